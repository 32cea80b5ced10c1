"""The Confluent Schema Registry REST client: URL forms, credentials never shown, caching, error paths.

The error paths run against a small fake HTTP server in this process on 127.0.0.1 (status codes, bodies and
delays a real registry cannot be made to produce on demand). The real registry is exercised in
tests/e2e/test_registry_service.py.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from applier.codecs.registry import (
    RegistryAuthError,
    RegistryClient,
    RegistryError,
    RegistryUnavailable,
    SchemaNotFound,
    parse_registry_url,
)
from applier.devtools.encoders.registry import InMemoryRegistry

SCHEMA = json.dumps({"type": "record", "name": "t", "fields": [{"name": "a", "type": "int"}]})
PASSWORD = "p@ss:w/rd%"
USER = "us er"
URL_USERINFO = "us%20er:p%40ss%3Aw%2Frd%25"


class FakeRegistry:
    """Scripted answers per path: a list of (status, body, delay) consumed in order (the last one repeats)."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[tuple[int, bytes, float]]] = {}
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.requests.append((self.command, self.path, dict(self.headers), body))
                script = outer.routes.get((self.command, self.path)) or [(404, b"<html>no route</html>", 0.0)]
                status, payload, delay = script.pop(0) if len(script) > 1 else script[0]
                if delay:
                    time.sleep(delay)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _serve

            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def route(self, method: str, path: str, *answers) -> None:
        self.routes[(method, path)] = [
            (a[0], a[1] if isinstance(a[1], bytes) else json.dumps(a[1]).encode(), a[2] if len(a) > 2 else 0.0)
            for a in answers
        ]

    def count(self, method: str, path: str) -> int:
        return sum(1 for m, p, _, _ in self.requests if (m, p) == (method, path))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    f = FakeRegistry()
    yield f
    f.close()


def client(url: str, **kw) -> RegistryClient:
    kw.setdefault("retries", 2)
    kw.setdefault("backoff", 0)
    kw.setdefault("timeout", 2)
    return RegistryClient(url, **kw)


# ---------------------------------------------------------------------------------------------------------
# URL forms and credentials
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url, base, auth", [
    ("http://127.0.0.1:8081", "http://127.0.0.1:8081", None),
    ("http://127.0.0.1:8081/", "http://127.0.0.1:8081", None),
    ("https://registry.example:443/apis/ccompat/v7/", "https://registry.example:443/apis/ccompat/v7", None),
    (f"https://{URL_USERINFO}@reg.example/x", "https://reg.example/x", (USER, PASSWORD)),
    ("http://user@h:1", "http://h:1", ("user", "")),
    ("http://[::1]:8081", "http://[::1]:8081", None),
])
def test_url_forms(url, base, auth):
    assert parse_registry_url(url) == (base, auth)


@pytest.mark.parametrize("url, fragment", [
    ("ftp://h:1", "http:// or https://"),
    ("h:8081", "http:// or https://"),
    ("http://", "no valid host"),
    ("http://h:99999", "no valid host"),
    ("http://h:1/?x=1", "query string"),
    ("", "empty"),
    (f"ftp://{URL_USERINFO}@h", "http:// or https://"),
    (f"{URL_USERINFO}@h:8081", "http:// or https://"),
])
def test_bad_urls_name_the_url_without_credentials(url, fragment):
    with pytest.raises(ValueError) as ei:
        RegistryClient(url)
    assert fragment in str(ei.value)
    assert "p@ss" not in str(ei.value) and "p%40ss" not in str(ei.value)


def test_repr_hides_the_password():
    c = RegistryClient(f"http://{URL_USERINFO}@127.0.0.1:1")
    for text in (repr(c), str(c)):
        assert "p@ss" not in text and "p%40ss" not in text and PASSWORD not in text
        assert "127.0.0.1:1" in text and "***" in text
    assert c.url == "http://127.0.0.1:1"
    c2 = RegistryClient("http://127.0.0.1:1", auth=("bob", "hunter2"))
    assert "hunter2" not in repr(c2) and "bob" in repr(c2)
    with pytest.raises(ValueError, match="auth must be"):
        RegistryClient("http://127.0.0.1:1", auth=("only-user",))


