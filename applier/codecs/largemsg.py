"""TiCDC's large-message variants, shared by the Open Protocol, Canal-JSON and Simple decoders.

A changefeed whose row message is larger than ``max-message-bytes`` either fails or, with
``[sink.kafka-config.large-message-handle]``, sends a smaller message instead (docs/large-messages.md has the
byte layouts and where each fact was read in TiCDC's source):

* ``large-message-handle-option = "claim-check"``: the full message is written to external storage
  (``claim-check-storage-uri``) as ``<uuid>.json`` and Kafka gets a message with only the handle-key columns and
  the file's location. The file is Go's JSON of ``{"key": <bytes>, "value": <bytes>}`` (``[]byte`` is base64;
  a nil key is ``null``): the Kafka key and value the full message would have had. With
  ``claim-check-raw-value = true`` (Canal-JSON and Simple only) the file holds the bare value instead.
  :class:`ClaimCheckStore` reads it.
* ``large-message-handle-option = "handle-key-only"``: Kafka gets only the handle-key columns; the consumer reads
  the row from the upstream TiDB as of the commit ts (the old row of an UPDATE as of commit ts - 1).
  :class:`Upstream` does, with ``SET @@tidb_snapshot``.
* ``large-message-handle-compression = "snappy" | "lz4"``: independently of the option above, every value the
  encoder builds (Open Protocol: each row/DDL event's value inside the batch; Canal-JSON and Simple: the whole
  Kafka value) is compressed - Snappy's block format or an LZ4 frame. Nothing in the message says so: the
  decoder must be told (``large_message_handle_compression``). :func:`decompress` undoes it.

Decoders hold one :class:`LargeMessages` built from their ``[source.codec]`` options. It only validates at
construction (the config check builds every decoder once): the storage and the upstream are opened on first use,
so a decoder stays cheap to build, and picklable, in Spark's Python workers.

Everything wrong with one message (a location outside ``claim_check_uri``, a file that is missing, unreadable
after retries, too large or not TiCDC's layout, a payload that does not decompress, a row that is not in the
upstream at that ts) raises :class:`~applier.codecs.base.Malformed`, which the decoders turn into a DecodeError
naming the message's position, so ``pipeline.on_decode_error`` applies and nothing of the message is applied.
"""

from __future__ import annotations

import base64
import binascii
import importlib
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

import orjson

from applier.codecs.base import Malformed, UpstreamUnusable

__all__ = [
    "COMPRESSIONS",
    "MAX_PAYLOAD_BYTES",
    "ClaimCheckStore",
    "LargeMessages",
    "Upstream",
    "UpstreamColumn",
    "UpstreamRow",
    "decompress",
    "parse_claim_check_file",
]

#: ``large-message-handle-compression`` values (TiCDC pkg/compression/compress.go)
COMPRESSIONS = ("none", "snappy", "lz4")
#: The largest claim-check file or decompressed payload read (TiDB's largest row, 120 MiB with
#: txn-entry-size-limit, base64'd twice on the way, stays below it). A message asking for more is refused, so a
#: hostile one cannot make the applier allocate without bound.
MAX_PAYLOAD_BYTES = 512 << 20

# Retries of one read (claim-check storage, upstream): transient failures only (module attributes: tests shorten)
RETRY_ATTEMPTS = 5
RETRY_WAIT_MAX = 5.0

# A claim-check file name: TiCDC writes "<uuid v4>.json" (pkg/sink/kafka/claimcheck NewFileName). Anything with a
# path separator, a leading dot or odd characters is refused before the storage is asked.
_FILE_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}")
_S3_PARAMS = {"endpoint", "region", "force-path-style"}
_S3_SECRET_PARAMS = {"access-key", "secret-access-key", "session-token", "access_key", "secret_access_key"}


def _option(name: str) -> str:
    return f"source.codec.{name}"


# ---------------------------------------------------------------------------------------------------------
# Compression
# ---------------------------------------------------------------------------------------------------------


def check_compression(value: Any) -> str:
    """The ``large_message_handle_compression`` option, validated ("" means "none")."""
    if value in ("", None):
        return "none"
    if not isinstance(value, str) or value.lower() not in COMPRESSIONS:
        raise ValueError(f"large_message_handle_compression must be one of {', '.join(COMPRESSIONS)} "
                         f"(the changefeed's large-message-handle-compression), got {value!r}")
    return value.lower()


