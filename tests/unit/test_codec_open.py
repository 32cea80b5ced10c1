"""TiCDC Open Protocol codec: golden vectors, round trips, malformed input, fuzzing."""

from __future__ import annotations

import base64
import datetime as dt
import json
import struct
from decimal import Decimal
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.codecs import Decoder, get_decoder
from applier.codecs import open as O
from applier import mysql_values as T
from applier.devtools.encoders import open as OE
from applier.events import (
    DDL,
    Column,
    DecodeError,
    KafkaMessage,
    Op,
    Resolved,
    RowChange,
    SourcePosition,
)
from tests.unit.helpers import VALUE_STRATEGIES, assert_same_row, kafka_msg, mutate_bytes

POS = SourcePosition("orders", 3, 42)
WHERE = "topic=orders partition=3 offset=42"


msg = kafka_msg


def raw(events: list[tuple[dict, dict | None]]) -> tuple[bytes, bytes]:
    """Frame hand-written key/value JSON objects."""
    return OE.frame_open_batch(
        (orjson.dumps(k), orjson.dumps(v) if v is not None else None) for k, v in events
    )


@pytest.fixture
def dec() -> O.OpenDecoder:
    return get_decoder("open")


def _vector(vectors: Path, kind: str, i: int) -> KafkaMessage:
    key = (vectors / "open" / "key" / f"{kind}_key_{i}").read_bytes()
    value = (vectors / "open" / "value" / f"{kind}_value_{i}").read_bytes()
    return msg(key, value)


# ---------------------------------------------------------------------------------------------------------
# Interface
# ---------------------------------------------------------------------------------------------------------


def test_get_decoder_and_protocol(dec):
    assert isinstance(dec, Decoder)
    assert dec.name == "open"
    assert dec.gated is True
    with pytest.raises(ValueError, match="valid protocols: .*canal-json, .*open"):
        get_decoder("opne")
    with pytest.raises(ValueError, match="strict_values"):
        get_decoder("open", no_such_option=True)


# ---------------------------------------------------------------------------------------------------------
# Golden vectors: raw Kafka bytes from tiflow's examples
# ---------------------------------------------------------------------------------------------------------


def test_vector_ddl_key_0(vectors, dec):
    events = dec.decode(_vector(vectors, "ddl", 0))
    assert events == [DDL(schema="a", table="b", commit_ts=1, query="create table a", position=POS,
                          ddl_type=1, size=events[0].size)]


def test_vector_ddl_key_1_batches_three_ddls(vectors, dec):
    events = dec.decode(_vector(vectors, "ddl", 1))
    assert [type(e) for e in events] == [DDL, DDL, DDL]
    assert [e.commit_ts for e in events] == [1, 2, 3]
    assert [e.query for e in events] == ["create table a", "create table b", "create table c"]
    assert [e.ddl_type for e in events] == [1, 2, 3]
    assert {(e.schema, e.table) for e in events} == {("a", "b")}
    assert all(e.position == POS for e in events)


@pytest.mark.parametrize("kind", ["ddl", "row", "rts"])
def test_vector_empty_batches(vectors, dec, kind):
    # key is just the version header, value is empty: zero events, no error
    assert dec.decode(_vector(vectors, kind, 2)) == []


def test_vector_rts(vectors, dec):
    assert dec.decode(_vector(vectors, "rts", 0)) == [Resolved(ts=1, position=POS)]
    assert dec.decode(_vector(vectors, "rts", 1)) == [Resolved(ts=t, position=POS) for t in (1, 2, 3)]


def test_vector_rows_strict_rejects_string_in_tinyint(vectors, dec):
    # tiflow's Java example declares col1 as type 1 (TINYINT) but sends "aa": not something TiCDC emits.
    # The strict default refuses it and names the column; the lenient mode decodes it like TiCDC's Go decoder.
    with pytest.raises(DecodeError) as ei:
        dec.decode(_vector(vectors, "row", 0))
    assert "col1" in ei.value.reason and "'aa'" in ei.value.reason
    with pytest.raises(DecodeError) as ei:
        dec.decode(_vector(vectors, "row", 1))
    assert "event 1 of 4" in ei.value.reason


def test_vector_rows_lenient(vectors):
    dec = get_decoder("open", strict_values=False)
    (e,) = dec.decode(_vector(vectors, "row", 0))
    assert (e.schema, e.table, e.commit_ts, e.op, e.before, e.after) == ("a", "b", 1, Op.INSERT, None,
                                                                         {"col1": "aa"})
    assert e.columns == (Column(name="col1", type_name="tinyint", nullable=False, type_code=1),)
    events = dec.decode(_vector(vectors, "row", 1))
    assert [(e.schema, e.table, e.commit_ts, e.op, e.after) for e in events] == [
        ("a", "b", 1, Op.INSERT, {"col1": "aa"}),
        ("a", "b", 2, Op.INSERT, {"col1": "bb"}),
        ("a", "b", 3, Op.INSERT, {"col1": "bb"}),
        ("a", "c", 4, Op.INSERT, {"col1": "cc"}),  # the key with "ptn": 6 (partition id is dropped)
    ]