def test_basic_auth_is_sent_decoded_and_never_shown(fake, caplog):
    fake.route("GET", "/schemas/ids/1", (200, {"schema": SCHEMA}))
    fake.route("GET", "/schemas/ids/2", (401, {"error_code": 40101, "message": "Unauthorized"}))
    caplog.set_level(logging.DEBUG, logger="applier.codecs.registry")
    c = client(f"http://{URL_USERINFO}@127.0.0.1:{fake.port}")
    assert c.schema_by_id(1).schema == SCHEMA
    _, _, headers, _ = fake.requests[0]
    expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    assert headers["Authorization"] == expected
    with pytest.raises(RegistryAuthError) as ei:
        c.schema_by_id(2)
    assert fake.count("GET", "/schemas/ids/2") == 1  # never retried
    text = str(ei.value)
    assert "HTTP 401" in text and "credentials" in text and f"127.0.0.1:{fake.port}" in text
    secrets = (PASSWORD, "p%40ss", expected.split()[1])
    for s in secrets:
        assert s not in text and s not in repr(ei.value) and s not in caplog.text
    # auth= wins over URL userinfo
    c2 = client(f"http://x:y@127.0.0.1:{fake.port}", auth=("bob", "hunter2"))
    c2.schema_by_id(1)
    assert fake.requests[-1][2]["Authorization"] == "Basic " + base64.b64encode(b"bob:hunter2").decode()


# ---------------------------------------------------------------------------------------------------------
# success paths
# ---------------------------------------------------------------------------------------------------------


def test_schema_by_id_is_cached_forever(fake):
    fake.route("GET", "/apis/ccompat/v7/schemas/ids/7", (200, {"schema": SCHEMA, "schemaType": "AVRO",
                                                                "references": []}))
    c = client(f"{fake.url}/apis/ccompat/v7/")
    for _ in range(5):
        s = c.schema_by_id(7)
    assert (s.id, s.schema, s.schema_type, s.references) == (7, SCHEMA, "AVRO", ())
    assert fake.count("GET", "/apis/ccompat/v7/schemas/ids/7") == 1
    _, _, headers, _ = fake.requests[0]
    assert "application/vnd.schemaregistry.v1+json" in headers["Accept"]


def test_latest_version_and_register(fake):
    fake.route("GET", "/subjects/a%2Fb.c-value/versions/latest",
               (200, {"subject": "a/b.c-value", "version": 3, "id": 9, "schema": SCHEMA}))
    fake.route("POST", "/subjects/a%2Fb.c-value/versions", (200, {"id": 9}))
    fake.route("GET", "/subjects", (200, ["a/b.c-value"]))
    c = client(fake.url)
    v = c.latest_version("a/b.c-value")
    assert (v.subject, v.version, v.id, v.schema, v.schema_type) == ("a/b.c-value", 3, 9, SCHEMA, "AVRO")
    assert fake.count("GET", "/subjects/a%2Fb.c-value/versions/latest") == 1
    c.latest_version("a/b.c-value")
    assert fake.count("GET", "/subjects/a%2Fb.c-value/versions/latest") == 2  # never cached
    assert c.register("a/b.c-value", json.loads(SCHEMA)) == 9
    method, path, headers, body = fake.requests[-1]
    assert headers["Content-Type"] == "application/vnd.schemaregistry.v1+json"
    assert json.loads(body) == {"schema": json.dumps(json.loads(SCHEMA), separators=(",", ":"))}
    assert c.subjects() == ["a/b.c-value"]


def test_transient_errors_are_retried(fake):
    fake.route("GET", "/schemas/ids/3", (500, b"oops"), (503, {"error_code": 50301, "message": "busy"}),
               (200, {"schema": SCHEMA}))
    assert client(fake.url, retries=2).schema_by_id(3).schema == SCHEMA
    assert fake.count("GET", "/schemas/ids/3") == 3


# ---------------------------------------------------------------------------------------------------------
# error paths
# ---------------------------------------------------------------------------------------------------------


