"""applier.columnar.plan: plan_batch on Arrow arrays must give exactly what plan_batch gives on the same row
changes (deletes, upserts, their order, the key and row values with their types), or refuse (NotColumnar).

The differential test builds random windows of one table as RowChange events and as the Arrow table the lane
hands over (:func:`arrow_window`), and compares ``to_batch_plan(plan_arrow(...))`` with ``plan_batch(...)``
field by field, order, value types and representations (-0.0 against 0.0, Decimal scale) included.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest

from applier.columnar.plan import ArrowPlan, NotColumnar, plan_arrow, to_batch_plan
from applier.events import Column, Op, RowChange, SourcePosition
from applier.sinks.plan import BatchPlan, plan_batch
from applier.sinks.table import ApplyError, TableMeta, build_meta
from tests.unit.arrow_lane import strict

_OPS = {Op.INSERT: 0, Op.UPDATE: 1, Op.DELETE: 2}
DECIMAL = "decimal"  # a column type of these tests: decimals held as their text in a string column

# ---- the two forms of a window ---------------------------------------------------------------------------------


def arrow_window(events: list[RowChange], names: tuple[str, ...], types: dict[str, Any]) -> pa.Table:
    """The Arrow table the lane builds for these events: ``_ts``, ``_part``, ``_off``, ``_op``, then ``b:c`` and
    ``a:c`` per column (nulls where an op has no such image); a DECIMAL column holds the decimal's text."""
    cols: dict[str, pa.Array] = {
        "_ts": pa.array([e.commit_ts for e in events], pa.int64()),
        "_part": pa.array([e.position.partition for e in events], pa.int32()),
        "_off": pa.array([e.position.offset for e in events], pa.int64()),
        "_op": pa.array([_OPS[e.op] for e in events], pa.int8()),
    }
    for prefix, attr in (("b:", "before"), ("a:", "after")):
        for c in names:
            typ = types[c]
            vals = [None if getattr(e, attr) is None else getattr(e, attr)[c] for e in events]
            if typ == DECIMAL:
                cols[prefix + c] = pa.array([None if v is None else str(v) for v in vals], pa.string())
            else:
                cols[prefix + c] = pa.array(vals, typ)
    return pa.table(cols)


def python_values(types: dict[str, Any]):
    def to_python(column: str, arr: pa.Array) -> list:
        if types[column] == DECIMAL:
            return [None if v is None else Decimal(v) for v in arr.to_pylist()]
        return arr.to_pylist()
    return to_python


def both_plans(meta: TableMeta, events: list[RowChange], names: tuple[str, ...],
               types: dict[str, Any]) -> tuple[tuple, tuple]:
    expected = strict(plan_batch(meta, events))
    rows = arrow_window(events, names, types)
    got = strict(to_batch_plan(meta, plan_arrow(meta, rows, names), python_values(types)))
    return got, expected


def ev(op: Op, ts: int, before: dict | None, after: dict | None, off: int = 0) -> RowChange:
    cols = tuple(Column(c, "int") for c in (after or before or {}))
    return RowChange("s", "t", ts, op, before, after, cols, SourcePosition("topic", 0, off))


# ---- the differential property test -------------------------------------------------------------------------

_DOMAINS: dict[str, tuple[Any, list[Any]]] = {
    "int64": (pa.int64(), [1, 2, 3, 4, 5, -7]),
    "uint64": (pa.uint64(), [2**63 + 1, 2**63 + 2, 2**64 - 1, 4, 5]),
    "float64": (pa.float64(), [0.0, -0.0, 1.5, 2.0, -3.25, 1e300]),
    "string": (pa.string(), ["a", "b", "é", "", "1.50", "01"]),
    "binary": (pa.binary(), [b"a", b"\x00", b"", b"\xff\xfe", b"ab"]),
    "timestamp": (pa.timestamp("us"), [dt.datetime(2024, 1, 1, 0, 0, 0, 5), dt.datetime(2024, 1, 1),
                                       dt.datetime(1999, 12, 31, 23, 59, 59, 999999), dt.datetime(2024, 2, 29, 12)]),
    "date32": (pa.date32(), [dt.date(2024, 1, 1), dt.date(1970, 1, 1), dt.date(2038, 1, 20), dt.date(1, 1, 1)]),
    "decimal": (DECIMAL, [Decimal("1.50"), Decimal("-2.25"), Decimal("0.00"), Decimal("12345678901234567890.10")]),
}


