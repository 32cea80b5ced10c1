"""``TranslatedDDL.alters`` / ``added_columns``: the kinds of clause of an ALTER TABLE (``ALTER_CLAUSES``).

One module for every dialect because the point is that they agree: a caller merging shards judges one upstream
ALTER the same way whatever the target, so each case runs through "mysql", "mariadb" and "postgresql" and must
give the same answer (``applier/ddl/syntax.py``'s ``alter_summary`` is shared; these tests hold both paths to it).
"""

from __future__ import annotations

import pytest

from applier.ddl import ALTER_CLAUSES, TranslatedDDL, UnsupportedDDL, translate
from applier.ddl.lexer import significant, tokenize
from tests.unit.helpers import workload_ddl

DIALECTS = ("mysql", "mariadb", "postgresql")


def same(schema: str, table: str):
    return schema, table


def ignore_tmp(schema: str, table: str):
    return None if table.startswith("tmp_") else (schema, table)


def run(dialect: str, query: str, *, route=same) -> TranslatedDDL:
    return translate(dialect, query, schema="s", table="t", route=route)


# (ALTER TABLE t ..., expected alters, expected added_columns)
CASES: list[tuple[str, set[str], tuple[str, ...]]] = [
    # columns
    ("ADD COLUMN c INT", {"add_column"}, ("c",)),
    ("ADD c2 INT NOT NULL DEFAULT 5 AFTER c", {"add_column"}, ("c2",)),
    ("ADD COLUMN IF NOT EXISTS `Odd Name` INT FIRST", {"add_column"}, ("Odd Name",)),
    ("ADD COLUMN (a INT, b VARCHAR(3) DEFAULT 'x')", {"add_column"}, ("a", "b")),
    ("ADD vector INT", {"add_column"}, ("vector",)),  # a column named vector, not a TiFlash index
    ("ADD COLUMN u INT UNIQUE", {"add_column", "add_index"}, ("u",)),
    ("ADD COLUMN id2 INT NOT NULL PRIMARY KEY", {"add_column", "add_primary_key"}, ("id2",)),
    ("ADD COLUMN n INT CHECK (n > 0)", {"add_column", "add_check"}, ("n",)),
    ("DROP COLUMN c", {"drop_column"}, ()),
    ("DROP c", {"drop_column"}, ()),
    ("DROP COLUMN IF EXISTS c", {"drop_column"}, ()),
    ("MODIFY COLUMN b VARCHAR(100) NOT NULL DEFAULT 'x' FIRST", {"modify_column"}, ()),
    ("MODIFY b INT UNIQUE", {"modify_column", "add_index"}, ()),
    ("CHANGE a a BIGINT NOT NULL", {"modify_column"}, ()),
    ("CHANGE COLUMN a b BIGINT NOT NULL", {"modify_column", "rename_column"}, ()),
    ("CHANGE a A BIGINT", {"modify_column", "rename_column"}, ()),  # a case change renames on PostgreSQL
    ("RENAME COLUMN a TO b", {"rename_column"}, ()),
    ("ALTER COLUMN c SET DEFAULT 3", {"alter_column_default"}, ()),
    ("ALTER c DROP DEFAULT", {"alter_column_default"}, ()),
    # indexes and keys
    ("ADD INDEX i (a)", {"add_index"}, ()),
    ("ADD KEY (a, b)", {"add_index"}, ()),
    ("ADD UNIQUE u (a)", {"add_index"}, ()),
    ("ADD UNIQUE KEY u (a) USING BTREE COMMENT 'c'", {"add_index"}, ()),
    ("ADD FULLTEXT INDEX f (a)", {"add_index"}, ()),
    ("ADD SPATIAL INDEX g (a)", {"add_index"}, ()),
    ("ADD CONSTRAINT uq UNIQUE (a)", {"add_index"}, ()),
    ("DROP INDEX i", {"drop_index"}, ()),
    ("DROP KEY IF EXISTS i", {"drop_index"}, ()),
    ("ADD PRIMARY KEY (id)", {"add_primary_key"}, ()),
    ("ADD CONSTRAINT pk PRIMARY KEY (id)", {"add_primary_key"}, ()),
    ("DROP PRIMARY KEY", {"drop_primary_key"}, ()),
    ("DROP INDEX `PRIMARY`", {"drop_primary_key"}, ()),
    ("RENAME INDEX a TO b", {"rename_index"}, ()),
    ("RENAME KEY a TO b", {"rename_index"}, ()),
    # constraints
    ("ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES p (id)", {"add_foreign_key"}, ()),
    ("ADD FOREIGN KEY (a) REFERENCES p (id) ON DELETE CASCADE", {"add_foreign_key"}, ()),
    ("DROP FOREIGN KEY fk", {"drop_foreign_key"}, ()),
    ("ADD CONSTRAINT ck CHECK (a > 0)", {"add_check"}, ()),
    ("ADD CHECK (a > 0)", {"add_check"}, ()),
    ("DROP CHECK ck", {"drop_check"}, ()),
    # DROP CONSTRAINT does not say what it drops: every kind it may be
    ("DROP CONSTRAINT c1", {"drop_index", "drop_foreign_key", "drop_check"}, ()),
    # partitions
    ("PARTITION BY HASH(id) PARTITIONS 4", {"partition"}, ()),
    ("ADD PARTITION (PARTITION p3 VALUES LESS THAN (30))", {"partition"}, ()),
    ("COALESCE PARTITION 2", {"partition"}, ()),
    ("REORGANIZE PARTITION p0 INTO (PARTITION a VALUES LESS THAN (5), PARTITION b VALUES LESS THAN (10))",
     {"partition"}, ()),
    ("REMOVE PARTITIONING", {"partition"}, ()),
    ("ANALYZE PARTITION p0", {"partition"}, ()),
    ("LAST PARTITION LESS THAN ('2025-01-01')", {"partition"}, ()),
    ("ENGINE=InnoDB PARTITION BY HASH(a) PARTITIONS 2", {"table_option", "partition"}, ()),
    # table options
    ("ENGINE=InnoDB", {"table_option"}, ()),
    ("DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin", {"table_option"}, ()),
    ("CHARACTER SET utf8mb4", {"table_option"}, ()),
    ("COMMENT 'x'", {"table_option"}, ()),
    ("COMMENT = 'x', AUTO_INCREMENT = 310", {"table_option"}, ()),
    ("ROW_FORMAT=COMPRESSED KEY_BLOCK_SIZE=8", {"table_option"}, ()),
    ("CONVERT TO CHARACTER SET utf8mb4", {"modify_column", "table_option"}, ()),  # converts every text column
    # other
    ("ORDER BY a", {"other"}, ()),
    ("FORCE", {"other"}, ()),
    ("ALGORITHM=INPLACE, LOCK=NONE", {"other"}, ()),
    ("ENGINE=InnoDB ALGORITHM=COPY", {"table_option", "other"}, ()),
    ("ALTER INDEX i INVISIBLE", {"other"}, ()),
    ("ALTER COLUMN c SET INVISIBLE", {"other"}, ()),
    ("ALTER CHECK ck NOT ENFORCED", {"other"}, ()),
    ("DISABLE KEYS", {"other"}, ()),
    ("DISCARD TABLESPACE", {"other"}, ()),
    # several clauses
    ("ADD COLUMN a INT, DROP COLUMN b, ADD INDEX i (a)", {"add_column", "drop_column", "add_index"}, ("a",)),
    ("ADD COLUMN a INT, ADD b INT AFTER a, ADD COLUMN (c INT, d INT)", {"add_column"}, ("a", "b", "c", "d")),
    ("DROP PRIMARY KEY, ADD PRIMARY KEY (a, b)", {"drop_primary_key", "add_primary_key"}, ()),
    ("MODIFY a BIGINT, CHANGE b c INT, ALTER d SET DEFAULT 1, RENAME INDEX i TO j",
     {"modify_column", "rename_column", "alter_column_default", "rename_index"}, ()),
    ("ADD INDEX i (a), ALGORITHM=INPLACE, LOCK=NONE", {"add_index", "other"}, ()),
    # TiDB-only clauses never reach the target, so they are left out
    ("ADD COLUMN c INT, CACHE", {"add_column"}, ("c",)),
    ("ADD VECTOR INDEX vi ((VEC_COSINE_DISTANCE(v))), ADD COLUMN c INT", {"add_column"}, ("c",)),
    ("SHARD_ROW_ID_BITS=4, DROP COLUMN c", {"drop_column"}, ()),
]