def test_not_found_names_the_id_and_what_to_do(fake):
    fake.route("GET", "/schemas/ids/404", (404, {"error_code": 40403, "message": "Schema 404 not found"}))
    fake.route("GET", "/subjects/nope/versions/latest",
               (404, {"error_code": 40401, "message": "Subject not found"}))
    c = client(fake.url)
    with pytest.raises(SchemaNotFound) as ei:
        c.schema_by_id(404)
    text = str(ei.value)
    assert "schema id 404" in text and "40403" in text and fake.url in text and "register" in text
    assert ei.value.status == 404 and ei.value.error_code == 40403
    assert fake.count("GET", "/schemas/ids/404") == 1
    with pytest.raises(SchemaNotFound, match="subject 'nope'"):
        c.latest_version("nope")


def test_unavailable_after_retries(fake):
    fake.route("GET", "/schemas/ids/5", (503, {"error_code": 50301, "message": "down for maintenance"}))
    slept: list[float] = []
    c = RegistryClient(fake.url, retries=3, backoff=0.01, timeout=2, sleep=slept.append)
    with pytest.raises(RegistryUnavailable) as ei:
        c.schema_by_id(5)
    assert fake.count("GET", "/schemas/ids/5") == 4
    assert len(slept) == 3 and slept == sorted(slept)  # exponential backoff
    text = str(ei.value)
    assert "4 attempts" in text and "HTTP 503" in text and "down for maintenance" in text
    assert "schema id 5" in text and fake.url in text and "--only registry" in text


def test_connection_refused_and_timeouts(fake):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(RegistryUnavailable, match="cannot connect") as ei:
        client(f"http://u:topsecret@127.0.0.1:{port}", retries=0).schema_by_id(1)
    assert "1 attempt;" in str(ei.value) and "topsecret" not in str(ei.value)
    fake.route("GET", "/schemas/ids/8", (200, {"schema": SCHEMA}, 1.5))
    t0 = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="timed out"):
        client(fake.url, retries=1, timeout=0.3).schema_by_id(8)
    assert time.monotonic() - t0 < 1.5


def test_https_against_a_plain_http_server_is_a_tls_error(fake):
    with pytest.raises(RegistryUnavailable, match="TLS|SSL|cannot connect"):
        client(f"https://127.0.0.1:{fake.port}", retries=0).schema_by_id(1)


def test_not_a_registry(fake):
    c = client(fake.url)
    with pytest.raises(RegistryError, match="ccompat/v7") as ei:
        c.schema_by_id(1)  # 404 with an HTML body: wrong base path
    assert not isinstance(ei.value, SchemaNotFound)
    fake.route("GET", "/schemas/ids/2", (200, b"<html>hello</html>"))
    with pytest.raises(RegistryError, match="not JSON"):
        c.schema_by_id(2)
    fake.route("GET", "/schemas/ids/3", (200, {"no": "schema"}))
    with pytest.raises(RegistryError, match="without a 'schema'"):
        c.schema_by_id(3)
    fake.route("POST", "/subjects/s/versions", (422, {"error_code": 42201, "message": "Invalid schema"}))
    with pytest.raises(RegistryError, match="rejected registering a schema under subject 's'.*42201"):
        c.register("s", "{bad")
    assert fake.count("POST", "/subjects/s/versions") == 1


def test_with_context_keeps_class_and_fields():
    e = RegistryUnavailable("registry down", url="http://h:1", status=503, error_code=50301)
    e2 = e.with_context("needed for x")
    assert type(e2) is RegistryUnavailable and str(e2) == "registry down (needed for x)"
    assert (e2.url, e2.status, e2.error_code) == ("http://h:1", 503, 50301)


# ---------------------------------------------------------------------------------------------------------
# in-memory stand-in
# ---------------------------------------------------------------------------------------------------------


