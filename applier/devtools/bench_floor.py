"""``python -m applier.devtools.bench_floor``: what Spark alone spends per Kafka message on this machine.

Why: issue 15's catch-up targets ask for a rate of the whole machine (the driver, the Spark JVM, its Python
workers, Kafka and the target share its cores). Whatever the applier does in Python, the CPU that Spark's Kafka
source and its exchange with the Python workers spend per message is paid on the same cores, so it bounds every
applier built on them. This tool measures that floor, one path at a time, on the bench's own topic:

* ``count``: the streaming Kafka source and ``count()`` in ``foreachBatch``: the JVM reading Kafka, nothing else.
* ``passthrough``: the pipeline's record columns through ``mapInArrow`` to Python workers that only count them,
  and ``toArrow()`` in the driver: adds the Arrow exchange with the workers.
* ``decode``: the pipeline's own read (``applier.pipeline.read_chunks`` with its worker spec): adds decoding in
  the workers, with nothing applied. This is the most any applier can do on this read path here.

Each mode runs in a fresh spawned process (its own JVM, so none profits from another's JIT or caches), with the
product's Spark session (``applier.pipeline.spark_session``, ``[spark] master = local[N]``), a streaming query
with the ``availableNow`` trigger and the pipeline's ``max_offsets_per_trigger``, as ``applier run
--until-caught-up`` reads. Reported per mode: wall, messages/s, and CPU seconds (and µs per message) of the
driver, the JVM and the Python workers (``/proc`` of every process started below the driver, sampled).

Tooling: the product never imports it. Uses the running services (APPLIER_KAFKA, APPLIER_PG_URL); starts none.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from applier.devtools.bench_parts import _count, check_workload_args, comma_choices, run_spawned

MODES = ("count", "passthrough", "decode")
Log = Callable[[str], None]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m applier.devtools.bench_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--topic", help="a kept bench topic (bench ... --keep); without it one is produced")
    p.add_argument("--protocol", choices=("canal-json", "open"), default="canal-json")
    p.add_argument("--events", type=_count, default=1_000_000, help="row changes of the produced topic (1M)")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--big-txn-rows", type=_count, default=100_000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--cores", type=int, default=2, help="local[N]")
    p.add_argument("--max-offsets-per-trigger", type=_count, default=200_000,
                   help="messages per micro-batch (200k, the in-process bench's; the product's default is 50k)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="[spark.conf] entry for the measured session (repeatable), e.g. a JVM option to compare")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    a.modes = comma_choices(p, "--modes", a.modes, MODES)
    check_workload_args(p, a, ("tables", "partitions", "cores", "max_offsets_per_trigger"))
    return a


def figures(mode: str, wall: float, messages: int, cpu: Mapping[str, float]) -> dict[str, Any]:
    """One mode's result: CPU seconds per process kind and per message, and their sum."""
    total = sum(cpu.values())
    per = {k: round(1e6 * v / messages, 1) if messages else None for k, v in cpu.items()}
    return {"mode": mode, "wall_s": round(wall, 2), "messages": messages,
            "messages_per_s": round(messages / wall) if wall else None,
            "cpu_s": {k: round(v, 2) for k, v in cpu.items()}, "cpu_us_per_message": per,
            "cpu_us_per_message_total": round(1e6 * total / messages, 1) if messages else None}


def _settings(a: argparse.Namespace, kafka: str, url: str, topic: str, checkpoint: Path) -> Any:
    from applier.config import parse_config

    return parse_config({
        "pipeline": {"name": "bench-floor", "checkpoint_dir": str(checkpoint), "decode_on": "executors",
                     "max_offsets_per_trigger": a.max_offsets_per_trigger},
        "source": {"bootstrap_servers": kafka, "topics": [topic], "protocol": a.protocol},
        "target": {"url": url},
        "spark": {"master": f"local[{a.cores}]", "conf": dict(a.spark_conf)},
    }, source="<bench-floor>")


