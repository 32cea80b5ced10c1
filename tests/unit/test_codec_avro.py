"""TiCDC flat Avro codec (Confluent framing): golden schemas, every type, round trips, malformed input, fuzzing.

Registry: an :class:`InMemoryRegistry` (pure logic, same semantics as the Confluent API). The real registry
(Apicurio, started by applier.devtools.services) is exercised in tests/e2e/test_registry_service.py.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import struct
from decimal import Decimal
from functools import partial
from pathlib import Path

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.codecs import Decoder, get_decoder, protocols
from applier.codecs import avro as A
from applier.codecs.registry import RegistryClient, RegistryError, RegistryUnavailable
from applier.devtools.encoders import avro as AE
from applier.devtools.encoders.registry import InMemoryRegistry
from applier.events import DDL, Column, DecodeError, Op, Resolved, RowChange, SourcePosition
from tests.unit.helpers import VALUE_STRATEGIES, kafka_msg, values_equal

POS = SourcePosition("shop_orders", 2, 77)
WHERE = "topic=shop_orders partition=2 offset=77"
TS = 425_123_456_789_012_345


msg = partial(kafka_msg, topic="shop_orders", partition=2, offset=77)


def frame(schema_id: int, payload: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + payload


def avro_bytes(schema: dict, record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return buf.getvalue()


def raw_datum(schema: dict, payload: bytes) -> dict:
    return fastavro.schemaless_reader(io.BytesIO(payload), fastavro.parse_schema(schema), None)


ORDERS_COLS = (
    Column("id", "int", nullable=False, key=True, unique=True),
    Column("customer", "varchar", nullable=False),
    Column("amount", "decimal", nullable=False),
    Column("note", "text"),
    Column("created", "datetime", nullable=False),
)
ORDER_SPECS = {"shop.orders": {"amount": AE.ColumnSpec(precision=14, scale=2)}}


def order(op: Op, before=None, after=None, ts: int = TS) -> RowChange:
    return RowChange("shop", "orders", ts, op, before, after, ORDERS_COLS, POS)


ROW1 = {"id": 1, "customer": "ann", "amount": Decimal("12.50"), "note": None,
        "created": dt.datetime(2024, 2, 29, 23, 59, 58, 123456)}


@pytest.fixture
def reg() -> InMemoryRegistry:
    return InMemoryRegistry()


def encoder(reg, **kw) -> AE.AvroEncoder:
    kw.setdefault("column_specs", ORDER_SPECS)
    return AE.AvroEncoder(reg, **kw)


def decode_all(dec, messages, start: int = 77):
    out = []
    for i, (k, v) in enumerate(messages):
        out += dec.decode(msg(k, v, offset=start + i))
    return out


# ---------------------------------------------------------------------------------------------------------
# registration in the codec table
# ---------------------------------------------------------------------------------------------------------


def test_registered_and_ungated_by_default():
    assert "avro" in protocols()
    d = get_decoder("avro")  # no options: the CLI builds it just to ask whether it is gated
    assert isinstance(d, Decoder)
    assert d.name == "avro" and d.gated is False
    assert get_decoder("avro", enable_watermark=True).gated is True
    with pytest.raises(ValueError, match="decimal_mode"):
        get_decoder("avro", decimal_mode="fast")
    with pytest.raises(ValueError, match="valid options"):
        get_decoder("avro", registry="x", nope=1)


def test_no_registry_configured_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("APPLIER_REGISTRY_URL", raising=False)
    d = A.AvroDecoder()
    with pytest.raises(RegistryError, match="APPLIER_REGISTRY_URL") as ei:
        d.decode(msg(frame(1, b"\x02"), frame(2, b"")))
    assert not isinstance(ei.value, DecodeError)


# ---------------------------------------------------------------------------------------------------------
# golden schemas (tiflow avro_test_data.go / avro_test.go, see shared/vectors/SOURCES.md)
# ---------------------------------------------------------------------------------------------------------

#: mysql type const (+ binary flag) -> event-model type name
MYSQL_CONST_TYPES = {
    ("TypeTiny", False): "tinyint", ("TypeShort", False): "smallint", ("TypeInt24", False): "mediumint",
    ("TypeLong", False): "int", ("TypeLonglong", False): "bigint", ("TypeFloat", False): "float",
    ("TypeDouble", False): "double", ("TypeBit", False): "bit", ("TypeNewDecimal", False): "decimal",
    ("TypeTinyBlob", False): "tinytext", ("TypeMediumBlob", False): "mediumtext", ("TypeBlob", False): "text",
    ("TypeLongBlob", False): "longtext", ("TypeVarchar", False): "varchar", ("TypeVarString", False): "varchar",
    ("TypeString", False): "char", ("TypeTinyBlob", True): "tinyblob", ("TypeMediumBlob", True): "mediumblob",
    ("TypeBlob", True): "blob", ("TypeLongBlob", True): "longblob", ("TypeVarchar", True): "varbinary",
    ("TypeVarString", True): "varbinary", ("TypeString", True): "binary", ("TypeEnum", False): "enum",
    ("TypeSet", False): "set", ("TypeJSON", False): "json", ("TypeDate", False): "date",
    ("TypeDatetime", False): "datetime", ("TypeTimestamp", False): "timestamp", ("TypeDuration", False): "time",
    ("TypeYear", False): "year",
}


@pytest.fixture(scope="module")
def type_table(vectors: Path) -> dict:
    return json.loads((vectors / "avro" / "avro_column_type_table.json").read_text())


def vector_column(entry: dict, nullable: bool) -> Column:
    binary = entry["flag"] == "BinaryFlag"
    return Column(
        entry["column"] + ("nullable" if nullable else ""),
        MYSQL_CONST_TYPES[(entry["mysqlTypeConst"], binary)],
        nullable=nullable,
        unsigned=entry["flag"] == "UnsignedFlag",
        binary=binary,
    )


def all_types_row(type_table: dict) -> RowChange:
    cols = [Column("id", "int", nullable=False, key=True)]
    for e in type_table["columns"]:
        cols += [vector_column(e, False), vector_column(e, True)]
    return RowChange("testdb", "avroencode", 1, Op.INSERT, None, {}, tuple(cols), POS)


def all_types_specs(type_table: dict) -> dict:
    specs = {}
    for e in type_table["columns"]:
        if e["elems"]:
            for n in (e["column"], e["column"] + "nullable"):
                specs[n] = AE.ColumnSpec(allowed=tuple(e["elems"]))
    return {"testdb.avroencode": specs}


@pytest.mark.parametrize("extension, golden", [
    (False, "expectedSchemaWithoutExtension.avsc"),
    (True, "expectedSchemaWithExtension.avsc"),
])
def test_generated_value_schema_equals_tiflow_golden(vectors, type_table, reg, extension, golden):
    enc = AE.AvroEncoder(reg, enable_tidb_extension=extension, column_specs=all_types_specs(type_table))
    expected = json.loads((vectors / "avro" / golden).read_text())
    assert enc.value_schema(all_types_row(type_table)) == expected


def test_column_schemas_match_the_type_table_in_every_mode(type_table, reg):
    default = AE.AvroEncoder(reg)
    overrides = {o["column"]: o for o in type_table["overrides"]}
    string_mode = AE.AvroEncoder(reg, decimal_mode="string", bigint_unsigned_mode="string")
    for e in type_table["columns"]:
        spec = AE.ColumnSpec(allowed=tuple(e["elems"])) if e["elems"] else None
        col = vector_column(e, False)
        assert default.column_type(col, spec) == e["expectedAvroSchema"], e["column"]
        if e["column"] in overrides:
            assert string_mode.column_type(col, spec) == overrides[e["column"]]["expectedAvroSchema"]
        else:
            assert string_mode.column_type(col, spec) == e["expectedAvroSchema"]


def test_key_schema_holds_only_the_handle_key(reg, type_table):
    enc = AE.AvroEncoder(reg, column_specs=all_types_specs(type_table))
    ks = enc.key_schema(all_types_row(type_table))
    assert ks == {"type": "record", "name": "avroencode", "namespace": "default.testdb",
                  "fields": [{"name": "id", "type": {"type": "int", "connect.parameters": {"tidb_type": "INT"}}}]}
    no_key = RowChange("s", "t", 1, Op.INSERT, None, {"a": 1}, (Column("a", "int"),), POS)
    assert enc.key_schema(no_key) is None


# ---------------------------------------------------------------------------------------------------------
# every type of the vector table: the Avro datum TiCDC writes, and the Python value decoded from it
# ---------------------------------------------------------------------------------------------------------

#: column -> (event-model input, expected Avro datum (tiflow expectedGoNativeData), expected decoded value)
TYPE_CASES = {
    "tiny": (1, 1, 1),
    "short": (1, 1, 1),
    "int24": (1, 1, 1),
    "long": (1, 1, 1),
    "longlong": (1, 1, 1),
    "tinyunsigned": (1, 1, 1),
    "shortunsigned": (1, 1, 1),
    "int24unsigned": (1, 1, 1),
    "longunsigned": (1, 1, 1),
    "longlongunsigned": (1, 1, 1),
    "float": (3.14, pytest.approx(3.14, rel=1e-7), 3.14),
    "double": (3.14, 3.14, 3.14),
    "bit": (683, b"\x02\xab", 683),
    "decimal": (Decimal("129012.1230000"), Decimal("129012.1230000"), Decimal("129012.1230000")),
    "tinytext": ("hello world", "hello world", "hello world"),
    "mediumtext": ("hello world", "hello world", "hello world"),
    "text": ("hello world", "hello world", "hello world"),
    "longtext": ("hello world", "hello world", "hello world"),
    "varchar": ("hello world", "hello world", "hello world"),
    "varstring": ("hello world", "hello world", "hello world"),
    "string": ("hello world", "hello world", "hello world"),
    "tinyblob": (b"hello world", b"hello world", b"hello world"),
    "mediumblob": (b"hello world", b"hello world", b"hello world"),
    "blob": (b"hello world", b"hello world", b"hello world"),
    "longblob": (b"hello world", b"hello world", b"hello world"),
    "varbinary": (b"hello world", b"hello world", b"hello world"),
    "varbinary1": (b"hello world", b"hello world", b"hello world"),
    "binary": (b"hello world", b"hello world", b"hello world"),
    "enum": (1, "a", "a"),  # ordinal 1 of ('a','b'), as TiCDC's Go value uint64(1)
    "set": (1, "a", "a"),  # bitmask 1
    "json": ('{"key": "value"}', '{"key": "value"}', '{"key": "value"}'),
    "date": (dt.date(2000, 1, 1), "2000-01-01", dt.date(2000, 1, 1)),
    "datetime": (dt.datetime(2015, 12, 20, 23, 58, 58), "2015-12-20 23:58:58",
                 dt.datetime(2015, 12, 20, 23, 58, 58)),
    "timestamp": (dt.datetime(1973, 12, 30, 15, 30), "1973-12-30 15:30:00", dt.datetime(1973, 12, 30, 15, 30)),
    "time": (dt.timedelta(hours=23, minutes=59, seconds=59), "23:59:59",
             dt.timedelta(hours=23, minutes=59, seconds=59)),
    "year": (1970, 1970, 1970),
}


def test_type_cases_cover_the_vector_table(type_table):
    assert set(TYPE_CASES) == {e["column"] for e in type_table["columns"]}


@pytest.mark.parametrize("mode", ["default", "string"])
def test_every_vector_type_round_trips(type_table, reg, mode):
    specs = all_types_specs(type_table)["testdb.avroencode"]
    specs["decimal"] = specs["decimalnullable"] = AE.ColumnSpec(precision=14, scale=7)
    kw = {"decimal_mode": "string", "bigint_unsigned_mode": "string"} if mode == "string" else {}
    enc = AE.AvroEncoder(reg, column_specs={"testdb.avroencode": specs}, **kw)
    base = all_types_row(type_table)
    after = {"id": 7}
    for e in type_table["columns"]:
        after[e["column"]] = TYPE_CASES[e["column"]][0]
        after[e["column"] + "nullable"] = None
    row = RowChange(base.schema, base.table, TS, Op.INSERT, None, after, base.columns, POS)
    [(key, value)] = enc.encode(row, "testdb.avroencode")

    # the datum on the wire is TiCDC's (tiflow TestColumnToAvroData)
    datum = raw_datum(enc.value_schema(row), value[5:])
    overrides = {o["column"]: o["expectedData"] for o in type_table["overrides"]} if mode == "string" else {}
    for name, (_, wire, _) in TYPE_CASES.items():
        if name in overrides:
            assert datum[name] == overrides[name], name
        elif name != "decimal":
            assert datum[name] == wire, name
        assert datum[name + "nullable"] is None
    assert datum["_tidb_op"] == "c" and datum["_tidb_commit_ts"] == TS
    assert datum["_tidb_commit_physical_time"] == TS >> 18

    [ev] = A.AvroDecoder(registry=reg).decode(msg(key, value))
    assert ev.op is Op.INSERT and ev.commit_ts == TS and ev.before is None
    assert (ev.schema, ev.table) == ("testdb", "avroencode")
    for name, (_, _, expected) in TYPE_CASES.items():
        got = ev.after[name]
        assert got == expected and type(got) is type(expected), name
        assert ev.after[name + "nullable"] is None
    cols = {c.name: c for c in ev.columns}
    assert cols["id"].key and cols["id"].unique and not cols["tiny"].key
    assert cols["tiny"].type_name == "int" and not cols["tiny"].nullable and cols["tinynullable"].nullable
    assert cols["longlongunsigned"].unsigned and cols["longlongunsigned"].type_name == "bigint"
    assert cols["varbinary"].binary and cols["varbinary"].type_name == "blob"
    assert cols["varchar"].type_name == "text" and not cols["varchar"].binary
    assert cols["timestamp"].type_name == "timestamp" and cols["time"].type_name == "time"


def test_extreme_values(reg):
    cols = (Column("id", "bigint", nullable=False, key=True, unsigned=True), Column("i", "int", unsigned=True),
            Column("b", "bit"), Column("d", "decimal"), Column("f", "float"), Column("t", "time"),
            Column("z", "date"), Column("zz", "datetime"), Column("s", "bigint"))
    specs = {"s.t": {"d": AE.ColumnSpec(precision=65, scale=30), "b": AE.ColumnSpec(length=64)}}
    rows = [
        {"id": 2**64 - 1, "i": 2**32 - 1, "b": 2**64 - 1, "d": Decimal("-" + "9" * 35 + "." + "9" * 30),
         "f": 3.4028234663852886e38, "t": -dt.timedelta(hours=838, minutes=59, seconds=59), "z": "0000-00-00",
         "zz": "0000-00-00 00:00:00", "s": -(2**63)},
        {"id": 2**63, "i": 0, "b": 0, "d": Decimal("0E-30"), "f": -1.5e-45, "t": dt.timedelta(0),
         "z": dt.date(1, 1, 1), "zz": dt.datetime(9999, 12, 31, 23, 59, 59, 999999), "s": 2**63 - 1},
    ]
    for mode in ("long", "string"):
        enc = AE.AvroEncoder(reg, bigint_unsigned_mode=mode, column_specs=specs)
        dec = A.AvroDecoder(registry=reg)
        for after in rows:
            [(k, v)] = enc.encode(RowChange("s", "t", 5, Op.INSERT, None, after, cols, POS), "s_t")
            [ev] = dec.decode(msg(k, v))
            for c in cols:
                assert values_equal(c.type_name, ev.after[c.name], after[c.name]), (c.name, ev.after[c.name])
    # the uint64 bit pattern on the wire in long mode: 2**64-1 is written as -1 (TiCDC's int64(uint64))
    enc = AE.AvroEncoder(reg, column_specs=specs)
    [(k, v)] = enc.encode(RowChange("s", "t", 5, Op.INSERT, None, rows[0], cols, POS), "s_t")
    key_schema = enc.key_schema(RowChange("s", "t", 5, Op.INSERT, None, rows[0], cols, POS))
    assert raw_datum(key_schema, k[5:]) == {"id": -1}


# ---------------------------------------------------------------------------------------------------------
# operations
# ---------------------------------------------------------------------------------------------------------


def test_insert_update_delete_with_extension(reg):
    enc, dec = encoder(reg), A.AvroDecoder(registry=reg)
    new = dict(ROW1, note="gift", amount=Decimal("13.00"))
    msgs = (enc.encode(order(Op.INSERT, None, ROW1), "shop.orders")
            + enc.encode(order(Op.UPDATE, ROW1, new, ts=TS + 1), "shop.orders")
            + enc.encode(order(Op.DELETE, new, None, ts=TS + 2), "shop.orders"))
    assert len(msgs) == 3
    assert msgs[2][1] is None  # delete: key + tombstone
    ins, upd, dele = decode_all(dec, msgs)
    assert (ins.op, ins.commit_ts, ins.before, ins.after) == (Op.INSERT, TS, None, ROW1)
    # TiCDC's avro value has no old row: an update carries only the new one (applied as an upsert)
    assert (upd.op, upd.commit_ts, upd.before, upd.after) == (Op.UPDATE, TS + 1, None, new)
    # a tombstone carries only the key, and no commit ts
    assert (dele.op, dele.commit_ts, dele.before, dele.after) == (Op.DELETE, 0, {"id": 1}, None)
    assert [c.name for c in dele.columns] == ["id"] and dele.columns[0].key
    assert [c.name for c in ins.columns] == [c.name for c in ORDERS_COLS]
    assert [c.name for c in ins.columns if c.key] == ["id"]
    assert all(ev.position.offset == i + 77 for i, ev in enumerate((ins, upd, dele)))
    assert (ins.schema, ins.table) == ("shop", "orders")
    assert ins.size == len(msgs[0][0]) + len(msgs[0][1])


def test_without_extension_commit_ts_is_unknown_and_updates_are_inserts(reg):
    enc, dec = encoder(reg, enable_tidb_extension=False), A.AvroDecoder(registry=reg)
    [(k, v)] = enc.encode(order(Op.UPDATE, ROW1, ROW1), "shop.orders")
    [ev] = dec.decode(msg(k, v))
    assert (ev.op, ev.commit_ts, ev.before, ev.after) == (Op.INSERT, 0, None, ROW1)
    assert "_tidb_op" not in json.dumps(enc.value_schema(order(Op.INSERT, None, ROW1)))


def test_key_changing_update_is_split_like_ticdc(reg):
    enc, dec = encoder(reg), A.AvroDecoder(registry=reg)
    new = dict(ROW1, id=2)
    msgs = enc.encode(order(Op.UPDATE, ROW1, new), "shop.orders")
    assert len(msgs) == 2 and msgs[0][1] is None
    d, i = decode_all(dec, msgs)
    assert (d.op, d.before) == (Op.DELETE, {"id": 1})
    assert (i.op, i.after) == (Op.INSERT, new)


def test_include_before_value(reg):
    enc, dec = encoder(reg, include_before_value=True), A.AvroDecoder(registry=reg)
    new = dict(ROW1, note="gift")
    msgs = (enc.encode(order(Op.INSERT, None, ROW1), "shop.orders")
            + enc.encode(order(Op.UPDATE, ROW1, new, ts=TS + 1), "shop.orders")
            + enc.encode(order(Op.DELETE, new, None, ts=TS + 2), "shop.orders"))
    schema = enc.value_schema(order(Op.INSERT, None, ROW1))
    before_field = [f for f in schema["fields"] if f["name"] == "_ticdc_before"][0]
    assert before_field["type"][0] == "null" and before_field["type"][1]["name"] == "orders_before"
    ins, upd, dele = decode_all(dec, msgs)
    assert (ins.op, ins.before, ins.after) == (Op.INSERT, None, ROW1)
    assert (upd.op, upd.before, upd.after, upd.commit_ts) == (Op.UPDATE, ROW1, new, TS + 1)
    assert (dele.op, dele.before, dele.after, dele.commit_ts) == (Op.DELETE, new, None, TS + 2)
    assert [c.name for c in dele.columns] == [c.name for c in ORDERS_COLS]
    # before value without the extension: _tidb_op alone (pingcap/ticdc schemaWithOperation)
    enc2 = encoder(reg, include_before_value=True, enable_tidb_extension=False)
    [(k, v)] = enc2.encode(order(Op.DELETE, ROW1, None), "shop.orders")
    [ev] = dec.decode(msg(k, v))
    assert (ev.op, ev.before, ev.commit_ts) == (Op.DELETE, ROW1, 0)


def test_watermark_mode_ddl_resolved_and_delete_marker(reg):
    enc = encoder(reg, enable_watermark=True)
    dec = A.AvroDecoder(registry=reg, enable_watermark=True)
    assert dec.gated
    ddl = DDL("shop", "orders", TS, "ALTER TABLE orders ADD note2 TEXT", POS, ddl_type=5)
    msgs = [enc.encode_ddl(ddl), enc.encode_resolved(TS + 5),
            *enc.encode(order(Op.INSERT, None, ROW1, ts=TS + 1), "shop.orders"),
            *enc.encode(order(Op.DELETE, ROW1, None, ts=TS + 2), "shop.orders")]
    assert msgs[0][0] is None and msgs[0][1][0] == 1
    assert json.loads(msgs[0][1][1:]) == {"query": ddl.query, "type": 5, "schema": "shop", "table": "orders",
                                          "commitTs": TS}
    assert msgs[1] == (None, b"\x02" + struct.pack(">Q", TS + 5))
    assert msgs[3][1] == b"\x03" + struct.pack(">Q", TS + 2)
    d, r, i, x = decode_all(dec, msgs)
    assert isinstance(d, DDL) and (d.schema, d.table, d.commit_ts, d.query, d.ddl_type) == (
        "shop", "orders", TS, ddl.query, 5)
    assert r == Resolved(TS + 5, SourcePosition("shop_orders", 2, 78))
    assert (i.op, i.commit_ts) == (Op.INSERT, TS + 1)
    assert (x.op, x.commit_ts, x.before) == (Op.DELETE, TS + 2, {"id": 1})
    # the ungated decoder still takes the 0x03 delete (it carries its commit ts)
    [x2] = A.AvroDecoder(registry=reg).decode(msg(*msgs[3]))
    assert x2.commit_ts == TS + 2


def test_watermark_mode_rejects_what_it_cannot_place(reg):
    dec = A.AvroDecoder(registry=reg, enable_watermark=True)
    [(k, _)] = encoder(reg).encode(order(Op.DELETE, ROW1, None), "shop.orders")
    with pytest.raises(DecodeError, match="delete without a commit ts") as ei:
        dec.decode(msg(k, None))
    assert WHERE in str(ei.value)
    [(k, v)] = encoder(reg, enable_tidb_extension=False).encode(order(Op.INSERT, None, ROW1), "shop.orders")
    with pytest.raises(DecodeError, match="enable-tidb-extension"):
        dec.decode(msg(k, v))


def test_watermark_messages_need_the_option(reg):
    dec = A.AvroDecoder(registry=reg)
    for value in (b"\x02" + struct.pack(">Q", 5), b'\x01{"query":"x"}'):
        with pytest.raises(DecodeError, match="enable_watermark=true"):
            dec.decode(msg(None, value))


def test_table_without_key(reg):
    cols = (Column("a", "int"), Column("b", "varchar"))
    enc, dec = AE.AvroEncoder(reg), A.AvroDecoder(registry=reg)
    [(k, v)] = enc.encode(RowChange("s", "nokey", 9, Op.INSERT, None, {"a": 1, "b": "x"}, cols, POS), "s_nokey")
    assert k is None
    [ev] = dec.decode(msg(None, v))
    assert ev.after == {"a": 1, "b": "x"} and not any(c.key for c in ev.columns)
    with pytest.raises(AE.AvroEncodeError, match="without a key"):
        enc.encode(RowChange("s", "nokey", 9, Op.DELETE, {"a": 1, "b": "x"}, None, cols, POS), "s_nokey")


def test_names_are_sanitized_like_ticdc(reg):
    assert A.sanitize_name("order-items") == "order_items"
    assert A.sanitize_name("1abc") == "_1abc"
    assert A.sanitize_name("表1") == "_1"
    assert A.sanitize_name("a表b") == "a_b"
    assert A.sanitize_name("ok_Name9") == "ok_Name9"
    assert AE.sanitize_topic("a.b.c") == "a_b_c"
    cols = (Column("my id", "int", nullable=False, key=True), Column("2nd", "varchar"))
    enc, dec = AE.AvroEncoder(reg, namespace="ns-1"), A.AvroDecoder(registry=reg)
    [(k, v)] = enc.encode(RowChange("my-db", "my.table", 9, Op.INSERT, None, {"my id": 1, "2nd": "x"}, cols, POS),
                          "my-db.my.table")
    assert reg.latest_version("my-db_my_table-value").id == struct.unpack(">I", v[1:5])[0]
    assert reg.latest_version("my-db_my_table-key").id == struct.unpack(">I", k[1:5])[0]
    [ev] = dec.decode(msg(k, v))
    assert (ev.schema, ev.table) == ("my_db", "my_table")
    assert ev.after == {"my_id": 1, "_2nd": "x"}
    assert json.loads(reg.schema_by_id(struct.unpack(">I", v[1:5])[0]).schema)["namespace"] == "ns_1.my_db"


def test_schema_change_arrives_as_new_ids_parsed_once(reg):
    enc, dec = encoder(reg), A.AvroDecoder(registry=reg)
    msgs = [m for i in range(3) for m in enc.encode(order(Op.INSERT, None, dict(ROW1, id=i)), "shop.orders")]
    cols2 = ORDERS_COLS + (Column("status", "varchar"),)
    row2 = RowChange("shop", "orders", TS, Op.INSERT, None, dict(ROW1, id=9, status="new"), cols2, POS)
    msgs += enc.encode(row2, "shop.orders") * 3
    evs = decode_all(dec, msgs)
    assert [len(e.columns) for e in evs] == [5, 5, 5, 6, 6, 6]
    assert evs[-1].after["status"] == "new"
    assert reg.lookups == 3  # key id, value id v1, value id v2: each fetched once
    assert reg.latest_version("shop_orders-value").version == 2


def test_decimal_and_bigint_mode_expectations(reg):
    [(k, v)] = encoder(reg, decimal_mode="string").encode(order(Op.INSERT, None, ROW1), "shop.orders")
    [ev] = A.AvroDecoder(registry=reg, decimal_mode="string").decode(msg(k, v))
    assert ev.after["amount"] == Decimal("12.50")
    with pytest.raises(DecodeError, match="decimal_mode is precise"):
        A.AvroDecoder(registry=reg, decimal_mode="precise").decode(msg(k, v))
    cols = (Column("id", "bigint", nullable=False, key=True, unsigned=True),)
    [(k, v)] = AE.AvroEncoder(reg, bigint_unsigned_mode="string").encode(
        RowChange("s", "u", 1, Op.INSERT, None, {"id": 2**64 - 1}, cols, POS), "s_u")
    with pytest.raises(DecodeError, match="bigint_unsigned_mode is long"):
        A.AvroDecoder(registry=reg, bigint_unsigned_mode="long").decode(msg(k, v))
    [ev] = A.AvroDecoder(registry=reg, bigint_unsigned_mode="string").decode(msg(k, v))
    assert ev.after == {"id": 2**64 - 1}


def test_encoder_refuses_what_ticdc_could_not_send(reg):
    enc = encoder(reg)
    with pytest.raises(AE.AvroEncodeError, match="more than 2 fractional digits"):
        enc.encode(order(Op.INSERT, None, dict(ROW1, amount=Decimal("1.234"))), "t")
    with pytest.raises(AE.AvroEncodeError, match="NOT NULL"):
        enc.encode(order(Op.INSERT, None, dict(ROW1, customer=None)), "t")
    with pytest.raises(AE.AvroEncodeError, match="no TiCDC Avro mapping"):
        enc.encode(RowChange("s", "g", 1, Op.INSERT, None, {"g": b""}, (Column("g", "geometry"),), POS), "t")
    with pytest.raises(AE.AvroEncodeError, match="ordinals need"):
        enc.encode(RowChange("s", "e", 1, Op.INSERT, None, {"e": 1}, (Column("e", "enum"),), POS), "t")
    with pytest.raises(AE.AvroEncodeError, match="enable_watermark"):
        enc.encode_resolved(1)


# ---------------------------------------------------------------------------------------------------------
# checksum schema (tiflow expectedSchemaWithExtensionEnableChecksum.avsc): decoded, corrupted rows refused
# ---------------------------------------------------------------------------------------------------------


def checksum_record(schema: dict, corrupted: bool) -> dict:
    rec = {}
    for f in schema["fields"]:
        t = f["type"]
        if isinstance(t, list):
            rec[f["name"]] = None
            continue
        if isinstance(t, dict):
            tidb = t["connect.parameters"]["tidb_type"]
            rec[f["name"]] = {"int": 1, "long": 2, "float": 1.5, "double": 2.5, "string": "1",
                              "bytes": b"\x01"}[t["type"]]
            if tidb == "DATE":
                rec[f["name"]] = "2020-01-02"
            elif tidb in ("DATETIME", "TIMESTAMP"):
                rec[f["name"]] = "2020-01-02 03:04:05"
            elif tidb == "TIME":
                rec[f["name"]] = "01:02:03"
    rec.update({"_tidb_op": "u", "_tidb_commit_ts": TS, "_tidb_commit_physical_time": TS >> 18,
                "_tidb_row_level_checksum": "123", "_tidb_corrupted": corrupted, "_tidb_checksum_version": 1})
    return rec


def test_checksum_schema_decodes_and_corrupted_rows_stop(vectors, reg):
    schema = json.loads((vectors / "avro" / "expectedSchemaWithExtensionEnableChecksum.avsc").read_text())
    sid = reg.register("testdb_avroencode-value", json.dumps(schema))
    # the record's values are made up, so its checksum "123" is wrong: verified (the default) that is an error
    with pytest.raises(DecodeError, match="row checksum"):
        A.AvroDecoder(registry=reg).decode(msg(None, frame(sid, avro_bytes(schema, checksum_record(schema, False)))))
    dec = A.AvroDecoder(registry=reg, decimal_mode="string", bigint_unsigned_mode="string", verify_checksum=False)
    [ev] = dec.decode(msg(None, frame(sid, avro_bytes(schema, checksum_record(schema, False)))))
    assert ev.op is Op.UPDATE and ev.commit_ts == TS
    assert ev.after["decimal"] == Decimal(1) and ev.after["longlongunsigned"] == 1 and ev.after["bit"] == 1
    assert ev.after["date"] == dt.date(2020, 1, 2)
    assert ev.after["time"] == dt.timedelta(hours=1, minutes=2, seconds=3)
    assert not any(c.name.startswith("_tidb") for c in ev.columns)
    with pytest.raises(DecodeError, match="corrupted") as ei:
        dec.decode(msg(None, frame(sid, avro_bytes(schema, checksum_record(schema, True)))))
    assert WHERE in str(ei.value)


# ---------------------------------------------------------------------------------------------------------
# malformed input
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture
def good(reg):
    [(k, v)] = encoder(reg).encode(order(Op.INSERT, None, ROW1), "shop.orders")
    return k, v


def expect_error(dec, key, value, *fragments):
    with pytest.raises(DecodeError) as ei:
        dec.decode(msg(key, value))
    text = str(ei.value)
    assert WHERE in text and "avro" in text, text
    for f in fragments:
        assert f in text, (f, text)
    return text


def test_wrong_magic_byte(reg, good):
    k, v = good
    dec = A.AvroDecoder(registry=reg)
    expect_error(dec, k, b"\x07" + v[1:], "0x07", "magic byte")
    expect_error(dec, b"\x01" + k[1:], v, "key starts with byte 0x01", "magic byte")
    expect_error(dec, None, b"\x09abc", "0x09")


def test_short_frames(reg, good):
    k, v = good
    dec = A.AvroDecoder(registry=reg)
    expect_error(dec, k, v[:4], "value is 4 bytes", "5-byte Confluent header")
    expect_error(dec, k[:3], v, "key is 3 bytes")


def test_unknown_schema_id_names_it(reg, good):
    k, v = good
    dec = A.AvroDecoder(registry=reg)
    text = expect_error(dec, k, frame(4242, v[5:]), "schema id 4242", "registry does not have")
    assert "value" in text
    expect_error(dec, frame(77, k[5:]), v, "schema id 77", "key")


def test_truncated_and_trailing_avro(reg, good):
    k, v = good
    dec = A.AvroDecoder(registry=reg)
    for cut in (6, 10, len(v) - 1):
        expect_error(dec, k, v[:cut], "not valid Avro", f"schema id {struct.unpack('>I', v[1:5])[0]}")
    expect_error(dec, k, v + b"\x00\x01", "2 bytes after the Avro record")


def test_key_value_disagreement(reg, good):
    k, v = good
    [(k2, _)] = encoder(reg).encode(order(Op.INSERT, None, dict(ROW1, id=5)), "shop.orders")
    expect_error(A.AvroDecoder(registry=reg), k2, v, "key column 'id'")
    other = RowChange("shop", "other", 1, Op.INSERT, None, {"id": 1}, (Column("id", "int", nullable=False,
                                                                             key=True),), POS)
    [(k3, _)] = AE.AvroEncoder(reg).encode(other, "shop.other")
    expect_error(A.AvroDecoder(registry=reg), k3, v, "shop.other", "shop.orders")


def test_schemas_that_are_not_ticdcs(reg):
    dec = A.AvroDecoder(registry=reg)
    plain = {"type": "record", "name": "t", "namespace": "default.db", "fields": [{"name": "a", "type": "int"}]}
    sid = reg.register("x-value", json.dumps(plain))
    expect_error(dec, None, frame(sid, b"\x02"), f"schema id {sid}", "no connect.parameters.tidb_type")
    bad_type = dict(plain, fields=[{"name": "a", "type": {"type": "string", "connect.parameters":
                                                               {"tidb_type": "INT"}}}])
    sid = reg.register("y-value", json.dumps(bad_type))
    expect_error(dec, None, frame(sid, b"\x02a"), "tidb_type INT cannot be Avro string")
    no_ns = dict(plain, namespace="db")
    sid = reg.register("z-value", json.dumps(no_ns))
    expect_error(dec, None, frame(sid, b"\x02"), "namespace 'db'")
    sid = reg.register("w-value", "not json at all")
    expect_error(dec, None, frame(sid, b"\x02"), "is not JSON")


def test_values_that_do_not_fit_their_type(reg):
    dec = A.AvroDecoder(registry=reg)

    def one(tidb, avro, datum, extra=None):
        t = {"type": avro, "connect.parameters": {"tidb_type": tidb}, **(extra or {})}
        s = {"type": "record", "name": "t", "namespace": "default.db", "fields": [{"name": "c", "type": t}]}
        sid = reg.register(f"{tidb}-{avro}-value", json.dumps(s))
        writer = dict(s, fields=[{"name": "c", "type": avro}])
        return frame(sid, avro_bytes(writer, {"c": datum}))

    expect_error(dec, None, one("DATE", "string", "2020-02-30"), "column 'c' (DATE)")
    expect_error(dec, None, one("TIME", "string", "noon"), "column 'c' (TIME)")
    expect_error(dec, None, one("BIGINT UNSIGNED", "string", "-1"), "not an unsigned integer")
    expect_error(dec, None, one("BIGINT UNSIGNED", "string", str(2**64)), "exceeds BIGINT UNSIGNED")
    expect_error(dec, None, one("DECIMAL", "string", "abc"), "(DECIMAL)")
    expect_error(dec, None, one("BIT", "bytes", b"\x01" * 9), "BIT(64)")
    expect_error(dec, None, one("DOUBLE", "double", float("nan")), "finite")
    expect_error(dec, None, one("INT UNSIGNED", "int", -1), "negative")
    expect_error(dec, None, one("DECIMAL", "bytes", b"\x7f\xff", {"logicalType": "decimal", "precision": 3,
                                                                    "scale": 1}), "more than 3 digits")


def test_invalid_extension_values(reg):
    dec = A.AvroDecoder(registry=reg)
    s = {"type": "record", "name": "t", "namespace": "default.db", "fields": [
        {"name": "c", "type": {"type": "int", "connect.parameters": {"tidb_type": "INT"}}},
        {"name": "_tidb_op", "type": "string"}, {"name": "_tidb_commit_ts", "type": "long"}]}
    sid = reg.register("ext-value", json.dumps(s))
    expect_error(dec, None, frame(sid, avro_bytes(s, {"c": 1, "_tidb_op": "x", "_tidb_commit_ts": 1})),
                 "_tidb_op is 'x'")
    expect_error(dec, None, frame(sid, avro_bytes(s, {"c": 1, "_tidb_op": "c", "_tidb_commit_ts": -5})),
                 "not a commit ts")
    # a real column named like an extension field (it has a tidb_type) is a column, not metadata
    s2 = {"type": "record", "name": "t", "namespace": "default.db", "fields": [
        {"name": "_tidb_op", "type": {"type": "string", "connect.parameters": {"tidb_type": "TEXT"}}}]}
    sid2 = reg.register("ext2-value", json.dumps(s2))
    [ev] = dec.decode(msg(None, frame(sid2, avro_bytes(s2, {"_tidb_op": "zzz"}))))
    assert ev.op is Op.INSERT and ev.after == {"_tidb_op": "zzz"}


def test_framing_errors_of_watermark_messages(reg, good):
    k, _ = good
    dec = A.AvroDecoder(registry=reg, enable_watermark=True)
    expect_error(dec, None, b"\x02\x00\x01", "expected 9")
    expect_error(dec, None, b"\x02" + b"\xff" * 8, "out of range")
    expect_error(dec, None, b"\x01not json", "not JSON")
    expect_error(dec, None, b'\x01{"query":"","schema":"a","table":"b","commitTs":1}', "no query")
    expect_error(dec, None, b'\x01{"query":"x","schema":"a","table":"b","commitTs":-1}', "not a commit ts")
    expect_error(dec, k, b"\x01{}", "has a key")
    expect_error(dec, k, b"\x03\x00", "expected 9")
    expect_error(dec, None, b"\x03" + b"\x00" * 8, "without a key")
    expect_error(dec, None, None, "neither key nor value")


def test_registry_unreachable_is_a_clear_error_not_a_decode_error(good):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    k, v = good
    dec = A.AvroDecoder(registry=RegistryClient(f"http://u:s3cret-pw@127.0.0.1:{port}", retries=1, backoff=0,
                                                timeout=1))
    with pytest.raises(RegistryUnavailable) as ei:
        dec.decode(msg(k, v))
    text = str(ei.value)
    assert not isinstance(ei.value, DecodeError)
    assert f"http://127.0.0.1:{port}" in text and "schema id" in text and "2 attempts" in text
    assert WHERE in text and "applier.devtools.services start --only registry" in text
    assert "s3cret" not in text and "s3cret" not in repr(dec)


# ---------------------------------------------------------------------------------------------------------
# property tests
# ---------------------------------------------------------------------------------------------------------

ROUND_TRIP_TYPES = [
    (t, u) for (t, u) in VALUE_STRATEGIES if t not in ("enum", "set")
]
ENUM_MEMBERS = ("a", "b,c", "d'e", "")


@st.composite
def typed_rows(draw):
    n = draw(st.integers(1, 6))
    picks = draw(st.lists(st.sampled_from(ROUND_TRIP_TYPES + [("enum", False), ("set", False)]),
                          min_size=n, max_size=n))
    cols = [Column("id", "bigint", nullable=False, key=True)]
    after = {"id": draw(st.integers(-(2**63), 2**63 - 1))}
    specs = {}
    for i, (t, unsigned) in enumerate(picks):
        name = f"c{i}"
        nullable = draw(st.booleans())
        binary = t in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob")
        cols.append(Column(name, t, nullable=nullable, unsigned=unsigned, binary=binary))
        if t == "enum":
            strat = st.sampled_from(ENUM_MEMBERS)
            specs[name] = AE.ColumnSpec(allowed=ENUM_MEMBERS)
        elif t == "set":
            strat = st.sampled_from(["", "a", "a,d'e"])
            specs[name] = AE.ColumnSpec(allowed=ENUM_MEMBERS)
        else:
            strat = VALUE_STRATEGIES[(t, unsigned)]
            if t == "decimal":
                specs[name] = AE.ColumnSpec(precision=30, scale=6)
        after[name] = draw(st.none() if nullable and draw(st.booleans()) else strat)
    op = draw(st.sampled_from([Op.INSERT, Op.UPDATE, Op.DELETE]))
    ts = draw(st.integers(0, 2**63 - 1))
    row = RowChange("db", "t", ts, op, after if op is Op.DELETE else None,
                    None if op is Op.DELETE else after, tuple(cols), POS)
    return row, {"db.t": specs}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_rows(), st.sampled_from(["precise", "string"]), st.booleans())
def test_round_trip_property(case, decimal_mode, before_value):
    row, specs = case
    reg = InMemoryRegistry()
    enc = AE.AvroEncoder(reg, decimal_mode=decimal_mode, include_before_value=before_value, column_specs=specs)
    [(k, v)] = enc.encode(row, "db.t")
    [ev] = A.AvroDecoder(registry=reg).decode(msg(k, v))
    assert (ev.schema, ev.table) == ("db", "t")
    image = row.before if row.op is Op.DELETE else row.after
    got = ev.before if row.op is Op.DELETE else ev.after
    if row.op is Op.DELETE and not before_value:
        assert got == {"id": image["id"]} and ev.commit_ts == 0
        return
    assert ev.commit_ts == row.commit_ts
    expected_op = row.op
    assert ev.op is expected_op
    for c in row.columns:
        assert values_equal(c.type_name, got[c.name], image[c.name]), (c, got[c.name], image[c.name])


def valid_messages():
    reg = InMemoryRegistry()
    enc = encoder(reg, include_before_value=True, enable_watermark=True)
    out = []
    for op, before, after in ((Op.INSERT, None, ROW1), (Op.UPDATE, ROW1, dict(ROW1, note="x")),
                              (Op.DELETE, ROW1, None)):
        out += enc.encode(order(op, before, after), "shop.orders")
    out += encoder(reg).encode(order(Op.DELETE, ROW1, None), "shop.orders")
    out += [enc.encode_resolved(5), enc.encode_ddl(DDL("a", "b", 3, "create table b (a int)", POS))]
    return reg, out


FUZZ_REG, FUZZ_MESSAGES = valid_messages()


def _only_decode_errors(dec, key, value):
    try:
        evs = dec.decode(msg(key, value))
    except DecodeError as e:
        assert e.position == POS and e.protocol == "avro"
        return
    assert isinstance(evs, list)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.none(), st.binary(max_size=60)), st.one_of(st.none(), st.binary(max_size=120)),
       st.booleans())
def test_fuzz_random_bytes_raise_only_decode_error(key, value, watermark):
    dec = A.AvroDecoder(registry=FUZZ_REG, enable_watermark=watermark)
    _only_decode_errors(dec, key, value)
    # the same random payloads behind a valid header with a registered schema id
    for sid in (1, 2, 3):
        _only_decode_errors(dec, frame(sid, key or b""), frame(sid + 1, value or b""))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_fuzz_mutated_messages_raise_only_decode_error(data, watermark):
    key, value = data.draw(st.sampled_from(FUZZ_MESSAGES))
    part = data.draw(st.sampled_from(["key", "value"]))
    buf = bytearray((key if part == "key" else value) or b"")
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip" and buf:
            i = data.draw(st.integers(0, len(buf) - 1))
            buf[i] = data.draw(st.integers(0, 255))
        elif action == "cut" and buf:
            del buf[data.draw(st.integers(0, len(buf) - 1)):]
        else:
            i = data.draw(st.integers(0, len(buf)))
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=4))
    if part == "key":
        key = bytes(buf)
    else:
        value = bytes(buf)
    _only_decode_errors(A.AvroDecoder(registry=FUZZ_REG, enable_watermark=watermark), key, value)
