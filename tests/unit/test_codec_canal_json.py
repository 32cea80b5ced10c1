"""TiCDC Canal-JSON codec: golden vectors, round trips, malformed input, fuzzing."""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import Decimal
from functools import partial
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.codecs import Decoder, get_decoder
from applier.codecs import canal_json as C
from applier import mysql_values as T
from applier.devtools.encoders import canal_json as CE
from applier.events import DDL, Column, DecodeError, KafkaMessage, Op, Resolved, RowChange, SourcePosition
from tests.unit.helpers import VALUE_STRATEGIES, assert_same_row, kafka_msg, mutate_bytes

POS = SourcePosition("orders", 3, 42)
WHERE = "topic=orders partition=3 offset=42"
COMMIT_TS = 417318403368288260


msg = partial(kafka_msg, None)  # Canal-JSON messages have no key that matters


def jmsg(obj) -> KafkaMessage:
    return msg(orjson.dumps(obj))


@pytest.fixture
def dec() -> C.CanalJSONDecoder:
    return get_decoder("canal-json")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def test_get_decoder_and_protocol(dec):
    assert isinstance(dec, Decoder)
    assert dec.name == "canal-json"
    assert dec.gated is True
    assert get_decoder("canal-json", require_tidb_extension=False).gated is False
    with pytest.raises(ValueError, match="require_tidb_extension"):
        get_decoder("canal-json", enable_tidb_extension=True)


# ---------------------------------------------------------------------------------------------------------
# Golden vectors
# ---------------------------------------------------------------------------------------------------------


def test_extension_golden_messages_decode(vectors, dec):
    watermark, ddl = _lines(vectors / "canal-json" / "canal_json_extension_golden.jsonl")
    # decode the exact (indented) text the Go test asserts
    assert dec.decode(msg(watermark["message_text_exact"].encode())) == [Resolved(ts=1024, position=POS)]
    (e,) = dec.decode(msg(ddl["message_text_exact"].encode()))
    assert e == DDL(schema="cdc", table="person", commit_ts=COMMIT_TS,
                    query="create table person(id int, name varchar(32), tiny tinyint unsigned, comment text, "
                          "primary key(id))",
                    position=POS, ddl_type="CREATE", size=e.size)


def test_extension_golden_messages_encode(vectors):
    watermark, ddl = _lines(vectors / "canal-json" / "canal_json_extension_golden.jsonl")
    key, value = CE.encode_canal_json(Resolved(ts=1024, position=POS), build_ts_ms=1469579899)
    assert key is None
    got = orjson.loads(value)
    assert got == watermark["message"]
    assert list(got) == list(watermark["message"])  # same field order as TiCDC
    query = ddl["message"]["sql"]
    key, value = CE.encode_canal_json(
        DDL(schema="cdc", table="person", commit_ts=COMMIT_TS, query=query, position=POS, ddl_type=3),
        build_ts_ms=1469579899,
    )
    got = orjson.loads(value)
    assert got == ddl["message"]  # es = commitTs >> 18 = 1591943372224
    assert list(got) == list(ddl["message"])
    # a canal DDL type name passes through unchanged
    _, value = CE.encode_canal_json(DDL("cdc", "person", COMMIT_TS, query, POS, "CREATE"), build_ts_ms=1)
    assert orjson.loads(value)["type"] == "CREATE"


def test_docs_examples(vectors, dec):
    drop_db, insert, watermark, update_fragment = _lines(vectors / "canal-json" / "docs_examples.jsonl")
    (e,) = dec.decode(jmsg(drop_db["message"]))
    assert e == DDL(schema="test", table="", commit_ts=163963309467037594, query="drop database if exists test",
                    position=POS, ddl_type="QUERY", size=e.size)

    (e,) = dec.decode(jmsg(insert["message"]))
    assert (e.schema, e.table, e.commit_ts, e.op, e.before) == ("test", "tp_int", 163963314122145239,
                                                                 Op.INSERT, None)
    assert e.after == {"c_bigint": 9223372036854775807, "c_int": 2147483647, "c_mediumint": 8388607,
                       "c_smallint": 32767, "c_tinyint": 127, "id": 2}
    assert e.key_columns == ("id",)
    cols = {c.name: c for c in e.columns}
    assert cols["c_tinyint"] == Column("c_tinyint", "tinyint", nullable=True, type_code=-6, declared="tinyint")
    assert cols["id"] == Column("id", "int", nullable=True, key=True, unique=True, type_code=4, declared="int")

    assert dec.decode(jmsg(watermark["message"])) == [Resolved(ts=429918007904436226, position=POS)]

    # The UPDATE fragment has no _tidb: no commit ts, so gated mode refuses it and says why.
    with pytest.raises(DecodeError, match="enable-tidb-extension=true") as ei:
        dec.decode(jmsg(update_fragment["message"]))
    assert WHERE in str(ei.value)
    # Completed with the INSERT's metadata it decodes: old carries all columns.
    full = dict(insert["message"], type="UPDATE", data=update_fragment["message"]["data"],
                old=update_fragment["message"]["old"])
    (e,) = dec.decode(jmsg(full))
    assert e.op is Op.UPDATE
    assert e.after == {"c_bigint": 9223372036854775807, "c_int": 0, "c_mediumint": 8388607,
                       "c_smallint": 32767, "c_tinyint": 0, "id": 2}
    assert e.before == {"c_bigint": 9223372036854775807, "c_int": 2147483647, "c_mediumint": 8388607,
                        "c_smallint": 32767, "c_tinyint": 127, "id": 2}
    # ... and without the extension requirement it decodes with an unknown (0) commit ts
    lenient = get_decoder("canal-json", require_tidb_extension=False)
    no_ext = {k: v for k, v in full.items() if k != "_tidb"}
    (e,) = lenient.decode(jmsg(no_ext))
    assert e.commit_ts == 0 and e.op is Op.UPDATE and e.before["c_int"] == 2147483647


