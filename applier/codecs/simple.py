"""TiCDC Simple protocol (``protocol=simple``), JSON and Avro encodings: decoder (the test
encoder is :mod:`applier.devtools.encoders.simple`).

One Kafka value is one message; TiCDC sends no key (``None``). Message kinds (``type``):

* ``WATERMARK``: ``commitTs`` is the partition's watermark -> :class:`~applier.events.Resolved`.
* ``BOOTSTRAP``: ``tableSchema`` describes a table at one schema version (``commitTs`` is always 0) ->
  :class:`~applier.events.TableSchema`. TiCDC sends one when it first writes a table, then again every
  ``send-bootstrap-interval-in-sec`` (default 120) seconds or every ``send-bootstrap-in-msg-count`` (default
  10000) row messages of the table, to every partition (``send-bootstrap-to-all-partition``, default true);
  ``send-all-bootstrap-at-start`` sends one for every table when the changefeed starts. A negative interval or
  count disables bootstrap messages (tiflow pkg/config/sink.go, pkg/sink/codec/bootstraper.go).
* DDL (``CREATE ALTER ERASE RENAME TRUNCATE CINDEX DINDEX QUERY``): ``sql``, ``commitTs``, ``tableSchema``
  (the table after the DDL; absent for e.g. DROP DATABASE) and ``preTableSchema`` (before; RENAME, ALTER,
  TRUNCATE, ...) -> :class:`~applier.events.DDL` with ``ddl_type`` = the Simple type string, schema/table
  from ``tableSchema`` (else ``preTableSchema``, else ""). Both schemas also enter the schema cache.
* DML (``INSERT UPDATE DELETE``): ``database``, ``table``, ``commitTs``, ``schemaVersion``, ``data`` (new row)
  and ``old`` (old row) -> :class:`~applier.events.RowChange`. An UPDATE's ``before`` is ``data`` overlaid
  with ``old`` (TiCDC's decoder does the same), so a partial ``old`` still gives a whole old row.

Message layout (tiflow/ticdc ``pkg/sink/codec/simple/message.go``): JSON is Go's ``encoding/json`` output of one
struct (``version, database, table, tableID, type, sql, commitTs, buildTs, schemaVersion, claimCheckLocation,
handleKeyOnly, checksum, data, old, tableSchema, preTableSchema``, empty ones omitted; ``data``/``old`` keys
sorted). A table schema is ``{"schema", "table", "tableID", "version", "columns": [{"name", "dataType":
{"mysqlType", "charset", "collate", "length", "decimal", "elements", "unsigned", "zerofill"}, "nullable",
"default"}], "indexes": [{"name", "unique", "primary", "nullable", "columns"}]}``. Avro
(``encoding_format="avro"``) writes the same content with the schema in ``simple_avro_schema.json``: a byte-for-
byte copy of tiflow ``pkg/sink/codec/simple/message.json`` (identical from v8.0.0 to today, and in pingcap/ticdc)
- a top-level union whose branch 11 is ``Message{type, payload: Watermark|Bootstrap|DDL|DML}``; the table
schema's name field is ``database`` there. The pre-release variant from tiflow's Java example
(``examples/java/src/main/resources/schema.avsc``: branch 9, no ``Message.type``, no Timestamp/UnsignedBigint
records) is recognised by its first byte and decoded too; its schema is derived from the current one by
:func:`legacy_avro_schema`. The v7.6.0 (experimental) layout without a ``Message`` record is rejected.

Values (how TiCDC's encoders write them, and what this decoder returns):

===========================  =========================================  ===================================
column type                  JSON / Avro on the wire                    Python value
===========================  =========================================  ===================================
tinyint..bigint, year        decimal string / long                      int (range-checked for the type)
bigint unsigned              decimal string / UnsignedBigint{value}     int 0..2**64-1 (Avro value is the
                             (two's complement in a long)               uint64 bits in an int64)
bit                          decimal string of the bits / string (ticdc) int
                             or long (tiflow)
enum, set                    ordinal / bitmask as string / long         int (as TiCDC sends them)
float, double                shortest text / float, double              float (FLOAT: float32 precision)
decimal                      string                                     Decimal (scale kept)
date, datetime, time         string                                     date, datetime, timedelta (types.py)
timestamp                    {"location", "value"} / Timestamp record   naive datetime of ``value``
char..longtext, json,        string                                     str
vector
binary, varbinary, *blob     base64 string / bytes                      bytes
===========================  =========================================  ===================================

A column is binary when its ``mysqlType`` contains "binary" or "blob" (TiCDC's own rule) or when it is a
character type with the ``binary`` charset. TIMESTAMP values are the wall-clock time in ``location`` (the
changefeed's time-zone); like TiCDC's own consumer the decoder keeps the wall-clock value and drops the zone,
so writers must use the same session time zone.

Column metadata comes from the cached table schema: ``key`` = the primary index columns, or, without one,
TiCDC's handle index (the unique index whose columns are all NOT NULL with the fewest columns, first in order);
``unique`` = the column is in any unique index; ``nullable``/``unsigned`` from the column; ``binary`` as above.
The schema does not say which columns are generated: TiCDC omits virtual generated columns from ``data``/
``old``, so :attr:`RowChange.columns` lists only the columns present in the message (in schema order) and
``generated`` is always False.

Schema cache and held messages: a DML message is decoded with the table schema of exactly its (database,
table, schemaVersion), as TiCDC's consumer does. A consumer that starts mid-stream has no schema for a table
until a BOOTSTRAP or a DDL carrying it arrives; until then the decoder HOLDS the table's DML messages (the raw
:class:`KafkaMessage`, after validating everything that does not need the schema) in arrival order and returns
nothing for them. The :meth:`SimpleDecoder.decode` call whose message delivers the schema returns the schema's
own event first (TableSchema; for a DDL, the DDL event with the released rows committed before it moved in
front of it) followed by the released rows in arrival order, so commit order per table is kept. The pipeline
asks :meth:`SimpleDecoder.held_offsets` and :meth:`SimpleDecoder.held_min_commit_ts` so it never commits
offsets past, nor applies at or above, anything held. ``max_held_messages_per_table`` bounds the hold; beyond
it decode() raises DecodeError (enable bootstrap messages, or start the changefeed before the table existed).

Decoding in Spark's Python workers (``decodes_with_schemas``; :mod:`applier.decode`): a DML message needs its
table's schema, learnt from an earlier BOOTSTRAP or DDL message that may sit in an earlier micro-batch or in another
partition, and rows wait for it in the driver's hold. A worker sees one slice of one partition of one micro-batch,
so it cannot hold anything. The split that keeps every decision where it is today and moves the per-row work off
the driver:

* The driver's decoder stays the one authority of the schema cache and the holds. Before a micro-batch is mapped
  it hands the workers a :class:`SchemaSnapshot` of its cache (:meth:`SimpleDecoder.schema_snapshot`: the table
  schemas as their Column tuples, pickled and compressed, at most ``SNAPSHOT_MAX_BYTES``, the newest version of
  every table first; rebuilt only when the cache has changed, counted by a version number; in Spark it travels as
  a broadcast variable that is sent again only when that version changes).
* A worker (:meth:`SimpleDecoder.decode_in_worker`) decodes a WATERMARK, and a DML whose (database, table,
  schemaVersion) the snapshot has, into the event the driver would make: parsing, value conversion, claim-check
  and upstream completion and checksum verification all run there. The driver's cache never forgets or replaces
  an entry (the first copy of a version wins), so an entry of the snapshot is still the driver's own when it
  reaches the message, and the event is final. A worker also learns the schemas of the BOOTSTRAP and DDL messages
  of its slice (and of earlier tasks of its process) and decodes later rows with them, but such an event is only
  provisional: the chunk carries the message's bytes and the Column tuple it used, and the driver takes the event
  only if its own cache has that version with equal columns when it reaches the message (equal columns make equal
  converters), else decodes the bytes itself. This matters most at a run's start, when the driver knows nothing
  yet (and the next batch is mapped before the first one is applied).
* Everything else comes back as raw bytes, in place: BOOTSTRAP and DDL messages (rare, and they release held rows
  and reorder them around the DDL), rows whose schema the worker does not know, and any message a worker could not
  decode or whose ts it does not trust. Errors are thus always made by the driver, with today's positions,
  ``held_message`` and protocol hints.
* The driver walks each micro-batch in Kafka order (:func:`applier.decode.decode_chunks`): it decodes the raw
  messages with :meth:`SimpleDecoder.decode` (holding, releasing, erroring exactly as when it decodes alone, under
  its crash guard) and passes each worker event through :meth:`SimpleDecoder.accept`, which adds what a
  ``decode()`` call at that message would have added besides the message's own events (rows decoded before a
  held message failed, held rows left to release). So the events, their order, the empty offsets, the errors and
  ``held_offsets()``/``held_min_commit_ts()`` after every batch are the driver-only decode's
  (tests/unit/test_decode_simple_workers.py checks it on random streams, batch cuts and worker slices).

Why not ship the schema-bearing messages' schemas back as events for the driver to learn (or hold rows in the
workers)? The driver would then have to re-create, from events, the holding, releasing and the DDL's reordering of
released rows that ``decode()`` already does for the raw message, and any difference would change what is applied;
BOOTSTRAP and DDL messages are a tiny share of a stream, so decoding them again in the driver costs nothing
measurable.

Large messages (:mod:`applier.codecs.largemsg`, layouts in docs/large-messages.md): with
``large_message_handle_compression`` ("snappy"/"lz4") every value is decompressed first (JSON and Avro alike). A
claim-check DML (``claimCheckLocation``, sent with ``handleKeyOnly`` true and only the handle-key columns) is
replaced, once its table's schema is known, by the message in the claim-check file (``claim_check_uri``; Go's
JSON ``{"key": null, "value": <base64>}``, or the bare value with ``claim_check_raw_value``), compressed like any
value and in the same encoding, which must be a DML of the same table, schema version, type and commit ts (its
own checksum is verified). A handle-key-only INSERT/UPDATE (``handleKeyOnly`` without a location) is completed from
the upstream TiDB (``upstream_url``) as of the commit ts (an UPDATE's old row, by ``old``'s key, as of commit ts -
1), and is a DecodeError naming that option when it is not set; a handle-key-only DELETE is complete and decodes
as it is.

Rejected with DecodeError: rows whose ``checksum.corrupted`` is true, protocol ``version`` other than 1.

Row checksums (``[integrity] integrity-check-level = "correctness"``): a DML message's ``checksum`` object carries
``current`` (CRC32 of the new row, ``data``) and ``previous`` (of the old row, ``old``); 0 means "none" (INSERT has
no ``previous``, DELETE no ``current``). With ``verify_checksum`` (default true) the decoder recomputes both from
the row as received (:mod:`applier.codecs.checksum`, algorithm in docs/checksum.md) and a mismatch is a
DecodeError naming the table and both checksums: the row changed after TiCDC computed it, so applying it would
write damaged data. The UPDATE's old row is ``old`` completed from ``data`` (as for ``before``), TIMESTAMP values
are converted from their ``location`` to UTC as TiDB does, and a handle-key-only DELETE (only the key columns
arrive) is not verified. Messages without a ``checksum`` decode as before; ``verify_checksum = false`` in
``[source.codec]`` skips the recomputation (the ``corrupted`` flag is still honoured).

Errors: anything malformed (bad JSON/Avro, unknown message/DDL/DML type, a DML column not in the cached schema,
a value that does not convert, ...) raises :class:`applier.events.DecodeError` (protocol "simple") naming the
message's topic/partition/offset; nothing else escapes decode(). When a *held* message turns out to be bad at
the moment its schema arrives, the DecodeError names the held message's position and carries it as
``error.held_message``; everything decoded so far in that call (including the current message's own events) is
kept and returned first by the next decode() call (and counted by held_offsets()/held_min_commit_ts() meanwhile),
so quarantining never loses a good event.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import uuid
import zlib
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from typing import Any, Callable, NamedTuple

import orjson

from applier import mysql_values as T
from applier.codecs import WORKER_CHECK, WORKER_DONE, WORKER_RAW
from applier.codecs import checksum as CK
from applier.codecs.base import Malformed, decode_error
from applier.codecs.largemsg import LargeMessages, UpstreamRow
from applier.events import (
    DDL,
    Column,
    DecodeError,
    KafkaMessage,
    Op,
    Resolved,
    RowChange,
    TableSchema,
)

__all__ = [
    "SchemaSnapshot",
    "SimpleDecoder",
    "avro_schema",
    "legacy_avro_schema",
    "DDL_TYPES",
]

PROTOCOL = "simple"
PROTOCOL_VERSION = 1

MSG_WATERMARK = "WATERMARK"
MSG_BOOTSTRAP = "BOOTSTRAP"
MSG_DDL = "DDL"
MSG_DML = "DML"
DML_TYPES = {"INSERT": Op.INSERT, "UPDATE": Op.UPDATE, "DELETE": Op.DELETE}
#: the DDL message types, in the order of the Avro DDLType enum
DDL_TYPES = ("CREATE", "ALTER", "ERASE", "RENAME", "TRUNCATE", "CINDEX", "DINDEX", "QUERY")
_DDL_TYPE_SET = frozenset(DDL_TYPES)

_NS = "com.pingcap.simple.avro."
AVRO_MESSAGE = _NS + "Message"
AVRO_WATERMARK = _NS + "Watermark"
AVRO_BOOTSTRAP = _NS + "Bootstrap"
AVRO_DDL = _NS + "DDL"
AVRO_DML = _NS + "DML"
AVRO_TABLE_SCHEMA = _NS + "TableSchema"
AVRO_TIMESTAMP = _NS + "Timestamp"
AVRO_UNSIGNED_BIGINT = _NS + "UnsignedBigint"
_PAYLOAD_KIND = {AVRO_WATERMARK: MSG_WATERMARK, AVRO_BOOTSTRAP: MSG_BOOTSTRAP, AVRO_DDL: MSG_DDL, AVRO_DML: MSG_DML}

# First byte of an Avro message = zigzag varint of the top-level union branch holding ``Message``.
_AVRO_CURRENT_TAG = 0x16  # branch 11 (message.json since v8.0.0)
_AVRO_LEGACY_TAG = 0x12  # branch 9 (tiflow examples/java schema.avsc, pre-release)

_U64 = 2**64
_MASK64 = _U64 - 1
_DEFAULT_MAX_HELD = 100_000
# A schema snapshot for the workers carries at most this many bytes (pickled, compressed; a table of 20 columns
# takes about 0.3 KiB): beyond it the oldest versions stay behind, and their rows are decoded in the driver.
SNAPSHOT_MAX_BYTES = 1 << 20
# Schemas a worker process keeps from BOOTSTRAP/DDL messages it decoded (provisional: the driver checks each use).
_MAX_LEARNT = 4096
_RAW = (WORKER_RAW, None, None, None)

_INT_RANGES = {
    "tinyint": ((-(2**7), 2**7 - 1), (0, 2**8 - 1)),
    "smallint": ((-(2**15), 2**15 - 1), (0, 2**16 - 1)),
    "mediumint": ((-(2**23), 2**23 - 1), (0, 2**24 - 1)),
    "int": ((-(2**31), 2**31 - 1), (0, 2**32 - 1)),
    "bigint": ((-(2**63), 2**63 - 1), (0, 2**64 - 1)),
    "year": ((0, 2155), (0, 2155)),
    "bit": ((0, _MASK64), (0, _MASK64)),
    "enum": ((0, _MASK64), (0, _MASK64)),
    "set": ((0, _MASK64), (0, _MASK64)),
}
_CHAR_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})

_INT_RE = re.compile(r"-?[0-9]{1,20}")
_FLOAT_RE = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]{1,3})?")
_DECIMAL_RE = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")


_Bad = Malformed  # a reason for a DecodeError; the position is added by guarded_decode


class _HeldBad(Exception):
    """Internal: a held message failed to decode when its schema arrived."""

    def __init__(self, held: "_Held", reason: str) -> None:
        super().__init__(reason)
        self.held = held
        self.reason = reason


# ---------------------------------------------------------------------------------------------------------
# Avro schema
# ---------------------------------------------------------------------------------------------------------

_SCHEMA_FILE = "simple_avro_schema.json"
_avro_cache: dict[str, Any] = {}


def avro_schema() -> list:
    """The Simple protocol Avro schema (a fresh copy of tiflow's message.json, as JSON data)."""
    return json.loads(resources.files("applier.codecs").joinpath(_SCHEMA_FILE).read_bytes())


def legacy_avro_schema() -> list:
    """The pre-release Avro schema of tiflow's Java example (schema.avsc), derived from the current one:
    no Timestamp/UnsignedBigint records, Watermark/Bootstrap carry a string ``type``, row values are
    ``null|int|long|float|double|string|boolean|bytes`` and Message has only ``payload``."""
    out = []
    for rec in avro_schema():
        name = rec["name"]
        if name in ("Timestamp", "UnsignedBigint"):
            continue
        rec = dict(rec)
        fields = [dict(f) for f in rec["fields"]]
        if name in ("Watermark", "Bootstrap"):
            fields.insert(1, {"name": "type", "type": "string"})
        elif name == "DML":
            for f in fields:
                if f["name"] in ("data", "old"):
                    f["type"] = ["null", {"type": "map", "values": ["null", "int", "long", "float", "double",
                                                                    "string", "boolean", "bytes"],
                                          "default": None}]
        elif name == "Message":
            fields = [f for f in fields if f["name"] != "type"]
        rec["fields"] = fields
        out.append(rec)
    return out


def _parsed_schemas() -> tuple[Any, Any]:
    """(current, legacy) parsed fastavro schemas, built once."""
    hit = _avro_cache.get("parsed")
    if hit is None:
        import fastavro

        hit = (fastavro.parse_schema(avro_schema()), fastavro.parse_schema(legacy_avro_schema()))
        _avro_cache["parsed"] = hit
    return hit


# ---------------------------------------------------------------------------------------------------------
# Table schemas
# ---------------------------------------------------------------------------------------------------------


class _Entry:
    """One table at one schema version: the Columns and a value converter per column."""

    __slots__ = ("schema", "table", "version", "table_id", "columns", "convs", "by_name", "_checksum_columns")

    def __init__(self, schema: str, table: str, version: int, table_id: int, columns: tuple[Column, ...],
                 convs: dict[str, Callable[[Any], Any]]) -> None:
        self.schema = schema
        self.table = table
        self.version = version
        self.table_id = table_id
        self.columns = columns
        self.convs = convs
        self.by_name = {c.name: c for c in columns}
        self._checksum_columns: tuple[CK.ChecksumColumn, ...] | None = None

    @property
    def checksum_columns(self) -> tuple[CK.ChecksumColumn, ...]:
        """Every column of the schema, in schema order, as the row checksum sees it (built on first use)."""
        cc = self._checksum_columns
        if cc is None:
            cc = self._checksum_columns = tuple(CK.ChecksumColumn(c.name, c.type_name) for c in self.columns)
        return cc

    def columns_present(self, a: dict | None, b: dict | None) -> tuple[Column, ...]:
        n = len(self.columns)
        if a is not None and len(a) == n and (b is None or len(b) == n):
            return self.columns  # every column present (the names were checked by the converters)
        return tuple(c for c in self.columns if (a is not None and c.name in a) or (b is not None and c.name in b))


def _entry_from_columns(schema: str, table: str, version: int, table_id: int, columns: tuple[Column, ...]) -> _Entry:
    """An entry rebuilt from its Columns (a worker's, from a :class:`SchemaSnapshot`): a column's converter depends
    only on its ``type_name``, ``unsigned`` and ``binary``, exactly as :func:`_parse_table_schema` builds it."""
    return _Entry(schema, table, version, table_id, columns,
                  {c.name: _converter(c.type_name, c.unsigned, c.binary) for c in columns})


@dataclass(frozen=True)
class SchemaSnapshot:
    """The table schemas a driver's decoder knows, for Spark's Python workers (see the module docstring).

    ``origin`` names the driver decoder (a worker keeps what it built per origin and version), ``version`` counts
    the cache's changes, ``data`` is the compressed pickle of ``(schema, table, version, table_id, columns)``
    tuples. In Spark the bytes travel as a broadcast variable (``shared``, whose value is ``data``; then ``data``
    is None): sent to each executor once per version rather than with every task."""

    origin: str
    version: int
    tables: int  # entries carried
    data: bytes | None
    shared: Any = None

    def payload(self) -> bytes:
        return self.data if self.data is not None else self.shared.value

    def entries(self) -> list[tuple[str, str, int, int, tuple[Column, ...]]]:
        return pickle.loads(zlib.decompress(self.payload()))


def _snapshot_bytes(entries: list[_Entry], limit: int) -> tuple[bytes, int]:
    """The compressed pickle of as many ``entries`` as fit ``limit`` bytes, the newest version of each table first
    (then older versions, newest first), and how many that is."""
    latest: dict[tuple[str, str], int] = {}
    for e in entries:
        k = (e.schema, e.table)
        if e.version > latest.get(k, -1):
            latest[k] = e.version
    order = sorted(entries, key=lambda e: (e.version != latest[(e.schema, e.table)], -e.version,
                                           e.schema, e.table))
    items = [(e.schema, e.table, e.version, e.table_id, e.columns) for e in order]
    n = len(items)
    while True:
        data = zlib.compress(pickle.dumps(items[:n], protocol=5), 1)
        if len(data) <= limit or n == 0:
            return data, n
        n = min(n - 1, max(1, n * limit // len(data)))


def _get(obj: dict, key: str, kinds: tuple[type, ...], what: str, default: Any = ...) -> Any:
    v = obj.get(key, default)
    if v is ...:
        raise _Bad(f"{what} has no '{key}'")
    if v is None and default is None:
        return None
    if type(v) not in kinds:
        raise _Bad(f"{what} '{key}' must be {'/'.join(k.__name__ for k in kinds)} (got {v!r:.60})")
    return v


def _uint(v: Any, what: str, avro: bool) -> int:
    """A uint64 field: JSON gives it as is; Avro carries the uint64 bits in a long."""
    if type(v) is not int:
        raise _Bad(f"{what} must be an integer (got {v!r:.40})")
    if avro:
        return v & _MASK64
    if v < 0 or v > _MASK64:
        raise _Bad(f"{what} {v} is out of range for uint64")
    return v


def _parse_table_schema(raw: Any, avro: bool, what: str) -> _Entry:
    if type(raw) is not dict:
        raise _Bad(f"{what} is a {type(raw).__name__}, expected an object")
    schema = _get(raw, "database" if avro else "schema", (str,), what)
    table = _get(raw, "table", (str,), what)
    table_id = _get(raw, "tableID", (int,), what, 0)
    version = _uint(_get(raw, "version", (int,), what), f"{what} 'version'", avro)
    raw_cols = _get(raw, "columns", (list,), what, None) or []
    raw_idx = _get(raw, "indexes", (list,), what, None) or []

    cols: list[tuple[str, str, bool, bool, bool]] = []  # name, base type, nullable, unsigned, binary
    declared: dict[str, str | None] = {}  # name -> full MySQL type (Column.declared)
    names: set[str] = set()
    for i, rc in enumerate(raw_cols):
        cw = f"{what} column {i}"
        if type(rc) is not dict:
            raise _Bad(f"{cw} is a {type(rc).__name__}, expected an object")
        name = _get(rc, "name", (str,), cw)
        if name in names:
            raise _Bad(f"{what} lists column {name!r} twice")
        names.add(name)
        dt = rc.get("dataType")
        if type(dt) is not dict:
            raise _Bad(f"{what} column {name!r} has no 'dataType' object")
        mysql_type = _get(dt, "mysqlType", (str,), f"{what} column {name!r} dataType")
        charset = dt.get("charset")
        unsigned_flag = dt.get("unsigned")
        if unsigned_flag is not None and type(unsigned_flag) is not bool:
            raise _Bad(f"{what} column {name!r}: 'unsigned' must be a boolean")
        nullable = _get(rc, "nullable", (bool,), f"{what} column {name!r}", True)
        base, unsigned = T.split_mysql_type(mysql_type)
        if base not in T.KNOWN_TYPES:
            raise _Bad(f"{what} column {name!r}: unknown mysqlType {mysql_type!r:.60}")
        unsigned = unsigned or bool(unsigned_flag)
        mt = mysql_type.lower()
        binary = base in T.BINARY_TYPES or "blob" in mt or "binary" in mt or (
            base in _CHAR_TYPES and charset == "binary")
        if binary and base in _CHAR_TYPES:
            base = T.binary_type_name(base, True)
        elif base not in T.BINARY_TYPES:
            binary = False  # enum('binary') and the like: a name mentioning it, not a binary column
        cols.append((name, base, nullable, unsigned, binary))
        declared[name] = _declared(dt, base, unsigned, f"{what} column {name!r}")

    primary: list[str] | None = None
    unique_cols: set[str] = set()
    handle: list[str] | None = None
    not_null = {c[0] for c in cols if not c[2]}
    for i, ri in enumerate(raw_idx):
        iw = f"{what} index {i}"
        if type(ri) is not dict:
            raise _Bad(f"{iw} is a {type(ri).__name__}, expected an object")
        is_unique = _get(ri, "unique", (bool,), iw, False)
        is_primary = _get(ri, "primary", (bool,), iw, False)
        idx_nullable = _get(ri, "nullable", (bool,), iw, False)
        icols = _get(ri, "columns", (list,), iw, None) or []
        if any(type(c) is not str for c in icols):
            raise _Bad(f"{iw}: 'columns' must be a list of column names")
        if is_primary:
            missing = [c for c in icols if c not in names]
            if missing or not icols:
                raise _Bad(f"{what}: primary index names unknown columns {missing or icols!r:.80}")
            primary = list(icols)
        if is_unique or is_primary:
            unique_cols.update(c for c in icols if c in names)
            if (not is_primary and not idx_nullable and icols and all(c in not_null for c in icols)
                    and (handle is None or len(icols) < len(handle))):
                handle = list(icols)
    key_cols = set(primary if primary is not None else (handle or ()))

    columns: list[Column] = []
    convs: dict[str, Callable[[Any], Any]] = {}
    for name, base, nullable, unsigned, binary in cols:
        columns.append(Column(name=name, type_name=base, nullable=nullable, key=name in key_cols,
                              unique=name in unique_cols, unsigned=unsigned, binary=binary, declared=declared[name]))
        convs[name] = _converter(base, unsigned, binary)
    return _Entry(schema, table, version, table_id, tuple(columns), convs)


def _declared(dt: dict, base: str, unsigned: bool, what: str) -> str | None:
    """The full MySQL type from a dataType object: ``length`` is the length of CHAR/VARCHAR/BINARY/VARBINARY/BIT
    and the precision of DECIMAL, ``decimal`` DECIMAL's scale and the fractional seconds of DATETIME/TIMESTAMP/
    TIME, ``elements`` the ENUM/SET members (other types' ``length`` is a display width, not kept)."""
    length, scale, elements = dt.get("length"), dt.get("decimal"), dt.get("elements")
    if length is not None and type(length) is not int:
        raise _Bad(f"{what}: 'length' must be an integer")
    if scale is not None and type(scale) is not int:
        raise _Bad(f"{what}: 'decimal' must be an integer")
    if elements is not None and (type(elements) is not list or any(type(e) is not str for e in elements)):
        raise _Bad(f"{what}: 'elements' must be a list of strings")
    if base not in T.LENGTH_TYPES and base != "decimal":
        length = None
    return T.declared_type(base, length=length, scale=scale, elements=elements or (), unsigned=unsigned)


# ---------------------------------------------------------------------------------------------------------
# Value converters (one per column; accept both the JSON and the Avro wire forms)
# ---------------------------------------------------------------------------------------------------------


def _converter(base: str, unsigned: bool, binary: bool) -> Callable[[Any], Any]:
    if base in _INT_RANGES:
        lo, hi = _INT_RANGES[base][1 if unsigned else 0]
        ubig = base == "bigint" and unsigned
        bits64 = ubig or base in ("bit", "enum", "set")

        def to_int(v: Any) -> int:
            t = type(v)
            if t is str:
                if _INT_RE.fullmatch(v) is None:
                    raise ValueError("not a decimal integer")
                n = int(v)
            elif t is int:
                n = v
                if n < 0 and bits64:  # uint64 bits carried in an Avro long (SET, tiflow's BIT, old layout)
                    n &= _MASK64
            elif t is tuple and ubig and v[0] == AVRO_UNSIGNED_BIGINT:
                n = v[1]["value"]
                if type(n) is not int:
                    raise TypeError("UnsignedBigint value must be a long")
                n &= _MASK64
            else:
                raise TypeError(f"expected an integer, got {_wire_type(v)}")
            if n < lo or n > hi:
                raise ValueError(f"{n} is out of range for {base}{' unsigned' if unsigned else ''}")
            return n

        return to_int
    if base in T.FLOAT_TYPES:
        single = base == "float"

        def to_float(v: Any) -> float:
            t = type(v)
            if t is str:
                if _FLOAT_RE.fullmatch(v) is None:
                    raise ValueError("not a decimal number")
                f = float(v)
            elif t is float or t is int:
                f = float(v)
            else:
                raise TypeError(f"expected a number, got {_wire_type(v)}")
            if f - f != 0.0:
                raise ValueError("not a finite number")
            if single:
                try:
                    return T.shortest_float32(f)
                except OverflowError:
                    raise ValueError("out of range for FLOAT (float32)") from None
            return f

        return to_float
    if base == "decimal":

        def to_decimal(v: Any) -> Decimal:
            if type(v) is not str:
                raise TypeError(f"expected decimal text, got {_wire_type(v)}")
            if len(v) > 200 or _DECIMAL_RE.fullmatch(v) is None:
                raise ValueError("not a decimal number")
            return Decimal(v)

        return to_decimal
    if base == "timestamp":

        def to_timestamp(v: Any) -> Any:
            t = type(v)
            if t is dict:  # JSON: {"location": zone, "value": text}
                v = v["value"]
            elif t is tuple and v[0] == AVRO_TIMESTAMP:
                v = v[1]["value"]
            return T.parse_datetime(v)  # a plain string: pre-release layouts

        return to_timestamp
    if binary or base in T.BINARY_TYPES:

        def to_bytes(v: Any) -> bytes:
            t = type(v)
            if t is bytes:  # Avro
                return v
            if t is str:  # JSON (and TiCDC's decoder does the same for a string in Avro)
                return T.b64decode_strict(v)
            raise TypeError(f"expected base64 text or bytes, got {_wire_type(v)}")

        return to_bytes
    if base == "null":

        def to_null(v: Any) -> None:
            raise TypeError(f"a NULL-typed column holds {_wire_type(v)}")

        return to_null
    if base == "geometry":

        def to_geometry(v: Any) -> None:
            raise ValueError("GEOMETRY is not supported (TiCDC does not replicate it)")

        return to_geometry
    return T.text_converter(base)  # date, datetime, time (strict parsers) and the text types (str only)


def _wire_type(v: Any) -> str:
    if type(v) is tuple and v and isinstance(v[0], str):
        return v[0].rsplit(".", 1)[-1]
    return type(v).__name__


# ---------------------------------------------------------------------------------------------------------
# Row checksums (see the module docstring and applier.codecs.checksum)
# ---------------------------------------------------------------------------------------------------------


class _Checksum(NamedTuple):
    """A DML message's checksum object; 0 means "no checksum for that image"."""

    version: int
    current: int
    previous: int


_TEMPORAL_TEXT = frozenset({"date", "datetime", "time"})


def _checksum_fields(raw: Any, avro: bool, verify: bool) -> _Checksum | None:
    """The checksum object of a DML message -> what to verify (None: nothing). ``corrupted`` is refused
    whether or not checksums are verified (TiCDC itself found the row damaged)."""
    if raw is None:
        return None
    if type(raw) is not dict:
        raise _Bad("'checksum' must be an object")
    if raw.get("corrupted") is True:
        raise _Bad("TiCDC flagged this row as corrupted (checksum.corrupted=true)")
    if not verify:
        return None
    version = raw.get("version", 0)
    if type(version) is not int:
        raise _Bad(f"'checksum' 'version' must be an integer (got {version!r:.40})")
    current, previous = (_checksum_value(raw.get(k, 0), k) for k in ("current", "previous"))
    if not current and not previous:
        return None
    return _Checksum(version, current, previous)


def _checksum_value(v: Any, key: str) -> int:
    """A CRC32 from the message: JSON carries the uint32, Avro the same number in a long."""
    if type(v) is not int or not 0 <= v <= CK.MASK32:
        raise _Bad(f"'checksum' '{key}' must be a CRC32 (an integer 0..{CK.MASK32}), got {v!r:.40}")
    return v


def _timestamp_text_utc(v: Any) -> str:
    """A TIMESTAMP as sent ({"location", "value"}, the Avro Timestamp record, or a bare string in the pre-release
    layout, taken as UTC) -> its UTC text, which is what TiDB hashes."""
    t = type(v)
    if t is dict:
        return CK.timestamp_in_utc(v["value"], CK.resolve_zone(v["location"]))
    if t is tuple and v[0] == AVRO_TIMESTAMP:
        return CK.timestamp_in_utc(v[1]["value"], CK.resolve_zone(v[1]["location"]))
    return v


def _checksum_row(entry: _Entry, raw: dict, decoded: dict) -> dict:
    """The row the checksum is computed over: the decoded values, except temporal columns, which keep TiDB's
    own text from the message (it carries the column's fractional digits, which the Python values lose)."""
    row = dict(decoded)
    for c in entry.columns:
        t = c.type_name
        if t in _TEMPORAL_TEXT:
            v = raw.get(c.name)
            if type(v) is str:
                row[c.name] = v
        elif t == "timestamp":
            v = raw.get(c.name)
            if v is not None:
                row[c.name] = _timestamp_text_utc(v)
    return row


def _verify(entry: _Entry, cs: _Checksum, expected: int, image: str, raw: dict, decoded: dict) -> None:
    """Recompute one image's checksum; a mismatch (or a value that cannot be hashed) is a DecodeError."""
    table = f"`{entry.schema}`.`{entry.table}`"
    try:
        got = CK.verify_row(entry.checksum_columns, _checksum_row(entry, raw, decoded), expected)
    except (CK.ChecksumError, KeyError, TypeError) as e:
        raise _Bad(
            f"cannot verify the row checksum of {table} ({image}): {e}; set verify_checksum = false in "
            "[source.codec] to apply such rows unverified"
        ) from None
    if got is not None:
        raise _Bad(
            f"row checksum mismatch for {table} ({image}): TiCDC sent {expected}, the row as received gives {got} "
            f"(checksum version {cs.version}). The row changed after TiCDC computed its checksum, so it is not "
            "applied: compare it with the upstream row and find where it was altered (Kafka, a proxy, a "
            "re-encoding step). Only if the table's columns were reordered by DDL (ADD COLUMN ... FIRST/AFTER, "
            "MODIFY COLUMN) and TiCDC hashes them in column-id order may this be a false alarm: then set "
            "verify_checksum = false in [source.codec]"
        )


# ---------------------------------------------------------------------------------------------------------
# Decoder
# ---------------------------------------------------------------------------------------------------------


class _Held(NamedTuple):
    msg: KafkaMessage
    commit_ts: int
    version: int


class _Dml(NamedTuple):
    """A DML message's fields (see SimpleDecoder._dml_fields)."""

    schema: str
    table: str
    version: int
    op: Op
    data: dict | None
    old: dict | None
    cs: "_Checksum | None"
    loc: str | None  # claimCheckLocation
    hko: bool  # handleKeyOnly


def _upstream_values(row: UpstreamRow) -> dict:
    """An upstream row in the wire form the Simple converters read: MySQL's text, bytes for binary columns (what
    the Avro encoding carries; the JSON one would base64 them)."""
    return dict(row.values)


class _Msg(NamedTuple):
    """A parsed message, normalised across JSON and Avro."""

    kind: str  # WATERMARK / BOOTSTRAP / DDL / DML
    type: str  # WATERMARK / BOOTSTRAP / a DDL type / a DML type
    commit_ts: int
    body: dict
    avro: bool


class SimpleDecoder:
    """Decoder for TiCDC's Simple protocol. Gated: the protocol carries watermarks.

    Options (``[source.codec]``): ``encoding_format`` ("json" or "avro", the changefeed's
    ``encoding-format``), ``max_held_messages_per_table`` (see the module docstring) and ``verify_checksum``
    (default true: recompute the row checksums TiCDC sends with ``integrity-check-level = "correctness"`` and
    refuse a row whose checksum does not match; false skips the recomputation).
    """

    name = PROTOCOL
    gated = True

    def __init__(self, *, encoding_format: str = "json", max_held_messages_per_table: int = _DEFAULT_MAX_HELD,
                 verify_checksum: bool = True, large_message_handle_compression: str = "none",
                 claim_check_uri: str = "", claim_check_location_prefix: str = "",
                 claim_check_raw_value: bool = False, upstream_url: str = "", upstream_time_zone: str = "+00:00",
                 upstream_read_current_state: bool = False) -> None:
        self._large = LargeMessages(
            PROTOCOL, compression=large_message_handle_compression, claim_check_uri=claim_check_uri,
            claim_check_location_prefix=claim_check_location_prefix, claim_check_raw_value=claim_check_raw_value,
            upstream_url=upstream_url, upstream_time_zone=upstream_time_zone,
            upstream_read_current_state=upstream_read_current_state)
        self._compressed = self._large.compressed
        if encoding_format not in ("json", "avro"):
            raise ValueError(f"encoding_format must be 'json' or 'avro', got {encoding_format!r}")
        if isinstance(max_held_messages_per_table, bool) or not isinstance(max_held_messages_per_table, int) \
                or max_held_messages_per_table < 1:
            raise ValueError("max_held_messages_per_table must be a positive integer")
        if not isinstance(verify_checksum, bool):
            raise ValueError(f"verify_checksum must be true or false, got {verify_checksum!r}")
        self.encoding_format = encoding_format
        self.max_held_messages_per_table = max_held_messages_per_table
        self.verify_checksum = verify_checksum
        if encoding_format == "avro":
            self._schemas_avro = _parsed_schemas()
        self._cache: dict[tuple[str, str, int], _Entry] = {}
        self._held: dict[tuple[str, str], list[_Held]] = {}
        self._pending: set[tuple[str, str]] = set()  # tables with held messages whose schema is known
        self._ready: list = []  # events decoded by a call that then raised for a held message
        self._hold_summary: tuple[dict[tuple[str, int], int], int | None] | None = ({}, None)
        self._schema_version = 0  # counts the entries put into _cache (schema_snapshot)
        self.origin = uuid.uuid4().hex  # names this decoder in its snapshots (a worker keeps entries per origin)
        self._snapshot: SchemaSnapshot | None = None
        # worker side (decode_in_worker): the snapshot _cache was seeded from, and schemas learnt here
        self._seeded: tuple[str, int] | None = None
        self._learnt: dict[tuple[str, str, int], _Entry] = {}

    # -- the Decoder protocol -------------------------------------------------------------------------------

    def table_of(self, msg: KafkaMessage) -> tuple[str, str] | None:
        """The table of an undecodable row message (JSON encoding): its ``database`` and ``table`` fields, when
        the JSON parses. DDL and BOOTSTRAP messages block nothing (their table's rows wait for a schema anyway)."""
        if self.encoding_format != "json" or not msg.value:
            return None
        value = self._large.decompress(msg.value, "value") if self._large.compressed else msg.value
        doc = orjson.loads(value)
        if type(doc) is not dict or doc.get("type") not in ("INSERT", "UPDATE", "DELETE"):
            return None
        schema, table = doc.get("database"), doc.get("table")
        return (schema, table) if isinstance(schema, str) and isinstance(table, str) else None

    def decode(self, msg: KafkaMessage) -> list:
        """The events of one Kafka record (plus any held rows it releases). Raises only DecodeError."""
        return self._call(msg.position, msg, None)

    def _call(self, where: Any, msg: KafkaMessage | None, decoded: list | None) -> list:
        """One decode() call at the message at ``where``: the message's own events are decoded from ``msg``, or,
        for a message a Spark worker decoded, are ``decoded`` (see :meth:`accept`)."""
        out = self._ready
        self._ready = []
        if out:
            self._hold_summary = None
        try:
            if decoded is None:
                self._decode(msg, out)  # type: ignore[arg-type]
            else:
                out.extend(decoded)
            if self._pending:  # held rows left behind when a held message failed in an earlier call
                pending, self._pending = self._pending, set()
                for key in sorted(pending):
                    self._release(key, out)
            return out
        except _HeldBad as e:
            self._ready = out
            self._hold_summary = None
            h = e.held
            err = DecodeError(
                h.msg.position,
                f"held row message (waiting for the schema of its table) cannot be decoded now that the "
                f"schema arrived (in the message at {where}): {e.reason}",
                protocol=PROTOCOL,
            )
            err.held_message = h.msg
            raise err from None
        except DecodeError:
            self._ready = out
            self._hold_summary = None
            raise
        except _Bad as e:
            self._ready = out
            self._hold_summary = None
            raise decode_error(where, e, PROTOCOL) from None
        except Exception as e:  # noqa: BLE001 - the contract is: nothing but DecodeError escapes
            self._ready = out
            self._hold_summary = None
            raise DecodeError(where, f"unexpected {type(e).__name__} while decoding: {e}",
                              protocol=PROTOCOL) from e

    # -- decoding in Spark's Python workers (module docstring; applier.decode) -------------------------------

    decodes_with_schemas = True  # workers decode given the driver's schema snapshot (applier.codecs)

    def idle(self) -> bool:
        """Driver side: whether a decode() call now would add nothing besides its message's own events (no rows
        left from a call that raised, no held rows left to release), so a worker's events pass as they are."""
        return not self._ready and not self._pending

    def accept(self, where: Any, events: list) -> list:
        """Driver side: what decode() of the message at ``where`` returns, given ``events``, the message's own
        events as a worker decoded them with a schema this decoder has (:meth:`confirms`). Raises DecodeError as
        decode() would (a held row that fails when released here)."""
        if not self._ready and not self._pending:
            return events
        return self._call(where, None, events)

    def confirms(self, key: tuple[str, str, int], columns: tuple[Column, ...]) -> bool:
        """Driver side: whether this decoder has the schema ``key`` with exactly ``columns`` now, so that a row a
        worker decoded with a schema it learnt itself is the row this decoder would decode."""
        entry = self._cache.get(key)
        return entry is not None and (entry.columns is columns or entry.columns == columns)

    def schema_snapshot(self, limit: int | None = None) -> SchemaSnapshot:
        """Driver side: the table schemas this decoder knows, for the workers (at most ``limit`` bytes, default
        ``SNAPSHOT_MAX_BYTES``). Rebuilt only when the cache changed since the last call. Safe to call from another
        thread while this one decodes: copying the cache's values is one step under the GIL, and an entry, once in
        the cache, never changes, so the copy holds the driver's entries whatever the version number says."""
        version = self._schema_version
        snap = self._snapshot
        if snap is not None and snap.version == version and limit is None:
            return snap
        for _ in range(10):
            try:
                entries = list(self._cache.values())
                break
            except RuntimeError:  # pragma: no cover - the dict changed size while copied (free-threaded builds)
                continue
        else:  # pragma: no cover
            entries = []
        data, n = _snapshot_bytes(entries, SNAPSHOT_MAX_BYTES if limit is None else limit)
        snap = SchemaSnapshot(self.origin, version, n, data)
        if limit is None:
            self._snapshot = snap
        return snap

    def seed(self, snapshot: SchemaSnapshot | None) -> None:
        """Worker side: decode with ``snapshot``'s schemas as final ones (None: with none). Entries this process
        had (earlier snapshots, schemas learnt from its own BOOTSTRAP/DDL messages) stay usable as provisional
        ones. Rebuilds nothing when the snapshot is the one it has."""
        seeded = None if snapshot is None else (snapshot.origin, snapshot.version)
        if seeded == self._seeded and (seeded is not None or not self._cache):
            return
        old = self._cache
        cache: dict[tuple[str, str, int], _Entry] = {}
        for schema, table, version, table_id, columns in (snapshot.entries() if snapshot is not None else ()):
            key = (schema, table, version)
            have = old.get(key) or self._learnt.get(key)
            cache[key] = have if have is not None and have.columns == columns else _entry_from_columns(
                schema, table, version, table_id, columns)
        learnt = self._learnt
        for key, e in old.items():
            if key not in cache:
                learnt.setdefault(key, e)
        for key in cache:
            learnt.pop(key, None)
        if len(learnt) > _MAX_LEARNT:
            learnt.clear()
        self._cache = cache
        self._seeded = seeded

    @property
    def seeded_origin(self) -> str:
        """Worker side: the origin of the snapshot this decoder was seeded with ("" for none)."""
        return self._seeded[0] if self._seeded is not None else ""

    def decode_in_worker(self, msg: KafkaMessage) -> tuple[int, Any, Any, Any]:
        """Worker side: ``(WORKER_DONE, event, None, None)`` for a WATERMARK, or a DML decoded with a schema of the
        snapshot; ``(WORKER_CHECK, event, key, columns)`` for a DML decoded with a schema this worker learnt itself
        (the driver checks it has the same); ``(WORKER_RAW, None, None, None)`` for anything the driver must decode
        itself (BOOTSTRAP and DDL, whose schemas this worker learns on the way; a row of a schema it does not know;
        anything it cannot decode). Never raises for the message's content."""
        try:
            m = self._parse(msg)
            kind = m.kind
            if kind == MSG_DML:
                d = self._dml_fields(m)
                key = (d.schema, d.table, d.version)
                entry = self._cache.get(key)
                verdict = WORKER_DONE
                if entry is None:
                    entry = self._learnt.get(key)
                    if entry is None:
                        return _RAW
                    verdict = WORKER_CHECK
                d = self._complete(m, d, entry)
                ev = self._row(entry, m.commit_ts, d.op, d.data, d.old, msg, d.cs)
                ev.size = len(msg.value or b"") + len(msg.key or b"")
                if verdict == WORKER_DONE:
                    return WORKER_DONE, ev, None, None
                return WORKER_CHECK, ev, key, entry.columns
            if kind == MSG_WATERMARK:
                return WORKER_DONE, Resolved(ts=m.commit_ts, position=msg.position), None, None
            if kind == MSG_BOOTSTRAP:
                raw = m.body.get("tableSchema")
                if raw is not None:
                    entry = _parse_table_schema(raw, m.avro, "'tableSchema'")
                    if entry.table:
                        self._learn_in_worker(entry)
            elif kind == MSG_DDL and type(m.body.get("sql")) is str:  # the checks _ddl makes before it learns
                after = before = None
                raw = m.body.get("tableSchema")
                if raw is not None:
                    after = _parse_table_schema(raw, m.avro, "'tableSchema'")
                raw = m.body.get("preTableSchema")
                if raw is not None:
                    before = _parse_table_schema(raw, m.avro, "'preTableSchema'")
                for e in (after, before):
                    if e is not None:
                        self._learn_in_worker(e)
        except Exception:  # noqa: BLE001 - the driver decodes it again and reports what is wrong
            pass
        return _RAW

    def _learn_in_worker(self, entry: _Entry) -> None:
        if not entry.schema or not entry.table:
            return
        key = (entry.schema, entry.table, entry.version)
        if key in self._cache or key in self._learnt:
            return
        if len(self._learnt) >= _MAX_LEARNT:
            self._learnt.clear()
        self._learnt[key] = entry

    def held_offsets(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition): the lowest offset of any message the decoder holds (held rows waiting for
        their table's schema, and events decoded but not yet returned)."""
        return dict(self._summary()[0])

    def held_min_commit_ts(self) -> int | None:
        """The smallest commit ts among held rows (and not yet returned events); None when nothing is held."""
        return self._summary()[1]

    def held_count(self) -> int:
        """How many row messages are held waiting for a table schema."""
        return sum(len(v) for v in self._held.values())

    # -- internals ------------------------------------------------------------------------------------------

    def _summary(self) -> tuple[dict[tuple[str, int], int], int | None]:
        s = self._hold_summary
        if s is not None:
            return s
        offsets: dict[tuple[str, int], int] = {}
        min_ts: int | None = None
        for lst in self._held.values():
            for h in lst:
                tp = (h.msg.topic, h.msg.partition)
                if h.msg.offset < offsets.get(tp, h.msg.offset + 1):
                    offsets[tp] = h.msg.offset
                if min_ts is None or h.commit_ts < min_ts:
                    min_ts = h.commit_ts
        for ev in self._ready:
            p = ev.position
            if p is not None:
                tp = (p.topic, p.partition)
                if p.offset < offsets.get(tp, p.offset + 1):
                    offsets[tp] = p.offset
            if isinstance(ev, (RowChange, DDL)) and (min_ts is None or ev.commit_ts < min_ts):
                min_ts = ev.commit_ts
        s = (offsets, min_ts)
        self._hold_summary = s
        return s

    def _parse(self, msg: KafkaMessage) -> _Msg:
        value = msg.value
        if value is None or len(value) == 0:
            raise _Bad("empty value (a tombstone?); every simple protocol message has a value")
        if self._compressed:
            value = self._large.decompress(value, "value")
        return self._parse_value(value)

    def _parse_value(self, value: bytes) -> _Msg:
        if self.encoding_format == "json":
            return self._parse_json(value)
        return self._parse_avro(value)

    def _parse_json(self, value: bytes) -> _Msg:
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            first = value[:1]
            hint = ""
            if first in (b"\x16", b"\x12"):
                hint = " (it looks like Avro: set encoding_format='avro')"
            elif first != b"{" and not self._large.compressed:
                hint = (" (compressed? set large_message_handle_compression to the changefeed's "
                        "large-message-handle-compression)")
            raise _Bad(f"value is not valid JSON{hint}: {e}") from None
        if type(obj) is not dict:
            raise _Bad(f"value is a JSON {type(obj).__name__}, expected an object")
        version = obj.get("version")
        if version != PROTOCOL_VERSION or type(version) is not int:
            raise _Bad(f"unsupported simple protocol version {version!r:.40} (expected {PROTOCOL_VERSION})")
        mtype = obj.get("type")
        if type(mtype) is not str:
            raise _Bad(f"'type' must be a string (got {mtype!r:.40})")
        if mtype == MSG_WATERMARK or mtype == MSG_BOOTSTRAP:
            kind = mtype
        elif mtype in DML_TYPES:
            kind = MSG_DML
        elif mtype in _DDL_TYPE_SET:
            kind = MSG_DDL
        else:
            raise _Bad(f"unknown message type {mtype!r:.40}")
        ts = obj.get("commitTs", 0)
        commit_ts = _uint(ts, "'commitTs'", False)
        return _Msg(kind, mtype, commit_ts, obj, False)

    def _parse_avro(self, value: bytes) -> _Msg:
        import fastavro

        current, legacy = self._schemas_avro
        tag = value[0]
        if tag == _AVRO_CURRENT_TAG:
            schema = current
        elif tag == _AVRO_LEGACY_TAG:
            schema = legacy
        else:
            hint = " (it looks like JSON: set encoding_format='json')" if tag == 0x7B else ""
            raise _Bad(f"not a simple protocol Avro message: first byte 0x{tag:02x} is not the Message "
                       f"branch of the schema union (0x16){hint}")
        bio = io.BytesIO(value)
        try:
            native = fastavro.schemaless_reader(bio, schema, None, return_record_name=True,
                                                return_record_name_override=True)
        except Exception as e:  # noqa: BLE001 - fastavro raises many kinds for bad bytes
            raise _Bad(f"invalid Avro data: {type(e).__name__}: {e}") from None
        if bio.tell() != len(value):
            raise _Bad(f"invalid Avro data: {len(value) - bio.tell()} trailing bytes after the message")
        if type(native) is not tuple or native[0] != AVRO_MESSAGE:
            raise _Bad("Avro value is not a com.pingcap.simple.avro.Message")
        m = native[1]
        payload = m["payload"]
        pname, body = payload
        kind = _PAYLOAD_KIND.get(pname)
        if kind is None:  # pragma: no cover - the schema allows no other branch
            raise _Bad(f"unknown Avro payload {pname!r}")
        mtype_field = m.get("type")
        if mtype_field is not None and mtype_field != kind:
            raise _Bad(f"Message type {mtype_field!r} does not match its payload {pname.rsplit('.', 1)[-1]}")
        version = body.get("version")
        if version != PROTOCOL_VERSION:
            raise _Bad(f"unsupported simple protocol version {version!r:.40} (expected {PROTOCOL_VERSION})")
        if kind == MSG_DDL or kind == MSG_DML:
            mtype = body["type"]
        else:
            mtype = kind
        commit_ts = _uint(body.get("commitTs", 0), "'commitTs'", True)
        return _Msg(kind, mtype, commit_ts, body, True)

    def _decode(self, msg: KafkaMessage, out: list) -> None:
        m = self._parse(msg)
        pos = msg.position
        if m.kind == MSG_WATERMARK:
            out.append(Resolved(ts=m.commit_ts, position=pos))
            return
        if m.kind == MSG_BOOTSTRAP:
            raw = m.body.get("tableSchema")
            if raw is None:
                raise _Bad("BOOTSTRAP message has no 'tableSchema'")
            entry = self._learn(_parse_table_schema(raw, m.avro, "'tableSchema'"))
            if not entry.table:
                raise _Bad("BOOTSTRAP 'tableSchema' names no table")
            out.append(TableSchema(schema=entry.schema, table=entry.table, version=entry.version,
                                   columns=entry.columns, position=pos))
            self._release((entry.schema, entry.table), out)
            return
        if m.kind == MSG_DDL:
            self._ddl(m, msg, out)
            return
        self._dml_or_hold(m, msg, out)

    def _learn(self, entry: _Entry) -> _Entry:
        """Put a table schema into the cache (the first copy of a (schema, table, version) wins)."""
        if not entry.schema or not entry.table:
            return entry
        key = (entry.schema, entry.table, entry.version)
        have = self._cache.get(key)
        if have is not None:
            return have
        self._cache[key] = entry
        self._schema_version += 1
        return entry

    def _ddl(self, m: _Msg, msg: KafkaMessage, out: list) -> None:
        body = m.body
        what = f"{m.type} DDL message"
        query = body.get("sql")
        if type(query) is not str:
            raise _Bad(f"{what} has no 'sql' string")
        after = before = None
        raw = body.get("tableSchema")
        if raw is not None:
            after = _parse_table_schema(raw, m.avro, "'tableSchema'")
        raw = body.get("preTableSchema")
        if raw is not None:
            before = _parse_table_schema(raw, m.avro, "'preTableSchema'")
        named = after if after is not None else before
        ev = DDL(schema=named.schema if named else "", table=named.table if named else "", commit_ts=m.commit_ts,
                 query=query, position=msg.position, ddl_type=m.type, size=len(msg.value or b""))
        start = len(out)
        out.append(ev)
        for e in (after, before):
            if e is not None:
                self._learn(e)
        for e in (after, before):
            if e is not None and e.table:
                self._release((e.schema, e.table), out)
        # released rows committed before the DDL go in front of it (they were written under the old schema)
        released = out[start + 1:]
        if released and any(r.commit_ts < ev.commit_ts for r in released):
            out[start:] = [r for r in released if r.commit_ts < ev.commit_ts] + [ev] + [
                r for r in released if r.commit_ts >= ev.commit_ts]

    def _dml_fields(self, m: _Msg) -> _Dml:
        body = m.body
        op = DML_TYPES.get(m.type)
        if op is None:  # pragma: no cover - _parse only lets DML types through
            raise _Bad(f"unknown DML type {m.type!r:.40}")
        schema = body.get("database")
        table = body.get("table")
        if type(schema) is not str or type(table) is not str or not schema or not table:
            raise _Bad(f"{m.type} message needs non-empty 'database' and 'table' strings")
        version = _uint(body.get("schemaVersion", 0), "'schemaVersion'", m.avro)
        loc = body.get("claimCheckLocation")
        if loc is not None and type(loc) is not str:
            raise _Bad(f"'claimCheckLocation' must be a string (got {loc!r:.40})")
        hko = body.get("handleKeyOnly")
        if hko is not None and type(hko) is not bool:
            raise _Bad("'handleKeyOnly' must be a boolean")
        cs = _checksum_fields(body.get("checksum"), m.avro, self.verify_checksum)
        if hko:
            cs = None  # only the key columns arrive: the checksum covers the whole row and cannot be verified
        data = body.get("data")
        old = body.get("old")
        if data is not None and type(data) is not dict:
            raise _Bad(f"'data' is a {type(data).__name__}, expected an object of columns")
        if old is not None and type(old) is not dict:
            raise _Bad(f"'old' is a {type(old).__name__}, expected an object of columns")
        if op is Op.INSERT and not data:
            raise _Bad("INSERT message has no 'data'")
        if op is Op.DELETE and not old:
            raise _Bad("DELETE message has no 'old'")
        if op is Op.UPDATE and not data:
            raise _Bad("UPDATE message has no 'data'")
        return _Dml(schema, table, version, op, data, old, cs, loc or None, bool(hko))

    def _complete(self, m: _Msg, d: _Dml, entry: _Entry) -> _Dml:
        """A DML with its whole rows: a claim-check message's from its file, a handle-key-only INSERT/UPDATE's from
        the upstream (a handle-key-only DELETE is complete as it is)."""
        if d.loc:
            return self._claim_checked(m, d)
        if d.hko and d.op is not Op.DELETE:
            return self._from_upstream(m, d, entry)
        return d

    def _claim_checked(self, m: _Msg, d: _Dml) -> _Dml:
        name = f"`{d.schema}`.`{d.table}`"
        _, data = self._large.read_claim_check(d.loc, name)
        where = f"claim-check file {d.loc!r:.200} (for a row of {name})"
        try:
            if self._large.compressed:
                data = self._large.decompress(data, "its value")
            full = self._parse_value(data)
        except _Bad as e:
            raise _Bad(f"{where}: {e}") from None
        if full.kind != MSG_DML or full.type != m.type or full.commit_ts != m.commit_ts:
            raise _Bad(f"{where} holds a {full.type} at commit ts {full.commit_ts}, not the {m.type} at commit ts "
                       f"{m.commit_ts} the message names")
        fd = self._dml_fields(full)
        if (fd.schema, fd.table, fd.version) != (d.schema, d.table, d.version):
            raise _Bad(f"{where} holds a row of `{fd.schema}`.`{fd.table}` (schemaVersion {fd.version}), not of "
                       f"{name} (schemaVersion {d.version})")
        if fd.loc or fd.hko:
            raise _Bad(f"{where} holds another large-message reference, not the full row")
        return fd

    def _from_upstream(self, m: _Msg, d: _Dml, entry: _Entry) -> _Dml:
        name = f"`{d.schema}`.`{d.table}`"
        up = self._large.need_upstream(name, f"{d.op.name} (handleKeyOnly=true)")
        key_new = self._convert(d.data or {}, entry.convs, "data", entry)
        data = _upstream_values(up.fetch(d.schema, d.table, m.commit_ts, key_new, "the new row"))
        old = None
        if d.op is Op.UPDATE:
            key_old = self._convert(d.old, entry.convs, "old", entry) if d.old else key_new
            old = _upstream_values(up.fetch(d.schema, d.table, m.commit_ts - 1, key_old, "the old row"))
        return d._replace(data=data, old=old, cs=None, hko=False)

    def _dml_or_hold(self, m: _Msg, msg: KafkaMessage, out: list) -> None:
        d = self._dml_fields(m)
        schema, table, version = d.schema, d.table, d.version
        entry = self._cache.get((schema, table, version))
        if entry is not None:
            d = self._complete(m, d, entry)
            out.append(self._row(entry, m.commit_ts, d.op, d.data, d.old, msg, d.cs))
            return
        key = (schema, table)
        lst = self._held.get(key)
        if lst is None:
            lst = self._held[key] = []
        if len(lst) >= self.max_held_messages_per_table:
            first = lst[0].msg.position
            raise _Bad(
                f"no table schema for `{schema}`.`{table}` (schemaVersion {version}) after holding "
                f"{len(lst)} of its row messages (max_held_messages_per_table={self.max_held_messages_per_table}); "
                f"the first held message is at {first}. The consumer started mid-stream and no BOOTSTRAP or DDL "
                "message for this table arrived: make sure the changefeed sends bootstrap messages "
                "(send-bootstrap-interval-in-sec / send-bootstrap-in-msg-count > 0, "
                "send-bootstrap-to-all-partition=true), or start the changefeed from before the table was "
                "created, or raise max_held_messages_per_table"
            )
        lst.append(_Held(msg, m.commit_ts, version))
        self._hold_summary = None

    def _release(self, key: tuple[str, str], out: list) -> None:
        """Decode, in arrival order, the held messages of a table whose schema version is now cached."""
        lst = self._held.get(key)
        if not lst:
            return
        cache = self._cache
        keep: list[_Held] = []
        for i, h in enumerate(lst):
            entry = cache.get((key[0], key[1], h.version))
            if entry is None:
                keep.append(h)
                continue
            try:
                m = self._parse(h.msg)
                d = self._complete(m, self._dml_fields(m), entry)
                ev = self._row(entry, m.commit_ts, d.op, d.data, d.old, h.msg, d.cs)
            except _Bad as e:
                # drop the bad one (it is reported); the rest waits for the next decode() call
                keep.extend(lst[i + 1:])
                self._set_held(key, keep)
                if any(cache.get((key[0], key[1], k.version)) is not None for k in keep):
                    self._pending.add(key)
                raise _HeldBad(h, str(e)) from None
            out.append(ev)
        self._set_held(key, keep)

    def _set_held(self, key: tuple[str, str], keep: list[_Held]) -> None:
        if keep:
            self._held[key] = keep
        else:
            self._held.pop(key, None)
        self._hold_summary = None

    def _row(self, entry: _Entry, commit_ts: int, op: Op, data: dict | None, old: dict | None,
             msg: KafkaMessage, cs: _Checksum | None = None) -> RowChange:
        convs = entry.convs
        pos = msg.position
        size = len(msg.value or b"")
        if op is Op.INSERT:
            after = self._convert(data, convs, "data", entry)
            if cs is not None and cs.current:
                _verify(entry, cs, cs.current, "the new row ('data')", data, after)
            return RowChange(schema=entry.schema, table=entry.table, commit_ts=commit_ts, op=op, before=None,
                             after=after, columns=entry.columns_present(data, None), position=pos, size=size)
        if op is Op.DELETE:
            before = self._convert(old, convs, "old", entry)
            if cs is not None and cs.previous:
                _verify(entry, cs, cs.previous, "the old row ('old')", old, before)
            return RowChange(schema=entry.schema, table=entry.table, commit_ts=commit_ts, op=op, before=before,
                             after=None, columns=entry.columns_present(old, None), position=pos, size=size)
        after = self._convert(data, convs, "data", entry)
        before = dict(after)
        if old:  # TiCDC fills columns missing from 'old' (or an omitted empty 'old') from 'data'
            before.update(self._convert(old, convs, "old", entry))
        if cs is not None:
            if cs.current:
                _verify(entry, cs, cs.current, "the new row ('data')", data, after)
            if cs.previous:
                _verify(entry, cs, cs.previous, "the old row ('old')", {**data, **old} if old else data, before)
        return RowChange(schema=entry.schema, table=entry.table, commit_ts=commit_ts, op=op, before=before,
                         after=after, columns=entry.columns_present(data, old), position=pos, size=size)

    @staticmethod
    def _convert(row: dict, convs: dict, which: str, entry: _Entry) -> dict:
        try:
            out = {}
            for name, v in row.items():
                conv = convs[name]  # also for NULLs: every column must be in the schema
                out[name] = None if v is None else conv(v)
            return out
        except Exception:  # noqa: BLE001 - find the culprit on the slow path
            pass
        for name, v in row.items():
            conv = convs.get(name)
            if conv is None:
                raise _Bad(f"'{which}' column {name!r} is not in the schema of `{entry.schema}`.`{entry.table}` "
                           f"(schemaVersion {entry.version})")
            if v is None:
                continue
            try:
                conv(v)
            except Exception as e:  # noqa: BLE001
                col = entry.by_name[name]
                raise _Bad(f"'{which}' column {name!r} ({col.type_name}{' unsigned' if col.unsigned else ''}): "
                           f"cannot decode {v!r:.80}: {e}") from None
        raise _Bad(f"'{which}' cannot be decoded")  # pragma: no cover - defensive
