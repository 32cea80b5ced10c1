"""Every value in one canonical form, whichever server it was read from: equal data gives equal values.

Why: the replica does not store the upstream's bytes. PostgreSQL keeps ENUM/SET as text, BIT as ``bit varying``,
JSON as ``jsonb`` (key order and spacing normalised), TIME as ``interval``, zero dates as ``-infinity``
(docs/value-rules.md), and MariaDB prints a FLOAT with 6 digits. So each server is first asked for a comparable
text where its own is not (dates and datetimes through ``DATE_FORMAT`` / ``to_char``, JSON and BIT as text:
:func:`read_expr`), then every value is brought to one canonical form by :func:`canonical` (one function, used
for both sides): None, int, str or bytes. Pure: no connection.
"""

from __future__ import annotations

import datetime as _dt
import json
from decimal import Decimal
from typing import Any, Callable, Iterable, Sequence

from applier.mysql_values import format_time, is_zero_date, parse_time, shortest_float32

#: Canonical values: what :func:`canonical` returns.
Canon = None | int | str | bytes
Key = tuple[Canon, ...]
Row = tuple[Canon, ...]

#: information_schema DATA_TYPE -> comparison kind (a type not listed is "other": compared by its text).
_KINDS: dict[str, str] = {
    **dict.fromkeys(("tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year", "bool", "boolean",
                     "serial"), "int"),
    **dict.fromkeys(("decimal", "numeric", "dec", "fixed"), "decimal"),
    "float": "float",
    **dict.fromkeys(("double", "real", "double precision"), "double"),
    **dict.fromkeys(("char", "varchar", "tinytext", "text", "mediumtext", "longtext"), "string"),
    "enum": "enum",
    "set": "set",
    **dict.fromkeys(("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"), "binary"),
    "date": "date",
    "datetime": "datetime",
    "timestamp": "timestamp",
    "time": "time",
    "bit": "bit",
    "json": "json",
}

ZERO_DATE = "0000-00-00"
ZERO_DATETIME = "0000-00-00 00:00:00.000000"


def base_type(column_type: str) -> str:
    """``"decimal(10,2) unsigned"`` -> ``"decimal"``; ``"timestamp(6) with time zone"`` -> ``"timestamp"``."""
    t = column_type.strip().lower()
    if t.startswith("double precision"):
        return "double precision"
    for i, ch in enumerate(t):
        if ch in "( ":
            return t[:i]
    return t


def column_kind(data_type: str) -> str:
    """The comparison kind of an upstream column from its ``information_schema`` DATA_TYPE (``"other"`` for
    types compared by their text, e.g. spatial types)."""
    return _KINDS.get(base_type(data_type), "other")


def _decimal_text(d: Decimal) -> str:
    """A decimal without exponent or trailing zeros: DECIMAL(10,2) '1.50' on one side and '1.5' on the other
    are the same number. No context arithmetic (which would round DECIMAL(65,30) to 28 digits)."""
    s = format(d, "f")
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "", "-") else s


def _to_decimal(v: Any) -> Decimal:
    if isinstance(v, Decimal):
        return v
    if isinstance(v, float):
        return Decimal(repr(v))
    return Decimal(str(v))


def _zero(s: str, token: str, collapse: bool) -> str | None:
    """The canonical form of a zero date, or None when ``s`` is not one. PostgreSQL stores every zero date as
    '-infinity', so when the replica is PostgreSQL (``collapse``) all of them compare equal."""
    if s == "-infinity":
        return token
    if is_zero_date(s):
        return token if collapse else s
    return None


def _canon_date(v: Any, collapse: bool) -> Canon:
    if isinstance(v, _dt.datetime):
        v = v.date()
    if isinstance(v, _dt.date):
        return f"{v.year:04d}-{v.month:02d}-{v.day:02d}"
    s = str(v)
    z = _zero(s, ZERO_DATE, collapse)
    return z if z is not None else s


