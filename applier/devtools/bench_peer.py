"""``python -m applier.devtools.bench_peer``: the applier against another consumer of the same TiCDC topic (issue 25).

One run:

1. **Resolves the peer** before anything is timed: Kafka Connect standalone and the Debezium JDBC sink with its
   JDBC drivers, from Maven Central into the jar cache (:mod:`applier.devtools.peers.debezium_jdbc`; the first
   time only).
2. **Writes one topic**: TiCDC's Debezium JSON with the schema envelope (``applier.devtools.bench_stream``,
   ``protocol="debezium"``): N row changes over T tables and P partitions, dispatched by key, TiCDC-restart
   replays, the CREATE TABLEs broadcast; no watermark unless ``--tidb-extension`` (then ``op: "m"``
   watermarks and ``tidb_type``). The stream leaves out what TiCDC's Debezium encoding cannot carry exactly
   (``DEBEZIUM_AVOIDS``, printed), so both consumers can reproduce the upstream rows.
3. **Alternates**, ``--rounds`` times: the applier as a user starts it (``applier run --until-caught-up`` in a
   fresh process with the default config, timed from start to exit, as ``bench --whole-process`` does) into a
   fresh schema, verified; then the sink (a fresh Kafka Connect process, ``tasks.max`` = partitions, timed from
   start to the moment its consumer group has committed every partition up to its last row change: the sink
   commits only what it wrote, so trailing DDL messages and watermarks, which its transforms drop, stay
   uncommitted; stopped afterwards, the stop not timed) into another fresh schema, verified. The 1-minute load average before each run is printed with
   it: the machine is shared, and a run beside another one is not a measurement.
4. **Verifies row by row**: every target row's digest against the generator's final rows (missing, unexpected
   and differing rows counted). The applier must be exact (exit 1 otherwise; with ``--tidb-extension`` its
   applied resolved ts must also be the stream's last). The sink is compared on the columns it carries (TIME and
   BIT are excluded from it) and its differences are reported as a count, never fatal: on real TiCDC streams it
   gets values wrong (peers.md), which this bench stream avoids.
5. **Reports** each time, both verifications, the medians and their ratio (the sink's median over the applier's:
   above 1, the applier is faster).

A failing sink task ends the run with the task's error (exit 1); whatever the run started is stopped, and its
schemas and topic are dropped unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from applier.devtools.bench_parts import (_count, applied_resolved_ts, check_workload_args, create_schema, delete_topic,
                                         drop_schema, human_bytes, produce_stream, safe_name)

PEERS = ("debezium-jdbc",)
PROTOCOLS = ("debezium",)
TARGETS = ("mariadb", "postgres")


def build_parser() -> argparse.ArgumentParser:
    from applier.devtools.bench import DEFAULT_MIX, parse_mix

    p = argparse.ArgumentParser(
        prog="python -m applier.devtools.bench_peer",
        description="Write one TiCDC topic, then apply it alternately with the applier (a fresh `applier run "
                    "--until-caught-up`) and with a peer consumer into fresh schemas; time, verify and compare.")
    p.add_argument("--peer", choices=PEERS, default="debezium-jdbc")
    p.add_argument("--protocol", choices=PROTOCOLS, default="debezium")
    p.add_argument("--target", choices=TARGETS, default="mariadb")
    p.add_argument("--events", type=_count, default=50_000, help="distinct upstream row changes (50k, 200k, ...)")
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--partitions", type=int, default=6, help="also the sink's tasks.max")
    p.add_argument("--rounds", type=int, default=2, help="applier then peer, this many times")
    p.add_argument("--big-txn-rows", type=_count, default=0, help="rows of one very large upstream transaction")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--mix", type=parse_mix, default=DEFAULT_MIX, help="insert,update,delete weights (50,35,15)")
    p.add_argument("--hot-keys", type=int, default=64)
    p.add_argument("--dup-fraction", type=float, default=0.005, help="row changes sent twice by TiCDC restarts")
    p.add_argument("--tidb-extension", action="store_true",
                   help="TiCDC's enable-tidb-extension=true: op \"m\" watermarks (the applier gates on them, the sink "
                        "drops them with a Groovy filter) and tidb_type in the column schemas")
    p.add_argument("--peer-batch-size", type=int, default=2000,
                   help="the sink's batch.size and consumer.override.max.poll.records (2000: its best measured)")
    p.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark setting for the applier's process")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds a peer run may take to catch up")
    p.add_argument("--keep", action="store_true", help="keep the topic and the schemas")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    check_workload_args(p, a, ("tables", "partitions", "rounds", "peer_batch_size"))
    if not 0 <= a.dup_fraction < 1:
        p.error("--dup-fraction must be in [0, 1)")
    return a


# ---------------------------------------------------------------------------------------------------------
# Verification: row by row against the generator's final rows
# ---------------------------------------------------------------------------------------------------------

def expected_digests(wl, columns: tuple[str, ...]) -> dict[str, dict[int, int]]:
    """table -> {id: digest of the final row on ``columns``}."""
    from applier.devtools.bench_stream import bench_row_digest
    return {t: {r["id"]: bench_row_digest(r, columns) for r in wl.final_rows(t)} for t in wl.table_names}


def compare_digests(expected: Mapping[int, int], got: Iterable[tuple[int, int | None]]) -> dict[str, Any]:
    """Counts of ``got`` ((id, digest or None when the row could not be read)) against ``expected``: rows equal,
    missing, unexpected, different; and the first few ids of each kind."""
    seen: set[int] = set()
    out: dict[str, Any] = {"equal": 0, "missing": 0, "unexpected": 0, "different": 0, "examples": []}
    for key, digest in got:
        seen.add(key)
        want = expected.get(key)
        kind = "unexpected" if want is None else "equal" if digest == want else "different"
        out[kind] += 1
        if kind != "equal" and len(out["examples"]) < 5:
            out["examples"].append((kind, key))
    missing = [k for k in expected if k not in seen]
    out["missing"] = len(missing)
    out["examples"] += [("missing", k) for k in missing[: max(0, 5 - len(out["examples"]))]]
    return out


def verify_rows(engine, schema: str, wl, expected: Mapping[str, Mapping[int, int]],
                columns: tuple[str, ...]) -> dict[str, Any]:
    """Every row of every bench table in ``schema`` against ``expected`` on ``columns``; a table the consumer never
    created counts all its rows as missing."""
    from sqlalchemy import select

    from applier.devtools.bench_stream import bench_row_digest
    from applier.dialect import dialect_for

    t0 = time.perf_counter()
    writer = dialect_for(engine).writer()
    total = {"equal": 0, "missing": 0, "unexpected": 0, "different": 0}
    examples: list[str] = []
    for table in wl.table_names:
        def rows() -> Iterable[tuple[int, int | None]]:
            with engine.connect() as conn:
                try:
                    meta = writer.reflect(conn, schema, table)
                except Exception as exc:  # the consumer never created it
                    examples.append(f"{table}: not readable ({type(exc).__name__})")
                    return
                result = conn.execution_options(stream_results=True, yield_per=20_000).execute(select(meta.table))
                for row in result.mappings():
                    try:
                        digest: int | None = bench_row_digest(row, columns)
                    except Exception:  # a value of a type the shape does not have
                        digest = None
                    yield int(row["id"]), digest

        res = compare_digests(expected[table], rows())
        for k in total:
            total[k] += res[k]
        for kind, key in res["examples"]:
            if len(examples) < 8:
                examples.append(f"{table} id {key}: {kind}" + (_column_diff(engine, schema, wl, table, key, columns)
                                                               if kind == "different" else ""))
    bad = total["missing"] + total["unexpected"] + total["different"]
    return {"ok": bad == 0, "rows_equal": total["equal"], "differences": bad, **total, "examples": examples,
            "columns": list(columns), "seconds": round(time.perf_counter() - t0, 1)}


def _column_diff(engine, schema: str, wl, table: str, key: int, columns: tuple[str, ...]) -> str:
    """' (column: expected != got, ...)' for one differing row (examples only)."""
    from sqlalchemy import select

    from applier.devtools.bench_stream import bench_canonical
    from applier.dialect import dialect_for

    want = wl.final_row(table, key)
    try:
        with engine.connect() as conn:
            meta = dialect_for(engine).writer().reflect(conn, schema, table)
            got = conn.execute(select(meta.table).where(meta.table.c["id"] == key)).mappings().first()
    except Exception as exc:  # an example only
        return f" (not readable: {type(exc).__name__})"
    if want is None or got is None:
        return ""
    diffs = []
    for c in columns:
        try:
            same = bench_canonical(want, (c,)) == bench_canonical(got, (c,))
        except Exception:
            same = False
        if not same:
            diffs.append(f"{c}: {want[c]!r} != {got.get(c)!r}")
    return f" ({'; '.join(diffs)[:400]})"


# ---------------------------------------------------------------------------------------------------------
# The two consumers
# ---------------------------------------------------------------------------------------------------------

def applier_codec(a: argparse.Namespace) -> dict[str, Any]:
    """``[source.codec]`` for the stream: with the TiDB extension the applier gates on the watermarks."""
    return {"gated": True} if a.tidb_extension else {}


def run_applier(a: argparse.Namespace, *, kafka: str, topic: str, url: str, wl, schema: str, name: str,
                log: Callable[[str], None]) -> dict[str, Any]:
    """``applier run --until-caught-up`` in a fresh process with the default config (``bench --whole-process``'s
    config, password only in the child's environment), timed from start to exit."""
    from applier.devtools import bench

    ns = bench.build_parser().parse_args([])  # the bench's defaults, so that the child gets the product's
    ns.protocol, ns.spark_conf = a.protocol, a.spark_conf
    tmp = Path(tempfile.mkdtemp(prefix="applier-peer-run-"))  # mode 0700
    try:
        cfg = bench.applier_config(ns, name=name, ckpt=tmp / "checkpoint", kafka=kafka, topic=topic, url=url,
                                   source_schema=wl.schema, schema=schema)
        cfg["source"]["codec"] = applier_codec(a)
        path = tmp / "applier.toml"
        bench.write_private(path, bench.toml_text(bench.whole_process_config(ns, cfg)))
        cmd = bench.applier_command(str(path), verbose=True)
        password = bench.split_password(url)[1]
        env = {**os.environ, **({bench.TARGET_PASSWORD_ENV: password} if password is not None else {})}
        log(f"applier: {shlex.join(cmd)} into {schema}")
        proc = bench.time_process(cmd, env, log)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"  exited 0 after {proc['wall_seconds']:.1f} s: {proc.get('row_changes_applied', 0):,} row changes applied "
        f"in {proc.get('batches', '?')} micro-batches")
    return {"seconds": round(proc["wall_seconds"], 2), "batches": proc.get("batches"),
            "row_changes_applied": proc.get("row_changes_applied"),
            "first_applied_batch_seconds": proc.get("first_applied_batch_seconds")}


