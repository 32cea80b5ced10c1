"""TiCDC's large-message variants (issue 14, point 4) for Open Protocol, Canal-JSON and Simple (JSON and Avro):
claim-check messages read from file:// and s3:// storage (a moto S3 server this module starts and stops),
handle-key-only messages completed from an upstream (a stand-in object here; the real reader against a real TiDB is in
tests/e2e/test_large_messages.py), large-message-handle-compression (snappy, lz4), and every bad input as a
DecodeError naming the message's position and table.

The messages are built by the test encoders (applier/devtools/encoders: open, canal_json, simple, largemsg) in
TiCDC's layouts, as docs/large-messages.md describes them."""

from __future__ import annotations

import datetime as dt
import os
import pickle
import socket
from decimal import Decimal
from pathlib import Path

import orjson
import pytest

from applier.codecs import get_decoder
from applier.codecs import largemsg as LM
from applier.codecs.base import Malformed
from applier.codecs.largemsg import UpstreamColumn, UpstreamRow
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.devtools.encoders.largemsg import ClaimCheckStorage, LargeMessage, compress
from applier.devtools.encoders.open import encode_open, encode_open_batch
from applier.devtools.encoders.simple import encode_simple
from applier.events import DDL, Column, DecodeError, KafkaMessage, Op, Resolved, RowChange, SourcePosition, TableSchema

TOPIC, PARTITION, OFFSET = "lm", 2, 7
WHERE = f"topic={TOPIC} partition={PARTITION} offset={OFFSET}"
POS = SourcePosition(TOPIC, PARTITION, OFFSET)
SCHEMA, TABLE = "shop", "docs"
TS = 449_000_000_000_000_000
VERSION = 448_000_000_000_000_000

COLS = (
    Column("id", "int", nullable=False, key=True),
    Column("note", "text"),
    Column("amount", "decimal"),
    Column("body", "blob", binary=True),
    Column("kind", "enum"),
    Column("flags", "bit"),
    Column("at", "datetime"),
    Column("ratio", "double"),
    Column("big", "bigint", unsigned=True),
    Column("tag", "varbinary", binary=True),
)
ROW = {"id": 1, "note": "héllo ☃ " + "x" * 200, "amount": Decimal("1234.50"), "body": b"\x00\xff\x10" * 50,
       "kind": 2, "flags": 5, "at": dt.datetime(2024, 1, 2, 3, 4, 5, 123456), "ratio": 0.25, "big": 2**64 - 1,
       "tag": b"\x00A\""}
ROW2 = dict(ROW, note="changed", amount=Decimal("7.00"), body=b"\x01", flags=0, tag=b"z")
TABLE_SCHEMA = TableSchema(SCHEMA, TABLE, VERSION, COLS)

PROTOCOLS = ["open", "canal-json", "simple", "simple-avro"]


def upstream_row(row: dict) -> UpstreamRow:
    """``row`` as the upstream reader hands it over: MySQL's text, bytes for binary columns, ENUM/SET/BIT as the
    text of their number (tests/e2e/test_large_messages.py checks the real reader against TiDB gives this)."""
    spec = {"id": ("int", "int(11)", "PRI"), "note": ("text", "text", ""), "amount": ("decimal", "decimal(10,2)", ""),
            "body": ("blob", "blob", ""), "kind": ("enum", "enum('a','b','c')", ""), "flags": ("bit", "bit(5)", ""),
            "at": ("datetime", "datetime(6)", ""), "ratio": ("double", "double", ""),
            "big": ("bigint", "bigint(20) unsigned", ""), "tag": ("varbinary", "varbinary(16)", "")}
    cols = tuple(UpstreamColumn(n, t, ct, n != "id", "unsigned" in ct, t in ("blob", "varbinary"), False, k)
                 for n, (t, ct, k) in spec.items())

    def text(name, v):
        if v is None or isinstance(v, bytes):
            return v
        if isinstance(v, dt.datetime):
            return v.strftime("%Y-%m-%d %H:%M:%S.%f")
        return str(v)

    return UpstreamRow(cols, {n: text(n, row[n]) for n in spec})


