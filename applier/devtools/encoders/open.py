"""Test fixture: TiCDC's Open Protocol encoder.

Produces the Kafka (key, value) records TiCDC's open-protocol encoder writes (tiflow
pkg/sink/codec/internal/column.go, ticdc pkg/sink/codec/open/codec.go), for the unit tests, the changefeed
generators and the benchmark. The applier itself only decodes (:mod:`applier.codecs.open`), whose constants
this module shares.
"""

from __future__ import annotations

import base64
import datetime as _dt
from typing import Any, Iterable

import orjson

from applier import mysql_values as T
from applier.codecs.open import (
    _BLOB_CODES,
    _DATE_CODES,
    _DATETIME_CODES,
    _DECIMAL_CODES,
    _INT_CODES,
    _STRING_CODES,
    _U64,
    BATCH_VERSION,
    FLAG_BINARY,
    FLAG_GENERATED,
    FLAG_HANDLE_KEY,
    FLAG_NULLABLE,
    FLAG_PRIMARY_KEY,
    FLAG_UNIQUE_KEY,
    FLAG_UNSIGNED,
    MESSAGE_TYPE_DDL,
    MESSAGE_TYPE_RESOLVED,
    MESSAGE_TYPE_ROW,
    TYPE_BIT,
    TYPE_BLOB,
    TYPE_DATE,
    TYPE_DATETIME,
    TYPE_DOUBLE,
    TYPE_DURATION,
    TYPE_ENUM,
    TYPE_FLOAT,
    TYPE_GEOMETRY,
    TYPE_INT24,
    TYPE_JSON,
    TYPE_LONG,
    TYPE_LONG_BLOB,
    TYPE_LONGLONG,
    TYPE_MEDIUM_BLOB,
    TYPE_NAMES,
    TYPE_NEWDECIMAL,
    TYPE_NULL,
    TYPE_SET,
    TYPE_SHORT,
    TYPE_STRING,
    TYPE_TIMESTAMP,
    TYPE_TINY,
    TYPE_TINY_BLOB,
    TYPE_VARCHAR,
    TYPE_VECTOR_FLOAT32,
    TYPE_YEAR,
)
from applier.devtools.encoders import values as V
from applier.devtools.encoders.largemsg import MAX_RECORD_OVERHEAD, LargeMessage, compress
from applier.events import DDL, Column, Op, Resolved, RowChange


#: type name -> type code, as TiCDC puts it on the wire (the encoder's map)
TYPE_CODES: dict[str, int] = {
    "tinyint": TYPE_TINY,
    "smallint": TYPE_SHORT,
    "mediumint": TYPE_INT24,
    "int": TYPE_LONG,
    "bigint": TYPE_LONGLONG,
    "float": TYPE_FLOAT,
    "double": TYPE_DOUBLE,
    "decimal": TYPE_NEWDECIMAL,
    "null": TYPE_NULL,
    "timestamp": TYPE_TIMESTAMP,
    "date": TYPE_DATE,
    "time": TYPE_DURATION,
    "datetime": TYPE_DATETIME,
    "year": TYPE_YEAR,
    "varchar": TYPE_VARCHAR,
    "varbinary": TYPE_VARCHAR,
    "char": TYPE_STRING,
    "binary": TYPE_STRING,
    "bit": TYPE_BIT,
    "vector": TYPE_VECTOR_FLOAT32,
    "json": TYPE_JSON,
    "enum": TYPE_ENUM,
    "set": TYPE_SET,
    "tinytext": TYPE_TINY_BLOB,
    "tinyblob": TYPE_TINY_BLOB,
    "mediumtext": TYPE_MEDIUM_BLOB,
    "mediumblob": TYPE_MEDIUM_BLOB,
    "longtext": TYPE_LONG_BLOB,
    "longblob": TYPE_LONG_BLOB,
    "text": TYPE_BLOB,
    "blob": TYPE_BLOB,
}

_VERSION_HEADER = _U64.pack(BATCH_VERSION)


