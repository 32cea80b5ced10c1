"""TiCDC "avro" protocol (flat Avro rows, Confluent Schema Registry) decoder (the test encoder is
:mod:`applier.devtools.encoders.avro`).

Wire format (TiCDC ``protocol=avro``; one topic per table is TiCDC's usual layout for it, but nothing here
depends on the topic name):

* key   = Confluent frame of the **handle-key columns** (primary key, or the not-null unique key TiCDC uses as
  handle): byte ``0x00``, 4-byte big-endian schema id, Avro binary. ``None`` when the table has no handle key
  (force-replicate tables).
* value = Confluent frame of the **whole row** for inserts and updates; for deletes a Kafka tombstone
  (``None``/empty) so that compacted topics drop the key. Newer TiCDC (pingcap/ticdc) also knows
  ``avro-include-before-value``: then deletes and updates carry a value whose ``_ticdc_before`` field (a
  nullable record named ``<table>_before``) holds the old row.
* Schemas are registered under ``<topic>-key`` / ``<topic>-value`` (dots in the topic become ``_``). Every
  table version gets new ids: a schema change simply shows up as new ids, and this decoder fetches and parses
  each id once (``GET /schemas/ids/{id}``, then ``fastavro.parse_schema``) and keeps it for its lifetime.
* Value record: ``{"type": "record", "name": <table>, "namespace": "<changefeed namespace>.<schema>",
  "fields": [...]}`` - the changefeed namespace is ``default`` unless TiCDC runs with keyspaces/namespaces, so
  the vectors say ``default.testdb``. Schema = the namespace after its first dot, table = the record name.
  TiCDC *sanitizes* these names and the column names for Avro (any character outside ``[A-Za-z0-9_]`` becomes
  ``_``, a leading digit gets a ``_`` prefix), so the names decoded here are the sanitized ones: an upstream
  table ``order-items`` arrives as ``order_items``. Use the routing rules to map such names back.
* Each column field's type (inside an optional ``["null", T]`` union) carries
  ``connect.parameters.tidb_type``, which is all that is known about the MySQL type:

  =====================  ===========================  ================================================
  tidb_type              Avro type                    Python value (event model)
  =====================  ===========================  ================================================
  INT, INT UNSIGNED      int (long for INT UNSIGNED)  int (TINYINT/SMALLINT/MEDIUMINT/INT all say INT)
  BIGINT                 long                         int
  BIGINT UNSIGNED        long, or string with         int; a long is the uint64 bit pattern, so values
                         bigint-unsigned mode string  >= 2**63 arrive negative and are mapped back
  FLOAT / DOUBLE         float / double               float (FLOAT: the float32's shortest repr)
  DECIMAL                bytes+logicalType decimal,   Decimal (schema scale) / Decimal (text scale)
                         or string (decimal mode)
  BIT                    bytes (big-endian, minimal)  int
  TEXT / BLOB            string / bytes               str / bytes (char, varchar, *text all say TEXT)
  ENUM, SET              string (+ ``allowed``)       str (the member names, "a,b" for a SET)
  JSON, TiDBVECTOR...    string                       str
  DATE                   string 'YYYY-MM-DD'          datetime.date (zero dates: the string)
  DATETIME, TIMESTAMP    string 'YYYY-MM-DD HH:MM:SS  datetime.datetime, naive (zero dates: the string)
                         [.ffffff]'                   TiCDC sends no logical timestamp types
  TIME                   string '[-]HH:MM:SS[.f]'     datetime.timedelta
  YEAR                   int                          int
  =====================  ===========================  ================================================

  ``Column.type_name`` is therefore the closest MySQL name: int, bigint, float, double, decimal, bit, text,
  blob (``binary=True``), enum, set, json, vector, date, datetime, timestamp, time, year; ``unsigned`` comes
  from "UNSIGNED", ``nullable`` from the ``null`` union branch, ``key``/``unique`` from the key schema.
* TiDB extension fields (``enable-tidb-extension=true``), after the columns: ``_tidb_op`` ("c" insert,
  "u" update, and "d" delete in pingcap/ticdc's before-value mode), ``_tidb_commit_ts`` (the commit ts),
  ``_tidb_commit_physical_time`` (commit ts >> 18, ms) and with row checksums ``_tidb_row_level_checksum``,
  ``_tidb_corrupted``, ``_tidb_checksum_version``. Extension fields are recognised by name *and* by having no
  ``tidb_type``, so a real column called ``_tidb_op`` still decodes as a column.

Decoding decisions:

* Insert/update value: ``_tidb_op`` "c" -> ``Op.INSERT``; "u" -> ``Op.UPDATE``; no ``_tidb_op`` (extension off)
  -> ``Op.INSERT``. TiCDC's avro output has **no old value**, so an update is ``Op.UPDATE`` with
  ``before=None`` unless ``_ticdc_before`` is present: writers apply it as an upsert of the new row. Updates that
  change the primary/unique key are split by TiCDC itself into delete + insert for non-MySQL sinks (since
  v6.5.3 / v7.1.1 / v7.2.0, tiflow#9086), so the old key still gets deleted.
* Delete: key + tombstone -> ``Op.DELETE`` with ``before`` = the key columns only and ``columns`` = the key
  columns. A tombstone carries **no commit ts**: ``commit_ts`` is 0. With before-value mode the value is a
  full row with ``_tidb_op`` "d" (``before`` = ``_ticdc_before``, or the row itself).
* Without the TiDB extension ``commit_ts`` is 0 for every row. The stream has no resolved ts at all, so this
  decoder is ``gated = False``: the pipeline keeps per-key order (a key always lives in one partition) and
  applies in offset order per partition, dropping nothing by commit ts.
* ``_tidb_corrupted = true`` (TiCDC found a checksum mismatch upstream) is a DecodeError: applying a row TiCDC
  itself flags as corrupted would pass bad data on silently.
* ``_tidb_row_level_checksum`` (TiCDC's ``[integrity] integrity-check-level = "correctness"``; "" or "0" means
  none) is the CRC32 of the record's own row (the new row; a before-value delete's old row). With
  ``verify_checksum`` (default true) the decoder recomputes it from the fields as received, in schema order (TiCDC
  sorts the fields by column id when checksums are on), ENUM/SET names mapped back to numbers through
  ``connect.parameters.allowed`` and TIMESTAMP text converted from ``checksum_time_zone`` (default "UTC"; set it
  to TiCDC's time zone, the Avro message does not carry it) to UTC (:mod:`applier.codecs.checksum`,
  docs/checksum.md). A mismatch is a DecodeError naming the table and both checksums: the row changed after
  TiCDC computed it. ``verify_checksum = false`` skips the recomputation; ``_ticdc_before`` and the key carry
  no checksum.
* ``enable_watermark=True`` mirrors TiCDC's test-only ``avro-enable-watermark`` (it needs the extension): DDL
  values are byte ``0x01`` + JSON ``{"query","type","schema","table","commitTs"}`` with a nil key -> ``DDL``;
  watermarks are byte ``0x02`` + 8-byte big-endian ts with a nil key -> ``Resolved``; pingcap/ticdc also sends
  deletes as key + value byte ``0x03`` + 8-byte commit ts. In that mode the decoder is ``gated = True`` and a
  row without ``_tidb_commit_ts`` or a plain tombstone delete (tiflow-era TiCDC, no commit ts) is a
  DecodeError: a gated pipeline cannot place an event whose commit ts it does not know, and guessing would
  drop or reorder the delete. Without ``enable_watermark`` such 0x01/0x02 values are a DecodeError naming the
  option; a ``0x03`` delete is accepted in either mode (it is unambiguous and carries its commit ts).
* ``decimal_mode`` / ``bigint_unsigned_mode`` default to ``"auto"`` (whatever the schema says). Set them to
  the changefeed's ``avro-decimal-handling-mode`` (precise|string) / ``avro-bigint-unsigned-handling-mode``
  (long|string) to have a schema that disagrees rejected.

Errors: malformed input (wrong magic byte, truncated frame, Avro that does not decode with its schema, bytes
left over, values that do not fit their tidb_type, unknown schema id, a schema that is not TiCDC-shaped) raises
:class:`applier.events.DecodeError` (protocol "avro") naming topic/partition/offset and the schema id. When the
registry itself cannot be asked (unreachable, 5xx, bad credentials, no registry configured) decode raises
:class:`applier.codecs.registry.RegistryError` instead: that is not the message's fault, so it must stop the
pipeline rather than send the message to quarantine. Nothing else escapes :meth:`AvroDecoder.decode`.

The registry URL comes from ``registry_url=`` or, when not given, the ``APPLIER_REGISTRY_URL`` environment
variable (``python -m applier.devtools.services start --only registry`` prints it).
"""

