"""TiCDC Debezium codec: golden vectors (real Debezium and TiCDC's tests), round trips, malformed input, fuzzing."""

from __future__ import annotations

import base64
import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.codecs import Decoder, get_decoder
from applier.codecs import debezium as D
from applier import mysql_values as T
from applier.devtools.encoders import debezium as DE
from applier.events import DDL, Column, DecodeError, KafkaMessage, Op, Resolved, RowChange, SourcePosition
from tests.unit.helpers import TIME_MAX, TIME_MIN, VALUE_STRATEGIES, assert_same_row, kafka_msg, mutate_bytes

POS = SourcePosition("orders", 3, 42)
WHERE = "topic=orders partition=3 offset=42"
NOW = 1701326309000  # the ts_ms TiCDC's tests pin


msg = kafka_msg


def jmsg(key_obj, value_obj) -> KafkaMessage:
    return msg(None if key_obj is None else orjson.dumps(key_obj), orjson.dumps(value_obj))


@pytest.fixture
def dec() -> D.DebeziumDecoder:
    return get_decoder("debezium")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def _pairs(path: Path) -> list[tuple[dict, dict]]:
    recs = _lines(path)
    assert len(recs) == 22
    out = []
    for k, v in zip(recs[::2], recs[1::2]):
        assert (k["part"], v["part"]) == ("key", "value") and k["source"]["test"] == v["source"]["test"]
        out.append((k, v))
    return out


# ---------------------------------------------------------------------------------------------------------
# Interface
# ---------------------------------------------------------------------------------------------------------


def test_get_decoder_and_options(dec):
    assert isinstance(dec, Decoder)
    assert dec.name == "debezium"
    assert dec.gated is False  # Debezium carries no watermark unless enable-tidb-extension=true
    assert D.DebeziumDecoder.gated is False
    assert get_decoder("debezium", gated=True).gated is True
    assert get_decoder("debezium", time_zone="Asia/Shanghai").time_zone == "Asia/Shanghai"
    with pytest.raises(ValueError, match="require_tidb_extension"):
        get_decoder("debezium", enable_tidb_extension=True)
    with pytest.raises(ValueError, match="unknown time zone"):
        D.DebeziumDecoder(time_zone="Mars/Olympus")


# ---------------------------------------------------------------------------------------------------------
# datatype.dbz.json: real Debezium (MySQL connector 2.4) output for datatype.dml.sql
# ---------------------------------------------------------------------------------------------------------

# column -> full MySQL type, from datatype.ddl.sql
DATATYPE_FT = {
    "pk": "int", "col_d_2023": "date", "col_d_1000": "date", "col_d_9999": "date", "col_d_0000": "date",
    "col_dt": "datetime", "col_dt_fsp_0": "datetime(0)", "col_dt_fsp_1": "datetime(1)",
    "col_dt_fsp_4": "datetime(4)", "col_dt_fsp_6": "datetime(6)", "col_dt_0000": "datetime(6)",
    "col_t": "time", "col_t_fsp_0": "time(0)", "col_t_fsp_1": "time(1)", "col_t_fsp_4": "time(4)",
    "col_t_fsp_6": "time(6)", "col_t_neg": "time(6)",
    "col_ts": "timestamp", "col_ts_fsp_0": "timestamp(0)", "col_ts_fsp_1": "timestamp(1)",
    "col_ts_fsp_5": "timestamp(5)", "col_ts_fsp_6": "timestamp(6)",
    "col_y": "year", "col_bit_1": "bit(1)", "col_bit_5": "bit(5)", "col_bit_6": "bit(6)", "col_bit_60": "bit(60)",
    "col_varchar": "varchar(100)", "col_char": "char(100)", "col_varbinary": "varbinary(100)",
    "col_binary": "binary(100)", "col_blob": "blob",
    "col_decimal": "decimal(10,5)", "col_numeric": "decimal(10,5)", "col_float": "float", "col_double": "double",
    "col_int": "int", "col_int_unsigned": "int unsigned", "col_tinyint": "tinyint",
    "col_tinyint_unsigned": "tinyint unsigned", "col_smallint": "smallint",
    "col_smallint_unsigned": "smallint unsigned",
    "col_mediumint": "mediumint", "col_mediumint_unsigned": "mediumint unsigned", "col_bigint": "bigint",
    "col_bigint_unsigned": "bigint unsigned",
    "col_enum": "enum('a','b','c')", "col_enum_invalid": "enum('a','b','c')", "col_set": "set('a','b','c')",
    "col_set_invalid": "set('a','b','c')", "col_json": "json",
}
_TS = dt.datetime(2023, 11, 30, 12, 34, 56)
_T = dt.timedelta(hours=12, minutes=34, seconds=56)
# The row of datatype.dml.sql as TiDB stores it (rounded to each column's fsp; sql_mode='' zero dates, invalid
# ENUM/SET members stored as ordinal 0) - what TiCDC hands its encoder.
DATATYPE_STORED = {
    "pk": 1, "col_d_2023": dt.date(2023, 11, 30), "col_d_1000": dt.date(1000, 1, 1),
    "col_d_9999": dt.date(9999, 12, 31), "col_d_0000": "0000-00-00",
    "col_dt": _TS, "col_dt_fsp_0": _TS, "col_dt_fsp_1": _TS.replace(microsecond=100000),
    "col_dt_fsp_4": _TS.replace(microsecond=123500), "col_dt_fsp_6": _TS.replace(microsecond=123456),
    "col_dt_0000": "0000-00-00 00:00:00",
    "col_t": _T, "col_t_fsp_0": _T, "col_t_fsp_1": _T + dt.timedelta(microseconds=100000),
    "col_t_fsp_4": _T + dt.timedelta(microseconds=123500), "col_t_fsp_6": _T + dt.timedelta(microseconds=123456),
    "col_t_neg": -(_T + dt.timedelta(microseconds=123456)),
    "col_ts": _TS, "col_ts_fsp_0": _TS, "col_ts_fsp_1": _TS.replace(microsecond=100000),
    "col_ts_fsp_5": _TS.replace(microsecond=123460), "col_ts_fsp_6": _TS.replace(microsecond=123456),
    "col_y": 2023, "col_bit_1": 1, "col_bit_5": 16, "col_bit_6": 16, "col_bit_60": 16,
    "col_varchar": "foo", "col_char": "foo", "col_varbinary": b"foo", "col_binary": b"foo" + bytes(97),
    "col_blob": b"foo", "col_decimal": Decimal("12345.12345"), "col_numeric": Decimal("12345.12345"),
    "col_float": T.float32(12345.12345), "col_double": 12345.12345,
    "col_int": -2147483648, "col_int_unsigned": 4294967295, "col_tinyint": -128, "col_tinyint_unsigned": 255,
    "col_smallint": -32768, "col_smallint_unsigned": 65535, "col_mediumint": -8388608,
    "col_mediumint_unsigned": 16777215, "col_bigint": -9223372036854775808,
    "col_bigint_unsigned": 18446744073709551615,
    "col_enum": 1, "col_enum_invalid": 0, "col_set": 3, "col_set_invalid": 0, "col_json": '["foo"]',
}


