"""TiCDC Open Protocol decoder (the test encoder is :mod:`applier.devtools.encoders.open`).

Wire format (one Kafka record may batch several events):

* key   = 8-byte big-endian version (must be 1), then repeated [8-byte BE length + JSON key event]
* value = repeated [8-byte BE length + JSON value event]; the i-th value belongs to the i-th key.
  A resolved event has a zero-length value.

Key event: ``{"ts": commit ts, "scm": schema, "tbl": table, "t": 1 row | 2 DDL | 3 resolved}`` plus the
optional ``ptn`` (physical partition id), ``rid`` (row id), ``ohk`` (only handle-key columns: the row was too
large) and ``ccl`` (claim-check location). Row value: ``{"u": {...}}`` insert (or update with old value
off), ``{"u": {...}, "p": {...}}`` update (``p`` = previous image; with only-output-updated-columns it holds
only the changed columns), ``{"d": {...}}`` delete (all columns, or the handle-key columns only). Each column
is ``{"t": type code, "h": handle key (deprecated), "f": flags, "v": value}``. DDL value: ``{"q": query,
"t": TiDB DDL action type}``.

Values by type code, as TiCDC's encoder writes them (tiflow pkg/sink/codec/internal/column.go, ticdc
pkg/sink/codec/open/codec.go): integers, YEAR, BIT, ENUM (1-based index) and SET (bitmask) as JSON numbers
(BIGINT UNSIGNED up to 2**64-1); FLOAT/DOUBLE as numbers; DECIMAL, DATE/DATETIME/TIMESTAMP, TIME, JSON and
VECTOR as strings; CHAR/VARCHAR as plain text, or, when the Binary flag is set, as Go ``strconv.Quote`` output
without the surrounding quotes (``\\x89PNG\\r\\n``); the TEXT/BLOB family (249-252) as base64 of the bytes.
TiCDC before v4.0.6 (tiflow#870) base64'd CHAR/VARCHAR values too; that output is only readable with
``legacy_base64_strings=True`` because nothing in the message tells the two apart.

Decoding decisions:

* ``u`` without ``p`` -> ``Op.INSERT`` (exactly what TiCDC's own decoder does). With old value off an update
  also looks like this, so writers must apply inserts as upserts (they do: replays must be idempotent).
* ``u`` with ``p`` -> ``Op.UPDATE``; ``before`` is ``u`` overlaid with ``p`` so that an only-updated-columns
  ``p`` still yields a complete old row.
* ``d`` -> ``Op.DELETE`` with ``before`` = ``d`` (possibly only the key columns).
* ``Column.key`` = handle key (``"h": true`` or the HandleKey flag); ``Column.unique`` = primary or unique
  key flag. The physical partition id (``ptn``) and row id are not part of the event model and are dropped.
* Large messages (:mod:`applier.codecs.largemsg`, layouts in docs/large-messages.md): a claim-check row
  (``ccl`` = the file's location, ``ohk`` false, the value holding only the handle-key columns) is replaced by the
  row in the claim-check file (``claim_check_uri``), whose key must name the same table and commit ts; a
  handle-key-only insert/update (``ohk`` true) is completed from the upstream TiDB as of the commit ts (the old
  row of an update as of commit ts - 1) when ``upstream_url`` is set, and is a DecodeError naming that option
  otherwise. A handle-key-only delete is complete (the key is all a delete needs) and decodes as it is. With
  ``large_message_handle_compression`` ("snappy"/"lz4") every row and DDL value is decompressed first (resolved
  events carry no value). Nothing of a message is returned when any of its events fails.
* With ``strict_values=True`` (default) a value that does not fit its column type (a string for a TINYINT,
  bad base64, an impossible date, ...) is a DecodeError. ``strict_values=False`` passes such values through
  unchanged (raw JSON value), as TiCDC's Go decoder does for values of an unexpected JSON type; it exists for
  hand-made test data such as tiflow's Java examples, not for production streams.

Any malformed input raises :class:`applier.events.DecodeError` (protocol "open"); no other exception escapes
:meth:`OpenDecoder.decode`.
"""

from __future__ import annotations

import binascii
import codecs as _codecs
import dataclasses
import functools
import itertools
import operator
import re
import struct
from decimal import Decimal
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from applier import mysql_values as T
from applier.codecs.base import Malformed, guarded_decode
from applier.codecs.largemsg import LargeMessages, UpstreamRow, go_quote_bytes
from applier.columnar import values as V
from applier.columnar.rows import META_TYPES, OP_CODE, ArrowSlice, Shape, build_batch
from applier.events import (
    DDL,
    Column,
    KafkaMessage,
    Op,
    Resolved,
    RowChange,
    SourcePosition,
)

PROTOCOL = "open"
BATCH_VERSION = 1

MESSAGE_TYPE_ROW = 1
MESSAGE_TYPE_DDL = 2
MESSAGE_TYPE_RESOLVED = 3

# Column flag bits: cdc/model/sink.go ColumnFlagType (1 << iota in this order), same as the docs table.
FLAG_BINARY = 0x01
FLAG_HANDLE_KEY = 0x02
FLAG_GENERATED = 0x04
FLAG_PRIMARY_KEY = 0x08
FLAG_UNIQUE_KEY = 0x10
FLAG_MULTIPLE_KEY = 0x20
FLAG_NULLABLE = 0x40
FLAG_UNSIGNED = 0x80

# MySQL / TiDB field type codes (tidb pkg/parser/mysql/type.go).
TYPE_DECIMAL = 0
TYPE_TINY = 1
TYPE_SHORT = 2
TYPE_LONG = 3
TYPE_FLOAT = 4
TYPE_DOUBLE = 5
TYPE_NULL = 6
TYPE_TIMESTAMP = 7
TYPE_LONGLONG = 8
TYPE_INT24 = 9
TYPE_DATE = 10
TYPE_DURATION = 11
TYPE_DATETIME = 12
TYPE_YEAR = 13
TYPE_NEWDATE = 14
TYPE_VARCHAR = 15
TYPE_BIT = 16
TYPE_VECTOR_FLOAT32 = 0xE1
TYPE_JSON = 0xF5
TYPE_NEWDECIMAL = 0xF6
TYPE_ENUM = 0xF7
TYPE_SET = 0xF8
TYPE_TINY_BLOB = 0xF9
TYPE_MEDIUM_BLOB = 0xFA
TYPE_LONG_BLOB = 0xFB
TYPE_BLOB = 0xFC
TYPE_VAR_STRING = 0xFD
TYPE_STRING = 0xFE
TYPE_GEOMETRY = 0xFF

#: type code -> (type name without binary flag, type name with binary flag)
TYPE_NAMES: dict[int, tuple[str, str]] = {
    TYPE_DECIMAL: ("decimal", "decimal"),
    TYPE_TINY: ("tinyint", "tinyint"),
    TYPE_SHORT: ("smallint", "smallint"),
    TYPE_LONG: ("int", "int"),
    TYPE_FLOAT: ("float", "float"),
    TYPE_DOUBLE: ("double", "double"),
    TYPE_NULL: ("null", "null"),
    TYPE_TIMESTAMP: ("timestamp", "timestamp"),
    TYPE_LONGLONG: ("bigint", "bigint"),
    TYPE_INT24: ("mediumint", "mediumint"),
    TYPE_DATE: ("date", "date"),
    TYPE_DURATION: ("time", "time"),
    TYPE_DATETIME: ("datetime", "datetime"),
    TYPE_YEAR: ("year", "year"),
    TYPE_NEWDATE: ("date", "date"),
    TYPE_VARCHAR: ("varchar", "varbinary"),
    TYPE_BIT: ("bit", "bit"),
    TYPE_VECTOR_FLOAT32: ("vector", "vector"),
    TYPE_JSON: ("json", "json"),
    TYPE_NEWDECIMAL: ("decimal", "decimal"),
    TYPE_ENUM: ("enum", "enum"),
    TYPE_SET: ("set", "set"),
    TYPE_TINY_BLOB: ("tinytext", "tinyblob"),
    TYPE_MEDIUM_BLOB: ("mediumtext", "mediumblob"),
    TYPE_LONG_BLOB: ("longtext", "longblob"),
    TYPE_BLOB: ("text", "blob"),
    TYPE_VAR_STRING: ("varchar", "varbinary"),
    TYPE_STRING: ("char", "binary"),
    TYPE_GEOMETRY: ("geometry", "geometry"),
}

