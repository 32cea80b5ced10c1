"""``[source.kafka]``'s security settings outside Spark: the same login and trust for librdkafka (confluent_kafka), and
what a refusal means in the operator's terms.

Spark's Kafka source (the Java client) takes ``[source.kafka]`` as it is. Two readers in the driver use librdkafka
instead: the start-up probe (:func:`probe`: before Spark starts, so a wrong password or a certificate that does not
verify stops the run within seconds, naming the setting) and the metrics' consumer-lag reader
(applier.metrics.EndOffsets). :func:`librdkafka_security` translates the Java client's names for them:

- ``security.protocol``, ``sasl.mechanism`` as they are; ``sasl.jaas.config`` of the PLAIN or SCRAM login modules
  becomes ``sasl.username``/``sasl.password``;
- a PEM trust store (``ssl.truststore.type = "PEM"``: ``ssl.truststore.location`` or ``.certificates``) becomes
  ``ssl.ca.location``/``ssl.ca.pem``; a PKCS12 trust store (Java's default type since 9) is opened here with
  ``ssl.truststore.password`` and its certificates passed as ``ssl.ca.pem``;
- ``ssl.endpoint.identification.algorithm`` as it is ("" becomes "none": no host name check).

A JKS trust store, Kerberos, OAuth or a custom login module have no librdkafka form: then there is no probe (the JVM
client's check once Spark has started names the same refusals, :func:`refusal`) and no consumer-lag gauge.

:func:`refusal` reads an error of either client (librdkafka's text, or the Java exception chain) and says which
``[source.kafka]`` key is at fault and what to do; it never repeats a secret (neither client's messages hold one).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Mapping

log = logging.getLogger("applier.kafka_security")

# [source.kafka] security settings (the Java client's names) that librdkafka spells the same way
_SAME_IN_LIBRDKAFKA = frozenset({"security.protocol", "sasl.mechanism", "ssl.key.password", "ssl.keystore.password",
                                 "ssl.ca.location", "sasl.username", "sasl.password"})
_JAAS_FIELD = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


class KafkaSettingError(Exception):
    """A ``[source.kafka]`` setting that cannot be used as it is (a trust store that does not open): ``key`` names
    it as a configuration error does (``source.kafka."ssl.truststore.password"``), ``message`` says what to do."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def option_key(name: str) -> str:
    """How a configuration message names a ``[source.kafka]`` option."""
    return f'source.kafka."{name}"'


def librdkafka_security(kafka: Mapping[str, str]) -> dict[str, str] | None:
    """The librdkafka (confluent_kafka) form of ``[source.kafka]``'s security settings, or None when one has no
    librdkafka form: a JKS trust or key store, a JAAS login other than PLAIN/SCRAM, Kerberos, OAuth, cipher
    lists. Other settings (timeouts, client ids, fetch sizes) do not matter for listing topics and are left out.
    Raises :class:`KafkaSettingError` for a PKCS12 trust store that does not open (a wrong password)."""
    out: dict[str, str] = {}
    for key, value in kafka.items():
        if not key.startswith(("security.", "sasl.", "ssl.")):
            continue
        if key in _SAME_IN_LIBRDKAFKA:
            out[key] = value
        elif key == "sasl.jaas.config":
            if "PlainLoginModule" not in value and "ScramLoginModule" not in value:
                return None
            fields = {k: re.sub(r"\\(.)", r"\1", v) for k, v in _JAAS_FIELD.findall(value)}
            if set(fields) != {"username", "password"}:
                return None
            out["sasl.username"], out["sasl.password"] = fields["username"], fields["password"]
        elif key == "ssl.endpoint.identification.algorithm":
            out[key] = value or "none"
        elif key == "ssl.truststore.location" and kafka.get("ssl.truststore.type", "").upper() == "PEM":
            out["ssl.ca.location"] = value
        elif key == "ssl.truststore.certificates" and kafka.get("ssl.truststore.type", "").upper() == "PEM":
            out["ssl.ca.pem"] = value
        elif key == "ssl.truststore.location" and kafka.get("ssl.truststore.type", "JKS").upper() in ("JKS", "PKCS12"):
            # the Java client's default type "JKS" reads PKCS12 files too (Java 9+); a real JKS file has no form here
            pem = pkcs12_certificates(value, kafka.get("ssl.truststore.password"))
            if pem is None:
                return None  # a JKS file under the default type: Java reads it, librdkafka cannot
            out["ssl.ca.pem"] = pem
        elif key == "ssl.keystore.location" and kafka.get("ssl.keystore.type", "").upper() == "PKCS12":
            out[key] = value
        elif key in ("ssl.truststore.type", "ssl.keystore.type", "ssl.truststore.password"):
            continue  # read with the location above (a PEM trust store has no password)
        else:
            return None
    if out.get("sasl.mechanism", "PLAIN").upper() not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        return None
    return out