_CONST_TO_TYPE = {
    "TypeTiny": "tinyint", "TypeShort": "smallint", "TypeInt24": "mediumint", "TypeLong": "int",
    "TypeLonglong": "bigint", "TypeFloat": "float", "TypeDouble": "double", "TypeNewDecimal": "decimal",
    "TypeVarchar": "varchar", "TypeString": "char", "TypeTinyBlob": "tinytext", "TypeBlob": "text",
    "TypeMediumBlob": "mediumtext", "TypeLongBlob": "longtext", "TypeDate": "date", "TypeDatetime": "datetime",
    "TypeTimestamp": "timestamp", "TypeDuration": "time", "TypeYear": "year", "TypeEnum": "enum",
    "TypeSet": "set", "TypeBit": "bit", "TypeJSON": "json",
}
_TEXTISH = {"varchar", "char", "tinytext", "text", "mediumtext", "longtext"}


def _go_bytes_literal(go: str) -> bytes:
    m = re.fullmatch(r'\[\]uint8\("(.*)"\)', go)
    assert m, go
    return m.group(1).encode("utf-8")


def _column_table(vectors: Path):
    """canal_test_util.go's testColumnsTable -> (mysqlType map, data row, expected Python values)."""
    table = json.loads((vectors / "canal-json" / "canal_column_value_table.json").read_text())
    mysql_type, data, expected, dummy_binary = {}, {}, {}, {}
    for c in table["columns"]:
        name, flags = c["column"], set(c["flags"])
        base = _CONST_TO_TYPE[c["mysqlTypeConst"]]
        binary = "BinaryFlag" in flags and base in _TEXTISH
        type_name = T.TEXT_TO_BINARY[base] if binary else base
        if "UnsignedFlag" in flags and base not in ("bit", "year"):
            type_name += " unsigned"  # TiCDC's withUnsigned4MySQLType
        mysql_type[name] = type_name
        enc = c["expectedEncodedValue"]
        if c["expectedDecodedValue_go"] == "nil":
            data[name], expected[name] = None, None
        elif binary:
            # the Go test feeds a dummy here; the real encoder maps each byte to one ISO-8859-1 character
            raw = _go_bytes_literal(c["goInputValue"])
            data[name], expected[name] = raw.decode("latin-1"), raw
            dummy_binary[name] = enc
        elif base in ("tinyint", "smallint", "mediumint", "int", "bigint", "year", "enum", "set", "bit"):
            data[name], expected[name] = enc, int(enc)
        elif base in ("float", "double"):
            data[name], expected[name] = enc, float(enc)
        elif base == "decimal":
            data[name], expected[name] = enc, Decimal(enc)
        elif base == "date":
            data[name], expected[name] = enc, dt.datetime.strptime(enc, "%Y-%m-%d").date()
        elif base in ("datetime", "timestamp"):
            data[name], expected[name] = enc, dt.datetime.strptime(enc, "%Y-%m-%d %H:%M:%S")
        elif base == "time":
            h, m, s = (int(x) for x in enc.split(":"))
            data[name], expected[name] = enc, dt.timedelta(hours=h, minutes=m, seconds=s)
        else:  # char/varchar/text family, json
            data[name], expected[name] = enc, enc
    assert len(mysql_type) == 52
    return mysql_type, data, expected, dummy_binary


