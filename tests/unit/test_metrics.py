"""The Prometheus metrics (applier.metrics) without a pipeline: stage durations through the timing hook, counts
and positions from a batch report, lags computed against the clock at scrape time, the consumer lag from log end
offsets, the endpoint on loopback, and the [metrics] config keys."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, field

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client import generate_latest

from applier.config import ConfigError
from applier.metrics import MetricsServer, PipelineMetrics
from applier.progress import PartitionCheckpoint, PipelineState
from applier.timing import StageTimer
from tests.unit.helpers import CLI_CONF, write_conf

NOW = 1_800_000_000.0


def tso(seconds_ago: float) -> int:
    return int((NOW - seconds_ago) * 1000) << 18


@dataclass
class Applied:
    rows: int = 0
    ddls: int = 0
    ddls_skipped: int = 0
    quarantined_rows: int = 0
    transactions: int = 1
    tables: dict = field(default_factory=dict)


@dataclass
class Report:
    messages: int
    quarantined: int
    applied: Applied
    applied_ts: int
    global_resolved: int
    held: int


class Gate:
    def __init__(self) -> None:
        self.stats = {"duplicates_dropped": 0, "ddl_duplicates_dropped": 0}
        self.resolved = {("t", 0): tso(2), ("t", 1): tso(3)}
        self.next_offsets = {("t", 0): 40, ("t", 1): 7}
        self.memory_bytes = 4096


def samples(m: PipelineMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(m.registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pipeline")))] = s.value
    return out


class Recorder(StageTimer):
    def __init__(self) -> None:
        self.seen: list = []

    def add(self, stage: str, seconds: float) -> None:
        self.seen.append((stage, seconds))

    def applied(self, report, gate) -> None:
        self.seen.append(("applied", report.applied_ts))


def test_a_batch_gives_counts_positions_and_lags_measured_when_scraped() -> None:
    clock = [NOW]
    inner = Recorder()
    m = PipelineMetrics("p1", inner=inner, clock=lambda: clock[0])
    m.resumed(PipelineState(applied_ts=tso(60), checkpoints={("t", 0): PartitionCheckpoint(0, tso(50), 0)}))
    assert samples(m)[("applier_applied_lag_seconds", ())] == pytest.approx(60, abs=0.01)
    m.add("write", 0.02)
    m.add("commit", 0.004)
    m.add("not_a_stage", 1.0)
    m.count("rows_upserted", 5)
    m.count("rows_deleted", 2)
    gate = Gate()
    gate.stats["duplicates_dropped"] = 3
    m.applied(Report(10, 1, Applied(rows=7, ddls=1, quarantined_rows=2, tables={("shop", "a"): 7}), tso(4), tso(3), 9),
              gate)
    m.set_end_offsets({("t", 0): 45, ("t", 1): 7})
    clock[0] = NOW + 10  # nothing applied for 10 s: the lag grows at the next scrape
    s = samples(m)
    assert s[("applier_messages_total", ())] == 10 and s[("applier_row_changes_total", ())] == 7
    assert s[("applier_rows_upserted_total", ())] == 5 and s[("applier_rows_deleted_total", ())] == 2
    assert s[("applier_ddl_applied_total", ())] == 1 and s[("applier_quarantined_messages_total", ())] == 1
    assert s[("applier_quarantined_row_changes_total", ())] == 2 and s[("applier_duplicates_dropped_total", ())] == 3
    assert s[("applier_batches_total", ())] == 1
    assert s[("applier_applied_resolved_timestamp_seconds", ())] == pytest.approx(NOW - 4, abs=0.001)
    assert s[("applier_applied_lag_seconds", ())] == pytest.approx(14, abs=0.01)
    assert s[("applier_global_resolved_lag_seconds", ())] == pytest.approx(13, abs=0.01)
    assert s[("applier_partition_resolved_timestamp_seconds", (("partition", "1"), ("topic", "t")))] == \
        pytest.approx(NOW - 3, abs=0.001)
    assert s[("applier_kafka_consumer_lag_messages", (("partition", "0"), ("topic", "t")))] == 5
    assert s[("applier_kafka_consumer_lag_messages", (("partition", "1"), ("topic", "t")))] == 0
    table = (("schema", "shop"), ("table", "a"))
    assert s[("applier_table_freshness_lag_seconds", table)] == pytest.approx(14, abs=0.01)
    assert s[("applier_table_last_change_lag_seconds", table)] == pytest.approx(14, abs=0.01)
    assert s[("applier_held_events", ())] == 9 and s[("applier_held_memory_bytes", ())] == 4096
    assert s[("applier_stage_duration_seconds_count", (("stage", "write"),))] == 1
    assert s[("applier_stage_duration_seconds_sum", (("stage", "commit"),))] == pytest.approx(0.004)
    assert not any(k[0].startswith("applier_stage") and ("stage", "not_a_stage") in k[1] for k in s)
    # the benchmark's own timer still sees everything
    assert ("write", 0.02) in inner.seen and ("not_a_stage", 1.0) in inner.seen and ("applied", tso(4)) in inner.seen
    gate.stats["duplicates_dropped"] = 5  # counters follow the gate's running totals
    m.applied(Report(0, 0, Applied(), tso(4), tso(3), 0), gate)
    assert samples(m)[("applier_duplicates_dropped_total", ())] == 5


def test_each_apply_streams_applied_ts_from_the_progress_and_as_streams_commit() -> None:
    m = PipelineMetrics("p5", clock=lambda: NOW)
    m.resumed(PipelineState(applied_ts=tso(60), streams={0: tso(60), 1: tso(40)}))
    m.stream_applied(0, tso(20))
    s = samples(m)
    assert s[("applier_stream_applied_timestamp_seconds", (("stream", "0"),))] == pytest.approx(NOW - 20, abs=0.001)
    assert s[("applier_stream_applied_timestamp_seconds", (("stream", "1"),))] == pytest.approx(NOW - 40, abs=0.001)
    assert s[("applier_applied_resolved_timestamp_seconds", ())] == pytest.approx(NOW - 60, abs=0.001)


def test_no_stream_series_without_apply_streams() -> None:
    m = PipelineMetrics("p6", clock=lambda: NOW)
    m.resumed(PipelineState(applied_ts=tso(60)))
    assert not [k for k in samples(m) if k[0] == "applier_stream_applied_timestamp_seconds"]


def test_the_endpoint_serves_on_loopback_and_a_taken_port_names_the_key() -> None:
    m = PipelineMetrics("p2")
    server = MetricsServer(m, "127.0.0.1", 0)
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
        assert "# TYPE applier_applied_resolved_timestamp_seconds gauge" in body
        assert 'applier_held_events{pipeline="p2"} 0.0' in body
        with pytest.raises(ConfigError) as e:
            MetricsServer(PipelineMetrics("p3"), "127.0.0.1", server.port)
        assert e.value.key == "metrics.port" and "remove [metrics] port" in str(e.value)
    finally:
        server.close()


def test_metrics_config_keys(tmp_path) -> None:
    from applier.config import load_config

    s = load_config(write_conf(tmp_path, CLI_CONF + "[metrics]\nport = 9464\n"))
    assert (s.metrics.port, s.metrics.host) == (9464, "127.0.0.1") and s.redacted()["metrics"]["port"] == 9464
    assert load_config(write_conf(tmp_path)).metrics.port == 0
    for bad, key in (("port = 70000", "metrics.port"), ("port = \"x\"", "metrics.port"), ('host = " "', "metrics.host"),
                     ("pot = 1", "metrics.pot")):
        with pytest.raises(ConfigError) as e:
            load_config(write_conf(tmp_path, CLI_CONF + f"[metrics]\n{bad}\n"))
        assert e.value.key == key, (bad, e.value)


def test_the_grafana_dashboard_and_the_alerts_name_only_metrics_the_applier_exports() -> None:
    import json
    import re
    from pathlib import Path

    import yaml

    m = PipelineMetrics("p4", clock=lambda: NOW)
    m.resumed(PipelineState(applied_ts=tso(1), checkpoints={("t", 0): PartitionCheckpoint(0, tso(1), 0)}))
    m.add("commit", 0.1)
    m.applied(Report(1, 0, Applied(rows=1, tables={("s", "t"): 1}), tso(1), tso(1), 0), Gate())
    m.set_end_offsets({("t", 0): 45})
    exported = {fam.name for fam in text_string_to_metric_families(generate_latest(m.registry).decode())}
    exported |= {f"{n}_total" for n in exported} | {f"{n}_bucket" for n in exported}
    conf = Path(__file__).resolve().parents[2] / "conf"
    dash = json.loads((conf / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    rules = yaml.safe_load((conf / "prometheus-alerts.yml").read_text())["groups"][0]["rules"]
    exprs += [r["expr"] for r in rules]
    used = {n for e in exprs for n in re.findall(r"\bapplier_[a-z_]+", e)}
    assert used and used <= exported, used - exported
    assert {"applier_applied_lag_seconds", "applier_kafka_consumer_lag_messages",
            "applier_table_freshness_lag_seconds", "applier_stage_duration_seconds_bucket"} <= used