def _datatype_columns() -> tuple[Column, ...]:
    out = []
    for name, full in DATATYPE_FT.items():
        base, unsigned = T.split_mysql_type(full)
        out.append(Column(name, base, nullable=name != "pk", key=name == "pk", unique=name == "pk",
                          unsigned=unsigned, binary=base in T.BINARY_TYPES))
    return tuple(out)


def _datatype_event() -> RowChange:
    return RowChange("test", "foo", 1, Op.INSERT, None, dict(DATATYPE_STORED), _datatype_columns(), POS)


def test_datatype_real_debezium_output_decodes_exactly(vectors, dec):
    key = (vectors / "debezium" / "datatype.dbz.key.json").read_bytes()
    value = (vectors / "debezium" / "datatype.dbz.json").read_bytes()
    (e,) = dec.decode(msg(key, value))
    assert (e.schema, e.table, e.op, e.before, e.position) == ("test", "foo", Op.INSERT, None, POS)
    assert e.commit_ts == 0  # real Debezium has no TiCDC commit_ts
    assert e.size == len(key) + len(value)
    # The exact Python value of every column of datatype.dml.sql as this (extension-less) message gives it.
    want = {
        "pk": 1,
        "col_d_2023": dt.date(2023, 11, 30), "col_d_1000": dt.date(1000, 1, 1), "col_d_9999": dt.date(9999, 12, 31),
        "col_d_0000": None,  # zero date: null on the wire
        "col_dt": _TS, "col_dt_fsp_0": _TS, "col_dt_fsp_1": _TS.replace(microsecond=100000),
        "col_dt_fsp_4": _TS.replace(microsecond=123500), "col_dt_fsp_6": _TS.replace(microsecond=123456),
        "col_dt_0000": None,
        "col_t": _T, "col_t_fsp_0": _T, "col_t_fsp_1": _T + dt.timedelta(microseconds=100000),
        "col_t_fsp_4": _T + dt.timedelta(microseconds=123500), "col_t_fsp_6": _T + dt.timedelta(microseconds=123456),
        "col_t_neg": -(_T + dt.timedelta(microseconds=123456)),
        "col_ts": _TS, "col_ts_fsp_0": _TS, "col_ts_fsp_1": _TS.replace(microsecond=100000),
        "col_ts_fsp_5": _TS.replace(microsecond=123460), "col_ts_fsp_6": _TS.replace(microsecond=123456),
        "col_y": 2023,
        "col_bit_1": 1, "col_bit_5": 16, "col_bit_6": 16, "col_bit_60": 16,
        "col_varchar": "foo", "col_char": "foo",
        # without tidb_type a binary column is an ordinary string field: its base64 text comes through
        "col_varbinary": "Zm9v", "col_binary": base64.b64encode(b"foo" + bytes(97)).decode(), "col_blob": "Zm9v",
        "col_decimal": 12345.12345, "col_numeric": 12345.12345,  # decimals arrive as float64
        "col_float": 12345.123, "col_double": 12345.12345,
        "col_int": -2147483648, "col_int_unsigned": 4294967295, "col_tinyint": -128, "col_tinyint_unsigned": 255,
        "col_smallint": -32768, "col_smallint_unsigned": 65535, "col_mediumint": -8388608,
        "col_mediumint_unsigned": 16777215, "col_bigint": -9223372036854775808,
        "col_bigint_unsigned": -1,  # 18446744073709551615 as int64; only tidb_type can undo this
        "col_enum": "a", "col_enum_invalid": "", "col_set": "a,b", "col_set_invalid": "", "col_json": '["foo"]',
    }
    assert e.after == want
    assert list(e.after) == list(want)
    for name, v in want.items():
        assert type(e.after[name]) is type(v), name
    cols = {c.name: c for c in e.columns}
    assert [c.name for c in e.columns] == list(want)
    assert e.key_columns == ("pk",)
    assert cols["pk"] == Column("pk", "int", nullable=False, key=True, unique=True)
    assert cols["col_d_2023"] == Column("col_d_2023", "date")
    types = {n: c.type_name for n, c in cols.items()}
    assert types["col_dt_fsp_1"] == types["col_dt_fsp_6"] == "datetime"
    assert types["col_ts"] == "timestamp" and types["col_t_neg"] == "time" and types["col_y"] == "year"
    assert types["col_bit_1"] == types["col_bit_60"] == "bit"
    assert types["col_enum"] == "enum" and types["col_set"] == "set" and types["col_json"] == "json"
    assert types["col_decimal"] == "double" and types["col_float"] == "float"
    assert types["col_tinyint"] == "smallint" and types["col_int_unsigned"] == "bigint"  # Connect int16 / int64
    assert all(c.nullable for c in e.columns if c.name != "pk")


def test_datatype_with_tidb_extension_is_exact(vectors, dec):
    """The same message with TiCDC's tidb_type on each field: binary, DECIMAL and BIGINT UNSIGNED exact."""
    value = json.loads((vectors / "debezium" / "datatype.dbz.json").read_text())
    for struct in value["schema"]["fields"][:2]:
        for f in struct["fields"]:
            base, unsigned = T.split_mysql_type(DATATYPE_FT[f["field"]])
            f["tidb_type"] = base + (" unsigned" if unsigned and base not in ("decimal",) else "")
    key = (vectors / "debezium" / "datatype.dbz.key.json").read_bytes()
    (e,) = dec.decode(msg(key, orjson.dumps(value)))
    assert e.after["col_varbinary"] == b"foo" and e.after["col_blob"] == b"foo"
    assert e.after["col_binary"] == b"foo" + bytes(97)
    assert e.after["col_decimal"] == Decimal("12345.12345") and type(e.after["col_decimal"]) is Decimal
    assert e.after["col_bigint_unsigned"] == 2**64 - 1
    assert e.after["col_varchar"] == "foo" and e.after["col_char"] == "foo"
    cols = {c.name: c for c in e.columns}
    assert cols["col_tinyint"].type_name == "tinyint" and cols["col_tinyint_unsigned"].unsigned
    assert cols["col_varbinary"] == Column("col_varbinary", "varbinary", binary=True)
    assert cols["col_char"].type_name == "char" and cols["col_blob"].type_name == "blob"
    assert cols["col_bigint_unsigned"].unsigned and cols["col_bigint_unsigned"].type_name == "bigint"
    # ... and the strict decoder accepts it, but refuses the extension-less original
    strict = get_decoder("debezium", require_tidb_extension=True)
    assert strict.decode(msg(key, orjson.dumps(value)))[0].after == e.after
    with pytest.raises(DecodeError, match="enable-tidb-extension=true") as ei:
        strict.decode(msg(key, (vectors / "debezium" / "datatype.dbz.json").read_bytes()))
    assert WHERE in str(ei.value)