def test_docs_event_stream_reframed(vectors):
    """pingcap/docs' 14-message example stream, framed with the batch framing and decoded."""
    lines = [json.loads(line) for line in (vectors / "open" / "docs_event_stream_example.jsonl").open()]
    assert len(lines) == 14
    dec = get_decoder("open", legacy_base64_strings=True)  # the docs show pre-v4.0.6 base64 varchar
    decoded = {}
    for rec in lines:
        kj = orjson.dumps(rec["key_event"])
        vj = orjson.dumps(rec["value_event"]) if rec["value_event"] is not None else None
        key, value = OE.frame_open_batch([(kj, vj)])
        (e,) = dec.decode(msg(key, value, topic="docs", partition=rec["partition"], offset=rec["log"]))
        assert e.position == SourcePosition("docs", rec["partition"], rec["log"])
        decoded[rec["log"]] = e

    create = "CREATE TABLE test.t1(id int primary key, val varchar(16))"
    for log in (1, 3):
        assert isinstance(decoded[log], DDL)
        assert (decoded[log].schema, decoded[log].table, decoded[log].query, decoded[log].ddl_type,
                decoded[log].commit_ts) == ("test", "t1", create, 3, 415508856908021766)
    for log in (2, 4):
        assert decoded[log] == Resolved(ts=415508856908021766, position=decoded[log].position)
    for log in (13, 14):
        assert isinstance(decoded[log], Resolved) and decoded[log].ts == 415508881038376963

    def row(log):
        e = decoded[log]
        assert isinstance(e, RowChange) and (e.schema, e.table) == ("test", "t1")
        return e.commit_ts, e.op, e.before, e.after

    t1, t2 = 415508878783938562, 415508881418485761
    assert row(5) == (t1, Op.INSERT, None, {"id": 1, "val": "aa"})
    assert row(6) == (t1, Op.INSERT, None, {"id": 2, "val": "bb"})
    assert row(7) == (t1, Op.INSERT, None, {"id": 3, "val": "cc"})
    assert row(8) == row(7)  # duplicate delivery decodes identically
    assert row(9) == (t2, Op.DELETE, {"id": 1}, None)
    assert row(10) == (t2, Op.DELETE, {"id": 2}, None)
    assert row(11) == (t2, Op.INSERT, None, {"id": 3, "val": "dd"})
    assert row(12) == (t2, Op.INSERT, None, {"id": 4, "val": "ee"})
    assert decoded[5].key_columns == ("id",)
    assert decoded[9].key_columns == ("id",)
    assert decoded[5].columns[1] == Column(name="val", type_name="varchar", nullable=False, type_code=15)

    # The same stream as two batched records (one per partition), in log order.
    for partition in (0, 1):
        recs = [r for r in lines if r["partition"] == partition]
        key, value = OE.frame_open_batch(
            (orjson.dumps(r["key_event"]),
             orjson.dumps(r["value_event"]) if r["value_event"] is not None else None) for r in recs
        )
        events = dec.decode(msg(key, value, topic="docs", partition=partition, offset=0))
        assert len(events) == len(recs)
        for r, e in zip(recs, events):
            d = decoded[r["log"]]
            assert type(e) is type(d)
            if isinstance(e, RowChange):
                assert (e.commit_ts, e.op, e.before, e.after) == (d.commit_ts, d.op, d.before, d.after)

    # Every decoded event re-encoded with our encoder (current format) decodes to the same thing.
    current = get_decoder("open")
    for log, e in decoded.items():
        (again,) = current.decode(msg(*OE.encode_open(e), topic="docs", partition=e.position.partition,
                                      offset=log))
        if isinstance(e, RowChange):
            assert (again.commit_ts, again.op, again.before, again.after, again.key_columns) == (
                e.commit_ts, e.op, e.before, e.after, e.key_columns)
        elif isinstance(e, DDL):
            assert (again.schema, again.table, again.query, again.ddl_type, again.commit_ts) == (
                e.schema, e.table, e.query, e.ddl_type, e.commit_ts)
        else:
            assert again == e

    # Without the legacy switch the base64 text is taken literally (current TiCDC sends plain UTF-8).
    key, value = OE.frame_open_batch([(orjson.dumps(lines[4]["key_event"]),
                                      orjson.dumps(lines[4]["value_event"]))])
    (e,) = get_decoder("open").decode(msg(key, value))
    assert e.after == {"id": 1, "val": "YWE="}


# Expected Python value for each example in the docs' type code table.
_TYPE_CODE_EXPECTED = {
    0: Decimal("129012.1230000"),
    1: 1,
    2: 1,
    3: 123,
    4: 153.123,
    5: 153.123,
    6: None,
    7: dt.datetime(1973, 12, 30, 15, 30),
    8: 123,
    9: 123,
    10: dt.date(2000, 1, 1),
    11: dt.timedelta(hours=23, minutes=59, seconds=59),
    12: dt.datetime(2015, 12, 20, 23, 58, 58),
    13: 1970,
    14: dt.date(2000, 1, 1),
    15: "test",
    16: 81,
    245: '{"key1": "value1"}',
    246: Decimal("129012.1230000"),
    247: 1,
    248: 3,
    249: "测试text",
    250: "测试text",
    251: "测试text",
    252: "测试text",
    253: "test",
    254: "test",
}


