"""MySQL/MariaDB: the columnar lane's upserts written as LOAD DATA's file by Arrow, not value by value.

Why: with ``[target] load_data`` the writer already sends an upsert chunk as a LOAD DATA file
(:mod:`applier.sinks.mysql_load`), but it made the file from Python rows: each value built from the lane's arrays
(:func:`applier.columnar.values.to_python`), each row a dict, then each column's texts in Python
(``column_texts``, ``encode_rows``). Here the same file comes from the arrays with Arrow's compute functions (casts,
three replaces for the escapes, one join), which cost a fraction of that (``docs/benchmarks.md``, round 13).

**The same file.** :func:`encode_arrow` gives, for the kinds it takes, the bytes ``encode_rows`` gives for the
rows ``to_python`` makes, with the same load mode per column (``_mode_for`` of the same column kind and the
kind's Python type):

* ``int``: Arrow's decimal digits (``str(int)``);
* ``decimal``: the text with its leading zeros dropped (``format(Decimal(t), 'f')`` for ``-?digits[.digits]``);
* ``str``: ``\\``, TAB and LF escaped as ``\\\\``, ``\\t``, ``\\n`` (``_escape``);
* ``bytes``: lowercase hex (``bytes.hex()``, loaded with ``UNHEX``);
* ``date``: ``YYYY-MM-DD``; ``datetime`` (naive): ``YYYY-MM-DD HH:MM:SS`` with ``.ffffff`` unless it is zero
  (``str(datetime)``);
* ``float``: the one difference: Arrow's shortest text that reads back as the same double (``0.00001``, ``1``)
  where Python's ``repr`` writes ``1e-05``, ``1.0``. Both are the same decimal number, which the server reads into
  the same double; a FLOAT (single precision) column has a value converter, so its floats go the Python way.

NULL is ``\\N``. A column whose value converter could act on the kind's values (TIMESTAMP from datetimes, FLOAT
from floats, TIME) goes the Python way (:func:`refusal`), as does any chunk LOAD DATA does not take exactly (a
warning, fewer rows loaded: :class:`~applier.sinks.mysql_load.LoadDataUpserter` sends it through executemany, with
the chunk's rows made as the lane makes them, :func:`applier.columnar.plan.python_rows`).
``tests/e2e/test_mysql_arrow_load.py`` writes random tables both ways and compares the files and the tables.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.columnar import values as V
from applier.sinks.adapt import RowAdapters
from applier.sinks.arrow_text import PYTHON_TYPE, column_refusal, hex_text
from applier.sinks.mysql_load import NULL, Encoded, _mode_for
from applier.sinks.table import TableMeta

def refusal(meta: TableMeta, table: pa.Table, kinds: Mapping[str, str], adapters: RowAdapters) -> str | None:
    """Why ``table`` (upserts of the lane, its columns named as the target's) goes the Python way, or None.
    ``kinds``: column -> lane kind; ``adapters``: the writer's value converters for these columns. (Whether a
    column kind takes the values is :func:`encode_arrow`'s question, asked with the writer's column kinds.)"""
    for field in table.schema:
        why = column_refusal(field, kinds, adapters)
        if why is not None:
            return why
    return None


def _texts(kind: str, arr: pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    if kind == V.STR:
        for a, b in (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n")):
            arr = pc.replace_substring(arr, a, b)
        return arr
    if kind == V.BYTES:
        return hex_text(arr)
    if kind == V.DECIMAL:
        return pc.replace_substring_regex(arr, r"^(-?)0+([0-9])", r"\1\2")
    text = arr.cast(pa.string())
    if kind == V.DATETIME:
        return pc.replace_substring_regex(text, r"\.000000$", "")
    return text  # int, float, date


def encode_arrow(column_kinds: Sequence[str | None], table: pa.Table, kinds: Mapping[str, str]) -> Encoded | None:
    """The chunk's LOAD DATA file (:mod:`applier.sinks.mysql_load`) from the lane's Arrow ``table``, or None when a
    column's kind (``column_kinds``: the writer's, from the target's column types) does not take the lane kind's
    values."""
    n = table.num_rows
    if not n:
        return None
    fields, modes = [], []
    for field, column_kind in zip(table.schema, column_kinds):
        if pa.types.is_null(field.type) or table.column(field.name).null_count == n:  # as encode_rows: "text"
            fields.append(pa.array([NULL] * n, pa.large_string()))
            modes.append("text")
            continue
        kind = kinds[field.name]
        mode = _mode_for(column_kind, {PYTHON_TYPE[kind]})
        if mode is None:
            return None
        text = _texts(kind, table.column(field.name))
        if isinstance(text, pa.ChunkedArray):
            text = text.combine_chunks()
        fields.append(pc.fill_null(text.cast(pa.large_string()), NULL))
        modes.append(mode)
    tab, lf, none = (pa.scalar(s, pa.large_string()) for s in ("\t", "\n", ""))
    rows = pc.binary_join_element_wise(pc.binary_join_element_wise(*fields, tab), lf, none)  # the lines, each + LF
    offsets = np.frombuffer(rows.buffers()[1], np.int64, n + 1, rows.offset * 8)
    return Encoded(rows.buffers()[2][int(offsets[0]):int(offsets[-1])].to_pybytes(), tuple(modes))


__all__ = ["refusal", "encode_arrow"]