@pytest.mark.parametrize("disable_schema", [False, True])
def test_encoder_matches_real_debezium_for_datatype(vectors, disable_schema):
    """TiCDC's own TestDataTypes: the encoder output equals real Debezium's, ignoring payload.source,
    payload.ts_ms (and the schema when it is disabled)."""
    key, value = DE.encode_debezium(_datatype_event(), cluster_id="dbserver1", field_types=DATATYPE_FT,
                                   disable_schema=disable_schema, ts_ms=NOW)
    want = json.loads((vectors / "debezium" / "datatype.dbz.json").read_text())
    want_key = json.loads((vectors / "debezium" / "datatype.dbz.key.json").read_text())
    got, got_key = orjson.loads(value), orjson.loads(key)
    for ignored in ("source", "ts_ms"):
        got["payload"].pop(ignored)
        want["payload"].pop(ignored)
    if disable_schema:
        assert set(got) == set(got_key) == {"payload"}
        want.pop("schema")
        want_key.pop("schema")
    assert got == want
    assert got_key == want_key
    # TiCDC's field order in the payload: source, ts_ms, transaction, op, before, after
    assert list(orjson.loads(value)["payload"]) == ["source", "ts_ms", "transaction", "op", "before", "after"]


def test_encode_then_decode_datatype_with_extension():
    key, value = DE.encode_debezium(_datatype_event(), cluster_id="dbserver1", field_types=DATATYPE_FT,
                                   enable_tidb_extension=True)
    (e,) = get_decoder("debezium", require_tidb_extension=True).decode(msg(key, value))
    expected = dict(DATATYPE_STORED)
    # what TiCDC's encoding loses for this row
    expected.update(col_d_0000=None, col_dt_0000=None, col_enum="a", col_enum_invalid="", col_set="a,b",
                    col_set_invalid="", col_float=12345.123)  # FLOAT: the shortest float32 text, as Go prints it
    assert e.after == expected
    for name in ("col_decimal", "col_numeric", "col_varbinary", "col_bigint_unsigned", "col_bit_60"):
        assert type(e.after[name]) is type(expected[name]), name
    assert e.commit_ts == 1


# ---------------------------------------------------------------------------------------------------------
# TiCDC's codec_test.go golden messages (tiflow and ticdc)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["tiflow", "ticdc"])
def test_codec_test_vectors_decode(vectors, dec, flavour):
    pairs = _pairs(vectors / "debezium" / f"{flavour}_codec_test_expected.jsonl")
    got = [dec.decode(msg(orjson.dumps(k["message"]), orjson.dumps(v["message"]))) for k, v in pairs]
    assert all(len(events) == 1 for events in got)
    events = [g[0] for g in got]
    rename, create, drop, watermark, ins_noschema, ins, upd_noschema, upd, upd_noold, del_noschema, dele = events
    renamed_table = "table1" if flavour == "tiflow" else "table2"  # the versions disagree (SOURCES.md)
    assert rename == DDL("test", renamed_table, 1, "RENAME TABLE test.table1 to test.table2", POS, "ALTER",
                         size=rename.size)
    create_query = ("CREATE TABLE test.table1" if flavour == "tiflow"
                    else "CREATE TABLE test.table1(id int(10) primary key)")
    assert create == DDL("test", "table1", 1, create_query, POS, "CREATE", size=create.size)
    assert drop == DDL("test", "table2", 1, "DROP TABLE test.table2", POS, "DROP", size=drop.size)
    assert watermark == Resolved(ts=3, position=POS)
    key_nullable = flavour == "tiflow"
    for e in (ins_noschema, ins):
        assert (e.schema, e.table, e.commit_ts, e.op, e.before, e.after) == ("test", "table1", 1, Op.INSERT,
                                                                             None, {"tiny": 1})
        assert e.key_columns == ("tiny",)
    assert ins.columns == (Column("tiny", "smallint", nullable=key_nullable, key=True, unique=True),)
    assert ins_noschema.columns == (Column("tiny", "bigint", nullable=True, key=True, unique=True, inferred=True),)
    for e in (upd_noschema, upd):
        assert (e.op, e.before, e.after, e.commit_ts) == (Op.UPDATE, {"tiny": 2}, {"tiny": 1}, 1)
    # DebeziumOutputOldValue=false: an update without 'before' (applied as an upsert)
    assert (upd_noold.op, upd_noold.before, upd_noold.after) == (Op.UPDATE, None, {"tiny": 1})
    for e in (del_noschema, dele):
        assert (e.op, e.before, e.after, e.key_columns) == (Op.DELETE, {"tiny": 2}, None, ("tiny",))
    assert all(e.position == POS for e in events)


@pytest.mark.parametrize("flavour", ["tiflow", "ticdc"])
def test_codec_test_vectors_gated(vectors, flavour):
    """With gated=True every message of the vectors still decodes: all carry source.commit_ts."""
    gated = get_decoder("debezium", gated=True)
    for k, v in _pairs(vectors / "debezium" / f"{flavour}_codec_test_expected.jsonl"):
        (e,) = gated.decode(msg(orjson.dumps(k["message"]), orjson.dumps(v["message"])))
        assert (e.ts if isinstance(e, Resolved) else e.commit_ts) in (1, 3)


