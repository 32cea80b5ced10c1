"""The values of a Dumpling export as the event model's Python values, per upstream column type.

:mod:`applier.dumpling` reads a data file into lexical values: None (NULL), str (a string's content, or a
number's digits), bytes (a hex or ``_binary`` literal) and :class:`~applier.dumpling.BitLiteral`. This module
turns each into what a decoder hands the writers for the same upstream value (``applier/events.py``), using the
same MySQL text parsers (:mod:`applier.mysql_values`), so the target's value converters
(``Dialect.value_converter``, applied by ``Sink.adapt_rows``) see exactly what replication gives them:

=================================  ============================================================================
integers, YEAR                     ``int`` (a ``b'..'`` literal too)
FLOAT, DOUBLE / DECIMAL            ``float`` / ``Decimal`` (scale kept)
DATE, DATETIME, TIMESTAMP, TIME    ``date`` / ``datetime`` (naive; TIMESTAMP as written, read as UTC like
                                   TiCDC's default) / ``timedelta``; zero dates stay their text
CHAR .. LONGTEXT, ENUM, SET, JSON  ``str`` (ENUM/SET by member names); bytes that are not UTF-8 are refused
BINARY, VARBINARY, BLOBs           ``bytes``: hex literals as they are, CSV text as its raw bytes
BIT(n)                             ``int``: the raw big-endian bytes Dumpling writes (``x'..'`` in SQL, the bytes
                                   themselves in CSV)
GEOMETRY                           refused (the applier does not replicate it either)
=================================  ============================================================================
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from applier import mysql_values as T
from applier.dumpling import BitLiteral, SourceColumn, has_undecodable, to_bytes

__all__ = ["column_converter", "row_function", "first_error"]

Converter = Callable[[Any], Any]


def _kind(v: Any) -> str:
    if isinstance(v, BitLiteral):
        return "a bit-value literal"
    return "a hex/binary literal" if isinstance(v, bytes) else type(v).__name__


def _text_only(parse: Callable[[str], Any]) -> Converter:
    def conv(v: Any) -> Any:
        if type(v) is str:
            return parse(v)
        raise T.ConversionError(f"expected text, found {_kind(v)}")
    return conv


def _int(v: Any) -> int:
    if type(v) is str:
        return int(v)
    if isinstance(v, BitLiteral):
        return int(v)
    raise T.ConversionError(f"expected an integer, found {_kind(v)}")


T.set_fast_form(_int, str, int)


def _text(v: Any) -> str:
    if type(v) is str:
        return v
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            raise T.ConversionError("a hex literal that is not UTF-8 text") from None
    raise T.ConversionError(f"expected text, found {_kind(v)}")


T.set_fast_form(_text, str)


def _checked_text(v: Any) -> str:
    s = _text(v)
    if has_undecodable(s):
        raise T.ConversionError("bytes that are not UTF-8 in a text column (export it with --params "
                                "character_set_results=utf8mb4, or fix the upstream value)")
    return s


def _binary(v: Any) -> bytes:
    if type(v) is bytes:
        return v
    if type(v) is str:
        return to_bytes(v)
    raise T.ConversionError(f"expected binary data, found {_kind(v)}")


T.set_fast_form(_binary, bytes)


def _bit(v: Any) -> int:
    if isinstance(v, int):  # b'0101'
        return int(v)
    if type(v) is bytes:
        return int.from_bytes(v, "big")
    if type(v) is str:  # CSV: the value's raw bytes
        return int.from_bytes(to_bytes(v), "big")
    raise T.ConversionError(f"expected a BIT value, found {_kind(v)}")


def _unsupported(name: str) -> Converter:
    def conv(v: Any) -> Any:
        raise T.ConversionError(f"{name.upper()} columns cannot be loaded (the applier does not replicate them "
                                "either): leave the table out of the routes")
    return conv


def column_converter(col: SourceColumn, *, checked: bool = False) -> Converter:
    """The converter for one upstream column; ``checked``: the file had bytes that are not UTF-8, so text
    values are checked for them (the check costs, and is only needed then)."""
    base = col.type
    if base in T.INTEGER_TYPES or base == "year":
        return _int
    if base == "bit":
        return _bit
    if base in T.BINARY_TYPES:
        return _binary
    if base in T.STRING_TYPES:
        return _checked_text if checked else _text
    if base in ("geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
                "geometrycollection", "geomcollection"):
        return _unsupported(base)
    try:
        return _text_only(T.text_converter(base, unsigned=col.unsigned))
    except T.ConversionError:
        return _unsupported(base)


def row_function(names: Sequence[str], cols: Sequence[SourceColumn], *, checked: bool = False
                 ) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """A function from a row's lexical values (in ``cols`` order) to ``{name: value}``: generated once per file
    shape by :func:`applier.mysql_values.row_converter` (the codecs' own row builder)."""
    return T.row_converter(tuple(names), tuple(column_converter(c, checked=checked) for c in cols))


def first_error(cols: Sequence[SourceColumn], values: Sequence[Any], *, checked: bool = False
                ) -> tuple[SourceColumn, Any, str] | None:
    """The first value of a row that does not convert: (its column, the value, why); None when all do."""
    for col, v in zip(cols, values):
        if v is None:
            continue
        try:
            column_converter(col, checked=checked)(v)
        except (ValueError, TypeError, ArithmeticError, OverflowError) as exc:
            return col, v, str(exc) or type(exc).__name__
    return None
