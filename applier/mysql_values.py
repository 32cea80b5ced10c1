"""MySQL value semantics: text in MySQL's own format -> the Python values of the event model, shared by the
codecs (every protocol) and the sinks (TIME text, zero dates).

Every TiCDC protocol eventually hands over column values either as JSON scalars or as text in MySQL's own
textual format ("2020-02-20 02:20:20.123", "-838:59:59", "129012.1230000", ...). This module turns that text
into the Python values the event model promises (see :mod:`applier.events`), so each protocol module only has
to deal with its own framing and its own quirks (base64, Go string quoting, ISO-8859-1 byte mapping, ordinal
ENUM/SET, ...). The way back (Python value -> TiCDC's text) belongs to the test encoders
(:mod:`applier.devtools.encoders.values`); only :func:`format_time` is here, for the sinks.

Type names are the lower-case MySQL names without parameters, as :class:`applier.events.Column` carries them
("tinyint", "varchar", "decimal", "datetime", ...). :func:`split_mysql_type` turns a full column type such as
``"decimal(10,2) unsigned zerofill"`` or ``"enum('a','b')"`` into that name plus the unsigned flag.

Value mapping (text -> Python):

=========================================  ==========================================================
integers (tinyint .. bigint), year         ``int`` (any size; BIGINT UNSIGNED up to 2**64-1 is exact)
decimal                                    ``Decimal`` (exact, the scale of the text is kept)
float, double                              ``float`` (NaN and infinities are rejected: MySQL has none)
char, varchar, *text, enum, set, json,     ``str`` (JSON stays text; ENUM/SET stay their text form here,
vector                                     protocols that send ordinals convert themselves)
binary, varbinary, *blob (or any string    ``bytes``; text -> bytes uses ``binary_encoding`` (ISO-8859-1
type with the binary flag)                 by default: one character per byte)
bit                                        ``int``: every TiCDC protocol sends BIT as its unsigned integer
                                           value (TiCDC encodes bits as integers to dodge tidb#10988)
date                                       ``datetime.date``
datetime, timestamp                        ``datetime.datetime`` (naive, microseconds kept)
time                                       ``datetime.timedelta`` (negative and > 24h allowed)
null                                       ``None``
=========================================  ==========================================================

Zero dates: TiDB (like MySQL without NO_ZERO_DATE / NO_ZERO_IN_DATE) stores '0000-00-00',
'0000-00-00 00:00:00' and dates with a zero month or day ('2020-00-15'). Python's date/datetime cannot
represent them (year, month and day start at 1), and mapping them to None or to some sentinel date would
silently change the data. They are therefore returned as the *original string*; a writer can pass the string
straight to MySQL/MariaDB (which accept it under a permissive sql_mode) or apply its target's policy
(PostgreSQL has no zero date). Any other invalid date ('2020-02-30') is an error.
"""

from __future__ import annotations

import binascii
import datetime as _dt
import math
import struct
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any, Callable, Iterable


__all__ = [
    "ConversionError",
    "INTEGER_TYPES",
    "FLOAT_TYPES",
    "DECIMAL_TYPES",
    "TEMPORAL_TYPES",
    "STRING_TYPES",
    "BINARY_TYPES",
    "TEXT_TO_BINARY",
    "KNOWN_TYPES",
    "canonical_type_name",
    "split_mysql_type",
    "binary_type_name",
    "is_binary_type",
    "text_converter",
    "convert_text",
    "parse_int",
    "parse_float",
    "parse_decimal",
    "parse_date",
    "parse_datetime",
    "parse_time",
    "format_time",
    "float32",
    "shortest_float32",
    "is_zero_date",
    "b64decode_strict",
    "set_fast_form",
    "conversion_expr",
    "generated_function",
    "row_converter",
]


class ConversionError(ValueError):
    """A value that is not valid text for its MySQL type."""


# ---------------------------------------------------------------------------------------------------------
# Type names
# ---------------------------------------------------------------------------------------------------------

