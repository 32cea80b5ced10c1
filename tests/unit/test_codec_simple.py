"""TiCDC Simple protocol codec (JSON and Avro): documented examples, round trips, held rows, malformed input,
fuzzing."""

from __future__ import annotations

import dataclasses

import base64
import datetime as dt
import io
import json
import random
import re
from decimal import Decimal
from pathlib import Path

import fastavro
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.codecs import Decoder, get_decoder
from applier.codecs import simple as S
from applier.devtools.encoders import simple as SE
from applier.events import DDL, Column, DecodeError, KafkaMessage, Op, Resolved, RowChange, SourcePosition, TableSchema
from tests.unit.edge_rows import edge_col, edge_table
from tests.unit.helpers import VALUE_STRATEGIES, values_equal

FORMATS = ("json", "avro")
TOPIC = "cdc"
BUILD_TS = 1708923662983


def kmsg(value: bytes | None, offset: int = 42, partition: int = 3, topic: str = TOPIC) -> KafkaMessage:
    return KafkaMessage(topic=topic, partition=partition, offset=offset, key=None, value=value)


def jmsg(obj, offset: int = 42, partition: int = 3) -> KafkaMessage:
    return kmsg(orjson.dumps(obj), offset, partition)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


@pytest.fixture
def docs(vectors) -> dict[str, dict]:
    out = {}
    for rec in _lines(vectors / "simple" / "docs_examples.jsonl"):
        out[rec["description"].split(" (")[0]] = rec["message"]
    return out


def test_registry_and_options():
    dec = get_decoder("simple")
    assert isinstance(dec, Decoder)
    assert dec.name == "simple" and dec.gated is True
    assert get_decoder("simple", encoding_format="avro").encoding_format == "avro"
    with pytest.raises(ValueError, match="encoding_format"):
        get_decoder("simple", encoding_format="protobuf")
    with pytest.raises(ValueError, match="max_held_messages_per_table"):
        get_decoder("simple", max_held_messages_per_table=0)
    with pytest.raises(ValueError, match="valid options"):
        get_decoder("simple", encoding="json")


# ---------------------------------------------------------------------------------------------------------
# Documented examples (pingcap/docs ticdc-simple-protocol.md)
# ---------------------------------------------------------------------------------------------------------

def _undeclared(cols: tuple[Column, ...]) -> tuple[Column, ...]:
    """Columns without their declared full type: the test encoder writes its own lengths for the round trips."""
    return tuple(dataclasses.replace(c, declared=None) for c in cols)


USER_COLUMNS = (
    Column("id", "int", nullable=False, key=True, unique=True),
    Column("name", "varchar", declared="varchar(255)"),
    Column("age", "int"),
    Column("score", "float"),
)
OLD_VERSION = 447984074911121426
NEW_VERSION = 447987408682614791


def test_docs_ddl_alter(docs):
    dec = S.SimpleDecoder()
    evs = dec.decode(jmsg(docs["DDL ALTER add column"], offset=7))
    assert evs == [DDL(schema="simple", table="user", commit_ts=447987408682614795,
                       query="ALTER TABLE `user` ADD COLUMN `createTime` TIMESTAMP",
                       position=SourcePosition(TOPIC, 3, 7), ddl_type="ALTER", size=evs[0].size)]
    # both versions are now cached: after (with createTime) and before (the one the docs' DML examples use)
    assert (("simple", "user", NEW_VERSION) in dec._cache) and (("simple", "user", OLD_VERSION) in dec._cache)
    new = dec._cache[("simple", "user", NEW_VERSION)]
    assert new.columns == USER_COLUMNS + (Column("createTime", "timestamp"),)


def test_docs_dml_watermark_bootstrap(docs):
    dec = S.SimpleDecoder()
    dec.decode(jmsg(docs["DDL ALTER add column"], offset=1))

    [ins] = dec.decode(jmsg(docs["DML INSERT"], offset=2))
    assert isinstance(ins, RowChange)
    assert (ins.schema, ins.table, ins.commit_ts, ins.op) == ("simple", "user", 447984084414103554, Op.INSERT)
    assert ins.before is None
    assert ins.after == {"id": 1, "name": "John Doe", "age": 25, "score": 90.5}
    assert ins.columns == USER_COLUMNS and ins.key_columns == ("id",)
    assert ins.position == SourcePosition(TOPIC, 3, 2)

    [upd] = dec.decode(jmsg(docs["DML UPDATE"], offset=3))
    assert (upd.op, upd.commit_ts) == (Op.UPDATE, 447984099186180098)
    assert upd.before == {"id": 1, "name": "John Doe", "age": 25, "score": 90.5}
    assert upd.after == {"id": 1, "name": "John Doe", "age": 25, "score": 95.0}

    [dele] = dec.decode(jmsg(docs["DML DELETE"], offset=4))
    assert (dele.op, dele.commit_ts, dele.after) == (Op.DELETE, 447984114259722243, None)
    assert dele.before == {"id": 1, "name": "John Doe", "age": 25, "score": 95.0}

    assert dec.decode(jmsg(docs["WATERMARK"], offset=5)) == [
        Resolved(ts=447984124732375041, position=SourcePosition(TOPIC, 3, 5))]

    [boot] = dec.decode(jmsg(docs["BOOTSTRAP"], offset=6))
    assert boot == TableSchema(schema="simple", table="new_user", version=OLD_VERSION, columns=USER_COLUMNS,
                               position=SourcePosition(TOPIC, 3, 6))
    assert dec.held_offsets() == {} and dec.held_min_commit_ts() is None


def test_docs_messages_reencode_byte_exact(docs):
    """The encoder writes exactly what the documentation shows (field order, omitted fields, sorted rows)."""
    dec = S.SimpleDecoder()
    ddl_msg = docs["DDL ALTER add column"]
    [ddl] = dec.decode(jmsg(ddl_msg))
    after = dec._cache[("simple", "user", NEW_VERSION)]
    before = dec._cache[("simple", "user", OLD_VERSION)]
    as_ts = lambda e: TableSchema(e.schema, e.table, e.version, e.columns)  # noqa: E731
    _, v = SE.encode_simple(ddl, table_schema=as_ts(after), pre_table_schema=as_ts(before), table_id=148,
                           build_ts_ms=ddl_msg["buildTs"])
    assert v == orjson.dumps(ddl_msg)
    for name in ("DML INSERT", "DML UPDATE", "DML DELETE"):
        m = docs[name]
        [ev] = dec.decode(jmsg(m))
        key, v = SE.encode_simple(ev, schema_version=m["schemaVersion"], table_id=148, build_ts_ms=m["buildTs"])
        assert key is None
        assert v == orjson.dumps(m), name
    wm = docs["WATERMARK"]
    [r] = dec.decode(jmsg(wm))
    assert SE.encode_simple(r, build_ts_ms=wm["buildTs"]) == (None, orjson.dumps(wm))
    boot = docs["BOOTSTRAP"]
    [ts] = dec.decode(jmsg(boot))
    assert SE.encode_simple(ts, table_id=148, build_ts_ms=boot["buildTs"]) == (None, orjson.dumps(boot))
    assert SE.encode_bootstrap(ts, table_id=148, build_ts_ms=boot["buildTs"]) == (None, orjson.dumps(boot))