def test_column_type_code_table(vectors, dec):
    table = json.loads((vectors / "open" / "column_type_codes.json").read_text())
    seen = set()
    for entry in table["column_type_codes"]:
        code = entry["code"]
        if entry["example"] is None:  # GEOMETRY: unsupported
            assert code == O.TYPE_GEOMETRY
            key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1},
                               {"u": {"g": {"t": code, "f": 0, "v": "x"}}})])
            with pytest.raises(DecodeError, match="GEOMETRY"):
                dec.decode(msg(key, value))
            continue
        seen.add(code)
        key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1}, {"u": {"c": entry["example"]}})])
        (e,) = dec.decode(msg(key, value))
        got = e.after["c"]
        assert got == _TYPE_CODE_EXPECTED[code], entry
        assert type(got) is type(_TYPE_CODE_EXPECTED[code]), entry
        assert e.columns[0].type_code == code
        if "example_binary" in entry:  # Go-quoted bytes of a binary CHAR/VARCHAR
            c = dict(entry["example_binary"], f=O.FLAG_BINARY)
            key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1}, {"u": {"c": c}})])
            (e,) = dec.decode(msg(key, value))
            assert e.after["c"] == b"\x89PNG\r\n\x1a\n"
            assert e.columns[0].binary and e.columns[0].type_name in ("varbinary", "binary")
        if 249 <= code <= 252:  # the same base64 with the binary flag: a BLOB
            c = dict(entry["example"], f=O.FLAG_BINARY)
            key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1}, {"u": {"c": c}})])
            (e,) = dec.decode(msg(key, value))
            assert e.after["c"] == "测试text".encode()
            assert e.columns[0].type_name.endswith("blob")
    assert seen == set(_TYPE_CODE_EXPECTED)


def test_column_flag_bits_match_the_docs(vectors, dec):
    table = json.loads((vectors / "open" / "column_type_codes.json").read_text())
    assert {int(k, 16): v for k, v in table["column_flag_bits"].items()} == {
        O.FLAG_BINARY: "BinaryFlag",
        O.FLAG_HANDLE_KEY: "HandleKeyFlag",
        O.FLAG_GENERATED: "GeneratedColumnFlag",
        O.FLAG_PRIMARY_KEY: "PrimaryKeyFlag",
        O.FLAG_UNIQUE_KEY: "UniqueKeyFlag",
        O.FLAG_MULTIPLE_KEY: "MultipleKeyFlag",
        O.FLAG_NULLABLE: "NullableFlag",
        O.FLAG_UNSIGNED: "UnsignedFlag",
    }
    cols = {
        "pk": {"t": 8, "h": True, "f": O.FLAG_HANDLE_KEY | O.FLAG_PRIMARY_KEY, "v": 1},
        "uk": {"t": 3, "f": O.FLAG_UNIQUE_KEY | O.FLAG_NULLABLE, "v": 2},
        "gen": {"t": 3, "f": O.FLAG_GENERATED | O.FLAG_NULLABLE, "v": 3},
        "u": {"t": 8, "f": O.FLAG_UNSIGNED, "v": 4},
        "hk_by_flag_only": {"t": 3, "f": O.FLAG_HANDLE_KEY, "v": 5},
        "bin": {"t": 254, "f": O.FLAG_BINARY, "v": "\\x00"},
    }
    key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1}, {"u": cols})])
    (e,) = dec.decode(msg(key, value))
    c = {col.name: col for col in e.columns}
    assert c["pk"] == Column("pk", "bigint", nullable=False, key=True, unique=True, type_code=8)
    assert c["uk"] == Column("uk", "int", nullable=True, key=False, unique=True, type_code=3)
    assert c["gen"].generated and c["gen"].nullable and not c["gen"].key
    assert c["u"].unsigned and not c["u"].nullable
    assert c["hk_by_flag_only"].key
    assert c["bin"] == Column("bin", "binary", nullable=False, binary=True, type_code=254)
    assert e.key_columns == ("pk", "hk_by_flag_only")
    assert e.after["bin"] == b"\x00"


def test_spark_hands_over_bytearrays(vectors, dec):
    m = _vector(vectors, "ddl", 1)
    events = dec.decode(KafkaMessage("orders", 3, 42, bytearray(m.key), bytearray(m.value)))
    assert [e.query for e in events] == ["create table a", "create table b", "create table c"]


def test_bigint_unsigned_max_is_exact(dec):
    value = b'{"u":{"a":{"t":8,"h":true,"f":139,"v":18446744073709551615},"b":{"t":8,"f":128,"v":9223372036854775808}}}'
    key, value = OE.frame_open_batch([(b'{"ts":5,"scm":"s","tbl":"t","t":1}', value)])
    (e,) = dec.decode(msg(key, value))
    assert e.after == {"a": 18446744073709551615, "b": 2**63}
    assert type(e.after["a"]) is int


