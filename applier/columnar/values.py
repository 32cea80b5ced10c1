"""MySQL text values -> Arrow arrays, exactly as the codecs' per-value converters would give them.

A codec decodes a column of a slice at once: the values of one column of one table shape, as the protocol
carries them (text, or null). :func:`column_array` turns them into one Arrow array whose values, read back
(:func:`to_python`), are exactly what the codec's converter (:mod:`applier.mysql_values`, via the codec) gives
for each value, type included, or raises :class:`Refused`: the caller then decodes the slice record by record,
which also names a bad value. Each kind says why its conversion is exact:

* ``int`` (integer types, YEAR, BIT, ENUM ordinals, SET bitmasks): the converter's fast form is ``int(text)``
  (:func:`applier.mysql_values.set_fast_form` contract): Arrow's cast when every text is an ASCII decimal
  integer within int64 (the one spelling where the two agree), else one C-level ``map``; int64, or uint64 when a
  value is beyond int64 (an unsigned BIGINT).
* ``float`` (FLOAT, DOUBLE): :func:`~applier.mysql_values.parse_float` is ``float(text)`` refused when not
  finite: Arrow's cast for plain decimal spellings (both round correctly), else ``map(float)``, then one
  finiteness check over the array.
* ``str`` (character types, JSON, ENUM/SET names): the text itself.
* ``bytes`` (binary types): the converter's fast form (``text.encode("latin-1")`` for Canal-JSON).
* ``decimal``: kept as its text, which :func:`~applier.mysql_values.parse_decimal` turns into the Decimal (scale
  included) wherever a Python value is needed; taken only when every value matches ``-?digits[.digits]``, which
  Decimal always accepts as a finite number.
* ``date`` / ``datetime`` (DATE; DATETIME, TIMESTAMP): Arrow's cast (date32 / timestamp[us]), taken only when
  every value has the exact shape the converter checks first (``YYYY-MM-DD[ HH:MM:SS[.f{1,6}]]`` in ASCII
  digits) and no year 0000 (a zero date stays text in the converter); the cast refuses any part out of range, so
  it gives what ``fromisoformat`` gives.

Anything else (TIME, zero dates, a date-only DATETIME, converters without a kind here) is refused.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from applier import mysql_values as T

_FAST_FORM = T._FAST_FORM  # the attribute set_fast_form stores (value type, fast function)

_DATE_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
_DATETIME_RE = r"^[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?$"
_DECIMAL_RE = r"^-?[0-9]+(\.[0-9]+)?$"

INT, FLOAT, STR, BYTES, DECIMAL, DATE, DATETIME = "int", "float", "str", "bytes", "decimal", "date", "datetime"


class Refused(ValueError):
    """These values are not converted here (the slice is decoded record by record instead)."""


def kind_of(conv: Callable[[Any], Any]) -> str | None:
    """How a converter's column is held in Arrow (see the module docstring), or None when it is not."""
    if conv is T.parse_float:
        return FLOAT
    if conv is T.parse_decimal:
        return DECIMAL
    if conv is T.parse_date:
        return DATE
    if conv is T.parse_datetime:
        return DATETIME
    form = getattr(conv, _FAST_FORM, None)
    if form is None or form[0] is not str:
        return None
    fast = form[1]
    if fast is None:
        return STR
    if fast is int:
        return INT
    if getattr(fast, "__name__", "") == "methodcaller" or type(fast).__name__ == "methodcaller":
        return BYTES if _gives_bytes(fast) else None
    return None


def _gives_bytes(fast: Callable[[str], Any]) -> bool:
    try:
        return type(fast("a")) is bytes
    except Exception:  # noqa: BLE001
        return False


