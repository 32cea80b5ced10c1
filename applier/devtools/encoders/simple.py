"""Test fixture: TiCDC's Simple protocol encoder (``protocol=simple``), JSON and Avro encodings.

Produces the Kafka (key, value) records TiCDC's simple encoder writes (tiflow/ticdc
pkg/sink/codec/simple/message.go: encodeValue, encodeValue4Avro, getDDLType), BOOTSTRAP messages included,
for the unit tests, the changefeed generators and the benchmark. The applier itself only decodes
(:mod:`applier.codecs.simple`), whose constants and Avro schema this module shares.

Row checksums (``encode_simple(..., checksum=True)``) are computed here by :func:`tidb_row_checksum`, written
separately from the decoder's :mod:`applier.codecs.checksum` and from the Python values (not from decoded wire
values), so the tests compare two implementations of TiDB's algorithm (TiDB pkg/util/rowcodec/common.go
``RowData.Checksum`` / ``appendDatumForChecksum``; docs/checksum.md).
"""

from __future__ import annotations

import base64
import datetime as _dt
import io
import math
import struct
import time
import zlib
from typing import Any, Iterable, Mapping

import orjson

from applier import mysql_values as T
from applier.codecs.simple import (
    _DDL_TYPE_SET,
    _INT_RANGES,
    _U64,
    AVRO_BOOTSTRAP,
    AVRO_DDL,
    AVRO_DML,
    AVRO_MESSAGE,
    AVRO_TIMESTAMP,
    AVRO_UNSIGNED_BIGINT,
    AVRO_WATERMARK,
    MSG_BOOTSTRAP,
    MSG_DDL,
    MSG_DML,
    MSG_WATERMARK,
    PROTOCOL_VERSION,
    _parsed_schemas,
)
from applier.devtools.encoders import values as V
from applier.devtools.encoders.largemsg import MAX_RECORD_OVERHEAD, LargeMessage, compress
from applier.events import DDL, Column, Op, Resolved, RowChange, TableSchema

__all__ = ["encode_simple", "encode_bootstrap", "simple_ddl_type", "tidb_row_checksum", "tidb_checksum_bytes"]


_dumps = V.go_json_dumps

# TiDB model.ActionType -> Simple DDL type (tiflow pkg/sink/codec/simple/message.go getDDLType)
_ACTION_TO_SIMPLE: dict[int, str] = {3: "CREATE", 14: "RENAME", 47: "RENAME", 7: "CINDEX", 9: "CINDEX",
                                     32: "CINDEX", 8: "DINDEX", 10: "DINDEX", 33: "DINDEX", 4: "ERASE",
                                     11: "TRUNCATE"}
for _a in (5, 6, 12, 13, 15, 17, 18, 19, 20, 22, 23, 41, 61, 64, 71, 72):
    _ACTION_TO_SIMPLE[_a] = "ALTER"

# MySQL default display lengths (TiDB mysql.GetDefaultFieldLengthAndDecimal), for the schema's "length"
_DEFAULT_LENGTH = {"tinyint": 4, "smallint": 6, "mediumint": 9, "int": 11, "bigint": 20, "float": 12,
                   "double": 22, "decimal": 10, "date": 10, "datetime": 19, "timestamp": 19, "time": 10,
                   "year": 4, "bit": 1, "char": 1, "binary": 1, "varchar": 255, "varbinary": 255,
                   "tinytext": 255, "tinyblob": 255, "text": 65535, "blob": 65535, "mediumtext": 16777215,
                   "mediumblob": 16777215, "longtext": 4294967295, "longblob": 4294967295,
                   "json": 4294967295}
_NUMERIC_SCHEMA_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint", "float", "double",
                                   "bit", "year", "decimal"})


def simple_ddl_type(ddl_type: int | str | None) -> str:
    """Simple DDL type for a DDL: a Simple type name passes through, a TiDB action code is mapped."""
    if isinstance(ddl_type, str) and ddl_type in _DDL_TYPE_SET:
        return ddl_type
    if isinstance(ddl_type, int) and not isinstance(ddl_type, bool):
        return _ACTION_TO_SIMPLE.get(ddl_type, "QUERY")
    return "QUERY"


