"""The LOAD DATA LOCAL upsert path (applier.sinks.mysql_load) against the real MariaDB, beside today's executemany.

(a) the same edge-case and random rows through both paths into two tables of every column type give identical
``SELECT *`` results (a differential test: a faster path beside an older one), on inserts and on updates, in chunks
of one type per column and of mixed ENUM/SET forms; (b) a value the column cannot hold gives the same error as
today (the LOAD only warns; the chunk then goes through executemany), down to the ApplyError of the apply stage;
(c) a server with local_infile OFF: "auto" falls back to executemany, "on" refuses to start, and a connection that
saw it ON falls back when it goes OFF; (d) the path inside a transaction (or savepoint) that is rolled back leaves
nothing, neither in the target nor in the stage, and a replay after a rollback or a lost connection writes the
rows once; (e) the file guard: a server request for any other file is refused and the connection stays usable.
"""

from __future__ import annotations

import copy
import datetime as dt
import logging
import random
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import DBAPIError

from applier.config import ConfigError, parse_config
from applier.dialect import MARIADB
from applier.events import DDL, Column, Op, Resolved, RowChange
from applier.pipeline import make_engine, settle_load_data
from applier.sinks import ApplyError
from applier.sinks import mysql_load as L
from applier.sinks.base import VERBATIM
from tests.e2e.helpers import POS, Feed, processor, target_url

pytestmark = pytest.mark.e2e

UTC = dt.timezone.utc
KEY = "k`e%y"  # identifiers are data (invariant 10): quoted, a % and a backtick included

COLUMNS = {  # name -> MariaDB type
    KEY: "INT NOT NULL PRIMARY KEY",
    "ti": "TINYINT", "tb": "TINYINT(1)", "iu": "INT UNSIGNED", "bi": "BIGINT", "biu": "BIGINT UNSIGNED",
    "f": "FLOAT", "d": "DOUBLE", "dc": "DECIMAL(65,30)", "dm": "DECIMAL(10,2)",
    "c": "CHAR(10)", "vc": "VARCHAR(64)", "l1": "VARCHAR(20) CHARACTER SET latin1", "tx": "TEXT", "lt": "LONGTEXT",
    "bn": "BINARY(4)", "vb": "VARBINARY(300)", "bl": "BLOB",
    "dt": "DATE", "dtm": "DATETIME(6)", "ts": "TIMESTAMP(6) NULL", "tm": "TIME(6)", "yr": "YEAR",
    "b1": "BIT(1)", "b64": "BIT(64)", "e": "ENUM('a','b','2','ü')", "st": "SET('x','y','z')", "j": "JSON",
    "_applier_seq": "INT",  # the stage's own order column name, taken by the target: the stage picks another
    "gen": "BIGINT AS (`iu` + 1) VIRTUAL",  # generated: never written
}
WRITABLE = tuple(c for c in COLUMNS if c != "gen")
STRINGS = ["plain", "tab\there", "line\nbreak", "back\\slash", "NULL", "\\N", "N", "", "\\", "\\\\N", "\r\x1a\x08",
           "zoë", "李", "😀 four bytes", "trailing\\", "\t", "\n", "a\tb\nc\\d", "nul\x00in", "\x01"]
BINARIES = [b"\x00\x5c\x09\x0a", b"\xff\xfe\x80", b"", bytes(range(256)), b"\\N", b"NULL", None]


def _ddl(schema: str, table: str, columns: dict[str, str] = COLUMNS) -> str:
    q = lambda n: "`" + n.replace("`", "``") + "`"  # noqa: E731
    return (f"CREATE TABLE {q(schema)}.{q(table)} ({', '.join(f'{q(c)} {t}' for c, t in columns.items())}) "
            "DEFAULT CHARSET = utf8mb4")


