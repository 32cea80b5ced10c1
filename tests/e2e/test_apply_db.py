"""The apply stage against real MariaDB and PostgreSQL, without Spark (decode -> route -> gate -> apply).

Invariants checked here: identifiers from upstream are always quoted (10), one upstream transaction larger
than the memory budget spills and still applies in one target transaction (8), a failed write leaves neither
data nor progress behind (6), and a MySQL DDL interrupted after it ran is completed on replay (6).
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, select, text

from applier import migrate
from applier import progress as P
from applier.codecs import get_decoder
from applier.dialect import MARIADB, dialect_for
from applier.events import DDL, Column, KafkaMessage, Op, Resolved, RowChange
from applier.processor import BatchProcessor
from applier.progress import ProgressStore
from applier.sinks import ApplyError
from tests.e2e.helpers import POS, TOPIC, Feed, processor, target_url

pytestmark = pytest.mark.e2e

@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"ap_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    yield request.param, engine, schema
    engine.dispose()


WEIRD_TABLE = 'we`ir"d%s; DROP TABLE x; --'
WEIRD_COL = 'co`l"%(x)s; --'


def test_identifiers_from_upstream_are_quoted(target, unique) -> None:
    kind, engine, schema = target
    cols = (Column("id", "int", nullable=False, key=True), Column(WEIRD_COL, "varchar"))
    q = "`" + WEIRD_TABLE.replace("`", "``") + "`"
    c = "`" + WEIRD_COL.replace("`", "``") + "`"
    ddl = DDL("up", WEIRD_TABLE, 100, f"CREATE TABLE {q} (`id` INT PRIMARY KEY, {c} VARCHAR(20) DEFAULT '5%' COMMENT '100%')", POS)
    f = Feed()
    proc = processor(engine, f"id-{unique}", lambda s, t: (schema, t))
    msgs = f.msgs(ddl,
                  RowChange("up", WEIRD_TABLE, 101, Op.INSERT, None, {"id": 1, WEIRD_COL: "'); DROP --"}, cols, POS),
                  RowChange("up", WEIRD_TABLE, 102, Op.INSERT, None, {"id": 2, WEIRD_COL: "b"}, cols, POS),
                  RowChange("up", WEIRD_TABLE, 103, Op.DELETE, {"id": 2, WEIRD_COL: "b"}, None, cols, POS),
                  Resolved(200, POS))
    proc.process(msgs)
    from applier.devtools.verify import read_table
    rows = read_table(engine, schema, WEIRD_TABLE)
    assert rows == {(1,): {"id": 1, WEIRD_COL: "'); DROP --"}}


def test_transaction_larger_than_the_budget_spills_and_applies_atomically(target, unique, tmp_path) -> None:
    kind, engine, schema = target
    cols = (Column("id", "bigint", nullable=False, key=True), Column("amount", "decimal"),
            Column("at", "datetime"), Column("note", "varchar"))
    ddl = DDL("up", "big", 100, "CREATE TABLE `big` (`id` BIGINT PRIMARY KEY, `amount` DECIMAL(20,4), "
              "`at` DATETIME(6), `note` VARCHAR(64))", POS)
    f = Feed()
    proc = processor(engine, f"big-{unique}", lambda s, t: (schema, t), budget_bytes=300_000,
                     spill_dir=str(tmp_path))
    proc.process(f.msgs(ddl, Resolved(100, POS)))
    n = 30_000
    base = dt.datetime(2026, 5, 1, 12, 0, 0, 123456)
    rows = [RowChange("up", "big", 500, Op.INSERT, None,
                      {"id": i, "amount": Decimal(i) / 10000, "at": base + dt.timedelta(seconds=i), "note": f"n{i}"},
                      cols, POS) for i in range(n)]
    # the one transaction (commit ts 500) arrives over several micro-batches, before its resolved ts
    for lo in range(0, n, 5000):
        proc.process(f.msgs(*rows[lo:lo + 5000], batch=64))
    assert proc.gate.stats["spills"] >= 2 and proc.gate.held == n
    assert proc.gate.memory_bytes <= 300_000
    with engine.connect() as c:
        assert c.execute(text(f"SELECT COUNT(*) FROM {_q(kind, schema)}.{_q(kind, 'big')}")).scalar() == 0
    proc.process(f.msgs(Resolved(600, POS)))
    with engine.connect() as c:
        assert c.execute(text(f"SELECT COUNT(*), SUM(id) FROM {_q(kind, schema)}.{_q(kind, 'big')}")).one() == (n, n * (n - 1) // 2)
        assert c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == f"big-{unique}")).scalar() == 600
    assert not list(tmp_path.rglob("*.pickle"))
    proc.close()


def test_failed_write_leaves_no_data_and_no_progress(target, unique) -> None:
    kind, engine, schema = target
    cols = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))
    f = Feed()
    name = f"atom-{unique}"
    proc = processor(engine, name, lambda s, t: (schema, t))
    proc.process(f.msgs(DDL("up", "a", 100, "CREATE TABLE `a` (`id` INT PRIMARY KEY, `v` VARCHAR(8))", POS),
                        Resolved(150, POS)))
    # table "missing" has no CREATE: its write fails after table a's rows were written in the same transaction
    msgs = f.msgs(RowChange("up", "a", 200, Op.INSERT, None, {"id": 1, "v": "x"}, cols, POS),
                  RowChange("up", "missing", 201, Op.INSERT, None, {"id": 1, "v": "x"}, cols, POS),
                  Resolved(300, POS))
    with pytest.raises(ApplyError, match="does not exist"):
        proc.process(msgs)
    with engine.connect() as c:
        assert c.execute(text(f"SELECT COUNT(*) FROM {_q(kind, schema)}.{_q(kind, 'a')}")).scalar() == 0
        assert c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == name)).scalar() == 150


def test_staging_tables_kept_for_the_session_follow_a_column_type_change(target, unique) -> None:
    """PostgreSQL keeps its staging tables across transactions (ON COMMIT DELETE ROWS): one left from before an
    ALTER would stage a BIGINT value in a SMALLINT column. A rolled-back batch (its staging table created in it)
    must not break the next one either. MariaDB writes without staging tables and must pass the same."""
    kind, engine, schema = target
    cols = (Column("id", "int", nullable=False, key=True), Column("v", "smallint"))
    f = Feed()
    proc = processor(engine, f"stage-{unique}", lambda s, t: (schema, t))
    proc.process(f.msgs(DDL("up", "s", 100, "CREATE TABLE `s` (`id` INT PRIMARY KEY, `v` SMALLINT)", POS),
                        RowChange("up", "s", 101, Op.INSERT, None, {"id": 1, "v": 7}, cols, POS),
                        Resolved(150, POS)))
    with pytest.raises(ApplyError, match="does not exist"):  # rolls back the staging of s created in it
        proc.process(f.msgs(RowChange("up", "s", 160, Op.INSERT, None, {"id": 3, "v": 8}, cols, POS),
                            RowChange("up", "gone", 161, Op.INSERT, None, {"id": 1, "v": 1}, cols, POS),
                            Resolved(170, POS)))
    proc = processor(engine, f"stage-{unique}", lambda s, t: (schema, t))  # the restart after that failure
    wide = (cols[0], Column("v", "bigint"))
    proc.process(f.msgs(RowChange("up", "s", 180, Op.INSERT, None, {"id": 2, "v": 9}, cols, POS),
                        Resolved(190, POS),
                        DDL("up", "s", 200, "ALTER TABLE `s` MODIFY `v` BIGINT", POS),
                        RowChange("up", "s", 201, Op.UPDATE, {"id": 1, "v": 7}, {"id": 1, "v": 2 ** 40}, wide, POS),
                        Resolved(250, POS)))
    proc.process(f.msgs(RowChange("up", "s", 260, Op.DELETE, {"id": 2, "v": 9}, None, wide, POS),
                        RowChange("up", "s", 261, Op.INSERT, None, {"id": 4, "v": -2 ** 40}, wide, POS),
                        Resolved(300, POS)))
    with engine.connect() as c:
        got = c.execute(text(f"SELECT id, v FROM {_q(kind, schema)}.{_q(kind, 's')} ORDER BY id")).all()
    assert [tuple(r) for r in got] == [(1, 2 ** 40), (4, -2 ** 40)]


def test_mysql_ddl_interrupted_after_running_completes_on_replay(urls, unique, drop_schema) -> None:
    """The crash window of a non-transactional DDL: history says 'started', the table already exists."""
    schema = f"ap_{unique}"
    drop_schema(("mariadb", schema))
    engine = create_engine(urls.mariadb_url)
    name = f"ddl-{unique}"
    ev = DDL("up", "d", 100, "ALTER TABLE `d` ADD COLUMN `extra` INT", POS)
    try:
        assert urls.mariadb_url.startswith("mysql+pymysql://")
        assert dialect_for(engine) is MARIADB  # a mysql+pymysql URL: the server itself says it is MariaDB
        migrate.upgrade(engine)
        crashed = ProgressStore(name, "open")
        crashed.claim(engine)
        with engine.begin() as c:
            c.execute(text(f"CREATE DATABASE `{schema}`"))
            c.execute(text(f"CREATE TABLE `{schema}`.`d` (`id` INT PRIMARY KEY, `extra` INT)"))  # ran before the crash
            crashed.ddl_record(c, ev, P.ddl_key(ev), state="started", statements=[])
        proc = processor(engine, name, lambda s, t: (schema, t))
        proc.process(Feed().msgs(ev, Resolved(200, POS)))
        with engine.connect() as c:
            assert c.execute(select(P.ddl_history.c.state).where(P.ddl_history.c.pipeline == name)).scalar() == "done"
        # without a 'started' record, an error of the same family is a real failure that stops the pipeline
        ev2 = DDL("up", "nosuch", 300, "ALTER TABLE `nosuch` ADD COLUMN `x` INT", POS)
        proc2 = processor(engine, name, lambda s, t: (schema, t))
        with pytest.raises(ApplyError, match="doesn.t exist"):
            proc2.process(Feed().msgs(ev2, Resolved(400, POS)))
    finally:
        engine.dispose()


def _q(kind: str, name: str) -> str:
    return f"`{name}`" if kind == "mariadb" else f'"{name}"'


def test_ungated_replay_of_a_unique_key_swap_applies_in_replace_mode(target, unique) -> None:
    """No commit ts (canal-json without the TiDB extension): a re-sent older insert can arrive while another
    row holds its unique value. Without clearing unique-key holders first, PostgreSQL refused the batch
    (UniqueViolation) and MariaDB's ON DUPLICATE KEY UPDATE overwrote the wrong row."""
    from applier.devtools.encoders.canal_json import encode_canal_json

    kind, engine, schema = target
    cols = (Column("id", "int", nullable=False, key=True), Column("email", "varchar", unique=True))
    with engine.begin() as c:
        c.execute(text(f"CREATE SCHEMA {_q(kind, schema)}" if kind == "postgres" else f"CREATE DATABASE `{schema}`"))
        c.execute(text(f"CREATE TABLE {_q(kind, schema)}.{_q(kind, 'u')} (id INT PRIMARY KEY, "
                       f"email VARCHAR(20) NOT NULL UNIQUE)"))

    def rc(op, before=None, after=None):
        return RowChange("up", "u", 0, op, before, after, cols, POS)

    a_x, b_y, a_y, b_x = ({"id": 1, "email": "x"}, {"id": 2, "email": "y"}, {"id": 1, "email": "y"},
                          {"id": 2, "email": "x"})
    stream = [rc(Op.INSERT, after=a_x), rc(Op.INSERT, after=b_y), rc(Op.DELETE, before=a_x),
              rc(Op.DELETE, before=b_y), rc(Op.INSERT, after=a_y), rc(Op.INSERT, after=b_x)]
    stream += stream  # a TiCDC restart re-sends all of it
    msgs = [KafkaMessage(TOPIC, 0, i, *encode_canal_json(ev, enable_tidb_extension=False))
            for i, ev in enumerate(stream)]
    migrate.upgrade(engine)
    store = ProgressStore(f"ug-{unique}", "canal-json")
    store.claim(engine)
    with engine.connect() as c:
        state = store.load(c)
    proc = BatchProcessor(engine=engine, decoder=get_decoder("canal-json", require_tidb_extension=False),
                          route=lambda s, t: (schema, t), store=store, state=state, partitions=[(TOPIC, 0)])
    for lo, hi in ((0, 6), (6, 7), (7, 12)):
        proc.process(msgs[lo:hi])
    from applier.devtools.verify import read_table
    assert read_table(engine, schema, "u") == {(1,): a_y, (2,): b_x}