_INT_CODES = frozenset({TYPE_TINY, TYPE_SHORT, TYPE_LONG, TYPE_LONGLONG, TYPE_INT24, TYPE_YEAR, TYPE_BIT,
                        TYPE_ENUM, TYPE_SET})
_FLOAT_CODES = frozenset({TYPE_FLOAT, TYPE_DOUBLE})
_DECIMAL_CODES = frozenset({TYPE_DECIMAL, TYPE_NEWDECIMAL})
_DATE_CODES = frozenset({TYPE_DATE, TYPE_NEWDATE})
_DATETIME_CODES = frozenset({TYPE_TIMESTAMP, TYPE_DATETIME})
_STRING_CODES = frozenset({TYPE_VARCHAR, TYPE_VAR_STRING, TYPE_STRING})
_BLOB_CODES = frozenset({TYPE_TINY_BLOB, TYPE_MEDIUM_BLOB, TYPE_LONG_BLOB, TYPE_BLOB})

_U64 = struct.Struct(">Q")
_MAX_EXACT_FLOAT_INT = 2**53
_COLUMN_CACHE_LIMIT = 1 << 16
_SHAPE_CACHE_LIMIT = 4096


_Bad = Malformed  # a reason for a DecodeError; the position is added by guarded_decode


# ---------------------------------------------------------------------------------------------------------
# Go string unquoting (strconv.Unquote), used for binary CHAR/VARCHAR values
# ---------------------------------------------------------------------------------------------------------

_SIMPLE_ESCAPES = {
    "a": 0x07, "b": 0x08, "f": 0x0C, "n": 0x0A, "r": 0x0D, "t": 0x09, "v": 0x0B, "\\": 0x5C, '"': 0x22,
}
_HEX = frozenset("0123456789abcdefABCDEF")
_OCT = frozenset("01234567")


# Text whose every backslash starts one of Go's byte escapes with the meaning Python's bytes escapes give it
# (octal limited to <= 0o377, as Go requires exactly three digits up to 255). Written as runs of plain text
# between escapes, with possessive quantifiers (nothing to backtrack into: an escape starts with the one
# character a run cannot hold), it matches the same texts as (?:[^\\]|\\(?:...))* about 30% faster.
_GO_BYTE_ESCAPES = re.compile(
    r'[^\\]*+(?:\\(?:[abfnrtv\\"]|x[0-9a-fA-F]{2}|[0-3][0-7]{2})[^\\]*+)*+', re.S)


def go_unquote(s: str) -> bytes:
    """Inverse of Go's ``strconv.Quote`` without the surrounding quotes: escaped text -> exact bytes.

    Accepts every escape Go's ``strconv.Unquote`` accepts in a double-quoted string (``\\a \\b \\f \\n \\r
    \\t \\v \\\\ \\" \\xHH \\NNN \\uHHHH \\UHHHHHHHH``); unescaped characters are UTF-8 encoded.
    Raises ValueError on a malformed escape.
    """
    if "\\" not in s:
        return s.encode("utf-8")
    if "\\u" not in s and "\\U" not in s and _GO_BYTE_ESCAPES.fullmatch(s):
        # every escape is one Python's bytes escapes mean the same way: decode them in C (3x faster here)
        return _codecs.escape_decode(s.encode("utf-8"))[0]
    out = bytearray()
    i = 0
    n = len(s)
    while i < n:
        j = s.find("\\", i)
        if j < 0:
            out += s[i:].encode("utf-8")
            break
        if j > i:
            out += s[i:j].encode("utf-8")
        if j + 1 >= n:
            raise ValueError("trailing backslash")
        c = s[j + 1]
        simple = _SIMPLE_ESCAPES.get(c)
        if simple is not None:
            out.append(simple)
            i = j + 2
        elif c == "x":
            h = s[j + 2 : j + 4]
            if len(h) != 2 or not all(ch in _HEX for ch in h):
                raise ValueError(f"bad \\x escape at {j}")
            out.append(int(h, 16))
            i = j + 4
        elif c == "u" or c == "U":
            width = 4 if c == "u" else 8
            h = s[j + 2 : j + 2 + width]
            if len(h) != width or not all(ch in _HEX for ch in h):
                raise ValueError(f"bad \\{c} escape at {j}")
            cp = int(h, 16)
            if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                raise ValueError(f"invalid code point U+{cp:X} at {j}")
            out += chr(cp).encode("utf-8")
            i = j + 2 + width
        elif c in _OCT:
            o = s[j + 1 : j + 4]
            if len(o) != 3 or not all(ch in _OCT for ch in o) or int(o, 8) > 255:
                raise ValueError(f"bad octal escape at {j}")
            out.append(int(o, 8))
            i = j + 4
        else:
            raise ValueError(f"unknown escape \\{c} at {j}")
    return bytes(out)


# ---------------------------------------------------------------------------------------------------------
# Value converters (JSON value -> Python value) per (type code, binary flag)
# ---------------------------------------------------------------------------------------------------------


def _conv_int(v: Any) -> int:
    if type(v) is int:
        return v
    # TiCDC's decoder also takes integral floats; beyond 2**53 a float has already lost digits.
    if type(v) is float and v.is_integer() and abs(v) < _MAX_EXACT_FLOAT_INT:
        return int(v)
    raise ValueError(f"expected an integer, got {type(v).__name__}")


def _conv_float(v: Any) -> float:
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v)
    raise ValueError(f"expected a number, got {type(v).__name__}")


def _conv_decimal(v: Any) -> Decimal:
    if type(v) is str:
        return T.parse_decimal(v)
    if type(v) is int:
        return Decimal(v)
    if type(v) is float:
        return T.parse_decimal(repr(v))
    raise ValueError(f"expected decimal text, got {type(v).__name__}")


def _conv_str(v: Any) -> str:
    if type(v) is str:
        return v
    raise ValueError(f"expected a string, got {type(v).__name__}")


def _conv_go_quoted(v: Any) -> bytes:
    if type(v) is str:
        return go_unquote(v)
    raise ValueError(f"expected a Go-quoted string, got {type(v).__name__}")


def _conv_b64_bytes(v: Any) -> bytes:
    return T.b64decode_strict(v)


def _conv_b64_text(v: Any) -> str:
    try:
        return T.b64decode_strict(v).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"base64 payload of a text column is not UTF-8: {e}") from None


def _conv_null(_v: Any) -> None:
    return None


def _b64_utf8(v: str) -> str:
    return _a2b_base64(v, strict_mode=True).decode("utf-8")


# What each converter runs for a value of the JSON type TiCDC sends (types.set_fast_form): generated row
# converters inline these, so an integer or a string costs no call. A failing fast form (bad base64, a bad Go
# escape) sends the whole image to the per-column path, which raises the converter's own error.
_a2b_base64 = binascii.a2b_base64
T.set_fast_form(_conv_int, int)
T.set_fast_form(_conv_float, float)
T.set_fast_form(_conv_str, str)
T.set_fast_form(_conv_decimal, str, T.parse_decimal)
T.set_fast_form(_conv_go_quoted, str, go_unquote)
T.set_fast_form(_conv_b64_bytes, str, functools.partial(_a2b_base64, strict_mode=True))
T.set_fast_form(_conv_b64_text, str, _b64_utf8)