def edge_rows() -> list[dict[str, Any]]:
    """One row per edge case and column (ENUM/SET as ints: the form Open, Canal-JSON and Simple give)."""
    rows = []
    n = max(len(STRINGS), len(BINARIES), 12)
    for i in range(n):
        rows.append({
            KEY: i, "ti": [-128, 127, 0, None][i % 4], "tb": [True, False, None][i % 3],
            "iu": [0, 2**32 - 1, None][i % 3], "bi": [-2**63, 2**63 - 1, 0][i % 3],
            "biu": [2**64 - 1, 0, None][i % 3],
            "f": [3.4028234663852886e+38, 0.1, -1.5, 1e-45, None][i % 5],
            "d": [0.1, -0.0, 1e300, 5e-324, 2.0**53 + 1, None][i % 6],
            "dc": [Decimal("12345678901234567890123456789012345.123456789012345678901234567890"), Decimal("-0.000001"),
                   Decimal("1E+3"), None][i % 4],
            "dm": [Decimal("1.25"), Decimal("-0.01"), Decimal("99999999.99"), Decimal("0"), None][i % 5],
            "c": ["", "abc", "😀", None][i % 4], "vc": STRINGS[i % len(STRINGS)],
            "l1": ["café", "plain", None][i % 3], "tx": STRINGS[(i + 3) % len(STRINGS)],
            "lt": "x" * (i * 1000) + STRINGS[(i + 5) % len(STRINGS)],
            "bn": [b"\x00\x00\x00\x00", b"\xff\\\t\n", None][i % 3], "vb": BINARIES[i % len(BINARIES)],
            "bl": BINARIES[(i + 2) % len(BINARIES)],
            "dt": [dt.date(2024, 2, 29), dt.date(1000, 1, 1), "0000-00-00", None][i % 4],
            "dtm": [dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.datetime(1000, 1, 1), "0000-00-00 00:00:00",
                    None][i % 4],
            "ts": [dt.datetime(2038, 1, 19, 3, 14, 7, 999999), dt.datetime(1970, 1, 1),  # the zero TIMESTAMP
                   dt.datetime(2020, 6, 1, 12, 0, 0, 5, tzinfo=dt.timezone(dt.timedelta(hours=2))), None][i % 4],
            "tm": [dt.timedelta(hours=-838, minutes=-59, seconds=-59), dt.timedelta(hours=838, minutes=59, seconds=59),
                   dt.timedelta(hours=100, microseconds=500000), dt.timedelta(0), None][i % 5],
            "yr": [0, 1901, 2155, None][i % 4], "b1": [0, 1, None][i % 3], "b64": [2**64 - 1, 0, 5, None][i % 4],
            "e": [1, 2, 3, 4, None][i % 5], "st": [0, 5, 7, None][i % 4],
            "j": ['{"a": [1, "x\\ty", null]}', "[]", '"\\\\N"', None][i % 4], "_applier_seq": i,
        })
    return rows


