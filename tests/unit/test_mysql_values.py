"""Shared MySQL value conversions (applier.mysql_values)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applier import mysql_values as T
from applier.devtools.encoders import values as V
from tests.unit.helpers import VALUE_STRATEGIES

# ---------------------------------------------------------------------------------------------------------
# Type names
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("int", ("int", False)),
        ("INT(11)", ("int", False)),
        ("int(10) unsigned", ("int", True)),
        ("int unsigned", ("int", True)),
        ("bigint(20) unsigned zerofill", ("bigint", True)),
        ("int zerofill", ("int", True)),
        ("decimal(10,2)", ("decimal", False)),
        ("decimal(10,0) unsigned zerofill", ("decimal", True)),
        ("numeric", ("decimal", False)),
        ("float unsigned", ("float", True)),
        ("double precision", ("double", False)),
        ("enum('a','b','c')", ("enum", False)),
        ("enum('unsigned','x y')", ("enum", False)),
        ("set('a','b')", ("set", False)),
        ("varchar(255)", ("varchar", False)),
        ("year(4)", ("year", False)),
        ("bit(3)", ("bit", False)),
        ("tinyint(1)", ("tinyint", False)),
        ("boolean", ("tinyint", False)),
        ("integer", ("int", False)),
        ("datetime(6)", ("datetime", False)),
    ],
)
def test_split_mysql_type(spec, expected):
    assert T.split_mysql_type(spec) == expected


def test_binary_type_name():
    assert T.binary_type_name("varchar", True) == "varbinary"
    assert T.binary_type_name("char", True) == "binary"
    assert T.binary_type_name("text", True) == "blob"
    assert T.binary_type_name("longtext", True) == "longblob"
    assert T.binary_type_name("json", True) == "json"
    assert T.binary_type_name("varchar", False) == "varchar"


# ---------------------------------------------------------------------------------------------------------
# Text -> value
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "type_name, text, expected",
    [
        ("tinyint", "-128", -128),
        ("tinyint unsigned", "255", 255),
        ("bigint", "-9223372036854775808", -(2**63)),
        ("bigint unsigned", "18446744073709551615", 2**64 - 1),
        ("bigint(20) unsigned", "9223372036854775808", 2**63),
        ("year", "2020", 2020),
        ("year", "0", 0),
        ("float", "3.14", 3.14),
        ("double", "2.71", 2.71),
        ("double", "-1e-7", -1e-7),
        ("char", "测试String", "测试String"),
        ("varchar", "", ""),
        ("longtext", "x\ny", "x\ny"),
        ("enum", "a", "a"),
        ("set", "a,b", "a,b"),
        ("json", '{"key1": "value1"}', '{"key1": "value1"}'),
        ("bit", "65", 65),
        ("date", "2020-02-20", dt.date(2020, 2, 20)),
        ("datetime", "2020-02-20 02:20:20", dt.datetime(2020, 2, 20, 2, 20, 20)),
        ("datetime", "2020-02-20 02:20:20.1", dt.datetime(2020, 2, 20, 2, 20, 20, 100000)),
        ("datetime(6)", "2020-02-20 02:20:20.000001", dt.datetime(2020, 2, 20, 2, 20, 20, 1)),
        ("timestamp", "1973-12-30 15:30:00", dt.datetime(1973, 12, 30, 15, 30)),
        ("time", "02:20:20", dt.timedelta(hours=2, minutes=20, seconds=20)),
        ("time", "838:59:59", dt.timedelta(hours=838, minutes=59, seconds=59)),
        ("time", "-838:59:59.000000", -dt.timedelta(hours=838, minutes=59, seconds=59)),
        ("time", "-00:00:00.5", -dt.timedelta(microseconds=500000)),
        ("time", "25:00:00.123", dt.timedelta(hours=25, microseconds=123000)),
        ("null", "anything", None),
    ],
)
def test_convert_text(type_name, text, expected):
    got = T.convert_text(type_name, text)
    assert got == expected
    assert type(got) is type(expected)


def test_decimal_is_exact_and_keeps_scale():
    d = T.convert_text("decimal(13,7)", "129012.1230000")
    assert isinstance(d, Decimal)
    assert str(d) == "129012.1230000"
    assert d.as_tuple().exponent == -7
    big = T.convert_text("decimal(65,30)", "12345678901234567890123456789012345.123456789012345678901234567890")
    assert str(big) == "12345678901234567890123456789012345.123456789012345678901234567890"


def test_binary_types_give_exact_bytes():
    raw = bytes(range(256))
    text = raw.decode("latin-1")
    for name in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        assert T.convert_text(name, text) == raw
    # the binary flag turns character types into their binary twins
    assert T.convert_text("varchar", text, binary=True) == raw
    assert T.convert_text("text", text, binary=True) == raw
    with pytest.raises(T.ConversionError):
        T.convert_text("blob", "测试")  # not one character per byte


@pytest.mark.parametrize(
    "type_name, text",
    [
        ("date", "0000-00-00"),
        ("date", "2020-00-15"),
        ("date", "2020-01-00"),
        ("datetime", "0000-00-00 00:00:00"),
        ("datetime", "0000-00-00 00:00:00.000000"),
        ("timestamp", "0000-00-00 00:00:00"),
        ("datetime", "2021-00-00 12:34:56"),
    ],
)
def test_zero_dates_come_back_as_the_original_string(type_name, text):
    assert T.convert_text(type_name, text) == text
    assert T.is_zero_date(text)


@pytest.mark.parametrize(
    "type_name, text",
    [
        ("int", "abc"),
        ("int", "1.5"),
        ("bigint", ""),
        ("decimal", "abc"),
        ("decimal", "NaN"),
        ("decimal", "Infinity"),
        ("float", "nan"),
        ("double", "inf"),
        ("date", "2020-02-30"),
        ("date", "2020/02/20"),
        ("date", "20200220"),
        ("datetime", "2020-02-20T02:20:20"),
        ("datetime", "2020-02-20 25:00:00"),
        ("datetime", "2020-02-20 02:20:20+08:00"),
        ("datetime", "2020-02-20 02:20:20.1234567"),
        ("datetime", "0000-00-00 99:00:00"),
        ("time", "12:60:00"),
        ("time", "1:2"),
        ("time", "12:00:00.1234567"),
        ("time", "ab:cd:ef"),
        ("geometry", "POINT(1 1)"),
    ],
)
def test_invalid_text_raises_conversion_error(type_name, text):
    with pytest.raises(T.ConversionError):
        T.convert_text(type_name, text)


def test_unknown_type_is_an_error():
    with pytest.raises(T.ConversionError):
        T.text_converter("no_such_type")
    with pytest.raises(T.ConversionError):
        T.convert_text("no_such_type", "1")


def test_none_stays_none():
    assert T.convert_text("int", None) is None
    assert T.convert_text("blob", None) is None


def test_converters_are_cached_per_type():
    assert T.text_converter("int") is T.text_converter("int")
    assert T.text_converter("decimal(10,2)") is T.parse_decimal


def test_bits_to_int():
    assert V.bits_to_int(b"\x00\x41") == 65
    assert V.bits_to_int(b"\xff" * 8) == 2**64 - 1


# ---------------------------------------------------------------------------------------------------------
# Formatters (encoders) and round trips
# ---------------------------------------------------------------------------------------------------------


def test_formatters_match_tidb_text():
    assert V.format_datetime(dt.datetime(2020, 2, 20, 2, 20, 20)) == "2020-02-20 02:20:20"
    assert V.format_datetime(dt.datetime(2020, 2, 20, 2, 20, 20, 120000)) == "2020-02-20 02:20:20.120000"
    assert V.format_date(dt.date(1, 1, 1)) == "0001-01-01"
    assert T.format_time(-dt.timedelta(hours=838, minutes=59, seconds=59)) == "-838:59:59"
    assert T.format_time(dt.timedelta(days=1, seconds=1, microseconds=5)) == "24:00:01.000005"
    assert T.format_time(-dt.timedelta(microseconds=500000)) == "-00:00:00.500000"
    assert V.format_decimal(Decimal("1E+2")) == "100"
    assert V.format_decimal(Decimal("1.500")) == "1.500"
    # Go strconv.FormatFloat(v, 'f', -1, 32 / 64)
    assert V.format_float_fixed(3.14, single=True) == "3.14"
    assert V.format_float_fixed(T.float32(3.14), single=True) == "3.14"
    assert V.format_float_fixed(1e-7) == "0.0000001"
    assert V.format_float_fixed(1e21) == "1000000000000000000000"
    assert V.format_float_fixed(100.0) == "100"
    assert V.format_float_fixed(2.71) == "2.71"


@given(st.floats(width=32, allow_nan=False, allow_infinity=False))
def test_shortest_float32_identifies_the_float32(x):
    s = T.shortest_float32(x)
    assert T.float32(s) == T.float32(x)
    assert len(Decimal(repr(s)).normalize().as_tuple().digits) <= 9  # float32 never needs more digits


@settings(max_examples=300)
@given(st.data())
def test_format_then_parse_round_trips(data):
    for type_name, fmt, parse in (
        ("datetime", V.format_datetime, T.parse_datetime),
        ("date", V.format_date, T.parse_date),
        ("time", T.format_time, T.parse_time),
        ("decimal", V.format_decimal, T.parse_decimal),
    ):
        v = data.draw(VALUE_STRATEGIES[(type_name, False)], label=type_name)
        assert parse(fmt(v)) == v
    f = data.draw(VALUE_STRATEGIES[("double", False)])
    assert T.parse_float(V.format_float_fixed(f)) == f
    f32 = data.draw(VALUE_STRATEGIES[("float", False)])
    assert T.float32(T.parse_float(V.format_float_fixed(f32, single=True))) == T.float32(f32)


@given(st.text(max_size=30), st.sampled_from(sorted(T.KNOWN_TYPES)))
def test_convert_text_raises_only_conversion_error(text, type_name):
    try:
        T.convert_text(type_name, text)
    except T.ConversionError:
        pass
