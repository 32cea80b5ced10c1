"""The Debezium JDBC sink on Kafka Connect standalone: the peer the bench races on TiCDC's Debezium protocol.

Facts (``../shared/docs/peers.md``, measured on this machine kind):

* **Jars**: Kafka Connect (``org.apache.kafka:connect-runtime`` and ``connect-json`` :data:`CONNECT_VERSION`, which
  run against the local Kafka 4.x broker), ``io.debezium:debezium-connector-jdbc`` :data:`DEBEZIUM_VERSION`
  (3.6.1.Final is not served, 3.6.0.Final does not resolve: its ``hibernate-agroal`` 7.2.6.Final is missing), the
  JDBC drivers (MariaDB Connector/J :data:`MARIADB_DRIVER_VERSION`, PostgreSQL :data:`POSTGRES_DRIVER_VERSION`) and,
  for streams with TiCDC's TiDB extension, ``debezium-scripting`` with Groovy :data:`GROOVY_VERSION` (the filter
  that drops the ``op: "m"`` watermarks). One ``mvn dependency:copy-dependencies`` of a small POM into
  ``$APPLIER_HOME/jars/debezium-jdbc-<versions>/``, with the applier's own resolver (:func:`applier.jars.resolve`:
  pinned maven-dependency-plugin, atomic cache folder, a marker file that makes later calls free, Maven's error
  tail in the exception). The folder is the JVM's classpath (``java -cp <folder>/*``): no plugin path.
* **Worker** (:func:`worker_properties`): JsonConverter for key and value with ``schemas.enable=true`` (TiCDC's
  Debezium JSON carries the Connect schema envelope), a file offset store in the run's private folder,
  ``offset.flush.interval.ms=1000`` (so "caught up" is: the sink's consumer group committed every partition up to
  its last row change, at most a second after it wrote it; :func:`sink_ends` says why not always the end offset), ``connector.client.config.override.policy=All`` (for
  ``consumer.override.max.poll.records``), the REST listener on a free loopback port (the run reads the task states
  there: a FAILED task ends the run with its trace), and the target password from an environment variable through
  Kafka's ``EnvVarConfigProvider`` (no file holds it).
* **Connector** (:func:`connector_config`): ``JdbcSinkConnector``, ``insert.mode=upsert``, ``delete.enabled``,
  ``primary.key.mode=record_key``, ``schema.evolution=basic`` (it creates the tables from the record schemas),
  ``collection.name.format`` qualified with the target database/schema (unqualified, MariaDB's existence check
  finds a same-named table in another database and the task fails), ``database.time_zone=UTC``,
  ``tasks.max`` = the topic's partitions, ``batch.size`` 2000 with ``consumer.override.max.poll.records`` 2000
  (its best measured setting). What TiCDC's streams need before the sink gets through them: TiCDC's DDL messages
  fail the task, so ``SchemaChangeEventFilter`` drops them; with the TiDB extension the ``op: "m"`` watermarks
  fail it too, so a Groovy ``Filter`` keeps only ``c``/``u``/``d``/``r`` records; TIME and BIT columns fail it
  unless listed in ``field.exclude.list`` (:func:`excluded_fields`).

Tooling: the product never imports this module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from applier.devtools.services.kafka import LOG4J_VERSION  # the broker's log4j2: one version in the jar cache
from applier.jars import jars_home, resolve

CONNECT_VERSION = "4.1.1"
DEBEZIUM_VERSION = "3.5.0.Final"
MARIADB_DRIVER_VERSION = "3.5.7"
POSTGRES_DRIVER_VERSION = "42.7.8"
GROOVY_VERSION = "4.0.27"
#: the sink's best measured setting (peers.md): JDBC batch and the consumer's poll size
BATCH_SIZE = 2000
CONNECTOR_CLASS = "io.debezium.connector.jdbc.JdbcSinkConnector"
MAIN_CLASS = "org.apache.kafka.connect.cli.ConnectStandalone"
#: what connect-standalone.sh gives the JVM (KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS)
JVM_OPTIONS = ("-Xms256m", "-Xmx2g", "-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
               "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
               "-Djava.awt.headless=true")
#: the environment variable the worker reads the target password from (EnvVarConfigProvider)
PASSWORD_ENV = "APPLIER_PEER_TARGET_PASSWORD"
#: TiCDC's DDL messages, all of them (the sink fails on any)
SCHEMA_CHANGE_TYPES = "DATABASE,CREATE,ALTER,DROP,TRUNCATE"
#: MySQL column types the sink fails on unless excluded (peers.md)
UNCARRIED_TYPES = frozenset({"time", "bit"})


# ---------------------------------------------------------------------------------------------------------
# The jars (pure parts unit-tested; resolution by applier.jars.resolve)
# ---------------------------------------------------------------------------------------------------------

def dependencies() -> list[tuple[str, str, str]]:
    """(group, artifact, version) of everything the sink's JVM needs; Maven adds their runtime dependencies."""
    return [
        ("org.apache.kafka", "connect-runtime", CONNECT_VERSION),
        ("org.apache.kafka", "connect-json", CONNECT_VERSION),
        ("io.debezium", "debezium-connector-jdbc", DEBEZIUM_VERSION),
        ("org.mariadb.jdbc", "mariadb-java-client", MARIADB_DRIVER_VERSION),
        ("org.postgresql", "postgresql", POSTGRES_DRIVER_VERSION),
        # Kafka 4.x logs through slf4j 1.7; nothing in the tree binds it to a backend
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        # the watermark filter's language (debezium-scripting itself: scripting_jar())
        ("org.apache.groovy", "groovy", GROOVY_VERSION),
        ("org.apache.groovy", "groovy-jsr223", GROOVY_VERSION),
    ]