def random_rows(start: int, n: int, seed: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    alphabet = "ab \t\n\\Nzë李😀'\"%\x00"

    def text(k: int) -> str:
        return "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, k)))

    def maybe(v: Any) -> Any:
        return None if rnd.random() < 0.15 else v

    out = []
    for k in range(start, start + n):
        out.append({
            KEY: k, "ti": maybe(rnd.randrange(-128, 128)), "tb": maybe(rnd.random() < .5),
            "iu": maybe(rnd.randrange(0, 2**32)), "bi": rnd.randrange(-2**63, 2**63), "biu": maybe(rnd.randrange(0, 2**64)),
            "f": maybe(rnd.uniform(-1e6, 1e6)), "d": maybe(rnd.uniform(-1, 1) * 10.0 ** rnd.randrange(-300, 300)),
            "dc": maybe(Decimal(rnd.randrange(-10**35, 10**35)).scaleb(-rnd.randrange(0, 31))),
            "dm": maybe(Decimal(rnd.randrange(-10**9, 10**9)).scaleb(-2)),
            "c": maybe(text(10).rstrip(" ")), "vc": maybe(text(20)), "l1": maybe("".join(rnd.choice("abcé ") for _ in range(8))),
            "tx": maybe(text(200)), "lt": maybe(text(50)),
            "bn": maybe(rnd.randbytes(4)), "vb": maybe(rnd.randbytes(rnd.randrange(0, 300))), "bl": maybe(rnd.randbytes(100)),
            "dt": maybe(dt.date(1000, 1, 1) + dt.timedelta(days=rnd.randrange(0, 3_000_000))),
            "dtm": maybe(dt.datetime(1000, 1, 1) + dt.timedelta(microseconds=rnd.randrange(0, 280_000_000_000_000_000))),
            "ts": maybe(dt.datetime(1970, 1, 2) + dt.timedelta(microseconds=rnd.randrange(0, 2**50))),
            "tm": maybe(dt.timedelta(microseconds=rnd.randrange(-3_000_000_000_000, 3_000_000_000_000))),
            "yr": maybe(rnd.choice([0, rnd.randrange(1901, 2156)])), "b1": maybe(rnd.randrange(2)),
            "b64": maybe(rnd.randrange(2**64)), "e": maybe(rnd.randrange(1, 5)), "st": maybe(rnd.randrange(8)),
            "j": maybe('{"k": %d, "s": "%s"}' % (k, text(5).replace("\\", "\\\\").replace('"', '\\"')
                                               .replace("\t", "\\t").replace("\n", "\\n").replace("\x00", "\\u0000"))),
            "_applier_seq": maybe(k),
        })
    return out


def as_names(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same rows with ENUM and SET as names (the form Debezium and Avro give)."""
    enum = {1: "a", 2: "b", 3: "2", 4: "ü"}
    out = copy.deepcopy(rows)
    for r in out:
        if r["e"] is not None:
            r["e"] = enum[r["e"]]
        if r["st"] is not None:
            r["st"] = ",".join(m for b, m in ((1, "x"), (2, "y"), (4, "z")) if r["st"] & b)
    return out


@pytest.fixture
def engines(urls):
    plain = create_engine(target_url(urls, "mariadb"))
    fast = create_engine(target_url(urls, "mariadb"))
    L.enable_local_infile(fast)
    yield plain, fast
    plain.dispose()
    fast.dispose()


@pytest.fixture
def schema(urls, unique, drop_schema, engines):
    name = f"ld_{unique}"
    drop_schema(("mariadb", name))
    with engines[0].begin() as c:
        c.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    return name


def write(engine, schema: str, table: str, batches: list[list[dict[str, Any]]], *, min_rows: int = 1,
          cols: tuple[str, ...] = WRITABLE):
    """Each batch through MySQLSink.upsert_rows (adapted as Sink.write adapts them), one transaction."""
    sink = MARIADB.writer()
    sink.load_data.min_rows = min_rows
    with engine.begin() as c:
        sink.begin(c)
        meta = sink.table(c, schema, table)
        for rows in batches:
            sink.upsert_rows(c, meta, cols, sink.adapt_rows(meta, cols, copy.deepcopy(rows)))
    return sink


def select_all(engine, schema: str, table: str) -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.exec_driver_sql(
            f"SELECT *, UNIX_TIMESTAMP(ts), HEX(vc), HEX(l1) FROM `{schema}`.`{table}` ORDER BY 1")]


# ---- (a) the differential test ------------------------------------------------------------------------------

def test_both_paths_write_identical_tables(engines, schema) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(execution_options=VERBATIM, statement=_ddl(schema, "today"))
        c.exec_driver_sql(execution_options=VERBATIM, statement=_ddl(schema, "load"))
    edges = edge_rows()
    batches = [edges, random_rows(100, 700, seed=1), random_rows(800, 300, seed=2)]
    updates = [as_names(edges), as_names(random_rows(100, 700, seed=3)), random_rows(800, 300, seed=4)]
    many = write(plain, schema, "today", batches)
    load = write(fast, schema, "load", batches)
    assert many.load_data.stats.loaded_rows == 0
    assert load.load_data.stats.loaded_rows == sum(map(len, batches)), load.load_data.stats
    first = select_all(plain, schema, "today")
    assert len(first) == 1000 + len(edges) and select_all(plain, schema, "load") == first
    # updates over the same keys (ODKU), with ENUM/SET as names in some chunks
    write(plain, schema, "today", updates)
    load = write(fast, schema, "load", updates)
    assert load.load_data.stats.loaded_rows == sum(map(len, updates)), load.load_data.stats
    second = select_all(plain, schema, "today")
    assert second != first and select_all(plain, schema, "load") == second


def test_a_key_only_table_and_a_column_subset(engines, schema) -> None:
    plain, fast = engines
    with plain.begin() as c:
        for t in ("ko_today", "ko_load"):
            c.exec_driver_sql(f"CREATE TABLE `{schema}`.`{t}` (a INT NOT NULL, b VARCHAR(10) NOT NULL, PRIMARY KEY (a, b))")
            c.exec_driver_sql(execution_options=VERBATIM, statement=_ddl(schema, f"sub_{t}"))
    rows = [{"a": i % 7, "b": STRINGS[i % len(STRINGS)][:10]} for i in range(100)]
    rows = list({(r["a"], r["b"]): r for r in rows}.values())
    for _ in range(2):  # the second time every row is already there
        write(plain, schema, "ko_today", [rows], cols=("a", "b"))
        assert write(fast, schema, "ko_load", [rows], cols=("a", "b")).load_data.stats.loaded_rows == len(rows)
    with plain.connect() as c:
        assert (c.exec_driver_sql(f"SELECT * FROM `{schema}`.ko_today ORDER BY a, b").all()
                == c.exec_driver_sql(f"SELECT * FROM `{schema}`.ko_load ORDER BY a, b").all())
    sub = (KEY, "vc", "vb", "e")  # rows of fewer columns (other columns keep their defaults, or their old values)
    part = [{c: r[c] for c in sub} for r in edge_rows()]
    write(plain, schema, "sub_ko_today", [part], cols=sub)
    assert write(fast, schema, "sub_ko_load", [part], cols=sub).load_data.stats.loaded_rows == len(part)
    assert select_all(plain, schema, "sub_ko_today") == select_all(plain, schema, "sub_ko_load")


def test_a_chunk_with_a_value_type_the_path_does_not_write_goes_through_executemany(engines, schema) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(execution_options=VERBATIM, statement=_ddl(schema, "today"))
        c.exec_driver_sql(execution_options=VERBATIM, statement=_ddl(schema, "load"))
    mixed = edge_rows()
    mixed[0]["e"] = "b"  # an ENUM column holding an index and a name in one chunk
    write(plain, schema, "today", [mixed])
    sink = write(fast, schema, "load", [mixed])
    assert sink.load_data.stats.loaded_rows == 0 and sink.load_data.stats.fallback_values == 1
    assert select_all(plain, schema, "load") == select_all(plain, schema, "today")


def test_a_stage_follows_a_column_type_change(engines, schema) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.s (id INT PRIMARY KEY, v SMALLINT)")
    sink = MARIADB.writer()
    sink.load_data.min_rows = 1
    with fast.connect() as c:
        with c.begin():
            sink.begin(c)
            meta = sink.table(c, schema, "s")
            sink.upsert_rows(c, meta, ("id", "v"), [{"id": 1, "v": 7}])
        c.exec_driver_sql(f"ALTER TABLE `{schema}`.s MODIFY v BIGINT")
        c.commit()
        sink.forget_tables([(schema, "s")])
        with c.begin():
            sink.begin(c)
            meta = sink.table(c, schema, "s")
            sink.upsert_rows(c, meta, ("id", "v"), [{"id": 1, "v": 2**40}, {"id": 2, "v": -2**40}])
        assert sink.load_data.stats.loaded_rows == 3, sink.load_data.stats
        assert c.exec_driver_sql(f"SELECT id, v FROM `{schema}`.s ORDER BY id").all() == [(1, 2**40), (2, -2**40)]


def test_a_table_whose_loads_warn_goes_through_executemany_for_a_while(engines, schema, caplog) -> None:
    """A DECIMAL(10,2) fed three decimals rounds with a note (both paths store the rounded value); the LOAD's note
    sends its chunk through executemany and the table's next chunks straight there, 1, 2, 4, ... of them."""
    plain, fast = engines
    with plain.begin() as c:
        for t in ("today", "load"):
            c.exec_driver_sql(f"CREATE TABLE `{schema}`.`{t}` (id INT PRIMARY KEY, v DECIMAL(10,2))")
    batches = [[{"id": i * 10 + j, "v": Decimal(f"{i}.{j}55")} for j in range(10)] for i in range(6)]
    write(plain, schema, "today", batches, cols=("id", "v"))
    with caplog.at_level(logging.INFO, logger="applier.sinks"):
        sink = write(fast, schema, "load", batches, cols=("id", "v"))
    stats = sink.load_data.stats
    assert (stats.fallback_warnings, stats.skipped, stats.loaded_rows) == (3, 3, 0), stats  # L s L s s L
    told = [r.getMessage() for r in caplog.records if "load_data" in r.getMessage()]
    assert len(told) == 1 and "1265" in told[0] and ".load" in told[0]
    with plain.connect() as c:
        assert (c.exec_driver_sql(f"SELECT * FROM `{schema}`.today ORDER BY id").all()
                == c.exec_driver_sql(f"SELECT * FROM `{schema}`.load ORDER BY id").all())


# ---- (b) a refused value: the same error as today -------------------------------------------------------------

REFUSED = [("vc", "x" * 65), ("ti", 128), ("iu", -1), ("e", 9), ("st", 8), ("b1", 2), ("dm", Decimal("1E+9")),
           ("dtm", "2024-13-01 00:00:00"), ("j", "not json"), ("l1", "李"), ("c", "😀" * 11), ("yr", 1800),
           ("bi", 2**63)]


@pytest.mark.parametrize("column, value", REFUSED, ids=[c for c, _ in REFUSED])
def test_a_value_the_column_cannot_hold_raises_todays_error(engines, schema, column, value) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(execution_options=VERBATIM, statement=_ddl(schema, "t"))
    rows = random_rows(0, 300, seed=5)
    rows[150][column] = value
    errors = []
    for engine in (plain, fast):
        sink = MARIADB.writer()
        with pytest.raises(DBAPIError) as info:
            write_with(sink, engine, schema, rows)
        errors.append(str(info.value))
        if engine is fast:
            assert sink.load_data.stats.fallback_warnings + sink.load_data.stats.fallback_errors == 1, \
                sink.load_data.stats
    assert errors[0] == errors[1]
    assert select_all(plain, schema, "t") == []


def write_with(sink, engine, schema: str, rows: list[dict[str, Any]]) -> None:
    with engine.begin() as c:
        sink.begin(c)
        meta = sink.table(c, schema, "t")
        sink.upsert_rows(c, meta, WRITABLE, sink.adapt_rows(meta, WRITABLE, copy.deepcopy(rows)))


def test_not_null_refused_as_today(engines, schema) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.t (id INT PRIMARY KEY, v VARCHAR(8) NOT NULL)")
    rows = [{"id": i, "v": None if i == 77 else "ok"} for i in range(300)]
    errors = []
    for engine in (plain, fast):
        with pytest.raises(DBAPIError) as info:
            write(engine, schema, "t", [rows], cols=("id", "v"))
        errors.append(str(info.value))
    assert "1048" in errors[0] and errors[0] == errors[1]


def test_the_apply_stage_stops_with_the_same_apply_error(engines, schema, unique) -> None:
    """Through the processor (decode, gate, apply) with each engine: the row too long for VARCHAR(8) stops the run
    with the same ApplyError, and nothing of the batch is written."""
    plain, fast = engines
    cols = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))
    messages = []
    for n, engine in enumerate((plain, fast)):
        f = Feed()
        table = f"r{n}"
        proc = processor(engine, f"refuse-{n}-{unique}", lambda s, t: (schema, t))
        proc.process(f.msgs(DDL("up", table, 100, f"CREATE TABLE `{table}` (`id` INT PRIMARY KEY, `v` VARCHAR(8))", POS),
                            Resolved(150, POS)))
        rows = L.MIN_ROWS + 200  # one chunk, large enough for the LOAD DATA path
        changes = [RowChange("up", table, 200, Op.INSERT, None, {"id": i, "v": "too long!" if i == rows - 50 else "ok"},
                             cols, POS) for i in range(rows)]
        with pytest.raises(ApplyError) as info:
            proc.process(f.msgs(*changes, Resolved(300, POS), batch=100))
        messages.append(str(info.value).replace(table, "<t>"))
        stats = proc.applier.sink.load_data.stats
        assert stats.fallback_warnings >= (1 if engine is fast else 0), stats
        with plain.connect() as c:
            assert c.exec_driver_sql(f"SELECT COUNT(*) FROM `{schema}`.`{table}`").scalar() == 0
    assert "Data too long" in messages[0] and messages[0] == messages[1]


