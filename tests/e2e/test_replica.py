"""A TiCDC-shaped changefeed through real Kafka and Spark into real MariaDB and PostgreSQL.

Each case writes a generated changefeed (3 partitions, rows dispatched by key, resolved ts broadcast, DDL
broadcast, CREATE TABLE + ALTER TABLE mid-stream, PK-changing updates, unique-key swaps, deletes, an ignored
table, and TiCDC-restart replays) and runs the pipeline until caught up; the target must then equal the
upstream state row for row, and the progress tables must say where it stands.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, select, text

from applier import progress as P
from applier.config import parse_config
from applier.pipeline import run
from applier.devtools.verify import compare_tables
from applier.devtools.changefeed import generate, produce
from tests.e2e.helpers import config, target_url

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
@pytest.mark.parametrize("protocol", ["open", "canal-json"])
def test_changefeed_converges(urls, spark, unique, drop_schema, tmp_path, protocol, target) -> None:
    topic = f"e2e-{protocol}-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    wl = generate(protocol, partitions=3, txns=250, seed=7, replays=3)  # fixed: a CI run must be repeatable
    produce(urls.kafka, topic, wl.messages, partitions=3)
    settings = parse_config(config(urls, target, protocol, topic, schema, tmp_path / "ckpt",
                                   max_offsets_per_trigger=150))
    res = run(settings, until_caught_up=True, spark=spark, progress=False)
    assert res.batches > 1
    engine = create_engine(target_url(urls, target))
    try:
        assert compare_tables(engine, schema, wl.expected) == []
        with engine.connect() as c:
            names = {r[0] for r in c.execute(select(P.tables.c.source_table).where(P.tables.c.pipeline == settings.pipeline.name))}
            assert names == {"orders", "customers"}  # audit_log was routed away
            hist = c.execute(select(P.ddl_history.c.state, P.ddl_history.c.source_table)
                             .where(P.ddl_history.c.pipeline == settings.pipeline.name)).all()
            # 3 CREATE TABLE (audit_log's routed away before the gate) + 1 ALTER, each once despite broadcast
            assert sorted(t for _, t in hist) == ["customers", "orders", "orders"]
            assert {s for s, _ in hist} == {"done"}
            applied = c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == settings.pipeline.name)).scalar()
            assert applied == wl.final_ts
            if target == "mariadb":
                has_audit = c.execute(text("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = :s "
                                           "AND table_name = 'audit_log'"), {"s": schema}).scalar()
            else:
                has_audit = c.execute(text("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = :s "
                                           "AND table_name = 'audit_log'"), {"s": schema}).scalar()
            assert has_audit == 0
    finally:
        engine.dispose()


def test_undecodable_message_stops_with_its_position_or_is_quarantined(urls, spark, unique, drop_schema, tmp_path) -> None:
    from applier.events import DecodeError
    from applier.redrive import Redrive, Selection
    from applier.sinks import ApplyError

    topic = f"e2e-bad-{unique}"
    schema = f"shop_{unique}"
    drop_schema(("mariadb", schema))
    wl = generate("open", partitions=1, txns=20, seed=3, replays=0)
    msgs = list(wl.messages)
    msgs.insert(5, (0, b"\x00\x00\x00\x00\x00\x00\x00\x07garbage", b"\x01"))  # wrong version header
    produce(urls.kafka, topic, msgs, partitions=1)
    cfg = config(urls, "mariadb", "open", topic, schema, tmp_path / "ckpt")
    with pytest.raises(DecodeError) as err:
        run(parse_config(cfg), until_caught_up=True, spark=spark, progress=False)
    text_ = str(err.value)
    assert f"topic={topic}" in text_ and "partition=0" in text_ and "offset=5" in text_

    # quarantined, the message blocks its partition (its table cannot be read): what follows waits behind it,
    # and a DDL that reshapes a table with changes waiting stops the run, until the operator gives it up
    cfg["pipeline"]["on_decode_error"] = "quarantine"
    settings = parse_config(cfg)
    engine = create_engine(urls.mariadb_url)
    try:
        try:
            run(settings, until_caught_up=True, spark=spark, progress=False)
        except ApplyError as exc:
            assert "was not run" in str(exc) and "offset=5" in str(exc), exc
        assert compare_tables(engine, schema, wl.expected) != []
        red = Redrive.from_settings(engine, settings)
        block = next(g for g in red.listing().groups if g.row_key == "*")
        assert (block.schema, block.table, block.rows[0].position.offset) == ("", "", 5)
        red.discard(Selection(ids=tuple(block.ids)), reason="not a TiCDC message")
        red.retry(Selection(everything=True))
        run(settings, until_caught_up=True, spark=spark, progress=False)
        assert compare_tables(engine, schema, wl.expected) == []
        with engine.connect() as c:
            q = c.execute(select(P.quarantine.c.kafka_offset, P.quarantine.c.reason, P.quarantine.c.msg_value)
                          .where(P.quarantine.c.pipeline == settings.pipeline.name)).all()
        assert [(o, v) for o, _, v in q] == [(5, b"\x01")]
        assert "version" in q[0][1]
    finally:
        engine.dispose()
