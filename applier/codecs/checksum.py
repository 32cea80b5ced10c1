"""TiCDC's single-row checksum, recomputed from a decoded row so the Simple and Avro decoders can verify it.

Why: with TiDB's ``tidb_enable_row_level_checksum`` and a changefeed with ``[integrity] integrity-check-level =
"correctness"``, TiCDC puts a CRC32 of every row image into Simple and Avro messages (Simple: the ``checksum``
object, ``current`` for ``data`` and ``previous`` for ``old``; Avro: ``_tidb_row_level_checksum`` for the
record's own row). TiCDC's ``corrupted`` flag only says that TiCDC found the row damaged *before* it encoded
the message; a row damaged after that (a broker, a proxy, a bug in a decoder) is only caught by recomputing the
checksum from what arrived. That is what this module does, with no TiDB server involved.

The algorithm (what TiDB computes and TiCDC puts into the message; docs/checksum.md has the full table):

* ``checksum = 0``; for every column of the row, in column-id order: ``checksum = crc32_update(checksum,
  encode(column))`` with the IEEE polynomial. Updating per column equals one CRC32 over the concatenation.
* ``encode`` of a NULL (and of NULL/GEOMETRY typed columns) is no bytes at all, so a column the message leaves
  out (a virtual generated column, which TiCDC never sends) changes nothing.
* integer types, YEAR: the value as uint64 (a negative value by its two's complement bits), 8 bytes
  little-endian; BIT, ENUM (1-based member index), SET (member bitmask): the same.
* FLOAT, DOUBLE: the value as a float64 (a FLOAT is its float32 widened), its IEEE-754 bits as 8 bytes
  little-endian; NaN and infinities count as 0.
* DECIMAL, DATE, DATETIME, TIMESTAMP, TIME, JSON: TiDB's text of the value (``MyDecimal.String()``,
  ``Time.String()`` with the column's fractional digits, ``Duration.String()``, ``BinaryJSON.String()``) as
  4-byte little-endian length + bytes. A TIMESTAMP is first converted from the changefeed's time zone to UTC.
* CHAR..LONGTEXT, BINARY..LONGBLOB: 4-byte little-endian length + the raw bytes (UTF-8 for text).
* VECTOR(FLOAT32): TiDB's serialized vector: 4-byte little-endian element count + each float32 little-endian.

Learnt from (read, not copied):

* TiDB ``pkg/util/rowcodec/common.go``: ``RowData.Checksum`` (CRC32 IEEE, updated per column, columns "sorted
  by id"), ``appendDatumForChecksum`` (the byte encoding per type), ``appendLengthValue``; the expected bytes per
  type in ``rowcodec_test.go`` ``TestColumnEncode`` and the per-column == whole-row CRC in ``TestRowChecksum``.
  ``pkg/types/vector.go``: ``VectorFloat32.SerializeTo`` (count + float32 data).
* tiflow ``cdc/entry/mounter.go``: ``calculateColumnChecksum`` (visible columns sorted by column id, checksum
  computed with the changefeed's time zone, which makes TIMESTAMP text UTC) and ``mountRowKVEntry`` /
  ``verifyChecksum`` (the checksum sent is this column-level one for checksum versions 0, 1 and 2; 0 means
  "none"); pingcap/ticdc ``pkg/common/event/checksum.go`` (same functions; its columns come in table order).
* tiflow ``pkg/sink/codec/common/verify_checksum.go``: ``calculateChecksum`` / ``buildChecksumBytes`` (TiCDC's
  own consumer-side verification), ``examples/golang/avro-checksum-verification/main.go``
  (``CalculateAndVerifyChecksum``: Avro fields are already in column-id order; ENUM/SET names -> numbers via
  ``allowed``; TIMESTAMP converted to UTC); ``pkg/sink/codec/avro/avro.go`` ``value2AvroSchema`` (fields sorted
  by column id when checksums are on) and ``nativeValueWithExtension``; ``pkg/sink/codec/simple/message.go``
  (``checksum{version, corrupted, current, previous}``).
* pingcap/docs ``ticdc/ticdc-integrity-check.md`` ("Algorithm for checksum calculation").

Column order: the message's order is used (Avro: the schema's fields, which TiCDC sorts by column id; Simple:
the table schema's columns). TiDB/tiflow hash in column-id order and pingcap/ticdc in table order; the two differ
only after DDL such as ``ADD COLUMN ... FIRST/AFTER`` or a ``MODIFY COLUMN`` that rewrites a column (it gets a
new, higher id). :func:`verify_row` therefore also accepts the orders that differ from the message's by one
column moved to the end or the last column moved elsewhere (the shape one such DDL leaves); anything else is a
mismatch. The extra orders are tried only after a mismatch, and they raise the chance of a damaged row passing
from 1 in 2**32 to about 2n in 2**32 for an n-column table.
"""

