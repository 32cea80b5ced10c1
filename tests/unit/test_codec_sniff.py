"""applier.codecs.sniff: every vector sniffs as its own protocol; noise sniffs as nothing."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applier.codecs.sniff import describe_mismatch, sniff
from applier.devtools.encoders import canal_json as CE
from applier.devtools.encoders import debezium as DE
from applier.devtools.encoders import open as OE
from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition

POS = SourcePosition("t", 0, 0)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def test_open_raw_vectors(vectors):
    keys = sorted((vectors / "open" / "key").iterdir())
    assert len(keys) == 9
    for kp in keys:
        vp = vectors / "open" / "value" / kp.name.replace("_key_", "_value_")
        assert sniff(kp.read_bytes(), vp.read_bytes()) == "open", kp.name
        assert sniff(bytearray(kp.read_bytes()), vp.read_bytes()) == "open"


def test_open_docs_and_type_code_vectors(vectors):
    for rec in _lines(vectors / "open" / "docs_event_stream_example.jsonl"):
        k, v = rec["key_event"], rec.get("value_event")
        framed = OE.frame_open_batch([(orjson.dumps(k), orjson.dumps(v) if v else None)])
        assert sniff(*framed) == "open", rec["log"]
        # the docs show the bare key event (no framing): still recognisably the open protocol
        assert sniff(orjson.dumps(k), orjson.dumps(v) if v else None) == "open", rec["log"]
    table = json.loads((vectors / "open" / "column_type_codes.json").read_text())
    for entry in table["column_type_codes"]:
        if entry["example"] is not None:
            framed = OE.frame_open_batch([(b'{"ts":1,"scm":"s","tbl":"t","t":1}',
                                          orjson.dumps({"u": {"c": dict(entry["example"], f=0)}}))])
            assert sniff(*framed) == "open"


def test_canal_json_vectors(vectors):
    for rec in _lines(vectors / "canal-json" / "canal_json_extension_golden.jsonl"):
        assert sniff(None, rec["message_text_exact"].encode()) == "canal-json"
        assert sniff(None, orjson.dumps(rec["message"])) == "canal-json"
    recs = _lines(vectors / "canal-json" / "docs_examples.jsonl")
    assert len(recs) == 4
    for rec in recs:  # including the bare UPDATE fragment {"type", "data", "old"}
        assert sniff(None, orjson.dumps(rec["message"])) == "canal-json", rec["description"]
    # the column tables: messages built from them
    table = json.loads((vectors / "canal-json" / "canal_column_value_table.json").read_text())
    row = {c["column"]: c["expectedEncodedValue"] for c in table["columns"]}
    m = {"id": 0, "database": "test", "table": "t", "pkNames": ["t"], "isDdl": False, "type": "INSERT",
         "es": 1, "ts": 1, "sql": "", "sqlType": {}, "mysqlType": {n: "varchar" for n in row}, "old": None,
         "data": [row]}
    assert sniff(None, orjson.dumps(m)) == "canal-json"
    cols = (Column("id", "int", key=True), Column("b", "varbinary", binary=True))
    for variant in ({}, {"enable_tidb_extension": False}, {"content_compatible": True}):
        _, value = CE.encode_canal_json(RowChange("s", "t", 1, Op.INSERT, None, {"id": 1, "b": b"\x00"}, cols, POS),
                                       **variant)
        assert sniff(None, value) == "canal-json"


def test_debezium_vectors(vectors):
    d = vectors / "debezium"
    assert sniff((d / "datatype.dbz.key.json").read_bytes(), (d / "datatype.dbz.json").read_bytes()) == "debezium"
    assert sniff(None, (d / "datatype.dbz.json").read_bytes()) == "debezium"
    for name in ("tiflow_codec_test_expected.jsonl", "ticdc_codec_test_expected.jsonl"):
        recs = _lines(d / name)
        for k, v in zip(recs[::2], recs[1::2]):
            assert sniff(orjson.dumps(k["message"]), orjson.dumps(v["message"])) == "debezium", v["source"]
            assert sniff(None, orjson.dumps(v["message"])) == "debezium"
    doc = json.loads((d / "docs_example_dml.json").read_text())
    assert sniff(None, orjson.dumps(doc["payload"])) == "debezium"  # a bare payload
    assert sniff(None, orjson.dumps({"payload": doc["payload"], "schema": doc["schema_partial"]})) == "debezium"
    # a tombstone (key only)
    assert sniff((d / "datatype.dbz.key.json").read_bytes(), None) == "debezium"


def test_simple_vectors(vectors):
    recs = _lines(vectors / "simple" / "docs_examples.jsonl")
    assert len(recs) >= 6
    for rec in recs:
        assert sniff(None, orjson.dumps(rec["message"])) == "simple", rec["description"]


def test_avro_confluent_wire_format(vectors):
    # the avro vectors are schemas; a record is magic 0 + 4-byte schema id + Avro binary
    for schema_file in sorted((vectors / "avro").glob("*.avsc")):
        json.loads(schema_file.read_text())
        for schema_id in (1, 7, 2**31 - 1):
            value = b"\x00" + struct.pack(">I", schema_id) + b"\x02\x0c\x00\x00\x80\x3f"
            key = b"\x00" + struct.pack(">I", schema_id + 1) + b"\x02"
            assert sniff(key, value) == "avro", schema_file.name
            assert sniff(None, value) == "avro"
            assert sniff(key, None) == "avro"  # a tombstone with an Avro key
    # TiCDC's avro-enable-watermark side channel (no key)
    assert sniff(None, b"\x02" + struct.pack(">Q", 123456)) == "avro"
    assert sniff(None, b"\x01" + orjson.dumps({"query": "CREATE TABLE t (a int)", "type": 3, "schema": "s",
                                               "table": "t", "commitTs": 1})) == "avro"


def test_encoders_output_sniffs_as_their_protocol():
    cols = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))
    row = RowChange("s", "t", 5, Op.INSERT, None, {"id": 1, "v": "x"}, cols, POS)
    for e in (row, DDL("s", "t", 5, "CREATE TABLE t (id int)", POS, 3)):
        assert sniff(*OE.encode_open(e)) == "open"
        assert sniff(*CE.encode_canal_json(e)) == "canal-json"
        assert sniff(*DE.encode_debezium(e, table_columns=cols)) == "debezium"
        assert sniff(*DE.encode_debezium(e, disable_schema=True, table_columns=cols)) == "debezium"
    assert sniff(*OE.encode_open(Resolved(5, POS))) == "open"
    assert sniff(*CE.encode_canal_json(Resolved(5, POS))) == "canal-json"
    assert sniff(*DE.encode_debezium(Resolved(5, POS), enable_tidb_extension=True)) == "debezium"


@pytest.mark.parametrize("key, value", [
    (None, None), (b"", b""), (None, b"{}"), (None, b"[]"), (None, b"null"), (None, b'{"a":1}'),
    (None, b"\x04\x22\x4d\x18compressed"), (b"\x00" * 8, None), (b"\x00\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x05"),
    (None, b'{"type":"INSERT"}'), (b'{"ts":1}', None), (None, b"\xff\xfe"), (None, b"\x01not json"),
])
def test_noise_sniffs_as_nothing(key, value):
    assert sniff(key, value) is None


def test_describe_mismatch():
    key, value = OE.encode_open(Resolved(5, POS))
    assert describe_mismatch("open", key, value) is None
    text = describe_mismatch("canal-json", key, value)
    assert text is not None and "'canal-json'" in text and "'open'" in text
    assert describe_mismatch("debezium", None, b"garbage") is None  # shape says nothing: no claim


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=80)))
def test_sniff_never_raises(key, value):
    assert sniff(key, value) in (None, "open", "canal-json", "debezium", "simple", "avro")