# ---- (c) a server that does not allow LOCAL INFILE --------------------------------------------------------------

@pytest.fixture
def local_infile_off(engines):
    plain = engines[0]
    with plain.connect() as c:
        before = c.exec_driver_sql("SELECT @@GLOBAL.local_infile").scalar()
    yield lambda on: _set_local_infile(plain, on)
    _set_local_infile(plain, bool(before))


def _set_local_infile(engine, on: bool) -> None:
    with engine.begin() as c:
        c.exec_driver_sql(f"SET GLOBAL local_infile = {1 if on else 0}")


def _settings(urls, load_data: str):
    return parse_config({
        "pipeline": {"name": "p", "checkpoint_dir": "/tmp/applier-ld-ckpt"},
        "source": {"bootstrap_servers": urls.kafka, "topics": ["t"], "protocol": "open"},
        "target": {"url": target_url(urls, "mariadb"), "load_data": load_data},
    }, env={})


def test_auto_falls_back_and_on_refuses_when_the_server_does_not_allow_it(urls, local_infile_off, caplog) -> None:
    local_infile_off(False)
    auto = _settings(urls, "auto")
    engine = make_engine(auto, load_data=True)
    with caplog.at_level(logging.WARNING, logger="applier.pipeline"):
        settled = settle_load_data(engine, auto)
    try:
        assert settled is not engine and not list(settled.dialect.dispatch.do_connect)
        assert any("load_data" in r.getMessage() and "local_infile" in r.getMessage() for r in caplog.records)
        with settled.connect() as c:
            assert L.guarded(c) is None
    finally:
        settled.dispose()
    on = _settings(urls, "on")
    with pytest.raises(ConfigError) as info:
        settle_load_data(make_engine(on, load_data=True), on)
    assert info.value.key == "target.load_data"
    assert "SET GLOBAL local_infile = 1" in info.value.message and "local_infile is OFF" in info.value.message
    local_infile_off(True)
    for mode in ("auto", "on"):
        s = _settings(urls, mode)
        engine = make_engine(s, load_data=True)
        try:
            assert settle_load_data(engine, s) is engine
        finally:
            engine.dispose()


