"""Spark glue: the Kafka source, ``foreachBatch`` into the batch processor, and the run loop.

The progress tables in the target are the source of truth for where to resume: every start reads them and
starts the Kafka source at each partition's restart offset (the lowest offset any held event came from), so
held events are rebuilt from Kafka after a crash (invariant 7). The Spark checkpoint folder is working state
of the running query only; it is cleared at start, which is why deleting it loses nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import json
import logging
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple

from sqlalchemy.engine import Engine

from applier import logs, migrate
from applier.config import ConfigError, Settings
from applier.codecs import Decoder, batch_hint, decodes_alone, get_decoder
from applier.crashguard import STOP, DecodingMarker, DriverDecodeGuard, Position, Ranges, describe
from applier.decode import (
    CHUNK_SCHEMA, KILLED, WorkerSpec, decode_arrow_batches, decode_isolated, find_killers, killed_reason,
    shared_schemas, warm_decoder, with_schemas, worker_crashed,
)
from applier.dialect import Dialect, dialect_for
from applier.events import DecodeError, KafkaMessage
from applier.handoff import BatchHandoff
from applier.kafka_security import KafkaSettingError, librdkafka_security, probe, refusal
from applier.processor import BatchProcessor, BatchReport
from applier.progress import PipelineState, ProgressStore
from applier.report import ProgressLine
from applier.wiring import applier_options, make_engine, router_for, settle_load_data  # noqa: F401 (re-exported)
from applier.session import close_session, reset_checkpoint, silence, spark_session
from applier.timing import NO_TIMING, StageTimer

__all__ = ["PipelineStopped", "RunResult", "make_engine", "run", "spark_session"]

log = logging.getLogger("applier.pipeline")


def max_offsets_per_trigger(settings: Settings) -> int:
    return settings.pipeline.max_offsets_per_trigger or batch_hint(settings.source.protocol)


# The Kafka source's columns a micro-batch is read with, in KafkaMessage's field order.
RECORD_COLUMNS = ("topic", "partition", "offset", "key", "value")


def read_chunks(df, spec: WorkerSpec, tasks: int | None = None) -> list[bytes]:
    """The micro-batch decoded by Spark's Python workers (applier.decode), as chunks for
    :meth:`BatchProcessor.process_chunks`. Spark runs the workers while this thread waits in the JVM, so they
    decode batch N+1 on other cores while the apply thread writes batch N. A spec with a schema snapshot
    (:func:`applier.decode.with_schemas`, Simple) sends it as a broadcast, once per snapshot version. ``tasks``:
    read the batch in at most that many Spark tasks (:meth:`DecodePlacement.tasks`); each worker then decodes
    several Kafka partitions one after another (:func:`applier.decode.partition_runs` keeps them apart)."""
    if spec.schemas is not None:
        spec = shared_schemas(spec, df.sparkSession.sparkContext)
    records = df.select(*RECORD_COLUMNS)
    if tasks is not None:
        records = records.coalesce(tasks)
    decoded = records.mapInArrow(
        functools.partial(decode_arrow_batches, spec), CHUNK_SCHEMA)
    return decoded.toArrow().column(0).to_pylist()


# Below this many decoded events in the previous micro-batch, ``decode_on = "auto"`` decodes the next one in the
# driver. Events, not messages: an Open Protocol message carries up to 16 row changes. Measured live (Canal-JSON
# into PostgreSQL, 500 ms trigger, 2 minutes each, workers reading small batches in one task per core): at 5k row
# changes/s (2.5k-event batches) the driver's decode gave staleness p99 0.61 s against the workers' 0.66 s and
# used less of the machine; at 10k/s (5k-event batches) the workers' 0.89 s against 1.17 s, and at 20k/s the
# driver's decode on the apply thread (184 ms a batch) put p99 at 3.4-3.7 s where the workers hold 1.4 s
# (docs/benchmarks.md, round 5, fifth sitting). Batches of one or a few messages keep Spark's Python job out of
# their way (round 4: 1-message batches 182 -> 122 ms).
SMALL_BATCH_EVENTS = 4_000
# Below this many events in the previous micro-batch the workers read it in one Spark task per core rather than
# one per Kafka partition: a task costs a Python worker about 33 ms of CPU whatever its size (measured: 300k
# Canal-JSON row changes in 15k-event batches, 6 partitions, local[2]: workers 10.0-10.5 CPU-s with 6 tasks a
# batch, 6.0-6.6 with 2, the same as in 200k-event batches), which at 20k row changes/s was a quarter of a core.
# Catch-up batches keep a task per Kafka partition: there the cost is a few percent, and Spark's coalescing
# pairs partitions by position, not size, so a skewed partition would hold up its partner.
COALESCE_BELOW_EVENTS = 100_000
# How often the Spark thread asks Kafka for new partitions of the subscribed topics.
PARTITION_REFRESH_SECONDS = 30.0
# A stopping run (a signal, --until-ts, an outside stop of its query, a failure) waits this long for the window
# being written in Spark tasks (apply_on = "executors"), then cancels its job: the next run applies what it did
# not commit. A run that ends because it caught up waits for its last window without a bound.
STOP_APPLY_GRACE_SECONDS = 30.0
#: how `applier run` says where its apply streams write (Settings.apply_form)
_FORMS = {"executors": "as Spark tasks on the executors", "driver": "as threads of the driver",
          "one_transaction": "in one transaction of the driver per window"}


class ReadBatch(NamedTuple):
    """What the Spark thread hands to the apply thread."""

    batch_id: int
    chunks: bool  # payload: the workers' chunks (True) or raw KafkaMessages to decode in the driver
    payload: list
    partitions: list[tuple[str, int]] | None  # every partition again, when the Spark thread refreshed the list


class DecodePlacement:
    """Where each micro-batch is decoded: Spark's Python workers, the driver, or (``auto`` with a protocol the
    workers decode) the workers for big batches and the driver for small ones, judged by the previous batch's
    size. The first batch of a run goes to the workers: a restart usually begins with a backlog. Simple's
    workers leave some records to the driver's decoder (applier.decode), so with Simple the driver decodes
    (and needs its crash guard) even when every batch goes to the workers."""

    def __init__(self, executors: bool, driver: bool, auto: bool | None = None) -> None:
        self.executors = executors  # some batches may be decoded by the workers
        self.driver = driver  # some records may be decoded in the driver (it then needs the crash guard)
        self.auto = driver if auto is None else auto  # small batches are decoded in the driver
        self.previous: int | None = None  # events in the last applied batch; written by the apply thread

    @classmethod
    def for_settings(cls, settings: Settings) -> "DecodePlacement":
        executors = settings.decodes_on_executors()
        auto = not executors or settings.pipeline.decode_on == "auto"
        leftovers = executors and not decodes_alone(settings.source.protocol)
        return cls(executors, driver=auto or leftovers, auto=auto)

    def on_executors(self) -> bool:
        if not self.executors:
            return False
        if not self.auto:
            return True
        return self.previous is None or self.previous >= SMALL_BATCH_EVENTS

    def tasks(self, parallelism: int) -> int | None:
        """How many Spark tasks the workers read the next batch in: ``parallelism`` (the cluster's cores) after a
        batch below :data:`COALESCE_BELOW_EVENTS` events, else None (one per Kafka partition, Spark's own)."""
        if self.previous is None or self.previous >= COALESCE_BELOW_EVENTS:
            return None
        return max(1, parallelism)

    def saw(self, events: int) -> None:
        self.previous = events

    def describe(self) -> str:
        if self.executors and self.auto:
            return (f"Spark's Python workers, or the driver when the previous micro-batch had fewer than "
                    f"{SMALL_BATCH_EVENTS:,} events")
        return "Spark's Python workers" if self.executors else "the driver"


def warm_python_workers(spark, settings: Settings, spec: WorkerSpec) -> None:
    """Start Spark's Python workers and build their decoders in the background while the query starts.

    On a local master nothing starts them before the first micro-batch, which then paid the workers' start and
    the decoder's imports on top of Spark's own query start (docs/benchmarks.md, round 4, start-up); Spark reuses
    the workers, so the first batch finds them warm. Clusters run the start-up check instead (applier.session).
    A failure here is only logged: the first batch meets the same fault and reports it properly."""
    if not settings.spark.is_local:
        return
    tasks = max(1, spark.sparkContext.defaultParallelism)

    def job() -> None:
        try:
            spark.range(tasks, numPartitions=tasks).mapInArrow(
                functools.partial(warm_decoder, spec), CHUNK_SCHEMA).collect()
        except Exception as exc:  # noqa: BLE001 - see the docstring
            log.debug("warming the Python workers failed: %s", str(exc).splitlines()[0][:300] if str(exc) else exc)

    threading.Thread(target=job, name="applier-warm-workers", daemon=True).start()


def worker_spec(settings: Settings) -> WorkerSpec:
    return WorkerSpec(settings.source.protocol, tuple(sorted(settings.source.codec.items())),
                      stop_at_error=settings.stops_at_decode_error(), max_skew_ms=settings.source.max_clock_skew_ms,
                      columnar=settings.pipeline.columnar)


def read_messages(df) -> list[KafkaMessage]:
    """The micro-batch's records as KafkaMessages, fetched through Arrow.

    Arrow moves the five columns in bulk: about 1.5x faster than ``collect()``, which pickles every Row through
    py4j and builds Row objects first (docs/benchmarks.md)."""
    table = df.select(*RECORD_COLUMNS).toArrow()
    cols = [table.column(i).to_pylist() for i in range(5)]
    del table
    return list(map(KafkaMessage, *cols))


def read_ranges(spark, settings: Settings, ranges: Ranges) -> list[KafkaMessage]:
    """The records of inclusive offset ranges, read again from Kafka in one batch query."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for (t, p), (lo, hi) in sorted(ranges.items()):
        assign.setdefault(t, []).append(p)
        starting.setdefault(t, {})[str(p)] = lo
        ending.setdefault(t, {})[str(p)] = hi + 1
    reader = spark.read.format("kafka")
    for k, v in settings.source.spark_options().items():
        if k not in ("subscribe", "subscribePattern"):
            reader = reader.option(k, v)
    df = (reader.option("assign", json.dumps(assign)).option("startingOffsets", json.dumps(starting))
          .option("endingOffsets", json.dumps(ending)).option("failOnDataLoss", "false").load())
    return sorted(read_messages(df), key=lambda m: (m.topic, m.partition, m.offset))


def recover_from_decoder_crash(spark, settings: Settings, marker: DecodingMarker) -> dict[Position, str]:
    """A previous driver died while decoding (the marker says which records): find the messages that kill the
    decoder, in child processes. Stop naming the first (exit 3), or return them to be quarantined unread."""
    ranges = marker.pending()
    if ranges is None:
        return {}
    log.error("the previous run died while decoding %s; decoding those records again in child processes to find "
              "the message that kills the decoder", describe(ranges))
    killers = find_killers(worker_spec(settings), read_ranges(spark, settings, ranges))
    if not killers:
        log.error("no single message among %s kills the decoder when decoded again; going on (if the fault "
                  "recurs, report it with the traceback the dead run printed)", describe(ranges))
        marker.disarm()
        return {}
    if settings.pipeline.on_decode_error == "stop":  # a killer's table is never read: the global policy decides
        msg, how = killers[0]
        raise DecodeError(msg.position, killed_reason(how), protocol=settings.source.protocol)
    marker.disarm()  # found: this run quarantines them; were it killed first, the next crash marks them again
    for msg, how in killers:
        log.error("%s: %s; it will be quarantined", msg.position, killed_reason(how),
                  extra={"position": msg.position})
    return {(m.topic, m.partition, m.offset): killed_reason(how) for m, how in killers}


# Collector thresholds while the pipeline runs (CPython's default is (700, 10, 10)); see bulk_gc.
BULK_GC_THRESHOLD = (100_000, 50, 1000)


@contextlib.contextmanager
def bulk_gc() -> Iterator[None]:
    """Collect cyclic garbage less often while the driver holds many events.

    Held events are acyclic (dataclasses, dicts, tuples), so the cyclic collector never frees any of them, but
    every 700 container allocations it walks the young ones and, every so often, the whole held set. Measured
    (400k held Canal-JSON events): gate.add 2.15 -> 1.6 s, rebuilding worker chunks 1.5 -> 1.4 s. What exists
    at start (modules, SQLAlchemy and Spark objects) is frozen out of the collector's walks. Reference counting
    still frees everything as before; the previous settings come back when the run ends."""
    old = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0  # a host process that froze objects itself keeps them frozen
    if freeze:
        gc.freeze()
    gc.set_threshold(*BULK_GC_THRESHOLD)
    try:
        yield
    finally:
        gc.set_threshold(*old)
        if freeze:
            gc.unfreeze()


class PipelineStopped(Exception):
    """The pipeline stopped on an error an operator must act on (the message says what and where)."""


class SourceUnreachable(PipelineStopped):
    """Kafka cannot be reached or refuses us (exit code 5, like an unreachable target).

    ``cause`` is the Java client's exception chain as text (:func:`java_text`) when there is one, ``reason`` its
    one-line summary; ``running`` says it ended a running query (not found at start). A running pipeline starts
    over from the progress tables after a ``transient`` one, for ``source.retry_seconds`` (``_run_retrying``)."""

    def __init__(self, message: str, *, cause: str = "", reason: str = "", running: bool = False) -> None:
        super().__init__(message)
        self.cause = cause
        self.reason = reason or java_summary(cause) or message
        self.running = running

    @property
    def transient(self) -> bool:
        return kafka_transient(self.cause)


class TargetLost(PipelineStopped):
    """The target failed while running and did not come back within ``target.retry_seconds`` (exit code 5)."""


def java_cause(exc: BaseException) -> str:
    """The innermost Java exception of a py4j error, as ``Class: message``: py4j's own text is only "An error
    occurred while calling o46.listTopics", which names no cause."""
    jexc = getattr(exc, "java_exception", None)
    if jexc is None:
        return str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
    seen = 0
    while jexc.getCause() is not None and seen < 20:
        jexc = jexc.getCause()
        seen += 1
    return str(jexc.toString())[:300]


def java_text(exc: BaseException) -> str:
    """The Java exception chain behind a PySpark or py4j error (and the errors it was raised from), as Java prints
    it: ``Class: message`` lines, stack frames, ``Caused by:`` lines. '' for a plain Python error."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen and len(seen) < 20:
        seen.add(id(cur))
        trace = getattr(cur, "_stackTrace", None)  # pyspark's CapturedException (StreamingQueryException, ...)
        if isinstance(trace, str) and trace:
            parts.append(trace)
        elif getattr(cur, "java_exception", None) is not None:  # py4j's Py4JJavaError: str() asks the JVM
            with contextlib.suppress(Exception):
                parts.append(str(cur))
        cur = cur.__cause__ or cur.__context__
    return "\n".join(parts)


_JAVA_FRAME = re.compile(r"^\s+(at |\.\.\. \d+ more)|^\s*$")
# What says a Kafka outage: the client gave up waiting for a broker (its TimeoutException, whatever the call), lost
# its connection, or found no leader; the Spark source's own words when it cannot get offsets or metadata.
_KAFKA_TRANSIENT = re.compile(
    r"org\.apache\.kafka\.common\.errors\.(TimeoutException|DisconnectException|NetworkException"
    r"|LeaderNotAvailableException|NotLeaderOrFollowerException|BrokerNotAvailableException"
    r"|CoordinatorNotAvailableException)"
    r"|position for partition \S+ could (not )?be determined"
    r"|[Ff]ailed to (fetch|get|update) (topic )?metadata|Timeout expired while fetching topic metadata")
# What no waiting repairs: a refused login or permission, a topic that is gone, data that is gone (failOnDataLoss:
# Kafka no longer holds a restart offset), a bad configuration.
_KAFKA_FATAL = re.compile(
    r"Authentication|Authorization|SaslException|SSLHandshakeException|IllegalSaslState"
    r"|UnknownTopicOrPartition|InvalidTopicException|do(es)? not exist"
    r"|failOnDataLoss|OffsetOutOfRange|data (may have been|was) lost|DATA_LOSS|ConfigException")


def kafka_transient(text: str) -> bool:
    """Whether a failure of the Kafka source, given as the Java exception chain's text (:func:`java_text`), is an
    outage that passes -- brokers down, restarting or unreachable -- so the run may start over from the progress
    tables (invariant 14), rather than one no waiting repairs (authentication, authorization, a missing topic, data
    lost under ``failOnDataLoss``), which stays a stop. Only the exception lines are read, not the stack frames."""
    lines = "\n".join(ln for ln in text.splitlines() if not _JAVA_FRAME.match(ln))
    return bool(_KAFKA_TRANSIENT.search(lines)) and not _KAFKA_FATAL.search(lines)


_JAVA_EXCEPTION = re.compile(r"[a-z][\w$]*(\.[\w$]+)+(Exception|Error)\b")


def java_summary(text: str) -> str:
    """One line for a Java exception chain's text: its innermost cause (``Class: message``), else its first
    exception line (py4j's start with ": "), else its first line."""
    lines = [ln.strip() for ln in text.splitlines() if not _JAVA_FRAME.match(ln)]
    causes = [ln[len("Caused by: "):] for ln in lines if ln.startswith("Caused by: ")]
    exceptions = [ln.lstrip(": ") for ln in lines if _JAVA_EXCEPTION.match(ln.lstrip(": "))]
    return (causes[-1] if causes else exceptions[0] if exceptions else lines[0] if lines else "")[:300]


# Spark's and the Kafka client's loggers that turn one Kafka outage into hundreds of lines on stderr: the client's
# "Connection to node -1 could not be established" every second, the source's "Error in attempt N getting Kafka
# offsets" with a stack trace, the query's "terminated with error" with another. The run reports each of these
# failures itself, in one line (a failure it cannot place gets its Java trace from _run).
QUIET_LOGGERS = {
    "org.apache.kafka": "ERROR",
    "org.apache.spark.sql.kafka010": "ERROR",
    "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution": "OFF",
}


def quiet_spark_logs(spark) -> None:
    """Set :data:`QUIET_LOGGERS`' levels in the driver's log4j2 (the root level stays Spark's)."""
    try:
        jvm = spark.sparkContext._jvm
        configurator = jvm.org.apache.logging.log4j.core.config.Configurator
        for name, level in QUIET_LOGGERS.items():
            configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.getLevel(level))
    except Exception as exc:  # a JVM without log4j2 core: louder logs, nothing else
        log.debug("could not set Spark's log levels: %s", exc)


def check_brokers_reachable(settings: Settings, timeout: float = 5.0) -> None:
    """Ask the bootstrap servers' ports before Spark starts: the Kafka client would retry silently until its
    API timeout and then name no host."""
    import socket

    errors = []
    for item in settings.source.bootstrap_servers.split(","):
        host, _, port = item.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return
        except (OSError, ValueError) as exc:
            errors.append(f"{item.strip()} ({getattr(exc, 'strerror', None) or exc})")
    raise SourceUnreachable(
        f"cannot connect to any Kafka bootstrap server: {', '.join(errors)}. Check source.bootstrap_servers and "
        "that the brokers run and are reachable from this host")


def missing_topics(settings: Settings, missing: list[str]) -> ConfigError:
    return ConfigError(
        "source.topics", f"topic(s) {', '.join(missing)} do not exist on {settings.source.bootstrap_servers} (or "
        "this client may not describe them): create them or start the TiCDC changefeed first, or fix the name",
        source=str(settings.source_path or "<config>"))


def check_kafka_access(settings: Settings, timeout: float = 10.0) -> None:
    """Before Spark starts, within ``timeout`` seconds: Kafka accepts this client's login and TLS (a refused login, a
    certificate that does not verify or names another host: exit 5 naming the ``[source.kafka]`` key and the fix,
    :mod:`applier.kafka_security`), and a topic of ``source.topics`` that Kafka does not have is a configuration
    error. librdkafka asks, with ``[source.kafka]``'s security settings mapped to its names; when they have no
    librdkafka form, or the brokers do not answer in time, the check is left (logged at INFO) to the JVM client's
    in :func:`kafka_partitions`, which names the same errors once Spark has started."""
    mode, _ = settings.source.subscription()
    kafka = settings.source.kafka
    try:
        security = librdkafka_security(kafka)
    except KafkaSettingError as exc:
        raise ConfigError(exc.key, exc.message, source=str(settings.source_path or "<config>")) from None
    if security is None:
        log.info("[source.kafka] has security settings librdkafka cannot take: Kafka's login and the topics are "
                 "checked once Spark has started")
        return
    if mode != "subscribe" and not security:
        return  # nothing to check: a pattern may match topics created later, and there is no login
    found = probe(settings.source.bootstrap_servers, security, kafka, timeout=timeout)
    if found.refused is not None:
        raise SourceUnreachable(found.refused.message(settings.source.bootstrap_servers), reason=found.refused.reason)
    if found.topics is None:
        log.info("could not list the topics before Spark starts (%s); they are checked once it has",
                 found.errors[-1] if found.errors else "no answer")
        return
    missing = [t for t in settings.source.topics or () if t not in found.topics] if mode == "subscribe" else []
    if missing:
        raise missing_topics(settings, missing)


@dataclass
class RunResult:
    batches: int
    report: BatchReport
    gate: dict[str, int] = field(default_factory=dict)  # the gate's counters: duplicates dropped, spills
    stopped_at: int | None = None  # the --until-ts the run stopped at: the replica is consistent as of exactly it
    signal: int | None = None  # the SIGINT/SIGTERM/SIGHUP the run stopped on (after its current micro-batch)


def kafka_partitions(spark, settings: Settings) -> list[tuple[str, int]]:
    """Every partition of every subscribed topic, asked of Kafka through the JVM client Spark already has,
    with the same kafka.* settings the source uses."""
    jvm = spark.sparkContext._jvm
    props = jvm.java.util.Properties()
    props.put("bootstrap.servers", settings.source.bootstrap_servers)
    props.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer")
    props.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer")
    props.put("default.api.timeout.ms", "30000")
    for k, v in settings.source.kafka.items():
        props.put(k, v)
    consumer = jvm.org.apache.kafka.clients.consumer.KafkaConsumer(props)
    try:
        try:
            topics = consumer.listTopics()
        except Exception as exc:
            reason = java_cause(exc)
            refused = refusal(java_text(exc) or reason, settings.source.kafka)
            if refused is not None:
                raise SourceUnreachable(refused.message(settings.source.bootstrap_servers), cause=java_text(exc),
                                        reason=refused.reason) from None
            raise SourceUnreachable(
                f"cannot list topics on {settings.source.bootstrap_servers} (config key source.bootstrap_servers, "
                f"and [source.kafka] for security settings): {reason}", cause=java_text(exc) or reason, reason=reason,
            ) from None
        names = [str(t) for t in topics.keySet().toArray()]
        mode, value = settings.source.subscription()
        if mode == "subscribe":
            wanted = [t.strip() for t in value.split(",") if t.strip()]
            missing = [t for t in wanted if t not in names]
            if missing:
                raise missing_topics(settings, missing)
        else:
            import re
            rx = re.compile(value)
            wanted = sorted(t for t in names if rx.fullmatch(t))
        out = []
        for t in wanted:
            for info in topics.get(t).toArray():
                out.append((t, int(info.partition())))
        return sorted(out)
    finally:
        consumer.close()


# ---- wiring: the runtime objects a configuration describes (Settings stays plain data) ----------------------

def decoder_for(settings: Settings) -> Decoder:
    """A new decoder for the source's protocol, with its ``[source.codec]`` options."""
    return get_decoder(settings.source.protocol, **dict(settings.source.codec))


def remote_apply(spark, settings: Settings, store: ProgressStore) -> Any:
    """The Spark side of the apply streams when ``[target] apply_on`` puts them on the executors (None: threads of
    the driver); ``store`` must have claimed the writer epoch, which the tasks write under (invariant 13)."""
    if not settings.applies_on_executors():
        return None
    from applier.streams.remote import RemoteApply, RemoteContext

    return RemoteApply(spark, RemoteContext(settings, store.epoch))


def starting_offsets(parts: list[tuple[str, int]], restart: dict[tuple[str, int], int], default: str) -> str:
    """The Kafka source's startingOffsets JSON: restart offsets where known, else earliest (-2) or latest (-1)."""
    fallback = -1 if default == "latest" and not restart else -2
    doc: dict[str, dict[str, int]] = {}
    for topic, part in parts:
        doc.setdefault(topic, {})[str(part)] = restart.get((topic, part), fallback)
    return json.dumps(doc)


def seed_start_ts(state: PipelineState, start_ts: int | None, pipeline: str) -> None:
    """``source.start_ts``: a new pipeline (no row in applier_pipelines) starts as if its replica were consistent
    as of that TSO already, because it was seeded from a snapshot there (Dumpling or BR at the TSO, then a
    changefeed created with ``--start-ts`` of it). Its applied resolved ts becomes the TSO, so the gate drops
    every change committed at or before it (invariant 4's rule, which the snapshot makes true) and applies the
    rest. A pipeline with progress resumes from what it recorded: that is where its replica is now, whatever the
    configuration says."""
    if start_ts is None:
        return
    if not state.exists:
        state.applied_ts = start_ts
        log.info("pipeline %s is new: starting from source.start_ts %d (changes committed at or before it are in "
                 "the replica's snapshot and are skipped)", pipeline, start_ts)
        return
    log.warning("source.start_ts = %d is ignored: pipeline %s already has progress in applier_pipelines (applied "
                "resolved ts %d) and resumes from it. start_ts only seeds a new pipeline; to start a replica again "
                "from a snapshot, give it a new pipeline.name", start_ts, pipeline, state.applied_ts)


def check_until_ts(settings: Settings, until_ts: int | None) -> None:
    """``applier run --until-ts`` needs a gated stream: only resolved ts say that every change up to the TSO has
    arrived, and only commit-ts order makes the replica consistent as of it. An ungated stream (no watermark,
    applied in offset order, often without commit ts) could only guess, so it is refused before anything starts."""
    if until_ts is None or decoder_for(settings).gated:
        return
    raise ConfigError(
        "--until-ts", f'source.protocol = "{settings.source.protocol}" with these [source.codec] options has no '
        "resolved ts: nothing says when every change up to the TSO has arrived, and its changes are applied in "
        "offset order, so the replica is never consistent as of one TSO. Stop the run yourself, or use a gated "
        "changefeed (open, simple, canal-json with enable-tidb-extension=true, debezium with gated = true, avro "
        "with enable_watermark = true)", source="command line")


def until_ts_reached(state: PipelineState, until_ts: int | None, pipeline: str) -> bool:
    """Whether the progress loaded at start already stands at ``until_ts`` (then there is nothing to apply; a
    live query would wait for data for ever). A replica already past it cannot go back: refused."""
    if until_ts is None or state.applied_ts < until_ts:
        return False
    if state.applied_ts > until_ts:
        raise ConfigError(
            "--until-ts", f"pipeline {pipeline} has already applied up to TSO {state.applied_ts} "
            f"(applier_pipelines.applied_ts), past {until_ts}: a replica cannot go back. Give a TSO at or after "
            f"{state.applied_ts}, or seed a new replica from a snapshot at or before {until_ts} (source.start_ts, "
            "a new pipeline.name)", source="command line")
    return True


class _Lock:
    """One running instance per pipeline: a second one would interleave progress writes."""

    def __init__(self, path: Path, pipeline: str = "") -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.pipeline = pipeline
        self.fh = open(path, "a+")

    def __enter__(self) -> "_Lock":
        try:
            fcntl.flock(self.fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.seek(0)
            holder = self.fh.read(200).strip()
            self.fh.close()
            raise PipelineStopped(
                f"pipeline {self.pipeline} is already running on this host"
                + (f" ({holder})" if holder else "")
                + f": another applier run holds {self.path} (pipeline.local_dir). Stop that one first (SIGINT or "
                "SIGTERM to it), or give this configuration another pipeline.name"
            ) from None
        self.fh.seek(0)
        self.fh.truncate()
        self.fh.write(f"pid {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S %z')}")
        self.fh.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fh, fcntl.LOCK_UN)
        self.fh.close()


def run(settings: Settings, *, until_caught_up: bool = False, until_ts: int | None = None, spark=None,
        progress: bool | None = None, timer: StageTimer = NO_TIMING) -> RunResult:
    """Run the pipeline: drain the backlog and stop (``until_caught_up``), or keep applying until stopped.
    ``until_ts`` (a TSO; gated protocols only) stops the run once the applied resolved ts reaches it, with nothing
    committed after it applied: the replica is then consistent as of exactly that TSO (``RunResult.stopped_at``),
    and a later run continues from there. With ``until_caught_up`` too, whichever comes first ends the run.
    ``timer`` receives every stage's durations (applier.timing; the benchmark uses it). With ``[metrics] port``
    the run serves Prometheus metrics, which see the same durations (and pass them on to ``timer``).
    Called on the main thread, SIGINT, SIGTERM and SIGHUP stop the run: the query stops, the micro-batch being
    applied finishes (one read meanwhile is left to the next run) and ``RunResult.signal`` names the signal."""
    logs.set_pipeline(settings.pipeline.name)  # every log line names it (applier.logs)
    check_until_ts(settings, until_ts)
    # The lock first: a second run of a running pipeline is told so before it asks Kafka or binds the metrics port.
    # A stop signal from here on stops the run where it stands (applier.crashguard.STOP: main thread only).
    with STOP.handling(), _Lock(settings.pipeline.local_dir / "applier.lock", settings.pipeline.name):
        check_brokers_reachable(settings)
        check_kafka_access(settings)  # a refused login or certificate, a missing topic: found before Spark starts
        served = serve_metrics(settings, timer)
        if served is not None:
            timer = served.metrics
        engine = make_engine(settings, load_data=True)
        try:
            engine = settle_load_data(engine, settings)
            migrate.upgrade(engine)
            dialect = dialect_for(engine)
            if STOP.requested:  # asked to stop while starting: nothing read, nothing to finish
                return RunResult(0, BatchReport(), signal=STOP.signum)
            own_spark = spark is None
            if own_spark:
                spark = spark_session(settings, owns_jvm=True)
                STOP.install()  # pyspark installed its own SIGINT handler, which re-enters py4j (see StopRequest)
            try:
                if STOP.requested:
                    return RunResult(0, BatchReport(), signal=STOP.signum)
                with bulk_gc():
                    res = _run_retrying(settings, spark, engine, dialect, until_caught_up, progress, timer,
                                        until_ts=until_ts)
                res.signal = STOP.signum
                return res
            finally:
                if own_spark:  # a stop signal: no class archive is written (close_session), the stop stays prompt
                    close_session(spark, keep_archive=not STOP.requested)
        finally:
            engine.dispose()
            if served is not None:
                served.close()


def serve_metrics(settings: Settings, timer: StageTimer) -> Any:
    """The metrics endpoint and its Kafka end-offset reader, when ``[metrics] port`` is set (imported only
    then: prometheus_client is loaded by runs that serve metrics)."""
    if not settings.metrics.port:
        return None
    from applier.metrics import ServedMetrics

    return ServedMetrics.start(settings, inner=timer)


def _query_failure(exc: BaseException, source_lost: list[SourceUnreachable], settings: Settings) -> PipelineStopped:
    """The error that ended the Spark query, as ``_run`` raises it: the partition refresh's failure to list the topics,
    a Kafka outage (:func:`kafka_transient`: ``_run_retrying`` starts over), or anything else, whose Java trace is
    logged here (the query's own error log is off: :data:`QUIET_LOGGERS`)."""
    if source_lost:
        return source_lost[0]
    lost = _kafka_lost(exc, settings)
    if lost is not None:
        return lost
    text = java_text(exc)
    refused = refusal(text, settings.source.kafka) if text else None
    if refused is not None:  # a login or certificate refused while running (a rotated password): no retry repairs it
        return SourceUnreachable(refused.message(settings.source.bootstrap_servers), cause=text, reason=refused.reason,
                                 running=True)
    if text:
        log.error("the Spark query failed:\n%s", text)
    return PipelineStopped(f"the Spark query stopped: {str(exc).splitlines()[0][:800]}")


def _kafka_lost(exc: BaseException, settings: Settings) -> SourceUnreachable | None:
    """``exc`` (the query's failure, or reading a micro-batch's records) as a Kafka outage, else None."""
    text = java_text(exc)
    if not kafka_transient(text):
        return None
    reason = java_summary(text)
    return SourceUnreachable(f"the Kafka source failed reading {settings.source.bootstrap_servers} "
                             f"(source.bootstrap_servers): {reason}", cause=text, reason=reason, running=True)


class OutageClock:
    """When the current outage began and how many tries it has failed, for ``_run_retrying``: the first failure
    after the last applied batch begins an outage, whose retry budget counts from there and whose backoff starts
    again at the shortest wait (0.5 s, doubling per failed try up to 15 s). ``_run`` calls ``batch_applied()``."""

    def __init__(self, now: Callable[[], float] = time.monotonic, *, shortest: float = 0.5,
                 longest: float = 15.0) -> None:
        self._now = now
        self.shortest, self.longest = shortest, longest
        self.applied = now()  # when the last batch applied (the start counts as one)
        self.began: float | None = None  # the current outage's first failure
        self.last: float | None = None  # the latest failure
        self.tries = 0  # failed tries in the current outage

    def batch_applied(self) -> None:
        self.applied = self._now()

    def failed(self) -> None:
        now = self._now()
        if self.last is None or self.applied > self.last:  # a batch applied since the last failure: a new outage
            self.began, self.tries = now, 0
        self.tries += 1
        self.last = now

    def wait(self) -> float:
        """Seconds to wait before the next try."""
        return min(self.longest, self.shortest * 2 ** (self.tries - 1))

    def spent(self) -> float:
        """Seconds since the current outage began."""
        return 0.0 if self.began is None else self._now() - self.began


def _sleep_unless_stopped(seconds: float) -> None:
    """The backoff between tries, ended at once by a stop signal (the retry loop then returns): everything
    committed is consistent, and an operator stopping a run must not wait for an outage's budget to run out."""
    end = time.monotonic() + seconds
    while not STOP.requested and (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.25))


def _run_retrying(settings: Settings, spark, engine: Engine, dialect: Dialect, until_caught_up: bool,
                  progress: bool | None, timer: StageTimer = NO_TIMING, *, until_ts: int | None = None,
                  clock: OutageClock | None = None, sleep: Callable[[float], None] | None = None) -> RunResult:
    """Invariant 14: a transient fault is not a failure. A target fault (lost connection, restart, deadlock,
    lock-wait timeout) rolled back the transaction with its progress; a Kafka outage (brokers down or unreachable:
    the running query failed, or the partition refresh or a restart could not list the topics; see
    :func:`kafka_transient`) left the progress as the last commit made it. Either way the run starts over from the
    progress tables (a new query, the same Spark session) -- the crash-recovery path, which replays exactly the
    transactions that did not commit -- with exponential backoff, for ``target.retry_seconds`` (a target fault)
    or ``source.retry_seconds`` (a Kafka outage), counted from the first failure after the last batch that
    applied. Kafka found unusable at start (the first try, before a query ran) is not retried."""
    from tenacity import Retrying

    from applier.sinks import db_reason

    clock = clock or OutageClock()
    servers = settings.source.bootstrap_servers
    quiet_spark_logs(spark)

    def kafka_outage(exc: BaseException | None, attempt: int) -> bool:
        return isinstance(exc, SourceUnreachable) and (exc.running or attempt > 1) and exc.transient

    def transient(state) -> bool:
        exc = state.outcome.exception()
        return exc is not None and (dialect.is_transient(exc) or kafka_outage(exc, state.attempt_number))

    def budget(exc: BaseException | None) -> int:
        return settings.source.retry_seconds if isinstance(exc, SourceUnreachable) else settings.target.retry_seconds

    def note(state) -> None:
        exc = state.outcome.exception()
        if isinstance(exc, SourceUnreachable):
            log.warning("Kafka failed while running (%s, source.bootstrap_servers = %s); starting over from the "
                        "progress tables in %.1f s (source.retry_seconds = %d)", exc.reason, servers,
                        state.next_action.sleep, budget(exc))
        else:
            log.warning("the target failed while running (%s); starting over from the progress tables in %.1f s "
                        "(target.retry_seconds = %d)", db_reason(exc), state.next_action.sleep, budget(exc))

    retrying = Retrying(retry=transient, after=lambda state: clock.failed(), wait=lambda state: clock.wait(),
                        stop=lambda state: clock.spent() >= budget(state.outcome.exception()), reraise=True,
                        before_sleep=note, sleep=sleep or _sleep_unless_stopped)
    try:
        for attempt in retrying:
            if STOP.requested and attempt.retry_state.attempt_number > 1:
                log.info("stopping on %s during the outage, before starting over", STOP.name)
                return RunResult(0, BatchReport(), signal=STOP.signum)
            with attempt:
                return _run(settings, spark, engine, dialect, until_caught_up, progress, clock, timer,
                            until_ts=until_ts)
    except SourceUnreachable as exc:
        if not (clock.tries or exc.running) or not exc.transient:
            raise  # at start, or not an outage (a refused login, a missing topic): as it is
        raise SourceUnreachable(
            f"lost Kafka while running: {servers} (source.bootstrap_servers) did not come back within "
            f"source.retry_seconds = {budget(exc)}: {exc.reason}. Everything committed is consistent (progress "
            "commits with the data); rerun once the brokers answer", cause=exc.cause, reason=exc.reason,
            running=True) from None
    except Exception as exc:
        if not dialect.is_transient(exc):
            raise
        raise TargetLost(
            f"lost the target database while running and it did not come back within target.retry_seconds = "
            f"{budget(exc)}: {db_reason(exc)}. Everything committed is consistent (progress commits with the data); "
            "rerun once the database answers") from exc
    raise AssertionError("unreachable")


def _run(settings: Settings, spark, engine: Engine, dialect: Dialect, until_caught_up: bool, progress: bool | None,
         mark: OutageClock, timer: StageTimer = NO_TIMING, *, until_ts: int | None = None) -> RunResult:
    # Everything that can refuse this environment comes first (Spark session and executors, checkpoint, topics):
    # only a run that can work takes the pipeline over from another writer.
    query_dir = reset_checkpoint(spark, settings)
    spec = worker_spec(settings)
    placement = DecodePlacement.for_settings(settings)
    if placement.executors:
        warm_python_workers(spark, settings, spec)
    parts = kafka_partitions(spark, settings)
    guard = None
    if placement.driver:
        marker = DecodingMarker(settings.pipeline.local_dir)
        killers = recover_from_decoder_crash(spark, settings, marker)
    store = ProgressStore(settings.pipeline.name, settings.source.protocol)
    store.claim(engine)  # invariant 13: fence any older writer of this pipeline, then read what it committed
    with engine.connect() as conn:
        state = store.load(conn)
        seed_start_ts(state, settings.source.start_ts, settings.pipeline.name)
        timer.resumed(state)
        if placement.driver:
            # messages that killed the decoder before stay undecoded when a replay reads them again
            guard = DriverDecodeGuard(marker, {**store.quarantined_with(conn, KILLED), **killers},
                                      settings.source.protocol)
    if until_ts_reached(state, until_ts, settings.pipeline.name):
        log.info("the applied resolved ts is already --until-ts %d: nothing to apply", until_ts)
        return RunResult(0, BatchReport(applied_ts=state.applied_ts), stopped_at=until_ts)
    restart = {tp: cp.restart_offset for tp, cp in state.checkpoints.items()}
    offsets = starting_offsets(parts, restart, settings.source.starting_offsets)
    spill_dir = str(settings.pipeline.spill_dir)
    shutil.rmtree(spill_dir, ignore_errors=True)  # spilled runs of a previous process are rebuilt from Kafka
    router = router_for(settings)
    remote = remote_apply(spark, settings, store)
    processor = BatchProcessor(
        engine=engine, decoder=decoder_for(settings), route=router.route,
        store=store, state=state, partitions=parts, on_decode_error=settings.pipeline.on_decode_error,
        decode_error_policy=router.decode_error_policy, stops_at_decode_error=settings.stops_at_decode_error(),
        budget_bytes=settings.pipeline.buffer_memory_bytes, spill_dir=spill_dir,
        guard=guard, timer=timer, dialect=dialect, until_ts=until_ts, max_skew_ms=settings.source.max_clock_skew_ms,
        columnar=settings.pipeline.columnar, apply_streams=settings.target.apply_streams,
        remote=remote, one_transaction=settings.apply_form() == "one_transaction",
        **applier_options(settings, router),
    )
    line = ProgressLine(enabled=sys.stderr.isatty() if progress is None else progress)
    last_refresh = [time.monotonic()]  # when the Spark thread last listed the partitions
    query_box: list = []
    source_lost: list[SourceUnreachable] = []  # the partition refresh could not list the topics: the query stops
    at_until_ts = threading.Event()  # the applied resolved ts reached until_ts: the query is being stopped

    log.info("decoding %s records in %s", settings.source.protocol, placement.describe())
    if settings.target.apply_streams > 1:
        log.info("applying in %d streams, %s", settings.target.apply_streams, _FORMS[settings.apply_form()])

    def apply_batch(item: ReadBatch) -> None:
        """Runs on the hand-off thread: the only thread that touches the processor and its gate."""
        batch_id = item.batch_id
        if at_until_ts.is_set() or STOP.requested:  # read while the query stops: left to the next run (the
            return  # progress tables say so)
        if item.partitions is not None:
            processor.gate.add_partitions(item.partitions)
        rep = processor.process_chunks(item.payload) if item.chunks else processor.process(item.payload)
        placement.saw(rep.events)
        mark.batch_applied()
        timer.applied(rep, processor.gate)
        line.update(rep, processor.totals)
        log.info("batch %d: %d messages, %d rows, %d DDL, applied ts %d, held %d", batch_id, rep.messages,
                 rep.applied.rows, rep.applied.ddls, rep.applied_ts, rep.held)
        if processor.gate.reached_until_ts:
            # the gate released nothing past until_ts and the progress committed applied_ts = until_ts: stop the
            # query the way a failed batch does; what is held above it stays in the restart offsets
            at_until_ts.set()
            log.info("the applied resolved ts reached --until-ts %d: stopping", until_ts)
            stop_query(None)

    def stop_query(exc: BaseException | None) -> None:
        # a failed batch stops the query at once, also when it is idle waiting for new data
        if query_box:
            threading.Thread(target=query_box[0].stop, name="applier-stop", daemon=True).start()

    work = logs.per_batch(apply_batch, pipeline=settings.pipeline.name)  # its log lines name the batch
    handoff: BatchHandoff[ReadBatch] = BatchHandoff(work, on_error=stop_query)

    def on_batch(df, batch_id: int) -> None:
        with logs.batch_context(batch_id, settings.pipeline.name), timer.span("on_batch"):
            try:
                _on_batch(df, batch_id)
            except Exception as exc:
                lost = _kafka_lost(exc, settings)  # reading the batch's records met a Kafka outage
                if lost is None:
                    raise
                source_lost.append(lost)  # as at the partition refresh: stop, the next try reads the batch again
                stop_query(lost)
                return
        timer.count("batches", 1)

    def _on_batch(df, batch_id: int) -> None:
        handoff.raise_if_failed()
        if source_lost:  # Kafka was lost and the query is stopping: nothing more is applied, the next try reads it
            return
        new_parts = None
        if time.monotonic() - last_refresh[0] > PARTITION_REFRESH_SECONDS:
            # here, not on the apply thread: the JVM consumer's 20-40 ms overlap the previous batch's apply
            with timer.span("partition_refresh"):
                try:
                    new_parts = kafka_partitions(spark, settings)
                except SourceUnreachable as exc:
                    # stop the query (rather than fail it: Spark would log the Python traceback it wraps) and leave
                    # this batch and any later one to the next try, which starts from the progress tables; _run
                    # raises it once the query has stopped
                    exc.running = True
                    source_lost.append(exc)
                    stop_query(exc)
                    return
            last_refresh[0] = time.monotonic()
        on_executors = placement.on_executors()
        if on_executors:
            bspec = with_schemas(spec, processor.decoder)  # Simple: the schemas the driver knows now
            try:
                payload = read_chunks(df, bspec, placement.tasks(spark.sparkContext.defaultParallelism))
            except Exception as exc:
                if not worker_crashed(exc):
                    raise
                log.error("batch %d: a Spark Python worker died decoding it; decoding it again in child processes "
                          "to find the message that kills the decoder", batch_id)
                payload = decode_isolated(bspec, read_messages(df))
        else:
            payload = read_messages(df)
        with timer.span("submit_wait"):
            handoff.submit(ReadBatch(batch_id, on_executors, payload, new_parts))  # waits for the previous batch,
            # raises its error

    cancelled_at_stop: list[bool] = []  # the window being written in Spark tasks was cancelled by a stopping run
    interrupted: list[BaseException] = []  # the query failed or was interrupted (not a caught-up end)

    def drain() -> None:
        stopping = (not until_caught_up or STOP.requested or at_until_ts.is_set() or bool(source_lost)
                    or bool(interrupted) or handoff.error is not None)
        if remote is None or not stopping:
            handoff.close()
        elif handoff.close_within(STOP_APPLY_GRACE_SECONDS, remote.cancel) and not cancelled_at_stop:
            cancelled_at_stop.append(True)
            log.warning("the window being written in Spark tasks was not done %.0f s after the run began to stop: its "
                        "job was cancelled; what its shares committed stays (each stream commits its rows with its "
                        "progress) and the next run applies the rest", STOP_APPLY_GRACE_SECONDS)

    reader = spark.readStream.format("kafka")
    for k, v in settings.source.spark_options().items():
        reader = reader.option(k, v)
    # fetchOffset.numRetries: one try of the source's offset request (each waits default.api.timeout.ms, 60 s) rather
    # than Spark's three, so that Kafka gone fails the query within a minute and _run_retrying's tries, each a
    # warning, start over instead of Spark waiting three minutes in silence before the same failure
    reader = (reader.option("startingOffsets", offsets).option("failOnDataLoss", "true")
              .option("fetchOffset.numRetries", "1")
              .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger(settings))))
    writer = reader.load().writeStream.foreachBatch(on_batch).option("checkpointLocation", query_dir)
    writer = writer.trigger(availableNow=True) if until_caught_up else writer.trigger(
        processingTime=settings.pipeline.trigger_interval)
    try:
        query = writer.start()
        query_box.append(query)
        if at_until_ts.is_set():  # reached by a batch that ran before the query was in query_box
            stop_query(None)
        # SIGINT/SIGTERM/SIGHUP (applier.crashguard.STOP): stop the query, quietly (Spark logs a stopped query's
        # cancelled read as warnings and errors); the batch being applied finishes below (handoff.close)
        forget_stop = STOP.when_requested(lambda: (silence(spark), query.stop()))
        try:
            while not query.awaitTermination(1):  # back in Python every second, so a signal is handled at once
                pass
        except KeyboardInterrupt as exc:
            interrupted.append(exc)
            query.stop()
        except Exception as exc:
            interrupted.append(exc)
            if handoff.error is None and not at_until_ts.is_set() and not STOP.requested:
                raise _query_failure(exc, source_lost, settings) from exc
        finally:
            forget_stop()
        with timer.span("drain"):
            drain()  # the last handed-over batch is applied before run() returns
    finally:
        drain()
        line.close()
        processor.close()
    if handoff.error is not None and not cancelled_at_stop:
        raise handoff.error from None
    if source_lost:
        raise source_lost[0]
    return RunResult(processor.batches, processor.totals, dict(processor.gate.stats),
                     stopped_at=until_ts if at_until_ts.is_set() else None)