def column_array(kind: str, conv: Callable[[Any], Any], values: Sequence[Any], texts: bool = False) -> pa.Array:
    """The Arrow array of one column's protocol values (nulls stay null), or :class:`Refused`. ``texts``: the
    caller knows every value is a str or None (a typed parse checked it), so it is not checked again."""
    if not texts:
        kinds = set(map(type, values))
        kinds.discard(type(None))
        if kinds and kinds != {str}:
            raise Refused(f"values of types {sorted(k.__name__ for k in kinds)}, not text")
    if kind == STR:
        return pa.array(values, pa.string())
    if kind == INT:
        if getattr(conv, _FAST_FORM)[1] is int:
            arr = _arrow_ints(values)
            if arr is not None:
                return arr
        return _python_ints(conv, values)
    if kind == BYTES:
        fast = getattr(conv, _FAST_FORM)[1]
        py = [None if v is None else fast(v) for v in values] if None in values else list(map(fast, values))
        return pa.array(py, pa.binary())
    if kind == FLOAT:
        arr = _arrow_floats(values)
        if arr is None:
            py = [None if v is None else float(v) for v in values] if None in values else list(map(float, values))
            arr = pa.array(py, pa.float64())
        if arr.null_count < len(arr) and not pc.all(pc.is_finite(arr)).as_py():
            raise Refused("a float that is not finite")
        return arr
    text = pa.array(values, pa.string())
    if kind == DECIMAL:
        if text.null_count < len(text) and not pc.all(pc.match_substring_regex(text, _DECIMAL_RE)).as_py():
            raise Refused("decimal text of another shape")
        return text
    if kind == DATE:
        return _checked_temporal(text, _DATE_RE, pa.date32(), False)
    if kind == DATETIME:
        return _checked_temporal(text, _DATETIME_RE, pa.timestamp("us"), True)
    raise Refused(f"no Arrow kind {kind!r}")


# Arrow's own parse of a column, taken only for text in the one spelling where it and Python's agree: ASCII decimal
# integers (int() also takes signs, blanks, underscores and other scripts' digits; Arrow also takes 0x hex), and
# decimal floats without blanks or underscores (both round correctly; "inf" and "nan" go the Python way, refused as
# not finite there). Anything else, or an integer beyond int64, goes the Python way below.
_INT_TEXT_RE = r"^-?[0-9]+$"
_FLOAT_TEXT_RE = r"^-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"


def _arrow_ints(values: Sequence[Any]) -> pa.Array | None:
    text = pa.array(values, pa.string())
    if text.null_count == len(text):
        return pa.nulls(len(text), pa.int64())
    if not pc.all(pc.match_substring_regex(text, _INT_TEXT_RE)).as_py():
        return None
    try:
        return text.cast(pa.int64())
    except (pa.ArrowInvalid, OverflowError):
        return None


def _arrow_floats(values: Sequence[Any]) -> pa.Array | None:
    text = pa.array(values, pa.string())
    if text.null_count == len(text):
        return pa.nulls(len(text), pa.float64())
    if not pc.all(pc.match_substring_regex(text, _FLOAT_TEXT_RE)).as_py():
        return None
    try:
        return text.cast(pa.float64())
    except (pa.ArrowInvalid, OverflowError):
        return None


def _python_ints(conv: Callable[[Any], Any], values: Sequence[Any]) -> pa.Array:
    fast = getattr(conv, _FAST_FORM)[1]
    py = [None if v is None else fast(v) for v in values] if None in values else list(map(fast, values))
    try:
        return pa.array(py, pa.int64())
    except (OverflowError, pa.ArrowInvalid):
        try:
            return pa.array(py, pa.uint64())
        except (OverflowError, pa.ArrowInvalid):
            raise Refused("an integer beyond 64 bits") from None


def _checked_temporal(text: pa.Array, regex: str, typ: pa.DataType, with_time: bool) -> pa.Array:
    """Dates and datetimes cast by Arrow, taken when every text has the converter's shape (the regex) and is not a
    zero date: Arrow's cast of that shape refuses any part out of range (a 30 February, a 29 February outside a
    leap year, hour 24, minute or second 60), so what it gives is what ``fromisoformat`` gives."""
    if text.null_count == len(text):
        return pa.nulls(len(text), typ)
    if not pc.all(pc.match_substring_regex(text, regex)).as_py():
        raise Refused("temporal text of another shape")
    if pc.any(pc.starts_with(text, "0000")).as_py():
        raise Refused("year 0000 (a zero date stays text)")
    try:
        return text.cast(typ)
    except pa.ArrowInvalid:
        raise Refused("a date or time part out of range") from None