def jars_folder() -> Path:
    """The cache folder of the resolved jars, named by every pinned version (a version change resolves anew)."""
    return jars_home() / (f"debezium-jdbc-{DEBEZIUM_VERSION}-connect-{CONNECT_VERSION}-mariadb-{MARIADB_DRIVER_VERSION}"
                          f"-pg-{POSTGRES_DRIVER_VERSION}-groovy-{GROOVY_VERSION}")


def sink_pom() -> str:
    """The POM :func:`sink_jars` hands to Maven (what ``resolve`` writes, for the tests and for reading)."""
    from applier.jars import render_pom
    return render_pom(jars_folder().name, dependencies())


def sink_jars() -> list[str]:
    """Absolute paths of the sink's classpath, resolved from Maven Central once and cached."""
    from applier.devtools.services.common import MAVEN_PACKAGE, ensure_command

    ensure_command("mvn", MAVEN_PACKAGE, "Maven resolves Kafka Connect and the Debezium JDBC sink from Maven Central")
    return resolve(jars_folder(), f"the Debezium JDBC sink {DEBEZIUM_VERSION} on Kafka Connect {CONNECT_VERSION}",
                   [("exact", dependencies(), [], "")], lambda g, a, v: True)


def resolution_facts() -> dict[str, Any]:
    """What the cache's marker says about the resolution (when, how long Maven took) and the folder's size."""
    folder = jars_folder()
    try:
        marker = json.loads((folder / ".complete.json").read_text())
    except (OSError, ValueError):
        return {}
    size = sum(p.stat().st_size for p in folder.glob("*.jar"))
    return {"folder": str(folder), "jars": len(marker.get("jars", [])), "bytes": size,
            "maven_seconds": marker.get("seconds"), "resolved_at": marker.get("at")}


SCRIPTING_ARTIFACT = "debezium-scripting"


def scripting_folder() -> Path:
    return jars_home() / f"{SCRIPTING_ARTIFACT}-{DEBEZIUM_VERSION}"


