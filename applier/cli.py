"""``applier``: run / status / migrate / validate / verify / quarantine / load / jars / demo.

``applier quarantine list|show|retry|discard`` works on the row changes the target refused and the changes held
behind them (applier/redrive.py): exit 0 done (``list`` also when nothing is held: a health check of a healthy
pipeline passes), 1 nothing matched (``show``, ``retry``, ``discard``), 2 a bad option, 4 the retry failed again
(the changes stay held with the new reason), 5 the target is unreachable, 6 fenced.

Exit codes: 0 done; 2 configuration error (the message names the key) or a missing prerequisite such as Java
(the message names the command that installs it); 3 undecodable message (names topic,
partition, offset); 4 a change or DDL the target refused (names the table and position); 5 the target database or Kafka is unreachable or
refused the connection (Kafka: the Java client's cause, e.g. an authentication failure); 6 fenced: another run claimed the same pipeline.name (invariant 13; names its host, pid and when),
this one stopped without writing; 1 anything else (also a second ``applier run`` of a pipeline already running
on this host: it says so).

``applier run`` stops on SIGINT (Ctrl-C), SIGTERM or SIGHUP, sent to its process alone or to its process group:
the micro-batch being applied finishes (or, on a second signal, rolls back), one line on stderr says where the
progress stands, and it ends with 128 + the signal's number (130, 143, 129) -- from a shell, by the signal itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Sequence

from applier import logs
from applier.config import ConfigError, Settings, load_config

if TYPE_CHECKING:
    from applier.redrive import Selection

EXIT_CONFIG = 2
EXIT_DECODE = 3
EXIT_APPLY = 4
EXIT_TARGET = 5
EXIT_FENCED = 6


def consistency_of(settings: Settings) -> str:
    from applier.pipeline import decoder_for
    gated = decoder_for(settings).gated
    return "transactional (resolved-ts gated)" if gated else "per-key order (offset order per partition)"


def _load(path: str) -> Settings:
    settings = load_config(path)
    logs.set_pipeline(settings.pipeline.name)  # named by every log line from now on
    return settings


def cmd_run(args: argparse.Namespace) -> int:
    from applier.pipeline import run
    settings = _load(args.config)
    res = run(settings, until_caught_up=args.until_caught_up, until_ts=args.until_ts)
    if res.signal is not None:
        return _stopped_on_signal(settings, res)
    t = res.report
    print(f"pipeline {settings.pipeline.name}: {res.batches} batch(es), {t.messages} messages, {t.applied.rows} row "
          f"changes, {t.applied.ddls} DDL applied ({t.applied.ddls_skipped} skipped), applied resolved ts "
          f"{t.applied_ts}, {t.held} event(s) held above it")
    if res.stopped_at is not None:
        print(f"stopped at --until-ts {res.stopped_at}: the replica is consistent as of exactly that TSO "
              "(applier_pipelines.applied_ts); a run without --until-ts continues from there")
    elif args.until_ts is not None:  # --until-caught-up drained Kafka first
        print(f"caught up before --until-ts {args.until_ts}: what Kafka holds does not reach it yet (global resolved "
              f"ts {t.global_resolved}); the replica is consistent as of {t.applied_ts}. Run again with --until-ts "
              f"{args.until_ts} (without --until-caught-up it waits for it)")
    return 0


def _stopped_on_signal(settings: Settings, res) -> int:
    """The one line a run stopped by an operator's signal prints, and its exit code (128 + the signal's number)."""
    from applier.crashguard import signal_name

    try:
        applied = _applied_ts(settings)
    except Exception:  # noqa: BLE001 - the target does not answer now: say what this run knows
        applied = res.report.applied_ts if res.batches else -1
    where = ("no progress is recorded yet" if applied is None else
             "everything committed is consistent (the target did not answer to say up to where)" if applied < 0 else
             f"progress is committed up to applied ts {applied} (applier_pipelines.applied_ts)")
    logs.say(f"stopping on {signal_name(res.signal)}: {where}, after {res.batches} micro-batch(es) in this run; "
             "run again to go on", level=logging.WARNING)
    return 128 + res.signal


def _applied_ts(settings: Settings) -> int | None:
    """The pipeline's applied resolved ts as the target has it (None: no progress recorded yet)."""
    from sqlalchemy import inspect, select

    from applier.dialect import target_engine
    from applier.progress import pipelines

    engine = target_engine(settings.target, connect_args={"connect_timeout": 5})  # both drivers take it
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(pipelines.name):
                return None
            value = conn.execute(select(pipelines.c.applied_ts)
                                 .where(pipelines.c.pipeline == settings.pipeline.name)).scalar()
        return None if value is None else int(value)
    finally:
        engine.dispose()