def decompress(method: str, data: bytes | bytearray | memoryview, what: str) -> bytes:
    """Undo ``large-message-handle-compression``: Snappy block format (Go's ``snappy.Encode``) or an LZ4 frame
    (``lz4.NewWriter``). Raises Malformed for a payload that does not decompress or would exceed
    :data:`MAX_PAYLOAD_BYTES`."""
    if method == "none":
        return bytes(data)
    import cramjam

    data = bytes(data)
    try:
        if method == "snappy":
            size = cramjam.snappy.decompress_raw_len(data)
            if size > MAX_PAYLOAD_BYTES:
                raise Malformed(f"{what} would decompress to {size} bytes, more than the {MAX_PAYLOAD_BYTES} "
                                "this applier reads")
            return bytes(cramjam.snappy.decompress_raw(data))
        if method == "lz4":
            return _lz4_bounded(cramjam, data, what)
    except cramjam.DecompressionError as e:
        raise Malformed(f"{what} is not valid {method} data (source.codec.large_message_handle_compression = "
                        f"\"{method}\" must match the changefeed's large-message-handle-compression): {e}") from None
    raise Malformed(f"unknown compression {method!r}")  # pragma: no cover - check_compression guards


def _lz4_bounded(cramjam: Any, data: bytes, what: str) -> bytes:
    """An LZ4 frame, decompressed into a buffer that grows 4x while too small, up to the cap (TiCDC's frames do not
    carry the content size, and an unbounded decompression would let a tiny message claim gigabytes)."""
    size = max(1 << 16, 4 * len(data))
    while True:
        buf = bytearray(min(size, MAX_PAYLOAD_BYTES + 1))
        try:
            n = cramjam.lz4.decompress_into(data, buf)
        except cramjam.DecompressionError as e:
            if "whole buffer" in str(e) and len(buf) <= MAX_PAYLOAD_BYTES:
                size *= 4
                continue
            if "whole buffer" in str(e):
                raise Malformed(f"{what} would decompress to more than the {MAX_PAYLOAD_BYTES} bytes this applier "
                                "reads") from None
            raise
        if n > MAX_PAYLOAD_BYTES:
            raise Malformed(f"{what} would decompress to more than the {MAX_PAYLOAD_BYTES} bytes this applier reads")
        return bytes(memoryview(buf)[:n])


# ---------------------------------------------------------------------------------------------------------
# Claim-check storage
# ---------------------------------------------------------------------------------------------------------


def parse_claim_check_file(data: bytes, raw_value: bool, where: str) -> tuple[bytes | None, bytes]:
    """A claim-check file -> (Kafka key, Kafka value) of the full message. TiCDC writes Go's JSON of
    ``ClaimCheckMessage{Key, Value []byte}`` (base64 strings; ``null`` for a nil key), or with
    ``claim-check-raw-value`` the bare value (key None)."""
    if raw_value:
        return None, data
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise Malformed(f"claim-check file {where} is not TiCDC's JSON {{\"key\", \"value\"}} (if the changefeed "
                        f"sets claim-check-raw-value = true, set claim_check_raw_value = true too): {e}") from None
    if type(obj) is not dict or "value" not in obj:
        raise Malformed(f"claim-check file {where} is not TiCDC's JSON {{\"key\", \"value\"}}")
    out: list[bytes | None] = []
    for field in ("key", "value"):
        v = obj.get(field)
        if v is None:
            out.append(None)
            continue
        if type(v) is not str:
            raise Malformed(f"claim-check file {where}: '{field}' must be a base64 string or null")
        try:
            out.append(base64.b64decode(v, validate=True))
        except (binascii.Error, ValueError):
            raise Malformed(f"claim-check file {where}: '{field}' is not valid base64") from None
    key, value = out
    if value is None:
        raise Malformed(f"claim-check file {where} has no value")
    return key, value


