"""The writers' value adaptation (applier/sinks/postgres.py, applier/sinks/mysql.py), pure logic: no database.

The rules are tabled in docs/value-rules.md; tests/e2e/test_values.py checks them against the real servers.
"""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal

import pytest
from hypothesis import given, strategies as st

from applier.dialect import MYSQL, POSTGRES
from applier.mysql_values import parse_time, shortest_float32
from applier.sinks import ApplyError
from applier.sinks.table import build_meta
from applier.sinks.mysql import ZERO_TIMESTAMP, mysql_converter, session_sql_mode
from applier.sinks.postgres import NEG_INFINITY, ValueRefused, pg_converter

UTC = dt.timezone.utc


def meta(types: dict[str, str], key: tuple[str, ...] = ("id",)):
    m = build_meta("s", "t", [(c, c not in key, False) for c in types], key, [])
    m.types = dict(types)
    return m


# --------------------------------------------------------------------------------------------- PostgreSQL


@pytest.mark.parametrize("typ, has", [
    ("enum('a','b')", True), ("set('x')", True), ("text", True), ("bit varying(64)", True), ("bit(8)", True),
    ("bit varying", True), ("date", True), ("timestamp(6) without time zone", True),
    ("timestamp without time zone", True), ("timestamp(3) with time zone", True), ("interval(6)", True),
    ("interval", True), ("integer", False), ("numeric(20,0)", False), ("jsonb", False), ("bytea", False),
    ("character varying(64)", False), ("real", False), ("smallint", False), (None, False), ("", False),
])
def test_pg_converters_exist_only_where_a_value_changes(typ, has):
    assert (pg_converter(typ) is not None) is has


def test_pg_enum_ordinals_become_member_names():
    conv = pg_converter("enum('a','b','it''s','ü')")
    assert [conv(i) for i in range(5)] == ["", "a", "b", "it's", "ü"]  # 0: MySQL's '' error value
    assert conv("b") == "b"  # names (Debezium, Avro) pass
    with pytest.raises(ValueRefused, match="ENUM ordinal 5 is not one of the 4 members"):
        conv(5)
    with pytest.raises(ValueRefused):
        conv(-1)


def test_pg_set_bitmasks_become_member_lists_in_definition_order():
    conv = pg_converter("set('x','y','z')")
    assert [conv(i) for i in range(8)] == ["", "x", "y", "x,y", "z", "x,z", "y,z", "x,y,z"]
    assert conv("y,z") == "y,z"
    with pytest.raises(ValueRefused, match="bitmask 8 has bits beyond the 3 members"):
        conv(8)
    wide = pg_converter("set(" + ",".join(f"'m{i}'" for i in range(64)) + ")")
    assert wide(2**64 - 1) == ",".join(f"m{i}" for i in range(64))


def test_pg_text_without_member_comment_refuses_integers():
    conv = pg_converter("text")
    assert conv("plain") == "plain"
    with pytest.raises(ValueRefused, match=r"applier:enum\(\.\.\.\)"):
        conv(2)


def test_pg_bits_have_the_column_width():
    b64 = pg_converter("bit varying(64)")
    assert b64(5) == "0" * 61 + "101"
    assert b64(2**64 - 1) == "1" * 64
    assert b64(b"\x01\x00") == "0" * 55 + "100000000"  # raw big-endian bytes, should a codec send them
    assert b64("0101") == "0101"  # already bits
    assert pg_converter("bit(1)")(True) == "1"
    assert pg_converter("bit varying")(6) == "110"
    with pytest.raises(ValueRefused, match="does not fit in 10 bits"):
        pg_converter("bit varying(10)")(1024)


@given(st.integers(min_value=1, max_value=64).flatmap(lambda w: st.tuples(st.just(w), st.integers(0, 2**w - 1))))
def test_pg_bits_round_trip(wv):
    width, v = wv
    out = pg_converter(f"bit varying({width})")(v)
    assert len(out) == width and int(out, 2) == v


@pytest.mark.parametrize("typ", ["date", "timestamp(6) without time zone", "timestamp(0) with time zone"])
@pytest.mark.parametrize("zero", ["0000-00-00", "2020-00-15", "2020-01-00", "0000-00-00 00:00:00",
                                  "0000-00-00 00:00:00.000000", "2021-01-00 10:11:12"])
