"""``python -m applier.devtools.bench_columnar``: what each step of a columnar path would cost (issue 25).

Why: issue 25 asks for half the applier's CPU per row change. Today every row change becomes Python objects in
Spark's Python workers (the codec), is block-encoded there and rebuilt in the driver (:mod:`applier.blocks`,
:mod:`applier.decode`), goes through the resolved-ts gate one event at a time (:mod:`applier.gate`), is collapsed
per key (:func:`applier.sinks.plan.plan_batch`) and written row by row (psycopg's COPY ``write_row`` on
PostgreSQL, PyMySQL's ``executemany`` on MariaDB). A columnar path would keep a micro-batch as Arrow arrays from
the Kafka record to the target and let C++ do the per-row work. Before writing it, this tool measures each step
of both on the same input, side by side, in CPU µs per message or row (``time.process_time`` of this process,
the best of ``--repeat`` runs: the least disturbed by whatever else runs on the machine):

* ``decode`` (Canal-JSON messages of the benchmark generator, :func:`applier.devtools.bench_stream.generate_bench`,
  as Kafka record batches of up to :data:`ARROW_BATCH` messages per partition, as Spark's ``mapInArrow`` hands
  them over). Today: :func:`applier.decode.decode_arrow_batches` (the workers' decode and block encoding) and
  :func:`applier.decode.decode_chunks` (the driver's rebuild). Columnar: :func:`columnar_decode`, i.e. the
  values newline-joined, ``pyarrow.json.read_json`` with the message's schema, ``data`` and ``old`` flattened and
  every column cast to its type (the ISO-8859-1 text Canal-JSON carries binary columns in turned back into bytes
  by :func:`latin1_to_binary`). Also shown: ``to_pylist()`` of the decoded columns, what turning Arrow back into
  Python values would cost wherever a step stays in Python. The columnar values are checked, not just timed:
  every row's ``data`` image against the Python decoder's (its ``after``; ``before`` for a delete) and every
  update's ``old`` image against its ``before``, column by column, type included.
* ``gate`` (the same generator's stream, decoded by the product's decoder outside the timing, one micro-batch, an
  applied resolved ts :data:`APPLIED_FRACTION` of the way through the stream so that the first rule drops
  something, the generator's TiCDC replays for the second). Today: :meth:`applier.gate.Gate.add`,
  :meth:`~applier.gate.Gate.release` and :func:`~applier.sinks.plan.plan_batch` per table. Columnar:
  :func:`columnar_gate` with ``pyarrow.compute`` on the rows as Arrow arrays (built outside the timing: the
  columnar decode would hand them over): drop ``ts <= applied`` and above the global resolved ts, drop exact
  copies, commit-ts order, each key's last version. Both must leave the same rows (upserted keys and versions,
  deleted keys); a row count alone would not do (the first prototype took ``sort_indices`` of the surviving row
  indices: the right count of the wrong rows).
* ``pg`` (``--rows`` bench rows into a fresh table). Today: the writer's binary COPY
  (:func:`applier.sinks.postgres.binary_copy_types` and psycopg's ``write_row``, as ``PostgresSink._copy``).
  Columnar: ``adbc_driver_postgresql``'s ``adbc_ingest`` of an Arrow table (not a project dependency: skipped,
  with the install command, when missing). Both loads are checked against the generator's rows.
* ``mariadb`` (the same rows). Today: PyMySQL ``executemany`` of the writer's ``INSERT ... ON DUPLICATE KEY
  UPDATE`` in chunks of the writer's 5000 rows. Columnar: ``pyarrow.csv`` writes the Arrow table to a file
  (binary columns hex-encoded by :func:`binary_to_hex`), ``LOAD DATA LOCAL INFILE`` into a staging table, then
  ``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE``. Both are checked row by row against the generator's rows,
  and any column that differs is printed. (The first prototype of this path wrote NULL as an empty field, which
  ``LOAD DATA`` reads as '' with an empty ``ESCAPED BY``: NULL notes became '' and NULL payloads b''. The file
  now writes NULL as the unquoted word ``NULL`` (:data:`CSV_NULL`), which LOAD DATA reads as NULL while every
  string value is quoted, so a note 'NULL' stays text; ``--csv-null ''`` brings the mismatch back.) Raw bytes
  cannot go into the text file (``pyarrow.csv`` refuses a binary value that is not UTF-8, and LOAD DATA would
  read it in the file's character set), hence the hex.
* ``sink`` (the product's writer, :meth:`applier.sinks.mysql.MySQLSink.upsert_rows`, on the same bench rows in
  chunks of its ``batch_rows``, 5000; the rows adapted outside the timing, as ``Sink.write`` hands them over).
  Today: executemany (an engine without local_infile). Columnar: the LOAD DATA path of
  :mod:`applier.sinks.mysql_load` (an engine made by ``enable_local_infile``): its own text file, LOAD DATA into a
  temporary stage, ``INSERT ... SELECT ... ON DUPLICATE KEY UPDATE``, ``DELETE`` of the stage. Both into an empty
  table (inserts) and again over it with the rows' next version (updates), each table checked against the
  generator's rows and the two tables against each other. Then the crossover that sets
  :data:`applier.sinks.mysql_load.MIN_ROWS`: both paths at chunk sizes of :data:`SWEEP_SIZES` rows
  (:data:`SWEEP_ROWS` rows each), the LOAD DATA path forced at every size. The load average is printed with it
  (the server shares the machine: its work is in the wall time).

The database figures are the client's CPU only: LOAD DATA and INSERT ... SELECT move work to the server, whose
CPU is not in them (the wall time, also shown, includes it, on a shared machine). What is not measured: the
Arrow exchange with Spark, the writers' value adaptation (:mod:`applier.sinks.adapt`; for the bench's types on
PostgreSQL one C-level scan of the value types per column and batch), the PostgreSQL merge statement after the
COPY (the same for both loads), and the rules of the product that the columnar gate leaves out (see
:func:`columnar_gate`). So the columnar figures are a projection of what the steps
cost, not of a working applier.

Tooling: the product never imports it. ``decode`` and ``gate`` need nothing running; ``pg`` and ``mariadb`` use the
running services (APPLIER_PG_URL, APPLIER_MARIADB_URL), create the schema :data:`SCHEMA` and drop it at the end.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import operator
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from applier.devtools.bench_parts import _count, comma_choices
from applier.devtools.bench_stream import BENCH_COLUMN_NAMES, BENCH_TYPES, bench_canonical, bench_row

PARTS = ("decode", "gate", "pg", "mariadb", "sink")
#: the ``sink`` part's crossover sweep: chunk sizes, and rows written at each
SWEEP_SIZES = (16, 32, 64, 128, 256, 512, 1024)
SWEEP_ROWS = 10_240
SCHEMA = "bench_columnar"
KEY = "id"
TOPIC = "bench-columnar"
#: messages per Arrow record batch handed to the decoders: Spark's spark.sql.execution.arrow.maxRecordsPerBatch
ARROW_BATCH = 10_000
#: the gate's applied resolved ts: the commit ts this share of the way through the row changes
APPLIED_FRACTION = 0.05
#: rows per executemany, as MySQLSink (its batch_rows)
MARIADB_CHUNK = 5000
#: how the LOAD DATA file writes NULL: unquoted, the word NULL is read as NULL (ENCLOSED BY set, ESCAPED BY empty)
CSV_NULL = "NULL"
ADBC_INSTALL = "pip install adbc-driver-postgresql"
#: PostgreSQL shape of the bench table (applier/ddl/pg_types.py's map of bench_table_ddl's MySQL types)
PG_DDL = ("CREATE TABLE {table} (id bigint PRIMARY KEY, grp bigint NOT NULL, name varchar(64) NOT NULL, "
          "amount numeric(14,2) NOT NULL, ratio double precision NOT NULL, created timestamp(6) NOT NULL, "
          "day date NOT NULL, flag smallint NOT NULL, note text, payload bytea, ver bigint NOT NULL)")
OP_CODES = {"insert": 0, "update": 1, "delete": 2}  # Op.value -> the int8 code of the columnar gate
INSERT, UPDATE, DELETE = 0, 1, 2

T = TypeVar("T")
Log = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m applier.devtools.bench_columnar", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=_count, default=100_000,
                   help="row changes of the generated stream (decode, gate) and rows loaded (pg, mariadb); 100k")
    p.add_argument("--repeat", type=int, default=3, help="runs of each figure, the best one counts (3)")
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--csv-null", default=CSV_NULL, metavar="TEXT",
                   help=f"how the LOAD DATA file writes NULL ({CSV_NULL!r}); '' reproduces the first prototype, whose "
                        "NULLs came back as '' (the check prints it)")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    a = p.parse_args(argv)
    a.only = comma_choices(p, "--only", a.only, PARTS)
    if a.rows < 10:
        p.error("--rows must be >= 10")
    if a.repeat < 1:
        p.error("--repeat must be >= 1")
    return a


@dataclass
class Timing:
    """The best (least) process CPU and wall seconds over the runs: the figure least disturbed by the rest of the
    machine (CPU and wall are each the minimum, possibly of different runs)."""

    cpu_s: float
    wall_s: float
    runs: int


def best_of(run: Callable[[], T], repeat: int, setup: Callable[[], Any] | None = None) -> tuple[Timing, T]:
    """Call ``run`` ``repeat`` times (``setup`` before each, untimed); the best timings and the last result."""
    cpu = wall = math.inf
    out: Any = None
    for _ in range(max(1, repeat)):
        if setup is not None:
            setup()
        c, w = time.process_time(), time.perf_counter()
        out = run()
        cpu = min(cpu, time.process_time() - c)
        wall = min(wall, time.perf_counter() - w)
    return Timing(cpu, wall, max(1, repeat)), out


def per_unit(seconds: float | None, n: int) -> float | None:
    """Seconds for ``n`` units -> µs per unit, rounded (None when there is nothing to divide)."""
    if seconds is None or n <= 0:
        return None
    return round(1e6 * seconds / n, 2)


def figure(side: str, what: str, timing: Timing, n: int, unit: str, *, total: bool = True,
           wall: bool = False) -> dict[str, Any]:
    """One line of the report: ``side`` is "today" or "columnar"; ``total`` figures add up to the side's sum that
    the ratio compares; ``wall`` adds the wall time (for steps that make a server work)."""
    out = {"side": side, "what": what, "cpu_us": per_unit(timing.cpu_s, n), "unit": unit, "n": n, "total": total}
    if wall:
        out["wall_us"] = per_unit(timing.wall_s, n)
    return out


def side_totals(figures: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Per side, the sum of its ``total`` figures (µs per unit; they share the unit within a part)."""
    out: dict[str, float | None] = {}
    for f in figures:
        if not f.get("total"):
            continue
        side = f["side"]
        v = f.get("cpu_us")
        prev = out.get(side, 0.0)
        out[side] = None if v is None or prev is None else round(prev + v, 2)
    return out