def _codec_test_events(flavour: str) -> list[tuple[object, dict]]:
    tiny = (Column("tiny", "tinyint", nullable=flavour == "tiflow", key=True, unique=True),)
    ids = [Column("id", "int", nullable=False, key=True, unique=True)]
    # tiflow's test passes the two table infos of the RENAME swapped; ticdc's is the right way round
    ren_table, old = ("table1", ("test", "table2")) if flavour == "tiflow" else ("table2", ("test", "table1"))
    ddl_opts = dict(table_columns=ids, default_charset="" if flavour == "tiflow" else "utf8mb4",
                    field_types={"id": "int(0)" if flavour == "tiflow" else "int(10)"})  # 'length' differs
    create_q = ("CREATE TABLE test.table1" if flavour == "tiflow"
                else "CREATE TABLE test.table1(id int(10) primary key)")
    return [
        (DDL("test", ren_table, 1, "RENAME TABLE test.table1 to test.table2", POS, 14),
         dict(old_table=old, **ddl_opts)),
        (DDL("test", "table1", 1, create_q, POS, 3), dict(disable_schema=True, **ddl_opts)),
        (DDL("test", "table2", 1, "DROP TABLE test.table2", POS, 4), dict(disable_schema=True)),
        (Resolved(3, POS), dict(enable_tidb_extension=True)),
        (RowChange("test", "table1", 1, Op.INSERT, None, {"tiny": 1}, tiny, POS),
         dict(disable_schema=True, output_old_value=False)),
        (RowChange("test", "table1", 1, Op.INSERT, None, {"tiny": 1}, tiny, POS), dict(output_old_value=False)),
        (RowChange("test", "table1", 1, Op.UPDATE, {"tiny": 2}, {"tiny": 1}, tiny, POS), dict(disable_schema=True)),
        (RowChange("test", "table1", 1, Op.UPDATE, {"tiny": 2}, {"tiny": 1}, tiny, POS), dict()),
        (RowChange("test", "table1", 1, Op.UPDATE, {"tiny": 2}, {"tiny": 1}, tiny, POS),
         dict(disable_schema=True, output_old_value=False)),
        (RowChange("test", "table1", 1, Op.DELETE, {"tiny": 2}, None, tiny, POS),
         dict(disable_schema=True, output_old_value=False)),
        (RowChange("test", "table1", 1, Op.DELETE, {"tiny": 2}, None, tiny, POS), dict(output_old_value=False)),
    ]


@pytest.mark.parametrize("flavour", ["tiflow", "ticdc"])
def test_encoder_matches_codec_test_vectors(vectors, flavour):
    """Field by field (as JSON objects) against both TiCDC versions' golden key and value of every case."""
    pairs = _pairs(vectors / "debezium" / f"{flavour}_codec_test_expected.jsonl")
    for (event, opts), (k, v) in zip(_codec_test_events(flavour), pairs):
        key, value = DE.encode_debezium(event, cluster_id="test_cluster", ts_ms=NOW, **opts)
        assert orjson.loads(key) == k["message"], (flavour, k["source"])
        assert orjson.loads(value) == v["message"], (flavour, v["source"])


def test_docs_example(vectors, dec):
    doc = json.loads((vectors / "debezium" / "docs_example_dml.json").read_text())
    # the documented payload on its own (a bare payload) ...
    (e,) = dec.decode(msg(None, orjson.dumps(doc["payload"])))
    assert (e.schema, e.table, e.commit_ts, e.op, e.after) == ("test", "t2", 447507027004751877, Op.INSERT,
                                                               {"a": 4, "b": 2})
    assert e.key_columns == ()
    # ... and in the envelope with the documented (partial) schema and a key
    (e2,) = dec.decode(jmsg({"payload": {"a": 4}}, {"payload": doc["payload"], "schema": doc["schema_partial"]}))
    assert e2.after == {"a": 4, "b": 2} and e2.key_columns == ("a",)
    assert e2.columns == (Column("a", "int", nullable=False, key=True, unique=True), Column("b", "int"))


# ---------------------------------------------------------------------------------------------------------
# Decoder details
# ---------------------------------------------------------------------------------------------------------


def _row_value(op="c", before=None, after=None, fields=None, source=None, *, schema=True, **extra):
    payload = {"source": source if source is not None else {"db": "d", "table": "t", "commit_ts": 5},
               "ts_ms": 1, "transaction": None, "op": op, "before": before, "after": after, **extra}
    out = {"payload": payload}
    if schema:
        fields = fields if fields is not None else [{"type": "int32", "optional": False, "field": "id"}]
        out["schema"] = {"type": "struct", "name": "x.Envelope", "fields": [
            {"type": "struct", "optional": True, "field": "before", "fields": fields},
            {"type": "struct", "optional": True, "field": "after", "fields": fields},
            {"type": "string", "optional": False, "field": "op"}]}
    return out


KEY = {"payload": {"id": 1}}


def test_ops_and_commit_ts(dec):
    (e,) = dec.decode(jmsg(KEY, _row_value("r", after={"id": 1})))
    assert e.op is Op.INSERT and e.after == {"id": 1} and e.commit_ts == 5  # snapshot read = insert
    (e,) = dec.decode(jmsg(KEY, _row_value("u", before={"id": 1}, after={"id": 2})))
    assert (e.op, e.before, e.after) == (Op.UPDATE, {"id": 1}, {"id": 2})
    (e,) = dec.decode(jmsg(KEY, _row_value("d", before={"id": 1})))
    assert (e.op, e.before, e.after) == (Op.DELETE, {"id": 1}, None)
    no_ts = _row_value("c", after={"id": 1}, source={"db": "d", "table": "t"})
    (e,) = dec.decode(jmsg(KEY, no_ts))
    assert e.commit_ts == 0  # source.commit_ts absent (real Debezium): 0
    with pytest.raises(DecodeError, match="cannot be gated") as ei:
        get_decoder("debezium", gated=True).decode(jmsg(KEY, no_ts))
    assert WHERE in str(ei.value)
    big = _row_value("c", after={"id": 1}, source={"db": "d", "table": "t", "commit_ts": 2**64 - 1})
    assert dec.decode(jmsg(KEY, big))[0].commit_ts == 2**64 - 1
    # a watermark needs no key and carries the ts in source.commit_ts
    wm = {"payload": {"source": {"db": "", "table": "", "commit_ts": 77}, "op": "m", "ts_ms": 1,
                      "transaction": None}}
    assert dec.decode(jmsg({"payload": {}}, wm)) == [Resolved(77, POS)]
    assert dec.decode(jmsg(None, wm)) == [Resolved(77, POS)]


def test_tombstone_is_no_change(dec):
    assert dec.decode(msg(orjson.dumps(KEY), None)) == []
    assert dec.decode(msg(orjson.dumps({"id": 1}), b"")) == []
    with pytest.raises(DecodeError, match="empty message"):
        dec.decode(msg(None, None))