def test_pg_zero_dates_become_negative_infinity(typ, zero):
    assert pg_converter(typ)(zero) == NEG_INFINITY


def test_pg_real_dates_pass_and_timestamps_become_utc_instants():
    assert pg_converter("date")(dt.date(2024, 2, 29)) == dt.date(2024, 2, 29)
    assert pg_converter("date")("2024-02-29") == "2024-02-29"
    naive = dt.datetime(2024, 2, 29, 12, 34, 56, 654321)
    assert pg_converter("timestamp(6) without time zone")(naive) is naive
    tz = pg_converter("timestamp(6) with time zone")
    assert tz(naive) == naive.replace(tzinfo=UTC) and tz(naive).tzinfo is UTC
    aware = dt.datetime(2024, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=8)))
    assert tz(aware) is aware
    # MySQL's zero TIMESTAMP is 1970-01-01 00:00:00 UTC (Debezium sends it so); real instants start 1 s later
    assert tz(dt.datetime(1970, 1, 1)) == NEG_INFINITY
    assert tz(dt.datetime(1970, 1, 1, 0, 0, 1)) == dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)
    # a DATETIME of 1970-01-01 is an ordinary value
    assert pg_converter("timestamp(0) without time zone")(dt.datetime(1970, 1, 1)) == dt.datetime(1970, 1, 1)


@pytest.mark.parametrize("td, text", [
    (dt.timedelta(hours=838, minutes=59, seconds=59), "838:59:59"),
    (-dt.timedelta(hours=838, minutes=59, seconds=59), "-838:59:59"),
    (dt.timedelta(hours=100, microseconds=500000), "100:00:00.500000"),
    (-dt.timedelta(microseconds=1), "-00:00:00.000001"),
    (dt.timedelta(0), "00:00:00"),
])
def test_time_becomes_mysql_text_for_both_targets(td, text):
    assert pg_converter("interval(6)")(td) == text
    assert mysql_converter("time(6)")(td) == text
    assert pg_converter("interval(6)")(text) == text  # idempotent


@given(st.timedeltas(min_value=-dt.timedelta(hours=838, minutes=59, seconds=59),
                     max_value=dt.timedelta(hours=838, minutes=59, seconds=59)))
def test_time_text_is_the_same_signed_duration(td):
    assert parse_time(pg_converter("interval")(td)) == td


def test_converters_are_idempotent():
    cases = [("enum('a','b')", 2), ("set('x','y')", 3), ("bit varying(8)", 9), ("date", "0000-00-00"),
             ("timestamp(6) with time zone", dt.datetime(2020, 1, 1)), ("interval(0)", dt.timedelta(hours=-5))]
    for typ, v in cases:
        f = pg_converter(typ)
        assert f(f(v)) == f(v), typ


def test_pg_adapt_rows_converts_only_what_needs_it_and_names_the_column_on_refusal():
    sink = POSTGRES.writer()
    m = meta({"id": "integer", "e": "enum('a','b')", "b": "bit varying(4)", "n": "numeric(65,30)", "t": "text"})
    rows = [{"id": 1, "e": 2, "b": 3, "n": Decimal("1.5"), "t": "x"}, {"id": 2, "e": None, "b": None, "n": None, "t": None}]
    out = sink.adapt_rows(m, ("id", "e", "b", "n", "t"), rows)
    assert out == [{"id": 1, "e": "b", "b": "0011", "n": Decimal("1.5"), "t": "x"},
                   {"id": 2, "e": None, "b": None, "n": None, "t": None}]
    assert sink.adapt_rows(m, ("id", "e", "b", "n", "t"), out) == out  # adapting twice changes nothing
    plain = [{"id": 1, "n": Decimal(1)}]
    assert sink.adapt_rows(m, ("id", "n"), plain) is plain  # nothing to convert: no per-row work at all
    with pytest.raises(ApplyError, match=r"column 't' of target table s\.t: .*ENUM ordinals"):
        sink.adapt_rows(m, ("id", "t"), [{"id": 1, "t": None}, {"id": 2, "t": 7}])
    # a column is sent either as ordinals or as text: the check looks at the first non-NULL value of a batch
    mixed = [{"id": 1, "t": "x"}, {"id": 2, "t": 7}]
    assert sink.adapt_rows(m, ("id", "t"), mixed) is mixed


