"""Per-table floors in the gate (issue 26, apply streams; invariant 4): after a crash between two streams'
commits, the tables whose stream committed past the pipeline's applied ts drop their re-read events at or below
their own applied ts, and every other table is gated by the pipeline's applied ts alone."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from applier.columnar.rows import Shape, build_batch
from applier.events import DDL, SourcePosition
from applier.gate import Gate
from tests.unit.gate_streams import COLS, apply, make_stream, materialise, res, row

APPLIED = 100
FLOORS = {("s", "a"): 150}


def gate(**kw) -> Gate:
    return Gate(partitions=[("k", 0)], applied_ts=APPLIED, table_floors=FLOORS, **kw)


def drain(g: Gate) -> list:
    rel = g.release()
    out = list(rel)
    g.forget(rel)
    return out


def kept(g: Gate, upto: int = 1000) -> list[tuple[str, int]]:
    g.add([res(upto, 0, 10_000)])
    return [(e.table, e.commit_ts) for e in drain(g)]


def ddl(ts: int, off: int, table: str = "a") -> DDL:
    return DDL("s", table, ts, f"ALTER TABLE {table} ADD COLUMN c{ts} INT", SourcePosition("k", 0, off))


def test_rows_at_or_below_their_tables_floor_are_dropped_and_counted() -> None:
    g = gate()
    g.add([row(120, 0, 0, 1, 1, table="a"), row(150, 0, 1, 2, 2, table="a"), row(151, 0, 2, 3, 3, table="a")])
    assert kept(g) == [("a", 151)]
    assert g.stats["duplicates_dropped"] == 2


def test_other_tables_are_gated_by_the_applied_ts_alone() -> None:
    g = gate()
    g.add([row(100, 0, 0, 1, 1, table="b"), row(120, 0, 1, 2, 2, table="b"), row(150, 0, 2, 3, 3, table="b"),
           row(120, 0, 3, 4, 4, table="a")])
    assert kept(g) == [("b", 120), ("b", 150)]
    assert g.stats["duplicates_dropped"] == 2  # b at the applied ts, a below its floor


def test_a_ddl_of_the_table_at_or_below_its_floor_is_dropped_as_a_duplicate() -> None:
    g = gate()
    g.add([ddl(140, 0), ddl(150, 1), ddl(160, 2), ddl(140, 3, table="b")])
    assert kept(g) == [("b", 140), ("a", 160)]
    # counted as the DDL at or below the applied ts are: ddl_duplicates_dropped is for copies of a held DDL
    assert (g.stats["duplicates_dropped"], g.stats["ddl_duplicates_dropped"]) == (2, 0)


def test_floors_at_or_below_the_applied_ts_are_dropped_at_construction() -> None:
    g = Gate(partitions=[("k", 0)], applied_ts=APPLIED, table_floors={("s", "a"): 100, ("s", "b"): 90,
                                                                      ("s", "c"): 101})
    assert g.table_floors == {("s", "c"): 101}


def test_floors_expire_once_the_applied_ts_passes_them() -> None:
    g = Gate(partitions=[("k", 0)], applied_ts=APPLIED, table_floors={("s", "a"): 150, ("s", "b"): 300})
    g.add([res(150, 0, 0)])
    drain(g)
    assert g.applied_ts == 150 and g.table_floors == {("s", "b"): 300}
    g.add([res(400, 0, 1)])
    drain(g)
    assert g.table_floors == {}
    g.add([row(401, 0, 2, 1, 1, table="b")])  # above: kept as it always would be
    assert kept(g) == [("b", 401)]


def test_an_ungated_gate_ignores_floors() -> None:
    g = Gate(partitions=[("k", 0)], applied_ts=APPLIED, table_floors=FLOORS, gated=False)
    assert g.table_floors == {}
    g.add([row(120, 0, 0, 1, 1, table="a"), row(90, 0, 1, 2, 2, table="a")])
    assert [(e.table, e.commit_ts) for e in drain(g)] == [("a", 120), ("a", 90)]
    assert g.stats["duplicates_dropped"] == 0


# ---- the columnar lane's row batches ----------------------------------------------------------------------

def batch(table: str, tss: list[int], first_offset: int = 0):
    """A row batch of inserts into ``s.<table>`` (id, v), one row per commit ts, as a codec's lane builds it."""
    n = len(tss)
    shape = Shape("s", table, "k", ("id", "v"), ("int", "int"), (COLS,))
    meta = [tss, [0] * n, list(range(first_offset, first_offset + n)), [10] * n, [0] * n, [0] * n]
    nulls = [pa.nulls(n, pa.int64()), pa.nulls(n, pa.int64())]
    after = [pa.array(range(n), pa.int64()), pa.array(range(n), pa.int64())]
    return build_batch(shape, meta, nulls, after)


