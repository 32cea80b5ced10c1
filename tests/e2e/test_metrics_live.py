"""Prometheus metrics scraped during a live run (issue 13, point 1): `applier run` in live mode serves
`[metrics] port` on loopback while it applies a changefeed from real Kafka through real Spark into MariaDB;
the scraped positions and counts must equal what the target's progress tables say, and the consumer lag must
reach 0 once everything is read."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, func, select

from applier import progress as P
from applier.config import parse_config
from applier.devtools.changefeed import generate, produce
from applier.devtools.verify import compare_tables
from applier.metrics import tso_seconds
from applier.pipeline import run
from tests.e2e.helpers import config, target_url

pytestmark = pytest.mark.e2e


APPLIED = ("applier_applied_resolved_timestamp_seconds", ())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pipeline")))] = s.value
    return out


def test_metrics_scraped_during_a_live_run_match_the_progress_tables(urls, spark, unique, drop_schema,
                                                                    tmp_path) -> None:
    topic = f"e2e-metrics-{unique}"
    schema = f"met_{unique}"
    drop_schema(("mariadb", schema))
    wl = generate("canal-json", partitions=2, txns=120, seed=11, replays=0)
    produce(urls.kafka, topic, wl.messages, partitions=2)
    port = free_port()
    cfg = config(urls, "mariadb", "canal-json", topic, schema, tmp_path / "ckpt", trigger_interval="200 ms")
    cfg["metrics"] = {"port": port}
    settings = parse_config(cfg)
    done: dict = {}

    def live() -> None:
        try:
            done["result"] = run(settings, until_caught_up=False, spark=spark, progress=False)
        except BaseException as exc:  # the test reports it
            done["error"] = exc

    t = threading.Thread(target=live, name="live-run", daemon=True)
    t.start()
    engine = create_engine(target_url(urls, "mariadb"))
    try:
        deadline = time.monotonic() + 120
        s: dict = {}
        while time.monotonic() < deadline and "error" not in done:
            try:
                s = scrape(port)
            except OSError:
                s = {}
            lagging = [v for k, v in s.items() if k[0] == "applier_kafka_consumer_lag_messages"]
            if s.get(APPLIED) == tso_seconds(wl.final_ts) and len(lagging) == 2 and not any(lagging):
                break
            time.sleep(0.5)
        assert "error" not in done, done.get("error")
        assert s.get(APPLIED) == tso_seconds(wl.final_ts), s
        assert compare_tables(engine, schema, wl.expected) == []
        name = settings.pipeline.name
        with engine.connect() as c:
            applied, batches = c.execute(select(P.pipelines.c.applied_ts, P.pipelines.c.batches)
                                         .where(P.pipelines.c.pipeline == name)).one()
            parts = c.execute(select(P.partitions.c.kafka_partition, P.partitions.c.resolved_ts,
                                     P.partitions.c.next_offset).where(P.partitions.c.pipeline == name)).all()
            tables = dict(c.execute(select(P.tables.c.source_table, P.tables.c.applied_ts)
                                    .where(P.tables.c.pipeline == name)).all())
            ddl = c.execute(select(func.count()).select_from(P.ddl_history)
                            .where(P.ddl_history.c.pipeline == name, P.ddl_history.c.state == "done")).scalar()
        assert s[APPLIED] == tso_seconds(applied)
        assert s[("applier_batches_total", ())] >= 1
        for part, resolved, _ in parts:
            assert s[("applier_partition_resolved_timestamp_seconds", (("partition", str(part)), ("topic", topic)))] \
                == tso_seconds(resolved)
            assert s[("applier_kafka_consumer_lag_messages", (("partition", str(part)), ("topic", topic)))] == 0
        for table, ts in tables.items():
            assert s[("applier_table_applied_timestamp_seconds", (("schema", "shop"), ("table", table)))] == \
                tso_seconds(ts)
            assert s[("applier_table_freshness_lag_seconds", (("schema", "shop"), ("table", table)))] >= 0
        assert s[("applier_ddl_applied_total", ())] == ddl
        assert s[("applier_messages_total", ())] == len(wl.messages)
        assert s[("applier_rows_upserted_total", ())] > 0
        assert s[("applier_stage_duration_seconds_count", (("stage", "commit"),))] >= 1
        assert 0 <= s[("applier_applied_lag_seconds", ())] < 10 ** 9
    finally:
        for q in spark.streams.active:
            q.stop()
        t.join(timeout=60)
        engine.dispose()
    assert not t.is_alive() and "error" not in done, done.get("error")
    with pytest.raises(OSError):  # the endpoint stopped with the run
        scrape(port)