def _canon_datetime(v: Any, collapse: bool) -> Canon:
    if isinstance(v, _dt.datetime):
        if v.tzinfo is not None:
            v = v.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return (f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
                f".{v.microsecond:06d}")
    s = str(v).replace("T", " ", 1)
    z = _zero(s, ZERO_DATETIME, collapse)
    if z is not None:
        return z
    head, dot, frac = s.partition(".")
    if len(head) == 10:  # a date alone
        head += " 00:00:00"
    return f"{head}.{(frac if dot else '')[:6].ljust(6, '0')}"


def _canon_time(v: Any, collapse: bool) -> Canon:
    if isinstance(v, str):
        try:
            v = parse_time(v)
        except Exception:
            return v
    if isinstance(v, _dt.timedelta):
        return format_time(v)
    return str(v)


def _canon_bit(v: Any, collapse: bool) -> Canon:
    if isinstance(v, (bytes, bytearray)):
        return int.from_bytes(v, "big")
    if isinstance(v, str):
        return int(v, 2) if v else 0
    return int(v)


def _canon_float(v: Any, collapse: bool) -> Canon:
    f = _unsigned_zero(float(v))
    try:
        return repr(shortest_float32(f))
    except OverflowError:
        return repr(f)


def _unsigned_zero(f: float) -> float:
    """-0.0 as 0.0: MySQL/MariaDB store every FLOAT/DOUBLE zero as +0 whatever is sent, so a TiDB -0 and its
    replica's 0 are the same value to compare (IEEE addition of +0.0 turns -0.0 into +0.0 and changes nothing
    else)."""
    return f + 0.0


def _canon_string(v: Any, collapse: bool) -> Canon:
    if isinstance(v, (bytes, bytearray)):
        try:
            return bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(v)
    return str(v)


def _canon_binary(v: Any, collapse: bool) -> Canon:
    if isinstance(v, str):
        return v.encode("utf-8")
    return bytes(v)


def _canon_other(v: Any, collapse: bool) -> Canon:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, (int, str)):
        return v
    return str(v)


def canonical_json(value: Any) -> str:
    """JSON text in one form: keys sorted, no spaces, numbers as plain decimals (MySQL's 1.0, jsonb's 1.0 and a
    hand-written 1e0 are one number). Text that is not JSON is kept as it is."""
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            value = json.loads(value, parse_float=Decimal, parse_int=Decimal)
        except (ValueError, RecursionError):
            return value
    try:
        return _json_text(value)
    except RecursionError:
        return str(value)


def _json_text(v: Any) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (Decimal, int, float)):
        return _decimal_text(_to_decimal(v))
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(str(k), ensure_ascii=False) + ":" + _json_text(v[k])
                              for k in sorted(v, key=str)) + "}"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_json_text(x) for x in v) + "]"
    return json.dumps(str(v), ensure_ascii=False)


_CANON: dict[str, Callable[[Any, bool], Canon]] = {
    "int": lambda v, c: int(v),
    "decimal": lambda v, c: _decimal_text(_to_decimal(v)),
    "float": _canon_float,
    "double": lambda v, c: repr(_unsigned_zero(float(v))),
    "string": _canon_string,
    "enum": _canon_string,
    "set": _canon_string,
    "binary": _canon_binary,
    "date": _canon_date,
    "datetime": _canon_datetime,
    "timestamp": _canon_datetime,
    "time": _canon_time,
    "bit": _canon_bit,
    "json": lambda v, c: canonical_json(v),
}


def canonical(value: Any, kind: str, *, collapse_zero_dates: bool = False) -> Canon:
    """One value, as read from either side (after :func:`read_expr`), in the form both sides share: None,
    int, str or bytes. ``collapse_zero_dates``: the replica is PostgreSQL, which keeps no zero date apart."""
    if value is None:
        return None
    if isinstance(value, memoryview):
        value = bytes(value)
    return _CANON.get(kind, _canon_other)(value, collapse_zero_dates)