def _retrying(transient: Callable[[BaseException], bool]) -> Any:
    """The retry loop of a claim-check or upstream read: RETRY_ATTEMPTS tries with exponential backoff while the
    failure is ``transient``, then the last error is raised."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    return Retrying(stop=stop_after_attempt(RETRY_ATTEMPTS), wait=wait_exponential(multiplier=0.2, max=RETRY_WAIT_MAX),
                    retry=retry_if_exception(transient), reraise=True)


def _transient(exc: BaseException) -> bool:
    """Worth another try: anything but a definite answer about the file itself."""
    return not isinstance(exc, (Malformed, FileNotFoundError, PermissionError, IsADirectoryError,
                                NotADirectoryError, ValueError, TypeError))


class ClaimCheckStore:
    """Reads claim-check files from one folder of a file system (``file://``) or an S3 bucket (``s3://``), through
    fsspec (s3fs for S3).

    What a message may name (decided here, documented in the README): a location is read only when it is
    ``<claim_check_location_prefix>/<name>`` - the prefix defaults to ``claim_check_uri``, i.e. exactly the folder
    TiCDC's ``claim-check-storage-uri`` names - with ``<name>`` one plain file name (letters, digits, ``._-``, no
    leading dot); the file read is then ``<claim_check_uri>/<name>``. Anything else (another folder or bucket,
    ``..``, a query, another scheme) is refused without touching the storage, so a hostile message cannot make the
    applier read any other file. For ``file://`` the resolved path (symlinks followed) must stay inside the folder.

    S3 credentials come from the environment (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/
    ``AWS_SESSION_TOKEN``, ``AWS_PROFILE``, an instance role: botocore's chain); ``claim_check_uri`` may carry
    TiCDC's ``endpoint``, ``region`` and ``force-path-style`` parameters (an S3-compatible store), never keys.
    """

    def __init__(self, uri: str, location_prefix: str = "") -> None:
        self.uri = uri
        self.scheme, self.base, self._s3 = _parse_storage_uri(uri, "claim_check_uri")
        if location_prefix:
            scheme, base, _ = _parse_storage_uri(location_prefix, "claim_check_location_prefix", location=True)
            self._prefix = (scheme, base)
        else:
            self._prefix = (self.scheme, self.base)
        self._fs: Any = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_fs"] = None  # reopened on first use in the process that unpickles it
        return state

    # -- which file a location names ------------------------------------------------------------------------

    def file_name(self, location: Any) -> str:
        """The file name a message's location names, or Malformed when the location is not allowed."""
        if type(location) is not str or not location:
            raise Malformed(f"claim-check location must be a non-empty string (got {location!r:.80})")
        where = f"claim-check location {location!r:.300}"
        if any(c in location for c in "?#\\\x00") or any(ord(c) < 0x20 for c in location):
            raise Malformed(f"{where} is not allowed: it holds a query, a fragment or control characters")
        head, _, name = location.rpartition("/")
        if not _FILE_NAME_RE.fullmatch(name) or name in (".", ".."):
            raise Malformed(f"{where} is not allowed: {name!r:.80} is not a plain file name")
        try:
            scheme, base, _ = _parse_storage_uri(head, "", location=True)
        except ValueError:
            scheme, base = "", ""
        if (scheme, base) != self._prefix or ".." in head.split("/"):
            raise Malformed(f"{where} is outside the claim-check storage this applier reads "
                            f"({_option('claim_check_uri')} = {self.uri!r}); only files directly in that folder are "
                            "read (set claim_check_location_prefix when TiCDC wrote them under another name for the "
                            "same folder)")
        return name

    # -- reading ----------------------------------------------------------------------------------------------

    def read(self, location: str) -> bytes:
        """The bytes of the claim-check file a message names; Malformed for any problem with it."""
        name = self.file_name(location)
        path = f"{self.base}/{name}"
        where = f"{location!r:.300}"
        try:
            for attempt in _retrying(_transient):
                with attempt:
                    return self._read_once(path, where)
        except Malformed:
            raise
        except FileNotFoundError:
            raise Malformed(f"claim-check file {where} does not exist (TiCDC writes it before the message; was it "
                            "deleted, or does claim_check_uri name another folder than the changefeed's "
                            "claim-check-storage-uri?)") from None
        except (PermissionError, IsADirectoryError, NotADirectoryError) as e:
            raise Malformed(f"claim-check file {where} cannot be read: {type(e).__name__}: {e}") from None
        except Exception as e:  # noqa: BLE001 - storage errors come in many kinds
            raise Malformed(f"claim-check file {where} could not be read after {RETRY_ATTEMPTS} attempts: "
                            f"{type(e).__name__}: {str(e)[:300]}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_once(self, path: str, where: str) -> bytes:
        fs = self._filesystem()
        if self.scheme == "file":
            real = os.path.realpath(path)
            if os.path.dirname(real) != os.path.realpath(self.base):
                raise Malformed(f"claim-check file {where} resolves outside {self.uri!r} (a symbolic link?); "
                                "not read")
        info = fs.info(path)
        if info.get("type") not in ("file", None):
            raise IsADirectoryError(f"{path} is not a file")
        size = info.get("size")
        if isinstance(size, int) and size > MAX_PAYLOAD_BYTES:
            raise Malformed(f"claim-check file {where} is {size} bytes, more than the {MAX_PAYLOAD_BYTES} this "
                            "applier reads")
        with fs.open(path, "rb") as f:
            data = f.read(MAX_PAYLOAD_BYTES + 1)
        if len(data) > MAX_PAYLOAD_BYTES:
            raise Malformed(f"claim-check file {where} is larger than the {MAX_PAYLOAD_BYTES} bytes this applier reads")
        return data

    def _filesystem(self) -> Any:
        if self._fs is None:
            import fsspec

            if self.scheme == "file":
                self._fs = fsspec.filesystem("file", skip_instance_cache=True)
            else:
                self._fs = fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False,
                                             **self._s3)
        return self._fs


def _parse_storage_uri(uri: str, option: str, *, location: bool = False) -> tuple[str, str, dict]:
    """(scheme "file"/"s3", base path without trailing slash: "/dir" or "bucket/prefix", s3fs options).

    A bare absolute path means ``file://``. Raises ValueError naming ``option``."""
    what = f"{_option(option)} = {uri!r}" if option else repr(uri)
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"{what}: expected a file:// or s3:// URI")
    if uri.startswith("/"):
        uri = "file://" + uri
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if parts.fragment:
        raise ValueError(f"{what}: a fragment (#...) is not allowed")
    if scheme in ("file", "local"):
        if parts.netloc not in ("", "localhost") or parts.query:
            raise ValueError(f"{what}: write file:///absolute/folder (no host, no parameters)")
        path = parts.path
        if not path.startswith("/"):
            raise ValueError(f"{what}: the folder must be an absolute path")
        if ".." in path.split("/"):
            raise ValueError(f"{what}: '..' is not allowed")
        base = posixpath.normpath(path)
        if base.startswith("//"):
            base = "/" + base.lstrip("/")
        return "file", base.rstrip("/") or "/", {}
    if scheme == "s3":
        bucket = parts.netloc
        if not bucket or "@" in bucket:
            raise ValueError(f"{what}: write s3://bucket/prefix (credentials come from the environment)")
        prefix = "/".join(p for p in parts.path.split("/") if p)
        if ".." in prefix.split("/"):
            raise ValueError(f"{what}: '..' is not allowed")
        params = parse_qs(parts.query, keep_blank_values=True)
        if location:
            if params:
                raise ValueError(f"{what}: a location has no parameters")
            return "s3", f"{bucket}/{prefix}".rstrip("/"), {}
        secret = sorted(set(params) & _S3_SECRET_PARAMS)
        if secret:
            raise ValueError(f"{what}: S3 credentials ({', '.join(secret)}) do not belong in the URI; set "
                             "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, an instance role) in "
                             "the applier's environment")
        unknown = sorted(set(params) - _S3_PARAMS - _S3_SECRET_PARAMS)
        if unknown:
            raise ValueError(f"{what}: unknown parameter(s) {', '.join(unknown)}; accepted: "
                             f"{', '.join(sorted(_S3_PARAMS))}")
        opts: dict[str, Any] = {}
        client: dict[str, Any] = {}
        endpoint = params.get("endpoint", [""])[-1]
        if endpoint:
            if not endpoint.startswith(("http://", "https://")):
                endpoint = "https://" + endpoint
            opts["endpoint_url"] = endpoint
        region = params.get("region", [""])[-1]
        if region:
            client["region_name"] = region
        if client:
            opts["client_kwargs"] = client
        path_style = params.get("force-path-style", ["true" if endpoint else ""])[-1].lower()
        if path_style in ("true", "1"):
            opts["config_kwargs"] = {"s3": {"addressing_style": "path"}}
        return "s3", f"{bucket}/{prefix}".rstrip("/"), opts
    raise ValueError(f"{what}: only file:// and s3:// claim-check storage is supported")