def test_update_delete_and_only_updated_columns(dec):
    k = {"ts": 7, "scm": "s", "tbl": "t", "t": 1}
    full = {
        "u": {"id": {"t": 3, "h": True, "f": 11, "v": 1}, "a": {"t": 15, "f": 64, "v": "new"},
              "b": {"t": 3, "f": 64, "v": 5}},
        "p": {"id": {"t": 3, "h": True, "f": 11, "v": 1}, "a": {"t": 15, "f": 64, "v": "old"},
              "b": {"t": 3, "f": 64, "v": 5}},
    }
    only_changed = {"u": full["u"], "p": {"a": {"t": 15, "f": 64, "v": "old"}}}
    delete_key_only = {"d": {"id": {"t": 3, "h": True, "f": 11, "v": 1}}}
    key, value = raw([(k, full), (k, only_changed), (k, delete_key_only)])
    e1, e2, e3 = dec.decode(msg(key, value))
    assert e1.op is Op.UPDATE and e2.op is Op.UPDATE
    assert e1.before == e2.before == {"id": 1, "a": "old", "b": 5}
    assert e1.after == e2.after == {"id": 1, "a": "new", "b": 5}
    assert e3.op is Op.DELETE and e3.before == {"id": 1} and e3.after is None
    assert e3.key_columns == ("id",)
    assert all(e.commit_ts == 7 and e.position == POS for e in (e1, e2, e3))


def test_handle_key_only_and_claim_check(dec):
    k = {"ts": 1, "scm": "s", "tbl": "t", "t": 1, "ohk": True}
    cols = {"id": {"t": 3, "h": True, "f": 11, "v": 1}}
    key, value = raw([(k, {"d": cols})])
    (e,) = dec.decode(msg(key, value))  # a key-only delete is complete
    assert e.op is Op.DELETE and e.before == {"id": 1}
    key, value = raw([(k, {"u": cols})])
    with pytest.raises(DecodeError, match="handle-key-only"):
        dec.decode(msg(key, value))
    key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1, "ohk": False, "ccl": "s3://b/f"},
                       {"u": cols})])
    with pytest.raises(DecodeError, match="claim-check"):
        dec.decode(msg(key, value))


# ---------------------------------------------------------------------------------------------------------
# Go string quoting (binary CHAR/VARCHAR)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, quoted",
    [
        (b"\x89PNG\r\n\x1a\n", "\\x89PNG\\r\\n\\x1a\\n"),  # the docs' example
        (b"plain", "plain"),
        (b'a"b\\c', 'a\\"b\\\\c'),
        (b"\x00\x07\x08\x0c\x0b\t\x7f", "\\x00\\a\\b\\f\\v\\t\\x7f"),
        ("测试".encode(), "测试"),
        ("\u00a0".encode(), "\\u00a0"),  # non-printable per Go's IsPrint
        ("\u200b".encode(), "\\u200b"),
        ("😀".encode(), "😀"),
        ("\U000e0001".encode(), "\\U000e0001"),
        (b"\xff\xfe", "\\xff\\xfe"),  # invalid UTF-8: byte escapes
        (b"\xe6\xb5", "\\xe6\\xb5"),  # truncated UTF-8 sequence
    ],
)
def test_go_quote_matches_go(data, quoted):
    assert OE.go_quote(data) == quoted
    assert O.go_unquote(quoted) == data


def test_go_unquote_accepts_all_go_escapes():
    assert O.go_unquote("\\101\\u00e9\\U0001F600") == b"A" + "é😀".encode()
    for bad in ("\\", "\\x4", "\\xzz", "\\q", "\\ud800", "\\U00110000", "\\400"):
        with pytest.raises(ValueError):
            O.go_unquote(bad)


@given(st.binary(max_size=64))
def test_go_quote_round_trip(data):
    assert O.go_unquote(OE.go_quote(data)) == data


# ---------------------------------------------------------------------------------------------------------
# Encoder -> decoder round trips
# ---------------------------------------------------------------------------------------------------------

_TYPES = sorted(VALUE_STRATEGIES)


def _columns(specs):
    return tuple(
        Column(name=f"c{i}", type_name=name, nullable=True, unsigned=unsigned,
               binary=name in T.BINARY_TYPES)
        for i, (name, unsigned) in enumerate(specs)
    )


@st.composite
def row_changes(draw, op=None):
    specs = draw(st.lists(st.sampled_from(_TYPES), min_size=1, max_size=6))
    cols = (Column(name="id", type_name="bigint", nullable=False, key=True, unique=True),) + _columns(specs)

    def image():
        img = {"id": draw(st.integers(-(2**63), 2**63 - 1))}
        for col, spec in zip(cols[1:], specs):
            img[col.name] = draw(st.none() | VALUE_STRATEGIES[spec])
        return img

    op = op or draw(st.sampled_from([Op.INSERT, Op.UPDATE, Op.DELETE]))
    before = image() if op is not Op.INSERT else None
    after = image() if op is not Op.DELETE else None
    return RowChange(schema=draw(st.sampled_from(["db", "测试库", "a<b>&c"])), table="t",
                     commit_ts=draw(st.integers(1, 2**64 - 1)), op=op, before=before, after=after,
                     columns=cols, position=POS)