INTEGER_TYPES = frozenset({"tinyint", "smallint", "mediumint", "int", "bigint"})
FLOAT_TYPES = frozenset({"float", "double"})
DECIMAL_TYPES = frozenset({"decimal"})
NUMERIC_TYPES = INTEGER_TYPES | FLOAT_TYPES | DECIMAL_TYPES
TEMPORAL_TYPES = frozenset({"date", "datetime", "timestamp", "time", "year"})
STRING_TYPES = frozenset(
    {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "json", "vector"}
)
BINARY_TYPES = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
#: the binary twin of each character type: what a column of that type with the binary charset/flag is
TEXT_TO_BINARY = {
    "char": "binary",
    "varchar": "varbinary",
    "tinytext": "tinyblob",
    "text": "blob",
    "mediumtext": "mediumblob",
    "longtext": "longblob",
}
OTHER_TYPES = frozenset({"bit", "null", "geometry"})
KNOWN_TYPES = NUMERIC_TYPES | TEMPORAL_TYPES | STRING_TYPES | BINARY_TYPES | OTHER_TYPES

_ALIASES = {
    "integer": "int",
    "int1": "tinyint",
    "int2": "smallint",
    "int3": "mediumint",
    "middleint": "mediumint",
    "int4": "int",
    "int8": "bigint",
    "bool": "tinyint",
    "boolean": "tinyint",
    "numeric": "decimal",
    "dec": "decimal",
    "fixed": "decimal",
    "real": "double",
    "float4": "float",
    "float8": "double",
    "character": "char",
    "nchar": "char",
    "nvarchar": "varchar",
    "var_string": "varchar",  # MySQL wire type for VARCHAR
    "string": "char",
    "long": "mediumtext",
}


def canonical_type_name(name: str) -> str:
    """Lower-case, alias-resolved MySQL type name ("INTEGER" -> "int", "numeric" -> "decimal")."""
    n = name.strip().lower()
    return _ALIASES.get(n, n)


@lru_cache(maxsize=4096)
def split_mysql_type(spec: str) -> tuple[str, bool]:
    """Split a MySQL column type into (canonical name, unsigned).

    ``"decimal(10,2) unsigned zerofill"`` -> ``("decimal", True)``; ``"int(10) unsigned"`` -> ``("int", True)``;
    ``"enum('a','b')"`` -> ``("enum", False)``; ``"double precision"`` -> ``("double", False)``.
    ZEROFILL implies UNSIGNED in MySQL. Only numeric types can be unsigned, so words inside ENUM/SET
    member lists never count.
    """
    s = spec.strip().lower()
    cut = len(s)
    for i, ch in enumerate(s):
        if ch == "(" or ch == " ":
            cut = i
            break
    base = canonical_type_name(s[:cut])
    unsigned = False
    if base in NUMERIC_TYPES:
        rest = s[cut:]
        close = rest.rfind(")")
        tail = rest[close + 1 :] if close >= 0 else rest
        words = tail.split()
        unsigned = "unsigned" in words or "zerofill" in words
    return base, unsigned


def binary_type_name(type_name: str, binary: bool) -> str:
    """The type name a column really has once its binary flag is applied (varchar + binary -> varbinary)."""
    if binary:
        return TEXT_TO_BINARY.get(type_name, type_name)
    return type_name


def is_binary_type(type_name: str) -> bool:
    return type_name in BINARY_TYPES


#: types whose one parameter is a length (characters, bytes or bits) and those whose parameter is fractional seconds
LENGTH_TYPES = frozenset({"char", "varchar", "binary", "varbinary", "bit"})
FSP_TYPES = frozenset({"datetime", "timestamp", "time"})