# ---------------------------------------------------------------------------------------------------------
# The upstream TiDB (handle-key-only)
# ---------------------------------------------------------------------------------------------------------

#: column types read as ``col + 0``: TiCDC's protocols carry ENUM/SET as their ordinal/bitmask and BIT as its
#: unsigned value, and that is what ``+ 0`` gives
_NUMERIC_READ = frozenset({"enum", "set", "bit"})
_BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
_CHAR_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})


@dataclass(frozen=True)
class UpstreamColumn:
    """A column as the upstream's information_schema describes it."""

    name: str
    data_type: str  # DATA_TYPE, lower case ("int", "varchar", "enum", ...)
    column_type: str  # COLUMN_TYPE ("int(10) unsigned", "enum('a','b')", ...)
    nullable: bool
    unsigned: bool
    binary: bool  # binary string types, and character types in the binary charset
    generated: bool  # a STORED generated column (VIRTUAL ones are not read: TiCDC never sends them)
    column_key: str  # COLUMN_KEY: PRI, UNI, MUL or ""


@dataclass(frozen=True)
class UpstreamRow:
    """One row read from the upstream: the columns in table order and each value as MySQL's text (str), the bytes
    of a binary column, or None. ENUM/SET/BIT come as the decimal text of their number."""

    columns: tuple[UpstreamColumn, ...]
    values: dict[str, str | bytes | None]