def test_time_zone_and_offsets():
    fields = [{"type": "int32", "optional": False, "field": "id"},
              {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "version": 1,
               "field": "ts"}]
    v = _row_value("c", after={"id": 1, "ts": "2023-11-30T12:34:56.5Z"}, fields=fields)
    (e,) = get_decoder("debezium", time_zone="Asia/Shanghai").decode(jmsg(KEY, v))
    assert e.after["ts"] == dt.datetime(2023, 11, 30, 20, 34, 56, 500000)
    (e,) = get_decoder("debezium").decode(jmsg(KEY, v))
    assert e.after["ts"] == dt.datetime(2023, 11, 30, 12, 34, 56, 500000)
    v = _row_value("c", after={"id": 1, "ts": "2023-11-30T14:34:56.123456789+02:00"}, fields=fields)
    (e,) = get_decoder("debezium").decode(jmsg(KEY, v))
    assert e.after["ts"] == dt.datetime(2023, 11, 30, 12, 34, 56, 123456)
    # the encoder takes naive datetimes in its time zone and writes UTC
    col = (Column("id", "int", nullable=False, key=True), Column("ts", "timestamp"))
    ev = RowChange("d", "t", 5, Op.INSERT, None, {"id": 1, "ts": dt.datetime(2023, 11, 30, 20, 34, 56)}, col, POS)
    _, value = DE.encode_debezium(ev, time_zone="Asia/Shanghai", field_types={"ts": "timestamp"})
    assert orjson.loads(value)["payload"]["after"]["ts"] == "2023-11-30T12:34:56Z"
    _, value = DE.encode_debezium(ev, field_types={"ts": "timestamp"})
    assert orjson.loads(value)["payload"]["after"]["ts"] == "2023-11-30T20:34:56Z"