class Shape:
    """A random table: a key of one or two columns of random types, a non-key unique column ``u``, plain
    columns ``v`` (nullable) and ``g`` (generated on the target, so never upserted)."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        kinds = list(_DOMAINS)
        self.compound = rnd.random() < 0.4
        self.key = ("k1", "k2") if self.compound else ("k1",)
        self.kinds = {c: rnd.choice(kinds) for c in self.key}
        self.kinds["u"] = rnd.choice(["int64", "string", "decimal", "float64"])
        self.types = {c: _DOMAINS[k][0] for c, k in self.kinds.items()}
        self.types.update(v=pa.string(), g=pa.int64())
        self.names = (*self.key, "u", "v", "g")
        self.null_keys = self.compound and rnd.random() < 0.3  # the second key column may hold NULL
        cols = [(c, c == "k2" and self.null_keys, False) for c in self.key]
        cols += [("u", True, False), ("v", True, False), ("g", True, True)]
        uniques = [("u",)] if rnd.random() < 0.8 else []
        self.meta = build_meta("s", "t", cols, self.key, uniques)

    def key_value(self) -> tuple:
        out = []
        for c in self.key:
            if c == "k2" and self.null_keys and self.rnd.random() < 0.25:
                out.append(None)
            else:
                out.append(self.rnd.choice(_DOMAINS[self.kinds[c]][1]))
        return tuple(out)

    def row(self, key: tuple) -> dict:
        r = self.rnd
        row = dict(zip(self.key, key))
        row["u"] = None if r.random() < 0.2 else r.choice(_DOMAINS[self.kinds["u"]][1])
        row["v"] = None if r.random() < 0.3 else r.choice(["x", "y", "zz", ""])
        row["g"] = r.randint(0, 3)
        return row


def free_window(sh: Shape, n: int) -> list[RowChange]:
    """Changes in any order of any keys: images drawn from small domains, commit ts repeating (several
    changes per ts) and now and then going back (a re-sent older change)."""
    r, out, ts = sh.rnd, [], 100
    for i in range(n):
        ts = ts + r.choice([0, 0, 1, 2]) if r.random() > 0.05 else max(1, ts - r.randint(1, 3))
        op = r.choice([Op.INSERT, Op.UPDATE, Op.UPDATE, Op.DELETE])
        before = sh.row(sh.key_value()) if op is not Op.INSERT else None
        after = None
        if op is Op.UPDATE and r.random() < 0.5:
            after = dict(before, v=r.choice(["x", "w", None]))  # same key
            if r.random() < 0.5:
                after["u"] = r.choice(_DOMAINS[sh.kinds["u"]][1] + [None])
        elif op is not Op.DELETE:
            after = sh.row(sh.key_value())
        out.append(ev(op, ts, before, after, i))
        if r.random() < 0.1:  # a duplicate (TiCDC re-send) of some earlier change
            d = r.choice(out)
            out.append(ev(d.op, d.commit_ts, d.before, d.after, i))
    return out


def stateful_window(sh: Shape, n: int) -> list[RowChange]:
    """Changes a real upstream table could give: inserts of free keys, updates of present rows (value changes,
    unique value changes, key moves), primary-key swaps of two rows inside one commit ts (either order), deletes
    and re-inserts, several versions per key across and within commit ts, re-sent duplicates."""
    r, out, ts = sh.rnd, [], 1000
    table: dict[tuple, dict] = {}

    def emit(op: Op, before: dict | None, after: dict | None) -> None:
        out.append(ev(op, ts, before, after, len(out)))

    while len(out) < n:
        ts += r.choice([0, 1, 1, 5])
        free = [k for k in (sh.key_value() for _ in range(4)) if k not in table]
        present = list(table)
        step = r.random()
        if step < 0.3 and free:
            row = sh.row(free[0])
            table[free[0]] = row
            emit(Op.INSERT, None, row)
        elif step < 0.5 and present:
            k = r.choice(present)
            new = dict(table[k], v=r.choice(["x", "y", None]))
            if r.random() < 0.4:
                new["u"] = r.choice(_DOMAINS[sh.kinds["u"]][1] + [None])
            emit(Op.UPDATE, table[k], new)
            table[k] = new
        elif step < 0.6 and present and free:  # a key move
            k = r.choice(present)
            new = dict(table.pop(k), **dict(zip(sh.key, free[0])))
            emit(Op.UPDATE, dict(new, **dict(zip(sh.key, k))), new)
            table[free[0]] = new
        elif step < 0.75 and len(present) >= 2:  # two rows swap keys in one transaction, in either order
            k1, k2 = r.sample(present, 2)
            a, b = table[k1], table[k2]
            a2, b2 = dict(a, **dict(zip(sh.key, k2))), dict(b, **dict(zip(sh.key, k1)))
            pair = [(a, a2), (b, b2)]
            r.shuffle(pair)
            for before, after in pair:
                emit(Op.UPDATE, before, after)
            table[k1], table[k2] = b2, a2
        elif step < 0.9 and present:
            k = r.choice(present)
            emit(Op.DELETE, table.pop(k), None)
            if r.random() < 0.5:  # re-inserted, in this ts or a later one
                ts += r.choice([0, 1])
                row = sh.row(k)
                table[k] = row
                emit(Op.INSERT, None, row)
        elif out:
            d = r.choice(out[-5:])
            out.append(ev(d.op, d.commit_ts, d.before, d.after, len(out)))
    return out


@pytest.mark.parametrize("seed", range(400))
def test_plan_arrow_is_plan_batch_on_random_windows(seed: int) -> None:
    rnd = random.Random(seed)
    sh = Shape(rnd)
    n = rnd.randint(1, 60)
    events = stateful_window(sh, n) if seed % 2 else free_window(sh, n)
    got, expected = both_plans(sh.meta, events, sh.names, sh.types)  # never refused: one spelling per decimal
    assert got == expected


def test_the_random_windows_reach_every_rule() -> None:
    """The differential test is only as good as its windows: across the seeds they collapse versions, change keys,
    block removals by written_at, change unique values, upsert rows after deleting them, hold -0.0 keys."""
    seen = dict(collapsed=0, key_changes=0, blocked=0, unique_changes=0, reinserted=0, float_keys=0)
    for seed in range(150):
        rnd = random.Random(seed)
        sh = Shape(rnd)
        events = stateful_window(sh, rnd.randint(1, 60)) if seed % 2 else free_window(sh, rnd.randint(1, 60))
        plan = plan_batch(sh.meta, events)
        keys = {tuple(e.after[c] for c in sh.key) for e in events if e.after}
        seen["collapsed"] += len(plan.upserts) < len(keys)
        seen["key_changes"] += any(e.op is Op.UPDATE and [e.before[c] for c in sh.key] != [e.after[c] for c in sh.key]
                                   for e in events)
        seen["unique_changes"] += any(e.op is Op.UPDATE and e.before["u"] != e.after["u"] for e in events)
        seen["reinserted"] += bool(set(plan.deletes) & {tuple(r[c] for c in sh.key) for r in plan.upserts})
        seen["float_keys"] += "float64" in sh.kinds.values()
        # a removal written_at blocks: without the rule, the plan would differ
        seen["blocked"] += _plan_without_written_at(sh.meta, events) != strict(plan)
    assert all(v > 5 for v in seen.values()), seen


def _plan_without_written_at(meta: TableMeta, events: list[RowChange]) -> tuple:
    """plan_batch with every change given its own commit ts: the written_at rule never applies."""
    return strict(plan_batch(meta, [ev(e.op, i, e.before, e.after, i) for i, e in enumerate(events)]))


# ---- each rule, on a window small enough to read ---------------------------------------------------------------

META = build_meta("s", "t", [("id", False, False), ("u", True, False), ("v", True, False), ("g", True, True)],
                  ("id",), [("u",)])
NAMES = ("id", "u", "v", "g")
TYPES = {"id": pa.int64(), "u": pa.int64(), "v": pa.string(), "g": pa.int64()}


def row(id_: Any, v: Any = "x", u: Any = None, g: int = 0) -> dict:
    return {"id": id_, "u": u, "v": v, "g": g}


def plans(events: list[RowChange], meta: TableMeta = META, names: tuple[str, ...] = NAMES,
          types: dict[str, Any] = TYPES) -> BatchPlan:
    got, expected = both_plans(meta, events, names, types)
    assert got == expected
    return plan_batch(meta, events)


def test_several_versions_of_a_key_collapse_to_the_last_in_the_last_ones_place() -> None:
    p = plans([ev(Op.INSERT, 1, None, row(1, "a")), ev(Op.INSERT, 1, None, row(2, "b")),
               ev(Op.UPDATE, 2, row(1, "a"), row(1, "c")), ev(Op.UPDATE, 2, row(2, "b"), row(2, "d")),
               ev(Op.UPDATE, 3, row(1, "c"), row(1, "e"))])
    assert p.deletes == []
    assert p.upserts == [{"id": 2, "u": None, "v": "d"}, {"id": 1, "u": None, "v": "e"}]


def test_a_deleted_key_is_deleted_first_and_re_inserted_when_it_has_a_final_row() -> None:
    p = plans([ev(Op.INSERT, 1, None, row(1)), ev(Op.DELETE, 2, row(1), None), ev(Op.INSERT, 3, None, row(1, "new")),
               ev(Op.DELETE, 3, row(2), None)])
    assert p.deletes == [(1,), (2,)]
    assert p.upserts == [{"id": 1, "u": None, "v": "new"}]


def test_a_key_change_deletes_the_old_key() -> None:
    p = plans([ev(Op.UPDATE, 1, row(1, "a"), row(7, "a")), ev(Op.UPDATE, 2, row(7, "a"), row(8, "b"))])
    assert p.deletes == [(1,), (7,)]
    assert p.upserts == [{"id": 8, "u": None, "v": "b"}]


@pytest.mark.parametrize("first", [0, 1])
def test_a_primary_key_swap_inside_one_commit_ts_keeps_both_rows_in_either_order(first: int) -> None:
    swap = [ev(Op.UPDATE, 5, row(4, "four"), row(5, "four")), ev(Op.UPDATE, 5, row(5, "five"), row(4, "five"))]
    p = plans(swap if first == 0 else swap[::-1])
    assert sorted(p.deletes) == [(4,), (5,)]
    assert sorted(r["v"] for r in p.upserts) == ["five", "four"]


def test_across_commit_ts_a_removal_undoes_the_earlier_write() -> None:
    p = plans([ev(Op.UPDATE, 5, row(4, "four"), row(5, "four")), ev(Op.UPDATE, 6, row(5, "four"), row(6, "four")),
               ev(Op.INSERT, 7, None, row(9)), ev(Op.DELETE, 8, row(9), None)])
    assert p.deletes == [(4,), (5,), (9,)]
    assert p.upserts == [{"id": 6, "u": None, "v": "four"}]


def test_within_one_commit_ts_a_delete_after_a_write_of_that_key_leaves_the_row() -> None:
    p = plans([ev(Op.INSERT, 5, None, row(1, "kept")), ev(Op.DELETE, 5, row(1, "old"), None)])
    assert p.deletes == [(1,)]
    assert p.upserts == [{"id": 1, "u": None, "v": "kept"}]


def test_a_changed_non_key_unique_value_puts_the_new_key_in_the_deletes() -> None:
    p = plans([ev(Op.UPDATE, 1, row(1, u=10), row(1, u=11)), ev(Op.UPDATE, 1, row(2, u=None), row(2, u=None)),
               ev(Op.UPDATE, 2, row(3, u=None), row(3, u=12)), ev(Op.UPDATE, 2, row(4, u=13), row(4, u=13))])
    assert p.deletes == [(1,), (3,)]
    assert [r["id"] for r in p.upserts] == [1, 2, 3, 4]


def test_deletes_come_in_first_removal_order_and_a_key_change_precedes_its_unique_change() -> None:
    p = plans([ev(Op.UPDATE, 1, row(1, u=1), row(2, u=2)), ev(Op.DELETE, 2, row(3), None),
               ev(Op.DELETE, 3, row(2), None), ev(Op.DELETE, 3, row(1), None)])
    assert p.deletes == [(1,), (2,), (3,)]


def test_columns_generated_on_the_target_are_not_upserted() -> None:
    p = plans([ev(Op.INSERT, 1, None, row(1, g=5))])
    assert list(p.upserts[0]) == ["id", "u", "v"]


def test_null_key_values_are_one_key_like_none() -> None:
    meta = build_meta("s", "t", [("a", False, False), ("b", True, False), ("v", True, False)], ("a", "b"), [])
    types = {"a": pa.int64(), "b": pa.string(), "v": pa.string()}
    p = plans([ev(Op.INSERT, 1, None, {"a": 1, "b": None, "v": "x"}),
               ev(Op.INSERT, 2, None, {"a": 1, "b": None, "v": "y"}),
               ev(Op.UPDATE, 3, {"a": 1, "b": "", "v": "z"}, {"a": 1, "b": None, "v": "z"})],
              meta, ("a", "b", "v"), types)
    assert p.deletes == [(1, "")]
    assert p.upserts == [{"a": 1, "b": None, "v": "z"}]


def test_minus_zero_is_the_key_zero_and_the_deletes_keep_the_first_spelling() -> None:
    meta = build_meta("s", "t", [("f", False, False), ("v", True, False)], ("f",), [])
    types = {"f": pa.float64(), "v": pa.string()}
    p = plans([ev(Op.DELETE, 1, {"f": -0.0, "v": "a"}, None), ev(Op.INSERT, 2, None, {"f": 0.0, "v": "b"}),
               ev(Op.DELETE, 3, {"f": 0.0, "v": "b"}, None),
               ev(Op.UPDATE, 3, {"f": 1.0, "v": "c"}, {"f": -0.0, "v": "c"})],
              meta, ("f", "v"), types)
    assert repr(p.deletes) == "[(-0.0,), (1.0,)]"
    assert repr(p.upserts) == "[{'f': -0.0, 'v': 'c'}]"


@pytest.mark.parametrize("kind", ["uint64", "string", "binary", "timestamp", "date32", "decimal"])
def test_a_compound_key_of_each_type(kind: str) -> None:
    typ, values = _DOMAINS[kind]
    meta = build_meta("s", "t", [("a", False, False), ("b", False, False), ("v", True, False)], ("a", "b"), [])
    x, y = values[0], values[1]
    plans([ev(Op.INSERT, 1, None, {"a": 1, "b": x, "v": "1"}), ev(Op.UPDATE, 1, {"a": 1, "b": x, "v": "1"},
                                                                    {"a": 1, "b": y, "v": "2"}),
           ev(Op.INSERT, 2, None, {"a": 2, "b": x, "v": "3"}), ev(Op.DELETE, 3, {"a": 1, "b": y, "v": "2"}, None)],
          meta, ("a", "b", "v"), {"a": pa.int64(), "b": typ, "v": pa.string()})


def test_an_empty_window_plans_nothing() -> None:
    rows = arrow_window([], NAMES, TYPES)
    a = plan_arrow(META, rows, NAMES)
    assert (a.deletes.column_names, a.upserts.column_names, a.changes) == (["id"], ["id", "u", "v"], 0)
    assert strict(to_batch_plan(META, a, python_values(TYPES))) == strict(plan_batch(META, []))


def test_the_arrow_plan_names_its_columns_as_the_target() -> None:
    a = plan_arrow(META, arrow_window([ev(Op.DELETE, 1, row(1), None), ev(Op.INSERT, 2, None, row(2))], NAMES, TYPES),
                   NAMES)
    assert isinstance(a, ArrowPlan)
    assert a.deletes.to_pydict() == {"id": [1]}
    assert a.upserts.to_pydict() == {"id": [2], "u": [None], "v": ["x"]}


# ---- refusals: whatever plan_batch refuses, and whatever Arrow would not compare as Python does ------------------

def refused(events: list[RowChange], meta: TableMeta = META, names: tuple[str, ...] = NAMES,
            types: dict[str, Any] = TYPES, rows: pa.Table | None = None) -> str:
    with pytest.raises(NotColumnar) as exc:
        plan_arrow(meta, arrow_window(events, names, types) if rows is None else rows, names)
    return str(exc.value)


def test_a_keyless_table_is_refused() -> None:
    meta = build_meta("s", "t", [("a", True, False)], (), [])
    assert "no key" in refused([ev(Op.INSERT, 1, None, {"a": 1})], meta, ("a",), {"a": pa.int64()})


def test_a_key_column_missing_from_the_images_is_refused_as_plan_batch_refuses_it() -> None:
    names = ("u", "v", "g")
    events = [ev(Op.DELETE, 1, {"u": 1, "v": "x", "g": 0}, None)]
    with pytest.raises(ApplyError, match="lacks key column"):
        plan_batch(META, events)
    assert "key column" in refused(events, META, names, TYPES)


def test_a_column_the_target_lacks_is_refused_in_an_insert_or_update_not_in_a_delete() -> None:
    names = (*NAMES, "extra")
    types = dict(TYPES, extra=pa.int64())
    ins = [ev(Op.INSERT, 1, None, dict(row(1), extra=1))]
    with pytest.raises(ApplyError, match="lacks"):
        plan_batch(META, ins)
    assert "lacks" in refused(ins, META, names, types)
    plans([ev(Op.DELETE, 1, dict(row(1), extra=1), None)], META, names, types)


@pytest.mark.parametrize("op,before,after,raises", [(Op.INSERT, None, None, True), (Op.UPDATE, row(1), None, True),
                                                     (Op.UPDATE, None, row(1), False), (Op.DELETE, None, None, True)])
def test_a_row_without_an_image_is_refused(op: Op, before: dict | None, after: dict | None, raises: bool) -> None:
    # plan_batch refuses an insert, update or delete without its row and skips an update's old key without its
    # old image; in the arrays an absent image is all null, as an image of nulls would be
    e = ev(op, 1, before, after)
    if raises:
        with pytest.raises(ApplyError, match="no row image"):
            plan_batch(META, [e])
    assert "all null" in refused([e])


def test_an_update_with_an_image_of_nulls_is_refused_too() -> None:
    nulls = {c: None for c in NAMES}
    assert "all null" in refused([ev(Op.UPDATE, 1, nulls, row(1))])


def test_nan_in_a_key_is_refused() -> None:
    meta = build_meta("s", "t", [("f", False, False), ("v", True, False)], ("f",), [])
    types = {"f": pa.float64(), "v": pa.string()}
    assert "NaN" in refused([ev(Op.INSERT, 1, None, {"f": float("nan"), "v": "a"})], meta, ("f", "v"), types)


@pytest.mark.parametrize("texts", [("1.5", "1.50"), ("-0.00", "0.00"), ("007", "7"), ("1.0", "1")])
def test_two_texts_of_one_decimal_value_in_a_key_or_unique_column_are_refused(texts: tuple[str, str]) -> None:
    meta = build_meta("s", "t", [("d", False, False), ("u", True, False)], ("d",), [("u",)])
    types = {"d": pa.string(), "u": pa.string()}
    x, y = texts
    two = [ev(Op.INSERT, 1, None, {"d": x, "u": "a"}), ev(Op.INSERT, 2, None, {"d": y, "u": "b"})]
    assert "decimal" in refused(two, meta, ("d", "u"), types)
    assert "decimal" in refused([ev(Op.UPDATE, 1, {"d": "k", "u": x}, {"d": "k", "u": y})], meta, ("d", "u"), types)
    # one spelling per value is exact, as text or as Decimal
    plans([ev(Op.INSERT, 1, None, {"d": x, "u": "a"}), ev(Op.DELETE, 2, {"d": x, "u": "a"}, None)],
          meta, ("d", "u"), types)


def test_a_type_arrow_does_not_group_here_is_refused() -> None:
    meta = build_meta("s", "t", [("b", False, False), ("v", True, False)], ("b",), [])
    assert "not compared" in refused([ev(Op.INSERT, 1, None, {"b": True, "v": "a"})], meta, ("b", "v"),
                                    {"b": pa.bool_(), "v": pa.string()})


def test_images_of_different_types_are_refused() -> None:
    rows = arrow_window([ev(Op.UPDATE, 1, row(1), row(2))], NAMES, TYPES)
    rows = rows.set_column(rows.schema.get_field_index("a:id"), "a:id", pa.array([2], pa.uint64()))
    assert "type" in refused([], rows=rows)


def test_an_unknown_op_or_a_missing_column_is_refused() -> None:
    rows = arrow_window([ev(Op.INSERT, 1, None, row(1))], NAMES, TYPES)
    bad = rows.set_column(rows.schema.get_field_index("_op"), "_op", pa.array([3], pa.int8()))
    assert "_op" in refused([], rows=bad)
    assert "a:u" in refused([], rows=rows.drop_columns(["a:u"]))


def test_null_typed_image_columns_are_taken() -> None:
    """A window of inserts only may carry its before images as null-typed columns, and a column that is NULL in
    every image of the window (here the unique column) may be null-typed in both images."""
    events = [ev(Op.INSERT, 1, None, row(1)), ev(Op.INSERT, 1, None, row(1, "y"))]
    rows = arrow_window(events, NAMES, TYPES)
    for c in NAMES:
        i = rows.schema.get_field_index("b:" + c)
        rows = rows.set_column(i, "b:" + c, pa.nulls(rows.num_rows))
    got = strict(to_batch_plan(META, plan_arrow(META, rows, NAMES), python_values(TYPES)))
    assert got == strict(plan_batch(META, events))
    events = [ev(Op.UPDATE, 1, row(1), row(1, "y")), ev(Op.UPDATE, 1, row(2), row(3)), ev(Op.DELETE, 2, row(5), None)]
    rows = arrow_window(events, NAMES, TYPES)
    for c in ("b:u", "a:u"):
        rows = rows.set_column(rows.schema.get_field_index(c), c, pa.nulls(rows.num_rows))
    got = strict(to_batch_plan(META, plan_arrow(META, rows, NAMES), python_values(TYPES)))
    assert got == strict(plan_batch(META, events))


@pytest.mark.parametrize("values", [[1, 2, 3], [1, 2, 10**15], [2**64 - 3, 2**64 - 1, 2**64 - 2], [-5, -4, 2**62]])
def test_integer_keys_dense_or_sparse_with_nulls(values: list[int]) -> None:
    """Integer key ids are the values' offsets when their range is small, hashed otherwise; NULL is an id of
    its own either way (not the lowest value's)."""
    meta = build_meta("s", "t", [("a", True, False), ("b", False, False), ("v", True, False)], ("a", "b"), [])
    typ = pa.uint64() if values[0] >= 2**63 else pa.int64()
    types = {"a": typ, "b": pa.int64(), "v": pa.string()}
    x, y, z = values
    plans([ev(Op.INSERT, 1, None, {"a": x, "b": 1, "v": "1"}), ev(Op.INSERT, 1, None, {"a": None, "b": 1, "v": "2"}),
           ev(Op.UPDATE, 2, {"a": y, "b": 1, "v": "3"}, {"a": None, "b": 1, "v": "4"}),
           ev(Op.DELETE, 3, {"a": x, "b": 1, "v": "5"}, None), ev(Op.INSERT, 4, None, {"a": z, "b": 1, "v": "6"}),
           ev(Op.DELETE, 4, {"a": None, "b": 2, "v": "7"}, None)],
          meta, ("a", "b", "v"), types)