def run_peer(a: argparse.Namespace, *, kafka: str, topic: str, url: str, wl, schema: str, engine, name: str,
             log: Callable[[str], None]) -> dict[str, Any]:
    from applier.devtools.peers import debezium_jdbc as dj

    create_schema(engine, schema)
    extra = {}
    if a.peer_batch_size != dj.BATCH_SIZE:
        extra = {"batch.size": str(a.peer_batch_size), "consumer.override.max.poll.records": str(a.peer_batch_size)}
    run = dj.run_sink(bootstrap=kafka, topic=topic, target_url=url, schema=schema, run_id=name,
                      column_types=wl.column_types, tidb_extension=a.tidb_extension, timeout=a.timeout,
                      extra=extra, log=log)
    return {"seconds": round(run.seconds, 2), "tasks_running_seconds": _round(run.rest_seconds),
            "first_commit_seconds": _round(run.first_commit_seconds), "stop_seconds": round(run.stop_seconds, 1),
            "config": run.config}


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 2)


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------

def peer_facts(a: argparse.Namespace, log) -> dict[str, Any]:
    """Resolve the peer's jars (Maven, once; not timed) and say what was resolved."""
    from applier.devtools.peers import debezium_jdbc as dj

    t = time.perf_counter()
    dj.classpath(tidb_extension=a.tidb_extension)
    secs = time.perf_counter() - t
    facts = dj.resolution_facts()
    log(f"peer jars: {facts.get('jars')} jars, {human_bytes(facts.get('bytes'))} in {facts.get('folder')} "
        f"(Maven took {facts.get('maven_seconds')} s on {facts.get('resolved_at')}; {secs:.1f} s now)")
    return {"versions": {"kafka-connect": dj.CONNECT_VERSION, "debezium-connector-jdbc": dj.DEBEZIUM_VERSION,
                         "mariadb-java-client": dj.MARIADB_DRIVER_VERSION, "postgresql-jdbc": dj.POSTGRES_DRIVER_VERSION,
                         **({"debezium-scripting": dj.DEBEZIUM_VERSION, "groovy": dj.GROOVY_VERSION}
                            if a.tidb_extension else {})},
            "jar_cache": facts}