def pkcs12_certificates(path: str, password: str | None) -> str | None:
    """The certificates of a PKCS12 trust store as PEM text (what librdkafka's ``ssl.ca.pem`` takes); None when the
    file is not PKCS12 at all (a JKS store: Java's client reads it, this cannot). A PKCS12 file that does not open
    with ``password`` raises :class:`KafkaSettingError` naming the password setting."""
    from cryptography.hazmat.primitives.serialization import Encoding, pkcs12

    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError:
        return None  # the configuration check names a missing file; the Java client decides here
    if data[:4] == b"\xfe\xed\xfe\xed":  # JKS magic
        return None
    try:
        store = pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError as exc:
        if "password" in str(exc).lower() or "mac" in str(exc).lower():
            raise KafkaSettingError(option_key("ssl.truststore.password"),
                                    f"the trust store {path} does not open with this password; set the password "
                                    "it was written with (keytool -storepass)") from None
        return None  # not PKCS12 (another store type): the Java client decides
    certs = [c.certificate for c in store.additional_certs] + ([store.cert.certificate] if store.cert else [])
    if not certs:
        raise KafkaSettingError(option_key("ssl.truststore.location"),
                                f"the trust store {path} holds no certificate; import the CA that signed the "
                                "brokers' certificates (keytool -importcert)")
    return "".join(c.public_bytes(Encoding.PEM).decode("ascii") for c in certs)


# ---- what a refusal means ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    """Kafka refused this client for good (no waiting repairs it): ``key`` is the setting at fault as a configuration
    message names it, ``reason`` the client's words (one line), ``fix`` what to do."""

    key: str
    reason: str
    fix: str

    def message(self, bootstrap: str) -> str:
        return f"Kafka at {bootstrap} refused this client: {self.reason.rstrip('.')}. {self.key}: {self.fix}"


_AUTH = re.compile(r"SaslAuthenticationException|SASL authentication (error|failed)|invalid credentials|"
                   r"Authentication failed", re.I)
_MECHANISM = re.compile(r"UnsupportedSaslMechanism|Unsupported SASL mechanism|SASL mechanism .* not (enabled|"
                        r"supported)|no common mechanism", re.I)
_HOSTNAME = re.compile(r"No subject alternative (DNS )?names? matching|No name matching|Hostname mismatch|"
                       r"IP address mismatch|certificate is not valid for|does not match (the )?host", re.I)
_UNTRUSTED = re.compile(r"PKIX path (building|validation) failed|unable to find valid certification path|"
                        r"certificate verify failed|CERTIFICATE_VERIFY_FAILED|self[- ]signed certificate|"
                        r"unable to get local issuer|certificate has expired|unknown ca", re.I)
_KEYSTORE = re.compile(r"Failed to load SSL keystore|keystore password was incorrect|Invalid keystore format|"
                       r"truststore password", re.I)
_PROTOCOL = re.compile(r"incorrect security\.protocol|wrong version number|packet length too long|"
                       r"Unsupported protocol|Unrecognized SSL message|plaintext connection\?|"
                       r"Unexpected Kafka request of type METADATA during SASL handshake|Illegal SASL state", re.I)


def refusal(text: str, kafka: Mapping[str, str]) -> Refusal | None:
    """What an error of either Kafka client (librdkafka's message, or the Java exception chain's text) means, when
    it is a refusal no waiting repairs: a login the brokers refuse, a certificate that does not verify or does not
    name the host, a trust store that does not open, a security protocol the listener does not speak. None for
    anything else (an outage, a timeout)."""
    line = _first(text, (_HOSTNAME, _UNTRUSTED, _KEYSTORE, _AUTH, _MECHANISM, _PROTOCOL))
    if line is None:
        return None
    if _HOSTNAME.search(line):
        return Refusal(option_key("ssl.endpoint.identification.algorithm"), line,
                       "the broker's certificate does not name the host this client connected to. Connect by a "
                       "name the certificate holds (source.bootstrap_servers, and the brokers' advertised.listeners), "
                       'or have the certificate reissued for it; "ssl.endpoint.identification.algorithm" = "" turns '
                       "the check off (not advised: any certificate from the CA would then pass)")
    if _UNTRUSTED.search(line):
        return Refusal(option_key("ssl.truststore.location"), line,
                       "the broker's certificate does not verify against the trust store. Point ssl.truststore.location "
                       "at the CA that signed the brokers' certificates (ssl.truststore.type = \"PEM\" for a PEM file, "
                       "or a PKCS12 store with ssl.truststore.password), and check that the certificate has not "
                       "expired")
    if _KEYSTORE.search(line):
        return Refusal(option_key("ssl.truststore.password"), line,
                       "the trust store (or key store) does not open: check its type (ssl.truststore.type) and its "
                       "password (ssl.truststore.password)")
    if _AUTH.search(line):
        return Refusal(option_key("sasl.jaas.config"), line,
                       "the brokers refused the login. Check the user name and password in sasl.jaas.config, and that "
                       "sasl.mechanism is the one the user was created with (SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN)")
    if _MECHANISM.search(line):
        return Refusal(option_key("sasl.mechanism"), line,
                       "the brokers' listener does not offer this SASL mechanism: use one of those it enables "
                       "(sasl.enabled.mechanisms on the broker)")
    return Refusal(option_key("security.protocol"), line,
                   "the listener at source.bootstrap_servers speaks another security protocol: set security.protocol "
                   "to the listener's (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL), or use the port of the listener "
                   "meant for this client")