def ratio(today: float | None, columnar: float | None) -> float | None:
    """How many times today's CPU the columnar step's is (today / columnar)."""
    if today is None or not columnar:
        return None
    return round(today / columnar, 1)


def arrow_type(mysql_type: str) -> Any:
    """The Arrow type a columnar decoder gives a column of this MySQL type (``"int unsigned"``,
    ``"decimal(14,2)"``): the narrowest exact one, so that a cast also range-checks. Only what the bench shape
    uses (and its near relatives); anything else is refused rather than guessed."""
    import pyarrow as pa

    t = " ".join(mysql_type.lower().split())
    unsigned = t.endswith(" unsigned")
    base = t.removesuffix(" unsigned")
    name, _, args = base.partition("(")
    ints = {"tinyint": 8, "smallint": 16, "mediumint": 32, "int": 32, "integer": 32, "bigint": 64}
    if name in ints:
        bits = ints[name]
        return getattr(pa, f"{'u' if unsigned else ''}int{bits}")()
    if name == "decimal":
        p, _, s = args.rstrip(")").partition(",")
        precision, scale = int(p or 10), int(s or 0)
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    if name == "double":
        return pa.float64()
    if name in ("datetime", "timestamp"):
        return pa.timestamp("us")
    if name == "date":
        return pa.date32()
    if name in ("char", "varchar", "text", "tinytext", "mediumtext", "longtext"):
        return pa.string()
    if name in ("binary", "varbinary", "blob", "tinyblob", "mediumblob", "longblob"):
        return pa.binary()
    raise ValueError(f"no columnar type for MySQL type {mysql_type!r} in this bench")


def _offsets(arr: Any) -> tuple[Any, Any]:
    """(offsets relative to the first value, the values' bytes) of a string/binary Arrow array, as numpy
    arrays (no copies)."""
    import numpy as np
    import pyarrow as pa

    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    width = np.int64 if large else np.int32
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], width, len(arr) + 1, arr.offset * np.dtype(width).itemsize)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    return off - off[0], data[off[0]:off[-1]]


def _validity(arr: Any) -> Any:
    """A validity bitmap for ``arr`` that starts at its first value (a sliced array's own bitmap does not)."""
    import pyarrow.compute as pc

    if not arr.null_count:
        return None
    return pc.is_valid(arr).buffers()[1]


def latin1_to_binary(arr: Any) -> Any:
    """A string array of ISO-8859-1 text (how Canal-JSON carries BINARY/VARBINARY/BLOB values: one character per
    byte) -> the binary array of those bytes, in numpy without a Python step per value.

    In UTF-8, U+0000..U+007F is one byte and U+0080..U+00FF is 0xC2/0xC3 followed by one continuation byte; so each
    0xC2/0xC3 is dropped and folded into the byte after it, and the offsets shrink by the lead bytes before them. A
    character above U+00FF (a lead byte from 0xC4) is not ISO-8859-1: ValueError, as the Python decoder refuses it."""
    import numpy as np
    import pyarrow as pa

    rel, b = _offsets(arr)
    lead = b >= 0xC0
    if (b >= 0xC4).any():
        raise ValueError("a binary column's text holds a character above U+00FF: not ISO-8859-1")
    at = np.flatnonzero(lead)
    out = b.copy()
    out[at + 1] = ((b[at] & 0x03) << 6) | (b[at + 1] & 0x3F)
    before = np.concatenate(([0], np.cumsum(lead, dtype=np.int64)))
    new_off = (rel - before[rel]).astype(np.int32 if rel.dtype == np.int32 else np.int64)
    typ = pa.binary() if new_off.dtype == np.int32 else pa.large_binary()
    return pa.Array.from_buffers(typ, len(arr), [_validity(arr), pa.py_buffer(new_off), pa.py_buffer(out[~lead])],
                                 arr.null_count)