def test_docs_examples_through_avro(docs):
    """The documented content, re-encoded as Avro, decodes to the same events."""
    jd, ad = S.SimpleDecoder(), S.SimpleDecoder(encoding_format="avro")
    ddl_msg = docs["DDL ALTER add column"]
    [ddl] = jd.decode(jmsg(ddl_msg))
    as_ts = lambda e: TableSchema(e.schema, e.table, e.version, e.columns)  # noqa: E731
    after, before = jd._cache[("simple", "user", NEW_VERSION)], jd._cache[("simple", "user", OLD_VERSION)]
    _, v = SE.encode_simple(ddl, encoding_format="avro", table_schema=as_ts(after),
                           pre_table_schema=as_ts(before), table_id=148)
    [a] = ad.decode(kmsg(v))
    [j] = jd.decode(jmsg(ddl_msg))
    j.size = a.size
    assert a == j
    for name in ("DML INSERT", "DML UPDATE", "DML DELETE", "WATERMARK", "BOOTSTRAP"):
        m = docs[name]
        [ev] = jd.decode(jmsg(m))
        _, v = SE.encode_simple(ev, encoding_format="avro", schema_version=m.get("schemaVersion"), table_id=148)
        [back] = ad.decode(kmsg(v))
        if isinstance(ev, (RowChange, DDL)):
            ev.size = back.size
        assert back == ev, name


# ---------------------------------------------------------------------------------------------------------
# Avro schema files
# ---------------------------------------------------------------------------------------------------------


def test_embedded_avro_schema_is_tiflows(vectors):
    assert S.avro_schema() == json.loads((vectors / "simple" / "message.json").read_text())


def test_legacy_avro_schema_matches_java_example(vectors):
    assert S.legacy_avro_schema() == json.loads((vectors / "simple" / "schema.avsc").read_text())


def _legacy_bytes(payload_name: str, body: dict) -> bytes:
    bio = io.BytesIO()
    fastavro.schemaless_writer(bio, fastavro.parse_schema(S.legacy_avro_schema()),
                               (S.AVRO_MESSAGE, {"payload": (payload_name, body)}))
    return bio.getvalue()


def test_legacy_avro_messages_decode():
    ts = TableSchema("db", "t", 9, (Column("id", "bigint", nullable=False, key=True, unique=True, unsigned=True),
                                    Column("at", "timestamp"), Column("b", "blob", binary=True)))
    _, boot = SE.encode_bootstrap(ts, encoding_format="avro")
    dec = S.SimpleDecoder(encoding_format="avro")
    dec.decode(kmsg(boot))
    wm = _legacy_bytes(S.AVRO_WATERMARK, {"version": 1, "type": "WATERMARK", "commitTs": 77, "buildTs": 1})
    assert wm[0] == 0x12
    assert dec.decode(kmsg(wm)) == [Resolved(77, SourcePosition(TOPIC, 3, 42))]
    row = {"version": 1, "database": "db", "table": "t", "tableID": 1, "type": "INSERT", "commitTs": 78,
           "buildTs": 1, "schemaVersion": 9,
           "data": {"id": ("long", -1), "at": ("string", "2024-01-02 03:04:05.5"), "b": ("bytes", b"\x00\xff")}}
    [ev] = dec.decode(kmsg(_legacy_bytes(S.AVRO_DML, row)))
    assert ev.after == {"id": 2**64 - 1, "at": dt.datetime(2024, 1, 2, 3, 4, 5, 500000), "b": b"\x00\xff"}


# ---------------------------------------------------------------------------------------------------------
# Round trips, every column type
# ---------------------------------------------------------------------------------------------------------

def _assert_rows_equal(cols: tuple[Column, ...], got: dict | None, want: dict | None) -> None:
    assert (got is None) == (want is None)
    if want is None:
        return
    assert set(got) == set(want)
    types = {c.name: c.type_name for c in cols}
    for name, v in want.items():
        assert values_equal(types[name], got[name], v), (name, got[name], v)


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_every_type_at_its_limits(fmt):
    ts, rows = edge_table()
    dec = S.SimpleDecoder(encoding_format=fmt)
    [schema_ev] = dec.decode(kmsg(SE.encode_bootstrap(ts, encoding_format=fmt)[1], offset=0))
    assert _undeclared(schema_ev.columns) == ts.columns and schema_ev.version == ts.version
    pos = SourcePosition(TOPIC, 0, 0)
    for i, row in enumerate(rows):
        for op, before, after in ((Op.INSERT, None, row), (Op.UPDATE, rows[i - 1], row), (Op.DELETE, row, None)):
            ev = RowChange("db", "all_types", 1000 + i, op, before, after, ts.columns, pos)
            _, value = SE.encode_simple(ev, encoding_format=fmt, table_schema=ts)
            [back] = dec.decode(kmsg(value, offset=10 + i))
            assert (back.schema, back.table, back.commit_ts, back.op) == ("db", "all_types", 1000 + i, op)
            assert _undeclared(back.columns) == ts.columns
            _assert_rows_equal(ts.columns, back.before, before)
            _assert_rows_equal(ts.columns, back.after, after)