from __future__ import annotations

import datetime as _dt
import math
import struct
import zlib
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping, Sequence

import orjson

from applier import mysql_values as T

__all__ = [
    "ChecksumColumn",
    "ChecksumError",
    "UTC",
    "encode_value",
    "resolve_zone",
    "row_checksum",
    "timestamp_in_utc",
    "verify_row",
]

UTC = _dt.timezone.utc
MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1
#: above this many columns a mismatch is reported without trying the reordered column orders
MAX_REORDER_COLUMNS = 1024

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_F32 = struct.Struct("<f")
_NOTHING = b""


class ChecksumError(ValueError):
    """A value the checksum cannot be computed for (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class ChecksumColumn:
    """One column as the checksum sees it: its name in the row, its event-model type name (``Column.type_name``,
    e.g. "bigint", "varbinary", "timestamp") and, for ENUM/SET values that arrive as member names (Avro), the
    members in definition order."""

    name: str
    type_name: str
    elements: tuple[str, ...] = ()


# ---------------------------------------------------------------------------------------------------------
# time zones and TIMESTAMP text
# ---------------------------------------------------------------------------------------------------------

_UTC_NAMES = frozenset({"utc", "etc/utc", "z", "+00:00", "gmt", "etc/gmt"})


@lru_cache(maxsize=64)
def resolve_zone(name: str) -> _dt.tzinfo:
    """A TiCDC time-zone name (Go ``Location.String()``: "UTC" or an IANA name such as "Asia/Shanghai") ->
    tzinfo. "Local"/"System" name the TiCDC host's zone, which a consumer cannot know: ChecksumError."""
    if not isinstance(name, str):
        raise ChecksumError(f"time zone must be a string, got {type(name).__name__}")
    if name.strip().lower() in _UTC_NAMES:
        return UTC
    if name.strip().lower() in ("", "local", "system"):
        raise ChecksumError(
            f"time zone {name!r} is the TiCDC host's local zone, which the applier cannot know: start TiCDC "
            "with an explicit --tz (e.g. --tz=Asia/Shanghai) or UTC"
        )
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ChecksumError(f"unknown time zone {name!r} ({e}); use an IANA name such as 'Asia/Shanghai'") from None


def timestamp_in_utc(text: str, zone: _dt.tzinfo) -> str:
    """TIMESTAMP text in ``zone`` -> the same instant as UTC text, keeping the fractional digits as written
    (TiDB ``Time.ConvertTimeZone`` then ``Time.String()``). Zero dates stay as they are (TiDB skips them)."""
    if zone is UTC or T.is_zero_date(text):
        return text
    head, dot, frac = text.partition(".")
    try:
        local = _dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ChecksumError(f"TIMESTAMP {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction]'") from None
    try:
        u = local.replace(tzinfo=zone).astimezone(UTC)
    except (OverflowError, ValueError) as e:
        raise ChecksumError(f"TIMESTAMP {text!r} cannot be converted to UTC: {e}") from None
    return f"{u.year:04d}-{u.month:02d}-{u.day:02d} {u.hour:02d}:{u.minute:02d}:{u.second:02d}{dot}{frac}"


# ---------------------------------------------------------------------------------------------------------
# per-type encodings (TiDB appendDatumForChecksum)
# ---------------------------------------------------------------------------------------------------------