def run_peer_bench(a: argparse.Namespace, log=None) -> dict[str, Any]:
    from sqlalchemy import create_engine

    from applier.devtools import services
    from applier.devtools.bench import versions
    from applier.devtools.bench_stream import DEBEZIUM_AVOIDS, generate_bench
    from applier.devtools.peers.debezium_jdbc import UNCARRIED_TYPES, excluded_fields

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    urls = services.start({"kafka", a.target})
    url = urls.mariadb_url if a.target == "mariadb" else urls.pg_url
    run_id = safe_name(f"peer_{a.target}_{a.events}_{time.strftime('%Y%m%d%H%M%S')}_{uuid.uuid4().hex[:4]}")
    topic = f"bench-{run_id}"
    result: dict[str, Any] = {"params": {k: v for k, v in vars(a).items() if k != "json"}, "topic": topic,
                              "versions": versions(urls, a.target), "avoids": list(DEBEZIUM_AVOIDS)}
    result["peer"] = peer_facts(a, log)

    wl = generate_bench(a.protocol, tables=a.tables, partitions=a.partitions, events=a.events,
                        big_txn_rows=a.big_txn_rows, seed=a.seed, mix=a.mix, hot_keys=a.hot_keys,
                        dup_fraction=a.dup_fraction, tidb_extension=a.tidb_extension)
    log(f"generating {a.events:,} row changes ({a.protocol}{', TiDB extension' if a.tidb_extension else ''}, "
        f"{a.tables} tables, {a.partitions} partitions) into topic {topic}")
    t = time.perf_counter()
    n_msgs, n_bytes = produce_stream(urls.kafka, topic, wl.messages(), partitions=a.partitions, log=log)
    result["workload"] = {**vars(wl.stats), "generate_and_produce_seconds": round(time.perf_counter() - t, 1),
                          "columns": list(wl.columns), "column_types": wl.column_types}
    log(f"  {n_msgs:,} messages, {human_bytes(n_bytes)}, {wl.stats.row_events:,} row changes + "
        f"{wl.stats.duplicate_row_events:,} replayed")
    excluded = {f.split(":", 1)[1] for f in excluded_fields(topic, wl.column_types)}
    carried = tuple(c for c in wl.columns if c not in excluded)
    result["peer"]["excluded_columns"] = sorted(excluded)
    want_all = expected_digests(wl, wl.columns)
    want_carried = want_all if carried == wl.columns else expected_digests(wl, carried)
    if excluded:
        log(f"  the sink leaves out {', '.join(sorted(excluded))} ({'/'.join(sorted(UNCARRIED_TYPES)).upper()}): "
            "verified on the other columns")

    engine = create_engine(url)
    runs: list[dict[str, Any]] = []
    schemas: list[str] = []
    try:
        for rnd in range(1, a.rounds + 1):
            for who in ("applier", a.peer):
                schema = f"{run_id}_{'a' if who == 'applier' else 'p'}{rnd}"
                schemas.append(schema)
                load = os.getloadavg()[0]
                name = f"{run_id}-{who}-{rnd}"
                kw = dict(kafka=urls.kafka, topic=topic, url=url, wl=wl, schema=schema, name=name, log=log)
                if who == "applier":
                    figures = run_applier(a, **kw)
                    check = verify_rows(engine, schema, wl, want_all, wl.columns)
                    if a.tidb_extension:  # gated: the applied resolved ts must be the stream's last
                        applied = applied_resolved_ts(engine, name)
                        check["applied_ts"] = applied
                        if applied != wl.final_ts:
                            check["ok"] = False
                            check["examples"].append(f"applied resolved ts {applied} != the stream's {wl.final_ts}")
                else:
                    figures = run_peer(a, engine=engine, **kw)
                    check = verify_rows(engine, schema, wl, want_carried, carried)
                runs.append({"round": rnd, "consumer": who, "schema": schema, "loadavg_1m_before": round(load, 2),
                             **figures, "verify": check})
                log(f"  verify: {verify_text(check)}")
                if not a.keep:
                    drop_schema(engine, schema)
    finally:
        if not a.keep:
            for schema in schemas:
                try:
                    drop_schema(engine, schema)
                except Exception as exc:  # pragma: no cover - best effort
                    log(f"could not drop {schema}: {exc}")
            why = delete_topic(urls.kafka, topic)
            if why:
                log(f"could not delete topic {topic}: {why}")
        engine.dispose()
    result["runs"] = runs
    result["summary"] = summary(runs, a.peer)
    return result


