"""Crash safety: ``applier run`` killed with SIGKILL mid-stream, restarted (once with the Spark checkpoint
folder deleted), must end in the same target state with every change applied exactly once."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.devtools.verify import compare_tables
from applier.devtools.changefeed import generate, produce
from tests.e2e.helpers import REPO, config, target_url, write_toml

pytestmark = pytest.mark.e2e

def batches_done(engine, name: str) -> int:
    try:
        with engine.connect() as c:
            return int(c.execute(select(P.pipelines.c.batches).where(P.pipelines.c.pipeline == name)).scalar() or 0)
    except Exception:
        return 0


def start(cfg_path: Path, log: Path, *options: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "applier.cli", *options, "run", "-c", str(cfg_path),
                             "--until-caught-up"],
                            cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def finish_and_check(cfg_path: Path, log: Path, engine, schema: str, name: str, wl) -> None:
    """The last run drains the stream; the target must then equal upstream with every row change counted once
    across all the runs (the streams have no replays) and each DDL done once."""
    proc = start(cfg_path, log)
    assert proc.wait(timeout=600) == 0, log.read_text()[-5000:]
    assert compare_tables(engine, schema, wl.expected) == []
    with engine.connect() as c:
        per_table = dict(c.execute(select(P.tables.c.source_table, P.tables.c.rows_applied)
                                   .where(P.tables.c.pipeline == name)).all())
        assert per_table == {t: n for t, n in wl.row_changes.items() if t != "audit_log"}
        rows = c.execute(select(P.pipelines.c.rows_applied).where(P.pipelines.c.pipeline == name)).scalar()
        assert rows == sum(per_table.values())
        states = c.execute(select(P.ddl_history.c.state).where(P.ddl_history.c.pipeline == name)).scalars().all()
        assert sorted(states) == ["done"] * 3


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_sigkill_mid_stream_then_restart_converges(urls, unique, drop_schema, tmp_path, target) -> None:
    protocol = "open" if target == "mariadb" else "canal-json"
    topic = f"crash-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    wl = generate(protocol, partitions=3, txns=500, seed=11, replays=0)
    produce(urls.kafka, topic, wl.messages, partitions=3)
    ckpt = tmp_path / "ckpt"
    cfg = config(urls, target, protocol, topic, schema, ckpt, max_offsets_per_trigger=25)
    cfg["pipeline"]["trigger_interval"] = "100 ms"
    cfg_path = tmp_path / "applier.toml"
    write_toml(cfg_path, cfg)
    name = cfg["pipeline"]["name"]
    engine = create_engine(target_url(urls, target))
    log = tmp_path / "run.log"
    kills = 0
    try:
        for kill_after, wipe_checkpoint in ((3, False), (5, True), (4, False)):
            base = batches_done(engine, name)
            proc = start(cfg_path, log)
            deadline = time.monotonic() + 180
            while batches_done(engine, name) < base + kill_after and proc.poll() is None:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                kills += 1
            proc.wait()
            if wipe_checkpoint:
                shutil.rmtree(ckpt / "query", ignore_errors=True)
        assert kills >= 2, "the stream was drained before the applier could be killed; make it longer"
        finish_and_check(cfg_path, log, engine, schema, name, wl)
    finally:
        engine.dispose()


# Issue 26: 30 SIGKILLs at random points with N = 4 on each target, spread over the three forms the streams take,
# each form killed at random moments of its windows. Each kill restarts Spark and its Python workers (17-25 s a
# cycle here, using 1.4 of the 2 cores), so the two targets' loops run side by side, and the 30 per target are what
# the suite pays for: they were 46 (30 threads, 10 tasks, 6 one transaction), one target after the other, 30 of the
# 68 minutes of the whole suite here, until the CI run of stop 35 took 64 minutes of tests.
KILLS_BY_FORM = {"driver": 16, "one_transaction": 8, "executors": 6}
assert sum(KILLS_BY_FORM.values()) == 30
TARGETS = ("mariadb", "postgres")


@pytest.mark.parametrize("apply_on", list(KILLS_BY_FORM))
def test_sigkills_with_four_apply_streams_converge(urls, unique, drop_schema, tmp_path, apply_on) -> None:
    """``[target] apply_streams = 4`` killed at random moments of its windows, restarted each time, must end exact
    with every row change counted once, on both targets (each its own topic and loop, run side by side); the
    per-table floors are what makes the re-read windows exact.

    * ``driver`` (threads): each stream commits alone, the marker after them, so a kill falls between two
      streams' commits among others;
    * ``one_transaction`` (what "auto" picks on local[N] for a target on this machine): every stream's share and
      progress row, and the marker, commit together or not at all;
    * ``executors``: the streams commit in Spark's Python workers, which the SIGKILL of the process group kills
      at any point of their transactions, before or after their commit and before the driver's marker."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(TARGETS)) as pool:
        loops = [pool.submit(_kill_four_streams, urls, unique, drop_schema, tmp_path / target, target, apply_on,
                             KILLS_BY_FORM[apply_on]) for target in TARGETS]
        for target, loop in zip(TARGETS, loops):
            try:
                loop.result()
            except BaseException as exc:
                raise AssertionError(f"{target}: {exc}") from exc


