"""A client for the Confluent Schema Registry REST API (and registries that speak it, e.g. Apicurio's
``/apis/ccompat/v7``). (An in-memory stand-in with the same methods, for pure unit tests, is
:class:`applier.devtools.encoders.registry.InMemoryRegistry`.)

Used by the Avro codec: every Confluent-framed Avro message names a schema id, and ids are immutable, so
``schema_by_id`` caches each answer for the life of the client. Only the standard library talks HTTP
(``urllib``); retries use tenacity.

URL forms: ``http://host:port[/path]`` and ``https://...``; the path is the API base (Confluent serves the API
at the root, Apicurio at ``/apis/ccompat/v7``). Credentials may be given as URL userinfo
(``http://user:p%40ss@host:8081``: percent-escapes are decoded) or as ``auth=(user, password)``, which wins;
they are sent as HTTP Basic authentication. The password never appears in a log line, an exception message or
a ``repr``: everything shows :attr:`RegistryClient.url`, the URL without userinfo.

Errors (all :class:`RegistryError`, a RuntimeError; each names the registry URL without credentials, what was
asked for and what to do):

* :class:`SchemaNotFound` - the registry answered 404 with a Confluent error code (40401 subject, 40402
  version, 40403 schema id): the thing does not exist there.
* :class:`RegistryAuthError` - HTTP 401/403: wrong or missing credentials.
* :class:`RegistryUnavailable` - connection refused, DNS failure, timeout, TLS failure, HTTP 5xx or 429,
  still failing after the retries: the registry could not be asked. Not a property of any message.
* :class:`RegistryError` itself - anything else (a 404 without a Confluent error code usually means the URL
  points at something that is not a schema registry, e.g. Apicurio's root instead of ``/apis/ccompat/v7``;
  a 409/422 on registration means an incompatible or invalid schema; a non-JSON answer).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

__all__ = [
    "RegisteredSchema",
    "RegistryAuthError",
    "RegistryClient",
    "RegistryError",
    "RegistryUnavailable",
    "SchemaNotFound",
    "SubjectVersion",
    "parse_registry_url",
]

log = logging.getLogger("applier.codecs.registry")

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
ACCEPT = "application/vnd.schemaregistry.v1+json, application/vnd.schemaregistry+json, application/json"
USER_AGENT = "ticdc-applier-registry-client"
_START_HINT = "start the local one with `python -m applier.devtools.services start --only registry`"


# ---------------------------------------------------------------------------------------------------------
# errors and results
# ---------------------------------------------------------------------------------------------------------


class RegistryError(RuntimeError):
    """The schema registry could not give what was asked. ``url`` never carries credentials."""

    def __init__(self, message: str, *, url: str = "", status: int | None = None,
                 error_code: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.error_code = error_code

    def __reduce__(self) -> tuple:
        # raised in a Spark Python worker, it travels to the driver pickled (applier.decode): keep every field
        return (_registry_error, (type(self), str(self), self.url, self.status, self.error_code))

    def with_context(self, context: str) -> "RegistryError":
        """The same error (same class and fields) with ``context`` appended to the message."""
        return type(self)(f"{self} ({context})", url=self.url, status=self.status, error_code=self.error_code)


def _registry_error(cls: type, message: str, url: str, status: int | None, error_code: int | None) -> RegistryError:
    return cls(message, url=url, status=status, error_code=error_code)


class SchemaNotFound(RegistryError):
    """404 with a Confluent error code: the schema id / subject / version does not exist in the registry."""


class RegistryAuthError(RegistryError):
    """401/403: the registry refused the credentials (or wants some)."""


class RegistryUnavailable(RegistryError):
    """The registry could not be reached or kept failing (connection, timeout, TLS, 5xx, 429)."""


@dataclass(frozen=True, slots=True)
class RegisteredSchema:
    """``GET /schemas/ids/{id}``: a schema as the registry stores it (``schema`` is the schema text)."""

    id: int
    schema: str
    schema_type: str = "AVRO"
    references: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True, slots=True)
class SubjectVersion:
    """``GET /subjects/{subject}/versions/{version}``."""

    subject: str
    version: int
    id: int
    schema: str
    schema_type: str = "AVRO"


class _Transient(Exception):
    """Internal: a failure worth retrying (the message is safe to show: it never carries credentials)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------------------
