"""Real local services for the tests, the demo and the benchmark: Kafka, MariaDB, PostgreSQL, and on request
a Confluent-compatible schema registry (Apicurio Registry, for the Avro protocol).

``python -m applier.devtools.services start|stop|status|env|jars`` (see ``__main__``), or from Python::

    from applier.devtools.services import spark_kafka_jars, start, stop, urls, Urls

    u = start()                  # idempotent; Urls(kafka=..., mariadb_url=..., pg_url=..., registry_url=...)
    start({"registry"})          # the schema registry is optional: only started when asked for
    jars = spark_kafka_jars()    # absolute jar paths for spark.jars
    stop()                       # stops exactly what start() started (pid files)

Everything lives under a state home, ``$APPLIER_HOME`` or ``~/.cache/applier``::

    jars/      Maven-resolved jars (spark-kafka-<ver>/, kafka-<ver>/, apicurio-registry-<ver>/)
    kafka/     server.properties, log4j2.properties, data/p<port>/ (KRaft log + metadata)
    mariadb/   my.cnf, data/ (datadir, socket, pid)
    postgres/  data/ (PGDATA), or a LOCATION file pointing elsewhere (see databases.py)
    registry/  working directory of the schema registry (its storage is in memory)
    logs/      kafka.out, kafka-server.log, mariadb.err, mariadb.out, postgres.out, registry.out
    run/       <service>.pid of the processes started here, and a lock file

Ports: Kafka 19092 (controller 19093), MariaDB 13306, PostgreSQL 15432, schema registry 18081, all on
127.0.0.1; override with APPLIER_KAFKA_PORT (APPLIER_KAFKA_CONTROLLER_PORT, default Kafka port + 1),
APPLIER_MARIADB_PORT, APPLIER_PG_PORT, APPLIER_REGISTRY_PORT.  If something already answers on a port and
it was not started from this state home, it is used as it is ("external") and never stopped.

TiDB (``tidb.py``: ``tidb-server`` with its embedded store on 127.0.0.1:14000, built with Dumpling from TiDB's Go
module the first time) is optional in the same way: ``start({"tidb"})`` / ``--only tidb``.

The schema registry is an optional service: ``start()``/``status()`` without arguments cover only Kafka,
MariaDB and PostgreSQL; ``start({"registry"})`` (or ``--only registry``) starts it; ``stop()`` without
arguments stops it too if it was started here.
"""

from __future__ import annotations

from applier.devtools.services import databases, kafka, registry, tidb
from applier.devtools.services.common import (
    ALL_SERVICES,
    OPTIONAL_SERVICES,
    PORT_ENV,
    SERVICES,
    ServiceStatus,
    ServicesError,
    Urls,
    build_urls,
    env_lines,
    kafka_controller_port,
    normalize_only,
    services_lock,
    url_for,
    urls,
)
from applier import jars
from applier.jars import applier_home

__all__ = [
    "ALL_SERVICES",
    "OPTIONAL_SERVICES",
    "PORT_ENV",
    "SERVICES",
    "ServiceStatus",
    "ServicesError",
    "Urls",
    "applier_home",
    "build_urls",
    "env_lines",
    "kafka_controller_port",
    "normalize_only",
    "services_lock",
    "spark_kafka_jars",
    "start",
    "status",
    "stop",
    "url_for",
    "urls",
]


def spark_kafka_jars() -> list[str]:
    """Absolute paths of Spark's Kafka source jars (the product's lookup, :mod:`applier.jars`)."""
    return jars.spark_kafka_jars()


def _module(service: str):
    if service == "kafka":
        return kafka
    if service == "registry":
        return registry
    if service == "tidb":
        return tidb
    return databases.MARIADB if service == "mariadb" else databases.POSTGRES


def start(only: set[str] | None = None) -> Urls:
    """Start the services (Kafka, MariaDB, PostgreSQL; or ``only``, which may name the optional "registry")
    unless they already run; wait until each answers."""
    for service in normalize_only(only):
        with services_lock():
            _module(service).start()
    return urls()


def stop(only: set[str] | None = None) -> None:
    """Stop the services that start() started (all, the optional registry included, or ``only``); never an
    external one."""
    errors = []
    for service in reversed(normalize_only(only, default=ALL_SERVICES)):
        with services_lock():
            try:
                _module(service).stop()
            except ServicesError as exc:
                errors.append(str(exc))
    if errors:
        raise ServicesError("\n".join(errors))


def status(only: set[str] | None = None) -> list[ServiceStatus]:
    return [_module(s).status() for s in normalize_only(only)]