# ---------------------------------------------------------------------------------------------------------
# Go string quoting (strconv.Quote), used for binary CHAR/VARCHAR values
# ---------------------------------------------------------------------------------------------------------

_QUOTE_NAMED = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v",
                '"': '\\"', "\\": "\\\\"}


def go_quote(data: bytes) -> str:
    """Go's ``strconv.Quote(string(data))`` without the surrounding quotes (what TiCDC sends for binary
    CHAR/VARCHAR): printable UTF-8 kept, ``\\a``-style escapes, ``\\xHH`` for control bytes and for bytes that
    are not valid UTF-8, ``\\uHHHH``/``\\UHHHHHHHH`` for other non-printable characters."""
    s = data.decode("utf-8", "surrogateescape")
    if s.isprintable() and '"' not in s and "\\" not in s:
        return s
    out = []
    for ch in s:
        named = _QUOTE_NAMED.get(ch)
        if named is not None:
            out.append(named)
            continue
        cp = ord(ch)
        if 0xDC80 <= cp <= 0xDCFF:  # an undecodable byte, kept by surrogateescape
            out.append(f"\\x{cp - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif cp < 0x20 or cp == 0x7F:
            out.append(f"\\x{cp:02x}")
        elif cp < 0x10000:
            out.append(f"\\u{cp:04x}")
        else:
            out.append(f"\\U{cp:08x}")
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------
# Encoder
# ---------------------------------------------------------------------------------------------------------


_dumps = V.go_json_dumps


def column_type_code(col: Column) -> int:
    """The type code TiCDC sends for a column (raises ValueError for an unknown type name)."""
    if col.type_code is not None and col.type_code in TYPE_NAMES and col.type_code != TYPE_GEOMETRY:
        # only trust a code that agrees with the type name (a canal sqlType is not an open type code)
        names = TYPE_NAMES[col.type_code]
        if T.canonical_type_name(col.type_name) in names:
            return col.type_code
    name = T.canonical_type_name(col.type_name)
    code = TYPE_CODES.get(name)
    if code is None:
        raise ValueError(f"column {col.name!r}: type {col.type_name!r} has no open protocol type code")
    return code


def column_flags(col: Column) -> int:
    """TiCDC column flags for a Column: key -> HandleKey|PrimaryKey, unique (non-key) -> UniqueKey."""
    name = T.canonical_type_name(col.type_name)
    f = 0
    if col.binary or name in T.BINARY_TYPES:
        f |= FLAG_BINARY
    if col.key:
        f |= FLAG_HANDLE_KEY | FLAG_PRIMARY_KEY
    elif col.unique:
        f |= FLAG_UNIQUE_KEY
    if col.generated:
        f |= FLAG_GENERATED
    if col.nullable:
        f |= FLAG_NULLABLE
    if col.unsigned:
        f |= FLAG_UNSIGNED
    return f


def _as_bytes(v: Any) -> bytes:
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    raise ValueError(f"expected bytes or str, got {type(v).__name__}")


def _as_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).decode("utf-8", "replace")
    raise ValueError(f"expected str, got {type(v).__name__}")


def encode_value(code: int, flags: int, v: Any) -> Any:
    """Python value -> the JSON value TiCDC writes for this type code/flags."""
    if v is None:
        return None
    if code in _INT_CODES:
        if code in (TYPE_ENUM, TYPE_SET) and isinstance(v, str):
            raise ValueError("the open protocol sends ENUM/SET as their ordinal integers, got a name")
        if code == TYPE_BIT and isinstance(v, (bytes, bytearray)):
            return V.bits_to_int(bytes(v))
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected int, got {type(v).__name__}")
        return v
    if code == TYPE_FLOAT:
        return T.shortest_float32(float(v))
    if code == TYPE_DOUBLE:
        return float(v)
    if code in _DECIMAL_CODES:
        return V.format_decimal(v)
    if code in _DATE_CODES:
        if isinstance(v, _dt.datetime):
            v = v.date()
        return V.format_date(v)
    if code in _DATETIME_CODES:
        return V.format_datetime(v)
    if code == TYPE_DURATION:
        return T.format_time(v)
    if code == TYPE_JSON:
        return v if isinstance(v, str) else orjson.dumps(v).decode()
    if code == TYPE_VECTOR_FLOAT32:
        return _as_text(v)
    if code in _STRING_CODES:
        if flags & FLAG_BINARY:
            return go_quote(_as_bytes(v))
        return _as_text(v)
    if code in _BLOB_CODES:
        return base64.b64encode(_as_bytes(v)).decode("ascii")
    if code == TYPE_NULL:
        return None
    raise ValueError(f"cannot encode type code {code}")


