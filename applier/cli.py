"""``applier``: run / status / migrate / validate / jars / demo.

Exit codes: 0 done; 2 configuration error (the message names the key) or a missing prerequisite such as Java
(the message names the command that installs it); 3 undecodable message (names topic,
partition, offset); 4 a change or DDL the target refused (names the table and position); 5 the target database or Kafka is unreachable or
refused the connection (Kafka: the Java client's cause, e.g. an authentication failure); 6 fenced: another run claimed the same pipeline.name (invariant 13; names its host, pid and when),
this one stopped without writing; 1 anything else.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

from applier.config import ConfigError, Settings, load_config

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
    return load_config(path)


def cmd_run(args: argparse.Namespace) -> int:
    from applier.pipeline import run
    settings = _load(args.config)
    res = run(settings, until_caught_up=args.until_caught_up)
    t = res.report
    print(f"pipeline {settings.pipeline.name}: {res.batches} batch(es), {t.messages} messages, {t.applied.rows} row "
          f"changes, {t.applied.ddls} DDL applied ({t.applied.ddls_skipped} skipped), applied resolved ts "
          f"{t.applied_ts}, {t.held} event(s) held above it")
    return 0


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
    print(f"applier tables at revision {rev} in {settings.target.url_redacted()}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    settings = _load(args.config)
    print(json.dumps(settings.redacted(), indent=2, default=str))
    print(f"{args.config}: OK", file=sys.stderr)
    return 0


def cmd_jars(args: argparse.Namespace) -> int:
    from applier.jars import spark_kafka_jars
    print(",".join(spark_kafka_jars()))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from applier.devtools.demo import demo
    return demo(target=args.target, protocol=args.protocol)


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
        print(f"config error: {exc}", file=sys.stderr)
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
    v.set_defaults(fn=cmd_validate)
    j = sub.add_parser("jars", help="resolve (once, with Maven) and print Spark's Kafka source jars, comma-separated "
                       "(for spark-submit --jars)")
    j.set_defaults(fn=cmd_jars)
    d = sub.add_parser("demo", help="start local Kafka and a database, write a sample TiCDC stream, apply it")
    d.add_argument("--target", choices=["mariadb", "postgres"], default="mariadb")
    d.add_argument("--protocol", choices=["open", "canal-json"], default="canal-json")
    d.set_defaults(fn=cmd_demo)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """The command line. ``applier run`` from a shell (``argv`` None) runs the pipeline in a supervised child
    process (applier.crashguard: a decoder that kills the process is found and contained); called from Python
    with an ``argv`` list, or as spark-submit's driver (its cluster manager restarts drivers), everything runs
    in this process."""
    args = build_parser().parse_args(argv)
    if args.cmd == "run":
        import os

        from applier.crashguard import CHILD_ENV, as_supervised_child
        if os.environ.get(CHILD_ENV) == "1":
            as_supervised_child()
        elif argv is None and "PYSPARK_GATEWAY_PORT" not in os.environ:  # not under spark-submit
            return _supervise(args, sys.argv[1:])
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
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
        print(f"setup error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except WriterFenced as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return EXIT_FENCED
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except DecodeError as exc:
        print(f"stopped: {exc}. Fix the producer/changefeed settings (source.protocol must match the "
              "changefeed's protocol), or set pipeline.on_decode_error = \"quarantine\" to keep such messages in "
              "applier_quarantine and go on.", file=sys.stderr)
        return EXIT_DECODE
    except ApplyError as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return EXIT_APPLY
    except (SourceUnreachable, TargetLost) as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return EXIT_TARGET
    except PipelineStopped as exc:
        fenced = _cause(exc, WriterFenced)
        print(f"stopped: {fenced or exc}", file=sys.stderr)
        return EXIT_FENCED if fenced else 1
    except RegistryError as exc:
        print(f"stopped: {exc}", file=sys.stderr)
        return 1
    except DBAPIError as exc:
        reason = str(exc.orig if exc.orig is not None else exc).splitlines()[0][:500]
        print(f"stopped: cannot use the target database: {reason}. Check [target] url (and password_env), that the "
              "server is reachable and that the user may create tables; then rerun.", file=sys.stderr)
        return EXIT_TARGET


if __name__ == "__main__":
    sys.exit(main())
