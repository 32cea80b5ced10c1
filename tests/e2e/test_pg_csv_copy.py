"""PostgreSQL: the columnar lane's upserts sent as CSV made by Arrow (applier/sinks/postgres_csv.py) store exactly
what the same upserts store as Python rows through ``upsert_rows`` (binary or text COPY).

Random Arrow tables, one column per (lane kind, column type) pair the CSV path takes, at the edges of their
ranges and with the characters CSV treats specially, written both ways into two tables of the same shape on the
real server. (The processor with and without it: tests/e2e/test_arrow_upserts.py.)"""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from applier.columnar import values as V
from applier.columnar.apply import python_values
from applier.columnar.plan import ArrowPlan, to_batch_plan
from applier.sinks import postgres as PG
from tests.e2e.helpers import target_url

pytestmark = pytest.mark.e2e

_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
_SPECIAL = st.sampled_from(["", "\\.", '"', '""', ",", "\n", "\r\n", "\\", "\\N", "NULL", " ", "a,\"b\"\n"])
_DECIMAL = st.from_regex(r"\A-?[0-9]{1,12}(\.[0-9]{1,2})?\Z")
_DECIMAL_WIDE = st.from_regex(r"\A-?[0-9]{1,30}(\.[0-9]{1,30})?\Z") | st.sampled_from(["0.0000001", "-0", "-0.00"])
_JSON_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=5)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _JSON_TEXT,  # (jsonb refuses \u0000)
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(_JSON_TEXT, c, max_size=3),
                     max_leaves=6).map(json.dumps)
_F32 = st.floats(width=32, allow_nan=False, allow_infinity=False).map(float)

