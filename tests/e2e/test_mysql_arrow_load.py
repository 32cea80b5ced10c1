"""MariaDB: the columnar lane's upserts written as LOAD DATA's file by Arrow (applier/sinks/mysql_arrow.py) store
exactly what the same upserts store as Python rows.

Random Arrow tables, one column per lane kind and column type the path takes (ENUM and YEAR from integers
included), written as Python rows through executemany into one table and by the Arrow path into another of the
same shape on the real server, then compared; the Arrow file must also be byte for byte the file the Python rows
make (``encode_rows``) in every column but the floats, whose text differs in form only."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine

from applier.columnar import values as V
from applier.columnar.apply import python_values
from applier.columnar.plan import ArrowPlan, to_batch_plan
from applier.dialect import MARIADB
from applier.sinks import mysql_arrow as M
from applier.sinks import mysql_load as L
from tests.e2e.helpers import target_url

pytestmark = pytest.mark.e2e

_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_SPECIAL = st.sampled_from(["", "\\N", "NULL", "\t", "\n", "\\", "a\tb\nc\\d", "\r\x1a\x08", "nul\x00in", "\x01"])

#: column -> (MariaDB type, lane kind, Arrow type, values as the lane holds them)
COLUMNS = {
    "i": ("BIGINT", V.INT, pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "u": ("BIGINT UNSIGNED", V.INT, pa.uint64(), st.integers(0, 2**64 - 1)),
    "ti": ("TINYINT", V.INT, pa.int64(), st.integers(-128, 127)),
    "e": ("ENUM('a','b','2')", V.INT, pa.int64(), st.integers(1, 3)),  # (0 is refused in strict mode)
    "yr": ("YEAR", V.INT, pa.int64(), st.sampled_from([0, 1901, 1999, 2000, 2155])),
    "dm": ("DECIMAL(14,2)", V.DECIMAL, pa.string(), st.from_regex(r"\A-?0{0,3}[0-9]{1,12}(\.[0-9]{1,2})?\Z")),
    "dw": ("DECIMAL(65,30)", V.DECIMAL, pa.string(), st.from_regex(r"\A-?[0-9]{1,35}(\.[0-9]{1,30})?\Z")),
    "f8": ("DOUBLE", V.FLOAT, pa.float64(), st.floats(allow_nan=False, allow_infinity=False)),
    "vc": ("VARCHAR(40)", V.STR, pa.string(), _TEXT | _SPECIAL),
    "tx": ("TEXT", V.STR, pa.string(), _TEXT | _SPECIAL),
    "vb": ("VARBINARY(40)", V.BYTES, pa.binary(), st.binary(max_size=40)),
    "bl": ("BLOB", V.BYTES, pa.binary(), st.binary(max_size=60)),
    "da": ("DATE", V.DATE, pa.date32(), st.dates(min_value=dt.date(1000, 1, 1))),
    "dt6": ("DATETIME(6)", V.DATETIME, pa.timestamp("us"), st.datetimes(min_value=dt.datetime(1000, 1, 1))),
    "dt0": ("DATETIME", V.DATETIME, pa.timestamp("us"),
            st.datetimes(min_value=dt.datetime(1000, 1, 1)).map(lambda d: d.replace(microsecond=0))),
}
KINDS = {"k": V.INT, "nul": V.INT, **{n: kind for n, (_, kind, _, _) in COLUMNS.items()}}


@pytest.fixture(scope="module")
def maria(urls):
    plain = create_engine(target_url(urls, "mariadb"))
    fast = create_engine(target_url(urls, "mariadb"))
    L.enable_local_infile(fast)
    schema = "arrowload_test"
    with plain.begin() as c:
        c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{schema}`")
        c.exec_driver_sql(f"CREATE DATABASE `{schema}` CHARACTER SET utf8mb4")
        cols = ", ".join(f"`{n}` {typ}" for n, (typ, _, _, _) in COLUMNS.items())
        for t in ("as_rows", "as_arrow"):
            c.exec_driver_sql(f"CREATE TABLE `{schema}`.`{t}` (k BIGINT PRIMARY KEY, {cols}, nul INT) "
                              "DEFAULT CHARSET = utf8mb4")
    yield plain, fast, schema
    with plain.begin() as c:
        c.exec_driver_sql(f"DROP DATABASE IF EXISTS `{schema}`")
    plain.dispose()
    fast.dispose()


def _table(draw, n: int) -> pa.Table:
    cols = {"k": pa.array(range(n), pa.int64())}
    for name, (_, _, typ, values) in COLUMNS.items():
        cols[name] = pa.array([draw(st.none() | values) for _ in range(n)], typ)
    cols["nul"] = pa.nulls(n)
    return pa.table(cols)


@st.composite
def tables(draw) -> pa.Table:
    return _table(draw, draw(st.integers(1, 12)))


def _select(engine, schema: str, t: str) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.exec_driver_sql(f"SELECT *, HEX(vc), HEX(tx) FROM `{schema}`.`{t}` ORDER BY k")]


def _write_both(maria, table: pa.Table) -> tuple[list[tuple], list[tuple], M.Encoded | None, L.Encoded | None]:
    plain, fast, schema = maria
    for t in ("as_rows", "as_arrow"):
        with plain.begin() as c:
            c.exec_driver_sql(f"TRUNCATE `{schema}`.`{t}`")
    to_python = python_values(KINDS)
    empty = pa.table({"k": pa.array([], pa.int64())})
    files = None
    for _ in range(2):  # the second time every row is an update
        sink = MARIADB.writer()
        with plain.begin() as c:  # Python rows through executemany (no LOAD DATA on this engine)
            sink.begin(c)
            meta = sink.table(c, schema, "as_rows")
            sink.write(c, to_batch_plan(meta, ArrowPlan(empty, table, table.num_rows), to_python))
        sink = MARIADB.writer()
        sink.load_data.min_rows = 1
        with fast.begin() as c:
            sink.begin(c)
            meta = sink.table(c, schema, "as_arrow")
            assert sink.takes_arrow(c, meta, table, KINDS)
            sink.upsert_arrow(c, meta, table, KINDS)
            assert sink.load_data.stats.loaded_rows == table.num_rows, sink.load_data.stats
            kinds = sink.load_data._shape(meta, tuple(table.column_names)).kinds
            rows = to_batch_plan(meta, ArrowPlan(empty, table, table.num_rows), to_python).upserts
            files = (M.encode_arrow(kinds, table, KINDS), L.encode_rows(kinds, table.column_names, rows))
    return _select(plain, schema, "as_rows"), _select(plain, schema, "as_arrow"), *files


def _without_floats(data: bytes) -> list[list[bytes]]:
    f8 = 1 + list(COLUMNS).index("f8")
    return [line.split(b"\t")[:f8] + line.split(b"\t")[f8 + 1:] for line in data.split(b"\n")]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tables())
def test_arrow_file_loads_what_python_rows_store(maria, table) -> None:
    as_rows, as_arrow, arrow_file, rows_file = _write_both(maria, table)
    assert as_arrow == as_rows and len(as_rows) == table.num_rows
    assert arrow_file is not None and rows_file is not None
    assert arrow_file.modes == rows_file.modes
    assert _without_floats(arrow_file.data) == _without_floats(rows_file.data)


def test_many_rows_in_chunks(maria) -> None:
    """More rows than one chunk (``batch_rows``), the last one smaller than LOAD DATA's minimum."""
    rng = random.Random(4)
    n = 10_000 + 50
    cols = {"k": pa.array(range(n), pa.int64()),
            "i": pa.array([rng.randrange(-(2**63), 2**63) for _ in range(n)], pa.int64()),
            "dm": pa.array([f"{rng.randrange(-10**12, 10**12) / 100:.2f}" for _ in range(n)]),
            "f8": pa.array([rng.uniform(-1e9, 1e9) for _ in range(n)]),
            "tx": pa.array([rng.choice(["", "x", "a\tb", "l\nm", "\\N", None]) for _ in range(n)]),
            "vb": pa.array([rng.randbytes(rng.randrange(0, 9)) for _ in range(n)], pa.binary()),
            "dt6": pa.array([dt.datetime(2020, 1, 1) + dt.timedelta(microseconds=rng.getrandbits(40))
                             for _ in range(n)], pa.timestamp("us"))}
    table = pa.table(cols)
    plain, fast, schema = maria
    with plain.begin() as c:
        c.exec_driver_sql(f"TRUNCATE `{schema}`.`as_arrow`")
    sink = MARIADB.writer()
    with fast.begin() as c:
        sink.begin(c)
        meta = sink.table(c, schema, "as_arrow")
        assert sink.takes_arrow(c, meta, table, KINDS)
        sink.upsert_arrow(c, meta, table, KINDS)
    assert sink.load_data.stats.loaded_rows == 10_000  # the last 50 rows went through executemany
    with plain.begin() as c:
        c.exec_driver_sql(f"TRUNCATE `{schema}`.`as_rows`")
        sink2 = MARIADB.writer()
        sink2.begin(c)
        meta = sink2.table(c, schema, "as_rows")
        sink2.write(c, to_batch_plan(meta, ArrowPlan(pa.table({"k": pa.array([], pa.int64())}), table, n),
                                     python_values(KINDS)))
    assert _select(plain, schema, "as_arrow") == _select(plain, schema, "as_rows")


