"""Hostile messages through real Kafka and Spark into real MariaDB and PostgreSQL (issue 24, invariants 11 and 15).

A 4-partition Canal-JSON changefeed gets, half way into every partition, a TIDB_WATERMARK of the year 2100 (which
used to release half-read transactions, record 2100 as applied and drop every later change as "already applied"),
one watermark of 2^64 - 1 (which used to stop every run at the progress tables), a row committed in 2100 (held for
ever, pinning its partition's restart offset) and a row of a 300-character table under a ``{table}`` route
template (an unhandled RoutingError). Under every policy that goes on, the replica ends equal to upstream with
each hostile message recorded; under ``stop`` the run stops naming the first one."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, select, text

from applier import progress as P
from applier.config import parse_config
from applier.devtools.changefeed import generate, produce
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.devtools.verify import compare_tables
from applier.events import Column, DecodeError, Op, RowChange, SourcePosition
from applier.pipeline import run
from applier.report import status
from tests.e2e.helpers import config, made_topic, target_url

pytestmark = pytest.mark.e2e

PARTS = 4
YEAR_2100 = 4_102_444_800_000 << 18
COLS = (Column("id", "int", nullable=False, key=True), Column("v", "int"))


def forged_watermark(ts: int) -> bytes:
    return (b'{"id":0,"database":"","table":"","pkNames":null,"isDdl":false,"type":"TIDB_WATERMARK","es":0,'
            b'"ts":0,"sql":"","sqlType":null,"mysqlType":null,"data":null,"old":null,"_tidb":{"watermarkTs":'
            + str(ts).encode() + b"}}")


def row(table: str, ts: int, key: int) -> bytes:
    return encode_canal_json(RowChange("shop", table, ts, Op.INSERT, None, {"id": key, "v": key}, COLS,
                                       SourcePosition("", 0, 0)))[1]


def hostile_stream(long_name: bool):
    """The generated changefeed with the hostile messages spliced in; (workload, messages, hostile count)."""
    wl = generate("canal-json", partitions=PARTS, txns=160, seed=24, replays=2)
    per_part: dict[int, list] = {p: [] for p in range(PARTS)}
    for m in wl.messages:
        per_part[m[0]].append(m)
    some_ts = wl.final_ts - (1000 << 18)
    for p, msgs in per_part.items():
        mid = len(msgs) // 2
        extra = [(p, None, forged_watermark(YEAR_2100))]
        if p == 0:
            extra.append((p, None, forged_watermark(2**64 - 1)))
        if p == 1:
            extra.append((p, None, row("ghost", YEAR_2100, 7)))  # a row committed in 2100
        if p == 2 and long_name:
            extra.append((p, None, row("x" * 300, some_ts, 8)))
        msgs[mid:mid] = extra
    messages = [m for p in range(PARTS) for m in per_part[p]]
    return wl, messages, PARTS + 2 + (1 if long_name else 0)


def _settings(urls, kind: str, topic: str, schema: str, tmp_path, policy: str):
    cfg = config(urls, kind, "canal-json", topic, schema, tmp_path / f"ck-{policy}", on_decode_error=policy,
                 max_offsets_per_trigger=200)
    cfg["route"] = [{"match": "shop.audit_*", "ignore": True},
                    {"match": "shop.*", "schema": schema, "table": "{table}"}]
    cfg["pipeline"]["name"] = f"p-{topic}-{policy}"
    return parse_config(cfg)


def _quarantined(engine, pipeline: str) -> list[tuple[int, int, str]]:
    with engine.connect() as c:
        return sorted((int(p), int(o), r) for p, o, r in c.execute(
            select(P.quarantine.c.kafka_partition, P.quarantine.c.kafka_offset, P.quarantine.c.reason)
            .where(P.quarantine.c.pipeline == pipeline)))


def _has_table(engine, schema: str, table: str) -> bool:
    with engine.connect() as c:
        return bool(c.execute(text("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = :s AND "
                                   "table_name = :t"), {"s": schema, "t": table}).scalar())


@pytest.mark.parametrize("kind", ["mariadb", "postgres"])
def test_hostile_timestamps_and_names_are_skipped_with_a_record_and_the_replica_stays_equal(
        urls, spark, unique, drop_schema, tmp_path, kind) -> None:
    topic = f"hostile-{kind}-{unique}"
    made_topic(topic)
    schema = f"hostile_{unique}"
    drop_schema((kind, schema))
    wl, messages, hostile = hostile_stream(long_name=True)
    produce(urls.kafka, topic, messages, partitions=PARTS)
    settings = _settings(urls, kind, topic, schema, tmp_path, "skip")
    run(settings, until_caught_up=True, spark=spark, progress=False)
    engine = create_engine(target_url(urls, kind))
    try:
        assert compare_tables(engine, schema, wl.expected) == []
        assert not _has_table(engine, schema, "ghost")
        st = status(engine, settings.pipeline.name)
        assert st["applied_ts"] == wl.final_ts  # never 2100: the forged watermarks moved nothing
        assert st["untrusted_timestamps"] == hostile - 1  # all but the long name
        assert all(r["resolved_ts"] == wl.final_ts for r in st["partitions"])
        reasons = [r for _p, _o, r in _quarantined(engine, settings.pipeline.name)]
        assert len(reasons) == hostile
        assert sum("ahead of this host's clock" in r for r in reasons) == PARTS + 1
        assert sum("does not fit 63 bits" in r for r in reasons) == 1
        assert sum("cannot be routed" in r for r in reasons) == 1
    finally:
        engine.dispose()


def test_hostile_timestamps_under_quarantine_and_stop(urls, spark, unique, drop_schema, tmp_path) -> None:
    kind = "mariadb"
    topic = f"hostile-q-{unique}"
    made_topic(topic)
    schema = f"hostileq_{unique}"
    drop_schema((kind, schema))
    wl, messages, hostile = hostile_stream(long_name=False)
    produce(urls.kafka, topic, messages, partitions=PARTS)
    engine = create_engine(target_url(urls, kind))
    try:
        # quarantine: the watermarks are recorded and hold nothing; the 2100 row holds only its own table
        settings = _settings(urls, kind, topic, schema, tmp_path, "quarantine")
        run(settings, until_caught_up=True, spark=spark, progress=False)
        assert compare_tables(engine, schema, wl.expected) == []
        st = status(engine, settings.pipeline.name)
        assert st["applied_ts"] == wl.final_ts and st["untrusted_timestamps"] == hostile
        assert st["quarantined_rows"]["blocked_keys"] == 1  # shop.ghost, the table of the 2100 row
        # stop: the first forged message stops the run, naming it; nothing past it is trusted
        schema_s = f"hostiles_{unique}"
        drop_schema((kind, schema_s))
        stop = _settings(urls, kind, topic, schema_s, tmp_path, "stop")
        with pytest.raises(DecodeError) as err:
            run(stop, until_caught_up=True, spark=spark, progress=False)
        assert "max_clock_skew" in str(err.value) or "63 bits" in str(err.value)
        assert err.value.position.topic == topic
        assert status(engine, stop.pipeline.name).get("applied_ts", 0) < YEAR_2100
    finally:
        engine.dispose()
