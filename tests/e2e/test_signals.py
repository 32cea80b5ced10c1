"""Stopping and starting as an operator expects (issue 24, point 5), with the real ``applier run`` console script
against real Kafka, Spark and MariaDB/PostgreSQL.

- SIGTERM to the PID of a running ``applier run`` (a service manager, ``kill PID``), and SIGINT to its PID or to its
  whole process group (a terminal's Ctrl-C), stop it within seconds: it ends by that signal, prints one line on
  stderr naming the applied ts (no Java or py4j trace), and the target holds exactly the upstream tables as of that
  applied ts (progress and data committed together); a rerun ``--until-caught-up`` converges on the final tables.
- A second run of a running pipeline with ``[metrics] port`` says the pipeline is running.
- A topic that does not exist is a configuration error (exit 2) found before Spark starts.
- ``applier quarantine list`` exits 0 when nothing is quarantined.
- ``python -m applier.devtools.changefeed`` writes a sample changefeed into a topic of one's own, which a run applies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.devtools.changefeed import generate, produce
from applier.devtools.verify import compare_tables
from tests.e2e.helpers import REPO, config, state_as_of, target_url, write_toml

pytestmark = pytest.mark.e2e

APPLIER = str(Path(sys.executable).parent / "applier")  # the console script an operator runs
STOP_WITHIN = 20  # seconds from the signal to the exit: the batch being applied finishes first (a loaded machine)





def progress_of(engine, name: str) -> tuple[int, int]:
    """(batches, applied_ts) the pipeline has committed; (0, 0) before its first batch."""
    try:
        with engine.connect() as c:
            row = c.execute(select(P.pipelines.c.batches, P.pipelines.c.applied_ts)
                            .where(P.pipelines.c.pipeline == name)).first()
    except Exception:  # the applier's tables are not there yet
        return 0, 0
    return (int(row[0]), int(row[1])) if row else (0, 0)


def start(cfg: Path, out: Path, *args: str) -> subprocess.Popen:
    """``applier run`` as a shell starts it: the leader of a process group of its own."""
    return subprocess.Popen([APPLIER, "run", "-c", str(cfg), *args], cwd=REPO,
                            stdout=open(out.with_suffix(".out"), "w"), stderr=open(out.with_suffix(".err"), "w"),
                            start_new_session=True)


def wait_for_batches(proc: subprocess.Popen, engine, name: str, n: int, log: Path) -> None:
    deadline = time.monotonic() + 240
    while progress_of(engine, name)[0] < n:
        assert proc.poll() is None, f"the run ended early ({proc.returncode}): {log.with_suffix('.err').read_text()}"
        assert time.monotonic() < deadline, log.with_suffix(".err").read_text()[-3000:]
        time.sleep(0.1)


def stop(proc: subprocess.Popen, sig: int, *, group: bool = False) -> float:
    """Send ``sig`` to the run's PID (or its process group); seconds until it ended."""
    t0 = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return time.monotonic() - t0