def test_other_logical_types(dec):
    """Logical types real Debezium uses in other modes (precise decimals, connect/nano time precision)."""
    fields = [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
         "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "dec"},
        {"type": "struct", "optional": True, "name": "io.debezium.data.VariableScaleDecimal", "field": "vdec"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.NanoTimestamp", "field": "nts"},
        {"type": "int32", "optional": True, "name": "io.debezium.time.Time", "field": "tm"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.NanoTime", "field": "ntm"},
        {"type": "int32", "optional": True, "name": "org.apache.kafka.connect.data.Date", "field": "cd"},
        {"type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp", "field": "cts"},
        {"type": "bytes", "optional": True, "field": "raw"},
        {"type": "string", "optional": True, "name": "io.debezium.data.TiDBVectorFloat32", "field": "vec"},
        {"type": "int8", "optional": True, "field": "i8"},
        {"type": "string", "optional": True, "name": "dbserver1.some.RecordName", "field": "named"},
    ]
    after = {"id": 1, "dec": base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode(),
             "vdec": {"scale": 3, "value": base64.b64encode((1500).to_bytes(2, "big")).decode()},
             "nts": 1_000_000_001_999, "tm": -1500, "ntm": 3_000_000_999, "cd": -1, "cts": 1500,
             "raw": base64.b64encode(b"\x00\xff").decode(), "vec": "[1,2]", "i8": -5, "named": "x"}
    (e,) = dec.decode(jmsg(KEY, _row_value("c", after=after, fields=fields)))
    assert e.after == {"id": 1, "dec": Decimal("-123.45"), "vdec": Decimal("1.500"),
                       "nts": dt.datetime(1970, 1, 1, 0, 16, 40, 1), "tm": dt.timedelta(milliseconds=-1500),
                       "ntm": dt.timedelta(seconds=3), "cd": dt.date(1969, 12, 31),
                       "cts": dt.datetime(1970, 1, 1, 0, 0, 1, 500000), "raw": b"\x00\xff", "vec": "[1,2]",
                       "i8": -5, "named": "x"}
    types = {c.name: c.type_name for c in e.columns}
    assert types["dec"] == types["vdec"] == "decimal" and types["raw"] == "varbinary" and types["i8"] == "tinyint"
    assert types["vec"] == "vector" and types["nts"] == "datetime"


def test_schemaless_messages(dec):
    """debezium-disable-schema=true: values as JSON gives them, booleans (BIT(1)) as 1/0."""
    value = {"payload": {"source": {"db": "d", "table": "t", "commit_ts": 9}, "ts_ms": 1, "transaction": None,
                         "op": "u", "before": {"id": 1, "b": True, "f": 1.5, "s": "x", "n": None},
                         "after": {"id": 1, "b": False, "f": 2.5, "s": "y", "n": 19691}}}
    (e,) = dec.decode(jmsg({"payload": {"id": 1}}, value))
    assert e.before == {"id": 1, "b": 1, "f": 1.5, "s": "x", "n": None}
    assert e.after == {"id": 1, "b": 0, "f": 2.5, "s": "y", "n": 19691}  # a DATE stays a day number
    assert [(c.name, c.type_name, c.key) for c in e.columns] == [
        ("id", "bigint", True), ("b", "bit", False), ("f", "double", False), ("s", "varchar", False),
        ("n", "bigint", False)]
    with pytest.raises(DecodeError, match="schema envelope"):
        get_decoder("debezium", require_tidb_extension=True).decode(jmsg({"payload": {"id": 1}}, value))


def test_unsigned_bigint_and_decimal_from_float():
    fields = [{"tidb_type": "bigint unsigned", "type": "int64", "optional": False, "field": "id"},
              {"tidb_type": "decimal", "type": "double", "optional": True, "field": "d"},
              {"tidb_type": "int unsigned", "type": "int64", "optional": True, "field": "u"}]
    dec = get_decoder("debezium")
    for wire, want in ((-1, 2**64 - 1), (-(2**63), 2**63), (5, 5)):
        (e,) = dec.decode(jmsg({"payload": {"id": wire}}, _row_value("c", after={"id": wire, "d": 1e16, "u": 7},
                                                                     fields=fields)))
        assert e.after == {"id": want, "d": Decimal("10000000000000000"), "u": 7}
    (e,) = dec.decode(jmsg(None, _row_value("c", after={"id": 1, "d": 0.1, "u": None}, fields=fields)))
    assert str(e.after["d"]) == "0.1" and e.after["u"] is None
    (e,) = dec.decode(jmsg(None, _row_value("c", after={"id": 1, "d": 12345, "u": 0}, fields=fields)))
    assert e.after["d"] == Decimal(12345)


def test_encoder_details():
    cols = (Column("id", "bigint", nullable=False, key=True, unique=True, unsigned=True),
            Column("e", "enum"), Column("s", "set"), Column("b", "bit"), Column("d", "date"),
            Column("dt", "datetime"), Column("f", "float"), Column("v", "varbinary", binary=True))
    ft = {"e": "enum('a','b,c')", "s": "set('x','y')", "b": "bit(9)", "dt": "datetime(3)", "f": "float(10,3)"}
    row = {"id": 2**64 - 1, "e": 2, "s": 3, "b": 0x1FF, "d": dt.date(18, 2, 28),
           "dt": dt.datetime(2020, 1, 1, 0, 0, 0, 123999), "f": 1.5, "v": b"\x00"}
    key, value = DE.encode_debezium(RowChange("d", "t-1", 5, Op.INSERT, None, row, cols, POS), field_types=ft,
                                   enable_tidb_extension=True, cluster_id="c 1")
    k, v = orjson.loads(key), orjson.loads(value)
    assert k["payload"] == {"id": -1}
    assert k["schema"]["name"] == "c_1.d.t_1.Key"  # names sanitised like TiCDC's SanitizeName
    after = v["payload"]["after"]
    assert after == {"id": -1, "e": "b,c", "s": "x,y", "b": base64.b64encode(b"\xff\x01").decode(),
                     "d": (dt.date(2018, 2, 28) - dt.date(1970, 1, 1)).days,  # TiCDC's two-digit-year rule
                     "dt": 1577836800123, "f": 1.5, "v": "AA=="}
    fields = {f["field"]: f for f in v["schema"]["fields"][1]["fields"]}
    assert fields["e"]["parameters"] == {"allowed": "a,b\\,c"} and fields["e"]["tidb_type"] == "enum"
    assert fields["b"] == {"tidb_type": "bit", "type": "bytes", "optional": True, "name": "io.debezium.data.Bits",
                           "version": 1, "parameters": {"length": "9"}, "field": "b"}
    assert fields["f"]["type"] == "double"  # FLOAT(M,D) is declared double, as TiCDC does
    assert fields["id"]["tidb_type"] == "bigint unsigned" and fields["dt"]["name"] == "io.debezium.time.Timestamp"
    # old value off, DDL variants, watermark without the extension
    upd = RowChange("d", "t", 5, Op.UPDATE, {"id": 1}, {"id": 2}, cols[:1], POS)
    assert "before" not in orjson.loads(DE.encode_debezium(upd, output_old_value=False)[1])["payload"]
    with pytest.raises(ValueError, match="enable-tidb-extension"):
        DE.encode_debezium(Resolved(1, POS))
    with pytest.raises(ValueError, match="does not send"):
        DE.encode_debezium(DDL("d", "t", 1, "ALTER TABLE t ADD FOREIGN KEY ...", POS, 9))
    _, value = DE.encode_debezium(DDL("d", "t", 1, "TRUNCATE TABLE t", POS, 11))
    assert orjson.loads(value)["payload"]["tableChanges"] == []
    _, value = DE.encode_debezium(DDL("d", "", 1, "CREATE DATABASE d", POS, 1))
    assert orjson.loads(value)["payload"]["tableChanges"] == []
    (e,) = get_decoder("debezium").decode(msg(*DE.encode_debezium(DDL("d", "t", 7, "TRUNCATE TABLE t", POS, 11))))
    assert e == DDL("d", "t", 7, "TRUNCATE TABLE t", POS, None, size=e.size)
    with pytest.raises(ValueError, match="member list"):
        DE.encode_debezium(RowChange("d", "t", 5, Op.INSERT, None, {"id": 1, "e": 1}, cols, POS))


# ---------------------------------------------------------------------------------------------------------
# Encoder -> decoder round trips (with enable-tidb-extension: the lossless configuration)
# ---------------------------------------------------------------------------------------------------------

_DBZ_VALUES = dict(VALUE_STRATEGIES)
_DBZ_VALUES.update({
    # TiCDC shifts years < 100 (two-digit-year rule) and sends zero dates as null: keep to what survives
    ("date", False): st.dates(min_value=dt.date(100, 1, 1)),
    ("datetime", False): st.datetimes(min_value=dt.datetime(100, 1, 1)),
    ("decimal", False): st.decimals(min_value=Decimal("-1e9"), max_value=Decimal("1e9"), places=5,
                                    allow_nan=False, allow_infinity=False),  # <= 14 digits survive float64
    ("enum", False): st.sampled_from(["a", "b", "c", ""]),
    ("set", False): st.sampled_from(["", "a", "a,b", "a,b,c"]),
    ("time", False): st.timedeltas(min_value=TIME_MIN, max_value=TIME_MAX),
})
_TYPES = sorted(_DBZ_VALUES)


@st.composite
def row_changes(draw, op=None):
    specs = draw(st.lists(st.sampled_from(_TYPES), min_size=1, max_size=6))
    cols = (Column("id", "bigint", nullable=False, key=True, unique=True),) + tuple(
        Column(f"c{i}", n, unsigned=u, binary=n in T.BINARY_TYPES) for i, (n, u) in enumerate(specs))

    def image():
        img = {"id": draw(st.integers(-(2**63), 2**63 - 1))}
        for col, spec in zip(cols[1:], specs):
            img[col.name] = draw(st.none() | _DBZ_VALUES[spec])
        return img

    op = op or draw(st.sampled_from([Op.INSERT, Op.UPDATE, Op.DELETE]))
    return RowChange(schema=draw(st.sampled_from(["db", "测试库", "a<b>&c"])), table=draw(st.sampled_from(["t", "表1"])),
                     commit_ts=draw(st.integers(0, 2**64 - 1)), op=op,
                     before=image() if op is not Op.INSERT else None,
                     after=image() if op is not Op.DELETE else None, columns=cols, position=POS)




_EXT_DECODER = get_decoder("debezium", require_tidb_extension=True, gated=True)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(row_changes())
def test_round_trip_rows(e):
    key, value = DE.encode_debezium(e, enable_tidb_extension=True)
    (got,) = _EXT_DECODER.decode(msg(key, value))
    assert_same_row(got, e)
    assert got.key_columns == ("id",)


@pytest.mark.parametrize("spec", _TYPES, ids=[f"{n}{' unsigned' if u else ''}" for n, u in _TYPES])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_every_type(spec, data):
    cols = (Column("id", "int", nullable=False, key=True, unique=True),
            Column("c0", spec[0], unsigned=spec[1], binary=spec[0] in T.BINARY_TYPES))
    v = data.draw(_DBZ_VALUES[spec])
    e = RowChange("s", "t", 9, Op.INSERT, None, {"id": 1, "c0": v}, cols, POS)
    (got,) = _EXT_DECODER.decode(msg(*DE.encode_debezium(e, enable_tidb_extension=True)))
    assert_same_row(got, e)


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**63), 2**64 - 1), st.text(max_size=20), st.booleans())
def test_round_trip_schemaless_integers_and_text(i, s, old_value):
    cols = (Column("id", "bigint", nullable=False, key=True, unique=True, unsigned=i >= 2**63),
            Column("s", "varchar"))
    e = RowChange("s", "t", 3, Op.UPDATE, {"id": i, "s": s + "x"}, {"id": i, "s": s}, cols, POS)
    (got,) = get_decoder("debezium").decode(msg(*DE.encode_debezium(e, disable_schema=True,
                                                                    output_old_value=old_value)))
    want_id = i - 2**64 if i >= 2**63 else i  # int64 on the wire, no tidb_type to undo it
    assert got.after == {"id": want_id, "s": s}
    assert got.before == ({"id": want_id, "s": s + "x"} if old_value else None)


