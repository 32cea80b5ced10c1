"""Test tooling: write a Dumpling export of a known table state, in the layout Dumpling itself writes.

The reader is :mod:`applier.dumpling` (used by ``applier load``); this writer is its counterpart for the tests
and the load benchmark, written from Dumpling's documented output (pingcap/tidb ``dumpling/export``, the
``dumpling-overview`` docs), never from the reader:

* ``metadata`` with the ``SHOW MASTER STATUS:`` block (``Log: tidb-binlog`` / ``Pos: <TSO>`` for TiDB, a binlog
  position for ``server="mysql"``);
* ``{db}-schema-create.sql``, ``{db}.{table}-schema.sql`` (``/*!40101 SET NAMES binary*/;`` + CREATE TABLE);
* data files ``{db}.{table}.{000000000}.sql|csv`` (``.gz`` with ``compress``), names escaped as Dumpling's
  ``fn`` template function does (``%2E`` for ``.`` ...);
* SQL: ``INSERT INTO `t` VALUES\\n(..),\\n(..);`` (a column list when the table has generated columns or
  ``complete_insert``), numbers bare, strings quoted with backslash escapes (or doubled quotes with
  ``escape_backslash=False``), BINARY/VARBINARY/BLOB/BIT as ``x'hex'``;
* CSV: a header line of quoted names (unless ``csv_header=False``), ``\\r\\n`` line ends, numbers bare,
  strings and binary values (raw bytes) between ``"`` with ``\\0 \\r \\n \\\\ \\"`` escaped, NULL as ``\\N``.

Values are the event model's (``applier/events.py``; ENUM/SET by their member names, zero dates as text, TIMESTAMP
as a naive UTC datetime), rendered as TiDB prints them (temporal values with the column's fractional digits).

``python -m applier.devtools.dumpling --out DIR --rows 100000`` writes a synthetic table for the load benchmark
(README, "Seeding a replica").
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import random
import re
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Sequence

from applier import mysql_values as T
from applier.devtools.encoders.values import format_date, format_decimal

__all__ = ["DumpTable", "write_export", "escape_name", "sql_value", "csv_value", "create_table_sql", "main"]


@dataclass
class DumpTable:
    """One upstream table: its columns' full MySQL types in table order, its rows, and how it is written."""

    schema: str
    name: str
    types: dict[str, str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    key: tuple[str, ...] = ("id",)
    filetype: str = "sql"  # sql | csv
    rows_per_file: int = 0  # 0: everything in one file
    compress: bool = False  # gzip the data files (.gz)
    generated: dict[str, str] = field(default_factory=dict)  # column -> expression (not exported, as Dumpling does)
    create: str | None = None  # the CREATE TABLE; default: built from types and key


_NAME_ESCAPE = re.compile(r"[\x00-\x1f%\"*./:<>?\\|]|-(?i:schema)")


def escape_name(name: str) -> str:
    """A database or table name as Dumpling puts it in a file name."""
    return _NAME_ESCAPE.sub(lambda m: f"%{ord(m.group(0)[0]):02X}{m.group(0)[1:]}", name)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def create_table_sql(t: DumpTable) -> str:
    if t.create is not None:
        return t.create
    cols = []
    for c, full in t.types.items():
        if c in t.generated:
            cols.append(f"  {_q(c)} {full} GENERATED ALWAYS AS ({t.generated[c]}) VIRTUAL")
        else:
            cols.append(f"  {_q(c)} {full}{' NOT NULL' if c in t.key else ' DEFAULT NULL'}")
    cols.append(f"  PRIMARY KEY ({', '.join(map(_q, t.key))}) /*T![clustered_index] CLUSTERED */")
    return (f"CREATE TABLE {_q(t.name)} (\n" + ",\n".join(cols)
            + "\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin")


# ---------------------------------------------------------------------------------------------------------
# values

_NUMBER_KIND = T.INTEGER_TYPES | T.FLOAT_TYPES | T.DECIMAL_TYPES  # bare in SQL and CSV (Dumpling's dataTypeNum)
_BYTES_KIND = T.BINARY_TYPES | {"bit"}  # hex in SQL, raw bytes in CSV (dataTypeBin)


def _fsp(full: str) -> int:
    m = re.search(r"\((\d+)\)", full)
    return int(m.group(1)) if m else 0


def _temporal(base: str, full: str, v: Any) -> str:
    fsp = _fsp(full)
    frac = (lambda us: f".{us:06d}"[: fsp + 1] if fsp else "")
    if isinstance(v, str):  # a zero date, as TiDB prints it
        return v + (frac(0) if base in ("datetime", "timestamp") and len(v) == 19 else "")
    if base == "date":
        return format_date(v)
    if base == "time":
        text = T.format_time(v).split(".")[0]
        us = abs((v.days * 86400 + v.seconds) * 1_000_000 + v.microseconds) % 1_000_000
        return text + frac(us)
    return (f"{v.year:04d}-{v.month:02d}-{v.day:02d} {v.hour:02d}:{v.minute:02d}:{v.second:02d}"
            + frac(v.microsecond))


def _raw(full: str, v: Any) -> bytes | str:
    """A value as Dumpling's row receiver holds it: the text TiDB sends, or raw bytes for binary kinds."""
    base, _ = T.split_mysql_type(full)
    if base == "bit":
        width = _fsp(full) or 1
        return int(v).to_bytes((width + 7) // 8, "big")
    if base in T.BINARY_TYPES:
        return bytes(v)
    if base in T.INTEGER_TYPES:
        return str(int(v))
    if base == "year":
        return f"{int(v):04d}" if v else "0000"
    if base == "float":
        return repr(T.shortest_float32(v))
    if base == "double":
        return repr(float(v))
    if base == "decimal":
        return format_decimal(v if isinstance(v, Decimal) else Decimal(v))
    if base in ("date", "datetime", "timestamp", "time"):
        return _temporal(base, full, v)
    return str(v)


_SQL_ESC = {0: b"\\0", 10: b"\\n", 13: b"\\r", 92: b"\\\\", 39: b"\\'", 34: b'\\"', 26: b"\\Z"}


def _escape_bytes(data: bytes, table: dict[int, bytes]) -> bytes:
    out = bytearray()
    for b in data:
        esc = table.get(b)
        if esc is None:
            out.append(b)
        else:
            out += esc
    return bytes(out)


def sql_value(full: str, v: Any, *, escape_backslash: bool = True) -> bytes:
    """One value as Dumpling writes it in an INSERT statement."""
    if v is None:
        return b"NULL"
    base, _ = T.split_mysql_type(full)
    raw = _raw(full, v)
    if base in _BYTES_KIND:
        return b"x'" + raw.hex().encode() + b"'"  # type: ignore[union-attr]
    if base in _NUMBER_KIND:
        return raw.encode()  # type: ignore[union-attr]
    data = raw.encode() if isinstance(raw, str) else raw
    if escape_backslash:
        return b"'" + _escape_bytes(data, _SQL_ESC) + b"'"
    return b"'" + data.replace(b"'", b"''") + b"'"


def csv_value(full: str, v: Any, *, escape_backslash: bool = True, delimiter: bytes = b'"',
              null: bytes = b"\\N") -> bytes:
    """One value as Dumpling writes it in a CSV record."""
    if v is None:
        return null
    base, _ = T.split_mysql_type(full)
    raw = _raw(full, v)
    if base in _NUMBER_KIND:
        return raw.encode()  # type: ignore[union-attr]
    data = raw.encode() if isinstance(raw, str) else raw
    if escape_backslash:
        table = {0: b"\\0", 13: b"\\r", 10: b"\\n", 92: b"\\\\", delimiter[0]: b"\\" + delimiter}
        return delimiter + _escape_bytes(data, table) + delimiter
    return delimiter + data.replace(delimiter, delimiter + delimiter) + delimiter


# ---------------------------------------------------------------------------------------------------------
# files


def _write(path: Path, data: bytes, compress: bool) -> Path:
    if compress:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


def metadata_text(snapshot_ts: int | None, server: str = "tidb") -> str:
    now = time.strftime("%Y-%m-%d %H:%M:%S")
    if server == "tidb":
        block = f"SHOW MASTER STATUS:\n\tLog: tidb-binlog\n\tPos: {snapshot_ts}\n\tGTID:\n\n"
    else:
        block = ("SHOW MASTER STATUS:\n\tLog: mysql-bin.000003\n\tPos: 7502\n"
                 "\tGTID:6ce40be3-e359-11e9-87e0-36933cb0ca5a:1-29\n\n")
    return f"Started dump at: {now}\n{block}Finished dump at: {now}\n"


def write_export(root: Path, tables: Sequence[DumpTable], *, snapshot_ts: int | None, server: str = "tidb",
                 escape_backslash: bool = True, csv_header: bool = True, statement_rows: int = 100,
                 complete_insert: bool = False) -> list[Path]:
    """Write ``tables`` as Dumpling would export them at ``snapshot_ts`` into ``root``; returns the data files.
    A table with no rows gets no data file (Dumpling writes none)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "metadata").write_text(metadata_text(snapshot_ts, server))
    files: list[Path] = []
    for schema in dict.fromkeys(t.schema for t in tables):
        (root / f"{escape_name(schema)}-schema-create.sql").write_text(
            f"/*!40101 SET NAMES binary*/;\nCREATE DATABASE {_q(schema)} /*!40100 DEFAULT CHARACTER SET utf8mb4 */;\n")
    for t in tables:
        stem = f"{escape_name(t.schema)}.{escape_name(t.name)}"
        (root / f"{stem}-schema.sql").write_text(f"/*!40101 SET NAMES binary*/;\n{create_table_sql(t)};\n")
        cols = [c for c in t.types if c not in t.generated]
        per = t.rows_per_file or max(1, len(t.rows))
        for i, lo in enumerate(range(0, len(t.rows), per)):
            chunk = t.rows[lo:lo + per]
            path = root / f"{stem}.{i:09d}.{t.filetype}"
            if t.filetype == "sql":
                data = _sql_file(t, cols, chunk, escape_backslash, statement_rows,
                                 complete_insert or bool(t.generated))
            else:
                data = _csv_file(t, cols, chunk, escape_backslash, csv_header)
            files.append(_write(path, data, t.compress))
    return files


def _sql_file(t: DumpTable, cols: list[str], rows: list[dict[str, Any]], escape_backslash: bool,
              statement_rows: int, column_list: bool) -> bytes:
    head = f"INSERT INTO {_q(t.name)}" + (f" ({','.join(map(_q, cols))})" if column_list else "") + " VALUES\n"
    out = [b"/*!40101 SET NAMES binary*/;\n/*!40014 SET FOREIGN_KEY_CHECKS=0*/;\n"]
    for lo in range(0, len(rows), statement_rows):
        tuples = [b"(" + b",".join(sql_value(t.types[c], r.get(c), escape_backslash=escape_backslash) for c in cols)
                  + b")" for r in rows[lo:lo + statement_rows]]
        out.append(head.encode() + b",\n".join(tuples) + b";\n")
    return b"".join(out)


def _csv_file(t: DumpTable, cols: list[str], rows: list[dict[str, Any]], escape_backslash: bool,
              header: bool) -> bytes:
    out = []
    if header:
        out.append(b",".join(csv_value("varchar(64)", c, escape_backslash=escape_backslash) for c in cols) + b"\r\n")
    for r in rows:
        out.append(b",".join(csv_value(t.types[c], r.get(c), escape_backslash=escape_backslash) for c in cols)
                   + b"\r\n")
    return b"".join(out)


# ---------------------------------------------------------------------------------------------------------
# a synthetic table for the load benchmark

BENCH_TYPES = {"id": "bigint", "customer": "varchar(64)", "amount": "decimal(12,2)", "note": "text",
               "created": "datetime(6)", "flag": "bit(1)", "payload": "varbinary(32)"}


def bench_rows(n: int, seed: int = 11) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    base = dt.datetime(2026, 1, 1)
    names = ["Ann", "Bo", "Zoë", "Ξένια", "李", "O'Brien", 'say "hi"', "back\\slash"]
    return [{"id": i, "customer": rng.choice(names), "amount": Decimal(rng.randint(-10**8, 10**8)) / 100,
             "note": rng.choice([None, "", "first order", "line\nbreak", "naïve ☃ 🚀", "NULL", "\\N"]),
             "created": base + dt.timedelta(seconds=rng.randint(0, 10**8), microseconds=rng.randint(0, 999999)),
             "flag": rng.randint(0, 1), "payload": rng.randbytes(rng.randint(0, 32))} for i in range(1, n + 1)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m applier.devtools.dumpling",
                                 description="Write a synthetic Dumpling export (one table) for `applier load`.")
    ap.add_argument("--out", required=True, help="the export folder to write")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--filetype", choices=["sql", "csv"], default="sql")
    ap.add_argument("--files", type=int, default=4, help="data files the rows are split into")
    ap.add_argument("--schema", default="bench")
    ap.add_argument("--table", default="orders")
    ap.add_argument("--snapshot-ts", type=int, default=0, help="default: the current time as a TSO")
    args = ap.parse_args(argv)
    ts = args.snapshot_ts or (int(time.time() * 1000) << 18)
    rows = bench_rows(args.rows)
    t = DumpTable(args.schema, args.table, BENCH_TYPES, rows, filetype=args.filetype,
                  rows_per_file=max(1, -(-len(rows) // max(1, args.files))))
    files = write_export(Path(args.out), [t], snapshot_ts=ts)
    print(f"wrote {len(rows):,} rows of {args.schema}.{args.table} in {len(files)} {args.filetype} file(s) to "
          f"{args.out} at snapshot ts {ts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
