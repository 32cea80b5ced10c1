"""The gate's invariants: global resolved ts, gating, order, duplicates, late events, restart, spill.

Property tests drive a TiCDC-shaped stream (rows dispatched by key to partitions, resolved events broadcast,
at-least-once replays after a simulated TiCDC restart) through the gate with random interleavings and batch
sizes, and check every release against a model.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition
from applier.gate import Gate
from tests.unit.gate_streams import apply, make_stream, materialise, res, row

def ddl(ts: int, part: int, off: int, q: str = "alter table t add column x int", table: str = "t") -> DDL:
    return DDL("s", table, ts, q, SourcePosition("k", part, off))


def drain(g: Gate, upto: int | None = None) -> list:
    rel = g.release(upto)
    out = list(rel)
    g.forget(rel)
    return out


# ---- invariant 1: global resolved ts ----------------------------------------------------------------

def test_global_resolved_is_min_over_partitions_and_zero_until_each_reports() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1), ("k", 2)])
    g.add([res(100, 0, 0), res(90, 1, 0)])
    assert g.global_resolved() == 0  # partition 2 never reported
    g.add([res(95, 2, 0)])
    assert g.global_resolved() == 90
    g.add([res(200, 1, 1), res(200, 2, 1)])
    assert g.global_resolved() == 100


def test_global_resolved_spans_every_topic() -> None:
    g = Gate(partitions=[("a", 0), ("b", 0)])
    g.add([res(50, 0, 0, topic="a")])
    assert g.global_resolved() == 0
    g.add([res(40, 0, 0, topic="b")])
    assert g.global_resolved() == 40


def test_replayed_older_watermark_never_moves_it_back() -> None:
    g = Gate(partitions=[("k", 0)])
    g.add([res(100, 0, 0)])
    g.add([res(60, 0, 1)])
    assert g.global_resolved() == 100


def test_restored_partition_resolved_is_kept() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1)], partition_resolved={("k", 0): 70, ("k", 1): 80})
    assert g.global_resolved() == 70
    g.add([res(10, 0, 5)])
    assert g.global_resolved() == 70


# ---- invariant 2: gating ----------------------------------------------------------------------------

def test_rows_wait_for_global_resolved() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1)])
    g.add([row(10, 0, 0, 1, 1), row(20, 1, 0, 2, 2), res(15, 0, 1)])
    assert drain(g) == []  # partition 1 has not reported
    g.add([res(15, 1, 1)])
    out = drain(g)
    assert [e.commit_ts for e in out] == [10]
    g.add([res(25, 0, 2), res(25, 1, 2)])
    assert [e.commit_ts for e in drain(g)] == [20]
    assert g.applied_ts == 25


# ---- invariant 3: order, DDL as a barrier ----------------------------------------------------------

def test_release_is_in_commit_order_with_ddl_between() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1)])
    g.add([row(30, 1, 0, 2, 1), ddl(20, 1, 1), row(10, 0, 0, 1, 1), ddl(20, 0, 1), row(25, 0, 2, 3, 3)])
    g.add([res(40, 0, 3), res(40, 1, 2)])
    out = drain(g)
    assert [(type(e).__name__, e.commit_ts) for e in out] == [
        ("RowChange", 10), ("DDL", 20), ("RowChange", 25), ("RowChange", 30)
    ]  # the broadcast DDL is kept once


# ---- invariant 4: duplicates and late events --------------------------------------------------------

def test_event_at_or_below_applied_ts_is_dropped() -> None:
    g = Gate(partitions=[("k", 0)], applied_ts=100)
    g.add([row(100, 0, 0, 1, 1), row(90, 0, 1, 1, 1), row(101, 0, 2, 1, 2)])
    assert g.held == 1


def test_late_event_above_applied_ts_is_never_dropped() -> None:
    """TiCDC's consumer dropped events below a partition's watermark (ticdc#4051); we must not."""
    g = Gate(partitions=[("k", 0), ("k", 1)])
    g.add([row(50, 0, 0, 1, 1), res(60, 0, 1), res(40, 1, 0)])
    assert [e.commit_ts for e in drain(g)] == []
    # partition 1 delivers a late event at ts 45 < partition 0's watermark, but > applied ts (40 was never
    # applied since nothing was released). It must still be applied.
    g.add([row(45, 1, 1, 2, 2), res(70, 1, 2)])
    assert [e.commit_ts for e in drain(g)] == [45, 50]


def test_a_resent_copy_of_a_held_change_is_dropped_and_only_that() -> None:
    g = Gate(partitions=[("k", 0)])
    g.add([row(10, 0, 0, 1, 1), row(10, 0, 1, 2, 2), row(10, 0, 2, 1, 1)])  # offset 2 re-sends offset 0
    g.add([row(10, 0, 3, 2, 2), res(10, 0, 4)])  # and the next micro-batch re-sends offset 1
    assert [(e.after["id"], e.position.offset) for e in drain(g)] == [(1, 0), (2, 1)]
    assert g.stats["duplicates_dropped"] == 2


@pytest.mark.parametrize("a, b", [(-1, -2), (1, 2**61)])  # equal Python hashes: hash(-1) == hash(-2) == -2
def test_different_changes_whose_hashes_collide_are_both_kept(a: int, b: int) -> None:
    """Duplicates are found by exact comparison: a hash alone once dropped the row with key -2 of a transaction
    that also wrote key -1, and upstream values are untrusted input that can collide on purpose."""
    assert hash(a) == hash(b)
    g = Gate(partitions=[("k", 0)])
    g.add([row(10, 0, 0, a, 7), row(10, 0, 1, b, 7), res(10, 0, 2)])
    assert sorted(e.after["id"] for e in drain(g)) == sorted([a, b]) and g.stats["duplicates_dropped"] == 0


def test_keyless_changes_are_told_apart_by_position_and_composite_keys_exactly() -> None:
    """A table without a key may hold identical rows: one upstream transaction inserting (-1) twice is two rows,
    whether the copies travel in two messages or in one (Open Protocol batches rows). So a keyless change is only
    a copy when it is the same record read again (same offset, same place in its message); a re-send at another
    offset is kept (at-least-once for such tables). Composite keys are compared exactly, as every key is."""
    keyless = (Column("v", "int"),)
    two = (Column("a", "int", nullable=False, key=True), Column("b", "int", nullable=False, key=True))
    pos = [SourcePosition("k", 0, i) for i in range(9)]

    def kl(v: int, p: SourcePosition) -> RowChange:
        return RowChange("s", "n", 10, Op.INSERT, None, {"v": v}, keyless, p)

    g = Gate(partitions=[("k", 0)])
    g.add([kl(-1, pos[0]), kl(-2, pos[1]),
           kl(-1, pos[2]),  # equal to offset 0: another row of the same content, or a re-send; kept either way
           kl(-1, pos[3]), kl(-1, pos[3]),  # two identical rows in one message
           RowChange("s", "c", 10, Op.INSERT, None, {"a": -1, "b": 5}, two, pos[4]),
           RowChange("s", "c", 10, Op.INSERT, None, {"a": -2, "b": 5}, two, pos[5]),
           RowChange("s", "c", 10, Op.DELETE, {"a": -2, "b": 6}, None, two, pos[6]),
           RowChange("s", "c", 10, Op.INSERT, None, {"a": -1, "b": 5}, two, pos[7])])  # a re-sent copy of offset 4
    g.add([kl(-1, pos[3]), kl(-1, pos[3])])  # the record at offset 3 read again: both its rows are copies
    g.add([Resolved(10, pos[8])])
    assert [e.position.offset for e in drain(g)] == [0, 1, 2, 3, 3, 4, 5, 6] and g.stats["duplicates_dropped"] == 3


def test_ddl_already_applied_is_not_held_again() -> None:
    g = Gate(partitions=[("k", 0)], seen_ddl=[(20, "s", "t", "alter table t add column x int")])
    g.add([ddl(20, 0, 0)])
    assert g.held == 0


# ---- invariant 7: restart offsets ---------------------------------------------------------------------

def test_restart_offsets_point_at_the_lowest_held_event() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1)])
    g.add([row(10, 0, 5, 1, 1), row(30, 0, 6, 2, 1), res(20, 0, 7), row(12, 1, 3, 3, 1), res(20, 1, 4)])
    assert g.restart_offsets() == {("k", 0): 5, ("k", 1): 3}
    drain(g)
    assert g.restart_offsets() == {("k", 0): 6, ("k", 1): 5}
    cp = g.checkpoint()
    # partition 0 re-reads from offset 6, before its resolved event at offset 7: restore 0, not 20
    assert (cp[("k", 0)].restart_offset, cp[("k", 0)].resolved_ts) == (6, 0)
    assert (cp[("k", 1)].restart_offset, cp[("k", 1)].resolved_ts) == (5, 20)


