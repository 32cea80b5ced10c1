"""``python -m applier.devtools.bench``: end-to-end throughput of the applier on the local services, with its own yardsticks.

One run does, in this order:

1. **Generate and produce** a TiCDC changefeed (``applier.devtools.bench_stream.generate_bench``: N mixed-type tables, hot
   keys, inserts/updates/deletes/PK changes, transactions of varying size plus one of ``--big-txn-rows`` rows,
   resolved ts every second of upstream time, TiCDC-restart replays) straight from a generator into a new Kafka
   topic. The driver never holds the workload: the expected final state is a per-table checksum.
2. **Raw Kafka read**: a confluent-kafka consumer reads the same topic from the beginning to the end offsets
   (bytes and messages counted): the rate at which the messages can physically be read on this machine.
3. **The applier**: ``applier.pipeline.run(settings, until_caught_up=True)`` in this process, ``[spark] master =
   local[--cores]``, with light instrumentation (wrappers around the foreachBatch function, the batch processor,
   ``plan_batch``, the sink's ``write``, the progress save and the DBAPI commit) to split the wall time by stage.
   With ``--whole-process`` instead: ``python -m applier run -c FILE --until-caught-up`` as a child process with
   the default config (the bench's tuning only where the user gave it), timed from start to exit, Spark start-up
   included, which is what a user compares with TiCDC's own consumer (issue 15); no stage split, no driver RSS.
4. **Verify**: the checksum of every target table (rows streamed from the target, digested like the generator
   does) must equal the generator's, and the applied resolved ts must be the stream's last one; exit 1 if not.
5. **Raw bulk load** into the same target, same row shape, same number of row changes, into a fresh table:
   PostgreSQL ``COPY ... FROM STDIN`` (psycopg ``write_row``), MariaDB/MySQL ``LOAD DATA LOCAL INFILE`` of a TSV
   file (formatting the file is timed and counted, like psycopg's formatting is for COPY). On PostgreSQL also
   the target's own idempotent merge path on the workload's row changes (``applier.devtools.bench_merge``).
6. **Report**: events, wall time, events/s, rows written/s, the ratios to the yardsticks measured in this run,
   peak RSS of the driver and of its child processes (the Spark JVM), and the per-stage split.

Nothing here changes how the applier works; it only observes it. ``--profile FILE`` additionally runs cProfile in
the Spark thread that runs each micro-batch (FILE) and in the apply thread (FILE.apply) and prints the top
functions of each by cumulative time. Spark's Python workers (decoding) are separate processes and not profiled.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import platform
import pstats
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict, deque
from decimal import Decimal
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import datetime as dt

from applier.config import APPLY_ON
from applier.devtools.bench_merge import format_merge, merge_path_postgres, merge_ratios
from applier.devtools.bench_parts import (StageClock, _count, check_workload_args, applied_resolved_ts, delete_topic, drop_schema,
                                         human_bytes, parse_rates, produce_stream, rate, ratio, safe_name,
                                         system_cpu_ticks, target_checksums, toml_text)

PROTOCOLS = ("open", "canal-json", "simple")  # bench_peer runs "debezium" (its own verification)
TARGETS = ("mariadb", "postgres")
DEFAULT_MIX = (0.5, 0.35, 0.15)
BULK_CHUNK_ROWS = 50_000


# ---------------------------------------------------------------------------------------------------------
# Arguments and pure helpers
# ---------------------------------------------------------------------------------------------------------

def parse_mix(text: str) -> tuple[float, float, float]:
    """``insert=50,update=35,delete=15`` or ``50,35,15`` -> normalised weights (insert, update, delete)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    names = ("insert", "update", "delete")
    values: dict[str, float] = {}
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--mix needs three weights (insert, update, delete), got {text!r}")
    for i, p in enumerate(parts):
        if "=" in p:
            k, v = (x.strip() for x in p.split("=", 1))
            if k not in names:
                raise argparse.ArgumentTypeError(f"--mix: unknown operation {k!r} (insert, update, delete)")
        else:
            k, v = names[i], p
        try:
            values[k] = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--mix: {v!r} is not a number") from None
    if set(values) != set(names) or min(values.values()) < 0 or sum(values.values()) <= 0:
        raise argparse.ArgumentTypeError(f"--mix needs non-negative insert, update and delete weights, got {text!r}")
    total = sum(values.values())
    return tuple(values[n] / total for n in names)  # type: ignore[return-value]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m applier.devtools.bench",
        description="Generate a TiCDC changefeed into the local Kafka, apply it with the applier until caught up, "
                    "verify the target and compare the throughput with the raw bulk-load and Kafka read rates "
                    "measured in the same run.")
    p.add_argument("--protocol", choices=PROTOCOLS, default="canal-json")
    p.add_argument("--target", choices=TARGETS, default="postgres")
    p.add_argument("--events", type=_count, default=200_000,
                   help="distinct upstream row changes (replayed duplicates come on top); 2M, 500k, ...")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--cores", type=int, default=2, help="Spark master local[N]")
    p.add_argument("--big-txn-rows", type=_count, default=100_000,
                   help="rows of the one very large upstream transaction (0: none)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-offsets-per-trigger", type=_count, default=200_000)
    p.add_argument("--mix", type=parse_mix, default=DEFAULT_MIX, help="insert,update,delete weights (50,35,15)")
    p.add_argument("--hot-keys", type=int, default=64, help="hot keys per table (updates go there half of the time)")
    p.add_argument("--dup-fraction", type=float, default=0.005, help="row changes sent twice by TiCDC restarts")
    p.add_argument("--batch-rows", type=int, default=5000, help="[target] batch_rows")
    p.add_argument("--apply-streams", type=int, default=1, help="[target] apply_streams (parallel transactions)")
    p.add_argument("--apply-on", choices=APPLY_ON, default="auto",
                   help="[target] apply_on: how the apply streams write (auto: Spark tasks on a cluster; on local[N], "
                        "one transaction for a target on this machine, else driver threads)")
    p.add_argument("--buffer-mb", type=int, default=512, help="[pipeline] buffer_memory_mb")
    p.add_argument("--decode-on", choices=("auto", "executors", "driver"), default="auto",
                   help="[pipeline] decode_on: where Kafka records are decoded")
    p.add_argument("--columnar", action=argparse.BooleanOptionalAction, default=None,
                   help="[pipeline] columnar (default: the product's default)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE", help="extra SparkSession setting")
    p.add_argument("--profile", metavar="FILE", help="cProfile every micro-batch into FILE (pstats) and print the top")
    p.add_argument("--keep", action="store_true", help="keep the topic and the target schema (and print how to "
                   "rerun `applier run` on the kept topic)")
    p.add_argument("--whole-process", action="store_true",
                   help="step 3 runs `python -m applier run --until-caught-up` as a child process with the default "
                        "config (bench tuning only where given) and times it from start to exit, Spark start-up "
                        "included; no stage split or driver RSS")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    live = p.add_argument_group("live mode, start-up and small batches (applier.devtools.bench_live; uses the "
                                "running services named by APPLIER_KAFKA / APPLIER_*_URL, starts none)")
    live.add_argument("--live", type=_count, metavar="RATE",
                      help="produce RATE row changes/s (resolved ts every second) while `applier run` applies in "
                           "live mode; report staleness p50/p95/p99")
    live.add_argument("--duration", type=float, default=60.0, metavar="S", help="measured seconds of a live run (60)")
    live.add_argument("--warmup", type=float, default=15.0, metavar="S",
                      help="seconds produced and applied before the measurement starts (query start-up; 15)")
    live.add_argument("--sweep", type=_rates, metavar="RATES",
                      help="live runs at each rate (e.g. 5k,10k,20k,30k) up to the first whose p99 >= 2 s; "
                           "reports the highest rate under 2 s")
    live.add_argument("--repeat", type=int, default=1, help="live runs per rate (same Spark session)")
    live.add_argument("--cluster-workers", type=int, default=0, metavar="K",
                      help="live: run on a loopback Spark standalone cluster of K one-core workers "
                           "(applier.devtools.cluster) instead of local[--cores]")
    live.add_argument("--trigger-interval", default=None, metavar="TEXT",
                      help='[pipeline] trigger_interval for live runs (default: the product default, "500 ms")')
    live.add_argument("--no-verify", dest="verify", action="store_false",
                      help="live: skip the catch-up and the checksum comparison after the stop")
    live.add_argument("--producer", choices=("encode", "pooled"), default=None,
                      help="live: 'pooled' encodes a pool of transactions before the start and replays it with live "
                           "commit ts (Canal-JSON only; the default for it), 'encode' runs the test encoder for "
                           "every row (about 60 us each; the default for Open Protocol)")
    live.add_argument("--pool-rows", type=_count, default=300_000, metavar="N",
                      help="live, pooled producer: row changes in the pool, replayed in passes (300k)")
    live.add_argument("--startup", type=int, metavar="N",
                      help="time N fresh processes from start to the first applied transaction, by phase")
    live.add_argument("--micro-batch", type=int, metavar="N",
                      help="apply N one-row transactions one message per micro-batch; per-batch cost by stage, "
                           "and Spark alone on the same batches")
    return p