def _lenient(conv: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """TiCDC's Go decoder leaves values whose JSON type does not fit the column as they are."""

    def lenient(v: Any) -> Any:
        try:
            return conv(v)
        except (ValueError, TypeError, ArithmeticError):
            return v

    return lenient


# decode_arrow: how a converter's column of JSON values becomes an Arrow array (see _ArrowColumns). DECIMAL,
# DATE and DATETIME values are MySQL text, converted and checked by applier.columnar.values (converter given);
# the others are the converter's Python values, in an Arrow type that gives them back unchanged (None: int64,
# else uint64). TIME is a kind applier.columnar.values does not have: its timedelta as duration[us].
TIME_KIND = "time"
_TEXT_KINDS: dict[Callable[[Any], Any], tuple[str, Callable[[Any], Any]]] = {
    _conv_decimal: (V.DECIMAL, T.parse_decimal),
    T.parse_date: (V.DATE, T.parse_date),
    T.parse_datetime: (V.DATETIME, T.parse_datetime),
}
_PY_KINDS: dict[Callable[[Any], Any], tuple[str, Any]] = {
    _conv_int: (V.INT, None),
    _conv_float: (V.FLOAT, pa.float64()),
    _conv_str: (V.STR, pa.string()),
    _conv_go_quoted: (V.BYTES, pa.binary()),
    _conv_b64_bytes: (V.BYTES, pa.binary()),
    _conv_b64_text: (V.STR, pa.string()),
    T.parse_time: (TIME_KIND, pa.duration("us")),
}
_not_none = functools.partial(operator.is_not, None)
_a2b_strict = functools.partial(_a2b_base64, strict_mode=True)
_escape_decode = _codecs.escape_decode
_first = operator.itemgetter(0)


# _GO_BYTE_ESCAPES for Arrow's RE2, on a whole column: the same regular language (literal characters, classes of
# code points, alternation, bounded repetition; no backreference or lookaround, so both engines decide membership
# alike; tests/unit/test_open_arrow.py compares them on random texts)
_GO_BYTE_ESCAPES_RE2 = r'^(?:[^\\]|\\(?:[abfnrtv\\"]|x[0-9a-fA-F]{2}|[0-3][0-7]{2}))*$'


def _go_unquote_all(texts: list[str]) -> list[bytes]:
    """``go_unquote`` of each text: ``escape_decode`` of the UTF-8 as C-level maps for the texts whose every
    backslash starts one of Go's byte escapes that Python's bytes escapes read alike (checked over the whole
    column by Arrow), ``go_unquote`` itself for the others. For such a text both branches of ``go_unquote`` give
    that: its fast branch runs exactly this, and its escape loop decodes each of those escapes to the same byte
    (a backslash before 'u' or 'U' is always one escaped by another)."""
    fast = pc.match_substring_regex(pa.array(texts, pa.string()), _GO_BYTE_ESCAPES_RE2)
    if pc.all(fast).as_py() is not False:  # (None: no texts)
        return list(map(_first, map(_escape_decode, map(str.encode, texts))))
    picks = fast.to_pylist()
    quick = iter(list(map(_first, map(_escape_decode, map(str.encode, itertools.compress(texts, picks))))))
    slow = iter(list(map(go_unquote, itertools.compress(texts, pc.invert(fast).to_pylist()))))
    return list(map(next, map((slow, quick).__getitem__, picks)))


# converter -> what its fast form (T.set_fast_form above) gives for each of a column's values (all of the fast
# form's type, none null), run without a Python call per value: _b64_utf8 is a2b_base64 then a UTF-8 decode. (A
# fast form that is itself a C function, such as _conv_b64_bytes', is mapped as it is.)
_ALL_AT_ONCE: dict[Callable[[Any], Any], Callable[[list], list]] = {
    _conv_go_quoted: _go_unquote_all,
    _conv_b64_text: lambda texts: list(map(bytes.decode, map(_a2b_strict, texts))),
}


def _arrow_kind(conv: Callable[[Any], Any]) -> str | None:
    """The columnar kind of a converter's column, or None when decode_arrow does not take it (TYPE_NULL, the
    lenient converters of strict_values=False)."""
    hit = _TEXT_KINDS.get(conv) or _PY_KINDS.get(conv)
    return None if hit is None else hit[0]


def _py_array(conv: Callable[[Any], Any], values: Sequence[Any]) -> pa.Array:
    """The Arrow array of a _PY_KINDS converter's values: ``None if v is None else conv(v)`` for each, run as
    its fast form (T.set_fast_form) when every value is of the fast form's type, else by the converter itself.
    ``pa.array`` holds str, bytes, float and int (within its 64 bits) as they are and a timedelta as its
    microseconds, so ``to_pylist`` gives back values equal to the converter's, of its type; what does not fit
    raises."""
    typ = _PY_KINDS[conv][1]
    form = getattr(conv, T._FAST_FORM, None)
    types = set(map(type, values))
    nulls = type(None) in types
    types.discard(type(None))
    if form is not None and types <= {form[0]} and form[1] is None:
        py = values  # the values themselves (nulls stay null)
    else:
        valid = list(map(_not_none, values)) if nulls else None
        texts = list(itertools.compress(values, valid)) if nulls else list(values)
        if form is not None and types <= {form[0]}:
            fast = form[1]
            at_once = _ALL_AT_ONCE.get(conv)
            py = at_once(texts) if at_once is not None else list(map(fast, texts))
        else:
            py = list(map(conv, texts))
        if nulls:
            return _with_nulls(_typed_array(py, typ), valid)
    return _typed_array(py, typ)


def _typed_array(py: Sequence[Any], typ: Any) -> pa.Array:
    if typ is not None:
        return pa.array(py, typ)
    try:
        return pa.array(py, pa.int64())
    except (OverflowError, pa.ArrowInvalid):
        return pa.array(py, pa.uint64())  # an unsigned BIGINT; raises for anything else


def _with_nulls(arr: pa.Array, valid: list[bool]) -> pa.Array:
    """``arr`` (the non-null values) spread over ``valid``'s positions, null elsewhere."""
    return arr.take(_spread(np.array(valid, dtype=bool)))


def _spread(mask: Any) -> pa.Array:
    """Indices that spread values kept for ``mask``'s true positions over all of them (``take``): the i-th true
    position takes value i, the others null."""
    return pa.array(np.cumsum(mask) - 1, pa.int64(), mask=~mask)


class _ArrowColumns:
    """The columns of a slice (every group's, both images), converted by kind: DECIMAL, DATE and DATETIME by
    :class:`applier.columnar.values.SliceColumns`, the others by their converter (one conversion per converter
    over all its columns, then sliced back; an integer column beyond int64 converted alone, as uint64)."""

    def __init__(self) -> None:
        self._text = V.SliceColumns()
        self._where: list[tuple[Any, int]] = []  # per column: (converter, its index there) or (None, text index)
        self._py: dict[Callable[[Any], Any], list[Sequence[Any]]] = {}

    def add(self, conv: Callable[[Any], Any], values: Sequence[Any]) -> int:
        text = _TEXT_KINDS.get(conv)
        if text is not None:
            self._where.append((None, self._text.add(text[0], text[1], values)))
        else:
            cols = self._py.setdefault(conv, [])
            self._where.append((conv, len(cols)))
            cols.append(values)
        return len(self._where) - 1

    def convert(self) -> list[pa.Array]:
        """Every column's array; raises (V.Refused, a converter's error, an Arrow error) when one is not exact."""
        text = self._text.convert()
        py: dict[Callable[[Any], Any], list[pa.Array]] = {}
        for conv, cols in self._py.items():
            merged: list[Any] = []
            for c in cols:
                merged.extend(c)
            try:
                whole = _py_array(conv, merged)
                if whole.type == pa.uint64():
                    raise OverflowError("one of the columns is beyond int64")
            except (OverflowError, pa.ArrowInvalid):
                if _PY_KINDS[conv][1] is not None:
                    raise
                py[conv] = [_py_array(conv, c) for c in cols]
                continue
            out, at = [], 0
            for c in cols:
                out.append(whole.slice(at, len(c)))
                at += len(c)
            py[conv] = out
        return [text[i] if conv is None else py[conv][i] for conv, i in self._where]


def _make_converter(code: int, binary: bool, strict: bool, legacy_b64: bool) -> Callable[[Any], Any]:
    if code in _INT_CODES:
        conv = _conv_int
    elif code in _FLOAT_CODES:
        conv = _conv_float
    elif code in _DECIMAL_CODES:
        conv = _conv_decimal
    elif code in _DATE_CODES:
        conv = T.parse_date
    elif code in _DATETIME_CODES:
        conv = T.parse_datetime
    elif code == TYPE_DURATION:
        conv = T.parse_time
    elif code == TYPE_JSON or code == TYPE_VECTOR_FLOAT32:
        conv = _conv_str
    elif code in _STRING_CODES:
        if legacy_b64:
            conv = _conv_b64_bytes if binary else _conv_b64_text
        else:
            conv = _conv_go_quoted if binary else _conv_str
    elif code in _BLOB_CODES:
        conv = _conv_b64_bytes if binary else _conv_b64_text
    elif code == TYPE_NULL:
        return _conv_null
    elif code == TYPE_GEOMETRY:
        raise _Bad("GEOMETRY columns are not supported by TiCDC or this applier")
    else:
        raise _Bad(f"unknown column type code {code}")
    return conv if strict else _lenient(conv)


# ---------------------------------------------------------------------------------------------------------
# Decoder
# ---------------------------------------------------------------------------------------------------------


def _split_frames(buf: bytes, start: int, what: str) -> list[tuple[int, int]]:
    spans = []
    off = start
    n = len(buf)
    unpack = _U64.unpack_from
    while off < n:
        if n - off < 8:
            raise _Bad(f"{what}: truncated length prefix at byte {off} ({n - off} bytes left, need 8)")
        (length,) = unpack(buf, off)
        off += 8
        if length > n - off:
            raise _Bad(
                f"{what}: event length {length} at byte {off - 8} runs past the end ({n - off} bytes left)"
            )
        spans.append((off, length))
        off += length
    return spans


def _loads(mv: memoryview, off: int, length: int, what: str) -> Any:
    try:
        return orjson.loads(mv[off : off + length])
    except orjson.JSONDecodeError as e:
        raise _Bad(f"{what} is not valid JSON: {e}") from None


_ABSENT = object()  # a column object without 'f' / 'h'
_SHAPES_PER_NAMES = 8  # shapes kept per column-name tuple (tables sharing column names, flag variants)


class _Shape(NamedTuple):
    """A row image shape met before: its Column tuple (shared by every image of that shape), its generated
    check-and-convert function (:func:`_image_converter`), each column's converter, and the generated function
    with the same checks that returns the raw values instead (:func:`_image_extractor`, for decode_arrow)."""

    columns: tuple[Column, ...]
    convert: Callable[[Iterable[dict]], dict[str, Any] | None]
    convs: tuple[Callable[[Any], Any], ...]
    extract: Callable[[Iterable[dict]], tuple | None]


def _same(expr: str, name: str, const: Any, ns: dict[str, Any]) -> str:
    """Source testing that ``expr`` is exactly ``const`` (type included: 8.0 == 8 and True == 1, but neither
    is a valid type code or handle flag). None, booleans and small integers are single objects in CPython
    (and orjson returns those), so identity is the cheap exact test; anything else is compared by type and
    value."""
    ns[name] = const
    if const is None or type(const) is bool or (type(const) is int and -5 <= const <= 256):
        return f"{expr} is {name}"
    return f"(type({expr}) is type({name}) and {expr} == {name})"


def _image_converter(names: tuple[str, ...], metas: tuple[tuple[Any, Any, Any], ...],
                     convs: tuple[Callable[[Any], Any], ...]) -> Callable[[Iterable[dict]], dict[str, Any] | None]:
    """A generated function taking an image's column objects (in ``names`` order) and returning its values,
    or None when a column's 't', 'f' or 'h' differs from ``metas`` (a 'f'/'h' given as _ABSENT must be
    absent). It raises (KeyError, TypeError, a converter's error) for anything else unusual; the caller then
    decodes column by column. Source holds indices only; names and constants are bound in its namespace
    (locals: o<i> column object, v<i> its value; T.conversion_expr binds c<i>, t<i>, f<i>)."""
    ns: dict[str, Any] = {}
    items = []
    for i, (name, conv) in enumerate(zip(names, convs)):
        ns[f"k{i}"] = name
        items.append(f"k{i}: {T.conversion_expr(i, conv, ns)}")
    n = len(names)
    src = (
        _image_checks_source("convert", metas, ns)
        + "".join(f'    v{i} = o{i}["v"]\n' for i in range(n))
        + f"    return {{{', '.join(items)}}}\n"
    )
    return T.generated_function("convert", src, ns)


def _image_extractor(metas: tuple[tuple[Any, Any, Any], ...]) -> Callable[[Iterable[dict]], tuple | None]:
    """The twin of :func:`_image_converter` for decode_arrow: the same checks of 't', 'f' and 'h' (None when one
    differs), then the columns' raw 'v' values as a tuple, converted later column by column. It raises (KeyError,
    TypeError) where the converter would."""
    ns: dict[str, Any] = {}
    n = len(metas)
    values = "".join(f'o{i}["v"], ' for i in range(n))
    src = _image_checks_source("extract", metas, ns) + f"    return ({values})\n"
    return T.generated_function("extract", src, ns)


def _image_checks_source(fname: str, metas: tuple[tuple[Any, Any, Any], ...], ns: dict[str, Any]) -> str:
    """The head both generated functions share: unpack the column objects, return None when a column's 't', 'f'
    or 'h' is not the shape's (a 'f'/'h' given as _ABSENT must be absent)."""
    checks = []
    for i, (t, f, h) in enumerate(metas):
        checks.append(_same(f'o{i}["t"]', f"mt{i}", t, ns))
        checks.append(f'"f" not in o{i}' if f is _ABSENT else _same(f'o{i}["f"]', f"mf{i}", f, ns))
        checks.append(f'"h" not in o{i}' if h is _ABSENT else _same(f'o{i}["h"]', f"mh{i}", h, ns))
    return (
        f"def {fname}(columns):\n"
        f"    [{''.join(f'o{i}, ' for i in range(len(metas)))}] = columns\n"
        f"    if not ({' and '.join(checks)}):\n"
        "        return None\n"
    )


def _frames(msg: KafkaMessage) -> tuple[Any, Any, list[tuple[int, int]], list[tuple[int, int]]]:
    """A record's key and value (None: empty) checked and split into their events' frames (shared by
    :meth:`OpenDecoder._decode` and :meth:`OpenDecoder.decode_arrow`)."""
    key = msg.key
    if key is None:
        raise _Bad("message has no key (the open protocol keeps event metadata in the Kafka key)")
    value = msg.value if msg.value is not None else b""
    if not isinstance(key, (bytes, bytearray, memoryview)) or not isinstance(
        value, (bytes, bytearray, memoryview)
    ):
        raise _Bad("key and value must be bytes")
    if len(key) < 8:
        raise _Bad(f"key is {len(key)} bytes, shorter than the 8-byte version header")
    (version,) = _U64.unpack_from(key, 0)
    if version != BATCH_VERSION:
        raise _Bad(f"unsupported key format version {version} (expected {BATCH_VERSION})")
    key_spans = _split_frames(key, 8, "key")
    value_spans = _split_frames(value, 0, "value")
    if len(key_spans) != len(value_spans):
        raise _Bad(f"key holds {len(key_spans)} events but value holds {len(value_spans)}")
    return key, value, key_spans, value_spans


def _key_event(kmv: memoryview, ko: int, kl: int) -> tuple[dict, int, Any, str, str]:
    """One key event checked: the object, its commit ts, its type 't' (as sent: the caller tests it), and for
    any but a resolved event the schema and table it names ("" for a resolved event, which names none)."""
    try:
        k = orjson.loads(kmv[ko:ko + kl])
    except orjson.JSONDecodeError as e:
        raise _Bad(f"key event is not valid JSON: {e}") from None
    if type(k) is not dict:
        raise _Bad(f"key event is a JSON {type(k).__name__}, expected an object")
    ts = k.get("ts")
    if type(ts) is not int or ts < 0:
        raise _Bad(f"key event has no valid commit ts 'ts' (got {ts!r:.40})")
    t = k.get("t")
    if t == MESSAGE_TYPE_RESOLVED and type(t) is int:
        return k, ts, t, "", ""
    schema = k.get("scm", "")
    table = k.get("tbl", "")
    if type(schema) is not str or type(table) is not str:
        raise _Bad("key event 'scm'/'tbl' must be strings")
    return k, ts, t, schema, table


# _row builds RowChange positionally (twice as fast as by keyword); make a reordering of its fields loud.
if tuple(f.name for f in dataclasses.fields(RowChange))[:9] != (
        "schema", "table", "commit_ts", "op", "before", "after", "columns", "position", "size"):
    raise ImportError("applier.events.RowChange fields changed order: update open._row")


# information_schema DATA_TYPE -> the type code TiCDC's open encoder sends for such a column
_UPSTREAM_TYPE_CODES: dict[str, int] = {
    "tinyint": TYPE_TINY, "smallint": TYPE_SHORT, "mediumint": TYPE_INT24, "int": TYPE_LONG, "integer": TYPE_LONG,
    "bigint": TYPE_LONGLONG, "float": TYPE_FLOAT, "double": TYPE_DOUBLE, "decimal": TYPE_NEWDECIMAL,
    "date": TYPE_DATE, "datetime": TYPE_DATETIME, "timestamp": TYPE_TIMESTAMP, "time": TYPE_DURATION,
    "year": TYPE_YEAR, "char": TYPE_STRING, "binary": TYPE_STRING, "varchar": TYPE_VARCHAR,
    "varbinary": TYPE_VARCHAR, "tinytext": TYPE_TINY_BLOB, "tinyblob": TYPE_TINY_BLOB, "text": TYPE_BLOB,
    "blob": TYPE_BLOB, "mediumtext": TYPE_MEDIUM_BLOB, "mediumblob": TYPE_MEDIUM_BLOB, "longtext": TYPE_LONG_BLOB,
    "longblob": TYPE_LONG_BLOB, "enum": TYPE_ENUM, "set": TYPE_SET, "bit": TYPE_BIT, "json": TYPE_JSON,
    "vector": TYPE_VECTOR_FLOAT32,
}
_COLUMN_KEY_FLAGS = {"PRI": FLAG_PRIMARY_KEY, "UNI": FLAG_UNIQUE_KEY, "MUL": FLAG_MULTIPLE_KEY}


def _open_image(row: UpstreamRow, sent: Any) -> dict:
    """An upstream row as the open protocol image TiCDC would have sent: the key columns exactly as the message
    carried them, every other column with the type code, flags and value form of TiCDC's encoder."""
    out: dict[str, Any] = {}
    for c in row.columns:
        mine = sent.get(c.name) if type(sent) is dict else None
        if type(mine) is dict:
            out[c.name] = mine
            continue
        code = _UPSTREAM_TYPE_CODES.get(c.data_type)
        if code is None:
            raise _Bad(f"upstream column {c.name!r} is of type {c.column_type!r}, which the open protocol does not "
                       "carry")
        flags = ((FLAG_BINARY if c.binary else 0) | (FLAG_NULLABLE if c.nullable else 0)
                 | (FLAG_UNSIGNED if c.unsigned else 0) | (FLAG_GENERATED if c.generated else 0)
                 | _COLUMN_KEY_FLAGS.get(c.column_key, 0))
        raw = row.values.get(c.name)
        try:
            out[c.name] = {"t": code, "f": flags, "v": None if raw is None else _wire_value(code, raw)}
        except (ValueError, TypeError) as e:
            raise _Bad(f"upstream column {c.name!r} ({c.column_type}): cannot use value {raw!r:.80}: {e}") from None
    return out


def _wire_value(code: int, raw: str | bytes) -> Any:
    """MySQL's text of a value (bytes for binary columns) -> the JSON value TiCDC's open encoder writes."""
    if code in _INT_CODES:
        return int(raw)
    if code in _FLOAT_CODES:
        return float(raw)
    if code in _STRING_CODES:
        return go_quote_bytes(raw) if isinstance(raw, bytes) else raw
    if code in _BLOB_CODES:
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8")
        return binascii.b2a_base64(data, newline=False).decode("ascii")
    if isinstance(raw, bytes):
        raise ValueError("binary data for a non-binary type")
    return raw  # DECIMAL, temporal types, JSON, VECTOR: their text


class _ArrowGroup:
    """The row changes of one table, topic, column names and kinds in a slice, gathered by
    :meth:`OpenDecoder.decode_arrow`: per row its commit ts, message (index in the slice), op, Column tuple
    (``variants``) and the raw values of the images it has."""

    __slots__ = ("schema", "table", "topic", "names", "kinds", "convs", "index", "variants", "meta", "befores",
                 "afters")

    def __init__(self, schema: str, table: str, topic: str, names: tuple[str, ...], kinds: tuple[str, ...],
                 convs: tuple[Callable[[Any], Any], ...], index: int) -> None:
        self.schema, self.table, self.topic, self.names, self.kinds = schema, table, topic, names, kinds
        self.convs, self.index = convs, index  # one converter per column for all rows: one conversion
        self.variants: list[tuple[Column, ...]] = []
        self.meta: list[tuple[int, int, int]] = []  # per row: commit ts, message index, 4 * variant + op code
        self.befores: list[tuple] = []  # the raw values of each row that has a before image (update, delete)
        self.afters: list[tuple] = []  # ... and of each that has an after image (insert, update)

    def variant(self, columns: tuple[Column, ...]) -> int:
        """The index of a Column tuple among the group's variants, times 4 (the op code fills the low bits)."""
        for i, v in enumerate(self.variants):
            if v is columns:
                return 4 * i
        self.variants.append(columns)
        return 4 * (len(self.variants) - 1)

    def shape(self) -> Shape:
        return Shape(self.schema, self.table, self.topic, self.names, self.kinds, tuple(self.variants))


def _image_rows(g: _ArrowGroup, idx: list[int] | None, arrays: list[pa.Array], ops: pa.Array, absent: int,
                have: int) -> list[pa.Array]:
    """One image's columns over all of a group's rows: the converted columns (``idx`` into ``arrays``, one value per
    row that has the image) spread to the rows, null where the op has no such image (``absent``)."""
    n = len(ops)
    if idx is None:  # no row has this image: every column null, of the type its kind gives
        return [pa.nulls(n, _NULL_TYPES[k]) for k in g.kinds]
    cols = [arrays[i] for i in idx]
    if have == n:
        return cols
    where = _spread(ops.to_numpy(zero_copy_only=False) != absent)
    return pa.RecordBatch.from_arrays(cols, names=[str(i) for i in range(len(cols))]).take(where).columns


# the Arrow type of a column of nulls of each kind (what applier.columnar.values and _py_array give for one)
_NULL_TYPES = {V.INT: pa.int64(), V.FLOAT: pa.float64(), V.STR: pa.string(), V.BYTES: pa.binary(),
               V.DECIMAL: pa.string(), V.DATE: pa.date32(), V.DATETIME: pa.timestamp("us"),
               TIME_KIND: pa.duration("us")}


class OpenDecoder:
    """Decoder for TiCDC's Open Protocol. Carries resolved ts, so it is gated."""

    name = PROTOCOL
    gated = True
    decodes_alone = True  # a message's events depend on that message only: may decode in Spark workers
    max_offsets_per_trigger = 3_125  # up to 16 row changes per message: keeps a batch near 50k row changes

    def __init__(self, *, strict_values: bool = True, legacy_base64_strings: bool = False,
                 large_message_handle_compression: str = "none", claim_check_uri: str = "",
                 claim_check_location_prefix: str = "", upstream_url: str = "", upstream_time_zone: str = "+00:00",
                 upstream_read_current_state: bool = False) -> None:
        self.strict_values = bool(strict_values)
        self.legacy_base64_strings = bool(legacy_base64_strings)
        # TiCDC refuses claim-check-raw-value for the open protocol (pkg/config/large_message.go): no such option
        self._large = LargeMessages(
            PROTOCOL, compression=large_message_handle_compression, claim_check_uri=claim_check_uri,
            claim_check_location_prefix=claim_check_location_prefix, upstream_url=upstream_url,
            upstream_time_zone=upstream_time_zone, upstream_read_current_state=upstream_read_current_state)
        self._compressed = self._large.compressed
        self._converters: dict[tuple[int, bool], Callable[[Any], Any]] = {}
        self._columns: dict[tuple[str, Any, Any, Any], Column] = {}
        # column names of an image -> the shapes met with those names (see _image)
        self._shapes: dict[tuple[str, ...], list[_Shape]] = {}

    # -- public ---------------------------------------------------------------------------------------------

    def table_of(self, msg: KafkaMessage) -> tuple[str, str] | None:
        """The table of an undecodable message, from its key (schema and table of every event in it), when the
        key still parses and names one table."""
        key = msg.key
        if not isinstance(key, (bytes, bytearray)) or len(key) < 8:
            return None
        names = set()
        for off, length in _split_frames(bytes(key), 8, "key"):
            k = orjson.loads(bytes(key[off:off + length]))
            names.add((k.get("scm"), k.get("tbl")))
        if len(names) != 1:
            return None
        schema, table = names.pop()
        return (schema, table) if isinstance(schema, str) and isinstance(table, str) else None

    def decode(self, msg: KafkaMessage) -> list:
        """All events of one Kafka record, in order. Raises DecodeError (only) for malformed input."""
        return guarded_decode(PROTOCOL, self._decode, msg)

    # -- whole slices as columns (Spark's Python workers) -----------------------------------------------------

    def decode_arrow(self, msgs: list[KafkaMessage], limit: int) -> ArrowSlice | None:
        """A slice of records decoded straight into Arrow record batches, one per table, topic, column names and
        kinds (:class:`applier.columnar.rows.ArrowSlice`), resolved and DDL events kept as events in their place
        (``extras``); or None when the slice holds anything this path does not take: then the caller decodes it
        record by record with :meth:`decode`, which also names whatever is wrong.

        It gives what :meth:`decode` of each record gives (:meth:`ArrowSlice.to_events`), ``size`` as
        :func:`applier.decode.decode_messages` sets it (the record's bytes over its events, resolved ones
        included), and every ts checked against ``limit`` (:func:`applier.clock.clock_limit`). Records are read
        with the record path's own steps (:func:`_frames`, :func:`_key_event`, :meth:`_row_value`, the image
        shapes of :meth:`_image`; a DDL event by :meth:`_event`), the values are converted column by column
        (:class:`_ArrowColumns`). Not taken: claim-check and handle-key-only insert/update rows, compressed
        streams, strict_values=False, a record without events, an update whose 'p' does not name the columns of
        'u' in the same order (an only-updated-columns 'p'), a table whose rows change a column's converter within
        the slice, and a value a column conversion refuses. tests/unit/test_open_arrow.py holds the two paths
        equal."""
        if self._compressed or not self.gated or not self.strict_values:
            return None
        groups: dict[tuple, _ArrowGroup] = {}  # (schema, table, topic, names, kinds)
        seen: dict[tuple, tuple] = {}  # (schema, table, topic, id(shape)) -> (shape, group, variant)
        order: list[int] = []
        extras: list = []
        parts: list[int] = []
        offs: list[int] = []
        sizes: list[int] = []
        row_type, resolved_type = MESSAGE_TYPE_ROW, MESSAGE_TYPE_RESOLVED
        insert_code, update_code, delete_code = OP_CODE[Op.INSERT], OP_CODE[Op.UPDATE], OP_CODE[Op.DELETE]
        delete_op = Op.DELETE
        key_event, row_value, image, shapes_get = _key_event, self._row_value, self._arrow_image, self._shapes.get
        try:
            for mi, msg in enumerate(msgs):
                key, value, key_spans, value_spans = _frames(msg)
                total = len(key_spans)
                if not total:
                    return None  # a record without events: only the record path keeps its offset
                parts.append(msg.partition)
                offs.append(msg.offset)
                sizes.append((len(msg.value or b"") + len(msg.key or b"")) // total)
                topic = msg.topic
                kmv = memoryview(key)
                vmv = memoryview(value)
                for (ko, kl), (vo, vl) in zip(key_spans, value_spans):
                    k, ts, t, schema, table = key_event(kmv, ko, kl)
                    if ts > limit or type(t) is not int:
                        return None
                    if t == resolved_type:
                        order.append(-1)
                        extras.append(Resolved(ts=ts, position=msg.position))
                        continue
                    if t != row_type:  # DDL, kept as an event in its place, sized as decode_messages sizes it
                        ev = self._event(kmv, ko, kl, vmv, vo, vl, msg.position)  # (raises for an unknown type)
                        if type(ev) is not DDL:
                            return None
                        ev.size = sizes[-1]
                        order.append(-1)
                        extras.append(ev)
                        continue
                    ccl = k.get("ccl")
                    if not (ccl is None or ccl == ""):
                        return None  # a claim-check row
                    op, u, p = row_value(vmv, vo, vl)
                    if op is not delete_op and k.get("ohk") is True:
                        return None  # a handle-key-only insert/update
                    # the image's shape: _image's, the first kept for its names tried here first (the shapes kept
                    # for one tuple of names differ in their checks, so at most one takes an image)
                    values = None
                    if type(u) is dict:
                        names = tuple(u)
                        shapes = shapes_get(names)
                        if shapes:
                            shape = shapes[0]
                            values = shape.extract(u.values())
                    if values is None:
                        shape, names, values = image(u, "d" if op is delete_op else "u")
                    hit = seen.get((schema, table, topic, id(shape)))
                    if hit is None or hit[0] is not shape:
                        hit = self._arrow_group(groups, seen, schema, table, topic, shape, names)
                        if hit is None:
                            return None
                    g = hit[1]
                    if op is delete_op:
                        g.meta.append((ts, mi, hit[2] + delete_code))
                        g.befores.append(values)
                    elif p is None:
                        g.meta.append((ts, mi, hit[2] + insert_code))
                        g.afters.append(values)
                    else:  # before = u overlaid with p: p's values when p names u's columns in u's order
                        old = shape.extract(p.values()) if type(p) is dict and tuple(p) == names else None
                        if old is None:
                            pshape, pnames, old = image(p, "p")
                            if pnames != names or pshape.convs != shape.convs:
                                return None
                        g.meta.append((ts, mi, hit[2] + update_code))
                        g.befores.append(old)
                        g.afters.append(values)
                    order.append(g.index)
            return self._arrow_slice(len(msgs), order, extras, groups, parts, offs, sizes)
        except Exception:  # noqa: BLE001 - the record-by-record path raises the DecodeError that names it
            return None

    def _arrow_image(self, obj: Any, which: str) -> tuple[_Shape, tuple[str, ...], tuple]:
        """An image's shape (one :meth:`_image` keeps), column names and raw values; an image no kept shape
        matches is decoded by :meth:`_image` first (which checks it and keeps its shape). Raises when there is
        none to be had (the slice goes record by record)."""
        if type(obj) is not dict:
            raise TypeError("an image is a JSON object")
        names = tuple(obj)
        for attempt in (0, 1):
            shapes = self._shapes.get(names)
            if shapes is not None:
                cs = obj.values()
                for shape in shapes:
                    values = shape.extract(cs)
                    if values is not None:
                        return shape, names, values
            if attempt == 0:
                self._image(obj, which)
        raise ValueError("an image shape that is not kept")

    def _arrow_group(self, groups: dict, seen: dict, schema: str, table: str, topic: str, shape: _Shape,
                     names: tuple[str, ...]) -> tuple | None:
        """(shape, group, variant) for the rows of ``shape`` in this table and topic; None when a column kind is
        not taken or the table's group converts a column of that kind with another converter."""
        kinds = tuple(map(_arrow_kind, shape.convs))
        if None in kinds:
            return None
        k = (schema, table, topic, names, kinds)
        g = groups.get(k)
        if g is None:
            g = groups[k] = _ArrowGroup(schema, table, topic, names, kinds, shape.convs, len(groups))
        elif g.convs != shape.convs:
            return None
        hit = seen[(schema, table, topic, id(shape))] = (shape, g, g.variant(shape.columns))
        return hit

    @staticmethod
    def _arrow_slice(messages: int, order: list[int], extras: list, groups: dict[tuple, _ArrowGroup],
                     parts: list[int], offs: list[int], sizes: list[int]) -> ArrowSlice:
        """The groups' rows as record batches (raises when a column's conversion is not exact)."""
        columns = _ArrowColumns()
        shaped = []
        for g in groups.values():
            # only the images the rows have (an insert has no before image, a delete no after image)
            b = [columns.add(c, v) for c, v in zip(g.convs, zip(*g.befores))] if g.befores else None
            a = [columns.add(c, v) for c, v in zip(g.convs, zip(*g.afters))] if g.afters else None
            shaped.append((g, b, a))
        arrays = columns.convert()
        ts: list[int] = []
        at: list[int] = []
        codes: list[int] = []
        for g in groups.values():
            t, a, c = zip(*g.meta)
            ts.extend(t)
            at.extend(a)
            codes.extend(c)
        where = pa.array(at, pa.int64())
        code = np.array(codes, dtype=np.int64)
        meta = [pa.array(ts, META_TYPES[0]), pa.array(parts, META_TYPES[1]).take(where),
                pa.array(offs, META_TYPES[2]).take(where), pa.array(sizes, META_TYPES[3]).take(where),
                pa.array(code & 3, META_TYPES[4]), pa.array(code >> 2, META_TYPES[5])]
        out = []
        n0 = 0
        for g, b, a in shaped:
            n = len(g.meta)
            ops_g = meta[4].slice(n0, n)
            before = _image_rows(g, b, arrays, ops_g, OP_CODE[Op.INSERT], len(g.befores))
            after = _image_rows(g, a, arrays, ops_g, OP_CODE[Op.DELETE], len(g.afters))
            out.append(build_batch(g.shape(), [m.slice(n0, n) for m in meta], before, after))
            n0 += n
        return ArrowSlice(messages, order, out, extras)

    # -- internals ------------------------------------------------------------------------------------------

    def _decode(self, msg: KafkaMessage) -> list:
        key, value, key_spans, value_spans = _frames(msg)
        pos = msg.position
        kmv = memoryview(key)
        vmv = memoryview(value)
        events: list = []
        total = len(key_spans)
        for i in range(total):
            ko, kl = key_spans[i]
            vo, vl = value_spans[i]
            try:
                events.append(self._event(kmv, ko, kl, vmv, vo, vl, pos))
            except _Bad as e:
                if total > 1:
                    raise _Bad(f"event {i + 1} of {total}: {e}") from None
                raise
        return events

    def _event(self, kmv: memoryview, ko: int, kl: int, vmv: memoryview, vo: int, vl: int,
               pos: SourcePosition) -> Any:
        k, ts, t, schema, table = _key_event(kmv, ko, kl)
        if t == MESSAGE_TYPE_RESOLVED and type(t) is int:
            # TiCDC writes a zero-length value; its decoder ignores the value of a resolved event.
            return Resolved(ts=ts, position=pos)
        if t == MESSAGE_TYPE_DDL and type(t) is int:
            if vl == 0:
                raise _Bad("DDL event has an empty value")
            v = self._value(vmv, vo, vl, "DDL value")
            if type(v) is not dict:
                raise _Bad(f"DDL value is a JSON {type(v).__name__}, expected an object")
            query = v.get("q")
            if type(query) is not str:
                raise _Bad("DDL value has no query string 'q'")
            ddl_type = v.get("t")
            if ddl_type is not None and type(ddl_type) is not int:
                raise _Bad(f"DDL type 't' must be an integer (got {ddl_type!r:.40})")
            return DDL(schema=schema, table=table, commit_ts=ts, query=query, position=pos,
                       ddl_type=ddl_type, size=kl + vl)
        if t == MESSAGE_TYPE_ROW and type(t) is int:
            return self._row(k, ts, schema, table, vmv, vo, vl, pos, kl)
        raise _Bad(f"unknown event type t={t!r:.40} in key (1 row, 2 DDL, 3 resolved)")

    def _value(self, vmv: memoryview, vo: int, vl: int, what: str) -> Any:
        """One event's value as JSON, decompressed first when the changefeed compresses values."""
        if self._compressed:
            data = self._large.decompress(vmv[vo:vo + vl], what)
            return _loads(memoryview(data), 0, len(data), what)
        return _loads(vmv, vo, vl, what)

    def _row(self, k: dict, ts: int, schema: str, table: str, vmv: memoryview, vo: int, vl: int,
             pos: SourcePosition, kl: int, nested: bool = False) -> RowChange:
        ccl = k.get("ccl")
        if ccl is not None and ccl != "":
            if nested:
                raise _Bad("the row in a claim-check file is itself a claim-check row ('ccl')")
            return self._claim_checked(k, ts, schema, table, ccl, pos, kl + vl)
        op, u, p = self._row_value(vmv, vo, vl)
        if op is Op.DELETE:
            before, columns = self._image(u, "d")
            # RowChange(schema, table, commit_ts, op, before, after, columns, position, size), positionally:
            # keyword arguments cost twice as much here (the field order is checked at import)
            return RowChange(schema, table, ts, Op.DELETE, before, None, columns, pos, kl + vl)
        if k.get("ohk") is True:
            if nested:
                raise _Bad("the row in a claim-check file is handle-key-only ('ohk'), not the full row")
            u, p = self._from_upstream(schema, table, ts, u, p)
        after, columns = self._image(u, "u")
        if p is None:
            return RowChange(schema, table, ts, Op.INSERT, None, after, columns, pos, kl + vl)
        old, _ = self._image(p, "p")
        before = dict(after)
        before.update(old)
        return RowChange(schema, table, ts, Op.UPDATE, before, after, columns, pos, kl + vl)

    def _row_value(self, vmv: memoryview, vo: int, vl: int) -> tuple[Op, Any, Any]:
        """A row event's value checked up to its images, shared by :meth:`_row` and :meth:`decode_arrow`: the op,
        its main image ('d' for a delete, else 'u') and 'p' (None unless an update)."""
        if vl == 0:
            raise _Bad("row event has an empty value")
        if self._compressed:
            v = self._value(vmv, vo, vl, "row value")
        else:
            try:
                v = orjson.loads(vmv[vo:vo + vl])
            except orjson.JSONDecodeError as e:
                raise _Bad(f"row value is not valid JSON: {e}") from None
        if type(v) is not dict:
            raise _Bad(f"row value is a JSON {type(v).__name__}, expected an object")
        u = v.get("u")
        p = v.get("p")
        d = v.get("d")
        if d is not None:
            if u is not None or p is not None:
                raise _Bad("row value has both a delete image 'd' and an update image 'u'/'p'")
            return Op.DELETE, d, None
        if u is None:
            raise _Bad("row value has neither 'u' (insert/update) nor 'd' (delete)")
        return (Op.INSERT if p is None else Op.UPDATE), u, p

    # -- large messages (applier.codecs.largemsg) ---------------------------------------------------------------

    def _claim_checked(self, k: dict, ts: int, schema: str, table: str, ccl: Any, pos: SourcePosition,
                       size: int) -> RowChange:
        """The row a claim-check event points to: the file holds the Kafka key and value TiCDC would have sent
        for this one event (key: version header + one framed key event; value: one framed, possibly compressed,
        row value)."""
        name = f"`{schema}`.`{table}`"
        key, value = self._large.read_claim_check(ccl, name)
        where = f"claim-check file {ccl!r:.200} (for a row of {name})"
        if key is None or len(key) < 8 or _U64.unpack_from(key, 0)[0] != BATCH_VERSION:
            raise _Bad(f"{where}: its key is not an open protocol batch key (8-byte version 1 + framed events)")
        kspans = _split_frames(key, 8, f"{where} key")
        vspans = _split_frames(value, 0, f"{where} value")
        if len(kspans) != 1 or len(vspans) != 1:
            raise _Bad(f"{where} holds {len(kspans)} key and {len(vspans)} value events, expected one row")
        (ko, ikl), (vo, vl) = kspans[0], vspans[0]
        inner = _loads(memoryview(key), ko, ikl, f"{where} key event")
        if type(inner) is not dict or inner.get("t") != MESSAGE_TYPE_ROW or inner.get("ts") != ts \
                or inner.get("scm", "") != schema or inner.get("tbl", "") != table:
            got = inner if type(inner) is not dict else {f: inner.get(f) for f in ("ts", "scm", "tbl", "t")}
            raise _Bad(f"{where} holds {got!r:.200}, not the row event of {name} at ts {ts} the message names")
        ev = self._row(inner, ts, schema, table, memoryview(value), vo, vl, pos, ikl, nested=True)
        ev.size = max(ev.size, size)
        return ev

    def _from_upstream(self, schema: str, table: str, ts: int, u: Any, p: Any) -> tuple[dict, dict | None]:
        """Complete a handle-key-only insert/update from the upstream: the new row as of ``ts``, the old row (an
        update's ``p``, found by its own key) as of ``ts - 1``, both as open protocol images."""
        name = f"`{schema}`.`{table}`"
        up = self._large.need_upstream(name, "row event (ohk=true)")
        key, _ = self._image(u, "u")
        full_u = _open_image(up.fetch(schema, table, ts, key, "the new row"), u)
        if p is None:
            return full_u, None
        old_key, _ = self._image(p, "p")
        return full_u, _open_image(up.fetch(schema, table, ts - 1, old_key, "the old row"), p)

    def _image(self, obj: Any, which: str) -> tuple[dict, tuple[Column, ...]]:
        """One row image ('u', 'p' or 'd'): its values and Column tuple.

        Images repeat a few shapes (the same column names with the same type codes, flags and handle flags),
        so each shape met once is kept with a generated function (:func:`_image_converter`) that checks an
        image's metadata against it and converts the values in one go. Anything else, and any image the
        function refuses or fails on, goes column by column through :meth:`_image_columns`, which decides the
        values and names the error exactly as it always did."""
        if type(obj) is dict:
            names = tuple(obj)
            shapes = self._shapes.get(names)
            if shapes is not None:
                cs = obj.values()
                try:
                    for shape in shapes:
                        values = shape.convert(cs)
                        if values is not None:
                            return values, shape.columns
                except Exception:  # noqa: BLE001 - a bad value: the per-column path names it
                    return self._image_columns(obj, which)
            values, columns = self._image_columns(obj, which)
            if shapes is None or len(shapes) < _SHAPES_PER_NAMES:
                self._keep_shape(names, obj, columns, shapes)
            return values, columns
        return self._image_columns(obj, which)

    def _keep_shape(self, names: tuple[str, ...], obj: dict, columns: tuple[Column, ...],
                    shapes: list[_Shape] | None) -> None:
        """Remember the shape of an image that just decoded column by column (so its metadata is valid)."""
        if not names or len(names) > T.MAX_GENERATED_COLUMNS:
            return
        metas = tuple((c["t"], c["f"] if "f" in c else _ABSENT, c["h"] if "h" in c else _ABSENT)
                      for c in obj.values())
        convs = tuple(self._converters[(col.type_code, col.binary)] for col in columns)
        shape = _Shape(columns, _image_converter(names, metas, convs), convs, _image_extractor(metas))
        if shapes is None:
            if len(self._shapes) >= _SHAPE_CACHE_LIMIT:
                self._shapes.clear()
            self._shapes[names] = [shape]
        else:
            shapes.append(shape)

    def _image_columns(self, obj: Any, which: str) -> tuple[dict, tuple[Column, ...]]:
        if type(obj) is not dict:
            raise _Bad(f"'{which}' is a JSON {type(obj).__name__}, expected an object of columns")
        if not obj:
            raise _Bad(f"'{which}' has no columns")
        values: dict[str, Any] = {}
        cols: list[Column] = []
        col_cache = self._columns
        convs = self._converters
        for name, c in obj.items():
            try:
                code = c["t"]
                flags = c.get("f", 0)
                handle = c.get("h", False)
                raw = c.get("v")
                ck = (name, code, flags, handle)
                col = col_cache.get(ck)
            except (TypeError, KeyError, AttributeError):
                raise _Bad(
                    f"'{which}' column {name!r}: expected an object with 't', 'f' and 'v'"
                ) from None
            if col is None or type(code) is not int or type(flags) is not int or type(handle) is not bool:
                # (8.0 == 8 and True == 1: a cache hit alone does not prove the types, so validate)
                col = self._new_column(name, code, flags, handle, which)
            if raw is None:
                values[name] = None
            else:
                try:
                    values[name] = convs[(code, flags & FLAG_BINARY)](raw)
                except Exception as e:  # noqa: BLE001
                    raise _Bad(
                        f"'{which}' column {name!r} ({col.type_name}, type code {code}): cannot decode "
                        f"value {raw!r:.80}: {e}"
                    ) from None
            cols.append(col)
        return values, tuple(cols)

    def _new_column(self, name: str, code: Any, flags: Any, handle: Any, which: str) -> Column:
        if type(code) is not int:
            raise _Bad(f"'{which}' column {name!r}: type code 't' must be an integer (got {code!r:.40})")
        if type(flags) is not int or flags < 0:
            raise _Bad(f"'{which}' column {name!r}: flags 'f' must be a non-negative integer")
        if type(handle) is not bool:
            raise _Bad(f"'{which}' column {name!r}: 'h' must be a boolean")
        names = TYPE_NAMES.get(code)
        if names is None:
            raise _Bad(f"'{which}' column {name!r}: unknown column type code {code}")
        binary = bool(flags & FLAG_BINARY)
        ckey = (code, flags & FLAG_BINARY)
        if ckey not in self._converters:
            try:
                self._converters[ckey] = _make_converter(
                    code, binary, self.strict_values, self.legacy_base64_strings
                )
            except _Bad as e:
                raise _Bad(f"'{which}' column {name!r}: {e}") from None
        col = Column(
            name=name,
            type_name=names[1] if binary else names[0],
            nullable=bool(flags & FLAG_NULLABLE),
            key=handle or bool(flags & FLAG_HANDLE_KEY),
            unique=bool(flags & (FLAG_PRIMARY_KEY | FLAG_UNIQUE_KEY)),
            unsigned=bool(flags & FLAG_UNSIGNED),
            binary=binary,
            generated=bool(flags & FLAG_GENERATED),
            type_code=code,
        )
        if len(self._columns) >= _COLUMN_CACHE_LIMIT:
            self._columns.clear()
        self._columns[(name, code, flags, handle)] = col
        return col
