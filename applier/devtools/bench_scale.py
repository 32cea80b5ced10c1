"""``python -m applier.devtools.bench_scale``: does decoding scale out, and where does the one apply thread stop it?

Issue 15, target 4, and issue 25, point 4 (for each protocol). One topic with the bench workload
(``applier.devtools.bench_stream``) is produced once; then, for each worker count (``--workers 1,2``), a Spark
standalone cluster on loopback is started (:mod:`applier.devtools.cluster`: one master, that many one-core workers)
and:

1. **The pipeline**: ``applier.pipeline.run(settings, until_caught_up=True)`` with ``[spark] master = spark://...``
   and ``decode_on = "executors"``, into a fresh target schema, with the stage timer of the bench. Reported:
   wall, events/s, the Spark thread's **read** per event (``on_batch`` minus its wait for the apply thread: Kafka
   fetch, decoding in the executors' Python workers, ``toArrow()``), the apply thread's **apply** per event
   (``process``) and how much of it is CPU of that thread (``time.thread_time``: Python holding the GIL), the
   apply thread's utilisation (process seconds / wall), and the target's per-table checksums against the
   generator's (exit 1 when they differ).
2. **Decode only**: a batch query over the whole topic, ``read_chunks(df, spec)`` (the pipeline's own read),
   timed and divided by messages and by row changes, with nothing applied: the executors' decode time alone. The
   same query with a pass-through Python function (records reach the workers, only their count comes back) gives
   Kafka fetch + Arrow without decoding; the difference is decoding itself. What the workers do is each
   protocol's steady state in the pipeline:

   * ``open``, ``canal-json``, ``debezium``, ``avro`` decode alone (``decodes_alone``): ``spec`` is
     ``worker_spec(settings)``, and every message is decoded in the workers (avro: each worker process asks the
     registry once per schema id, then decodes from its cache).
   * ``simple`` decodes in the workers with the driver decoder's schema snapshot (``with_schemas``). The
     pipeline's driver learns a table's schema from its CREATE TABLE / BOOTSTRAP messages in the first
     micro-batches and snapshots it into every later one. Here a driver decoder learns them the pipeline's way:
     a first, untimed pass of the same query without a snapshot, whose chunks it rebuilds (``decode_chunks``:
     it decodes the schema messages the workers left it, in Kafka order). The timed passes then carry its
     snapshot, so the workers decode every row (none left to the driver for want of a schema) and leave only the
     schema messages to the driver, whose decoding of those few, like the rebuilding of chunks for every
     protocol, is not timed (in the pipeline it is the apply thread's). The report gives the messages left to
     the driver. The pipeline run's ``read`` per event, after the first micro-batch, is the same work with
     the snapshot the driver had at each batch.

   What the pipeline is configured with (``[source.codec]``, :func:`source_codec`) is what bench.py and
   bench_peer.py use for the stream: nothing for open, canal-json and simple (JSON); nothing for debezium
   either (bench_peer's default: TiCDC without enable-tidb-extension sends no watermark, so the pipeline is
   ungated, applies in offset order per partition, and the run is verified by its checksums only, on the Debezium
   shape ``DEBEZIUM_BENCH_COLUMN_NAMES``); avro: the registry's URL and ``enable_watermark`` (the stream's
   watermarks gate it). Avro needs a Confluent-compatible schema registry: ``APPLIER_REGISTRY_URL``, else the
   local one (``python -m applier.devtools.services start --only registry``); the stream's schemas are
   registered in it while it is produced.

Why both: the read and the apply overlap (applier/handoff.py), so a run's throughput is bounded by the slower of
the two per event, and ``1 / apply seconds per event`` is the apply thread's ceiling whatever the executors do.
The report says which side bounds each run, and a ``conclusion`` computed from the figures: how decoding scaled,
from how many workers the apply thread is the limit, and how many apply streams (one per group of tables, each
committing its rows with its own progress in one transaction, invariant 6, under a shared consistent-as-of
marker) would lift it.

Each worker count runs in its own spawned process (its own driver JVM), so the second is not favoured by the
first's warm JIT. Read and apply per event are taken after the first micro-batch, which alone pays the query's and
the Python workers' warm-up (``--max-offsets-per-trigger`` sets how many batches there are). The machine's CPU
busy share is reported next to every figure: on a small machine the driver, the target, Kafka and the executors
share the cores, and a second worker only helps while a core is free.
Tooling: the product never imports it. Uses the running services named by APPLIER_KAFKA / APPLIER_PG_URL /
APPLIER_MARIADB_URL (and APPLIER_REGISTRY_URL for avro; see ``applier.devtools.services``); starts none.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from applier.config import APPLY_ON
from applier.devtools.bench_parts import (StageClock, _count, check_workload_args, run_spawned, safe_name,
                                          system_cpu_ticks)
from applier.devtools.bench_stream import BENCH_PROTOCOLS

PROTOCOLS = BENCH_PROTOCOLS  # every stream the bench generator writes
TARGETS = ("postgres", "mariadb")

Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------------
# Arguments
# ---------------------------------------------------------------------------------------------------------

def parse_workers(text: str) -> list[int]:
    """``1,2`` -> [1, 2]: the worker counts to compare, ascending, each at least 1."""
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--workers takes counts like 1,2 (got {text!r})") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"--workers needs counts >= 1, e.g. 1,2 (got {text!r})")
    return counts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m applier.devtools.bench_scale",
        description="Decode time per event on a loopback Spark standalone cluster with 1 and 2 one-core workers, "
                    "and where the single apply thread becomes the limit (issue 15, target 4), for each protocol the "
                    "bench stream writes (issue 25, point 4).")
    p.add_argument("--protocol", choices=PROTOCOLS, default="canal-json",
                   help="the stream's protocol (avro needs a schema registry: APPLIER_REGISTRY_URL, or `python -m "
                        "applier.devtools.services start --only registry`)")
    p.add_argument("--target", choices=TARGETS, default="postgres")
    p.add_argument("--events", type=_count, default=200_000, help="distinct upstream row changes (200k, 1M, ...)")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--partitions", type=int, default=6, help="Kafka partitions: Spark reads one task per partition")
    p.add_argument("--big-txn-rows", type=_count, default=0,
                   help="rows of one very large upstream transaction (0, the default: steady throughput; a big "
                        "transaction is held and applied at once, which measures the gate, not the scale-out)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=parse_workers, default=[1, 2], help="worker counts to compare (1,2)")
    p.add_argument("--max-offsets-per-trigger", type=_count, default=25_000,
                   help="messages per micro-batch: several batches, so reading and applying overlap (25k)")
    p.add_argument("--batch-rows", type=int, default=5000, help="[target] batch_rows")
    p.add_argument("--apply-streams", type=int, default=1, help="[target] apply_streams (parallel transactions)")
    p.add_argument("--apply-on", choices=APPLY_ON, default="auto",
                   help="[target] apply_on: how the apply streams write (auto: the executors on the cluster)")
    p.add_argument("--buffer-mb", type=int, default=512, help="[pipeline] buffer_memory_mb")
    p.add_argument("--executor-memory", default="512m", help="spark.executor.memory (each worker offers 1g)")
    p.add_argument("--decode-repeat", type=int, default=2,
                   help="decode-only passes per worker count; the fastest counts (the first may start workers)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting for the driver")
    p.add_argument("--keep", action="store_true", help="keep the topic, the target schemas and the cluster folders")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    check_workload_args(p, a, ("tables", "partitions", "batch_rows", "buffer_mb", "max_offsets_per_trigger",
                               "decode_repeat"))
    return a


# ---------------------------------------------------------------------------------------------------------
# Each protocol's pipeline settings
# ---------------------------------------------------------------------------------------------------------

def source_codec(protocol: str, registry_url: str | None = None) -> dict[str, Any]:
    """``[source.codec]`` for the bench stream of ``protocol``, as bench.py and bench_peer.py configure the applier
    for it: nothing but for avro, whose decoder needs the registry the stream's schemas are in and
    ``enable_watermark`` for the watermarks the stream carries (without it they would be decode errors). Debezium
    gets nothing either: the bench's Debezium stream has no watermark (TiCDC without enable-tidb-extension), so
    ``gated = true`` would be wrong for it."""
    if protocol == "avro":
        if not registry_url:
            raise ValueError("the avro stream needs the schema registry's URL")
        return {"registry_url": registry_url, "enable_watermark": True}
    return {}


def schema_registry(log: Log) -> tuple[str, Any]:
    """(URL, client) of the Confluent-compatible registry the avro stream's schemas are registered in:
    APPLIER_REGISTRY_URL, else the local services' one. Asked once before anything is produced, so that a registry
    that is not running stops the run here, with what to do, rather than in the middle of producing the topic."""
    from applier.codecs.registry import RegistryClient, RegistryError, SchemaNotFound
    from applier.devtools import services

    url = os.environ.get("APPLIER_REGISTRY_URL") or services.urls().registry_url
    client = RegistryClient(url, timeout=10, retries=1)
    try:
        client.latest_version(f"applier-bench-scale-probe-{uuid.uuid4().hex[:8]}")
    except SchemaNotFound:
        pass  # it answers
    except RegistryError as exc:  # before anything exists to clean up: the message, not a traceback (exit 1)
        raise SystemExit(f"bench_scale: the avro stream needs a schema registry (APPLIER_REGISTRY_URL, else the local "
                         f"one): {exc}") from None
    log(f"schema registry: {client.url}")
    return url, client


# ---------------------------------------------------------------------------------------------------------
# Figures and the conclusion (pure: tests/unit/test_bench_scale.py)
# ---------------------------------------------------------------------------------------------------------

def per_event_us(seconds: float | None, events: int) -> float | None:
    return None if seconds is None or events <= 0 else 1e6 * seconds / events


def ceiling(us_per_event: float | None) -> float | None:
    """Events/s one side could sustain alone: 1 / its seconds per event."""
    return None if not us_per_event else 1e6 / us_per_event


def steady_state(on_batch: Sequence[float], submit_wait: Sequence[float], process: Sequence[float],
                 messages: Sequence[int], events: int) -> dict[str, Any] | None:
    """Read and apply per event after the first micro-batch, which alone pays the query's and the Python
    workers' warm-up (the decoder's imports, cold JITs): the rate the pipeline keeps once running. The lists
    are per batch, in order (the hand-off is first in, first out); events are shared out by messages. None
    when there is no second batch or the lists do not line up."""
    n = len(on_batch)
    if n < 2 or not (len(submit_wait) == len(process) == len(messages) == n) or not sum(messages):
        return None
    later = sum(messages[1:])
    if not later:
        return None
    later_events = events * later / sum(messages)
    read = sum(on_batch[1:]) - sum(submit_wait[1:])
    return {"batches": n - 1, "events": round(later_events),
            "read_us_per_event": per_event_us(read, later_events),  # type: ignore[arg-type]
            "apply_us_per_event": per_event_us(sum(process[1:]), later_events),  # type: ignore[arg-type]
            "first_batch_read_s": round(on_batch[0] - submit_wait[0], 3), "first_batch_apply_s": round(process[0], 3),
            "first_batch_messages": messages[0]}


def read_apply(p: Mapping[str, Any]) -> tuple[float, float, str]:
    """(read, apply) us per event of a run and their basis: after the first micro-batch when there was a
    second one, else the whole run."""
    st = p.get("steady")
    if st:
        return st["read_us_per_event"], st["apply_us_per_event"], "after the first micro-batch"
    return p["read_us_per_event"], p["apply_us_per_event"], "whole run"


def run_figures(run: Mapping[str, Any]) -> dict[str, Any]:
    """The per-run verdict: which side bounds the pipeline (read and apply overlap through the hand-off, so the
    slower of the two per event does) and each side's ceiling on its own."""
    p = run["pipeline"]
    read, apply, basis = read_apply(p)
    whole_apply = p["apply_us_per_event"]
    return {
        "workers": run["workers"],
        "basis": basis,
        "read_us_per_event": read,
        "apply_us_per_event": apply,
        "bound_by": "apply" if apply >= read else "read",
        "read_ceiling_events_per_s": ceiling(read),
        "apply_ceiling_events_per_s": ceiling(apply),
        "apply_cpu_share": (p["apply_cpu_us_per_event"] / whole_apply) if whole_apply else None,
    }


