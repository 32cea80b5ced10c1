"""One writer per pipeline (invariant 13): a run claims the pipeline's writer epoch in the target, and every data
transaction checks it, so an older run that another host took over stops without changing anything.

Against real MariaDB and PostgreSQL: the claim race, a fenced writer's row batch and DDL, and two whole
appliers (one a live ``applier run`` subprocess, one in-process with its own checkpoint folder, as on another
host) through real Kafka and Spark.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import create_engine, select

from applier import migrate
from applier import progress as P
from applier.config import parse_config
from applier.events import DDL, Column, Op, Resolved, RowChange
from applier.pipeline import run
from applier.progress import NotClaimed, ProgressStore, WriterFenced
from applier.devtools.verify import compare_tables, read_table
from applier.devtools.changefeed import generate, produce
from tests.e2e.helpers import Feed, POS, REPO, config, processor, target_url, write_toml

pytestmark = pytest.mark.e2e

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"fx_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    migrate.upgrade(engine)
    yield engine, schema
    engine.dispose()


def progress_rows(engine, name: str) -> dict[str, list]:
    """Every applier_* row of one pipeline except the writer's own (its heartbeat is not progress)."""
    out = {}
    with engine.connect() as c:
        for t in (P.pipelines, P.partitions, P.tables, P.ddl_history, P.quarantine):
            out[t.name] = sorted(map(tuple, c.execute(select(t).where(t.c.pipeline == name)).all()), key=repr)
    return out


def row(ts: int, id_: int, v: str) -> RowChange:
    return RowChange("up", "a", ts, Op.INSERT, None, {"id": id_, "v": v}, COLS, POS)


def started_pair(engine, schema: str, name: str):
    """Writer A applies the table and a first row, then writer B claims the same pipeline."""
    feed = Feed()
    a = processor(engine, name, lambda s, t: (schema, t))
    a.process(feed.msgs(DDL("up", "a", 100, "CREATE TABLE `a` (`id` INT PRIMARY KEY, `v` VARCHAR(8))", POS),
                        row(110, 1, "one"), Resolved(150, POS)))
    b = processor(engine, name, lambda s, t: (schema, t))
    assert (a.applier.store.epoch, b.applier.store.epoch) == (1, 2)
    return feed, a, b


def test_fenced_writer_changes_nothing_and_the_new_writer_lands(target, unique) -> None:
    engine, schema = target
    name = f"fx-{unique}"
    feed, a, b = started_pair(engine, schema, name)
    data_before, progress_before = read_table(engine, schema, "a"), progress_rows(engine, name)
    msgs = feed.msgs(row(200, 2, "two"), row(210, 3, "three"), Resolved(300, POS))
    with pytest.raises(WriterFenced) as err:
        a.process(msgs)
    msg = str(err.value)
    assert f"pipeline {name!r}" in msg and "held writer epoch 1" in msg and "epoch 2 was claimed by" in msg
    assert f"pid {os.getpid()}" in msg and "without applying its batch" in msg and "pipeline.name" in msg
    assert "applier:applier@" not in msg  # never the target URL
    assert read_table(engine, schema, "a") == data_before
    assert progress_rows(engine, name) == progress_before

    b.process(msgs)
    assert set(read_table(engine, schema, "a")) == {(1,), (2,), (3,)}
    with engine.connect() as c:
        assert c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == name)).scalar() == 300
    a.close()
    b.close()


def test_fenced_writer_runs_no_ddl(target, unique) -> None:
    engine, schema = target
    name = f"fxd-{unique}"
    feed, a, b = started_pair(engine, schema, name)
    progress_before = progress_rows(engine, name)
    msgs = feed.msgs(DDL("up", "a", 200, "ALTER TABLE `a` ADD COLUMN `extra` INT", POS), Resolved(300, POS))
    with pytest.raises(WriterFenced):
        a.process(msgs)
    assert progress_rows(engine, name) == progress_before  # no DDL history row either
    assert "extra" not in next(iter(read_table(engine, schema, "a").values()))

    b.process(msgs)
    assert "extra" in next(iter(read_table(engine, schema, "a").values()))
    a.close()
    b.close()


