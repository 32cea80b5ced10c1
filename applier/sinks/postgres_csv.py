"""PostgreSQL: the columnar lane's upserts sent as ``COPY ... (FORMAT csv)`` made by Arrow, not row by row.

Why: the lane plans a window on Arrow arrays (:mod:`applier.columnar.plan`), and the writer took the rows left
as Python values: each value built from the array, each row a dict, then a tuple, then psycopg's ``write_row``.
That cost 12.8-14.3 µs of driver CPU per row written (bench shape, 11 columns, 100k rows); Arrow's C++ CSV
writer makes the same COPY data in 1.7-2.0 µs. The server parses text instead of binary, which cost it 1.6-2.1 µs
more per row: about 10 µs less CPU per row in all (``docs/benchmarks.md``, round 13).

**What it stores.** A CSV value is text that PostgreSQL parses with the column type's input function, the same
function that reads the text COPY the writer falls back to when binary is not allowed; and binary COPY is only
used where it stores what text stores (:data:`applier.sinks.postgres.BINARY_COPY_VALUE_TYPES`). So the CSV path
stores what today's path stores wherever, for each column, the CSV text parses as the text psycopg would send for
the Python value :func:`applier.columnar.values.to_python` gives. That holds for these (lane kind, column type)
pairs only (:data:`TAKES`); anything else sends the table's upserts the Python way:

* ``int`` (int64/uint64) into smallint, integer, bigint, numeric: decimal digits both ways (an out-of-range
  value is refused by the same input function);
* ``float`` (float64) into double precision and real: Arrow writes the shortest text that reads back as the
  same double, as Python's ``repr`` does (``0.00001`` where Python writes ``1e-05``): the same decimal number,
  so ``float8in`` and ``float4in`` give the same value from both;
* ``decimal`` (its text, ``-?digits[.digits]``) into numeric: the same number and scale as ``str(Decimal(t))``
  (which may read ``1E-7`` for ``0.0000001``; numeric keeps scale 7 from both);
* ``str`` into text, varchar, char, json, jsonb: the string itself (always quoted by Arrow, ``"`` doubled, so
  an empty string is ``""`` and only a NULL is an empty field; a string ``\\.`` is quoted and never ends the
  data); a string holding NUL goes the Python way, whose error names the row;
* ``bytes`` into bytea: bytea's hex input (``\\x0a1b``), made here (:func:`hex_bytea`);
* ``date`` (date32) into date and ``datetime`` (timestamp[us], no zone) into timestamp: ``YYYY-MM-DD`` and
  ``YYYY-MM-DD HH:MM:SS.ffffff``, years 0001-9999 (the lane refuses year 0000), read the same under any DateStyle;
* a column of nulls only (Arrow's null type) into any type: empty fields, NULL.

A column whose value converter (:func:`applier.sinks.postgres.pg_converter`) could act on the column's Python
values (a ``timestamp with time zone`` column, BIT from bytes, a converter that does not say what it acts on)
goes the Python way too, as does a connection whose client encoding is not UTF-8 (the CSV is UTF-8).
``tests/e2e/test_pg_csv_copy.py`` writes random tables both ways and compares them.
"""

from __future__ import annotations

from typing import Mapping

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from applier.columnar import values as V
from applier.sinks.adapt import RowAdapters
from applier.sinks.arrow_text import column_refusal, hex_text
from applier.sinks.table import TableMeta

_INT2, _INT4, _INT8, _FLOAT4, _FLOAT8, _NUMERIC = 21, 23, 20, 700, 701, 1700
_TEXT, _VARCHAR, _BPCHAR, _JSON, _JSONB, _BYTEA, _DATE, _TIMESTAMP = 25, 1043, 1042, 114, 3802, 17, 1082, 1114

#: lane kind -> the column type oids whose input reads its CSV text as the text psycopg sends for its Python
#: value (see the module docstring)
TAKES: dict[str, frozenset[int]] = {
    V.INT: frozenset({_INT2, _INT4, _INT8, _NUMERIC}),
    V.FLOAT: frozenset({_FLOAT8, _FLOAT4}),
    V.DECIMAL: frozenset({_NUMERIC}),
    V.STR: frozenset({_TEXT, _VARCHAR, _BPCHAR, _JSON, _JSONB}),
    V.BYTES: frozenset({_BYTEA}),
    V.DATE: frozenset({_DATE}),
    V.DATETIME: frozenset({_TIMESTAMP}),
}
_OPTIONS = pcsv.WriteOptions(include_header=False, quoting_style="needed", delimiter=",")


def refusal(meta: TableMeta, table: pa.Table, kinds: Mapping[str, str], adapters: RowAdapters) -> str | None:
    """Why ``table`` (upserts of the lane, its columns named as the target's) cannot go as CSV, or None when
    it can. ``kinds``: column -> lane kind; ``adapters``: the writer's value converters for these columns."""
    for field in table.schema:
        why = column_refusal(field, kinds, adapters)
        if why is not None:
            return why
        if pa.types.is_null(field.type):
            continue  # NULL whatever the column's type
        col, kind = field.name, kinds[field.name]
        if meta.type_oids.get(col) not in TAKES[kind]:
            return f"column {col!r}: type oid {meta.type_oids.get(col)} for lane kind {kind}"
        if kind == V.STR and pc.any(pc.match_substring(table.column(col), "\x00")).as_py():
            return f"column {col!r}: a string holds NUL"
    return None


def csv_data(table: pa.Table) -> pa.Buffer:
    """The rows of ``table`` as COPY's CSV (no header, comma, ``"`` quoting; bytea columns as hex)."""
    for i, field in enumerate(table.schema):
        if pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            table = table.set_column(i, field.name, hex_bytea(table.column(i)))
    out = pa.BufferOutputStream()
    pcsv.write_csv(table, out, _OPTIONS)
    return out.getvalue()


def hex_bytea(col: pa.Array | pa.ChunkedArray) -> pa.Array:
    """bytea's hex input form of each value (``\\x`` then two lowercase hex digits a byte), nulls kept."""
    return hex_text(col, b"\\x")


__all__ = ["TAKES", "refusal", "csv_data", "hex_bytea"]