# what MySQL/MariaDB run and PostgreSQL refuses (its table is not partitioned, or the column cannot be rendered)
MYSQL_ONLY: list[tuple[str, set[str], tuple[str, ...]]] = [
    ("DROP PARTITION p0", {"partition"}, ()),
    ("TRUNCATE PARTITION p0, p1", {"partition"}, ()),
    ("EXCHANGE PARTITION p0 WITH TABLE t6", {"partition"}, ()),
    ("ADD COLUMN g INT AS (a + 1) VIRTUAL", {"add_column"}, ("g",)),
    ("ADD COLUMN c INT PARTITION BY HASH(c) PARTITIONS 2", {"add_column", "partition"}, ("c",)),
    ("ORDER BY a, b", {"other"}, ()),
]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("spec, alters, added", CASES, ids=[c[0] for c in CASES])
def test_alter_clauses(dialect, spec, alters, added):
    out = run(dialect, f"ALTER TABLE t {spec}")
    assert out.kind == "alter_table"
    assert out.alters == frozenset(alters)
    assert out.added_columns == added


@pytest.mark.parametrize("dialect", ["mysql", "mariadb"])
@pytest.mark.parametrize("spec, alters, added", MYSQL_ONLY, ids=[c[0] for c in MYSQL_ONLY])
def test_alter_clauses_postgresql_refuses(dialect, spec, alters, added):
    out = run(dialect, f"ALTER TABLE t {spec}")
    assert out.statements and out.kind == "alter_table"
    assert out.alters == frozenset(alters)
    assert out.added_columns == added
    with pytest.raises(UnsupportedDDL):
        run("postgresql", f"ALTER TABLE t {spec}")


