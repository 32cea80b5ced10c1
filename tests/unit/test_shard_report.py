"""`applier validate --target`'s shard merge report (applier/shard_report.py): grouping by the current routes,
primary keys read from replicated DDL, and the findings, on made-up inputs and on a SQLite target."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import create_engine, insert, text

from applier import progress as P
from applier import shard_report as sr
from applier.sinks.table import reflect_table


def route(schema: str, table: str) -> tuple[str, str] | None:
    if table.startswith("ignored"):
        return None
    return ("main", "merged") if table.startswith("shard") else ("main", table)


def test_merged_targets_groups_by_the_current_routes_and_keeps_only_merges() -> None:
    got = sr.merged_targets([("up", "shard2"), ("up", "shard1"), ("up", "alone"), ("up", "ignored1"),
                             ("up", "shard1")], route)
    assert got == {("main", "merged"): [("up", "shard1"), ("up", "shard2")]}


@pytest.mark.parametrize("query, key", [
    ("CREATE TABLE `s` (`id` INT PRIMARY KEY, `v` INT)", ("id",)),
    ("CREATE TABLE IF NOT EXISTS up.s (id INT, r VARCHAR(8), PRIMARY KEY (id, r)) ENGINE=InnoDB", ("id", "r")),
    ("CREATE TABLE s (id BIGINT /*T![clustered_index] CLUSTERED */ PRIMARY KEY) /*T! SHARD_ROW_ID_BITS=4 */", ("id",)),
    ("CREATE TABLE s (id INT, v INT, UNIQUE KEY (id))", ()),
])
def test_the_key_of_a_create_table(query: str, key: tuple[str, ...]) -> None:
    assert sr.create_table_key(query) == sr.KnownKey(key)


def test_shard_key_follows_the_last_create_and_the_alters_that_change_the_key() -> None:
    hist = ["CREATE TABLE s (a INT PRIMARY KEY)",
            "CREATE TABLE s (id INT PRIMARY KEY, r INT)",  # recreated: this one counts
            "ALTER TABLE s DROP PRIMARY KEY, ADD PRIMARY KEY (id, r)",
            "ALTER TABLE s CHANGE r region INT, ADD COLUMN x INT",
            "TRUNCATE TABLE s"]
    assert sr.shard_key(hist).columns == ("id", "region")
    assert sr.shard_key(["ALTER TABLE s RENAME COLUMN id TO k"]) == sr.KnownKey(
        None, "its CREATE TABLE was not replicated")
    assert sr.shard_key(["CREATE TABLE s2 LIKE s1"]).columns is None


def merged(*keys: tuple[str, ...] | None, target: tuple[str, ...] | None) -> sr.MergedTarget:
    shards = [sr.Shard("up", f"shard{i + 1}", sr.KnownKey(k, "" if k is not None else "its CREATE TABLE was not "
                                                           "replicated")) for i, k in enumerate(keys)]
    return sr.MergedTarget("main", "merged", shards, sr.KnownKey(target, "" if target is not None else "gone"))


def test_one_shared_key_is_a_warning_that_says_what_to_do() -> None:
    [f] = sr.findings_for(merged(("id",), ("ID",), None, target=("id",)))
    assert f.level == sr.WARNING
    assert "share primary key (id)" in f.message and "ONE row in the target" in f.message
    assert "auto-increment offsets" in f.message and "applier verify" in f.message


def test_differing_keys_are_problems_naming_both_keys() -> None:
    fs = sr.findings_for(merged(("id",), ("region", "id"), target=("id",)))
    assert [f.level for f in fs] == [sr.PROBLEM, sr.PROBLEM]
    assert "up.shard1: (id)" in fs[0].message and "up.shard2: (region, id)" in fs[0].message
    assert "target main.merged has primary key (id), but up.shard2 has (region, id)" in fs[1].message
    assert "differ only in region overwrite each other" in fs[1].message
    # the same set of columns in another order is the same key
    assert [f.level for f in sr.findings_for(merged(("a", "b"), ("b", "a"), target=("a", "b")))] == [sr.WARNING]


def test_a_target_key_that_differs_from_every_shard_is_a_problem() -> None:
    [f] = sr.findings_for(merged(("id", "r"), ("id", "r"), target=("id",)))
    assert f.level == sr.PROBLEM and "up.shard1, up.shard2 has (id, r)" in f.message


def test_nothing_known_is_a_warning() -> None:
    [f] = sr.findings_for(merged(None, None, target=None))
    assert f.level == sr.WARNING and "could not be checked" in f.message


@pytest.fixture
def sqlite(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 't.db'}")
    P.metadata.create_all(engine)
    yield engine
    engine.dispose()


def seed(engine, pipeline: str, ddl: list[tuple[str, str, int, str, str]], shards: list[str]) -> None:
    now = dt.datetime(2024, 1, 1)
    with engine.begin() as c:
        for t in shards:
            c.execute(insert(P.tables).values(pipeline=pipeline, source_schema="up", source_table=t,
                                              target_schema="main", target_table="merged", applied_ts=1,
                                              rows_applied=1, updated_at=now))
        for i, (table, query, ts, state, pl) in enumerate(ddl):
            c.execute(insert(P.ddl_history).values(pipeline=pl, ddl_key=f"k{i}", commit_ts=ts, source_schema="up",
                                                   source_table=table, query=query, statements="", state=state,
                                                   detail="", started_at=now, finished_at=now))


def test_gather_reads_the_pipelines_tables_ddl_and_the_target_key(sqlite) -> None:
    with sqlite.begin() as c:
        c.execute(text("CREATE TABLE merged (id INTEGER PRIMARY KEY, v INTEGER)"))
    seed(sqlite, "p", [
        ("shard1", "CREATE TABLE shard1 (id INT PRIMARY KEY, v INT)", 100, "done", "p"),
        ("shard2", "CREATE TABLE shard2 (id INT, r INT, PRIMARY KEY (id, r))", 101, "done", "p"),
        ("shard3", "CREATE TABLE shard3 (x INT PRIMARY KEY)", 102, "skipped", "p"),  # not applied: not known
        ("shard3", "CREATE TABLE shard3 (y INT PRIMARY KEY)", 103, "done", "other"),  # another pipeline's
    ], ["shard1", "shard2", "shard3"])
    rep = sr.gather(sqlite, pipeline="p", route=route, reflect=reflect_table, target_shown="sqlite://")
    [m] = rep.merges
    assert m.name == "main.merged" and [s.name for s in m.shards] == ["up.shard1", "up.shard2", "up.shard3"]
    assert [s.key.columns for s in m.shards] == [("id",), ("id", "r"), None]
    assert m.key.columns == ("id",)
    assert rep.problems == 2 and rep.warnings == 0
    text_ = sr.format_report(rep)
    assert "shard up.shard3: primary key unknown: its CREATE TABLE was not replicated" in text_
    assert "PROBLEM: the shards merged into main.merged have different primary keys" in text_
    assert rep.as_json()["merges"][0]["shards"][1]["primary_key"] == ["id", "r"]


def test_gather_without_merges_or_with_a_missing_target(sqlite) -> None:
    seed(sqlite, "p", [], ["alone"])
    assert sr.gather(sqlite, pipeline="p", route=route, reflect=reflect_table, target_shown="x").merges == []
    seed(sqlite, "q", [("shard1", "CREATE TABLE shard1 (id INT PRIMARY KEY)", 1, "done", "q")], ["shard1", "shard2"])
    [m] = sr.gather(sqlite, pipeline="q", route=route, reflect=reflect_table, target_shown="x").merges
    assert m.key.columns is None and "could not be read" in m.key.why
    [f] = m.findings
    assert f.level == sr.WARNING and "share primary key (id)" in f.message
