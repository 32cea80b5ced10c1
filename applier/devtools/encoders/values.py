"""Test fixture: Python value -> the text and JSON TiCDC's encoders write, shared by the test encoders.

The reverse of :mod:`applier.mysql_values` (whose parsers the decoders use): MySQL text as TiDB prints it
(``Time.String()``, ``MyDecimal.String()``, Go's ``strconv.FormatFloat``), raw BIT bytes -> their integer, and
compact JSON with Go's escaping. TIME text and float32 rounding stay in :mod:`applier.mysql_values` (the sinks
and the decoders use them).
"""

from __future__ import annotations

import datetime as _dt
import math
from decimal import Decimal
from typing import Any

import orjson

from applier.mysql_values import ConversionError, shortest_float32

__all__ = [
    "bits_to_int",
    "format_date",
    "format_datetime",
    "format_decimal",
    "format_float_fixed",
    "go_json_dumps",
]


def bits_to_int(data: bytes) -> int:
    """Raw BIT bytes (big-endian, as MySQL stores them) -> unsigned int."""
    return int.from_bytes(data, "big")


def format_date(v: _dt.date | str) -> str:
    if isinstance(v, str):
        return v
    return f"{v.year:04d}-{v.month:02d}-{v.day:02d}"


def format_datetime(v: _dt.datetime | _dt.date | str) -> str:
    """TiDB's Time.String() shape: 'YYYY-MM-DD HH:MM:SS' plus '.ffffff' when there is a fraction.

    (TiDB prints exactly the column's fsp digits; the event model does not carry fsp, so a fraction is printed
    with 6 digits. The value is the same.)
    """
    if isinstance(v, str):
        return v
    if not isinstance(v, _dt.datetime):
        return format_date(v) + " 00:00:00"
    s = f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
    if v.microsecond:
        s += f".{v.microsecond:06d}"
    return s


def format_decimal(v: Decimal | int | str) -> str:
    """Decimal -> plain (never exponent) text keeping the scale, like TiDB's MyDecimal.String()."""
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v)
    return format(v, "f")


def format_float_fixed(v: float, *, single: bool = False) -> str:
    """Go's strconv.FormatFloat(v, 'f', -1, 32|64): shortest round-trip digits, never an exponent."""
    if single:
        v = shortest_float32(v)
    if not math.isfinite(v):
        raise ConversionError(f"{v!r} is not a finite number")
    r = repr(v)
    if "e" not in r and "E" not in r:
        return r[:-2] if r.endswith(".0") else r
    s = format(Decimal(r), "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s


_LS = "\u2028".encode()
_PS = "\u2029".encode()


def go_json_dumps(obj: Any) -> bytes:
    """Compact JSON as TiCDC's Go encoders write it: like orjson's output, plus Go's default escaping of
    ``<``, ``>``, ``&``, U+2028 and U+2029 (encoding/json and easyjson both do this). The characters can
    only occur inside strings, so a byte replace is safe. Integers must fit in 64 bits (MySQL's do)."""
    data = orjson.dumps(obj)
    if b"<" in data or b">" in data or b"&" in data or b"\xe2\x80" in data:
        data = (
            data.replace(b"<", b"\\u003c")
            .replace(b">", b"\\u003e")
            .replace(b"&", b"\\u0026")
            .replace(_LS, b"\\u2028")
            .replace(_PS, b"\\u2029")
        )
    return data