def declared_type(base: str, *, length: int | None = None, scale: int | None = None,
                  elements: tuple[str, ...] | list[str] = (), unsigned: bool = False) -> str | None:
    """A column's full MySQL type from the parts a protocol sends separately (Simple's dataType, Avro's
    connect.parameters, Debezium's parameters), as :attr:`applier.events.Column.declared`; None when the parts
    add nothing to the type name. ``length`` is a length for :data:`LENGTH_TYPES` and the precision of DECIMAL;
    ``scale`` is DECIMAL's scale and the fractional seconds of :data:`FSP_TYPES`. ENUM/SET members are written as
    MySQL string literals (quotes doubled, backslashes escaped), so the text parses back to exactly them."""
    params = ""
    if base in ("enum", "set"):
        if not elements:
            return None
        params = "(" + ",".join("'" + m.replace("\\", "\\\\").replace("'", "''") + "'" for m in elements) + ")"
    elif base == "decimal" and length is not None:
        params = f"({int(length)},{int(scale or 0)})"
    elif base in LENGTH_TYPES and length is not None:
        params = f"({int(length)})"
    elif base in FSP_TYPES and scale is not None:
        params = f"({int(scale)})"
    if not params:
        return None  # the type name and Column.unsigned say it all
    return base + params + (" unsigned" if unsigned and base in NUMERIC_TYPES else "")


# ---------------------------------------------------------------------------------------------------------
# Parsers: text -> Python value. Each raises ValueError (usually ConversionError) or TypeError on bad input.
# ---------------------------------------------------------------------------------------------------------


def parse_int(text: str) -> int:
    """Decimal integer text -> int. Any size (BIGINT UNSIGNED 18446744073709551615 stays exact)."""
    if type(text) is int:
        return text
    if type(text) is not str:
        raise TypeError(f"expected integer text, got {type(text).__name__}")
    return int(text)


def parse_float(text: str) -> float:
    v = float(text)
    if v - v != 0.0:  # NaN or +-inf
        raise ConversionError(f"{text!r} is not a finite number")
    return v


def parse_decimal(text: str) -> Decimal:
    """Exact decimal text -> Decimal; the scale is kept ("1.500" stays Decimal("1.500"))."""
    if type(text) is not str:
        if type(text) is int:
            return Decimal(text)
        raise TypeError(f"expected decimal text, got {type(text).__name__}")
    try:
        d = Decimal(text)
    except InvalidOperation:
        raise ConversionError(f"{text!r} is not a decimal number") from None
    if not d.is_finite():
        raise ConversionError(f"{text!r} is not a finite decimal")
    return d


def _digits(s: str) -> bool:
    return s.isdigit() and s.isascii()


_date_fromiso = _dt.date.fromisoformat
_datetime_fromiso = _dt.datetime.fromisoformat


def is_zero_date(text: str) -> bool:
    """True for MySQL zero dates / dates with a zero part ('0000-00-00', '2020-00-01 ...')."""
    if len(text) < 10 or text[4] != "-" or text[7] != "-":
        return False
    y, m, d = text[0:4], text[5:7], text[8:10]
    if not (_digits(y) and _digits(m) and _digits(d)):
        return False
    return y == "0000" or m == "00" or d == "00"


def parse_date(text: str) -> _dt.date | str:
    """'YYYY-MM-DD' -> date. Zero dates come back as the original string (see module docstring)."""
    if type(text) is not str:
        raise TypeError(f"expected date text, got {type(text).__name__}")
    # text[4:8:3] is text[4] + text[7]: one slice instead of two index tests (this runs once per value)
    if len(text) != 10 or text[4:8:3] != "--":
        raise ConversionError(f"{text!r} is not a date (YYYY-MM-DD)")
    try:
        return _date_fromiso(text)  # fast path; the shape check above rules out other ISO forms
    except ValueError:
        pass
    y, m, d = text[0:4], text[5:7], text[8:10]
    if not (_digits(y) and _digits(m) and _digits(d)):
        raise ConversionError(f"{text!r} is not a date (YYYY-MM-DD)")
    if y == "0000" or m == "00" or d == "00":
        return text
    try:
        return _dt.date(int(y), int(m), int(d))
    except ValueError as e:
        raise ConversionError(f"{text!r} is not a valid date: {e}") from None


