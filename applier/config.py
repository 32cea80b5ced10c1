"""TOML configuration -> validated, immutable :class:`Settings`.

Every problem is reported as a :class:`ConfigError` naming the dotted key at fault
(``source.protocol``, ``route[2].match``; ``route`` indexes count from 0 in file order) and saying what
to put there. Unknown keys are errors, with the closest valid key suggested, so a typo never passes
silently.

Secrets: the target password comes from ``target.password_env``, ``target.password_file`` or from ``${VAR}`` /
``${file:PATH}`` references in ``target.url`` (both also work in ``[source.kafka]``, ``[source.codec]`` and
``[spark.conf]`` values, for SASL or SSL secrets; ``${file:PATH}`` is the file's text less one trailing newline;
``$${`` writes a literal ``${``). The resolved password is only returned by
:meth:`Settings.target_url`; ``repr``/``str`` of every settings object, :meth:`Settings.redacted` and
every ``ConfigError`` message mask it, as well as ``[source.kafka]``/``[spark.conf]`` values whose key
looks secret (password, secret, jaas, token, credential, key) or that came from ``${VAR}``.

Relative paths (``pipeline.checkpoint_dir``, ``pipeline.spill_dir``) resolve against the folder of the
configuration file (for :func:`parse_config`, against ``base_dir`` or the working directory).
``checkpoint_dir`` may also be a URI (``hdfs://``, ``s3a://``, ``file://``) that Spark understands: it is handed
to Spark unchanged. What must stay on the driver's local disk (the one-run-per-host lock file and the default spill
folder) lives in ``local_dir``: the checkpoint folder itself when that is a local path or ``file://`` URI, else
``$XDG_STATE_HOME/applier/<name>`` (``~/.local/state/applier/<name>``).

Example (every key; see ``conf/*.toml``)::

    [pipeline]
    name = "shop-replica"                 # required; [A-Za-z0-9_.-]{1,64}; keys the progress rows
    checkpoint_dir = "/var/lib/applier/shop-replica"   # required; Spark working state (path or URI)
    local_dir = ""                        # driver-local lock + spill; default: see above
    buffer_memory_mb = 512                # held-event budget before spilling to disk; >= 1
    spill_dir = ""                        # default: <local_dir>/spill
    on_decode_error = "stop"              # stop | quarantine (hold the message, block its table) | skip (record, go on)
    trigger_interval = "500 ms"           # "<n> ms|millisecond(s)|second(s)|minute(s)"
    max_offsets_per_trigger = 100000      # optional int >= 1
    decode_on = "auto"                    # auto | executors | driver (where Kafka records are decoded)
    columnar = true                       # Canal-JSON, Open, Debezium: decode into Arrow batches, plan on them

    [source]
    bootstrap_servers = "127.0.0.1:9092"  # required, "host:port[,host:port]"
    topics = ["tidb-shop"]                # exactly one of topics / topic_pattern
    protocol = "canal-json"               # required: open | canal-json | simple | debezium | avro
    starting_offsets = "earliest"         # earliest | latest, for a pipeline with no progress yet
    start_ts = 449958940139667457         # optional TiDB TSO (gated protocols): a new pipeline skips every change
                                          # committed at or before it (the replica holds the snapshot at that TSO)
    max_clock_skew = "1 minute"           # a commit/resolved ts further ahead of this host's clock is untrusted:
                                          # on_decode_error settles its message (applier.clock)
    retry_seconds = 300                   # a Kafka outage while running is retried this long; 0: never
    [source.kafka]                        # passed to the consumer as kafka.<key>

    [target]
    url = "postgresql+psycopg://replica@127.0.0.1:5432/replica"   # required
    password_env = "REPLICA_PASSWORD"     # optional; or password_file = "/run/secrets/replica-password"
    ssl_mode = "verify-full"              # optional: disable | require | verify-ca | verify-full (applier.dialect)
    ssl_ca = "/etc/applier/tls/ca.pem"    # optional (alone it means verify-full); ssl_cert + ssl_key: a client cert
    batch_rows = 5000
    retry_seconds = 300                   # transient target faults are retried this long; 0: never
    on_unsupported_ddl = "stop"           # stop | skip
    on_apply_error = "stop"               # stop | quarantine (hold the row and its key) | skip (record, go on)
    shard_ddl = "stop"                    # stop | skip: a DROP/TRUNCATE/RENAME/DROP INDEX of one shard of a merged table
    schema_evolution = "create"           # none | create (a routed table the target lacks, from the stream's schema)
                                          # | evolve (also add columns that appear in the stream)
    load_data = "auto"                    # auto | on | off: MySQL/MariaDB upserts through LOAD DATA LOCAL INFILE
                                          # (auto: when the server allows local_infile; PostgreSQL: not used)
    apply_streams = 1                     # 1-16 parallel target transactions per window, split by table, one
                                          # consistent resolved ts (gated protocols; applier/streams)
    apply_on = "auto"                     # auto | driver | executors | one_transaction: how the streams write
                                          # (apply_streams > 1 only; auto: executors on a cluster master; on
                                          # local[N], driver threads, or one transaction for a target on this
                                          # machine)
    schema = ""                           # default target schema for unrouted tables

    [metrics]                             # Prometheus endpoint of `applier run` (applier.metrics)
    port = 0                              # 0: off; e.g. 9464
    host = "127.0.0.1"                    # loopback by default

    [spark]
    master = "local[2]"                   # local[N], spark://host:port[,host:port], yarn, k8s://...
    startup_timeout_seconds = 120         # cluster masters: how long executors may take to appear
    class_archive = true                  # the driver JVM maps Spark's classes from a CDS archive written by
                                          # the first run (applier.session: about 4 s less start-up)
    [spark.conf]

    [[route]]
    match = "shop.*"
    schema = "shop_copy"
    table = "{table}"
    ignore = false
    mode = "replica"                      # replica | history (every version) | soft_delete (applier.modes)
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import os
import re
import time
import tomllib
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from applier.clock import DEFAULT_MAX_SKEW_MS
from applier.routing import APPLY_ERROR_POLICIES, DECODE_ERROR_POLICIES, MAX_NAME_LENGTH, Rule, RuleError

__all__ = [
    "ConfigError",
    "FrozenMap",
    "PipelineSettings",
    "RouteSettings",
    "Settings",
    "SourceSettings",
    "SparkSettings",
    "SUPPORTED_DRIVERS",
    "TargetSettings",
    "load_config",
    "parse_config",
    "tso_problem",
]

MASK = "***"


class FrozenMap(Mapping[str, str]):
    """A read-only, hashable, picklable str -> str mapping (``MappingProxyType`` does not pickle, and
    settings may travel to Spark workers inside closures)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, str] | None = None) -> None:
        object.__setattr__(self, "_data", dict(data or {}))

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("FrozenMap is read-only")

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (self._data,))

    def __repr__(self) -> str:
        # values under secret-looking keys (password, jaas, token...) are masked here too
        shown = {k: (MASK if _is_secret_key(k) else v) for k, v in self._data.items()}
        return f"FrozenMap({shown!r})"


def supported_protocols() -> tuple[str, ...]:
    """The protocols this build has a decoder for."""
    from applier.codecs import protocols
    return tuple(protocols())


def _url_password(value: str) -> str | None:
    """The password in a URL's userinfo (``https://user:pw@host``), if any."""
    m = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/@]*)@", value)
    if not m or ":" not in m.group(1):
        return None
    return m.group(1).split(":", 1)[1] or None


def _redact_codec_value(key: str, value: Any) -> Any:
    if not isinstance(value, str):
        return value
    if _is_secret_key(key):
        return MASK
    pw = _url_password(value)
    return value.replace(pw, MASK) if pw else value
SUPPORTED_DRIVERS: tuple[str, ...] = ("mysql+pymysql", "mariadb+pymysql", "postgresql+psycopg")

#: Kafka consumer settings the applier (or Spark's Kafka source) owns; ``[source.kafka]`` may not set them.
OWNED_KAFKA_KEYS: Mapping[str, str] = FrozenMap(
    {
        "bootstrap.servers": "set source.bootstrap_servers instead",
        "group.id": "the applier tracks its own progress in the target and needs no consumer group",
        "auto.offset.reset": "set source.starting_offsets instead (earliest | latest)",
        "enable.auto.commit": "the applier never commits consumer offsets; progress lives in the target",
        "key.deserializer": "the applier reads raw bytes and decodes them itself",
        "value.deserializer": "the applier reads raw bytes and decodes them itself",
        "interceptor.classes": "Spark's Kafka source does not support consumer interceptors",
    }
)

