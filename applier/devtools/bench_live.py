"""Live-mode benchmark (issue 15, points 3 and 5): staleness at a steady rate, start-up time, 1-message batches.

Run through ``python -m applier.devtools.bench`` (``--live RATE --duration S``, ``--sweep 5k,10k,30k``,
``--startup N``, ``--micro-batch N``); see docs/benchmarks.md, "Round 4".

**Live staleness.** A producer *process* (spawned, so its encoding does not take the driver's GIL) writes a
TiCDC-shaped changefeed (:class:`LiveWorkload`, the bench workload with commit ts taken from the wall clock) at
a steady RATE of row changes per second, with a resolved ts on every partition every second (TiCDC's
default). ``--producer encode`` (Open Protocol's) runs the test encoder for every row, 40-60 µs of CPU each,
which caps it near 9k rows/s here; ``--producer pooled`` (Canal-JSON's default) encodes a pool of
``--pool-rows`` row changes before the start and replays it in whole passes with live commit ts substituted into
the bytes, about 3 µs per row (:mod:`applier.devtools.bench_pool`, which also says why the checksums still hold).
The applier runs in this process the way ``applier run`` does (``applier.pipeline.run`` without
``until_caught_up``: the ``processingTime`` trigger), and a timer thread stops its query after warm-up + S s.

What is measured, per applied target transaction: ``commit time - physical time of the resolved ts it
applied`` (TSO >> 18 is milliseconds since the epoch; the producer takes it from the same clock the driver
reads). The commit time is observed in-process through the pipeline's own stage-timer hook
(:mod:`applier.timing`): the end of the ``commit`` span (right after the DBAPI ``commit()`` returned), paired
with the ``applied`` event that follows it with the batch's applied resolved ts. Error bound: the commit is
durable before ``commit()`` returns, so the recorded time is late by at most one client round trip plus the
span's own bookkeeping (well under 1 ms here); both clocks are the same host clock. Polling the progress
table from another connection was the alternative and was not used: its error is the polling interval, and
it adds load to the target being measured.

Reported on top of the per-commit figure:
* per resolved ts emitted: when the applied ts first reached it (covers resolved ts that a batch skipped by
  applying a later one); resolved ts still unapplied at the stop count with ``stop - emitted`` (a lower bound);
* the replica's age just before each commit (``commit time - physical time of the previously applied resolved
  ts``): the peak of the saw-tooth a reader of the replica sees, which includes the 1 s upstream cadence.

After the stop the producer writes a final resolved ts, the pipeline catches up (``until_caught_up``) and the
target's per-table checksums are compared with the producer's (``--no-verify`` skips this).

**Start-up** (``--startup N``): N fresh interpreters, each running the applier's start path in-process with
time stamps: interpreter start, imports, configuration, Spark session, then inside ``run()``: broker check,
target engine + migrations, checkpoint reset, partition listing, claim + progress load, query start to the first
``foreachBatch``, first micro-batch to its commit. The stages inside ``run()`` that have no timer hook are timed
by wrapping the module-level functions ``run()`` calls (in that child process only; the wrapper fails loudly if
a name disappears).

**1-message micro-batches** (``--micro-batch N``): a one-partition topic of N one-row transactions with a
resolved ts every few transactions, applied with ``max_offsets_per_trigger = 1`` (every micro-batch is one
message), per-batch medians from the stage timer; then Spark alone on the same topic with the same trigger
(``foreachBatch`` doing nothing / ``toArrow()`` / ``mapInArrow`` + ``toArrow()``): Spark's own fixed cost per batch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from applier.devtools.bench_parts import StageClock, safe_name, system_cpu_ticks

LOGICAL_BITS = 18
MAX_LOGICAL = (1 << LOGICAL_BITS) - 1
STALENESS_LIMIT_S = 2.0


# ---------------------------------------------------------------------------------------------------------
# Pure parts (tests/unit/test_bench_live.py)
# ---------------------------------------------------------------------------------------------------------

def physical_ms(ts: int) -> int:
    """The physical part of a TiDB TSO: milliseconds since the Unix epoch."""
    return ts >> LOGICAL_BITS


def compose_tso(ms: int, logical: int = 0) -> int:
    if not 0 <= logical <= MAX_LOGICAL:
        raise ValueError(f"logical part {logical} out of range")
    return (ms << LOGICAL_BITS) | logical


def wall_ms() -> int:
    return int(time.time() * 1000)


class TsoClock:
    """Commit ts and resolved ts from a wall clock, with PD's guarantees: strictly increasing commit ts, and no
    commit ts ever at or below a resolved ts already handed out (the gate would drop such a row as already
    applied: invariant 4). A resolved ts covers its whole millisecond (logical part all ones), so the commit ts
    after it move to the next millisecond even when the wall clock has not."""

    def __init__(self) -> None:
        self.ms = 0
        self.logical = 0
        self.resolved_ms = -1

    def commit_ts(self, now_ms: int) -> int:
        ms = max(now_ms, self.resolved_ms + 1, self.ms)
        if ms != self.ms:
            self.ms, self.logical = ms, 0
        if self.logical >= MAX_LOGICAL - 1:
            self.ms, self.logical = self.ms + 1, 0
        self.logical += 1
        return compose_tso(self.ms, self.logical)

    def resolved_ts(self, now_ms: int) -> int:
        ms = max(now_ms, self.ms, self.resolved_ms)
        self.ms, self.logical, self.resolved_ms = ms, MAX_LOGICAL, ms
        return compose_tso(ms, MAX_LOGICAL)


class Pacer:
    """A steady rate: ``done`` rows are due at ``start + done / rate``. A producer that falls behind sends at
    once until it has caught up (so the average rate holds), and :meth:`lateness` says by how much it lagged."""

    def __init__(self, rate: float, start: float) -> None:
        if rate <= 0:
            raise ValueError("rate must be > 0")
        self.rate = float(rate)
        self.start = start

    def due(self, done: int) -> float:
        return self.start + done / self.rate

    def delay(self, done: int, now: float) -> float:
        """How long to wait before sending more, having sent ``done`` rows by ``now``."""
        return max(0.0, self.due(done) - now)

    def lateness(self, done: int, now: float) -> float:
        return max(0.0, now - self.due(done))


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) of already sorted values, linear between closest ranks (numpy's default)."""
    if not sorted_values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: Sequence[float]) -> dict[str, Any]:
    v = sorted(values)
    r = (lambda x: None if x is None else round(x, 4))
    return {"n": len(v), "p50": r(percentile(v, 50)), "p95": r(percentile(v, 95)), "p99": r(percentile(v, 99)),
            "max": r(v[-1]) if v else None, "mean": r(sum(v) / len(v)) if v else None}


@dataclass(frozen=True)
class Commit:
    """One applied micro-batch as the stage timer saw it (times are time.time() seconds)."""

    commit_wall: float
    applied_ts: int
    rows: int
    messages: int