def _base(col: Column) -> str:
    base, _ = T.split_mysql_type(col.type_name)
    return T.binary_type_name(base, col.binary)


def _is_binary(col: Column) -> bool:
    return col.binary or _base(col) in T.BINARY_TYPES


def _check_int(v: Any, col: Column) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"column {col.name!r}: expected int, got {type(v).__name__}")
    return v


def _json_value(col: Column, v: Any, time_zone: str) -> Any:
    """Python value -> the JSON value TiCDC's simple encoder writes (tiflow/ticdc message.go encodeValue)."""
    if v is None:
        return None
    base = _base(col)
    if base in ("enum", "set") and isinstance(v, str):
        raise ValueError(f"column {col.name!r}: the simple protocol sends ENUM/SET as ordinal integers")
    if base == "bit" and isinstance(v, (bytes, bytearray)):
        return str(V.bits_to_int(bytes(v)))
    if base in _INT_RANGES:
        return str(_check_int(v, col))
    if base == "float":
        return V.format_float_fixed(float(v), single=True)
    if base == "double":
        return V.format_float_fixed(float(v))
    if base == "decimal":
        return V.format_decimal(v)
    if base == "timestamp":
        return {"location": time_zone, "value": V.format_datetime(v)}
    if base == "datetime":
        return V.format_datetime(v)
    if base == "date":
        return V.format_date(v.date() if isinstance(v, _dt.datetime) else v)
    if base == "time":
        return T.format_time(v)
    if _is_binary(col):
        b = bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else str(v).encode("utf-8")
        return base64.b64encode(b).decode("ascii")
    if base == "json" and not isinstance(v, str):
        return orjson.dumps(v).decode()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8")
    if not isinstance(v, str):
        raise ValueError(f"column {col.name!r}: cannot encode {type(v).__name__} as {base}")
    return v


def _avro_value(col: Column, v: Any, time_zone: str) -> Any:
    """Python value -> the Avro union value TiCDC's simple encoder writes (ticdc encodeValue4Avro), in
    fastavro's (branch name, value) tuple notation."""
    if v is None:
        return None
    base = _base(col)
    if base == "timestamp":
        return (AVRO_TIMESTAMP, {"location": time_zone, "value": V.format_datetime(v)})
    if base == "bigint" and col.unsigned:
        n = _check_int(v, col)
        return (AVRO_UNSIGNED_BIGINT, {"value": n - _U64 if n >= 2**63 else n})
    if base in ("enum", "set") and isinstance(v, str):
        raise ValueError(f"column {col.name!r}: the simple protocol sends ENUM/SET as ordinal integers")
    if base == "bit":
        n = V.bits_to_int(bytes(v)) if isinstance(v, (bytes, bytearray)) else _check_int(v, col)
        return ("string", str(n))
    if base in _INT_RANGES:
        return ("long", _i64(_check_int(v, col)))  # SET bitmasks above 2**63: TiCDC's GetInt64 bits
    if base == "float":
        return ("float", float(v))
    if base == "double":
        return ("double", float(v))
    if _is_binary(col):
        b = bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else str(v).encode("utf-8")
        return ("bytes", b)
    return ("string", _json_value(col, v, time_zone))


# ---------------------------------------------------------------------------------------------------------
# TiDB's row checksum, from Python values (an implementation independent of applier.codecs.checksum)
# ---------------------------------------------------------------------------------------------------------

_TEXT_HASHED = frozenset({"decimal", "date", "datetime", "timestamp", "time", "json"})


def _utc_text(v: Any, time_zone: str) -> str:
    """A TIMESTAMP (wall clock in ``time_zone``) -> the UTC text TiDB hashes (same fraction as the wire)."""
    if isinstance(v, str) or time_zone.upper() == "UTC":
        return V.format_datetime(v)
    from zoneinfo import ZoneInfo

    u = v.replace(tzinfo=ZoneInfo(time_zone)).astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return V.format_datetime(u)