#: column -> (PostgreSQL type, lane kind, Arrow type, values as the lane holds them)
COLUMNS = {
    "i2": ("smallint", V.INT, pa.int64(), st.integers(-(2**15), 2**15 - 1)),
    "i4": ("integer", V.INT, pa.int64(), st.integers(-(2**31), 2**31 - 1)),
    "i8": ("bigint", V.INT, pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "u8": ("numeric(20,0)", V.INT, pa.uint64(), st.integers(0, 2**64 - 1)),
    "in": ("numeric", V.INT, pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "f8": ("double precision", V.FLOAT, pa.float64(), st.floats(allow_nan=False, allow_infinity=False)),
    "f4": ("real", V.FLOAT, pa.float64(), _F32),
    "d": ("numeric(14,2)", V.DECIMAL, pa.string(), _DECIMAL),
    "dx": ("numeric", V.DECIMAL, pa.string(), _DECIMAL_WIDE),
    "s": ("varchar(30)", V.STR, pa.string(), _TEXT | _SPECIAL),
    "t": ("text", V.STR, pa.string(), _TEXT | _SPECIAL),
    "c": ("char(4)", V.STR, pa.string(), st.text(st.sampled_from(' a",\n\\é'), max_size=4)),
    "j": ("jsonb", V.STR, pa.string(), _JSON),
    "b": ("bytea", V.BYTES, pa.binary(), st.binary(max_size=40)),
    "da": ("date", V.DATE, pa.date32(), st.dates(min_value=dt.date(1, 1, 1))),
    "ts": ("timestamp(6) without time zone", V.DATETIME, pa.timestamp("us"), st.datetimes()),
    "ts3": ("timestamp(3) without time zone", V.DATETIME, pa.timestamp("us"), st.datetimes()),
}
NAMES = tuple(COLUMNS)
KINDS = {"k": V.INT, **{n: kind for n, (_, kind, _, _) in COLUMNS.items()}}


@pytest.fixture(scope="module")
def pg(urls):
    engine = create_engine(target_url(urls, "postgres"))
    schema = "pgcsv_test"
    with engine.begin() as c:
        c.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        c.execute(text(f'CREATE SCHEMA "{schema}"'))
        cols = ", ".join(f'"{n}" {typ}' for n, (typ, _, _, _) in COLUMNS.items())
        for t in ("as_rows", "as_csv"):
            c.execute(text(f'CREATE TABLE "{schema}"."{t}" (k bigint PRIMARY KEY, {cols}, nul integer)'))
    yield engine, schema
    with engine.begin() as c:
        c.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


@st.composite
def tables(draw) -> pa.Table:
    n = draw(st.integers(1, 12))
    cols = {"k": pa.array(range(n), pa.int64())}
    for name, (_, _, typ, values) in COLUMNS.items():
        cols[name] = pa.array([draw(st.none() | values) for _ in range(n)], typ)
    cols["nul"] = pa.nulls(n)  # a column the lane holds as Arrow's null type
    return pa.table(cols)


def _write_both(engine, schema: str, table: pa.Table) -> list[list[str]]:
    """``table`` upserted into ``as_rows`` as Python rows and into ``as_csv`` by the CSV path (twice: the second
    time every row is an update); both tables' rows as PostgreSQL prints them."""
    sink = PG.PostgresSink(convert=PG.pg_converter)
    kinds = {**KINDS, "nul": V.INT}
    to_python = python_values(kinds)
    empty_keys = pa.table({"k": pa.array([], pa.int64())})
    with engine.begin() as conn:
        for t in ("as_rows", "as_csv"):
            conn.execute(text(f'TRUNCATE "{schema}"."{t}"'))
    for _ in range(2):
        with engine.begin() as conn:
            sink.begin(conn)
            rows_meta = sink.table(conn, schema, "as_rows")
            csv_meta = sink.table(conn, schema, "as_csv")
            sink.write(conn, to_batch_plan(rows_meta, ArrowPlan(empty_keys, table, table.num_rows), to_python))
            assert sink.takes_arrow(conn, csv_meta, table, kinds), "these columns are all meant to go as CSV"
            sink.upsert_arrow(conn, csv_meta, table, kinds)
    with engine.connect() as conn:
        return [conn.execute(text(f'SELECT r::text FROM "{schema}"."{t}" r ORDER BY k')).scalars().all()
                for t in ("as_rows", "as_csv")]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(tables())
def test_csv_upserts_store_what_python_rows_store(pg, table) -> None:
    engine, schema = pg
    as_rows, as_csv = _write_both(engine, schema, table)
    assert as_csv == as_rows and len(as_rows) == table.num_rows


def test_many_rows_in_chunks(pg) -> None:
    """More rows than one COPY chunk (``batch_rows``), with every column filled."""
    engine, schema = pg
    n = 50_000
    rng = __import__("random").Random(3)
    cols = {"k": pa.array(range(n), pa.int64()),
            "i2": pa.array([rng.randrange(-(2**15), 2**15) for _ in range(n)], pa.int64()),
            "f8": pa.array([rng.uniform(-1e9, 1e9) for _ in range(n)]),
            "d": pa.array([f"{rng.randrange(-10**12, 10**12) / 100:.2f}" for _ in range(n)]),
            "t": pa.array([rng.choice(["", "x", 'q"', "a,b", "l\nm", None]) for _ in range(n)]),
            "b": pa.array([rng.randbytes(rng.randrange(0, 9)) for _ in range(n)], pa.binary()),
            "ts": pa.array([dt.datetime(2020, 1, 1) + dt.timedelta(microseconds=rng.getrandbits(40))
                            for _ in range(n)], pa.timestamp("us"))}
    as_rows, as_csv = _write_both(engine, schema, pa.table(cols))
    assert as_csv == as_rows and len(as_rows) == n


def test_refused_values_fail_alike(pg) -> None:
    """A value the column refuses (out of its range) fails the CSV COPY as it fails the Python rows' COPY."""
    engine, schema = pg
    table = pa.table({"k": pa.array([1], pa.int64()), "i2": pa.array([40000], pa.int64())})
    sink = PG.PostgresSink(convert=PG.pg_converter)
    errors = []
    for arrow in (False, True):
        with engine.connect() as conn:
            tx = conn.begin()
            sink.begin(conn)
            meta = sink.table(conn, schema, "as_csv")
            try:
                if arrow:
                    assert sink.takes_arrow(conn, meta, table, KINDS)
                    sink.upsert_arrow(conn, meta, table, KINDS)
                else:
                    sink.write(conn, to_batch_plan(meta, ArrowPlan(table.select(["k"]).slice(0, 0), table, 1),
                                                   python_values(KINDS)))
            except Exception as exc:  # noqa: BLE001 - the server's refusal, compared below
                errors.append(str(getattr(exc, "orig", exc)).splitlines()[0])
            finally:
                tx.rollback()
    assert len(errors) == 2 and errors[0] == errors[1] and "out of range" in errors[0]