# ---- invariant 8: spill ----------------------------------------------------------------------------------

def test_spill_keeps_memory_under_budget_and_releases_the_same(tmp_path) -> None:
    events = [row(10 + i // 50, i % 3, i, i % 97, i) for i in range(3000)]
    big = Gate(partitions=[("k", p) for p in range(3)])
    small = Gate(partitions=[("k", p) for p in range(3)], budget_bytes=20_000, spill_dir=tmp_path)
    for lo in range(0, 3000, 100):
        big.add(events[lo:lo + 100])
        small.add(events[lo:lo + 100])
        assert small.memory_bytes <= 20_000 + 100 * 500
    assert small.stats["spills"] > 1
    for upto in (20, 40, 75):
        a = [(e.commit_ts, e.position.offset) for e in drain(big, upto)]
        b = [(e.commit_ts, e.position.offset) for e in drain(small, upto)]
        assert a == b
        assert small.restart_offsets().keys() == big.restart_offsets().keys()
        for tp, off in small.restart_offsets().items():
            assert off <= big.restart_offsets()[tp]  # conservative, never above the true lowest held offset
    assert small.held == 0
    small.close()
    assert not list(tmp_path.rglob("*.pickle"))


def test_forget_needs_a_fully_iterated_release() -> None:
    g = Gate(partitions=[("k", 0)])
    g.add([row(1, 0, 0, 1, 1), row(2, 0, 1, 2, 1), res(5, 0, 2)])
    rel = g.release()
    it = iter(rel)
    next(it)
    with pytest.raises(RuntimeError):
        g.forget(rel)


# ---- property test: random TiCDC-shaped streams ---------------------------------------------------------

@settings(max_examples=400, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), parts=st.integers(1, 4), replay=st.booleans(),
       crash=st.booleans(), budget=st.sampled_from([10**9, 3000]))
def test_random_streams_converge(seed: int, parts: int, replay: bool, crash: bool, budget: int, tmp_path_factory) -> None:
    rng = random.Random(seed)
    logs, expected = make_stream(rng, parts, rng.randint(1, 40), replay)
    spill = tmp_path_factory.mktemp("spill")
    tps = [("k", p) for p in range(parts)]
    gate = Gate(partitions=tps, budget_bytes=budget, spill_dir=spill)
    cursor = {p: 0 for p in range(parts)}
    state: dict = {}
    last_ts = 0
    crashed = not crash
    durable = {"applied": 0, "resolved": {}, "restart": {tp: 0 for tp in tps}}
    while any(cursor[p] < len(logs[p]) for p in range(parts)):
        batch = []
        for p in range(parts):
            n = rng.randint(0, 4)
            for m in logs[p][cursor[p]:cursor[p] + n]:
                batch.append(materialise(m))
            cursor[p] = min(len(logs[p]), cursor[p] + n)
        rng.shuffle(batch)  # arrival across partitions is arbitrary...
        batch.sort(key=lambda e: (e.position.partition, e.position.offset))  # ...but in order within one
        gate.add(batch)
        g = gate.global_resolved()
        rel = gate.release()
        for ev in rel:
            assert ev.commit_ts <= g
            assert ev.commit_ts >= last_ts, "released out of commit order"
            last_ts = ev.commit_ts
            apply(state, ev)
        gate.forget(rel)
        cp = gate.checkpoint()
        durable = {"applied": gate.applied_ts, "resolved": {tp: c.resolved_ts for tp, c in cp.items()},
                   "restart": {tp: c.restart_offset for tp, c in cp.items()}, "state": dict(state)}
        if not crashed and rng.random() < 0.2:
            # crash: everything in memory is gone; rebuild from what was committed with the data
            crashed = True
            gate.close()
            gate = Gate(partitions=tps, applied_ts=durable["applied"], partition_resolved=durable["resolved"],
                        budget_bytes=budget, spill_dir=spill)
            for (_, p), off in durable["restart"].items():
                cursor[p] = off
            state = dict(durable["state"])
            last_ts = durable["applied"]
    assert gate.held == 0
    assert state == expected
    gate.close()


# ---- protocols without a watermark, and holds upstream of the gate ------------------------------------------

def test_ungated_releases_everything_in_offset_order_per_partition() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1)], gated=False, applied_ts=50)
    g.add([row(0, 0, 3, 1, 1), row(0, 1, 0, 2, 1), row(0, 0, 1, 1, 0), row(10, 0, 2, 3, 3)])
    out = drain(g)
    assert [(e.position.partition, e.position.offset) for e in out] == [(0, 1), (0, 2), (0, 3), (1, 0)]
    assert g.held == 0 and g.restart_offsets() == {("k", 0): 4, ("k", 1): 1}