def tidb_checksum_bytes(col: Column, v: Any, time_zone: str = "UTC") -> bytes:
    """What one column value adds to TiDB's row checksum: uint64/float64 little-endian for numbers, 4-byte
    little-endian length + text or bytes for the rest, nothing for NULL (TiDB appendDatumForChecksum)."""
    if v is None:
        return b""
    base = _base(col)
    if base in _INT_RANGES:  # integers, year, bit, enum ordinal, set bitmask
        n = V.bits_to_int(bytes(v)) if isinstance(v, (bytes, bytearray)) else v
        return struct.pack("<Q", n % _U64)
    if base in ("float", "double"):
        f = T.float32(v) if base == "float" else float(v)
        return struct.pack("<d", f if math.isfinite(f) else 0.0)
    if base == "vector":
        items = orjson.loads(v) if isinstance(v, str) else list(v)
        return struct.pack("<I", len(items)) + b"".join(struct.pack("<f", x) for x in items)
    if base in ("null", "geometry"):
        return b""
    if base in _TEXT_HASHED:
        if base == "timestamp":
            text = _utc_text(v, time_zone)
        elif base == "json" and not isinstance(v, str):
            text = orjson.dumps(v).decode()
        else:
            text = _json_value(col, v, time_zone)
        data = text.encode()
    else:
        data = bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else str(v).encode("utf-8")
    return struct.pack("<I", len(data)) + data


def tidb_row_checksum(columns: Iterable[Column], row: Mapping[str, Any], time_zone: str = "UTC") -> int:
    """CRC32 (IEEE) over the columns in the given order (column-id order); absent columns count as NULL."""
    crc = 0
    for c in columns:
        crc = zlib.crc32(tidb_checksum_bytes(c, row.get(c.name), time_zone), crc)
    return crc


def _checksum_object(checksum: bool | Mapping[str, Any], columns: Iterable[Column], data: dict | None,
                     old: dict | None, time_zone: str) -> dict[str, Any]:
    """The DML ``checksum`` object: computed (``True``; the old row is ``old`` completed from ``data``, as TiDB
    has it), or the given fields (a Mapping, for crafted messages) with TiCDC's defaults for the rest."""
    if isinstance(checksum, Mapping):
        out = {"version": 1, "corrupted": False, "current": 0, "previous": 0}
        out.update(checksum)
        return out
    cols = list(columns)
    current = tidb_row_checksum(cols, data, time_zone) if data is not None else 0
    previous = tidb_row_checksum(cols, {**(data or {}), **old}, time_zone) if old is not None else 0
    return {"version": 1, "corrupted": False, "current": current, "previous": previous}


def _table_schema_json(ts: TableSchema, table_id: int) -> dict:
    columns = []
    for c in ts.columns:
        base = _base(c)
        binary_cs = base in _NUMERIC_SCHEMA_TYPES or base in T.BINARY_TYPES or base in T.TEMPORAL_TYPES \
            or base == "json"
        dt: dict[str, Any] = {"mysqlType": base, "charset": "binary" if binary_cs else "utf8mb4",
                              "collate": "binary" if binary_cs else "utf8mb4_bin"}
        length = _DEFAULT_LENGTH.get(base, 0)
        if length:
            dt["length"] = length
        dt.update(_declared_parts(c))
        if c.unsigned and base in _NUMERIC_SCHEMA_TYPES:
            dt["unsigned"] = True
        columns.append({"name": c.name, "dataType": dt, "nullable": c.nullable, "default": None})
    return {"schema": ts.schema, "table": ts.table, "tableID": table_id, "version": ts.version,
            "columns": columns, "indexes": _indexes(ts.columns)}