def test_every_clause_kind_is_covered_and_nothing_else():
    seen = set().union(*(a for _, a, _ in CASES + MYSQL_ONLY), *(a for _, a in RENAMES))
    assert seen == ALTER_CLAUSES


RENAMES = [
    ("RENAME TO u", {"rename_table"}),
    ("RENAME AS u", {"rename_table"}),
    ("RENAME u", {"rename_table"}),
    ("ADD COLUMN x INT, RENAME TO u", {"add_column", "rename_table"}),
]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("spec, alters", RENAMES, ids=[c[0] for c in RENAMES])
def test_alter_table_rename_is_kind_rename_table_and_says_so(dialect, spec, alters):
    out = run(dialect, f"ALTER TABLE t {spec}")
    assert out.kind == "rename_table"
    assert out.alters == frozenset(alters)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_clauses_come_from_the_upstream_statement(dialect):
    # the same answer for an ignored table (nothing runs) as for a kept one
    out = run(dialect, "ALTER TABLE tmp_x ADD COLUMN c INT, DROP INDEX i", route=ignore_tmp)
    assert out == TranslatedDDL([], "alter_table", [])
    assert out.alters == {"add_column", "drop_index"} and out.added_columns == ("c",)
    # and whatever the target renders: nothing on PostgreSQL, dropped on MariaDB
    assert run(dialect, "ALTER TABLE t ADD FULLTEXT INDEX f (a), ENGINE=InnoDB").alters == {"add_index",
                                                                                            "table_option"}
    assert run(dialect, "ALTER TABLE t ADD INDEX i ((a + b))").alters == {"add_index"}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("query", [
    "ALTER TABLE t SET TIFLASH REPLICA 1",
    "ALTER TABLE t CACHE",
    "ALTER TABLE t ADD VECTOR INDEX vi ((VEC_COSINE_DISTANCE(v))) USING HNSW",
    "ALTER TABLE t SHARD_ROW_ID_BITS = 4",
    "ALTER TABLE t PARTITION p0 PLACEMENT POLICY = p1",
])
def test_tidb_only_alter_has_no_clauses(dialect, query):
    out = run(dialect, query)
    assert out == TranslatedDDL([], "other", [])
    assert out.alters == frozenset() and out.added_columns == ()


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("query, kind", [
    ("CREATE TABLE t (id INT PRIMARY KEY, c INT)", "create_table"),
    ("DROP TABLE t", "drop_table"),
    ("TRUNCATE TABLE t", "truncate_table"),
    ("RENAME TABLE t TO u", "rename_table"),
    ("CREATE INDEX i ON t (c)", "create_index"),
    ("DROP INDEX i ON t", "drop_index"),
    ("CREATE DATABASE d", "create_schema"),
    ("DROP DATABASE s", "drop_schema"),
    ("ALTER DATABASE s CHARACTER SET utf8mb4", "other"),
    ("DROP VIEW v", "drop_view"),
])
def test_other_statements_have_no_clauses(dialect, query, kind):
    out = run(dialect, query)
    assert out.kind == kind
    assert out.alters == frozenset() and out.added_columns == ()


def test_every_workload_alter_table_agrees_across_dialects(vectors):
    seen = 0
    for workload, schema, stmt in workload_ddl(vectors):
        sig = significant(tokenize(stmt))
        if not (sig[0].is_word("ALTER") and sig[1].is_word("TABLE")):
            continue
        results = {}
        for dialect in DIALECTS:
            try:
                results[dialect] = translate(dialect, stmt, schema=schema, table="", route=same)
            except UnsupportedDDL:
                continue
        assert "mysql" in results, (workload, stmt)
        summaries = {(r.alters, r.added_columns) for r in results.values()}
        assert len(summaries) == 1, (workload, stmt, results)
        out = results["mysql"]
        if out.kind in ("alter_table", "rename_table"):
            assert out.alters and out.alters <= ALTER_CLAUSES, (workload, stmt)
            assert bool(out.added_columns) == ("add_column" in out.alters), (workload, stmt)
            seen += 1
    assert seen > 50