def test_wire_forms_json():
    """Spot checks of the JSON wire form against TiCDC's encodeValue."""
    ts = TableSchema("db", "t", 1, (
        Column("u", "bigint", unsigned=True, key=True, unique=True, nullable=False),
        edge_col("b", "varbinary"), Column("ts", "timestamp"), Column("f", "float"), Column("d", "decimal"),
        Column("e", "enum"), Column("bit", "bit"), Column("tm", "time")))
    row = {"u": 2**64 - 1, "b": b"\x00\xff", "ts": dt.datetime(2020, 1, 2, 3, 4, 5, 123000), "f": 3.14,
           "d": Decimal("1.10"), "e": 2, "bit": 5, "tm": dt.timedelta(hours=-26)}
    _, v = SE.encode_simple(RowChange("db", "t", 1, Op.INSERT, None, row, ts.columns, SourcePosition("x", 0, 0)),
                           table_schema=ts, time_zone="Asia/Shanghai", build_ts_ms=5)
    data = json.loads(v)["data"]
    assert data == {"u": "18446744073709551615", "b": "AP8=", "bit": "5", "d": "1.10", "e": "2", "f": "3.14",
                    "ts": {"location": "Asia/Shanghai", "value": "2020-01-02 03:04:05.123000"},
                    "tm": "-26:00:00"}
    assert list(data) == sorted(data)


def test_wire_forms_avro():
    ts = TableSchema("db", "t", 1, (Column("u", "bigint", unsigned=True, key=True, unique=True, nullable=False),
                                    Column("ts", "timestamp"), Column("i", "int"), Column("bit", "bit"),
                                    Column("e", "set"), edge_col("bl", "blob"), Column("x", "text")))
    row = {"u": 2**64 - 1, "ts": dt.datetime(2020, 1, 2), "i": -5, "bit": 3, "e": 6, "bl": b"\x00", "x": "y"}
    _, v = SE.encode_simple(RowChange("db", "t", 2**63 + 5, Op.INSERT, None, row, ts.columns,
                                     SourcePosition("x", 0, 0)), encoding_format="avro", table_schema=ts)
    native = fastavro.schemaless_reader(io.BytesIO(v), fastavro.parse_schema(S.avro_schema()), None,
                                        return_record_name=True, return_record_name_override=True)
    body = native[1]["payload"][1]
    assert body["commitTs"] == 5 - 2**63  # uint64 bits in an int64, like TiCDC's int64(commitTs)
    assert body["data"] == {"u": (S.AVRO_UNSIGNED_BIGINT, {"value": -1}),
                            "ts": (S.AVRO_TIMESTAMP, {"location": "UTC", "value": "2020-01-02 00:00:00"}),
                            "i": -5, "bit": "3", "e": 6, "bl": b"\x00", "x": "y"}
    dec = S.SimpleDecoder(encoding_format="avro")
    dec.decode(kmsg(SE.encode_bootstrap(ts, encoding_format="avro")[1]))
    [back] = dec.decode(kmsg(v))
    assert back.commit_ts == 2**63 + 5 and back.after == row


def test_json_decoder_accepts_ticdc_wire_variants():
    """Timestamp as {"location","value"} or a plain string; ints as strings (JSON) or numbers; BIT as text."""
    dec = S.SimpleDecoder()
    ts = TableSchema("db", "t", 3, (Column("id", "int", nullable=False, key=True, unique=True),
                                    Column("at", "timestamp"), Column("bit", "bit")))
    dec.decode(kmsg(SE.encode_bootstrap(ts)[1]))
    base = {"version": 1, "database": "db", "table": "t", "tableID": 1, "type": "INSERT", "commitTs": 10,
            "buildTs": 1, "schemaVersion": 3}
    [a] = dec.decode(jmsg({**base, "data": {"id": "1", "at": {"location": "Local", "value": "2020-02-02 20:20:20"},
                                           "bit": "255"}}))
    [b] = dec.decode(jmsg({**base, "data": {"id": 1, "at": "2020-02-02 20:20:20", "bit": None}}))
    assert a.after == {"id": 1, "at": dt.datetime(2020, 2, 2, 20, 20, 20), "bit": 255}
    assert b.after == {"id": 1, "at": dt.datetime(2020, 2, 2, 20, 20, 20), "bit": None}
    assert [c.name for c in b.columns] == ["id", "at", "bit"]
    # a column the schema has but the message lacks (a virtual generated column) is simply absent
    [c] = dec.decode(jmsg({**base, "data": {"id": "2", "at": None}}))
    assert c.after == {"id": 2, "at": None} and [col.name for col in c.columns] == ["id", "at"]
    # UPDATE whose 'old' lacks columns: TiCDC fills them from 'data'
    [u] = dec.decode(jmsg({**base, "type": "UPDATE", "data": {"id": "2", "at": None, "bit": "1"},
                           "old": {"bit": "0"}}))
    assert u.before == {"id": 2, "at": None, "bit": 0} and u.after == {"id": 2, "at": None, "bit": 1}
    # a handle-key-only DELETE is complete
    [d] = dec.decode(jmsg({**base, "type": "DELETE", "handleKeyOnly": True, "old": {"id": "2"}}))
    assert d.before == {"id": 2} and d.key_columns == ("id",)


SCHEMA_COLUMN = {"name": "a", "dataType": {"mysqlType": "int", "charset": "binary", "collate": "binary",
                                           "length": 11}, "nullable": False, "default": None}


def _schema_json(columns: list[dict], indexes: list[dict], table: str = "t", version: int = 1) -> dict:
    return {"schema": "db", "table": table, "tableID": 7, "version": version, "columns": columns,
            "indexes": indexes}


def _colj(name: str, mysql_type: str, nullable: bool = True, charset: str = "binary", **extra) -> dict:
    return {"name": name, "dataType": {"mysqlType": mysql_type, "charset": charset, "collate": "binary",
                                       "length": 0, **extra}, "nullable": nullable, "default": None}


