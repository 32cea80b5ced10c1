"""TiCDC's single-row checksum (issue 12, point 4): the algorithm against TiDB's own expectations, and its
verification in the Simple and Avro decoders (correct rows pass for every type, a changed byte is a
DecodeError, ``verify_checksum = false`` skips, messages without checksums decode as before).

No golden *checksum* of a real row exists in pingcap/ticdc, pingcap/tiflow or pingcap/tidb tests (TiCDC's codec
tests round-trip through their own encoder). What TiDB pins down are the bytes each column contributes
(``pkg/util/rowcodec/rowcodec_test.go`` ``TestColumnEncode``) and that the per-column CRC update equals one CRC32
over the concatenation (same file, ``TestRowChecksum``); those are the golden cases below. The encoders'
checksums come from separate implementations (applier.devtools.encoders.simple ``tidb_row_checksum`` from the
Python values, applier.devtools.encoders.avro ``datum_checksum`` from the Avro datums).
"""

from __future__ import annotations

import datetime as dt
import io
import json
import math
import struct
import zlib
from decimal import Decimal
from functools import partial

import fastavro
import orjson
import pytest

from applier.codecs import avro as A
from applier.codecs import checksum as CK
from applier.codecs import get_decoder
from applier.codecs import simple as S
from applier.devtools.encoders import avro as AE
from applier.devtools.encoders import simple as SE
from applier.devtools.encoders.registry import InMemoryRegistry
from applier.events import Column, DecodeError, Op, RowChange, SourcePosition, TableSchema
from tests.unit.helpers import kafka_msg, values_equal
from tests.unit.edge_rows import edge_table

POS = SourcePosition("cdc", 0, 0)
FORMATS = ("json", "avro")
kmsg = partial(kafka_msg, None, topic="cdc", partition=0)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v % 2**64)


def lv(b: bytes) -> bytes:
    return struct.pack("<I", len(b)) + b


def col(type_name: str, elements: tuple[str, ...] = ()) -> CK.ChecksumColumn:
    return CK.ChecksumColumn("c", type_name, elements)


# ---------------------------------------------------------------------------------------------------------
# the algorithm: bytes per type (TiDB rowcodec_test.go TestColumnEncode) and the row CRC (TestRowChecksum)
# ---------------------------------------------------------------------------------------------------------

# (type, value, expected bytes); the TiDB case each line mirrors is named in the comment
COLUMN_ENCODE_CASES = [
    ("tinyint", 0, u64(0)),  # tinyint/zero
    ("tinyint", 42, u64(42)),  # tinyint/pos
    ("tinyint", -2, u64(-2)),  # tinyint/neg: two's complement bits
    ("tinyint", -128, u64(-128)),  # tinyint/min/signed
    ("tinyint", 255, u64(255)),  # tinyint/max/unsigned
    ("smallint", -(2**15), u64(-(2**15))),  # smallint/min/signed
    ("mediumint", -(1 << 23), u64(-(1 << 23))),  # mediumint/min/signed
    ("int", 2**32 - 1, u64(2**32 - 1)),  # int/max/unsigned
    ("bigint", -(2**63), u64(-(2**63))),  # bigint/min/signed
    ("bigint", 2**64 - 1, u64(2**64 - 1)),  # bigint/max/unsigned
    ("year", 2023, u64(2023)),  # year
    ("varchar", "foo", b"\x03\x00\x00\x00foo"),  # varchar
    ("varchar", "", b"\x00\x00\x00\x00"),  # varchar/empty
    ("varbinary", b"foo", lv(b"foo")),  # varbinary
    ("char", "foo", lv(b"foo")),  # char
    ("binary", b"", lv(b"")),  # binary/empty
    ("text", "foo", lv(b"foo")),  # text
    ("blob", b"foo", lv(b"foo")),  # blob
    ("longtext", "foo", lv(b"foo")),  # longtext
    ("mediumblob", b"foo", lv(b"foo")),  # mediumblob
    ("tinytext", "", lv(b"")),  # tinytext/empty
    ("float", 3.14, struct.pack("<d", struct.unpack("<f", struct.pack("<f", 3.14))[0])),  # float: float32 widened
    ("float", math.nan, struct.pack("<d", 0.0)),  # float/nan
    ("float", math.inf, struct.pack("<d", 0.0)),  # float/+inf
    ("double", 3.14, struct.pack("<d", 3.14)),  # double
    ("double", -math.inf, struct.pack("<d", 0.0)),  # double/-inf
    ("enum", 0b010, u64(0b010)),  # enum
    ("set", 0b101, u64(0b101)),  # set
    ("bit", b"\x12\x34", u64(0x1234)),  # bit
    ("bit", b"\x12\x34" * 4 + b"\xff", u64(2**64 - 1)),  # bit/truncate
    ("bit", 0x1234, u64(0x1234)),
    ("datetime", "2023-01-02 03:04:05.000", lv(b"2023-01-02 03:04:05.000")),  # datetime: fsp digits as sent
    ("datetime", "0000-00-00 00:00:00", lv(b"0000-00-00 00:00:00")),  # datetime/zero
    ("date", "2023-01-02", lv(b"2023-01-02")),  # date
    ("date", "0000-00-00", lv(b"0000-00-00")),  # date/zero
    ("time", "08:07:00.123456", lv(b"08:07:00.123456")),  # time
    ("time", "00:00:00", lv(b"00:00:00")),  # time/zero
    ("decimal", Decimal("0.000"), lv(b"0.000")),  # decimal/zero
    ("decimal", Decimal("3.14"), lv(b"3.14")),  # decimal/pos
    ("decimal", Decimal("-1.2"), lv(b"-1.2")),  # decimal/neg
    ("decimal", Decimal("-999999.999999"), lv(b"-999999.999999")),  # decimal/min (12, 6)
    ("json", "null", lv(b"null")),  # json/1
    ("json", "42", lv(b"42")),  # json/2
    ("json", '{"a": 42, "foo": "bar"}', lv(b'{"a": 42, "foo": "bar"}')),  # json/3 (TiDB's own text)
    ("null", 1, b""),  # null
    ("geometry", b"\x00", b""),  # geometry
    ("varchar", None, b""),  # nulldatum: every type contributes nothing for NULL
    ("bigint", None, b""),
    ("timestamp", None, b""),
]