def test_upstream_holds_cap_the_release_and_the_restart_offsets() -> None:
    holds = {"offsets": {("k", 0): 2}, "ts": 15}
    g = Gate(partitions=[("k", 0)], upstream_holds=lambda: (holds["offsets"], holds["ts"]))
    g.add([row(10, 0, 1, 1, 1), row(20, 0, 3, 2, 2), res(30, 0, 4)])
    assert [e.commit_ts for e in drain(g)] == [10]  # 20 waits: a held message at ts 15 must land first
    assert g.applied_ts == 14
    assert g.restart_offsets()[("k", 0)] == 2
    holds["offsets"], holds["ts"] = {}, None
    assert [e.commit_ts for e in drain(g)] == [20]


def test_replayed_transaction_cut_by_a_batch_boundary_keeps_the_row() -> None:
    """A TiCDC restart re-sends T2 (delete + insert of one key) after T2's resolved ts; a micro-batch boundary
    falls between the copy's delete and insert. Keeping the delete copy released 'del, ins, del' and then the
    insert copy was dropped as already applied: the row was lost."""
    g = Gate(partitions=[("k", 0)])
    msgs = [row(10, 0, 0, 1, 1), row(20, 0, 1, 1, None), row(20, 0, 2, 1, 2), res(20, 0, 3), res(9, 0, 4),
            row(20, 0, 5, 1, None), row(20, 0, 6, 1, 2), res(20, 0, 7)]
    state: dict = {}
    for batch in (msgs[:6], msgs[6:]):
        g.add(batch)
        for ev in drain(g):
            apply(state, ev)
    assert state == {("t", 1): 2}