def test_column_metadata_from_schema():
    cols = [_colj("a", "int", False), _colj("b", "int", False), _colj("c", "varchar", False, "utf8mb4"),
            _colj("d", "bigint", unsigned=True), _colj("e", "char", charset="binary"),
            _colj("f", "varchar", charset="utf8mb4"), _colj("g", "longblob"), _colj("h", "year")]
    idx = [{"name": "uk_nullable", "unique": True, "primary": False, "nullable": True, "columns": ["d"]},
           {"name": "uk_ab", "unique": True, "primary": False, "nullable": False, "columns": ["a", "b"]},
           {"name": "uk_c", "unique": True, "primary": False, "nullable": False, "columns": ["c"]},
           {"name": "plain", "unique": False, "primary": False, "nullable": True, "columns": ["f"]}]
    dec = S.SimpleDecoder()
    [ts] = dec.decode(jmsg({"version": 1, "type": "BOOTSTRAP", "commitTs": 0, "buildTs": 1,
                            "tableSchema": _schema_json(cols, idx)}))
    by = {c.name: c for c in ts.columns}
    # no primary key: the handle is the not-null unique index with the fewest columns (uk_c)
    assert [c.name for c in ts.columns if c.key] == ["c"]
    assert {n for n, c in by.items() if c.unique} == {"a", "b", "c", "d"}
    assert by["d"].unsigned and by["d"].type_name == "bigint"
    assert by["e"].binary and by["e"].type_name == "binary"  # char with the binary charset
    assert not by["f"].binary and by["g"].binary and by["g"].type_name == "longblob"
    assert not by["a"].nullable and by["h"].nullable
    # with a primary key, the key is exactly the primary index
    idx.append({"name": "primary", "unique": True, "primary": True, "nullable": False, "columns": ["b", "a"]})
    [ts2] = dec.decode(jmsg({"version": 1, "type": "BOOTSTRAP", "commitTs": 0, "buildTs": 1,
                             "tableSchema": _schema_json(cols, idx, version=2)}))
    assert [c.name for c in ts2.columns if c.key] == ["a", "b"]


hyp_types = sorted(VALUE_STRATEGIES)


@st.composite
def table_and_rows(draw):
    picked = draw(st.lists(st.sampled_from(hyp_types), min_size=1, max_size=6))
    cols = [Column("pk", "int", nullable=False, key=True, unique=True)]
    strategies = {"pk": st.integers(-(2**31), 2**31 - 1)}
    for i, (type_name, unsigned) in enumerate(picked):
        c = edge_col(f"c{i}", type_name, unsigned)
        cols.append(c)
        strategies[c.name] = st.none() | VALUE_STRATEGIES[(type_name, unsigned)]
    ts = TableSchema("db", draw(st.sampled_from(["t", "表1", "a`b"])), draw(st.integers(1, 2**64 - 1)), tuple(cols))
    row_st = st.fixed_dictionaries(strategies)
    return ts, draw(row_st), draw(row_st), draw(st.sampled_from(list(Op))), draw(st.integers(0, 2**64 - 1))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table_and_rows(), st.sampled_from(FORMATS))
def test_round_trip_random_rows(case, fmt):
    ts, before, after, op, commit_ts = case
    ev = RowChange("db", ts.table, commit_ts, op, None if op is Op.INSERT else before,
                   None if op is Op.DELETE else after, ts.columns, SourcePosition(TOPIC, 0, 0))
    dec = S.SimpleDecoder(encoding_format=fmt)
    dec.decode(kmsg(SE.encode_bootstrap(ts, encoding_format=fmt)[1]))
    [back] = dec.decode(kmsg(SE.encode_simple(ev, encoding_format=fmt, table_schema=ts)[1]))
    assert (back.op, back.commit_ts, back.table) == (op, commit_ts, ts.table)
    _assert_rows_equal(ts.columns, back.before, ev.before)
    _assert_rows_equal(ts.columns, back.after, ev.after)


@pytest.mark.parametrize("fmt", FORMATS)
def test_ddl_round_trip_and_types(fmt):
    dec = S.SimpleDecoder(encoding_format=fmt)
    after = TableSchema("db", "t2", 20, (Column("id", "int", nullable=False, key=True, unique=True),))
    before = TableSchema("db", "t1", 10, after.columns)
    for ddl_type, expected in ((14, "RENAME"), ("RENAME", "RENAME"), (3, "CREATE"), (4, "ERASE"), (11, "TRUNCATE"),
                               (7, "CINDEX"), (8, "DINDEX"), (5, "ALTER"), (61, "ALTER"), (1, "QUERY"),
                               (None, "QUERY")):
        ev = DDL("db", "t2", 99, "RENAME TABLE `db`.`t1` TO `db`.`t2`", SourcePosition(TOPIC, 3, 42),
                 ddl_type=ddl_type)
        [back] = dec.decode(kmsg(SE.encode_simple(ev, encoding_format=fmt, table_schema=after,
                                                 pre_table_schema=before)[1]))
        assert back == DDL("db", "t2", 99, ev.query, ev.position, ddl_type=expected, size=back.size)
    assert {("db", "t1", 10), ("db", "t2", 20)} <= set(dec._cache)
    # schema-level DDL: no table schema at all
    ev = DDL("", "", 100, "DROP DATABASE `db`", SourcePosition(TOPIC, 3, 42), ddl_type="QUERY")
    [back] = dec.decode(kmsg(SE.encode_simple(ev, encoding_format=fmt)[1]))
    assert (back.schema, back.table, back.query, back.ddl_type) == ("", "", "DROP DATABASE `db`", "QUERY")


def test_ddl_with_schema_level_table_schema():
    """ticdc (new architecture) sends a tableSchema with an empty table for database DDL."""
    dec = S.SimpleDecoder()
    [ev] = dec.decode(jmsg({"version": 1, "type": "QUERY", "sql": "CREATE DATABASE `x`", "commitTs": 5,
                            "buildTs": 1, "tableSchema": {"schema": "x", "table": "", "tableID": 0, "version": 0,
                                                          "columns": None, "indexes": None}}))
    assert (ev.schema, ev.table) == ("x", "")
    assert dec._cache == {}


# ---------------------------------------------------------------------------------------------------------
# Starting mid-stream: rows held until their table's schema arrives
# ---------------------------------------------------------------------------------------------------------

T_COLS = (Column("id", "int", nullable=False, key=True, unique=True), Column("v", "varchar"))
T_V1 = TableSchema("db", "t", 100, T_COLS)
T_V2 = TableSchema("db", "t", 200, T_COLS + (Column("w", "int"),))


def _row(ts: TableSchema, commit_ts: int, i: int, op: Op = Op.INSERT) -> RowChange:
    row = {"id": i, "v": f"v{i}"}
    if len(ts.columns) > 2:
        row["w"] = i
    return RowChange(ts.schema, ts.table, commit_ts, op, None, row, ts.columns, SourcePosition("x", 0, 0))


