"""Large messages (issue 14, point 4) through real Kafka and Spark into real MariaDB and PostgreSQL, and the
handle-key-only reader against a real TiDB (issue 27, point 1).

* Claim-check (``file://``) for Open Protocol, Canal-JSON and Simple: a generated TiCDC changefeed
  (:mod:`applier.devtools.changefeed`: DDL, key-changing updates, unique-key swaps, deletes, replays) re-encoded by
  the test encoders with a third of its row changes sent as claim-check messages and every value compressed
  (``large-message-handle-compression``), as TiCDC would have sent it. The replica must equal the upstream state.
* Handle-key-only, the reader against TiDB (applier/devtools/services/tidb.py): a row of every column type read
  at an insert's commit ts, and an update's new row at its commit ts and old row at commit ts - 1, after the row
  was changed again and deleted, decodes through each protocol exactly as the full message; a row not there at the
  ts, TiDB's GC past the ts and an unreachable TiDB each stop with their own message.
* Handle-key-only, a whole changefeed of a real TiDB (tests/e2e/tidb_feed.py: TiDB's commit ts, key changes,
  deletes, rows changed again after their handle-key-only message) through Kafka and Spark into both targets: the
  replica ends equal to TiDB (``applier verify --upstream``); a transaction TiDB's GC has passed stops the run with
  nothing of it applied, and applies whole once TiDB can read it.
* What only a server that is not TiDB can show (MariaDB): it is refused as the upstream unless
  ``upstream_read_current_state = true`` says to read its current rows.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import orjson
import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.cli import main
from applier.codecs import get_decoder
from applier.config import parse_config
from applier.devtools.changefeed import generate, produce
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.devtools.encoders.largemsg import ClaimCheckStorage, LargeMessage, compress
from applier.devtools.encoders.open import encode_open, encode_open_batch
from applier.devtools.encoders.simple import encode_simple
from applier.devtools.services import tidb as tidb_service
from applier.devtools.verify import compare_tables
from applier.events import Column, DecodeError, KafkaMessage, Op, RowChange, SourcePosition, TableSchema
from applier.pipeline import run
from tests.e2e.helpers import config, target_url, write_toml
from tests.e2e.tidb_feed import ITEMS, Feed, connect, item, last_commit_ts, random_txn

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


def _reencode(protocol: str, wl, *, compression: str, large: LargeMessage) -> list:
    """The workload's messages as TiCDC would have sent them with large-message handling: each message decoded by
    the applier's own decoder and encoded again by the test encoder with ``compression`` and ``large``."""
    out = []
    name = "simple" if protocol == "simple" else protocol
    dec = get_decoder(name)
    for i, (part, key, value) in enumerate(wl.messages):
        events = dec.decode(KafkaMessage("g", part, i, key, value))
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


# ---- handle-key-only rows read from a real TiDB ---------------------------------------------------------------

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
                "'2024-01-02 03:04:05.123456', '2024-01-02 03:04:05.123', '-01:00:01.50', 2024, 'ab', %(vc)s, "
                "%(tx)s, %(bl)s, %(vb)s, %(bn)s, 'c', 'x,z', b'10101', NULL)")
# the row after the update the messages carry (committed at ts2), and after a later one (ts3) the reader must not see
TYPES_ROW_2 = dict(TYPES_ROW, d=Decimal("0.001"), vc="second", tx="two", bl=b"\xff\x00", e=1, s=0, bt=0, n=2)
TYPES_UPDATE_2 = "UPDATE {db}.t SET d = 0.001, vc = 'second', tx = 'two', bl = x'ff00', e = 'a', s = '', bt = 0, n = 2"
TYPES_UPDATE_3 = "UPDATE {db}.t SET vc = 'third', tx = 'three', n = 3"


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


def _commit(conn, sql: str, args=None) -> int:
    with conn.cursor() as cur:
        cur.execute(sql, args)
    conn.commit()
    return last_commit_ts(conn)