def target_problem(exc: BaseException, *, create: bool = False) -> str:
    """The target database's refusal in one line, and what to check: the TLS settings when TLS is what failed
    (applier.dialect.tls_failure), else the url and the password and that the server answers."""
    from applier.dialect import tls_failure

    orig = getattr(exc, "orig", None)
    reason = str(orig if orig is not None else exc).splitlines()[0][:500]
    tls = tls_failure(exc)
    if tls is not None:
        return f"{reason}. TLS: {tls}; then rerun."
    return (f"{reason}. Check [target] url (and password_env or password_file), that the server is reachable"
            + (" and that the user may create tables" if create else "") + "; then rerun.")


def _tso_arg(text: str) -> int:
    """``--until-ts``: a TiDB TSO. A TSO the cluster has not reached yet is fine: the run waits for it."""
    from applier.config import tso_problem

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TSO (a whole number, physical ms << 18 | logical, "
                                         "e.g. SELECT @@tidb_current_ts)") from None
    problem = tso_problem(value, future_ok=True)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def cmd_status(args: argparse.Namespace) -> int:
    from applier.pipeline import make_engine
    from applier.report import format_status, status
    settings = _load(args.config)
    engine = make_engine(settings)
    try:
        from applier import migrate
        if migrate.current(engine) is None:
            st = {"pipeline": settings.pipeline.name, "exists": False}
        else:
            st = status(engine, settings.pipeline.name, consistency=consistency_of(settings))
    finally:
        engine.dispose()
    print(json.dumps(st, indent=2, default=str) if args.json else format_status(st))
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from applier import migrate
    from applier.pipeline import make_engine
    settings = _load(args.config)
    engine = make_engine(settings)
    try:
        rev = migrate.upgrade(engine)
    finally:
        engine.dispose()
    print(f"applier tables at revision {rev} in {settings.target.url_redacted}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Check a config and print it (secrets masked). With --target, also connect to the target and report the
    shard merges it holds (applier/shard_report.py): exit 1 when merged shards' primary keys differ from each
    other or from the target's, 0 otherwise (a shared key is a printed warning), 5 when the target is
    unreachable."""
    settings = _load(args.config)
    if not args.target:
        print(json.dumps(settings.redacted(), indent=2, default=str))
        print(f"{args.config}: OK", file=sys.stderr)
        return 0
    from sqlalchemy.exc import DBAPIError

    from applier import migrate
    from applier import shard_report as sr
    from applier.dialect import dialect_for
    from applier.pipeline import make_engine, router_for
    engine = make_engine(settings)
    try:
        try:
            reflect = dialect_for(engine).writer().reflect
            if migrate.current(engine) is None:
                report = sr.ShardReport(settings.pipeline.name, settings.target.url_redacted, [],
                                        note="no applier tables in the target yet (nothing replicated): no merges")
            else:
                report = sr.gather(engine, pipeline=settings.pipeline.name, route=router_for(settings).route,
                                   reflect=reflect, target_shown=settings.target.url_redacted)
        except DBAPIError as exc:
            print(f"stopped: cannot use the target database {settings.target.url_redacted}: {target_problem(exc)}",
                  file=sys.stderr)
            return EXIT_TARGET
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"config": settings.redacted(), "shard_merges": report.as_json()}, indent=2, default=str))
    else:
        print(json.dumps(settings.redacted(), indent=2, default=str))
        print(sr.format_report(report))
    print(f"{args.config}: {'shard merge problems' if report.problems else 'OK'}", file=sys.stderr)
    return 1 if report.problems else 0


def cmd_load(args: argparse.Namespace) -> int:
    """Seed the replica from a Dumpling export and make its snapshot TSO the pipeline's starting point
    (applier/load.py). Exit 0 loaded, 2 a bad option/export or a pipeline that already has progress or a load
    (without --replace), 4 a row (or CREATE TABLE) the target refused, 5 the target is unusable, 6 fenced."""
    from pathlib import Path

    from applier import load as ld
    from applier.dumpling import ReadOptions
    settings = _load(args.config)
    opts = ld.LoadOptions(
        Path(args.dumpling), replace=args.replace, threads=args.threads, snapshot_ts=args.snapshot_ts,
        read=ReadOptions(escape_backslash=not args.no_escape_backslash, csv_separator=args.csv_separator,
                         csv_delimiter=args.csv_delimiter, csv_null=args.csv_null_value, csv_header=args.csv_header))
    try:
        res = ld.load(settings, opts)
    except ld.LoadError as exc:
        logs.say(f"stopped: {exc}")
        return exc.code
    print(ld.format_result(res))
    return 0


def cmd_jars(args: argparse.Namespace) -> int:
    from applier.jars import spark_kafka_jars
    print(",".join(spark_kafka_jars()))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from applier.devtools.demo import demo
    return demo(target=args.target, protocol=args.protocol)


def cmd_verify(args: argparse.Namespace) -> int:
    """Without --upstream: check the applier's own tables. With it: compare the replica with the upstream, chunk
    by chunk (applier/verify/; docs/verify.md). Exit 0 equal/consistent, 1 differences/problems, 2 a
    bad option, 5 the upstream is unreachable."""
    from applier import verify as vr
    from applier.dialect import dialect_for
    from applier.pipeline import decoder_for, make_engine, router_for
    settings = _load(args.config)
    gated = decoder_for(settings).gated
    if args.chunk_rows < 1:
        raise ConfigError("--chunk-rows", f"must be >= 1, got {args.chunk_rows}", source="command line")
    up_url = None if args.upstream is None else vr.upstream_url(args.upstream, password_env=args.upstream_password_env)
    if up_url is None and args.fix_sql:
        raise ConfigError("--fix-sql", "needs --upstream (the rows to write come from the upstream)",
                          source="command line")
    engine = make_engine(settings)
    try:
        dialect = dialect_for(engine)
        if up_url is None:
            findings = vr.check_applier_tables(
                engine, pipeline=settings.pipeline.name, gated=gated,
                subscribed=vr.topic_matcher(settings.source.topics, settings.source.topic_pattern))
            print(f"verify the applier's tables in {settings.target.url_redacted} (no --upstream: the replica's "
                  "rows are not compared)")
            print(vr.format_findings(findings))
            return 1 if any(f.problem for f in findings) else 0
        try:
            upstream = vr.connect_upstream(up_url)
        except vr.UpstreamUnreachable as exc:
            print(f"stopped: {exc}", file=sys.stderr)
            return EXIT_TARGET
        try:
            fix = None
            if args.fix_sql:
                fix = (vr.literal_dialect(engine), dialect.value_converter)
            res = vr.verify(engine, upstream, pipeline=settings.pipeline.name, router=router_for(settings),
                            writer=dialect.writer(), gated=gated,
                            upstream_shown=up_url.render_as_string(hide_password=True),
                            replica_shown=settings.target.url_redacted, chunk_rows=args.chunk_rows, fix=fix)
        except vr.VerifyError as exc:
            print(f"stopped: {exc}", file=sys.stderr)
            return 1
        finally:
            upstream.dispose()
        print(vr.format_report(res, max_keys=args.max_keys))
        if fix is not None:
            n = vr.write_fix_sql(args.fix_sql, res, engine, fix[0])
            print(f"fix-up SQL: {n} statement(s) written to {args.fix_sql}")
        return 1 if res.differences else 0
    finally:
        engine.dispose()


def _selection(args: argparse.Namespace) -> "Selection":
    from applier.redrive import Selection, parse_key, parse_table
    return Selection(table=None if args.table is None else parse_table(args.table),
                     row_key=None if args.key is None else parse_key(args.key),
                     ids=tuple(dict.fromkeys(args.id or ())), everything=args.all)


def cmd_quarantine(args: argparse.Namespace) -> int:
    """Held row changes and quarantined messages: list, show, retry, discard (applier/redrive.py). This only
    parses and prints; exit codes: 0 done (``list`` with nothing held too), 1 nothing matched (``show``, ``retry``,
    ``discard``), 2 a bad option, 4 the retry failed again, 5 the target is unreachable, 6 fenced (another claim of
    the pipeline's writer epoch won meanwhile)."""
    from applier import redrive as rd
    from applier import redrive_text as rt
    from applier.pipeline import make_engine
    settings = _load(args.config)
    if getattr(args, "limit", 1) < 1:
        raise ConfigError("--limit", f"must be >= 1, got {args.limit}", source="command line")
    sel = _selection(args) if args.action in ("retry", "discard") else None
    if args.action == "discard" and not (args.reason or "").strip():
        raise ConfigError("--reason", "discard needs --reason TEXT saying why these changes are given up (it is "
                          "recorded with them)", source="command line")
    if sel is not None:
        sel.check(args.action)
    engine = make_engine(settings)
    try:
        red = rd.Redrive.from_settings(engine, settings)
        try:
            if args.action == "list":
                ls = red.listing(state=args.state, table=None if args.table is None else rd.parse_table(args.table),
                                 row_key=None if args.key is None else rd.parse_key(args.key))
                if args.json:
                    print(json.dumps(ls.as_json(), indent=2, default=str))
                else:
                    print(f"quarantine of pipeline {settings.pipeline.name} in {settings.target.url_redacted}")
                    print(rt.format_listing(ls, limit=args.limit, config=args.config))
                return 0  # also when nothing is held: an empty quarantine is the healthy state
            if args.action == "show":
                if args.message:
                    m = red.message(args.id)
                    print(json.dumps({**m.as_json(), "key_preview": rt.safe_preview(m.key, args.preview),
                                      "value_preview": rt.safe_preview(m.value, args.preview)}, indent=2)
                          if args.json else rt.format_message(m, preview=args.preview))
                else:
                    h = red.held(args.id)
                    print(json.dumps(rt.held_json(h), indent=2) if args.json else rt.format_held(h))
                return 0
            if args.action == "retry":
                res = red.retry(sel)
                missing = red.missing_ids(sel, res.groups)
                print(rt.format_retry(res))
                if missing:
                    print(f"note: --id {' '.join(map(str, missing))} picked no held change (already resolved, or "
                          "not this pipeline's)", file=sys.stderr)
                return 0
            res_d = red.discard(sel, reason=args.reason)
            missing = red.missing_ids(sel, res_d.groups)
            print(rt.format_discard(res_d, config=args.config))
            if missing:
                print(f"note: --id {' '.join(map(str, missing))} picked no held change (already resolved, or not "
                      "this pipeline's)", file=sys.stderr)
            return 0
        except rd.RetryFailed as exc:
            print(f"retry failed: {exc}", file=sys.stderr)
            n = sum(len(g.rows) for g in exc.groups)
            print(f"nothing was applied (the transaction rolled back): the {n} change(s) of {len(exc.groups)} key(s) "
                  f"stay held, {len(exc.renoted)} of them with this reason. Fix the cause (the target table, the "
                  "config, the applier), then retry again, or give them up with `applier quarantine discard ... "
                  "--reason TEXT`", file=sys.stderr)
            return EXIT_APPLY
        except rd.RedriveError as exc:
            print(f"{'nothing matched' if isinstance(exc, rd.NothingMatched) else 'stopped'}: {exc}",
                  file=sys.stderr)
            return exc.code
    finally:
        engine.dispose()


def _cause(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first ``kind`` in ``exc``'s cause/context chain: the Spark query's failure can wrap the apply
    thread's error, and the exit code must still say what happened."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, kind):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _supervise(args: argparse.Namespace, argv: list[str]) -> int:
    from applier.crashguard import DecodingMarker, supervise
    try:
        settings = _load(args.config)
    except ConfigError as exc:
        logs.say(f"config error: {exc}")
        return EXIT_CONFIG
    return supervise(argv, DecodingMarker(settings.pipeline.local_dir))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="applier", description="Apply TiCDC change streams from Kafka to MySQL, "
                                 "MariaDB or PostgreSQL, exactly once.")
    ap.add_argument("-v", "--verbose", action="store_true", help="log each batch")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the pipeline")
    r.add_argument("-c", "--config", required=True)
    r.add_argument("--until-caught-up", action="store_true",
                   help="drain what is in Kafka now (Spark trigger availableNow) and exit 0")
    r.add_argument("--until-ts", type=_tso_arg, metavar="TSO",
                   help="stop once the applied resolved ts reaches this TiDB TSO, applying nothing committed after "
                   "it: the replica is then consistent as of exactly TSO; exit 0 (gated protocols only)")
    r.set_defaults(fn=cmd_run)
    s = sub.add_parser("status", help="applied and global resolved ts, lag, partitions, tables")
    s.add_argument("-c", "--config", required=True)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_status)
    m = sub.add_parser("migrate", help="create/upgrade the applier's tables in the target")
    m.add_argument("-c", "--config", required=True)
    m.set_defaults(fn=cmd_migrate)
    v = sub.add_parser("validate", help="check a config file and print it (secrets masked)")
    v.add_argument("-c", "--config", required=True)
    v.add_argument("--target", action="store_true", help="also connect to the target and report the shard merges "
                   "it holds: merged shards whose primary keys differ (exit 1) or share one key (a warning)")
    v.add_argument("--json", action="store_true", help="with --target: the config and the report as one JSON "
                   "document")
    v.set_defaults(fn=cmd_validate)
    j = sub.add_parser("jars", help="resolve (once, with Maven) and print Spark's Kafka source jars, comma-separated "
                       "(for spark-submit --jars)")
    j.set_defaults(fn=cmd_jars)
    vf = sub.add_parser("verify", help="compare the replica with the upstream TiDB/MySQL chunk by chunk (--upstream), "
                        "or check the applier's own tables (without it)")
    vf.add_argument("-c", "--config", required=True)
    vf.add_argument("--upstream", metavar="URL", help="the upstream, e.g. mysql+pymysql://user@tidb:4000/ (TiDB is "
                    "read at the replica's applied resolved ts)")
    vf.add_argument("--upstream-password-env", metavar="VAR", help="environment variable holding the upstream password")
    vf.add_argument("--chunk-rows", type=int, default=10_000, help="upstream rows per checksum chunk (default 10000)")
    vf.add_argument("--fix-sql", metavar="FILE", help="write idempotent SQL that makes the replica equal the upstream")
    vf.add_argument("--max-keys", type=int, default=20, help="differing keys listed per table and kind (default 20)")
    vf.set_defaults(fn=cmd_verify)
    q = sub.add_parser("quarantine", help="held row changes the target refused (and the changes held behind them), "
                       "and quarantined messages: list, show, retry, discard")
    qs = q.add_subparsers(dest="action", required=True)
    ql = qs.add_parser("list", help="held changes grouped by blocked key, and the quarantined messages")
    qsh = qs.add_parser("show", help="one held change in full (or, with --message, one quarantined message)")
    qr = qs.add_parser("retry", help="apply every held change of the selected keys, in commit order, in one "
                       "transaction (requires a filter or --all)")
    qd = qs.add_parser("discard", help="give up every held change of the selected keys (requires a filter or "
                       "--all, and --reason)")
    for a in (ql, qsh, qr, qd):
        a.add_argument("-c", "--config", required=True)
    ql.add_argument("--state", choices=["held", "retried", "discarded", "skipped", "all"], default="held",
                    help="which changes (default held)")
    for a in (ql, qr, qd):
        a.add_argument("--table", metavar="SCHEMA.TABLE", help="the upstream table, as list shows it")
        a.add_argument("--key", metavar="JSON", help="the row key as list shows it, e.g. '[7]' or '[1,\"a\"]'")
    ql.add_argument("--json", action="store_true", help="machine-readable output")
    ql.add_argument("--limit", type=int, default=50, help="keys and messages listed (default 50; --json lists all)")
    qsh.add_argument("id", type=int, metavar="ID", help="the id list shows")
    qsh.add_argument("--message", action="store_true", help="ID is a quarantined (undecodable) message's")
    qsh.add_argument("--preview", type=int, default=400, help="bytes of a message's key/value shown, escaped")
    qsh.add_argument("--json", action="store_true", help="machine-readable output")
    for a in (qr, qd):
        a.add_argument("--id", type=int, nargs="+", action="extend", metavar="N",
                       help="held change ids (their whole keys are taken)")
        a.add_argument("--all", action="store_true", help="every held change of the pipeline")
    qd.add_argument("--reason", help="why they are given up (required; recorded with them)")
    q.set_defaults(fn=cmd_quarantine)
    ld = sub.add_parser("load", help="seed the replica from a Dumpling export and start the pipeline at its snapshot "
                        "TSO (the next run drops every change committed at or before it)")
    ld.add_argument("-c", "--config", required=True)
    ld.add_argument("--dumpling", required=True, metavar="DIR", help="the folder Dumpling wrote (.sql or .csv data, "
                    "plain or gzip)")
    ld.add_argument("--replace", action="store_true", help="empty every routed target table before loading it, and "
                    "replace the pipeline's progress and recorded load with this one")
    ld.add_argument("--threads", type=int, default=4, help="target tables loaded at a time (default 4)")
    ld.add_argument("--snapshot-ts", type=int, metavar="TSO", help="the TSO the export is consistent at, for an "
                    "export whose metadata has none")
    ld.add_argument("--no-escape-backslash", action="store_true", help="the export was written with Dumpling's "
                    "--escape-backslash=false (quotes doubled, backslashes literal)")
    ld.add_argument("--csv-separator", default=",", help="Dumpling's --csv-separator (default ,)")
    ld.add_argument("--csv-delimiter", default='"', help="Dumpling's --csv-delimiter (default \")")
    ld.add_argument("--csv-null-value", default="\\N", help="Dumpling's --csv-null-value (default \\N)")
    ld.add_argument("--csv-header", choices=["auto", "yes", "no"], default="auto", help="whether CSV files start "
                    "with a header line (default auto: a first line of quoted column names is one)")
    ld.set_defaults(fn=cmd_load)
    d = sub.add_parser("demo", help="start local Kafka and a database, write a sample TiCDC stream, apply it")
    d.add_argument("--target", choices=["mariadb", "postgres"], default="mariadb")
    d.add_argument("--protocol", choices=["open", "canal-json"], default="canal-json")
    d.set_defaults(fn=cmd_demo)
    logs.add_option(ap)  # --log-format, before or after any subcommand
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """The command line. ``applier run`` from a shell (``argv`` None) runs the pipeline in a supervised child
    process (applier.crashguard: a decoder that kills the process is found and contained); called from Python
    with an ``argv`` list, or as spark-submit's driver (its cluster manager restarts drivers), everything runs
    in this process."""
    args = build_parser().parse_args(argv)
    logs.configure(args.log_format, verbose=args.verbose)
    if args.cmd == "run":
        import os

        from applier.crashguard import CHILD_ENV, STOP, as_supervised_child
        if os.environ.get(CHILD_ENV) == "1":
            STOP.install()  # a stop signal from now on stops the run after its current micro-batch
            as_supervised_child()  # unblocks the stop signals (one that came while starting is handled now)
        elif argv is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
            return _supervise(args, sys.argv[1:])
    from applier.events import DecodeError
    from applier.pipeline import PipelineStopped, SourceUnreachable, TargetLost
    from sqlalchemy.exc import DBAPIError

    from applier.codecs.registry import RegistryError
    from applier.progress import WriterFenced
    from applier.jars import JarsError
    from applier.session import SetupError
    from applier.sinks import ApplyError
    try:
        return args.fn(args)
    except (SetupError, JarsError) as exc:
        logs.say(f"setup error: {exc}")
        return EXIT_CONFIG
    except WriterFenced as exc:
        logs.say(f"stopped: {exc}")
        return EXIT_FENCED
    except ConfigError as exc:
        logs.say(f"config error: {exc}")
        return EXIT_CONFIG
    except DecodeError as exc:
        logs.say(f"stopped: {exc}. Fix the producer/changefeed settings (source.protocol must match the "
                 "changefeed's protocol), or set pipeline.on_decode_error = \"quarantine\" to keep such messages "
                 "in applier_quarantine and go on.")
        return EXIT_DECODE
    except ApplyError as exc:
        logs.say(f"stopped: {exc}")
        return EXIT_APPLY
    except (SourceUnreachable, TargetLost) as exc:
        logs.say(f"stopped: {exc}")
        return EXIT_TARGET
    except PipelineStopped as exc:
        fenced = _cause(exc, WriterFenced)
        logs.say(f"stopped: {fenced or exc}")
        return EXIT_FENCED if fenced else 1
    except RegistryError as exc:
        logs.say(f"stopped: {exc}")
        return 1
    except DBAPIError as exc:
        logs.say(f"stopped: cannot use the target database: {target_problem(exc, create=True)}")
        return EXIT_TARGET


if __name__ == "__main__":
    sys.exit(main())