@functools.lru_cache(maxsize=1)
def _hex_digits() -> Any:
    """Per byte value, its two lowercase hex digits (a 256 x 2 numpy array of ASCII codes)."""
    import numpy as np

    return np.frombuffer(bytes(range(256)).hex().encode(), np.uint8).reshape(256, 2)


def binary_to_hex(arr: Any) -> Any:
    """A binary array -> a string array of each value's lowercase hex (NULL stays NULL), in numpy: what
    ``LOAD DATA ... SET col = UNHEX(@col)`` reads back exactly (raw bytes in a text file would be read in the file's
    character set)."""
    import numpy as np
    import pyarrow as pa

    rel, b = _offsets(arr)
    doubled = rel.astype(np.int64) * 2
    large = doubled[-1] >= 2 ** 31
    new_off = doubled if large else doubled.astype(np.int32)
    return pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(arr),
                                 [_validity(arr), pa.py_buffer(new_off), pa.py_buffer(_hex_digits()[b].reshape(-1))],
                                 arr.null_count)


def canal_schema(types: Mapping[str, str]) -> Any:
    """The Arrow schema of one Canal-JSON message (TiDB extension) of a table with ``types`` (column -> MySQL
    type): every field TiCDC writes, so the parse costs what a full decode would; the row images as structs of
    strings (Canal-JSON's values are text), cast by :func:`columnar_decode`."""
    import pyarrow as pa

    s = pa.string()
    row = pa.struct([(c, s) for c in types])
    return pa.schema([
        ("id", pa.int64()), ("database", s), ("table", s), ("pkNames", pa.list_(s)), ("isDdl", pa.bool_()),
        ("type", s), ("es", pa.int64()), ("ts", pa.int64()), ("sql", s),
        ("sqlType", pa.struct([(c, pa.int32()) for c in types])), ("mysqlType", pa.struct([(c, s) for c in types])),
        ("data", pa.list_(row)), ("old", pa.list_(row)),
        ("_tidb", pa.struct([("commitTs", pa.uint64()), ("watermarkTs", pa.uint64())])),
    ])


def _cast_image(flat: Any, arrow_types: Mapping[str, Any]) -> dict[str, Any]:
    """The columns of a flattened image (struct of strings) cast to their types; binary via ISO-8859-1."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = {}
    for name, typ in arrow_types.items():
        col = flat.field(name)
        if pa.types.is_binary(typ):
            out[name] = latin1_to_binary(col)
        elif pa.types.is_string(typ):
            out[name] = col
        else:
            out[name] = pc.cast(col, typ)
    return out


def read_canal(batch: Any, schema: Any) -> Any:
    """The parse alone: a record batch's values newline-joined (in C++) and read by ``pyarrow.json`` with the
    message schema, on one thread (a Spark task has one core)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    values = batch.column(4)
    one = pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)
    joined = pc.binary_join(one, b"\n")[0].as_buffer()  # JSON writers escape newlines inside strings
    t = pj.read_json(pa.BufferReader(joined),
                     read_options=pj.ReadOptions(use_threads=False, block_size=max(1 << 20, 2 * joined.size)),
                     parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"))
    if t.num_rows != len(values):
        raise ValueError(f"{len(values)} messages, {t.num_rows} JSON objects")
    return t


def columnar_decode(batch: Any, schema: Any, arrow_types: Mapping[str, Any]) -> dict[str, Any]:
    """One Kafka record batch (topic, partition, offset, key, value) of Canal-JSON messages -> the row changes as
    Arrow arrays: per row (one per ``data`` element) its position, commit ts, schema, table and type, the ``data``
    image's columns (``image``), and per update row the ``old`` image's columns (``old``); per watermark its
    partition, offset and ts. DDL messages are left aside (``ddl_rows``: their index in the batch)."""
    import pyarrow.compute as pc

    t = read_canal(batch, schema)
    data = t.column("data").combine_chunks()
    parent = pc.list_parent_indices(data)
    tidb = t.column("_tidb").combine_chunks()
    kind = t.column("type").combine_chunks()
    old = t.column("old").combine_chunks()
    old_parent = pc.list_parent_indices(old)
    watermark = pc.equal(kind, "TIDB_WATERMARK")
    return {
        "partition": pc.take(batch.column(1), parent), "offset": pc.take(batch.column(2), parent),
        "commit_ts": pc.take(tidb.field("commitTs"), parent),
        "schema": pc.take(t.column("database"), parent), "table": pc.take(t.column("table"), parent),
        "type": pc.take(kind, parent),
        "image": _cast_image(pc.list_flatten(data), arrow_types),
        "old": _cast_image(pc.list_flatten(old), arrow_types),
        "old_offset": pc.take(batch.column(2), old_parent),
        "watermarks": {"partition": batch.column(1).filter(watermark), "offset": batch.column(2).filter(watermark),
                       "ts": tidb.field("watermarkTs").filter(watermark)},
        "ddl_rows": pc.indices_nonzero(t.column("isDdl").combine_chunks().fill_null(False)),
    }


def same_value(a: Any, b: Any) -> bool:
    """Equal and of the same type; floats and decimals also in their text (so -0.0 differs from 0.0 and 1.10
    from 1.1), as an exact copy of a value must be."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) or type(a).__name__ == "Decimal":
        return repr(a) == repr(b)
    return a == b


def canonical_equal(column: str) -> Callable[[Any, Any], bool]:
    """Equal in the bench checksum's text of ``column`` (for values read back from a database, whose driver types
    may differ: memoryview for bytes, Decimal scale)."""
    cols = (column,)
    return lambda a, b: bench_canonical({column: a}, cols) == bench_canonical({column: b}, cols)


def _shown(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def compare_columns(got: Mapping[str, Sequence[Any]], want: Sequence[Mapping[str, Any]], columns: Sequence[str],
                    equal: Callable[[str], Callable[[Any, Any], bool]] | None = None,
                    label: Callable[[int], str] | None = None) -> dict[str, Any]:
    """Column by column, ``got`` (column -> values) against ``want`` (rows): per column the mismatch count and the
    first mismatch, worded. ``equal(column)`` gives the comparison (default :func:`same_value`); ``label(i)``
    names row i in the example (default its index)."""
    n_got = min((len(got[c]) for c in columns), default=0)
    n = min(n_got, len(want))
    out: dict[str, Any] = {"rows": n, "rows_got": n_got, "rows_want": len(want), "columns": {}}
    for c in columns:
        eq = equal(c) if equal else same_value
        values = got[c]
        bad = 0
        first = None
        for i in range(n):
            a, b = values[i], want[i][c]
            if not eq(a, b):
                bad += 1
                if first is None:
                    first = f"{label(i) if label else f'row {i}'}: got {_shown(a)}, want {_shown(b)}"
        out["columns"][c] = {"mismatches": bad, **({"first": first} if first else {})}
    return out


def check_ok(check: Mapping[str, Any]) -> bool:
    """A comparison of :func:`compare_columns` found every row and every value equal."""
    return (check["rows_got"] == check["rows_want"]
            and all(c["mismatches"] == 0 for c in check["columns"].values()))


def exact_columns(check: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(columns without a mismatch, columns with one)."""
    cols = check["columns"]
    return [c for c, v in cols.items() if not v["mismatches"]], [c for c, v in cols.items() if v["mismatches"]]