def staleness_per_commit(commits: Sequence[Commit], lo: float, hi: float) -> tuple[list[float], list[float]]:
    """(commit time - physical time of the applied resolved ts, replica age just before the commit) of each
    commit in [lo, hi] that moved the applied resolved ts forward (a commit that did not released nothing)."""
    stale, age = [], []
    prev = 0
    for c in commits:
        if c.applied_ts > prev:
            if lo <= c.commit_wall <= hi:
                stale.append(c.commit_wall - physical_ms(c.applied_ts) / 1000)
                if prev:
                    age.append(c.commit_wall - physical_ms(prev) / 1000)
            prev = c.applied_ts
    return stale, age


def split_staleness(commits: Sequence[Commit], batch_starts: Sequence[float], lo: float, hi: float
                    ) -> tuple[list[float], list[float]]:
    """Each counted commit's staleness cut in two at the start of its micro-batch (``foreachBatch`` entry; the
    k-th batch start belongs to the k-th commit, one per batch): (batch start - physical time of the resolved
    ts: the wait for a trigger, plus Kafka delivery), (commit - batch start: read + apply). The first part depends
    on the phase between the upstream 1 s cadence and the 1 s trigger, which is nearly fixed within a run and random
    between runs; the second part is what the applier's levers change."""
    if len(batch_starts) < len(commits):
        return [], []
    wait, inside = [], []
    prev = 0
    for c, start in zip(commits, batch_starts):
        if c.applied_ts > prev:
            if lo <= c.commit_wall <= hi:
                wait.append(start - physical_ms(c.applied_ts) / 1000)
                inside.append(c.commit_wall - start)
            prev = c.applied_ts
    return wait, inside


def staleness_per_resolved(resolved: Sequence[int], commits: Sequence[Commit], lo: float, stop: float
                           ) -> tuple[list[float], int]:
    """For every resolved ts emitted in [lo, stop): the first commit whose applied ts reached it, minus its
    physical time. One still unapplied at ``stop`` counts ``stop - physical`` (a lower bound); returns
    (values, how many of them are such lower bounds)."""
    out: list[float] = []
    censored = 0
    i = 0
    best = 0
    for r in sorted(resolved):
        phys = physical_ms(r) / 1000
        if not lo <= phys < stop:
            continue
        while i < len(commits) and best < r:
            best = max(best, commits[i].applied_ts)
            i += 1
        if best >= r:
            out.append(commits[i - 1].commit_wall - phys)
        else:
            out.append(stop - phys)
            censored += 1
    return out, censored


def highest_rate_under(results: Mapping[int, float | None], limit: float = STALENESS_LIMIT_S) -> int | None:
    """The highest rate whose p99 is under ``limit``, if every lower rate tried was under it too (a sweep stops
    counting at the first rate that misses)."""
    best = None
    for rate in sorted(results):
        p99 = results[rate]
        if p99 is None or p99 >= limit:
            break
        best = rate
    return best


def median(values: Sequence[float]) -> float | None:
    return percentile(sorted(values), 50)


# ---------------------------------------------------------------------------------------------------------
# The workload: the bench changefeed with wall-clock timestamps
# ---------------------------------------------------------------------------------------------------------

def _live_workload_class():
    from applier.devtools.bench_stream import BenchWorkload
    from applier.events import Resolved

    class LiveWorkload(BenchWorkload):
        """:class:`BenchWorkload` driven one transaction at a time, commit ts from the wall clock, resolved ts
        every ``resolved_interval_ms`` of wall time on every partition. No replays (``dup_fraction`` 0) and no
        very large transaction: the steady state is what is measured."""

        def __init__(self, protocol: str, *, clock: Callable[[], int] = wall_ms, **kw: Any) -> None:
            kw.setdefault("dup_fraction", 0.0)
            super().__init__(protocol, events=0, big_txn_rows=0, **kw)
            self.clock = clock
            self.tso = TsoClock()
            self.resolved_log: list[tuple[int, int]] = []  # (resolved ts, rows produced before it)

        def _next_ts(self) -> int:
            ts = self.tso.commit_ts(self.clock())
            self.ts_ms = physical_ms(ts)
            return ts

        def commit_ts(self) -> int:
            """A live commit ts (above every resolved ts handed out) for a transaction encoded elsewhere: the
            pooled producer's (:mod:`applier.devtools.bench_pool`)."""
            return self._next_ts()

        def _resolved(self) -> None:
            self._flush_all()
            ts = self.tso.resolved_ts(self.clock())
            for p in range(self.partitions):
                self._emit_single(p, Resolved(ts, self.positions[p]))
                self.stats.resolved_messages += 1
            self.prev_resolved_ts = ts
            self.ts_ms = self.last_resolved_ms = physical_ms(ts)
            self.resolved_log.append((ts, self.stats.row_events))

        def resolved_due(self) -> bool:
            return self.clock() - self.last_resolved_ms >= self.resolved_interval_ms

        def _after_txn(self) -> None:
            if self.resolved_due():
                self._resolved()

        def begin(self) -> list[tuple[int, bytes | None, bytes]]:
            self._used = True
            self._begin()
            return self.take()

        def transaction(self) -> tuple[int, list[tuple[int, bytes | None, bytes]]]:
            n = self._txn(self._txn_size())
            self._after_txn()
            return n, self.take()

        def resolve_now(self) -> list[tuple[int, bytes | None, bytes]]:
            self._resolved()
            return self.take()

        def end(self) -> list[tuple[int, bytes | None, bytes]]:
            self._end()
            return self.take()

        def take(self) -> list[tuple[int, bytes | None, bytes]]:
            out, self.out = self.out, []
            return out

    return LiveWorkload


def _pool_workload_class():
    from applier.devtools.bench_pool import PLACEHOLDER_MS, PLACEHOLDER_TSO

    class PoolWorkload(_live_workload_class()):
        """:class:`LiveWorkload` with every transaction at the pool's placeholder commit ts and no resolved ts:
        what :func:`applier.devtools.bench_pool.build_pool` encodes once (the sender adds the timestamps live)."""

        def _next_ts(self) -> int:
            self.ts_ms = PLACEHOLDER_MS
            return PLACEHOLDER_TSO

        def _resolved(self) -> None:
            self._flush_all()

        def _after_txn(self) -> None:
            pass

    return PoolWorkload


def default_producer(protocol: str) -> str:
    """Pooled for Canal-JSON (fast enough for 30k/s); Open Protocol can only be encoded row by row (its batches
    carry binary length prefixes, see :mod:`applier.devtools.bench_pool`)."""
    return "pooled" if protocol == "canal-json" else "encode"


class KafkaOut:
    """``produce(partition, key, value)`` into one topic, waiting out a full local queue; counts what it sent."""

    def __init__(self, producer: Any, topic: str) -> None:
        self.producer = producer
        self.topic = topic
        self.messages = 0
        self.bytes = 0

    def __call__(self, part: int, key: bytes | None, value: bytes) -> None:
        prod = self.producer
        while True:
            try:
                prod.produce(self.topic, value=value, key=key, partition=part)
                break
            except BufferError:
                prod.poll(0.01)
        self.messages += 1
        self.bytes += len(value) + (len(key) if key else 0)
        if not self.messages & 1023:
            prod.poll(0)  # serve librdkafka's events now and then (no delivery callbacks are set)