def _enc(ev, fmt: str, ts: TableSchema | None = None) -> bytes:
    return SE.encode_simple(ev, encoding_format=fmt, table_schema=ts)[1]


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_before_bootstrap_are_held_and_released_in_order(fmt):
    dec = S.SimpleDecoder(encoding_format=fmt)
    other = TableSchema("db", "other", 7, T_COLS)
    dec.decode(kmsg(SE.encode_bootstrap(other, encoding_format=fmt)[1], offset=1, partition=0))
    assert dec.held_offsets() == {} and dec.held_min_commit_ts() is None

    # rows of db.t on two partitions, no schema yet: held, nothing returned
    assert dec.decode(kmsg(_enc(_row(T_V1, 50, 1), fmt, T_V1), offset=10, partition=0)) == []
    assert dec.decode(kmsg(_enc(_row(T_V1, 40, 2), fmt, T_V1), offset=5, partition=1)) == []
    # another table with a schema is not held back by the decoder (the gate orders by commit ts)
    [o] = dec.decode(kmsg(_enc(_row(other, 60, 9), fmt, other), offset=11, partition=0))
    assert o.table == "other"
    assert dec.decode(kmsg(_enc(_row(T_V1, 70, 3), fmt, T_V1), offset=12, partition=0)) == []
    assert dec.decode(kmsg(_enc(Resolved(80, SourcePosition("x", 0, 0)), fmt), offset=13, partition=0)) == [
        Resolved(80, SourcePosition(TOPIC, 0, 13))]
    assert dec.held_offsets() == {(TOPIC, 0): 10, (TOPIC, 1): 5}
    assert dec.held_min_commit_ts() == 40
    assert dec.held_count() == 3

    # a bootstrap of another version releases nothing
    assert [type(e) for e in dec.decode(kmsg(SE.encode_bootstrap(T_V2, encoding_format=fmt)[1], offset=14,
                                             partition=0))] == [TableSchema]
    assert dec.held_count() == 3

    evs = dec.decode(kmsg(SE.encode_bootstrap(T_V1, encoding_format=fmt)[1], offset=6, partition=1))
    assert isinstance(evs[0], TableSchema) and evs[0].version == 100
    rows = evs[1:]
    assert [(r.commit_ts, r.after["id"], r.position.partition, r.position.offset) for r in rows] == [
        (50, 1, 0, 10), (40, 2, 1, 5), (70, 3, 0, 12)]
    assert all(_undeclared(r.columns) == T_COLS for r in rows)
    assert dec.held_offsets() == {} and dec.held_min_commit_ts() is None and dec.held_count() == 0
    # from now on rows of that version decode at once
    [r] = dec.decode(kmsg(_enc(_row(T_V1, 90, 4), fmt, T_V1), offset=15, partition=0))
    assert r.after == {"id": 4, "v": "v4"}


@pytest.mark.parametrize("fmt", FORMATS)
def test_ddl_releases_held_rows_around_itself(fmt):
    """Rows of the old version (released by preTableSchema) come before the DDL, rows of the new one after."""
    dec = S.SimpleDecoder(encoding_format=fmt)
    assert dec.decode(kmsg(_enc(_row(T_V2, 310, 1), fmt, T_V2), offset=1, partition=1)) == []
    assert dec.decode(kmsg(_enc(_row(T_V1, 290, 2), fmt, T_V1), offset=1, partition=0)) == []
    assert dec.held_min_commit_ts() == 290
    ddl = DDL("db", "t", 300, "ALTER TABLE t ADD COLUMN w INT", SourcePosition("x", 0, 0), ddl_type="ALTER")
    evs = dec.decode(kmsg(SE.encode_simple(ddl, encoding_format=fmt, table_schema=T_V2, pre_table_schema=T_V1)[1],
                          offset=2, partition=0))
    assert [(type(e).__name__, e.commit_ts) for e in evs] == [("RowChange", 290), ("DDL", 300), ("RowChange", 310)]
    assert _undeclared(evs[0].columns) == T_COLS and evs[2].after == {"id": 1, "v": "v1", "w": 1}
    assert dec.held_offsets() == {}


@pytest.mark.parametrize("fmt", FORMATS)
def test_rename_releases_rows_held_under_the_old_name(fmt):
    dec = S.SimpleDecoder(encoding_format=fmt)
    assert dec.decode(kmsg(_enc(_row(T_V1, 10, 1), fmt, T_V1), offset=3)) == []
    renamed = TableSchema("db", "t_new", 150, T_COLS)
    ddl = DDL("db", "t_new", 20, "RENAME TABLE t TO t_new", SourcePosition("x", 0, 0), ddl_type="RENAME")
    evs = dec.decode(kmsg(SE.encode_simple(ddl, encoding_format=fmt, table_schema=renamed, pre_table_schema=T_V1)[1],
                          offset=4))
    assert [(type(e).__name__, e.table, e.commit_ts) for e in evs] == [("RowChange", "t", 10), ("DDL", "t_new", 20)]


def test_hold_bound_error():
    dec = S.SimpleDecoder(max_held_messages_per_table=3)
    for i in range(3):
        assert dec.decode(kmsg(_enc(_row(T_V1, 10 + i, i), "json", T_V1), offset=100 + i, partition=2)) == []
    # another table has its own budget
    other = TableSchema("db", "u", 1, T_COLS)
    assert dec.decode(kmsg(_enc(_row(other, 5, 1), "json", other), offset=200, partition=2)) == []
    with pytest.raises(DecodeError) as ei:
        dec.decode(kmsg(_enc(_row(T_V1, 20, 9), "json", T_V1), offset=103, partition=2))
    e = ei.value
    assert e.position == SourcePosition(TOPIC, 2, 103) and e.protocol == "simple"
    assert "`db`.`t`" in e.reason
    assert "topic=cdc partition=2 offset=100" in e.reason  # the first held message
    assert "send-bootstrap" in e.reason and "before the table was created" in e.reason
    # what was held is still held and still reported
    assert dec.held_offsets() == {(TOPIC, 2): 100} and dec.held_min_commit_ts() == 5