def test_ungated_keeps_each_partitions_copy_of_a_broadcast_ddl() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1)], gated=False)
    g.add([ddl(0, 1, 0), ddl(0, 0, 0), row(0, 0, 1, 1, 1)])
    out = drain(g)
    assert [(type(e).__name__, e.position.partition) for e in out] == [("DDL", 0), ("RowChange", 0), ("DDL", 1)]


# ---- start and stop at a TSO (source.start_ts, applier run --until-ts) ---------------------------------------

def test_until_ts_caps_the_release_even_when_the_global_resolved_ts_is_beyond_it() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1)], until_ts=25)
    g.add([row(10, 0, 0, 1, 1), row(25, 1, 0, 2, 2), row(26, 0, 1, 1, 3), row(30, 1, 1, 3, 3),
           res(40, 0, 2), res(40, 1, 2)])
    assert [e.commit_ts for e in drain(g)] == [10, 25]  # 26 and 30 are below the global resolved ts 40, but after 25
    assert g.applied_ts == 25 and g.reached_until_ts
    assert g.held == 2
    assert g.restart_offsets() == {("k", 0): 1, ("k", 1): 1}  # a later run re-reads what is held above 25
    assert drain(g) == [] and g.applied_ts == 25  # further batches never pass it


def test_until_ts_is_reached_only_once_the_global_resolved_ts_passes_it() -> None:
    g = Gate(partitions=[("k", 0), ("k", 1)], until_ts=25)
    g.add([row(10, 0, 0, 1, 1), row(20, 1, 0, 2, 2), res(30, 0, 1), res(15, 1, 1)])
    assert [e.commit_ts for e in drain(g)] == [10]
    assert g.applied_ts == 15 and not g.reached_until_ts  # partition 1 may still send a change at 16..25
    g.add([row(22, 1, 2, 3, 3), res(50, 1, 3)])
    assert [e.commit_ts for e in drain(g)] == [20, 22]
    assert g.applied_ts == 25 and g.reached_until_ts


def test_until_ts_needs_a_gated_stream() -> None:
    with pytest.raises(ValueError, match="gated"):
        Gate(partitions=[("k", 0)], gated=False, until_ts=25)
    assert not Gate(partitions=[("k", 0)]).reached_until_ts