def test_a_connection_that_saw_it_on_falls_back_when_it_goes_off(engines, schema, local_infile_off, caplog) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.t (id INT PRIMARY KEY, v VARCHAR(8))")
    local_infile_off(True)
    sink = MARIADB.writer()
    sink.load_data.min_rows = 1
    rows = [{"id": i, "v": str(i)} for i in range(300)]
    with fast.connect() as c:
        with c.begin():
            sink.begin(c)
            meta = sink.table(c, schema, "t")
            sink.upsert_rows(c, meta, ("id", "v"), rows[:100])
        local_infile_off(False)
        with caplog.at_level(logging.WARNING, logger="applier.sinks"), c.begin():
            sink.begin(c)
            sink.upsert_rows(c, meta, ("id", "v"), rows[100:200])  # refused by the server: executemany
            sink.upsert_rows(c, meta, ("id", "v"), rows[200:])  # the connection knows now: executemany at once
        assert c.connection.info[L.ALLOWED_KEY] is False
    stats = sink.load_data.stats
    assert (stats.loaded_rows, stats.fallback_errors) == (100, 1), stats
    assert any("local_infile" in r.getMessage() for r in caplog.records)
    with plain.connect() as c:
        assert c.exec_driver_sql(f"SELECT COUNT(*), SUM(id) FROM `{schema}`.t").one() == (300, sum(range(300)))