def summary(runs: list[Mapping[str, Any]], peer: str) -> dict[str, Any]:
    """Medians of each consumer's times and their ratio (the peer's over the applier's: > 1, the applier is
    faster); whether every applier run verified."""
    def times(who: str) -> list[float]:
        return [r["seconds"] for r in runs if r["consumer"] == who]

    mine, theirs = times("applier"), times(peer)
    m_a = statistics.median(mine) if mine else None
    m_p = statistics.median(theirs) if theirs else None
    return {"applier_median_seconds": m_a, "peer_median_seconds": m_p,
            "ratio_peer_to_applier": (m_p / m_a) if m_a and m_p is not None else None,
            "applier_verified": all(r["verify"]["ok"] for r in runs if r["consumer"] == "applier"),
            "peer_differences": [r["verify"]["differences"] for r in runs if r["consumer"] == peer]}


def verify_text(check: Mapping[str, Any]) -> str:
    if check["ok"]:
        return f"OK, {check['rows_equal']:,} rows equal ({len(check['columns'])} columns)"
    return (f"{check['differences']:,} rows differ ({check['missing']:,} missing, {check['unexpected']:,} unexpected, "
            f"{check['different']:,} with other values; {check['rows_equal']:,} equal, {len(check['columns'])} "
            f"columns compared)")