def _already(kind: str) -> type | None:
    """The driver type whose values of this kind are canonical as they come (the per-row fast path)."""
    return {"int": int, "string": str, "enum": str, "set": str, "binary": bytes}.get(kind)


def _datetime_fast(collapse: bool) -> Callable[[Any], Canon]:
    """DATE_FORMAT/to_char text is canonical unless it is a zero date or '-infinity'."""
    def canon(v: Any) -> Canon:
        if type(v) is str and len(v) == 26 and v[0] != "-" and v[:4] != "0000" and v[5:7] != "00" \
                and v[8:10] != "00":
            return v
        return _canon_datetime(v, collapse)
    return canon


def row_canonicaliser(kinds: Sequence[str], collapse_zero_dates: bool = False) -> Callable[[Sequence[Any]], Row]:
    """:func:`canonical` over a row, with the per-column choices made once per table: values already in
    canonical form (an int of an integer column, a str of a string column...) pass untouched."""
    fns: list[Callable[[Any], Canon]] = []
    for kind in kinds:
        typ, slow = _already(kind), _CANON.get(kind, _canon_other)
        if kind in ("datetime", "timestamp"):
            fns.append(_datetime_fast(collapse_zero_dates))
        elif typ is not None:
            fns.append(lambda v, typ=typ, slow=slow: v if type(v) is typ else slow(bytes(v) if isinstance(
                v, memoryview) else v, collapse_zero_dates))
        else:
            fns.append(lambda v, slow=slow: slow(bytes(v) if isinstance(v, memoryview) else v, collapse_zero_dates))

    def canon_row(values: Sequence[Any]) -> Row:
        return tuple(None if v is None else f(v) for f, v in zip(fns, values))

    return canon_row


def read_expr(flavour: str, col: str, col_type: str) -> str:
    """The select expression for quoted column ``col`` of catalog type ``col_type`` on a server of this
    flavour: a text both sides share where the driver's own values would differ (zero dates and '-infinity',
    which neither driver loads; timestamptz in UTC; MariaDB's 6-digit FLOAT; jsonb and bit strings)."""
    t = col_type.strip().lower()
    b = base_type(t)
    if flavour == "postgresql":
        if b == "date":
            return f"CASE WHEN {col} IS NULL THEN NULL WHEN isfinite({col}) THEN to_char({col}, 'YYYY-MM-DD') " \
                   "ELSE '-infinity' END"
        if b == "timestamp":
            src = f"({col} AT TIME ZONE 'UTC')" if "with time zone" in t else col
            return f"CASE WHEN {col} IS NULL THEN NULL WHEN isfinite({col}) THEN " \
                   f"to_char({src}, 'YYYY-MM-DD HH24:MI:SS.US') ELSE '-infinity' END"
        if b in ("json", "jsonb", "bit"):
            return f"CAST({col} AS text)"
        return col
    if flavour == "tidb" and b in ("date", "datetime", "timestamp"):
        # TiDB's DATE_FORMAT gives NULL for a zero date and for one with a zero month or day, which MySQL and
        # MariaDB print; its CAST prints them, with the column's fractional digits (none, 3, 6...), padded to six
        text = f"CAST({col} AS CHAR)"
        return text if b == "date" else f"RPAD(CONCAT({text}, IF(INSTR({text}, '.') > 0, '', '.')), 26, '0')"
    if b == "date":
        return f"DATE_FORMAT({col}, '%Y-%m-%d')"
    if b in ("datetime", "timestamp"):
        return f"DATE_FORMAT({col}, '%Y-%m-%d %H:%i:%s.%f')"
    if b == "float" and flavour == "mariadb":
        return f"CAST({col} AS DOUBLE)"  # MariaDB's text protocol prints FLOAT with 6 digits
    return col


def sorted_keys(keys: Iterable[Key]) -> list[Key]:
    """Canonical keys in one stable order (values of different types are never compared with each other): the
    order keys are listed in and fix-up statements are written in."""
    return sorted(keys, key=lambda k: tuple((v is None, type(v).__name__, v if v is not None else 0) for v in k))