# ---- (d) rollback and replay ------------------------------------------------------------------------------

def _stage_rows(c) -> list[int]:
    """The rows in each of the connection's stages (0 for a dropped one: a stage lives from a chunk's LOAD to
    its merge's end)."""
    out = []
    for s in c.connection.info.get(L.STAGES_KEY, {}).values():
        try:
            with c.begin_nested():
                out.append(c.exec_driver_sql(f"SELECT COUNT(*) FROM {s.name}").scalar())
        except DBAPIError as exc:
            assert exc.orig.args[0] == 1146, exc  # no such table
            out.append(0)
    return out


def test_the_mariadb_stage_is_aria_and_is_dropped_after_its_merge(engines, schema) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.t (id INT PRIMARY KEY, v TEXT, b BLOB)")
    sink = MARIADB.writer()
    sink.load_data.min_rows = 1
    with fast.connect() as c, c.begin():
        sink.begin(c)
        meta = sink.table(c, schema, "t")
        stage = sink.load_data._stage(c, meta, ("id", "v", "b"))
        create = c.exec_driver_sql(f"SHOW CREATE TABLE {stage.name}").one()[1]
        assert "ENGINE=Aria" in create and "`b` blob" in create, create
        sink.upsert_rows(c, meta, ("id", "v", "b"), [{"id": i, "v": "x" * i, "b": bytes([i])} for i in range(50)])
        with pytest.raises(DBAPIError), c.begin_nested():
            c.exec_driver_sql(f"SELECT COUNT(*) FROM {stage.name}")
    with plain.connect() as c:
        assert c.exec_driver_sql(f"SELECT COUNT(*), SUM(LENGTH(v)) FROM `{schema}`.t").one() == (50, sum(range(50)))