def _row_message(mysql_type, data, *, etype="INSERT", old=None, pk=("t",), commit_ts=COMMIT_TS):
    return {"id": 0, "database": "test", "table": "t", "pkNames": list(pk) or None, "isDdl": False,
            "type": etype, "es": commit_ts >> 18, "ts": 1, "sql": "",
            "sqlType": {n: CE.JAVA_VARCHAR for n in mysql_type}, "mysqlType": mysql_type,
            "old": old, "data": data, "_tidb": {"commitTs": commit_ts}}


def test_column_value_table_every_column_decodes(vectors, dec):
    mysql_type, data, expected, dummy_binary = _column_table(vectors)
    (e,) = dec.decode(jmsg(_row_message(mysql_type, [data])))
    assert e.op is Op.INSERT and e.commit_ts == COMMIT_TS and e.key_columns == ("t",)
    assert list(e.after) == list(expected)
    for name, want in expected.items():
        got = e.after[name]
        assert got == want and type(got) is type(want), (name, got, want)
    cols = {c.name: c for c in e.columns}
    assert cols["biu2"].unsigned and cols["biu2"].type_name == "bigint"
    assert e.after["biu2"] == 9223372036854775808
    assert cols["varbinaryT"].binary and cols["varbinaryT"].type_name == "varbinary"
    assert cols["blobT"].type_name == "blob" and not cols["textT"].binary
    assert e.after["jsonT"] == '{"key1": "value1"}'
    # UPDATE / DELETE of the same row
    (u,) = dec.decode(jmsg(_row_message(mysql_type, [data], etype="UPDATE", old=[data])))
    assert u.before == u.after == e.after
    (d,) = dec.decode(jmsg(_row_message(mysql_type, [data], etype="DELETE")))
    assert d.before == e.after and d.after is None
    # The test's dummy binary strings are not ISO-8859-1 byte maps: refused, not silently mangled.
    assert dummy_binary
    for name, dummy in dummy_binary.items():
        with pytest.raises(DecodeError, match=name):
            dec.decode(jmsg(_row_message(mysql_type, [dict(data, **{name: dummy})])))


def _go_value(go: str):
    if go == "nil":
        return None
    m = re.fullmatch(r"u?int64\((-?\d+)\)", go)
    if m:
        return int(m.group(1))
    if go.startswith("[]uint8("):
        return _go_bytes_literal(go)
    if go.startswith('"'):
        return json.loads(go)
    return float(go)


def test_mysql_type_expectations(vectors):
    table = json.loads((vectors / "canal-json" / "canal_mysql_type_expectations.json").read_text())
    checked = 0
    for t in table["tables"]:
        for c in t["columns"]:
            short, with_len = c["mysqlType"], c["mysqlTypeWithLen"]
            base, unsigned = T.split_mysql_type(short)
            assert T.split_mysql_type(with_len) == (base, unsigned), c
            col = Column("c", base, unsigned=unsigned, binary=base in T.BINARY_TYPES)
            assert CE.mysql_type_string(col) == short.replace(" zerofill", ""), c
            for j in c.get("javaSQLType", []):
                assert CE.java_sql_type(col, _go_value(j["goValue"])) == j["code"], (t["ddl"], c, j)
                checked += 1
    assert checked >= 20


def test_content_compatible_types_and_multi_row_message(dec):
    mysql_type = {"id": "int(10) unsigned", "d": "decimal(5,2)", "e": "enum('a','b','c')",
                  "s": "set('a','b','c')", "vb": "varbinary(23)", "b": "bit(3)", "y": "year(4)",
                  "tt": "timestamp(3)", "z": "int(10) unsigned zerofill"}
    rows = [
        {"id": "1", "d": "1.50", "e": "2", "s": "3", "vb": "\u0000\u00ff", "b": "5", "y": "2024",
         "tt": "2024-01-02 03:04:05.678", "z": "7"},
        {"id": "2", "d": None, "e": None, "s": "0", "vb": "", "b": "0", "y": "0", "tt": None, "z": None},
        {"id": "4294967295", "d": "-999.99", "e": "1", "s": "7", "vb": "abc", "b": "7", "y": "1901",
         "tt": "0000-00-00 00:00:00", "z": "0"},
    ]
    events = dec.decode(jmsg(_row_message(mysql_type, rows, pk=("id",))))
    assert [e.after["id"] for e in events] == [1, 2, 4294967295]
    assert all(e.op is Op.INSERT and e.position == POS for e in events)
    a = events[0].after
    assert a == {"id": 1, "d": Decimal("1.50"), "e": 2, "s": 3, "vb": b"\x00\xff", "b": 5, "y": 2024,
                 "tt": dt.datetime(2024, 1, 2, 3, 4, 5, 678000), "z": 7}
    assert str(a["d"]) == "1.50"
    assert events[2].after["tt"] == "0000-00-00 00:00:00"
    assert events[1].after["d"] is None
    cols = {c.name: c for c in events[0].columns}
    assert cols["z"].unsigned and cols["id"].unsigned and cols["id"].key
    assert cols["vb"].binary and cols["vb"].type_name == "varbinary"
    assert [c.name for c in events[0].columns] == list(rows[0])  # data order, not Go's random map order