#: ``[spark.conf]`` keys that other settings own.
OWNED_SPARK_KEYS: Mapping[str, str] = FrozenMap(
    {
        "spark.master": "set spark.master instead",
        "spark.sql.streaming.checkpointLocation": "set pipeline.checkpoint_dir instead",
    }
)

_SECRET_KEY_RE = re.compile(r"pass|secret|jaas|token|credential|(^|[._])key($|[._])|apikey|private", re.I)
_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_ENV_REF_RE = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HOSTNAME_RE = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_DURATION_RE = re.compile(r"\s*(\d+)\s*([A-Za-z]+)\s*")
_DURATION_UNITS = {
    "ms": 1,
    "msec": 1,
    "msecs": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "min": 60_000,
    "mins": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
}

_SECTIONS = ("pipeline", "source", "target", "spark", "metrics", "route")
_PIPELINE_KEYS = (
    "name",
    "checkpoint_dir",
    "local_dir",
    "buffer_memory_mb",
    "spill_dir",
    "on_decode_error",
    "trigger_interval",
    "max_offsets_per_trigger",
    "decode_on",
    "columnar",
)
_SOURCE_KEYS = ("bootstrap_servers", "topics", "topic_pattern", "protocol", "starting_offsets", "start_ts", "kafka",
                "codec", "max_clock_skew", "retry_seconds")
_TARGET_KEYS = ("url", "password_env", "password_file", "batch_rows", "on_unsupported_ddl", "on_apply_error",
                "shard_ddl", "schema", "retry_seconds", "schema_evolution", "load_data", "ssl_mode", "ssl_ca", "ssl_cert",
                "ssl_key", "apply_streams", "apply_on")
#: ``[target] apply_streams``: at most this many (each holds a target connection and a thread of the driver)
MAX_APPLY_STREAMS = 16
#: ``[target] apply_on``: where and how the apply streams write their shares: threads of the driver ("driver"),
#: Spark tasks ("executors", applier.streams.remote), or every share of a window in one transaction of the driver
#: ("one_transaction"); see Settings.apply_form()
APPLY_ON = ("auto", "driver", "executors", "one_transaction")
#: ``[target] ssl_mode``: PostgreSQL's sslmode words, for every target (applier.dialect maps them per driver)
SSL_MODES = ("disable", "require", "verify-ca", "verify-full")
#: TLS settings a target URL's query may carry for its driver: set in the URL or in the [target] ssl_* keys, not both
_URL_TLS_QUERY = frozenset({"sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "ssl", "ssl_ca", "ssl_cert",
                            "ssl_key", "ssl_disabled", "ssl_verify_cert", "ssl_verify_identity", "ssl_capath"})
#: A secret file larger than this is a mistake (a certificate bundle, a log), not a password
SECRET_FILE_MAX_BYTES = 65536
#: ``[source.kafka]`` options that name a file the driver and the executors read (checked to exist at start-up)
KAFKA_FILE_KEYS = ("ssl.truststore.location", "ssl.keystore.location")
SCHEMA_EVOLUTION = ("none", "create", "evolve")
#: ``[target] load_data``: MySQL/MariaDB upserts through LOAD DATA LOCAL INFILE (applier.sinks.mysql_load)
LOAD_DATA = ("auto", "on", "off")
_SPARK_KEYS = ("master", "startup_timeout_seconds", "class_archive", "conf")
_METRICS_KEYS = ("port", "host")
_ROUTE_KEYS = ("match", "schema", "table", "ignore", "on_apply_error", "on_decode_error", "mode")


_URI_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


# A TiDB TSO is (physical milliseconds since the epoch << 18) | logical counter. PD hands out TSOs from its wall
# clock, so no real one has a physical part before TiDB existed: a smaller value is a Unix time or a row count
# written by mistake, and one far in the future is a nanosecond time. Either would silently skip or re-apply changes.
TSO_LOGICAL_BITS = 18
_TSO_EARLIEST_MS = 1_420_070_400_000  # 2015-01-01T00:00:00Z
_TSO_MAX = 2**63 - 1  # the progress tables store it as a signed BIGINT
TSO_HINT = ("a TiDB TSO is physical milliseconds << 18 | logical, e.g. the Pos or TSO in Dumpling's metadata "
            "file, BR's BackupTS, or SELECT @@tidb_current_ts")


def tso_problem(value: int, *, future_ok: bool = False) -> str | None:
    """What is wrong with ``value`` as a TiDB TSO (None when it is one). ``future_ok``: a TSO the cluster has not
    reached yet is fine (a point to stop at), else it cannot name a snapshot that exists."""
    if value < 1 or value > _TSO_MAX:
        return f"must be a TSO between 1 and {_TSO_MAX}, got {value}; {TSO_HINT}"
    physical_ms = value >> TSO_LOGICAL_BITS
    if physical_ms < _TSO_EARLIEST_MS:
        return (f"{value} is not a TiDB TSO: its physical part is before 2015 (a Unix time in seconds or "
                f"milliseconds?); {TSO_HINT}")
    if not future_ok:
        if physical_ms > time.time() * 1000 + 86_400_000:
            return (f"{value} is not a TiDB TSO yet: its physical part is more than a day in the future (a "
                    f"nanosecond time?); {TSO_HINT}")
    return None


def is_uri(text: str) -> bool:
    """``scheme://...``: a location Spark/Hadoop resolves, as opposed to a local path."""
    return _URI_RE.match(text) is not None


def is_local_master(master: str) -> bool:
    """``local``/``local[N]``/``local[N,F]``: driver and executors in one process on this host."""
    return master == "local" or master.startswith("local[")


def default_state_dir() -> Path:
    """Where driver-local state of pipelines whose checkpoint is remote lives (XDG state home)."""
    base = os.environ.get("XDG_STATE_HOME") or "~/.local/state"
    return Path(base).expanduser().absolute() / "applier"


# --------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------


class ConfigError(Exception):
    """A configuration problem: ``key`` is the dotted key at fault, ``message`` what is wrong and what
    to write instead. ``str()`` is ``"<source>: <key>: <message>"``. Messages never contain secrets."""

    def __init__(self, key: str, message: str, *, source: str = "<config>") -> None:
        self.key = key
        self.message = message
        self.source = source
        super().__init__(key, message)

    def __str__(self) -> str:
        return f"{self.source}: {self.key}: {self.message}"

    def __repr__(self) -> str:
        return f"ConfigError({self.key!r}, {self.message!r}, source={self.source!r})"


