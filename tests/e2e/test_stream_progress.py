"""Apply streams' progress against real MariaDB and PostgreSQL (issue 26, invariants 6, 13 and 16): each stream
saves its own row with its rows, the marker moves the pipeline's applied ts, and a restart reads back each
stream's applied ts and the tables applied past the marker (the gate's floors). Each test migrates a database of
its own (``fresh_engine``), so the shared one keeps its revision."""

from __future__ import annotations

import threading

import pytest
from alembic import command
from sqlalchemy import inspect, select

from applier import migrate
from applier import progress as P
from applier.gate import PartitionCheckpoint
from applier.progress import ProgressStore, TableProgress, WriterFenced
from applier.streams.store import AllStreamsStore

pytestmark = pytest.mark.e2e

CP = {("t", 0): PartitionCheckpoint(5, 90, 7)}


def tp(table: str, rows: int) -> TableProgress:
    return TableProgress("down", table, rows)


def stored(engine, name: str) -> dict:
    """The pipeline's applied ts and rows, its streams' and its tables' (applied ts, rows)."""
    with engine.connect() as c:
        pl = c.execute(select(P.pipelines.c.applied_ts, P.pipelines.c.rows_applied)
                       .where(P.pipelines.c.pipeline == name)).first()
        streams = {int(n): (int(ts), int(r)) for n, ts, r in c.execute(
            select(P.streams.c.stream, P.streams.c.applied_ts, P.streams.c.rows_applied)
            .where(P.streams.c.pipeline == name))}
        tables = {t: (int(ts), int(r)) for t, ts, r in c.execute(
            select(P.tables.c.source_table, P.tables.c.applied_ts, P.tables.c.rows_applied)
            .where(P.tables.c.pipeline == name))}
    return {"pipeline": None if pl is None else (int(pl[0]), int(pl[1])), "streams": streams, "tables": tables}


@pytest.fixture
def store(fresh_engine):
    migrate.upgrade(fresh_engine)
    s = ProgressStore("p", "canal-json")
    s.claim(fresh_engine)
    return s


def load(engine, store: ProgressStore) -> P.PipelineState:
    with engine.connect() as c:
        return store.load(c)


def test_the_migration_creates_and_drops_applier_streams(fresh_engine) -> None:
    assert migrate.upgrade(fresh_engine) == "0012"
    cols = {c["name"]: c for c in inspect(fresh_engine).get_columns("applier_streams")}
    assert list(cols) == ["pipeline", "stream", "applied_ts", "rows_applied", "updated_at"]
    assert not any(c["nullable"] for c in cols.values())
    assert inspect(fresh_engine).get_pk_constraint("applier_streams")["constrained_columns"] == ["pipeline", "stream"]
    cfg = migrate._config()
    with fresh_engine.begin() as c:
        cfg.attributes["connection"] = c
        command.downgrade(cfg, "0011")
    assert "applier_streams" not in inspect(fresh_engine).get_table_names()
    assert "applier_loads" in inspect(fresh_engine).get_table_names()
    migrate.upgrade(fresh_engine)
    assert "applier_streams" in inspect(fresh_engine).get_table_names()


def test_streams_then_the_marker_and_what_a_restart_loads(fresh_engine, store) -> None:
    e = fresh_engine
    with e.begin() as c:  # the window before: an ordinary save, then the marker of the run's start
        store.save(c, applied_ts=100, checkpoints=CP, table_progress={("up", "c"): tp("c", 1)}, batches=1)
    with e.begin() as c:
        store.save_stream(c, stream=0, applied_ts=200, table_progress={("up", "a"): tp("a", 3)})
    # a crash here: stream 0 committed window 200, stream 1 did not, the marker still says 100
    st = load(e, store)
    assert (st.applied_ts, st.streams, st.table_floors) == (100, {0: 200}, {("up", "a"): 200})
    assert st.checkpoints == CP
    with e.begin() as c:
        store.save_stream(c, stream=1, applied_ts=200, table_progress={("up", "b"): tp("b", 2)})
    st = load(e, store)
    assert (st.applied_ts, st.streams) == (100, {0: 200, 1: 200})
    assert st.table_floors == {("up", "a"): 200, ("up", "b"): 200}
    cp2 = {("t", 0): PartitionCheckpoint(9, 200, 9)}
    with e.begin() as c:  # the marker: every stream committed window 200
        store.save(c, applied_ts=200, checkpoints=cp2, table_progress={}, batches=1)
    st = load(e, store)
    assert (st.applied_ts, st.streams, st.table_floors, st.checkpoints) == (200, {0: 200, 1: 200}, {}, cp2)
    assert st.batches == 2
    with e.begin() as c:
        store.save_stream(c, stream=0, applied_ts=300,
                          table_progress={("up", "a"): tp("a", 4), ("up", "c"): tp("c", 2)})
    assert stored(e, "p") == {"pipeline": (200, 12), "streams": {0: (300, 9), 1: (200, 2)},
                              "tables": {"a": (300, 7), "b": (200, 2), "c": (300, 3)}}
    assert load(e, store).table_floors == {("up", "a"): 300, ("up", "c"): 300}


