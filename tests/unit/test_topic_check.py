"""The missing-topic check before Spark starts (issue 24, point 5): ``[source.kafka]``'s security settings (the Java
client's names) in librdkafka's names, or None when one has no librdkafka form, so the check is skipped and the JVM
check after Spark's start decides. The check against a real broker: tests/e2e/test_signals.py."""

from __future__ import annotations

import logging

from applier.config import parse_config
from applier.kafka_security import librdkafka_security
from applier.pipeline import check_kafka_access


def test_plain_and_scram_logins_and_pem_trust_stores_map() -> None:
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="rep" '
            'password="p\\"w";')
    assert librdkafka_security({
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas,
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "", "client.id": "x", "request.timeout.ms": "5000",
    }) == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "rep",
           "sasl.password": 'p"w', "ssl.ca.location": "/etc/ca.pem", "ssl.endpoint.identification.algorithm": "none"}
    assert librdkafka_security({}) == {}
    assert librdkafka_security({"fetch.max.bytes": "1"}) == {}  # tuning: not needed to list topics


def test_settings_without_a_librdkafka_form_skip_the_check() -> None:
    for kafka in ({"ssl.truststore.location": "/etc/trust.jks"},  # JKS, the Java default
                  {"sasl.mechanism": "GSSAPI", "sasl.kerberos.service.name": "kafka"},
                  {"sasl.mechanism": "OAUTHBEARER"},
                  {"sasl.jaas.config": "com.example.CustomLoginModule required;"},
                  {"ssl.keystore.location": "/etc/key.jks"}):
        assert librdkafka_security(kafka) is None, kafka


def test_the_check_is_skipped_with_a_note_when_the_settings_cannot_be_mapped(caplog, tmp_path) -> None:
    jks = tmp_path / "trust.jks"
    jks.write_bytes(b"\xfe\xed\xfe\xed" + bytes(60))  # a JKS store (its magic): Java reads it, librdkafka cannot
    settings = parse_config({
        "pipeline": {"name": "p", "checkpoint_dir": "/tmp/x"},
        "source": {"bootstrap_servers": "127.0.0.1:1", "topics": ["t"], "protocol": "open",
                   "kafka": {"security.protocol": "SSL", "ssl.truststore.location": str(jks)}},
        "target": {"url": "mysql+pymysql://u@127.0.0.1:1/d"},
    })
    with caplog.at_level(logging.INFO, logger="applier.pipeline"):
        check_kafka_access(settings)  # returns at once: no broker is asked
    assert "checked once Spark has started" in caplog.text