from __future__ import annotations

import io
import math
import os
import struct
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Callable, Iterable, Mapping

import fastavro
import orjson

from applier import mysql_values as T
from applier.codecs import checksum as CK
from applier.codecs.registry import RegistryClient, RegistryError, SchemaNotFound
from applier.codecs.base import Malformed, allowed_members, guarded_decode
from applier.events import (
    DDL,
    Column,
    Event,
    KafkaMessage,
    Op,
    Resolved,
    RowChange,
    SourcePosition,
)

__all__ = [
    "AvroDecoder",
    "PROTOCOL",
    "sanitize_name",
]

PROTOCOL = "avro"

MAGIC_BYTE = 0x00
DDL_BYTE = 0x01
CHECKPOINT_BYTE = 0x02
DELETE_BYTE = 0x03

TIDB_TYPE = "tidb_type"
EXT_OP = "_tidb_op"
EXT_COMMIT_TS = "_tidb_commit_ts"
EXT_PHYSICAL_TIME = "_tidb_commit_physical_time"
EXT_CHECKSUM = "_tidb_row_level_checksum"
EXT_CORRUPTED = "_tidb_corrupted"
EXT_CHECKSUM_VERSION = "_tidb_checksum_version"
EXT_BEFORE = "_ticdc_before"
EXTENSION_FIELDS = frozenset(
    {EXT_OP, EXT_COMMIT_TS, EXT_PHYSICAL_TIME, EXT_CHECKSUM, EXT_CORRUPTED, EXT_CHECKSUM_VERSION, EXT_BEFORE}
)

OP_INSERT = "c"
OP_UPDATE = "u"
OP_DELETE = "d"
_OPS = {OP_INSERT: Op.INSERT, OP_UPDATE: Op.UPDATE, OP_DELETE: Op.DELETE}

DECIMAL_MODES = ("precise", "string")
BIGINT_UNSIGNED_MODES = ("long", "string")
# tidb_types whose checksum is taken over the text as sent (it carries the column's fractional digits)
_TEXT_FOR_CHECKSUM = frozenset({"DATE", "DATETIME", "TIMESTAMP", "TIME"})

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_TWO64 = 1 << 64
_TS_MAX = (1 << 63) - 1