def test_rows_a_rolled_back_load_left_in_the_stage_never_reach_the_next_chunk(engines, schema, monkeypatch) -> None:
    """Aria does not roll back: a LOAD whose transaction failed before the merge leaves its rows in the stage,
    and the replay on the same connection must start from an empty one."""
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.t (id INT PRIMARY KEY, v VARCHAR(8))")
    sink = MARIADB.writer()
    sink.load_data.min_rows = 1
    up = sink.load_data
    with fast.connect() as c:
        with c.begin():
            sink.begin(c)
            meta = sink.table(c, schema, "t")
        stage = up._stage(c, meta, ("id", "v"))
        c.rollback()
        real = stage.merge
        stage.merge = "SELECT no_such_column FROM DUAL"  # the merge fails after the LOAD (a transient fault, say)
        up.transient = lambda exc: True
        with pytest.raises(DBAPIError), c.begin():
            sink.begin(c)
            sink.upsert_rows(c, meta, ("id", "v"), [{"id": i, "v": "lost"} for i in range(100, 130)])
        assert _stage_rows(c) == [30]  # still there: the engine kept them through the rollback
        c.rollback()
        stage.merge = real
        with c.begin():
            sink.begin(c)
            sink.upsert_rows(c, meta, ("id", "v"), [{"id": i, "v": "kept"} for i in range(5)])
        assert _stage_rows(c) == [0]
    with plain.connect() as c:
        assert c.exec_driver_sql(f"SELECT id, v FROM `{schema}`.t ORDER BY id").all() == [(i, "kept") for i in range(5)]


def test_a_rolled_back_transaction_or_savepoint_leaves_nothing(engines, schema) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.t (id INT PRIMARY KEY, v VARCHAR(8))")
        c.exec_driver_sql(f"INSERT INTO `{schema}`.t VALUES (-1, 'before')")
    sink = MARIADB.writer()
    sink.load_data.min_rows = 1
    rows = [{"id": i, "v": str(i)} for i in range(200)]
    with fast.connect() as c:
        tx = c.begin()
        sink.begin(c)
        meta = sink.table(c, schema, "t")
        sink.upsert_rows(c, meta, ("id", "v"), rows[:100])  # the stage is created inside this transaction
        assert c.exec_driver_sql(f"SELECT COUNT(*) FROM `{schema}`.t").scalar() == 101
        tx.rollback()
        assert c.exec_driver_sql(f"SELECT COUNT(*) FROM `{schema}`.t").scalar() == 1
        assert _stage_rows(c) == [0]
        c.rollback()
        with c.begin():
            sink.begin(c)
            sp = c.begin_nested()
            sink.upsert_rows(c, meta, ("id", "v"), rows[100:])
            sp.rollback()
            sink.upsert_rows(c, meta, ("id", "v"), rows[:10])  # the same connection, the same stage: only these
        assert _stage_rows(c) == [0]
        c.rollback()
    assert sink.load_data.stats.loaded_chunks == 3
    with plain.connect() as c:
        assert c.exec_driver_sql(f"SELECT id FROM `{schema}`.t ORDER BY id").scalars().all() == list(range(-1, 10))


