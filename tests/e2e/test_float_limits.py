"""FLOAT at float32's limits, and types declared in full, through the apply stage (decode -> gate -> apply, no
Spark) into real MariaDB and PostgreSQL (docs/value-rules.md).

* FLOAT: TiCDC sends a float32 as its shortest text (``3.4028235e+38`` for the largest finite value), which as a
  double lies just beyond FLT_MAX. MariaDB range-checks that double in strict mode (error 1264), so the largest
  legal FLOAT stopped the replica. Every limit (+/- FLT_MAX, the smallest normal, the largest and the smallest
  subnormal, zeros) and ordinary values must read back as the same float32 on both targets, through inserts,
  upserts and a keyless table's full-row matches, and ``applier verify``'s canonical form must agree.
* Schema from the stream: a table created from Canal-JSON's full types (``content-compatible``) keeps what they
  declare: TIMESTAMP/TIME without fraction stay fsp 0, DATETIME(3) stays 3, TINYINT(1) stays TINYINT(1) on
  MariaDB (``smallint`` on PostgreSQL, as for a replicated TINYINT(1)).
"""

from __future__ import annotations

import datetime as dt
import struct

import pytest
from sqlalchemy import create_engine, text

from applier import migrate
from applier.codecs import get_decoder
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.events import DDL, Column, KafkaMessage, Op, Resolved, RowChange
from applier.processor import BatchProcessor
from applier.progress import ProgressStore
from applier.verify.normalise import canonical, read_expr
from tests.e2e.helpers import POS, TOPIC, Feed, processor, target_url

pytestmark = pytest.mark.e2e

_F32 = struct.Struct("<f")
FLT_MAX = _F32.unpack(b"\xff\xff\x7f\x7f")[0]


def _f32(v: float) -> float:
    """The float32 a value stands for (PostgreSQL's real reads back as the shortest text, MariaDB as the exact
    double: both are this)."""
    return _F32.unpack(_F32.pack(v))[0]

# (id, the value as the decoder gives it: the float32's shortest text, as TiCDC sends it)
LIMITS = [
    (1, 3.4028235e+38),   # FLT_MAX
    (2, -3.4028235e+38),  # -FLT_MAX
    (3, 1.1754944e-38),   # the smallest normal
    (4, -1.1754944e-38),
    (5, 1.1754942e-38),   # the largest subnormal
    (6, 1e-45),           # the smallest subnormal (1.4e-45)
    (7, -1e-45),
    (8, 0.0),
    (9, -0.0),
    (10, 0.1),
    (11, 3.1415927),
    (12, 16777216.0),     # 2^24: the last integer every float32 step holds
    (13, -123456.79),
]


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"fl_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    yield request.param, engine, schema
    engine.dispose()


def _q(kind: str, name: str) -> str:
    return f"`{name}`" if kind == "mariadb" else f'"{name}"'


def _float_col(kind: str) -> str:
    """The select expression verify uses for a FLOAT column (MariaDB's text protocol prints 6 digits)."""
    return read_expr("mariadb" if kind == "mariadb" else "postgresql", _q(kind, "v"),
                     "float" if kind == "mariadb" else "real")


def _same_float32(kind: str, got: float, sent: float) -> bool:
    """Equal as float32, bit for bit; MariaDB stores every zero as +0 (its documented loss of the sign)."""
    if kind == "mariadb" and sent == 0.0:
        return got == 0.0
    return _F32.pack(got) == _F32.pack(sent)


def _read_floats(kind: str, engine, schema: str, table: str) -> dict[int, float]:
    with engine.connect() as c:
        rows = c.execute(text(f"SELECT id, {_float_col(kind)} FROM {_q(kind, schema)}.{_q(kind, table)}")).all()
    return {i: v for i, v in rows}


def test_float_limits_round_trip_as_float32(target, unique) -> None:
    kind, engine, schema = target
    cols = (Column("id", "int", nullable=False, key=True), Column("v", "float"))
    f = Feed()
    proc = processor(engine, f"fl-{unique}", lambda s, t: (schema, t))
    rows = [RowChange("up", "f", 101, Op.INSERT, None, {"id": i, "v": v}, cols, POS) for i, v in LIMITS]
    proc.process(f.msgs(DDL("up", "f", 100, "CREATE TABLE `f` (`id` INT PRIMARY KEY, `v` FLOAT)", POS),
                        *rows, Resolved(150, POS), batch=8))
    got = _read_floats(kind, engine, schema, "f")
    assert set(got) == {i for i, _ in LIMITS}
    for i, sent in LIMITS:
        assert _same_float32(kind, got[i], sent), (i, sent, got[i])
        if sent != 0.0 or kind != "mariadb":  # verify compares the canonical forms of both sides
            assert canonical(got[i], "float") == canonical(sent, "float"), (i, sent, got[i])
    if kind == "postgres":
        assert str(got[9]) == "-0.0"  # real keeps the sign of zero

    # upserts (ON DUPLICATE KEY UPDATE / ON CONFLICT) swap the limits around
    swaps = [RowChange("up", "f", 201, Op.UPDATE, {"id": 1, "v": 3.4028235e+38}, {"id": 1, "v": -3.4028235e+38},
                       cols, POS),
             RowChange("up", "f", 201, Op.UPDATE, {"id": 2, "v": -3.4028235e+38}, {"id": 2, "v": 1e-45}, cols, POS),
             RowChange("up", "f", 201, Op.UPDATE, {"id": 6, "v": 1e-45}, {"id": 6, "v": 3.4028235e+38}, cols, POS)]
    proc.process(f.msgs(*swaps, Resolved(250, POS)))
    got = _read_floats(kind, engine, schema, "f")
    assert (_f32(got[1]), _f32(got[2]), _f32(got[6])) == (-FLT_MAX, _f32(1e-45), FLT_MAX)
    proc.close()