def test_pg_adapt_keys_and_the_converter_cache():
    sink = POSTGRES.writer()
    m = meta({"k": "enum('a','b')", "ts": "timestamp(6) with time zone", "v": "integer"}, key=("k", "ts"))
    keys = [(1, dt.datetime(2020, 1, 1)), (2, "0000-00-00 00:00:00")]
    assert sink.adapt_keys(m, keys) == [("a", dt.datetime(2020, 1, 1, tzinfo=UTC)), ("b", NEG_INFINITY)]
    convs = sink._adapters.row(m, ("k", "v"))
    assert sink._adapters.row(m, ("k", "v")) is convs  # built once per table shape and column set
    m2 = meta({"k": "text", "ts": "timestamp(6) with time zone", "v": "integer"}, key=("k", "ts"))  # after a DDL
    assert sink._adapters.row(m2, ("k", "v")) is not convs
    with pytest.raises(ApplyError, match="key column 'k' of target table s.t"):
        sink.adapt_keys(m2, [(1, dt.datetime(2020, 1, 1))])
    ints = meta({"id": "integer"})
    assert sink.adapt_keys(ints, keys) is keys


# --------------------------------------------------------------------------------------------- MySQL / MariaDB


@pytest.mark.parametrize("mode, kept", [
    ("STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO",
     "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO"),
    ("STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION",
     "STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION"),
    ("NO_ZERO_DATE", ""), ("", ""),
])
def test_mysql_session_sql_mode_only_drops_the_zero_date_modes(mode, kept):
    assert session_sql_mode(mode) == kept


@pytest.mark.parametrize("column_type, has", [
    ("timestamp(6)", True), ("timestamp", True), ("time(3)", True), ("time", True), ("datetime(6)", False),
    ("date", False), ("enum('a','b')", False), ("bit(64)", False), ("bigint(20) unsigned", False), (None, False),
    ("float", True), ("float unsigned", True), ("float(10,3)", True), ("FLOAT", True), ("double", False),
    ("double(20,3)", False), ("decimal(10,2)", False),
])
def test_mysql_converters_exist_only_for_time_timestamp_and_float(column_type, has):
    assert (mysql_converter(column_type) is not None) is has


FLT_MAX = struct.unpack("<f", b"\xff\xff\x7f\x7f")[0]  # 3.4028234663852886e+38, float32's largest finite value
FLT_MIN_NORMAL = struct.unpack("<f", b"\x00\x00\x80\x00")[0]  # 1.1754943508222875e-38
FLT_TRUE_MIN = struct.unpack("<f", b"\x01\x00\x00\x00")[0]  # 1.401298464324817e-45, the smallest subnormal


def _bits(v: float) -> bytes:
    return struct.pack("<f", v)


@pytest.mark.parametrize("sent, exact", [
    (3.4028235e+38, FLT_MAX),  # TiCDC's shortest text: just beyond FLT_MAX as a double, refused by strict mode
    (-3.4028235e+38, -FLT_MAX),
    (1.1754944e-38, FLT_MIN_NORMAL),
    (1e-45, FLT_TRUE_MIN), (1.4e-45, FLT_TRUE_MIN), (-1e-45, -FLT_TRUE_MIN),
    (1.1754942e-38, struct.unpack("<f", b"\xff\xff\x7f\x00")[0]),  # the largest subnormal
    (0.1, 0.10000000149011612), (3.14, 3.140000104904175), (16777217.0, 16777216.0),
])
def test_mysql_float_is_sent_as_the_exact_double_of_its_float32(sent, exact):
    conv = mysql_converter("float")
    got = conv(sent)
    assert got == exact and type(got) is float
    assert abs(got) <= FLT_MAX  # what MySQL/MariaDB range-check before rounding to single precision
    assert _bits(got) == _bits(sent)  # the same float32 as the value stands for
    assert conv(got) == got  # idempotent