# ---------------------------------------------------------------------------------------------------------
# Malformed input: every failure is a DecodeError naming topic/partition/offset
# ---------------------------------------------------------------------------------------------------------

_GOOD_KEY = orjson.dumps(KEY)
_GOOD = _row_value("c", after={"id": 1})


def _bad(mutate) -> bytes:
    v = json.loads(json.dumps(_GOOD))
    mutate(v)
    return orjson.dumps(v)


def _set(path, value):
    def m(v):
        target = v
        for p in path[:-1]:
            target = target[p]
        if value is ...:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return m


_GOOD_BYTES = orjson.dumps(_GOOD)
_MALFORMED = {
    "truncated value": (_GOOD_KEY, _GOOD_BYTES[: len(_GOOD_BYTES) // 2], "not valid JSON"),
    "truncated key": (_GOOD_KEY[:-3], _GOOD_BYTES, "key is not valid JSON"),
    "invalid JSON": (_GOOD_KEY, b'{"payload":', "not valid JSON"),
    "compressed": (_GOOD_KEY, b"\x04\x22\x4d\x18garbage", "not valid JSON"),
    "value not an object": (_GOOD_KEY, b"[1]", "expected an object"),
    "key not an object": (b"5", _GOOD_BYTES, "key is a JSON int"),
    "payload null": (_GOOD_KEY, b'{"payload":null}', "'payload' is null"),
    "schema not an object": (_GOOD_KEY, _bad(_set(["schema"], [1])), "'schema' must be an object"),
    "wrong op": (_GOOD_KEY, _bad(_set(["payload", "op"], "x")), "unknown op 'x'"),
    "op not a string": (_GOOD_KEY, _bad(_set(["payload", "op"], 1)), "unknown op"),
    "truncate op": (_GOOD_KEY, _bad(_set(["payload", "op"], "t")), "unknown op 't'"),
    "neither op nor ddl": (_GOOD_KEY, _bad(_set(["payload", "op"], ...)), "neither 'op'"),
    "no source": (_GOOD_KEY, _bad(_set(["payload", "source"], ...)), "'source'"),
    "no table": (_GOOD_KEY, _bad(_set(["payload", "source", "table"], ...)), "source.table"),
    "string commit_ts": (_GOOD_KEY, _bad(_set(["payload", "source", "commit_ts"], "5")), "commit_ts"),
    "negative commit_ts": (_GOOD_KEY, _bad(_set(["payload", "source", "commit_ts"], -1)), "commit_ts"),
    "commit_ts beyond 64 bits": (_GOOD_KEY, _GOOD_BYTES.replace(b'"commit_ts":5', b'"commit_ts":18446744073709551616'),
                                 "commit_ts"),
    "insert without after": (_GOOD_KEY, _bad(_set(["payload", "after"], None)), "without an 'after'"),
    "insert with before": (_GOOD_KEY, _bad(_set(["payload", "before"], {"id": 1})), "with a 'before'"),
    "delete without before": (_GOOD_KEY, _bad(_set(["payload", "op"], "d")), "without a 'before'"),
    "update without after": (_GOOD_KEY, _bad(lambda v: v["payload"].update(op="u", after=None, before={"id": 1})),
                             "without an 'after'"),
    "after not an object": (_GOOD_KEY, _bad(_set(["payload", "after"], [1])), "expected an object or null"),
    "empty after": (_GOOD_KEY, _bad(_set(["payload", "after"], {})), "no columns"),
    "column missing from schema": (_GOOD_KEY, _bad(_set(["payload", "after"], {"id": 1, "extra": 2})),
                                   "column 'extra' is not in the schema envelope"),
    "key column not in row": (orjson.dumps({"payload": {"nope": 1}}), _GOOD_BYTES, "key column 'nope'"),
    "string for int32": (_GOOD_KEY, _bad(_set(["payload", "after"], {"id": "1"})), "column 'id'"),
    "bool for int32": (_GOOD_KEY, _bad(_set(["payload", "after"], {"id": True})), "expected an integer"),
    "unknown connect type": (_GOOD_KEY, _bad(lambda v: [s.update(fields=[{"type": "uuid", "field": "id"}])
                                                         for s in v["schema"]["fields"][:2]]),
                             "unsupported Connect type 'uuid'"),
    "unknown logical type": (_GOOD_KEY, _bad(lambda v: [s.update(fields=[{"type": "bytes", "field": "id",
                                                                          "name": "io.debezium.data.geometry.Point"}])
                                                         for s in v["schema"]["fields"][:2]]),
                             "unsupported logical type"),
    "logical type on wrong connect type": (
        _GOOD_KEY, _bad(lambda v: [s.update(fields=[{"type": "string", "field": "id", "name": "io.debezium.time.Date"}])
                                   for s in v["schema"]["fields"][:2]]), "io.debezium.time.Date"),
    "unknown tidb_type": (_GOOD_KEY, _bad(lambda v: [s.update(fields=[{"type": "int32", "field": "id",
                                                                       "tidb_type": "superint"}])
                                                      for s in v["schema"]["fields"][:2]]), "unknown tidb_type"),
    "schema without row struct": (_GOOD_KEY, _bad(lambda v: v["schema"].update(fields=[])), "no 'before'/'after'"),
    "schema fields not a list": (_GOOD_KEY, _bad(lambda v: v["schema"].update(fields=5)), "'fields'"),
    "duplicate schema field": (_GOOD_KEY, _bad(lambda v: [s["fields"].append(dict(s["fields"][0]))
                                                           for s in v["schema"]["fields"][:2]]), "twice"),
    "bad base64 bits": (_GOOD_KEY, _bad(lambda v: ([s.update(fields=[
        {"type": "bytes", "field": "id", "name": "io.debezium.data.Bits"}]) for s in v["schema"]["fields"][:2]],
        v["payload"].update(after={"id": "!!"}))), "base64"),
    "bad zoned timestamp": (_GOOD_KEY, _bad(lambda v: ([s.update(fields=[
        {"type": "string", "field": "id", "name": "io.debezium.time.ZonedTimestamp"}])
        for s in v["schema"]["fields"][:2]], v["payload"].update(after={"id": "2023-11-30 12:00:00"}))), "ISO-8601"),
    "date out of range": (_GOOD_KEY, _bad(lambda v: ([s.update(fields=[
        {"type": "int32", "field": "id", "name": "io.debezium.time.Date"}]) for s in v["schema"]["fields"][:2]],
        v["payload"].update(after={"id": 10**9}))), "column 'id'"),
    "watermark without commit_ts": (None, b'{"payload":{"op":"m","source":{}}}', "commit_ts"),
    "ddl not a string": (None, b'{"payload":{"ddl":5,"source":{"db":"d"}}}', "'ddl' string"),
    "tableChanges not a list": (None, b'{"payload":{"ddl":"x","source":{"db":"d"},"tableChanges":{}}}',
                                "'tableChanges'"),
    "empty message": (None, None, "empty message"),
    "tombstone with bad key": (b"{", None, "key is not valid JSON"),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_malformed_input_raises_decode_error(case, dec):
    key, value, reason = _MALFORMED[case]
    with pytest.raises(DecodeError) as ei:
        dec.decode(msg(key, value))
    err = ei.value
    assert err.position == POS and err.protocol == "debezium"
    assert WHERE in str(err)
    assert reason in err.reason, err.reason


def test_good_message_used_by_malformed_cases_is_good(dec):
    (e,) = dec.decode(msg(_GOOD_KEY, _GOOD_BYTES))
    assert e.after == {"id": 1} and e.key_columns == ("id",)
    (e2,) = dec.decode(msg(bytearray(_GOOD_KEY), bytearray(_GOOD_BYTES)))  # Spark hands over bytearrays
    assert e2.after == e.after


# ---------------------------------------------------------------------------------------------------------
# Fuzzing: nothing but DecodeError ever escapes
# ---------------------------------------------------------------------------------------------------------

_FUZZ_DECODERS = [get_decoder("debezium"), get_decoder("debezium", gated=True, time_zone="Asia/Shanghai"),
                  get_decoder("debezium", require_tidb_extension=True)]


def _only_decode_errors(key, value):
    for d in _FUZZ_DECODERS:
        try:
            events = d.decode(msg(key, value))
        except DecodeError as e:
            assert e.position == POS and e.protocol == "debezium"
        else:
            assert isinstance(events, list)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.none(), st.binary(max_size=60)), st.one_of(st.none(), st.binary(max_size=120)))
def test_fuzz_random_bytes(key, value):
    _only_decode_errors(key, value)


def _seeds() -> list[tuple[bytes, bytes]]:
    ev = _datatype_event()
    upd = RowChange("s", "t", 6, Op.UPDATE, dict(DATATYPE_STORED, col_varchar="old"), dict(DATATYPE_STORED),
                    ev.columns, POS)
    dele = RowChange("s", "t", 7, Op.DELETE, dict(DATATYPE_STORED), None, ev.columns, POS)
    out = [DE.encode_debezium(e, field_types=DATATYPE_FT, enable_tidb_extension=x, disable_schema=s)
           for e in (ev, upd, dele) for x in (False, True) for s in (False, True)]
    out.append(DE.encode_debezium(DDL("s", "t", 8, "CREATE TABLE t (id int)", POS, 3), table_columns=ev.columns[:3]))
    out.append(DE.encode_debezium(Resolved(9, POS), enable_tidb_extension=True))
    return out


_SEEDS = _seeds()


@st.composite
def mutated(draw):
    key, value = draw(st.sampled_from(_SEEDS))
    out = []
    for part in (key, value):
        buf = mutate_bytes(draw, part, steps=(0, 3), special=b'{}[]":,-0123456789tfn\\\x00\xff')
        out.append(bytes(buf))
    return out[0], out[1]


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutated_valid_messages(kv):
    _only_decode_errors(*kv)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@st.composite
def mutated_json(draw):
    key, value = draw(st.sampled_from(_SEEDS))
    m = orjson.loads(value)
    for _ in range(draw(st.integers(1, 3))):
        target = m
        for step in draw(st.lists(st.integers(0, 60), max_size=5)):  # walk down into a random container
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
    return key, json.dumps(m).encode()  # big ints, NaN, Infinity: all fair game


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_json())
def test_fuzz_structured_json(kv):
    _only_decode_errors(*kv)


