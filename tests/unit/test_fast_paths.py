"""The per-event fast paths give exactly what the plain code gives.

Decoding, planning and value adaptation have fast paths (cached message shapes, generated row converters,
C-level getters, column skipping, binary COPY). Each one is checked here against the plain code it replaces:
either the slow path still in the module (the decoders fall back to it), or a copy of the code as it was
before the fast path existed (``_ref_*`` below). Values are compared by type and repr, so Decimal('1.50')
never passes for Decimal('1.5'), and errors by their full message.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Column as SAColumn, Integer, MetaData, String, Table

from applier.codecs import canal_json as C
from applier.codecs import open as O
from applier import mysql_values as T
from applier.devtools.encoders import canal_json as CE
from applier.devtools.encoders import open as OE
from applier.events import Column, DecodeError, KafkaMessage, Op, RowChange, SourcePosition
from applier.sinks import adapt as A
from applier.sinks import postgres as PG
from applier.sinks.plan import BatchPlan, _key, _writable_row, plan_batch, plan_keyless
from applier.sinks.table import ApplyError, TableMeta
from tests.unit import test_codec_canal_json as TC
from tests.unit import test_codec_open as TO

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def norm_value(v: Any) -> tuple[str, str]:
    return type(v).__name__, repr(v)


def norm_image(img: dict | None) -> Any:
    return None if img is None else tuple((k, *norm_value(v)) for k, v in img.items())


def outcome(decode, message: KafkaMessage) -> Any:
    """Everything a decoder answers for one message: events (values by type and repr) or the error."""
    try:
        events = decode(message)
    except DecodeError as e:
        return "error", str(e)
    out = []
    for e in events:
        if isinstance(e, RowChange):
            out.append((e.schema, e.table, e.commit_ts, e.op, norm_image(e.before), norm_image(e.after),
                        e.columns, e.position, e.size))
        else:
            out.append(repr(e))
    return "events", out


# ---------------------------------------------------------------------------------------------------------
# types.py: the parsers rewritten for speed, against their previous code
# ---------------------------------------------------------------------------------------------------------


def _ref_digits(s: str) -> bool:
    return s.isdigit() and s.isascii()


def _ref_is_zero_date(text: str) -> bool:
    if len(text) < 10 or text[4] != "-" or text[7] != "-":
        return False
    y, m, d = text[0:4], text[5:7], text[8:10]
    if not (_ref_digits(y) and _ref_digits(m) and _ref_digits(d)):
        return False
    return y == "0000" or m == "00" or d == "00"


def _ref_parse_date(text: str) -> dt.date | str:
    if type(text) is not str:
        raise TypeError(f"expected date text, got {type(text).__name__}")
    if len(text) != 10 or text[4] != "-" or text[7] != "-":
        raise T.ConversionError(f"{text!r} is not a date (YYYY-MM-DD)")
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        pass
    y, m, d = text[0:4], text[5:7], text[8:10]
    if not (_ref_digits(y) and _ref_digits(m) and _ref_digits(d)):
        raise T.ConversionError(f"{text!r} is not a date (YYYY-MM-DD)")
    if y == "0000" or m == "00" or d == "00":
        return text
    try:
        return dt.date(int(y), int(m), int(d))
    except ValueError as e:
        raise T.ConversionError(f"{text!r} is not a valid date: {e}") from None


def _ref_parse_datetime(text: str) -> dt.datetime | str:
    if type(text) is not str:
        raise TypeError(f"expected datetime text, got {type(text).__name__}")
    n = len(text)
    if n != 19 and not (21 <= n <= 26 and text[19] == "."):
        if n == 10:
            d = _ref_parse_date(text)
            return d if isinstance(d, str) else dt.datetime(d.year, d.month, d.day)
        raise T.ConversionError(f"{text!r} is not a datetime (YYYY-MM-DD HH:MM:SS[.ffffff])")
    if (text[4] != "-" or text[7] != "-" or text[10] != " " or text[13] != ":" or text[16] != ":"
            or (n > 19 and not _ref_digits(text[20:]))):
        raise T.ConversionError(f"{text!r} is not a datetime (YYYY-MM-DD HH:MM:SS[.ffffff])")
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        pass
    if _ref_is_zero_date(text):
        hh, mm, ss = text[11:13], text[14:16], text[17:19]
        if _ref_digits(hh) and _ref_digits(mm) and _ref_digits(ss) and int(hh) < 24 and int(mm) < 60 and int(ss) < 60:
            return text
    raise T.ConversionError(f"{text!r} is not a valid datetime")


def _ref_b64decode_strict(text: str) -> bytes:
    if type(text) is not str:
        raise TypeError(f"expected base64 text, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as e:
        raise T.ConversionError(f"invalid base64: {e}") from None


def same_call(f, g, *args) -> None:
    """f(*args) and g(*args) return the same value (type and repr) or raise the same error."""
    try:
        a = ("ok", norm_value(f(*args)))
    except Exception as e:  # noqa: BLE001
        a = ("raise", type(e).__name__, str(e))
    try:
        b = ("ok", norm_value(g(*args)))
    except Exception as e:  # noqa: BLE001
        b = ("raise", type(e).__name__, str(e))
    assert a == b, args


_DT_CHARS = "0123456789-: .T+Z,x\u0663\u00b2"


@st.composite
def datetime_like(draw) -> str:
    """Valid MySQL datetimes and dates, zero dates, and small corruptions of them."""
    base = draw(st.sampled_from([
        "2020-02-20 02:20:20", "2020-02-20 02:20:20.123456", "2020-02-20 02:20:20.5", "0000-00-00 00:00:00",
        "2020-00-15 10:00:00.25", "2020-02-30 00:00:00", "9999-12-31 23:59:59.999999", "0001-01-01",
        "2020-02-20", "0000-00-00", "2020-13-01 00:00:00", "2020-02-20T02:20:20", "2020-02-20 24:00:00"]))
    chars = list(base)
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["set", "del", "ins"]))
        i = draw(st.integers(0, max(0, len(chars) - 1)))
        c = draw(st.sampled_from(_DT_CHARS))
        if op == "set" and chars:
            chars[i] = c
        elif op == "del" and chars:
            del chars[i]
        else:
            chars.insert(i, c)
    return "".join(chars)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(datetime_like(), st.text(_DT_CHARS, max_size=28), st.integers(), st.none()))
def test_parse_datetime_and_date_as_before(text):
    same_call(T.parse_datetime, _ref_parse_datetime, text)
    same_call(T.parse_date, _ref_parse_date, text)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode()),
                 st.text("QUJDRA=+/ \n\u00e9-_", max_size=12), st.binary(max_size=4), st.integers()))
def test_b64decode_strict_as_before(text):
    same_call(T.b64decode_strict, _ref_b64decode_strict, text)


# ---------------------------------------------------------------------------------------------------------
# Fast forms and generated row converters
# ---------------------------------------------------------------------------------------------------------

_FAST_FORMS = [T.parse_int, T._str, C._to_int, C._to_bytes, O._conv_int, O._conv_float, O._conv_str,
               O._conv_decimal, O._conv_go_quoted, O._conv_b64_bytes, O._conv_b64_text]

_SAMPLES = {
    str: st.one_of(st.text(max_size=12), st.from_regex(r"-?[0-9]{1,25}(\.[0-9]{0,8})?", fullmatch=True),
                   st.binary(max_size=9).map(OE.go_quote), st.binary(max_size=9).map(lambda b: base64.b64encode(b).decode()),
                   st.sampled_from(["NaN", "inf", "1e5", " 7", "1_0", "\u0663", "\\x4", "\\u00e9", "\\400", "QQ="])),
    int: st.integers(),
    float: st.floats(),
}


@pytest.mark.parametrize("conv", _FAST_FORMS, ids=lambda f: f"{f.__module__}.{f.__name__}")
@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_every_fast_form_answers_like_its_converter(conv, data):
    value_type, fast = conv.fast_form
    v = data.draw(_SAMPLES[value_type])
    try:
        want = ("ok", norm_value(conv(v)))
    except Exception:  # noqa: BLE001
        want = ("raise",)
    try:
        got = ("ok", norm_value(v if fast is None else fast(v)))
    except Exception:  # noqa: BLE001
        got = ("raise",)
    assert got == want, v


_CONVS = [T.parse_int, T._str, T.parse_decimal, T.parse_datetime, T.parse_date, C._to_int, C._to_bytes,
          O._conv_int, O._conv_float, O._conv_go_quoted, O._conv_b64_text, O._lenient(O._conv_int)]
_ANY = st.one_of(st.none(), st.integers(), st.floats(), st.text(max_size=6),
                 st.sampled_from(["12", "2020-02-20", "2020-02-20 01:02:03.5", "1.50", "QQ==", "\\x00", "é"]))


def _ref_convert(names, convs, values):
    return {n: None if v is None else c(v) for n, c, v in zip(names, convs, values)}


@settings(max_examples=600, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_CONVS), _ANY), min_size=0, max_size=8),
       st.lists(st.text(max_size=6), min_size=8, max_size=8, unique=True))
def test_row_converter_is_the_plain_loop(cols, names):
    names = tuple(names[:len(cols)])
    convs = tuple(c for c, _ in cols)
    values = [v for _, v in cols]
    f = T.row_converter(names, convs)
    try:
        want = ("ok", norm_image(_ref_convert(names, convs, values)))
    except Exception:  # noqa: BLE001
        want = ("raise",)
    try:
        got = ("ok", norm_image(f(iter(values))))
    except Exception:  # noqa: BLE001
        got = ("raise",)
    assert got == want


def test_row_converter_names_never_become_code():
    names = ("x\"; __import__('os').system('false') #", "k0", "\n", "v0", "type", "'''")
    f = T.row_converter(names, (T._str,) * len(names))
    assert f(["a", "b", "c", "d", "e", "f"]) == dict(zip(names, "abcdef"))
    with pytest.raises(ValueError):
        f(["a"])


def test_row_converter_beyond_the_generated_size_is_a_loop():
    n = T.MAX_GENERATED_COLUMNS + 1
    names = tuple(f"c{i}" for i in range(n))
    f = T.row_converter(names, (T.parse_int,) * n)
    assert f([str(i) for i in range(n)]) == {f"c{i}": i for i in range(n)}
    with pytest.raises(ValueError):
        f(["1"])


# ---------------------------------------------------------------------------------------------------------
# Canal-JSON: cached shapes and generated converters against the column-by-column path
# ---------------------------------------------------------------------------------------------------------


class SlowCanal(C.CanalJSONDecoder):
    """The decoder without its fast paths: column metadata resolved per message, values per column."""

    def _shape(self, schema, table, first, mysql_types, sql_types, pk_names):
        columns, convs = self._columns_of(first, mysql_types, sql_types, frozenset(pk_names or ()))
        return C._Shape(columns, tuple(first), convs, None, mysql_types, sql_types, (), pk_names)


_CANAL_FAST = C.CanalJSONDecoder()  # shared across examples: it keeps every shape the fuzzing shows it
_CANAL_FAST_LENIENT = C.CanalJSONDecoder(require_tidb_extension=False)


def _same_canal(value: bytes) -> None:
    m = TC.msg(value)
    assert outcome(_CANAL_FAST.decode, m) == outcome(SlowCanal().decode, m)
    assert outcome(_CANAL_FAST_LENIENT.decode, m) == outcome(SlowCanal(require_tidb_extension=False).decode, m)


@FUZZ
@given(TC.row_changes())
def test_canal_valid_rows_as_slow_path(e):
    _same_canal(CE.encode_canal_json(e)[1])
    _same_canal(CE.encode_canal_json(e, only_output_updated_columns=True)[1])
    _same_canal(CE.encode_canal_json(e)[1])  # again, from the kept shape


@FUZZ
@given(TC.mutated_bytes())
def test_canal_mutated_bytes_as_slow_path(value):
    _same_canal(value)


@FUZZ
@given(TC.mutated_json())
def test_canal_mutated_json_as_slow_path(value):
    _same_canal(value)


def _canal_row(**over) -> dict:
    m = {"id": 0, "database": "s", "table": "t", "pkNames": ["id"], "isDdl": False, "type": "UPDATE",
         "es": 1, "ts": 1, "sql": "", "sqlType": {"id": 4, "n": 12, "d": 3}, "mysqlType": {"id": "int", "n": "varchar", "d": "decimal"},
         "old": [{"id": "1", "n": "a", "d": "1.50"}], "data": [{"id": "1", "n": "b", "d": "2.50"}],
         "_tidb": {"commitTs": 5}}
    m.update(over)
    return m


def test_canal_mysql_type_order_does_not_matter():
    """TiCDC writes mysqlType from a Go map: its order changes per message, the shape stays one."""
    d = C.CanalJSONDecoder()
    a = d.decode(TC.jmsg(_canal_row()))
    b = d.decode(TC.jmsg(_canal_row(mysqlType={"d": "decimal", "n": "varchar", "id": "int"})))
    assert outcome(lambda m: a, None) == outcome(lambda m: b, None)
    assert len(d._recent[("s", "t")]) == 1 and a[0].columns is b[0].columns


@pytest.mark.parametrize("bad", [4.0, True])
def test_canal_sql_type_must_be_an_integer_even_after_a_valid_one(bad):
    d = C.CanalJSONDecoder()
    d.decode(TC.jmsg(_canal_row()))
    for dec in (d, C.CanalJSONDecoder()):
        with pytest.raises(DecodeError, match="'sqlType' must be an integer"):
            dec.decode(TC.jmsg(_canal_row(sqlType={"id": bad, "n": 12, "d": 3})))


def test_canal_multi_row_and_partial_old_rows():
    m = _canal_row(data=[{"id": "1", "n": "b", "d": "2.50"}, {"n": "c", "id": "2", "d": None}, {"id": "3", "n": "x", "d": "0"}],
                   old=[{"n": "a"}, {"id": "2", "n": "b", "d": "1"}, {}])
    assert outcome(C.CanalJSONDecoder().decode, TC.jmsg(m)) == outcome(SlowCanal().decode, TC.jmsg(m))


# ---------------------------------------------------------------------------------------------------------
# Open Protocol: kept image shapes and generated check-and-convert functions against the per-column path
# ---------------------------------------------------------------------------------------------------------


class SlowOpen(O.OpenDecoder):
    """The decoder without its fast path: every image column by column."""

    def _image(self, obj, which):
        return self._image_columns(obj, which)


_OPEN_FAST = O.OpenDecoder()
_OPEN_FAST_LENIENT = O.OpenDecoder(strict_values=False)
_OPEN_FAST_B64 = O.OpenDecoder(legacy_base64_strings=True)


def _same_open(key: bytes, value: bytes) -> None:
    m = KafkaMessage("orders", 3, 42, key, value)
    assert outcome(_OPEN_FAST.decode, m) == outcome(SlowOpen().decode, m)
    assert outcome(_OPEN_FAST_LENIENT.decode, m) == outcome(SlowOpen(strict_values=False).decode, m)
    assert outcome(_OPEN_FAST_B64.decode, m) == outcome(SlowOpen(legacy_base64_strings=True).decode, m)


@FUZZ
@given(st.lists(TO.row_changes(), min_size=1, max_size=4), st.booleans())
def test_open_valid_rows_as_slow_path(events, only_updated):
    key, value = OE.encode_open_batch(events, only_output_updated_columns=only_updated)
    _same_open(key, value)
    _same_open(key, value)  # again, from the kept shapes


@FUZZ
@given(TO.mutated())
def test_open_mutated_bytes_as_slow_path(kv):
    _same_open(*kv)


_META = st.one_of(st.integers(-2, 300), st.sampled_from([8.0, 1.0, True, False, None, "8", [8]]))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["id", "a", "b"]), st.fixed_dictionaries(
    {"t": _META}, optional={"f": _META, "h": _META, "v": st.one_of(_ANY, st.just("\\xff"))})), max_size=4),
    st.sampled_from(["u", "d"]))
def test_open_odd_column_objects_as_slow_path(cols, which):
    img = dict(cols)
    warm = {"id": {"t": 8, "h": True, "f": 11, "v": 1}, "a": {"t": 15, "f": 0, "v": "x"}, "b": {"t": 3, "f": 128, "v": 7}}
    for image in (warm, img):  # the shared decoder has seen the well-formed shape first
        key, value = OE.frame_open_batch([(orjson.dumps({"ts": 1, "scm": "s", "tbl": "t", "t": 1}),
                                          json.dumps({which: image}).encode())])
        _same_open(key, value)


@pytest.mark.parametrize("field,bad", [("t", 8.0), ("f", True), ("h", 1), ("f", 11.0)])
def test_open_metadata_types_are_checked_even_after_a_valid_image(field, bad):
    good = {"id": {"t": 8, "h": True, "f": 11, "v": 1}}
    d = O.OpenDecoder()
    frame = lambda img: OE.frame_open_batch([(b'{"ts":1,"scm":"s","tbl":"t","t":1}', orjson.dumps({"u": img}))])  # noqa: E731
    d.decode(KafkaMessage("t", 0, 0, *frame(good)))
    bad_img = {"id": dict(good["id"], **{field: bad})}
    for dec in (d, O.OpenDecoder()):
        with pytest.raises(DecodeError, match="must be"):
            dec.decode(KafkaMessage("t", 0, 1, *frame(bad_img)))


def test_open_second_image_takes_the_generated_path(monkeypatch):
    d = O.OpenDecoder()
    e = RowChange("s", "t", 5, Op.INSERT, None, {"id": 1, "b": b"\x00\\x", "s": "t\u00e9"},
                  (Column("id", "bigint", key=True), Column("b", "varbinary", binary=True), Column("s", "text")),
                  SourcePosition("t", 0, 0))
    key, value = OE.encode_open(e)
    first = d.decode(KafkaMessage("t", 0, 0, key, value))
    monkeypatch.setattr(d, "_image_columns", lambda *a: pytest.fail("took the per-column path"))
    second = d.decode(KafkaMessage("t", 0, 0, key, value))
    assert outcome(lambda m: first, None) == outcome(lambda m: second, None)
    assert second[0].after == {"id": 1, "b": b"\x00\\x", "s": "t\u00e9"}


_OLD_GO_BYTE_ESCAPES = re.compile(r'(?:[^\\]|\\(?:[abfnrtv\\"]|x[0-9a-fA-F]{2}|[0-3][0-7]{2}))*', re.S)


@settings(max_examples=1000, deadline=None)
@given(st.text("ab\\x0f37489'\"unU\n", max_size=14))
def test_go_escape_pattern_matches_what_it_did(s):
    assert bool(O._GO_BYTE_ESCAPES.fullmatch(s)) == bool(_OLD_GO_BYTE_ESCAPES.fullmatch(s))


# ---------------------------------------------------------------------------------------------------------
# plan_batch against its previous code
# ---------------------------------------------------------------------------------------------------------


def _ref_plan_batch(meta: TableMeta, changes, *, replace: bool = False) -> BatchPlan:
    if not meta.key:  # tables without a key have a planner of their own (tests/unit/test_keyless.py)
        return plan_keyless(meta, changes)
    key_cols = meta.key
    final: dict = {}
    must_delete: dict = {}
    for ch in changes:
        if ch.op is Op.DELETE:
            k = _key(meta, ch, ch.before, key_cols)
            final.pop(k, None)
            final[k] = None
            must_delete[k] = None
            continue
        row = _writable_row(meta, ch)
        k = _key(meta, ch, ch.after, key_cols)
        if ch.op is Op.UPDATE and ch.before:
            old = ch.before
            if any(c in old for c in key_cols):
                ok = _key(meta, ch, old, key_cols)
                if ok != k:
                    final.pop(ok, None)
                    final[ok] = None
                    must_delete[ok] = None
            for cols in meta.unique_sets:
                if cols == key_cols:
                    continue
                if any(c in old and c in ch.after and old[c] != ch.after[c] for c in cols):
                    must_delete[k] = None
                    break
        final.pop(k, None)
        final[k] = row
    plan = BatchPlan(meta, changes=len(changes))
    plan.deletes = list(must_delete)
    plan.upserts = [row for row in final.values() if row is not None]
    if replace:
        for cols in meta.unique_sets:
            if cols == key_cols:
                continue
            vals = [v for row in plan.upserts
                    if (v := tuple(row.get(c) for c in cols)) and all(x is not None for x in v) and all(c in row for c in cols)]
            if vals:
                plan.unique_clears[cols] = list(dict.fromkeys(vals))
    return plan


def _meta(key, uniques, generated=()) -> TableMeta:
    cols = ("id", "k2", "email", "v", "g")
    t = Table("t", MetaData(), *(SAColumn(c, Integer if c != "email" else String(10), primary_key=c in key) for c in cols))
    return TableMeta("s", "t", t, cols, frozenset(c for c in cols if c not in generated), tuple(key), tuple(uniques))


_METAS = [_meta(("id",), [("id",), ("email",)]), _meta(("id", "k2"), [("id", "k2"), ("email",)], generated=("g",)),
          _meta(("id",), [("id",)]), _meta((), [])]
_IMG_COLS = ["id", "k2", "email", "v", "g", "zz"]


@st.composite
def images(draw):
    if draw(st.integers(0, 20)) == 0:
        return draw(st.sampled_from([None, {}]))
    cols = draw(st.lists(st.sampled_from(_IMG_COLS), unique=True, min_size=1, max_size=6))
    if draw(st.integers(0, 4)):  # mostly complete, well-formed rows
        cols = ["id", "k2", "email", "v"] + [c for c in cols if c in ("g",)]
    return {c: draw(st.integers(0, 3)) if c != "email" else draw(st.sampled_from(["a", "b", None])) for c in cols}


@st.composite
def changes(draw):
    out = []
    for i in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from([Op.INSERT, Op.UPDATE, Op.DELETE]))
        before = draw(images()) if op is not Op.INSERT else None
        after = draw(images()) if op is not Op.DELETE else None
        out.append(RowChange("s", "t", i + 1, op, before, after, (), SourcePosition("k", 0, i)))
    return out


def _plan_outcome(f, meta, chs, replace):
    try:
        p = f(meta, chs, replace=replace)
    except ApplyError as e:
        return "error", str(e)
    return ("plan", p.deletes, [norm_image(r) for r in p.upserts], p.changes,
            {k: v for k, v in p.unique_clears.items()}, p.keyless)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(_METAS), changes(), st.booleans())
def test_plan_batch_as_before(meta, chs, replace):
    assert _plan_outcome(plan_batch, meta, chs, replace) == _plan_outcome(_ref_plan_batch, meta, chs, replace)


def test_plan_rows_are_copies_of_the_events_rows():
    """Writers adapt plan rows in place; the events' own dicts must not change."""
    after = {"id": 1, "k2": 0, "email": "a", "v": 1}
    p = plan_batch(_METAS[0], [RowChange("s", "t", 1, Op.INSERT, None, after, (), SourcePosition("k", 0, 0))])
    assert p.upserts == [after] and p.upserts[0] is not after