def test_one_transaction_moves_the_marker_and_each_stream_it_wrote_rows_of(fresh_engine, store) -> None:
    """The one-transaction form (AllStreamsStore): one save records the marker, the tables and every stream whose
    tables it carries, each with its own rows, as the streams' own saves and the marker would have."""
    e = fresh_engine
    by_stream = {"a": 0, "b": 2, "c": 2}
    all_streams = AllStreamsStore(store, lambda schema, table: by_stream[table])
    with e.begin() as c:
        all_streams.save(c, applied_ts=100, checkpoints=CP, table_progress={}, batches=1)  # nothing written yet
    assert stored(e, "p") == {"pipeline": (100, 0), "streams": {}, "tables": {}}
    with e.begin() as c:
        all_streams.save(c, applied_ts=200, checkpoints=CP, batches=1,
                         table_progress={("up", "a"): tp("a", 3), ("up", "b"): tp("b", 2), ("up", "c"): tp("c", 4)})
    with e.begin() as c:
        all_streams.save(c, applied_ts=300, checkpoints=CP, table_progress={("up", "c"): tp("c", 1)}, batches=1)
    assert stored(e, "p") == {"pipeline": (300, 10), "streams": {0: (200, 3), 2: (300, 7)},
                              "tables": {"a": (200, 3), "b": (200, 2), "c": (300, 5)}}
    st = load(e, store)
    assert (st.applied_ts, st.streams, st.table_floors, st.batches) == (300, {0: 200, 2: 300}, {}, 3)
    newer = ProgressStore("p", "canal-json")
    newer.claim(e)
    before = stored(e, "p")
    with pytest.raises(WriterFenced):
        with e.begin() as c:
            all_streams.save(c, applied_ts=400, checkpoints=CP, table_progress={("up", "a"): tp("a", 1)})
    assert stored(e, "p") == before


def test_a_fenced_store_saves_no_stream_progress(fresh_engine, store) -> None:
    e = fresh_engine
    with e.begin() as c:
        store.save(c, applied_ts=100, checkpoints=CP, table_progress={})
    newer = ProgressStore("p", "canal-json")
    newer.claim(e)
    before = stored(e, "p")
    with pytest.raises(WriterFenced, match="held writer epoch 1"):
        with e.begin() as c:
            store.save_stream(c, stream=0, applied_ts=200, table_progress={("up", "a"): tp("a", 3)})
    assert stored(e, "p") == before == {"pipeline": (100, 0), "streams": {}, "tables": {}}


def test_a_stream_cannot_save_before_the_marker_made_the_pipelines_row(fresh_engine, store) -> None:
    with pytest.raises(RuntimeError, match=r"apply stream 2 .* no row in applier_pipelines .* marker .* must be "
                                           r"saved first"):
        with fresh_engine.begin() as c:
            store.save_stream(c, stream=2, applied_ts=200, table_progress={("up", "a"): tp("a", 3)})
    assert stored(fresh_engine, "p") == {"pipeline": None, "streams": {}, "tables": {}}


def test_a_load_with_replace_forgets_the_streams(fresh_engine, store) -> None:
    e = fresh_engine
    with e.begin() as c:
        store.save(c, applied_ts=100, checkpoints=CP, table_progress={})
        store.save_stream(c, stream=0, applied_ts=200, table_progress={("up", "a"): tp("a", 3)})
    with e.begin() as c:  # applier load --replace at snapshot 150
        store.start_at(c, applied_ts=150, tables_loaded={("up", "a"): tp("a", 0)}, replace=True)
    st = load(e, store)
    assert (st.applied_ts, st.streams, st.table_floors) == (150, {}, {})


def test_concurrent_streams_commit_without_deadlock_and_every_row_counts(fresh_engine, store) -> None:
    """Four streams save at the same moment, window after window (the first save of each inserts its rows): the
    writer row's lock makes them take turns from their progress save to their commit, so no two of them deadlock
    on the UPDATE-then-INSERT of their rows (an InnoDB gap-lock pattern) and no count is lost."""
    e = fresh_engine
    with e.begin() as c:
        store.save(c, applied_ts=100, checkpoints=CP, table_progress={})
    streams, windows = 4, 8
    barrier = threading.Barrier(streams)
    errors: list[BaseException] = []

    def stream(n: int) -> None:
        try:
            for w in range(1, windows + 1):
                with e.connect() as conn:
                    with conn.begin():
                        barrier.wait(timeout=30)
                        store.save_stream(conn, stream=n, applied_ts=100 + w,
                                          table_progress={("up", f"t{n}"): tp(f"t{n}", n + 1)})
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=stream, args=(n,)) for n in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    total = sum(n + 1 for n in range(streams)) * windows
    assert stored(e, "p") == {
        "pipeline": (100, total), "streams": {n: (100 + windows, (n + 1) * windows) for n in range(streams)},
        "tables": {f"t{n}": (100 + windows, (n + 1) * windows) for n in range(streams)}}