@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(row_changes(), min_size=1, max_size=4))
def test_round_trip_rows(events):
    key, value = OE.encode_open_batch(events)
    got = get_decoder("open").decode(msg(key, value))
    assert len(got) == len(events)
    for g, w in zip(got, events):
        assert_same_row(g, w)


@pytest.mark.parametrize("spec", _TYPES, ids=[f"{n}{' unsigned' if u else ''}" for n, u in _TYPES])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_round_trip_every_type(spec, data):
    cols = (Column(name="id", type_name="int", nullable=False, key=True, unique=True),) + _columns([spec])
    v = data.draw(VALUE_STRATEGIES[spec])
    e = RowChange(schema="s", table="t", commit_ts=9, op=Op.INSERT, before=None, after={"id": 1, "c0": v},
                  columns=cols, position=POS)
    (got,) = get_decoder("open").decode(msg(*OE.encode_open(e)))
    assert_same_row(got, e)


def test_round_trip_mixed_batch_and_encoder_shape():
    cols = (Column("id", "int", nullable=False, key=True, unique=True), Column("v", "varbinary", binary=True))
    row = RowChange(schema="s", table="t", commit_ts=10, op=Op.UPDATE, before={"id": 1, "v": b"\x00"},
                    after={"id": 1, "v": b"\xff"}, columns=cols, position=POS)
    ddl = DDL(schema="s", table="t", commit_ts=11, query="ALTER TABLE t ADD c INT", position=POS, ddl_type=5)
    res = Resolved(ts=12, position=POS)
    key, value = OE.encode_open_batch([row, ddl, res])
    assert key[:8] == b"\x00" * 7 + b"\x01"
    got = get_decoder("open").decode(msg(key, value))
    assert got[0].before == {"id": 1, "v": b"\x00"} and got[0].after == {"id": 1, "v": b"\xff"}
    assert got[1] == DDL(schema="s", table="t", commit_ts=11, query="ALTER TABLE t ADD c INT", position=POS,
                         ddl_type=5, size=got[1].size)
    assert got[2] == res
    # JSON shape as TiCDC writes it
    spans = O._split_frames(key, 8, "key")
    assert orjson.loads(key[spans[0][0]:spans[0][0] + spans[0][1]]) == {"ts": 10, "scm": "s", "tbl": "t", "t": 1}
    vspans = O._split_frames(value, 0, "value")
    v0 = orjson.loads(value[vspans[0][0]:vspans[0][0] + vspans[0][1]])
    assert v0 == {"u": {"id": {"t": 3, "h": True, "f": 10, "v": 1}, "v": {"t": 15, "f": 65, "v": "\\xff"}},
                  "p": {"id": {"t": 3, "h": True, "f": 10, "v": 1}, "v": {"t": 15, "f": 65, "v": "\\x00"}}}
    assert vspans[2][1] == 0  # resolved: zero-length value
    # Go's encoding/json escapes HTML characters
    key, _ = OE.encode_open(DDL(schema="a<b", table="", commit_ts=1, query="", position=POS))
    assert b"a\\u003cb" in key


def test_encoder_value_formats():
    assert OE.encode_value(O.TYPE_FLOAT, 0, T.float32(3.14)) == 3.14
    assert OE.encode_value(O.TYPE_NEWDECIMAL, 0, Decimal("1.50")) == "1.50"
    assert OE.encode_value(O.TYPE_DATETIME, 0, dt.datetime(2020, 1, 2, 3, 4, 5, 6)) == "2020-01-02 03:04:05.000006"
    assert OE.encode_value(O.TYPE_DURATION, 0, -dt.timedelta(hours=30)) == "-30:00:00"
    assert OE.encode_value(O.TYPE_BLOB, 0, "测试text") == "5rWL6K+VdGV4dA=="  # the docs' base64 example
    assert OE.encode_value(O.TYPE_STRING, O.FLAG_BINARY, b"\x89PNG\r\n\x1a\n") == "\\x89PNG\\r\\n\\x1a\\n"
    assert OE.encode_value(O.TYPE_BIT, 0, b"\x01\x00") == 256
    with pytest.raises(ValueError):
        OE.encode_value(O.TYPE_ENUM, 0, "a")


# ---------------------------------------------------------------------------------------------------------
# Malformed input: every failure is a DecodeError naming topic/partition/offset
# ---------------------------------------------------------------------------------------------------------

_K = b'{"ts":1,"scm":"s","tbl":"t","t":1}'
_V = b'{"u":{"id":{"t":3,"h":true,"f":11,"v":1}}}'
_U = struct.Struct(">Q")


