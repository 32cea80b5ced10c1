"""What the benchmark's modes share (applier.devtools.bench for catch-up, applier.devtools.bench_live for live
staleness, start-up and small batches): argument parsing of counts and rates, the stage clock installed around
the pipeline, CPU readings, and the Kafka and target housekeeping of a run. Tooling: the product never imports
it."""

from __future__ import annotations

import argparse
import cProfile
import json
import re
import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

from applier.timing import StageTimer


def _count(text: str) -> int:
    """An event count: 2000000, 2_000_000, 2M, 500k."""
    s = text.strip().lower().replace("_", "")
    mult = 1
    if s.endswith("k"):
        mult, s = 1_000, s[:-1]
    elif s.endswith("m"):
        mult, s = 1_000_000, s[:-1]
    try:
        value = float(s) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (e.g. 2000000, 2_000_000, 2M, 500k)") from None
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a count: {text!r}")
    return int(value)


def check_workload_args(p: argparse.ArgumentParser, a: argparse.Namespace, positive: Iterable[str]) -> None:
    """The checks every bench entry point makes of its workload options (``p.error`` exits with code 2), and
    ``--spark-conf KEY=VALUE`` items turned into a dict."""
    if a.events < 1:
        p.error("--events must be >= 1")
    if a.big_txn_rows > a.events:
        p.error(f"--big-txn-rows ({a.big_txn_rows}) cannot exceed --events ({a.events})")
    for name in positive:
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    conf = {}
    for item in a.spark_conf:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            p.error(f"--spark-conf takes KEY=VALUE, got {item!r}")
        conf[k.strip()] = v.strip()
    a.spark_conf = conf


def parse_rates(text: str) -> list[int]:
    rates = sorted({_count(x) for x in text.split(",") if x.strip()})
    if not rates or min(rates) < 1:
        raise argparse.ArgumentTypeError(f"--sweep needs rates >= 1, e.g. 5k,10k,20k (got {text!r})")
    return rates


def comma_choices(p: argparse.ArgumentParser, option: str, text: str, choices: Iterable[str]) -> list[str]:
    """A comma-separated list of ``choices`` (an option such as ``--modes``), in the order given; anything else, or
    nothing at all, is a usage error naming the option and the choices."""
    choices = tuple(choices)
    got = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in got if x not in choices]
    if bad or not got:
        p.error(f"{option}: {', '.join(bad) or 'none given'}; choose from {', '.join(choices)}")
    return got


def rate(n: float, seconds: float) -> float | None:
    return n / seconds if seconds > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


def toml_text(cfg: Mapping[str, Any]) -> str:
    """A config dict (sections of scalars, lists and sub-tables; lists of tables for ``[[route]]``) as TOML, for
    runs of the real ``applier`` command. JSON's string escapes are valid TOML basic-string escapes, and keys
    are always quoted, so no value or key can break out of its line."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"no TOML form for {type(v).__name__}")

    out: list[str] = []

    def table(header: str, data: Mapping[str, Any]) -> None:
        out.append(header)
        subs = [(k, v) for k, v in data.items() if isinstance(v, Mapping)]
        out.extend(f"{json.dumps(k)} = {value(v)}" for k, v in data.items() if not isinstance(v, Mapping))
        for k, v in subs:
            table(f"[{header.strip('[]')}.{json.dumps(k)}]", v)

    for section, data in cfg.items():
        if isinstance(data, Mapping):
            table(f"[{json.dumps(section)}]", data)
        else:
            for item in data:
                table(f"[[{json.dumps(section)}]]", item)
    return "\n".join(out) + "\n"


def safe_name(text: str) -> str:
    """A lower-case identifier from free text (topic and schema names)."""
    return re.sub(r"[^a-z0-9_]+", "_", text.lower()).strip("_")


def system_cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return sum(f) - idle, sum(f)


class StageClock(StageTimer):
    """The pipeline's stage timer (:mod:`applier.timing`) for one benchmark run: sums per stage, row counts, when
    the first batch started, and the profilers switched on around the Spark thread's ``on_batch`` and the apply
    thread's ``process`` (cProfile follows only the thread that enables it)."""

    def __init__(self, profiler: cProfile.Profile | None = None,
                 apply_profiler: cProfile.Profile | None = None) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.counts: dict[str, int] = defaultdict(int)
        self.first_batch_at: float | None = None
        self.profilers = {"on_batch": profiler, "process": apply_profiler}

    @property
    def rows_upserted(self) -> int:
        return self.counts["rows_upserted"]

    @property
    def rows_deleted(self) -> int:
        return self.counts["rows_deleted"]

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] += seconds
        self.calls[stage] += 1

    def count(self, what: str, n: int) -> None:
        self.counts[what] += n

    @contextmanager
    def span(self, stage: str) -> Iterator[None]:
        prof = self.profilers.get(stage)
        t = time.perf_counter()
        if stage == "on_batch" and self.first_batch_at is None:
            self.first_batch_at = t
        if prof is not None:
            prof.enable()
        try:
            yield
        finally:
            if prof is not None:
                prof.disable()
            self.add(stage, time.perf_counter() - t)