@dataclass(frozen=True)
class ReadModel:
    """read(n) = fixed + spread / n, through two measured worker counts: the part of the read that does not
    spread over executors (driver side: the Spark thread's toArrow and chunk handling, Kafka metadata, the
    per-batch job overhead) and the part that does (fetch and decode in the executors)."""

    fixed_us: float
    spread_us: float

    @classmethod
    def fit(cls, n1: int, r1: float, n2: int, r2: float) -> "ReadModel":
        if n1 == n2:
            raise ValueError("two different worker counts are needed")
        spread = (r1 - r2) / (1 / n1 - 1 / n2)
        return cls(r1 - spread / n1, spread)

    def at(self, workers: float) -> float:
        return self.fixed_us + self.spread_us / workers

    def workers_below(self, target_us: float) -> int | None:
        """The fewest workers whose read per event is at or below ``target_us`` (None: no number of workers
        gets there, because the part that does not spread is already above it, or reading does not scale)."""
        if self.spread_us <= 0:
            return 1 if self.fixed_us + self.spread_us <= target_us else None
        if target_us <= self.fixed_us:
            return None
        return max(1, math.ceil(self.spread_us / (target_us - self.fixed_us) - 1e-9))


SATURATED = 0.9  # machine CPU busy share above which a worker more had no free core to run on