@pytest.mark.parametrize("type_name, value, expected", COLUMN_ENCODE_CASES)
def test_column_bytes_are_tidbs(type_name, value, expected):
    assert CK.encode_value(col(type_name), value) == expected


def test_python_values_encode_like_their_text():
    """Decoded values (Decimal, date, datetime, timedelta) give TiDB's text; text is taken as sent."""
    assert CK.encode_value(col("decimal"), Decimal("1.50")) == lv(b"1.50")
    assert CK.encode_value(col("decimal"), Decimal("0E-10")) == lv(b"0.0000000000")
    assert CK.encode_value(col("decimal"), Decimal("1E+3")) == lv(b"1000")
    assert CK.encode_value(col("date"), dt.date(2023, 1, 2)) == lv(b"2023-01-02")
    assert CK.encode_value(col("datetime"), dt.datetime(2023, 1, 2, 3, 4, 5)) == lv(b"2023-01-02 03:04:05")
    assert CK.encode_value(col("datetime"), dt.datetime(2023, 1, 2, 3, 4, 5, 120000)) == lv(
        b"2023-01-02 03:04:05.120000")
    assert CK.encode_value(col("time"), -dt.timedelta(hours=838, minutes=59, seconds=59)) == lv(b"-838:59:59")
    assert CK.encode_value(col("varchar"), "漢") == lv("漢".encode())
    assert CK.encode_value(col("vector"), "[1,2.5]") == struct.pack("<Iff", 2, 1.0, 2.5)  # VectorFloat32 data
    assert CK.encode_value(col("vector"), "[]") == struct.pack("<I", 0)
    assert CK.encode_value(col("enum", ("a", "b")), "b") == u64(2)  # Avro names -> 1-based ordinal
    assert CK.encode_value(col("enum", ("a", "b")), "") == u64(0)
    assert CK.encode_value(col("set", ("a", "b", "c")), "a,c") == u64(0b101)  # docs: 'a,c' -> 5
    assert CK.encode_value(col("set", ("a", "b")), "") == u64(0)
    assert CK.encode_value(col("bool"), 1) == u64(1)  # alias of tinyint


def test_timestamp_is_hashed_in_utc():
    """TiDB converts a TIMESTAMP from the changefeed's zone to UTC before hashing (rowcodec_test.go timestamp)."""
    sh = CK.resolve_zone("Asia/Shanghai")
    assert CK.timestamp_in_utc("2023-01-02 03:04:05.678", sh) == "2023-01-01 19:04:05.678"
    assert CK.encode_value(col("timestamp"), "2023-01-02 03:04:05.678", time_zone=sh) == lv(
        b"2023-01-01 19:04:05.678")
    assert CK.encode_value(col("timestamp"), "2023-01-02 03:04:05", time_zone=CK.UTC) == lv(b"2023-01-02 03:04:05")
    assert CK.timestamp_in_utc("0000-00-00 00:00:00", sh) == "0000-00-00 00:00:00"  # timestamp/zero
    assert CK.resolve_zone("UTC") is CK.UTC
    for bad in ("Local", "", "Mars/Olympus"):
        with pytest.raises(CK.ChecksumError):
            CK.resolve_zone(bad)


def test_row_checksum_is_one_crc32_over_the_column_bytes():
    """TestRowChecksum: updating the CRC per column equals crc32.ChecksumIEEE of the concatenation."""
    cols = [CK.ChecksumColumn("n", "null"), CK.ChecksumColumn("i", "int"), CK.ChecksumColumn("v", "varchar")]
    row = {"n": None, "i": 42, "v": "foobar"}
    assert CK.row_checksum(cols, row) == zlib.crc32(u64(42) + lv(b"foobar")) == 183663747
    assert CK.row_checksum([], {}) == 0  # nil / empty
    assert CK.row_checksum(cols[:1], {"n": None}) == 0  # nullonly
    # a column absent from the row (a virtual generated column TiCDC does not send) counts as NULL
    assert CK.row_checksum(cols + [CK.ChecksumColumn("g", "int")], row) == 183663747
    cols2 = [CK.ChecksumColumn("id", "int"), CK.ChecksumColumn("name", "varchar"),
             CK.ChecksumColumn("f", "double"), CK.ChecksumColumn("amount", "decimal")]
    row2 = {"id": 1, "name": "ann", "f": 3.14, "amount": Decimal("12.50")}
    assert CK.row_checksum(cols2, row2) == 2743445041


