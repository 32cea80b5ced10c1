"""Prometheus metrics of a running pipeline (``[metrics] port``): what an operator's dashboard and alerts read.

Why a registry of our own and a scrape-time collector: lags must be measured when Prometheus asks (a pipeline
that stopped applying must show its lag growing, not the last value it set), and tests build several
pipelines' metrics in one process. Durations come through the stage-timing hook (:class:`StageMetrics` is a
:class:`~applier.timing.StageTimer`), counts and positions from each micro-batch's report (:meth:`after_batch`),
and the Kafka log end offsets from a background thread that asks the brokers every ``refresh_seconds`` (a scrape
never waits on Kafka).

Names follow Prometheus conventions: ``applier_`` prefix, base units (seconds, bytes), ``_total`` for counters.
TSOs are exported as the Unix time of their physical part (``..._timestamp_seconds``): a TSO does not fit a
float64 exactly, and a time is what a dashboard subtracts from ``time()``.
Every series carries ``pipeline``. Nothing here reads a secret; the endpoint serves loopback by default.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from applier.timing import NO_TIMING, StageTimer

log = logging.getLogger("applier.metrics")

#: seconds: from a 1 ms chunk write to a 2-minute catch-up micro-batch
BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

#: stage-timing names (applier.timing) -> the ``stage`` label: read is Spark's side of a micro-batch
STAGES = {"on_batch": "read", "decode": "decode", "gate": "gate", "apply": "apply", "plan": "plan",
          "write": "write", "progress": "progress", "commit": "commit", "process": "batch",
          "apply_remote": "apply_remote"}  # the apply streams' Spark job (applier.streams.remote)


def tso_seconds(ts: int) -> float:
    """The physical time of a TiDB TSO, in Unix seconds."""
    return (ts >> 18) / 1000.0


@dataclass
class Snapshot:
    """What the last micro-batch left: positions and sizes that the scrape-time collector turns into gauges."""

    applied_ts: int = 0
    global_resolved_ts: int = 0
    partition_resolved: dict[tuple[str, int], int] = field(default_factory=dict)
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    end_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    table_applied_ts: dict[tuple[str, str], int] = field(default_factory=dict)
    held_events: int = 0
    held_memory_bytes: int = 0
    stream_applied_ts: dict[int, int] = field(default_factory=dict)  # apply stream -> its applied ts


class PipelineMetrics(StageTimer):
    """One pipeline's metrics. Also the stage-timing hook: stages reported to it are observed in
    ``applier_stage_duration_seconds`` and passed on to ``inner`` (the benchmark's timer, when there is one)."""

    def __init__(self, pipeline: str, *, spill_dir: str | None = None, inner: StageTimer = NO_TIMING,
                 clock: Callable[[], float] = time.time) -> None:
        self.pipeline = pipeline
        self.inner = inner
        self.clock = clock
        self.spill_dir = spill_dir
        self.registry = CollectorRegistry(auto_describe=True)
        self.snap = Snapshot()
        self._lock = threading.Lock()
        labels = ["pipeline"]
        r = self.registry
        self.stage = Histogram("applier_stage_duration_seconds", "Time spent per pipeline stage (read: Spark's "
                               "side of a micro-batch; batch: one micro-batch end to end on the apply thread)",
                               labels + ["stage"], buckets=BUCKETS, registry=r)
        c = {
            "messages": Counter("applier_messages", "Kafka messages read", labels, registry=r),
            "row_changes": Counter("applier_row_changes", "Row changes applied (rows written, held ones not "
                                   "counted)", labels, registry=r),
            "rows_upserted": Counter("applier_rows_upserted", "Rows written by upserts", labels, registry=r),
            "rows_deleted": Counter("applier_rows_deleted", "Rows deleted", labels, registry=r),
            "ddl_applied": Counter("applier_ddl_applied", "DDL statements applied", labels, registry=r),
            "ddl_skipped": Counter("applier_ddl_skipped", "DDL recorded as skipped", labels, registry=r),
            "quarantined_messages": Counter("applier_quarantined_messages", "Messages that could not be decoded "
                                            "(quarantined or skipped)", labels, registry=r),
            "untrusted_timestamps": Counter("applier_untrusted_timestamps", "Messages refused because their commit "
                                            "or resolved ts was ahead of this host's clock by more than "
                                            "source.max_clock_skew, or did not fit 63 bits (counted in "
                                            "applier_quarantined_messages too)", labels, registry=r),
            "quarantined_row_changes": Counter("applier_quarantined_row_changes", "Row changes held or set aside "
                                               "(on_apply_error, blocks)", labels, registry=r),
            "duplicates_dropped": Counter("applier_duplicates_dropped", "Events dropped as already applied or "
                                          "already held (replays)", labels, registry=r),
            "batches": Counter("applier_batches", "Micro-batches applied", labels, registry=r),
            "transactions": Counter("applier_transactions", "Target transactions committed", labels, registry=r),
        }
        self.counters = {k: v.labels(pipeline) for k, v in c.items()}
        self._stage_children: dict[str, Any] = {}
        self._dups_seen = 0
        r.register(_ScrapeCollector(self))

    # ---- the stage-timing hook ---------------------------------------------------------------------------
    def add(self, stage: str, seconds: float) -> None:
        label = STAGES.get(stage)
        if label is not None:
            child = self._stage_children.get(label)
            if child is None:
                child = self._stage_children[label] = self.stage.labels(self.pipeline, label)
            child.observe(seconds)
        self.inner.add(stage, seconds)

    def count(self, what: str, n: int) -> None:
        child = self.counters.get(what)
        if child is not None and what != "batches":  # batches are counted as applied, in after_batch
            child.inc(n)
        self.inner.count(what, n)

    def resumed(self, state: Any) -> None:
        self.seed(state.applied_ts, {}, {tp: cp.resolved_ts for tp, cp in state.checkpoints.items()})
        for stream, ts in state.streams.items():
            self.stream_applied(stream, ts)
        self.inner.resumed(state)

    def stream_applied(self, stream: int, applied_ts: int) -> None:
        """An apply stream committed its rows up to ``applied_ts`` (any thread)."""
        with self._lock:
            self.snap.stream_applied_ts[stream] = applied_ts

    def applied(self, report: Any, gate: Any) -> None:
        self.after_batch(report, gate)
        self.inner.applied(report, gate)

    def partitions(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(set(self.snap.partition_resolved) | set(self.snap.next_offsets))

    # ---- after each micro-batch (apply thread) ---------------------------------------------------------------
    def after_batch(self, rep: Any, gate: Any) -> None:
        """Counts from a BatchReport and positions from the gate, once the batch is applied and committed."""
        c = self.counters
        c["messages"].inc(rep.messages)
        c["row_changes"].inc(rep.applied.rows)
        c["ddl_applied"].inc(rep.applied.ddls)
        c["ddl_skipped"].inc(rep.applied.ddls_skipped)
        c["quarantined_messages"].inc(rep.quarantined)
        c["untrusted_timestamps"].inc(getattr(rep, "untrusted", 0))
        c["quarantined_row_changes"].inc(rep.applied.quarantined_rows)
        c["transactions"].inc(rep.applied.transactions)
        c["batches"].inc()
        dups = int(gate.stats.get("duplicates_dropped", 0)) + int(gate.stats.get("ddl_duplicates_dropped", 0))
        if dups > self._dups_seen:
            c["duplicates_dropped"].inc(dups - self._dups_seen)
        self._dups_seen = dups
        with self._lock:
            s = self.snap
            s.applied_ts = rep.applied_ts
            s.global_resolved_ts = rep.global_resolved
            s.partition_resolved = dict(gate.resolved)
            s.next_offsets = dict(gate.next_offsets)
            for t in rep.applied.tables:
                s.table_applied_ts[t] = rep.applied_ts
            s.held_events = rep.held
            s.held_memory_bytes = gate.memory_bytes

    def set_end_offsets(self, ends: Mapping[tuple[str, int], int]) -> None:
        with self._lock:
            self.snap.end_offsets.update(ends)

    def seed(self, applied_ts: int, tables: Mapping[tuple[str, str], int],
             partition_resolved: Mapping[tuple[str, int], int]) -> None:
        """What the progress tables say at start, so lags are right before the first batch applies."""
        with self._lock:
            self.snap.applied_ts = applied_ts
            self.snap.table_applied_ts.update(tables)
            self.snap.partition_resolved.update(partition_resolved)
            if partition_resolved:
                self.snap.global_resolved_ts = min(partition_resolved.values())

    def spilled_bytes(self) -> int:
        total = 0
        if self.spill_dir and os.path.isdir(self.spill_dir):
            for root, _, files in os.walk(self.spill_dir):
                for f in files:
                    try:
                        total += os.path.getsize(os.path.join(root, f))
                    except OSError:  # removed meanwhile
                        pass
        return total


class _ScrapeCollector(Collector):
    """Gauges computed when Prometheus scrapes: positions from the last batch, lags against the clock now."""

    def __init__(self, m: PipelineMetrics) -> None:
        self.m = m

    def describe(self) -> Iterable[Any]:
        return []  # the families vary with the tables and partitions seen

    def collect(self) -> Iterator[Any]:
        m = self.m
        now = m.clock()
        with m._lock:
            t = m.snap
            s = Snapshot(t.applied_ts, t.global_resolved_ts, dict(t.partition_resolved), dict(t.next_offsets),
                         dict(t.end_offsets), dict(t.table_applied_ts), t.held_events, t.held_memory_bytes,
                         dict(t.stream_applied_ts))
        s_applied = s.applied_ts
        p = m.pipeline

        def gauge(name: str, doc: str, value: float | None, labels: Mapping[str, str] | None = None) -> Any:
            g = GaugeMetricFamily(name, doc, labels=["pipeline", *(labels or {})])
            if value is not None:
                g.add_metric([p, *(labels or {}).values()], value)
            return g

        def family(name: str, doc: str, *labels: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["pipeline", *labels])

        def lag(ts: int) -> float | None:
            return None if ts <= 0 else max(0.0, now - tso_seconds(ts))

        def when(ts: int) -> float | None:
            return None if ts <= 0 else tso_seconds(ts)

        yield gauge("applier_applied_resolved_timestamp_seconds", "Physical time of the applied resolved ts: the "
                    "target is consistent as of it", when(s_applied))
        yield gauge("applier_global_resolved_timestamp_seconds", "Physical time of the lowest resolved ts over "
                    "all partitions", when(s.global_resolved_ts))
        yield gauge("applier_applied_lag_seconds", "Now minus the physical time of the applied resolved ts: how "
                    "old the state the replica is consistent as of is", lag(s_applied))
        yield gauge("applier_global_resolved_lag_seconds", "Now minus the physical time of the global resolved ts",
                    lag(s.global_resolved_ts))
        part_res = family("applier_partition_resolved_timestamp_seconds", "Physical time of each Kafka "
                          "partition's resolved ts (0: never reported)", "topic", "partition")
        consumer_lag = family("applier_kafka_consumer_lag_messages", "Log end offset minus the next "
                              "offset the applier reads, per partition", "topic", "partition")
        for (topic, part), ts in sorted(s.partition_resolved.items()):
            part_res.add_metric([p, topic, str(part)], when(ts) or 0.0)
        for (topic, part), end in sorted(s.end_offsets.items()):
            nxt = s.next_offsets.get((topic, part))
            if nxt is not None:
                consumer_lag.add_metric([p, topic, str(part)], max(0, end - nxt))
        yield part_res
        yield consumer_lag
        tab_ts = family("applier_table_applied_timestamp_seconds", "Physical time of the applied "
                        "resolved ts when the table last received changes", "schema", "table")
        tab_change = family("applier_table_last_change_lag_seconds", "Now minus the physical time of "
                            "the table's last applied change's resolved ts", "schema", "table")
        tab_fresh = family("applier_table_freshness_lag_seconds", "How old the state the table is "
                           "consistent as of is (the pipeline's applied resolved ts)", "schema", "table")
        fresh = lag(s_applied)
        for (schema, table), ts in sorted(s.table_applied_ts.items()):
            if ts > 0:
                tab_ts.add_metric([p, schema, table], tso_seconds(ts))
            changed = lag(ts)
            if changed is not None:
                tab_change.add_metric([p, schema, table], changed)
            if fresh is not None:
                tab_fresh.add_metric([p, schema, table], fresh)
        yield tab_ts
        yield tab_change
        yield tab_fresh
        streams = family("applier_stream_applied_timestamp_seconds", "Physical time of the ts each apply stream "
                         "committed its rows up to (the applied resolved ts is the minimum over them)", "stream")
        for n, ts in sorted(s.stream_applied_ts.items()):
            if ts > 0:
                streams.add_metric([p, str(n)], tso_seconds(ts))
        yield streams
        yield gauge("applier_held_events", "Events held until the resolved ts passes them", s.held_events)
        yield gauge("applier_held_memory_bytes", "Estimated memory of the held events", s.held_memory_bytes)
        yield gauge("applier_spilled_bytes", "Bytes of held events spilled to local disk", m.spilled_bytes())


class EndOffsets:
    """Asks Kafka for each partition's log end offset every ``refresh_seconds`` on a daemon thread, for the
    consumer-lag gauge. A failure is logged once and retried; it never touches the pipeline."""

    def __init__(self, metrics: PipelineMetrics, bootstrap: str, partitions: Callable[[], Iterable[tuple[str, int]]],
                 kafka: Mapping[str, str] | None = None, refresh_seconds: float = 10.0) -> None:
        self.metrics = metrics
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.kafka = dict(kafka or {})
        self.refresh_seconds = refresh_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="applier-metrics-kafka", daemon=True)
        self._warned = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from applier.kafka_security import librdkafka_security

        consumer = None
        while not self._stop.is_set():
            try:
                if consumer is None:
                    # [source.kafka]'s login and trust in librdkafka's names (the same as the source's)
                    security = librdkafka_security(self.kafka)
                    if security is None:
                        log.warning("metrics: [source.kafka] has security settings librdkafka cannot take (a JKS "
                                    "trust store, Kerberos, OAuth...): no consumer-lag gauge in this run")
                        return
                    # log_level 0: librdkafka's own lines (connection retries, ...) stay off the applier's stderr;
                    # a failure is reported once below
                    conf = {"bootstrap.servers": self.bootstrap, "group.id": f"applier-metrics-{os.getpid()}",
                            "enable.auto.commit": False, "log_level": 0, **security}
                    consumer = Consumer(conf)
                ends = {}
                for topic, part in list(self.partitions()):
                    _, high = consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=5, cached=False)
                    ends[(topic, part)] = int(high)
                self.metrics.set_end_offsets(ends)
            except Exception as exc:  # the lag gauge goes stale; the pipeline is not concerned
                if not self._warned:
                    log.warning("metrics: cannot read Kafka log end offsets for the consumer-lag gauge (%s); "
                                "retrying every %.0f s", exc, self.refresh_seconds)
                    self._warned = True
            self._stop.wait(self.refresh_seconds)
        if consumer is not None:
            consumer.close()