class FakeUpstream:
    """Stands in for applier.codecs.largemsg.Upstream: rows by (ts, id), and every call recorded."""

    def __init__(self, rows: dict[tuple[int, int], dict]) -> None:
        self.rows = rows
        self.calls: list[tuple[str, str, int, dict]] = []

    def describe(self) -> str:
        return "mysql+pymysql://cdc:***@tidb:4000/"

    def fetch(self, schema, table, ts, key, what):
        self.calls.append((schema, table, ts, dict(key)))
        row = self.rows.get((ts, key["id"]))
        if row is None:
            raise Malformed(f"{what} of `{schema}`.`{table}`: the upstream has no row with key {key} as of ts {ts}")
        return upstream_row(row)


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch):
    monkeypatch.setattr(LM, "RETRY_ATTEMPTS", 3)
    monkeypatch.setattr(LM, "RETRY_WAIT_MAX", 0.01)


@pytest.fixture
def cc_dir(tmp_path) -> Path:
    d = tmp_path / "claim-check"
    d.mkdir()
    return d


def ev(op: Op, before=None, after=None, ts: int = TS) -> RowChange:
    return RowChange(SCHEMA, TABLE, ts, op, before, after, COLS, POS)


def kmsg(key, value, offset: int = OFFSET) -> KafkaMessage:
    return KafkaMessage(TOPIC, PARTITION, offset, key, value)


def encode(protocol: str, event, **kw) -> KafkaMessage:
    """One event as ``protocol`` sends it (``kw``: compression, large_message)."""
    if protocol == "open":
        return kmsg(*encode_open(event, **kw))
    if protocol == "canal-json":
        return kmsg(*encode_canal_json(event, build_ts_ms=1, **kw))
    fmt = "avro" if protocol == "simple-avro" else "json"
    return kmsg(*encode_simple(event, encoding_format=fmt, table_schema=TABLE_SCHEMA, build_ts_ms=1, **kw))


def decoder(protocol: str, **options):
    """A decoder for ``protocol``; Simple ones have the table's schema already (a BOOTSTRAP)."""
    name = "simple" if protocol.startswith("simple") else protocol
    if protocol == "simple-avro":
        options["encoding_format"] = "avro"
    dec = get_decoder(name, **options)
    if name == "simple":
        comp = options.get("large_message_handle_compression", "none")
        boot = encode_simple(TABLE_SCHEMA, encoding_format=options.get("encoding_format", "json"), build_ts_ms=1,
                             compression=comp)
        assert dec.decode(kmsg(*boot, offset=0))
    return dec


def claim_check(cc_dir: Path, *, raw: bool = False, names=None) -> LargeMessage:
    return LargeMessage("claim-check", ClaimCheckStorage(f"file://{cc_dir}", raw_value=raw, names=names),
                        is_large=lambda e: True)


def decode_one(dec, msg):
    out = dec.decode(msg)
    assert len(out) == 1, out
    return out[0]


def bad(dec, msg, *patterns: str) -> DecodeError:
    with pytest.raises(DecodeError) as ei:
        dec.decode(msg)
    text = str(ei.value)
    assert WHERE in text, text
    for p in patterns:
        assert p in text, f"{p!r} not in {text!r}"
    return ei.value