_Bad = Malformed  # a reason for a DecodeError; the position is added by guarded_decode


# ---------------------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------------------


def _valid_first(c: str) -> bool:
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or c == "_"


def _valid_rest(c: str) -> bool:
    return _valid_first(c) or ("0" <= c <= "9")


def sanitize_name(name: str) -> str:
    """TiCDC's Avro name sanitizing: ``[A-Za-z_][A-Za-z0-9_]*``; a bad first character becomes ``_`` (a digit
    is kept after it: ``1a`` -> ``_1a``), any other bad character becomes ``_`` (``a-b`` -> ``a_b``)."""
    out = []
    for i, c in enumerate(name):
        if i == 0 and not _valid_first(c):
            out.append("_")
            if "0" <= c <= "9":
                out.append(c)
        elif not _valid_rest(c):
            out.append("_")
        else:
            out.append(c)
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------
# tidb_type table
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _TiDBType:
    type_name: str
    unsigned: bool
    binary: bool
    avro_types: frozenset[str]  # accepted Avro types ("bytes.decimal" = bytes with logicalType decimal)


def _tt(type_name: str, avro: Iterable[str], unsigned: bool = False, binary: bool = False) -> _TiDBType:
    return _TiDBType(type_name, unsigned, binary, frozenset(avro))


TIDB_TYPES: dict[str, _TiDBType] = {
    "INT": _tt("int", ("int", "long")),
    "INT UNSIGNED": _tt("int", ("int", "long"), unsigned=True),
    "BIGINT": _tt("bigint", ("long",)),
    "BIGINT UNSIGNED": _tt("bigint", ("long", "string"), unsigned=True),
    "FLOAT": _tt("float", ("float",)),
    "DOUBLE": _tt("double", ("double",)),
    "BIT": _tt("bit", ("bytes",)),
    "DECIMAL": _tt("decimal", ("bytes.decimal", "string")),
    "TEXT": _tt("text", ("string",)),
    "BLOB": _tt("blob", ("bytes",), binary=True),
    "ENUM": _tt("enum", ("string",)),
    "SET": _tt("set", ("string",)),
    "JSON": _tt("json", ("string",)),
    "DATE": _tt("date", ("string",)),
    "DATETIME": _tt("datetime", ("string",)),
    "TIMESTAMP": _tt("timestamp", ("string",)),
    "TIME": _tt("time", ("string",)),
    "YEAR": _tt("year", ("int",)),
    "TiDBVECTORFloat32": _tt("vector", ("string",)),
}


# ---------------------------------------------------------------------------------------------------------
# value converters (fastavro datum -> event-model value); each raises ValueError/TypeError on bad input
# ---------------------------------------------------------------------------------------------------------


def _int(v: Any) -> int:
    if type(v) is not int:
        raise TypeError(f"expected an integer, got {type(v).__name__}")
    return v


def _uint_small(v: Any) -> int:
    v = _int(v)
    if v < 0:
        raise ValueError(f"{v} is negative for an unsigned column")
    return v


def _uint64_long(v: Any) -> int:
    v = _int(v)
    return v + _TWO64 if v < 0 else v


def _uint64_text(v: Any) -> int:
    if type(v) is not str or not v.isascii() or not v.isdigit():
        raise ValueError(f"{v!r} is not an unsigned integer")
    n = int(v)
    if n >= _TWO64:
        raise ValueError(f"{v} exceeds BIGINT UNSIGNED")
    return n


def _float32(v: Any) -> float:
    if type(v) is not float or not math.isfinite(v):
        raise ValueError(f"{v!r} is not a finite float")
    return T.shortest_float32(v)


def _double(v: Any) -> float:
    if type(v) is not float or not math.isfinite(v):
        raise ValueError(f"{v!r} is not a finite double")
    return v


def _bit(v: Any) -> int:
    if type(v) is not bytes:
        raise TypeError(f"expected bytes, got {type(v).__name__}")
    if len(v) > 8:
        raise ValueError(f"BIT value of {len(v)} bytes exceeds BIT(64)")
    return int.from_bytes(v, "big")


def _decimal_bytes(precision: int, scale: int) -> Callable[[Any], Decimal]:
    """Avro ``bytes`` + logicalType decimal: big-endian two's complement unscaled value. Decoded here, exactly
    (fastavro's own decimal reader rounds to the schema precision), and a value with more digits than the
    schema's precision is an error rather than silently rounded."""

    def conv(v: Any) -> Decimal:
        if type(v) is not bytes:
            raise TypeError(f"expected bytes, got {type(v).__name__}")
        if not v:
            raise ValueError("empty decimal bytes")
        unscaled = int.from_bytes(v, "big", signed=True)
        digits = str(abs(unscaled))
        if unscaled and len(digits) > precision:
            raise ValueError(f"unscaled value {unscaled} has more than {precision} digits (schema precision)")
        return Decimal((1 if unscaled < 0 else 0, tuple(int(c) for c in digits), -scale))

    return conv


def _decimal_text(v: Any) -> Decimal:
    return T.parse_decimal(v)


def _text(v: Any) -> str:
    if type(v) is not str:
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _blob(v: Any) -> bytes:
    if type(v) is not bytes:
        raise TypeError(f"expected bytes, got {type(v).__name__}")
    return v