_UPSTREAM_DRIVERS = {"mysql": "mysql+pymysql", "mysql+pymysql": "mysql+pymysql", "tidb": "mysql+pymysql",
                     "mariadb": "mariadb+pymysql", "mariadb+pymysql": "mariadb+pymysql"}
_TRANSIENT_ERRNOS = frozenset({1040, 1053, 1205, 1213, 2002, 2003, 2005, 2006, 2013, 2055, 8027, 9001, 9002, 9005})


class Upstream:
    """Reads a row of the upstream TiDB as of a commit ts, for handle-key-only messages.

    On first use it checks that the server is TiDB (``SELECT tidb_version()``). Each read runs on one connection
    in autocommit mode: ``SET time_zone`` (``upstream_time_zone``, default "+00:00", the changefeed's time zone the
    applier assumes for TIMESTAMP), ``SET @@tidb_snapshot = <ts>``, the table's columns from information_schema (as
    of that snapshot too), the row by its key, and ``SET @@tidb_snapshot = ''`` again. Identifiers are quoted by
    SQLAlchemy and key values are bound parameters. Values arrive as MySQL's text (PyMySQL without result
    converters), which is what the protocols' own decoders read.

    A server that is not TiDB has no snapshot reads: it is refused, unless ``upstream_read_current_state = true``
    says reading its *current* row is acceptable (a stand-in upstream for tests; see the README).
    The password is never shown: :meth:`describe` masks it."""

    def __init__(self, url: str, *, time_zone: str = "+00:00", read_current_state: bool = False) -> None:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        if not isinstance(url, str) or not url.strip():
            raise ValueError(f"{_option('upstream_url')} must be a mysql+pymysql:// URL of the upstream TiDB")
        try:
            parsed = make_url(url)
        except ArgumentError as e:
            raise ValueError(f"{_option('upstream_url')} is not a database URL: {e}") from None
        driver = _UPSTREAM_DRIVERS.get(parsed.drivername)
        if driver is None:
            raise ValueError(f"{_option('upstream_url')} = {parsed.render_as_string(hide_password=True)!r}: the "
                             "upstream TiDB speaks MySQL's protocol; write mysql+pymysql://user:password@host:4000/")
        if not isinstance(time_zone, str) or not time_zone:
            raise ValueError(f"{_option('upstream_time_zone')} must be a time zone such as \"+00:00\"")
        if not isinstance(read_current_state, bool):
            raise ValueError(f"{_option('upstream_read_current_state')} must be true or false")
        self._url = parsed.set(drivername=driver).render_as_string(hide_password=False)
        self.time_zone = time_zone
        self.read_current_state = read_current_state
        self._engine: Any = None
        self._is_tidb: bool | None = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_engine"] = None
        return state

    def describe(self) -> str:
        """The upstream URL with its password masked."""
        from sqlalchemy.engine import make_url

        return make_url(self._url).render_as_string(hide_password=True)

    def _get_engine(self) -> Any:
        if self._engine is None:
            import pymysql.converters
            from sqlalchemy import create_engine

            # PyMySQL's encoders (for the bound key values) without its decoders: values arrive as MySQL's text
            encoders = {k: v for k, v in pymysql.converters.conversions.items() if not isinstance(k, int)}
            self._engine = create_engine(self._url, pool_size=1, max_overflow=2, pool_pre_ping=True,
                                         pool_recycle=600, connect_args={"conv": encoders, "connect_timeout": 10,
                                                                         "read_timeout": 300})
        return self._engine

    def fetch(self, schema: str, table: str, ts: int, key: dict[str, Any], what: str) -> UpstreamRow:
        """The row of ``schema.table`` whose key columns equal ``key`` (Python values), as of TSO ``ts``.
        ``what`` says which image it is for the messages. Raises Malformed when it cannot be read or is not
        there."""
        from sqlalchemy.exc import DBAPIError

        name = f"`{schema}`.`{table}`"
        try:
            for attempt in _retrying(_db_transient):
                with attempt:
                    row = self._fetch_once(schema, table, ts, key)
        except Malformed as e:
            raise type(e)(f"{what} of {name}: {e}") from None
        except DBAPIError as e:
            if _db_gc_passed(e):
                raise UpstreamUnusable(
                    f"{what} of {name}: the upstream TiDB {self.describe()} cannot read as of ts {ts}: "
                    f"{_db_reason(e)}. {GC_FIX}") from None
            if _db_transient(e):
                raise UpstreamUnusable(
                    f"{what} of {name}: the upstream {self.describe()} could not be reached after {RETRY_ATTEMPTS} "
                    f"attempts: {_db_reason(e)}. {REACH_FIX}") from None
            raise UpstreamUnusable(
                f"{what} of {name}: the upstream {self.describe()} refused the read: {_db_reason(e)}. Check "
                f"{_option('upstream_url')}: its user must be able to SELECT the table and set tidb_snapshot; "
                "nothing of this message was applied") from None
        except Exception as e:  # noqa: BLE001 - a driver error of another kind
            raise UpstreamUnusable(f"{what} of {name}: reading the upstream {self.describe()} failed: "
                                   f"{type(e).__name__}: {str(e)[:300]}. {REACH_FIX}") from None
        if row is None:
            when = ("in its current state (upstream_read_current_state: not TiDB, no snapshot)"
                    if not self._is_tidb else f"as of ts {ts} (tidb_snapshot)")
            raise Malformed(f"{what} of {name}: the upstream {self.describe()} has no row with key "
                            f"{_show_key(key)} {when}; it was deleted (or the key changed) and cannot be read "
                            "any more, so the change cannot be applied whole")
        return row

    def _fetch_once(self, schema: str, table: str, ts: int, key: dict[str, Any]) -> UpstreamRow | None:
        from sqlalchemy import text

        engine = self._get_engine()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if self._is_tidb is None:
                self._is_tidb = _probe_tidb(conn)
            if not self._is_tidb and not self.read_current_state:
                raise UpstreamUnusable(
                    f"the upstream {self.describe()} ({_option('upstream_url')}) is not TiDB (SELECT tidb_version() "
                    "failed), so it cannot read the row as of the change's commit ts; point upstream_url at the "
                    "changefeed's upstream TiDB (set upstream_read_current_state = true only for a stand-in "
                    "upstream in tests: it reads the current row)")
            conn.execute(text("SET time_zone = :tz"), {"tz": self.time_zone})
            snapshot = bool(self._is_tidb)
            if snapshot:
                conn.execute(text("SET @@tidb_snapshot = :ts"), {"ts": int(ts)})
            try:
                cols = _columns(conn, schema, table)
                if not cols:
                    raise Malformed("the upstream has no such table" + (f" as of ts {ts}" if snapshot else ""))
                missing = [k for k in key if k not in {c.name for c in cols}]
                if missing:
                    raise Malformed(f"the upstream table has no key column(s) {', '.join(map(repr, missing))}")
                return _row(conn, schema, table, cols, key)
            finally:
                if snapshot:
                    try:
                        conn.execute(text("SET @@tidb_snapshot = ''"))
                    except Exception:  # noqa: BLE001 - never hand back a connection stuck in the past
                        conn.invalidate()