# URL handling
# ---------------------------------------------------------------------------------------------------------


def parse_registry_url(url: str) -> tuple[str, tuple[str, str] | None]:
    """``url`` -> (the URL without userinfo and without a trailing slash, (user, password) or None).

    Userinfo percent-escapes are decoded (``p%40ss`` -> ``p@ss``). Raises ValueError (naming the URL without
    its credentials) for anything but an absolute http(s) URL without query or fragment.
    """
    if not isinstance(url, str) or not url.strip():
        raise ValueError("schema registry URL is empty: give http(s)://host:port[/path]")
    try:
        parts = urllib.parse.urlsplit(url.strip())
    except ValueError:
        raise ValueError("schema registry URL cannot be parsed: give http(s)://host:port[/path]") from None
    hostport = parts.netloc.rsplit("@", 1)[-1]  # never the userinfo
    safe = urllib.parse.urlunsplit((parts.scheme, hostport, parts.path, "", "")).rstrip("/")
    if "@" in safe:  # userinfo that urlsplit did not recognise (no scheme): never echo it
        safe = "***@" + safe.rsplit("@", 1)[1]
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"schema registry URL {safe!r} must start with http:// or https://")
    try:
        port_ok = parts.port is None or 0 < parts.port
    except ValueError:
        port_ok = False
    if not parts.hostname or not port_ok:
        raise ValueError(f"schema registry URL {safe!r} has no valid host[:port]")
    if parts.query or parts.fragment:
        raise ValueError(f"schema registry URL {safe!r} must not have a query string or fragment")
    auth = None
    if parts.username is not None or parts.password is not None:
        auth = (urllib.parse.unquote(parts.username or ""), urllib.parse.unquote(parts.password or ""))
    return safe, auth


def _basic_header(user: str, password: str) -> str:
    token = base64.b64encode(f"{user}:{password}".encode("utf-8")).decode("ascii")
    return f"Basic {token}"


def _error_body(raw: bytes) -> tuple[int | None, str]:
    """(Confluent error_code, message) from an error response body, tolerating non-JSON bodies."""
    try:
        doc = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        text = raw.decode("utf-8", "replace").strip().replace("\n", " ")
        return None, text[:200]
    if isinstance(doc, dict):
        code = doc.get("error_code")
        msg = doc.get("message")
        return (code if isinstance(code, int) else None), (str(msg)[:300] if msg is not None else "")
    return None, str(doc)[:200]


# ---------------------------------------------------------------------------------------------------------
# the client
# ---------------------------------------------------------------------------------------------------------


