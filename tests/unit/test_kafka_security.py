"""A secured Kafka's settings outside Spark (issue 27, point 2): the librdkafka form of a PKCS12 trust store, what
either client's refusal means (the key and the fix), and the secured test broker's server.properties. Against a real
SASL_SSL broker: tests/e2e/test_secure.py."""

from __future__ import annotations

import pytest

from applier.devtools.certs import java_truststore, make_ca
from applier.devtools.services.kafka import SaslSsl, server_properties
from applier.kafka_security import KafkaSettingError, librdkafka_security, option_key, refusal

JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="applier" password="pw";'


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def p12(ca, tmp_path_factory):
    d = tmp_path_factory.mktemp("trust")
    (d / "pw").write_text("trust-pw\n")
    return java_truststore(ca.cert_path, d / "trust.p12", d / "pw")


def test_a_pkcs12_trust_store_becomes_its_pem_certificates(ca, p12) -> None:
    for kind in ({}, {"ssl.truststore.type": "PKCS12"}, {"ssl.truststore.type": "JKS"}):  # JKS: Java reads PKCS12 too
        sec = librdkafka_security({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                   "sasl.jaas.config": JAAS, "ssl.truststore.location": str(p12),
                                   "ssl.truststore.password": "trust-pw", **kind})
        assert sec == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "applier",
                       "sasl.password": "pw", "ssl.ca.pem": ca.cert_path.read_text()}


def test_a_wrong_trust_store_password_names_the_password(p12) -> None:
    with pytest.raises(KafkaSettingError) as e:
        librdkafka_security({"ssl.truststore.location": str(p12), "ssl.truststore.password": "wrong"})
    assert e.value.key == option_key("ssl.truststore.password") and "wrong" not in e.value.message


def test_a_jks_store_has_no_librdkafka_form(tmp_path) -> None:
    jks = tmp_path / "t.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed" + bytes(40))
    assert librdkafka_security({"ssl.truststore.location": str(jks)}) is None


@pytest.mark.parametrize("text, key", [
    # librdkafka (the probe, the lag reader)
    ("sasl_ssl://127.0.0.1:29392/bootstrap: SASL authentication error: Authentication failed during authentication "
     "due to invalid credentials with SASL mechanism SCRAM-SHA-512 (after 318ms in state AUTH_REQ)", "sasl.jaas.config"),
    ("127.0.0.1:29394: TLS handshake failed: certificate verify failed: IP address mismatch, certificate is not valid "
     "for '127.0.0.1'.", "ssl.endpoint.identification.algorithm"),
    ("sasl_ssl://127.0.0.1:1/bootstrap: SSL handshake failed: error:0A000086:SSL routines::certificate verify failed: "
     "broker certificate could not be verified", "ssl.truststore.location"),
    ("127.0.0.1:9092/bootstrap: Disconnected while requesting ApiVersion: might be caused by incorrect "
     "security.protocol configuration (connecting to a SSL listener?)", "security.protocol"),
    # the Java client (Spark's source, the JVM check), with stack frames
    ("py4j.protocol.Py4JJavaError: An error occurred while calling o52.listTopics.\n"
     ": org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed during authentication due "
     "to invalid credentials with SASL mechanism SCRAM-SHA-512\n\tat org.apache.kafka.Foo.bar(Foo.java:1)",
     "sasl.jaas.config"),
    ("org.apache.kafka.common.errors.SslAuthenticationException: SSL handshake failed\n"
     "Caused by: javax.net.ssl.SSLHandshakeException: PKIX path building failed: sun.security.provider.certpath."
     "SunCertPathBuilderException: unable to find valid certification path to requested target",
     "ssl.truststore.location"),
    ("Caused by: java.security.cert.CertificateException: No subject alternative names matching IP address 127.0.0.1 "
     "found", "ssl.endpoint.identification.algorithm"),
    ("org.apache.kafka.common.KafkaException: Failed to load SSL keystore /x of type PKCS12",
     "ssl.truststore.password"),
    ("org.apache.kafka.common.errors.UnsupportedSaslMechanismException: Client SASL mechanism 'PLAIN' not enabled in "
     "the server, enabled mechanisms are [SCRAM-SHA-512]", "sasl.mechanism"),
])
def test_refusals_name_the_setting(text, key) -> None:
    found = refusal(text, {})
    assert found is not None and found.key == option_key(key)
    assert "\tat " not in found.reason and not found.reason.startswith("Caused by")
    assert found.key in found.message("127.0.0.1:9093")