def measure_mode(a: argparse.Namespace, mode: str, kafka: str, url: str, topic: str) -> dict[str, Any]:
    """One mode in this process: a Spark session, the streaming read until the topic's end, CPU by process."""
    import os

    from applier.devtools.bench import ProcSampler, _ppids, descendants
    from applier.devtools.bench_scale import count_records
    from applier.pipeline import RECORD_COLUMNS, read_chunks, spark_session, worker_spec

    root = Path(tempfile.mkdtemp(prefix="applier-bench-floor-"))
    settings = _settings(a, kafka, url, topic, root / "ckpt")
    before = descendants(_ppids(), os.getpid())
    spark = spark_session(settings)
    spec = worker_spec(settings)
    seen = [0]

    def on_batch(df: Any, _batch_id: int) -> None:
        if mode == "count":
            seen[0] += df.count()
        elif mode == "passthrough":
            counted = df.select(*RECORD_COLUMNS).mapInArrow(count_records, "n long").toArrow()
            seen[0] += sum(counted.column(0).to_pylist())
        else:
            from applier.decode import decode_chunk
            seen[0] += sum(decode_chunk(c).messages for c in read_chunks(df, spec))

    try:
        sampler = ProcSampler(interval=0.2, exclude=before)
        sampler.start()
        time.sleep(0.5)  # the sampler's first look: CPU the JVM spent starting is not the read's
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        reader = spark.readStream.format("kafka")
        for k, v in settings.source.spark_options().items():
            reader = reader.option(k, v)
        q = (reader.option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", str(a.max_offsets_per_trigger)).load()
             .writeStream.foreachBatch(on_batch).option("checkpointLocation", str(root / "query"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        wall = time.perf_counter() - t
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        sampler.stop()
    finally:
        spark.stop()
    cpu = {"driver": (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime),
           **sampler.summary()["cpu_seconds_by_kind"]}
    return figures(mode, wall, seen[0], cpu)


def format_report(r: Mapping[str, Any]) -> str:
    lines = [f"Spark alone on {r['topic']} ({r['messages']:,} messages), local[{r['cores']}], "
             f"{r['max_offsets_per_trigger']:,} messages per micro-batch"]
    for m in r["modes"]:
        if "error" in m:
            lines.append(f"  {m['mode']:<12} FAILED: {m['error'].splitlines()[0][:300]}")
            continue
        per = ", ".join(f"{k} {v}" for k, v in m["cpu_us_per_message"].items())
        lines.append(f"  {m['mode']:<12} {m['wall_s']:>7.1f} s  {m['messages_per_s']:>8,} msg/s  CPU µs/message: "
                     f"{per}; total {m['cpu_us_per_message_total']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from applier.devtools.bench_live import service_urls

    a = parse_args(argv)
    kafka, url = service_urls("postgres")
    log: Log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    topic, produced = a.topic, None
    if topic is None:
        from applier.devtools.bench_scale import produce_workload

        a.target = "postgres"
        produced = produce_workload(a, log)
        topic = produced.topic
    modes = []
    try:
        for mode in a.modes:
            log(f"{mode}: a fresh process reads {topic}")
            modes.append(run_spawned(measure_mode, a, mode, kafka, url, topic, name=f"bench-floor-{mode}",
                                     label={"mode": mode}))
            if "error" not in modes[-1]:
                log(f"  {modes[-1]['wall_s']} s, CPU µs/message {modes[-1]['cpu_us_per_message']}")
    finally:
        if produced is not None:
            from applier.devtools.bench_parts import delete_topic

            why = delete_topic(kafka, topic)
            if why:
                log(f"the topic {topic} was not deleted: {why}")
    counts = {m["messages"] for m in modes if "error" not in m}
    r = {"topic": topic, "messages": max(counts) if counts else 0, "cores": a.cores,
         "max_offsets_per_trigger": a.max_offsets_per_trigger, "modes": modes}
    print(json.dumps(r, indent=2) if a.json else format_report(r))
    failed = any("error" in m for m in modes) or len(counts) > 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