def _encode_image(values: dict, columns: dict[str, Column]) -> dict:
    out = {}
    for name, v in values.items():
        col = columns.get(name)
        if col is None:
            raise ValueError(f"value for column {name!r} has no Column metadata")
        code = column_type_code(col)
        flags = column_flags(col)
        c: dict[str, Any] = {"t": code}
        if col.key:
            c["h"] = True
        c["f"] = flags
        c["v"] = encode_value(code, flags, v)
        out[name] = c
    return out


def _encode_event(e: Any, output_old_value: bool = True, only_output_updated_columns: bool = False,
                  delete_only_handle_key: bool = False, only_handle_key: bool = False) -> tuple[bytes, bytes]:
    if isinstance(e, Resolved):
        return _dumps({"ts": e.ts, "t": MESSAGE_TYPE_RESOLVED}), b""
    if isinstance(e, DDL):
        key: dict[str, Any] = {"ts": e.commit_ts}
        if e.schema:
            key["scm"] = e.schema
        if e.table:
            key["tbl"] = e.table
        key["t"] = MESSAGE_TYPE_DDL
        ddl_type = e.ddl_type if isinstance(e.ddl_type, int) and not isinstance(e.ddl_type, bool) else 0
        return _dumps(key), _dumps({"q": e.query, "t": ddl_type})
    if isinstance(e, RowChange):
        key = {"ts": e.commit_ts}
        if e.schema:
            key["scm"] = e.schema
        if e.table:
            key["tbl"] = e.table
        key["t"] = MESSAGE_TYPE_ROW
        cols = {c.name: c for c in e.columns}
        if only_handle_key:  # a large message's handle-key-only image (codec.go largeMessageOnlyHandleKeyColumns)
            keys = {c.name for c in e.columns if c.key}
            if not keys:
                raise ValueError("handle-key-only: the row has no handle-key column")
            e = RowChange(e.schema, e.table, e.commit_ts, e.op,
                          None if e.before is None else {n: v for n, v in e.before.items() if n in keys},
                          None if e.after is None else {n: v for n, v in e.after.items() if n in keys},
                          e.columns, e.position)
        if e.op is Op.DELETE:
            if e.before is None:
                raise ValueError("delete without a before image")
            before = e.before
            if delete_only_handle_key:
                before = {n: v for n, v in before.items() if n in cols and cols[n].key}
                if not before:
                    raise ValueError("delete-only-output-handle-key-columns: the row has no handle-key column")
            value = {"d": _encode_image(before, cols)}
        elif e.op is Op.INSERT:
            if e.after is None:
                raise ValueError("insert without an after image")
            value = {"u": _encode_image(e.after, cols)}
        elif e.op is Op.UPDATE:
            if e.after is None:
                raise ValueError("update without an after image")
            value = {"u": _encode_image(e.after, cols)}
            if e.before is not None and output_old_value:
                pre = _encode_image(e.before, cols)
                if only_output_updated_columns:
                    # TiCDC's dropNotUpdatedColumns: drop from "p" what equals "u" (same type, same value)
                    u = value["u"]
                    pre = {n: c for n, c in pre.items() if n not in u or u[n]["t"] != c["t"] or u[n]["v"] != c["v"]}
                if pre:  # Go's omitempty: an empty "p" is not written
                    value["p"] = pre
        else:  # pragma: no cover - Op is closed
            raise ValueError(f"unknown op {e.op!r}")
        return _dumps(key), _dumps(value)
    raise TypeError(f"cannot encode {type(e).__name__} in the open protocol")