def test_update_with_only_changed_old_columns(dec):
    mysql_type = {"id": "int", "a": "varchar", "b": "int"}
    data = [{"id": "1", "a": "new", "b": "5"}, {"id": "2", "a": "x", "b": "9"}]
    old = [{"a": "old"}, {"b": "8"}]
    value = orjson.dumps(_row_message(mysql_type, data, etype="UPDATE", old=old, pk=("id",)))
    e1, e2 = dec.decode(msg(value))
    assert e1.before == {"id": 1, "a": "old", "b": 5} and e1.after == {"id": 1, "a": "new", "b": 5}
    assert e2.before == {"id": 2, "a": "x", "b": 8} and e2.after == {"id": 2, "a": "x", "b": 9}
    assert 0 < e1.size + e2.size <= len(value)  # the message's bytes are shared out between its rows


def test_handle_key_only_and_claim_check(dec):
    m = _row_message({"id": "int"}, [{"id": "1"}], etype="DELETE", pk=("id",))
    m["_tidb"]["onlyHandleKey"] = True
    (e,) = dec.decode(jmsg(m))
    assert e.op is Op.DELETE and e.before == {"id": 1}
    m["type"] = "INSERT"
    with pytest.raises(DecodeError, match="handle-key-only"):
        dec.decode(jmsg(m))
    m["_tidb"] = {"commitTs": 5, "claimCheckLocation": "s3://bucket/file"}
    with pytest.raises(DecodeError, match="claim-check"):
        dec.decode(jmsg(m))


def test_watermark_zero_is_omitted_by_go_and_accepted(dec):
    m = {"id": 0, "database": "", "table": "", "pkNames": None, "isDdl": False, "type": "TIDB_WATERMARK",
         "es": 0, "ts": 0, "sql": "", "sqlType": None, "mysqlType": None, "data": None, "old": None, "_tidb": {}}
    assert dec.decode(jmsg(m)) == [Resolved(ts=0, position=POS)]
    _, value = CE.encode_canal_json(Resolved(0, POS), build_ts_ms=0)
    assert orjson.loads(value) == m


# ---------------------------------------------------------------------------------------------------------
# Encoder -> decoder round trips
# ---------------------------------------------------------------------------------------------------------

_TYPES = sorted(VALUE_STRATEGIES)


@st.composite
def row_changes(draw, op=None):
    specs = draw(st.lists(st.sampled_from(_TYPES), min_size=1, max_size=6))
    cols = (Column(name="id", type_name="bigint", nullable=True, key=True, unique=True),) + tuple(
        Column(name=f"c{i}", type_name=n, unsigned=u, binary=n in T.BINARY_TYPES) for i, (n, u) in enumerate(specs)
    )

    def image():
        img = {"id": draw(st.integers(-(2**63), 2**63 - 1))}
        for col, spec in zip(cols[1:], specs):
            img[col.name] = draw(st.none() | VALUE_STRATEGIES[spec])
        return img

    op = op or draw(st.sampled_from([Op.INSERT, Op.UPDATE, Op.DELETE]))
    return RowChange(schema=draw(st.sampled_from(["db", "测试库"])), table="t",
                     commit_ts=draw(st.integers(1, 2**64 - 1)), op=op,
                     before=image() if op is not Op.INSERT else None,
                     after=image() if op is not Op.DELETE else None, columns=cols, position=POS)




@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row_changes())
def test_round_trip_rows(e):
    key, value = CE.encode_canal_json(e)
    assert key is None
    (got,) = get_decoder("canal-json").decode(msg(value))
    assert_same_row(got, e, nullable=False)
    m = orjson.loads(value)
    assert m["es"] == e.commit_ts >> 18 and m["_tidb"] == {"commitTs": e.commit_ts}
    assert m["pkNames"] == ["id"]
    if e.op is Op.UPDATE:
        assert list(m["old"][0]) == list(m["data"][0])  # old carries all columns


@pytest.mark.parametrize("spec", _TYPES, ids=[f"{n}{' unsigned' if u else ''}" for n, u in _TYPES])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_every_type(spec, data):
    cols = (Column("id", "int", key=True, unique=True),
            Column("c0", spec[0], unsigned=spec[1], binary=spec[0] in T.BINARY_TYPES))
    v = data.draw(VALUE_STRATEGIES[spec])
    e = RowChange("s", "t", 9, Op.INSERT, None, {"id": 1, "c0": v}, cols, POS)
    (got,) = get_decoder("canal-json").decode(msg(CE.encode_canal_json(e)[1]))
    assert_same_row(got, e, nullable=False)