def kafka_batches(messages: Iterable[tuple[int, bytes | None, bytes]], topic: str = TOPIC,
                  batch: int = ARROW_BATCH) -> tuple[list[Any], list[Any]]:
    """Generator messages -> (KafkaMessage list, Arrow record batches as Spark hands them to ``mapInArrow``: per
    partition, up to ``batch`` messages each), with per-partition offsets."""
    import pyarrow as pa

    from applier.events import KafkaMessage

    per: dict[int, list[KafkaMessage]] = {}
    for part, key, value in messages:
        msgs = per.setdefault(part, [])
        msgs.append(KafkaMessage(topic, part, len(msgs), key, value))
    batches = []
    for part in sorted(per):
        msgs = per[part]
        for lo in range(0, len(msgs), batch):
            s = msgs[lo:lo + batch]
            batches.append(pa.RecordBatch.from_arrays(
                [pa.array([m.topic for m in s]), pa.array([m.partition for m in s], pa.int32()),
                 pa.array([m.offset for m in s], pa.int64()), pa.array([m.key for m in s], pa.binary()),
                 pa.array([m.value for m in s], pa.binary())],
                names=["topic", "partition", "offset", "key", "value"]))
    return [m for part in sorted(per) for m in per[part]], batches


def applied_cut(events: Iterable[Any], fraction: float) -> int:
    """An applied resolved ts for the gate: the commit ts ``fraction`` of the way through the row changes' commit
    ts, so that the gate's first rule (drop what is at or below the applied ts) drops about that share. (The
    stream's own resolved ts come about once per second of upstream time, too seldom in a short stream to cut
    near ``fraction``.)"""
    from applier.events import RowChange

    ts = sorted(e.commit_ts for e in events if isinstance(e, RowChange))  # events come partition by partition
    if not ts:
        return 0
    return ts[min(len(ts) - 1, int(fraction * len(ts)))]


def gate_tables(events: Iterable[Any], tables: Sequence[str], arrow_types: Mapping[str, Any],
                key: str = KEY) -> tuple[Any, Any]:
    """Decoded events -> (row changes, watermarks) as Arrow tables for :func:`columnar_gate`: per row change its
    commit ts, partition, offset, table number, op code, key (of its image: ``after``, ``before`` for a delete),
    the old key of an update (else null) and the image's columns; per watermark its partition and ts. DDL is left
    out (the columnar gate handles rows)."""
    import pyarrow as pa

    from applier.events import Resolved, RowChange

    number = {t: i for i, t in enumerate(tables)}
    cols: dict[str, list[Any]] = {c: [] for c in ("ts", "part", "off", "tbl", "op", "key", "bkey", *arrow_types)}
    marks: dict[str, list[int]] = {"part": [], "ts": []}
    for e in events:
        if isinstance(e, Resolved):
            marks["part"].append(e.position.partition)
            marks["ts"].append(e.ts)
            continue
        if not isinstance(e, RowChange):
            continue
        op = OP_CODES[e.op.value]
        image = e.before if op == DELETE else e.after
        cols["ts"].append(e.commit_ts)
        cols["part"].append(e.position.partition)
        cols["off"].append(e.position.offset)
        cols["tbl"].append(number[e.table])
        cols["op"].append(op)
        cols["key"].append(image[key])
        cols["bkey"].append(e.before[key] if op == UPDATE and e.before else None)
        for c in arrow_types:
            cols[c].append(image[c])
    fixed = {"ts": pa.int64(), "part": pa.int32(), "off": pa.int64(), "tbl": pa.int32(), "op": pa.int8(),
             "key": pa.int64(), "bkey": pa.int64()}
    rows = pa.table({c: pa.array(v, fixed.get(c) or arrow_types[c]) for c, v in cols.items()})
    return rows, pa.table({"part": pa.array(marks["part"], pa.int32()), "ts": pa.array(marks["ts"], pa.int64())})


def columnar_gate(rows: Any, watermarks: Any, applied_ts: int, partitions: int) -> dict[str, Any]:
    """The gate's and the plan's per-row work on Arrow arrays (``pyarrow.compute``), one micro-batch:

    * the global resolved ts (the lowest over partitions of each one's highest watermark; 0 while a partition has
      not reported), and only changes with ``applied_ts < ts <=`` it;
    * exact copies (same commit ts, table, op, key, old key and image) dropped, the first kept;
    * commit-ts order (ts, partition, offset, arrival);
    * per (table, key) its last version: upserted unless it is a delete; every key that saw a delete is deleted
      (the plan deletes first, then upserts, so a delete and re-insert keeps the row).

    Left out (so this is a projection, not a replacement): a key-changing update (refused here; TiCDC's MQ sinks
    send a key change as delete + insert, and so does the bench stream), the rule that a removal does not undo a
    write of the same commit ts, DDL barriers, held events across micro-batches and the restart offsets.
    Returns {"upserts": table of the surviving rows, "deletes": table of (tbl, key), "released": rows released}."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    highest = watermarks.group_by("part", use_threads=False).aggregate([("ts", "max")])
    limit = pc.min(highest["ts_max"]).as_py() if highest.num_rows >= partitions else 0
    x = rows.filter(pc.and_(pc.greater(rows["ts"], applied_ts), pc.less_equal(rows["ts"], limit or 0)))
    moved = pc.sum(pc.and_(pc.equal(x["op"], UPDATE), pc.not_equal(x["bkey"], x["key"]))).as_py()
    if moved:
        raise NotImplementedError("the columnar gate does not handle key-changing updates")
    x = x.append_column("_i", pa.array(np.arange(x.num_rows, dtype=np.int64)))
    identity = [c for c in x.column_names if c not in ("part", "off", "_i")]
    first = x.group_by(identity, use_threads=False).aggregate([("_i", "min")]).column("_i_min")
    x = x.take(_sorted(first))  # the rows that are no copy, in arrival order
    x = x.take(pc.sort_indices(x, sort_keys=[("ts", "ascending"), ("part", "ascending"), ("off", "ascending"),
                                             ("_i", "ascending")]))
    x = x.set_column(x.column_names.index("_i"), "_i", pa.array(np.arange(x.num_rows, dtype=np.int64)))
    last = x.group_by(["tbl", "key"], use_threads=False).aggregate([("_i", "max")]).column("_i_max")
    final = x.take(_sorted(last))  # each key's last version, in commit order
    deletes = x.filter(pc.equal(x["op"], DELETE)).select(["tbl", "key"])
    deletes = deletes.group_by(["tbl", "key"], use_threads=False).aggregate([])
    return {"upserts": final.filter(pc.not_equal(final["op"], DELETE)), "deletes": deletes, "released": x.num_rows}


def _sorted(indices: Any) -> Any:
    """Row indices (a group_by aggregate) in ascending order. (Taking ``sort_indices`` of them instead, as the
    first prototype did, takes the first rows of the table in that order: right count, wrong rows.)"""
    import pyarrow.compute as pc

    return pc.take(indices, pc.sort_indices(indices))


def today_gate(events: Sequence[Any], metas: Mapping[str, Any], applied_ts: int, partitions: int,
               topic: str = TOPIC) -> dict[str, Any]:
    """Today's path for one micro-batch: the gate (add, release), the released row changes grouped per table
    (as ``applier.apply``), ``plan_batch`` per table, and forget. Returns the plans per table and the count of
    row changes released."""
    from applier.events import RowChange
    from applier.gate import Gate
    from applier.sinks.plan import plan_batch

    gate = Gate(partitions=[(topic, p) for p in range(partitions)], applied_ts=applied_ts)
    gate.add(events)
    rel = gate.release()
    by_table: dict[str, list[Any]] = {}
    released = 0
    for ev in rel:
        if type(ev) is RowChange:
            by_table.setdefault(ev.table, []).append(ev)
            released += 1
    plans = {t: plan_batch(metas[t], changes) for t, changes in by_table.items()}
    rel.forget()
    gate.close()
    return {"plans": plans, "released": released}


def survivors_today(plans: Mapping[str, Any], tables: Sequence[str], key: str = KEY) -> tuple[set, set]:
    """(upserted (table number, key, ver), deleted (table number, key)) of today's plans."""
    number = {t: i for i, t in enumerate(tables)}
    up = {(number[t], r[key], r["ver"]) for t, p in plans.items() for r in p.upserts}
    dl = {(number[t], k[0]) for t, p in plans.items() for k in p.deletes}
    return up, dl


