"""End-to-end fixtures: the real local services and one shared Spark session.

Services come from ``python -m applier.services`` (Kafka 4.3 in KRaft mode from Maven Central, MariaDB and
PostgreSQL from Debian). What this session starts, it stops at the end; services that were already running
(for example started by .ci/run) are left running for their owner to stop.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from applier import services


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


# Name parts of the topics this session made: every test topic carries its `unique` token (or is registered by
# name). Only those are deleted at the end: another pytest session on the same broker keeps its topics.
_MADE: set[str] = set()


def made_topic(name_or_token: str) -> None:
    """Register a topic (or a token in its name) this session created, for deletion at the end."""
    _MADE.add(name_or_token)


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


@pytest.fixture
def unique() -> str:
    token = uuid.uuid4().hex[:8]
    made_topic(token)
    return token


def target_url(urls, target: str) -> str:
    return urls.mariadb_url if target == "mariadb" else urls.pg_url


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


def config(urls, target: str, protocol: str, topic: str, schema: str, ckpt: Path, **pipeline) -> dict:
    return {
        "pipeline": {"name": f"p-{topic}", "checkpoint_dir": str(ckpt), **pipeline},
        "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": protocol},
        "target": {"url": target_url(urls, target)},
        "route": [{"match": "shop.*", "schema": schema}, {"match": "shop.audit_*", "ignore": True}],
    }


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def write_toml(path: Path, cfg: dict) -> Path:
    """A config dict (as :func:`config` builds it) as a TOML file, for tests that run the ``applier`` CLI."""
    out: list[str] = []

    def table(name: str, data: dict) -> None:
        out.append(f"[{name}]")
        subs = []
        for k, v in data.items():
            if isinstance(v, dict):
                subs.append((k, v))
            else:
                out.append(f"{json.dumps(k)} = {_toml_value(v)}")
        for k, v in subs:
            table(f"{name}.{k}", v)

    for section, data in cfg.items():
        if isinstance(data, list):
            for item in data:
                out.append(f"[[{section}]]")
                out.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in item.items())
        else:
            table(section, data)
    path.write_text("\n".join(out) + "\n")
    return path