def test_encoder_value_formats():
    col = Column("c", "float")
    assert CE.format_value(col, T.float32(3.14)) == "3.14"
    assert CE.format_value(Column("c", "double"), 1e-7) == "0.0000001"
    assert CE.format_value(Column("c", "varbinary", binary=True), b"\x00\xff") == "\x00\xff"
    assert CE.format_value(Column("c", "varchar"), "测试") == "测试"
    assert CE.format_value(Column("c", "decimal"), Decimal("2333")) == "2333"
    assert CE.format_value(Column("c", "time"), dt.timedelta(hours=2, minutes=20, seconds=20)) == "02:20:20"
    assert CE.java_sql_type(Column("c", "tinyint", unsigned=True), 128) == CE.JAVA_SMALLINT
    assert CE.java_sql_type(Column("c", "bigint", unsigned=True), 2**63) == CE.JAVA_DECIMAL
    assert CE.java_sql_type(Column("c", "text"), "x") == CE.JAVA_CLOB
    assert CE.java_sql_type(Column("c", "varchar", binary=True), b"x") == CE.JAVA_BLOB
    assert CE.canal_ddl_type(4) == "ERASE" and CE.canal_ddl_type(11) == "TRUNCATE" and CE.canal_ddl_type(5) == "ALTER"
    assert CE.canal_ddl_type(7) == "CINDEX" and CE.canal_ddl_type(14) == "RENAME" and CE.canal_ddl_type(1) == "QUERY"


# ---------------------------------------------------------------------------------------------------------
# Malformed input
# ---------------------------------------------------------------------------------------------------------

_GOOD = {"id": 0, "database": "d", "table": "t", "pkNames": ["id"], "isDdl": False, "type": "INSERT", "es": 1,
         "ts": 1, "sql": "", "sqlType": {"id": 4, "v": 12}, "mysqlType": {"id": "int", "v": "varbinary"},
         "old": None, "data": [{"id": "1", "v": "x"}], "_tidb": {"commitTs": 5}}


def _bad(**changes):
    m = json.loads(json.dumps(_GOOD))
    for k, v in changes.items():
        if v is ...:
            m.pop(k, None)
        else:
            m[k] = v
    return orjson.dumps(m)


_MALFORMED = {
    "none value": (None, "empty value"),
    "empty value": (b"", "empty value"),
    "invalid JSON": (b'{"id":0,', "not valid JSON"),
    "compressed": (b"\x04\x22\x4d\x18garbage", "not valid JSON"),
    "not an object": (b"[1,2]", "expected an object"),
    "no extension": (_bad(_tidb=...), "enable-tidb-extension=true"),
    "extension not an object": (_bad(_tidb=[1]), "'_tidb'"),
    "no commitTs": (_bad(_tidb={}), "commitTs"),
    "string commitTs": (_bad(_tidb={"commitTs": "5"}), "commitTs"),
    "unknown type": (_bad(type="UPSERT"), "unknown message type"),
    "type missing": (_bad(type=...), "'type'"),
    "isDdl not bool": (_bad(isDdl="yes"), "isDdl"),
    "ddl without sql": (_bad(isDdl=True, type="CREATE", sql=None), "sql"),
    "no data": (_bad(data=None), "no rows"),
    "empty data": (_bad(data=[]), "no rows"),
    "row not an object": (_bad(data=[5]), "objects"),
    "no mysqlType": (_bad(mysqlType=None), "mysqlType"),
    "column without mysqlType": (_bad(data=[{"id": "1", "v": "x", "w": "y"}]), "'w'"),
    "unknown mysqlType": (_bad(mysqlType={"id": "int", "v": "superblob2"}), "unknown mysqlType"),
    "geometry": (_bad(mysqlType={"id": "int", "v": "geometry"}), "GEOMETRY"),
    "bad int": (_bad(data=[{"id": "one", "v": "x"}]), "'id'"),
    "int given as list": (_bad(data=[{"id": [1], "v": "x"}]), "'id'"),
    "bad binary": (_bad(data=[{"id": "1", "v": "测"}]), "ISO-8859-1"),
    "update without old": (_bad(type="UPDATE"), "'old'"),
    "old length mismatch": (_bad(type="UPDATE", old=[{}, {}]), "'old'"),
    "bad old value": (_bad(type="UPDATE", old=[{"id": "x"}]), "'old' row 0"),
    "pkNames not a list": (_bad(pkNames="id"), "pkNames"),
    "sqlType not an object": (_bad(sqlType=[4]), "sqlType"),
    "sqlType not an int": (_bad(sqlType={"id": "int"}), "sqlType"),
    "database not a string": (_bad(database=5), "'database'"),
    "watermark without extension": (_bad(type="TIDB_WATERMARK", _tidb=...), "enable-tidb-extension"),
    "bad watermark": (_bad(type="TIDB_WATERMARK", _tidb={"watermarkTs": -1}), "watermarkTs"),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_malformed_input_raises_decode_error(case, dec):
    value, reason = _MALFORMED[case]
    with pytest.raises(DecodeError) as ei:
        dec.decode(msg(value))
    err = ei.value
    assert err.position == POS and err.protocol == "canal-json"
    assert WHERE in str(err)
    assert reason in err.reason, err.reason


def test_good_message_used_by_malformed_cases_is_good(dec):
    (e,) = dec.decode(msg(orjson.dumps(_GOOD)))
    assert e.after == {"id": 1, "v": b"x"}
    # Spark hands binary columns over as bytearray
    (e2,) = dec.decode(msg(bytearray(orjson.dumps(_GOOD))))
    assert e2.after == e.after


# ---------------------------------------------------------------------------------------------------------
# Fuzzing: nothing but DecodeError ever escapes
# ---------------------------------------------------------------------------------------------------------

_FUZZ_DECODERS = [get_decoder("canal-json"), get_decoder("canal-json", require_tidb_extension=False)]


def _only_decode_errors(value):
    for d in _FUZZ_DECODERS:
        try:
            events = d.decode(msg(value))
        except DecodeError as e:
            assert e.position == POS and e.protocol == "canal-json"
        else:
            assert isinstance(events, list) and events


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.none(), st.binary(max_size=120)))
def test_fuzz_random_bytes(value):
    _only_decode_errors(value)


