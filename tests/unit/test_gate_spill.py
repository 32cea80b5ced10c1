"""The gate's spill format: exact round trip of every value type the codecs produce, the block merge, and what
happens to spill files (removed when released, errors that say what to do).

Exactness is checked with :func:`same`: equal type and equal pickle bytes, so ``Decimal('1.50')`` differs from
``Decimal('1.5')``, ``-0.0`` from ``0.0``, a NaN payload or a datetime's ``fold`` counts, and NaN equals itself.
"""

from __future__ import annotations

import datetime as dt
import enum
import gc
import heapq
import math
import pickle
import struct
from collections import OrderedDict
from decimal import Decimal
from operator import itemgetter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import applier.blocks as blocks_mod
import applier.spill as spill_mod
from applier.blocks import BlockCodec
from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition

from applier.gate import Gate
from applier.spill import SpillError, _merge_slices


class Label(str):
    """A str subclass: must come back as itself, not as str."""


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class TaggedRow(RowChange):
    """A RowChange subclass (not the exact class): pickled whole, must come back as itself."""


def same(a: Any, b: Any) -> bool:
    """Exactly the same value: same type and same pickle bytes (NaN equals itself, -0.0 differs from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)) and not isinstance(a, (str, bytes)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return pickle.dumps(a, protocol=5) == pickle.dumps(b, protocol=5)


def same_event(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, RowChange):
        return (
            (a.schema, a.table, a.commit_ts, a.op, a.columns, a.position, a.size)
            == (b.schema, b.table, b.commit_ts, b.op, b.columns, b.position, b.size)
            and same(a.before, b.before) and same(a.after, b.after)
        )
    return a == b


# ---- value strategies: what applier/codecs/*.py can produce, and some they do not ----------------------------

_OFFSETS = st.timedeltas(min_value=-dt.timedelta(hours=23, minutes=59), max_value=dt.timedelta(hours=23, minutes=59))
_TZ = st.one_of(st.just(dt.timezone.utc), st.builds(dt.timezone, _OFFSETS))
_NAN_PAYLOAD = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_1234))[0]

VALUE_KINDS: dict[str, st.SearchStrategy[Any]] = {
    "int": st.one_of(st.integers(), st.integers(2**63, 2**64 - 1), st.integers(-(2**80), 2**80)),
    "bool": st.booleans(),
    "float": st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                       st.sampled_from([-0.0, 0.0, math.inf, -math.inf, _NAN_PAYLOAD, 5e-324])),
    "decimal": st.one_of(
        st.decimals(allow_nan=True, allow_infinity=True),
        st.sampled_from([Decimal("-0"), Decimal("-0.00"), Decimal("1.500"), Decimal("1E+10"), Decimal("-1E-30"),
                         Decimal("sNaN"), Decimal("-NaN123"), Decimal("Infinity"), Decimal("12345678901234567890.12")]),
    ),
    "str": st.one_of(st.text(), st.text(st.characters(codec=None, categories=None)),
                     st.sampled_from(["", "\x00", "a\x00b", "\ud800", "0000-00-00", "2020-00-15 00:00:00", "🚀"])),
    "bytes": st.one_of(st.binary(), st.sampled_from([b"", b"\x00", b"\x00\xff\x00", bytes(range(256))])),
    "datetime": st.one_of(st.datetimes(), st.datetimes().map(lambda d: d.replace(fold=1))),
    "datetime_tz": st.datetimes(timezones=_TZ),
    "date": st.dates(),
    "time": st.one_of(st.times(), st.times().map(lambda t: t.replace(fold=1))),
    "time_tz": st.times(timezones=_TZ),
    "timedelta": st.timedeltas(),
    "json_like": st.recursive(st.none() | st.integers() | st.text(max_size=5),
                              lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                             max_size=3),
                              max_leaves=6),
    "other": st.sampled_from([Label("x"), Level.HIGH, OrderedDict(a=1), frozenset({1}), (1, "a")]),
}


@st.composite
def column_values(draw: st.DrawFn, n: int) -> list[Any]:
    """``n`` values of one column: mostly one kind (as a real column), sometimes with nulls, sometimes mixed."""
    mode = draw(st.sampled_from(["one", "one", "nullable", "mixed", "null"]))
    if mode == "null":
        return [None] * n
    if mode == "mixed":
        return [draw(st.none() | st.one_of(*VALUE_KINDS.values())) for _ in range(n)]
    kind = VALUE_KINDS[draw(st.sampled_from(sorted(VALUE_KINDS)))]
    if mode == "nullable":
        return [draw(st.none() | kind) for _ in range(n)]
    return [draw(kind) for _ in range(n)]


COLS_A = (Column("id", "bigint", nullable=False, key=True), Column("v", "varchar"))
COLS_A2 = (Column("id", "bigint", nullable=False, key=True), Column("v", "varchar", type_code=253))
COLS_B = (Column("k", "int", nullable=False, key=True), Column("x", "datetime"), Column("y", "decimal"))


@st.composite
def event_blocks(draw: st.DrawFn) -> list[Any]:
    """A block of held events of several shapes (tables, ops, image key orders, column metadata), in any order."""
    n_shapes = draw(st.integers(1, 4))
    shapes = []
    for _ in range(n_shapes):
        names = draw(st.lists(st.sampled_from(["id", "v", "w", "x", "y", "z"]), unique=True, max_size=5))
        op = draw(st.sampled_from(list(Op)))
        before = op is not Op.INSERT and draw(st.booleans() if op is Op.UPDATE else st.just(True))
        after = op is not Op.DELETE
        cols = draw(st.sampled_from([COLS_A, COLS_A2, COLS_B, (), COLS_A + COLS_B]))
        table = draw(st.sampled_from(["t1", "t2"]))
        topic = draw(st.sampled_from(["k", "other"]))
        shapes.append((names, op, before, after, cols, table, topic))
    n = draw(st.integers(1, 30))
    which = draw(st.lists(st.integers(0, n_shapes - 1), min_size=n, max_size=n))
    per_shape_values = {}
    for s, (names, _, before, after, *_rest) in enumerate(shapes):
        count = which.count(s)
        per_shape_values[s] = {
            side: {name: draw(column_values(count)) for name in names}
            for side, present in (("before", before), ("after", after)) if present
        }
    events: list[Any] = []
    seen = {s: 0 for s in range(n_shapes)}
    for i, s in enumerate(which):
        names, op, before, after, cols, table, topic = shapes[s]
        j = seen[s]
        seen[s] += 1
        images = {side: {name: vals[j] for name, vals in cols_.items()}
                  for side, cols_ in per_shape_values[s].items()}
        ts = draw(st.sampled_from([0, 1, 2**62, 446_000_000_000_000_000]))
        size = draw(st.sampled_from([0, 17, 10**6]))
        events.append(RowChange("s", table, ts, op, images.get("before"), images.get("after"), cols,
                                SourcePosition(topic, draw(st.integers(0, 3)), i), size))
    extras = draw(st.lists(st.sampled_from(["ddl", "ordered", "subclass"]), max_size=3))
    for k, kind in enumerate(extras):
        pos = SourcePosition("k", 0, 1000 + k)
        if kind == "ddl":
            ev: Any = DDL("s", "t1", 5, "alter table t1 add column q int", pos, "ALTER", 40)
        elif kind == "ordered":  # an image that is not a plain dict: kept as its own type
            ev = RowChange("s", "t1", 5, Op.INSERT, None, OrderedDict(id=1, v="x"), COLS_A, pos, 3)
        else:
            ev = TaggedRow("s", "t1", 5, Op.DELETE, {"id": 2}, None, COLS_A, pos, 3)
        events.insert(draw(st.integers(0, len(events))), ev)
    return events


# ---- round trip -------------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(blocks=st.lists(event_blocks(), min_size=1, max_size=3))
def test_codec_round_trips_every_value_exactly(blocks: list[list[Any]]) -> None:
    codec = BlockCodec()
    encoded = [codec.encode(b) for b in blocks]
    codec.finish()
    for block, (core, rest) in zip(blocks, encoded):
        back = codec.decode(core, rest)
        assert len(back) == len(block)
        for a, b in zip(block, back):
            assert same_event(a, b), (a, b)


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(sorted(VALUE_KINDS)), data=st.data())
def test_each_value_kind_round_trips_as_a_whole_column(kind: str, data: st.DataObject) -> None:
    """One column of one kind, with and without nulls: the typed fast paths (Decimal text, date/time state,
    timedelta arguments) and the fallback to ordinary pickle."""
    values = data.draw(st.lists(VALUE_KINDS[kind], min_size=1, max_size=20))
    if data.draw(st.booleans()):
        values[data.draw(st.integers(0, len(values) - 1))] = None
    events = [RowChange("s", "t", 1, Op.INSERT, None, {"id": i, "v": v}, COLS_A, SourcePosition("k", 0, i), 1)
              for i, v in enumerate(values)]
    codec = BlockCodec()
    back = codec.decode(*codec.encode(events))
    assert all(same_event(a, b) for a, b in zip(events, back)) and len(back) == len(events)


def test_typed_columns_take_the_fast_paths() -> None:
    """Decimal, naive datetime/date/time and timedelta columns are stored as builtins, not pickled objects
    (that is the speed-up); tz-aware values fall back to pickle and still round-trip."""
    others: list = []
    dec = (Decimal("1.50"), None, Decimal("-0"))
    assert blocks_mod._encode_column(dec, others)[0] == blocks_mod._DECIMAL
    naive = (dt.datetime(2020, 1, 1, 1, 2, 3, 456789, fold=1), dt.datetime(1, 1, 1))
    assert blocks_mod._encode_column(naive, others)[0] == blocks_mod._STATE
    assert blocks_mod._encode_column((dt.timedelta(days=-3, microseconds=7),), others)[0] == blocks_mod._ARGS
    aware = (dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2020, 1, 1))
    assert blocks_mod._encode_column(aware, others)[0] == blocks_mod._OTHER
    for col in (dec, naive, aware):
        back = blocks_mod._decode_column(blocks_mod._encode_column(col, others), others)
        assert same(list(col), list(back))
    assert blocks_mod._decode_column(blocks_mod._encode_column(naive, others), others)[0].fold == 1


def test_decoded_events_share_column_metadata_and_images_are_fresh() -> None:
    cols = tuple(COLS_A)
    evs = [RowChange("s", "t", 1, Op.UPDATE, {"id": i, "v": "a"}, {"id": i, "v": "b"}, tuple(cols),
                     SourcePosition("k", 0, i)) for i in range(5)]
    codec = BlockCodec()
    back = codec.decode(*codec.encode(evs))
    assert back == evs
    assert len({id(e.columns) for e in back}) == 1
    assert back[0].before is not back[0].after


def test_too_many_column_variants_are_pickled_whole() -> None:
    """Column metadata that never compares equal must not grow the shape table without bound."""
    evs = [RowChange("s", "t", 1, Op.INSERT, None, {"id": i}, (Column("id", "int", type_code=i),),
                     SourcePosition("k", 0, i)) for i in range(3 * blocks_mod._MAX_SHAPE_VARIANTS)]
    codec = BlockCodec()
    back = codec.decode(*codec.encode(evs))
    assert back == evs
    assert len(codec.shapes) == blocks_mod._MAX_SHAPE_VARIANTS


def test_decode_pauses_the_collector_and_restores_its_state() -> None:
    evs = [RowChange("s", "t", 1, Op.INSERT, None, {"id": 1}, COLS_A[:1], SourcePosition("k", 0, 0))]
    codec = BlockCodec()
    block = codec.encode(evs)
    was = gc.isenabled()
    try:
        gc.enable()
        assert codec.decode(*block) == evs and gc.isenabled()
        gc.disable()
        assert codec.decode(*block) == evs and not gc.isenabled()
    finally:
        (gc.enable if was else gc.disable)()


# ---- merge ------------------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_block_merge_equals_heapq_merge(data: st.DataObject) -> None:
    """Same order as heapq.merge, ties included (stream order), whatever the pieces the streams come in."""
    k = data.draw(st.integers(1, 5))
    streams = []
    for s in range(k):
        keys = sorted(data.draw(st.lists(st.integers(0, 6), max_size=25)))
        streams.append([(key, s, i) for i, key in enumerate(keys)])

    def pieces(items: list) -> list[tuple[list, int, int]]:
        out = []
        i = 0
        while i < len(items) or data.draw(st.booleans()) and len(out) < 3:
            j = min(len(items), i + data.draw(st.integers(0, 6)))
            pad = data.draw(st.integers(0, 2))  # a piece is a window (lo, hi) of a larger list
            out.append(([("pad",)] * pad + items[i:j] + [("pad",)], pad, pad + j - i))
            i = j
        return out

    expected = list(heapq.merge(*streams, key=itemgetter(0)))
    got = [x for part in _merge_slices([iter(pieces(s)) for s in streams], itemgetter(0)) for x in part]
    assert got == expected


# ---- through the gate: spill files -------------------------------------------------------------------------

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "decimal"), Column("at", "datetime"))


def big_txn(n: int, ts: int = 100, parts: int = 3, start: int = 0) -> list[RowChange]:
    return [RowChange("s", "t", ts, Op.INSERT, None,
                      {"id": i, "v": Decimal(i).scaleb(-2), "at": dt.datetime(2020, 1, 1, 0, 0, i % 60, i)}, COLS,
                      SourcePosition("k", i % parts, start + i // parts), 500)
            for i in range(n)]


def test_spilled_run_releases_exactly_what_went_in_and_removes_its_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(spill_mod, "SPILL_CHUNK_EVENTS", 7)
    tps = [("k", p) for p in range(3)]
    g = Gate(partitions=tps, budget_bytes=20_000, spill_dir=tmp_path)
    ref = Gate(partitions=tps)
    events = big_txn(300)
    for lo in range(0, 300, 40):
        g.add(events[lo:lo + 40])
        ref.add(events[lo:lo + 40])
    assert g.stats["spills"] >= 2 and list(tmp_path.rglob("*.spill"))
    done = [Resolved(200, SourcePosition("k", p, 1000)) for p in range(3)]
    g.add(done)
    ref.add(done)
    rel, rel_ref = g.release(), ref.release()
    out, out_ref = list(rel), list(rel_ref)
    assert len(out) == 300 and all(same_event(a, b) for a, b in zip(out, out_ref))
    g.forget(rel)
    assert not list(tmp_path.rglob("*.spill")), "a fully released run's file must go before close()"
    assert g.held == 0 and g.memory_bytes == 0
    g.close()
    assert not list(tmp_path.iterdir())


def test_unwritable_spill_dir_names_the_setting(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    g = Gate(partitions=[("k", 0)], budget_bytes=1, spill_dir=blocker / "spill")
    with pytest.raises(SpillError, match=r"spill_dir"):
        g.add(big_txn(5, parts=1))


def test_spill_file_removed_while_running_says_restart(tmp_path) -> None:
    g = Gate(partitions=[("k", 0)], budget_bytes=1, spill_dir=tmp_path)
    g.add(big_txn(50, parts=1))
    for f in tmp_path.rglob("*.spill"):
        f.unlink()
    g.add([Resolved(200, SourcePosition("k", 0, 100))])
    with pytest.raises(SpillError, match=r"Restart the applier"):
        list(g.release())
    g.close()


def test_truncated_spill_file_is_reported(tmp_path) -> None:
    g = Gate(partitions=[("k", 0)], budget_bytes=1, spill_dir=tmp_path)
    g.add(big_txn(50, parts=1))
    for f in tmp_path.rglob("*.spill"):
        f.write_bytes(f.read_bytes()[:10])
    g.add([Resolved(200, SourcePosition("k", 0, 100))])
    with pytest.raises(SpillError, match=r"truncated"):
        list(g.release())
    g.close()