@pytest.mark.parametrize("text", [
    "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node assignment. Call: listTopics",
    "127.0.0.1:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection refused",
    "1/1 brokers are down",
])
def test_outages_are_no_refusals(text) -> None:
    assert refusal(text, {}) is None


def test_the_secured_broker_properties(ca, tmp_path) -> None:
    sec = SaslSsl(keystore=tmp_path / "ks.pem", ca=ca.cert_path, users={"admin": "a1", "applier": "b2"},
                  other_keystore=tmp_path / "other.pem")
    text = server_properties(29092, 29093, tmp_path / "data", security=sec)
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    assert props["listeners"] == "SASL_SSL://127.0.0.1:29092,OTHERHOST://127.0.0.1:29094,CONTROLLER://127.0.0.1:29093"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["ssl.keystore.type"] == "PEM" and props["listener.name.otherhost.ssl.keystore.location"].endswith(
        "other.pem")
    assert "PLAINTEXT://" not in props["listeners"].replace("CONTROLLER://", "")
    assert sec.scram_args() == ["--add-scram", "SCRAM-SHA-512=[name=admin,password=a1]",
                                "--add-scram", "SCRAM-SHA-512=[name=applier,password=b2]"]
    with pytest.raises(Exception, match="letters, digits"):
        SaslSsl(keystore=tmp_path, ca=tmp_path, users={"admin": "a,b"}).scram_args()


def test_the_registry_trusts_the_ca_file_it_is_given(ca, tmp_path) -> None:
    """``[source.codec] registry_ca``: the registry client trusts that CA (made where the decoder lands: it is
    shipped to Spark's workers), and a missing file is named at configuration time."""
    import pickle
    import ssl

    from applier.codecs import get_decoder

    dec = get_decoder("avro", registry_url="https://u:p@registry.internal:8081", registry_ca=str(ca.cert_path))
    client = pickle.loads(pickle.dumps(dec)).registry
    ctx = client._context()  # noqa: SLF001
    assert isinstance(ctx, ssl.SSLContext) and ctx.check_hostname
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "applier test CA"),),)]
    with pytest.raises(ValueError, match="registry_ca"):
        get_decoder("avro", registry_url="https://registry.internal:8081", registry_ca=str(tmp_path / "none.pem"))


def test_a_refusal_while_running_stops_naming_the_setting_and_is_not_retried() -> None:
    """Spark's source meets a refused login mid-run (a rotated password): the run stops with exit 5 naming the key,
    not as an outage to wait out, nor as an unexplained Spark failure."""
    from applier.config import parse_config
    from applier.pipeline import SourceUnreachable, _query_failure

    class QueryFailed(Exception):
        _stackTrace = ("org.apache.spark.SparkException: Job aborted\n\tat org.apache.spark.X.y(X.scala:1)\n"
                       "Caused by: org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed "
                       "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512\n")

    settings = parse_config({"pipeline": {"name": "p", "checkpoint_dir": "/tmp/x"},
                             "source": {"bootstrap_servers": "k:9093", "topics": ["t"], "protocol": "open"},
                             "target": {"url": "mysql+pymysql://u@127.0.0.1:1/d"}})
    stop = _query_failure(QueryFailed("query failed"), [], settings)
    assert isinstance(stop, SourceUnreachable) and not stop.transient
    assert 'source.kafka."sasl.jaas.config"' in str(stop) and "\tat " not in str(stop)
