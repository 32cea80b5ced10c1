"""Test fixture: TiCDC's "avro" protocol encoder (flat Avro rows, Confluent Schema Registry).

Produces what TiCDC's avro encoder writes for a row change: TiCDC-shaped key/value schemas registered under
``<topic>-key``/``<topic>-value`` and Confluent-framed Avro messages (deletes as tombstones, key-changing updates
split into delete + insert), plus the test-only ``avro-enable-watermark`` DDL and watermark messages, for the
unit tests, the changefeed generators and the benchmark. The applier itself only decodes
(:mod:`applier.codecs.avro`), whose constants and name sanitizing this module shares.

With ``enable_row_checksum=True`` the value schema gets TiCDC's ``_tidb_row_level_checksum`` /
``_tidb_corrupted`` / ``_tidb_checksum_version`` fields and every row its CRC32, computed here by
:func:`datum_checksum` from the Avro datums the encoder writes (the way TiCDC's own consumer does it, tiflow
examples/golang/avro-checksum-verification), separately from the decoder's :mod:`applier.codecs.checksum`.
"""

from __future__ import annotations

import datetime as _dt
import io
import math
import struct
import zlib
from dataclasses import dataclass
from decimal import Decimal, localcontext
from typing import Any, Iterable, Mapping

import fastavro
import orjson

from applier import mysql_values as T
from applier.codecs.avro import (
    _TWO64,
    _U32,
    _U64,
    BIGINT_UNSIGNED_MODES,
    CHECKPOINT_BYTE,
    DDL_BYTE,
    DECIMAL_MODES,
    DELETE_BYTE,
    EXT_BEFORE,
    EXT_CHECKSUM,
    EXT_CHECKSUM_VERSION,
    EXT_COMMIT_TS,
    EXT_CORRUPTED,
    EXT_OP,
    EXT_PHYSICAL_TIME,
    MAGIC_BYTE,
    OP_DELETE,
    OP_INSERT,
    OP_UPDATE,
    TIDB_TYPE,
    sanitize_name,
)
from applier.devtools.encoders import values as V
from applier.events import DDL, Column, Op, RowChange

__all__ = ["AvroEncodeError", "AvroEncoder", "ColumnSpec", "datum_checksum", "sanitize_topic"]

KEY_SUFFIX = "-key"
VALUE_SUFFIX = "-value"
DEFAULT_NAMESPACE = "default"


def sanitize_topic(topic: str) -> str:
    """TiCDC replaces dots in the topic before deriving the registry subjects from it."""
    return topic.replace(".", "_")


def escape_enum_option(option: str) -> str:
    """How TiCDC writes one ENUM/SET member into ``connect.parameters.allowed`` (comma-joined)."""
    return option.replace(",", "\\,").replace("\\'", "'").replace("''", "'")


class AvroEncodeError(ValueError):
    """A RowChange that cannot be written in TiCDC's Avro shape (the message says which column and why)."""


@dataclass(frozen=True)
class ColumnSpec:
    """Column details TiCDC puts into the schema but the event model does not carry.

    ``allowed``: ENUM/SET members in definition order (also lets integer ordinals/bitmasks be encoded);
    ``precision``/``scale``: DECIMAL(M, D), default TiDB's DECIMAL(10, 0); ``length``: BIT(M), default 1.
    """

    allowed: tuple[str, ...] | None = None
    precision: int | None = None
    scale: int | None = None
    length: int | None = None


_INT_TYPES = frozenset({"tinyint", "smallint", "mediumint"})
_TEXT_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})
_BLOB_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
_STRING_TIDB = {"json": "JSON", "date": "DATE", "datetime": "DATETIME", "timestamp": "TIMESTAMP", "time": "TIME",
                "vector": "TiDBVECTORFloat32"}


# ---------------------------------------------------------------------------------------------------------
# TiDB's row checksum from the Avro datums (independent of applier.codecs.checksum)
# ---------------------------------------------------------------------------------------------------------