def test_bad_held_message_is_reported_without_losing_good_events():
    dec = S.SimpleDecoder()
    good1 = _enc(_row(T_V1, 10, 1), "json", T_V1)
    bad = orjson.loads(_enc(_row(T_V1, 11, 2), "json", T_V1))
    bad["data"]["id"] = "not a number"
    good2 = _enc(_row(T_V1, 12, 3), "json", T_V1)
    assert dec.decode(kmsg(good1, offset=1)) == []
    assert dec.decode(kmsg(orjson.dumps(bad), offset=2)) == []
    assert dec.decode(kmsg(good2, offset=3)) == []
    with pytest.raises(DecodeError) as ei:
        dec.decode(kmsg(SE.encode_bootstrap(T_V1)[1], offset=4))
    e = ei.value
    assert e.position == SourcePosition(TOPIC, 3, 2)  # names the held message
    assert e.held_message.offset == 2 and "'id'" in e.reason and "offset=4" in e.reason
    # the schema event and the good row stay with the decoder (and hold the offsets) until the next call
    assert dec.held_offsets() == {(TOPIC, 3): 1} and dec.held_min_commit_ts() == 10
    evs = dec.decode(kmsg(_enc(Resolved(50, SourcePosition("x", 0, 0)), "json"), offset=5))
    assert dec.held_offsets() == {} and dec.held_min_commit_ts() is None
    assert [(type(x).__name__, getattr(x, "commit_ts", None)) for x in evs] == [
        ("TableSchema", None), ("RowChange", 10), ("Resolved", None), ("RowChange", 12)]
    assert dec.held_offsets() == {} and dec.held_min_commit_ts() is None


# ---------------------------------------------------------------------------------------------------------
# Malformed input: DecodeError naming topic/partition/offset
# ---------------------------------------------------------------------------------------------------------

_DML = {"version": 1, "database": "db", "table": "t", "tableID": 1, "type": "INSERT", "commitTs": 10, "buildTs": 1,
        "schemaVersion": 100, "data": {"id": "1", "v": "x"}}


def _with(obj: dict, **kw) -> dict:
    out = dict(obj)
    for k, v in kw.items():
        if v is ...:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def _BAD_SCHEMA(ts) -> dict:  # noqa: N802 - reads like a constant in the tables below
    return {"version": 1, "type": "BOOTSTRAP", "commitTs": 0, "buildTs": 1, "tableSchema": ts}

MALFORMED_JSON = [
    (None, "empty value"),
    (b"", "empty value"),
    (b"{not json", "not valid JSON"),
    (b"\x16\x06\x06", "looks like Avro"),
    (b"\x1f\x8b\x08\x00", "compressed"),
    (b"[1, 2]", "JSON list, expected an object"),
    (orjson.dumps(_with(_DML, version=...)), "version"),
    (orjson.dumps(_with(_DML, version=2)), "unsupported simple protocol version 2"),
    (orjson.dumps(_with(_DML, version=True)), "version"),
    (orjson.dumps(_with(_DML, type=...)), "'type' must be a string"),
    (orjson.dumps(_with(_DML, type="UPSERT")), "unknown message type 'UPSERT'"),
    (orjson.dumps(_with(_DML, type="DROP")), "unknown message type 'DROP'"),
    (orjson.dumps(_with(_DML, commitTs=-1)), "commitTs"),
    (orjson.dumps(_with(_DML, commitTs="10")), "commitTs"),
    (orjson.dumps(_with(_DML, database=...)), "'database' and 'table'"),
    (orjson.dumps(_with(_DML, table=5)), "'database' and 'table'"),
    (orjson.dumps(_with(_DML, schemaVersion="x")), "schemaVersion"),
    (orjson.dumps(_with(_DML, data=...)), "INSERT message has no 'data'"),
    (orjson.dumps(_with(_DML, data=[1])), "'data' is a list"),
    (orjson.dumps(_with(_DML, type="DELETE", data=...)), "DELETE message has no 'old'"),
    (orjson.dumps(_with(_DML, type="DELETE", old="x")), "'old' is a str"),
    (orjson.dumps(_with(_DML, type="UPDATE", data=...)), "UPDATE message has no 'data'"),
    (orjson.dumps(_with(_DML, claimCheckLocation="s3://b/f")), "claim-check"),
    (orjson.dumps(_with(_DML, handleKeyOnly=True)), "handle-key-only"),
    (orjson.dumps(_with(_DML, handleKeyOnly="yes")), "handleKeyOnly"),
    (orjson.dumps(_with(_DML, checksum={"version": 1, "corrupted": True, "current": 1, "previous": 0})),
     "corrupted"),
    (orjson.dumps(_with(_DML, data={"id": "1", "nope": "x"})), "column 'nope' is not in the schema"),
    (orjson.dumps(_with(_DML, data={"id": "abc"})), "column 'id' \\(int\\): cannot decode"),
    (orjson.dumps(_with(_DML, data={"id": "2147483648"})), "out of range for int"),
    (orjson.dumps(_with(_DML, data={"id": " 1"})), "column 'id'"),
    (orjson.dumps(_with(_DML, data={"id": 1.5})), "column 'id'"),
    (orjson.dumps(_with(_DML, data={"id": "1", "v": 5})), "column 'v'"),
    (orjson.dumps({"version": 1, "type": "WATERMARK", "commitTs": "1", "buildTs": 1}), "commitTs"),
    (orjson.dumps({"version": 1, "type": "ALTER", "commitTs": 1, "buildTs": 1}), "has no 'sql'"),
    (orjson.dumps({"version": 1, "type": "ALTER", "sql": "x", "commitTs": 1, "buildTs": 1, "tableSchema": []}),
     "'tableSchema' is a list"),
    (orjson.dumps({"version": 1, "type": "BOOTSTRAP", "commitTs": 0, "buildTs": 1}), "no 'tableSchema'"),
    (orjson.dumps(_BAD_SCHEMA(_schema_json([SCHEMA_COLUMN], [], table=""))), "names no table"),
    (orjson.dumps(_BAD_SCHEMA(_schema_json("x", []))), "'columns' must be list"),
    (orjson.dumps(_BAD_SCHEMA(_schema_json([SCHEMA_COLUMN, SCHEMA_COLUMN], []))), "twice"),
    (orjson.dumps(_BAD_SCHEMA(_schema_json([{"name": "a"}], []))), "no 'dataType'"),
    (orjson.dumps(_BAD_SCHEMA(_schema_json([_colj("a", "hugeint")], []))), "unknown mysqlType 'hugeint'"),
    (orjson.dumps(_BAD_SCHEMA(_schema_json([_colj("a", "int", unsigned="yes")], []))), "'unsigned'"),
    (orjson.dumps(_BAD_SCHEMA(_schema_json([SCHEMA_COLUMN], [
        {"name": "primary", "unique": True, "primary": True, "nullable": False, "columns": ["zz"]}]))),
     "primary index names unknown columns"),
    (orjson.dumps(_BAD_SCHEMA({**_schema_json([SCHEMA_COLUMN], []), "version": -3})), "version"),
]