def _suggest(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not close:
        close = [c for c in choices if c.lower() == word.lower().replace("-", "_")]
    return f"; did you mean {close[0]!r}?" if close else ""


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


_KIND_NAMES = {
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    list: "an array",
    dict: "a table",
}


def _kind_name(kind: type) -> str:
    return _KIND_NAMES.get(kind, kind.__name__)


def _type_name(value: Any) -> str:
    return _kind_name(type(value))


# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------


def _is_secret_key(key: str) -> bool:
    return bool(_SECRET_KEY_RE.search(key))


def _redact_options(values: Mapping[str, str], templates: Mapping[str, str]) -> dict[str, str]:
    """Show option values except secrets: secret-looking keys are masked, ``${VAR}`` values show the
    reference, not what it resolved to."""
    out = {}
    for key, value in values.items():
        if _is_secret_key(key):
            out[key] = MASK
        elif key in templates:
            out[key] = templates[key]
        else:
            out[key] = value
    return out


class _RedactedRepr:
    """repr/str built from ``redacted()``, so secrets never reach a log line or traceback."""

    def redacted(self) -> dict[str, Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.redacted().items())
        return f"{type(self).__name__}({fields})"

    __str__ = __repr__


@dataclass(frozen=True, repr=False)
class PipelineSettings(_RedactedRepr):
    name: str
    checkpoint_dir: str  # absolute local path, or a URI Spark understands (kept exactly as written)
    buffer_memory_mb: int = 512
    spill_dir: Path = Path()
    local_dir: Path = Path()  # driver-local: the lock file and the default spill folder
    on_decode_error: str = "stop"  # stop | quarantine | skip: a message that cannot be decoded
    # Live mode's micro-batch interval. 500 ms, not Spark's usual 1 s: with TiCDC's resolved ts every second, a
    # 1 s trigger added 0-1 s of phase to every commit's staleness; at 5k row changes/s a batch takes 0.33-0.34 s
    # to read and apply, so 500 ms keeps up and halves that wait (docs/benchmarks.md, round 4: staleness p99
    # 1.76 -> 0.94 s on PostgreSQL, 1.21 -> 0.73 s on MariaDB), for 61% of the machine's CPU instead of 56%.
    trigger_interval: str = "500 milliseconds"  # canonical Spark form: "<n> milliseconds|seconds|minutes"
    trigger_interval_ms: int = 500
    max_offsets_per_trigger: int | None = None
    decode_on: str = "auto"  # auto | executors | driver; see decodes_on_executors()
    # the columnar lane (applier/columnar): Canal-JSON, Open Protocol and (gated) Debezium decoded into Arrow batches, planned on them
    columnar: bool = True

    @property
    def buffer_memory_bytes(self) -> int:
        return self.buffer_memory_mb * 1024 * 1024

    @property
    def checkpoint_uri(self) -> str:
        """Where Spark keeps the query's working state, as a URI: a local path becomes ``file://`` so it means
        the driver's disk even on a cluster whose default file system is HDFS."""
        return self.checkpoint_dir if is_uri(self.checkpoint_dir) else Path(self.checkpoint_dir).as_uri()

    def redacted(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "checkpoint_dir": self.checkpoint_dir,
            "local_dir": str(self.local_dir),
            "buffer_memory_mb": self.buffer_memory_mb,
            "spill_dir": str(self.spill_dir),
            "on_decode_error": self.on_decode_error,
            "trigger_interval": self.trigger_interval,
            "max_offsets_per_trigger": self.max_offsets_per_trigger,
            "decode_on": self.decode_on,
            "columnar": self.columnar,
        }


# The Kafka consumer of Spark's source, where [source.kafka] does not say otherwise. Spark asks the broker for the
# partition's first and last offsets after every poll (two ListOffsets round trips), so Kafka's default of 500
# records per poll made those requests about a tenth of the JVM's CPU in a catch-up (JFR, docs/benchmarks.md round
# 5); larger polls and fetches cut them and the broker's per-fetch work. A fetch holds at most
# max.partition.fetch.bytes of a partition (one larger record still comes whole), so memory stays bounded.
CONSUMER_DEFAULTS = {"kafka.max.poll.records": "5000", "kafka.max.partition.fetch.bytes": str(4 << 20)}


@dataclass(frozen=True, repr=False)
class SourceSettings(_RedactedRepr):
    bootstrap_servers: str
    protocol: str  # one of supported_protocols()
    topics: tuple[str, ...] | None = None
    topic_pattern: str | None = None
    starting_offsets: str = "earliest"  # earliest | latest
    start_ts: int | None = None  # a TiDB TSO: a new pipeline skips the changes committed at or before it
    kafka: Mapping[str, str] = field(default_factory=FrozenMap)
    _kafka_templates: Mapping[str, str] = field(default_factory=FrozenMap, compare=False)
    codec: Mapping[str, Any] = field(default_factory=FrozenMap)  # decoder options ([source.codec])
    # a ts further ahead of this host's clock is untrusted input (applier.clock, invariant 15)
    max_clock_skew_ms: int = DEFAULT_MAX_SKEW_MS
    retry_seconds: int = 300  # how long a Kafka outage while running is retried (0: never)

    def subscription(self) -> tuple[str, str]:
        """The Spark Kafka source option naming what to read: ``("subscribe", "a,b")`` or
        ``("subscribePattern", regex)``."""
        if self.topics is not None:
            return "subscribe", ",".join(self.topics)
        assert self.topic_pattern is not None
        return "subscribePattern", self.topic_pattern

    def spark_options(self) -> dict[str, str]:
        """Options for ``spark.readStream.format("kafka")``: bootstrap servers, the subscription and
        every ``[source.kafka]`` entry as ``kafka.<key>`` (secrets included: do not log this).
        ``startingOffsets``/``maxOffsetsPerTrigger`` are the pipeline's business (they depend on the
        progress tables)."""
        sub_key, sub_value = self.subscription()
        opts = {"kafka.bootstrap.servers": self.bootstrap_servers, sub_key: sub_value, **CONSUMER_DEFAULTS}
        opts.update({f"kafka.{k}": v for k, v in self.kafka.items()})
        return opts

    def redacted(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "topics": list(self.topics) if self.topics is not None else None,
            "topic_pattern": self.topic_pattern,
            "protocol": self.protocol,
            "starting_offsets": self.starting_offsets,
            "start_ts": self.start_ts,
            "max_clock_skew_ms": self.max_clock_skew_ms,
            "retry_seconds": self.retry_seconds,
            "kafka": _redact_options(self.kafka, self._kafka_templates),
            "codec": {k: _redact_codec_value(k, v) for k, v in self.codec.items()},
        }


@dataclass(frozen=True, repr=False)
class TargetSettings(_RedactedRepr):
    _url: URL = field(compare=False)  # password resolved; only sqlalchemy_url() hands it out
    password_env: str | None = None
    password_file: str | None = None  # absolute path of the file the password was read from
    # TLS (applier.dialect maps these per driver): "" = the driver's default (psycopg: prefer; PyMySQL: preferred,
    # unverified), else disable | require | verify-ca | verify-full; files as absolute paths
    ssl_mode: str = ""
    ssl_ca: str | None = None
    ssl_cert: str | None = None
    ssl_key: str | None = None
    batch_rows: int = 5000
    on_unsupported_ddl: str = "stop"  # stop | skip
    on_apply_error: str = "stop"  # stop | quarantine | skip: a row change the target refuses
    shard_ddl: str = "stop"  # stop | skip: a shard's destructive DDL on a table that routes merge
    schema: str = ""
    retry_seconds: int = 300  # how long transient target faults are retried (0: never)
    schema_evolution: str = "create"  # none | create | evolve (applier/evolve.py)
    # auto | on | off: MySQL/MariaDB upserts through LOAD DATA LOCAL INFILE (applier/sinks/mysql_load.py); auto uses
    # it when the server allows local_infile, on requires it, off keeps executemany. PostgreSQL: not used.
    load_data: str = "auto"
    # parallel transaction streams per resolved window, split by target table (applier/streams); 1: one transaction
    apply_streams: int = 1
    # auto | driver | executors: where the streams' transactions run (threads of the driver, or Spark tasks:
    # applier/streams/remote.py); only read with apply_streams > 1, see Settings.applies_on_executors()
    apply_on: str = "auto"

    @property
    def verifies_certificate(self) -> bool:
        """Whether the server's certificate is checked (ssl_mode verify-ca or verify-full)."""
        return self.ssl_mode in ("verify-ca", "verify-full")

    def sqlalchemy_url(self) -> URL:
        """The effective URL, password resolved (``str()`` of a SQLAlchemy URL masks it; use
        ``url.render_as_string(hide_password=False)`` only to hand it to a driver)."""
        return self._url

    @property
    def url_redacted(self) -> str:
        return self._url.render_as_string(hide_password=True)

    @property
    def drivername(self) -> str:
        return self._url.drivername

    @property
    def dialect(self) -> str:
        """``mysql``, ``mariadb`` or ``postgresql``."""
        return self._url.get_backend_name()

    def on_this_machine(self) -> bool:
        """Whether the target database runs on this machine: its URL's host (which the configuration requires) is
        ``localhost`` or a loopback address (127.0.0.0/8, ::1). Read by ``apply_on = "auto"``: such a target
        shares the cores Spark and the applier use, so parallel transactions have no database work of their own
        to overlap (Settings.apply_form)."""
        host = self._url.host or ""
        if host.lower() == "localhost":
            return True
        try:
            return ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            return False

    def redacted(self) -> dict[str, Any]:
        return {
            "url": self.url_redacted,
            "password_env": self.password_env,
            "password_file": self.password_file,
            "ssl_mode": self.ssl_mode or None,
            "ssl_ca": self.ssl_ca,
            "ssl_cert": self.ssl_cert,
            "ssl_key": self.ssl_key,
            "batch_rows": self.batch_rows,
            "on_unsupported_ddl": self.on_unsupported_ddl,
            "on_apply_error": self.on_apply_error,
            "shard_ddl": self.shard_ddl,
            "schema": self.schema,
            "retry_seconds": self.retry_seconds,
            "schema_evolution": self.schema_evolution,
            "load_data": self.load_data,
            "apply_streams": self.apply_streams,
            "apply_on": self.apply_on,
        }

    @property
    def uses_load_data(self) -> bool:
        """Whether the engine is made for LOAD DATA LOCAL (a MySQL/MariaDB target, load_data not "off")."""
        return self.load_data != "off" and self.dialect in ("mysql", "mariadb")


@dataclass(frozen=True, repr=False)
class SparkSettings(_RedactedRepr):
    master: str = "local[2]"
    startup_timeout_seconds: int = 120
    class_archive: bool = True  # Java class-data sharing for the driver's JVM (applier.session.class_archive)
    conf: Mapping[str, str] = field(default_factory=FrozenMap)
    _conf_templates: Mapping[str, str] = field(default_factory=FrozenMap, compare=False)

    def redacted(self) -> dict[str, Any]:
        return {"master": self.master, "startup_timeout_seconds": self.startup_timeout_seconds,
                "class_archive": self.class_archive, "conf": _redact_options(self.conf, self._conf_templates)}

    @property
    def is_local(self) -> bool:
        return is_local_master(self.master)


@dataclass(frozen=True, repr=False)
class MetricsSettings(_RedactedRepr):
    """``[metrics]``: the Prometheus endpoint of ``applier run`` (applier.metrics); off unless a port is set."""

    port: int = 0  # 0: no endpoint
    host: str = "127.0.0.1"  # loopback by default: the metrics name tables and topics

    def redacted(self) -> dict[str, Any]:
        return {"port": self.port, "host": self.host}


@dataclass(frozen=True, repr=False)
class RouteSettings(_RedactedRepr):
    """A ``[[route]]`` entry as written (``rule`` is its compiled form)."""

    match: str
    schema: str | None = None
    table: str | None = None
    ignore: bool = False
    on_apply_error: str | None = None
    on_decode_error: str | None = None
    mode: str | None = None  # replica | history | soft_delete (applier.modes); None: replica

    def redacted(self) -> dict[str, Any]:
        out: dict[str, Any] = {"match": self.match}
        if self.schema is not None:
            out["schema"] = self.schema
        if self.table is not None:
            out["table"] = self.table
        if self.ignore:
            out["ignore"] = True
        if self.on_apply_error is not None:
            out["on_apply_error"] = self.on_apply_error
        if self.on_decode_error is not None:
            out["on_decode_error"] = self.on_decode_error
        if self.mode is not None:
            out["mode"] = self.mode
        return out


@dataclass(frozen=True, repr=False)
class Settings(_RedactedRepr):
    pipeline: PipelineSettings
    source: SourceSettings
    target: TargetSettings
    spark: SparkSettings = field(default_factory=SparkSettings)
    routes: tuple[Rule, ...] = ()
    source_path: Path | None = None  # the configuration file, when loaded from one
    metrics: MetricsSettings = field(default_factory=MetricsSettings)

    def target_url(self) -> URL:
        """The effective target URL with the password resolved (never log it; ``str()`` masks it)."""
        return self.target.sqlalchemy_url()

    def decodes_on_executors(self) -> bool:
        """Whether Spark's Python workers decode the records (applier.decode): ``pipeline.decode_on``, where
        "auto" means yes for every protocol whose decoder runs there: those whose messages decode alone, and
        Simple, which decodes there with a snapshot of the driver's schemas (applier.codecs.simple)."""
        if self.pipeline.decode_on == "driver":
            return False
        from applier.codecs import decodes_on_workers

        return decodes_on_workers(self.source.protocol)

    def applies_on_executors(self) -> bool:
        """Whether the apply streams write their shares in Spark tasks (applier.streams.remote) rather than in
        threads of the driver: ``target.apply_on``, where "auto" means yes on a cluster master (the driver then
        does no per-row write work) and no on ``local[N]`` (the driver's threads share the machine's cores
        without shipping the rows to another process). With one stream there is nothing to spread: no."""
        return self.apply_form() == "executors"

    def apply_form(self) -> str:
        """How the apply streams write (``target.apply_on``): "executors" (Spark tasks), "driver" (threads of the
        driver) or "one_transaction" (every stream's share of a window in one transaction of the driver, each
        stream's progress with it); "single" with one stream.

        "auto": executors on a cluster master; on ``local[N]``, driver threads for a target on another machine
        (they overlap its work and round trips) and one transaction for a target on this one, which shares the
        cores Spark and the applier already fill: there, at the machine's limit, four threads applied fewer row
        changes per second than N = 1 in three runs of four, and one transaction is N = 1's own transactions
        (docs/benchmarks.md, round 10)."""
        on = self.target.apply_on
        if self.target.apply_streams <= 1:
            return "single"
        if on != "auto":
            return on
        if not self.spark.is_local:
            return "executors"
        return "one_transaction" if self.target.on_this_machine() else "driver"

    def stops_at_decode_error(self) -> bool:
        """Whether the first message that cannot be decoded stops the run: only when no policy anywhere says
        otherwise (a [[route]] rule's ``on_decode_error`` needs every error collected to decide per table)."""
        return self.pipeline.on_decode_error == "stop" and all(
            r.on_decode_error in (None, "stop") for r in self.routes)

    def redacted(self) -> dict[str, Any]:
        """Everything, secrets masked: for ``applier status`` and logs."""
        return {
            "source_path": str(self.source_path) if self.source_path else None,
            "pipeline": self.pipeline.redacted(),
            "source": self.source.redacted(),
            "target": self.target.redacted(),
            "spark": self.spark.redacted(),
            "metrics": self.metrics.redacted(),
            "route": [
                RouteSettings(r.match, r.schema, r.table, r.ignore, r.on_apply_error, r.on_decode_error,
                              mode=r.mode).redacted()
                for r in self.routes
            ],
        }


# --------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, source: str, env: Mapping[str, str], base_dir: Path) -> None:
        self.source = source
        self.env = env
        self.base_dir = base_dir
        self.secrets: list[str] = []

    # -- errors --------------------------------------------------------------------------------

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(key, message, source=self.source)

    def scrub(self, err: ConfigError) -> ConfigError:
        message = err.message
        forms = set()
        for secret in self.secrets:
            if secret:
                # as written, as repr() shows it inside quotes, and URL-quoted
                forms.update({secret, repr(secret)[1:-1], urllib.parse.quote(secret, safe="")})
        for form in sorted(forms, key=len, reverse=True):
            message = message.replace(form, MASK)
        if message == err.message:
            return err
        return ConfigError(err.key, message, source=err.source)

    # -- generic readers -----------------------------------------------------------------------

    def table(self, data: Any, key: str, allowed: Sequence[str]) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.error(key, f"expected a table ([{key}]), got {_type_name(data)}")
        for k in data:
            if k not in allowed:
                raise self.error(
                    _join(key, k),
                    f"unknown key{_suggest(k, allowed)} (valid keys in [{key}]: {', '.join(allowed)})",
                )
        return data

    def get(
        self,
        data: Mapping[str, Any],
        prefix: str,
        key: str,
        kind: type | tuple[type, ...],
        *,
        hint: str,
        default: Any = ...,
    ) -> Any:
        dotted = _join(prefix, key)
        if key not in data:
            if default is ...:
                raise self.error(dotted, f"missing required key; add {hint}")
            return default
        value = data[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            raise self.error(dotted, f"expected {_kind_name(kinds[0])}, got {_type_name(value)}; write {hint}")
        return value

    def choice(
        self, data: Mapping[str, Any], prefix: str, key: str, choices: Sequence[str], default: str
    ) -> str:
        hint = f'{key} = "{choices[0]}"'
        value = self.get(data, prefix, key, str, hint=hint, default=default)
        if value not in choices:
            raise self.error(
                _join(prefix, key),
                f"invalid value {value!r}{_suggest(value, choices)} (expected one of: {', '.join(choices)})",
            )
        return value

    def positive_int(self, data: Mapping[str, Any], prefix: str, key: str, default: Any, example: int) -> Any:
        value = self.get(data, prefix, key, int, hint=f"{key} = {example}", default=default)
        if value is not None and value < 1:
            raise self.error(_join(prefix, key), f"must be >= 1, got {value}; e.g. {key} = {example}")
        return value

    def expand(self, key: str, value: str, *, secret: bool, quote: bool = False) -> str:
        """Replace ``${VAR}`` with the environment's value (``$${`` -> literal ``${``)."""

        def sub(m: re.Match[str]) -> str:
            if m.group(0) == "$${":
                return "${"
            name = m.group(1)
            if name.startswith("file:"):  # a secret kept in a file (a Kubernetes secret volume): always a secret
                resolved = self.secret_file(key, name[len("file:"):])
                self.secrets.append(resolved)
                if quote:
                    self.secrets.append(urllib.parse.quote(resolved, safe=""))
                return urllib.parse.quote(resolved, safe="") if quote else resolved
            if not _ENV_NAME_RE.fullmatch(name):
                raise self.error(key, f"invalid environment reference ${{{name}}}; write ${{NAME}} (letters, digits, _)")
            if name not in self.env:
                raise self.error(key, f"environment variable {name} is not set (referenced as ${{{name}}})")
            resolved = self.env[name]
            if secret:
                self.secrets.append(resolved)
                if quote:
                    self.secrets.append(urllib.parse.quote(resolved, safe=""))
            return urllib.parse.quote(resolved, safe="") if quote else resolved

        return _ENV_REF_RE.sub(sub, value)

    def secret_file(self, key: str, path_text: str) -> str:
        """The secret a file holds (``${file:PATH}``, ``target.password_file``): its text, less one trailing newline
        (``echo pw > f`` and Kubernetes secret volumes both work). A relative path resolves against the config
        file's folder. Any file mode is accepted: Kubernetes mounts secrets 0644 by default in a volume only the pod
        sees; keeping the file private is the deployment's business (README, "Secrets")."""
        if not path_text.strip():
            raise self.error(key, "empty file path in ${file:...}; write ${file:/run/secrets/NAME}")
        path = self.local_path(path_text.strip())
        try:
            with path.open("rb") as fh:
                data = fh.read(SECRET_FILE_MAX_BYTES + 1)
        except FileNotFoundError:
            raise self.error(key, f"secret file {path} does not exist; create it (or mount the secret there) or "
                             "fix the path") from None
        except IsADirectoryError:
            raise self.error(key, f"secret file {path} is a directory; name the file inside it") from None
        except PermissionError:
            raise self.error(key, f"secret file {path} is not readable by this user (uid {os.getuid()}); "
                             "give it read permission for the applier's user") from None
        except OSError as exc:
            raise self.error(key, f"cannot read secret file {path}: {exc.strerror or exc}") from None
        if len(data) > SECRET_FILE_MAX_BYTES:
            raise self.error(key, f"secret file {path} is larger than {SECRET_FILE_MAX_BYTES} bytes: not a "
                             "password file; check the path")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(key, f"secret file {path} is not UTF-8 text") from None
        if text.endswith("\r\n"):
            text = text[:-2]
        elif text.endswith("\n"):
            text = text[:-1]
        if text == "":
            raise self.error(key, f"secret file {path} is empty; write the secret into it")
        return text

    def readable_file(self, key: str, value: str, what: str) -> str:
        """A file the applier (or its driver's Kafka client) reads at start-up, as an absolute path; it must exist
        and be readable now, so a wrong path is named here rather than deep in a driver's TLS handshake."""
        if not value.strip():
            raise self.error(key, f"must not be empty: the path of {what}")
        path = self.local_path(value.strip())
        if not path.is_file():
            raise self.error(key, f"{what} {path} does not exist or is not a file; fix the path")
        if not os.access(path, os.R_OK):
            raise self.error(key, f"{what} {path} is not readable by this user (uid {os.getuid()})")
        return str(path)

    def local_dir_key(self, d: Mapping[str, Any], key: str, example: str) -> Path | None:
        """An optional ``[pipeline]`` folder that must be on the driver's own disk (never a URI); None if unset."""
        value = self.get(d, "pipeline", key, str, hint=f'{key} = "{example}"', default="")
        if not value.strip():
            return None
        if is_uri(value):
            raise self.error(f"pipeline.{key}", "must be a local directory on the driver's host, not a URI")
        return self.local_path(value)

    def local_path(self, value: str) -> Path:
        path = Path(value).expanduser()
        if not path.is_absolute():
            path = self.base_dir / path
        return Path(os.path.normpath(path))

    def options(
        self, data: Any, key: str, owned: Mapping[str, str], *, allow_float: bool, prefix_hint: str | None
    ) -> tuple[Mapping[str, str], Mapping[str, str]]:
        """A str -> str table (ints/bools, and floats when allowed, become strings)."""
        if not isinstance(data, dict):
            raise self.error(key, f"expected a table ([{key}]) of string values, got {_type_name(data)}")
        values: dict[str, str] = {}
        templates: dict[str, str] = {}
        for k, v in data.items():
            dotted = f"{key}.{k}" if re.fullmatch(r"[A-Za-z0-9_-]+", k) else f'{key}."{k}"'
            if not k.strip():
                raise self.error(dotted, "empty option name")
            if prefix_hint and k.startswith(prefix_hint):
                raise self.error(
                    dotted,
                    f"write the option without the {prefix_hint!r} prefix (the applier adds it): "
                    f'"{k[len(prefix_hint):]}" = ...',
                )
            if k in owned:
                raise self.error(dotted, f"this option is owned by the applier: {owned[k]}")
            secret = _is_secret_key(k)
            if isinstance(v, bool):
                text = "true" if v else "false"
            elif isinstance(v, int) or (allow_float and isinstance(v, float)):
                text = str(v)
            elif isinstance(v, str):
                text = self.expand(dotted, v, secret=secret)
                if text != v:
                    templates[k] = v
                elif secret:
                    self.secrets.append(v)
            else:
                allowed = "a string, integer or boolean" + (" or float" if allow_float else "")
                raise self.error(dotted, f"expected {allowed}, got {_type_name(v)}; quote the value")
            values[k] = text
        return FrozenMap(values), FrozenMap(templates)

    # -- sections ------------------------------------------------------------------------------

    def parse(self, data: Mapping[str, Any]) -> Settings:
        if not isinstance(data, Mapping):
            raise self.error("<root>", f"expected a TOML document (a table), got {_type_name(data)}")
        data = dict(data)
        for k in data:
            if k not in _SECTIONS:
                raise self.error(
                    k, f"unknown section{_suggest(k, _SECTIONS)} (valid sections: {', '.join(_SECTIONS)})"
                )
        for required in ("pipeline", "source", "target"):
            if required not in data:
                raise self.error(required, f"missing required section; add a [{required}] table")
        # target first: it collects the password, so later messages can be scrubbed of it.
        target = self.parse_target(data["target"])
        pipeline = self.parse_pipeline(data["pipeline"])
        source = self.parse_source(data["source"])
        spark = self.parse_spark(data.get("spark", {}))
        metrics = self.parse_metrics(data.get("metrics", {}))
        routes = self.parse_routes(data.get("route", []))
        self.check_route_modes(routes, pipeline, source, target)
        self.check_apply_streams(source, target)
        if pipeline.decode_on == "executors":
            from applier.codecs import decodes_on_workers

            if not decodes_on_workers(source.protocol):
                raise self.error(
                    "pipeline.decode_on",
                    f'"executors" is not possible with source.protocol = "{source.protocol}": its messages '
                    "decode with a schema learnt from earlier messages, which only the driver has. Use "
                    '"auto" (executors where possible) or "driver"',
                )
        return Settings(pipeline=pipeline, source=source, target=target, spark=spark, routes=routes, metrics=metrics)

    def parse_pipeline(self, raw: Any) -> PipelineSettings:
        p = "pipeline"
        d = self.table(raw, p, _PIPELINE_KEYS)
        name = self.get(d, p, "name", str, hint='name = "shop-replica"')
        if not _NAME_RE.fullmatch(name):
            raise self.error(
                "pipeline.name",
                f"invalid name {name!r}: use 1 to 64 characters from A-Z a-z 0-9 _ . - (e.g. \"shop-replica\")",
            )
        ckpt = self.get(d, p, "checkpoint_dir", str, hint='checkpoint_dir = "/var/lib/applier/<name>"')
        if not ckpt.strip():
            raise self.error("pipeline.checkpoint_dir", 'must not be empty; e.g. checkpoint_dir = "/var/lib/applier/<name>"')
        ckpt = ckpt.strip()
        if is_uri(ckpt):
            checkpoint_dir = ckpt  # Spark's business: never normalised (hdfs://nn:8020/x must stay so)
            scheme, _, rest = ckpt.partition("://")
            if scheme.lower() == "file" and not rest.startswith("/"):
                raise self.error("pipeline.checkpoint_dir",
                                 f"{ckpt!r} is not an absolute file URI; write file:///abs/path (three slashes)")
            default_local = (Path(urllib.parse.unquote(rest)) if scheme.lower() == "file"
                             else default_state_dir() / name)
        else:
            checkpoint_dir = str(self.local_path(ckpt))
            default_local = Path(checkpoint_dir)
        local_dir = self.local_dir_key(d, "local_dir", "/var/lib/applier/<name>") or default_local
        buffer_mb = self.positive_int(d, p, "buffer_memory_mb", 512, 512)
        spill_dir = self.local_dir_key(d, "spill_dir", "/var/lib/applier/<name>/spill") or local_dir / "spill"
        on_decode_error = self.choice(d, p, "on_decode_error", DECODE_ERROR_POLICIES, "stop")
        interval_text = self.get(d, p, "trigger_interval", str, hint='trigger_interval = "500 ms"', default="500 ms")
        interval, interval_ms = self.duration("pipeline.trigger_interval", interval_text)
        max_offsets = self.positive_int(d, p, "max_offsets_per_trigger", None, 100000)
        decode_on = self.choice(d, p, "decode_on", ("auto", "executors", "driver"), "auto")
        columnar = self.get(d, p, "columnar", bool, hint="columnar = false", default=True)
        return PipelineSettings(
            name=name,
            checkpoint_dir=checkpoint_dir,
            buffer_memory_mb=buffer_mb,
            spill_dir=spill_dir,
            local_dir=local_dir,
            on_decode_error=on_decode_error,
            trigger_interval=interval,
            trigger_interval_ms=interval_ms,
            max_offsets_per_trigger=max_offsets,
            decode_on=decode_on,
            columnar=bool(columnar),
        )

    def duration(self, key: str, text: str) -> tuple[str, int]:
        m = _DURATION_RE.fullmatch(text)
        unit = m.group(2).lower() if m else ""
        if m is None or unit not in _DURATION_UNITS:
            raise self.error(
                key,
                f"invalid duration {text!r}; write a whole number and a unit: "
                '"500 ms", "1 second", "10 seconds", "2 minutes"',
            )
        n = int(m.group(1))
        if n < 1:
            raise self.error(key, f"must be positive, got {text!r}; e.g. \"1 second\"")
        factor = _DURATION_UNITS[unit]
        canonical_unit = {1: "millisecond", 1000: "second", 60_000: "minute"}[factor]
        canonical = f"{n} {canonical_unit}" + ("" if n == 1 else "s")
        return canonical, n * factor

    def parse_source(self, raw: Any) -> SourceSettings:
        p = "source"
        d = self.table(raw, p, _SOURCE_KEYS)
        servers = self.get(d, p, "bootstrap_servers", str, hint='bootstrap_servers = "127.0.0.1:9092"')
        self.check_servers(servers)
        has_topics, has_pattern = "topics" in d, "topic_pattern" in d
        if has_topics == has_pattern:
            raise self.error(
                "source.topics",
                ("set only one of topics and topic_pattern" if has_topics else "missing: set topics")
                + ' (topics = ["tidb-shop"] or topic_pattern = "tidb-.*")',
            )
        topics: tuple[str, ...] | None = None
        pattern: str | None = None
        if has_topics:
            value = self.get(d, p, "topics", list, hint='topics = ["tidb-shop"]')
            if not value:
                raise self.error("source.topics", 'must not be empty; e.g. topics = ["tidb-shop"]')
            for i, t in enumerate(value):
                if not isinstance(t, str):
                    raise self.error(f"source.topics[{i}]", f"expected a string, got {_type_name(t)}")
                if not _TOPIC_RE.fullmatch(t) or t in (".", ".."):
                    raise self.error(
                        f"source.topics[{i}]",
                        f"invalid Kafka topic name {t!r}: use 1 to 249 characters from A-Z a-z 0-9 . _ -",
                    )
            if len(set(value)) != len(value):
                raise self.error("source.topics", "lists a topic twice")
            topics = tuple(value)
        else:
            pattern = self.get(d, p, "topic_pattern", str, hint='topic_pattern = "tidb-.*"')
            if not pattern:
                raise self.error("source.topic_pattern", 'must not be empty; e.g. topic_pattern = "tidb-.*"')
            try:
                re.compile(pattern)
            except re.error as exc:
                raise self.error("source.topic_pattern", f"invalid regular expression: {exc}") from None
        protocol = self.get(d, p, "protocol", str, hint='protocol = "canal-json" (or "open")')
        supported = supported_protocols()
        if protocol not in supported:
            raise self.error(
                "source.protocol",
                f"unknown protocol {protocol!r}{_suggest(protocol, supported)} "
                f"(supported: {', '.join(supported)})",
            )
        codec = self.codec_options(d.get("codec", {}), protocol)
        starting = self.choice(d, p, "starting_offsets", ("earliest", "latest"), "earliest")
        start_ts = self.start_ts(d, protocol, codec, starting)
        skew_text = self.get(d, p, "max_clock_skew", str, hint='max_clock_skew = "1 minute"', default=None)
        skew_ms = DEFAULT_MAX_SKEW_MS if skew_text is None else self.duration("source.max_clock_skew", skew_text)[1]
        retry = self.get(d, p, "retry_seconds", int, hint="retry_seconds = 300", default=300)
        if retry < 0:
            raise self.error("source.retry_seconds", f"must be >= 0 (0: never retry), got {retry}")
        kafka, kafka_templates = self.options(
            d.get("kafka", {}), "source.kafka", OWNED_KAFKA_KEYS, allow_float=False, prefix_hint="kafka."
        )
        files = {k: self.readable_file(f'source.kafka."{k}"', kafka[k], "the file")
                 for k in KAFKA_FILE_KEYS if k in kafka}
        if files:
            kafka = FrozenMap({**kafka, **files})
        return SourceSettings(
            bootstrap_servers=servers,
            protocol=protocol,
            topics=topics,
            topic_pattern=pattern,
            starting_offsets=starting,
            start_ts=start_ts,
            max_clock_skew_ms=skew_ms,
            retry_seconds=retry,
            kafka=kafka,
            _kafka_templates=kafka_templates,
            codec=codec,
        )

    def start_ts(self, d: Mapping[str, Any], protocol: str, codec: Mapping[str, Any], starting: str) -> int | None:
        """``source.start_ts``: the TSO of the snapshot a new replica was seeded from (Dumpling/BR at that TSO,
        then a changefeed with ``--start-ts`` of it). Only a gated stream can honour it: the pipeline seeds its
        applied resolved ts with it, and only the gate drops changes by commit ts (invariant 4). Ungated streams
        carry no commit ts (Canal-JSON and Avro without the TiDB extension: every change has 0) or no resolved
        ts to order by, so skipping "what the snapshot holds" would be a guess that loses or re-applies rows."""
        key = "source.start_ts"
        value = self.get(d, "source", "start_ts", int, hint=f"start_ts = 449958940139667457 ({TSO_HINT})",
                         default=None)
        if value is None:
            return None
        problem = tso_problem(value)
        if problem:
            raise self.error(key, problem)
        if starting == "latest":
            raise self.error(key, 'needs source.starting_offsets = "earliest" (the default): with "latest" every '
                             "change committed after the snapshot but written before this run starts would be "
                             "skipped")
        from applier.codecs import get_decoder
        if not get_decoder(protocol, **codec).gated:
            raise self.error(
                key, f'cannot be honoured with source.protocol = "{protocol}" and these [source.codec] options: that '
                "stream has no resolved ts (and its changes may carry no commit ts), so it is applied in offset order "
                "and nothing tells which changes the snapshot already holds. Use a gated changefeed (open, simple, "
                "canal-json with enable-tidb-extension=true, debezium with enable-tidb-extension=true and gated = "
                "true, avro with avro-enable-watermark=true and enable_watermark = true), or drop start_ts and give "
                "this pipeline a topic that holds only the changes after the snapshot (a changefeed created with "
                "--start-ts=<the snapshot's TSO>)")
        return value

    def codec_options(self, raw: Any, protocol: str) -> Mapping[str, Any]:
        """``[source.codec]``: options of the protocol's decoder (strings may use ${VAR}); checked by
        building the decoder once, so a wrong option name fails here with the valid ones listed."""
        if not isinstance(raw, dict):
            raise self.error("source.codec", f"expected a table of decoder options, got {_type_name(raw)}")
        out: dict[str, Any] = {}
        for k, v in raw.items():
            key = f"source.codec.{k}"
            if isinstance(v, str):
                v = self.expand(key, v, secret=_is_secret_key(k))
                pw = _url_password(v)
                if pw:
                    self.secrets.append(pw)
            elif not isinstance(v, (bool, int, float)):
                raise self.error(key, f"expected a string, number or boolean, got {_type_name(v)}")
            out[k] = v
        from applier.codecs import get_decoder
        try:
            get_decoder(protocol, **out)
        except ValueError as exc:
            raise self.error("source.codec", str(exc)) from None
        return FrozenMap(out)

    def check_servers(self, servers: str) -> None:
        key = "source.bootstrap_servers"
        hint = 'write "host:port" or "host1:port1,host2:port2"'
        if not servers.strip():
            raise self.error(key, f"must not be empty; {hint}")
        for entry in servers.split(","):
            entry = entry.strip()
            host, sep, port = entry.rpartition(":")
            if host.startswith("[") and host.endswith("]"):
                host_ok = len(host) > 2
            else:
                host_ok = bool(_HOSTNAME_RE.fullmatch(host))
            if not sep or not host_ok:
                raise self.error(key, f"invalid server {entry!r}; {hint}")
            if not port.isdigit() or not 1 <= int(port) <= 65535:
                raise self.error(key, f"invalid port in {entry!r} (1-65535); {hint}")

    def parse_target(self, raw: Any) -> TargetSettings:
        p = "target"
        d = self.table(raw, p, _TARGET_KEYS)
        example = f'url = "postgresql+psycopg://replica@127.0.0.1:5432/replica" (drivers: {", ".join(SUPPORTED_DRIVERS)})'
        raw_url = self.get(d, p, "url", str, hint=example)
        password_env = self.get(d, p, "password_env", str, hint='password_env = "REPLICA_PASSWORD"', default=None)
        password_file = self.get(d, p, "password_file", str, hint='password_file = "/run/secrets/replica-password"',
                                 default=None)
        # Remember the password part (literal or from ${VAR}) before parsing, so no message can echo it.
        expanded = self.expand("target.url", raw_url, secret=False, quote=True)
        self.note_literal_password(expanded)
        try:
            url = make_url(expanded)
        except (ArgumentError, ValueError):
            raise self.error(
                "target.url", f"not a valid SQLAlchemy URL; write e.g. {example}"
            ) from None
        if url.drivername not in SUPPORTED_DRIVERS:
            backend = url.drivername.split("+", 1)[0]
            near = [d_ for d_ in SUPPORTED_DRIVERS if d_.startswith(backend + "+")]
            if backend in ("postgres", "pg"):
                near = ["postgresql+psycopg"]
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise self.error(
                "target.url",
                f"unsupported driver {url.drivername!r}{hint} (accepted: {', '.join(SUPPORTED_DRIVERS)})",
            )
        if not url.host:
            raise self.error("target.url", f"missing host; write e.g. {example}")
        if not url.database:
            raise self.error("target.url", f"missing database name after the host; write e.g. {example}")
        if url.password is not None:
            self.secrets.append(str(url.password))
        if password_env is not None and password_file is not None:
            raise self.error("target.password_file", "set the password in one place: password_env or password_file, "
                             "not both")
        if password_file is not None:
            if url.password is not None:
                raise self.error(
                    "target.password_file",
                    "the url already carries a password; set it in one place (drop it from the url or drop "
                    "password_file)")
            password = self.secret_file("target.password_file", password_file)
            self.secrets.append(password)
            url = url.set(password=password)
            password_file = str(self.local_path(password_file.strip()))
        if password_env is not None:
            if not _ENV_NAME_RE.fullmatch(password_env):
                raise self.error(
                    "target.password_env",
                    f"invalid environment variable name {password_env!r}; e.g. password_env = \"REPLICA_PASSWORD\"",
                )
            if url.password is not None:
                raise self.error(
                    "target.password_env",
                    "the url already carries a password; set it in one place (drop it from the url or drop password_env)",
                )
            if password_env not in self.env:
                raise self.error("target.password_env", f"environment variable {password_env} is not set")
            password = self.env[password_env]
            if password == "":
                raise self.error(
                    "target.password_env",
                    f"environment variable {password_env} is empty; set it, or drop password_env for a passwordless login",
                )
            self.secrets.append(password)
            url = url.set(password=password)
        batch_rows = self.positive_int(d, p, "batch_rows", 5000, 5000)
        on_ddl = self.choice(d, p, "on_unsupported_ddl", ("stop", "skip"), "stop")
        on_apply = self.choice(d, p, "on_apply_error", APPLY_ERROR_POLICIES, "stop")
        shard_ddl = self.choice(d, p, "shard_ddl", ("stop", "skip"), "stop")
        evolution = self.choice(d, p, "schema_evolution", SCHEMA_EVOLUTION, "create")
        load_data = self.choice(d, p, "load_data", LOAD_DATA, "auto")
        if load_data == "on" and url.get_backend_name() == "postgresql":
            raise self.error("target.load_data", '"on" is for MySQL/MariaDB targets (LOAD DATA LOCAL INFILE); a '
                             'PostgreSQL target already writes with COPY: remove the key or set "auto"')
        retry = self.get(d, p, "retry_seconds", int, hint="retry_seconds = 300", default=300)
        if retry < 0:
            raise self.error("target.retry_seconds", f"must be >= 0 (0: never retry), got {retry}")
        schema = self.get(d, p, "schema", str, hint='schema = "replica" (or leave it out)', default="")
        if len(schema) > MAX_NAME_LENGTH:
            raise self.error("target.schema", f"longer than {MAX_NAME_LENGTH} characters")
        if schema and schema != schema.strip():
            raise self.error("target.schema", "must not start or end with spaces")
        streams = self.positive_int(d, p, "apply_streams", 1, 4)
        if streams > MAX_APPLY_STREAMS:
            raise self.error("target.apply_streams", f"at most {MAX_APPLY_STREAMS} (each stream holds a target "
                             f"connection and a driver thread), got {streams}")
        apply_on = self.choice(d, p, "apply_on", APPLY_ON, "auto")
        tls = self.target_tls(d, url)
        return TargetSettings(
            _url=url,
            password_env=password_env,
            password_file=password_file,
            **tls,
            batch_rows=batch_rows,
            on_unsupported_ddl=on_ddl,
            on_apply_error=on_apply,
            shard_ddl=shard_ddl,
            schema=schema,
            retry_seconds=retry,
            schema_evolution=evolution,
            load_data=load_data,
            apply_streams=streams,
            apply_on=apply_on,
        )

    def target_tls(self, d: Mapping[str, Any], url: URL) -> dict[str, Any]:
        """``[target] ssl_mode``, ``ssl_ca``, ``ssl_cert``, ``ssl_key``: TLS to the target database, one vocabulary
        for every target (PostgreSQL's sslmode words; applier.dialect maps them to each driver's arguments).
        ``ssl_ca`` alone means ``verify-full``: the certificate must chain to that CA and name the url's host."""
        p = "target"
        mode = self.get(d, p, "ssl_mode", str, hint='ssl_mode = "verify-full"', default=None)
        if mode is not None and mode not in SSL_MODES:
            raise self.error("target.ssl_mode", f"invalid value {mode!r}{_suggest(mode, SSL_MODES)} (expected one of: "
                             f"{', '.join(SSL_MODES)}; verify-full checks the certificate and that it names the url's "
                             "host, verify-ca only the certificate, require encrypts without checking it)")
        files: dict[str, str | None] = {}
        for key, example, what in (("ssl_ca", "/etc/applier/tls/ca.pem", "the CA certificate file (PEM)"),
                                   ("ssl_cert", "/etc/applier/tls/client.pem", "the client certificate file (PEM)"),
                                   ("ssl_key", "/etc/applier/tls/client.key", "the client key file (PEM)")):
            value = self.get(d, p, key, str, hint=f'{key} = "{example}"', default=None)
            files[key] = None if value is None else self.readable_file(f"target.{key}", value, what)
        if (files["ssl_cert"] is None) != (files["ssl_key"] is None):
            missing = "ssl_key" if files["ssl_key"] is None else "ssl_cert"
            raise self.error(f"target.{missing}", "a client certificate needs both ssl_cert and ssl_key; set "
                             f"{missing} too (or drop the other)")
        given = [k for k in ("ssl_mode", "ssl_ca", "ssl_cert", "ssl_key") if k in d]
        if mode is None and given:
            mode = "verify-full"
        if mode == "disable" and len(given) > 1:
            raise self.error("target.ssl_mode", f'"disable" contradicts {", ".join(g for g in given if g != "ssl_mode")}: '
                             "drop them, or choose require, verify-ca or verify-full")
        in_url = sorted(k for k in url.query if k.lower() in _URL_TLS_QUERY)
        if given and in_url:
            raise self.error(f"target.{given[0]}", f"the url's query already sets TLS ({', '.join(in_url)}); set TLS "
                             "in one place: the [target] ssl_* keys (preferred) or the url, not both")
        return {"ssl_mode": mode or "", "ssl_ca": files["ssl_ca"], "ssl_cert": files["ssl_cert"],
                "ssl_key": files["ssl_key"]}

    def note_literal_password(self, text: str) -> None:
        """Record the password part of a URL-like string (before parsing, so parse errors can't leak it)."""
        for pattern in (r"[^:/]*://[^:@/]*:([^@]*)@", r"[^:/]*://[^:@/]*:(.*)@"):
            m = re.match(pattern, text, re.S)
            if m and m.group(1):
                self.secrets.append(m.group(1))
                self.secrets.append(urllib.parse.unquote(m.group(1)))

    def parse_spark(self, raw: Any) -> SparkSettings:
        p = "spark"
        d = self.table(raw, p, _SPARK_KEYS)
        master = self.get(d, p, "master", str, hint='master = "local[2]"', default="local[2]")
        if not master.strip():
            raise self.error("spark.master", 'must not be empty; e.g. master = "local[2]"')
        timeout = self.positive_int(d, p, "startup_timeout_seconds", 120, 120)
        conf, templates = self.options(
            d.get("conf", {}), "spark.conf", OWNED_SPARK_KEYS, allow_float=True, prefix_hint=None
        )
        archive = self.get(d, p, "class_archive", bool, hint="class_archive = true", default=True)
        return SparkSettings(master=master.strip(), startup_timeout_seconds=timeout, class_archive=archive,
                             conf=conf, _conf_templates=templates)

    def parse_metrics(self, raw: Any) -> MetricsSettings:
        p = "metrics"
        d = self.table(raw, p, _METRICS_KEYS)
        port = self.get(d, p, "port", int, hint="port = 9464", default=0)
        if not 0 <= port <= 65535:
            raise self.error("metrics.port", f"must be a TCP port 1..65535 (0 or absent: no endpoint), got {port}; "
                             "e.g. port = 9464")
        host = self.get(d, p, "host", str, hint='host = "127.0.0.1"', default="127.0.0.1").strip()
        if not host:
            raise self.error("metrics.host", 'must not be empty; e.g. host = "127.0.0.1" (or "0.0.0.0" for every '
                             "interface, if the network is trusted)")
        return MetricsSettings(port=port, host=host)

    def parse_routes(self, raw: Any) -> tuple[Rule, ...]:
        if isinstance(raw, dict):
            raise self.error("route", "must be an array of tables: write [[route]] (double brackets), one per rule")
        if not isinstance(raw, list):
            raise self.error("route", f"expected [[route]] tables, got {_type_name(raw)}")
        rules = []
        for i, entry in enumerate(raw):
            key = f"route[{i}]"
            if not isinstance(entry, dict):
                raise self.error(key, f"expected a table ([[route]]), got {_type_name(entry)}")
            self.table(entry, key, _ROUTE_KEYS)
            match = self.get(entry, key, "match", str, hint='match = "shop.*"')
            schema = self.get(entry, key, "schema", str, hint='schema = "{schema}_copy"', default=None)
            table = self.get(entry, key, "table", str, hint='table = "{table}"', default=None)
            ignore = self.get(entry, key, "ignore", bool, hint="ignore = true", default=None)
            on_apply = self.get(entry, key, "on_apply_error", str, hint='on_apply_error = "quarantine"', default=None)
            on_decode = self.get(entry, key, "on_decode_error", str, hint='on_decode_error = "quarantine"',
                                 default=None)
            mode = self.get(entry, key, "mode", str, hint='mode = "history"', default=None)
            if ignore is False and match.strip(" \t").startswith("!"):
                raise self.error(
                    f"{key}.ignore",
                    "contradicts the leading '!' in match (which means ignore); drop one of them",
                )
            try:
                rules.append(Rule(match, schema=schema, table=table, ignore=bool(ignore), name=key,
                                  on_apply_error=on_apply, on_decode_error=on_decode, mode=mode))
            except RuleError as exc:
                raise self.error(f"{key}.{exc.field}", f"{exc.message} (in match = {match!r})") from None
        return tuple(rules)

    def check_apply_streams(self, source: SourceSettings, target: TargetSettings) -> None:
        """``[target] apply_streams`` above 1 needs a gated stream: the streams stay consistent as of a resolved ts,
        and a restart tells what a stream already applied by commit ts (invariant 16), neither of which an
        ungated stream has."""
        if target.apply_streams > 1:
            self.require_gated("target.apply_streams", source, f"apply_streams = {target.apply_streams}",
                               "the streams stay consistent as of a resolved ts, and a restart tells by commit ts what "
                               "each stream applied", "apply_streams = 1")

    def require_gated(self, key: str, source: SourceSettings, what: str, why: str, instead: str) -> None:
        """Refuse ``what`` (at ``key``) unless the source's protocol and codec options carry resolved ts."""
        from applier.codecs import get_decoder

        if not get_decoder(source.protocol, **source.codec).gated:
            raise self.error(
                key, f'{what} needs a gated changefeed ({why}), and source.protocol = "{source.protocol}" with these '
                "[source.codec] options has no resolved ts. Use open, simple, canal-json with "
                "enable-tidb-extension=true, debezium with gated = true or avro with enable_watermark = true, "
                f"or {instead}")

    def check_route_modes(self, routes: Sequence[Rule], pipeline: PipelineSettings, source: SourceSettings,
                          target: TargetSettings) -> None:
        """A ``[[route]]`` rule's ``mode`` other than "replica" (applier.modes) needs: a gated stream (a version is
        identified by its commit ts, which ungated streams lack or cannot order by), and nothing that sets row
        changes aside: the quarantine (``on_apply_error`` "quarantine"/"skip", ``on_decode_error`` "quarantine",
        and ``applier quarantine retry``) holds and re-applies changes by the target's key and as a replica would,
        which would lose or overwrite versions. Said here, before anything runs."""
        moded = [r for r in routes if r.mode not in (None, "replica")]
        for rule in moded:
            key = f"{rule.name}.mode"
            self.require_gated(key, source, f'"{rule.mode}"', "the mode's columns come from each change's commit ts, "
                               "and changes must apply in commit-ts order", 'mode = "replica"')
            apply_policy = rule.on_apply_error or target.on_apply_error
            if apply_policy != "stop":
                where = f"{rule.name}.on_apply_error" if rule.on_apply_error else "target.on_apply_error"
                raise self.error(
                    key, f'"{rule.mode}" cannot be combined with on_apply_error = "{apply_policy}" ({where}): row '
                    "changes set aside are held and retried by the target's key as a replica would write them, "
                    f'which would lose versions. Set on_apply_error = "stop" in this [[route]] rule')
            decode_policy = rule.on_decode_error or pipeline.on_decode_error
            if "quarantine" in (decode_policy, pipeline.on_decode_error):
                raise self.error(
                    key, f'"{rule.mode}" cannot be combined with on_decode_error = "quarantine" (in this rule or in '
                    "[pipeline]): the changes held behind a quarantined message are kept and retried by the target's "
                    'key as a replica would write them. Use "stop" (or "skip", which holds nothing)')


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str = "<config>",
    env: Mapping[str, str] | None = None,
    base_dir: str | Path | None = None,
) -> Settings:
    """Validate an already-parsed TOML document. ``env`` defaults to ``os.environ``; relative paths
    resolve against ``base_dir`` (default: the working directory)."""
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    parser = _Parser(source, os.environ if env is None else env, base.absolute())
    try:
        return parser.parse(data)
    except ConfigError as exc:
        raise parser.scrub(exc) from None


def load_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate a TOML configuration file."""
    path = Path(path)
    source = str(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError("<file>", "no such file", source=source) from None
    except IsADirectoryError:
        raise ConfigError("<file>", "is a directory, expected a TOML file", source=source) from None
    except PermissionError:
        raise ConfigError("<file>", "permission denied", source=source) from None
    except UnicodeDecodeError:
        raise ConfigError("<file>", "not UTF-8 text", source=source) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("<file>", f"TOML syntax error: {exc}", source=source) from None
    settings = parse_config(data, source=source, env=env, base_dir=path.resolve().parent)
    return dataclasses.replace(settings, source_path=path.resolve())