def test_mysql_float_leaves_what_it_cannot_make_single_precision():
    conv = mysql_converter("float unsigned")
    assert conv(3.5e38) == 3.5e38  # beyond FLOAT's range: strict mode refuses it, naming the table
    assert conv(7) == 7 and type(conv(7)) is int
    z = conv(-0.0)
    assert z == 0.0 and str(z) == "-0.0"  # sent as it is (MariaDB stores 0: equal as float32)
    assert conv("1.5") == "1.5"


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_mysql_float_keeps_every_float32_from_its_shortest_text(f):
    """Whatever float32 upstream holds, the text TiCDC sends for it (its shortest repr) becomes that same float32,
    as an exact double within FLOAT's range."""
    sent = shortest_float32(f)
    got = mysql_converter("float")(sent)
    assert got == f and abs(got) <= FLT_MAX


def test_mysql_adapt_rows_makes_float_columns_exact_single_precision():
    sink = MYSQL.writer()
    m = meta({"id": "int(11)", "f": "float", "d": "double"})
    rows = [{"id": 1, "f": 3.4028235e+38, "d": 3.4028235e+38}, {"id": 2, "f": None, "d": 0.1},
            {"id": 3, "f": 1, "d": 1}]
    assert sink.adapt_rows(m, ("id", "f", "d"), rows) == [
        {"id": 1, "f": FLT_MAX, "d": 3.4028235e+38},  # DOUBLE goes as it is
        {"id": 2, "f": None, "d": 0.1}, {"id": 3, "f": 1, "d": 1}]
    ints = [{"id": 1, "f": 2}]
    assert sink.adapt_rows(m, ("id", "f"), ints) == [{"id": 1, "f": 2}]


@pytest.mark.parametrize("value", [FLT_MAX, -FLT_MAX, FLT_MIN_NORMAL, FLT_TRUE_MIN, -FLT_TRUE_MIN, 0.1])
def test_verify_reads_float_limits_the_same_from_every_side(value):
    """applier verify compares FLOAT canonically: upstream's text (shortest repr), MariaDB's CAST(f AS DOUBLE)
    (the exact double) and PostgreSQL's real (psycopg's float of the shortest text) give one value."""
    from applier.verify.normalise import canonical, read_expr

    assert read_expr("mariadb", "`f`", "float") == "CAST(`f` AS DOUBLE)"
    upstream = float(repr(shortest_float32(value)))
    assert canonical(upstream, "float") == canonical(value, "float") == canonical(float(repr(value)), "float")
    assert canonical(mysql_converter("float")(upstream), "float") == canonical(value, "float")


def test_mysql_timestamp():
    conv = mysql_converter("timestamp(6)")
    assert conv(dt.datetime(1970, 1, 1)) == ZERO_TIMESTAMP  # Debezium's zero TIMESTAMP, refused as a literal
    v = dt.datetime(2038, 1, 19, 3, 14, 7, 999999)
    assert conv(v) is v
    assert conv(dt.datetime(2020, 1, 1, 8, tzinfo=dt.timezone(dt.timedelta(hours=8)))) == dt.datetime(2020, 1, 1)
    assert conv("0000-00-00 00:00:00") == "0000-00-00 00:00:00"


def test_mysql_adapt_rows_and_keys():
    sink = MYSQL.writer()
    m = meta({"id": "int(11)", "tm": "time(6)", "ts": "timestamp(6)", "e": "enum('a','b')", "b": "bit(64)"},
             key=("id", "tm"))
    rows = [{"id": 1, "tm": -dt.timedelta(hours=1), "ts": dt.datetime(1970, 1, 1), "e": 2, "b": 2**64 - 1}]
    assert sink.adapt_rows(m, ("id", "tm", "ts", "e", "b"), rows) == [
        {"id": 1, "tm": "-01:00:00", "ts": ZERO_TIMESTAMP, "e": 2, "b": 2**64 - 1}]  # ENUM/BIT ints as they are
    assert rows[0]["tm"] == "-01:00:00"  # converted in place: the rows are the batch plan's own dicts
    plain = [{"id": 1, "e": 1}]
    assert sink.adapt_rows(m, ("id", "e"), plain) is plain
    assert sink.adapt_keys(m, [(1, dt.timedelta(seconds=-1)), (2, None)]) == [(1, "-00:00:01"), (2, None)]
    ints = meta({"id": "int(11)"})
    keys = [(1,)]
    assert sink.adapt_keys(ints, keys) is keys