def _length_value(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


def _int(v: Any) -> int:
    if type(v) is not int:
        raise ChecksumError(f"expected an integer, got {type(v).__name__}")
    return v


def _enc_int(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    return _U64.pack(_int(v) & MASK64)


def _enc_bit(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    if isinstance(v, (bytes, bytearray)):
        raw = bytes(v).lstrip(b"\x00")
        # TiDB BinaryLiteral.ToInt: more than 8 significant bytes truncate to the uint64 maximum
        return _U64.pack(MASK64 if len(raw) > 8 else int.from_bytes(raw, "big"))
    return _U64.pack(_int(v) & MASK64)


def _member_index(name: str, elements: tuple[str, ...]) -> int | None:
    """0-based index of an ENUM/SET member (exact, then case-insensitive as MySQL's collations compare)."""
    try:
        return elements.index(name)
    except ValueError:
        pass
    folded = name.casefold()
    for i, e in enumerate(elements):
        if e.casefold() == folded:
            return i
    return None


def _enc_enum(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    if type(v) is not str:
        return _U64.pack(_int(v) & MASK64)
    i = _member_index(v, col.elements)
    if i is None:
        if v == "":  # the empty "error" value MySQL stores for an invalid ENUM: index 0
            return _U64.pack(0)
        raise ChecksumError(f"ENUM value {v!r} is not one of the members {list(col.elements)!r}")
    return _U64.pack(i + 1)


def _enc_set(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    if type(v) is not str:
        return _U64.pack(_int(v) & MASK64)
    mask = 0
    if v:
        for name in v.split(","):
            i = _member_index(name, col.elements)
            if i is None:
                raise ChecksumError(f"SET value {v!r}: {name!r} is not one of the members {list(col.elements)!r}")
            mask |= 1 << i
    return _U64.pack(mask & MASK64)


def _float(v: Any) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise ChecksumError(f"expected a number, got {type(v).__name__}")


def _enc_double(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    f = _float(v)
    return _F64.pack(f if math.isfinite(f) else 0.0)


def _enc_float(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    f = _float(v)
    if not math.isfinite(f):
        return _F64.pack(0.0)
    try:
        f32 = _F32.unpack(_F32.pack(f))[0]  # the float32 TiDB holds, widened back to float64
    except (OverflowError, struct.error):
        raise ChecksumError(f"{f!r} is out of range for FLOAT") from None
    return _F64.pack(f32)


def _enc_decimal(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    if isinstance(v, Decimal):
        if not v.is_finite():
            raise ChecksumError(f"{v} is not a finite decimal")
        text = format(v, "f")  # plain digits, scale kept: TiDB's MyDecimal.String()
    elif type(v) is str:
        text = v
    elif type(v) is int:
        text = str(v)
    else:
        raise ChecksumError(f"expected a Decimal, got {type(v).__name__}")
    return _length_value(text.encode("ascii", "surrogateescape"))


def _date_text(v: Any) -> str:
    if type(v) is str:
        return v
    if isinstance(v, _dt.date):
        return f"{v.year:04d}-{v.month:02d}-{v.day:02d}"
    raise ChecksumError(f"expected a date, got {type(v).__name__}")


def _datetime_text(v: Any) -> str:
    """TiDB text for a DATETIME/TIMESTAMP value. Text is used as it is (it carries the column's fractional
    digits); a Python datetime can only be written with 6 digits when it has a fraction (exact for fsp 0 and 6)."""
    if type(v) is str:
        return v
    if isinstance(v, _dt.datetime):
        s = f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
        return s + f".{v.microsecond:06d}" if v.microsecond else s
    if isinstance(v, _dt.date):
        return _date_text(v) + " 00:00:00"
    raise ChecksumError(f"expected a datetime, got {type(v).__name__}")


def _enc_date(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    if isinstance(v, _dt.datetime):
        v = v.date()
    return _length_value(_date_text(v).encode("ascii", "surrogateescape"))


def _enc_datetime(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    return _length_value(_datetime_text(v).encode("ascii", "surrogateescape"))


def _enc_timestamp(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    return _length_value(timestamp_in_utc(_datetime_text(v), zone).encode("ascii", "surrogateescape"))


def _enc_time(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    if isinstance(v, _dt.timedelta):
        v = T.format_time(v)
    elif type(v) is not str:
        raise ChecksumError(f"expected a time, got {type(v).__name__}")
    return _length_value(v.encode("ascii", "surrogateescape"))


def _enc_bytes(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    if type(v) is str:
        return _length_value(v.encode("utf-8", "surrogatepass"))
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _length_value(bytes(v))
    raise ChecksumError(f"expected text or bytes, got {type(v).__name__}")


def _enc_vector(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    if type(v) is str:
        try:
            items = orjson.loads(v)
        except orjson.JSONDecodeError:
            raise ChecksumError(f"VECTOR {v[:60]!r} is not a JSON array of numbers") from None
    else:
        items = v
    if not isinstance(items, (list, tuple)) or any(type(x) not in (int, float) for x in items):
        raise ChecksumError(f"VECTOR {str(v)[:60]!r} is not an array of numbers")
    try:
        return _U32.pack(len(items)) + struct.pack(f"<{len(items)}f", *items)
    except (OverflowError, struct.error):
        raise ChecksumError(f"VECTOR {str(v)[:60]!r} has an element out of the float32 range") from None


def _enc_nothing(v: Any, col: ChecksumColumn, zone: _dt.tzinfo) -> bytes:
    return _NOTHING


_Encoder = Callable[[Any, ChecksumColumn, _dt.tzinfo], bytes]

_ENCODERS: dict[str, _Encoder] = {
    **{t: _enc_int for t in ("tinyint", "smallint", "mediumint", "int", "bigint", "year")},
    "bit": _enc_bit,
    "enum": _enc_enum,
    "set": _enc_set,
    "float": _enc_float,
    "double": _enc_double,
    "decimal": _enc_decimal,
    "date": _enc_date,
    "datetime": _enc_datetime,
    "timestamp": _enc_timestamp,
    "time": _enc_time,
    **{t: _enc_bytes for t in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json")},
    **{t: _enc_bytes for t in T.BINARY_TYPES},
    "vector": _enc_vector,
    "null": _enc_nothing,
    "geometry": _enc_nothing,
}


def _encoder_for(type_name: str) -> _Encoder:
    enc = _ENCODERS.get(type_name)
    if enc is None:
        enc = _ENCODERS.get(T.canonical_type_name(type_name))
    if enc is None:
        raise ChecksumError(f"MySQL type {type_name!r} has no checksum encoding")
    return enc


def encode_value(column: ChecksumColumn, value: Any, *, time_zone: _dt.tzinfo = UTC) -> bytes:
    """The bytes one column value adds to the checksum (no bytes for NULL). ``time_zone`` is the zone TIMESTAMP
    values are written in (the changefeed's). Raises ChecksumError naming the column."""
    if value is None:
        return _NOTHING
    try:
        return _encoder_for(column.type_name)(value, column, time_zone)
    except ChecksumError as e:
        raise ChecksumError(f"column {column.name!r} ({column.type_name}): {e}") from None


# ---------------------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------------------


def _parts(columns: Sequence[ChecksumColumn], row: Mapping[str, Any], zone: _dt.tzinfo) -> list[bytes]:
    get = row.get
    return [encode_value(c, get(c.name), time_zone=zone) for c in columns]


def row_checksum(columns: Sequence[ChecksumColumn], row: Mapping[str, Any], *,
                 time_zone: _dt.tzinfo = UTC) -> int:
    """CRC32 (IEEE) of a row: the columns in the given order (column-id order), a column missing from ``row``
    counts as NULL. Raises ChecksumError for a value that cannot be encoded."""
    return zlib.crc32(b"".join(_parts(columns, row, time_zone)))


def _reordered(parts: list[bytes]) -> Iterable[int]:
    """Checksums of the column orders one DDL can leave between column-id order and table order: one column
    moved to the end, or the last column moved to an earlier place (see the module docstring)."""
    n = len(parts)
    if n < 2 or n > MAX_REORDER_COLUMNS:
        return
    prefix = [0] * (n + 1)  # CRC of parts[:i]
    for i, p in enumerate(parts):
        prefix[i + 1] = zlib.crc32(p, prefix[i])
    for i in range(n - 1):
        if parts[i]:
            yield zlib.crc32(parts[i], zlib.crc32(b"".join(parts[i + 1:]), prefix[i]))
    last = parts[-1]
    if last:
        for j in range(n - 1):
            yield zlib.crc32(b"".join(parts[j:-1]), zlib.crc32(last, prefix[j]))


def verify_row(columns: Sequence[ChecksumColumn], row: Mapping[str, Any], expected: int, *,
               time_zone: _dt.tzinfo = UTC) -> int | None:
    """None when ``row`` has checksum ``expected`` (in the given column order, or in one of the orders a single
    column-moving DDL leaves, see the module docstring); otherwise the checksum in the given order, for the
    error message. Raises ChecksumError for a value that cannot be encoded."""
    parts = _parts(columns, row, time_zone)
    got = zlib.crc32(b"".join(parts))
    if got == expected:
        return None
    if any(c == expected for c in _reordered(parts)):
        return None
    return got