def test_decoder_pickles_with_its_options(vectors):
    import pickle

    d = get_decoder("debezium", gated=True, time_zone="Asia/Shanghai", require_tidb_extension=False)
    key = (vectors / "debezium" / "datatype.dbz.key.json").read_bytes()
    value = (vectors / "debezium" / "datatype.dbz.json").read_bytes()
    before = d.decode(msg(key, value.replace(b'"db": "test"', b'"db": "test", "commit_ts": 1')))
    d2 = pickle.loads(pickle.dumps(d))  # after use: the cache of converters is not shipped
    assert (d2.gated, d2.time_zone, d2.require_tidb_extension) == (True, "Asia/Shanghai", False)
    assert d2.decode(msg(key, value.replace(b'"db": "test"', b'"db": "test", "commit_ts": 1'))) == before
    assert before[0].after["col_ts"] == dt.datetime(2023, 11, 30, 20, 34, 56)


def test_bare_key_with_a_column_called_payload(dec):
    fields = [{"type": "int32", "optional": False, "field": "payload"}]
    (e,) = dec.decode(jmsg({"payload": 5}, _row_value("c", after={"payload": 5}, fields=fields)))
    assert e.key_columns == ("payload",) and e.after == {"payload": 5}
    (e,) = dec.decode(jmsg({"payload": {"payload": 5}}, _row_value("c", after={"payload": 5}, fields=fields)))
    assert e.key_columns == ("payload",)