def _converter(tidb_type: str, avro_type: str, inner: Mapping[str, Any]) -> Callable[[Any], Any]:
    if tidb_type in ("INT", "BIGINT", "YEAR"):
        return _int
    if tidb_type == "INT UNSIGNED":
        return _uint_small
    if tidb_type == "BIGINT UNSIGNED":
        return _uint64_text if avro_type == "string" else _uint64_long
    if tidb_type == "FLOAT":
        return _float32
    if tidb_type == "DOUBLE":
        return _double
    if tidb_type == "BIT":
        return _bit
    if tidb_type == "DECIMAL":
        if avro_type == "string":
            return _decimal_text
        return _decimal_bytes(inner["precision"], inner.get("scale", 0))
    if tidb_type == "BLOB":
        return _blob
    if tidb_type == "DATE":
        return T.parse_date
    if tidb_type in ("DATETIME", "TIMESTAMP"):
        return T.parse_datetime
    if tidb_type == "TIME":
        return T.parse_time
    return _text  # TEXT, ENUM, SET, JSON, vector


# ---------------------------------------------------------------------------------------------------------
# parsed schemas
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Field:
    name: str
    column: Column
    conv: Callable[[Any], Any]
    tidb_type: str
    avro_type: str
    elements: tuple[str, ...] = ()  # ENUM/SET members (connect.parameters.allowed), for the row checksum


@dataclass(frozen=True, slots=True)
class _Schema:
    id: int
    parsed: Any
    schema: str
    table: str
    fields: tuple[_Field, ...]
    before: tuple[_Field, ...] | None
    extensions: frozenset[str]


def _split_type(ftype: Any, where: str) -> tuple[Any, bool]:
    """(inner type, nullable) of a field type that may be a ``["null", T]`` / ``[T, "null"]`` union."""
    if isinstance(ftype, list):
        others = [t for t in ftype if t != "null"]
        if len(ftype) != 2 or len(others) != 1:
            raise _Bad(f"{where}: union {ftype!r} is not a nullable type ([\"null\", T])")
        return others[0], True
    return ftype, False


def _column_fields(fields: Any, where: str, *, top: bool) -> tuple[tuple[_Field, ...], set[str], Any]:
    """Column fields, extension field names and the before-value record schema (if any) of a record."""
    if not isinstance(fields, list):
        raise _Bad(f"{where}: 'fields' is not a list")
    cols: list[_Field] = []
    exts: set[str] = set()
    before: Any = None
    for f in fields:
        if not isinstance(f, dict) or not isinstance(f.get("name"), str):
            raise _Bad(f"{where}: a field is not an object with a name")
        name = f["name"]
        inner, nullable = _split_type(f.get("type"), f"{where} field {name!r}")
        params = inner.get("connect.parameters") if isinstance(inner, dict) else None
        tidb_type = params.get(TIDB_TYPE) if isinstance(params, dict) else None
        if tidb_type is None:
            if top and name in EXTENSION_FIELDS:
                exts.add(name)
                if name == EXT_BEFORE:
                    if not (nullable and isinstance(inner, dict) and inner.get("type") == "record"):
                        raise _Bad(f"{where}: {EXT_BEFORE} is not a nullable record")
                    before = inner
                continue
            raise _Bad(
                f"{where} field {name!r} has no connect.parameters.tidb_type: not a TiCDC avro schema"
            )
        if not isinstance(tidb_type, str) or tidb_type not in TIDB_TYPES:
            raise _Bad(f"{where} field {name!r}: unknown tidb_type {tidb_type!r}")
        spec = TIDB_TYPES[tidb_type]
        avro_type = inner.get("type")
        if not isinstance(avro_type, str):
            raise _Bad(f"{where} field {name!r}: Avro type {avro_type!r} is not a primitive type")
        if inner.get("logicalType") == "decimal":
            avro_type += ".decimal"
            precision, scale = inner.get("precision"), inner.get("scale", 0)
            if type(precision) is not int or type(scale) is not int or not 0 <= scale <= precision or precision < 1:
                raise _Bad(f"{where} field {name!r}: bad decimal precision/scale {precision!r}/{scale!r}")
        if avro_type not in spec.avro_types:
            raise _Bad(
                f"{where} field {name!r}: tidb_type {tidb_type} cannot be Avro {avro_type} "
                f"(TiCDC writes {' or '.join(sorted(spec.avro_types))})"
            )
        elements = allowed_members(params.get("allowed", "")) if tidb_type in ("ENUM", "SET") else ()
        col = Column(name=name, type_name=spec.type_name, nullable=nullable, unsigned=spec.unsigned,
                     binary=spec.binary, declared=_declared(spec.type_name, spec.unsigned, params, inner, elements))
        cols.append(_Field(name, col, _converter(tidb_type, avro_type, inner), tidb_type, avro_type, elements))
    if not cols:
        raise _Bad(f"{where} has no column fields")
    return tuple(cols), exts, before


def _declared(base: str, unsigned: bool, params: dict, inner: Any, elements: tuple[str, ...]) -> str | None:
    """The full MySQL type where the schema says more than the type name: DECIMAL's precision and scale (the
    Avro decimal logical type), BIT's ``length`` parameter, ENUM/SET members."""
    length = scale = None
    if base == "decimal" and isinstance(inner, dict) and inner.get("logicalType") == "decimal":
        length, scale = inner.get("precision"), inner.get("scale", 0)
    elif base == "bit":
        text = params.get("length")
        length = int(text) if isinstance(text, str) and text.isdigit() and len(text) < 4 else None
    return T.declared_type(base, length=length, scale=scale, elements=elements, unsigned=unsigned)


