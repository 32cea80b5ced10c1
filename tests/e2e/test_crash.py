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


KILLS_WITH_STREAMS = 30
KILLS_WITH_TASKS = 10  # per target (each restart starts Spark and its Python workers: about 15-30 s)
KILLS_IN_ONE_TRANSACTION = 6  # per target: N = 1's transaction with every stream's progress in it (12 min for 2 x 10 here)


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_thirty_sigkills_with_four_apply_streams_converge(urls, unique, drop_schema, tmp_path, target) -> None:
    """Issue 26: ``[target] apply_streams = 4`` killed 30 times at random moments of its windows (between two
    streams' commits among them: each stream commits alone, the marker after them), restarted each time, must end
    exact with every row change counted once; the per-table floors are what makes the re-read windows exact."""
    _kill_four_streams(urls, unique, drop_schema, tmp_path, target, "driver", KILLS_WITH_STREAMS)


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_sigkills_with_four_apply_streams_in_spark_tasks_converge(urls, unique, drop_schema, tmp_path,
                                                                   target) -> None:
    """The same with ``apply_on = "executors"``: the streams commit in Spark's Python workers, which the SIGKILL of
    the process group kills at any point of their transactions, before or after their commit and before the
    driver's marker."""
    _kill_four_streams(urls, unique, drop_schema, tmp_path, target, "executors", KILLS_WITH_TASKS)


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_sigkills_with_four_apply_streams_in_one_transaction_converge(urls, unique, drop_schema, tmp_path,
                                                                      target) -> None:
    """The same with ``apply_on = "one_transaction"`` (what "auto" picks on local[N] for a target on this
    machine): every stream's share and progress row, and the marker, commit together or not at all."""
    _kill_four_streams(urls, unique, drop_schema, tmp_path, target, "one_transaction", KILLS_IN_ONE_TRANSACTION)


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
    ckpt = tmp_path / "ckpt"
    cfg = config(urls, target, protocol, topic, schema, ckpt, max_offsets_per_trigger=25)
    cfg["pipeline"]["trigger_interval"] = "100 ms"
    cfg["target"]["apply_streams"] = 4
    cfg["target"]["apply_on"] = apply_on
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