def scripting_jar() -> str:
    """``io.debezium:debezium-scripting`` (the ``Filter`` transform), fetched once into its own cache folder.

    Why not with the other jars: its parent POM (``debezium-scripting-parent``) is missing from the Maven registry
    reachable here, so Maven cannot read its descriptor and ``copy-dependencies`` refuses the whole POM. The jar
    itself is there: ``wagon-maven-plugin`` ``download-single`` (no POM needed, as for Apicurio Registry in
    :mod:`applier.devtools.services.registry`) fetches it and its published ``.sha1``, which must match. Its own
    dependencies (debezium-connector-common, debezium-connect-plugins) and Groovy are in :func:`sink_jars`."""
    from applier.devtools.services.common import MAVEN_PACKAGE, ensure_command
    from applier.devtools.services.registry import MAVEN_CENTRAL, mvn_wagon_command
    from applier.jars import JarsError, locked, tail

    import hashlib
    import shutil

    folder = scripting_folder()
    name = f"{SCRIPTING_ARTIFACT}-{DEBEZIUM_VERSION}.jar"
    if (folder / name).is_file():
        return str(folder / name)
    ensure_command("mvn", MAVEN_PACKAGE, "Maven fetches debezium-scripting from Maven Central")
    with locked(folder.parent / f".{folder.name}.lock"):
        if (folder / name).is_file():
            return str(folder / name)
        tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            repo = os.environ.get("APPLIER_MAVEN_REPOSITORY", MAVEN_CENTRAL).rstrip("/")
            remote = f"io/debezium/{SCRIPTING_ARTIFACT}/{DEBEZIUM_VERSION}/{name}"
            outputs = []
            for suffix in ("", ".sha1"):
                r = subprocess.run(mvn_wagon_command(repo, remote + suffix, tmp / (name + suffix)), cwd=tmp,
                                   capture_output=True, text=True, stdin=subprocess.DEVNULL)
                outputs.append(r.stdout + r.stderr)
            if not (tmp / name).is_file() or not (tmp / f"{name}.sha1").is_file():
                raise JarsError(f"Maven could not fetch {remote} from {repo}:\n{tail(''.join(outputs))}")
            published = (tmp / f"{name}.sha1").read_text().split()[0].lower()
            with open(tmp / name, "rb") as fh:
                got = hashlib.file_digest(fh, "sha1").hexdigest()
            if got != published:
                raise JarsError(f"{name}: SHA-1 {got} is not the published {published}; not using it")
            (tmp / f"{name}.sha1").unlink()
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return str(folder / name)


def classpath(*, tidb_extension: bool = False) -> str:
    """``java -cp`` for the sink: the resolved folder, plus debezium-scripting for the watermark filter."""
    jars = sink_jars()
    parts = [str(Path(jars[0]).parent / "*")]
    if tidb_extension:
        parts.append(scripting_jar())
    return os.pathsep.join(parts)


# ---------------------------------------------------------------------------------------------------------
# Configuration (pure, unit-tested)
# ---------------------------------------------------------------------------------------------------------

def worker_properties(*, bootstrap: str, offsets_file: Path | str, rest_port: int) -> str:
    """The standalone worker's properties. The sink's consumer group is Connect's ``connect-<connector name>``, so
    a connector name of its own per run (:func:`connector_name`) gives every run a fresh group that reads the topic
    from the beginning (sink consumers start at ``earliest``)."""
    return f"""\
# Kafka Connect standalone worker for the Debezium JDBC sink (written by applier.devtools.peers.debezium_jdbc)
bootstrap.servers={bootstrap}
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
offset.storage.file.filename={offsets_file}
offset.flush.interval.ms=1000
connector.client.config.override.policy=All
listeners=http://127.0.0.1:{rest_port}
plugin.discovery=service_load
config.providers=env
config.providers.env.class=org.apache.kafka.common.config.provider.EnvVarConfigProvider
"""


LOG4J2 = """\
# log4j2 configuration of the Debezium JDBC sink's worker (written by applier.devtools.peers.debezium_jdbc)
status = warn
name = applier-peer-connect
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:applier.peer.log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = file
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
"""


def connector_name(run_id: str) -> str:
    return "applier-peer-" + re.sub(r"[^A-Za-z0-9_-]+", "-", run_id).strip("-")


def consumer_group(name: str) -> str:
    """The consumer group Kafka Connect gives a sink connector named ``name``."""
    return f"connect-{name}"


