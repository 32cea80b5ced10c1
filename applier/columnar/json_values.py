"""JSON-typed values -> Arrow arrays, for codecs whose images carry JSON numbers, strings and booleans rather than
MySQL text (the text kinds are :mod:`.values`).

A codec hands one column of a slice at a time: the values its JSON parser gave (None for null). Each function here
returns one Arrow array whose values, read back with :func:`applier.columnar.values.to_python` under the kind it
documents, are exactly what the codec's converter gives for each value, Python type included; or raises
:class:`~.values.Refused` (or the converter's own error) and the caller decodes the slice record by record, which
also names a bad value. Every check is over the whole column: the exact Python types present (``type()``, so a
``bool`` is never taken for an ``int``), then the range the target type holds.

Integers beyond 64 bits are always refused: orjson reads them as floats while msgspec reads them as ints, so a
codec that parses with one and checks with the other must never see such a value reach a row.
"""

from __future__ import annotations

import datetime as _dt
from decimal import Decimal
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from applier.columnar.values import DATE, DATETIME, DECIMAL, FLOAT, INT, STR, Refused, slice_back

TIME = "time"  # a TIME as duration[us] (read back by to_python's to_pylist: timedelta); the kind Open's lane keeps

_I64_MIN, _I64_MAX, _U64_MAX = -(1 << 63), (1 << 63) - 1, (1 << 64) - 1
_EPOCH_DATE = _dt.date(1970, 1, 1)
_EPOCH_DT = _dt.datetime(1970, 1, 1)
# what Python's date and datetime hold, as days / microseconds from 1970-01-01 (the converters raise beyond)
_DAYS = ((_dt.date.min - _EPOCH_DATE).days, (_dt.date.max - _EPOCH_DATE).days)
_MICROS = ((_dt.datetime.min - _EPOCH_DT) // _dt.timedelta(microseconds=1),
           (_dt.datetime.max - _EPOCH_DT) // _dt.timedelta(microseconds=1))
_NONE = type(None)
_DECIMAL_TEXT_RE = r"^-?[0-9]+(\.[0-9]+)?$"


def _types(values: Sequence[Any], allowed: frozenset[type]) -> bool:
    """Whether ``values`` hold a null; Refused when a value's type is not one of ``allowed`` (or None)."""
    kinds = set(map(type, values))
    has_null = _NONE in kinds
    kinds.discard(_NONE)
    if not kinds <= allowed:
        raise Refused(f"values of types {sorted(k.__name__ for k in kinds - allowed)}")
    return has_null


def _int64(values: Sequence[Any]) -> pa.Array:
    """Integers (and nulls) as int64, or uint64 when one is beyond int64 (refused beyond 64 bits)."""
    try:
        return pa.array(values, pa.int64())
    except (OverflowError, pa.ArrowInvalid):
        pass
    try:
        return pa.array(values, pa.uint64())
    except (OverflowError, pa.ArrowInvalid):
        raise Refused("an integer beyond 64 bits") from None


def _bounded(arr: pa.Array, lo: int, hi: int, what: str) -> pa.Array:
    """``arr`` (int64) when every value is within [lo, hi], else Refused."""
    if arr.null_count < len(arr):
        mm = pc.min_max(arr)
        if mm["min"].as_py() < lo or mm["max"].as_py() > hi:
            raise Refused(f"{what} out of range")
    return arr


_INTS = frozenset({int})
_BOOLS = frozenset({bool})
_NUMBERS = frozenset({int, float})
_STRS = frozenset({str})


def ints(values: Sequence[Any]) -> pa.Array:
    """Kind ``int``: JSON integers as they are (a converter that checks ``type(v) is int`` and returns it)."""
    _types(values, _INTS)
    return _int64(values)


def ints_wrapped_unsigned(values: Sequence[Any]) -> pa.Array:
    """Kind ``int``: an unsigned 64-bit integer sent as a signed one (``v + 2**64`` when negative; the others as
    they are): negatives are int64's two's complement, so a cast to uint64 without a range check is that sum."""
    arr = ints(values)
    if arr.type == pa.int64() and arr.null_count < len(arr) and pc.min(arr).as_py() < 0:
        return pc.cast(arr, pa.uint64(), safe=False)
    return arr


def bools_as_ints(values: Sequence[Any]) -> pa.Array:
    """Kind ``int``: JSON booleans as 1/0."""
    _types(values, _BOOLS)
    return pa.array(values, pa.bool_()).cast(pa.int64())


def floats(values: Sequence[Any]) -> pa.Array:
    """Kind ``float``: JSON numbers as ``float(v)`` (floats as they are, integers within 64 bits converted with
    Python's correct rounding, not Arrow's exactness check)."""
    has_null = _types(values, _NUMBERS)
    if int in set(map(type, values)):
        _int64([v for v in values if type(v) is int])  # (refuses beyond 64 bits)
        values = [None if v is None else float(v) for v in values] if has_null else list(map(float, values))
    return pa.array(values, pa.float64())


def strs(values: Sequence[Any]) -> pa.Array:
    """Kind ``str``: JSON strings as they are (a lone surrogate is no UTF-8: Arrow raises)."""
    _types(values, _STRS)
    return pa.array(values, pa.string())


def number_texts(values: Sequence[Any], conv: Callable[[Any], Decimal] | None = None) -> pa.Array:
    """Kind ``decimal``: each JSON number as decimal text ``-?digits[.digits]``, which
    :func:`applier.columnar.values.to_python` reads back with ``Decimal(text)``.

    A number's shortest text (``str`` of an integer within 64 bits, ``repr`` of a float) in that shape gives
    ``Decimal(v)`` for an integer and ``Decimal(repr(v))`` for a float, digits and exponent alike (a float's repr
    in that shape always has a fraction, so its exponent is negative): what a converter that reads floats by their
    shortest text gives. A float whose repr has an exponent (1e-10, 1e+28) is given ``conv``'s Decimal written
    without one (``format(d, "f")``, taken only when it reads back to the same sign, digits and exponent); without
    ``conv`` it is refused, as are inf and nan."""
    has_null = _types(values, _NUMBERS)
    if int in set(map(type, values)):
        _int64([v for v in values if type(v) is int])
    texts = [None if v is None else repr(v) for v in values] if has_null else list(map(repr, values))
    arr = pa.array(texts, pa.string())
    if arr.null_count == len(arr):
        return arr
    plain = pc.match_substring_regex(arr, _DECIMAL_TEXT_RE)
    if pc.all(plain).as_py():
        return arr
    if conv is None:
        raise Refused("a number whose shortest text has an exponent")
    for i, ok in enumerate(plain.to_pylist()):
        if ok is False:
            d = conv(values[i])
            text = format(d, "f")
            if type(d) is not Decimal or Decimal(text).as_tuple() != d.as_tuple():
                raise Refused(f"decimal {d!r} has no plain text of the same digits")
            texts[i] = text
    arr = pa.array(texts, pa.string())
    if not pc.all(pc.match_substring_regex(arr, _DECIMAL_TEXT_RE)).as_py():
        raise Refused("decimal text of another shape")
    return arr


def epoch_days(values: Sequence[Any]) -> pa.Array:
    """Kind ``date``: integer days since 1970-01-01 (``date(1970, 1, 1) + timedelta(days=v)``), within Python's
    dates."""
    _types(values, _INTS)
    arr = _bounded(_int64(values), *_DAYS, "a day number")
    return arr.cast(pa.int32()).cast(pa.date32())


def _epoch(values: Sequence[Any], per: int) -> pa.Array:
    _types(values, _INTS)
    lo, hi = _MICROS
    arr = _bounded(_int64(values), -(-lo // per), hi // per, "an epoch time")
    if per != 1:
        arr = pc.multiply(arr, per)
    return arr.cast(pa.timestamp("us"))


def epoch_micros(values: Sequence[Any]) -> pa.Array:
    """Kind ``datetime``: integer microseconds since 1970-01-01 00:00 as a naive datetime, within Python's."""
    return _epoch(values, 1)


def epoch_millis(values: Sequence[Any]) -> pa.Array:
    """Kind ``datetime``: integer milliseconds since 1970-01-01 00:00 as a naive datetime, within Python's."""
    return _epoch(values, 1000)


def _duration(values: Sequence[Any], per: int) -> pa.Array:
    _types(values, _INTS)
    arr = _int64(values)
    if arr.type != pa.int64():
        raise Refused("a duration beyond int64 microseconds")
    if per != 1:
        arr = pc.multiply_checked(_bounded(arr, _I64_MIN // per, _I64_MAX // per, "a duration"), per)
    return arr.cast(pa.duration("us"))


def duration_micros(values: Sequence[Any]) -> pa.Array:
    """Kind ``time``: integer microseconds as ``timedelta(microseconds=v)`` (every int64 is a timedelta)."""
    return _duration(values, 1)


def duration_millis(values: Sequence[Any]) -> pa.Array:
    """Kind ``time``: integer milliseconds as ``timedelta(milliseconds=v)``."""
    return _duration(values, 1000)


def converted(conv: Callable[[Any], Any], typ: pa.DataType, values: Sequence[Any]) -> pa.Array:
    """The converter run on each non-null value (its errors raise), held in ``typ``: for converters whose values
    Arrow holds as they are (bytes in binary; naive datetimes within Python's range in timestamp[us]; integers
    within 64 bits as int64, else uint64)."""
    py = [None if v is None else conv(v) for v in values]
    if typ == pa.int64():
        return _int64(py)
    return pa.array(py, typ)


# the Arrow type a column of each kind has here when all its values are null (what the functions above give)
NULL_TYPES = {INT: pa.int64(), FLOAT: pa.float64(), STR: pa.string(), "bytes": pa.binary(), DECIMAL: pa.string(),
              DATE: pa.date32(), DATETIME: pa.timestamp("us"), TIME: pa.duration("us")}


class Columns:
    """The columns of a whole slice (every group's, both images), converted together: one call per conversion over
    all the columns that use it, because a call's fixed cost (type checks, Arrow compute calls) is about the same
    for 50 values as for 5000 and a slice holds many small groups. When the merged columns give uint64 (a value
    beyond int64) or are refused, each column is converted alone: it keeps the type its own values give, and a
    column is refused only for its own values."""

    def __init__(self) -> None:
        self._cols: list[tuple[Any, Callable[[Sequence[Any]], pa.Array], Sequence[Any]]] = []

    def add(self, key: Any, convert: Callable[[Sequence[Any]], pa.Array], values: Sequence[Any]) -> int:
        """Register one column (``key``: what identifies ``convert``'s conversion); its array will be
        ``convert()[returned index]``."""
        self._cols.append((key, convert, values))
        return len(self._cols) - 1

    def convert(self) -> list[pa.Array]:
        """Every registered column's array; raises where a conversion does (Refused, a converter's error)."""
        out: list[pa.Array | None] = [None] * len(self._cols)
        together: dict[Any, list[int]] = {}
        for i, (key, _, _) in enumerate(self._cols):
            together.setdefault(key, []).append(i)
        for idx in together.values():
            convert = self._cols[idx[0]][1]
            if len(idx) == 1:
                out[idx[0]] = convert(self._cols[idx[0]][2])
                continue
            merged: list[Any] = []
            for i in idx:
                merged.extend(self._cols[i][2])
            try:
                whole = convert(merged)
            except Refused:  # e.g. one column's uint64 values among another's negative ones: each alone decides
                whole = None
            if whole is None or whole.type == pa.uint64():
                for i in idx:
                    out[i] = convert(self._cols[i][2])
                continue
            for i, part in zip(idx, slice_back(whole, [len(self._cols[i][2]) for i in idx])):
                out[i] = part
        return out  # type: ignore[return-value]