def _utc_timestamp(text: str, time_zone: str) -> str:
    """TIMESTAMP text written in ``time_zone`` -> the UTC text TiDB hashes (the fraction is kept as written)."""
    if time_zone.upper() == "UTC" or text.startswith("0000-") or text[5:7] == "00" or text[8:10] == "00":
        return text
    from zoneinfo import ZoneInfo

    whole, dot, frac = text.partition(".")
    local = _dt.datetime.fromisoformat(whole).replace(tzinfo=ZoneInfo(time_zone))
    return local.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S") + dot + frac


def _checksum_datum_bytes(tidb: str, datum: Any, allowed: tuple[str, ...], time_zone: str) -> bytes:
    """The bytes one Avro datum adds to TiDB's checksum (TiDB appendDatumForChecksum, per tidb_type)."""
    if datum is None:
        return b""
    if tidb in ("INT", "INT UNSIGNED", "BIGINT", "YEAR"):
        return struct.pack("<Q", datum % _TWO64)
    if tidb == "BIGINT UNSIGNED":
        return struct.pack("<Q", int(datum) % _TWO64)  # a string in string mode, the uint64 bits otherwise
    if tidb in ("FLOAT", "DOUBLE"):
        f = struct.unpack("<f", struct.pack("<f", datum))[0] if tidb == "FLOAT" else datum
        return struct.pack("<d", f if math.isfinite(f) else 0.0)
    if tidb == "BIT":
        return struct.pack("<Q", int.from_bytes(datum, "big"))
    if tidb == "ENUM":
        return struct.pack("<Q", allowed.index(datum) + 1 if datum else 0)
    if tidb == "SET":
        return struct.pack("<Q", sum(1 << allowed.index(m) for m in datum.split(",")) if datum else 0)
    if tidb == "TiDBVECTORFloat32":
        items = orjson.loads(datum)
        return struct.pack(f"<I{len(items)}f", len(items), *items)
    if tidb == "DECIMAL":
        datum = datum if isinstance(datum, str) else format(datum, "f")
    elif tidb == "TIMESTAMP":
        datum = _utc_timestamp(datum, time_zone)
    data = datum if isinstance(datum, bytes) else datum.encode("utf-8")
    return struct.pack("<I", len(data)) + data


def datum_checksum(fields: Iterable[tuple[str, Any, tuple[str, ...]]], time_zone: str = "UTC") -> int:
    """CRC32 (IEEE) of a row given as ``(tidb_type, datum, allowed members)`` per column, in field order."""
    crc = 0
    for tidb, datum, allowed in fields:
        crc = zlib.crc32(_checksum_datum_bytes(tidb, datum, allowed, time_zone), crc)
    return crc


