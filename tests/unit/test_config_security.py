"""Secrets from files and TLS to the targets (issue 27, points 3 and 4): ``${file:PATH}`` references,
``[target] password_file``, the ``ssl_*`` keys and how each dialect turns them into its driver's arguments, and what a
TLS failure is reported as. The same settings against real TLS servers: tests/e2e/test_secure.py."""

from __future__ import annotations

import ssl

import pytest

from applier.config import ConfigError, parse_config
from applier.dialect import MARIADB, MYSQL, POSTGRES, target_engine, tls_failure

SECRET = "s3cr:t/pa%ss@word"


def base(target: dict | None = None, kafka: dict | None = None) -> dict:
    return {
        "pipeline": {"name": "p", "checkpoint_dir": "/tmp/ckpt"},
        "source": {"bootstrap_servers": "127.0.0.1:9093", "topics": ["t"], "protocol": "canal-json",
                   "kafka": kafka or {}},
        "target": {"url": "postgresql+psycopg://replica@db.example:5432/replica", **(target or {})},
    }


def err(data: dict, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        parse_config(data, **kw)
    return e.value


@pytest.fixture
def secret_file(tmp_path):
    f = tmp_path / "password"
    f.write_text(SECRET + "\n")  # as `echo` and Kubernetes secrets write it: one trailing newline is not the secret
    return f


@pytest.fixture
def ca(tmp_path):
    f = tmp_path / "ca.pem"
    f.write_text("-----BEGIN CERTIFICATE-----\n")
    return f


# ---- secrets from files ----------------------------------------------------------------------------------------

def test_password_file_resolves_into_the_url_and_is_masked(secret_file) -> None:
    s = parse_config(base({"password_file": str(secret_file)}))
    assert s.target_url().password == SECRET
    assert s.target.password_file == str(secret_file)
    shown = repr(s) + str(s.redacted())
    assert SECRET not in shown and str(secret_file) in shown


def test_password_file_relative_to_the_config_folder(tmp_path, secret_file) -> None:
    s = parse_config(base({"password_file": "password"}), base_dir=tmp_path)
    assert s.target_url().password == SECRET


def test_only_one_trailing_newline_is_stripped(tmp_path) -> None:
    f = tmp_path / "pw"
    f.write_text("pw \n\n")
    assert parse_config(base({"password_file": str(f)})).target_url().password == "pw \n"
    f.write_text("pw\r\n")
    assert parse_config(base({"password_file": str(f)})).target_url().password == "pw"


@pytest.mark.parametrize("make, fragment", [
    (lambda d: d / "missing", "does not exist"),
    (lambda d: d, "is a directory"),
    (lambda d: (d / "empty").write_text("\n") and d / "empty", "is empty"),
    (lambda d: (d / "big").write_bytes(b"x" * 70000) and d / "big", "larger than"),
    (lambda d: (d / "bin").write_bytes(b"\xff\xfe") and d / "bin", "not UTF-8"),
])
def test_bad_password_files_are_named(tmp_path, make, fragment) -> None:
    e = err(base({"password_file": str(make(tmp_path))}))
    assert e.key == "target.password_file" and fragment in e.message


def test_password_file_conflicts(secret_file) -> None:
    e = err(base({"password_file": str(secret_file), "password_env": "X"}), env={"X": "y"})
    assert e.key == "target.password_file" and "one place" in e.message
    data = base({"password_file": str(secret_file)})
    data["target"]["url"] = "postgresql+psycopg://replica:other@db.example:5432/replica"
    e = err(data)
    assert e.key == "target.password_file" and "already carries a password" in e.message and "other" not in str(e)


def test_file_references_in_kafka_options_and_the_url(secret_file) -> None:
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="applier" '
            'password="${file:%s}";' % secret_file)
    data = base(kafka={"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas})
    data["target"]["url"] = "postgresql+psycopg://replica:${file:%s}@db.example:5432/replica" % secret_file
    s = parse_config(data)
    assert s.source.kafka["sasl.jaas.config"].endswith(f'password="{SECRET}";')
    assert s.source.spark_options()["kafka.sasl.jaas.config"] == s.source.kafka["sasl.jaas.config"]
    assert s.target_url().password == SECRET
    shown = repr(s) + str(s.redacted())
    assert SECRET not in shown
    assert s.redacted()["source"]["kafka"]["sasl.jaas.config"] == "***"


def test_file_reference_errors_name_the_option(tmp_path) -> None:
    e = err(base(kafka={"ssl.truststore.password": "${file:%s}" % (tmp_path / "nope")}))
    assert e.key == 'source.kafka."ssl.truststore.password"' and "does not exist" in e.message
    e = err(base(kafka={"ssl.truststore.password": "${file:}"}))
    assert "empty file path" in e.message


def test_an_escaped_reference_stays_literal() -> None:
    s = parse_config(base(kafka={"client.id": "$${file:/x}"}))
    assert s.source.kafka["client.id"] == "${file:/x}"


def test_kafka_store_locations_must_exist(tmp_path) -> None:
    e = err(base(kafka={"ssl.truststore.location": str(tmp_path / "trust.p12")}))
    assert e.key == 'source.kafka."ssl.truststore.location"' and "does not exist" in e.message
    (tmp_path / "trust.p12").write_bytes(b"x")
    s = parse_config(base(kafka={"ssl.truststore.location": "trust.p12"}), base_dir=tmp_path)
    assert s.source.kafka["ssl.truststore.location"] == str(tmp_path / "trust.p12")  # absolute: executors read it


# ---- the TLS keys ----------------------------------------------------------------------------------------------

def test_no_tls_keys_leave_the_driver_defaults() -> None:
    t = parse_config(base()).target
    assert t.ssl_mode == "" and t.ssl_ca is None
    assert POSTGRES.connect_args(t) == {} and MYSQL.connect_args(t) == {}


def test_ssl_ca_alone_means_verify_full(ca) -> None:
    t = parse_config(base({"ssl_ca": str(ca)})).target
    assert t.ssl_mode == "verify-full" and t.ssl_ca == str(ca) and t.verifies_certificate
    assert POSTGRES.connect_args(t) == {"sslmode": "verify-full", "sslrootcert": str(ca)}


def test_postgres_modes(ca) -> None:
    def args(**kw):
        return POSTGRES.connect_args(parse_config(base(kw)).target)

    assert args(ssl_mode="verify-ca", ssl_ca=str(ca)) == {"sslmode": "verify-ca", "sslrootcert": str(ca)}
    assert args(ssl_mode="verify-full") == {"sslmode": "verify-full", "sslrootcert": "system"}  # the system's CAs
    assert args(ssl_mode="require") == {"sslmode": "require"}
    assert args(ssl_mode="disable") == {"sslmode": "disable"}
    assert args(ssl_cert=str(ca), ssl_key=str(ca)) == {"sslmode": "verify-full", "sslrootcert": "system",
                                                       "sslcert": str(ca), "sslkey": str(ca)}


def _mysql(**kw):
    data = base(kw)
    data["target"]["url"] = "mariadb+pymysql://replica@db.example:3306/replica"
    t = parse_config(data).target
    return MARIADB.connect_args(t), t


def test_mysql_modes_build_an_ssl_context(real_ca) -> None:
    args, _ = _mysql(ssl_ca=str(real_ca))
    ctx = args["ssl"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    assert len(ctx.get_ca_certs()) == 1  # that CA only, not the system's
    args, _ = _mysql(ssl_mode="verify-ca", ssl_ca=str(real_ca))
    assert not args["ssl"].check_hostname and args["ssl"].verify_mode == ssl.CERT_REQUIRED
    args, _ = _mysql(ssl_mode="require")
    assert not args["ssl"].check_hostname and args["ssl"].verify_mode == ssl.CERT_NONE
    assert _mysql(ssl_mode="disable")[0] == {"ssl_disabled": True}
    assert _mysql()[0] == {}


@pytest.fixture
def real_ca(tmp_path):
    from applier.devtools.certs import make_ca

    return make_ca(tmp_path / "ca").cert_path


@pytest.mark.parametrize("target, key, fragment", [
    ({"ssl_mode": "verify_full"}, "target.ssl_mode", "did you mean 'verify-full'"),
    ({"ssl_ca": "/nonexistent/ca.pem"}, "target.ssl_ca", "does not exist"),
    ({"ssl_ca": ""}, "target.ssl_ca", "must not be empty"),
    ({"ssl_cert": "CA"}, "target.ssl_key", "needs both"),
    ({"ssl_key": "CA"}, "target.ssl_cert", "needs both"),
    ({"ssl_mode": "disable", "ssl_ca": "CA"}, "target.ssl_mode", "contradicts ssl_ca"),
])
def test_tls_key_errors(ca, target, key, fragment) -> None:
    target = {k: (str(ca) if v == "CA" else v) for k, v in target.items()}
    e = err(base(target))
    assert e.key == key and fragment in e.message, e


def test_tls_in_the_url_and_in_the_keys_conflict(ca) -> None:
    data = base({"ssl_ca": str(ca)})
    data["target"]["url"] += "?sslmode=require"
    e = err(data)
    assert e.key == "target.ssl_ca" and "one place" in e.message
    data = base()
    data["target"]["url"] += "?sslmode=verify-full&sslrootcert=/x"  # the url alone still works, as before
    assert parse_config(data).target.ssl_mode == ""


def test_the_engine_hands_the_tls_arguments_to_the_driver(ca) -> None:
    from sqlalchemy import event

    t = parse_config(base({"ssl_ca": str(ca)})).target
    engine = target_engine(t, connect_args={"connect_timeout": 3})
    seen: dict = {}

    @event.listens_for(engine, "do_connect")
    def capture(dialect, record, cargs, cparams):
        seen.update(cparams)
        raise RuntimeError("captured")

    try:
        with pytest.raises(Exception, match="captured"):
            engine.connect()
    finally:
        engine.dispose()
    assert seen["sslmode"] == "verify-full" and seen["sslrootcert"] == str(ca) and seen["connect_timeout"] == 3
    assert seen["host"] == "db.example"


# ---- what a TLS failure is reported as ------------------------------------------------------------------------

@pytest.mark.parametrize("text, names", [
    ('connection failed: server certificate for "localhost" (and 1 other name) does not match host name '
     '"127.0.0.2"', ["target.url", "verify-ca"]),
    ("(2003, \"Can't connect to MySQL server on '127.0.0.2' ([SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
     "failed: IP address mismatch, certificate is not valid for '127.0.0.2'. (_ssl.c:1006))\")", ["target.url"]),
    ("connection failed: SSL error: certificate verify failed", ["target.ssl_ca"]),
    ("(2003, \"Can't connect ... [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local "
     "issuer certificate\")", ["target.ssl_ca"]),
    ("(2026, 'SSL is required but the server doesn't support it')", ["target.ssl_mode"]),
    ("SSL error: tlsv1 alert unknown ca", ["target.ssl_cert", "target.ssl_key"]),
])
def test_tls_failures_name_the_setting(text, names) -> None:
    advice = tls_failure(Exception(text))
    assert advice is not None
    for n in names:
        assert n in advice


def test_a_lost_tls_connection_is_no_tls_failure_and_passes() -> None:
    from sqlalchemy.exc import OperationalError

    for text in ("SSL SYSCALL error: EOF detected", "SSL connection has been closed unexpectedly"):
        assert tls_failure(Exception(text)) is None

    class PgError(Exception):
        sqlstate = "08006"

    lost = OperationalError("SELECT 1", {}, PgError("SSL connection has been closed unexpectedly"))
    assert POSTGRES.is_transient(lost)
    refused = OperationalError("SELECT 1", {}, PgError("SSL error: certificate verify failed"))
    assert not POSTGRES.is_transient(refused)  # it would not verify on the next try either
    mysql_refused = OperationalError("SELECT 1", {}, Exception(2003, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate "
                                                                     "verify failed"))
    assert not MYSQL.is_transient(mysql_refused)
