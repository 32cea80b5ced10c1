"""A single-node Kafka (KRaft, combined broker + controller) on 127.0.0.1.

Classpath: the Maven-resolved ``kafka_2.13`` jars (see jars.py), run with ``java -cp <jars>/*``.
Layout under ``$APPLIER_HOME``: ``kafka/server.properties`` and ``kafka/log4j2.properties`` (rewritten
at every start), ``kafka/data/p<port>/`` (log + metadata dir, formatted once with StorageTool; one per
client port because the standalone format records the controller endpoint in the bootstrap
metadata), ``logs/kafka.out`` (JVM stdout/stderr), ``logs/kafka-server.log`` (log4j2),
``run/kafka.pid``.

Settings worth knowing for tests: ``num.partitions=3``, ``auto.create.topics.enable=false`` (tests
create their topics explicitly), replication factor and min ISR 1 for the internal topics,
``group.initial.rebalance.delay.ms=0``, heap ``-Xmx1g``.

``Broker(port, home)`` is a second, private broker on another port with everything under ``home``, started and
stopped by its owner: for a test that stops a broker (tests/e2e/test_kafka_outage.py) while others use this one.
``Broker(port, home, security=SaslSsl(...))`` makes it a secured one: its client listener speaks SASL_SSL with
SCRAM-SHA-512 users created when its storage is formatted, and a PEM certificate (tests/e2e/test_secure.py).
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from applier.jars import SCALA_SUFFIX, jars_home, resolve
from applier.devtools.services.common import (
    HOST,
    JAVA_PACKAGE,
    _CHILDREN,
    ServicesError,
    ServiceStatus,
    await_ready,
    ensure_command,
    home_dir,
    kafka_controller_port,
    log_path,
    managed_pid,
    managed_status,
    port,
    port_open,
    spawn,
    stop_managed,
    wait_until,
)

NAME = "kafka"
READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
HEAP = "1g"

LOG4J2 = """\
# log4j2 configuration of the local test broker (written by applier.devtools.services.kafka)
status = warn
name = applier-kafka
property.dir = ${sys:kafka.logs.dir}

appender.server.type = RollingFile
appender.server.name = server
appender.server.fileName = ${dir}/kafka-server.log
appender.server.filePattern = ${dir}/kafka-server.log.%i
appender.server.layout.type = PatternLayout
appender.server.layout.pattern = [%d] %p %m (%c)%n
appender.server.policies.type = Policies
appender.server.policies.size.type = SizeBasedTriggeringPolicy
appender.server.policies.size.size = 50MB
appender.server.strategy.type = DefaultRolloverStrategy
appender.server.strategy.max = 3

rootLogger.level = INFO
rootLogger.appenderRef.server.ref = server

logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.authorizer.name = kafka.authorizer.logger
logger.authorizer.level = WARN
"""


def kafka_dir() -> Path:
    return home_dir("kafka")


def data_dir(client_port: int | None = None) -> Path:
    return kafka_dir() / "data" / f"p{client_port or port(NAME)}"


@dataclass(frozen=True)
class SaslSsl:
    """A broker's secured client listener: SASL_SSL with SCRAM-SHA-512.

    ``keystore``: PEM file with the broker's private key and certificate chain (``ssl.keystore.type=PEM``);
    ``ca``: the PEM CA the broker trusts when it connects to itself (inter-broker, as ``admin``);
    ``users``: SCRAM-SHA-512 user -> password, created when the storage is formatted (``--add-scram``), and
    ``admin`` among them; ``other_keystore``: a second SASL_SSL listener (``OTHERHOST``, on ``other_port``) whose
    certificate is made for another host name, for the tests of a certificate that does not name the host."""

    keystore: Path
    ca: Path
    users: Mapping[str, str] = field(default_factory=dict)
    admin: str = "admin"
    other_keystore: Path | None = None
    other_port: int | None = None

    def scram_args(self) -> list[str]:
        """StorageTool's --add-scram arguments (names and passwords of [A-Za-z0-9._-] only: its syntax has no
        escapes we rely on)."""
        out = []
        for name, password in self.users.items():
            for part in (name, password):
                if not part or not all(c.isalnum() or c in "._-" for c in part):
                    raise ServicesError(f"SCRAM user {name!r}: use letters, digits, '.', '_' and '-' only")
            out += ["--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]"]
        return out

    def client_config(self, user: str | None = None) -> dict[str, Any]:
        """librdkafka settings that log in as ``user`` (default: the admin) and trust ``ca``."""
        user = user or self.admin
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
                "sasl.password": self.users[user], "ssl.ca.location": str(self.ca)}


def _jaas(user: str | None = None, password: str | None = None) -> str:
    login = f' username="{user}" password="{password}"' if user else ""
    return f"org.apache.kafka.common.security.scram.ScramLoginModule required{login};"


def _security_properties(host: str, client_port: int, controller_port: int, sec: SaslSsl) -> str:
    listeners = [f"SASL_SSL://{host}:{client_port}"]
    protocols = ["CONTROLLER:PLAINTEXT", "SASL_SSL:SASL_SSL"]
    extra = []
    if sec.other_keystore is not None:
        other = sec.other_port or client_port + 2
        listeners.append(f"OTHERHOST://{host}:{other}")
        protocols.append("OTHERHOST:SASL_SSL")
        extra = [f"listener.name.otherhost.ssl.keystore.type=PEM",
                 f"listener.name.otherhost.ssl.keystore.location={sec.other_keystore}",
                 f"listener.name.otherhost.scram-sha-512.sasl.jaas.config={_jaas()}"]
    lines = [
        f"listeners={','.join(listeners)},CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners={','.join(listeners)}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=SASL_SSL",
        f"listener.security.protocol.map={','.join(protocols)}",
        "sasl.enabled.mechanisms=SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
        f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={_jaas(sec.admin, sec.users[sec.admin])}",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={sec.keystore}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={sec.ca}",
        "ssl.client.auth=none",
        *extra,
    ]
    return "\n".join(lines) + "\n"


def server_properties(client_port: int, controller_port: int, data: Path, host: str = HOST,
                      security: SaslSsl | None = None) -> str:
    """The broker's server.properties (pure: unit-tested)."""
    if security is None:
        listeners = f"""\
listeners=PLAINTEXT://{host}:{client_port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{client_port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
"""
    else:
        listeners = _security_properties(host, client_port, controller_port, security)
    return f"""\
# single-node KRaft broker+controller for tests (written by applier.devtools.services.kafka)
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers={host}:{controller_port}
{listeners}log.dirs={data}
metadata.log.dir={data}
num.partitions=3
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
delete.topic.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=168
num.network.threads=3
num.io.threads=8
"""


