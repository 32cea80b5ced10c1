"""Collapsing ordered row changes into deletes-then-upserts (invariant 5 and idempotence)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st
from sqlalchemy import Column as SAColumn, Integer, MetaData, String, Table

from applier.events import Column, Op, RowChange, SourcePosition
from applier.sinks.plan import plan_batch
from applier.sinks.table import ApplyError, TableMeta, build_meta

COLS = (Column("id", "int", key=True, nullable=False), Column("email", "varchar", unique=True), Column("v", "int"))


def meta(key=("id",), uniques=(("id",), ("email",))) -> TableMeta:
    t = Table("t", MetaData(), SAColumn("id", Integer, primary_key=True), SAColumn("email", String(10)),
              SAColumn("v", Integer))
    return TableMeta("s", "t", t, ("id", "email", "v"), frozenset({"id", "email", "v"}), key, uniques)


def ch(op: Op, before=None, after=None, ts=1, off=0) -> RowChange:
    return RowChange("s", "t", ts, op, before, after, COLS, SourcePosition("k", 0, off))


def r(i, e, v=0):
    return {"id": i, "email": e, "v": v}


def test_versions_of_one_key_collapse_to_the_last() -> None:
    p = plan_batch(meta(), [ch(Op.INSERT, after=r(1, "a", 1)), ch(Op.UPDATE, r(1, "a", 1), r(1, "a", 2)),
                            ch(Op.UPDATE, r(1, "a", 2), r(1, "a", 3))])
    assert p.deletes == [] and p.upserts == [r(1, "a", 3)] and p.changes == 3


def test_primary_key_change_is_delete_old_then_insert_new() -> None:
    p = plan_batch(meta(), [ch(Op.UPDATE, r(1, "a"), r(2, "a"))])
    assert p.deletes == [(1,)] and p.upserts == [r(2, "a")]


def test_unique_key_change_deletes_the_row_before_reinserting() -> None:
    # swap emails of 1 and 2: without deleting first, the upsert of 1 would collide with 2's old email
    p = plan_batch(meta(), [ch(Op.UPDATE, r(1, "a"), r(1, "b")), ch(Op.UPDATE, r(2, "b"), r(2, "a"))])
    assert sorted(p.deletes) == [(1,), (2,)]
    assert p.upserts == [r(1, "b"), r(2, "a")]


def test_delete_then_reinsert_keeps_the_row() -> None:
    p = plan_batch(meta(), [ch(Op.DELETE, before=r(1, "a")), ch(Op.INSERT, after=r(1, "z", 9))])
    assert p.deletes == [(1,)] and p.upserts == [r(1, "z", 9)]


def test_insert_then_delete_leaves_only_the_delete() -> None:
    p = plan_batch(meta(), [ch(Op.INSERT, after=r(1, "a")), ch(Op.DELETE, before=r(1, "a"), ts=2)])
    assert p.deletes == [(1,)] and p.upserts == []


def test_table_without_a_usable_key_is_planned_change_by_change_not_collapsed() -> None:
    """No key, nothing to collapse by: every change stays, in order (more in tests/unit/test_keyless.py)."""
    p = plan_batch(meta(key=(), uniques=()), [ch(Op.INSERT, after=r(1, "a")), ch(Op.INSERT, after=r(1, "a"), off=1),
                                              ch(Op.DELETE, before=r(1, "a"), off=2)])
    assert p.deletes == [] and p.upserts == [] and p.changes == 3
    assert [(o.op, o.before, o.after, o.position.offset) for o in p.keyless] == [
        (Op.INSERT, None, r(1, "a"), 0), (Op.INSERT, None, r(1, "a"), 1), (Op.DELETE, r(1, "a"), None, 2)]


def test_column_missing_in_target_names_the_fix() -> None:
    with pytest.raises(ApplyError, match="apply the upstream DDL"):
        plan_batch(meta(), [ch(Op.INSERT, after=dict(r(1, "a"), extra=1))])


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 10**9))
def test_plan_applied_to_a_model_equals_sequential_apply(seed: int) -> None:
    """Applying the plan (deletes, then upserts in order) to any start state equals applying the changes one by
    one; applying it twice changes nothing more (idempotence)."""
    rng = random.Random(seed)
    state = {i: r(i, f"e{i}", 0) for i in range(5)}
    seq = dict(state)
    changes = []
    nxt = 10
    for n in range(rng.randint(1, 30)):
        k = rng.choice(sorted(seq)) if seq else None
        x = rng.random()
        if k is None or x < 0.3:
            row = r(nxt, f"e{nxt}", n)
            nxt += 1
            changes.append(ch(Op.INSERT, after=row, ts=n))
            seq[row["id"]] = row
        elif x < 0.6:
            new = dict(seq[k], v=n)
            changes.append(ch(Op.UPDATE, seq[k], new, ts=n))
            seq[k] = new
        elif x < 0.8:
            new = dict(seq[k], id=nxt)
            nxt += 1
            changes.append(ch(Op.UPDATE, seq.pop(k), new, ts=n))
            seq[new["id"]] = new
        else:
            changes.append(ch(Op.DELETE, before=seq.pop(k), ts=n))
    plan = plan_batch(meta(), changes)

    def apply(s):
        s = dict(s)
        for (k,) in plan.deletes:
            s.pop(k, None)
        for row in plan.upserts:
            s[row["id"]] = row
        return s

    once = apply(state)
    assert once == seq
    assert apply(once) == seq


def test_two_rows_swapping_primary_keys_in_one_transaction_keep_both_rows() -> None:
    """Rows A (id 4) and B (id 5) swap ids in one transaction: TiCDC sends the two updates in either order, and
    the removal of each old key must not undo the row the other update wrote (found by the history mode's tests:
    replica mode lost row 5)."""
    cols = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))
    meta = build_meta("s", "t", [("id", False, False), ("v", True, False)], ("id",), [])
    pos = SourcePosition("t", 0, 0)
    a = RowChange("s", "t", 7, Op.UPDATE, {"id": 4, "v": "A"}, {"id": 5, "v": "A"}, cols, pos)
    b = RowChange("s", "t", 7, Op.UPDATE, {"id": 5, "v": "B"}, {"id": 4, "v": "B"}, cols, pos)
    for order in ([a, b], [b, a]):
        plan = plan_batch(meta, order)
        assert sorted(plan.deletes) == [(4,), (5,)]
        assert sorted((r["id"], r["v"]) for r in plan.upserts) == [(4, "B"), (5, "A")]
    # split by TiCDC into deletes and inserts, in the order it sends them
    d4 = RowChange("s", "t", 7, Op.DELETE, {"id": 4, "v": "A"}, None, cols, pos)
    i5 = RowChange("s", "t", 7, Op.INSERT, None, {"id": 5, "v": "A"}, cols, pos)
    d5 = RowChange("s", "t", 7, Op.DELETE, {"id": 5, "v": "B"}, None, cols, pos)
    i4 = RowChange("s", "t", 7, Op.INSERT, None, {"id": 4, "v": "B"}, cols, pos)
    plan = plan_batch(meta, [d4, i5, d5, i4])
    assert sorted((r["id"], r["v"]) for r in plan.upserts) == [(4, "B"), (5, "A")]
    # across commit ts, order decides as before: an insert at ts 7 and a delete at ts 8 leave nothing
    gone = RowChange("s", "t", 8, Op.DELETE, {"id": 5, "v": "A"}, None, cols, pos)
    assert plan_batch(meta, [i5, gone]).upserts == []
    # ungated (replace mode: no usable commit ts) keeps plain order
    assert plan_batch(meta, [i5, d5], replace=True).upserts == []