def _strip_decimals(node: Any) -> Any:
    """Drop ``logicalType: decimal`` everywhere so fastavro hands over the raw bytes (see _decimal_bytes)."""
    if isinstance(node, dict):
        if node.get("logicalType") == "decimal":
            node = {k: v for k, v in node.items() if k not in ("logicalType", "precision", "scale")}
        return {k: _strip_decimals(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_strip_decimals(v) for v in node]
    return node


def _parse_schema(schema_id: int, text: str) -> _Schema:
    where = f"schema id {schema_id}"
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise _Bad(f"{where} is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("type") != "record":
        raise _Bad(f"{where} is not an Avro record schema")
    name, namespace = doc.get("name"), doc.get("namespace")
    if not isinstance(name, str) or not name:
        raise _Bad(f"{where}: the record has no name (TiCDC names it after the table)")
    if not isinstance(namespace, str) or "." not in namespace:
        raise _Bad(
            f"{where}: record namespace {namespace!r} is not '<changefeed namespace>.<schema>' as TiCDC writes it"
        )
    schema_name = namespace.split(".", 1)[1]
    fields, exts, before_rec = _column_fields(doc.get("fields"), where, top=True)
    before = None
    if before_rec is not None:
        before, _, _ = _column_fields(before_rec.get("fields"), f"{where} {EXT_BEFORE}", top=False)
    try:
        parsed = fastavro.parse_schema(_strip_decimals(orjson.loads(text)), _write_hint=False)
    except Exception as e:  # noqa: BLE001 - fastavro raises several types for invalid schemas
        raise _Bad(f"{where} is not a valid Avro schema: {e}") from None
    return _Schema(schema_id, parsed, schema_name, name, fields, before, frozenset(exts))


# ---------------------------------------------------------------------------------------------------------
# decoder
# ---------------------------------------------------------------------------------------------------------


class AvroDecoder:
    """Decoder for TiCDC's flat Avro protocol with a Confluent-compatible schema registry (see module doc).

    ``registry_url`` (or ``$APPLIER_REGISTRY_URL``) + ``auth`` build a :class:`RegistryClient`;
    ``registry`` passes any object with ``schema_by_id(id)`` instead (an
    :class:`applier.devtools.encoders.registry.InMemoryRegistry` in tests). ``verify_checksum`` (default true)
    recomputes ``_tidb_row_level_checksum`` and refuses a row that does not match; ``checksum_time_zone``
    (default "UTC") is TiCDC's time zone, in which it writes TIMESTAMP values (needed to hash them as UTC).
    ``registry_ca``: a PEM file of the CA that signed an https registry's certificate (default: the system's CAs).
    """

    name = PROTOCOL
    # A message's events depend on that message and the registry's schema of the ids it names (a registry never
    # changes what an id means), so Spark's Python workers may decode it (applier.decode), each asking the
    # registry once per schema id through its own cached client.
    decodes_alone = True
    # Not the message's fault: stops the run wherever it decodes (a worker hands it to the driver in its chunk).
    passthrough_errors = (RegistryError,)

    def __init__(
        self,
        registry_url: str | None = None,
        *,
        auth: tuple[str, str] | None = None,
        registry: Any = None,
        decimal_mode: str = "auto",
        bigint_unsigned_mode: str = "auto",
        enable_watermark: bool = False,
        registry_timeout: float = 10.0,
        registry_retries: int = 3,
        registry_ca: str | None = None,
        verify_checksum: bool = True,
        checksum_time_zone: str = "UTC",
    ) -> None:
        if decimal_mode not in ("auto", *DECIMAL_MODES):
            raise ValueError(f"decimal_mode must be auto, precise or string, got {decimal_mode!r}")
        if bigint_unsigned_mode not in ("auto", *BIGINT_UNSIGNED_MODES):
            raise ValueError(f"bigint_unsigned_mode must be auto, long or string, got {bigint_unsigned_mode!r}")
        if not isinstance(verify_checksum, bool):
            raise ValueError(f"verify_checksum must be true or false, got {verify_checksum!r}")
        try:
            self._checksum_tz = CK.resolve_zone(checksum_time_zone)
        except CK.ChecksumError as e:
            raise ValueError(f"checksum_time_zone: {e}") from None
        self.verify_checksum = verify_checksum
        self.checksum_time_zone = checksum_time_zone
        self._checksum_columns: dict[int, tuple[CK.ChecksumColumn, ...]] = {}
        self.decimal_mode = decimal_mode
        self.bigint_unsigned_mode = bigint_unsigned_mode
        self.enable_watermark = bool(enable_watermark)
        self.gated = self.enable_watermark
        self._registry = registry
        self._registry_url = registry_url
        self._auth = auth
        self._timeout = registry_timeout
        self._retries = registry_retries
        self._registry_ca = registry_ca
        if registry is None and registry_url is not None:
            self._registry = RegistryClient(registry_url, auth=auth, timeout=registry_timeout,
                                            retries=registry_retries, ca_file=registry_ca)
        self._schemas: dict[int, _Schema] = {}
        self._bad_schemas: dict[int, str] = {}
        self._columns: dict[tuple[int, int], tuple[tuple[Column, ...], frozenset[str]]] = {}

    def __repr__(self) -> str:
        return f"AvroDecoder(registry={self._registry!r}, gated={self.gated})"

    # -- public -------------------------------------------------------------------------------------------

    def decode(self, msg: KafkaMessage) -> list[Event]:
        """All events of one Kafka record (zero or one). Raises DecodeError for malformed input and
        RegistryError when the schema registry cannot be asked (see the module docstring)."""
        return guarded_decode(PROTOCOL, self._decode, msg, passthrough=self.passthrough_errors)

    @property
    def registry(self) -> Any:
        if self._registry is None:
            url = os.environ.get("APPLIER_REGISTRY_URL")
            if not url:
                raise RegistryError(
                    "the avro protocol needs a schema registry: pass registry_url= to the avro decoder or set "
                    "APPLIER_REGISTRY_URL (python -m applier.devtools.services start --only registry prints one)"
                )
            self._registry = RegistryClient(url, auth=self._auth, timeout=self._timeout, retries=self._retries,
                                            ca_file=self._registry_ca)
        return self._registry

    # -- internals ----------------------------------------------------------------------------------------

    def _decode(self, msg: KafkaMessage) -> list[Event]:
        key, value = msg.key, msg.value
        if key is not None and not isinstance(key, (bytes, bytearray, memoryview)):
            raise _Bad("key must be bytes")
        if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
            raise _Bad("value must be bytes")
        key = bytes(key) if key else None
        value = bytes(value) if value else b""
        pos = msg.position
        size = len(key or b"") + len(value)
        if key is None:
            if not value:
                raise _Bad("message has neither key nor value")
            first = value[0]
            if first == MAGIC_BYTE:
                return [self._row(pos, None, value, size)]
            if first == DDL_BYTE:
                return [self._ddl(pos, value)]
            if first == CHECKPOINT_BYTE:
                return [self._watermark(pos, value)]
            if first == DELETE_BYTE:
                raise _Bad("delete marker (value byte 0x03) without a key")
            raise _Bad(f"value starts with byte 0x{first:02x}, not the Confluent magic byte 0x00")
        if not value:
            return [self._tombstone(pos, key, size)]
        first = value[0]
        if first == MAGIC_BYTE:
            return [self._row(pos, key, value, size)]
        if first == DELETE_BYTE:
            return [self._delete_marker(pos, key, value, size)]
        if first in (DDL_BYTE, CHECKPOINT_BYTE):
            raise _Bad(f"value starts with byte 0x{first:02x} (a TiCDC DDL/watermark message) but has a key")
        raise _Bad(f"value starts with byte 0x{first:02x}, not the Confluent magic byte 0x00")

    # frames and schemas

    def _frame(self, data: bytes, part: str) -> tuple[int, bytes]:
        if len(data) < 5:
            raise _Bad(f"{part} is {len(data)} bytes, shorter than the 5-byte Confluent header")
        if data[0] != MAGIC_BYTE:
            raise _Bad(f"{part} starts with byte 0x{data[0]:02x}, not the Confluent magic byte 0x00")
        (schema_id,) = _U32.unpack_from(data, 1)
        return schema_id, data[5:]

    def _schema(self, schema_id: int, pos: SourcePosition, part: str) -> _Schema:
        s = self._schemas.get(schema_id)
        if s is not None:
            return s
        bad = self._bad_schemas.get(schema_id)
        if bad is not None:
            raise _Bad(f"{part}: {bad}")
        try:
            reg = self.registry.schema_by_id(schema_id)
        except SchemaNotFound as e:
            raise _Bad(f"{part} names schema id {schema_id}, which the registry does not have: {e}") from None
        except RegistryError as e:
            raise e.with_context(f"needed for the {part} of the message at {pos}") from None
        try:
            if reg.schema_type != "AVRO":
                raise _Bad(f"schema id {schema_id} is a {reg.schema_type} schema, not Avro")
            if reg.references:
                raise _Bad(f"schema id {schema_id} uses schema references, which TiCDC never writes")
            s = _parse_schema(schema_id, reg.schema)
            self._check_modes(s)
        except _Bad as e:
            self._bad_schemas[schema_id] = str(e)
            raise _Bad(f"{part}: {e}") from None
        self._schemas[schema_id] = s
        return s

    def _check_modes(self, s: _Schema) -> None:
        for f in (*s.fields, *(s.before or ())):
            if f.tidb_type == "DECIMAL" and self.decimal_mode != "auto":
                got = "string" if f.avro_type == "string" else "precise"
                if got != self.decimal_mode:
                    raise _Bad(
                        f"schema id {s.id} column {f.name!r} is DECIMAL in {got} mode but decimal_mode is "
                        f"{self.decimal_mode} (match it to the changefeed's avro-decimal-handling-mode)"
                    )
            if f.tidb_type == "BIGINT UNSIGNED" and self.bigint_unsigned_mode != "auto":
                got = "string" if f.avro_type == "string" else "long"
                if got != self.bigint_unsigned_mode:
                    raise _Bad(
                        f"schema id {s.id} column {f.name!r} is BIGINT UNSIGNED in {got} mode but "
                        f"bigint_unsigned_mode is {self.bigint_unsigned_mode} (match it to the changefeed's "
                        "avro-bigint-unsigned-handling-mode)"
                    )

    def _read(self, s: _Schema, payload: bytes, part: str) -> dict[str, Any]:
        bio = io.BytesIO(payload)
        try:
            rec = fastavro.schemaless_reader(bio, s.parsed, None)
        except Exception as e:  # noqa: BLE001 - fastavro raises EOFError, ValueError, UnicodeDecodeError, ...
            raise _Bad(f"{part} (schema id {s.id}) is not valid Avro for its schema: "
                       f"{type(e).__name__}: {e}") from None
        left = len(payload) - bio.tell()
        if left:
            raise _Bad(f"{part} (schema id {s.id}) has {left} bytes after the Avro record")
        if not isinstance(rec, dict):
            raise _Bad(f"{part} (schema id {s.id}) did not decode to a record")
        return rec

    def _values(self, fields: tuple[_Field, ...], rec: Mapping[str, Any], s: _Schema, part: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields:
            v = rec.get(f.name)
            if v is None:
                out[f.name] = None
                continue
            try:
                out[f.name] = f.conv(v)
            except (ValueError, TypeError, ArithmeticError) as e:
                raise _Bad(f"{part} (schema id {s.id}) column {f.name!r} ({f.tidb_type}): {e}") from None
        return out

    def _columns_for(self, ks: _Schema | None, vs: _Schema) -> tuple[tuple[Column, ...], frozenset[str]]:
        cache_key = (ks.id if ks is not None else -1, vs.id)
        hit = self._columns.get(cache_key)
        if hit is not None:
            return hit
        keys = frozenset(f.name for f in ks.fields) if ks is not None else frozenset()
        missing = keys - {f.name for f in vs.fields}
        if missing:
            raise _Bad(
                f"key schema id {ks.id} has column(s) {', '.join(sorted(missing))} that value schema id "
                f"{vs.id} lacks"
            )
        cols = tuple(
            Column(f.column.name, f.column.type_name, nullable=f.column.nullable, key=True, unique=True,
                   unsigned=f.column.unsigned, binary=f.column.binary)
            if f.name in keys else f.column
            for f in vs.fields
        )
        self._columns[cache_key] = (cols, keys)
        return cols, keys

    def _key(self, pos: SourcePosition, key: bytes) -> tuple[_Schema, dict[str, Any]]:
        kid, payload = self._frame(key, "key")
        ks = self._schema(kid, pos, "key")
        rec = self._read(ks, payload, "key")
        return ks, self._values(ks.fields, rec, ks, "key")

    # event builders

    def _row(self, pos: SourcePosition, key: bytes | None, value: bytes, size: int) -> RowChange:
        ks, kvals = self._key(pos, key) if key is not None else (None, None)
        vid, payload = self._frame(value, "value")
        vs = self._schema(vid, pos, "value")
        if ks is not None and (ks.schema, ks.table) != (vs.schema, vs.table):
            raise _Bad(
                f"key schema id {ks.id} is for {ks.schema}.{ks.table} but value schema id {vs.id} is for "
                f"{vs.schema}.{vs.table}"
            )
        rec = self._read(vs, payload, "value")
        after = self._values(vs.fields, rec, vs, "value")
        columns, _ = self._columns_for(ks, vs)
        if kvals is not None:
            for k, kv in kvals.items():
                if after.get(k) != kv:
                    raise _Bad(f"key column {k!r} is {kv!r} in the key but {after.get(k)!r} in the value")
        if rec.get(EXT_CORRUPTED) is True and EXT_CORRUPTED in vs.extensions:
            raise _Bad(
                f"TiCDC flagged this row of {vs.schema}.{vs.table} as corrupted (_tidb_corrupted=true, checksum "
                f"{rec.get(EXT_CHECKSUM)!r}): upstream data failed its checksum; check TiDB and the changefeed"
            )
        if self.verify_checksum and EXT_CHECKSUM in vs.extensions:
            self._verify_checksum(vs, rec, after)
        commit_ts = 0
        if EXT_COMMIT_TS in vs.extensions:
            commit_ts = rec.get(EXT_COMMIT_TS)
            if type(commit_ts) is not int or commit_ts < 0:
                raise _Bad(f"{EXT_COMMIT_TS} is {commit_ts!r}, not a commit ts")
        elif self.gated:
            raise _Bad(
                f"value schema id {vs.id} has no {EXT_COMMIT_TS}: enable_watermark needs the changefeed's "
                "enable-tidb-extension=true (TiCDC only sends watermarks with it)"
            )
        op = Op.INSERT
        if EXT_OP in vs.extensions:
            raw_op = rec.get(EXT_OP)
            op = _OPS.get(raw_op)  # type: ignore[arg-type]
            if op is None:
                raise _Bad(f"{EXT_OP} is {raw_op!r}; TiCDC writes 'c', 'u' or 'd'")
        before = None
        raw_before = rec.get(EXT_BEFORE)
        if raw_before is not None and vs.before is not None:
            if not isinstance(raw_before, dict):
                raise _Bad(f"{EXT_BEFORE} is not a record")
            before = self._values(vs.before, raw_before, vs, EXT_BEFORE)
        if op is Op.DELETE:
            return RowChange(vs.schema, vs.table, commit_ts, Op.DELETE, before or after, None, columns, pos, size)
        if op is Op.INSERT:
            before = None
        return RowChange(vs.schema, vs.table, commit_ts, op, before, after, columns, pos, size)

    def _verify_checksum(self, vs: _Schema, rec: Mapping[str, Any], values: Mapping[str, Any]) -> None:
        """Recompute ``_tidb_row_level_checksum`` over the record's columns (see the module docstring)."""
        raw = rec.get(EXT_CHECKSUM)
        if raw is None or raw == "":
            return
        if type(raw) is not str or not raw.isascii() or not raw.isdigit() or int(raw) > CK.MASK32:
            raise _Bad(f"{EXT_CHECKSUM} is {raw!r:.40}, not a CRC32 (a decimal number 0..{CK.MASK32})")
        expected = int(raw)
        if expected == 0:
            return
        cols = self._checksum_columns.get(vs.id)
        if cols is None:
            cols = tuple(CK.ChecksumColumn(f.name, f.column.type_name, f.elements) for f in vs.fields)
            self._checksum_columns[vs.id] = cols
        row = dict(values)
        for f in vs.fields:
            if f.tidb_type in _TEXT_FOR_CHECKSUM:  # TiDB's text: it keeps the column's fractional digits
                row[f.name] = rec.get(f.name)
        table = f"{vs.schema}.{vs.table}"
        try:
            got = CK.verify_row(cols, row, expected, time_zone=self._checksum_tz)
        except CK.ChecksumError as e:
            raise _Bad(f"cannot verify the row checksum of {table} (schema id {vs.id}): {e}; set "
                       "verify_checksum = false in [source.codec] to apply such rows unverified") from None
        if got is None:
            return
        tz_hint = ""
        if any(f.tidb_type == "TIMESTAMP" and rec.get(f.name) is not None for f in vs.fields):
            tz_hint = (f" The row has TIMESTAMP values, which TiCDC writes in its own time zone: check that "
                       f"checksum_time_zone (now {self.checksum_time_zone!r}) is TiCDC's time zone.")
        raise _Bad(
            f"row checksum mismatch for {table} (schema id {vs.id}): TiCDC sent {expected}, the row as received "
            f"gives {got} (checksum version {rec.get(EXT_CHECKSUM_VERSION)!r}). The row changed after TiCDC "
            "computed its checksum, so it is not applied: compare it with the upstream row and find where it was "
            f"altered (Kafka, a proxy, a re-encoding step).{tz_hint} Only if the table's columns were reordered by "
            "DDL (ADD COLUMN ... FIRST/AFTER, MODIFY COLUMN) may this be a false alarm: then set verify_checksum "
            "= false in [source.codec]"
        )

    def _delete(self, pos: SourcePosition, key: bytes, commit_ts: int, size: int) -> RowChange:
        ks, kvals = self._key(pos, key)
        columns, _ = self._columns_for(ks, ks)
        return RowChange(ks.schema, ks.table, commit_ts, Op.DELETE, kvals, None, columns, pos, size)

    def _tombstone(self, pos: SourcePosition, key: bytes, size: int) -> RowChange:
        if self.gated:
            raise _Bad(
                "delete without a commit ts (key + empty value, as tiflow-era TiCDC sends deletes even with "
                "avro-enable-watermark): a gated pipeline cannot place it; decode this stream with "
                "enable_watermark=false (ungated, offset order)"
            )
        return self._delete(pos, key, 0, size)

    def _delete_marker(self, pos: SourcePosition, key: bytes, value: bytes, size: int) -> RowChange:
        if len(value) != 9:
            raise _Bad(f"delete marker value is {len(value)} bytes; expected 9 (0x03 + 8-byte commit ts)")
        (ts,) = _U64.unpack_from(value, 1)
        if ts > _TS_MAX:
            raise _Bad(f"delete marker commit ts {ts} is out of range")
        return self._delete(pos, key, ts, size)

    def _need_watermark_mode(self, what: str) -> None:
        if not self.enable_watermark:
            raise _Bad(
                f"{what} (TiCDC's test-only avro-enable-watermark output): decode it with enable_watermark=true"
            )

    def _watermark(self, pos: SourcePosition, value: bytes) -> Resolved:
        self._need_watermark_mode("watermark message (value byte 0x02)")
        if len(value) != 9:
            raise _Bad(f"watermark value is {len(value)} bytes; expected 9 (0x02 + 8-byte ts)")
        (ts,) = _U64.unpack_from(value, 1)
        if ts > _TS_MAX:
            raise _Bad(f"watermark ts {ts} is out of range")
        return Resolved(ts, pos)

    def _ddl(self, pos: SourcePosition, value: bytes) -> DDL:
        self._need_watermark_mode("DDL message (value byte 0x01)")
        try:
            doc = orjson.loads(value[1:])
        except orjson.JSONDecodeError as e:
            raise _Bad(f"DDL message is not JSON after the 0x01 byte: {e}") from None
        if not isinstance(doc, dict):
            raise _Bad("DDL message is not a JSON object")
        query, schema, table, ts, ddl_type = (doc.get(k) for k in ("query", "schema", "table", "commitTs", "type"))
        if not isinstance(query, str) or not query:
            raise _Bad("DDL message has no query")
        if not isinstance(schema, str) or not isinstance(table, str):
            raise _Bad("DDL message has no schema/table strings")
        if type(ts) is not int or not 0 <= ts <= _TS_MAX:
            raise _Bad(f"DDL commitTs {ts!r} is not a commit ts")
        if ddl_type is not None and type(ddl_type) is not int:
            raise _Bad(f"DDL type {ddl_type!r} is not a TiDB action type number")
        return DDL(schema, table, ts, query, pos, ddl_type=ddl_type, size=len(value))