# ---------------------------------------------------------------------------------------------------------
# adapt_rows against its previous code
# ---------------------------------------------------------------------------------------------------------


def _ref_adapt_rows(meta, adapters, rows):
    convs, checks = adapters
    col = ""
    try:
        for col, f in checks:
            for r in rows:
                v = r[col]
                if v is not None:
                    f(v)
                    break
        for r in rows:
            for col, f in convs:
                v = r[col]
                if v is not None:
                    r[col] = f(v)
    except A.ValueRefused as exc:
        raise ApplyError(f"column {col!r} of target table {meta.display}: {exc}") from None
    return rows


_PG_TYPES = {"e": "enum('a','b')", "s": "set('x','y')", "b": "bit varying(3)", "d": "date",
             "ts": "timestamp(6) without time zone", "tz": "timestamp(6) with time zone", "i": "interval(6)", "t": "text"}
_ADAPT_VALUES = {
    "e": st.one_of(st.integers(-1, 4), st.just("a")), "s": st.one_of(st.integers(-1, 8), st.just("x,y")),
    "b": st.one_of(st.integers(0, 9), st.binary(max_size=1), st.just("101")),
    "d": st.one_of(st.dates(), st.sampled_from(["0000-00-00", "2020-00-01", "-infinity"])),
    "ts": st.one_of(st.datetimes(), st.sampled_from(["0000-00-00 00:00:00"])),
    "tz": st.one_of(st.datetimes(), st.just(dt.datetime(1970, 1, 1)), st.sampled_from(["0000-00-00 00:00:00"])),
    "i": st.one_of(st.timedeltas(), st.just("01:00:00")), "t": st.one_of(st.text(max_size=3), st.integers(0, 3)),
}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(_PG_TYPES)), min_size=1, max_size=5, unique=True), st.data())
def test_adapt_rows_as_before(cols, data):
    cols = tuple(cols)
    rows = [{c: data.draw(st.none() | _ADAPT_VALUES[c]) for c in cols} for _ in range(data.draw(st.integers(1, 6)))]
    meta = _METAS[0]
    meta = TableMeta(meta.schema, meta.name, meta.table, cols, frozenset(cols), ("e",), (), dict(_PG_TYPES))
    adapters = A.AdapterCache(PG.pg_converter).row(meta, cols)
    results = []
    for f in (A.adapt_rows, _ref_adapt_rows):
        mine = [dict(r) for r in rows]
        try:
            results.append(("ok", [norm_image(r) for r in f(meta, adapters, mine)]))
        except ApplyError as e:
            results.append(("error", str(e)))
    assert results[0] == results[1]