VALUE_CASES = [  # (mysqlType, extra dataType fields, wire value, reason)
    ("tinyint", {"unsigned": True}, "256", "out of range for tinyint unsigned"),
    ("tinyint", {"unsigned": True}, "-1", "out of range"),
    ("bigint", {"unsigned": True}, "18446744073709551616", "out of range"),
    ("bigint", {}, "9223372036854775808", "out of range"),
    ("int", {}, "1_000", "not a decimal integer"),
    ("int", {}, True, "expected an integer"),
    ("year", {}, "2156", "out of range"),
    ("decimal", {}, "1e5", "not a decimal number"),
    ("decimal", {}, "NaN", "not a decimal number"),
    ("decimal", {}, 1.5, "expected decimal text"),
    ("float", {}, "nan", "not a decimal number"),
    ("double", {}, "1e999", "not a finite number"),
    ("float", {}, "1e39", "out of range for FLOAT"),
    ("date", {}, "2020-02-30", "not a valid date"),
    ("datetime", {}, "2020-01-01T00:00:00", "not a datetime"),
    ("timestamp", {}, {"location": "UTC"}, "cannot decode"),
    ("timestamp", {}, {"location": "UTC", "value": "yesterday"}, "not a datetime"),
    ("time", {}, "25:61:00", "out of range"),
    ("varbinary", {}, "!!notbase64", "invalid base64"),
    ("blob", {}, 5, "expected base64 text or bytes"),
    ("varchar", {"charset": "utf8mb4"}, ["x"], "expected text"),
    ("json", {}, {"a": 1}, "expected text"),
    ("varchar", {}, ["x"], "expected base64 text"),  # varchar with the binary charset is VARBINARY
    ("geometry", {}, "POINT(1 1)", "GEOMETRY is not supported"),
    ("enum", {}, "red", "not a decimal integer"),
    ("bit", {}, "-1", "out of range"),
]


def _dec_with_schema() -> S.SimpleDecoder:
    dec = S.SimpleDecoder()
    dec.decode(kmsg(SE.encode_bootstrap(T_V1)[1], offset=0))
    return dec


def _assert_decode_error(dec, m: KafkaMessage, reason: str) -> DecodeError:
    with pytest.raises(DecodeError) as ei:
        dec.decode(m)
    e = ei.value
    assert type(e) is DecodeError
    assert e.position == SourcePosition(m.topic, m.partition, m.offset)
    assert e.protocol == "simple"
    assert f"topic={m.topic} partition={m.partition} offset={m.offset}" in str(e)
    assert re.search(reason, e.reason), e.reason
    return e


@pytest.mark.parametrize("value, reason", MALFORMED_JSON, ids=[r for _, r in MALFORMED_JSON])
def test_malformed_json(value, reason):
    dec = _dec_with_schema()
    _assert_decode_error(dec, KafkaMessage("orders", 7, 99, None, value), reason)
    # the decoder keeps working afterwards
    [r] = dec.decode(jmsg({"version": 1, "type": "WATERMARK", "commitTs": 5, "buildTs": 1}))
    assert r.ts == 5


@pytest.mark.parametrize("mysql_type, extra, wire, reason", VALUE_CASES,
                         ids=[f"{c[0]}-{c[3]}" for c in VALUE_CASES])
def test_values_that_do_not_convert(mysql_type, extra, wire, reason):
    dec = S.SimpleDecoder()
    cols = [_colj("id", "int", False), _colj("x", mysql_type, **extra)]
    idx = [{"name": "primary", "unique": True, "primary": True, "nullable": False, "columns": ["id"]}]
    dec.decode(jmsg(_BAD_SCHEMA(_schema_json(cols, idx, version=100))))
    m = KafkaMessage("orders", 1, 2, None, orjson.dumps(_with(_DML, data={"id": "1", "x": wire})))
    e = _assert_decode_error(dec, m, reason)
    assert "'x'" in e.reason


def _avro_dml(data: dict | None, **kw) -> bytes:
    body = {"version": 1, "database": "db", "table": "t", "tableID": 1, "type": "INSERT", "commitTs": 10,
            "buildTs": 1, "schemaVersion": 100, "claimCheckLocation": None, "handleKeyOnly": None, "checksum": None,
            "data": data, "old": None}
    body.update(kw)
    return SE._avro_bytes(S.AVRO_DML, "DML", body)


def _avro_malformed() -> list[tuple[bytes | None, str]]:
    good = _avro_dml({"id": ("long", 1), "v": ("string", "x")})
    wm = SE.encode_simple(Resolved(5, SourcePosition("x", 0, 0)), encoding_format="avro")[1]
    bio = io.BytesIO()
    fastavro.schemaless_writer(bio, fastavro.parse_schema(S.avro_schema()),
                               (S._NS + "Watermark", {"version": 1, "commitTs": 1, "buildTs": 1}))
    return [
        (None, "empty value"),
        (b"", "empty value"),
        (orjson.dumps(_DML), "looks like JSON"),
        (b"\x0a\x02", "first byte 0x0a"),
        (good[:-3], "invalid Avro data"),
        (good + b"\x00", "trailing bytes"),
        (wm[:1] + b"\x08" + wm[2:], "invalid Avro data"),  # Message.type enum index 4: out of range
        (bio.getvalue(), "first byte"),  # a bare Watermark record, not a Message
        (SE._avro_bytes(S.AVRO_WATERMARK, "DDL", {"version": 1, "commitTs": 1, "buildTs": 1}), "does not match"),
        (SE._avro_bytes(S.AVRO_WATERMARK, "WATERMARK", {"version": 3, "commitTs": 1, "buildTs": 1}), "version 3"),
        (_avro_dml(None), "INSERT message has no 'data'"),
        (_avro_dml({"id": ("long", 1), "zz": None}), "column 'zz' is not in the schema"),
        (_avro_dml({"id": ("long", 2**40)}), "out of range for int"),
        (_avro_dml({"id": ("bytes", b"\x01")}), "expected an integer, got bytes"),
        (_avro_dml({"id": (S.AVRO_UNSIGNED_BIGINT, {"value": 1})}), "expected an integer, got UnsignedBigint"),
        (_avro_dml({"id": ("long", 1), "v": (S.AVRO_TIMESTAMP, {"location": "", "value": "x"})}), "column 'v'"),
        (_avro_dml({"id": ("long", 1)}, claimCheckLocation="f"), "claim-check"),
        (_avro_dml({"id": ("long", 1)}, handleKeyOnly=True), "handle-key-only"),
        (_avro_dml({"id": ("long", 1)}, checksum={"version": 1, "corrupted": True, "current": 1, "previous": 2}),
         "corrupted"),
    ]