def test_values_that_cannot_be_hashed_name_the_column():
    with pytest.raises(CK.ChecksumError, match="column 'c' \\(enum\\).*not one of the members"):
        CK.encode_value(col("enum", ("a",)), "z")
    with pytest.raises(CK.ChecksumError, match="'z' is not one of the members"):
        CK.encode_value(col("set", ("a",)), "a,z")
    with pytest.raises(CK.ChecksumError, match="no checksum encoding"):
        CK.encode_value(col("hugeint"), 1)
    with pytest.raises(CK.ChecksumError, match="expected an integer"):
        CK.encode_value(col("int"), "1")
    with pytest.raises(CK.ChecksumError, match="out of range for FLOAT"):
        CK.encode_value(col("float"), 1e300)


def test_one_moved_column_is_accepted_anything_else_is_not():
    """Column-id order vs table order after one ADD COLUMN ... FIRST / MODIFY COLUMN (module docstring)."""
    cols = [CK.ChecksumColumn(n, "int") for n in "abcd"]
    row = {"a": 1, "b": 2, "c": 3, "d": 4}

    def crc(order: str) -> int:
        return zlib.crc32(b"".join(u64(row[n]) for n in order))

    assert CK.verify_row(cols, row, crc("abcd")) is None
    assert CK.verify_row(cols, row, crc("acdb")) is None  # b moved to the end
    assert CK.verify_row(cols, row, crc("adbc")) is None  # the last column moved forward
    assert CK.verify_row(cols, row, crc("badc")) == crc("abcd")  # two swaps: a mismatch
    assert CK.verify_row(cols, row, crc("abcd") ^ 1) == crc("abcd")


def test_encoders_checksums_agree_with_tidb_bytes():
    """The encoders' own implementations give the same bytes for the golden cases."""
    for type_name, value, expected in COLUMN_ENCODE_CASES:
        if type_name in ("null", "geometry") or (isinstance(value, float) and not math.isfinite(value)):
            continue
        if isinstance(value, bytes) and type_name == "bit" and len(value) > 8:
            continue  # BIT(64) is the most TiCDC can send
        if type_name in ("date", "datetime", "time") and isinstance(value, str) and "0000" not in value:
            continue  # the encoders format Python values; their text forms are covered by the round trips
        c = Column("c", type_name, binary=type_name in ("varbinary", "binary", "blob", "mediumblob"))
        assert SE.tidb_checksum_bytes(c, value) == expected, (type_name, value)


# ---------------------------------------------------------------------------------------------------------
# Simple protocol
# ---------------------------------------------------------------------------------------------------------

VEC_TABLE = TableSchema("db", "vec", 7, (Column("id", "int", nullable=False, key=True, unique=True),
                                         Column("v", "vector")))
SHOP = TableSchema("db", "shop", 3, (
    Column("id", "int", nullable=False, key=True, unique=True), Column("name", "varchar"),
    Column("amount", "decimal"), Column("at", "timestamp"), Column("tm", "time")))
SHOP_ROW = {"id": 1, "name": "ann", "amount": Decimal("12.50"), "at": dt.datetime(2024, 1, 2, 3, 4, 5, 120000),
            "tm": dt.timedelta(hours=-1, seconds=1)}
SHOP_NEW = dict(SHOP_ROW, name="bob", amount=Decimal("13.00"))


def simple_decoder(fmt: str, *tables: TableSchema, **kw) -> S.SimpleDecoder:
    dec = S.SimpleDecoder(encoding_format=fmt, **kw)
    for ts in tables:
        dec.decode(kmsg(SE.encode_bootstrap(ts, encoding_format=fmt)[1]))
    return dec


def simple_row(ts: TableSchema, op: Op, before, after, fmt: str, tz: str = "UTC", **kw) -> bytes:
    ev = RowChange(ts.schema, ts.table, 100, op, before, after, ts.columns, POS)
    return SE.encode_simple(ev, encoding_format=fmt, table_schema=ts, time_zone=tz, build_ts_ms=1, **kw)[1]


def flip(value: bytes, old: bytes, new: bytes) -> bytes:
    """Change one column value's bytes in an encoded message (same length, so the framing stays valid)."""
    assert len(old) == len(new) and value.count(old) == 1, (old, value)
    return value.replace(old, new)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("tz", ["UTC", "Asia/Shanghai"])