@pytest.mark.parametrize("protocol", ["open", "canal-json", "simple", "simple-avro"])
def test_handle_key_only_rows_are_read_from_tidb_at_their_commit_ts(tidb, tidb_database, unique, protocol) -> None:
    """Against a real TiDB: an insert's row is read as of its commit ts and an update's new row as of its commit ts
    and old row as of commit ts - 1, although the row was changed again and then deleted since; every column type
    decodes, through each protocol, exactly as the full message does. A row that did not exist at the ts is a
    DecodeError; a TiDB whose GC passed the ts, or (Canal-JSON) one that cannot be reached, is an upstream error
    (``applier run`` exit 5) naming the setting and the fix, with the password masked."""
    db = f"hk_{unique}_{protocol.replace('-', '_')}"
    tidb_database(db)
    conn = connect(tidb.url)
    try:
        _commit(conn, f"CREATE DATABASE `{db}`")
        _commit(conn, TYPES_DDL.format(db=f"`{db}`"))
        ts1 = _commit(conn, TYPES_INSERT.format(db=f"`{db}`"), {k: TYPES_ROW[k] for k in ("vc", "tx", "bl", "vb", "bn")})
        ts2 = _commit(conn, TYPES_UPDATE_2.format(db=f"`{db}`"))
        _commit(conn, TYPES_UPDATE_3.format(db=f"`{db}`"))
        _commit(conn, f"DELETE FROM `{db}`.t")  # the row is gone now: only a snapshot read finds it
    finally:
        conn.close()
    pos = SourcePosition("u", 0, 1)
    insert = RowChange(db, "t", ts1, Op.INSERT, None, TYPES_ROW, TYPES_COLS, pos)
    update = RowChange(db, "t", ts2, Op.UPDATE, TYPES_ROW, TYPES_ROW_2, TYPES_COLS, pos)
    large = LargeMessage("handle-key-only", is_large=lambda e: True)
    for event, after, before in ((insert, TYPES_ROW, None), (update, TYPES_ROW_2, TYPES_ROW)):
        small = KafkaMessage("u", 0, 1, *_encode(protocol, event, large))
        assert "naïve".encode() not in small.value and b"second" not in small.value  # only the key travels
        want = _decoder(protocol, db).decode(KafkaMessage("u", 0, 1, *_encode(protocol, event)))[0]
        got = _decoder(protocol, db, upstream_url=tidb.url).decode(small)[0]
        assert got.after == want.after == after
        assert got.before == want.before
        if before is not None:
            assert got.before == before
    update_small = KafkaMessage("u", 0, 1, *_encode(protocol, update, large))

    # a row that was not there at the ts: nothing of the change can be applied
    early = RowChange(db, "t", ts1 - 1, Op.INSERT, None, TYPES_ROW, TYPES_COLS, pos)
    with pytest.raises(DecodeError) as ei:
        _decoder(protocol, db, upstream_url=tidb.url).decode(KafkaMessage("u", 0, 1, *_encode(protocol, early, large)))
    assert f"no row with key {{id=7}} as of ts {ts1 - 1}" in str(ei.value) and not ei.value.upstream

    # TiDB's GC passed the update's commit ts (its safe point moved as a GC run moves it)
    tidb_service.set_gc_safe_point(tidb.url, ts2 + (1 << 18))
    try:
        with pytest.raises(DecodeError) as ei:
            _decoder(protocol, db, upstream_url=tidb.url).decode(update_small)
    finally:
        tidb_service.reset_gc_safe_point(tidb.url)
    reason = str(ei.value)
    assert ei.value.upstream, reason
    assert f"cannot read as of ts {ts2}" in reason and "GC safe point" in reason and "tidb_gc_life_time" in reason
    assert "on_decode_error" in reason and "--fix-sql" in reason and "Nothing of this message was applied" in reason
    assert ":applier@" not in reason and ":***@" in reason

    if protocol == "canal-json":  # TiDB unreachable (after the reader's retries: 3 s; the same for every protocol)
        with pytest.raises(DecodeError) as ei:
            _decoder(protocol, db, upstream_url=tidb_service.tidb_url(1)).decode(update_small)
        reason = str(ei.value)
        assert ei.value.upstream and "could not be reached after 5 attempts" in reason
        assert "source.codec.upstream_url" in reason and ":applier@" not in reason