def parse_datetime(text: str) -> _dt.datetime | str:
    """'YYYY-MM-DD HH:MM:SS[.ffffff]' -> naive datetime (fraction kept). Zero dates -> original string."""
    if type(text) is not str:
        raise TypeError(f"expected datetime text, got {type(text).__name__}")
    # The separators sit every third character from index 4 (4, 7, 10, 13, 16 and the fraction's dot at 19),
    # so one extended slice checks them all: this runs once per value and the index-by-index test cost more
    # than fromisoformat itself. The fraction must be 1-6 ASCII digits (fromisoformat would also take a time
    # zone or a comma there).
    n = len(text)
    if n == 19:
        ok = text[4:17:3] == "-- ::"
    elif 21 <= n <= 26:
        frac = text[20:]
        ok = text[4:20:3] == "-- ::." and frac.isdigit() and frac.isascii()
    elif n == 10:  # a date without time part: accept, MySQL does
        d = parse_date(text)
        return d if isinstance(d, str) else _dt.datetime(d.year, d.month, d.day)
    else:
        ok = False
    if not ok:
        raise ConversionError(f"{text!r} is not a datetime (YYYY-MM-DD HH:MM:SS[.ffffff])")
    try:
        return _datetime_fromiso(text)
    except ValueError:
        pass
    if is_zero_date(text):
        hh, mm, ss = text[11:13], text[14:16], text[17:19]
        if _digits(hh) and _digits(mm) and _digits(ss) and int(hh) < 24 and int(mm) < 60 and int(ss) < 60:
            return text
    raise ConversionError(f"{text!r} is not a valid datetime")


def parse_time(text: str) -> _dt.timedelta:
    """MySQL TIME text '[-]H..H:MM:SS[.ffffff]' -> timedelta (negative and > 24 hours allowed)."""
    if type(text) is not str:
        raise TypeError(f"expected time text, got {type(text).__name__}")
    neg = text.startswith("-")
    body = text[1:] if neg else text
    parts = body.split(":")
    if len(parts) != 3:
        raise ConversionError(f"{text!r} is not a time ([-]HH:MM:SS[.ffffff])")
    h, m, s = parts
    frac = ""
    if "." in s:
        s, frac = s.split(".", 1)
        if not (1 <= len(frac) <= 6 and _digits(frac)):
            raise ConversionError(f"{text!r} has a bad fractional part")
    if not (_digits(h) and len(m) == 2 and _digits(m) and len(s) == 2 and _digits(s)):
        raise ConversionError(f"{text!r} is not a time ([-]HH:MM:SS[.ffffff])")
    mi, se = int(m), int(s)
    if mi > 59 or se > 59:
        raise ConversionError(f"{text!r} has minutes or seconds out of range")
    us = int(frac) * 10 ** (6 - len(frac)) if frac else 0
    td = _dt.timedelta(hours=int(h), minutes=mi, seconds=se, microseconds=us)
    return -td if neg else td


def b64decode_strict(text: str) -> bytes:
    """Standard base64 (with padding) -> bytes; anything else is an error (no silent skipping)."""
    if type(text) is not str:
        raise TypeError(f"expected base64 text, got {type(text).__name__}")
    try:
        # what base64.b64decode(text, validate=True) runs after encoding the text to ASCII (Python >= 3.11),
        # without its two Python-level calls; a non-ASCII text raises the same ValueError
        return _a2b_base64(text, strict_mode=True)
    except (ValueError, TypeError) as e:  # binascii.Error is a ValueError
        raise ConversionError(f"invalid base64: {e}") from None


_a2b_base64 = binascii.a2b_base64


def _str(text: str) -> str:
    if type(text) is not str:
        raise TypeError(f"expected text, got {type(text).__name__}")
    return text


# ---------------------------------------------------------------------------------------------------------
# Whole-row conversion. Decoding calls one converter per value, and for a row of mostly integers and strings
# the Python call (plus the dict lookup of the column's converter) costs more than the conversion itself. A
# converter may therefore declare a *fast form*: "for a value of exactly this type, the result is fast(value)
# (or the value itself)". row_converter() builds, once per row shape, a function that applies each column's
# converter with that test inlined, so the common values need no Python call at all.
# ---------------------------------------------------------------------------------------------------------

