"""What both targets' Arrow writers share (applier/sinks/postgres_csv.py, applier/sinks/mysql_arrow.py): the
Python type each lane kind stands for, whether a column's value converter could act on it, and bytes as hex.

The columnar lane hands a writer its upserts as an Arrow table (:meth:`applier.sinks.base.Sink.takes_arrow`). A
writer takes it only where the text it makes from the arrays is what it would make from the Python values
:func:`applier.columnar.values.to_python` gives, and no value converter of the target column would change those
values (:func:`converter_acts`)."""

from __future__ import annotations

import datetime as _dt
from decimal import Decimal
from typing import Mapping

import numpy as np
import pyarrow as pa

from applier.columnar import values as V
from applier.sinks.adapt import RowAdapters

#: lane kind -> the type of the Python values :func:`applier.columnar.values.to_python` gives for it
PYTHON_TYPE: dict[str, type] = {V.INT: int, V.FLOAT: float, V.DECIMAL: Decimal, V.STR: str, V.BYTES: bytes,
                                V.DATE: _dt.date, V.DATETIME: _dt.datetime}

#: lane kind -> the Arrow types :mod:`applier.columnar.values` holds it as
ARROW_TYPES: dict[str, tuple[pa.DataType, ...]] = {
    V.INT: (pa.int64(), pa.uint64()), V.FLOAT: (pa.float64(),), V.DECIMAL: (pa.string(), pa.large_string()),
    V.STR: (pa.string(), pa.large_string()), V.BYTES: (pa.binary(), pa.large_binary()), V.DATE: (pa.date32(),),
    V.DATETIME: (pa.timestamp("us"),),
}

_HEX = np.frombuffer(b"".join(b"%02x" % i for i in range(256)), np.uint8).reshape(256, 2)


def converter_acts(adapters: RowAdapters, col: str, kind: str) -> bool:
    """Whether a value converter (or check) of ``col`` could change or refuse a value of lane kind ``kind``: one
    that does not declare what it acts on (:func:`applier.sinks.adapt.acts_on`) could act on anything."""
    py = PYTHON_TYPE[kind]
    for c, f in (*adapters[0], *adapters[1]):
        if c == col:
            types = getattr(f, "acts_on", None)
            if types is None or issubclass(py, types):
                return True
    return False


def column_refusal(field: pa.Field, kinds: Mapping[str, str], adapters: RowAdapters) -> str | None:
    """Why a writer cannot make the text of column ``field`` from Arrow (its lane kind, ``kinds[name]``, is not
    one held as this Arrow type, or a value converter could act on it), or None. A column of Arrow's null type
    passes whatever its kind: NULL is NULL for every column type."""
    col, typ = field.name, field.type
    if pa.types.is_null(typ):
        return None
    kind = kinds.get(col)
    if kind not in ARROW_TYPES or typ not in ARROW_TYPES[kind]:
        return f"column {col!r}: lane kind {kind} as {typ}"
    if converter_acts(adapters, col, kind):
        return f"column {col!r}: its value converter acts on {PYTHON_TYPE[kind].__name__}"
    return None


def hex_text(col: pa.Array | pa.ChunkedArray, prefix: bytes = b"") -> pa.Array:
    """Each binary value as ``prefix`` then two lowercase hex digits a byte (``bytes.hex()``), nulls kept, as one
    large_string array: vectorised in numpy (a byte's two digits from a 256-entry table, scattered to their
    place), never a Python loop over the values."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n = len(arr)
    if not n:
        return pa.array([], pa.large_string())
    if arr.offset:
        arr = pa.concat_arrays([arr])  # offset 0: the buffers below then start at the first value
    width = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    validity, offsets, data = arr.buffers()
    offs = np.frombuffer(offsets, width, n + 1).astype(np.int64)
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    lens = np.diff(offs)
    p = len(prefix)
    new = np.zeros(n + 1, np.int64)
    np.cumsum(lens * 2 + p, out=new[1:])
    out = np.empty(int(new[-1]), np.uint8)
    for i, b in enumerate(prefix):
        out[new[:-1] + i] = b
    row = np.repeat(np.arange(n, dtype=np.int64), lens)
    src = raw[offs[0]:offs[-1]]
    dest = new[:-1][row] + p + 2 * (np.arange(len(src), dtype=np.int64) - (offs[:-1] - offs[0])[row])
    digits = _HEX[src]
    out[dest] = digits[:, 0]
    out[dest + 1] = digits[:, 1]
    return pa.Array.from_buffers(pa.large_string(), n, [validity if arr.null_count else None,
                                                        pa.py_buffer(new), pa.py_buffer(out)], arr.null_count)


__all__ = ["ARROW_TYPES", "PYTHON_TYPE", "column_refusal", "converter_acts", "hex_text"]