def test_in_memory_registry_semantics():
    r = InMemoryRegistry()
    a = r.register("t-value", SCHEMA)
    assert r.register("t-value", json.loads(SCHEMA)) == a  # same schema (any spelling) -> same id
    assert r.register("u-value", SCHEMA) == a  # ids are global, as in Confluent's registry
    b = r.register("t-value", SCHEMA.replace('"int"', '"long"'))
    assert b != a and r.latest_version("t-value").version == 2 and r.latest_version("t-value").id == b
    assert r.schema_by_id(a).schema == SCHEMA and r.subjects() == ["t-value", "u-value"]
    with pytest.raises(SchemaNotFound, match="schema id 99"):
        r.schema_by_id(99)
    with pytest.raises(SchemaNotFound, match="subject 'x'"):
        r.latest_version("x")


# ---------------------------------------------------------------------------------------------------------
# the local registry service's pure helpers (no Maven, no server here; see tests/e2e/test_registry_service.py)
# ---------------------------------------------------------------------------------------------------------


def test_registry_service_is_optional_and_configurable(monkeypatch):
    from applier.devtools import services

    assert services.normalize_only(None) == ["kafka", "mariadb", "postgres"]
    assert services.normalize_only("registry") == ["registry"]
    assert services.normalize_only("apicurio,kafka") == ["kafka", "registry"]
    assert "registry" in services.normalize_only(None, default=services.ALL_SERVICES)
    monkeypatch.delenv("APPLIER_REGISTRY_PORT", raising=False)
    assert services.urls().registry_url == "http://127.0.0.1:18081/apis/ccompat/v7"
    assert services.Urls("k", "m", "p").registry_url == services.urls().registry_url
    monkeypatch.setenv("APPLIER_REGISTRY_PORT", "28081")
    assert services.urls().registry_url == "http://127.0.0.1:28081/apis/ccompat/v7"
    assert services.url_for("registry") == "http://127.0.0.1:28081/apis/ccompat/v7"
    u = services.build_urls(1, 2, 3, registry_port=4)
    assert len(services.env_lines(u)) == 3
    assert services.env_lines(u, registry=True)[-1] == "export APPLIER_REGISTRY_URL=http://127.0.0.1:4/apis/ccompat/v7"
    monkeypatch.setenv("APPLIER_REGISTRY_PORT", "x")
    with pytest.raises(services.ServicesError, match="APPLIER_REGISTRY_PORT"):
        services.urls()


def test_registry_service_command_and_maven_coordinates(tmp_path):
    from applier.devtools.services import registry as R
    from applier.jars import MAVEN_DEPENDENCY_PLUGIN

    cmd = R.command(tmp_path / "app-runner.jar", 18099)
    assert cmd[-2:] == ["-jar", str(tmp_path / "app-runner.jar")]
    assert "-Dquarkus.http.host=127.0.0.1" in cmd and "-Dquarkus.http.port=18099" in cmd
    assert R.coordinates() == "io.apicurio:apicurio-registry-app:3.0.9:tar.gz:all"
    assert R.artifact_path() == (
        "io/apicurio/apicurio-registry-app/3.0.9/apicurio-registry-app-3.0.9-all.tar.gz")
    copy = R.mvn_copy_command(tmp_path)
    assert f"{MAVEN_DEPENDENCY_PLUGIN}:copy" in copy and MAVEN_DEPENDENCY_PLUGIN.endswith(":3.8.1")
    assert f"-Dartifact={R.coordinates()}" in copy
    wagon = R.mvn_wagon_command(R.MAVEN_CENTRAL, R.artifact_path(), tmp_path / "x.tar.gz")
    assert "org.codehaus.mojo:wagon-maven-plugin:2.0.2:download-single" in wagon
    assert f"-Dwagon.fromFile={R.artifact_path()}" in wagon
    assert R.registry_url(18099) == "http://127.0.0.1:18099/apis/ccompat/v7"


def test_client_and_decoder_pickle(fake):
    import pickle

    from applier.codecs.avro import AvroDecoder

    fake.route("GET", "/schemas/ids/1", (200, {"schema": SCHEMA}))
    c = client(fake.url)
    c.schema_by_id(1)
    c2 = pickle.loads(pickle.dumps(c))
    assert c2.schema_by_id(1).schema == SCHEMA and fake.count("GET", "/schemas/ids/1") == 1  # cache kept
    d = pickle.loads(pickle.dumps(AvroDecoder(fake.url)))
    assert d.registry.url == fake.url