def test_simple_every_type_passes_with_its_checksum(fmt, tz):
    ts, rows = edge_table()
    dec = simple_decoder(fmt, ts, VEC_TABLE)
    for i, row in enumerate(rows):
        for op, before, after in ((Op.INSERT, None, row), (Op.UPDATE, rows[i - 1], row), (Op.DELETE, row, None)):
            value = simple_row(ts, op, before, after, fmt, tz, checksum=True)
            [back] = dec.decode(kmsg(value, offset=i))
            assert back.op is op
            for name, v in (after or before).items():
                assert values_equal(next(c.type_name for c in ts.columns if c.name == name),
                                    (back.after or back.before)[name], v), name
    for v in ("[1,2.5,-3]", "[]"):
        [back] = dec.decode(kmsg(simple_row(VEC_TABLE, Op.INSERT, None, {"id": 1, "v": v}, fmt, checksum=True)))
        assert back.after == {"id": 1, "v": v}


@pytest.mark.parametrize("fmt", FORMATS)
def test_simple_checksum_object_is_ticdcs(fmt):
    """checksum{version, corrupted, current, previous}: current for 'data', previous for 'old', 0 = none."""
    cols = SHOP.columns
    ins = simple_row(SHOP, Op.INSERT, None, SHOP_ROW, "json", checksum=True)
    cs = json.loads(ins)["checksum"]
    assert list(cs) == ["version", "corrupted", "current", "previous"]
    assert cs == {"version": 1, "corrupted": False, "previous": 0,
                  "current": SE.tidb_row_checksum(cols, SHOP_ROW)}
    dele = json.loads(simple_row(SHOP, Op.DELETE, SHOP_ROW, None, "json", checksum=True))["checksum"]
    assert dele["current"] == 0 and dele["previous"] == cs["current"]
    # the hand-written row: id, name, amount, at (UTC text), tm
    expected = zlib.crc32(u64(1) + lv(b"ann") + lv(b"12.50") + lv(b"2024-01-02 03:04:05.120000") + lv(b"-00:59:59"))
    assert cs["current"] == expected
    sh = json.loads(simple_row(SHOP, Op.INSERT, None, SHOP_ROW, "json", "Asia/Shanghai", checksum=True))
    assert sh["checksum"]["current"] == zlib.crc32(
        u64(1) + lv(b"ann") + lv(b"12.50") + lv(b"2024-01-01 19:04:05.120000") + lv(b"-00:59:59"))
    dec = simple_decoder(fmt, SHOP)
    for op, before, after in ((Op.INSERT, None, SHOP_ROW), (Op.UPDATE, SHOP_ROW, SHOP_NEW),
                              (Op.DELETE, SHOP_NEW, None)):
        [ev] = dec.decode(kmsg(simple_row(SHOP, op, before, after, fmt, "Asia/Shanghai", checksum=True)))
        assert (ev.before, ev.after) == (before, after)