def frame_open_batch(pairs: Iterable[tuple[bytes, bytes | None]]) -> tuple[bytes, bytes]:
    """Frame already-serialised (key JSON, value JSON or None/b"" for resolved) pairs into one record."""
    kparts = [_VERSION_HEADER]
    vparts = []
    pack = _U64.pack
    for kj, vj in pairs:
        vj = vj or b""
        kparts.append(pack(len(kj)))
        kparts.append(kj)
        vparts.append(pack(len(vj)))
        vparts.append(vj)
    return b"".join(kparts), b"".join(vparts)


def encode_open_batch(events: Iterable[Any], *, output_old_value: bool = True,
                      only_output_updated_columns: bool = False,
                      delete_only_handle_key: bool = False, compression: str = "none",
                      large_message: LargeMessage | None = None) -> tuple[bytes, bytes]:
    """Several RowChange/DDL/Resolved events -> one Kafka (key, value) in TiCDC's batch framing.

    Column JSON follows TiCDC: ``{"t": code, "h": true (handle key only), "f": flags, "v": value}``; columns
    are written in the RowChange's column order (ticdc's encoder; tiflow's sorts them by name). Note that
    TiCDC itself only batches row events; DDL and resolved events travel alone (use :func:`encode_open`).

    Changefeed options, as TiCDC applies them:

    * ``output_old_value=False`` (``enable-old-value=false`` / OpenOutputOldValue off): updates carry no
      ``p``, so they decode as inserts (applied as upserts).
    * ``only_output_updated_columns=True``: ``p`` holds only the columns whose value changed; it is omitted
      when nothing changed.
    * ``delete_only_handle_key=True`` (``delete-only-output-handle-key-columns``): ``d`` holds only the
      handle-key columns.
    * ``compression`` (``large-message-handle-compression``: "snappy"/"lz4"): every row and DDL value is
      compressed (resolved events have no value).
    * ``large_message`` (``large-message-handle-option``, :class:`~applier.devtools.encoders.largemsg.
      LargeMessage`): a row event it finds too large (length = key + compressed value + sarama's record overhead
      + 24, TiCDC's count) is sent with only its handle-key columns and, appended to the key, ``"ohk":true``
      (handle-key-only) or ``"ohk":true,"ohk":false,"ccl":<location>`` (ticdc writes "ohk" twice) after the whole
      event - key ``version + length + key JSON``, value ``length + compressed value`` - went to the claim-check
      storage (ticdc
      pkg/sink/codec/open/encoder.go ``enhancedKeyValue``, codec.go ``encodeRowChangedEvent``).
    """
    pairs = []
    opts = (output_old_value, only_output_updated_columns, delete_only_handle_key)
    for e in events:
        kj, vj = _encode_event(e, *opts)
        if not isinstance(e, Resolved):
            vj = compress(compression, vj)
        if isinstance(e, RowChange) and large_message is not None:
            length = len(kj) + len(vj) + MAX_RECORD_OVERHEAD + 16 + 8
            if large_message.too_large(e, length):
                # ticdc's key writer appends "ohk":true for every large row and then, for a claim-check one,
                # "ohk":false and "ccl" - the key holds "ohk" twice (JSON readers keep the last one). tiflow
                # marshalled a struct instead: no "ohk" at all (omitempty) before "ccl".
                extra = b',"ohk":true'
                if large_message.claim:
                    assert large_message.claim_check is not None
                    location = large_message.claim_check.write(
                        _VERSION_HEADER + _U64.pack(len(kj)) + kj, _U64.pack(len(vj)) + vj)
                    extra += b',"ohk":false,"ccl":' + _dumps(location)
                kj = kj[:-1] + extra + b"}"
                vj = compress(compression, _encode_event(e, *opts, only_handle_key=True)[1])
        pairs.append((kj, vj))
    return frame_open_batch(pairs)


def encode_open(event: Any, **options: Any) -> tuple[bytes, bytes]:
    """One event -> one Kafka (key, value); options as for :func:`encode_open_batch`."""
    return encode_open_batch([event], **options)