#: what `applier run --verbose` logs for each form of the streams (applier.pipeline._FORMS)
_LOGGED_FORM = {"executors": "as Spark tasks on the executors", "driver": "as threads of the driver",
                "one_transaction": "in one transaction of the driver per window"}


def _kill_four_streams(urls, unique, drop_schema, tmp_path, target: str, apply_on: str, times: int) -> None:
    import random

    from applier.streams.assign import target_stream

    protocol = "open" if target == "mariadb" else "canal-json"
    topic = f"crash-streams-{target}-{unique}"
    wl = generate(protocol, partitions=3, txns=2000, seed=13, replays=0)
    tables = [t for t in wl.expected]
    schema = next(s for s in (f"st{i}_{unique}" for i in range(100))
                  if len({target_stream(s, t, 4) for t in tables}) == len(tables))
    drop_schema((target, schema))
    produce(urls.kafka, topic, wl.messages, partitions=3)
    tmp_path.mkdir(exist_ok=True)
    ckpt = tmp_path / "ckpt"
    cfg = config(urls, target, protocol, topic, schema, ckpt, max_offsets_per_trigger=25)
    cfg["pipeline"]["trigger_interval"] = "100 ms"
    cfg["target"]["apply_streams"] = 4
    cfg["target"]["apply_on"] = apply_on
    if apply_on != "executors":
        # the windows of 25 messages are decoded in the driver, as "auto" decodes such small batches after a run's
        # first: every run here is killed within a few batches, and the workers' start (and, after a kill during
        # their decode, the crash guard's search of that range in child processes) was a third of each cycle.
        # Kills inside the workers' decode are tests/e2e/test_decoder_crash.py's; these are about the streams.
        cfg["pipeline"]["decode_on"] = "driver"
    cfg_path = tmp_path / "applier.toml"
    write_toml(cfg_path, cfg)
    name = cfg["pipeline"]["name"]
    engine = create_engine(target_url(urls, target))
    log = tmp_path / "run.log"
    rng = random.Random(26)
    kills = 0
    try:
        while kills < times:
            base = batches_done(engine, name)
            proc = start(cfg_path, log, "--verbose")  # its log says where the streams run
            deadline = time.monotonic() + 180
            while batches_done(engine, name) <= base and proc.poll() is None:
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.02)
            time.sleep(rng.uniform(0.0, 1.2))  # anywhere in a window: before, between or after the streams' commits
            assert proc.poll() is None, f"the stream was drained before {times} kills; make it longer"
            os.killpg(proc.pid, signal.SIGKILL)
            kills += 1
            proc.wait()
        finish_and_check(cfg_path, log, engine, schema, name, wl)
        with engine.connect() as c:
            streams = c.execute(select(P.streams.c.stream).where(P.streams.c.pipeline == name)).scalars().all()
        assert len(streams) >= len(tables)  # every table's stream wrote
        assert f"applying in 4 streams, {_LOGGED_FORM[apply_on]}" in log.read_text()
    finally:
        engine.dispose()
