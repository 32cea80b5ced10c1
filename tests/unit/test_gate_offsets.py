"""Restart offsets are kept incrementally (not by scanning held events at every progress save); they must still
be exactly the lowest offset of any event held, in memory or spilled, after every partial release.

The reference here is the scan the gate no longer does: every held event, read back from memory and from the
spill files. A bookkeeping bug in either direction fails: an offset above the lowest held event loses that
event on restart; one below it (stale) re-reads more than needed, and for a spilled big transaction would
re-read it all.
"""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

import applier.spill as spill_mod
from applier.events import Column, Op, Resolved, RowChange, SourcePosition
from applier.gate import Gate
from tests.unit.gate_streams import make_stream, materialise

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "int"))


def held_events(g: Gate) -> list:
    out = []
    for r in g._runs._mem:
        out.extend(r.events[r.start:])
    for d in g._runs._disk:
        with open(d.path, "rb") as fh:
            spilled = [ev for b in d.blocks for ev in d.read_block(fh, b)]
        out.extend(spilled[d.consumed:])
    return out


def scanned_restart_offsets(g: Gate) -> dict:
    out = dict(g.next_offsets)
    for ev in held_events(g):
        tp = (ev.position.topic, ev.position.partition)
        if ev.position.offset < out.get(tp, ev.position.offset + 1):
            out[tp] = ev.position.offset
    return out


def row(ts: int, part: int, off: int, key: int) -> RowChange:
    return RowChange("s", "t", ts, Op.INSERT, None, {"id": key, "v": ts}, COLS, SourcePosition("k", part, off), 100)


def res(ts: int, part: int, off: int) -> Resolved:
    return Resolved(ts, SourcePosition("k", part, off))


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), parts=st.integers(1, 4), replay=st.booleans(),
       budget=st.sampled_from([10**9, 3000, 1]), block=st.sampled_from([1, 2, 3, 5, 2048]))
def test_restart_offsets_equal_a_scan_of_held_events_after_partial_releases(
        seed: int, parts: int, replay: bool, budget: int, block: int, tmp_path_factory) -> None:
    rng = random.Random(seed)
    logs, _ = make_stream(rng, parts, rng.randint(1, 40), replay)
    tps = [("k", p) for p in range(parts)]
    saved = spill_mod.SPILL_CHUNK_EVENTS
    spill_mod.SPILL_CHUNK_EVENTS = block
    try:
        g = Gate(partitions=tps, budget_bytes=budget, spill_dir=tmp_path_factory.mktemp("spill"))
        twin = Gate(partitions=tps)  # never spills
        cursor = {p: 0 for p in range(parts)}
        while any(cursor[p] < len(logs[p]) for p in range(parts)):
            batch = []
            for p in range(parts):
                n = rng.randint(0, 5)
                batch += [materialise(m) for m in logs[p][cursor[p]:cursor[p] + n]]
                cursor[p] = min(len(logs[p]), cursor[p] + n)
            rng.shuffle(batch)
            batch.sort(key=lambda e: (e.position.partition, e.position.offset))
            g.add(batch)
            twin.add(batch)
            # release up to a random point between what is applied and what could be: partial releases cut
            # runs and spilled blocks anywhere
            top = g.global_resolved()
            upto = rng.choice([None, rng.randint(min(g.applied_ts, top), max(g.applied_ts, top))])
            rel, rel_twin = g.release(upto), twin.release(upto)
            # mid-release (progress saved at a DDL): released events still count as held
            assert g.restart_offsets() == scanned_restart_offsets(g)
            got = [(e.commit_ts, e.position.partition, e.position.offset) for e in rel]
            assert got == [(e.commit_ts, e.position.partition, e.position.offset) for e in rel_twin]
            g.forget(rel)
            twin.forget(rel_twin)
            assert g.restart_offsets() == scanned_restart_offsets(g)
            assert g.restart_offsets() == twin.restart_offsets()
            restart = g.restart_offsets()
            assert {tp: c.restart_offset for tp, c in g.checkpoint().items()} == {
                tp: restart.get(tp, 0) for tp in set(g.resolved) | set(restart)}
        g.close()
    finally:
        spill_mod.SPILL_CHUNK_EVENTS = saved


def test_spilled_big_transaction_restart_offsets_follow_partial_releases(tmp_path, monkeypatch) -> None:
    """A big transaction (ts 20) is spilled with smaller ones around it; releasing those must move the restart
    offsets up to the big transaction's first offsets, not leave them where the spill started."""
    monkeypatch.setattr(spill_mod, "SPILL_CHUNK_EVENTS", 4)
    g = Gate(partitions=[("k", 0), ("k", 1)], budget_bytes=1, spill_dir=tmp_path)
    g.add([row(10, 0, 0, 1), row(10, 0, 1, 2), row(15, 1, 0, 3)]
          + [row(20, 0, 2 + i, 10 + i) for i in range(30)] + [row(20, 1, 1 + i, 50 + i) for i in range(30)])
    g.add([row(25, 0, 32, 99), row(26, 1, 31, 98)])
    assert g.stats["spills"] == 2
    assert g.restart_offsets() == {("k", 0): 0, ("k", 1): 0}
    g.add([res(16, 0, 33), res(16, 1, 32)])
    rel = g.release()
    assert [e.commit_ts for e in rel] == [10, 10, 15]
    g.forget(rel)
    assert g.restart_offsets() == {("k", 0): 2, ("k", 1): 1} == scanned_restart_offsets(g)
    g.add([res(20, 0, 34), res(20, 1, 33)])
    rel = g.release()
    assert len(list(rel)) == 60
    g.forget(rel)
    assert g.restart_offsets() == {("k", 0): 32, ("k", 1): 31} == scanned_restart_offsets(g)
    g.add([res(30, 0, 35), res(30, 1, 34)])
    g.forget(g.release())
    assert g.held == 0 and g.restart_offsets() == {("k", 0): 36, ("k", 1): 35}
    g.close()


def test_offsets_out_of_order_within_a_batch_are_still_covered(tmp_path) -> None:
    """add() expects offset order within a partition but must not lose an event if it does not get it."""
    for budget in (10**9, 1):
        g = Gate(partitions=[("k", 0)], budget_bytes=budget, spill_dir=tmp_path)
        g.add([row(30, 0, 7, 1), row(20, 0, 5, 2), row(20, 0, 3, 3), row(30, 0, 4, 4), row(20, 0, 9, 5)])
        assert g.restart_offsets() == {("k", 0): 3}
        g.add([res(25, 0, 10)])
        g.forget(g.release())
        assert g.restart_offsets() == {("k", 0): 4} == scanned_restart_offsets(g)
        g.close()


def test_a_held_transaction_costs_one_index_entry_per_partition_and_batch() -> None:
    """What makes checkpoint() cheap with a million held rows: the index collapses a transaction's run."""
    g = Gate(partitions=[("k", 0), ("k", 1)])
    g.add([row(50, i % 2, i // 2, i) for i in range(10_000)])
    (run,) = g._runs._mem
    assert sorted(len(p.offsets) for p in run.index._parts.values()) == [1, 1]
