"""Test certificates: a CA and the certificates it signs, made with the ``cryptography`` package, for the TLS
services (a SASL_SSL Kafka broker, MariaDB and PostgreSQL with TLS: applier.devtools.services) and the tests that
check what verifies and what does not.

    ca = make_ca(tmp / "ca")                                    # ca.cert_path: the PEM file clients trust
    server = ca.issue(tmp / "server", ["localhost", "127.0.0.1"])  # server.cert_path, server.key_path, server.pem_path
    other = ca.issue(tmp / "other", ["db.other.example"])          # signed by the same CA, for another host
    java_truststore(ca.cert_path, tmp / "trust.p12", password_file)  # PKCS12 with Java's trusted-cert entry

Keys are EC P-256 (fast to make; every client here speaks it). Names that parse as IP addresses go in as IP
subject alternative names, the others as DNS names. Everything is valid from a day ago for 30 days.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class Issued:
    """A certificate and its key as files: ``cert_path`` (PEM certificate), ``key_path`` (PEM PKCS#8 key, mode 0600),
    ``pem_path`` (key then certificate chain in one file: what Kafka's ``ssl.keystore.type = PEM`` reads)."""

    folder: Path
    cert_path: Path
    key_path: Path
    pem_path: Path


@dataclass(frozen=True)
class CA:
    cert_path: Path
    key_path: Path

    def issue(self, folder: Path, names: Sequence[str], *, client: bool = False) -> Issued:
        """A certificate for ``names`` (server authentication; ``client`` also client authentication)."""
        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_key = _load_key(self.key_path)
        ca_cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        key = _new_key()
        alt: list[x509.GeneralName] = []
        for n in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                alt.append(x509.DNSName(n))
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        cert = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]), ca_cert.subject, key)
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .sign(ca_key, _hash()))
        return _write(folder, key, [cert, ca_cert])


def make_ca(folder: Path, name: str = "applier test CA") -> CA:
    """A new self-signed CA in ``folder`` (``ca.pem``, ``ca.key``)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (_builder(subject, subject, key)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, _hash()))
    issued = _write(folder, key, [cert], cert_name="ca.pem", key_name="ca.key")
    return CA(issued.cert_path, issued.key_path)


def java_truststore(ca_pem: Path, path: Path, password_file: Path, store_type: str = "PKCS12") -> Path:
    """A trust store (PKCS12, or ``store_type`` "JKS") holding ``ca_pem`` as a trusted certificate, as Java's clients
    read it, made by the JDK's own ``keytool`` (so the entry carries Java's trusted-certificate attribute); its
    password is read from ``password_file`` (never on a command line)."""
    from applier.devtools.services.common import JAVA_PACKAGE, ensure_command

    java = Path(os.path.realpath(ensure_command("java", JAVA_PACKAGE, "keytool comes with Java")))
    keytool = java.parent / "keytool"
    path.unlink(missing_ok=True)
    r = subprocess.run([str(keytool), "-importcert", "-noprompt", "-alias", "ca", "-file", str(ca_pem),
                        "-keystore", str(path), "-storetype", store_type, "-storepass:file", str(password_file)],
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"keytool -importcert failed: {r.stdout}{r.stderr}")
    return path


# ---- helpers ---------------------------------------------------------------------------------------------------

def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _hash():
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


def _load_key(path: Path):
    from cryptography.hazmat.primitives import serialization

    return serialization.load_pem_private_key(path.read_bytes(), password=None)


def _builder(subject, issuer, key):
    from cryptography import x509

    now = dt.datetime.now(dt.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30)))


def _write(folder: Path, key, chain, *, cert_name: str = "cert.pem", key_name: str = "key.pem") -> Issued:
    from cryptography.hazmat.primitives import serialization

    folder.mkdir(parents=True, exist_ok=True)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    certs_pem = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)
    cert_path, key_path, pem_path = folder / cert_name, folder / key_name, folder / "keystore.pem"
    cert_path.write_bytes(certs_pem)
    for p, data in ((key_path, key_pem), (pem_path, key_pem + certs_pem)):
        p.touch(mode=0o600)
        p.chmod(0o600)
        p.write_bytes(data)
    return Issued(folder, cert_path, key_path, pem_path)


__all__ = ["CA", "Issued", "java_truststore", "make_ca"]