def batch_rows(g: Gate, upto: int = 1000) -> list[tuple[str, int]]:
    g.add([res(upto, 0, 10_000)])
    rel = g.release()
    assert list(rel) == []
    out = sorted((b.shape.table, ts) for b in rel.batches for ts in b.data.column("_ts").to_pylist())
    g.forget(rel)
    return out


def test_batch_rows_at_or_below_their_tables_floor_are_dropped_and_counted() -> None:
    g = gate()
    g.add_batches([batch("a", [120, 150, 151, 200]), batch("b", [100, 120, 150], first_offset=10)])
    assert batch_rows(g) == [("a", 151), ("a", 200), ("b", 120), ("b", 150)]
    assert g.stats["duplicates_dropped"] == 3  # a: 120, 150 (floor); b: 100 (applied ts)


def test_a_batch_wholly_below_its_floor_is_dropped() -> None:
    g = gate()
    g.add_batches([batch("a", [110, 120])])
    assert g.held == 0 and g.stats["duplicates_dropped"] == 2


def test_batch_floors_expire_after_forget() -> None:
    g = gate()
    g.add([res(160, 0, 0)])
    drain(g)
    g.add_batches([batch("a", [150, 161], first_offset=1)])  # 150: below the applied ts now
    assert batch_rows(g) == [("a", 161)]
    assert g.table_floors == {}


# ---- property: two streams, a crash between their commits -----------------------------------------------------

STREAM_OF = {"a": 0, "b": 1}  # gate_streams' two tables, one per stream


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), parts=st.integers(1, 3), replay=st.booleans())
def test_a_crash_between_two_streams_commits_resumes_to_exactly_once(seed: int, parts: int, replay: bool) -> None:
    """Each window's released changes go to stream 0 (table a) and stream 1 (table b), each committed with its
    tables' applied ts, then the marker (applied ts, checkpoints). Crashes fall after stream 0's commit, before
    stream 1's and the marker: the restarted gate gets the marker's progress and table a's floor, and every change
    is applied exactly once (no second application of a's window, nothing of b's lost)."""
    rng = random.Random(seed)
    logs, expected = make_stream(rng, parts, rng.randint(1, 40), replay)
    tps = [("k", p) for p in range(parts)]
    cursor = {p: 0 for p in range(parts)}
    marker = {"applied": 0, "resolved": {}, "restart": {tp: 0 for tp in tps}}
    floors: dict[tuple[str, str], int] = {}  # applier_tables: upstream table -> its stream's applied ts
    state: dict = {}  # the target's rows: durable as soon as a stream commits
    applied: Counter = Counter()  # every change a stream committed
    gate = Gate(partitions=tps)
    crashes = 0
    while any(cursor[p] < len(logs[p]) for p in range(parts)):
        batch = []
        for p in range(parts):
            n = rng.randint(0, 4)
            batch.extend(materialise(m) for m in logs[p][cursor[p]:cursor[p] + n])
            cursor[p] = min(len(logs[p]), cursor[p] + n)
        gate.add(sorted(batch, key=lambda e: (e.position.partition, e.position.offset)))
        rel = gate.release()
        streams: dict[int, list] = {0: [], 1: []}
        for ev in rel:
            streams[STREAM_OF[ev.table]].append(ev)
        gate.forget(rel)
        crash = crashes < 3 and streams[0] and rng.random() < 0.3
        for n in (0, 1):
            for ev in streams[n]:
                applied[(ev.table, ev.commit_ts, (ev.after or ev.before)["id"], ev.op)] += 1
                apply(state, ev)
                floors[("s", ev.table)] = gate.applied_ts
            if crash:
                break  # stream 0 committed; stream 1 and the marker did not
        if not crash:
            cp = gate.checkpoint()
            marker = {"applied": gate.applied_ts, "resolved": {tp: c.resolved_ts for tp, c in cp.items()},
                      "restart": {tp: c.restart_offset for tp, c in cp.items()}}
            continue
        crashes += 1
        gate.close()
        gate = Gate(partitions=tps, applied_ts=marker["applied"], partition_resolved=marker["resolved"],
                    table_floors=floors)
        for (_, p), off in marker["restart"].items():
            cursor[p] = off
    assert gate.held == 0
    assert state == expected
    assert [k for k, n in applied.items() if n > 1] == []
    gate.close()