def _java() -> str:
    return ensure_command("java", JAVA_PACKAGE, "Kafka needs Java 17+")


def _jvm_opts(logs: Path, log4j: Path) -> list[str]:
    return [
        f"-Xmx{HEAP}",
        "-Xms256m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dkafka.logs.dir={logs}",
        f"-Dlog4j2.configurationFile={log4j}",
    ]


def _write_config() -> tuple[Path, Path, Path]:
    classpath = kafka_broker_classpath()
    data = data_dir()
    data.mkdir(parents=True, exist_ok=True)
    props = kafka_dir() / "server.properties"
    props.write_text(server_properties(port(NAME), kafka_controller_port(), data))
    log4j = kafka_dir() / "log4j2.properties"
    log4j.write_text(LOG4J2)
    return props, log4j, Path(classpath)


def _format_storage(props: Path, log4j: Path, classpath: Path, data: Path | None = None,
                    logs: Path | None = None, extra: list[str] | None = None) -> None:
    data = data or data_dir()
    if (data / "meta.properties").exists():
        return
    base = [_java(), *_jvm_opts(logs or log_path(""), log4j), "-cp", str(classpath), "kafka.tools.StorageTool"]
    r = subprocess.run([*base, "random-uuid"], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    cluster_id = r.stdout.strip().splitlines()[-1] if r.returncode == 0 and r.stdout.strip() else ""
    if not cluster_id:
        raise ServicesError(f"kafka StorageTool random-uuid failed:\n{r.stdout}{r.stderr}")
    r = subprocess.run(
        [*base, "format", "--standalone", "-t", cluster_id, "-c", str(props), *(extra or [])],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    if r.returncode != 0 or not (data / "meta.properties").exists():
        out = f"{r.stdout}{r.stderr}"
        for arg in extra or []:  # never echo a SCRAM password
            out = out.replace(arg, "--add-scram ***")
        raise ServicesError(f"kafka StorageTool format failed:\n{out}")


def metadata_ready(bootstrap: str, timeout: float = 3.0, conf: Mapping[str, Any] | None = None) -> bool:
    """True once the broker answers a metadata request and lists itself (``conf``: a client's login settings)."""
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:  # no client library: fall back to TCP
        host, _, p = bootstrap.rpartition(":")
        return port_open(int(p), host)
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout * 1000), "log_level": 3,
                         **(conf or {})})
    md = admin.list_topics(timeout=timeout)
    return bool(md.brokers)


def _marker() -> str:
    return str(kafka_dir() / "server.properties")


def start() -> None:
    p = port(NAME)
    bootstrap = f"{HOST}:{p}"
    pid = managed_pid(NAME, _marker())
    if pid is None and port_open(p):
        # someone else's broker (or another state home's): use it as it is
        wait_until(f"kafka at {bootstrap} (external)", lambda: metadata_ready(bootstrap), timeout=15)
        return
    if pid is None:
        if port_open(kafka_controller_port()):
            raise ServicesError(
                f"kafka: the controller port {kafka_controller_port()} is taken by another process; "
                "set APPLIER_KAFKA_CONTROLLER_PORT"
            )
        props, log4j, classpath = _write_config()
        _format_storage(props, log4j, classpath)
        argv = [
            _java(),
            *_jvm_opts(log_path(""), log4j),
            "-cp",
            str(classpath),
            "kafka.Kafka",
            str(props),
        ]
        pid = spawn(NAME, argv, "kafka.out", cwd=kafka_dir())
    await_ready(NAME, _marker(), pid, f"kafka at {bootstrap}", lambda: port_open(p) and metadata_ready(bootstrap), timeout=READY_TIMEOUT,
                logs=[log_path("kafka.out"), log_path("kafka-server.log")])