def _frame(*parts: bytes) -> bytes:
    return b"".join(_U.pack(len(p)) + p for p in parts)


_MALFORMED = {
    "no key": (None, _frame(_V), "no key"),
    "short key": (b"\x00\x00\x01", _frame(_V), "shorter than the 8-byte version header"),
    "wrong version": (_U.pack(2) + _frame(_K), _frame(_V), "version 2"),
    "truncated key length": (_U.pack(1) + _frame(_K) + b"\x00\x00\x00", _frame(_V, _V), "truncated length"),
    "truncated value length": (_U.pack(1) + _frame(_K), _frame(_V) + b"\x00", "truncated length"),
    "key length past end": (_U.pack(1) + _U.pack(1000) + _K, _frame(_V), "runs past the end"),
    "value length past end": (_U.pack(1) + _frame(_K), _U.pack(len(_V) + 1) + _V, "runs past the end"),
    "invalid key JSON": (_U.pack(1) + _frame(b'{"ts":1,'), _frame(_V), "not valid JSON"),
    "invalid value JSON": (_U.pack(1) + _frame(_K), _frame(b'{"u":'), "not valid JSON"),
    "key not an object": (_U.pack(1) + _frame(b"[1]"), _frame(_V), "expected an object"),
    "unknown event type": (_U.pack(1) + _frame(b'{"ts":1,"t":9}'), _frame(b""), "unknown event type"),
    "missing ts": (_U.pack(1) + _frame(b'{"t":1}'), _frame(_V), "commit ts"),
    "negative ts": (_U.pack(1) + _frame(b'{"ts":-1,"t":3}'), _frame(b""), "commit ts"),
    "unknown column type code": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"c":{"t":99,"f":0,"v":1}}}'),
                                 "unknown column type code 99"),
    "key/value count mismatch": (_U.pack(1) + _frame(_K, _K), _frame(_V), "2 events but value holds 1"),
    "value without key": (_U.pack(1), _frame(_V), "0 events but value holds 1"),
    "empty row value": (_U.pack(1) + _frame(_K), _frame(b""), "empty value"),
    "row without u or d": (_U.pack(1) + _frame(_K), _frame(b'{"x":{}}'), "neither"),
    "both u and d": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"t":3,"f":0,"v":1}},"d":{"a":{"t":3,"f":0,"v":1}}}'),
                     "both"),
    "empty image": (_U.pack(1) + _frame(_K), _frame(b'{"u":{}}'), "no columns"),
    "column not an object": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":5}}'), "expected an object"),
    "column without t": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"v":5}}}'), "expected an object"),
    "bad flags": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"t":3,"f":"x","v":5}}}'), "flags"),
    "bad base64": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"t":252,"f":1,"v":"!!"}}}'), "base64"),
    "bad go escape": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"t":15,"f":1,"v":"\\\\q"}}}'), "escape"),
    "bad datetime": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"t":12,"f":0,"v":"2020-13-01 00:00:00"}}}'),
                     "'a'"),
    "bool as int": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"t":3,"f":0,"v":true}}}'), "integer"),
    "float beyond 2**53 as int": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"t":8,"f":0,"v":1e300}}}'),
                                  "integer"),
    "ddl without query": (_U.pack(1) + _frame(b'{"ts":1,"scm":"s","t":2}'), _frame(b'{"t":3}'), "query"),
    "text not utf-8": (_U.pack(1) + _frame(_K),
                       _frame(b'{"u":{"a":{"t":252,"f":0,"v":"' + base64.b64encode(b"\xff") + b'"}}}'), "UTF-8"),
    "lone surrogate": (_U.pack(1) + _frame(_K), _frame(b'{"u":{"a":{"t":15,"f":1,"v":"\\ud800"}}}'), ""),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_malformed_input_raises_decode_error(case, dec):
    key, value, reason = _MALFORMED[case]
    with pytest.raises(DecodeError) as ei:
        dec.decode(msg(key, value))
    err = ei.value
    assert err.position == POS
    assert err.protocol == "open"
    assert WHERE in str(err)
    assert reason in err.reason, err.reason


# ---------------------------------------------------------------------------------------------------------
# Fuzzing: nothing but DecodeError ever escapes
# ---------------------------------------------------------------------------------------------------------

_FUZZ_DECODERS = [get_decoder("open"), get_decoder("open", strict_values=False),
                  get_decoder("open", legacy_base64_strings=True)]


def _decode_only_decode_errors(key, value):
    for d in _FUZZ_DECODERS:
        try:
            events = d.decode(msg(key, value))
        except DecodeError as e:
            assert e.position == POS and e.protocol == "open"
        else:
            assert isinstance(events, list)


@settings(max_examples=2000, deadline=None)
@given(st.one_of(st.none(), st.binary(max_size=80)), st.one_of(st.none(), st.binary(max_size=80)),
       st.booleans())
def test_fuzz_random_bytes(key, value, with_header):
    if with_header and key is not None:
        key = _U.pack(1) + key
    _decode_only_decode_errors(key, value)