_FAST_FORM = "fast_form"


def set_fast_form(conv: Callable[[Any], Any], value_type: type, fast: Callable[[Any], Any] | None = None) -> None:
    """Declare that for every ``v`` whose type is exactly ``value_type``, ``conv(v)`` returns ``fast(v)`` (``v``
    itself when ``fast`` is None), and raises exactly when ``fast(v)`` raises (the exception may differ).
    Generated row converters rely on it; tests/unit/test_fast_paths.py checks every declared form."""
    setattr(conv, _FAST_FORM, (value_type, fast))


set_fast_form(parse_int, str, int)  # int(text) is what parse_int runs for text
set_fast_form(_str, str)

#: above this many columns a row converter is a loop (generated code would gain little and compile slowly)
MAX_GENERATED_COLUMNS = 512


def conversion_expr(i: int, conv: Callable[[Any], Any], ns: dict[str, Any]) -> str:
    """Source of an expression converting the local ``v{i}`` with ``conv`` (None stays None), inlining the
    converter's fast form; binds what it names (``c{i}``, ``t{i}``, ``f{i}``) in the namespace ``ns``."""
    v = f"v{i}"
    ns[f"c{i}"] = conv
    form = getattr(conv, _FAST_FORM, None)
    if form is None:
        return f"None if {v} is None else c{i}({v})"
    ns[f"t{i}"] = form[0]
    if form[1] is None:
        return f"{v} if type({v}) is t{i} or {v} is None else c{i}({v})"
    ns[f"f{i}"] = form[1]
    return f"f{i}({v}) if type({v}) is t{i} else None if {v} is None else c{i}({v})"


def generated_function(name: str, src: str, ns: dict[str, Any]) -> Callable[..., Any]:
    """Compile ``src`` (which defines function ``name``) in the namespace ``ns`` and return the function.
    For the codecs' per-shape converters: their source holds only indices and fixed text, never upstream
    names or values (those are bound in ``ns``)."""
    ns.setdefault("type", type)
    exec(compile(src, f"<generated {name}>", "exec"), ns)
    return ns[name]


def row_converter(names: tuple[str, ...], convs: tuple[Callable[[Any], Any], ...]) -> Callable[[Iterable[Any]], dict[str, Any]]:
    """A function taking the values of one row, in ``names`` order (exactly ``len(names)`` of them), and
    returning ``{name: None if v is None else conv(v)}`` in that order. It raises when a converter would (not
    necessarily the same exception: a caller that needs the converter's own error runs the converter again),
    or ValueError for a wrong number of values.

    The function is generated: one local per column and each converter's fast form (see :func:`set_fast_form`)
    inlined, e.g. ``int(v3) if type(v3) is t3 else None if v3 is None else c3(v3)``. Only indices enter the
    generated source; the column names, types and converters are bound as variables of its namespace, so no
    upstream text is ever compiled. Build it once per row shape (it takes ~0.1 ms) and cache it.
    """
    n = len(names)
    if n != len(convs):
        raise ValueError(f"{n} names but {len(convs)} converters")
    if n > MAX_GENERATED_COLUMNS:
        pairs = tuple(zip(names, convs))

        def convert_loop(values: Iterable[Any]) -> dict[str, Any]:
            vals = tuple(values)
            if len(vals) != n:
                raise ValueError(f"expected {n} values, got {len(vals)}")
            return {name: None if v is None else conv(v) for (name, conv), v in zip(pairs, vals)}

        return convert_loop
    ns: dict[str, Any] = {}
    items = []
    for i, (name, conv) in enumerate(zip(names, convs)):
        ns[f"k{i}"] = name
        items.append(f"k{i}: {conversion_expr(i, conv, ns)}")
    src = (
        "def convert(values):\n"
        f"    [{''.join(f'v{i}, ' for i in range(n))}] = values\n"
        f"    return {{{', '.join(items)}}}\n"
    )
    return generated_function("convert", src, ns)


def _null(_text: str) -> None:
    return None