def _declared_parts(c: Column) -> dict[str, Any]:
    """dataType's ``length``/``decimal``/``elements`` from the column's declared full type (as TiCDC fills them
    from the real column type: DECIMAL(12,2) -> length 12, decimal 2; DATETIME(6) -> decimal 6)."""
    if not c.declared:
        return {}
    from applier.ddl.lexer import Cursor, Statement
    from applier.ddl.syntax import parse_type

    t = parse_type(Cursor(Statement.lex(c.declared).sig))
    args = [int(a) for a in t.args]
    out: dict[str, Any] = {}
    if t.name in ("enum", "set"):
        out["elements"] = list(t.values)
    elif t.name == "decimal" and args:
        out["length"] = args[0]
        out["decimal"] = args[1] if len(args) > 1 else 0
    elif t.name in T.FSP_TYPES and args:
        out["decimal"] = args[0]
    elif t.name in T.LENGTH_TYPES and args:
        out["length"] = args[0]
    return out


def _indexes(columns: tuple[Column, ...]) -> list[dict]:
    """Key columns -> the primary index; every other unique column -> a one-column unique index (the event
    model keeps per-column flags, not the index definitions)."""
    out = []
    keys = [c.name for c in columns if c.key]
    if keys:
        out.append({"name": "primary", "unique": True, "primary": True, "nullable": False, "columns": keys})
    for c in columns:
        if c.unique and not c.key:
            out.append({"name": f"uk_{c.name}", "unique": True, "primary": False, "nullable": c.nullable,
                        "columns": [c.name]})
    return out


def _table_schema_avro(ts: TableSchema, table_id: int) -> dict:
    j = _table_schema_json(ts, table_id)
    cols = []
    for c, jc in zip(ts.columns, j["columns"]):
        base = _base(c)
        jd = jc["dataType"]
        numeric = base in _NUMERIC_SCHEMA_TYPES
        dt = {"mysqlType": jd["mysqlType"], "charset": jd["charset"], "collate": jd["collate"],
              "length": jd.get("length", 0),
              "decimal": jd.get("decimal", 0 if base in ("decimal", "timestamp") else None),
              "elements": jd.get("elements"), "unsigned": c.unsigned if numeric else None,
              "zerofill": False if numeric else None}
        cols.append({"name": c.name, "dataType": dt, "nullable": c.nullable, "default": None})
    return {"database": ts.schema, "table": ts.table, "tableID": table_id, "version": _i64(ts.version),
            "columns": cols, "indexes": j["indexes"]}


def _i64(v: int) -> int:
    """uint64 -> the int64 with the same bits (TiCDC's ``int64(x)`` for Avro longs)."""
    return v - _U64 if v >= 2**63 else v


def _now_ms() -> int:
    return int(time.time() * 1000)


def _avro_bytes(payload_name: str, kind: str, body: dict) -> bytes:
    import fastavro

    bio = io.BytesIO()
    fastavro.schemaless_writer(bio, _parsed_schemas()[0], (AVRO_MESSAGE, {"type": kind,
                                                                           "payload": (payload_name, body)}))
    return bio.getvalue()


def encode_bootstrap(table_schema: TableSchema, *, encoding_format: str = "json", table_id: int = 0,
                     build_ts_ms: int | None = None) -> tuple[bytes | None, bytes]:
    """A BOOTSTRAP message for a table schema -> (key, value); the key is always None."""
    build = _now_ms() if build_ts_ms is None else build_ts_ms
    if encoding_format == "json":
        return None, _dumps({"version": PROTOCOL_VERSION, "type": MSG_BOOTSTRAP, "commitTs": 0, "buildTs": build,
                             "tableSchema": _table_schema_json(table_schema, table_id)})
    if encoding_format == "avro":
        return None, _avro_bytes(AVRO_BOOTSTRAP, MSG_BOOTSTRAP, {
            "version": PROTOCOL_VERSION, "buildTs": build,
            "tableSchema": _table_schema_avro(table_schema, table_id)})
    raise ValueError(f"encoding_format must be 'json' or 'avro', got {encoding_format!r}")