def format_report(r: Mapping[str, Any]) -> str:
    p, wst, peer, s = r["params"], r["workload"], r["peer"], r["summary"]
    cfg = next((x["config"] for x in r["runs"] if x["consumer"] == p["peer"]), {})
    lines = [
        f"peer benchmark: {p['protocol']}{' (TiDB extension)' if p['tidb_extension'] else ''} -> {p['target']}, "
        f"applier vs {p['peer']}, {p['rounds']} round(s), {p['tables']} tables, {p['partitions']} partitions, "
        f"seed {p['seed']}",
        "  versions: " + ", ".join(f"{k} {v}" for k, v in {**r["versions"], **peer["versions"]}.items()),
        f"  peer jars: {peer['jar_cache'].get('jars')} jars, {human_bytes(peer['jar_cache'].get('bytes'))} in "
        f"{peer['jar_cache'].get('folder')} (resolved by Maven in {peer['jar_cache'].get('maven_seconds')} s)",
        f"  workload: {wst['row_events']:,} row changes (+{wst['duplicate_row_events']:,} replayed; "
        f"{wst['inserts']:,} ins / {wst['updates']:,} upd / {wst['deletes']:,} del), {wst['messages']:,} messages, "
        f"{human_bytes(wst['bytes'])}, columns {', '.join(wst['columns'])}",
        "  the stream avoids, so that both consumers can reproduce the upstream rows:",
        *[f"    - {x}" for x in r["avoids"]],
        "  applier: `applier run --until-caught-up`, default config, a fresh process: start to exit",
        f"  {p['peer']}: Kafka Connect standalone, a fresh process: start to its group committing every partition up "
        "to its last row change (offset.flush.interval.ms 1000, polled every 0.25 s; its stop is not counted)",
    ]
    if cfg:
        transforms = cfg.get("transforms", "")
        lines.append(f"    tasks.max {cfg.get('tasks.max')} (= partitions), batch.size {cfg.get('batch.size')}, "
                     f"consumer.override.max.poll.records {cfg.get('consumer.override.max.poll.records')}, insert.mode "
                     f"{cfg.get('insert.mode')}, delete.enabled {cfg.get('delete.enabled')}, primary.key.mode "
                     f"{cfg.get('primary.key.mode')}, schema.evolution {cfg.get('schema.evolution')}, "
                     f"database.time_zone {cfg.get('database.time_zone')}, transforms {transforms} "
                     "(TiCDC's DDL messages" + (", op \"m\" watermarks)" if "dropWatermarks" in transforms else ")")
                     + f", field.exclude.list {cfg.get('field.exclude.list') or 'none'}")
    lines += ["", f"  {'round':<6} {'consumer':<15} {'seconds':>9}  {'load 1m':>7}  verification"]
    for x in r["runs"]:
        lines.append(f"  {x['round']:<6} {x['consumer']:<15} {x['seconds']:>9.1f}  {x['loadavg_1m_before']:>7.2f}  "
                     f"{verify_text(x['verify'])}")
        for e in x["verify"]["examples"][:3]:
            lines.append(f"  {'':<6} {'':<15} {'':>9}  {'':>7}    {e}")
    ratio = s["ratio_peer_to_applier"]
    lines += ["", f"  median: applier {_s(s['applier_median_seconds'])}, {p['peer']} {_s(s['peer_median_seconds'])}; "
              f"ratio {p['peer']} / applier = {ratio:.2f} (above 1: the applier is faster)" if ratio is not None
              else "  median: n/a"]
    if not s["applier_verified"]:
        lines.append("  APPLIER VERIFICATION FAILED")
    return "\n".join(lines)


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} s"


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        result = run_peer_bench(a)
    except KeyboardInterrupt:
        print("peer benchmark interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        print(f"peer benchmark FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str) if a.json else format_report(result))
    if not result["summary"]["applier_verified"]:
        print("peer benchmark FAILED: the applier's target does not equal the generator's final rows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
