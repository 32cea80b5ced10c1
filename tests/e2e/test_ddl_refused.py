"""Issue 24 on both targets, through the real apply path (TiCDC Open Protocol messages decoded and applied by the
BatchProcessor, without Spark): a DDL the target refuses can no longer stall the replica for good.

* Under the default ``[target] on_unsupported_ddl = "stop"`` the run stops naming the DDL's Kafka position, its
  table, the target's error and the key to set, and a rerun stops again at the same place (on MariaDB too, where
  "doesn't exist" would otherwise pass for a replay of a statement already in effect).
* Under ``"skip"`` the refused DDL is recorded in ``applier_ddl_history`` as skipped with the target's error and its
  position, and the pipeline goes on: the tables end as expected.
* An ALTER whose MySQL executable comment smuggles a clause (``/*!50000 , DROP TABLE ... */``) never reaches the
  target: it stops the run (or is skipped by the policy) and the tables stay as they were; a MariaDB executable
  comment (``/*M! ... */``) is dropped and the ALTER runs without it.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect, select, text

from applier import progress as P
from applier.events import DDL, Column, Op, Resolved, RowChange
from applier.routing import Router, Rule
from applier.sinks import ApplyError
from tests.e2e.helpers import POS, Feed, processor, target_url

pytestmark = pytest.mark.e2e

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))
COLS_W = COLS + (Column("w", "int"),)


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"rf_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    yield request.param, engine, schema
    engine.dispose()


def _q(kind: str, name: str) -> str:
    return f"`{name}`" if kind == "mariadb" else f'"{name}"'


def _rows(kind: str, engine, schema: str, table: str = "t") -> list[tuple]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(f"SELECT * FROM {_q(kind, schema)}.{_q(kind, table)} ORDER BY id"))]


def _history(engine, name: str) -> list[tuple[str, str, str]]:
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(
            select(P.ddl_history.c.query, P.ddl_history.c.state, P.ddl_history.c.detail)
            .where(P.ddl_history.c.pipeline == name).order_by(P.ddl_history.c.commit_ts))]


def _ins(ts: int, key: int, v: str, w: int | None = None) -> RowChange:
    if w is None:
        return RowChange("shop", "t", ts, Op.INSERT, None, {"id": key, "v": v}, COLS, POS)
    return RowChange("shop", "t", ts, Op.INSERT, None, {"id": key, "v": v, "w": w}, COLS_W, POS)


def _stream(missing: str) -> list:
    """Offsets 0.. in this order: the refused DDLs are at offsets 3 and 4."""
    return [
        DDL("shop", "t", 100, "CREATE TABLE `t` (`id` INT PRIMARY KEY, `v` VARCHAR(8))", POS),
        _ins(110, 1, "a"),
        _ins(111, 2, "b"),
        # issue 24's message: its header names a schema the target lacks, so the routed TRUNCATE is refused there
        DDL(missing, "applier_partitions", 120, "TRUNCATE TABLE applier_partitions", POS),
        # a column the target table does not have
        DDL("shop", "t", 130, "ALTER TABLE t RENAME COLUMN nope TO other", POS),
        RowChange("shop", "t", 140, Op.UPDATE, {"id": 1, "v": "a"}, {"id": 1, "v": "c"}, COLS, POS),
        _ins(141, 3, "d"),
        DDL("shop", "t", 150, "ALTER TABLE t ADD COLUMN w INT", POS),
        _ins(160, 4, "e", 7),
        Resolved(200, POS),
    ]


EXPECTED = [(1, "c", None), (2, "b", None), (3, "d", None), (4, "e", 7)]


def test_under_skip_a_refused_ddl_is_recorded_and_the_pipeline_goes_on(target, unique) -> None:
    kind, engine, schema = target
    router = Router([Rule(match="shop.*", schema=schema)])
    name = f"rf-skip-{unique}"
    proc = processor(engine, name, router.route, ddl_scope=router.routed_by_rule, on_unsupported_ddl="skip")
    report = proc.process(Feed().msgs(*_stream(f"nx_{unique}")))
    assert report.applied_ts == 200
    assert _rows(kind, engine, schema) == EXPECTED
    hist = _history(engine, name)
    assert [(q.split()[0], s) for q, s, _ in hist] == [("CREATE", "done"), ("TRUNCATE", "skipped"),
                                                       ("ALTER", "skipped"), ("ALTER", "done")]
    truncate, rename = hist[1][2], hist[2][2]
    assert truncate.startswith("refused by the target: ") and "applier_partitions" in truncate
    assert truncate.endswith("(DDL message at topic=t partition=0 offset=3)"), truncate
    assert rename.startswith("refused by the target: ") and "nope" in rename
    assert rename.endswith("(DDL message at topic=t partition=0 offset=4)"), rename
    assert f"upstream table shop.t (target {schema}.t)" in rename


def test_under_stop_it_stops_naming_the_position_at_every_rerun_and_skip_lets_it_go_on(target, unique) -> None:
    kind, engine, schema = target
    router = Router([Rule(match="shop.*", schema=schema)])
    name = f"rf-stop-{unique}"
    missing = f"nx_{unique}"

    def run(policy: str):
        proc = processor(engine, name, router.route, ddl_scope=router.routed_by_rule, on_unsupported_ddl=policy)
        return proc.process(Feed().msgs(*_stream(missing)))  # Kafka hands the run everything again

    for _ in range(2):  # the first run, and a rerun with nothing changed
        with pytest.raises(ApplyError) as err:
            run("stop")
        msg = str(err.value)
        assert "DDL at topic=t partition=0 offset=3 (commit ts 120)" in msg, msg
        assert f"upstream table {missing}.applier_partitions (target {missing}.applier_partitions)" in msg, msg
        assert "failed on the target: " in msg and "TRUNCATE TABLE" in msg, msg
        assert 'set [target] on_unsupported_ddl = "skip"' in msg, msg
        # what came before it is applied and committed with its progress; nothing after it
        assert _rows(kind, engine, schema) == [(1, "a"), (2, "b")]
    # MariaDB's DDL commits alone: its "started" marker says "refused" (the rerun was no replay); PostgreSQL's DDL
    # transaction rolled back with its record
    states = {q.split()[0]: s for q, s, _ in _history(engine, name)}
    assert states.get("TRUNCATE") == ("refused" if kind == "mariadb" else None)
    assert run("skip").applied_ts == 200
    assert _rows(kind, engine, schema) == EXPECTED
    assert [s for _, s, _ in _history(engine, name)] == ["done", "skipped", "skipped", "done"]


def _comment_stream(query: str) -> list:
    return [
        DDL("shop", "t", 100, "CREATE TABLE `t` (`id` INT PRIMARY KEY, `v` VARCHAR(8))", POS),
        DDL("shop", "victim", 101, "CREATE TABLE `victim` (`id` INT PRIMARY KEY)", POS),
        _ins(110, 1, "a"),
        DDL("shop", "t", 120, query, POS),
        _ins(130, 2, "b"),
        Resolved(200, POS),
    ]


SMUGGLING = "ALTER TABLE t ADD COLUMN c INT /*!50000 , DROP TABLE shop.victim */"


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_an_executable_comment_smuggling_a_clause_never_reaches_the_target(target, unique, policy) -> None:
    kind, engine, schema = target
    router = Router([Rule(match="shop.*", schema=schema)])
    name = f"rf-cmt-{policy}-{unique}"
    proc = processor(engine, name, router.route, ddl_scope=router.routed_by_rule, on_unsupported_ddl=policy)
    msgs = Feed().msgs(*_comment_stream(SMUGGLING))
    if policy == "stop":
        with pytest.raises(ApplyError) as err:
            proc.process(msgs)
        msg = str(err.value)
        assert "DDL at topic=t partition=0 offset=3 (commit ts 120) of upstream table shop.t" in msg, msg
        assert "executable comment" in msg and "/*!50000 , DROP TABLE shop.victim */" in msg, msg
        assert _rows(kind, engine, schema) == [(1, "a")]
    else:
        assert proc.process(msgs).applied_ts == 200
        assert _rows(kind, engine, schema) == [(1, "a"), (2, "b")]
        (detail,) = [d for q, s, d in _history(engine, name) if s == "skipped"]
        assert "executable comment" in detail and detail.endswith("(DDL message at topic=t partition=0 offset=3)")
    # neither the ALTER nor what its comment carries reached the target
    assert "victim" in inspect(engine).get_table_names(schema=schema)
    assert [c["name"] for c in inspect(engine).get_columns("t", schema=schema)] == ["id", "v"]


def test_a_mariadb_executable_comment_is_dropped_and_the_alter_runs_without_it(target, unique) -> None:
    """TiDB does not run /*M! ... */, MariaDB would: the comment goes, the ALTER runs, column v stays."""
    kind, engine, schema = target
    router = Router([Rule(match="shop.*", schema=schema)])
    proc = processor(engine, f"rf-m-{unique}", router.route, ddl_scope=router.routed_by_rule)
    msgs = Feed().msgs(*_comment_stream("ALTER TABLE t /*M!100000 DROP COLUMN v, */ ADD COLUMN c INT"))
    assert proc.process(msgs).applied_ts == 200
    assert [c["name"] for c in inspect(engine).get_columns("t", schema=schema)] == ["id", "v", "c"]
    assert _rows(kind, engine, schema) == [(1, "a", None), (2, "b", None)]