def jdbc_url(sqlalchemy_url: str, schema: str) -> tuple[str, str | None, str | None]:
    """(JDBC URL, user, password) for the sink from the applier's SQLAlchemy URL of the same target. MariaDB/MySQL:
    the connection opens the run's database; PostgreSQL: the URL's database (the run's schema is in the table
    names, :func:`collection_name_format`)."""
    from sqlalchemy.engine import make_url

    u = make_url(sqlalchemy_url)
    backend = u.get_backend_name()
    host, port = u.host or "127.0.0.1", u.port
    if backend in ("mysql", "mariadb"):
        return f"jdbc:mariadb://{host}:{port or 3306}/{schema}", u.username, u.password
    if backend == "postgresql":
        return f"jdbc:postgresql://{host}:{port or 5432}/{u.database or ''}", u.username, u.password
    raise ValueError(f"the Debezium JDBC sink bench supports MariaDB/MySQL and PostgreSQL, not {backend!r}")


def collection_name_format(schema: str) -> str:
    """The target table of a record: ``<schema>.<source table>``, qualified (peers.md: unqualified, MariaDB's
    existence check finds a same-named table in another database and the task fails)."""
    return f"{schema}.${{source.table}}"


def excluded_fields(topic: str, column_types: Mapping[str, str]) -> list[str]:
    """``field.exclude.list`` entries (``<topic>:<column>``) for the columns the sink fails on: TIME and BIT. The
    sink matches a field by topic and name, not by table, so a name is excluded in every table of the topic.
    ``column_types``: column name -> MySQL type ("time(3)", "bit(8)", "int unsigned", ...)."""
    out = []
    for name, mysql_type in column_types.items():
        base = re.split(r"[\s(]", mysql_type.strip().lower(), maxsplit=1)[0]
        if base in UNCARRIED_TYPES:
            out.append(f"{topic}:{name}")
    return sorted(set(out))