def test_a_start_ts_seeded_as_the_applied_ts_drops_what_the_snapshot_holds_and_keeps_the_rest() -> None:
    """A new pipeline with source.start_ts = 20 starts with applied_ts 20 (applier.pipeline.seed_start_ts): the
    change at 20 and the replayed older ones are in the snapshot; 21 is not, even when it arrives late."""
    g = Gate(partitions=[("k", 0), ("k", 1)], applied_ts=20)
    g.add([row(10, 0, 0, 1, 1), row(20, 1, 0, 2, 2), res(15, 0, 1), res(15, 1, 1)])
    assert drain(g) == [] and g.applied_ts == 20  # a resolved ts below start_ts never moves it back
    g.add([row(25, 0, 2, 1, 5), row(21, 1, 2, 3, 3), res(30, 0, 3), res(30, 1, 3)])
    assert [e.commit_ts for e in drain(g)] == [21, 25]
    assert g.stats["duplicates_dropped"] == 2


def _state_as_of(logs: dict, ts: int) -> dict:
    """The table state after every upstream change committed at or before ``ts`` (replayed copies included: they
    are the same changes, and commit order puts each where it belongs)."""
    state: dict = {}
    changes = [m for p in logs for m in logs[p] if m.ev[0] == "row" and m.ev[1] <= ts]
    for m in sorted(changes, key=lambda m: (m.ev[1], m.part, m.off)):
        apply(state, materialise(m))
    return state


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), parts=st.integers(1, 4), replay=st.booleans(),
       budget=st.sampled_from([10**9, 3000]))
def test_random_streams_start_at_a_snapshot_stop_at_exactly_until_ts_and_a_later_run_continues(
        seed: int, parts: int, replay: bool, budget: int, tmp_path_factory) -> None:
    """A replica seeded with the state as of S, a first run with until_ts T: it ends equal to the state as of
    exactly T with applied_ts T, having released only changes in (S, T]. A later run without until_ts, rebuilt
    from what the first committed (as after a restart), ends equal to the final state."""
    rng = random.Random(seed)
    logs, expected = make_stream(rng, parts, rng.randint(2, 40), replay)
    commits = sorted({m.ev[1] for p in logs for m in logs[p] if m.ev[0] == "row"})
    s, t = sorted(rng.sample(commits, 2)) if len(commits) > 1 else (commits[0] - 1, commits[0])
    tps = [("k", p) for p in range(parts)]
    spill = tmp_path_factory.mktemp("spill")
    state = _state_as_of(logs, s)  # the snapshot
    gate = Gate(partitions=tps, applied_ts=s, until_ts=t, budget_bytes=budget, spill_dir=spill)
    cursor = {p: 0 for p in range(parts)}
    durable: dict = {}
    while not gate.reached_until_ts:
        assert any(cursor[p] < len(logs[p]) for p in range(parts)), "the stream ended before until_ts was reached"
        batch = []
        for p in range(parts):
            n = rng.randint(0, 4)
            batch.extend(materialise(m) for m in logs[p][cursor[p]:cursor[p] + n])
            cursor[p] = min(len(logs[p]), cursor[p] + n)
        gate.add(batch)
        rel = gate.release()
        for ev in rel:
            assert s < ev.commit_ts <= t
            apply(state, ev)
        gate.forget(rel)
        cp = gate.checkpoint()
        durable = {"resolved": {tp: c.resolved_ts for tp, c in cp.items()},
                   "restart": {tp: c.restart_offset for tp, c in cp.items()}}
    assert gate.applied_ts == t
    assert state == _state_as_of(logs, t)
    gate.close()
    gate = Gate(partitions=tps, applied_ts=t, partition_resolved=durable["resolved"], budget_bytes=budget,
                spill_dir=spill)
    for (_, p), off in durable["restart"].items():
        cursor[p] = off
    while any(cursor[p] < len(logs[p]) for p in range(parts)):
        batch = []
        for p in range(parts):
            batch.extend(materialise(m) for m in logs[p][cursor[p]:cursor[p] + 3])
            cursor[p] = min(len(logs[p]), cursor[p] + 3)
        gate.add(batch)
        rel = gate.release()
        for ev in rel:
            assert ev.commit_ts > t
            apply(state, ev)
        gate.forget(rel)
    assert gate.held == 0
    assert state == expected
    gate.close()