@pytest.mark.parametrize("case", range(len(_avro_malformed())))
def test_malformed_avro(case):
    value, reason = _avro_malformed()[case]
    dec = S.SimpleDecoder(encoding_format="avro")
    dec.decode(kmsg(SE.encode_bootstrap(T_V1, encoding_format="avro")[1], offset=0))
    _assert_decode_error(dec, KafkaMessage("orders", 7, 99, None, value), reason)


# ---------------------------------------------------------------------------------------------------------
# Fuzzing: only DecodeError escapes
# ---------------------------------------------------------------------------------------------------------

FUZZ_TS = TableSchema("db", "t", 100, (
    Column("id", "bigint", nullable=False, key=True, unique=True, unsigned=True), Column("d", "decimal"),
    Column("f", "float"), edge_col("b", "varbinary"), Column("ts", "timestamp"), Column("tm", "time"),
    Column("j", "json"), Column("e", "enum"), Column("dt", "datetime"), Column("y", "year")))
FUZZ_ROW = {"id": 2**64 - 1, "d": Decimal("-12.50"), "f": 1.5, "b": b"\x00\xff", "ts": dt.datetime(2020, 1, 1, 1, 1, 1),
            "tm": dt.timedelta(hours=-30), "j": '{"a":1}', "e": 2, "dt": dt.datetime(2021, 5, 6), "y": 2024}


def _valid_messages(fmt: str) -> list[bytes]:
    pos = SourcePosition("x", 0, 0)
    out = [SE.encode_bootstrap(FUZZ_TS, encoding_format=fmt, table_id=5, build_ts_ms=1)[1]]
    for op, before, after in ((Op.INSERT, None, FUZZ_ROW), (Op.UPDATE, FUZZ_ROW, FUZZ_ROW),
                              (Op.DELETE, FUZZ_ROW, None)):
        out.append(SE.encode_simple(RowChange("db", "t", 7, op, before, after, FUZZ_TS.columns, pos),
                                   encoding_format=fmt, table_schema=FUZZ_TS, build_ts_ms=1))
    out.append(SE.encode_simple(Resolved(9, pos), encoding_format=fmt, build_ts_ms=1))
    out.append(SE.encode_simple(DDL("db", "t", 8, "ALTER TABLE t ADD COLUMN z INT", pos, ddl_type="ALTER"),
                               encoding_format=fmt, table_schema=FUZZ_TS, pre_table_schema=FUZZ_TS, build_ts_ms=1))
    return [v[1] if isinstance(v, tuple) else v for v in out]


VALID = {fmt: _valid_messages(fmt) for fmt in FORMATS}


def _decode_only_decode_error(fmt: str, values: list[bytes | None]) -> None:
    dec = S.SimpleDecoder(encoding_format=fmt, max_held_messages_per_table=4)
    dec.decode(kmsg(VALID[fmt][0], offset=0))  # schema known, so row decoding paths run
    for i, v in enumerate(values):
        try:
            evs = dec.decode(kmsg(v, offset=i + 1))
        except DecodeError as e:
            assert e.position.topic == TOPIC and e.protocol == "simple"
            continue
        assert isinstance(evs, list)
        dec.held_offsets()
        dec.held_min_commit_ts()


def _mutate(data: bytes, rnd: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        kind = rnd.randrange(4)
        if kind == 0 and b:
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        elif kind == 1 and b:
            del b[rnd.randrange(len(b)):]
        elif kind == 2:
            i = rnd.randrange(len(b) + 1)
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 8)))
        elif b:
            i = rnd.randrange(len(b))
            del b[i:i + rnd.randint(1, 8)]
    return bytes(b)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.none(), st.binary(max_size=120)), min_size=1, max_size=3))
def test_fuzz_random_bytes(fmt, values):
    if fmt == "avro":  # also get past the first-byte check into fastavro and the message checks
        values = values + [b"\x16" + v for v in values if v] + [b"\x12" + v for v in values if v]
    _decode_only_decode_error(fmt, values)


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 6), min_size=1, max_size=3))
def test_fuzz_mutated_valid_messages(fmt, seed, which):
    rnd = random.Random(seed)
    values = []
    for w in which:
        base = VALID[fmt][w % len(VALID[fmt])]
        values.append(_mutate(base, rnd) if rnd.random() < 0.9 else base)
    _decode_only_decode_error(fmt, values)


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.floats(allow_nan=False),
                       st.text(max_size=12), st.sampled_from(["1", "-1", "18446744073709551616", "AP8=", "2020-01-01",
                                                              "12:00:00", "1.5", "INSERT", "DDL", "db", "t"]))
_json_value = st.recursive(_json_leaf, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 5), st.data())
def test_fuzz_structurally_mutated_json(which, data):
    """Replace or delete one node anywhere in a valid JSON message (reaches deeper than byte flips)."""
    obj = orjson.loads(VALID["json"][which])
    paths = [p for p in _paths(obj) if p]
    path = data.draw(st.sampled_from(paths))
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if data.draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = data.draw(_json_value)
    try:
        value = orjson.dumps(obj)
    except TypeError:  # integers beyond 64 bits
        value = json.dumps(obj).encode()
    _decode_only_decode_error("json", [value])


def test_every_valid_fuzz_seed_decodes():
    for fmt in FORMATS:
        dec = S.SimpleDecoder(encoding_format=fmt)
        kinds = []
        for i, v in enumerate(VALID[fmt]):
            kinds += [type(e).__name__ for e in dec.decode(kmsg(v, offset=i))]
        assert kinds == ["TableSchema", "RowChange", "RowChange", "RowChange", "Resolved", "DDL"]
        [row] = dec.decode(kmsg(VALID[fmt][1]))
        assert row.after == FUZZ_ROW


def test_base64_is_standard_alphabet_with_padding():
    ts = TableSchema("db", "t", 1, (Column("id", "int", key=True, unique=True, nullable=False), edge_col("b", "blob")))
    row = {"id": 1, "b": b"\xfb\xff\xfe"}
    _, v = SE.encode_simple(RowChange("db", "t", 1, Op.INSERT, None, row, ts.columns, SourcePosition("x", 0, 0)),
                           table_schema=ts)
    assert json.loads(v)["data"]["b"] == base64.b64encode(b"\xfb\xff\xfe").decode() == "+//+"
