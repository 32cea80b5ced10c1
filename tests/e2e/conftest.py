"""End-to-end fixtures: the real local services and one shared Spark session.

Services come from ``python -m applier.devtools.services`` (Kafka 4.3 in KRaft mode from Maven Central, MariaDB and
PostgreSQL from Debian; on request the schema registry, and TiDB built from its Go module). What this session starts, it stops at the end; services that were already running
(for example started by .ci/run) are left running for their owner to stop.
"""

from __future__ import annotations

import os
import sys
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from applier.devtools import services
from tests.e2e.helpers import _MADE, made_topic, target_url


def _topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def _delete_topics(bootstrap: str, topics: set[str]) -> None:
    """Delete the session's topics, so a long-lived local broker does not collect them run after run."""
    from confluent_kafka.admin import AdminClient

    names = sorted(t for t in topics if not t.startswith("_"))
    if not names:
        return
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive the futures
    for name, fut in admin.delete_topics(names, operation_timeout=60).items():
        try:
            fut.result(90)
        except Exception as exc:  # report, do not fail the session over clean-up
            print(f"could not delete test topic {name}: {exc}", file=sys.stderr)


def _wanted() -> set[str]:
    return {"kafka", "mariadb", "postgres"}


@pytest.fixture(scope="session")
def urls():
    before = {st.name for st in services.status(_wanted()) if st.up}
    u = services.start(_wanted())
    topics_before = _topics(u.kafka)
    yield u
    new = _topics(u.kafka) - topics_before
    _delete_topics(u.kafka, {t for t in new if any(m in t for m in _MADE)})  # what this session's tests created
    started = _wanted() - before
    if started and os.environ.get("APPLIER_KEEP_SERVICES") != "1":
        services.stop(started)


@pytest.fixture(scope="session")
def spark(urls, tmp_path_factory):
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # pyspark starts its Python workers with $PYSPARK_PYTHON (else "python3" from PATH): this venv's interpreter
    os.environ["PYSPARK_PYTHON"] = sys.executable
    jars = services.spark_kafka_jars()
    s = (SparkSession.builder.appName("applier-tests").master("local[2]")
         .config("spark.jars", ",".join(jars))
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
         .config("spark.pyspark.python", sys.executable)  # workers decode (applier.decode) with this venv
         .getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def registry(urls):
    """A RegistryClient on the local Apicurio registry (started here when not running; stopped at the end if
    it was started here)."""
    from applier.codecs.registry import RegistryClient

    was_up = services.status({"registry"})[0].up
    u = services.start({"registry"})
    yield RegistryClient(u.registry_url, timeout=10, retries=3)
    if not was_up and os.environ.get("APPLIER_KEEP_SERVICES") != "1":
        services.stop({"registry"})


@pytest.fixture(scope="session")
def tidb(urls):
    """A real TiDB: ``tidb-server`` on its embedded store, with Dumpling (applier/devtools/services/tidb.py). Built
    from TiDB's Go module when its binaries are missing (many minutes on a cold machine: .ci/run builds it before
    the tests), started here when not running and stopped at the end if started here. A build or start that fails
    fails every test that uses it, with the reason; nothing is skipped."""
    from applier.devtools.services import tidb as T
    from tests.e2e.tidb_feed import TiDB

    was_up = services.status({"tidb"})[0].up
    services.start({"tidb"})
    yield TiDB(url=T.tidb_url(), dumpling=T.resolve()["dumpling"])
    if not was_up and os.environ.get("APPLIER_KEEP_SERVICES") != "1":
        services.stop({"tidb"})


@pytest.fixture
def tidb_database(tidb):
    """Names of TiDB databases the test makes (``append``), dropped at the end."""
    made: list[str] = []
    yield made.append
    from tests.e2e.tidb_feed import connect

    conn = connect(tidb.url)
    try:
        with conn.cursor() as cur:
            for name in made:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        conn.commit()
    finally:
        conn.close()


@pytest.fixture
def unique() -> str:
    token = uuid.uuid4().hex[:8]
    made_topic(token)
    return token


@pytest.fixture
def drop_schema(urls):
    made: list[tuple[str, str]] = []
    yield made.append
    for target, schema in made:
        eng = create_engine(target_url(urls, target))
        with eng.begin() as c:
            if target == "mariadb":
                c.execute(text(f"DROP DATABASE IF EXISTS `{schema}`"))
            else:
                c.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        eng.dispose()




@pytest.fixture(params=["mariadb", "postgres"])
def fresh_engine(request, urls, unique, drop_schema):
    """An engine on an empty database (MariaDB) or schema (PostgreSQL) of its own: the applier's tables migrated
    there are the test's alone (the shared database's revision stays as it is)."""
    name = f"fresh_{unique}"
    admin = create_engine(target_url(urls, request.param))
    with admin.begin() as c:
        c.execute(text(f"CREATE DATABASE `{name}`" if request.param == "mariadb" else f'CREATE SCHEMA "{name}"'))
    admin.dispose()
    drop_schema((request.param, name))
    if request.param == "mariadb":
        engine = create_engine(make_url(urls.mariadb_url).set(database=name))
    else:
        engine = create_engine(urls.pg_url, connect_args={"options": f"-csearch_path={name}"})
    yield engine
    engine.dispose()