# ---------------------------------------------------------------------------------------------------------
# claim-check
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["none", "snappy", "lz4"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_claim_check_rows_decode_as_the_full_message(protocol, compression, cc_dir):
    """Insert, update and delete sent as claim-check messages decode to exactly what the full messages decode to;
    the Kafka message itself holds only the handle key and the location."""
    dec = decoder(protocol, claim_check_uri=f"file://{cc_dir}", large_message_handle_compression=compression)
    full = decoder(protocol, large_message_handle_compression=compression)
    for event in (ev(Op.INSERT, None, ROW), ev(Op.UPDATE, ROW, ROW2), ev(Op.DELETE, ROW2, None)):
        lm = claim_check(cc_dir)
        small = encode(protocol, event, compression=compression, large_message=lm)
        assert lm.sent == [event] and len(lm.claim_check.written) == 1
        assert b"x" * 200 not in small.value and b"x" * 200 not in compress("none", small.key or b"")
        got = decode_one(dec, small)
        want = decode_one(full, encode(protocol, event, compression=compression))
        assert (got.op, got.before, got.after, got.commit_ts, got.position) == \
            (want.op, want.before, want.after, want.commit_ts, want.position)
        assert got.key_columns == ("id",)


@pytest.mark.parametrize("protocol", ["canal-json", "simple", "simple-avro"])
def test_claim_check_raw_value(protocol, cc_dir):
    """claim-check-raw-value: the file holds the bare (compressed) value; read with claim_check_raw_value."""
    lm = claim_check(cc_dir, raw=True)
    small = encode(protocol, ev(Op.INSERT, None, ROW), compression="lz4", large_message=lm)
    raw = Path(lm.claim_check.written[0][len("file://"):]).read_bytes()
    assert not raw.startswith(b'{"key"')
    dec = decoder(protocol, claim_check_uri=str(cc_dir), claim_check_raw_value=True,
                  large_message_handle_compression="lz4")
    assert decode_one(dec, small).after == ROW
    # the same file read as TiCDC's JSON layout is refused with the hint
    bad(decoder(protocol, claim_check_uri=str(cc_dir), large_message_handle_compression="lz4"), small,
        "claim_check_raw_value", "`shop`.`docs`")


def test_open_has_no_raw_value_option():
    with pytest.raises(ValueError, match="claim_check_raw_value"):
        get_decoder("open", claim_check_raw_value=True)


def test_open_batch_mixes_claim_check_and_plain_rows(cc_dir):
    """TiCDC batches a claim-check event like any other: the other rows of the batch decode as usual."""
    other = RowChange(SCHEMA, TABLE, TS, Op.INSERT, None, dict(ROW, id=2), COLS, POS)
    lm = LargeMessage("claim-check", ClaimCheckStorage(str(cc_dir)), is_large=lambda e: e.after["id"] == 1)
    key, value = encode_open_batch([ev(Op.INSERT, None, ROW), other], compression="snappy", large_message=lm)
    evs = get_decoder("open", claim_check_uri=str(cc_dir), large_message_handle_compression="snappy") \
        .decode(kmsg(key, value))
    assert [e.after for e in evs] == [ROW, dict(ROW, id=2)]


def test_open_claim_check_key_layout(cc_dir):
    """ticdc's key carries "ohk":true,"ohk":false,"ccl":<uri>/<uuid>.json after t (its key writer appends both
    "ohk" fields); tiflow's has no "ohk" at all. Both read. The file holds the framed key and value (base64 in Go's
    JSON)."""
    lm = claim_check(cc_dir, names=iter(["f1.json"]))
    key, value = encode_open(ev(Op.INSERT, None, ROW), large_message=lm)
    kj = key[16:]
    assert kj.endswith(b'"t":1,"ohk":true,"ohk":false,"ccl":"file://' + str(cc_dir).encode() + b'/f1.json"}')
    k = orjson.loads(kj)
    assert k["ohk"] is False and k["ccl"] == f"file://{cc_dir}/f1.json"
    assert list(orjson.loads(value[8:])["u"]) == ["id"]
    dec = get_decoder("open", claim_check_uri=str(cc_dir))
    assert decode_one(dec, kmsg(key, value)).after == ROW
    tiflow = kj.replace(b',"ohk":true,"ohk":false', b"")
    tkey = (1).to_bytes(8, "big") + len(tiflow).to_bytes(8, "big") + tiflow
    assert decode_one(dec, kmsg(tkey, value)).after == ROW
    stored = orjson.loads((cc_dir / "f1.json").read_bytes())
    assert list(stored) == ["key", "value"]
    import base64
    assert base64.b64decode(stored["key"])[:8] == (1).to_bytes(8, "big")


def test_canal_and_simple_claim_check_fields(cc_dir):
    lm = claim_check(cc_dir, names=iter(["a.json", "b.json"]))
    c = orjson.loads(encode("canal-json", ev(Op.INSERT, None, ROW), large_message=lm).value)
    assert c["_tidb"] == {"commitTs": TS, "claimCheckLocation": f"file://{cc_dir}/a.json"}
    assert c["data"] == [{"id": "1"}] and c["mysqlType"] == {"id": "int"}
    s = orjson.loads(encode("simple", ev(Op.UPDATE, ROW, ROW2), large_message=lm).value)
    assert s["claimCheckLocation"] == f"file://{cc_dir}/b.json" and s["handleKeyOnly"] is True
    assert s["data"] == {"id": "1"} and s["old"] == {"id": "1"}
    assert orjson.loads((cc_dir / "a.json").read_bytes())["key"] is None


def test_simple_claim_check_message_held_until_its_schema_arrives(cc_dir):
    """A claim-check DML of a table whose schema is not known yet is held (nothing is read), then completed from
    its file when the BOOTSTRAP arrives."""
    dec = get_decoder("simple", claim_check_uri=str(cc_dir))
    small = encode("simple", ev(Op.INSERT, None, ROW), large_message=claim_check(cc_dir))
    assert dec.decode(small) == []
    assert dec.held_offsets() == {(TOPIC, PARTITION): OFFSET}
    out = dec.decode(kmsg(*encode_simple(TABLE_SCHEMA, build_ts_ms=1), offset=OFFSET + 1))
    assert [type(e).__name__ for e in out] == ["TableSchema", "RowChange"] and out[1].after == ROW


def test_claim_check_location_prefix_reads_a_relocated_folder(cc_dir):
    """TiCDC wrote to file:///mnt/cdc/cc; this host mounts the folder elsewhere."""
    lm = LargeMessage("claim-check", ClaimCheckStorage(str(cc_dir)), is_large=lambda e: True)
    msg = encode("canal-json", ev(Op.INSERT, None, ROW), large_message=lm)
    name = lm.claim_check.written[0].rsplit("/", 1)[1]
    obj = orjson.loads(msg.value)
    obj["_tidb"]["claimCheckLocation"] = f"file:///mnt/cdc/cc/{name}"
    moved = kmsg(None, orjson.dumps(obj))
    bad(get_decoder("canal-json", claim_check_uri=str(cc_dir)), moved, "outside the claim-check storage")
    dec = get_decoder("canal-json", claim_check_uri=str(cc_dir), claim_check_location_prefix="file:///mnt/cdc/cc/")
    assert decode_one(dec, moved).after == ROW


# ---------------------------------------------------------------------------------------------------------
# claim-check: bad input
# ---------------------------------------------------------------------------------------------------------


def _with_location(protocol: str, msg: KafkaMessage, location: str, compression: str = "none") -> KafkaMessage:
    """The claim-check message with another location (what a hostile producer controls)."""
    if protocol == "open":
        k = orjson.loads(msg.key[16:])
        k["ccl"] = location
        kj = orjson.dumps(k)
        return kmsg((1).to_bytes(8, "big") + len(kj).to_bytes(8, "big") + kj, msg.value)
    obj = orjson.loads(LM.decompress(compression, msg.value, "v"))
    (obj["_tidb"] if protocol == "canal-json" else obj)["claimCheckLocation"] = location
    return kmsg(None, compress(compression, orjson.dumps(obj)))


@pytest.mark.parametrize("protocol", ["open", "canal-json", "simple"])
def test_a_location_outside_the_claim_check_folder_is_never_read(protocol, cc_dir, tmp_path, monkeypatch):
    """A hostile location cannot make the applier read another file: other folders, '..', other schemes, a query,
    a name with a separator, and a symbolic link out of the folder are refused before (or instead of) reading."""
    secret = tmp_path / "secret"
    secret.mkdir()
    lm = claim_check(cc_dir, names=iter(["ok.json"]))
    msg = encode(protocol, ev(Op.INSERT, None, ROW), large_message=lm)
    (secret / "ok.json").write_bytes((cc_dir / "ok.json").read_bytes())  # a valid file, in the wrong place
    os.symlink(secret / "ok.json", cc_dir / "link.json")
    opened: list = []
    real_open = LM.ClaimCheckStore._read_once

    def spy(self, path, where):
        opened.append(path)
        return real_open(self, path, where)

    monkeypatch.setattr(LM.ClaimCheckStore, "_read_once", spy)
    dec = decoder(protocol, claim_check_uri=f"file://{cc_dir}")
    for location in (f"file://{secret}/ok.json", f"file://{cc_dir}/../secret/ok.json", f"{secret}/ok.json",
                     f"s3://bucket/{cc_dir.name}/ok.json", f"file://{cc_dir}/ok.json?x=1",
                     f"file://{cc_dir}/sub/ok.json", f"file://{cc_dir}/.hidden", "/etc/passwd", "ok.json",
                     f"file://{cc_dir}/..", f"file://{cc_dir}/a\\b.json"):
        e = bad(dec, _with_location(protocol, msg, location), "claim-check")
        assert "outside" in e.reason or "not allowed" in e.reason, e.reason
    assert opened == []
    bad(dec, _with_location(protocol, msg, f"file://{cc_dir}/link.json"), "resolves outside")
    assert decode_one(dec, msg).after == ROW  # the right location still reads


@pytest.mark.parametrize("protocol", ["open", "canal-json", "simple", "simple-avro"])
def test_claim_check_file_missing_or_unreadable(protocol, cc_dir, monkeypatch):
    dec = decoder(protocol, claim_check_uri=str(cc_dir))
    lm = claim_check(cc_dir, names=iter(["gone.json", "dir.json", "junk.json", "flaky.json", "other.json"]))
    gone = encode(protocol, ev(Op.INSERT, None, ROW), large_message=lm)
    (cc_dir / "gone.json").unlink()
    bad(dec, gone, "does not exist", "`shop`.`docs`")
    as_dir = encode(protocol, ev(Op.INSERT, None, ROW), large_message=lm)
    (cc_dir / "dir.json").unlink()
    (cc_dir / "dir.json").mkdir()
    bad(dec, as_dir, "cannot be read")
    junk = encode(protocol, ev(Op.INSERT, None, ROW), large_message=lm)
    (cc_dir / "junk.json").write_bytes(b"\x00not json")
    bad(dec, junk, "not TiCDC's JSON")
    flaky = encode(protocol, ev(Op.INSERT, None, ROW), large_message=lm)
    calls = []

    def down(self, path, where):
        calls.append(path)
        raise ConnectionError("storage unreachable")

    with monkeypatch.context() as m:
        m.setattr(LM.ClaimCheckStore, "_read_once", down)
        bad(dec, flaky, "could not be read after 3 attempts", "ConnectionError")
    assert len(calls) == 3  # retried, then given up as a DecodeError
    assert decode_one(dec, flaky).after == ROW  # once the storage is back, the same message decodes
    # a file that holds another row (here: of another commit ts) is not taken for this one
    encode(protocol, ev(Op.INSERT, None, ROW, ts=TS + 1), large_message=lm)
    if protocol != "simple-avro":  # (_with_location edits JSON)
        bad(dec, _with_location(protocol, flaky, lm.claim_check.written[-1]), "not the", "`shop`.`docs`")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_claim_check_without_claim_check_uri_names_the_option(protocol, cc_dir):
    msg = encode(protocol, ev(Op.INSERT, None, ROW), large_message=claim_check(cc_dir))
    bad(decoder(protocol), msg, "claim-check", "source.codec.claim_check_uri", "`shop`.`docs`")


def test_a_bad_claim_check_row_fails_its_whole_open_batch(cc_dir):
    """Nothing of a message is applied half: one unreadable claim-check event fails the whole batch."""
    good = RowChange(SCHEMA, TABLE, TS, Op.INSERT, None, dict(ROW, id=2), COLS, POS)
    lm = LargeMessage("claim-check", ClaimCheckStorage(str(cc_dir), names=iter(["x.json"])),
                      is_large=lambda e: e.after["id"] == 1)
    key, value = encode_open_batch([good, ev(Op.INSERT, None, ROW)], large_message=lm)
    (cc_dir / "x.json").unlink()
    bad(get_decoder("open", claim_check_uri=str(cc_dir)), kmsg(key, value), "event 2 of 2", "does not exist")


@pytest.mark.parametrize("uri, problem", [
    ("s3://bucket/p?access-key=AKIA&secret-access-key=x", "credentials"),
    ("s3://bucket/p?nope=1", "unknown parameter"),
    ("gcs://bucket/p", "only file:// and s3://"),
    ("relative/dir", "only file:// and s3://"),
    ("file://host/dir", "no host"),
    ("file:///a/../b", "'..'"),
])
def test_claim_check_uri_is_checked_at_construction(uri, problem):
    with pytest.raises(ValueError, match=problem):
        get_decoder("canal-json", claim_check_uri=uri)


# ---------------------------------------------------------------------------------------------------------
# compression
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["snappy", "lz4"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_message_kind_is_decompressed(protocol, compression):
    dec = decoder(protocol, large_message_handle_compression=compression)
    ddl = DDL(SCHEMA, TABLE, TS, "ALTER TABLE docs ADD COLUMN x INT", POS, ddl_type=5)
    row = ev(Op.UPDATE, ROW, ROW2)
    for event in (row, Resolved(TS, POS)) + ((ddl,) if protocol in ("open", "canal-json") else ()):
        msg = encode(protocol, event, compression=compression)
        assert msg.value != encode(protocol, event).value or event.__class__ is Resolved
        got = decode_one(dec, msg)
        assert type(got) is type(event)
        if isinstance(event, RowChange):
            assert (got.before, got.after) == (ROW, ROW2)
    if protocol in ("canal-json", "simple"):  # the quarantine still reads the table of a compressed message
        assert dec.table_of(encode(protocol, row, compression=compression)) == (SCHEMA, TABLE)


@pytest.mark.parametrize("compression", ["snappy", "lz4"])
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_corrupt_compressed_payload(protocol, compression, cc_dir):
    dec = decoder(protocol, large_message_handle_compression=compression, claim_check_uri=str(cc_dir))
    msg = encode(protocol, ev(Op.INSERT, None, ROW), compression=compression)
    if protocol == "open":  # the row value inside the batch framing
        head, body = msg.value[:8], bytearray(msg.value[8:])
        body[len(body) // 2:] = b"\xff" * (len(body) - len(body) // 2)
        broken = kmsg(msg.key, head + bytes(body))
    else:
        broken = kmsg(None, b"\xff\x00garbage" + msg.value[5:])
    bad(dec, broken, f"not valid {compression} data", "large_message_handle_compression")
    # a claim-check file whose value does not decompress
    lm = claim_check(cc_dir, names=iter(["c.json"]))
    small = encode(protocol, ev(Op.INSERT, None, ROW), compression=compression, large_message=lm)
    stored = orjson.loads((cc_dir / "c.json").read_bytes())
    import base64
    stored["value"] = base64.b64encode(
        base64.b64decode(stored["value"])[:8] + b"\xfe" * 40).decode() if protocol == "open" else \
        base64.b64encode(b"\xfe" * 40).decode()
    (cc_dir / "c.json").write_bytes(orjson.dumps(stored))
    bad(dec, small, "claim-check")


def test_uncompressed_stream_with_compression_configured_and_the_reverse():
    msg = encode("canal-json", ev(Op.INSERT, None, ROW))
    bad(decoder("canal-json", large_message_handle_compression="snappy"), msg, "not valid snappy data")
    bad(decoder("canal-json"), encode("canal-json", ev(Op.INSERT, None, ROW), compression="lz4"),
        "set large_message_handle_compression")
    with pytest.raises(ValueError, match="large_message_handle_compression"):
        get_decoder("open", large_message_handle_compression="zstd")


def test_decompression_is_bounded(monkeypatch):
    """A payload that would expand past MAX_PAYLOAD_BYTES is refused instead of allocated; below it the LZ4 buffer
    grows as needed (a 1000:1 ratio needs several steps)."""
    data = b"\x00" * (4 << 20)
    for method in ("snappy", "lz4"):
        assert LM.decompress(method, compress(method, data), "v") == data
    monkeypatch.setattr(LM, "MAX_PAYLOAD_BYTES", 1 << 20)
    for method in ("snappy", "lz4"):
        with pytest.raises(Malformed, match="more than"):
            LM.decompress(method, compress(method, data), "v")


# ---------------------------------------------------------------------------------------------------------
# handle-key-only
# ---------------------------------------------------------------------------------------------------------


def hko() -> LargeMessage:
    return LargeMessage("handle-key-only", is_large=lambda e: True)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_handle_key_only_rows_are_read_from_the_upstream(protocol):
    """An INSERT reads the row as of its commit ts, an UPDATE the new row as of the commit ts and the old row (by
    the old key) as of commit ts - 1; both decode to what the full message decodes to. A DELETE needs no read."""
    up = FakeUpstream({(TS, 1): ROW, (TS + 1, 1): ROW2})
    dec = decoder(protocol, upstream_url="mysql+pymysql://cdc:s3cret@tidb:4000/")
    dec._large.upstream = up
    full = decoder(protocol)
    for event in (ev(Op.INSERT, None, ROW), ev(Op.UPDATE, ROW, ROW2, ts=TS + 1), ev(Op.DELETE, ROW2, None)):
        msg = encode(protocol, event, large_message=hko())
        got = decode_one(dec, msg)
        want = decode_one(full, encode(protocol, event))
        if event.op is Op.DELETE:
            assert got.before == {"id": 1} and got.after is None
        else:
            assert (got.op, got.before, got.after) == (want.op, want.before, want.after)
    assert [c[2:] for c in up.calls] == [(TS, {"id": 1}), (TS + 1, {"id": 1}), (TS, {"id": 1})]
    assert {c[:2] for c in up.calls} == {(SCHEMA, TABLE)}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_handle_key_only_update_reads_the_old_row_by_its_old_key(protocol):
    """TiCDC sends key-changing updates split, but an update sent whole carries the old key in p/old: the old
    image is read by that key."""
    up = FakeUpstream({(TS, 9): dict(ROW2, id=9), (TS - 1, 1): ROW})
    dec = decoder(protocol, upstream_url="mysql://u@h/")
    dec._large.upstream = up
    got = decode_one(dec, encode(protocol, ev(Op.UPDATE, ROW, dict(ROW2, id=9)), large_message=hko()))
    assert got.before == ROW and got.after == dict(ROW2, id=9)
    assert [c[2:] for c in up.calls] == [(TS, {"id": 9}), (TS - 1, {"id": 1})]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_handle_key_only_without_upstream_url_names_the_option(protocol):
    msg = encode(protocol, ev(Op.INSERT, None, ROW), large_message=hko())
    bad(decoder(protocol), msg, "handle-key-only", "source.codec.upstream_url", "`shop`.`docs`")
    # a key-only DELETE is complete and needs no upstream
    assert decode_one(decoder(protocol), encode(protocol, ev(Op.DELETE, ROW, None), large_message=hko())).before \
        == {"id": 1}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_handle_key_only_row_gone_at_that_ts(protocol):
    dec = decoder(protocol, upstream_url="mysql://u:pw@h/")
    dec._large.upstream = FakeUpstream({})
    e = bad(dec, encode(protocol, ev(Op.INSERT, None, ROW), large_message=hko()), "no row", "`shop`.`docs`")
    assert "pw" not in str(e)


class UnusableUpstream(FakeUpstream):
    """An upstream that cannot serve the read (TiDB's GC passed the ts, or it is unreachable)."""

    def fetch(self, schema, table, ts, key, what):
        from applier.codecs.base import UpstreamUnusable

        raise UpstreamUnusable(f"{what} of `{schema}`.`{table}`: the upstream TiDB cannot read as of ts {ts}")


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_an_upstream_that_cannot_serve_the_read_is_an_upstream_decode_error(protocol):
    """Not the message's fault: the DecodeError says so (``applier run`` then exits 5), also after the trip from a
    Spark worker; a row that is not there stays a plain decode error."""
    dec = decoder(protocol, upstream_url="mysql://u:pw@h/")
    dec._large.upstream = UnusableUpstream({})
    e = bad(dec, encode(protocol, ev(Op.INSERT, None, ROW), large_message=hko()), "cannot read as of ts")
    assert e.upstream and pickle.loads(pickle.dumps(e)).upstream
    dec._large.upstream = FakeUpstream({})
    assert not bad(dec, encode(protocol, ev(Op.INSERT, None, ROW), large_message=hko()), "no row").upstream


def test_handle_key_only_open_key_and_canal_extension_layouts():
    k = orjson.loads(encode("open", ev(Op.INSERT, None, ROW), large_message=hko()).key[16:])
    assert list(k) == ["ts", "scm", "tbl", "t", "ohk"] and k["ohk"] is True
    c = orjson.loads(encode("canal-json", ev(Op.UPDATE, ROW, ROW2), large_message=hko()).value)
    assert c["_tidb"] == {"commitTs": TS, "onlyHandleKey": True}
    assert c["data"] == [{"id": "1"}] and c["old"] == [{"id": "1"}] and c["sqlType"] == {"id": 4}
    s = orjson.loads(encode("simple", ev(Op.INSERT, None, ROW), large_message=hko()).value)
    assert s["handleKeyOnly"] is True and "claimCheckLocation" not in s and s["data"] == {"id": "1"}


def test_upstream_options_are_checked_and_the_password_never_shown():
    dec = get_decoder("open", upstream_url="mysql+pymysql://cdc:s3cret@tidb:4000/db")
    assert dec._large.upstream.describe() == "mysql+pymysql://cdc:***@tidb:4000/db"
    assert "s3cret" not in repr(pickle.loads(pickle.dumps(dec))._large.upstream.describe())
    with pytest.raises(ValueError, match="upstream_url") as ei:
        get_decoder("open", upstream_url="postgresql://cdc:s3cret@pg/db")
    assert "s3cret" not in str(ei.value)
    with pytest.raises(ValueError, match="need source.codec.upstream_url"):
        get_decoder("simple", upstream_read_current_state=True)
    with pytest.raises(ValueError, match="upstream_read_current_state"):
        get_decoder("simple", upstream_url="mysql://u@h/", upstream_read_current_state="yes")


def test_codec_options_in_the_config_are_checked_and_masked(tmp_path):
    from applier.config import ConfigError, parse_config

    def cfg(**codec):
        return {"pipeline": {"name": "p", "checkpoint_dir": str(tmp_path / "ck")},
                "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "protocol": "canal-json",
                           "codec": codec},
                "target": {"url": "mysql+pymysql://u:target-password@127.0.0.1:3306/db"}}

    s = parse_config(cfg(upstream_url="mysql+pymysql://cdc:s3cret@tidb:4000/", claim_check_uri=str(tmp_path),
                         large_message_handle_compression="lz4"))
    assert "s3cret" not in repr(s.source.redacted())
    with pytest.raises(ConfigError, match="source.codec") as ei:
        parse_config(cfg(large_message_handle_compression="gzip"))
    assert "large_message_handle_compression" in str(ei.value)


@pytest.mark.parametrize("protocol", ["open", "canal-json"])
def test_spark_workers_build_the_decoder_from_its_options(protocol, cc_dir):
    """Open Protocol and Canal-JSON decode in Spark's Python workers, which build the decoder from the pickled
    WorkerSpec (its [source.codec] options): the large-message options travel that way and work there."""
    import pyarrow as pa

    from applier.decode import WorkerSpec, decode_arrow_batches, decode_chunk

    opts = dict(claim_check_uri=str(cc_dir), upstream_url="mysql://u:pw@h/", large_message_handle_compression="lz4")
    spec = pickle.loads(pickle.dumps(WorkerSpec(protocol, tuple(sorted(opts.items())), False)))
    msg = encode(protocol, ev(Op.INSERT, None, ROW), compression="lz4", large_message=claim_check(cc_dir))
    batch = pa.RecordBatch.from_pylist([{"topic": msg.topic, "partition": msg.partition, "offset": msg.offset,
                                         "key": msg.key, "value": msg.value}])
    [chunk] = list(decode_arrow_batches(spec, iter([batch])))
    decoded = decode_chunk(chunk.column(0)[0].as_py())
    assert decoded.errors == [] and [e.after for e in decoded.events] == [ROW]


@pytest.mark.parametrize("protocol", ["open", "canal-json", "simple"])
def test_large_message_settings_pickle_without_their_connections(protocol, cc_dir):
    """What a decoder holds for large messages pickles; an opened file system or database engine is left behind
    and reopened on first use."""
    dec = decoder(protocol, claim_check_uri=str(cc_dir), upstream_url="mysql://u:pw@h/")
    msg = encode(protocol, ev(Op.INSERT, None, ROW), large_message=claim_check(cc_dir))
    assert decode_one(dec, msg).after == ROW
    assert dec._large.claim_check._fs is not None
    dec._large.upstream._engine = object()  # stands for an engine: must not travel
    again = pickle.loads(pickle.dumps(dec._large))
    assert again.claim_check._fs is None and again.upstream._engine is None
    assert again.claim_check.read(claim_check_location(cc_dir))


def claim_check_location(cc_dir: Path) -> str:
    return f"file://{cc_dir}/{sorted(p.name for p in cc_dir.iterdir())[0]}"


# ---------------------------------------------------------------------------------------------------------
# S3 (a moto server on a free loopback port, started and stopped here)
# ---------------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for var in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(var, raising=False)
    import boto3

    name = f"cc-{os.getpid()}-{_free_port()}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.mark.parametrize("protocol", ["open", "canal-json", "simple"])
def test_claim_check_from_s3(protocol, s3_endpoint, s3_bucket):
    """TiCDC writes to s3://bucket/prefix (here through fsspec to the moto server); the applier reads with
    claim_check_uri = s3://bucket/prefix?endpoint=...&region=... and the credentials from the environment."""
    store = ClaimCheckStorage(f"s3://{s3_bucket}/cdc/cc?endpoint={s3_endpoint}",
                              storage_options={"endpoint_url": s3_endpoint})
    lm = LargeMessage("claim-check", store, is_large=lambda e: True)
    msg = encode(protocol, ev(Op.UPDATE, ROW, ROW2), compression="snappy", large_message=lm)
    assert store.written[0].startswith(f"s3://{s3_bucket}/cdc/cc/") and "?" not in store.written[0]
    uri = f"s3://{s3_bucket}/cdc/cc?endpoint={s3_endpoint}&region=us-east-1"
    dec = decoder(protocol, claim_check_uri=uri, large_message_handle_compression="snappy")
    got = decode_one(dec, msg)
    assert (got.before, got.after) == (ROW, ROW2)
    # a missing object, and an object of another bucket or prefix, are DecodeErrors
    missing = _with_location(protocol, msg, f"s3://{s3_bucket}/cdc/cc/missing.json", "snappy")
    bad(decoder(protocol, claim_check_uri=uri, large_message_handle_compression="snappy"), missing, "does not exist")
    for elsewhere in (f"s3://other-bucket/cdc/cc/{store.written[0].rsplit('/', 1)[1]}",
                      f"s3://{s3_bucket}/cdc/{store.written[0].rsplit('/', 1)[1]}"):
        bad(dec, _with_location(protocol, msg, elsewhere, "snappy"), "outside the claim-check storage")