def _rates(text: str) -> list[int]:
    return parse_rates(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    check_workload_args(p, a, ("tables", "partitions", "cores", "batch_rows", "buffer_mb", "max_offsets_per_trigger"))
    if not 0 <= a.dup_fraction < 1:
        p.error("--dup-fraction must be in [0, 1)")
    if a.whole_process and (a.profile or a.live or a.sweep or a.startup or a.micro_batch):
        p.error("--whole-process is a catch-up run of a child process: not with --profile or the live modes")
    if a.cluster_workers and not (a.live or a.sweep):
        p.error("--cluster-workers is for live runs (--live or --sweep); bench_scale measures catch-up on a cluster")
    if a.cluster_workers < 0:
        p.error("--cluster-workers must be 0 (local[--cores]) or more")
    _check_producer(p, a)
    return a


def _check_producer(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """``--producer`` defaults by protocol; the pooled one cannot send Open Protocol (bench_live says why)."""
    from applier.devtools.bench_live import default_producer
    from applier.devtools.bench_pool import pooled_unsupported
    if a.producer is None:
        a.producer = default_producer(a.protocol)
    elif a.producer == "pooled" and pooled_unsupported(a.protocol):
        p.error(pooled_unsupported(a.protocol))
    if a.pool_rows < 1:
        p.error("--pool-rows must be >= 1")


def _num(v: float | None, fmt: str = ",.0f") -> str:
    return "n/a" if v is None else format(v, fmt)


_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\0": "\\0"})


def tsv_value(v: Any) -> str:
    """A value as LOAD DATA's default text format reads it (FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\').
    Bytes are written as hex (loaded with ``SET col = UNHEX(@var)``), so the file stays valid UTF-8."""
    if v is None:
        return "\\N"
    if isinstance(v, str):
        return v.translate(_TSV_ESCAPES)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ", timespec="microseconds")
    if isinstance(v, (dt.date, int, Decimal)):
        return str(v)
    raise TypeError(f"no TSV form for {type(v).__name__}")


def tsv_line(values: Iterable[Any]) -> str:
    return "\t".join(tsv_value(v) for v in values) + "\n"


def descendants(ppids: Mapping[int, int], root: int) -> set[int]:
    """Every process below ``root`` in a pid -> parent pid map."""
    children: dict[int, list[int]] = defaultdict(list)
    for pid, ppid in ppids.items():
        children[ppid].append(pid)
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


# ---------------------------------------------------------------------------------------------------------
# Memory: the driver (this process) and its children (the Spark JVM, any Python workers)
# ---------------------------------------------------------------------------------------------------------

def _read_status(pid: int | str) -> dict[str, str]:
    out = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                out[k] = v.strip()
    except OSError:
        pass
    return out


def _kb(field_value: str | None) -> int:
    if not field_value:
        return 0
    return int(field_value.split()[0])


def _ppids() -> dict[int, int]:
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    s = fh.read()
                out[int(d)] = int(s[s.rindex(")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                pass
    return out


def _cpu_ticks(pid: int | str) -> int:
    """utime + stime of a process, in clock ticks."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            s = fh.read()
        f = s[s.rindex(")") + 2:].split()
        return int(f[11]) + int(f[12])
    except (OSError, ValueError, IndexError):
        return 0


def service_cpu_ticks() -> dict[str, int]:
    """CPU ticks used so far by each local service's process tree (Kafka, MariaDB, PostgreSQL + backends).
    Backends that exit in between lose their ticks, so a difference of two readings is a lower bound."""
    out: dict[str, int] = {}
    try:
        from applier.devtools import services
        sts = services.status()
    except Exception:
        return out
    ppids = _ppids()
    for st in sts:
        pid = getattr(st, "pid", None)
        if pid and getattr(st, "state", "") == "running":
            out[st.name] = sum(_cpu_ticks(p) for p in {pid} | descendants(ppids, pid))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM, and with it ru_maxrss) so it measures what follows."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


class ProcSampler(threading.Thread):
    """Samples the peak RSS (VmHWM) of this process's descendants that were not there at the start."""

    def __init__(self, interval: float = 0.5, exclude: Iterable[int] = ()) -> None:
        super().__init__(daemon=True, name="bench-rss-sampler")
        self.interval = interval
        self.exclude = set(exclude)
        self.peaks: dict[int, int] = {}  # pid -> peak KiB
        self.kinds: dict[int, str] = {}
        self.cpu_first: dict[int, int] = {}
        self.cpu_last: dict[int, int] = {}
        self.driver_peak_kb = 0
        self._halt = threading.Event()

    def sample(self) -> None:
        me = os.getpid()
        self.driver_peak_kb = max(self.driver_peak_kb, _kb(_read_status(me).get("VmRSS")))
        for pid in descendants(_ppids(), me) - self.exclude:
            st = _read_status(pid)
            peak = max(_kb(st.get("VmHWM")), _kb(st.get("VmRSS")))
            ticks = _cpu_ticks(pid)
            self.cpu_first.setdefault(pid, ticks)
            if ticks:
                self.cpu_last[pid] = ticks
            if peak:
                self.peaks[pid] = max(self.peaks.get(pid, 0), peak)
                if pid not in self.kinds:
                    cmd = _cmdline(pid)
                    self.kinds[pid] = ("jvm" if "java" in cmd.split(" ")[0] else
                                       "python-worker" if "pyspark" in cmd else st.get("Name", "other"))

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)
        self.sample()

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, int] = defaultdict(int)
        for pid, kb in self.peaks.items():
            if kb < 4096:  # short-lived helpers (readlink, shells of spark-submit): not worth a line
                continue
            by_kind[self.kinds.get(pid, "other")] = max(by_kind[self.kinds.get(pid, "other")], kb)
        hz = os.sysconf("SC_CLK_TCK")
        cpu: dict[str, float] = defaultdict(float)
        for pid, last in self.cpu_last.items():
            cpu[self.kinds.get(pid, "other")] += (last - self.cpu_first.get(pid, last)) / hz
        return {"processes": len(self.peaks), "peak_kib_by_kind": dict(by_kind),
                "sum_of_peaks_kib": sum(self.peaks.values()), "cpu_seconds_by_kind": dict(cpu)}


# ---------------------------------------------------------------------------------------------------------
# Stage timing: wrappers installed around the pipeline for the length of one run
# ---------------------------------------------------------------------------------------------------------

def stage_split(wall: float, clock: StageClock, processor_seconds: Mapping[str, float]) -> list[dict[str, Any]]:
    """The wall time of ``run()`` cut into stages, twice: once for the Spark thread (which reads) and once for
    the apply thread (which decodes, orders and writes). The two run at the same time (applier/handoff.py), so
    each part adds up to the wall time on its own. Every figure is a measured difference of timers."""
    s = clock.seconds
    on_batch, process = s.get("on_batch", 0.0), s.get("process", 0.0)
    submit_wait, drain = s.get("submit_wait", 0.0), s.get("drain", 0.0)
    decode, gate, apply = (processor_seconds.get(k, 0.0) for k in ("decode", "gate", "apply"))
    plan, write, progress, commit = (s.get(k, 0.0) for k in ("plan", "write", "progress", "commit"))
    rows = [
        ("spark query overhead", wall - on_batch - drain,
         "Spark thread, run() outside foreachBatch: migrations, progress load, partition listing, query "
         "start/stop, micro-batch planning between batches"),
        ("read", on_batch - submit_wait,
         "Spark thread, inside foreachBatch: Kafka source fetch + toArrow() to the driver (with decode_on "
         "executors this includes decoding in Spark's Python workers)"),
        ("wait for apply thread", submit_wait,
         "Spark thread: the next batch is read and waits for the apply thread to finish the previous one"),
        ("drain last batch", drain, "Spark thread: after the query ends, waiting for the last batch to apply"),
        ("decode", decode, "apply thread: codec decode (or, with decode_on executors, rebuilding the workers' "
         "events from their chunks) + routing (processor)"),
        ("gate/order", gate, "apply thread: gate.add: per-batch sort of held events, spill to disk when over budget"),
        ("apply: release+other", apply - plan - write - progress - commit,
         "apply thread: gate.release merge (incl. reading spilled runs), chunking, reflection, DDL, transaction begin"),
        ("apply: plan", plan, "apply thread: plan_batch: collapse to the last version per key, delete/upsert split"),
        ("apply: write", write,
         "apply thread: sink.write: upsert/delete statements (PostgreSQL: COPY to staging + merge)"),
        ("apply: progress", progress, "apply thread: progress rows written in the same transaction"),
        ("apply: commit", commit, "apply thread: DBAPI commit of data + progress"),
        ("processor other", process - decode - gate - apply, "apply thread: processor bookkeeping outside its timers"),
        ("apply thread idle", wall - process,
         "apply thread: nothing to apply (first batch being read, query start/stop)"),
    ]
    out = []
    for name, secs, what in rows:
        out.append({"stage": name, "seconds": round(secs, 3), "share": round(secs / wall, 4) if wall else None,
                    "what": what})
    if "write.copy" in s:
        out.append({"stage": "  of which COPY to staging", "seconds": round(s["write.copy"], 3),
                    "share": round(s["write.copy"] / wall, 4) if wall else None,
                    "what": "psycopg COPY write_row into the temp table (inside apply: write)"})
    return out


# ---------------------------------------------------------------------------------------------------------
# Kafka: produce from the generator, and the raw read rate
# ---------------------------------------------------------------------------------------------------------

def kafka_read_rate(bootstrap: str, topic: str, partitions: int) -> dict[str, Any]:
    """Read every message of ``topic`` from the beginning to the end offsets with one consumer, count them."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"applier-bench-raw-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "queued.max.messages.kbytes": 65536, "fetch.max.bytes": 52428800})
    try:
        total = 0
        for p in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += hi - lo
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        n = nbytes = 0
        idle_since = time.monotonic()
        while n < total:
            batch = c.consume(num_messages=10_000, timeout=1.0)
            if not batch:
                if time.monotonic() - idle_since > 60:
                    raise RuntimeError(f"raw Kafka read stalled at {n} of {total} messages")
                continue
            idle_since = time.monotonic()
            for m in batch:
                if m.error():
                    raise RuntimeError(f"raw Kafka read: {m.error()}")
                n += 1
                v, k = m.value(), m.key()
                nbytes += (len(v) if v else 0) + (len(k) if k else 0)
        secs = time.perf_counter() - t0
    finally:
        c.close()
    return {"messages": n, "bytes": nbytes, "seconds": round(secs, 3), "messages_per_s": rate(n, secs),
            "bytes_per_s": rate(nbytes, secs)}


# ---------------------------------------------------------------------------------------------------------
# Target: checksum of the replica, raw bulk load
# ---------------------------------------------------------------------------------------------------------

def _bulk_rows(n: int, seed: int) -> Iterator[list[tuple[Any, ...]]]:
    from applier.devtools.bench_stream import BENCH_COLUMN_NAMES, bench_row
    for lo in range(0, n, BULK_CHUNK_ROWS):
        yield [tuple(bench_row(0, k, 1, seed)[c] for c in BENCH_COLUMN_NAMES)
               for k in range(lo, min(n, lo + BULK_CHUNK_ROWS))]


def bulk_load_postgres(engine, schema: str, like: str, n: int, seed: int) -> dict[str, Any]:
    """COPY n rows of the bench shape into a fresh table (same columns and primary key) in one transaction.
    Generating the Python rows is not timed; psycopg's formatting (write_row) and the server's load are."""
    from applier.devtools.bench_stream import BENCH_COLUMN_NAMES

    prep = engine.dialect.identifier_preparer
    table = f"{prep.quote_schema(schema)}.{prep.quote('bench_bulk_load')}"
    cols = ", ".join(prep.quote(c) for c in BENCH_COLUMN_NAMES)
    raw = engine.raw_connection()
    try:
        pg = raw.driver_connection
        with pg.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
            cur.execute(f"CREATE TABLE {table} (LIKE {prep.quote_schema(schema)}.{prep.quote(like)} INCLUDING ALL)")
        pg.commit()
        timed = 0.0
        with pg.cursor() as cur:
            copy = cur.copy(f"COPY {table} ({cols}) FROM STDIN")
            t = time.perf_counter()
            cp = copy.__enter__()
            timed += time.perf_counter() - t
            try:
                for chunk in _bulk_rows(n, seed):
                    t = time.perf_counter()
                    for r in chunk:
                        cp.write_row(r)
                    timed += time.perf_counter() - t
            except BaseException as exc:
                copy.__exit__(type(exc), exc, exc.__traceback__)
                raise
            t = time.perf_counter()
            copy.__exit__(None, None, None)
            pg.commit()
            timed += time.perf_counter() - t
        with pg.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table}")
            loaded = cur.fetchone()[0]
            cur.execute(f"DROP TABLE {table}")
        pg.commit()
    finally:
        raw.close()
    return {"method": "COPY FROM STDIN (psycopg write_row) into a fresh table with the same primary key",
            "rows": loaded, "seconds": round(timed, 3), "rows_per_s": rate(loaded, timed)}


def bulk_load_mysql(url, schema: str, like: str, n: int, seed: int) -> dict[str, Any]:
    """LOAD DATA LOCAL INFILE of n rows of the bench shape into a fresh table, in files of BULK_CHUNK_ROWS rows,
    one transaction. Writing the TSV files from Python values is timed separately and counted in the rate."""
    from sqlalchemy import create_engine

    from applier.devtools.bench_stream import BENCH_COLUMN_NAMES, BENCH_KINDS

    eng = create_engine(url, connect_args={"local_infile": True})
    prep = eng.dialect.identifier_preparer
    table = f"{prep.quote_identifier(schema)}.{prep.quote_identifier('bench_bulk_load')}"
    targets = [f"@{c}" if BENCH_KINDS[c] == "bytes" else prep.quote_identifier(c) for c in BENCH_COLUMN_NAMES]
    sets = [f"{prep.quote_identifier(c)} = UNHEX(@{c})" for c in BENCH_COLUMN_NAMES if BENCH_KINDS[c] == "bytes"]
    stmt = (f"LOAD DATA LOCAL INFILE %s INTO TABLE {table} CHARACTER SET utf8mb4 "
            "FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' "
            f"({', '.join(targets)})" + (f" SET {', '.join(sets)}" if sets else ""))
    tmpdir = Path(tempfile.mkdtemp(prefix="applier-bench-load-"))
    raw = eng.raw_connection()
    fmt = load = 0.0
    try:
        cur = raw.cursor()
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TABLE {table} LIKE {prep.quote_identifier(schema)}.{prep.quote_identifier(like)}")
        raw.commit()
        path = tmpdir / "chunk.tsv"
        for chunk in _bulk_rows(n, seed):
            t = time.perf_counter()
            with open(path, "w", encoding="utf-8", newline="\n") as fh:
                fh.writelines(tsv_line(r) for r in chunk)
            t2 = time.perf_counter()
            cur.execute(stmt, (str(path),))
            load += time.perf_counter() - t2
            fmt += t2 - t
        t = time.perf_counter()
        raw.commit()
        load += time.perf_counter() - t
        cur.execute(f"SELECT COUNT(*) FROM {table}")
        loaded = cur.fetchone()[0]
        cur.execute(f"DROP TABLE {table}")
        raw.commit()
    finally:
        raw.close()
        eng.dispose()
        shutil.rmtree(tmpdir, ignore_errors=True)
    total = fmt + load
    return {"method": "LOAD DATA LOCAL INFILE (TSV written from Python values) into a fresh table with the same "
                      "primary key", "rows": loaded, "seconds": round(total, 3), "rows_per_s": rate(loaded, total),
            "format_seconds": round(fmt, 3), "load_seconds": round(load, 3),
            "load_only_rows_per_s": rate(loaded, load)}


# ---------------------------------------------------------------------------------------------------------
# What both ways of running the applier share: the workload, verification, yardsticks, clean-up, ratios
# ---------------------------------------------------------------------------------------------------------

def bench_workload(a: argparse.Namespace):
    """The run's generator (``BenchWorkload``), made from the options alone: a second one yields exactly the same
    row changes, which is how the merge-path yardstick gets the workload's rows without holding them."""
    from applier.devtools.bench_stream import generate_bench
    return generate_bench(a.protocol, tables=a.tables, partitions=a.partitions, events=a.events,
                          big_txn_rows=a.big_txn_rows, seed=a.seed, mix=a.mix, hot_keys=a.hot_keys,
                          dup_fraction=a.dup_fraction)


def applier_config(a: argparse.Namespace, *, name: str, ckpt: Path, kafka: str, topic: str, url: str,
                   source_schema: str, schema: str) -> dict[str, Any]:
    """The in-process run's config, with the bench's tuning (--whole-process derives its own from it)."""
    return {
        "pipeline": {"name": name, "checkpoint_dir": str(ckpt), "max_offsets_per_trigger": a.max_offsets_per_trigger,
                     "buffer_memory_mb": a.buffer_mb, "decode_on": a.decode_on,
                     **({} if getattr(a, "columnar", None) is None else {"columnar": a.columnar})},
        "source": {"bootstrap_servers": kafka, "topics": [topic], "protocol": a.protocol},
        "target": {"url": url, "batch_rows": a.batch_rows, "apply_streams": a.apply_streams,
                   "apply_on": a.apply_on},
        "spark": {"master": f"local[{a.cores}]", "conf": a.spark_conf},
        "route": [{"match": f"{source_schema}.*", "schema": schema}],
    }


def verify_replica(engine, schema: str, wl, pipeline: str, log) -> dict[str, Any]:
    """Step 4: every table's checksum against the generator's, and the applied resolved ts against the last."""
    t = time.perf_counter()
    got = target_checksums(engine, schema, wl.table_names)
    bad = {tn: (str(wl.expected[tn]), str(got[tn])) for tn in wl.table_names
           if (got[tn].rows, got[tn].digest_sum) != (wl.expected[tn].rows, wl.expected[tn].digest_sum)}
    applied_ts = applied_resolved_ts(engine, pipeline)
    if applied_ts is not None and applied_ts != wl.final_ts:
        bad["applied resolved ts"] = (str(wl.final_ts), str(applied_ts))
    log("  verify: " + ("target equals the expected state (per-table checksums)" if not bad else f"MISMATCH {bad}"))
    return {"ok": not bad, "differences": bad, "seconds": round(time.perf_counter() - t, 1),
            "tables": len(wl.table_names), "rows": sum(cs.rows for cs in got.values()), "applied_ts": applied_ts}


def yardsticks(a: argparse.Namespace, engine, settings, schema: str, wl, log) -> dict[str, Any]:
    """Step 5: the raw bulk load, and on PostgreSQL its own idempotent merge path (applier.devtools.bench_merge),
    of the workload's row changes into fresh tables."""
    n = wl.stats.row_events
    log(f"raw bulk load of {n:,} rows into {a.target}")
    if a.target == "postgres":
        bulk = bulk_load_postgres(engine, schema, wl.table_names[0], n, a.seed)
    else:
        bulk = bulk_load_mysql(settings.target_url(), schema, wl.table_names[0], n, a.seed)
    log(f"  {bulk['rows_per_s']:,.0f} rows/s")
    out: dict[str, Any] = {"bulk_load": bulk}
    if a.target == "postgres":
        txn_rows, chunk_rows = a.max_offsets_per_trigger, a.batch_rows * 4  # the applier's micro-batch and COPY chunk
        log(f"PostgreSQL merge path: {n:,} row changes in transactions of {txn_rows:,}, COPY chunks of "
            f"{chunk_rows:,} (staging COPY, INSERT ... ON CONFLICT DO UPDATE, DELETE ... USING)")
        merge = merge_path_postgres(engine, schema, wl.table_names[0], bench_workload(a), txn_rows, n,
                                    chunk_rows=chunk_rows)
        log(f"  {merge['rows_per_s']:,.0f} row changes/s")
        out["merge_path"] = merge
    return out


def clean_up(a: argparse.Namespace, engine, kafka: str, topic: str, schema: str, ckpt: Path, log) -> None:
    """Drop what the run made (unless --keep) and release the engine; best effort, so a failed run still reports."""
    if not a.keep:
        try:
            drop_schema(engine, schema)
        except Exception as exc:  # pragma: no cover - best effort
            log(f"could not drop {schema}: {exc}")
        why = delete_topic(kafka, topic)
        if why:
            log(f"could not delete topic {topic}: {why}")
        shutil.rmtree(ckpt, ignore_errors=True)
    engine.dispose()


def run_ratios(result: Mapping[str, Any], events_per_s: float | None, messages_per_s: float | None) -> dict[str, Any]:
    bulk = result["bulk_load"]
    return {
        "events_per_s_to_bulk_load_rows_per_s": ratio(events_per_s, bulk.get("rows_per_s")),
        "events_per_s_to_bulk_load_only_rows_per_s": ratio(events_per_s, bulk.get("load_only_rows_per_s")),
        "messages_per_s_to_kafka_raw_messages_per_s": ratio(messages_per_s, result["kafka_raw"]["messages_per_s"]),
        **merge_ratios(events_per_s, result.get("merge_path")),
    }


# ---------------------------------------------------------------------------------------------------------
# --whole-process: `applier run --until-caught-up` as a child process, timed from start to exit
# ---------------------------------------------------------------------------------------------------------

#: the child's config has the target URL without its password and ``password_env = TARGET_PASSWORD_ENV``, set only
#: in the child's environment, so neither the file nor anything printed holds the password
TARGET_PASSWORD_ENV = "APPLIER_BENCH_TARGET_PASSWORD"
#: what ``python -m applier.devtools.services env`` exports the target's URL as, for the printed rerun command
SERVICE_URL_ENV = {"mariadb": "APPLIER_MARIADB_URL", "postgres": "APPLIER_PG_URL"}
#: (section, key, bench option): the in-process run's tuning, which a plain `applier run` does not have
BENCH_TUNING = (("pipeline", "max_offsets_per_trigger", "max_offsets_per_trigger"),
                ("pipeline", "buffer_memory_mb", "buffer_mb"), ("pipeline", "decode_on", "decode_on"),
                ("pipeline", "columnar", "columnar"),
                ("target", "batch_rows", "batch_rows"), ("target", "apply_streams", "apply_streams"),
                ("target", "apply_on", "apply_on"))
STDERR_TAIL_LINES = 40
_BATCH_LINE = re.compile(r"\bbatch \d+: \d+ messages, (\d+) rows, (\d+) DDL")
_RUN_SUMMARY = re.compile(r"^pipeline \S+: (\d+) batch\(es\), (\d+) messages, (\d+) row changes, (\d+) DDL applied",
                          re.MULTILINE)


def split_password(url: str) -> tuple[str, str | None]:
    """(the URL without its password, the password or None)."""
    from sqlalchemy.engine import URL, make_url
    u = make_url(url)
    bare = URL.create(u.drivername, u.username, None, u.host, u.port, u.database, u.query)  # set() keeps a None
    return bare.render_as_string(hide_password=False), u.password


def whole_process_config(a: argparse.Namespace, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The in-process run's config (``cfg``) as a plain `applier run` gets it (issue 15: "with the default
    config"): the bench's tuning and the Spark master are kept only where the user gave a value other than the
    bench's default, and the target password moves to the environment variable TARGET_PASSWORD_ENV."""
    parser = build_parser()
    out = copy.deepcopy(dict(cfg))
    for section, key, option in BENCH_TUNING:
        if getattr(a, option) == parser.get_default(option):
            out[section].pop(key, None)
    spark = out.get("spark", {})
    if a.cores == parser.get_default("cores"):
        spark.pop("master", None)
    if not spark.get("conf"):
        spark.pop("conf", None)
    if not spark:
        out.pop("spark", None)
    out["target"]["url"], password = split_password(cfg["target"]["url"])
    if password is not None:
        out["target"]["password_env"] = TARGET_PASSWORD_ENV
    return out


def rerun_config(child_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The same run on the kept topic as a new pipeline into a new schema, so it starts from the beginning."""
    out = copy.deepcopy(dict(child_cfg))
    out["pipeline"]["name"] += "-rerun"
    out["pipeline"]["checkpoint_dir"] += "-rerun"
    for route in out["route"]:
        route["schema"] += "_rerun"
    return out


def applier_command(config_path: str, *, verbose: bool = False) -> list[str]:
    """``applier run --until-caught-up`` with this interpreter (``-v`` logs each batch: the first applied one
    is timed from it)."""
    return [sys.executable, "-m", "applier", *(["-v"] if verbose else []), "run", "-c", config_path,
            "--until-caught-up"]


def write_private(path: Path, text: str) -> None:
    """Write a file only this user can read (it is created with mode 0600, never wider for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def password_from_env(url_env: str) -> str:
    """A shell word that expands to the password inside the URL in ``$url_env`` (printed commands never hold it)."""
    code = ("import os; from sqlalchemy.engine import make_url; "
            f'print(make_url(os.environ[{json.dumps(url_env)}]).password or "")')
    return f'"$({shlex.quote(sys.executable)} -c {shlex.quote(code)})"'


def keep_rerun_config(a: argparse.Namespace, cfg: Mapping[str, Any], run_id: str, log) -> dict[str, str]:
    """With --keep: a config (no password in it) for a plain `applier run` on the kept topic into a new schema,
    and a command that runs it, taking the password from the services' URL variable (``. /tmp/env.sh`` or
    ``eval "$(python -m applier.devtools.services env)"`` sets it)."""
    path = Path(tempfile.gettempdir()) / "applier-bench" / f"{run_id}-rerun.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    child = rerun_config(whole_process_config(a, cfg))
    write_private(path, toml_text(child))
    command = shlex.join(applier_command(str(path)))
    if "password_env" in child["target"]:
        command = f"{TARGET_PASSWORD_ENV}={password_from_env(SERVICE_URL_ENV[a.target])} {command}"
    log(f"rerun on the kept topic: {command}")
    return {"config": str(path), "command": command}


def parse_run_summary(stdout: str) -> dict[str, int]:
    """The counts `applier run` prints when it ends (applier.cli.cmd_run); empty if the line is not there."""
    m = _RUN_SUMMARY.search(stdout)
    if not m:
        return {}
    return dict(zip(("batches", "messages", "row_changes_applied", "ddls"), map(int, m.groups())))


def applied_rows_in(line: str) -> bool:
    """Whether a log line of `applier -v run` reports a micro-batch that applied rows."""
    m = _BATCH_LINE.search(line)
    return bool(m and int(m.group(1)))


def time_process(cmd: list[str], env: Mapping[str, str], log) -> dict[str, Any]:
    """Run ``cmd`` to its exit, timed from just before it starts; also when its log first reports applied rows.
    A non-zero exit fails the benchmark, with the last lines of the process's stderr."""
    tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
    out: list[str] = []
    first: list[float] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace")

    def read_stderr() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            if not first and applied_rows_in(line):
                first.append(time.perf_counter())
            tail.append(line.rstrip("\n"))

    readers = [threading.Thread(target=read_stderr, daemon=True),
               threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)]  # type: ignore[arg-type]
    for r in readers:
        r.start()
    rc = proc.wait()
    wall = time.perf_counter() - t0
    for r in readers:
        r.join(30)
    if rc != 0:
        log(f"`applier run` exited with {rc}; the last lines of its stderr:")
        for line in tail:
            log(f"  | {line}")
        raise RuntimeError(f"`applier run` exited with {rc} (the tail of its stderr is above)")
    return {"wall_seconds": wall, "first_applied_batch_seconds": first[0] - t0 if first else None,
            **parse_run_summary("".join(out))}


def run_whole_process(a: argparse.Namespace, result: dict[str, Any], cfg: Mapping[str, Any], settings, url: str,
                      wl, topic: str, schema: str, ckpt: Path, log) -> dict[str, Any]:
    """Steps 3-6 with the applier as a user starts it: its config in a private folder (deleted afterwards), the
    target password only in the child's environment; then the same verification and yardsticks as in-process."""
    from applier.pipeline import make_engine

    tmp = Path(tempfile.mkdtemp(prefix="applier-bench-run-"))  # mode 0700
    engine = make_engine(settings)
    try:
        path = tmp / "applier.toml"
        write_private(path, toml_text(whole_process_config(a, cfg)))
        cmd = applier_command(str(path), verbose=True)
        log(f"applier: {shlex.join(cmd)} (a child process; target {a.target})")
        password = split_password(url)[1]
        env = {**os.environ, **({TARGET_PASSWORD_ENV: password} if password is not None else {})}
        proc = time_process(cmd, env, log)
        shutil.rmtree(tmp, ignore_errors=True)  # the config is not needed any more: gone before anything else
        log(f"  exited 0 after {proc['wall_seconds']:.1f} s: {proc.get('messages', 0):,} messages, "
            f"{proc.get('row_changes_applied', 0):,} row changes applied in {proc.get('batches', '?')} micro-batches")
        result["verify"] = verify_replica(engine, schema, wl, settings.pipeline.name, log)
        result.update(yardsticks(a, engine, settings, schema, wl, log))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        clean_up(a, engine, settings.source.bootstrap_servers, topic, schema, ckpt, log)
    result["applier"] = whole_process_figures(proc, wl.stats, shlex.join(cmd))
    result["ratios"] = run_ratios(result, result["applier"]["events_per_s"], result["applier"]["messages_per_s"])
    return result


def whole_process_figures(proc: Mapping[str, Any], st, command: str) -> dict[str, Any]:
    """The report's ``applier`` part for a child process: rates over its whole life; the counts it printed (the
    generator's message count if it printed none)."""
    wall = proc["wall_seconds"]
    messages = proc.get("messages", st.messages)
    first = proc["first_applied_batch_seconds"]
    return {
        "whole_process": True,
        "command": command,
        "wall_seconds": round(wall, 2),
        "wall_note": "start of the process to its exit: interpreter, Spark session, query start and stop included",
        "batches": proc.get("batches"),
        "messages": messages,
        "row_changes_applied": proc.get("row_changes_applied"),
        "ddls": proc.get("ddls"),
        "events_per_s": rate(st.row_events, wall),
        "messages_per_s": rate(messages, wall),
        "bytes_per_s": rate(st.bytes, wall),
        "time_to_first_applied_batch_seconds": round(first, 2) if first is not None else None,
    }


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------

def versions(urls, target: str) -> dict[str, str]:
    import pyspark
    from sqlalchemy import create_engine, text
    out = {"python": platform.python_version(), "pyspark": pyspark.__version__}
    try:
        import sqlalchemy
        out["sqlalchemy"] = sqlalchemy.__version__
    except Exception:  # pragma: no cover
        pass
    try:
        from applier import jars
        out["kafka"] = jars.KAFKA_VERSION
        out["spark-sql-kafka"] = jars.spark_version()
    except Exception:
        pass
    try:
        import subprocess
        root = Path(__file__).resolve().parents[1]
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        if head:
            out["applier"] = head + ("+local changes" if dirty else "")
    except Exception:
        pass
    url = urls.mariadb_url if target == "mariadb" else urls.pg_url
    try:
        eng = create_engine(url)
        with eng.connect() as c:
            out[target] = str(c.execute(text("SELECT version()")).scalar()).split(" on ")[0]
        eng.dispose()
    except Exception:
        pass
    return out


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "memory": human_bytes(mem), "kernel": platform.release()}


def run_bench(a: argparse.Namespace, log=None) -> dict[str, Any]:
    from applier.devtools import services
    from applier.config import parse_config
    from applier.pipeline import make_engine, run, spark_session

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    urls = services.start({"kafka", a.target})
    stamp = time.strftime("%Y%m%d%H%M%S")
    run_id = safe_name(f"{a.protocol}_{a.target}_{a.events}_{stamp}_{uuid.uuid4().hex[:4]}")
    topic = f"bench-{run_id}"
    schema = f"bench_{run_id}"
    url = urls.mariadb_url if a.target == "mariadb" else urls.pg_url
    result: dict[str, Any] = {
        "params": {k: v for k, v in vars(a).items() if k not in ("json",)},
        "topic": topic, "schema": schema, "machine": machine(), "versions": versions(urls, a.target),
    }

    # 1. generate + produce (streamed)
    wl = bench_workload(a)
    log(f"generating {a.events:,} row changes ({a.protocol}, {a.tables} tables, {a.partitions} partitions, "
        f"big transaction {a.big_txn_rows:,} rows) into topic {topic}")
    t = time.perf_counter()
    n_msgs, n_bytes = produce_stream(urls.kafka, topic, wl.messages(), partitions=a.partitions, log=log)
    gen_secs = time.perf_counter() - t
    st = wl.stats
    result["workload"] = {**vars(st), "generate_and_produce_seconds": round(gen_secs, 1),
                          "expected": {t: str(cs) for t, cs in wl.expected.items()}, "final_ts": wl.final_ts}
    log(f"  {n_msgs:,} messages, {human_bytes(n_bytes)}, {st.row_events:,} row changes + "
        f"{st.duplicate_row_events:,} replayed, in {gen_secs:.0f} s")

    # 2. raw Kafka read
    log("raw Kafka read (confluent-kafka, all partitions from the beginning)")
    result["kafka_raw"] = kafka_read_rate(urls.kafka, topic, a.partitions)
    log(f"  {result['kafka_raw']['messages_per_s']:,.0f} msg/s, "
        f"{human_bytes(result['kafka_raw']['bytes_per_s'])}/s")

    # 3. the applier
    ckpt = Path(tempfile.gettempdir()) / "applier-bench" / run_id
    cfg = applier_config(a, name=f"bench-{run_id}", ckpt=ckpt, kafka=urls.kafka, topic=topic, url=url,
                         source_schema=wl.schema, schema=schema)
    settings = parse_config(cfg, source="<bench>")
    if a.keep:
        result["rerun"] = keep_rerun_config(a, cfg, run_id, log)
    if a.whole_process:
        return run_whole_process(a, result, cfg, settings, url, wl, topic, schema, ckpt, log)
    before = descendants(_ppids(), os.getpid())
    t = time.perf_counter()
    spark = spark_session(settings)
    result["spark_startup_seconds"] = round(time.perf_counter() - t, 2)
    sampler = ProcSampler(exclude=before)
    sampler.start()
    reset_ok = reset_peak_rss()
    profiler = cProfile.Profile() if a.profile else None
    apply_profiler = cProfile.Profile() if a.profile else None
    clock = StageClock(profiler, apply_profiler)
    log(f"applier: run(until_caught_up=True), master local[{a.cores}], max_offsets_per_trigger "
        f"{a.max_offsets_per_trigger:,}, target {a.target}")
    engine = make_engine(settings)
    try:
        ru0, sys0, load0 = resource.getrusage(resource.RUSAGE_SELF), system_cpu_ticks(), os.getloadavg()[0]
        svc0 = service_cpu_ticks()
        t = time.perf_counter()
        res = run(settings, until_caught_up=True, spark=spark, progress=False, timer=clock)
        wall = time.perf_counter() - t
        ru1, sys1 = resource.getrusage(resource.RUSAGE_SELF), system_cpu_ticks()
        svc1 = service_cpu_ticks()
        driver_peak_run_kb = ru1.ru_maxrss
        sampler.stop()
        rep = res.report
        applied = rep.applied
        log(f"  caught up in {wall:.1f} s: {rep.messages:,} messages, {applied.rows:,} row changes applied in "
            f"{res.batches} micro-batches")

        # 4. verify, 5. yardsticks
        result["verify"] = verify_replica(engine, schema, wl, settings.pipeline.name, log)
        result.update(yardsticks(a, engine, settings, schema, wl, log))
    finally:
        if sampler.is_alive():
            sampler.stop()
        try:
            spark.stop()
        except Exception as exc:  # the JVM may already be gone (e.g. after an OutOfMemoryError)
            log(f"stopping Spark: {type(exc).__name__}")
        clean_up(a, engine, urls.kafka, topic, schema, ckpt, log)

    # 6. figures
    row_events = st.row_events
    written = clock.rows_upserted + clock.rows_deleted
    e2e_events_s = rate(row_events, wall)
    e2e_msgs_s = rate(rep.messages, wall)
    result["applier"] = {
        "whole_process": False,
        "wall_seconds": round(wall, 2),
        "batches": res.batches,
        "messages": rep.messages,
        "decoded_events": rep.events,
        "row_changes_applied": applied.rows,
        "rows_written": written,
        "rows_upserted": clock.rows_upserted,
        "rows_deleted": clock.rows_deleted,
        "rows_columnar": clock.counts.get("rows_columnar", 0),
        "ddls": applied.ddls,
        "transactions": applied.transactions,
        "events_per_s": e2e_events_s,
        "row_changes_applied_per_s": rate(applied.rows, wall),
        "rows_written_per_s": rate(written, wall),
        "messages_per_s": e2e_msgs_s,
        "bytes_per_s": rate(st.bytes, wall),
        "time_to_first_batch_seconds": round(clock.first_batch_at - t, 2) if clock.first_batch_at else None,
        "gate": res.gate,
    }
    result["ratios"] = run_ratios(result, e2e_events_s, e2e_msgs_s)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result["memory"] = {
        "driver_peak_rss_during_run": driver_peak_run_kb * 1024 if reset_ok else None,
        "driver_peak_rss_lifetime": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "driver_peak_rss_note": ("ru_maxrss after resetting the peak (/proc/self/clear_refs) just before run(); "
                                 "lifetime includes generation, verification and the bulk load"),
        "children_sampled": {k: v * 1024 for k, v in sampler.summary()["peak_kib_by_kind"].items()},
        "children_sampled_note": "VmHWM of each process started below the driver (the Spark JVM), sampled every 0.5 s",
        "rusage_children_maxrss": children * 1024,
        "rusage_children_note": "RUSAGE_CHILDREN: largest child the kernel has reaped (the JVM after spark.stop())",
        "psutil": _has("psutil"),
    }
    hz = os.sysconf("SC_CLK_TCK")
    driver_cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    child_cpu = sampler.summary()["cpu_seconds_by_kind"]
    busy = (sys1[0] - sys0[0]) / hz
    svc = {k: round((svc1[k] - svc0.get(k, 0)) / hz, 2) for k in svc1 if k in svc0}
    result["cpu"] = {
        "wall_seconds": round(wall, 2), "cpus": os.cpu_count(),
        "driver_cpu_seconds": round(driver_cpu, 2),
        "children_cpu_seconds": {k: round(v, 2) for k, v in child_cpu.items()},
        "machine_busy_cpu_seconds": round(busy, 2),
        "services_cpu_seconds": svc,
        "other_processes_cpu_seconds": round(busy - driver_cpu - sum(child_cpu.values()) - sum(svc.values()), 2),
        "loadavg_1m_before": round(load0, 2),
        "note": "CPU seconds during run(); services are the local Kafka/MariaDB/PostgreSQL process trees; 'other "
                "processes' is everything else on the machine at the time (e.g. other test runs)",
    }
    result["stages"] = stage_split(wall, clock, rep.seconds)
    result["stages_not_measured"] = [
        "Spark's Kafka fetch and the toArrow() transfer to the driver are one measurement ('read')",
        "the Spark thread's stages and the apply thread's stages overlap in time: each group adds up to the wall",
        "'gate/order' covers the sort on intake; the commit-order merge on release is inside 'apply: release+other'",
    ]
    if profiler is not None and apply_profiler is not None:
        profiler.dump_stats(a.profile)
        apply_file = f"{a.profile}.apply"
        apply_profiler.dump_stats(apply_file)
        result["profile"] = {"file": a.profile, "top_cumulative": profile_top(a.profile, 25),
                             "apply_file": apply_file, "apply_top_cumulative": profile_top(apply_file, 25)}
    return result


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def profile_top(path: str, n: int = 15) -> list[dict[str, Any]]:
    stats = pstats.Stats(path)
    rows = []
    for func, (cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        filename, line, name = func
        rows.append({"function": f"{_short(filename)}:{line}({name})", "calls": nc, "tottime": round(tt, 3),
                     "cumtime": round(ct, 3)})
    rows.sort(key=lambda r: -r["cumtime"])
    return rows[:n]


def _short(filename: str) -> str:
    for marker in ("/site-packages/", "/applier/", "/lib/python3"):
        i = filename.find(marker)
        if i >= 0:
            return filename[i + 1:] if marker != "/applier/" else "applier/" + filename[i + len(marker):]
    return filename


def format_report(r: dict[str, Any]) -> str:
    p, ap, wlst, kr, bl, mem, ra = (r["params"], r["applier"], r["workload"], r["kafka_raw"], r["bulk_load"],
                                    r.get("memory"), r["ratios"])
    lines = [
        f"applier benchmark: {p['protocol']} -> {p['target']}, local[{p['cores']}], {p['tables']} tables, "
        f"{p['partitions']} partitions, big transaction {p['big_txn_rows']:,} rows, seed {p['seed']}",
        "  versions: " + ", ".join(f"{k} {v}" for k, v in r["versions"].items()),
        f"  workload: {wlst['row_events']:,} row changes (+{wlst['duplicate_row_events']:,} replayed; "
        f"{wlst['inserts']:,} ins / {wlst['updates']:,} upd / {wlst['deletes']:,} del, {wlst['key_changes']:,} key "
        f"changes), {wlst['transactions']:,} transactions (largest {wlst['largest_txn_rows']:,} rows), "
        f"{wlst['messages']:,} messages, {human_bytes(wlst['bytes'])}",
        f"  verify: {'OK - target equals the expected state' if r['verify']['ok'] else 'FAILED'} "
        f"({r['verify']['rows']:,} rows in {r['verify']['tables']} tables)",
        "",
        f"  events (row changes)       {wlst['row_events']:>14,}",
        _wall_line(r),
        f"  events/s                   {_num(ap['events_per_s']):>14}",
    ]
    if "rows_written" in ap:  # counted by the stage clock: in-process only
        lines.append(f"  rows written/s             {_num(ap['rows_written_per_s']):>14}   ({ap['rows_written']:,} "
                     f"rows after per-key collapse: {ap['rows_upserted']:,} upserts, {ap['rows_deleted']:,} deletes)")
    if ap.get("rows_columnar"):
        lines.append(f"  row changes, columnar lane {ap['rows_columnar']:>14,}   (applier/columnar; the rest went per event)")
    lines += [
        f"  messages/s                 {_num(ap['messages_per_s']):>14}   ({ap['batches']} micro-batches)",
        f"  raw bulk load rows/s       {_num(bl['rows_per_s']):>14}   ({bl['method']})",
        f"  ratio to raw bulk load     {_num(ra['events_per_s_to_bulk_load_rows_per_s'], '.3f'):>14}",
    ]
    if bl.get("load_only_rows_per_s"):
        lines.append(f"  ratio to LOAD DATA alone   {_num(ra['events_per_s_to_bulk_load_only_rows_per_s'], '.3f'):>14}"
                     f"   (server load only {bl['load_only_rows_per_s']:,.0f} rows/s, TSV writing excluded)")
    lines += format_merge(r.get("merge_path"), ra)
    lines += [
        f"  raw Kafka read msg/s       {_num(kr['messages_per_s']):>14}   ({human_bytes(kr['bytes_per_s'])}/s)",
        f"  ratio to raw Kafka read    {_num(ra['messages_per_s_to_kafka_raw_messages_per_s'], '.3f'):>14}",
    ]
    if mem:  # in-process only: a child process's driver is not sampled
        lines.append(f"  driver peak RSS (run)      {human_bytes(mem['driver_peak_rss_during_run']):>14}   "
                     f"(lifetime {human_bytes(mem['driver_peak_rss_lifetime'])})")
        for kind, b in sorted(mem["children_sampled"].items()):
            lines.append(f"  child peak RSS ({kind}){' ' * max(1, 11 - len(kind))}{human_bytes(b):>14}")
        lines.append(f"  RUSAGE_CHILDREN maxrss     {human_bytes(mem['rusage_children_maxrss']):>14}   (the JVM is not "
                     "reaped before this process exits, so this stays small)")
    cpu = r.get("cpu")
    if cpu:
        kids = ", ".join(f"{k} {v:.1f} s" for k, v in cpu["children_cpu_seconds"].items())
        svcs = ", ".join(f"{k} {v:.1f} s" for k, v in cpu.get("services_cpu_seconds", {}).items())
        lines.append(f"  CPU during run             driver {cpu['driver_cpu_seconds']:.1f} s, {kids}, {svcs}, other processes "
                     f"{cpu['other_processes_cpu_seconds']:.1f} s, of {cpu['cpus']} x {cpu['wall_seconds']:.1f} s "
                     f"(load before {cpu['loadavg_1m_before']})")
    if "stages" in r:  # in-process only
        lines += ["", "  stage split of the wall time (measured; see 'what'):"]
        for s in r["stages"]:
            share = f"{100 * s['share']:5.1f}%" if s["share"] is not None else "  n/a"
            lines.append(f"    {s['stage']:<28} {s['seconds']:>9.2f} s {share}  {s['what']}")
        for note in r["stages_not_measured"]:
            lines.append(f"    not separately measured: {note}")
    if "profile" in r:
        for title, file_key, top_key in (("Spark thread", "file", "top_cumulative"),
                                         ("apply thread", "apply_file", "apply_top_cumulative")):
            if top_key not in r["profile"]:
                continue
            lines += ["", f"  profile of the {title} ({r['profile'][file_key]}), top by cumulative time:"]
            for row in r["profile"][top_key][:15]:
                lines.append(f"    {row['cumtime']:>9.2f} s cum {row['tottime']:>8.2f} s own {row['calls']:>10,}  "
                             f"{row['function']}")
    if "rerun" in r:
        lines += ["", "  rerun `applier run` on the kept topic (new pipeline and schema; the config holds no "
                  "password):", f"    {r['rerun']['command']}"]
    if not r["verify"]["ok"]:
        lines += ["", f"  VERIFY FAILED: {r['verify']['differences']}"]
    return "\n".join(lines)


def _wall_line(r: Mapping[str, Any]) -> str:
    ap = r["applier"]
    if ap.get("whole_process"):
        first = ap.get("time_to_first_applied_batch_seconds")
        return (f"  wall time (whole process)  {ap['wall_seconds']:>14,.1f} s   (`applier run --until-caught-up` start "
                f"to exit; first batch with rows applied after {_num(first, '.1f')} s)")
    return (f"  wall time (run)            {ap['wall_seconds']:>14,.1f} s   (+ Spark session start "
            f"{r['spark_startup_seconds']} s)")


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.live or a.sweep or a.startup or a.micro_batch:
        from applier.devtools import bench_live
        if a.startup:
            return bench_live.run_startup(a)
        if a.micro_batch:
            return bench_live.run_micro_batches(a)
        if a.max_offsets_per_trigger == 200_000:  # the batch benchmark's default; live runs keep the product's
            a.max_offsets_per_trigger = None
        return bench_live.main_live(a)
    try:
        result = run_bench(a)
    except KeyboardInterrupt:
        print("benchmark interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"benchmark FAILED: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", file=sys.stderr)
        if a.protocol == "open" and a.max_offsets_per_trigger > 50_000:
            print("  hint: an Open Protocol message carries up to 16 rows; --max-offsets-per-trigger counts messages "
                  "(try 12500 = about 200k rows per micro-batch)", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_report(result))
    if not result["verify"]["ok"]:
        print("benchmark FAILED: the target does not equal the generator's expected state", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