def test_two_transactions_making_the_same_schema_at_once_both_go_on(urls, unique, drop_schema) -> None:
    """PostgreSQL's CREATE SCHEMA IF NOT EXISTS waits for another transaction's uncommitted schema and then fails
    on pg_namespace's unique index: two apply streams each making a table of a new schema met it. The second
    one's transaction must go on (and stay usable) once the first committed."""
    import threading
    import time

    from applier.dialect import POSTGRES

    engine = create_engine(target_url(urls, "postgres"))
    schema = f"twice_{unique}"
    drop_schema(("postgres", schema))
    sink = POSTGRES.writer()
    first_made = threading.Event()
    errors: list[BaseException] = []

    def second() -> None:
        try:
            first_made.wait(10)
            with engine.begin() as c:
                sink.prepare_schema(c, schema)  # waits for the first, then meets its committed schema
                c.exec_driver_sql(f'CREATE TABLE "{schema}".b (id INT PRIMARY KEY)')
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread below
            errors.append(exc)

    t = threading.Thread(target=second)
    t.start()
    with engine.begin() as c:
        sink.prepare_schema(c, schema)
        c.exec_driver_sql(f'CREATE TABLE "{schema}".a (id INT PRIMARY KEY)')
        first_made.set()
        time.sleep(1.0)  # the second transaction is now waiting on this one's schema
    t.join(30)
    assert not errors, errors
    with engine.connect() as c:
        assert sorted(c.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema})
                      .scalars()) == ["a", "b"]
    engine.dispose()