def _probe_tidb(conn: Any) -> bool:
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    try:
        conn.execute(text("SELECT tidb_version()")).all()
        return True
    except DBAPIError as e:
        if _db_transient(e):
            raise
        return False


def _columns(conn: Any, schema: str, table: str) -> tuple[UpstreamColumn, ...]:
    from sqlalchemy import text

    rows = conn.execute(text(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, COLUMN_KEY, EXTRA, CHARACTER_SET_NAME "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t ORDER BY ORDINAL_POSITION"),
        {"s": schema, "t": table}).all()
    out = []
    for name, data_type, column_type, nullable, column_key, extra, charset in rows:
        data_type = (data_type or "").lower()
        column_type = (column_type or "").lower()
        extra = (extra or "").upper()
        if "VIRTUAL" in extra:
            continue  # TiCDC never sends virtual generated columns
        binary = data_type in _BINARY_TYPES or (data_type in _CHAR_TYPES and (charset or "").lower() == "binary")
        out.append(UpstreamColumn(name, data_type, column_type, nullable == "YES", "unsigned" in column_type,
                                  binary, "GENERATED" in extra or "PERSISTENT" in extra, (column_key or "").upper()))
    return tuple(out)


def _row(conn: Any, schema: str, table: str, cols: tuple[UpstreamColumn, ...],
         key: dict[str, Any]) -> UpstreamRow | None:
    from sqlalchemy import and_, bindparam, column, select
    from sqlalchemy import table as sql_table

    t = sql_table(table, *(column(c.name) for c in cols), schema=schema)
    exprs = [(t.c[c.name] + 0) if c.data_type in _NUMERIC_READ else t.c[c.name] for c in cols]
    where = and_(*(t.c[k] == bindparam(f"k{i}", v) for i, (k, v) in enumerate(key.items())))
    rows = conn.execute(select(*exprs).where(where).limit(2)).all()
    if not rows:
        return None
    if len(rows) > 1:
        raise Malformed(f"the key {_show_key(key)} matches more than one upstream row")
    values: dict[str, str | bytes | None] = {}
    for c, v in zip(cols, rows[0]):
        if v is not None and not c.binary and isinstance(v, (bytes, bytearray)):
            v = bytes(v).decode("utf-8")
        elif v is not None and c.binary and isinstance(v, str):
            v = v.encode("utf-8")
        values[c.name] = v
    return UpstreamRow(cols, values)