def _kafka_producer(params: Mapping[str, Any]) -> Any:
    from confluent_kafka import Producer
    return Producer({"bootstrap.servers": params["bootstrap"], "linger.ms": params.get("linger_ms", 5),
                     "enable.idempotence": True, "compression.type": "lz4", "message.max.bytes": 10_000_000,
                     "queue.buffering.max.kbytes": 65536})


def producer_main(conn, params: dict[str, Any]) -> None:
    """The producer process: paced transactions for ``seconds``, a final resolved ts, then its figures (sent
    through ``conn``). Runs in a spawned interpreter. ``params["producer"]``: "encode" runs the test encoder for
    every row; "pooled" (Canal-JSON) sends a pool encoded before the start (:mod:`applier.devtools.bench_pool`)."""
    if params.get("producer", "encode") == "pooled":
        report = _pooled_producer(conn, params)
    else:
        report = _encode_producer(conn, params)
    conn.send(("done", report))
    conn.close()


def _cpu_seconds() -> float:
    """This process's CPU time, every thread (librdkafka's included)."""
    return time.process_time()


@dataclass(frozen=True)
class EncodedRun:
    t_end: float
    rows: int
    worst_lateness_s: float


def send_encoded(wl: Any, pacer: Pacer, *, produce: Callable[[int, bytes | None, bytes], None], seconds: float,
                 now: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> EncodedRun:
    """The per-row producer's run without Kafka: ``wl`` (a :class:`LiveWorkload` on ``now``'s clock) encodes
    every transaction as it is sent, at ``pacer``'s rate from ``pacer.start`` for ``seconds``, then the final
    resolved ts."""
    from applier.devtools.bench_pool import emit, run_paced

    def send_txn() -> int:
        n, msgs = wl.transaction()  # a resolved ts follows when one is due
        emit(produce, msgs)
        return n

    def resolve_if_due() -> None:
        if wl.resolved_due():
            emit(produce, wl.resolve_now())

    emit(produce, wl.begin())
    paced = run_paced(send_txn, pacer=pacer, deadline=pacer.start + seconds, control=wl,
                      resolve_if_due=resolve_if_due, now=now, sleep=sleep)
    t_end = now()
    emit(produce, wl.end())
    return EncodedRun(t_end, paced.rows, paced.worst_lateness_s)


def _encode_producer(conn, params: dict[str, Any]) -> dict[str, Any]:
    LiveWorkload = _live_workload_class()
    wl = LiveWorkload(params["protocol"], tables=params["tables"], partitions=params["partitions"],
                      seed=params["seed"], resolved_interval_ms=params["resolved_interval_ms"])
    prod = _kafka_producer(params)
    out = KafkaOut(prod, params["topic"])
    t0 = time.time()
    conn.send(("started", t0))
    cpu0 = _cpu_seconds()
    res = send_encoded(wl, Pacer(params["rate"], t0), produce=out, seconds=params["seconds"])
    left = prod.flush(60)
    return _report(
        "encode", t0=t0, t_end=res.t_end, rows=res.rows, out=out, transactions=wl.stats.transactions,
        resolved=wl.resolved_log, final_ts=wl.final_ts,
        expected={t: (cs.rows, cs.digest_sum) for t, cs in wl.expected.items()}, table_names=wl.table_names,
        schema=wl.schema, worst_lateness_s=res.worst_lateness_s, unacknowledged=left,
        send_cpu_s=_cpu_seconds() - cpu0)


def _pooled_producer(conn, params: dict[str, Any]) -> dict[str, Any]:
    import gc

    from applier.devtools.bench_pool import build_pool, pool_size_for, send_pooled

    rate, seconds = params["rate"], params["seconds"]
    kw = {"tables": params["tables"], "partitions": params["partitions"], "seed": params["seed"],
          "resolved_interval_ms": params["resolved_interval_ms"]}
    cpu0 = _cpu_seconds()
    pool = build_pool(_pool_workload_class()(params["protocol"], **kw),
                      pool_size_for(params["pool_rows"], rate, seconds))
    gc.freeze()  # the pool lives to the end: keep the collector from walking it again and again
    build_cpu = _cpu_seconds() - cpu0
    prod = _kafka_producer(params)
    out = KafkaOut(prod, params["topic"])
    control = _live_workload_class()(params["protocol"], clock=wall_ms, **kw)
    t0 = time.time()
    conn.send(("started", t0))
    cpu1 = _cpu_seconds()
    res = send_pooled(pool, control, Pacer(rate, t0), produce=out, seconds=seconds)
    left = prod.flush(60)
    return _report(
        "pooled", t0=t0, t_end=res.t_end, rows=res.rows, out=out, transactions=res.transactions,
        resolved=res.resolved, final_ts=res.final_ts, expected=pool.expected, table_names=pool.table_names,
        schema=pool.schema, worst_lateness_s=res.worst_lateness_s, unacknowledged=left,
        send_cpu_s=_cpu_seconds() - cpu1, pool_rows=pool.rows, pool_transactions=len(pool.txns),
        passes=res.passes, pool_build_s=round(pool.build_seconds, 2), pool_build_cpu_s=round(build_cpu, 2),
        tail_rows=res.tail_rows, tail_s=round(res.tail_seconds, 2))


def _report(producer: str, *, t0: float, t_end: float, rows: int, out: KafkaOut, worst_lateness_s: float,
            send_cpu_s: float, **fields: Any) -> dict[str, Any]:
    """The producer's figures for the driver. ``cpu_us_per_row``: CPU from the start to the flush (pool build
    excluded) per row change sent, librdkafka's threads included."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"producer": producer, "t0": t0, "t_end": t_end, "rows": rows, "messages": out.messages,
            "bytes": out.bytes, "worst_lateness_s": round(worst_lateness_s, 3),
            "cpu_seconds": round(ru.ru_utime + ru.ru_stime, 2), "send_cpu_s": round(send_cpu_s, 2),
            "cpu_us_per_row": round(1e6 * send_cpu_s / rows, 2) if rows else None,
            "pool_rows": None, "passes": None, **fields}


# ---------------------------------------------------------------------------------------------------------
# Observing the pipeline: the stage-timer hook
# ---------------------------------------------------------------------------------------------------------

APPLY_THREAD_STAGES = ("decode", "gate", "plan", "write", "write.copy", "progress", "commit", "apply", "process")


class LiveClock(StageClock):
    """:class:`StageClock` that also keeps every occurrence of every stage (for per-batch medians), the wall
    time at which each ``commit`` ended, and one :class:`Commit` per applied micro-batch."""

    def __init__(self) -> None:
        super().__init__()
        self.each: dict[str, list[float]] = defaultdict(list)
        self.commits: list[Commit] = []
        self.batch_starts: list[float] = []
        self.marks: dict[str, float] = {}  # first occurrences (time.time()): resumed, on_batch, commit, applied
        self._last_commit: float | None = None
        self.on_applied: Callable[[Commit], None] | None = None
        # per micro-batch sums of the apply thread's stages (plan and write run once per table chunk, so their
        # per-call medians would understate a batch), closed when its "process" span ends
        self.per_batch: list[dict[str, float]] = []
        self._current: dict[str, float] = defaultdict(float)

    def add(self, stage: str, seconds: float) -> None:
        super().add(stage, seconds)
        self.each[stage].append(seconds)
        if stage in APPLY_THREAD_STAGES:
            self._current[stage] += seconds
            if stage == "process":
                self.per_batch.append(dict(self._current))
                self._current = defaultdict(float)

    def batch_medians_ms(self, skip: int = 0) -> dict[str, float]:
        """Median per micro-batch of each stage (the apply thread's summed per batch), in ms; ``apply other``
        is the apply stage minus plan, write, progress and commit (gate release, chunking, transaction begin)."""
        out: dict[str, float] = {}
        for stage in ("on_batch", "submit_wait"):
            v = self.each.get(stage, [])[skip:]
            if v:
                out[stage] = round(1000 * (median(v) or 0), 1)
        rows = self.per_batch[skip:]
        for stage in APPLY_THREAD_STAGES:
            v = [b.get(stage, 0.0) for b in rows]
            if v:
                out[stage] = round(1000 * (median(v) or 0), 1)
        other = [b.get("apply", 0.0) - sum(b.get(k, 0.0) for k in ("plan", "write", "progress", "commit")) for b in rows]
        if other:
            out["apply other"] = round(1000 * (median(other) or 0), 1)
        return out

    @contextmanager
    def span(self, stage: str) -> Iterator[None]:
        t = time.perf_counter()
        if stage == "on_batch":
            now = time.time()
            self.batch_starts.append(now)
            self.marks.setdefault("first_on_batch", now)
            if self.first_batch_at is None:
                self.first_batch_at = t
        try:
            yield
        finally:
            self.add(stage, time.perf_counter() - t)
            if stage == "commit":
                self._last_commit = time.time()
                self.marks.setdefault("first_commit", self._last_commit)

    def resumed(self, state: Any) -> None:
        self.marks.setdefault("resumed", time.time())

    def applied(self, report: Any, gate: Any) -> None:
        now = time.time()
        c = Commit(self._last_commit or now, report.applied_ts, report.applied.rows, report.messages)
        self.commits.append(c)
        self.marks.setdefault("first_applied", now)
        if c.rows and "first_rows_applied" not in self.marks:
            self.marks["first_rows_applied"] = now
        if self.on_applied is not None:
            self.on_applied(c)


def stop_queries(spark) -> float:
    """Stop every active streaming query of the session (what ends a live ``run()`` from outside); returns when
    the stop was asked."""
    t = time.time()
    for q in spark.streams.active:
        try:
            q.stop()
        except Exception:  # already stopping
            pass
    return t


# ---------------------------------------------------------------------------------------------------------
# Services and the scaffolding shared by the modes
# ---------------------------------------------------------------------------------------------------------

def service_urls(target: str) -> tuple[str, str]:
    """(Kafka bootstrap, target URL) from APPLIER_KAFKA / APPLIER_MARIADB_URL / APPLIER_PG_URL, else the local
    services' defaults. Never starts anything: the live modes measure what already runs."""
    from applier.devtools import services
    u = services.urls()
    kafka = os.environ.get("APPLIER_KAFKA") or u.kafka
    if target == "mariadb":
        return kafka, os.environ.get("APPLIER_MARIADB_URL") or u.mariadb_url
    return kafka, os.environ.get("APPLIER_PG_URL") or u.pg_url


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(60)


def bench_settings(a: argparse.Namespace, *, name: str, topic: str, url: str, kafka: str, schema: str,
                   trigger: str | None = None, max_offsets: int | None = None, checkpoint: Path) -> Any:
    from applier.config import parse_config
    from applier.devtools.bench_stream import BENCH_SCHEMA
    pipeline: dict[str, Any] = {"name": name, "checkpoint_dir": str(checkpoint), "buffer_memory_mb": a.buffer_mb,
                                "decode_on": a.decode_on}
    if trigger:
        pipeline["trigger_interval"] = trigger
    if max_offsets:
        pipeline["max_offsets_per_trigger"] = max_offsets
    cfg = {
        "pipeline": pipeline,
        "source": {"bootstrap_servers": kafka, "topics": [topic], "protocol": a.protocol},
        "target": {"url": url, "batch_rows": a.batch_rows, "apply_streams": a.apply_streams,
                   "apply_on": a.apply_on},
        "spark": {"master": getattr(a, "master", None) or f"local[{a.cores}]", "conf": a.spark_conf},
        "route": [{"match": f"{BENCH_SCHEMA}.*", "schema": schema}],
    }
    return parse_config(cfg, source="<bench-live>")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def verify_target(engine, schema: str, expected: Mapping[str, tuple[int, int]], pipeline: str,
                  final_ts: int | None, columns: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The target's per-table checksums (over ``columns``, the stream's shape; default the whole bench shape)
    against ``expected``, and the applied resolved ts against the stream's last, ``final_ts`` (None for an ungated
    stream: it has no resolved ts, and its applied ts is only the highest commit ts applied)."""
    from applier.devtools.bench_parts import applied_resolved_ts, target_checksums
    got = target_checksums(engine, schema, list(expected), columns)
    bad = {t: (str(expected[t]), f"{got[t].rows} rows / {got[t].digest_sum:016x}") for t in expected
           if (got[t].rows, got[t].digest_sum) != tuple(expected[t])}
    applied = applied_resolved_ts(engine, pipeline)
    if final_ts is not None and applied != final_ts:
        bad["applied resolved ts"] = (str(final_ts), str(applied))
    return {"ok": not bad, "differences": bad, "rows": sum(cs.rows for cs in got.values())}


def _cleanup(engine, kafka: str, topic: str, schema: str, ckpt: Path, keep: bool) -> None:
    from applier.devtools.bench_parts import delete_topic, drop_schema
    if keep:
        return
    try:
        drop_schema(engine, schema)
    except Exception as exc:  # best effort
        _log(f"could not drop {schema}: {exc}")
    why = delete_topic(kafka, topic)
    if why:
        _log(f"could not delete topic {topic}: {why}")
    shutil.rmtree(ckpt, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# Live staleness
# ---------------------------------------------------------------------------------------------------------

def run_live(a: argparse.Namespace, rate: int, spark, kafka: str, url: str) -> dict[str, Any]:
    """One live run at ``rate`` row changes/s: warm-up + duration seconds of producing while ``run()`` applies."""
    import multiprocessing as mp

    from applier.pipeline import PipelineStopped, make_engine, run

    run_id = safe_name(f"live_{a.protocol}_{a.target}_{rate}_{time.strftime('%H%M%S')}_{uuid.uuid4().hex[:4]}")
    topic, schema = f"bench-{run_id}", f"bench_{run_id}"
    ckpt = Path(tempfile.gettempdir()) / "applier-bench" / run_id
    settings = bench_settings(a, name=f"bench-{run_id}", topic=topic, url=url, kafka=kafka, schema=schema,
                              trigger=a.trigger_interval, max_offsets=a.max_offsets_per_trigger, checkpoint=ckpt)
    create_topic(kafka, topic, a.partitions)
    engine = make_engine(settings)
    clock = LiveClock()
    total = a.warmup + a.duration
    producer = a.producer or default_producer(a.protocol)
    params = {"protocol": a.protocol, "tables": a.tables, "partitions": a.partitions, "seed": a.seed,
              "resolved_interval_ms": 1000, "bootstrap": kafka, "topic": topic, "rate": rate, "seconds": total,
              "producer": producer, "pool_rows": a.pool_rows}
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=producer_main, args=(child, params), name="bench-live-producer", daemon=True)
    out: dict[str, Any] = {"rate": rate, "topic": topic, "schema": schema, "trigger_interval": settings.pipeline.trigger_interval,
                           "master": settings.spark.master, "apply_streams": settings.target.apply_streams,
                           "apply_on": settings.target.apply_on}
    stop_at: list[float] = []
    try:
        proc.start()
        # the pooled producer encodes its pool first (about 50 us per row on this machine; 500 us allowed)
        if not parent.poll(120 + (a.pool_rows / 2000 if producer == "pooled" else 0)):
            raise RuntimeError("the producer process did not start")
        _, t0 = parent.recv()
        _log(f"live {rate:,}/s {a.protocol} -> {a.target}: producing for {a.warmup:.0f} s warm-up + {a.duration:.0f} s "
             f"(trigger {settings.pipeline.trigger_interval}, {producer} producer)")
        timer = threading.Timer(max(0.0, t0 + total - time.time()), lambda: stop_at.append(stop_queries(spark)))
        timer.daemon = True
        timer.start()
        ru0, sys0, load0 = os.times(), system_cpu_ticks(), os.getloadavg()[0]
        stopped_note = None
        try:
            run(settings, spark=spark, progress=False, timer=clock)
        except PipelineStopped as exc:
            if not stop_at:
                raise
            stopped_note = str(exc)[:200]
        ru1, sys1 = os.times(), system_cpu_ticks()
        timer.cancel()
        t_stop = stop_at[0] if stop_at else time.time()
        if not parent.poll(120):
            raise RuntimeError("the producer did not report")
        _, prod = parent.recv()
        proc.join(30)
        lo = t0 + a.warmup
        stale, age = staleness_per_commit(clock.commits, lo, t_stop)
        wait, inside = split_staleness(clock.commits, clock.batch_starts, lo, t_stop)
        per_res, censored = staleness_per_resolved([r for r, _ in prod["resolved"]], clock.commits, lo, t_stop)
        window = [c for c in clock.commits if lo <= c.commit_wall <= t_stop]
        res_in = [(r, n) for r, n in prod["resolved"] if lo <= physical_ms(r) / 1000 <= prod["t_end"]]
        produce_rate = ((res_in[-1][1] - res_in[0][1]) / ((physical_ms(res_in[-1][0]) - physical_ms(res_in[0][0])) / 1000)
                        if len(res_in) > 1 else None)
        apply_rate = (sum(c.rows for c in window[1:]) / (window[-1].commit_wall - window[0].commit_wall)
                      if len(window) > 1 and window[-1].commit_wall > window[0].commit_wall else None)
        out.update({
            "window_seconds": round(t_stop - lo, 1),
            "staleness_per_commit_s": summarize(stale),
            "staleness_per_resolved_ts_s": {**summarize(per_res), "unapplied_at_stop": censored},
            "replica_age_before_commit_s": summarize(age),
            "trigger_wait_s": summarize(wait),
            "batch_read_and_apply_s": summarize(inside),
            "transactions_measured": len(stale),
            "batches_in_window": len(window),
            "produce_rows_per_s": produce_rate, "apply_rows_per_s": apply_rate,
            "rows_produced": prod["rows"], "messages_produced": prod["messages"],
            "producer_worst_lateness_s": prod["worst_lateness_s"], "producer_cpu_s": prod["cpu_seconds"],
            "producer": prod["producer"], "producer_cpu_us_per_row": prod["cpu_us_per_row"],
            "pool_rows": prod["pool_rows"], "passes": prod["passes"], "pool_build_s": prod.get("pool_build_s"),
            "tail_rows": prod.get("tail_rows"), "tail_s": prod.get("tail_s"),
            # a producer that fell behind sent in bursts to catch up: the run did not measure the asked rate
            "producer_kept_up": produce_rate is not None and produce_rate >= 0.95 * rate,
            "driver_cpu_s": round((ru1[0] + ru1[1]) - (ru0[0] + ru0[1]), 1),
            "batch_stage_medians_ms": clock.batch_medians_ms(skip=sum(1 for c in clock.commits if c.commit_wall < lo)),
            "batch_interval_median_s": round(median([b - a_ for a_, b in zip(clock.batch_starts, clock.batch_starts[1:])])
                                             or 0, 3),
            "stopped_note": stopped_note,
            "loadavg_1m_before": round(load0, 2),
            "machine_busy_cpu_s": round((sys1[0] - sys0[0]) / os.sysconf("SC_CLK_TCK"), 1),
            "run_seconds": round(t_stop - t0, 1),
        })
        if a.verify:
            t = time.perf_counter()
            run(settings, until_caught_up=True, spark=spark, progress=False)
            out["verify"] = verify_target(engine, schema, prod["expected"], settings.pipeline.name, prod["final_ts"])
            out["verify"]["catch_up_seconds"] = round(time.perf_counter() - t, 1)
        return out
    finally:
        if proc.is_alive():
            proc.terminate()
            proc.join(10)
        _cleanup(engine, kafka, topic, schema, ckpt, a.keep)
        engine.dispose()


def producer_text(r: Mapping[str, Any]) -> str:
    """How the run's messages were made: "encode producer" or the pool's size and passes."""
    mode = r.get("producer", "encode")
    if mode != "pooled":
        return f"{mode} producer"
    return (f"pooled producer: pool {r['pool_rows']:,} rows (built in {r.get('pool_build_s')} s), {r['passes']} "
            f"passes, last pass completed unpaced: {r.get('tail_rows') or 0:,} rows in {r.get('tail_s')} s")


def format_live(r: dict[str, Any]) -> str:
    s, pr, ag = r["staleness_per_commit_s"], r["staleness_per_resolved_ts_s"], r["replica_age_before_commit_s"]
    f = (lambda x, spec=".3f": "n/a" if x is None else format(x, spec))
    lines = [
        f"live {r['rate']:,} row changes/s, window {r['window_seconds']} s, trigger {r['trigger_interval']}, "
        f"master {r.get('master')}, apply_streams {r.get('apply_streams')} (apply_on {r.get('apply_on')})"
        + ("" if r.get("producer_kept_up", True) else
           f"  -- NOT MEASURED AT THIS RATE: the producer reached only {f(r['produce_rows_per_s'], ',.0f')}/s"),
        f"  staleness per commit (commit - resolved ts physical): p50 {f(s['p50'])}  p95 {f(s['p95'])}  "
        f"p99 {f(s['p99'])}  max {f(s['max'])} s  over {s['n']} transactions",
        f"  per resolved ts emitted:                     p50 {f(pr['p50'])}  p95 {f(pr['p95'])}  p99 {f(pr['p99'])}  "
        f"max {f(pr['max'])} s  ({pr['n']} resolved ts, {pr['unapplied_at_stop']} unapplied at stop)",
        f"  replica age just before each commit:         p50 {f(ag['p50'])}  p95 {f(ag['p95'])}  p99 {f(ag['p99'])}  "
        f"max {f(ag['max'])} s",
        f"  of which: resolved ts to batch start p50 {f(r.get('trigger_wait_s', {}).get('p50'))}, "
        f"batch start to commit p50 {f(r.get('batch_read_and_apply_s', {}).get('p50'))} "
        f"p99 {f(r.get('batch_read_and_apply_s', {}).get('p99'))} s",
        f"  produced {f(r['produce_rows_per_s'], ',.0f')} rows/s ({producer_text(r)}; worst lateness "
        f"{r['producer_worst_lateness_s']} s, CPU {r['producer_cpu_s']} s, "
        f"{f(r.get('producer_cpu_us_per_row'), '.1f')} us/row sent), "
        f"applied {f(r['apply_rows_per_s'], ',.0f')} rows/s, "
        f"{r['batches_in_window']} batches in the window (median interval {r['batch_interval_median_s']} s), "
        f"driver CPU {r['driver_cpu_s']} s; machine busy {r.get('machine_busy_cpu_s')} CPU-s of 2 x {r.get('run_seconds')} s "
        f"(load before {r.get('loadavg_1m_before')})",
        "  per-batch medians (ms): " + ", ".join(f"{k} {v}" for k, v in r["batch_stage_medians_ms"].items()),
    ]
    if "verify" in r:
        v = r["verify"]
        lines.append(f"  verify after catch-up ({v['catch_up_seconds']} s): "
                     + ("OK" if v["ok"] else f"MISMATCH {v['differences']}"))
    return "\n".join(lines)


def main_live(a: argparse.Namespace) -> int:
    """Live runs on ``local[--cores]``, or with ``--cluster-workers K`` on a loopback standalone cluster started
    (and stopped) here, the driver configured as :func:`applier.devtools.cluster.driver_conf` says."""
    if not getattr(a, "cluster_workers", 0):
        return _live_runs(a)
    from applier.devtools.cluster import standalone_cluster

    with standalone_cluster(a.cluster_workers, log=_log) as cluster:
        a.master = cluster.url
        a.spark_conf = cluster.driver_conf(extra=a.spark_conf)
        return _live_runs(a)


def _live_runs(a: argparse.Namespace) -> int:
    from applier.pipeline import spark_session

    kafka, url = service_urls(a.target)
    rates = a.sweep or [a.live]
    probe = bench_settings(a, name="bench-live-session", topic="x", url=url, kafka=kafka, schema="x",
                           checkpoint=Path(tempfile.gettempdir()) / "applier-bench" / "session")
    spark = spark_session(probe)
    results = []
    ok = True
    try:
        for rate in rates:
            for i in range(a.repeat):
                r = run_live(a, rate, spark, kafka, url)
                r["repeat"] = i
                results.append(r)
                _log(format_live(r))
                ok = ok and r.get("verify", {"ok": True})["ok"]
            if a.sweep:
                worst = max((x["staleness_per_commit_s"]["p99"] or math.inf) if x.get("producer_kept_up", True)
                            else math.inf for x in results if x["rate"] == rate)
                if worst >= STALENESS_LIMIT_S:
                    _log(f"p99 {worst:.2f} s >= {STALENESS_LIMIT_S} s at {rate:,}/s: the sweep stops here")
                    break
    finally:
        spark.stop()
    by_rate: dict[int, float | None] = {}
    for r in results:
        p = r["staleness_per_commit_s"]["p99"] if r.get("producer_kept_up", True) else None
        prev = by_rate.get(r["rate"], -math.inf)
        by_rate[r["rate"]] = None if p is None or prev is None else max(prev, p)
    summary = {"protocol": a.protocol, "target": a.target, "runs": results,
               "highest_rate_p99_under_2s": highest_rate_under(by_rate) if a.sweep else None}
    if a.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        for r in results:
            print(format_live(r))
        if a.sweep:
            print(f"highest rate with p99 staleness < {STALENESS_LIMIT_S} s: {summary['highest_rate_p99_under_2s']}")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------------------
# Start-up: a fresh interpreter per measurement
# ---------------------------------------------------------------------------------------------------------

STARTUP_PHASES = (
    ("interpreter", "spawn", "main", "process start to this module running (Python start-up, -m imports)"),
    ("imports", "main", "imported", "applier.cli, applier.pipeline and pyspark.sql (what `applier run` loads)"),
    ("config", "imported", "configured", "parse the settings"),
    ("spark_session", "configured", "spark", "spark_session(): JVM launch, SparkContext, jars on the class path"),
    ("broker_check", "run", "brokers", "run(): TCP check of the bootstrap servers"),
    ("target_migrations", "brokers", "migrated", "run(): engine, first connection, Alembic upgrade (at head)"),
    ("checkpoint_reset", "migrated", "checkpoint", "run(): lock file, clear the query checkpoint through Hadoop's FS"),
    ("kafka_partitions", "checkpoint", "partitions", "run(): list the topics' partitions (a JVM KafkaConsumer)"),
    ("claim_and_load", "partitions", "resumed", "run(): claim the writer epoch, load progress"),
    ("query_start", "resumed", "first_on_batch", "processor set-up, query start, Kafka source start, first batch planned"),
    ("first_batch_read", "first_on_batch", "first_submit", "first foreachBatch: read + decode in the Python workers"),
    ("first_batch_apply", "first_submit", "first_commit", "apply thread: gate, DDL, writes, progress, commit"),
)


def startup_child(cfg: dict[str, Any]) -> None:
    """One start of the pipeline in this (fresh) interpreter; prints the time stamps as one JSON line."""
    marks = {"spawn": cfg["spawn"], "main": time.time()}
    import importlib
    importlib.import_module("applier.cli")  # what the CLI loads before it runs anything
    import applier.pipeline as P
    importlib.import_module("pyspark.sql")
    from applier import migrate
    marks["imported"] = time.time()
    ns = argparse.Namespace(**cfg["args"])
    settings = bench_settings(ns, name=cfg["name"], topic=cfg["topic"], url=cfg["url"], kafka=cfg["kafka"],
                              schema=cfg["schema"], checkpoint=Path(cfg["checkpoint"]))
    marks["configured"] = time.time()
    spark = P.spark_session(settings)
    marks["spark"] = time.time()

    def mark_after(mod: Any, attr: str, key: str) -> None:
        fn = getattr(mod, attr)  # AttributeError names the function if the product renamed it

        def wrapped(*args: Any, **kw: Any) -> Any:
            try:
                return fn(*args, **kw)
            finally:
                marks.setdefault(key, time.time())
        setattr(mod, attr, wrapped)

    mark_after(P, "check_brokers_reachable", "brokers")
    mark_after(migrate, "upgrade", "migrated")
    mark_after(P, "reset_checkpoint", "checkpoint")
    mark_after(P, "kafka_partitions", "partitions")
    clock = LiveClock()
    submits: list[float] = []
    orig_add = clock.add

    def add(stage: str, seconds: float) -> None:
        if stage == "submit_wait" and not submits:
            submits.append(time.time() - seconds)
        orig_add(stage, seconds)
    clock.add = add  # type: ignore[method-assign]

    stopping: list[bool] = []

    def first(c: Commit) -> None:
        """The first transaction that applied rows ends the measurement: stop the query."""
        if c.rows and not stopping:
            stopping.append(True)
            threading.Thread(target=stop_queries, args=(spark,), daemon=True).start()
    clock.on_applied = first
    marks["run"] = time.time()
    try:
        P.run(settings, spark=spark, progress=False, timer=clock)
    except P.PipelineStopped:
        pass
    marks["stopped"] = time.time()
    marks.update(clock.marks)
    if submits:
        marks["first_submit"] = submits[0]
    t = time.time()
    spark.stop()
    marks["spark_stopped"] = time.time()
    marks["spark_stop_seconds"] = marks["spark_stopped"] - t
    print("STARTUP " + json.dumps(marks), flush=True)


def startup_bare_child(cfg: dict[str, Any]) -> None:
    """Spark alone, in a fresh interpreter: the same session, a streaming query on the same topic whose
    ``foreachBatch`` runs an identity ``mapInArrow`` + ``toArrow()`` (the applier's read without its decoder),
    stopped after the first batch. What Spark itself costs before a first batch is in the driver."""
    marks = {"spawn": cfg["spawn"], "main": time.time()}
    import applier.pipeline as P
    marks["imported"] = time.time()
    ns = argparse.Namespace(**cfg["args"])
    settings = bench_settings(ns, name=cfg["name"], topic=cfg["topic"], url=cfg["url"], kafka=cfg["kafka"],
                              schema=cfg["schema"], checkpoint=Path(cfg["checkpoint"]))
    marks["configured"] = time.time()
    spark = P.spark_session(settings)
    marks["spark"] = time.time()

    def identity(batches):
        yield from batches

    def fb(df, batch_id: int) -> None:
        marks.setdefault("first_on_batch", time.time())
        sel = df.select("topic", "partition", "offset", "key", "value")
        sel.mapInArrow(identity, sel.schema).toArrow()
        marks.setdefault("first_submit", time.time())
        threading.Thread(target=stop_queries, args=(spark,), daemon=True).start()

    ckpt = Path(cfg["checkpoint"]) / "bare"
    marks["resumed"] = time.time()
    q = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", cfg["kafka"])
         .option("subscribe", cfg["topic"]).option("startingOffsets", "earliest").load()
         .writeStream.foreachBatch(fb).option("checkpointLocation", str(ckpt)).trigger(processingTime="1 second")
         .start())
    try:
        q.awaitTermination()
    except Exception:
        pass
    spark.stop()
    print("STARTUP " + json.dumps(marks), flush=True)


def run_startup(a: argparse.Namespace) -> int:
    from applier.devtools.bench_parts import produce_stream
    from applier.devtools.bench_stream import generate_bench
    from applier.pipeline import make_engine

    kafka, url = service_urls(a.target)
    run_id = safe_name(f"startup_{a.protocol}_{a.target}_{time.strftime('%H%M%S')}_{uuid.uuid4().hex[:4]}")
    topic = f"bench-{run_id}"
    wl = generate_bench(a.protocol, tables=2, partitions=a.partitions, events=20, big_txn_rows=0, seed=a.seed,
                        dup_fraction=0)
    produce_stream(kafka, topic, wl.messages(), partitions=a.partitions)
    runs: list[dict[str, float]] = []
    bare: list[dict[str, float]] = []
    base = Path(tempfile.gettempdir()) / "applier-bench" / run_id
    args = {k: getattr(a, k) for k in ("protocol", "cores", "buffer_mb", "decode_on", "batch_rows", "apply_streams",
                                      "apply_on", "spark_conf")}
    schemas = []
    try:
        for i in range(a.startup):
            schema = f"bench_{run_id}_{i}"
            schemas.append(schema)
            cfg = {"name": f"bench-{run_id}-{i}", "topic": topic, "url": url, "kafka": kafka, "schema": schema,
                   "checkpoint": str(base / str(i)), "args": args}
            for kind in ("startup-child", "startup-bare-child"):
                cfg["spawn"] = time.time()
                p = subprocess.run([sys.executable, "-m", "applier.devtools.bench_live", kind, json.dumps(cfg)],
                                   capture_output=True, text=True, timeout=600)
                line = next((ln for ln in p.stdout.splitlines() if ln.startswith("STARTUP ")), None)
                if line is None:
                    _log(p.stderr[-3000:])
                    if kind == "startup-bare-child":  # the yardstick is optional: the applier's figures stand alone
                        _log(f"{kind} {i} failed (exit {p.returncode}); going on without it")
                        continue
                    raise RuntimeError(f"{kind} {i} failed (exit {p.returncode})")
                marks = json.loads(line[len("STARTUP "):])
                phases = {name: round(marks[b] - marks[a_], 3) for name, a_, b, _ in STARTUP_PHASES
                          if a_ in marks and b in marks}
                if kind == "startup-child":
                    phases["total_to_first_commit"] = round(marks["first_commit"] - marks["spawn"], 3)
                    phases["spark_stop"] = round(marks["spark_stop_seconds"], 3)
                    runs.append(phases)
                else:
                    phases["total_to_first_batch_read"] = round(marks["first_submit"] - marks["spawn"], 3)
                    bare.append(phases)
                _log(f"{kind} {i}: " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    finally:
        from applier.devtools.bench_parts import delete_topic, drop_schema
        probe = bench_settings(argparse.Namespace(**args), name="x", topic=topic, url=url, kafka=kafka,
                               schema="x", checkpoint=base)
        eng = make_engine(probe)
        for s in schemas:
            try:
                drop_schema(eng, s)
            except Exception:
                pass
        eng.dispose()
        delete_topic(kafka, topic)
        shutil.rmtree(base, ignore_errors=True)
    def summarize_runs(rs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
        keys = list(rs[0]) if rs else []
        return {k: {"median": round(median([r[k] for r in rs if k in r]) or 0, 3),
                    "min": min(r[k] for r in rs if k in r), "max": max(r[k] for r in rs if k in r)} for k in keys}

    summary, bare_summary = summarize_runs(runs), summarize_runs(bare)
    result = {"protocol": a.protocol, "target": a.target, "runs": runs, "summary": summary,
              "spark_alone_runs": bare, "spark_alone_summary": bare_summary,
              "phases": {name: what for name, _, _, what in STARTUP_PHASES}}
    if a.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"start-up to the first applied transaction ({a.protocol} -> {a.target}, {len(runs)} fresh processes; "
              "'Spark alone': same session and topic, identity mapInArrow + toArrow in foreachBatch):")
        for k, s in summary.items():
            b = bare_summary.get(k)
            alone = f"  Spark alone {b['median']:7.3f} s" if b else ""
            print(f"  {k:<22} median {s['median']:7.3f} s  (min {s['min']:.3f}, max {s['max']:.3f}){alone}  "
                  f"{result['phases'].get(k, '')}")
        if "total_to_first_batch_read" in bare_summary:
            print(f"  Spark alone: process start to the first batch in the driver "
                  f"{bare_summary['total_to_first_batch_read']['median']:.3f} s")
    return 0


# ---------------------------------------------------------------------------------------------------------
# 1-message micro-batches
# ---------------------------------------------------------------------------------------------------------

def spark_baseline(spark, kafka: str, topic: str, mode: str, ckpt: Path) -> dict[str, Any]:
    """Spark alone on the same one-partition topic, one message per batch, ``availableNow``: the per-batch time
    with ``foreachBatch`` doing nothing, ``toArrow()``, or ``mapInArrow`` (a Python worker) + ``toArrow()``."""
    starts: list[float] = []
    inside: list[float] = []

    def identity(batches):
        yield from batches

    def fb(df, batch_id: int) -> None:
        t = time.perf_counter()
        starts.append(t)
        if mode == "toArrow":
            df.select("topic", "partition", "offset", "key", "value").toArrow()
        elif mode == "mapInArrow":
            sel = df.select("topic", "partition", "offset", "key", "value")
            sel.mapInArrow(identity, sel.schema).toArrow()
        inside.append(time.perf_counter() - t)

    shutil.rmtree(ckpt, ignore_errors=True)
    q = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", kafka).option("subscribe", topic)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "1").load()
         .writeStream.foreachBatch(fb).option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())
    t = time.perf_counter()
    q.awaitTermination()
    wall = time.perf_counter() - t
    gaps = [b - a_ for a_, b in zip(starts, starts[1:])]
    return {"mode": mode, "batches": len(starts), "wall_s": round(wall, 2),
            "median_batch_interval_ms": round(1000 * (median(gaps) or 0), 1),
            "median_inside_foreachBatch_ms": round(1000 * (median(inside) or 0), 1)}


def run_micro_batches(a: argparse.Namespace) -> int:
    from applier.devtools.bench_parts import produce_stream
    from applier.devtools.bench_stream import generate_bench
    from applier.pipeline import make_engine, run, spark_session

    kafka, url = service_urls(a.target)
    run_id = safe_name(f"micro_{a.protocol}_{a.target}_{time.strftime('%H%M%S')}_{uuid.uuid4().hex[:4]}")
    topic, schema = f"bench-{run_id}", f"bench_{run_id}"
    ckpt = Path(tempfile.gettempdir()) / "applier-bench" / run_id
    # one partition, one table, mostly 1-4-row transactions, a resolved ts every few transactions
    wl = generate_bench(a.protocol, tables=1, partitions=1, events=a.micro_batch, big_txn_rows=0, seed=a.seed,
                        dup_fraction=0, resolved_interval_ms=6)
    produce_stream(kafka, topic, wl.messages(), partitions=1)
    settings = bench_settings(a, name=f"bench-{run_id}", topic=topic, url=url, kafka=kafka, schema=schema,
                              max_offsets=1, checkpoint=ckpt)
    spark = spark_session(settings)
    engine = make_engine(settings)
    clock = LiveClock()
    out: dict[str, Any] = {"protocol": a.protocol, "target": a.target, "messages": wl.stats.messages,
                           "row_events": wl.stats.row_events, "resolved_messages": wl.stats.resolved_messages}
    try:
        t = time.perf_counter()
        res = run(settings, until_caught_up=True, spark=spark, progress=False, timer=clock)
        out["wall_s"] = round(time.perf_counter() - t, 2)
        out["batches"] = res.batches
        starts = clock.batch_starts
        gaps = [b - a_ for a_, b in zip(starts[5:], starts[6:])]  # skip the first batches (workers starting)
        out["median_batch_interval_ms"] = round(1000 * (median(gaps) or 0), 1)
        out["stage_medians_ms"] = clock.batch_medians_ms(skip=5)
        rows_commits = [c for c in clock.commits if c.rows]
        out["batches_with_rows"] = len(rows_commits)
        out["verify"] = verify_target(engine, schema, {t_: (cs.rows, cs.digest_sum) for t_, cs in wl.expected.items()},
                                      settings.pipeline.name, wl.final_ts)
        out["spark_alone"] = [spark_baseline(spark, kafka, topic, m, ckpt / f"alone-{m}")
                              for m in ("nothing", "toArrow", "mapInArrow")]
        # run() refreshes the partition list on the apply thread every 30 s, before a batch (a JVM KafkaConsumer
        # each time): its warm cost lands on that batch's staleness
        from applier.pipeline import kafka_partitions
        times = []
        for _ in range(10):
            t = time.perf_counter()
            kafka_partitions(spark, settings)
            times.append(time.perf_counter() - t)
        out["partition_refresh_ms"] = {"median": round(1000 * (median(times) or 0), 1),
                                       "max": round(1000 * max(times), 1)}
    finally:
        spark.stop()
        _cleanup(engine, kafka, topic, schema, ckpt, a.keep)
        engine.dispose()
    if a.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print(f"1-message micro-batches ({a.protocol} -> {a.target}): {out['batches']} batches "
              f"({out['batches_with_rows']} applied rows) in {out['wall_s']} s; median batch interval "
              f"{out['median_batch_interval_ms']} ms; verify {'OK' if out['verify']['ok'] else 'MISMATCH'}")
        print("  applier stage medians (ms): " + ", ".join(f"{k} {v}" for k, v in sorted(out["stage_medians_ms"].items())))
        print(f"  partition list refresh (every 30 s on the apply thread): median "
              f"{out['partition_refresh_ms']['median']} ms, max {out['partition_refresh_ms']['max']} ms")
        for b in out["spark_alone"]:
            print(f"  Spark alone, foreachBatch {b['mode']:<10}: median batch interval {b['median_batch_interval_ms']} ms "
                  f"(inside foreachBatch {b['median_inside_foreachBatch_ms']} ms), {b['batches']} batches")
    return 0 if out["verify"]["ok"] else 1


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "startup-child":
        startup_child(json.loads(sys.argv[2]))
    elif len(sys.argv) == 3 and sys.argv[1] == "startup-bare-child":
        startup_bare_child(json.loads(sys.argv[2]))
    else:
        print("run through python -m applier.devtools.bench (--live/--sweep/--startup/--micro-batch)", file=sys.stderr)
        sys.exit(2)
