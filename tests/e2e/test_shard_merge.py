"""Safe shard merges on real MariaDB and PostgreSQL (issue 12, point 3): when routes merge several upstream
tables into one target table, one shard's DROP TABLE or TRUNCATE must not destroy the other shards' rows. It
stops naming the other shard and the setting, or under ``[target] shard_ddl = "skip"`` is recorded as skipped;
replication of every shard goes on either way."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, select, text

from applier import progress as P
from applier.events import DDL, Column, Op, Resolved, RowChange
from applier.sinks import ApplyError
from tests.e2e.helpers import POS, Feed, processor, target_url

pytestmark = pytest.mark.e2e

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "int"))


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"sm_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    yield request.param, engine, schema
    engine.dispose()


def ins(table: str, ts: int, key: int) -> RowChange:
    return RowChange("up", table, ts, Op.INSERT, None, {"id": key, "v": key}, COLS, POS)


def keys(kind: str, engine, schema: str) -> list[int]:
    q = (lambda n: f"`{n}`") if kind == "mariadb" else (lambda n: f'"{n}"')
    with engine.connect() as c:
        return sorted(r[0] for r in c.execute(text(f"SELECT id FROM {q(schema)}.{q('merged')}")))


@pytest.mark.parametrize("query", ["DROP TABLE `shard1`", "TRUNCATE TABLE `shard1`"])
def test_one_shards_destructive_ddl_leaves_the_merged_table_whole(target, unique, query) -> None:
    kind, engine, schema = target
    name = f"sm-{unique}"

    def route(s: str, t: str) -> tuple[str, str]:
        return (schema, "merged") if t.startswith("shard") else (schema, t)

    f = Feed()
    proc = processor(engine, name, route)
    proc.process(f.msgs(DDL("up", "shard1", 100, "CREATE TABLE `shard1` (`id` INT PRIMARY KEY, `v` INT)", POS),
                        DDL("up", "shard2", 101, "CREATE TABLE `shard2` (`id` INT PRIMARY KEY, `v` INT)", POS),
                        ins("shard1", 110, 1), ins("shard2", 111, 11), Resolved(150, POS)))
    assert keys(kind, engine, schema) == [1, 11]
    drop = f.msgs(DDL("up", "shard1", 200, query, POS), ins("shard2", 210, 12), Resolved(250, POS))
    with pytest.raises(ApplyError, match=r"also fill from up\.shard2\. .*shard_ddl = \"skip\""):
        proc.process(drop)
    assert keys(kind, engine, schema) == [1, 11]  # nothing ran, nothing after it either

    proc = processor(engine, name, route, shard_ddl="skip")  # the operator's choice, then a restart
    proc.process(drop)
    assert keys(kind, engine, schema) == [1, 11, 12]
    with engine.connect() as c:
        state, detail = c.execute(select(P.ddl_history.c.state, P.ddl_history.c.detail).where(
            P.ddl_history.c.pipeline == name, P.ddl_history.c.commit_ts == 200)).one()
    assert state == "skipped" and "up.shard2" in detail


def test_a_shards_drop_column_stops_and_an_add_column_from_every_shard_applies_once(target, unique) -> None:
    kind, engine, schema = target
    name = f"sma-{unique}"

    def route(s: str, t: str) -> tuple[str, str]:
        return (schema, "merged") if t.startswith("shard") else (schema, t)

    cols2 = COLS + (Column("w", "int"),)
    f = Feed()
    proc = processor(engine, name, route)
    proc.process(f.msgs(DDL("up", "shard1", 100, "CREATE TABLE `shard1` (`id` INT PRIMARY KEY, `v` INT)", POS),
                        DDL("up", "shard2", 101, "CREATE TABLE `shard2` (`id` INT PRIMARY KEY, `v` INT)", POS),
                        ins("shard1", 110, 1), ins("shard2", 111, 11),
                        # every shard gets the new column (as a sharded upstream does): it is added once
                        DDL("up", "shard1", 120, "ALTER TABLE `shard1` ADD COLUMN `w` INT", POS),
                        DDL("up", "shard2", 121, "ALTER TABLE `shard2` ADD COLUMN `w` INT", POS),
                        RowChange("up", "shard2", 130, Op.INSERT, None, {"id": 12, "v": 12, "w": 5}, cols2, POS),
                        Resolved(150, POS)))
    assert keys(kind, engine, schema) == [1, 11, 12]
    with engine.connect() as c:
        states = dict(c.execute(select(P.ddl_history.c.commit_ts, P.ddl_history.c.state).where(
            P.ddl_history.c.pipeline == name)).all())
    assert (states[120], states[121]) == ("done", "skipped")
    with pytest.raises(ApplyError, match=r"would drop column .*merged, which the routes also fill from up\.shard2"):
        proc.process(f.msgs(DDL("up", "shard1", 200, "ALTER TABLE `shard1` DROP COLUMN `v`", POS), Resolved(250, POS)))
    with engine.connect() as c:
        q = (lambda n: f"`{n}`") if kind == "mariadb" else (lambda n: f'"{n}"')
        assert c.execute(text(f"SELECT SUM(v) FROM {q(schema)}.{q('merged')}")).scalar() == 24  # v is still there
