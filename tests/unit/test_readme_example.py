"""The README's production-shaped configuration (issue 27, point 4) is one `applier validate` accepts: the block after
``<!-- production-example -->`` in the configuration reference, run as it is, with only its secret and certificate
folders moved under a temporary directory (where this test writes the files it names)."""

from __future__ import annotations

import re
from pathlib import Path

from applier.cli import main
from applier.config import load_config
from applier.devtools.certs import java_truststore, make_ca

README = Path(__file__).resolve().parents[2] / "README.md"
SECRETS = "/var/run/secrets/applier/"
TLS = "/etc/applier/tls/"


def example() -> str:
    text = README.read_text()
    m = re.search(r"<!-- production-example -->\n```toml\n(.*?)\n```", text, re.S)
    assert m, "the README lost its production example"
    return m.group(1)


def test_the_readme_production_example_validates_and_shows_no_secret(tmp_path, capsys) -> None:
    toml = example()
    for needed in ('"security.protocol" = "SASL_SSL"', "sasl.jaas.config", "ssl.truststore.location", "registry_url",
                   "registry_ca", "password_file", 'ssl_mode = "verify-full"', "ssl_ca", "${file:"):
        assert needed in toml, needed  # what point 4 asks the example to show
    secrets_dir, tls_dir = tmp_path / "secrets", tmp_path / "tls"
    secrets_dir.mkdir()
    tls_dir.mkdir()
    values = {}
    for name in sorted(set(re.findall(re.escape(SECRETS) + r"([\w.-]+)", toml))):
        values[name] = f"{name}-S3cr3t-value"
        (secrets_dir / name).write_text(values[name] + "\n")
    ca = make_ca(tmp_path / "ca")
    for name in sorted(set(re.findall(re.escape(TLS) + r"([\w.-]+)", toml))):
        if name.endswith(".p12"):
            java_truststore(ca.cert_path, tls_dir / name, secrets_dir / "kafka-truststore-password")
        else:
            (tls_dir / name).write_bytes(ca.cert_path.read_bytes())
    cfg = tmp_path / "shop.toml"
    cfg.write_text(toml.replace(SECRETS, f"{secrets_dir}/").replace(TLS, f"{tls_dir}/"))

    assert main(["validate", "-c", str(cfg)]) == 0
    out = capsys.readouterr()
    assert f"{cfg}: OK" in out.err
    for secret in values.values():
        assert secret not in out.out + out.err

    s = load_config(cfg, env={})
    assert s.target.ssl_mode == "verify-full" and s.target.ssl_ca == str(tls_dir / "pg-ca.pem")
    assert s.target_url().password == values["pg-password"]
    assert f'password="{values["kafka-password"]}"' in s.source.kafka["sasl.jaas.config"]
    assert s.source.kafka["ssl.truststore.password"] == values["kafka-truststore-password"]
    assert values["registry-password"] in s.source.codec["registry_url"]
    from applier.kafka_security import librdkafka_security

    sec = librdkafka_security(s.source.kafka)  # the probe and the lag gauge can log in with it
    assert sec is not None and sec["sasl.password"] == values["kafka-password"] and "BEGIN CERTIFICATE" in sec[
        "ssl.ca.pem"]