def _seed_messages() -> list[tuple[bytes, bytes]]:
    cols = (Column("id", "bigint", nullable=False, key=True, unique=True), Column("s", "varchar"),
            Column("b", "varbinary", binary=True), Column("d", "decimal"), Column("t", "datetime"),
            Column("x", "text"), Column("u", "bigint", unsigned=True))
    vals = {"id": 1, "s": "测试", "b": b"\x00\xff", "d": Decimal("1.50"), "t": dt.datetime(2020, 1, 1, 1, 1, 1, 5),
            "x": "hello", "u": 2**64 - 1}
    ins = RowChange("s", "t", 5, Op.INSERT, None, vals, cols, POS)
    upd = RowChange("s", "t", 6, Op.UPDATE, dict(vals, s="old"), vals, cols, POS)
    dele = RowChange("s", "t", 7, Op.DELETE, {"id": 1}, None, cols, POS)
    return [
        OE.encode_open_batch([ins, upd, dele]),
        OE.encode_open(DDL("s", "t", 8, "CREATE TABLE t (id int)", POS, 3)),
        OE.encode_open_batch([Resolved(9, POS), Resolved(10, POS)]),
    ]


_SEEDS = _seed_messages()


@st.composite
def mutated(draw):
    key, value = draw(st.sampled_from(_SEEDS))
    which = draw(st.sampled_from(["key", "value", "both"]))
    out = []
    for part, target in ((key, "key"), (value, "value")):
        buf = part
        if which in (target, "both"):
            buf = mutate_bytes(draw, part, steps=(1, 4), special=b'{}[]":,0123456789tfn\\\x00\xff', dup=True)
        out.append(bytes(buf))
    return out[0], out[1]


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutated_valid_messages(kv):
    _decode_only_decode_errors(*kv)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([1, 2, 3, 0, 7]), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["t", "f", "h", "v", "u", "p", "d", "q", "c"]), inner, max_size=4),
    max_leaves=12))
def test_fuzz_structured_json(t, value_obj):
    """Well-framed messages whose JSON is random but shaped like the protocol."""
    key, value = OE.frame_open_batch([(orjson.dumps({"ts": 1, "scm": "s", "tbl": "t", "t": t}),
                                      json.dumps(value_obj).encode())])  # big ints, NaN: all fair game
    _decode_only_decode_errors(key, value)


# ---------------------------------------------------------------------------------------------------------
# Changefeed variants: old value off, only-updated columns, handle-key-only deletes; type code pairs
# ---------------------------------------------------------------------------------------------------------

_VCOLS = (Column("id", "int", nullable=False, key=True, unique=True), Column("name", "varchar"),
          Column("bin", "varbinary", binary=True), Column("n", "bigint", unsigned=True))
_VOLD = {"id": 1, "name": "old", "bin": b"\x00\xff", "n": 2**64 - 1}
_VNEW = {"id": 1, "name": "new", "bin": b"\x00\xff", "n": 2**64 - 1}


def _values(value: bytes) -> list[dict]:
    return [orjson.loads(value[o : o + n]) for o, n in O._split_frames(value, 0, "value")]


def test_variant_old_value_off(dec):
    """enable-old-value=false: updates carry no "p" and decode as inserts (applied as upserts)."""
    upd = RowChange("s", "t", 5, Op.UPDATE, _VOLD, _VNEW, _VCOLS, POS)
    key, value = OE.encode_open(upd, output_old_value=False)
    (v,) = _values(value)
    assert set(v) == {"u"}
    (e,) = dec.decode(msg(key, value))
    assert (e.op, e.before, e.after, e.commit_ts) == (Op.INSERT, None, _VNEW, 5)
    assert e.key_columns == ("id",)
    # deletes are unaffected by the old value switch: "d" holds the whole old row
    key, value = OE.encode_open(RowChange("s", "t", 6, Op.DELETE, _VOLD, None, _VCOLS, POS), output_old_value=False)
    (e,) = dec.decode(msg(key, value))
    assert (e.op, e.before, e.after) == (Op.DELETE, _VOLD, None)
    # with old value on (the default) the same update is an UPDATE with the full old row
    (e,) = dec.decode(msg(*OE.encode_open(upd)))
    assert (e.op, e.before, e.after) == (Op.UPDATE, _VOLD, _VNEW)


def test_variant_delete_only_handle_key(dec):
    dele = RowChange("s", "t", 6, Op.DELETE, _VOLD, None, _VCOLS, POS)
    key, value = OE.encode_open(dele, delete_only_handle_key=True)
    (v,) = _values(value)
    assert v == {"d": {"id": {"t": O.TYPE_LONG, "h": True, "f": O.FLAG_HANDLE_KEY | O.FLAG_PRIMARY_KEY, "v": 1}}}
    (e,) = dec.decode(msg(key, value))
    assert (e.op, e.before, e.after) == (Op.DELETE, {"id": 1}, None)
    assert e.columns == (Column("id", "int", nullable=False, key=True, unique=True, type_code=O.TYPE_LONG),)
    with pytest.raises(ValueError, match="no handle-key column"):
        OE.encode_open(RowChange("s", "t", 6, Op.DELETE, {"name": "x"}, None, _VCOLS[1:2], POS),
                      delete_only_handle_key=True)