def _fit(points: Sequence[tuple[int, float]], apply_us: float) -> dict[str, Any] | None:
    """A :class:`ReadModel` through the first and last (workers, us/event) points, and from how many workers
    that side would be at or below ``apply_us`` (the apply thread's cost per event)."""
    if len(points) < 2 or points[0][0] == points[-1][0]:
        return None
    m = ReadModel.fit(*points[0], *points[-1])
    return {"fixed_us_per_event": m.fixed_us, "spread_us_per_event": m.spread_us,
            "below_apply_from_workers": m.workers_below(apply_us)}


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Figures across the runs that completed: the per-run verdicts, how decoding scaled, two read models
    (the executors' decode-only query, and the pipeline's read with its per-micro-batch costs), from how many
    workers each would be faster than the apply thread, and how many apply streams would match the read."""
    ok = [r for r in runs if "pipeline" in r]
    out: dict[str, Any] = {"runs": [run_figures(r) for r in ok]}
    if not ok:
        return out
    figs = out["runs"]
    best_apply = min(f["apply_us_per_event"] for f in figs)
    out["best_apply_us_per_event"] = best_apply
    dec = [r for r in ok if r.get("decode_only")]
    if len(dec) >= 2:
        first, last = dec[0]["decode_only"], dec[-1]["decode_only"]
        out["decode_scaling"] = {
            "from_workers": dec[0]["workers"], "to_workers": dec[-1]["workers"],
            "us_per_event": [first["us_per_event"], last["us_per_event"]],
            "decode_alone_us_per_event": [first["decode_us_per_event"], last["decode_us_per_event"]],
            "ratio": last["us_per_event"] / first["us_per_event"] if first["us_per_event"] else None}
        out["decode_model"] = _fit([(r["workers"], r["decode_only"]["us_per_event"]) for r in dec], best_apply)
    out["read_model"] = _fit([(f["workers"], f["read_us_per_event"]) for f in figs], best_apply)
    best_read = min(f["read_us_per_event"] for f in figs)
    # streams for the apply side's aggregate ceiling to reach the best read ceiling measured
    out["apply_streams_to_match_read"] = max(1, math.ceil(figs[-1]["apply_us_per_event"] / best_read - 1e-9))
    out["machine_busy_share_max"] = max(r["cpu"]["machine_busy_share"] or 0.0 for r in ok)
    out["saturated"] = out["machine_busy_share_max"] >= SATURATED
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _crossing(label: str, model: Mapping[str, Any] | None, apply_us: float) -> str | None:
    if not model:
        return None
    n = model["below_apply_from_workers"]
    when = (f"from about {n} one-core worker(s)" if n is not None else
            f"at no worker count (its part that does not spread, {model['fixed_us_per_event']:.1f} us/event, is "
            f"already at or above it)" if model["spread_us_per_event"] > 0 else "at no worker count (it did not fall)")
    return (f"{label} fits {model['fixed_us_per_event']:.1f} + {model['spread_us_per_event']:.1f}/n us/event: it "
            f"gets below the apply thread's {apply_us:.1f} us/event {when}.")


def conclusion(runs: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> str:
    """The answer to target 4 in a few sentences, every number taken from the runs."""
    ok = [r for r in runs if "pipeline" in r]
    if not ok:
        return "no run completed: nothing to conclude"
    parts = []
    ds = summary.get("decode_scaling")
    if ds:
        (d0, d1), (x0, x1) = ds["us_per_event"], ds["decode_alone_us_per_event"]
        verb = "fell" if d1 < d0 else "did not fall"
        parts.append(f"Decode-only time per event (executors: Kafka fetch + decode) {verb} from {d0:.1f} us "
                     f"({ds['from_workers']} worker) to {d1:.1f} us ({ds['to_workers']} workers), x{ds['ratio']:.2f}; "
                     f"decoding alone (minus the pass-through query) {x0:.1f} -> {x1:.1f} us.")
    for r, f in zip(ok, summary["runs"]):
        p = r["pipeline"]
        parts.append(
            f"{r['workers']} worker(s), {f['basis']}: read {f['read_us_per_event']:.1f} us/event, apply "
            f"{f['apply_us_per_event']:.1f} us/event (apply thread busy {_pct(p['apply_utilisation'])} of the wall), "
            f"so the {f['bound_by']} side bounds it; the apply thread alone caps at "
            f"{f['apply_ceiling_events_per_s']:,.0f} events/s (machine CPU busy {_pct(r['cpu']['machine_busy_share'])}).")
    apply_us = summary["best_apply_us_per_event"]
    bound = [f["workers"] for f in summary["runs"] if f["bound_by"] == "apply"]
    if bound:
        parts.append(f"The single apply thread is already the limit with {bound[0]} worker(s).")
    for label, key in (("The executors' decode-only cost", "decode_model"),
                       ("The pipeline's read (with Spark's per-micro-batch costs)", "read_model")):
        sentence = _crossing(label, summary.get(key), apply_us)
        if sentence:
            parts.append(sentence)
    if summary.get("saturated"):
        parts.append(f"Caveat: the machine was up to {_pct(summary['machine_busy_share_max'])} busy, so a worker more "
                     "found little free CPU: the fits understate what spreads on a machine with spare cores.")
    last, lf = ok[-1]["pipeline"], summary["runs"][-1]
    k = summary["apply_streams_to_match_read"]
    cpu_share = lf["apply_cpu_share"] or 0.0
    where_streams = ("separate processes: most of its time is Python holding the GIL, which threads in one process "
                     "would share" if cpu_share >= 0.5 else
                     f"threads or processes: {_pct(1 - cpu_share)} of its time is not its own CPU (waiting on the "
                     f"target, or for a core), which threads can overlap; processes also spread the CPU part")
    parts.append(
        f"The apply thread's time is {_pct(cpu_share)} its own CPU ({last['apply_cpu_us_per_event']:.1f} of "
        f"{last['apply_us_per_event']:.1f} us/event). What lifts its ceiling: several transaction streams, one per "
        f"group of tables, in {where_streams}. Each commits its rows with its own progress row in one transaction "
        f"(invariant 6 holds per stream), and the replica's consistent-as-of marker is the minimum of the streams' "
        f"applied resolved ts, advanced only once all have committed through it (a DDL is a barrier). "
        f"{k} stream(s) would match the best read rate measured here "
        f"({max(f['read_ceiling_events_per_s'] for f in summary['runs']):,.0f} events/s), the target permitting; "
        f"a second one pays only once the read gets below {lf['apply_us_per_event']:.1f} us/event.")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------------------
# Measuring
# ---------------------------------------------------------------------------------------------------------

PER_BATCH_STAGES = ("on_batch", "submit_wait", "process")


class ThreadCpuClock(StageClock):
    """The bench's stage clock plus the CPU time of the thread inside each span (``time.thread_time``: for
    ``process`` that is the apply thread's own Python work, which holds the GIL; the rest of its wall is waiting,
    on the target or for the GIL), and per micro-batch the read and apply durations and its messages, so the
    first batch's warm-up can be told from the steady state."""

    def __init__(self) -> None:
        super().__init__()
        self.cpu: dict[str, float] = defaultdict(float)
        self.per_batch: dict[str, list[float]] = {k: [] for k in PER_BATCH_STAGES}
        self.batch_messages: list[int] = []

    def add(self, stage: str, seconds: float) -> None:
        super().add(stage, seconds)
        if stage in self.per_batch:
            self.per_batch[stage].append(seconds)

    def applied(self, report: Any, gate: Any) -> None:
        self.batch_messages.append(report.messages)

    @contextmanager
    def span(self, stage: str) -> Iterator[None]:
        c = time.thread_time()
        try:
            with super().span(stage):
                yield
        finally:
            self.cpu[stage] += time.thread_time() - c


