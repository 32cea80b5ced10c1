"""Large messages (issue 14, point 4) through real Kafka and Spark into real MariaDB and PostgreSQL, and the
handle-key-only reader against a real server.

* Claim-check (``file://``) for Open Protocol, Canal-JSON and Simple: a generated TiCDC changefeed
  (:mod:`applier.devtools.changefeed`: DDL, key-changing updates, unique-key swaps, deletes, replays) re-encoded by
  the test encoders with a third of its row changes sent as claim-check messages and every value compressed
  (``large-message-handle-compression``), as TiCDC would have sent it. The replica must equal the upstream state.
* Handle-key-only for Canal-JSON, with MariaDB standing in for the upstream TiDB
  (``upstream_read_current_state = true``): the orders rows after the ALTER TABLE are sent handle-key-only and
  read back from a MariaDB database that holds the upstream's final state.
* The upstream reader itself against MariaDB: a non-TiDB upstream is refused without the stand-in option; with
  it, a row of every column type read back decodes, for each protocol, exactly as the full message does; a row
  that is not there is a DecodeError; the password never shows.

What MariaDB as the upstream cannot test (README, Operations): TiDB's snapshot read. ``SET @@tidb_snapshot``,
information_schema as of the snapshot, reading the old row of an UPDATE as of commit ts - 1 (MariaDB returns
the current row for both images), the error of a snapshot older than the GC safe point, and TiDB's own text of
its types (VECTOR, TiDB's JSON). Those paths run only against a real TiDB.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import orjson
import pytest
from sqlalchemy import create_engine, select, text

from applier import progress as P
from applier.codecs import get_decoder
from applier.config import parse_config
from applier.devtools.changefeed import generate, produce
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.devtools.encoders.largemsg import ClaimCheckStorage, LargeMessage, compress
from applier.devtools.encoders.open import encode_open, encode_open_batch
from applier.devtools.encoders.simple import encode_simple
from applier.devtools.verify import compare_tables
from applier.events import Column, DecodeError, KafkaMessage, Op, RowChange, SourcePosition, TableSchema
from applier.pipeline import run
from tests.e2e.helpers import config, target_url

pytestmark = pytest.mark.e2e

TARGETS = ["mariadb", "postgres"]
TXNS = 60
SEED = 7
MAX_OFFSETS = 120


# ---- re-encoding a generated changefeed with large messages ---------------------------------------------------

def _claim_check_large(e: RowChange) -> bool:
    """A third of the row changes, inserts, updates and deletes alike."""
    row = e.after if e.after is not None else e.before
    return row["id"] % 3 == 0


def _reencode(protocol: str, wl, *, compression: str, large: LargeMessage, rename: str | None = None) -> list:
    """The workload's messages as TiCDC would have sent them with large-message handling: each message decoded by
    the applier's own decoder and encoded again by the test encoder with ``compression`` and ``large``
    (``rename``: the upstream schema name to give the events)."""
    out = []
    name = "simple" if protocol == "simple" else protocol
    dec = get_decoder(name)
    for i, (part, key, value) in enumerate(wl.messages):
        events = dec.decode(KafkaMessage("g", part, i, key, value))
        for e in events:
            if rename and hasattr(e, "schema") and e.schema == "shop":
                e.schema = rename
        if protocol == "open":
            out.append((part, *encode_open_batch(events, compression=compression, large_message=large)))
        elif protocol == "canal-json":
            [e] = events
            out.append((part, *encode_canal_json(e, compression=compression, large_message=large)))
        else:
            doc = orjson.loads(value)
            if doc["type"] in ("INSERT", "UPDATE", "DELETE"):
                [e] = events
                out.append((part, *encode_simple(e, schema_version=doc.get("schemaVersion", 0),
                                                 build_ts_ms=doc["buildTs"], compression=compression,
                                                 large_message=large)))
            else:  # BOOTSTRAP, DDL, WATERMARK: the same message, compressed
                out.append((part, key, compress(compression, value)))
    return out


def _run(urls, spark, target: str, protocol: str, topic: str, schema: str, ckpt, codec: dict, messages, *,
         routes=None):
    produce(urls.kafka, topic, messages, partitions=3)
    cfg = config(urls, target, protocol, topic, schema, ckpt, max_offsets_per_trigger=MAX_OFFSETS)
    cfg["source"]["codec"] = codec
    if routes:
        cfg["route"] = routes
    settings = parse_config(cfg)
    res = run(settings, until_caught_up=True, spark=spark, progress=False)
    return settings, res


def _applied_ts(engine, settings) -> int:
    with engine.connect() as c:
        return c.execute(select(P.pipelines.c.applied_ts)
                         .where(P.pipelines.c.pipeline == settings.pipeline.name)).scalar()


CLAIM_CHECK_CASES = [
    # protocol, compression, claim-check-raw-value
    ("open", "snappy", False),
    ("canal-json", "lz4", True),
    ("simple", "lz4", False),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("protocol,compression,raw", CLAIM_CHECK_CASES)
def test_claim_check_stream_converges(urls, spark, unique, drop_schema, tmp_path, protocol, compression, raw,
                                      target) -> None:
    topic = f"e2e-lm-{protocol}-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    cc = tmp_path / "claim-check"
    wl = generate(protocol, partitions=3, txns=TXNS, seed=SEED, replays=2)
    large = LargeMessage("claim-check", ClaimCheckStorage(f"file://{cc}", raw_value=raw), is_large=_claim_check_large)
    messages = _reencode(protocol, wl, compression=compression, large=large)
    assert len(large.sent) > 20 and {e.op for e in large.sent} == {Op.INSERT, Op.UPDATE, Op.DELETE}
    assert len(list(cc.iterdir())) == len(large.sent)
    codec = {"claim_check_uri": f"file://{cc}", "large_message_handle_compression": compression}
    if raw:
        codec["claim_check_raw_value"] = True
    settings, res = _run(urls, spark, target, protocol, topic, schema, tmp_path / "ckpt", codec, messages)
    engine = create_engine(target_url(urls, target))
    try:
        assert res.batches > 1
        assert compare_tables(engine, schema, wl.expected) == []
        assert _applied_ts(engine, settings) == wl.final_ts
    finally:
        engine.dispose()


# ---- handle-key-only with MariaDB standing in for the upstream TiDB ---------------------------------------------

UPSTREAM_ORDERS = ("CREATE TABLE {db}.orders (id INT NOT NULL PRIMARY KEY, customer VARCHAR(64) NOT NULL, "
                   "amount DECIMAL(12,2) NOT NULL, note TEXT NULL, created DATETIME(6) NOT NULL, "
                   "status VARCHAR(16) NULL)")


@pytest.fixture
def upstream_db(urls, unique):
    """A MariaDB database standing in for the upstream TiDB (dropped at the end)."""
    name = f"up_{unique}"
    engine = create_engine(urls.mariadb_url)
    with engine.begin() as c:
        c.exec_driver_sql(f"CREATE DATABASE `{name}`")
    try:
        yield name, engine
    finally:
        with engine.begin() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        engine.dispose()


@pytest.mark.parametrize("target", TARGETS)
def test_handle_key_only_stream_converges_with_a_stand_in_upstream(urls, spark, unique, drop_schema, tmp_path,
                                                                   upstream_db, target) -> None:
    """Canal-JSON with large-message-handle-option = "handle-key-only": the orders rows written after the ALTER
    TABLE (and some deletes) arrive with only their key, and are read from the stand-in upstream, which holds the
    final state (reading the current row is only right for rows that do not change schema or get deleted later:
    that is what a stand-in can test)."""
    up, up_engine = upstream_db
    topic = f"e2e-lm-hko-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    wl = generate("canal-json", partitions=3, txns=TXNS, seed=SEED, replays=2)
    final = wl.expected["orders"]
    with up_engine.begin() as c:
        c.exec_driver_sql(UPSTREAM_ORDERS.format(db=f"`{up}`"))
        c.execute(text(f"INSERT INTO `{up}`.orders VALUES (:id, :customer, :amount, :note, :created, :status)"),
                  list(final.values()))

    def is_large(e: RowChange) -> bool:
        if e.table != "orders":
            return False
        if e.op is Op.DELETE:
            return e.before["id"] % 2 == 0
        return "status" in e.after and (e.after["id"],) in final and e.after["id"] % 2 == 0

    large = LargeMessage("handle-key-only", is_large=is_large)
    messages = _reencode("canal-json", wl, compression="snappy", large=large, rename=up)
    assert len([e for e in large.sent if e.op is not Op.DELETE]) >= 5 and any(e.op is Op.DELETE for e in large.sent)
    codec = {"large_message_handle_compression": "snappy", "upstream_url": urls.mariadb_url,
             "upstream_read_current_state": True}
    routes = [{"match": f"{up}.*", "schema": schema}, {"match": f"{up}.audit_*", "ignore": True}]
    settings, res = _run(urls, spark, target, "canal-json", topic, schema, tmp_path / "ckpt", codec, messages,
                         routes=routes)
    engine = create_engine(target_url(urls, target))
    try:
        assert compare_tables(engine, schema, wl.expected) == []
        assert _applied_ts(engine, settings) == wl.final_ts
    finally:
        engine.dispose()


# ---- the upstream reader against MariaDB -------------------------------------------------------------------------

TYPES_DDL = (
    "CREATE TABLE {db}.t (id INT NOT NULL PRIMARY KEY, tu TINYINT UNSIGNED, bu BIGINT UNSIGNED, d DECIMAL(12,3), "
    "f FLOAT, g DOUBLE, dd DATE, dtm DATETIME(6), ts TIMESTAMP(3) NULL, tm TIME(2), y YEAR, c CHAR(5), "
    "vc VARCHAR(20), tx TEXT, bl BLOB, vb VARBINARY(8), bn BINARY(3), e ENUM('a','b','c'), s SET('x','y','z'), "
    "bt BIT(5), n INT NULL)")
TYPES_COLS = (
    Column("id", "int", nullable=False, key=True), Column("tu", "tinyint", unsigned=True),
    Column("bu", "bigint", unsigned=True), Column("d", "decimal"), Column("f", "float"), Column("g", "double"),
    Column("dd", "date"), Column("dtm", "datetime"), Column("ts", "timestamp"), Column("tm", "time"),
    Column("y", "year"), Column("c", "char"), Column("vc", "varchar"), Column("tx", "text"),
    Column("bl", "blob", binary=True), Column("vb", "varbinary", binary=True), Column("bn", "binary", binary=True),
    Column("e", "enum"), Column("s", "set"), Column("bt", "bit"), Column("n", "int"),
)
TYPES_ROW = {"id": 7, "tu": 255, "bu": 2**64 - 1, "d": Decimal("-12345.678"), "f": 1.5, "g": 0.1,
             "dd": dt.date(2024, 2, 29), "dtm": dt.datetime(2024, 1, 2, 3, 4, 5, 123456),
             "ts": dt.datetime(2024, 1, 2, 3, 4, 5, 123000), "tm": dt.timedelta(hours=-1, seconds=-1, microseconds=-500000),
             "y": 2024, "c": "ab", "vc": "héllo ☃", "tx": "naïve 🚀 " * 20, "bl": bytes(range(256)),
             "vb": b"\x00\"\\A", "bn": b"a\x00\x00", "e": 3, "s": 5, "bt": 21, "n": None}
TYPES_INSERT = ("INSERT INTO {db}.t VALUES (7, 255, 18446744073709551615, -12345.678, 1.5, 0.1, '2024-02-29', "
                "'2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.123', '-01:00:01.50', 2024, 'ab', :vc, :tx, :bl, "
                ":vb, :bn, 'c', 'x,z', b'10101', NULL)")


def _types_table(engine, db: str) -> None:
    with engine.begin() as c:
        c.exec_driver_sql("SET time_zone = '+00:00'")
        c.exec_driver_sql(TYPES_DDL.format(db=f"`{db}`"))
        c.execute(text(TYPES_INSERT.format(db=f"`{db}`")), {k: TYPES_ROW[k] for k in ("vc", "tx", "bl", "vb", "bn")})


def _encode(protocol: str, event, large=None):
    schema = TableSchema(event.schema, event.table, 1, TYPES_COLS)
    if protocol == "open":
        return encode_open(event, large_message=large)
    if protocol == "canal-json":
        return encode_canal_json(event, large_message=large)
    return encode_simple(event, encoding_format="avro" if protocol == "simple-avro" else "json",
                         table_schema=schema, large_message=large)


def _decoder(protocol: str, db: str, **opts):
    """A decoder for ``protocol``; a Simple one has seen the BOOTSTRAP of ``db``.t."""
    name = "simple" if protocol.startswith("simple") else protocol
    fmt = "avro" if protocol == "simple-avro" else "json"
    if name == "simple":
        opts["encoding_format"] = fmt
    dec = get_decoder(name, **opts)
    if name == "simple":
        dec.decode(KafkaMessage("u", 0, 0, *encode_simple(TableSchema(db, "t", 1, TYPES_COLS), encoding_format=fmt)))
    return dec


@pytest.mark.parametrize("protocol", ["open", "canal-json", "simple", "simple-avro"])
def test_stand_in_upstream_reads_every_type_as_the_full_message(urls, upstream_db, protocol) -> None:
    """Against a real server (MariaDB) the reader's values - MySQL's text, bytes for binary columns, ENUM/SET/BIT
    as numbers - decode through each protocol to exactly what the full message decodes to; without the stand-in
    option a server that is not TiDB is refused, and the password never shows."""
    db, engine = upstream_db
    _types_table(engine, db)
    pos = SourcePosition("u", 0, 1)
    ts = (1_800_000_000_000 << 18) + 5
    insert = RowChange(db, "t", ts, Op.INSERT, None, TYPES_ROW, TYPES_COLS, pos)
    update = RowChange(db, "t", ts, Op.UPDATE, TYPES_ROW, TYPES_ROW, TYPES_COLS, pos)
    large = LargeMessage("handle-key-only", is_large=lambda e: True)
    for event in (insert, update):
        small = KafkaMessage("u", 0, 1, *_encode(protocol, event, large))
        full = KafkaMessage("u", 0, 1, *_encode(protocol, event))
        want = _decoder(protocol, db).decode(full)[0]
        got = _decoder(protocol, db, upstream_url=urls.mariadb_url, upstream_read_current_state=True).decode(small)[0]
        assert got.after == want.after == TYPES_ROW
        assert got.before == want.before
    # the same message without the stand-in option: MariaDB is not TiDB
    with pytest.raises(DecodeError) as ei:
        _decoder(protocol, db, upstream_url=urls.mariadb_url).decode(small)
    reason = str(ei.value)
    assert "is not TiDB" in reason and "upstream_read_current_state" in reason and f"`{db}`.`t`" in reason
    # (the local server's password equals its user name, so look for the masked URL, not the word)
    assert urls.mariadb_url.split("://", 1)[1] not in reason and ":***@" in reason
    # a key that is not in the upstream: the row cannot be read, so nothing of the change is applied
    gone = RowChange(db, "t", ts, Op.INSERT, None, dict(TYPES_ROW, id=8), TYPES_COLS, pos)
    with pytest.raises(DecodeError) as ei:
        _decoder(protocol, db, upstream_url=urls.mariadb_url, upstream_read_current_state=True).decode(
            KafkaMessage("u", 0, 1, *_encode(protocol, gone, large)))
    assert "no row with key {id=8}" in str(ei.value) and "topic=u partition=0 offset=1" in str(ei.value)
    assert urls.mariadb_url.split("://", 1)[1] not in str(ei.value)


def test_unreachable_upstream_is_retried_then_a_decode_error(monkeypatch) -> None:
    from applier.codecs import largemsg as LM

    monkeypatch.setattr(LM, "RETRY_ATTEMPTS", 2)
    monkeypatch.setattr(LM, "RETRY_WAIT_MAX", 0.01)
    dec = get_decoder("canal-json", upstream_url="mysql+pymysql://cdc:s3cret@127.0.0.1:9/")
    ev = RowChange("shop", "t", 5 << 18, Op.INSERT, None, {"id": 1, "v": "x"},
                   (Column("id", "int", key=True), Column("v", "varchar")), SourcePosition("u", 0, 3))
    msg = KafkaMessage("u", 0, 3, *encode_canal_json(ev, large_message=LargeMessage("handle-key-only",
                                                                                      is_large=lambda e: True)))
    with pytest.raises(DecodeError) as ei:
        dec.decode(msg)
    assert "could not be reached after 2 attempts" in str(ei.value) and "s3cret" not in str(ei.value)