def test_a_value_the_column_cannot_hold_goes_through_executemany(maria) -> None:
    """LOAD DATA only warns for a value the column cannot hold: the chunk then goes through executemany with its
    Python rows, which raises today's error."""
    plain, fast, schema = maria
    table = pa.table({"k": pa.array([1, 2], pa.int64()), "ti": pa.array([5, 300], pa.int64())})
    sink = MARIADB.writer()
    sink.load_data.min_rows = 1
    with fast.connect() as c:
        tx = c.begin()
        sink.begin(c)
        meta = sink.table(c, schema, "as_arrow")
        assert sink.takes_arrow(c, meta, table, KINDS)
        with pytest.raises(Exception, match="Out of range value for column 'ti'"):
            sink.upsert_arrow(c, meta, table, KINDS)
        tx.rollback()
    assert sink.load_data.stats.fallback_warnings == 1


def test_refusal_where_a_value_converter_could_act(maria) -> None:
    """TIMESTAMP (datetimes become UTC wall-clock times) and FLOAT (rounded to single precision) go the Python
    way."""
    plain, fast, schema = maria
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE IF NOT EXISTS `{schema}`.`conv` (k BIGINT PRIMARY KEY, ts TIMESTAMP(6) NULL, "
                          "f FLOAT)")
    sink = MARIADB.writer()
    with fast.connect() as c:
        sink.begin(c)
        meta = sink.table(c, schema, "conv")
        rows = 200
        ts = pa.table({"k": pa.array(range(rows), pa.int64()),
                       "ts": pa.array([dt.datetime(2020, 1, 1)] * rows, pa.timestamp("us"))})
        f = pa.table({"k": pa.array(range(rows), pa.int64()), "f": pa.array([0.1] * rows)})
        assert not sink.takes_arrow(c, meta, ts, {"k": V.INT, "ts": V.DATETIME})
        assert not sink.takes_arrow(c, meta, f, {"k": V.INT, "f": V.FLOAT})
        assert sink.takes_arrow(c, meta, f.select(["k"]), {"k": V.INT})