def to_python(kind: str, conv: Callable[[Any], Any], arr: pa.Array) -> list[Any]:
    """The Python values of a column this module made: what the converter gives for each original value. Dates and
    datetimes go through numpy (``astype(object)`` makes the same ``date``/``datetime`` objects as ``to_pylist``,
    about eight times faster)."""
    if kind == DECIMAL:
        return [None if v is None else Decimal(v) for v in arr.to_pylist()]
    if (kind == DATE or kind == DATETIME) and len(arr) and not pa.types.is_null(arr.type):
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        if kind == DATE:
            np_arr = arr.cast(pa.int32()).fill_null(0).to_numpy(zero_copy_only=False).astype("datetime64[D]")
        else:  # (fill_null first: with nulls, to_numpy would make floats of the ints)
            np_arr = arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype("datetime64[us]")
        out = np_arr.astype(object).tolist()
        if arr.null_count:
            valid = arr.is_valid().to_numpy(zero_copy_only=False)
            out = [v if ok else None for v, ok in zip(out, valid)]
        return out
    return arr.to_pylist()




def slice_back(whole: pa.Array, lengths: Sequence[int]) -> list[pa.Array]:
    """The columns one conversion of their merged values made, cut back apart (zero-copy slices)."""
    out, at = [], 0
    for n in lengths:
        out.append(whole.slice(at, n))
        at += n
    return out


_BATCHED = frozenset({INT, FLOAT, STR, BYTES, DECIMAL, DATE, DATETIME})


class SliceColumns:
    """The columns of a whole slice (every group's, both images), converted together: a kind whose checks are
    Arrow compute calls (floats, decimals, dates, datetimes) is checked once over all its columns, because a
    call costs about as much for 50 values as for 5000 and a slice holds many small groups."""

    def __init__(self, texts: bool = False) -> None:
        self._cols: list[tuple[str, Any, Sequence[Any]]] = []
        self._texts = texts  # every value is a str or None (see column_array)

    def add(self, kind: str, conv: Callable[[Any], Any], values: Sequence[Any]) -> int:
        """Register one column; its array will be ``convert()[returned index]``."""
        self._cols.append((kind, conv, values))
        return len(self._cols) - 1

    def add_all(self, kinds: Sequence[str], convs: Sequence[Callable[[Any], Any]],
                columns: Sequence[Sequence[Any]]) -> list[int]:
        return list(map(self.add, kinds, convs, columns))

    def convert(self) -> list[pa.Array]:
        """Every registered column's array, or :class:`Refused`."""
        out: list[pa.Array | None] = [None] * len(self._cols)
        together: dict[str, list[int]] = {}
        for i, (kind, conv, values) in enumerate(self._cols):
            if kind in _BATCHED:
                together.setdefault(kind, []).append(i)
            else:
                out[i] = column_array(kind, conv, values, self._texts)
        for kind, idx in together.items():
            merged: list[Any] = []
            for i in idx:
                merged.extend(self._cols[i][2])
            if kind in (INT, BYTES):  # one fast form for all: the converters differ only by the codec's own rules
                forms = {getattr(self._cols[i][1], _FAST_FORM) for i in idx}
                if len(forms) != 1:
                    for i in idx:
                        out[i] = column_array(kind, self._cols[i][1], self._cols[i][2], self._texts)
                    continue
            try:
                whole = column_array(kind, self._cols[idx[0]][1], merged, self._texts)
                if whole.type == pa.uint64():
                    raise Refused("an integer beyond int64 in one of the columns")
            except Refused:
                if kind != INT:
                    raise
                for i in idx:  # a uint64 column among int64 ones: each its own type
                    out[i] = column_array(kind, self._cols[i][1], self._cols[i][2], self._texts)
                continue
            for i, part in zip(idx, slice_back(whole, [len(self._cols[i][2]) for i in idx])):
                out[i] = part
        return out  # type: ignore[return-value]
