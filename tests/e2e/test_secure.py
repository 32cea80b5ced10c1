"""A secured Kafka and TLS targets (issue 27, points 2 and 3), on real services: a Kafka broker whose only client
listener is SASL_SSL (SCRAM-SHA-512 users created when its storage is formatted, a certificate from a CA these tests
make), and MariaDB and PostgreSQL that take TCP clients only over TLS. ``applier run`` (the command an operator runs,
real Spark) replicates through them with every secret from the environment or a file, and the metrics' consumer-lag
reader logs in with the same settings. A wrong password, an untrusted certificate and a certificate made for another
host, on either side, each stop the run within seconds with exit 5 (or 2), naming the setting and the fix, with no
Java trace and nothing applied. No secret appears in any output.

Everything here is private to this module: its own broker and databases on free ports with their state under a
temporary folder, started once and stopped at the end (the shared services are not used)."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import inspect, select, text

from applier import progress as P
from applier.devtools.certs import CA, java_truststore, make_ca
from applier.devtools.changefeed import Workload, generate, produce
from applier.devtools.services.kafka import Broker, SaslSsl
from applier.devtools.services.tls import OTHER_HOST, TlsMariaDB, TlsPostgres
from applier.devtools.verify import compare_tables
from applier.metrics import tso_seconds
from tests.e2e.helpers import REPO, write_toml

pytestmark = pytest.mark.e2e

APPLIER = str(Path(sys.executable).parent / "applier")  # the console script an operator runs
REFUSED_WITHIN = 25  # seconds from `applier run` to its exit when Kafka or the target refuses it (Python's start incl.)
JAVA_TRACE = re.compile(r"^\s+at [\w$.]+\(|Traceback \(most recent call last\)|Py4JJavaError", re.M)


def free_ports(n: int) -> int:
    """The first of ``n`` consecutive free ports on 127.0.0.1."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65535:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports")


@dataclass
class Secure:
    home: Path
    ca: CA
    other_ca: CA
    broker: Broker
    mariadb: TlsMariaDB
    postgres: TlsPostgres
    kafka_pw: str  # the applier's SCRAM password
    trust_pw: str  # the PKCS12 trust store's password
    db_pw: str  # the targets' password
    truststore: Path
    files: dict[str, Path]  # name -> secret file

    @property
    def secrets(self) -> list[str]:
        return [self.kafka_pw, self.trust_pw, self.db_pw, self.broker.security.users["admin"]]

    def admin(self) -> dict:
        return self.broker.client_config()


@pytest.fixture(scope="module")
def secure():
    home = Path(tempfile.mkdtemp(prefix="applier-secure-"))
    home.chmod(0o755)  # PostgreSQL runs as the postgres user when the tests run as root
    ca, other_ca = make_ca(home / "ca"), make_ca(home / "other-ca", "an unrelated CA")
    broker_cert = ca.issue(home / "kafka-cert", ["localhost", "127.0.0.1"])
    other_host = ca.issue(home / "kafka-other-cert", ["kafka.other.example"])  # the right CA, another host's name
    db_cert = ca.issue(home / "db-cert", ["localhost", "127.0.0.1"])
    kafka_pw, trust_pw, db_pw, admin_pw = (secrets.token_hex(12) for _ in range(4))
    files = {}
    for name, value in (("kafka", kafka_pw), ("trust", trust_pw), ("db", db_pw)):
        files[name] = home / "secrets" / name
        files[name].parent.mkdir(exist_ok=True)
        files[name].write_text(value + "\n")  # as a Kubernetes secret volume may hold it
        files[name].chmod(0o600)
    truststore = java_truststore(ca.cert_path, home / "truststore.p12", files["trust"])
    kport = free_ports(3)
    broker = Broker(kport, home / "kafka", security=SaslSsl(
        keystore=broker_cert.pem_path, ca=ca.cert_path, users={"admin": admin_pw, "applier": kafka_pw},
        other_keystore=other_host.pem_path, other_port=kport + 2))
    mariadb = TlsMariaDB(free_ports(1), home / "mariadb", db_cert, ca.cert_path, password=db_pw)
    postgres = TlsPostgres(free_ports(1), home / "postgres", db_cert, ca.cert_path, password=db_pw)
    started = []
    try:
        for server in (broker, mariadb, postgres):
            server.start()
            started.append(server)
        yield Secure(home, ca, other_ca, broker, mariadb, postgres, kafka_pw, trust_pw, db_pw, truststore, files)
    finally:
        for server in reversed(started):
            server.stop()
        if os.environ.get("APPLIER_KEEP_SERVICES") != "1":
            import shutil

            shutil.rmtree(home, ignore_errors=True)


JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="applier" password="{}";'


def kafka_settings(s: Secure, password: str = "${APPLIER_TEST_KAFKA_PASSWORD}") -> dict:
    """[source.kafka] as an operator writes it: SASL_SSL, SCRAM-SHA-512, the password from the environment (or a
    file), a PKCS12 trust store whose password is in a file."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": JAAS.format(password),
            "ssl.truststore.type": "PKCS12", "ssl.truststore.location": str(s.truststore),
            "ssl.truststore.password": "${file:%s}" % s.files["trust"]}


def config(s: Secure, tmp: Path, topic: str, schema: str, db_name: str, **extra) -> Path:
    """The secured configuration; ``extra``: section -> keys that replace the defaults (a whole [source.kafka])."""
    db = s.postgres if db_name == "postgres" else s.mariadb
    cfg = {
        "pipeline": {"name": f"p-{topic}", "checkpoint_dir": str(tmp / "ckpt"), "trigger_interval": "200 ms"},
        "source": {"bootstrap_servers": s.broker.bootstrap, "topics": [topic], "protocol": "canal-json",
                   "kafka": kafka_settings(s)},
        "target": {"url": db.url, "password_file": str(s.files["db"]), "ssl_ca": str(s.ca.cert_path)},
        "spark": {"conf": {"spark.ui.enabled": "false"}},
        "route": [{"match": "shop.*", "schema": schema}, {"match": "shop.audit_*", "ignore": True}],
    }
    for section, values in extra.items():
        cfg.setdefault(section, {}).update(values)
    return write_toml(tmp / "applier.toml", cfg)


def env(s: Secure, **extra: str) -> dict[str, str]:
    return {**os.environ, "APPLIER_TEST_KAFKA_PASSWORD": s.kafka_pw, **extra}


def target_engine_of(s: Secure, target: str):
    from applier.config import parse_config
    from applier.dialect import target_engine

    db = s.postgres if target == "postgres" else s.mariadb
    settings = parse_config({"pipeline": {"name": "x", "checkpoint_dir": "/tmp/x"},
                             "source": {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"], "protocol": "open"},
                             "target": {"url": db.url, "password_file": str(s.files["db"]),
                                        "ssl_ca": str(s.ca.cert_path)}})
    return target_engine(settings.target)


def no_secret(s: Secure, *texts: str) -> None:
    for t in texts:
        for secret in s.secrets:
            assert secret not in t, "a secret reached the output"


def written(s: Secure, topic: str, seed: int) -> Workload:
    wl = generate("canal-json", partitions=2, txns=80, seed=seed, replays=1)
    produce(s.broker.bootstrap, topic, wl.messages, partitions=2, client=s.admin())
    return wl


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for fam in text_string_to_metric_families(body):
        for sample in fam.samples:
            out[(sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "pipeline")))] = \
                sample.value
    return out


def test_validate_accepts_the_secured_config_and_shows_no_secret(secure, tmp_path) -> None:
    cfg = config(secure, tmp_path, "t-validate", "s_validate", "postgres")
    res = subprocess.run([APPLIER, "validate", "-c", str(cfg)], cwd=REPO, env=env(secure), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert '"ssl_mode": "verify-full"' in res.stdout and str(secure.files["db"]) in res.stdout
    no_secret(secure, res.stdout, res.stderr)


def test_sasl_ssl_into_postgres_verify_full_with_the_lag_gauge(secure, tmp_path) -> None:
    """Live `applier run`: the jaas password from the environment, the trust store's and the target's from files,
    PostgreSQL with sslmode=verify-full; the consumer-lag gauge (its own librdkafka login) reaches 0."""
    token = secrets.token_hex(4)
    topic, schema = f"secure-pg-{token}", f"secure_pg_{token}"
    wl = written(secure, topic, seed=27)
    port = free_ports(1)
    cfg = config(secure, tmp_path, topic, schema, "postgres", metrics={"port": port})
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    proc = subprocess.Popen([APPLIER, "run", "-c", str(cfg)], cwd=REPO, env=env(secure), stdout=open(out, "w"),
                            stderr=open(err, "w"), start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        seen: dict = {}
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                seen = scrape(port)
            except OSError:
                seen = {}
            lag = [v for k, v in seen.items() if k[0] == "applier_kafka_consumer_lag_messages"]
            if (seen.get(("applier_applied_resolved_timestamp_seconds", ())) == tso_seconds(wl.final_ts)
                    and len(lag) == 2 and not any(lag)):
                break
            time.sleep(0.5)
        assert proc.poll() is None, f"the run ended ({proc.returncode}): {err.read_text()[-3000:]}"
        # a partition's lag is served only once the reader has had its log end offset from Kafka (its own login)
        lag = {k: v for k, v in seen.items() if k[0] == "applier_kafka_consumer_lag_messages"}
        assert len(lag) == 2 and not any(lag.values()), (seen, err.read_text()[-2000:])
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert proc.returncode == -signal.SIGTERM, err.read_text()[-3000:]  # stopped as asked (a shell shows 143)
    assert "stopping on SIGTERM" in err.read_text()
    engine = target_engine_of(secure, "postgres")
    try:
        assert compare_tables(engine, schema, wl.expected) == []
        with engine.connect() as c:
            assert c.execute(text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).scalar() is True
    finally:
        engine.dispose()
    no_secret(secure, out.read_text(), err.read_text())
    assert not JAVA_TRACE.search(err.read_text()), err.read_text()[-3000:]
    assert "log end offsets" not in err.read_text()  # the lag reader never failed


def test_sasl_ssl_into_mariadb_with_the_ca(secure, tmp_path) -> None:
    """`applier run --until-caught-up`: the jaas password from a file (${file:...}), the target's from the
    environment (password_env), MariaDB verified against the CA and the host name."""
    token = secrets.token_hex(4)
    topic, schema = f"secure-my-{token}", f"secure_my_{token}"
    wl = written(secure, topic, seed=28)
    cfg = config(secure, tmp_path, topic, schema, "mariadb",
                 source={"kafka": kafka_settings(secure, "${file:%s}" % secure.files["kafka"])})
    text_ = cfg.read_text().replace(f'"password_file" = "{secure.files["db"]}"', '"password_env" = "REPLICA_PW"')
    assert text_ != cfg.read_text()
    cfg.write_text(text_)
    res = subprocess.run([APPLIER, "run", "-c", str(cfg), "--until-caught-up"], cwd=REPO,
                         env=env(secure, REPLICA_PW=secure.db_pw, APPLIER_TEST_KAFKA_PASSWORD="unused"),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    engine = target_engine_of(secure, "mariadb")
    try:
        assert compare_tables(engine, schema, wl.expected) == []
        with engine.connect() as c:
            assert c.execute(text("SHOW SESSION STATUS LIKE 'Ssl_cipher'")).all()[0][1]  # this check's own link
    finally:
        engine.dispose()
    no_secret(secure, res.stdout, res.stderr)


def _kafka_bad(s: Secure, case: str) -> tuple[dict, dict]:
    """(source overrides, extra env) for a Kafka refusal case."""
    if case == "wrong password":
        return {}, {"APPLIER_TEST_KAFKA_PASSWORD": "not-the-password"}
    if case == "untrusted certificate":  # the broker's CA is not in the trust store
        kafka = {**kafka_settings(s), "ssl.truststore.type": "PEM", "ssl.truststore.location": str(s.other_ca.cert_path)}
        del kafka["ssl.truststore.password"]  # a PEM trust store has none
        return {"kafka": kafka}, {}
    if case == "certificate for another host":  # the listener whose certificate names kafka.other.example
        return {"bootstrap_servers": f"127.0.0.1:{s.broker.port + 2}"}, {}
    if case == "wrong trust store password":
        bad = s.home / "secrets" / "bad-trust"
        bad.write_text("not-the-store-password\n")
        return {"kafka": {**kafka_settings(s), "ssl.truststore.password": "${file:%s}" % bad}}, {}
    raise AssertionError(case)


KAFKA_CASES = {
    "wrong password": (5, 'source.kafka."sasl.jaas.config"', "refused the login"),
    "untrusted certificate": (5, 'source.kafka."ssl.truststore.location"', "does not verify against the trust store"),
    "certificate for another host": (5, 'source.kafka."ssl.endpoint.identification.algorithm"',
                                     "does not name the host"),
    "wrong trust store password": (2, 'source.kafka."ssl.truststore.password"', "does not open with this password"),
}
TARGET_CASES = {
    "untrusted certificate": ({"ssl_ca": "OTHER_CA"}, "target.ssl_ca", "does not verify against target.ssl_ca"),
    "certificate for another host": ({"url": OTHER_HOST}, "target.url", "does not name the host in target.url"),
}


def run_refused(s: Secure, cfg: Path, extra_env: dict) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    res = subprocess.run([APPLIER, "run", "-c", str(cfg), "--until-caught-up"], cwd=REPO,
                         env=env(s, **extra_env), capture_output=True, text=True, timeout=180)
    return res, time.monotonic() - t0


def assert_clear_stop(s: Secure, res, took: float, code: int, key: str, fix: str) -> None:
    assert res.returncode == code, res.stderr[-3000:]
    assert took < REFUSED_WITHIN, f"took {took:.1f} s"
    assert key in res.stderr and fix in res.stderr, res.stderr
    assert not JAVA_TRACE.search(res.stderr + res.stdout), res.stderr
    assert len(res.stderr.strip().splitlines()) <= 2, res.stderr  # the one message, not a log of retries
    no_secret(s, res.stdout, res.stderr)


@pytest.mark.parametrize("case", list(KAFKA_CASES))
def test_kafka_refusals_stop_within_seconds_naming_the_setting(secure, tmp_path, case) -> None:
    token = secrets.token_hex(4)
    topic, schema = f"secure-bad-{token}", f"secure_bad_{token}"
    written(secure, topic, seed=29)
    source, extra_env = _kafka_bad(secure, case)
    cfg = config(secure, tmp_path, topic, schema, "postgres", source=source)
    code, key, fix = KAFKA_CASES[case]
    res, took = run_refused(secure, cfg, extra_env)
    assert_clear_stop(secure, res, took, code, key, fix)
    if code == 5:
        assert "refused this client" in res.stderr
    engine = target_engine_of(secure, "postgres")
    try:  # nothing applied, not even half: the check comes before the target is touched
        with engine.connect() as c:
            assert schema not in inspect(c).get_schema_names()
            if inspect(c).has_table(P.pipelines.name):
                assert c.execute(select(P.pipelines.c.pipeline).where(
                    P.pipelines.c.pipeline == f"p-{topic}")).first() is None
    finally:
        engine.dispose()


def test_a_store_librdkafka_cannot_read_leaves_the_check_to_spark_which_names_the_setting(secure, tmp_path) -> None:
    """A JKS trust store has no librdkafka form: no probe before Spark, so the Java client's check once Spark has
    started meets the refused login, and says the same: exit 5 naming sasl.jaas.config, no Java trace."""
    token = secrets.token_hex(4)
    topic, schema = f"secure-jks-{token}", f"secure_jks_{token}"
    written(secure, topic, seed=31)
    jks = java_truststore(secure.ca.cert_path, tmp_path / "trust.jks", secure.files["trust"], store_type="JKS")
    kafka = {**kafka_settings(secure), "ssl.truststore.type": "JKS", "ssl.truststore.location": str(jks)}
    cfg = config(secure, tmp_path, topic, schema, "postgres", source={"kafka": kafka})
    res, took = run_refused(secure, cfg, {"APPLIER_TEST_KAFKA_PASSWORD": "not-the-password"})
    assert res.returncode == 5, res.stderr[-3000:]
    assert took < 120, f"took {took:.1f} s"  # Spark's start, then the refusal at once (no retries until a timeout)
    assert 'source.kafka."sasl.jaas.config"' in res.stderr and "SaslAuthenticationException" in res.stderr
    assert not JAVA_TRACE.search(res.stderr + res.stdout), res.stderr[-3000:]
    no_secret(secure, res.stdout, res.stderr)


@pytest.mark.parametrize("target", ["postgres", "mariadb"])
@pytest.mark.parametrize("case", list(TARGET_CASES))
def test_target_certificates_that_do_not_verify_stop_naming_the_setting(secure, tmp_path, case, target) -> None:
    token = secrets.token_hex(4)
    topic, schema = f"secure-tbad-{token}", f"secure_tbad_{token}"
    written(secure, topic, seed=30)
    change, key, fix = TARGET_CASES[case]
    db = secure.postgres if target == "postgres" else secure.mariadb
    override = {"ssl_ca": str(secure.other_ca.cert_path)} if "ssl_ca" in change else {
        "url": db.url.replace("127.0.0.1", OTHER_HOST)}
    cfg = config(secure, tmp_path, topic, schema, target, target=override)
    res, took = run_refused(secure, cfg, {})
    assert_clear_stop(secure, res, took, 5, key, fix)
    assert "cannot use the target database" in res.stderr
    engine = target_engine_of(secure, target)
    try:
        with engine.connect() as c:  # the right settings connect: it was the certificate, and nothing was applied
            names = inspect(c).get_schema_names()
            assert schema not in names
    finally:
        engine.dispose()