def _first(text: str, patterns: tuple[re.Pattern[str], ...]) -> str | None:
    """The first line (Java's stack frames aside) that one of ``patterns`` matches, by the patterns' order."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith(("at ", "..."))]
    for rx in patterns:
        for ln in lines:
            if rx.search(ln):
                return ln.removeprefix("Caused by: ")[:400]
    return None


# ---- the start-up probe ---------------------------------------------------------------------------------------

@dataclass
class ProbeResult:
    """What the probe learnt: the topics Kafka lists (None: it did not answer in time), or its refusal."""

    topics: set[str] | None = None
    refused: Refusal | None = None
    errors: tuple[str, ...] = ()  # librdkafka's error reports meanwhile (no secret is in them)


def probe(bootstrap: str, security: Mapping[str, str], kafka: Mapping[str, str], timeout: float = 10.0) -> ProbeResult:
    """Ask the brokers for their topics with librdkafka and ``security`` (:func:`librdkafka_security`), for at most
    ``timeout`` seconds. librdkafka reports a refused login or a failed TLS handshake through its error callback and
    keeps retrying, so the metadata request is asked again every second and each report read in between: a refusal
    ends the probe at once."""
    from confluent_kafka.admin import AdminClient

    errors: list[str] = []
    # log_level 0: librdkafka's own lines (connection retries, ...) stay out of the applier's output; its errors
    # reach error_cb
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0, "socket.connection.setup.timeout.ms": 5000,
                         "error_cb": lambda err: errors.append(str(err.str())), **security})
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            names = set(admin.list_topics(timeout=max(0.1, min(1.0, left))).topics)
            return ProbeResult(topics=names, errors=tuple(errors))
        except Exception as exc:  # noqa: BLE001 - a timeout or a transport error: read the reports
            errors.append(str(exc))
        admin.poll(0)
        found = refusal("\n".join(errors), kafka)
        if found is not None:
            if found.key == option_key("ssl.truststore.location"):
                # librdkafka says only "certificate verify failed": ask once more with Python's TLS, which says why
                why = tls_verify_error(bootstrap, security)
                if why is not None:
                    found = refusal(why, kafka) or found
            return ProbeResult(refused=found, errors=tuple(errors))
        if time.monotonic() >= deadline:
            return ProbeResult(errors=tuple(errors))


def tls_verify_error(bootstrap: str, security: Mapping[str, str], timeout: float = 3.0) -> str | None:
    """Why the brokers' certificate does not verify, in OpenSSL's words (``Hostname mismatch``, ``IP address
    mismatch``, ``unable to get local issuer certificate``...), from a plain TLS handshake with the same trust and
    host name check as ``security`` (librdkafka form); None when it verifies or cannot be asked. Kafka's SSL and
    SASL_SSL listeners start with TLS, so no Kafka request is needed."""
    import socket
    import ssl

    if not str(security.get("security.protocol", "")).upper().endswith("SSL"):
        return None
    try:
        ctx = ssl.create_default_context(cafile=security.get("ssl.ca.location"), cadata=security.get("ssl.ca.pem"))
    except (OSError, ssl.SSLError, ValueError):
        return None
    ctx.check_hostname = security.get("ssl.endpoint.identification.algorithm", "https").lower() != "none"
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        host = host.strip("[]")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout) as sock:
                with ctx.wrap_socket(sock, server_hostname=host):
                    pass
        except ssl.SSLCertVerificationError as exc:
            return f"{server.strip()}: TLS handshake failed: certificate verify failed: {exc.verify_message}"
        except (OSError, ValueError):
            continue
    return None


__all__ = ["KafkaSettingError", "ProbeResult", "Refusal", "librdkafka_security", "option_key", "pkcs12_certificates",
           "probe", "refusal", "tls_verify_error"]
