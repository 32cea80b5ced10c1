"""``python -m applier.devtools.services {start,stop,status,env,jars} [--only kafka,mariadb,postgres,registry]``

start   start what is not running yet (idempotent), wait until each answers, print the env lines
stop    stop what start started here (pid files; SIGKILL after a timeout); idempotent
status  what runs, with URLs; exit 0 if every requested service is up, else 1
env     print ``export`` lines: APPLIER_KAFKA, APPLIER_MARIADB_URL, APPLIER_PG_URL, APPLIER_SPARK_JARS
        (and APPLIER_REGISTRY_URL when the schema registry was asked for or runs)
jars    resolve (once) and print Spark's Kafka source jars, comma-separated

Without ``--only``, start/status cover Kafka, MariaDB and PostgreSQL; the schema registry (Apicurio Registry,
Confluent-compatible API, for the Avro protocol) runs only when named: ``--only registry`` (or
``--only kafka,registry``); so does TiDB (``--only tidb``: tidb-server and Dumpling, built from TiDB's Go module
the first time, see tidb.py). ``stop`` without ``--only`` stops them too.

Typical use: ``eval "$(python -m applier.devtools.services start)"``.  Progress goes to stderr, so that
stdout carries only the export lines.
"""

from __future__ import annotations

import argparse
import sys
import time

from applier.devtools import services
from applier.devtools.services.common import ServicesError


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _env(registry: bool = False) -> None:
    for line in services.env_lines(services.urls(), services.spark_kafka_jars(), registry=registry):
        print(line)


def _registry_up() -> bool:
    return services.status({"registry"})[0].up


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m applier.devtools.services", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status", "env", "jars"])
    parser.add_argument("--only", default=None,
                        help="comma-separated subset of: " + ",".join(services.ALL_SERVICES)
                        + " (default: " + ",".join(services.SERVICES) + "; stop: all)")
    args = parser.parse_args(argv)
    try:
        only = services.normalize_only(args.only)
        if args.command == "stop" and args.only is None:
            only = services.normalize_only(None, default=services.ALL_SERVICES)
        if args.command == "start":
            for name in only:
                t0 = time.monotonic()
                before = services.status({name})[0]
                services.start({name})
                if before.state == "external":
                    _progress(f"{name}: already running at {before.url} (not started from this state home)")
                elif before.up:
                    _progress(f"{name}: already running at {before.url}")
                else:
                    _progress(f"{name}: started at {services.url_for(name)} in {time.monotonic() - t0:.1f} s")
            _env(registry="registry" in only)
            return 0
        if args.command == "stop":
            for name in reversed(only):
                before = services.status({name})[0]
                t0 = time.monotonic()
                services.stop({name})
                if before.state in ("running", "starting"):
                    _progress(f"{name}: stopped (pid {before.pid}) in {time.monotonic() - t0:.1f} s")
                elif before.state == "external":
                    _progress(f"{name}: not started from this state home, left running")
                else:
                    _progress(f"{name}: not running")
            return 0
        if args.command == "status":
            rows = services.status(set(only))
            for st in rows:
                pid = f"pid {st.pid}" if st.pid else "-"
                print(f"{st.name:9} {st.state:9} {pid:10} {st.url}" + (f"  ({st.detail})" if st.detail else ""))
            print(f"state home: {services.applier_home()}")
            return 0 if all(st.up for st in rows) else 1
        if args.command == "env":
            _env(registry="registry" in only or _registry_up())
            return 0
        if args.command == "jars":
            print(",".join(services.spark_kafka_jars()))
            return 0
    except ServicesError as exc:
        print(f"applier.devtools.services: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