def test_variant_only_output_updated_columns(dec):
    upd = RowChange("s", "t", 5, Op.UPDATE, _VOLD, _VNEW, _VCOLS, POS)
    key, value = OE.encode_open(upd, only_output_updated_columns=True)
    (v,) = _values(value)
    assert list(v["p"]) == ["name"] and list(v["u"]) == ["id", "name", "bin", "n"]
    (e,) = dec.decode(msg(key, value))
    assert (e.op, e.before, e.after) == (Op.UPDATE, _VOLD, _VNEW)
    # nothing changed: "p" is empty and Go's omitempty drops it, so the message reads as an insert (upsert)
    key, value = OE.encode_open(RowChange("s", "t", 5, Op.UPDATE, dict(_VNEW), _VNEW, _VCOLS, POS),
                               only_output_updated_columns=True)
    assert set(_values(value)[0]) == {"u"}
    (e,) = dec.decode(msg(key, value))
    assert (e.op, e.after) == (Op.INSERT, _VNEW)


@pytest.mark.parametrize("code", [O.TYPE_DATE, O.TYPE_NEWDATE])
def test_date_type_codes_10_and_14(code, dec):
    key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1},
                       {"u": {"d": {"t": code, "f": 64, "v": "2000-01-01"},
                              "z": {"t": code, "f": 64, "v": "0000-00-00"},
                              "n": {"t": code, "f": 64, "v": None}}})])
    (e,) = dec.decode(msg(key, value))
    assert e.after == {"d": dt.date(2000, 1, 1), "z": "0000-00-00", "n": None}
    assert [(c.type_name, c.type_code) for c in e.columns] == [("date", code)] * 3
    with pytest.raises(DecodeError, match="'d'"):
        dec.decode(msg(*raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1},
                              {"u": {"d": {"t": code, "f": 0, "v": "2000-02-30"}}})])))


@pytest.mark.parametrize("code", [O.TYPE_VARCHAR, O.TYPE_VAR_STRING, O.TYPE_STRING])
def test_string_type_codes_and_binary_escaping(code, dec):
    """15 VARCHAR / 253 VAR_STRING / 254 CHAR: plain UTF-8 text, or Go-quoted bytes with the binary flag."""
    every_byte = bytes(range(256))
    quoted = OE.go_quote(every_byte)
    # Go's strconv.Quote: printable ASCII as is, \a \b \f \n \r \t \v \\ \" named, other bytes \xNN
    assert quoted.startswith("\\x00\\x01\\x02\\x03\\x04\\x05\\x06\\a\\b\\t\\n\\v\\f\\r\\x0e")
    assert ' !\\"#$%' in quoted and "[\\\\]" in quoted and "}~\\x7f\\x80\\x81" in quoted and quoted.endswith("\\xff")
    cols = {"txt": {"t": code, "f": 64, "v": "测试 \\x00 \"q\""},
            "bin": {"t": code, "f": 65, "v": quoted},
            "png": {"t": code, "f": 1, "v": "\\x89PNG\\r\\n\\x1a\\n"},
            "utf": {"t": code, "f": 1, "v": "测试"}}
    key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1}, {"u": cols})])
    (e,) = dec.decode(msg(key, value))
    assert e.after == {"txt": "测试 \\x00 \"q\"", "bin": every_byte, "png": b"\x89PNG\r\n\x1a\n",
                       "utf": "测试".encode()}
    names = {c.name: c.type_name for c in e.columns}
    text_name, bin_name = ("char", "binary") if code == O.TYPE_STRING else ("varchar", "varbinary")
    assert names == {"txt": text_name, "bin": bin_name, "png": bin_name, "utf": bin_name}
    # and the encoder writes exactly that escaping
    col = Column("bin", bin_name, binary=True)
    assert OE.encode_value(OE.column_type_code(col), OE.column_flags(col), every_byte) == quoted


def test_every_documented_type_code_round_trips_through_the_encoder(vectors):
    """Each type code of column_type_codes.json: decode the docs example, re-encode it, decode it again."""
    table = json.loads((vectors / "open" / "column_type_codes.json").read_text())
    dec = get_decoder("open")
    codes = set()
    for entry in table["column_type_codes"]:
        if entry["example"] is None:
            continue
        for example, flags in ((entry["example"], 64), (entry.get("example_binary"), 65)):
            if example is None:
                continue
            key, value = raw([({"ts": 1, "scm": "s", "tbl": "t", "t": 1},
                               {"u": {"c": dict(example, f=flags)}})])
            (e,) = dec.decode(msg(key, value))
            (again,) = dec.decode(msg(*OE.encode_open(e)))
            assert again.after == e.after, entry
            assert again.columns[0].type_name == e.columns[0].type_name
            codes.add(entry["code"])
    assert codes == set(_TYPE_CODE_EXPECTED)