def test_a_server_that_is_not_tidb_is_refused_unless_told_to_read_its_current_rows(urls, unique) -> None:
    """What only a server that is not TiDB can show (MariaDB here): without ``upstream_read_current_state`` it is
    refused (an upstream error naming the option), with it the current row is read."""
    db = f"hkm_{unique}"
    engine = create_engine(urls.mariadb_url)
    try:
        with engine.begin() as c:
            c.exec_driver_sql(f"CREATE DATABASE `{db}`")
            c.exec_driver_sql(f"CREATE TABLE `{db}`.t (id INT PRIMARY KEY, v VARCHAR(10))")
            c.exec_driver_sql(f"INSERT INTO `{db}`.t VALUES (1, 'now')")
        cols = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))
        ev = RowChange(db, "t", 5 << 18, Op.INSERT, None, {"id": 1, "v": "then"}, cols, SourcePosition("u", 0, 1))
        msg = KafkaMessage("u", 0, 1, *encode_canal_json(ev, large_message=LargeMessage(
            "handle-key-only", is_large=lambda e: True)))
        with pytest.raises(DecodeError) as ei:
            get_decoder("canal-json", upstream_url=urls.mariadb_url).decode(msg)
        reason = str(ei.value)
        assert ei.value.upstream and "is not TiDB" in reason and "upstream_read_current_state" in reason
        # (the local server's password equals its user name, so look for the masked URL, not the word)
        assert urls.mariadb_url.split("://", 1)[1] not in reason and ":***@" in reason
        got = get_decoder("canal-json", upstream_url=urls.mariadb_url, upstream_read_current_state=True).decode(msg)
        assert got[0].after == {"id": 1, "v": "now"}
    finally:
        with engine.begin() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{db}`")
        engine.dispose()


def _hk(e: RowChange) -> bool:
    """Which rows go out handle-key-only: a third of the keys, every kind of change."""
    row = e.after if e.after is not None else e.before
    return row["id"] % 3 == 0


@pytest.mark.parametrize("target", TARGETS)
def test_handle_key_only_changefeed_from_tidb_converges(urls, spark, tidb, tidb_database, unique, drop_schema,
                                                        tmp_path, capsys, target) -> None:
    """A changefeed of a real TiDB (tests/e2e/tidb_feed.py) whose rows of a third of the keys go out
    handle-key-only, many of them changed again or deleted later, key changes among them: the pipeline reads each
    from TiDB at its commit ts and the replica ends equal to TiDB (``applier verify --upstream`` at the applied
    ts). Then a transaction whose handle-key-only row TiDB's GC has passed stops the run as an upstream error with
    nothing of that transaction applied; once TiDB can read it again, the run applies it whole."""
    up, schema = f"hks_{unique}_{target[:2]}", f"hkr_{unique}"
    topic = f"e2e-lm-hk-tidb-{target}-{unique}"
    tidb_database(up)
    drop_schema((target, schema))
    rng = random.Random(5)
    large = LargeMessage("handle-key-only", is_large=_hk)
    feed = Feed(tidb.url, up, partitions=3, large=large)
    try:
        feed.create(ITEMS)
        feed.insert("items", *(item(rng, i) for i in range(1, 61)))
        for _ in range(80):
            feed.txn(random_txn(feed, rng))
        sent = [e for e in large.sent if e.op is not Op.DELETE]
        final = feed.state["items"]
        later = [e for e in sent if e.after["id"] not in final or final[e.after["id"]] != e.after]
        assert len(sent) > 20 and len(later) > 10, "the workload must change handle-key-only rows again"
        assert any(e.op is Op.DELETE for e in large.sent) and any(e.op is Op.UPDATE for e in sent)
        produce(urls.kafka, topic, feed.records(), partitions=3)
        cfg = {
            "pipeline": {"name": f"p-{topic}", "checkpoint_dir": str(tmp_path / "ckpt"),
                         "max_offsets_per_trigger": MAX_OFFSETS},
            "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": "canal-json",
                       "codec": {"upstream_url": tidb.url}},
            "target": {"url": target_url(urls, target)},
            "route": [{"match": "*.*", "ignore": True}, {"match": f"{up}.*", "schema": schema}],
        }
        conf = str(write_toml(tmp_path / "c.toml", cfg))
        settings = parse_config(cfg)
        res = run(settings, until_caught_up=True, spark=spark, progress=False)
        assert res.batches > 1
        engine = create_engine(target_url(urls, target))
        try:
            assert _applied_ts(engine, settings) == feed.last_ts
            assert main(["verify", "-c", conf, "--upstream", tidb.url]) == 0, capsys.readouterr()
            assert "in replica: equal" in capsys.readouterr().out

            # a transaction of a handle-key-only row and a full one, after which TiDB's GC passes its commit ts
            hk, full = sorted(k for k in feed.state["items"] if k % 3 == 0)[0], \
                sorted(k for k in feed.state["items"] if k % 3)[0]
            before = _replica_rows(engine, target, schema, (hk, full))
            applied = feed.last_ts
            ts = feed.txn([("update", "items", hk, {"note": "gc passed"}), ("update", "items", full, {"note": "x"})])
            produce(urls.kafka, topic, feed.records(after=applied), partitions=3)
            tidb_service.set_gc_safe_point(tidb.url, ts + (1 << 18))
            try:
                with pytest.raises(DecodeError) as ei:
                    run(settings, until_caught_up=True, spark=spark, progress=False)
            finally:
                tidb_service.reset_gc_safe_point(tidb.url)
            assert ei.value.upstream and "tidb_gc_life_time" in str(ei.value), str(ei.value)
            assert _applied_ts(engine, settings) == applied
            assert _replica_rows(engine, target, schema, (hk, full)) == before  # neither row of the transaction

            res = run(settings, until_caught_up=True, spark=spark, progress=False)
            assert _applied_ts(engine, settings) == feed.last_ts
            assert {r[1] for r in _replica_rows(engine, target, schema, (hk, full))} == {"gc passed", "x"}
            assert main(["verify", "-c", conf, "--upstream", tidb.url]) == 0, capsys.readouterr()
        finally:
            engine.dispose()
    finally:
        feed.close()


def _replica_rows(engine, target: str, schema: str, keys) -> list[tuple]:
    q = (lambda n: f"`{n}`") if target == "mariadb" else (lambda n: f'"{n}"')  # noqa: E731
    with engine.connect() as c:
        return [tuple(r) for r in c.exec_driver_sql(
            f"SELECT id, note FROM {q(schema)}.{q('items')} WHERE id IN ({', '.join(map(str, keys))}) ORDER BY id")]


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
    assert ei.value.upstream and "source.codec.upstream_url" in str(ei.value)