def test_keyless_float_rows_are_found_at_the_limits(target, unique) -> None:
    """A table without a key is updated and deleted by full-row match: the old FLOAT value must match what the
    column stored (MariaDB: the single-precision double; PostgreSQL: the value cast to real)."""
    kind, engine, schema = target
    cols = (Column("v", "float"), Column("n", "int"))
    f = Feed()
    proc = processor(engine, f"flk-{unique}", lambda s, t: (schema, t))
    proc.process(f.msgs(DDL("up", "k", 100, "CREATE TABLE `k` (`v` FLOAT, `n` INT)", POS),
                        RowChange("up", "k", 101, Op.INSERT, None, {"v": 3.4028235e+38, "n": 1}, cols, POS),
                        RowChange("up", "k", 101, Op.INSERT, None, {"v": 1e-45, "n": 2}, cols, POS),
                        RowChange("up", "k", 101, Op.INSERT, None, {"v": -1.1754944e-38, "n": 3}, cols, POS),
                        Resolved(150, POS)))
    proc.process(f.msgs(
        RowChange("up", "k", 201, Op.UPDATE, {"v": 3.4028235e+38, "n": 1}, {"v": -3.4028235e+38, "n": 10}, cols, POS),
        RowChange("up", "k", 201, Op.DELETE, {"v": 1e-45, "n": 2}, None, cols, POS),
        RowChange("up", "k", 202, Op.UPDATE, {"v": -1.1754944e-38, "n": 3}, {"v": 1e-45, "n": 30}, cols, POS),
        Resolved(250, POS)))
    expr = _float_col(kind)
    with engine.connect() as c:
        got = sorted(c.execute(text(f"SELECT {_q(kind, 'n')}, {expr} FROM {_q(kind, schema)}.{_q(kind, 'k')}")).all())
    assert [(n, _f32(v)) for n, v in got] == [(10, -FLT_MAX), (30, _f32(1e-45))]
    proc.close()


# ---- schema from the stream: Canal-JSON with full types (content-compatible) ---------------------------------

FULL = (Column("id", "int", nullable=False, key=True, declared="int(11)"),
        Column("ts", "timestamp", declared="timestamp"),
        Column("t", "time", declared="time"),
        Column("dt", "datetime", declared="datetime(3)"),
        Column("flag", "tinyint", declared="tinyint(1)"),
        Column("v", "float", declared="float"))

WANT_TYPES = {
    "mariadb": {"id": "int(11)", "ts": "timestamp", "t": "time", "dt": "datetime(3)", "flag": "tinyint(1)",
                "v": "float"},
    "postgres": {"id": "integer", "ts": "timestamp(0) with time zone", "t": "interval(0)",
                 "dt": "timestamp(3) without time zone", "flag": "smallint", "v": "real"},
}


def _canal_processor(engine, name: str, route) -> BatchProcessor:
    migrate.upgrade(engine)
    store = ProgressStore(name, "canal-json")
    store.claim(engine)
    with engine.connect() as c:
        state = store.load(c)
    return BatchProcessor(engine=engine, decoder=get_decoder("canal-json"), route=route, store=store, state=state,
                          partitions=[(TOPIC, 0)], schema_evolution="create")


def _canal_msgs(*events) -> list[KafkaMessage]:
    return [KafkaMessage(TOPIC, 0, i, *encode_canal_json(ev, content_compatible=True)) for i, ev in enumerate(events)]


def _column_types(kind: str, engine, schema: str, table: str) -> dict[str, str]:
    if kind == "mariadb":
        q = ("SELECT COLUMN_NAME, COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = :s "
             "AND TABLE_NAME = :t")
    else:
        q = ("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
             "JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
             "WHERE n.nspname = :s AND c.relname = :t AND a.attnum > 0 AND NOT a.attisdropped")
    with engine.connect() as c:
        return {str(n): str(t).lower() for n, t in c.execute(text(q), {"s": schema, "t": table})}


def test_a_table_made_from_full_types_keeps_them(target, unique) -> None:
    kind, engine, schema = target
    proc = _canal_processor(engine, f"flt-{unique}", lambda s, t: (schema, t))
    after = {"id": 1, "ts": dt.datetime(2024, 2, 29, 23, 59, 59), "t": dt.timedelta(hours=-838, minutes=-59),
             "dt": dt.datetime(2024, 1, 2, 3, 4, 5, 678000), "flag": 1, "v": 3.4028235e+38}
    proc.process(_canal_msgs(RowChange("shop", "made", 1 << 20, Op.INSERT, None, after, FULL, POS),
                             Resolved(2 << 20, POS)))
    assert _column_types(kind, engine, schema, "made") == WANT_TYPES[kind]
    with engine.connect() as c:
        row = c.execute(text(f"SELECT {_q(kind, 'flag')}, {_float_col(kind)} FROM "
                             f"{_q(kind, schema)}.{_q(kind, 'made')}")).one()
    assert (row[0], _f32(row[1])) == (1, FLT_MAX)
    proc.close()