def _unsupported(type_name: str) -> Callable[[str], Any]:
    def conv(_text: str) -> Any:
        raise ConversionError(f"MySQL type {type_name!r} is not supported")

    return conv


@lru_cache(maxsize=1024)
def text_converter(
    type_name: str, *, unsigned: bool = False, binary: bool = False, binary_encoding: str = "latin-1"
) -> Callable[[str], Any]:
    """A function turning MySQL text of this type into its Python value (see the module table).

    ``type_name`` may be a full type ("int(10) unsigned"); ``binary`` is the column's binary flag (binary
    charset), which turns character types into their binary twins. ``binary_encoding`` says how a protocol
    maps bytes to text for binary columns (ISO-8859-1: one character per byte, as Canal does). The returned
    function raises ValueError (ConversionError) or TypeError on bad input; a type this module does not know
    raises ConversionError here. Converters are cached: build them once per column, not per value.
    """
    # ``unsigned`` does not change the conversion (Python ints are exact at any size); it is accepted so
    # callers can pass the column's flags as they have them.
    base, _ = split_mysql_type(type_name)
    base = binary_type_name(base, binary)
    if base in INTEGER_TYPES or base == "year" or base == "bit":
        return parse_int
    if base in FLOAT_TYPES:
        return parse_float
    if base in DECIMAL_TYPES:
        return parse_decimal
    if base == "date":
        return parse_date
    if base in ("datetime", "timestamp"):
        return parse_datetime
    if base == "time":
        return parse_time
    if base in STRING_TYPES:
        return _str
    if base in BINARY_TYPES:
        enc = binary_encoding

        def to_bytes(text: str) -> bytes:
            return text.encode(enc)

        return to_bytes
    if base == "null":
        return _null
    if base == "geometry":
        return _unsupported(base)
    raise ConversionError(f"unknown MySQL type {type_name!r}")


def convert_text(
    type_name: str,
    text: str | None,
    *,
    unsigned: bool = False,
    binary: bool = False,
    binary_encoding: str = "latin-1",
) -> Any:
    """Convert one value; None stays None. Raises ConversionError for anything invalid."""
    if text is None:
        return None
    conv = text_converter(type_name, unsigned=unsigned, binary=binary, binary_encoding=binary_encoding)
    try:
        return conv(text)
    except ConversionError:
        raise
    except (ValueError, TypeError, ArithmeticError) as e:
        raise ConversionError(f"{text!r} is not a valid {type_name} value: {e}") from None


# ---------------------------------------------------------------------------------------------------------
# TIME as text (the sinks write it so), float32 rounding (decoders of FLOAT values)
# ---------------------------------------------------------------------------------------------------------


def format_time(v: _dt.timedelta | str) -> str:
    """timedelta -> TiDB Duration.String() shape '[-]HH:MM:SS[.ffffff]' (hours may exceed 24)."""
    if isinstance(v, str):
        return v
    total_us = (v.days * 86400 + v.seconds) * 1_000_000 + v.microseconds
    sign = "-" if total_us < 0 else ""
    total_us = abs(total_us)
    secs, us = divmod(total_us, 1_000_000)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    out = f"{sign}{h:02d}:{m:02d}:{s:02d}"
    if us:
        out += f".{us:06d}"
    return out


_F32 = struct.Struct("<f")


def float32(v: float) -> float:
    """Round a float to the nearest IEEE single (raises OverflowError beyond the float32 range)."""
    return _F32.unpack(_F32.pack(v))[0]


def shortest_float32(v: float) -> float:
    """The float whose shortest repr identifies float32(v): what Go prints for a float32 (3.14, not
    3.140000104904175). Decoders get this value back from TiCDC's text, so encoders emit it too."""
    f = float32(v)
    if f == 0.0 or not math.isfinite(f):
        return f
    for p in range(1, 10):
        cand = float(f"{f:.{p}g}")
        try:
            if float32(cand) == f:
                return cand
        except OverflowError:  # rounded up past the float32 range (near 3.4e38)
            continue
    return f