class RegistryClient:
    """Confluent Schema Registry REST client: ``schema_by_id`` (cached), ``latest_version``, ``register``.

    ``timeout`` is per HTTP request (seconds). Transient failures (connection, timeout, 5xx, 429) are retried
    ``retries`` more times with exponential backoff starting at ``backoff`` seconds (capped at 5 s); 4xx
    answers are never retried. ``ssl_context`` is passed to urllib for https (default: system trust store);
    ``ca_file`` instead names a PEM file of the CA(s) to trust (the context is made at the first request, so the
    client stays picklable: decoders travel to Spark's workers).
    """

    def __init__(
        self,
        url: str,
        *,
        auth: tuple[str, str] | None = None,
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.25,
        ssl_context: ssl.SSLContext | None = None,
        ca_file: str | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.url, url_auth = parse_registry_url(url)
        if auth is not None:
            if not (isinstance(auth, (tuple, list)) and len(auth) == 2 and all(isinstance(a, str) for a in auth)):
                raise ValueError("auth must be a (user, password) pair of strings")
            url_auth = (auth[0], auth[1])
        self._user = url_auth[0] if url_auth else None
        self._auth_header = _basic_header(*url_auth) if url_auth else None
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries!r}")
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        if ca_file is not None and not os.path.isfile(ca_file):
            raise ValueError(f"registry_ca: {ca_file} does not exist or is not a file (a PEM file of the CA that "
                             "signed the registry's certificate)")
        self._ssl = ssl_context
        self._ca_file = ca_file
        self._sleep = sleep
        self._by_id: dict[int, RegisteredSchema] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # picklable (e.g. shipped inside a decoder): no lock
        state = self.__dict__.copy()
        del state["_lock"]
        if self._ca_file is not None:
            state["_ssl"] = None  # made again from ca_file where it lands
        return state

    def _context(self) -> ssl.SSLContext | None:
        if self._ssl is None and self._ca_file is not None:
            self._ssl = ssl.create_default_context(cafile=self._ca_file)
        return self._ssl

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        auth = f", auth=({self._user!r}, '***')" if self._auth_header else ""
        return f"RegistryClient({self.url!r}{auth})"

    __str__ = __repr__

    # -- public API ---------------------------------------------------------------------------------------

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """``GET /schemas/ids/{id}``; each id is fetched once and then served from the cache forever."""
        schema_id = int(schema_id)
        cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        what = f"schema id {schema_id}"
        doc = self._request("GET", f"/schemas/ids/{schema_id}", what=what)
        if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
            raise RegistryError(
                f"schema registry {self.url} answered {what} without a 'schema' string; "
                "check that the URL is the Confluent-compatible API base",
                url=self.url,
            )
        refs = doc.get("references") or ()
        result = RegisteredSchema(
            id=schema_id,
            schema=doc["schema"],
            schema_type=str(doc.get("schemaType") or "AVRO").upper(),
            references=tuple(refs) if isinstance(refs, list) else (),
        )
        with self._lock:
            self._by_id.setdefault(schema_id, result)
        return result

    def latest_version(self, subject: str) -> SubjectVersion:
        """``GET /subjects/{subject}/versions/latest`` (never cached: it changes)."""
        return self.version(subject, "latest")

    def version(self, subject: str, version: int | str = "latest") -> SubjectVersion:
        what = f"subject {subject!r} version {version}"
        quote = urllib.parse.quote
        path = f"/subjects/{quote(subject, safe='')}/versions/{quote(str(version), safe='')}"
        doc = self._request("GET", path, what=what)
        try:
            return SubjectVersion(
                subject=str(doc.get("subject", subject)),
                version=int(doc["version"]),
                id=int(doc["id"]),
                schema=str(doc["schema"]),
                schema_type=str(doc.get("schemaType") or "AVRO").upper(),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            raise RegistryError(
                f"schema registry {self.url} answered {what} with an unexpected document; "
                "check that the URL is the Confluent-compatible API base",
                url=self.url,
            ) from None

    def register(self, subject: str, schema: str | Mapping[str, Any], schema_type: str = "AVRO") -> int:
        """``POST /subjects/{subject}/versions``: register (or find) ``schema`` under ``subject``; its id."""
        text = schema if isinstance(schema, str) else json.dumps(schema, separators=(",", ":"))
        body: dict[str, Any] = {"schema": text}
        if schema_type.upper() != "AVRO":
            body["schemaType"] = schema_type.upper()
        what = f"registering a schema under subject {subject!r}"
        doc = self._request(
            "POST", f"/subjects/{urllib.parse.quote(subject, safe='')}/versions", what=what, body=body
        )
        try:
            schema_id = int(doc["id"])
        except (KeyError, TypeError, ValueError):
            raise RegistryError(
                f"schema registry {self.url} answered {what} without an id", url=self.url
            ) from None
        return schema_id

    def subjects(self) -> list[str]:
        """``GET /subjects``."""
        doc = self._request("GET", "/subjects", what="the subject list")
        if not isinstance(doc, list):
            raise RegistryError(f"schema registry {self.url} answered /subjects with a non-list", url=self.url)
        return [str(s) for s in doc]

    # -- HTTP ---------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, *, what: str, body: Any = None) -> Any:
        retrying = Retrying(
            stop=stop_after_attempt(self.retries + 1),
            wait=wait_exponential(multiplier=self.backoff, min=0, max=5),
            retry=retry_if_exception_type(_Transient),
            reraise=True,
            **({"sleep": self._sleep} if self._sleep is not None else {}),
        )
        try:
            return retrying(self._once, method, path, what, body)
        except _Transient as e:
            attempts = self.retries + 1
            raise RegistryUnavailable(
                f"schema registry {self.url} unavailable while fetching {what} "
                f"({attempts} attempt{'s' if attempts != 1 else ''}; last error: {e}); check that the registry "
                f"runs and that the URL is right ({_START_HINT})",
                url=self.url,
                status=e.status,
            ) from None

    def _once(self, method: str, path: str, what: str, body: Any) -> Any:
        headers = {"Accept": ACCEPT, "User-Agent": USER_AGENT}
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = CONTENT_TYPE
        if self._auth_header:
            headers["Authorization"] = self._auth_header
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        log.debug("schema registry %s: %s %s", self.url, method, path)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            try:
                raw_err = e.read()
            except Exception:  # noqa: BLE001 - the body is only used for the message
                raw_err = b""
            finally:
                e.close()
            self._raise_for_status(e.code, raw_err, what)
            raise AssertionError("unreachable")  # pragma: no cover
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, ssl.SSLError):
                raise _Transient(f"TLS error: {reason}") from None
            raise _Transient(f"cannot connect: {reason}") from None
        except (TimeoutError, OSError) as e:  # socket timeouts, resets, http.client errors (OSError subclasses)
            raise _Transient(f"{type(e).__name__}: {e}") from None
        except Exception as e:  # http.client.HTTPException (e.g. RemoteDisconnected, IncompleteRead)
            raise _Transient(f"{type(e).__name__}: {e}") from None
        if not raw:
            return None
        try:
            return json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise RegistryError(
                f"schema registry {self.url} answered {what} with something that is not JSON; check that the "
                "URL is the Confluent-compatible API base (Apicurio: http://host:port/apis/ccompat/v7)",
                url=self.url,
            ) from None

    def _raise_for_status(self, status: int, raw: bytes, what: str) -> None:
        code, message = _error_body(raw)
        detail = f"HTTP {status}" + (f" error_code {code}" if code is not None else "") + (
            f": {message}" if message else ""
        )
        if status in (429,) or status >= 500:
            raise _Transient(detail, status)
        if status in (401, 403):
            raise RegistryAuthError(
                f"schema registry {self.url} refused {what} ({detail}); check the credentials "
                "(URL userinfo http://user:password@host or the auth option)",
                url=self.url, status=status, error_code=code,
            )
        if status == 404 and code is not None and 40400 <= code <= 40499:
            raise SchemaNotFound(
                f"schema registry {self.url} has no {what} ({detail}); the producer must register it first, or "
                "this registry is not the one the producer (TiCDC's changefeed) writes to",
                url=self.url, status=status, error_code=code,
            )
        if status == 404:
            raise RegistryError(
                f"schema registry {self.url} answered {what} with {detail}; the URL does not look like a "
                "Confluent-compatible API base (for Apicurio use http://host:port/apis/ccompat/v7)",
                url=self.url, status=status, error_code=code,
            )
        raise RegistryError(
            f"schema registry {self.url} rejected {what} ({detail})",
            url=self.url, status=status, error_code=code,
        )