def connector_config(*, name: str, topic: str, partitions: int, jdbc: str, user: str | None, schema: str,
                     exclude: Sequence[str] = (), tidb_extension: bool = False,
                     batch_size: int = BATCH_SIZE, extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The connector's JSON (``{"name", "config"}``) for ``ConnectStandalone``. The password is not in it: the
    worker's ``env`` config provider reads :data:`PASSWORD_ENV`."""
    if partitions < 1:
        raise ValueError("partitions must be >= 1")
    cfg: dict[str, str] = {
        "connector.class": CONNECTOR_CLASS,
        "tasks.max": str(partitions),
        "topics": topic,
        "connection.url": jdbc,
        "insert.mode": "upsert",
        "delete.enabled": "true",
        "primary.key.mode": "record_key",
        "schema.evolution": "basic",
        "collection.name.format": collection_name_format(schema),
        "database.time_zone": "UTC",
        "batch.size": str(batch_size),
        "consumer.override.max.poll.records": str(batch_size),
    }
    if user is not None:
        cfg["connection.username"] = user
    cfg["connection.password"] = f"${{env:{PASSWORD_ENV}}}"
    transforms = ["dropSchemaChanges"]
    cfg["transforms.dropSchemaChanges.type"] = "io.debezium.transforms.SchemaChangeEventFilter"
    cfg["transforms.dropSchemaChanges.schema.change.event.exclude.list"] = SCHEMA_CHANGE_TYPES
    if tidb_extension:  # op "m": TiCDC's watermarks, broadcast to every partition
        transforms.append("dropWatermarks")
        cfg["transforms.dropWatermarks.type"] = "io.debezium.transforms.Filter"
        cfg["transforms.dropWatermarks.language"] = "jsr223.groovy"
        cfg["transforms.dropWatermarks.condition"] = "value.op != 'm'"  # kept when true
    cfg["transforms"] = ",".join(transforms)
    if exclude:
        cfg["field.exclude.list"] = ",".join(exclude)
    cfg.update(extra or {})
    return {"name": name, "config": cfg}


# ---------------------------------------------------------------------------------------------------------
# Caught up, failed tasks (pure, unit-tested)
# ---------------------------------------------------------------------------------------------------------

def lag(committed: Mapping[int, int | None], ends: Mapping[int, tuple[int, int]]) -> int:
    """Messages the group has not committed yet. ``ends``: partition -> (first offset, end offset) of the topic;
    ``committed``: partition -> the group's committed offset (None or negative: nothing committed, i.e. it starts
    at the first offset). An empty partition has nothing to commit and counts as caught up."""
    total = 0
    for p, (low, high) in ends.items():
        c = committed.get(p)
        at = low if c is None or c < 0 else max(c, low)
        total += max(0, high - at)
    return total


def caught_up(committed: Mapping[int, int | None], ends: Mapping[int, tuple[int, int]]) -> bool:
    return lag(committed, ends) == 0


def reaches_sink(value: bytes | None) -> bool:
    """Whether a record of TiCDC's Debezium topic reaches the sink's task: a row change does; a DDL message
    (``tableChanges``) and an ``op: "m"`` watermark are dropped by the connector's transforms first.

    Why it matters: Kafka Connect commits what the task's ``preCommit`` returns, and the JDBC sink returns the
    offsets of the records it wrote, so a partition that ends with dropped records is never committed up to its
    end offset; caught up is the offset after its last row change (:func:`sink_ends`)."""
    if not value:
        return True  # a tombstone goes to the task (TiCDC writes none)
    try:
        doc = json.loads(value)
    except ValueError:
        return True  # the converter fails on it, and the task with it: reported as a failure
    payload = doc.get("payload", doc) if isinstance(doc, dict) else None
    if not isinstance(payload, dict):
        return True
    return "tableChanges" not in payload and payload.get("op") != "m"


def sink_ends(ends: Mapping[int, tuple[int, int]],
              read: Callable[[int, int, int], list[tuple[int, bytes | None]]], window: int = 64
              ) -> dict[int, tuple[int, int]]:
    """partition -> (first offset, the offset after its last record that reaches the sink; the first offset when
    none does). ``read(partition, start, stop)`` returns (offset, value) of the records in [start, stop); the tail
    of each partition is read backwards in growing windows until a row change is found."""
    out = {}
    for p, (low, high) in ends.items():
        target, stop, size = low, high, window
        while stop > low:
            start = max(low, stop - size)
            reaching = [off for off, value in read(p, start, stop) if reaches_sink(value)]
            if reaching:
                target = max(reaching) + 1
                break
            stop, size = start, size * 4
        out[p] = (low, target)
    return out


def failures(status: Mapping[str, Any] | None) -> list[str]:
    """The errors in a ``GET /connectors/<name>/status`` answer: the connector's and each FAILED task's trace
    (the first line and every ``Caused by:``, which name the cause without the stack)."""
    if not status:
        return []
    out = []
    items = [("connector", status.get("connector") or {})]
    items += [(f"task {t.get('id')}", t) for t in status.get("tasks") or []]
    for what, st in items:
        if st.get("state") == "FAILED":
            out.append(f"{what} FAILED: {short_trace(st.get('trace') or '(no trace)')}")
    return out


def short_trace(trace: str, limit: int = 3000) -> str:
    lines = trace.strip().splitlines()
    keep = lines[:1] + [ln.strip() for ln in lines[1:] if ln.strip().startswith("Caused by:")]
    return "\n".join(keep)[:limit]


# ---------------------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------------------

class PeerError(RuntimeError):
    """The sink failed (a task's error, an early exit) or did not catch up in time; the message says why. ``pid``:
    the JVM's, stopped by the time the error reaches the caller."""

    pid: int | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def topic_offsets(bootstrap: str, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (first offset, end offset) of ``topic`` now."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    parts = admin.list_topics(topic, timeout=30).topics[topic].partitions
    out: dict[int, list[int]] = {p: [0, 0] for p in parts}
    for i, spec in ((0, OffsetSpec.earliest()), (1, OffsetSpec.latest())):
        futures = admin.list_offsets({TopicPartition(topic, p): spec for p in parts}, request_timeout=30)
        for tp, fut in futures.items():
            out[tp.partition][i] = fut.result().offset
    return {p: (lo, hi) for p, (lo, hi) in out.items()}


def read_range(bootstrap: str, topic: str) -> Callable[[int, int, int], list[tuple[int, bytes | None]]]:
    """A ``read(partition, start, stop)`` for :func:`sink_ends` on the broker (a consumer of no group)."""
    from confluent_kafka import Consumer, TopicPartition

    def read(partition: int, start: int, stop: int) -> list[tuple[int, bytes | None]]:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "applier-peer-tail", "enable.auto.commit": False})
        out: list[tuple[int, bytes | None]] = []
        try:
            c.assign([TopicPartition(topic, partition, start)])
            deadline = time.monotonic() + 60
            while (not out or out[-1][0] < stop - 1) and time.monotonic() < deadline:
                for m in c.consume(num_messages=1000, timeout=1.0):
                    if m.error():
                        raise PeerError(f"reading {topic} [{partition}]: {m.error()}")
                    if m.offset() < stop:
                        out.append((m.offset(), m.value()))
        finally:
            c.close()
        if not out or out[-1][0] < stop - 1:
            raise PeerError(f"could not read {topic} [{partition}] offsets {start}..{stop - 1} in 60 s")
        return out

    return read