def survivors_columnar(result: Mapping[str, Any]) -> tuple[set, set]:
    """The same sets from :func:`columnar_gate`'s result."""
    u, d = result["upserts"], result["deletes"]
    up = set(zip(u["tbl"].to_pylist(), u["key"].to_pylist(), u["ver"].to_pylist()))
    dl = set(zip(d["tbl"].to_pylist(), d["key"].to_pylist()))
    return up, dl


def bench_metas(tables: Sequence[str], schema: str = "bench") -> dict[str, Any]:
    """TableMeta of the bench tables as the writer would read them (key ``id``), without a database."""
    from applier.sinks.table import build_meta

    cols = [(c, c in ("note", "payload"), False) for c in BENCH_COLUMN_NAMES]
    return {t: build_meta(schema, t, cols, (KEY,), [(KEY,)]) for t in tables}


def bench_rows(n: int, table: int = 1, version: int = 1, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` bench rows (keys 0..n-1) of one table: what the load figures write."""
    return [bench_row(table, k, version, seed) for k in range(n)]


def mariadb_statements(table: str, stage: str, columns: Sequence[str], key: str, path_literal: str,
                       binary: Iterable[str] = ()) -> dict[str, str]:
    """The SQL of both MariaDB paths, with quoted table names and a quoted file name (``conn.escape(path)``):
    the writer's upsert (``MySQLSink._upsert_sql``'s shape, the one PyMySQL's executemany turns into multi-row
    INSERTs), the LOAD DATA of the columnar file (the ``binary`` columns as hex, through a variable and UNHEX) and
    the merge."""
    q = [f"`{c}`" for c in columns]
    updates = ", ".join(f"{qc} = VALUES({qc})" for c, qc in zip(columns, q) if c != key)
    binary = set(binary)
    targets = ", ".join(f"@{c}" if c in binary else f"`{c}`" for c in columns)
    sets = ", ".join(f"`{c}` = UNHEX(@{c})" for c in columns if c in binary)
    return {
        "upsert": f"INSERT INTO {table} ({', '.join(q)}) VALUES ({', '.join(['%s'] * len(columns))}) "
                  f"ON DUPLICATE KEY UPDATE {updates}",
        "load": f"LOAD DATA LOCAL INFILE {path_literal} INTO TABLE {stage} CHARACTER SET utf8mb4 "
                "FIELDS TERMINATED BY '\\t' OPTIONALLY ENCLOSED BY '\"' ESCAPED BY '' LINES TERMINATED BY '\\n' "
                f"({targets})" + (f" SET {sets}" if sets else ""),
        "merge": f"INSERT INTO {table} ({', '.join(q)}) SELECT {', '.join(q)} FROM {stage} "
                 f"ON DUPLICATE KEY UPDATE {updates}",
    }


def csv_write_options(null: str = CSV_NULL) -> Any:
    """The LOAD DATA file's format: tab-separated, strings quoted (doubled quotes inside; ``ESCAPED BY ''``), NULL
    as ``null`` unquoted (the word NULL is read as NULL; an empty field would be read as '')."""
    import pyarrow.csv as pcsv

    return pcsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="needed", null_string=null)


def scratch_dir() -> str:
    """Where the LOAD DATA file goes: memory (/dev/shm) when there is one, else the temp directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def format_report(r: Mapping[str, Any]) -> str:
    """The side-by-side text report."""
    lines = [f"Columnar path, step by step (issue 25): CPU µs of this process, best of {r['repeat']}"]
    for name in PARTS:
        part = r["parts"].get(name)
        if part is None:
            continue
        lines.append("")
        lines.append(f"{name}: {part.get('title', '')}")
        if "error" in part:
            lines.append(f"  FAILED: {part['error'].splitlines()[0][:300]}")
            continue
        for f in part.get("figures", []):
            wall = f" (wall {f['wall_us']})" if f.get("wall_us") is not None else ""
            cpu = "n/a" if f["cpu_us"] is None else f"{f['cpu_us']:.2f}"
            lines.append(f"  {f['side']:<9} {f['what']:<56} {cpu:>8} µs/{f['unit']}{wall}")
        for s in part.get("skipped", []):
            lines.append(f"  skipped   {s}")
        totals = side_totals(part.get("figures", []))
        if "today" in totals and "columnar" in totals:
            x = ratio(totals["today"], totals["columnar"])
            lines.append(f"  today {totals['today']} / columnar {totals['columnar']} µs: "
                         f"{'n/a' if x is None else f'{x}x'}")
        for label, check in part.get("checks", {}).items():
            lines.extend(_check_lines(label, check))
        for note in part.get("notes", []):
            lines.append(f"  note: {note}")
    return "\n".join(lines)


def _check_lines(label: str, check: Mapping[str, Any]) -> list[str]:
    if "columns" not in check:  # a plain verdict
        return [f"  check {label}: {'OK' if check.get('ok') else 'MISMATCH'} {check.get('detail', '')}".rstrip()]
    exact, inexact = exact_columns(check)
    head = (f"  check {label}: {'OK' if check_ok(check) else 'MISMATCH'}, {check['rows']:,} rows compared"
            + ("" if check["rows_got"] == check["rows_want"] else
               f" (got {check['rows_got']:,} rows, want {check['rows_want']:,})"))
    out = [head, f"    exact: {', '.join(exact) or 'none'}"]
    for c in inexact:
        v = check["columns"][c]
        out.append(f"    {c}: {v['mismatches']:,} mismatches, first {v['first']}")
    return out


# ---------------------------------------------------------------------------------------------------------
# The measurements
# ---------------------------------------------------------------------------------------------------------

def _workload(n: int, seed: int) -> Any:
    from applier.devtools.bench_stream import generate_bench

    return generate_bench("canal-json", events=n, big_txn_rows=n // 10, seed=seed)


def measure_decode(n: int, repeat: int, seed: int, log: Log) -> dict[str, Any]:
    """The ``decode`` part (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from applier.decode import WorkerSpec, decode_arrow_batches, decode_chunks
    from applier.events import Op, RowChange

    w = _workload(n, seed)
    msgs, batches = kafka_batches(w.messages())
    log(f"decode: {len(msgs):,} Canal-JSON messages in {len(batches)} record batches")
    spec = WorkerSpec("canal-json", (), False, None)
    list(decode_arrow_batches(spec, iter([batches[0].slice(0, 500)])))  # the worker's decoder built and warm

    def worker() -> list[bytes]:
        return [b.column(0)[0].as_py() for b in decode_arrow_batches(spec, iter(batches))]

    t_worker, chunks = best_of(worker, repeat)
    t_driver, decoded = best_of(lambda: decode_chunks(chunks, {}), repeat)
    events = decoded.events
    row_events = [e for e in events if type(e) is RowChange]

    types = {c: BENCH_TYPES[c] for c in BENCH_COLUMN_NAMES}
    arrow_types = {c: arrow_type(t) for c, t in types.items()}
    schema = canal_schema(types)
    columnar_decode(batches[0].slice(0, 500), schema, arrow_types)
    t_col, outs = best_of(lambda: [columnar_decode(b, schema, arrow_types) for b in batches], repeat)
    image = {c: pa.concat_arrays([o["image"][c] for o in outs]) for c in BENCH_COLUMN_NAMES}
    t_parse, _ = best_of(lambda: [read_canal(b, schema) for b in batches], repeat)
    t_py, py = best_of(lambda: {c: a.to_pylist() for c, a in image.items()}, repeat)
    n_rows = len(image[KEY])

    want = [e.before if e.op is Op.DELETE else e.after for e in row_events]
    label = _position_label(row_events)
    checks = {"data image vs Python decoder": compare_columns(py, want, BENCH_COLUMN_NAMES, label=label)}
    updates = [e for e in row_events if e.op is Op.UPDATE]
    old = {c: pa.concat_arrays([o["old"][c] for o in outs]).to_pylist() for c in BENCH_COLUMN_NAMES}
    checks["old image vs before (updates)"] = compare_columns(old, [e.before for e in updates], BENCH_COLUMN_NAMES,
                                                              label=_position_label(updates))
    raw = pa.concat_arrays([pc.list_flatten(_raw_data(b)).field("payload") for b in batches[:1]]).to_pylist()
    raw_check = compare_columns({"payload": raw}, want[:len(raw)], ["payload"], label=label)
    ts_ok = pa.concat_arrays([o["commit_ts"] for o in outs]).to_pylist() == [e.commit_ts for e in row_events]
    checks["commit ts per row"] = {"ok": ts_ok, "detail": "" if ts_ok else "(differs from the Python decoder's)"}
    notes = [f"payload as read, without the ISO-8859-1 conversion (first record batch): "
             f"{raw_check['columns']['payload']['mismatches']:,} of {raw_check['rows']:,} differ "
             f"(str against bytes; NULLs agree)",
             f"today's driver rebuild per event (the unit of docs/benchmarks.md's driver decode times): "
             f"{per_unit(t_driver.cpu_s, len(events))} µs"]
    m = len(msgs)
    figures = [
        figure("today", "worker decode + block encode (decode_arrow_batches)", t_worker, m, "message"),
        figure("today", "driver rebuild (decode_chunks)", t_driver, m, "message"),
        figure("columnar", "read_json + flatten + casts + ISO-8859-1 -> bytes", t_col, m, "message"),
        figure("columnar", "  of which read_json alone (not summed)", t_parse, m, "message", total=False),
        figure("columnar", "to_pylist() of the image's columns (not summed)", t_py, n_rows, "row", total=False),
    ]
    return {"title": f"Canal-JSON, {m:,} messages, {len(row_events):,} row changes, {len(events):,} events",
            "messages": m, "row_changes": len(row_events), "events": len(events),
            "driver_us_per_event": per_unit(t_driver.cpu_s, len(events)),
            "figures": figures, "checks": checks, "notes": notes}


def _raw_data(batch: Any) -> Any:
    """A batch's ``data`` images as read, before any cast (for the unconverted-payload note)."""
    types = {c: BENCH_TYPES[c] for c in BENCH_COLUMN_NAMES}
    return read_canal(batch, canal_schema(types)).column("data").combine_chunks()


def _position_label(events: Sequence[Any]) -> Callable[[int], str]:
    def label(i: int) -> str:
        p = events[i].position if i < len(events) else None
        return f"row {i}" if p is None else f"row {i} (partition {p.partition} offset {p.offset})"
    return label


def measure_gate(n: int, repeat: int, seed: int, log: Log) -> dict[str, Any]:
    """The ``gate`` part (see the module docstring)."""
    from applier.codecs import get_decoder
    from applier.decode import decode_messages
    from applier.events import RowChange

    w = _workload(n, seed)
    msgs, _ = kafka_batches(w.messages())
    events = decode_messages(get_decoder("canal-json"), msgs, stop_at_error=True).events
    rows = sum(1 for e in events if type(e) is RowChange)
    cut = applied_cut(events, APPLIED_FRACTION)
    metas = bench_metas(w.table_names)
    at_or_below = sum(1 for e in events if type(e) is RowChange and e.commit_ts <= cut)
    log(f"gate: {len(events):,} events, {rows:,} row changes, applied ts {cut}")
    t_today, today = best_of(lambda: today_gate(events, metas, cut, w.partitions), repeat)
    arrow_types = {c: arrow_type(BENCH_TYPES[c]) for c in BENCH_COLUMN_NAMES}
    table, marks = gate_tables(events, w.table_names, arrow_types)
    t_col, col = best_of(lambda: columnar_gate(table, marks, cut, w.partitions), repeat)
    up_t, del_t = survivors_today(today["plans"], w.table_names)
    up_c, del_c = survivors_columnar(col)
    same = up_t == up_c and del_t == del_c
    detail = (f"today {len(up_t):,} upserts + {len(del_t):,} deletes of {today['released']:,} released, "
              f"columnar {len(up_c):,} + {len(del_c):,} of {col['released']:,}")
    if not same:
        detail += (f"; upserts only today {len(up_t - up_c)}, only columnar {len(up_c - up_t)}; deletes only today "
                   f"{len(del_t - del_c)}, only columnar {len(del_c - del_t)}")
    figures = [
        figure("today", "Gate.add + release + plan_batch per table", t_today, rows, "row change"),
        figure("columnar", "resolved, filter, dedupe, order, last version (pyarrow)", t_col, rows, "row change"),
    ]
    return {"title": f"{rows:,} row changes of {len(events):,} events, one micro-batch, applied ts the commit "
                     f"ts {APPLIED_FRACTION:.0%} of the way through ({at_or_below:,} row changes at or "
                     "below it)",
            "row_changes": rows, "figures": figures,
            "checks": {"surviving rows": {"ok": same, "detail": f"({detail})"}}}


def _pg_urls() -> tuple[str, str]:
    """(psycopg/libpq URL, the same for ADBC) from APPLIER_PG_URL or the local services' default."""
    from sqlalchemy.engine import make_url

    from applier.devtools.bench_live import service_urls

    url = make_url(service_urls("postgres")[1]).set(drivername="postgresql")
    text = url.render_as_string(hide_password=False)
    return text, text


def measure_pg(n: int, repeat: int, log: Log) -> dict[str, Any]:
    """The ``pg`` part (see the module docstring)."""
    import psycopg
    from psycopg import sql as psql
    from psycopg.rows import dict_row

    from applier.sinks.postgres import binary_copy_types

    url, adbc_url = _pg_urls()
    rows = bench_rows(n)
    cols = tuple(BENCH_COLUMN_NAMES)
    name = "pg_load"
    table = psql.Identifier(SCHEMA, name)
    figures: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    skipped: list[str] = []
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(psql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psql.Identifier(SCHEMA)))
        c.execute(psql.SQL("CREATE SCHEMA {}").format(psql.Identifier(SCHEMA)))
        c.execute(psql.SQL(PG_DDL).format(table=table))
    try:
        with psycopg.connect(url) as conn:
            oids = dict(conn.execute("SELECT attname, atttypid::int FROM pg_attribute WHERE attrelid = %s::regclass "
                                     "AND attnum > 0 AND NOT attisdropped", (f"{SCHEMA}.{name}",)).fetchall())
            meta = bench_metas([name], SCHEMA)[name]
            meta.type_oids = {c: oids[c] for c in cols}
            stmt = psql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
                table, psql.SQL(", ").join(psql.Identifier(c) for c in cols))
            getter = operator.itemgetter(*cols)

            def truncate() -> None:
                conn.execute(psql.SQL("TRUNCATE {}").format(table))
                conn.commit()

            def copy() -> None:  # PostgresSink.upsert_rows's tuples and check, then _copy
                tuples = list(map(getter, rows))
                types = binary_copy_types(meta, cols, tuples)
                if types is None:
                    raise RuntimeError("the writer's rule would COPY these rows in text, not binary")
                with conn.cursor() as cur, cur.copy(stmt) as cp:
                    cp.set_types(types)
                    write_row = cp.write_row
                    for r in tuples:
                        write_row(r)
                conn.commit()

            t_copy, _ = best_of(copy, repeat, setup=truncate)
            figures.append(figure("today", "psycopg binary COPY write_row (+ tuples, type check)", t_copy, n, "row",
                                  wall=True))
            checks["COPY write_row"] = _pg_check(conn, table, rows, dict_row)
        try:
            import adbc_driver_postgresql.dbapi as adbc
        except ImportError:
            adbc = None
            skipped.append(f"adbc_ingest: adbc_driver_postgresql is not installed ({ADBC_INSTALL})")
        if adbc is not None:
            arrow = _pg_arrow(rows)
            with adbc.connect(adbc_url) as aconn:
                def atruncate() -> None:
                    with aconn.cursor() as cur:
                        cur.execute(f'TRUNCATE "{SCHEMA}"."{name}"')
                    aconn.commit()

                def ingest() -> None:
                    with aconn.cursor() as cur:
                        cur.adbc_ingest(name, arrow, mode="append", db_schema_name=SCHEMA)
                    aconn.commit()

                t_adbc, _ = best_of(ingest, repeat, setup=atruncate)
            figures.append(figure("columnar", "adbc_ingest of an Arrow table", t_adbc, n, "row", wall=True))
            with psycopg.connect(url) as conn:
                checks["adbc_ingest"] = _pg_check(conn, table, rows, dict_row)
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(psql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(psql.Identifier(SCHEMA)))
    return {"title": f"{n:,} bench rows into an empty PostgreSQL table", "figures": figures, "checks": checks,
            "skipped": skipped,
            "notes": ["client CPU only: the server's work is in the wall time (shown), not in the CPU figures"]}


def _pg_arrow(rows: Sequence[Mapping[str, Any]]) -> Any:
    """The rows as the columnar path would hold them for PostgreSQL (types of :data:`PG_DDL`)."""
    import pyarrow as pa

    types = {"id": pa.int64(), "grp": pa.int64(), "name": pa.string(), "amount": pa.decimal128(14, 2),
             "ratio": pa.float64(), "created": pa.timestamp("us"), "day": pa.date32(), "flag": pa.int16(),
             "note": pa.string(), "payload": pa.binary(), "ver": pa.int64()}
    return pa.table({c: pa.array([r[c] for r in rows], types[c]) for c in BENCH_COLUMN_NAMES})


def _pg_check(conn: Any, table: Any, rows: Sequence[Mapping[str, Any]], dict_row: Any) -> dict[str, Any]:
    from psycopg import sql as psql

    with conn.cursor(row_factory=dict_row) as cur:
        got = cur.execute(psql.SQL("SELECT * FROM {} ORDER BY id").format(table)).fetchall()
    conn.commit()
    return _rows_check(got, rows)


def _rows_check(got_rows: Sequence[Mapping[str, Any]], want: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A table's rows (ordered by key) against the generator's rows (keys 0..n-1), column by column, in the bench
    checksum's text of each value."""
    got = {c: [r[c] for r in got_rows] for c in BENCH_COLUMN_NAMES}
    return compare_columns(got, want, BENCH_COLUMN_NAMES, equal=canonical_equal,
                           label=lambda i: f"id {want[i][KEY]}" if i < len(want) else f"row {i}")


def _mariadb_params() -> dict[str, Any]:
    from sqlalchemy.engine import make_url

    from applier.devtools.bench_live import service_urls

    u = make_url(service_urls("mariadb")[1])
    return {"host": u.host or "127.0.0.1", "port": u.port or 3306, "user": u.username, "password": u.password or "",
            "charset": "utf8mb4", "autocommit": False, "local_infile": True}


def measure_mariadb(n: int, repeat: int, log: Log, csv_null: str = CSV_NULL) -> dict[str, Any]:
    """The ``mariadb`` part (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pymysql

    from applier.devtools.bench_stream import bench_table_ddl

    rows = bench_rows(n)
    cols = tuple(BENCH_COLUMN_NAMES)
    arrow = pa.table({c: pa.array([r[c] for r in rows], arrow_type(BENCH_TYPES[c])) for c in cols})
    # raw bytes cannot go into the text file (pyarrow.csv refuses a binary value that is not UTF-8): hex
    binary = [c for c in cols if pa.types.is_binary(arrow.schema.field(c).type)]
    fd, path = tempfile.mkstemp(prefix="bench-columnar-", suffix=".tsv", dir=scratch_dir())
    os.close(fd)
    conn = pymysql.connect(**_mariadb_params())
    figures: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    try:
        cur = conn.cursor()
        cur.execute(f"DROP DATABASE IF EXISTS `{SCHEMA}`")
        cur.execute(f"CREATE DATABASE `{SCHEMA}` CHARACTER SET utf8mb4")
        cur.execute(f"USE `{SCHEMA}`")
        for t in ("today", "columnar"):
            cur.execute(bench_table_ddl(t))
        cur.execute("CREATE TABLE stage LIKE today")
        conn.commit()
        sql = {t: mariadb_statements(f"`{t}`", "`stage`", cols, KEY, conn.escape(path), binary)
               for t in ("today", "columnar")}

        def truncate(*tables: str) -> Callable[[], None]:
            def run() -> None:
                for t in tables:
                    cur.execute(f"TRUNCATE `{t}`")
                conn.commit()
            return run

        def executemany() -> None:  # MySQLSink.upsert_rows per chunk of its batch_rows
            for lo in range(0, len(rows), MARIADB_CHUNK):
                chunk = rows[lo:lo + MARIADB_CHUNK]
                cur.executemany(sql["today"]["upsert"], [tuple(r[c] for c in cols) for r in chunk])
            conn.commit()

        t_many, _ = best_of(executemany, repeat, setup=truncate("today"))
        figures.append(figure("today", "PyMySQL executemany of INSERT ... ON DUPLICATE KEY UPDATE", t_many, n, "row",
                              wall=True))

        options = csv_write_options(csv_null)

        def load() -> None:
            table = arrow
            for c in binary:
                table = table.set_column(table.column_names.index(c), c, binary_to_hex(table[c].combine_chunks()))
            pcsv.write_csv(table, path, options)
            cur.execute(sql["columnar"]["load"])
            cur.execute(sql["columnar"]["merge"])
            conn.commit()

        t_load, _ = best_of(load, repeat, setup=truncate("columnar", "stage"))
        cur.execute("SHOW WARNINGS")
        warnings = cur.fetchall()
        figures.append(figure("columnar", "pyarrow.csv, LOAD DATA, INSERT ... SELECT ... ON DUPLICATE",
                              t_load, n, "row", wall=True))
        dcur = conn.cursor(pymysql.cursors.DictCursor)
        for t, label in (("today", "executemany"), ("columnar", "LOAD DATA path")):
            dcur.execute(f"SELECT * FROM `{t}` ORDER BY id")
            checks[label] = _rows_check(dcur.fetchall(), rows)
        conn.commit()
        notes = ["client CPU only: the server's work is in the wall time (shown), not in the CPU figures",
                 f"the LOAD DATA file writes NULL as {csv_null!r} unquoted (an empty field is read as '': NULL "
                 "notes became '' and NULL payloads b'' in the first prototype)"]
        if warnings:
            notes.append(f"LOAD DATA warnings: {warnings[:3]}")
    finally:
        try:
            conn.cursor().execute(f"DROP DATABASE IF EXISTS `{SCHEMA}`")
            conn.commit()
        finally:
            conn.close()
            os.unlink(path)
    return {"title": f"{n:,} bench rows into an empty MariaDB table", "figures": figures, "checks": checks,
            "notes": notes}


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def measure_sink(n: int, repeat: int, log: Log) -> dict[str, Any]:
    """The ``sink`` part (see the module docstring)."""
    from sqlalchemy import create_engine

    from applier.devtools.bench_live import service_urls
    from applier.devtools.bench_stream import bench_table_ddl
    from applier.dialect import dialect_for
    from applier.sinks.mysql_load import MIN_ROWS, enable_local_infile

    url = service_urls("mariadb")[1]
    plain, fast = create_engine(url), create_engine(url)
    enable_local_infile(fast)
    cols = tuple(BENCH_COLUMN_NAMES)
    figures: list[dict[str, Any]] = []
    checks: dict[str, Any] = {}
    load_before = _loadavg()
    paths = (("today", "executemany", plain, "many"), ("columnar", "LOAD DATA path", fast, "load"))
    try:
        with plain.begin() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{SCHEMA}`")
            c.exec_driver_sql(f"CREATE DATABASE `{SCHEMA}` CHARACTER SET utf8mb4")
            for _, _, _, t in paths:
                c.exec_driver_sql(f"CREATE TABLE `{SCHEMA}`.{bench_table_ddl(t)[len('CREATE TABLE '):]}")
        dialect = dialect_for(plain)

        def writer(engine: Any, table: str, min_rows: int) -> tuple[Any, Any]:
            sink = dialect.writer(MARIADB_CHUNK)
            sink.load_data.min_rows = min_rows
            with engine.begin() as c:
                sink.begin(c)
                meta = sink.table(c, SCHEMA, table)
            return sink, meta

        def chunks(sink: Any, meta: Any, rows: Sequence[Mapping[str, Any]], size: int) -> list[list[dict[str, Any]]]:
            return [sink.adapt_rows(meta, cols, [dict(r) for r in rows[lo:lo + size]])
                    for lo in range(0, len(rows), size)]

        def upsert(engine: Any, sink: Any, meta: Any, parts: list[list[dict[str, Any]]]) -> Callable[[], None]:
            def run() -> None:
                with engine.begin() as c:
                    sink.begin(c)
                    for part in parts:
                        sink.upsert_rows(c, meta, cols, part)
            return run

        def truncate(engine: Any, table: str, then: Callable[[], None] | None = None) -> Callable[[], None]:
            def run() -> None:
                with engine.begin() as c:
                    c.exec_driver_sql(f"TRUNCATE `{SCHEMA}`.`{table}`")
                if then is not None:
                    then()
            return run

        v1, v2 = bench_rows(n), bench_rows(n, version=2)
        for side, label, engine, table in paths:
            log(f"  sink: {label}, {n:,} rows ...")
            sink, meta = writer(engine, table, MIN_ROWS)
            inserts = upsert(engine, sink, meta, chunks(sink, meta, v1, MARIADB_CHUNK))
            t_ins, _ = best_of(inserts, repeat, setup=truncate(engine, table))
            t_upd, _ = best_of(upsert(engine, sink, meta, chunks(sink, meta, v2, MARIADB_CHUNK)), repeat,
                               setup=truncate(engine, table, inserts))
            figures.append(figure(side, f"{label}: inserts, chunks of {MARIADB_CHUNK}", t_ins, n, "row", wall=True))
            figures.append(figure(side, f"{label}: updates, chunks of {MARIADB_CHUNK}", t_upd, n, "row",
                                  total=False, wall=True))
            if side == "columnar" and sink.load_data.stats.loaded_rows == 0:
                checks["LOAD DATA path used"] = {"ok": False, "detail": f"{sink.load_data.stats}"}
        with plain.connect() as c:
            got = {t: [dict(r._mapping) for r in c.exec_driver_sql(f"SELECT * FROM `{SCHEMA}`.`{t}` ORDER BY id")]
                   for _, _, _, t in paths}
        for _, label, _, t in paths:
            checks[label] = _rows_check(got[t], v2)
        checks["both paths"] = {"ok": got["many"] == got["load"], "detail": "SELECT * of the two tables"}
        sweep_rows = bench_rows(min(n, SWEEP_ROWS))
        for size in SWEEP_SIZES:
            log(f"  sink: chunks of {size} ...")
            for side, label, engine, table in paths:
                sink, meta = writer(engine, table, 1)
                t, _ = best_of(upsert(engine, sink, meta, chunks(sink, meta, sweep_rows, size)), repeat,
                               setup=truncate(engine, table))
                figures.append(figure(side, f"{label}: chunks of {size}", t, len(sweep_rows), "row", total=False,
                                      wall=True))
    finally:
        try:
            with plain.begin() as c:
                c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{SCHEMA}`")
        finally:
            plain.dispose()
            fast.dispose()
    return {"title": f"MySQLSink.upsert_rows, {n:,} bench rows into MariaDB", "figures": figures, "checks": checks,
            "notes": ["client CPU only (time.process_time of this process); the server's work is in the wall time",
                      f"load average (1, 5, 15 min) before: {load_before}, after: {_loadavg()}",
                      f"the product sends chunks of {MIN_ROWS} rows or more through LOAD DATA (MIN_ROWS); the "
                      "sweep forces it at every size"]}


def part_ok(part: Mapping[str, Any]) -> bool:
    """A part ran and every one of its checks passed."""
    if "error" in part:
        return False
    for check in part.get("checks", {}).values():
        if not (check_ok(check) if "columns" in check else check.get("ok")):
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    log: Log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "decode": lambda: measure_decode(a.rows, a.repeat, a.seed, log),
        "gate": lambda: measure_gate(a.rows, a.repeat, a.seed, log),
        "pg": lambda: measure_pg(a.rows, a.repeat, log),
        "mariadb": lambda: measure_mariadb(a.rows, a.repeat, log, a.csv_null),
        "sink": lambda: measure_sink(a.rows, a.repeat, log),
    }
    parts: dict[str, Any] = {}
    for name in a.only:
        log(f"{name} ...")
        try:
            parts[name] = runs[name]()
        except Exception as exc:  # one part failing (a service down) does not hide the others' figures
            parts[name] = {"error": f"{type(exc).__name__}: {exc}"}
    r = {"rows": a.rows, "repeat": a.repeat, "seed": a.seed, "parts": parts}
    print(json.dumps(r, indent=2, default=str) if a.json else format_report(r))
    return 0 if all(part_ok(p) for p in parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
