"""PostgreSQL: a batch the writer sends as binary COPY stores exactly what the text COPY stores.

The writer uses binary COPY only for column types and value types listed in
``applier.sinks.postgres.BINARY_COPY_VALUE_TYPES`` (see there why); this checks that claim on the real server,
for each of those types, at the edges of their ranges, through the writer's own ``_copy``.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, text

from applier.sinks import postgres as PG
from applier.sinks.table import reflect_table
from tests.e2e.helpers import target_url

pytestmark = pytest.mark.e2e

UTC = dt.timezone.utc
COLUMNS = {  # column -> (PostgreSQL type, values)
    "i2": ("smallint", st.integers(-(2**15), 2**15 - 1)),
    "i4": ("integer", st.integers(-(2**31), 2**31 - 1)),
    "i8": ("bigint", st.integers(-(2**63), 2**63 - 1)),
    "u8": ("numeric(20,0)", st.integers(0, 2**64 - 1)),
    "d": ("numeric(14,2)", st.decimals(min_value=-10**11, max_value=10**11, places=3, allow_nan=False,
                                          allow_infinity=False)),
    "dx": ("numeric", st.decimals(allow_nan=False, allow_infinity=False).filter(lambda d: abs(d.adjusted()) < 120)),
    "f8": ("double precision", st.floats(allow_nan=False, allow_infinity=False)),
    "s": ("varchar(20)", st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)),
    "t": ("text", st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40)),
    "b": ("bytea", st.binary(max_size=40)),
    "da": ("date", st.dates()),
    "ts": ("timestamp(6) without time zone", st.datetimes()),
    "ts3": ("timestamp(3) without time zone", st.datetimes()),
    "tz": ("timestamp(6) with time zone", st.datetimes(timezones=st.just(UTC))),
}
NAMES = tuple(COLUMNS)


@pytest.fixture(scope="module")
def pg(urls):
    engine = create_engine(target_url(urls, "postgres"))
    schema = "pgcopy_test"
    with engine.begin() as c:
        c.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        c.execute(text(f'CREATE SCHEMA "{schema}"'))
        cols = ", ".join(f'"{n}" {typ}' for n, (typ, _) in COLUMNS.items())
        for t in ("as_text", "as_binary"):
            c.execute(text(f'CREATE TABLE "{schema}"."{t}" (k int PRIMARY KEY, {cols})'))
    yield engine, schema
    with engine.begin() as c:
        c.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


@st.composite
def batches(draw):
    return [tuple(draw(st.none() | strat) for _, strat in COLUMNS.values()) for _ in range(draw(st.integers(1, 8)))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batches())
def test_binary_copy_stores_what_text_copy_stores(pg, rows):
    engine, schema = pg
    sink = PG.PostgresSink()
    cols = ("k",) + NAMES
    rows = [(i,) + r for i, r in enumerate(rows)]
    with engine.begin() as conn:
        meta = reflect_table(conn, schema, "as_binary")
        meta.types, meta.type_oids = PG.catalog(conn, schema, "as_binary")
        oids = PG.binary_copy_types(meta, cols, rows)
        assert oids is not None, "these values are all meant to go in binary"
        for t in ("as_text", "as_binary"):
            conn.execute(text(f'TRUNCATE "{schema}"."{t}"'))
        conn.exec_driver_sql(f'SET search_path TO "{schema}"')
        sink._copy(conn, "as_text", cols, rows)
        sink._copy(conn, "as_binary", cols, rows, oids)
        got = [conn.execute(text(f'SELECT r::text FROM "{schema}"."{t}" r ORDER BY k')).scalars().all()
               for t in ("as_text", "as_binary")]
        conn.exec_driver_sql("SET search_path TO DEFAULT")
    assert got[0] == got[1] and len(got[0]) == len(rows)


def test_refused_values_fail_alike_or_go_as_text(pg):
    """Values binary would store differently (wrap-around) are sent as text, where the server refuses them."""
    engine, schema = pg
    with engine.begin() as conn:
        meta = reflect_table(conn, schema, "as_binary")
        meta.types, meta.type_oids = PG.catalog(conn, schema, "as_binary")
    assert PG.binary_copy_types(meta, ("k", "i2"), [(1, 40000)]) is None
    assert PG.binary_copy_types(meta, ("k", "t"), [(1, "a\x00")]) is None
    assert PG.binary_copy_types(meta, ("k", "da"), [(1, "-infinity")]) is None
    assert PG.binary_copy_types(meta, ("k", "d"), [(1, Decimal("1.5"))]) is not None