def _seeds() -> list[bytes]:
    cols = (Column("id", "bigint", key=True, unique=True), Column("s", "varchar"),
            Column("b", "varbinary", binary=True), Column("d", "decimal"), Column("t", "datetime"),
            Column("tm", "time"), Column("u", "bigint", unsigned=True), Column("e", "enum"))
    vals = {"id": 1, "s": "测试", "b": b"\x00\xff", "d": Decimal("1.50"), "t": dt.datetime(2020, 1, 1, 1, 1, 1, 5),
            "tm": dt.timedelta(hours=-30), "u": 2**64 - 1, "e": 2}
    return [
        CE.encode_canal_json(RowChange("s", "t", 5, Op.INSERT, None, vals, cols, POS))[1],
        CE.encode_canal_json(RowChange("s", "t", 6, Op.UPDATE, dict(vals, s="old"), vals, cols, POS))[1],
        CE.encode_canal_json(RowChange("s", "t", 7, Op.DELETE, vals, None, cols, POS))[1],
        CE.encode_canal_json(DDL("s", "t", 8, "CREATE TABLE t (id int)", POS, 3))[1],
        CE.encode_canal_json(Resolved(9, POS))[1],
    ]


_SEEDS = _seeds()


@st.composite
def mutated_bytes(draw):
    return mutate_bytes(draw, draw(st.sampled_from(_SEEDS)), steps=(1, 4),
                        special=b'{}[]":,0123456789tfn\\\x00\xff')


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_bytes())
def test_fuzz_mutated_valid_messages(value):
    _only_decode_errors(value)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def mutated_json(draw):
    m = orjson.loads(draw(st.sampled_from(_SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        target = m
        path = draw(st.lists(st.integers(0, 5), max_size=3))
        for step in path:  # walk down into a random container
            if isinstance(target, dict) and target:
                k = sorted(target)[step % len(target)]
                if isinstance(target[k], (dict, list)) and target[k]:
                    target = target[k]
            elif isinstance(target, list) and target:
                if isinstance(target[step % len(target)], (dict, list)) and target[step % len(target)]:
                    target = target[step % len(target)]
        if isinstance(target, dict) and target:
            k = draw(st.sampled_from(sorted(target)))
            if draw(st.booleans()):
                target[k] = draw(_json_values)
            else:
                del target[k]
        elif isinstance(target, list) and target:
            target[draw(st.integers(0, len(target) - 1))] = draw(_json_values)
    return json.dumps(m).encode()


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_json())
def test_fuzz_structured_json(value):
    _only_decode_errors(value)


# ---------------------------------------------------------------------------------------------------------
# Changefeed variants: no TiDB extension, only-updated old, content-compatible, handle-key-only deletes,
# the pre-5.4 DELETE shape, the byte <-> character mapping of binary values
# ---------------------------------------------------------------------------------------------------------

_VCOLS = (Column("id", "int", key=True, unique=True, unsigned=True), Column("name", "varchar"),
          Column("amount", "decimal"), Column("flag", "tinyint"), Column("blob", "varbinary", binary=True))
_OLD = {"id": 7, "name": "old", "amount": Decimal("1.50"), "flag": 1, "blob": b"\x00\x01"}
_NEW = {"id": 7, "name": "new", "amount": Decimal("1.50"), "flag": 1, "blob": b"\x00\x02"}


def test_variant_without_tidb_extension():
    upd = RowChange("s", "t", COMMIT_TS, Op.UPDATE, _OLD, _NEW, _VCOLS, POS)
    _, value = CE.encode_canal_json(upd, enable_tidb_extension=False, build_ts_ms=1)
    m = orjson.loads(value)
    assert "_tidb" not in m and m["es"] == COMMIT_TS >> 18  # es is still there, but only in milliseconds
    lenient = get_decoder("canal-json", require_tidb_extension=False)
    assert lenient.gated is False
    (e,) = lenient.decode(msg(value))
    assert (e.commit_ts, e.op, e.before, e.after) == (0, Op.UPDATE, _OLD, _NEW)
    with pytest.raises(DecodeError, match="enable-tidb-extension=true"):
        get_decoder("canal-json").decode(msg(value))
    # DDL without the extension: commit ts 0 as well; watermarks do not exist without it
    _, value = CE.encode_canal_json(DDL("s", "t", COMMIT_TS, "TRUNCATE TABLE t", POS, 11),
                                   enable_tidb_extension=False)
    (d,) = lenient.decode(msg(value))
    assert (d.commit_ts, d.ddl_type, d.query) == (0, "TRUNCATE", "TRUNCATE TABLE t")
    with pytest.raises(ValueError, match="watermarks"):
        CE.encode_canal_json(Resolved(5, POS), enable_tidb_extension=False)
    # a message that does carry _tidb is still read exactly by the lenient decoder
    (e,) = lenient.decode(msg(CE.encode_canal_json(upd)[1]))
    assert e.commit_ts == COMMIT_TS


def test_variant_only_output_updated_columns(dec):
    upd = RowChange("s", "t", COMMIT_TS, Op.UPDATE, _OLD, _NEW, _VCOLS, POS)
    _, value = CE.encode_canal_json(upd, only_output_updated_columns=True)
    m = orjson.loads(value)
    assert m["old"] == [{"name": "old", "blob": "\x00\x01"}]  # only what changed
    assert m["data"] == [{"id": "7", "name": "new", "amount": "1.50", "flag": "1", "blob": "\x00\x02"}]
    (e,) = dec.decode(msg(value))
    assert e.before == _OLD and e.after == _NEW  # the untouched columns come from data
    # a no-op update: old is [{}]
    noop = RowChange("s", "t", COMMIT_TS, Op.UPDATE, dict(_NEW), _NEW, _VCOLS, POS)
    _, value = CE.encode_canal_json(noop, only_output_updated_columns=True)
    assert orjson.loads(value)["old"] == [{}]
    (e,) = dec.decode(msg(value))
    assert e.op is Op.UPDATE and e.before == e.after == _NEW
    # default: old carries every column
    assert list(orjson.loads(CE.encode_canal_json(upd)[1])["old"][0]) == list(_OLD)


def _ddl_column_specs(ddl: str) -> list[str]:
    body = ddl[ddl.index("(") + 1 : ddl.rindex(")")]
    parts, depth, cur = [], 0, []
    for ch in body:
        if ch == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
            continue
        depth += ch == "("
        depth -= ch == ")"
        cur.append(ch)
    parts.append("".join(cur).strip())
    return [p.split(None, 1)[1] for p in parts]


def test_variant_content_compatible_mysql_types(vectors):
    """content-compatible=true writes TiDB's full type; without the real type at hand the encoder uses MySQL's
    default display widths, which match TiCDC's expectations for every column declared without parameters."""
    table = json.loads((vectors / "canal-json" / "canal_mysql_type_expectations.json").read_text())
    defaults = explicit = 0
    for t in table["tables"]:
        specs = _ddl_column_specs(t["ddl"])
        for c in t["columns"]:
            spec = specs[c["index"]].lower()
            want = c["mysqlTypeWithLen"]
            base, unsigned = T.split_mysql_type(want)
            col = Column("c", base, unsigned=unsigned, binary=base in T.BINARY_TYPES)
            type_word = spec.split()[0]
            if "(" in type_word or "zerofill" in spec or type_word == "bool":
                assert CE.mysql_type_full(col, want) == want  # the real type passes through
                explicit += 1
            else:
                assert CE.mysql_type_full(col) == want, (t["ddl"], spec)
                defaults += 1
    assert defaults >= 30 and explicit >= 15


def test_variant_content_compatible_round_trip(dec):
    cols = _VCOLS + (Column("e", "enum"), Column("y", "year"), Column("b", "bit"))
    row = dict(_NEW, e=2, y=2024, b=5)
    upd = RowChange("s", "t", COMMIT_TS, Op.UPDATE, dict(row, name="old"), row, cols, POS)
    _, value = CE.encode_canal_json(upd, content_compatible=True,
                                   mysql_types={"name": "varchar(32)", "e": "enum('a','b')", "b": "bit(3)"})
    m = orjson.loads(value)
    assert m["mysqlType"] == {"id": "int(10) unsigned", "name": "varchar(32)", "amount": "decimal(10,0)",
                              "flag": "tinyint(4)", "blob": "varbinary(255)", "e": "enum('a','b')",
                              "y": "year(4)", "b": "bit(3)"}
    assert m["old"] == [{"name": "old"}]  # content-compatible implies only-output-updated-columns
    (e,) = dec.decode(msg(value))
    assert e.after == row and e.before == dict(row, name="old")
    got = {c.name: c for c in e.columns}
    assert got["id"].unsigned and got["id"].type_name == "int" and got["blob"].binary
    assert got["e"].type_name == "enum" and got["b"].type_name == "bit"
    # the only-updated default can be overridden
    _, value = CE.encode_canal_json(upd, content_compatible=True, only_output_updated_columns=False)
    assert list(orjson.loads(value)["old"][0]) == list(row)


def test_variant_delete_only_handle_key_and_pre_5_4_delete_shape(dec):
    dele = RowChange("s", "t", COMMIT_TS, Op.DELETE, _OLD, None, _VCOLS, POS)
    _, value = CE.encode_canal_json(dele, delete_only_handle_key=True)
    m = orjson.loads(value)
    assert m["data"] == [{"id": "7"}] and m["sqlType"] == {"id": CE.JAVA_INTEGER}
    assert m["mysqlType"] == {"id": "int unsigned"} and m["old"] is None
    (e,) = dec.decode(msg(value))
    assert (e.op, e.before, e.after, e.key_columns) == (Op.DELETE, {"id": 7}, None, ("id",))
    # TiCDC before v5.4 repeated the deleted row in "old": an ordinary delete
    _, value = CE.encode_canal_json(dele, legacy_delete_old=True)
    m = orjson.loads(value)
    assert m["old"] == m["data"] and m["type"] == "DELETE"
    (e,) = dec.decode(msg(value))
    assert (e.op, e.before, e.after) == (Op.DELETE, _OLD, None)
    # hand-written pre-5.4 shape, old equal to data, several rows
    legacy = _row_message({"id": "int"}, [{"id": "1"}, {"id": "2"}], etype="DELETE", old=[{"id": "1"}, {"id": "2"}],
                          pk=("id",))
    assert [(e.op, e.before) for e in dec.decode(jmsg(legacy))] == [(Op.DELETE, {"id": 1}), (Op.DELETE, {"id": 2})]
    with pytest.raises(ValueError, match="no key column"):
        CE.encode_canal_json(RowChange("s", "t", 1, Op.DELETE, {"name": "x"}, None, _VCOLS[1:2], POS),
                            delete_only_handle_key=True)


def test_binary_values_map_one_byte_per_character(vectors, dec):
    """TiCDC maps binary bytes to ISO-8859-1 characters (canal_entry.go formatValue); all 256 byte values,
    and UTF-8 text stored in a binary column (the column table's "测试Binary"), come back byte for byte."""
    every_byte = bytes(range(256))
    cols = (Column("id", "int", key=True, unique=True), Column("b", "varbinary", binary=True),
            Column("bl", "blob", binary=True), Column("bi", "binary", binary=True))
    utf8 = "测试Binary".encode()
    row = {"id": 1, "b": every_byte, "bl": utf8, "bi": b"\x00\x80\xff"}
    _, value = CE.encode_canal_json(RowChange("s", "t", COMMIT_TS, Op.INSERT, None, row, cols, POS))
    data = orjson.loads(value)["data"][0]
    assert data["b"] == "".join(chr(i) for i in range(256))
    assert data["bl"] == utf8.decode("latin-1") and data["bi"] == "\x00\x80\xff"
    (e,) = dec.decode(msg(value))
    assert e.after == row
    table = json.loads((vectors / "canal-json" / "canal_column_value_table.json").read_text())
    binaries = [c for c in table["columns"] if "BinaryFlag" in c["flags"] and "blob" in c["column"].lower()
                or c["column"] in ("binaryT", "varbinaryT")]
    assert len(binaries) == 6
    for c in binaries:
        raw = _go_bytes_literal(c["goInputValue"])
        m = _row_message({"t": "int", "v": "varbinary"}, [{"t": "1", "v": raw.decode("latin-1")}])
        (e,) = dec.decode(jmsg(m))
        assert e.after["v"] == raw