def the_one_line(log: Path, sig: int, applied: int) -> None:
    """stderr holds the stop line and nothing else: no Spark start-up lines, no py4j or Java trace."""
    err = log.with_suffix(".err").read_text()
    name = signal.Signals(sig).name
    assert re.fullmatch(rf"stopping on {name}: progress is committed up to applied ts {applied} "
                        r"\(applier_pipelines\.applied_ts\), after \d+ micro-batch\(es\) in this run; run again to "
                        r"go on\n", err), err
    assert log.with_suffix(".out").read_text() == ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sample_changefeed_sigterm_to_the_pid_a_second_run_and_a_rerun(urls, unique, drop_schema, tmp_path) -> None:
    topic = f"e2e-sig-term-{unique}"
    schema = f"sig_{unique}"
    drop_schema(("mariadb", schema))
    start_ms = int(time.time() * 1000) - 120_000
    expected_file = tmp_path / "expected.json"
    sample = subprocess.run(
        [sys.executable, "-m", "applier.devtools.changefeed", "--bootstrap", urls.kafka, "--topic", topic,
         "--protocol", "canal-json", "--partitions", "2", "--txns", "500", "--seed", "5", "--start-ms", str(start_ms),
         "--expected", str(expected_file)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert sample.returncode == 0, sample.stderr
    assert sample.stderr == ""  # no librdkafka retry lines either
    assert f"to {topic} on {urls.kafka}" in sample.stdout and 'protocol = "canal-json"' in sample.stdout
    wl = generate("canal-json", partitions=2, txns=500, seed=5, start_ms=start_ms)  # the same stream, exactly
    assert f"wrote {len(wl.messages)} TiCDC canal-json messages" in sample.stdout
    for table, rows in wl.expected.items():
        assert f"shop.{table}: {len(rows)} rows" in sample.stdout
    assert {t: len(rows) for t, rows in json.loads(expected_file.read_text()).items()} == \
        {f"shop.{t}": len(rows) for t, rows in wl.expected.items()}

    cfg = config(urls, "mariadb", "canal-json", topic, schema, tmp_path / "ckpt", max_offsets_per_trigger=25,
                 trigger_interval="100 ms")
    cfg["metrics"] = {"port": free_port()}
    cfg_path = write_toml(tmp_path / "applier.toml", cfg)
    name = cfg["pipeline"]["name"]
    engine = create_engine(target_url(urls, "mariadb"))
    log = tmp_path / "run"
    proc = start(cfg_path, log)
    try:
        wait_for_batches(proc, engine, name, 3, log)

        # a second run of the running pipeline, metrics port and all: told at once that it is running
        t0 = time.monotonic()
        second = subprocess.run([APPLIER, "run", "-c", str(cfg_path)], cwd=REPO, capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 1, second.stderr
        assert f"pipeline {name} is already running on this host (pid " in second.stderr
        assert "Address already in use" not in second.stderr and time.monotonic() - t0 < 30

        took = stop(proc, signal.SIGTERM)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGTERM  # it ends by the signal: a stop, not a failure (shell: 143)
    assert took < STOP_WITHIN
    batches, applied = progress_of(engine, name)
    assert 0 < applied < wl.final_ts, "the stream was drained before the stop; make it longer"
    the_one_line(log, signal.SIGTERM, applied)
    try:
        # progress and data committed together: the replica is upstream as of its applied ts, exactly
        assert compare_tables(engine, schema, state_as_of(wl, applied)) == []
        rerun = subprocess.run([APPLIER, "run", "-c", str(cfg_path), "--until-caught-up"], cwd=REPO,
                               capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr
        assert rerun.stderr == ""  # a normal run prints only the applier's own lines: here none
        assert compare_tables(engine, schema, wl.expected) == []
        assert progress_of(engine, name)[1] == wl.final_ts
    finally:
        engine.dispose()


@pytest.mark.parametrize("target,group", [("postgres", False), ("mariadb", True)], ids=["pid", "ctrl-c"])
def test_sigint_stops_cleanly_with_one_line(urls, unique, drop_schema, tmp_path, target, group) -> None:
    """SIGINT to the PID alone (ignored for minutes before), or to the whole group as a terminal's Ctrl-C does
    (the pipeline, its JVM and Spark's workers used to get it too: 1,200 lines and a Java StackOverflowError), with
    micro-batches big enough that one is being read and applied when the signal comes."""
    topic = f"e2e-sig-int-{unique}"
    schema = f"sig_{unique}"
    drop_schema((target, schema))
    wl = generate("open", partitions=3, txns=2500, seed=9, replays=0)
    produce(urls.kafka, topic, wl.messages, partitions=3)
    cfg = config(urls, target, "open", topic, schema, tmp_path / "ckpt", max_offsets_per_trigger=300,
                 trigger_interval="100 ms")
    cfg_path = write_toml(tmp_path / "applier.toml", cfg)
    name = cfg["pipeline"]["name"]
    engine = create_engine(target_url(urls, target))
    log = tmp_path / "run"
    proc = start(cfg_path, log)
    try:
        wait_for_batches(proc, engine, name, 2, log)
        took = stop(proc, signal.SIGINT, group=group)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    try:
        assert proc.returncode == -signal.SIGINT, log.with_suffix(".err").read_text()[-3000:]  # shell: 130
        assert took < STOP_WITHIN
        _, applied = progress_of(engine, name)
        assert 0 < applied < wl.final_ts, "the stream was drained before the stop; make it longer"
        the_one_line(log, signal.SIGINT, applied)
        assert compare_tables(engine, schema, state_as_of(wl, applied)) == []
    finally:
        engine.dispose()


def test_a_missing_topic_is_a_config_error_before_spark_starts(urls, unique, tmp_path) -> None:
    topic = f"e2e-sig-missing-{unique}"  # never created
    cfg = config(urls, "mariadb", "open", topic, f"sig_{unique}", tmp_path / "ckpt")
    cfg_path = write_toml(tmp_path / "applier.toml", cfg)
    t0 = time.monotonic()
    res = subprocess.run([APPLIER, "run", "-c", str(cfg_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert time.monotonic() - t0 < 10  # Spark takes longer than this to start on this machine
    assert f"source.topics: topic(s) {topic} do not exist on {urls.kafka}" in res.stderr
    assert res.stderr.startswith("config error:") and len(res.stderr.splitlines()) == 1


def test_quarantine_list_of_a_healthy_pipeline_exits_0(urls, unique, tmp_path) -> None:
    cfg = config(urls, "postgres", "open", f"e2e-sig-q-{unique}", f"sig_{unique}", tmp_path / "ckpt")
    cfg_path = write_toml(tmp_path / "applier.toml", cfg)
    assert subprocess.run([APPLIER, "migrate", "-c", str(cfg_path)], cwd=REPO, capture_output=True,
                          timeout=120).returncode == 0
    for extra in ([], ["--json"]):
        res = subprocess.run([APPLIER, "quarantine", "list", "-c", str(cfg_path), *extra], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr  # was 1: a health check failed on a healthy pipeline