SIMPLE_CORRUPTIONS = [
    # (operation, which image is damaged, the bytes of one value before and after one byte changed)
    (Op.INSERT, "new row", {"json": (b'"ann"', b'"anm"'), "avro": (b"\x06ann", b"\x06anm")}),
    (Op.INSERT, "new row", {"json": (b'"12.50"', b'"12.51"'), "avro": (b"12.50", b"12.51")}),
    (Op.INSERT, "new row", {"json": (b"03:04:05.12", b"03:04:05.13"), "avro": (b"03:04:05.12", b"03:04:05.13")}),
    (Op.UPDATE, "old row", {"json": (b'"ann"', b'"anm"'), "avro": (b"\x06ann", b"\x06anm")}),
    (Op.UPDATE, "new row", {"json": (b'"bob"', b'"bop"'), "avro": (b"\x06bob", b"\x06bop")}),
    (Op.DELETE, "old row", {"json": (b'"ann"', b'"anm"'), "avro": (b"\x06ann", b"\x06anm")}),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("op, image, changes", SIMPLE_CORRUPTIONS)
def test_simple_changed_byte_is_a_decode_error(fmt, op, image, changes):
    before, after = {Op.INSERT: (None, SHOP_ROW), Op.UPDATE: (SHOP_ROW, SHOP_NEW), Op.DELETE: (SHOP_ROW, None)}[op]
    good = simple_row(SHOP, op, before, after, fmt, checksum=True)
    bad = flip(good, *changes[fmt])
    with pytest.raises(DecodeError, match="row checksum mismatch") as ei:
        simple_decoder(fmt, SHOP).decode(kmsg(bad, offset=77))
    text = str(ei.value)
    assert "`db`.`shop`" in text and image in text and "offset=77" in text
    assert "verify_checksum = false" in text
    cs = (json.loads(good) if fmt == "json" else None)
    if cs is not None:
        want = cs["checksum"]["current" if image == "new row" else "previous"]
        assert f"TiCDC sent {want}," in text
    # verify_checksum = false applies it, the changed value included
    [ev] = simple_decoder(fmt, SHOP, verify_checksum=False).decode(kmsg(bad))
    assert ev.op is op


@pytest.mark.parametrize("fmt", FORMATS)
def test_simple_without_checksum_and_zero_checksums_decode(fmt):
    dec = simple_decoder(fmt, SHOP)
    [ev] = dec.decode(kmsg(simple_row(SHOP, Op.INSERT, None, SHOP_ROW, fmt)))
    assert ev.after == SHOP_ROW
    [ev] = dec.decode(kmsg(simple_row(SHOP, Op.INSERT, None, SHOP_ROW, fmt, checksum={"current": 0})))
    assert ev.after == SHOP_ROW


@pytest.mark.parametrize("fmt", FORMATS)
def test_simple_wrong_checksum_and_corrupted_flag(fmt):
    right = SE.tidb_row_checksum(SHOP.columns, SHOP_ROW)
    value = simple_row(SHOP, Op.INSERT, None, SHOP_ROW, fmt, checksum={"current": right ^ 0x10})
    with pytest.raises(DecodeError, match=f"TiCDC sent {right ^ 0x10}, the row as received gives {right} "
                                          "\\(checksum version 1\\)"):
        simple_decoder(fmt, SHOP).decode(kmsg(value))
    flagged = simple_row(SHOP, Op.INSERT, None, SHOP_ROW, fmt, checksum={"current": right, "corrupted": True})
    for verify in (True, False):  # TiCDC's own verdict is refused either way
        with pytest.raises(DecodeError, match="corrupted"):
            simple_decoder(fmt, SHOP, verify_checksum=verify).decode(kmsg(flagged))


def test_simple_timestamp_location_matters_and_must_be_known():
    value = simple_row(SHOP, Op.INSERT, None, SHOP_ROW, "json", "Asia/Shanghai", checksum=True)
    assert simple_decoder("json", SHOP).decode(kmsg(value))
    # the same checksum with the location rewritten: the instant differs, so the checksum does
    with pytest.raises(DecodeError, match="row checksum mismatch"):
        simple_decoder("json", SHOP).decode(kmsg(flip(value, b'"Asia/Shanghai"', b'"Europe/London"')))
    local = value.replace(b'"Asia/Shanghai"', b'"Local"')
    with pytest.raises(DecodeError, match="cannot verify the row checksum.*'Local'.*--tz"):
        simple_decoder("json", SHOP).decode(kmsg(local))
    [ev] = simple_decoder("json", SHOP, verify_checksum=False).decode(kmsg(local))
    assert ev.after == SHOP_ROW


def test_simple_malformed_checksum_fields():
    base = orjson.loads(simple_row(SHOP, Op.INSERT, None, SHOP_ROW, "json", checksum=True))
    for field, bad in (("current", "1"), ("current", -1), ("previous", 2**32), ("version", "1")):
        obj = dict(base, checksum=dict(base["checksum"], **{field: bad}))
        with pytest.raises(DecodeError, match=f"'checksum' '{field}'"):
            simple_decoder("json", SHOP).decode(kmsg(orjson.dumps(obj)))
        assert simple_decoder("json", SHOP, verify_checksum=False).decode(kmsg(orjson.dumps(obj)))


def test_simple_handle_key_only_delete_is_not_verified():
    obj = orjson.loads(simple_row(SHOP, Op.DELETE, SHOP_ROW, None, "json", checksum=True))
    obj["old"] = {"id": obj["old"]["id"]}
    obj["handleKeyOnly"] = True
    [ev] = simple_decoder("json", SHOP).decode(kmsg(orjson.dumps(obj)))
    assert ev.before == {"id": 1}


def test_simple_held_row_with_a_bad_checksum_is_reported_when_its_schema_arrives():
    bad = flip(simple_row(SHOP, Op.INSERT, None, SHOP_ROW, "json", checksum=True), b'"ann"', b'"anm"')
    dec = S.SimpleDecoder()
    assert dec.decode(kmsg(bad, offset=5)) == []
    with pytest.raises(DecodeError, match="row checksum mismatch") as ei:
        dec.decode(kmsg(SE.encode_bootstrap(SHOP)[1], offset=6))
    assert ei.value.held_message is not None and ei.value.held_message.offset == 5


def test_simple_option_validation():
    assert get_decoder("simple", verify_checksum=False).verify_checksum is False
    assert get_decoder("simple").verify_checksum is True
    with pytest.raises(ValueError, match="verify_checksum must be true or false"):
        get_decoder("simple", verify_checksum="yes")


# ---------------------------------------------------------------------------------------------------------
# Avro protocol
# ---------------------------------------------------------------------------------------------------------

amsg = partial(kafka_msg, topic="db_t", partition=1, offset=9)

AVRO_COLS = (
    Column("id", "int", nullable=False, key=True, unique=True),
    Column("ti", "tinyint"), Column("si", "smallint", unsigned=True), Column("mi", "mediumint"),
    Column("i", "int", unsigned=True), Column("bi", "bigint"), Column("ub", "bigint", unsigned=True),
    Column("f", "float"), Column("d", "double"), Column("bit", "bit"), Column("dec", "decimal"),
    Column("ch", "char"), Column("vc", "varchar"), Column("tx", "longtext"),
    Column("bin", "binary", binary=True), Column("bl", "blob", binary=True),
    Column("e", "enum"), Column("s", "set"), Column("j", "json"), Column("da", "date"),
    Column("dtm", "datetime"), Column("ts", "timestamp"), Column("tm", "time"), Column("y", "year"),
    Column("v", "vector"), Column("n", "varchar"),
)
AVRO_SPECS = {"db.t": {"dec": AE.ColumnSpec(precision=20, scale=4), "bit": AE.ColumnSpec(length=64),
                       "e": AE.ColumnSpec(allowed=("small", "large,x", "z")),
                       "s": AE.ColumnSpec(allowed=("a", "b", "c"))}}
AVRO_ROWS = [
    {"id": 1, "ti": -128, "si": 65535, "mi": -8388608, "i": 4294967295, "bi": -(2**63), "ub": 2**64 - 1,
     "f": 3.14, "d": -1.7976931348623157e308, "bit": 2**64 - 1, "dec": Decimal("-1234567890123456.7890"),
     "ch": "漢字", "vc": "<&>\u2028", "tx": "x" * 300, "bin": b"\x00\xff\x00", "bl": bytes(range(256)),
     "e": "large,x", "s": "a,c", "j": '{"a": [1, 2.5, null]}', "da": dt.date(2024, 2, 29),
     "dtm": dt.datetime(2024, 2, 29, 23, 59, 59, 999999), "ts": dt.datetime(2038, 1, 19, 3, 14, 7, 500000),
     "tm": -dt.timedelta(hours=838, minutes=59, seconds=59), "y": 2155, "v": "[1,-2.5,3e-7]", "n": None},
    {"id": 2, "ti": 0, "si": 0, "mi": 0, "i": 0, "bi": 0, "ub": 0, "f": 0.0, "d": 5e-324, "bit": 0,
     "dec": Decimal("0.0000"), "ch": "", "vc": "", "tx": "", "bin": b"", "bl": b"", "e": "small", "s": "",
     "j": "null", "da": "0000-00-00", "dtm": "0000-00-00 00:00:00", "ts": dt.datetime(1970, 1, 1, 8, 0, 1),
     "tm": dt.timedelta(0), "y": 0, "v": "[]", "n": "z"},
    {"id": 3, **{c.name: None for c in AVRO_COLS[1:]}},
]


def avro_pair(reg, **kw):
    kw.setdefault("column_specs", AVRO_SPECS)
    tz = kw.pop("time_zone", "UTC")
    enc = AE.AvroEncoder(reg, enable_row_checksum=True, time_zone=tz, **kw)
    dec = A.AvroDecoder(registry=reg, checksum_time_zone=tz)
    return enc, dec


def avro_row(op: Op, before, after, cols=AVRO_COLS) -> RowChange:
    return RowChange("db", "t", 500, op, before, after, cols, POS)


@pytest.mark.parametrize("modes", [("precise", "long"), ("string", "string")])
@pytest.mark.parametrize("tz", ["UTC", "Asia/Shanghai"])
def test_avro_every_type_passes_with_its_checksum(modes, tz):
    reg = InMemoryRegistry()
    enc, dec = avro_pair(reg, decimal_mode=modes[0], bigint_unsigned_mode=modes[1], time_zone=tz,
                         include_before_value=True)
    for i, row in enumerate(AVRO_ROWS):
        prev = AVRO_ROWS[i - 1] if i else AVRO_ROWS[-1]
        for op, before, after in ((Op.INSERT, None, row), (Op.UPDATE, dict(prev, id=row["id"]), row),
                                  (Op.DELETE, row, None)):
            [(k, v)] = enc.encode(avro_row(op, before, after), "db.t")
            [ev] = dec.decode(amsg(k, v))
            assert ev.op is op
            got = ev.after if after is not None else ev.before
            for c in AVRO_COLS:
                assert values_equal(c.type_name, got[c.name], (after or before)[c.name]), c.name


def test_avro_checksum_fields_are_ticdcs():
    reg = InMemoryRegistry()
    enc, _ = avro_pair(reg, decimal_mode="string", bigint_unsigned_mode="string")
    row = avro_row(Op.INSERT, None, AVRO_ROWS[0])
    names = [f["name"] for f in enc.value_schema(row)["fields"]]
    assert names[-6:] == ["_tidb_op", "_tidb_commit_ts", "_tidb_commit_physical_time",
                          "_tidb_row_level_checksum", "_tidb_corrupted", "_tidb_checksum_version"]
    cols = (Column("id", "int", nullable=False, key=True), Column("name", "varchar"), Column("d", "double"),
            Column("amount", "decimal"))
    small = RowChange("db", "t", 500, Op.INSERT, None, {"id": 1, "name": "ann", "d": 3.14,
                                                        "amount": Decimal("12.50")}, cols, POS)
    [(_, v)] = enc.encode(small, "db.t2")
    rec = fastavro.schemaless_reader(io.BytesIO(v[5:]), fastavro.parse_schema(enc.value_schema(small)), None)
    assert rec["_tidb_row_level_checksum"] == "2743445041"  # the hand-computed row above
    assert rec["_tidb_corrupted"] is False and rec["_tidb_checksum_version"] == 1


AVRO_CORRUPTIONS = [
    # (column, its value in the row, the bytes as written, one byte changed)
    ("vc", "hello", b"\x0ahello", b"\x0ahellp"),
    ("bl", b"\x01\x02\x03\x04", b"\x08\x01\x02\x03\x04", b"\x08\x01\x02\x03\x05"),
    ("dec", Decimal("77.1234"), b"77.1234", b"77.1235"),  # string mode
    ("dtm", dt.datetime(2021, 5, 6, 7, 8, 9), b"2021-05-06 07:08:09", b"2021-05-06 07:08:08"),
    ("e", "z", b"\x02z", b"\x02c"),  # an ENUM name that is another member's would map to a wrong ordinal
    ("bi", 1234567, b"\x8e\xda\x96\x01", b"\x8e\xda\x96\x02"),  # the zigzag varint of a long
]


@pytest.mark.parametrize("column, value, wire, changed", AVRO_CORRUPTIONS)
def test_avro_changed_byte_is_a_decode_error(column, value, wire, changed):
    reg = InMemoryRegistry()
    enc, dec = avro_pair(reg, decimal_mode="string", bigint_unsigned_mode="string")
    if column == "e":
        enc.column_specs["db.t"]["e"] = AE.ColumnSpec(allowed=("z", "c"))
        dec = A.AvroDecoder(registry=reg)
    row = {**AVRO_ROWS[2], "id": 5, column: value}
    [(k, v)] = enc.encode(avro_row(Op.INSERT, None, row), "db.t")
    bad = flip(v, wire, changed)
    with pytest.raises(DecodeError, match="row checksum mismatch for db.t") as ei:
        dec.decode(amsg(k, bad))
    assert "topic=db_t partition=1 offset=9" in str(ei.value) and "TiCDC sent" in str(ei.value)
    [ev] = A.AvroDecoder(registry=reg, verify_checksum=False).decode(amsg(k, bad))
    assert ev.after[column] != value


def test_avro_delete_with_before_value_checks_the_old_row():
    reg = InMemoryRegistry()
    enc, dec = avro_pair(reg, include_before_value=True)
    row = {**AVRO_ROWS[2], "id": 5, "vc": "hello"}
    [(k, v)] = enc.encode(avro_row(Op.DELETE, row, None), "db.t")
    [ev] = dec.decode(amsg(k, v))
    assert ev.op is Op.DELETE and ev.before["vc"] == "hello"
    assert v.count(b"\x0ahello") == 2  # the record's row and _ticdc_before
    bad = v.replace(b"\x0ahello", b"\x0ahellp", 1)  # the record's own row
    with pytest.raises(DecodeError, match="row checksum mismatch"):
        dec.decode(amsg(k, bad))


def test_avro_without_checksum_decodes():
    reg = InMemoryRegistry()
    row = avro_row(Op.INSERT, None, {**AVRO_ROWS[2], "id": 5, "vc": "hello"})
    [(k, v)] = AE.AvroEncoder(reg, column_specs=AVRO_SPECS).encode(row, "db.t")  # no checksum fields at all
    assert A.AvroDecoder(registry=reg).decode(amsg(k, v))[0].after["vc"] == "hello"
    enc, dec = avro_pair(reg)
    for empty in ("", "0"):  # TiCDC writes "" when the row has no checksum (TiDB's checksum off)
        [(k, v)] = enc.encode(row, "db.t", checksum=empty)
        assert dec.decode(amsg(k, v))[0].after["vc"] == "hello"


def test_avro_wrong_or_malformed_checksum_and_corrupted_flag():
    reg = InMemoryRegistry()
    enc, dec = avro_pair(reg)
    row = avro_row(Op.INSERT, None, {**AVRO_ROWS[2], "id": 5})
    right = enc.row_checksum(row, row.after)
    [(k, v)] = enc.encode(row, "db.t", checksum=right + 1)
    with pytest.raises(DecodeError, match=f"TiCDC sent {right + 1}, the row as received gives {right} "
                                          "\\(checksum version 1\\)"):
        dec.decode(amsg(k, v))
    for bad in ("abc", "-1", str(2**32), " 1"):
        [(k, v)] = enc.encode(row, "db.t", checksum=bad)
        with pytest.raises(DecodeError, match="_tidb_row_level_checksum is .* not a CRC32"):
            dec.decode(amsg(k, v))
    [(k, v)] = enc.encode(row, "db.t", corrupted=True)
    for verify in (True, False):
        with pytest.raises(DecodeError, match="corrupted"):
            A.AvroDecoder(registry=reg, verify_checksum=verify).decode(amsg(k, v))


def test_avro_timestamp_needs_ticdcs_time_zone():
    reg = InMemoryRegistry()
    enc, _ = avro_pair(reg, time_zone="Asia/Shanghai")
    row = avro_row(Op.INSERT, None, {**AVRO_ROWS[2], "id": 5, "ts": dt.datetime(2024, 1, 2, 3, 4, 5)})
    [(k, v)] = enc.encode(row, "db.t")
    assert A.AvroDecoder(registry=reg, checksum_time_zone="Asia/Shanghai").decode(amsg(k, v))
    with pytest.raises(DecodeError, match="checksum_time_zone \\(now 'UTC'\\)"):
        A.AvroDecoder(registry=reg).decode(amsg(k, v))
    # without a TIMESTAMP value the zone does not matter
    [(k, v)] = enc.encode(avro_row(Op.INSERT, None, {**AVRO_ROWS[2], "id": 6}), "db.t")
    assert A.AvroDecoder(registry=reg).decode(amsg(k, v))


def test_avro_fields_in_column_id_order_and_one_moved_column():
    """TiCDC sorts the fields by column id; a table-order checksum (pingcap/ticdc) differs by one move."""
    reg = InMemoryRegistry()
    cols = (Column("id", "int", nullable=False, key=True), Column("a", "varchar"), Column("b", "varchar"),
            Column("c", "varchar"))
    after = {"id": 1, "a": "x", "b": "y", "c": "z"}
    enc, dec = avro_pair(reg)
    table_order = zlib.crc32(u64(1) + lv(b"z") + lv(b"x") + lv(b"y"))  # c was added FIRST after id
    [(k, v)] = enc.encode(RowChange("db", "m", 1, Op.INSERT, None, after, cols, POS), "db.m", checksum=table_order)
    assert dec.decode(amsg(k, v))[0].after == after
    swapped = zlib.crc32(u64(1) + lv(b"y") + lv(b"x") + lv(b"z"))
    [(k, v)] = enc.encode(RowChange("db", "m", 1, Op.INSERT, None, after, cols, POS), "db.m", checksum=swapped)
    with pytest.raises(DecodeError, match="row checksum mismatch"):
        dec.decode(amsg(k, v))


def test_avro_allowed_members_are_unescaped():
    assert A.allowed_members("a,b") == ("a", "b")
    assert A.allowed_members("small,large\\,x,z") == ("small", "large,x", "z")
    assert A.allowed_members("") == ()
    assert AE.escape_enum_option("large,x") == "large\\,x"


def test_avro_option_validation():
    reg = InMemoryRegistry()
    assert get_decoder("avro", registry=reg, verify_checksum=False).verify_checksum is False
    with pytest.raises(ValueError, match="verify_checksum must be true or false"):
        get_decoder("avro", registry=reg, verify_checksum=1)
    with pytest.raises(ValueError, match="checksum_time_zone: unknown time zone 'Mars/Base'"):
        get_decoder("avro", registry=reg, checksum_time_zone="Mars/Base")
    with pytest.raises(ValueError, match="checksum_time_zone: .*'Local'"):
        get_decoder("avro", registry=reg, checksum_time_zone="Local")


def test_tiflow_checksum_schema_verifies_a_real_shaped_row(vectors):
    """tiflow's expectedSchemaWithExtensionEnableChecksum.avsc (fields sorted by column id, decimal and
    bigint-unsigned in string mode): a row built on it verifies, one changed byte does not."""
    schema = json.loads((vectors / "avro" / "expectedSchemaWithExtensionEnableChecksum.avsc").read_text())
    rec: dict = {}
    parts: list[bytes] = []
    samples = {"INT": (7, u64(7)), "INT UNSIGNED": (7, u64(7)), "BIGINT": (-7, u64(-7)),
               "BIGINT UNSIGNED": ("18446744073709551615", u64(2**64 - 1)),
               "FLOAT": (1.5, struct.pack("<d", 1.5)), "DOUBLE": (2.25, struct.pack("<d", 2.25)),
               "BIT": (b"\x01", u64(1)), "DECIMAL": ("129012.1230000", lv(b"129012.1230000")),
               "TEXT": ("hello", lv(b"hello")), "BLOB": (b"\x00\x01", lv(b"\x00\x01")),
               "ENUM": ("b", u64(2)), "SET": ("a,b", u64(3)), "JSON": ('{"k": 1}', lv(b'{"k": 1}')),
               "DATE": ("2020-01-02", lv(b"2020-01-02")),
               "DATETIME": ("2020-01-02 03:04:05.123", lv(b"2020-01-02 03:04:05.123")),
               "TIMESTAMP": ("2020-01-02 03:04:05", lv(b"2020-01-02 03:04:05")),
               "TIME": ("-01:02:03", lv(b"-01:02:03")), "YEAR": (2020, u64(2020))}
    for f in schema["fields"]:
        t = f["type"]
        if not isinstance(t, dict):  # nullable columns stay NULL, extension fields come below
            rec[f["name"]] = None
            continue
        value, contributes = samples[t["connect.parameters"]["tidb_type"]]
        rec[f["name"]] = value
        parts.append(contributes)
    expected = zlib.crc32(b"".join(parts))
    rec.update({"_tidb_op": "c", "_tidb_commit_ts": 1, "_tidb_commit_physical_time": 0,
                "_tidb_row_level_checksum": str(expected), "_tidb_corrupted": False, "_tidb_checksum_version": 1})
    reg = InMemoryRegistry()
    sid = reg.register("testdb_avroencode-value", json.dumps(schema))
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), rec)
    value = b"\x00" + struct.pack(">I", sid) + buf.getvalue()
    dec = A.AvroDecoder(registry=reg, decimal_mode="string", bigint_unsigned_mode="string")
    [ev] = dec.decode(amsg(None, value))
    assert ev.after["enum"] == "b" and ev.after["set"] == "a,b"
    with pytest.raises(DecodeError, match="row checksum mismatch for testdb.avroencode"):
        dec.decode(amsg(None, value.replace(b"\x0ahello", b"\x0ahellp", 1)))