def encode_simple(
    event: Any,
    *,
    encoding_format: str = "json",
    table_schema: TableSchema | None = None,
    pre_table_schema: TableSchema | None = None,
    schema_version: int | None = None,
    table_id: int = 0,
    build_ts_ms: int | None = None,
    time_zone: str = "UTC",
    checksum: bool | Mapping[str, Any] = False,
    compression: str = "none",
    large_message: LargeMessage | None = None,
) -> tuple[bytes | None, bytes]:
    """One RowChange / DDL / Resolved / TableSchema -> (key, value) as TiCDC's simple encoder writes it.

    The key is always None (TiCDC sends simple messages without a key). A TableSchema becomes a BOOTSTRAP.
    For a RowChange, ``table_schema`` (if given) supplies the column types and the schema version, else the
    event's ``columns`` and ``schema_version`` (default 0) are used; ``schema_version`` wins when both are
    given. For a DDL, ``table_schema``/``pre_table_schema`` are the table after/before it, and ``ddl_type`` may
    be a Simple type name or a TiDB action code. ``build_ts_ms`` pins ``buildTs`` (wall clock otherwise),
    ``time_zone`` is the TIMESTAMP ``location`` (the changefeed's time-zone), ``table_id`` the physical table
    id. Field order, omitted empty fields, sorted row keys and Go's HTML escaping follow encoding/json.
    ``checksum=True`` attaches the row checksums TiCDC sends with ``integrity-check-level = "correctness"``
    (computed by :func:`tidb_row_checksum` over the columns in schema order); a Mapping attaches exactly those
    ``checksum`` fields (``version``, ``corrupted``, ``current``, ``previous``).

    Large messages (ticdc pkg/sink/codec/simple/encoder.go ``AppendRowChangedEvent``, message.go
    ``newDMLMessage``): ``compression`` ("snappy"/"lz4", ``large-message-handle-compression``) compresses every
    value, BOOTSTRAP and DDL included; a row message ``large_message`` finds too large (compressed value + sarama's
    record overhead, TiCDC's count) is sent with ``handleKeyOnly: true`` and only the handle-key columns in
    ``data``/``old`` (the checksum kept), plus ``claimCheckLocation`` after the full compressed value went to the
    claim-check storage with a nil key.
    """
    opts = dict(encoding_format=encoding_format, table_schema=table_schema, pre_table_schema=pre_table_schema,
                schema_version=schema_version, table_id=table_id, build_ts_ms=build_ts_ms, time_zone=time_zone,
                checksum=checksum)
    key, value = _encode_simple(event, **opts)
    value = compress(compression, value)
    if isinstance(event, RowChange) and large_message is not None \
            and large_message.too_large(event, len(value) + MAX_RECORD_OVERHEAD):
        location = None
        if large_message.claim:
            assert large_message.claim_check is not None
            location = large_message.claim_check.write(None, value)
        _, small = _encode_simple(event, **opts, only_handle_key=True, claim_check_location=location)
        value = compress(compression, small)
    return key, value