class CpuWindow:
    """Machine-wide CPU busy seconds and this process's CPU over a block (``/proc/stat``, ``getrusage``)."""

    def __enter__(self) -> "CpuWindow":
        self.load = os.getloadavg()[0]
        self.t0, self.sys0 = time.perf_counter(), system_cpu_ticks()
        self.ru0 = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.t0
        sys1, ru1 = system_cpu_ticks(), resource.getrusage(resource.RUSAGE_SELF)
        self.busy = (sys1[0] - self.sys0[0]) / os.sysconf("SC_CLK_TCK")
        self.driver = (ru1.ru_utime + ru1.ru_stime) - (self.ru0.ru_utime + self.ru0.ru_stime)

    def figures(self) -> dict[str, Any]:
        cpus = os.cpu_count() or 1
        return {"machine_busy_cpu_s": round(self.busy, 2), "cpus": cpus,
                "machine_busy_share": round(self.busy / (cpus * self.wall), 3) if self.wall else None,
                "driver_cpu_s": round(self.driver, 2), "loadavg_1m_before": round(self.load, 2)}


def count_records(batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body of the pass-through query: the records reach the Python worker, only their count
    comes back (Kafka fetch + Arrow to Python and back, without decoding)."""
    import pyarrow as pa

    for rb in batches:
        yield pa.RecordBatch.from_arrays([pa.array([rb.num_rows], type=pa.int64())], names=["n"])


def topic_frame(spark, settings):
    """The whole topic as one batch DataFrame, read with the source's own options."""
    reader = spark.read.format("kafka")
    for k, v in settings.source.spark_options().items():
        reader = reader.option(k, v)
    return reader.option("startingOffsets", "earliest").option("endingOffsets", "latest").load()


def learn_schemas(decoder: Any, chunks: Sequence[bytes]) -> int:
    """For a protocol whose workers decode with the driver's schemas (Simple): ``decoder`` rebuilds ``chunks``, the
    workers' read of the topic, in Kafka order as the pipeline's apply thread does (``decode_chunks``), and so learns
    the schemas of the messages the workers left to it (CREATE TABLE, BOOTSTRAP). Returns how many table schemas
    its snapshot for the workers now carries."""
    from applier.decode import decode_chunks

    decode_chunks(chunks, {}, decoder)
    return decoder.schema_snapshot().tables


def rebuild(chunks: Sequence[bytes], decoder: Any) -> tuple[Any, dict[str, int]]:
    """What the executors returned, rebuilt as the driver does (``decode_chunks``, with the driver's ``decoder``,
    which decodes what the workers left it), and how many messages the workers left: ``left_to_driver`` to decode
    there (Simple's schema messages, or rows whose schema the snapshot lacked), ``provisional`` decoded with a
    schema a worker learnt itself, for the driver to confirm (both 0 for a protocol that decodes alone). A decode
    error is a broken measurement, not a figure: it raises."""
    from applier.codecs import WORKER_CHECK, WORKER_RAW
    from applier.decode import _load_chunk, decode_chunks

    left = [lo for _, lo in (_load_chunk(c, None) for c in chunks) if lo is not None]
    counts = {"left_to_driver": sum(lo.kinds.count(WORKER_RAW) for lo in left),
              "provisional": sum(lo.kinds.count(WORKER_CHECK) for lo in left)}
    decoded = decode_chunks(chunks, {}, decoder)
    if decoded.errors:
        msg, exc = decoded.errors[0]
        raise RuntimeError(f"decode-only: {len(decoded.errors):,} message(s) did not decode, first "
                           f"{msg.topic}[{msg.partition}]@{msg.offset}: {exc}")
    return decoded, counts


def decode_only(spark, settings, messages: int, events: int, repeat: int) -> dict[str, Any]:
    """The executors' decode time with nothing applied, and the pass-through baseline, per message and per
    event (``events``: the workload's row changes, the denominator of the pipeline's figures too). Simple's timed
    passes carry the schema snapshot of a driver decoder that learnt the topic's schemas first (module docstring)."""
    from applier.decode import with_schemas
    # count_records by its module name, not __main__'s: the executors import it from the zip
    from applier.devtools.bench_scale import count_records as passthrough
    from applier.pipeline import RECORD_COLUMNS, decoder_for, read_chunks, worker_spec

    spec = worker_spec(settings)
    driver = decoder_for(settings)  # the pipeline's driver decoder, for what the workers leave to it
    out: dict[str, Any] = {}
    if getattr(driver, "decodes_with_schemas", False):
        t = time.perf_counter()
        out["snapshot_tables"] = learn_schemas(driver, read_chunks(topic_frame(spark, settings), spec))
        out["schema_pass_s"] = round(time.perf_counter() - t, 3)  # not timed: it is how the driver gets there
        spec = with_schemas(spec, driver)
    passes, through = [], []
    chunks: list[bytes] = []
    with CpuWindow() as cpu:
        for _ in range(repeat):
            t = time.perf_counter()
            chunks = read_chunks(topic_frame(spark, settings), spec)
            passes.append(time.perf_counter() - t)
            t = time.perf_counter()
            counted = topic_frame(spark, settings).select(*RECORD_COLUMNS).mapInArrow(passthrough, "n long")
            seen = sum(counted.toArrow().column(0).to_pylist())
            through.append(time.perf_counter() - t)
    decoded, left = rebuild(chunks, driver)  # outside the timing: what the executors returned
    if decoded.messages != messages or seen != messages:
        raise RuntimeError(f"decode-only read {decoded.messages:,} messages (pass-through {seen:,}) of {messages:,}")
    best, base = min(passes), min(through)
    return {"messages": messages, "events": events, "decoded_events": len(decoded.events), **left, **out,
            "passes_s": [round(x, 3) for x in passes], "passthrough_s": [round(x, 3) for x in through],
            "seconds": round(best, 3), "us_per_message": per_event_us(best, messages),
            "us_per_event": per_event_us(best, events),
            "passthrough_us_per_message": per_event_us(base, messages),
            "passthrough_us_per_event": per_event_us(base, events),
            "decode_us_per_event": per_event_us(best - base, events), "cpu": cpu.figures()}


def pipeline_figures(clock: ThreadCpuClock, rep: Any, wall: float, events: int, batches: int) -> dict[str, Any]:
    """The stage clock's sums as per-event figures of the two threads."""
    s = clock.seconds
    read = s.get("on_batch", 0.0) - s.get("submit_wait", 0.0)
    apply = s.get("process", 0.0)
    split = {k: round(rep.seconds.get(k, 0.0), 3) for k in ("decode", "gate", "apply")}
    split.update({k: round(s.get(k, 0.0), 3) for k in ("plan", "write", "progress", "commit")})
    return {
        "wall_s": round(wall, 2), "events": events, "messages": rep.messages, "batches": batches,
        "events_per_s": events / wall if wall else None,
        "read_s": round(read, 3), "read_us_per_event": per_event_us(read, events),
        "read_thread_cpu_s": round(clock.cpu.get("on_batch", 0.0), 3),
        "submit_wait_s": round(s.get("submit_wait", 0.0), 3),
        "apply_s": round(apply, 3), "apply_us_per_event": per_event_us(apply, events),
        "apply_cpu_s": round(clock.cpu.get("process", 0.0), 3),
        "apply_cpu_us_per_event": per_event_us(clock.cpu.get("process", 0.0), events),
        "apply_utilisation": apply / wall if wall else None,
        "outside_batches_s": round(wall - s.get("on_batch", 0.0) - s.get("drain", 0.0), 3),
        "apply_split_s": split,
        "steady": steady_state(*(clock.per_batch[k] for k in PER_BATCH_STAGES), clock.batch_messages, events),
    }


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------

@dataclass
class Workload:
    """The produced topic and what the target must hold afterwards."""

    kafka: str
    url: str
    topic: str
    run_id: str
    messages: int
    events: int
    expected: dict[str, tuple[int, int]]  # per table, over ``columns``
    final_ts: int
    stats: dict[str, Any]
    codec: dict[str, Any]  # [source.codec] for the stream (source_codec)
    columns: tuple[str, ...]  # the stream's shape (the Debezium stream leaves ``payload`` out)
    gated: bool  # the pipeline gates on resolved ts, so its applied resolved ts must end at ``final_ts``


def produce_workload(a: argparse.Namespace, log: Log) -> Workload:
    """Generate the bench workload straight into a new topic (as ``bench.run_bench`` does)."""
    from applier.codecs import get_decoder
    from applier.devtools.bench_live import service_urls
    from applier.devtools.bench_parts import produce_stream
    from applier.devtools.bench_stream import generate_bench

    kafka, url = service_urls(a.target)
    run_id = safe_name(f"scale_{a.protocol}_{a.target}_{a.events}_{time.strftime('%H%M%S')}_{uuid.uuid4().hex[:4]}")
    topic = f"bench-{run_id}"
    avro: dict[str, Any] = {}
    registry_url = None
    if a.protocol == "avro":
        registry_url, client = schema_registry(log)
        avro = {"registry": client, "topic": topic}
    codec = source_codec(a.protocol, registry_url)
    wl = generate_bench(a.protocol, tables=a.tables, partitions=a.partitions, events=a.events,
                        big_txn_rows=a.big_txn_rows, seed=a.seed, **avro)
    log(f"producing {a.events:,} row changes ({a.protocol}, {a.partitions} partitions) into {topic}")
    t = time.perf_counter()
    n, nbytes = produce_stream(kafka, topic, wl.messages(), partitions=a.partitions, log=log)
    log(f"  {n:,} messages in {time.perf_counter() - t:.1f} s")
    return Workload(kafka, url, topic, run_id, n, wl.stats.row_events,
                    {t_: (cs.rows, cs.digest_sum) for t_, cs in wl.expected.items()}, wl.final_ts,
                    {**vars(wl.stats), "bytes": nbytes}, codec, wl.columns, get_decoder(a.protocol, **codec).gated)


def scale_settings(a: argparse.Namespace, wl: Workload, *, master: str, conf: Mapping[str, str], schema: str,
                   name: str, checkpoint: Path) -> Any:
    """The pipeline as a user would configure it for a cluster: ``decode_on = "executors"`` (``auto`` would
    decode small batches in the driver, which is not what is measured), a fresh name and schema per run."""
    from applier.config import parse_config
    from applier.devtools.bench_stream import BENCH_SCHEMA

    cfg = {
        "pipeline": {"name": name, "checkpoint_dir": str(checkpoint), "buffer_memory_mb": a.buffer_mb,
                     "decode_on": "executors", "max_offsets_per_trigger": a.max_offsets_per_trigger},
        "source": {"bootstrap_servers": wl.kafka, "topics": [wl.topic], "protocol": a.protocol, "codec": wl.codec},
        "target": {"url": wl.url, "batch_rows": a.batch_rows, "apply_streams": a.apply_streams,
                   "apply_on": a.apply_on},
        "spark": {"master": master, "conf": dict(conf)},
        "route": [{"match": f"{BENCH_SCHEMA}.*", "schema": schema}],
    }
    return parse_config(cfg, source="<bench-scale>")


def measure_pipeline(spark, settings, wl: Workload, schema: str) -> dict[str, Any]:
    """``run(until_caught_up=True)`` timed by thread, then the target's checksums (on the stream's columns) and,
    for a gated stream, its applied resolved ts (an ungated one has none: its applied ts is only the highest
    commit ts it applied)."""
    from applier.devtools.bench_live import verify_target
    from applier.pipeline import make_engine, run

    clock = ThreadCpuClock()
    with CpuWindow() as cpu:
        res = run(settings, until_caught_up=True, spark=spark, progress=False, timer=clock)
    out = {"pipeline": pipeline_figures(clock, res.report, cpu.wall, wl.events, res.batches), "cpu": cpu.figures()}
    engine = make_engine(settings)
    try:
        out["verify"] = verify_target(engine, schema, wl.expected, settings.pipeline.name,
                                      wl.final_ts if wl.gated else None, wl.columns)
    finally:
        engine.dispose()
    return out


def drop_target(settings, schema: str, log: Log) -> None:
    from applier.devtools.bench_parts import drop_schema
    from applier.pipeline import make_engine

    engine = make_engine(settings)
    try:
        drop_schema(engine, schema)
    except Exception as exc:  # best effort
        log(f"could not drop {schema}: {exc}")
    finally:
        engine.dispose()


def run_on_cluster(a: argparse.Namespace, wl: Workload, workers: int, log: Log) -> dict[str, Any]:
    """One worker count: a fresh cluster, session, pipeline run into a fresh schema, decode-only passes."""
    from applier.devtools.cluster import standalone_cluster
    from applier.session import spark_session

    schema = f"bench_{wl.run_id}_w{workers}"
    ckpt = Path(tempfile.gettempdir()) / "applier-bench" / f"{wl.run_id}_w{workers}"
    out: dict[str, Any] = {"workers": workers, "schema": schema}
    t = time.perf_counter()
    with standalone_cluster(workers, cores=1, memory="1g", keep_dir=a.keep, log=log) as cluster:
        out["cluster_start_s"] = round(time.perf_counter() - t, 1)
        conf = cluster.driver_conf(executor_memory=a.executor_memory, extra=a.spark_conf)
        settings = scale_settings(a, wl, master=cluster.url, conf=conf, schema=schema,
                                  name=f"scale-{wl.run_id}-w{workers}", checkpoint=ckpt)
        try:
            t = time.perf_counter()
            spark = spark_session(settings, app_name=f"applier-bench-scale-w{workers}")
            out["spark_session_s"] = round(time.perf_counter() - t, 1)
            try:
                measure_on(spark, a, settings, wl, schema, out, log)
            finally:
                spark.stop()
        finally:
            if not a.keep:
                drop_target(settings, schema, log)
                shutil.rmtree(ckpt, ignore_errors=True)
    return out


def measure_on(spark, a: argparse.Namespace, settings, wl: Workload, schema: str, out: dict[str, Any],
               log: Log) -> None:
    """The pipeline run, then the decode-only passes, on one session (results go into ``out``)."""
    workers = out["workers"]
    log(f"  {workers} worker(s): pipeline run(until_caught_up) into {schema}")
    out.update(measure_pipeline(spark, settings, wl, schema))
    p = out["pipeline"]
    log(f"    {p['wall_s']} s, {p['events_per_s']:,.0f} events/s, verify {'OK' if out['verify']['ok'] else 'FAILED'}")
    log(f"  {workers} worker(s): decode-only passes over the topic")
    out["decode_only"] = decode_only(spark, settings, wl.messages, wl.events, a.decode_repeat)
    log(f"    {out['decode_only']['us_per_event']:.1f} us/event")


def _on_cluster_quietly(a: argparse.Namespace, wl: Workload, workers: int) -> dict[str, Any]:
    return run_on_cluster(a, wl, workers, _stderr)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_isolated(a: argparse.Namespace, wl: Workload, workers: int, log: Log) -> dict[str, Any]:
    """:func:`run_on_cluster` in a spawned process of its own (a cold driver JVM per worker count, so the second
    count does not start warmer than the first); returns its result (or its error)."""
    result = run_spawned(_on_cluster_quietly, a, wl, workers, name=f"bench-scale-w{workers}",
                         label={"workers": workers})
    if "error" in result:
        log(f"  {workers} worker(s) FAILED: {result['error'].splitlines()[0][:300]}")
    return result


def machine_info() -> dict[str, Any]:
    """bench.py's machine description (CPU model, memory, kernel); the CPU count alone if it cannot be had."""
    try:
        from applier.devtools.bench import machine
        return machine()
    except Exception:  # bench.py is tooling under change: the count is what the report needs
        return {"cpus": os.cpu_count()}


def run_scale(a: argparse.Namespace, log: Log) -> dict[str, Any]:
    from applier.devtools.bench_parts import delete_topic

    wl = produce_workload(a, log)
    result: dict[str, Any] = {
        "params": {k: v for k, v in vars(a).items() if k != "json"}, "topic": wl.topic, "machine": machine_info(),
        "workload": wl.stats, "stream": {"gated": wl.gated, "columns": list(wl.columns)}, "runs": []}
    t = time.perf_counter()
    try:
        for n in a.workers:
            result["runs"].append(run_isolated(a, wl, n, log))
    finally:
        if not a.keep:
            why = delete_topic(wl.kafka, wl.topic)
            if why:
                log(f"could not delete topic {wl.topic}: {why}")
    result["measuring_seconds"] = round(time.perf_counter() - t, 1)
    result["summary"] = summarize(result["runs"])
    result["conclusion"] = conclusion(result["runs"], result["summary"])
    return result


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------

def _f(v: float | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def _row(run: Mapping[str, Any], f: Mapping[str, Any]) -> str:
    pl, d = run["pipeline"], run.get("decode_only") or {}
    verify = "OK" if run["verify"]["ok"] else "FAILED " + str(run["verify"]["differences"])[:200]
    return (f"{run['workers']:>7} | {_f(d.get('us_per_event'), '.1f'):>16} | {_f(d.get('passthrough_us_per_event'), '.1f'):>13} | "
            f"{_f(d.get('cpu', {}).get('machine_busy_share'), '.0%'):>5} | {pl['wall_s']:>6.1f} | "
            f"{_f(pl['events_per_s'], ',.0f'):>8} | {f['read_us_per_event']:>7.1f} | {f['apply_us_per_event']:>8.1f} | "
            f"{pl['apply_cpu_us_per_event']:>6.1f} | {pl['apply_utilisation']:>6.0%} | {f['bound_by']:>5} | "
            f"{f['apply_ceiling_events_per_s']:>9,.0f} | {run['cpu']['machine_busy_share']:>5.0%} | {verify}")


def stream_notes(r: Mapping[str, Any]) -> list[str]:
    """What the figures of this protocol's stream mean beyond the legend: an ungated stream's verification, and
    the schema snapshot Simple's decode-only passes carried with what the workers still left to the driver."""
    lines = []
    stream = r.get("stream") or {}
    if stream and not stream.get("gated", True):
        lines.append(f"  {r['params']['protocol']}: an ungated stream (no watermark; offset order per partition): "
                     f"verify compares the per-table checksums over its columns ({', '.join(stream['columns'])}), "
                     "not the applied resolved ts")
    for run in r["runs"]:
        d = run.get("decode_only") or {}
        if "snapshot_tables" in d:
            lines.append(f"  {run['workers']} worker(s): the decode-only passes carried the schema snapshot "
                         f"({d['snapshot_tables']} tables) of a driver decoder that learnt them from a first, "
                         f"untimed pass ({d['schema_pass_s']:.1f} s); the workers left {d['left_to_driver']:,} of "
                         f"{d['messages']:,} messages to the driver's decoder and sent {d['provisional']:,} "
                         "provisional rows")
    return lines


def format_report(r: Mapping[str, Any]) -> str:
    p, w = r["params"], r["workload"]
    lines = [
        f"scale-out: {p['protocol']} -> {p['target']}, {w['row_events']:,} row changes, {w['messages']:,} messages, "
        f"{p['partitions']} partitions, micro-batches of {p['max_offsets_per_trigger']:,} messages, one-core "
        f"workers on loopback ({r['machine']['cpus']} CPUs on this machine)",
        "",
        "        | decode-only query             | pipeline run(until_caught_up)",
        f"{'workers':>7} | {'decode us/event':>16} | {'pass-through':>13} | {'busy':>5} | {'wall s':>6} | "
        f"{'events/s':>8} | {'read us':>7} | {'apply us':>8} | {'CPU us':>6} | {'util':>6} | {'bound':>5} | "
        f"{'apply cap':>9} | {'busy':>5} | verify",
    ]
    figs = {f["workers"]: f for f in r["summary"]["runs"]}
    for run in r["runs"]:
        if "pipeline" in run:
            lines.append(_row(run, figs[run["workers"]]))
        else:
            lines.append(f"{run['workers']:>7} | FAILED: {run.get('error', '?').splitlines()[0][:160]}")
    lines += [
        "",
        "  decode us/event: the whole topic read and decoded by the executors (read_chunks), nothing applied; "
        "pass-through: the same records to the Python workers and only their count back (Kafka fetch + Arrow)",
        "  read: the Spark thread's on_batch minus its wait for the apply thread (Kafka fetch, decoding in the "
        "executors, toArrow); apply: the apply thread's process; both after the first micro-batch when there was "
        "a second (the first pays the warm-up); CPU us: the apply thread's own CPU per event over the run (GIL "
        "held); util: apply seconds / wall; apply cap: 1 / apply seconds per event; busy: the whole machine's CPU "
        "share", *stream_notes(r), ""]
    for run in r["runs"]:
        if "pipeline" in run:
            pl = run["pipeline"]
            sp = ", ".join(f"{k} {v:.2f}" for k, v in pl["apply_split_s"].items())
            st = pl.get("steady") or {}
            first = (f" (first batch, {st['first_batch_messages']:,} messages: read {st['first_batch_read_s']:.1f} s, "
                     f"apply {st['first_batch_apply_s']:.1f} s)" if st else "")
            lines.append(f"  {run['workers']} worker(s): {pl['batches']} micro-batches{first}; whole run: read "
                         f"{pl['read_s']:.1f} s ({pl['read_us_per_event']:.1f} us/event), apply {pl['apply_s']:.1f} s "
                         f"({pl['apply_us_per_event']:.1f} us/event; {sp}), outside batches (query start, planning) "
                         f"{pl['outside_batches_s']:.1f} s; cluster start {run['cluster_start_s']} s, Spark session "
                         f"{run['spark_session_s']} s")
    lines += ["", "conclusion: " + r["conclusion"], f"(measuring took {r['measuring_seconds']} s)"]
    return "\n".join(lines)


def all_verified(r: Mapping[str, Any]) -> bool:
    return all("verify" in run and run["verify"]["ok"] for run in r["runs"])


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)

    try:
        result = run_scale(a, _stderr)
    except KeyboardInterrupt:
        print("bench_scale interrupted", file=sys.stderr)
        return 130
    print(json.dumps(result, indent=2, default=str) if a.json else format_report(result))
    if not all_verified(result):
        print("bench_scale FAILED: a run failed or its target does not equal the expected state", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