def stop() -> None:
    stop_managed(NAME, _marker(), STOP_TIMEOUT)


def status() -> ServiceStatus:
    return managed_status(NAME, _marker(), port(NAME), f"logs: {log_path('kafka-server.log')}")


def reset_data() -> None:
    """Delete the broker's data (only while stopped): the next start formats a fresh cluster."""
    if managed_pid(NAME, _marker()) is not None:
        raise ServicesError("kafka is running: stop it first")
    shutil.rmtree(data_dir(), ignore_errors=True)


class Broker:
    """A Kafka broker of its own, for a test that stops and starts a broker while something reads from it (never
    the shared one): KRaft on ``127.0.0.1:client_port`` (controller ``controller_port``, default client port + 1)
    with everything under ``home``: ``server.properties``, ``log4j2.properties``, ``data/`` (formatted at the first
    start, kept by ``stop()``, so a broker started again holds its topics and messages), ``logs/``. No pid file:
    the object that started the process stops it (``stop()``, or leaving a ``with`` block)::

        with Broker(29092, tmp_path / "kafka") as broker:   # started, ready
            ... broker.bootstrap ...
            broker.stop(); broker.start()                    # an outage
    """

    def __init__(self, client_port: int, home: Path, controller_port: int | None = None, *,
                 security: SaslSsl | None = None) -> None:
        self.port = client_port
        self.controller_port = controller_port or client_port + 1
        self.home = Path(home)
        self.security = security
        self._proc: subprocess.Popen | None = None

    def client_config(self, user: str | None = None) -> dict[str, Any]:
        """librdkafka settings for this broker: bootstrap servers, and a secured broker's login (``user``, default
        its admin) and trust."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        if self.security is not None:
            conf.update(self.security.client_config(user))
        return conf

    def _ports(self) -> list[int]:
        ports = [self.port, self.controller_port]
        if self.security is not None and self.security.other_keystore is not None:
            ports.append(self.security.other_port or self.port + 2)
        return ports

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        """Start the broker (formatting its data the first time) and wait until it answers metadata requests."""
        if self.running():
            return
        for p in self._ports():
            if port_open(p):
                raise ServicesError(f"kafka broker in {self.home}: port {p} is taken by another process")
        data = self.home / "data"
        for d in (data, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        classpath = Path(kafka_broker_classpath())
        props = self.home / "server.properties"
        props.touch(mode=0o600)  # a secured broker's holds its admin password
        props.write_text(server_properties(self.port, self.controller_port, data, security=self.security))
        log4j = self.home / "log4j2.properties"
        log4j.write_text(LOG4J2)
        _format_storage(props, log4j, classpath, data, self.logs,
                        self.security.scram_args() if self.security is not None else None)
        argv = [_java(), *_jvm_opts(self.logs, log4j), "-cp", str(classpath), "kafka.Kafka", str(props)]
        with open(self.logs / "kafka.out", "ab") as out:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          cwd=self.home, start_new_session=True, close_fds=True)
        proc = self._proc
        _CHILDREN[proc.pid] = proc  # pid_alive() (wait_until) reaps it through the Popen
        try:
            wait_until(f"kafka at {self.bootstrap} ({self.home})",
                       lambda: port_open(self.port) and metadata_ready(
                           self.bootstrap, conf={k: v for k, v in self.client_config().items()
                                                 if k != "bootstrap.servers"}),
                       timeout=timeout, pid=proc.pid, log=[self.logs / "kafka.out", self.logs / "kafka-server.log"])
        except ServicesError:
            self.stop(timeout=10)
            raise

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the broker (SIGTERM: a clean shutdown; SIGKILL after ``timeout`` s). Its data stay."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _CHILDREN.pop(proc.pid, None)
        if proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)

    def __enter__(self) -> "Broker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["Broker", "SaslSsl", "start", "stop", "status", "server_properties", "metadata_ready", "reset_data"]


KAFKA_VERSION = "4.3.0"
# The log4j2 version Kafka 4.3.0 itself depends on (log4j-api/log4j-core 2.25.4): keep them equal.
LOG4J_VERSION = "2.25.4"


def kafka_broker_jars() -> list[str]:
    """Absolute paths of the Kafka broker's classpath (kafka_2.13 + log4j2 slf4j binding)."""
    from applier.devtools.services.common import MAVEN_PACKAGE, ensure_command

    ensure_command("mvn", MAVEN_PACKAGE, "Maven resolves the Kafka jars from Maven Central")
    folder = jars_home() / f"kafka-{KAFKA_VERSION}"
    deps = [
        ("org.apache.kafka", f"kafka_{SCALA_SUFFIX}", KAFKA_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    ]
    return resolve(folder, f"the Kafka {KAFKA_VERSION} broker", [("exact", deps, [], "")], lambda g, a, v: True)


def kafka_broker_classpath() -> str:
    """``<jars>/*`` for ``java -cp`` (after resolving)."""
    jars = kafka_broker_jars()
    return str(Path(jars[0]).parent / "*")