def _db_errno(exc: Any) -> int | None:
    orig = getattr(exc, "orig", None)
    args = getattr(orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


def _db_transient(exc: BaseException) -> bool:
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    errno = _db_errno(exc)
    return errno in _TRANSIENT_ERRNOS or (errno is None and exc.__class__.__name__ in ("OperationalError",
                                                                                       "InterfaceError"))


def _db_reason(exc: Any) -> str:
    orig = getattr(exc, "orig", None)
    return (str(orig) if orig is not None else str(exc)).splitlines()[0][:300]


def _db_gc_passed(exc: Any) -> bool:
    """TiDB's error 8055: the snapshot asked for is older than the GC safe point."""
    return _db_errno(exc) == 8055 or "GC safe point" in _db_reason(exc)


#: the fix, when TiDB's GC has passed the commit ts of a handle-key-only row
GC_FIX = ("TiDB's GC has passed this change's commit ts, so the row as of it is gone and the message cannot be "
          "completed. Keep tidb_gc_life_time upstream longer than the applier can lag (e.g. SET GLOBAL "
          "tidb_gc_life_time = '24h'); for the rows already lost, seed the table again (applier load --replace "
          "of a new Dumpling export) or let this change go (pipeline.on_decode_error = \"skip\") and repair the "
          "table with applier verify --upstream ... --fix-sql. Nothing of this message was applied")
#: the fix, when the upstream cannot be reached
REACH_FIX = (f"Check {_option('upstream_url')} (host, port, user, password) and that TiDB is reachable from the "
             "applier's driver and executors, then run again: nothing of this message was applied")


def _show_key(key: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v!r:.60}" for k, v in key.items()) + "}"