# ---------------------------------------------------------------------------------------------------------
# PostgreSQL binary COPY: when a batch may go in binary (what it stores is checked against text COPY in
# tests/e2e/test_pg_copy.py)
# ---------------------------------------------------------------------------------------------------------


def _pg_meta(**oids) -> TableMeta:
    m = _METAS[0]
    return TableMeta(m.schema, m.name, m.table, tuple(oids), frozenset(oids), ("id",), (), type_oids=dict(oids))


UTC = dt.timezone.utc


@pytest.mark.parametrize("oid,values,binary", [
    (PG._INT2, [1, None, -32768, 32767], True),
    (PG._INT2, [32768], False),  # binary would wrap it around; text makes the server refuse it
    (PG._INT4, [2**31], False),
    (PG._INT8, [-(2**63), 2**63 - 1], True),
    (PG._INT8, [2**63], False),
    (PG._INT8, [True], False),
    (PG._NUMERIC, [Decimal("1.50"), 18446744073709551615, None], True),
    (PG._NUMERIC, [1.5], False),
    (PG._FLOAT8, [1.5, None], True),
    (PG._FLOAT8, [1], False),
    (PG._TEXT, ["a", "", None], True),
    (PG._VARCHAR, ["a\x00"], False),
    (PG._BYTEA, [b"\x00", None], True),
    (PG._BYTEA, [bytearray(b"x")], False),
    (PG._DATE, [dt.date(2020, 1, 1)], True),
    (PG._DATE, [dt.datetime(2020, 1, 1)], False),
    (PG._DATE, ["-infinity"], False),
    (PG._TIMESTAMP, [dt.datetime(2020, 1, 1), None], True),
    (PG._TIMESTAMP, [dt.datetime(2020, 1, 1, tzinfo=UTC)], False),
    (PG._TIMESTAMPTZ, [dt.datetime(2020, 1, 1, tzinfo=UTC)], True),
    (PG._TIMESTAMPTZ, [dt.datetime(2020, 1, 1)], False),
    (PG._TIMESTAMPTZ, [dt.datetime(2020, 1, 1, tzinfo=UTC), dt.datetime(2020, 1, 1)], False),
    (PG._TIMESTAMP, [dt.datetime(2020, 1, 1), dt.datetime(2020, 1, 1, tzinfo=UTC)], False),
    (700, [1.5], False),  # real: binary would round the double itself, text rounds its decimal text
    (1114 + 100000, [1], False),
    (PG._INT4, [None, None], True),
])
def test_binary_copy_only_where_it_stores_the_same(oid, values, binary):
    meta = _pg_meta(id=PG._INT8, c=oid)
    rows = [(i, v) for i, v in enumerate(values)]
    assert (PG.binary_copy_types(meta, ("id", "c"), rows) is not None) == binary


def test_binary_copy_needs_every_oid():
    meta = _pg_meta(id=PG._INT8)
    assert PG.binary_copy_types(meta, ("id", "other"), [(1, 2)]) is None
    assert PG.binary_copy_types(meta, ("id",), []) == [PG._INT8]