def test_claims_race_to_distinct_epochs_and_every_write_checks(target, unique) -> None:
    engine, _ = target
    for i in range(4):  # two first claims at once: one inserts, the other retries as an update
        name = f"race-{unique}-{i}"
        stores = [ProgressStore(name, "open") for _ in range(2)]
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def claim(st: ProgressStore) -> None:
            try:
                barrier.wait()
                st.claim(engine)
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=claim, args=(st,)) for st in stores]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == [] and sorted(st.epoch for st in stores) == [1, 2]

    # the deterministic interleaving: a first claim's INSERT is uncommitted while the second claims
    name = f"race-{unique}-held"
    first, second = ProgressStore(name, "open"), ProgressStore(name, "open")
    with engine.connect() as c:
        tx = c.begin()
        first.epoch = first._claim(c)
        t = threading.Thread(target=second.claim, args=(engine,))
        t.start()
        time.sleep(1)  # the second claim now waits on the first one's row
        tx.commit()
    t.join(60)
    assert (first.epoch, second.epoch) == (1, 2)

    # every write path checks: the fenced store's DDL marker and progress, the unclaimed store's anything
    ev = DDL("up", "x", 100, "CREATE TABLE `x` (`id` INT PRIMARY KEY)", POS)
    for st in (first, ProgressStore(name, "open")):
        expected = WriterFenced if st is first else NotClaimed
        with engine.connect() as c, c.begin():
            with pytest.raises(expected):
                st.ddl_record(c, ev, P.ddl_key(ev), state="started", statements=[])
            with pytest.raises(expected):
                st.save(c, applied_ts=1, checkpoints={}, table_progress={})
    assert progress_rows(engine, name) == {t.name: [] for t in (P.pipelines, P.partitions, P.tables,
                                                                P.ddl_history, P.quarantine)}


def applied_ts(engine, name: str) -> int:
    try:
        with engine.connect() as c:
            return int(c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == name)).scalar() or 0)
    except Exception:  # the tables may not exist yet
        return 0


def test_second_applier_fences_a_running_one(urls, spark, unique, drop_schema, tmp_path) -> None:
    """Writer A: a live ``applier run`` subprocess. Writer B: the same pipeline.name with another checkpoint
    folder (another host: A's lock file cannot see it). Once B has run, A must stop by itself with exit code 6
    and name the takeover, and B alone converges to the upstream state."""
    topic = f"fence-{unique}"
    schema = f"shop_{unique}"
    drop_schema(("mariadb", schema))
    wl = generate("open", partitions=3, txns=200, seed=13, replays=0)
    half = len(wl.messages) // 2
    produce(urls.kafka, topic, wl.messages[:half], partitions=3)
    cfg_a = config(urls, "mariadb", "open", topic, schema, tmp_path / "ckpt-a", trigger_interval="1 second")
    cfg_b = config(urls, "mariadb", "open", topic, schema, tmp_path / "ckpt-b")
    name = cfg_a["pipeline"]["name"]
    write_toml(tmp_path / "a.toml", cfg_a)
    log = tmp_path / "a.log"
    engine = create_engine(urls.mariadb_url)
    a = subprocess.Popen([sys.executable, "-m", "applier.cli", "run", "-c", str(tmp_path / "a.toml")], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=open(log, "wb"), start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while applied_ts(engine, name) == 0:
            assert a.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)

        run(parse_config(cfg_b), until_caught_up=True, spark=spark, progress=False)  # claims epoch 2
        produce(urls.kafka, topic, wl.messages[half:], partitions=3)
        try:
            rc = a.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pytest.fail("writer A kept running after writer B took the pipeline over:\n" + log.read_text()[-3000:])
        err = log.read_text()
        assert rc == 6, err[-3000:]
        assert "stopped: " in err and "held writer epoch 1" in err and "epoch 2 was claimed by" in err, err[-3000:]
        assert f"pid {os.getpid()}" in err  # B's holder: this test process

        run(parse_config(cfg_b), until_caught_up=True, spark=spark, progress=False)
        assert compare_tables(engine, schema, wl.expected) == []
        assert applied_ts(engine, name) == wl.final_ts
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
            a.wait()
        engine.dispose()