# ---------------------------------------------------------------------------------------------------------
# What a decoder holds
# ---------------------------------------------------------------------------------------------------------


class LargeMessages:
    """A decoder's large-message settings ([source.codec]): the compression, the claim-check store and the
    upstream, each only when configured. Validates at construction (ValueError names the option)."""

    def __init__(self, protocol: str, *, compression: Any = "none", claim_check_uri: Any = "",
                 claim_check_location_prefix: Any = "", claim_check_raw_value: Any = False,
                 upstream_url: Any = "", upstream_time_zone: Any = "+00:00",
                 upstream_read_current_state: Any = False) -> None:
        self.protocol = protocol
        self.compression = check_compression(compression)
        if not isinstance(claim_check_raw_value, bool):
            raise ValueError(f"{_option('claim_check_raw_value')} must be true or false")
        self.raw_value = claim_check_raw_value
        for name, v in (("claim_check_uri", claim_check_uri), ("claim_check_location_prefix",
                                                                claim_check_location_prefix),
                        ("upstream_url", upstream_url)):
            if not isinstance(v, str):
                raise ValueError(f"{_option(name)} must be a string")
        if claim_check_location_prefix and not claim_check_uri:
            raise ValueError(f"{_option('claim_check_location_prefix')} needs {_option('claim_check_uri')}")
        self.claim_check = ClaimCheckStore(claim_check_uri, claim_check_location_prefix) if claim_check_uri else None
        if not upstream_url and (upstream_read_current_state is not False or upstream_time_zone != "+00:00"):
            raise ValueError(f"{_option('upstream_time_zone')} and {_option('upstream_read_current_state')} need "
                             f"{_option('upstream_url')}")
        self.upstream = Upstream(upstream_url, time_zone=upstream_time_zone,
                                 read_current_state=upstream_read_current_state) if upstream_url else None
        # the libraries a configured feature needs, imported now: a Spark executor without them fails the start-up
        # check (applier.decode.worker_identity builds the decoder) instead of every message it decodes
        needed = (["cramjam"] if self.compressed else []) + (["fsspec"] if self.claim_check is not None else []) + (
            ["s3fs"] if self.claim_check is not None and self.claim_check.scheme == "s3" else [])
        for module in needed:
            importlib.import_module(module)

    @property
    def compressed(self) -> bool:
        return self.compression != "none"

    def decompress(self, data: Any, what: str) -> bytes:
        return decompress(self.compression, data, what)

    def read_claim_check(self, location: Any, table: str) -> tuple[bytes | None, bytes]:
        """(key, value) of the full message a claim-check message points to; Malformed names ``table``."""
        if self.claim_check is None:
            raise Malformed(f"claim-check message of {table} (the row is in external storage at {location!r:.300}) "
                            f"but {_option('claim_check_uri')} is not set: set it to the changefeed's "
                            "claim-check-storage-uri")
        try:
            data = self.claim_check.read(location)
            return parse_claim_check_file(data, self.raw_value, f"{location!r:.300}")
        except Malformed as e:
            raise Malformed(f"claim-check message of {table}: {e}") from None

    def need_upstream(self, table: str, op: str) -> Upstream:
        if self.upstream is None:
            raise Malformed(f"handle-key-only {op} of {table}: the row was larger than max-message-bytes and only "
                            "its handle-key columns were sent; the full row must be read from the upstream TiDB, "
                            f"but {_option('upstream_url')} is not set (set it to the changefeed's upstream, e.g. "
                            "\"mysql+pymysql://user:${PASSWORD}@tidb:4000/\", or use "
                            "large-message-handle-option = \"claim-check\")")
        return self.upstream


def go_quote_bytes(data: bytes) -> str:
    """Bytes as Go-quoted text without the quotes, in the simplest form :func:`applier.codecs.open.go_unquote`
    reads back exactly: printable ASCII as is (except ``"`` and ``\\``), every other byte as ``\\xHH``."""
    out = []
    for b in data:
        if 0x20 <= b < 0x7F and b not in (0x22, 0x5C):
            out.append(chr(b))
        else:
            out.append(f"\\x{b:02x}")
    return "".join(out)