def committed_offsets(admin, group: str, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
    """partition -> the group's committed offset (None: nothing committed)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    req = [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in partitions])]
    res = admin.list_consumer_group_offsets(req, request_timeout=10)[group].result()
    return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in res.topic_partitions}


def connector_status(rest_port: int, name: str, timeout: float = 2.0) -> dict[str, Any] | None:
    """The connector's status from the worker's REST API; None while the worker or the connector is not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{rest_port}/connectors/{name}/status", timeout=timeout) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _log_tail(path: Path, n: int = 25) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    wanted = [ln for ln in lines if " ERROR " in ln or "Exception" in ln or "Caused by" in ln]
    return "\n".join((wanted or lines)[-n:])


@dataclass
class SinkRun:
    """One run of the sink from a fresh process to caught up (see :func:`run_sink`)."""

    seconds: float  # process start to the first time every partition was committed up to its last row change
    rest_seconds: float | None  # process start to the connector's tasks all RUNNING (start-up)
    first_commit_seconds: float | None  # process start to the first offset committed by the group
    stop_seconds: float  # SIGTERM to exit (not in ``seconds``)
    messages: int
    pid: int  # of the JVM, gone when run_sink returns
    config: dict[str, Any] = field(default_factory=dict)


def stop_process(proc: subprocess.Popen, timeout: float = 30.0) -> float:
    """SIGTERM to the process group (a clean Connect shutdown), SIGKILL after ``timeout`` s; returns the seconds it
    took. Raises PeerError if anything of the group is still there afterwards."""
    t = time.perf_counter()
    pgid = proc.pid  # started with start_new_session: its own process group
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 30.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(pgid, signal.SIGKILL)  # anything the JVM left in its group
    except ProcessLookupError:
        pass
    if proc.poll() is None:
        raise PeerError(f"the Debezium JDBC sink (pid {proc.pid}) did not exit after SIGTERM and SIGKILL")
    return time.perf_counter() - t


def run_sink(*, bootstrap: str, topic: str, target_url: str, schema: str, run_id: str,
             column_types: Mapping[str, str] | None = None, tidb_extension: bool = False,
             timeout: float = 1800.0, poll: float = 0.25, extra: Mapping[str, str] | None = None,
             log: Callable[[str], None] = lambda m: None) -> SinkRun:
    """Start Kafka Connect standalone with the sink on ``topic`` (``tasks.max`` = its partitions) into ``schema``
    of the target (which must exist), wait until its consumer group has committed, on every partition, the offset
    after the last record that reaches the task (:func:`sink_ends`: the end offset unless the partition ends with
    DDL messages or watermarks, which the transforms drop), stop it, and time it from the process start. The target password reaches the worker through the environment
    only. A FAILED connector or task, or an early exit, ends the run at once with the error (PeerError); so does
    ``timeout``. The process is always stopped (SIGTERM, then SIGKILL) before this returns or raises."""
    import shutil
    from confluent_kafka.admin import AdminClient

    from applier.devtools.services.common import JAVA_PACKAGE, ensure_command

    java = ensure_command("java", JAVA_PACKAGE, "Kafka Connect needs Java 17+")
    cp = classpath(tidb_extension=tidb_extension)  # resolved before the clock starts
    offsets = topic_offsets(bootstrap, topic)
    messages = sum(hi - lo for lo, hi in offsets.values())
    ends = sink_ends(offsets, read_range(bootstrap, topic))  # read before the clock starts
    name = connector_name(run_id)
    group = consumer_group(name)
    jdbc, user, password = jdbc_url(target_url, schema)
    exclude = excluded_fields(topic, column_types or {})
    conn = connector_config(name=name, topic=topic, partitions=len(ends), jdbc=jdbc, user=user, schema=schema,
                            exclude=exclude, tidb_extension=tidb_extension, extra=extra)
    tmp = Path(tempfile.mkdtemp(prefix="applier-peer-"))  # mode 0700
    port = free_port()
    (tmp / "worker.properties").write_text(worker_properties(bootstrap=bootstrap, offsets_file=tmp / "connect.offsets",
                                                              rest_port=port))
    (tmp / "connector.json").write_text(json.dumps(conn, indent=2) + "\n")
    (tmp / "log4j2.properties").write_text(LOG4J2)
    logfile = tmp / "connect.log"
    argv = [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={tmp / 'log4j2.properties'}",
            f"-Dapplier.peer.log={logfile}", "-cp", cp, MAIN_CLASS, str(tmp / "worker.properties"),
            str(tmp / "connector.json")]
    env = {**os.environ, PASSWORD_ENV: password or ""}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    log(f"debezium-jdbc: ConnectStandalone, connector {name}, tasks.max {len(ends)}, batch.size "
        f"{conn['config']['batch.size']}, {messages:,} messages on {len(ends)} partitions")
    ok = False
    rest_at = first_at = None
    with open(tmp / "connect.out", "wb") as out:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                cwd=tmp, start_new_session=True, close_fds=True)
    try:
        next_status = 0.0
        while True:
            now = time.perf_counter()
            rc = proc.poll()
            if rc is not None:
                raise PeerError(f"Kafka Connect exited with {rc} before catching up:\n{_log_tail(logfile)}\n"
                                f"{_log_tail(tmp / 'connect.out', 10)}")
            try:
                committed = committed_offsets(admin, group, topic, ends)
            except Exception:  # the group does not exist yet, or the broker is slow to answer: ask again
                committed = {}
            if first_at is None and any(c is not None for c in committed.values()):
                first_at = now
            if caught_up(committed, ends):
                seconds = now - t0
                break
            if now >= next_status:
                next_status = now + 1.0
                status = connector_status(port, name)
                bad = failures(status)
                if bad:
                    raise PeerError("the Debezium JDBC sink failed:\n" + "\n".join(bad))
                if rest_at is None and status and status.get("tasks") and all(
                        t.get("state") == "RUNNING" for t in status["tasks"]):
                    rest_at = now
            if now - t0 > timeout:
                raise PeerError(f"the Debezium JDBC sink did not catch up in {timeout:.0f} s: "
                                f"{lag(committed, ends):,} of {messages:,} messages not committed\n{_log_tail(logfile)}")
            time.sleep(poll)
        ok = True
    except PeerError as exc:
        exc.pid = proc.pid
        raise
    finally:
        stopped = stop_process(proc)
        if not ok:
            keep = _keep_log(logfile, name)
            if keep:
                log(f"debezium-jdbc: the worker's log is kept in {keep}")
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"  caught up after {seconds:.1f} s (tasks running after {_secs(rest_at, t0)}, first commit after "
        f"{_secs(first_at, t0)}); stopped in {stopped:.1f} s")
    return SinkRun(seconds=seconds, rest_seconds=None if rest_at is None else rest_at - t0,
                   first_commit_seconds=None if first_at is None else first_at - t0, stop_seconds=stopped,
                   messages=messages, pid=proc.pid, config=conn["config"])


def _secs(at: float | None, t0: float) -> str:
    return "n/a" if at is None else f"{at - t0:.1f} s"


def _keep_log(logfile: Path, name: str) -> Path | None:
    from applier.devtools.services.common import home_dir

    if not logfile.is_file():
        return None
    dest = home_dir("logs", "peers") / f"{name}.log"
    try:
        dest.write_bytes(logfile.read_bytes())
    except OSError:
        return None
    return dest