@dataclass
class ServedMetrics:
    """A run's metrics with their endpoint and end-offset reader: started before the run, closed after it."""

    metrics: PipelineMetrics
    server: "MetricsServer"
    offsets: EndOffsets

    @classmethod
    def start(cls, settings: Any, inner: StageTimer = NO_TIMING) -> "ServedMetrics":
        m = PipelineMetrics(settings.pipeline.name, spill_dir=str(settings.pipeline.spill_dir), inner=inner)
        m.seed(0, _table_progress(settings), {})
        server = MetricsServer(m, settings.metrics.host, settings.metrics.port)
        offsets = EndOffsets(m, settings.source.bootstrap_servers, m.partitions, settings.source.kafka)
        offsets.start()
        return cls(m, server, offsets)

    def close(self) -> None:
        self.offsets.stop()
        self.server.close()


def _table_progress(settings: Any) -> dict[tuple[str, str], int]:
    """Each table's applied ts from the progress tables, so the per-table gauges cover the tables that get no
    change in this run; empty when the target cannot be read yet (the run says why, not the metrics)."""
    from sqlalchemy import inspect, select

    from applier.dialect import target_engine
    from applier.progress import tables

    try:
        engine = target_engine(settings.target, pool_size=1)
        try:
            with engine.connect() as conn:
                if not inspect(conn).has_table(tables.name):
                    return {}
                rows = conn.execute(select(tables.c.source_schema, tables.c.source_table, tables.c.applied_ts)
                                    .where(tables.c.pipeline == settings.pipeline.name))
                return {(s, t): int(ts) for s, t, ts in rows}
        finally:
            engine.dispose()
    except Exception:
        return {}


class MetricsServer:
    """The HTTP endpoint: ``/metrics`` on ``host:port``, stopped with the run."""

    def __init__(self, metrics: PipelineMetrics, host: str, port: int) -> None:
        from prometheus_client import start_http_server

        from applier.config import ConfigError

        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=metrics.registry)
        except OSError as exc:
            raise ConfigError("metrics.port", f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}. Choose "
                              "a free port (or another metrics.host), or remove [metrics] port") from None
        log.info("metrics served on http://%s:%d/metrics", host, self.server.server_port)

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