class AvroEncoder:
    """Builds TiCDC-shaped key/value schemas from RowChange column metadata, registers them (subjects
    ``<topic>-key``/``<topic>-value``) and encodes Confluent-framed messages.

    ``enable_tidb_extension`` defaults to True here (TiCDC's own default is false) because the applier's
    docs ask for it; the other options mirror TiCDC's sink-URI options. ``column_specs`` maps
    ``"schema.table"`` -> ``{column: ColumnSpec}``. ``enable_row_checksum`` mirrors ``[integrity]
    integrity-check-level = "correctness"`` (it needs the extension, as in TiCDC); the row's ``columns`` order is
    taken as column-id order. ``time_zone`` is TiCDC's time zone, in which TIMESTAMP values are written.
    """

    def __init__(
        self,
        registry: Any,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        enable_tidb_extension: bool = True,
        decimal_mode: str = "precise",
        bigint_unsigned_mode: str = "long",
        enable_watermark: bool = False,
        include_before_value: bool = False,
        column_specs: Mapping[str, Mapping[str, ColumnSpec]] | None = None,
        enable_row_checksum: bool = False,
        time_zone: str = "UTC",
    ) -> None:
        if decimal_mode not in DECIMAL_MODES:
            raise ValueError(f"decimal_mode must be precise or string, got {decimal_mode!r}")
        if bigint_unsigned_mode not in BIGINT_UNSIGNED_MODES:
            raise ValueError(f"bigint_unsigned_mode must be long or string, got {bigint_unsigned_mode!r}")
        if enable_watermark and not enable_tidb_extension:
            raise ValueError("enable_watermark needs enable_tidb_extension (as in TiCDC)")
        if enable_row_checksum and not enable_tidb_extension:
            raise ValueError("enable_row_checksum needs enable_tidb_extension (as in TiCDC)")
        self.enable_row_checksum = enable_row_checksum
        self.time_zone = time_zone
        self.registry = registry
        self.namespace = namespace
        self.enable_tidb_extension = enable_tidb_extension
        self.decimal_mode = decimal_mode
        self.bigint_unsigned_mode = bigint_unsigned_mode
        self.enable_watermark = enable_watermark
        self.include_before_value = include_before_value
        self.column_specs = {k: dict(v) for k, v in (column_specs or {}).items()}
        self._ids: dict[tuple[str, bytes], int] = {}
        self._parsed: dict[bytes, Any] = {}

    # -- schemas ------------------------------------------------------------------------------------------

    def _spec(self, row: RowChange, col: Column) -> ColumnSpec:
        return self.column_specs.get(f"{row.schema}.{row.table}", {}).get(col.name) or ColumnSpec()

    def column_type(self, col: Column, spec: ColumnSpec | None = None) -> dict[str, Any]:
        """The Avro type TiCDC writes for one column (without the null union)."""
        spec = spec or ColumnSpec()
        base = T.binary_type_name(T.canonical_type_name(col.type_name), col.binary)
        if base == "bool":
            base = "tinyint"

        def prim(avro: str, tidb: str, **params: str) -> dict[str, Any]:
            return {"type": avro, "connect.parameters": {TIDB_TYPE: tidb, **params}}

        if base in _INT_TYPES:
            return prim("int", "INT UNSIGNED" if col.unsigned else "INT")
        if base == "int":
            return prim("long", "INT UNSIGNED") if col.unsigned else prim("int", "INT")
        if base == "bigint":
            if col.unsigned:
                return prim("string" if self.bigint_unsigned_mode == "string" else "long", "BIGINT UNSIGNED")
            return prim("long", "BIGINT")
        if base == "float":
            return prim("float", "FLOAT")
        if base == "double":
            return prim("double", "DOUBLE")
        if base == "bit":
            return prim("bytes", "BIT", length=str(spec.length if spec.length is not None else 1))
        if base == "decimal":
            if self.decimal_mode == "string":
                return prim("string", "DECIMAL")
            t = prim("bytes", "DECIMAL")
            t["logicalType"] = "decimal"
            t["precision"] = spec.precision if spec.precision is not None else 10
            t["scale"] = spec.scale if spec.scale is not None else 0
            return t
        if base in _TEXT_TYPES:
            return prim("string", "TEXT")
        if base in _BLOB_TYPES:
            return prim("bytes", "BLOB")
        if base in ("enum", "set"):
            allowed = ",".join(escape_enum_option(e) for e in (spec.allowed or ()))
            return prim("string", base.upper(), allowed=allowed)
        if base in _STRING_TIDB:
            return prim("string", _STRING_TIDB[base])
        if base == "year":
            return prim("int", "YEAR")
        raise AvroEncodeError(f"column {col.name!r}: MySQL type {col.type_name!r} has no TiCDC Avro mapping")

    def _record(self, row: RowChange, cols: Iterable[Column], name: str) -> dict[str, Any]:
        fields = []
        for col in cols:
            t = self.column_type(col, self._spec(row, col))
            if col.nullable:
                fields.append({"name": sanitize_name(col.name), "type": ["null", t], "default": None})
            else:
                fields.append({"name": sanitize_name(col.name), "type": t})
        return {
            "type": "record",
            "name": name,
            "namespace": self._namespace(row),
            "fields": fields,
        }

    def _namespace(self, row: RowChange) -> str:
        ns, s = sanitize_name(self.namespace), sanitize_name(row.schema)
        return f"{ns}.{s}" if s else ns

    def key_schema(self, row: RowChange) -> dict[str, Any] | None:
        """The key schema (handle-key columns), or None when the row has no key columns."""
        keys = [c for c in row.columns if c.key]
        if not keys:
            return None
        return self._record(row, keys, sanitize_name(row.table))

    def value_schema(self, row: RowChange) -> dict[str, Any]:
        top = self._record(row, row.columns, sanitize_name(row.table))
        if self.include_before_value:
            before = self._record(row, row.columns, sanitize_name(row.table) + "_before")
            top["fields"].append({"name": EXT_BEFORE, "type": ["null", before], "default": None})
        if self.enable_tidb_extension:
            top["fields"] += [
                {"name": EXT_OP, "type": "string", "default": ""},
                {"name": EXT_COMMIT_TS, "type": "long", "default": 0},
                {"name": EXT_PHYSICAL_TIME, "type": "long", "default": 0},
            ]
            if self.enable_row_checksum:
                top["fields"] += [
                    {"name": EXT_CHECKSUM, "type": "string", "default": ""},
                    {"name": EXT_CORRUPTED, "type": "boolean", "default": False},
                    {"name": EXT_CHECKSUM_VERSION, "type": "int", "default": 0},
                ]
        elif self.include_before_value:
            top["fields"].append({"name": EXT_OP, "type": "string", "default": ""})
        return top

    # -- values -------------------------------------------------------------------------------------------

    def _datum(self, row: RowChange, col: Column, v: Any) -> Any:
        if v is None:
            if not col.nullable:
                raise AvroEncodeError(f"column {col.name!r} is NOT NULL but the row has no value for it")
            return None
        t = self.column_type(col, self._spec(row, col))
        tidb = t["connect.parameters"][TIDB_TYPE]
        avro = t["type"]
        try:
            if tidb in ("INT", "INT UNSIGNED", "BIGINT", "YEAR"):
                if type(v) is not int:
                    raise TypeError(f"expected int, got {type(v).__name__}")
                return v
            if tidb == "BIGINT UNSIGNED":
                if type(v) is not int or not 0 <= v < _TWO64:
                    raise ValueError(f"{v!r} is not a BIGINT UNSIGNED")
                if avro == "string":
                    return str(v)
                return v - _TWO64 if v >= 1 << 63 else v
            if tidb in ("FLOAT", "DOUBLE"):
                return float(v)
            if tidb == "BIT":
                if isinstance(v, (bytes, bytearray)):
                    return bytes(v)
                if type(v) is not int or not 0 <= v < _TWO64:
                    raise ValueError(f"{v!r} is not a BIT value")
                return v.to_bytes(max(1, (v.bit_length() + 7) // 8), "big")
            if tidb == "DECIMAL":
                d = v if isinstance(v, Decimal) else T.parse_decimal(str(v)) if not isinstance(v, float) \
                    else T.parse_decimal(repr(v))
                if avro == "string":
                    return V.format_decimal(d)
                return self._fit_decimal(col, d, t["precision"], t["scale"])
            if tidb == "BLOB":
                if not isinstance(v, (bytes, bytearray)):
                    raise TypeError(f"expected bytes, got {type(v).__name__}")
                return bytes(v)
            if tidb in ("ENUM", "SET"):
                return self._enum_set(row, col, tidb, v)
            if tidb == "DATE":
                return V.format_date(v)
            if tidb in ("DATETIME", "TIMESTAMP"):
                return V.format_datetime(v)
            if tidb == "TIME":
                return T.format_time(v)
            if type(v) is not str:
                raise TypeError(f"expected str, got {type(v).__name__}")
            return v
        except AvroEncodeError:
            raise
        except (TypeError, ValueError, ArithmeticError) as e:
            raise AvroEncodeError(f"column {col.name!r} ({tidb}): {e}") from None

    @staticmethod
    def _fit_decimal(col: Column, d: Decimal, precision: int, scale: int) -> Decimal:
        if not d.is_finite():
            raise AvroEncodeError(f"column {col.name!r}: {d} is not a finite decimal")
        q = d
        if d.as_tuple().exponent != -scale:
            with localcontext() as ctx:
                ctx.prec = max(precision, len(d.as_tuple().digits)) + scale + 2
                q = d.quantize(Decimal(1).scaleb(-scale))
        if q != d:
            raise AvroEncodeError(
                f"column {col.name!r}: {d} has more than {scale} fractional digits; give the column's real "
                "DECIMAL(M, D) with ColumnSpec(precision=M, scale=D)"
            )
        if len(q.as_tuple().digits) > precision and q != 0:
            raise AvroEncodeError(
                f"column {col.name!r}: {d} has more than {precision} digits; give the column's real DECIMAL(M, D) "
                "with ColumnSpec(precision=M, scale=D)"
            )
        return q

    def _enum_set(self, row: RowChange, col: Column, tidb: str, v: Any) -> str:
        if type(v) is str:
            return v
        allowed = self._spec(row, col).allowed
        if type(v) is not int or not allowed:
            raise AvroEncodeError(
                f"column {col.name!r} ({tidb}): {v!r} is not a member name; ordinals need ColumnSpec(allowed=...)"
            )
        if tidb == "ENUM":
            if v == 0:
                return ""
            if not 1 <= v <= len(allowed):
                raise AvroEncodeError(f"column {col.name!r}: ENUM ordinal {v} out of range")
            return allowed[v - 1]
        if v < 0 or v >> len(allowed):
            raise AvroEncodeError(f"column {col.name!r}: SET bitmask {v} out of range")
        return ",".join(m for i, m in enumerate(allowed) if v >> i & 1)

    def _image(self, row: RowChange, cols: Iterable[Column], image: Mapping[str, Any]) -> dict[str, Any]:
        return {sanitize_name(c.name): self._datum(row, c, image.get(c.name)) for c in cols}

    # -- messages -----------------------------------------------------------------------------------------

    def _register(self, subject: str, schema: dict[str, Any]) -> tuple[int, Any]:
        text = orjson.dumps(schema)
        cache_key = (subject, text)
        schema_id = self._ids.get(cache_key)
        if schema_id is None:
            schema_id = self.registry.register(subject, text.decode("utf-8"))
            self._ids[cache_key] = schema_id
        parsed = self._parsed.get(text)
        if parsed is None:
            parsed = self._parsed[text] = fastavro.parse_schema(schema, _write_hint=False)
        return schema_id, parsed

    @staticmethod
    def _frame(schema_id: int, parsed: Any, record: Mapping[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(bytes([MAGIC_BYTE]))
        buf.write(_U32.pack(schema_id))
        try:
            fastavro.schemaless_writer(buf, parsed, record)
        except (TypeError, ValueError, OverflowError, struct.error) as e:
            raise AvroEncodeError(f"cannot write the Avro record: {e}") from None
        return buf.getvalue()

    def row_checksum(self, row: RowChange, image: Mapping[str, Any]) -> int:
        """The checksum of one row image over its Avro datums, in the value schema's field order."""
        fields = []
        for c in row.columns:
            t = self.column_type(c, self._spec(row, c))
            allowed = self._spec(row, c).allowed or ()
            fields.append((t["connect.parameters"][TIDB_TYPE], self._datum(row, c, image.get(c.name)), allowed))
        try:
            return datum_checksum(fields, self.time_zone)
        except ValueError as e:  # an ENUM/SET name not in ``allowed`` (tuple.index)
            raise AvroEncodeError(f"row checksum of {row.schema}.{row.table}: {e}; ENUM/SET columns need "
                                  "ColumnSpec(allowed=...) for their checksum") from None

    def encode(self, row: RowChange, topic: str, *, checksum: int | str | None = None,
               corrupted: bool = False) -> list[tuple[bytes | None, bytes | None]]:
        """The Kafka (key, value) messages TiCDC would send for ``row``: one, or two (delete of the old key,
        then insert) for an update that changes the key, as TiCDC splits those for non-MySQL sinks. With
        ``enable_row_checksum`` the value carries the row's checksum, or ``checksum`` (written as given) and
        ``corrupted`` when the test crafts them."""
        key_cols = [c for c in row.columns if c.key]
        if row.op is Op.UPDATE and row.before and key_cols and row.after is not None:
            if any(c.name in row.before and row.before[c.name] != row.after.get(c.name) for c in key_cols):
                old = RowChange(row.schema, row.table, row.commit_ts, Op.DELETE, row.before, None, row.columns,
                                row.position)
                new = RowChange(row.schema, row.table, row.commit_ts, Op.INSERT, None, row.after, row.columns,
                                row.position)
                return self.encode(old, topic, checksum=checksum, corrupted=corrupted) + self.encode(
                    new, topic, checksum=checksum, corrupted=corrupted)
        subject_base = sanitize_topic(topic)
        image = row.before if row.op is Op.DELETE else row.after
        if image is None:
            raise AvroEncodeError(f"{row.op.value} on {row.schema}.{row.table} carries no row image")
        key = None
        ks = self.key_schema(row)
        if ks is not None:
            for c in key_cols:
                if c.name not in image:
                    raise AvroEncodeError(f"{row.op.value} row lacks key column {c.name!r}")
            kid, kparsed = self._register(subject_base + KEY_SUFFIX, ks)
            key = self._frame(kid, kparsed, self._image(row, key_cols, image))
        if row.op is Op.DELETE and not self.include_before_value:
            if key is None:
                raise AvroEncodeError(f"delete on {row.schema}.{row.table}: a table without a key column cannot "
                                      "send deletes in TiCDC's avro protocol")
            if self.enable_watermark:
                return [(key, bytes([DELETE_BYTE]) + _U64.pack(row.commit_ts))]
            return [(key, None)]
        vs = self.value_schema(row)
        vid, vparsed = self._register(subject_base + VALUE_SUFFIX, vs)
        record = self._image(row, row.columns, image)
        if self.include_before_value:
            record[EXT_BEFORE] = None
            if row.op in (Op.UPDATE, Op.DELETE) and row.before is not None:
                merged = dict(row.after or {})
                merged.update(row.before)
                record[EXT_BEFORE] = self._image(row, row.columns, merged)
        op = {Op.INSERT: OP_INSERT, Op.UPDATE: OP_UPDATE, Op.DELETE: OP_DELETE}[row.op]
        if self.enable_tidb_extension:
            record[EXT_OP] = op
            record[EXT_COMMIT_TS] = row.commit_ts
            record[EXT_PHYSICAL_TIME] = row.commit_ts >> 18
            if self.enable_row_checksum:
                crc = self.row_checksum(row, image) if checksum is None else checksum
                record[EXT_CHECKSUM] = str(crc)
                record[EXT_CORRUPTED] = corrupted
                record[EXT_CHECKSUM_VERSION] = 1
        elif self.include_before_value:
            record[EXT_OP] = op
        return [(key, self._frame(vid, vparsed, record))]

    def encode_resolved(self, ts: int) -> tuple[None, bytes]:
        """A watermark message (test-only avro-enable-watermark): nil key, 0x02 + 8-byte big-endian ts."""
        if not self.enable_watermark:
            raise AvroEncodeError("watermarks exist only with enable_watermark=True")
        return None, bytes([CHECKPOINT_BYTE]) + _U64.pack(ts)

    def encode_ddl(self, ddl: DDL) -> tuple[None, bytes]:
        """A DDL message (test-only avro-enable-watermark): nil key, 0x01 + JSON."""
        if not self.enable_watermark:
            raise AvroEncodeError("DDL messages exist only with enable_watermark=True")
        doc = {"query": ddl.query, "type": ddl.ddl_type if isinstance(ddl.ddl_type, int) else 0,
               "schema": ddl.schema, "table": ddl.table, "commitTs": ddl.commit_ts}
        return None, bytes([DDL_BYTE]) + V.go_json_dumps(doc)