def delete_topic(bootstrap: str, topic: str) -> str | None:
    """Delete the benchmark's topic; returns why it could not be deleted (None when it was)."""
    from confluent_kafka.admin import AdminClient
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.delete_topics([topic], operation_timeout=60)[topic].result(90)
        return None
    except Exception as exc:  # best effort: report, do not fail the run
        return f"{type(exc).__name__}: {exc}"


def target_checksums(engine, schema: str, tables: Iterable[str],
                     columns: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Per table, the checksum of its rows, streamed from the target (server-side cursor), over ``columns`` (the
    stream's shape, e.g. the Debezium stream's; default the whole bench shape)."""
    from sqlalchemy import select

    from applier.dialect import dialect_for
    from applier.devtools.bench_stream import BENCH_COLUMN_NAMES, TableChecksum

    sink = dialect_for(engine).writer()
    out = {}
    for t in tables:
        cs = TableChecksum(columns=columns or BENCH_COLUMN_NAMES)
        with engine.connect() as conn:
            meta = sink.reflect(conn, schema, t)
            result = conn.execution_options(stream_results=True, yield_per=20_000).execute(select(meta.table))
            for row in result.mappings():
                cs.add(row)
        out[t] = cs
    return out


def applied_resolved_ts(engine, pipeline: str) -> int | None:
    try:
        from sqlalchemy import select

        from applier import progress as P
        with engine.connect() as conn:
            return conn.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == pipeline)).scalar()
    except Exception:
        return None


def drop_schema(engine, schema: str) -> None:
    _schema_statement(engine, schema, "DROP SCHEMA IF EXISTS {} CASCADE", "DROP DATABASE IF EXISTS {}")


def create_schema(engine, schema: str) -> None:
    """A new schema (PostgreSQL) or database (MariaDB/MySQL, utf8mb4), for a consumer that writes into an existing
    one (the Debezium JDBC sink creates tables, not schemas)."""
    _schema_statement(engine, schema, "CREATE SCHEMA {}", "CREATE DATABASE {} CHARACTER SET utf8mb4")


def _schema_statement(engine, schema: str, postgres: str, mysql: str) -> None:
    prep = engine.dialect.identifier_preparer
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(postgres.format(prep.quote_schema(schema)))
        else:
            conn.exec_driver_sql(mysql.format(prep.quote_identifier(schema)))


def human_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def produce_stream(bootstrap: str, topic: str, messages: Iterable[tuple[int, bytes | None, bytes]], *,
                   partitions: int, log=None) -> tuple[int, int]:
    """Create ``topic`` and write the messages with their partitions; a bounded producer queue keeps the
    driver's memory flat whatever the workload size. Returns (messages, bytes)."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(60)
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True,
                     "compression.type": "lz4", "message.max.bytes": 10_000_000,
                     "queue.buffering.max.kbytes": 65536, "batch.size": 1_000_000})
    n = nbytes = 0
    t0 = last = time.monotonic()
    for part, key, value in messages:
        while True:
            try:
                prod.produce(topic, value=value, key=key, partition=part)
                break
            except BufferError:
                prod.poll(0.05)
        n += 1
        nbytes += len(value) + (len(key) if key else 0)
        if n % 5000 == 0:
            prod.poll(0)
            if log and time.monotonic() - last > 10:
                last = time.monotonic()
                log(f"  produced {n:,} messages ({human_bytes(nbytes)}) in {last - t0:.0f} s")
    left = prod.flush(120)
    if left:
        raise RuntimeError(f"{left} message(s) to {topic} were not acknowledged by {bootstrap}")
    return n, nbytes


# ---- a measurement in a process of its own ----------------------------------------------------------------------

def _spawned_child(conn: Any, fn: Callable[..., dict[str, Any]], args: tuple, label: Mapping[str, Any]) -> None:
    """The child of :func:`run_spawned`. A SIGTERM from the parent becomes an exception, so what ``fn`` started
    (a Spark session, a cluster) is still stopped by its own ``finally`` blocks; any failure comes back as
    ``{**label, "error": ...}`` instead of a silent death."""
    import signal

    def stop(*_: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: a second one must not cut the clean-up short
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, stop)
    try:
        conn.send(fn(*args))
    except BaseException as exc:
        conn.send({**label, "error": f"{type(exc).__name__}: {exc}"[:4000]})
    finally:
        conn.close()


def run_spawned(fn: Callable[..., dict[str, Any]], *args: Any, name: str, label: Mapping[str, Any]) -> dict[str, Any]:
    """``fn(*args)`` in a spawned process; returns its result dict, or ``{**label, "error": ...}``.

    Why a process: each measurement gets its own driver JVM, so none starts warmer than another (a second
    SparkContext in one JVM inherits the first's JIT warm-up, class loading and shipped files). ``fn`` and
    ``args`` must pickle (a module-level function)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_spawned_child, args=(send, fn, args, dict(label)), name=name)
    proc.start()
    send.close()
    try:
        try:
            result = recv.recv()
        except EOFError:
            result = {**label, "error": "the measuring process died without a result"}
        proc.join()
        return result
    finally:
        if proc.is_alive():  # interrupted: a Ctrl-C reached the child too and it is cleaning up; else ask it to
            proc.join(30)
            proc.terminate()  # it turns SIGTERM into an exception, so its clean-up still runs
            proc.join(90)
            if proc.is_alive():
                proc.kill()
                proc.join()