def _encode_simple(
    event: Any,
    *,
    encoding_format: str = "json",
    table_schema: TableSchema | None = None,
    pre_table_schema: TableSchema | None = None,
    schema_version: int | None = None,
    table_id: int = 0,
    build_ts_ms: int | None = None,
    time_zone: str = "UTC",
    checksum: bool | Mapping[str, Any] = False,
    only_handle_key: bool = False,
    claim_check_location: str | None = None,
) -> tuple[bytes | None, bytes]:
    if encoding_format not in ("json", "avro"):
        raise ValueError(f"encoding_format must be 'json' or 'avro', got {encoding_format!r}")
    avro = encoding_format == "avro"
    build = _now_ms() if build_ts_ms is None else build_ts_ms
    if isinstance(event, TableSchema):
        return encode_bootstrap(event, encoding_format=encoding_format, table_id=table_id, build_ts_ms=build)
    if isinstance(event, Resolved):
        if avro:
            return None, _avro_bytes(AVRO_WATERMARK, MSG_WATERMARK, {
                "version": PROTOCOL_VERSION, "commitTs": _i64(event.ts), "buildTs": build})
        return None, _dumps({"version": PROTOCOL_VERSION, "type": MSG_WATERMARK, "commitTs": event.ts,
                             "buildTs": build})
    if isinstance(event, DDL):
        dtype = simple_ddl_type(event.ddl_type)
        if avro:
            body = {"version": PROTOCOL_VERSION, "type": dtype, "sql": event.query,
                    "commitTs": _i64(event.commit_ts), "buildTs": build,
                    "tableSchema": None if table_schema is None else _table_schema_avro(table_schema, table_id),
                    "preTableSchema": None if pre_table_schema is None else _table_schema_avro(pre_table_schema,
                                                                                               table_id)}
            return None, _avro_bytes(AVRO_DDL, MSG_DDL, body)
        msg: dict[str, Any] = {"version": PROTOCOL_VERSION, "type": dtype}
        if event.query:
            msg["sql"] = event.query
        msg["commitTs"] = event.commit_ts
        msg["buildTs"] = build
        if table_schema is not None:
            msg["tableSchema"] = _table_schema_json(table_schema, table_id)
        if pre_table_schema is not None:
            msg["preTableSchema"] = _table_schema_json(pre_table_schema, table_id)
        return None, _dumps(msg)
    if not isinstance(event, RowChange):
        raise TypeError(f"cannot encode {type(event).__name__} in the simple protocol")

    e = event
    cols = {c.name: c for c in (table_schema.columns if table_schema is not None else e.columns)}
    version = schema_version if schema_version is not None else (
        table_schema.version if table_schema is not None else 0)
    if e.op is Op.DELETE:
        dtype, data, old = "DELETE", None, e.before
        if old is None:
            raise ValueError("DELETE without a before image")
    elif e.op is Op.INSERT or e.before is None:
        dtype, data, old = "INSERT", e.after, None
        if data is None:
            raise ValueError("INSERT without an after image")
    else:
        dtype, data, old = "UPDATE", e.after, e.before
        if data is None:
            raise ValueError("UPDATE without an after image")
    conv = _avro_value if avro else _json_value

    def image(row: dict) -> dict:
        out = {}
        for name in sorted(row):
            col = cols.get(name)
            if col is None:
                raise ValueError(f"value for column {name!r} has no Column metadata")
            out[name] = conv(col, row[name], time_zone)
        return out

    def handle_key(row: dict | None) -> dict | None:  # formatColumns with onlyHandleKey
        if row is None or not only_handle_key:
            return row
        out = {n: v for n, v in row.items() if n in cols and cols[n].key}
        if not out:
            raise ValueError("handle-key-only: the row has no handle-key column")
        return out

    cs = None if checksum is False else _checksum_object(checksum, cols.values(), data, old, time_zone)
    data, old = handle_key(data), handle_key(old)
    data_img = None if data is None else image(data)
    old_img = None if old is None else image(old)
    if avro:
        body = {"version": PROTOCOL_VERSION, "database": e.schema, "table": e.table, "tableID": table_id,
                "type": dtype, "commitTs": _i64(e.commit_ts), "buildTs": build, "schemaVersion": _i64(version),
                "claimCheckLocation": claim_check_location, "handleKeyOnly": True if only_handle_key else None,
                "checksum": cs, "data": data_img, "old": old_img}
        return None, _avro_bytes(AVRO_DML, MSG_DML, body)
    msg = {"version": PROTOCOL_VERSION}
    if e.schema:
        msg["database"] = e.schema
    if e.table:
        msg["table"] = e.table
    if table_id:
        msg["tableID"] = table_id
    msg["type"] = dtype
    msg["commitTs"] = e.commit_ts
    msg["buildTs"] = build
    if version:
        msg["schemaVersion"] = version
    if claim_check_location:
        msg["claimCheckLocation"] = claim_check_location
    if only_handle_key:
        msg["handleKeyOnly"] = True
    if cs is not None:
        msg["checksum"] = cs
    if data_img is not None:
        msg["data"] = data_img
    if old_img is not None:
        msg["old"] = old_img
    return None, _dumps(msg)