def test_a_replay_after_a_rollback_or_a_lost_connection_writes_the_rows_once(engines, schema) -> None:
    """Invariant 14: a transient fault rolls the whole transaction back (or loses the session and its temporary
    tables) and the retry writes the same chunk again."""
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.t (id INT PRIMARY KEY, v VARCHAR(8), n INT)")
    sink = MARIADB.writer()
    sink.load_data.min_rows = 1
    rows = [{"id": i, "v": str(i), "n": 1} for i in range(150)]
    cols = ("id", "v", "n")
    with fast.connect() as c:
        with pytest.raises(RuntimeError):
            with c.begin():
                sink.begin(c)
                meta = sink.table(c, schema, "t")
                sink.upsert_rows(c, meta, cols, rows)
                raise RuntimeError("a deadlock, say")
        with c.begin():  # the retry on the same connection
            sink.begin(c)
            sink.upsert_rows(c, meta, cols, rows)
        c.begin()
        sink.begin(c)
        sink.upsert_rows(c, meta, cols, [dict(r, n=2) for r in rows])
        c.invalidate()  # the connection is lost before the commit
    with fast.connect() as c:  # the retry on a new session: a new stage
        with c.begin():
            sink.begin(c)
            sink.upsert_rows(c, meta, cols, [dict(r, n=2) for r in rows])
    assert sink.load_data.stats.loaded_chunks == 4
    with plain.connect() as c:
        assert c.exec_driver_sql(f"SELECT COUNT(*), SUM(n), MIN(n) FROM `{schema}`.t").one() == (150, 300, 2)


# ---- (e) the file guard -------------------------------------------------------------------------------------

def test_a_server_request_for_another_file_is_refused(engines, schema, tmp_path, monkeypatch) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.t (id INT PRIMARY KEY, v VARCHAR(200))")
    secret = tmp_path / "secret.txt"
    secret.write_text("1\tnot for the server\n")
    mine = tmp_path / "mine.tsv"
    mine.write_text("2\tmine\n")
    load = f"LOAD DATA LOCAL INFILE '{{}}' INTO TABLE `{schema}`.t"
    with fast.connect() as c:
        dbapi = L.guarded(c)
        assert dbapi is not None
        with pytest.raises(DBAPIError) as info:  # no LOAD of the writer running
            c.exec_driver_sql(load.format(secret))
        assert isinstance(info.value.orig, L.LocalFileRefused) and "no LOAD DATA of the applier" in str(info.value)
        with pytest.raises(DBAPIError) as info, dbapi.sending(str(mine)):  # another file than the one permitted
            c.exec_driver_sql(load.format(secret))
        assert isinstance(info.value.orig, L.LocalFileRefused) and "instead of the file" in str(info.value)
        assert c.exec_driver_sql("SELECT 1").scalar() == 1  # the connection stayed in step
        with dbapi.sending(str(mine)):
            c.exec_driver_sql(load.format(mine))
        assert dbapi.applier_load_result == (1, 0)
        c.commit()
    # the writer raises a refused request (never falls back on it): a server naming its own file is not trusted
    monkeypatch.setattr(L, "path_literal", lambda path: f"'{secret}'")
    with pytest.raises(DBAPIError) as info:
        write(fast, schema, "t", [[{"id": 3, "v": "x"}]], cols=("id", "v"))
    assert isinstance(info.value.orig, L.LocalFileRefused)
    with plain.connect() as c:
        assert c.exec_driver_sql(f"SELECT id, v FROM `{schema}`.t").all() == [(2, "mine")]


def test_a_stage_engine_the_server_refuses_falls_back_to_its_default_once(engines, schema, caplog) -> None:
    plain, fast = engines
    with plain.begin() as c:
        c.exec_driver_sql(f"CREATE TABLE `{schema}`.t (id INT PRIMARY KEY, v VARCHAR(8))")
    sink = MARIADB.writer()
    sink.load_data.min_rows = 1
    sink.load_data.stage_engine = "NoSuchEngine"
    with caplog.at_level(logging.WARNING), fast.connect() as c:
        for part in range(2):
            with c.begin():
                sink.begin(c)
                meta = sink.table(c, schema, "t")
                sink.upsert_rows(c, meta, ("id", "v"), [{"id": i, "v": str(part)} for i in range(20)])
    assert sink.load_data.stats.loaded_chunks == 2
    assert sum("ENGINE=NoSuchEngine" in r.getMessage() for r in caplog.records) == 1
    with plain.connect() as c:
        assert c.exec_driver_sql(f"SELECT COUNT(*), MIN(v) FROM `{schema}`.t").one() == (20, "1")
