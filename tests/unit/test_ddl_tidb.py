"""TiDB-only syntax removal (applier/ddl/tidb.py) and the lexer under it (applier/ddl/lexer.py)."""

from __future__ import annotations

import pytest

from applier.ddl import neutralise_tidb as public_neutralise
from applier.ddl.lexer import LexError, significant, split_statements, tokenize
from applier.ddl.tidb import neutralise_tidb, restores_data_statement, tidb_only_statement


def sig(sql: str):
    return significant(tokenize(sql))


# --------------------------------------------------------------------------------------------- lexer


def test_tokenize_is_lossless_on_every_workload(vectors):
    files = sorted((vectors / "workloads").glob("*/*.sql"))
    assert files
    for f in files:
        text = f.read_text()
        assert "".join(t.text for t in tokenize(text)) == text, f


def test_token_kinds():
    toks = sig("CREATE TABLE `a``b`.表1 (x VARCHAR(3) DEFAULT 'it''s\\n', y BIT DEFAULT b'01', "
               "z BINARY(2) DEFAULT x'4142', w INT DEFAULT 0x1F, v DOUBLE DEFAULT -1.5e3, 1abc INT)")
    kinds = {(t.kind, t.value) for t in toks}
    assert ("qident", "a`b") in kinds
    assert ("word", "表1") in kinds
    assert ("string", "it's\n") in kinds
    assert ("bitstr", "01") in kinds
    assert ("hexstr", "4142") in kinds
    assert ("hexnum", "0x1F") in kinds
    assert ("number", "1.5e3") in kinds
    assert ("word", "1ABC") in kinds


def test_double_quoted_strings_and_escapes():
    (tok,) = sig('"a\\"b""c"')
    assert tok.kind == "string" and tok.value == 'a"b"c'


def test_comments():
    toks = tokenize("a -- c1\nb #c2\n/* c3 */ c --not-a-comment")
    kinds = [t.kind for t in toks if t.kind != "ws"]
    assert kinds == ["word", "comment", "word", "comment", "comment", "word", "op", "op", "word", "op", "word",
                     "op", "word"]


def test_versioned_comment_content_is_lexed_but_tidb_comment_is_one_token():
    toks = tokenize("a /*!40101 DEFAULT CHARSET=utf8 */ /*T![clustered_index] CLUSTERED */")
    kinds = [t.kind for t in toks if t.kind != "ws"]
    assert kinds == ["word", "vopen", "word", "word", "op", "word", "vclose", "tidb_comment"]


@pytest.mark.parametrize("bad", ["'abc", "`abc", "/* abc", "/*!40101 abc"])
def test_unterminated(bad):
    with pytest.raises(LexError):
        tokenize(bad)


def test_split_statements_respects_quotes_and_comments():
    assert split_statements("create table a(b varchar(3) default ';'); -- x;\n/* ; */ drop table a; ;") == [
        "create table a(b varchar(3) default ';')", "-- x;\n/* ; */ drop table a"]


# --------------------------------------------------------------------------------------------- neutralise


@pytest.mark.parametrize("query, expected", [
    # feature comments
    ("CREATE TABLE t (id bigint /*T![auto_rand] AUTO_RANDOM(5) */ PRIMARY KEY /*T![clustered_index] CLUSTERED */,"
     " b int) ENGINE=InnoDB /*T! SHARD_ROW_ID_BITS=4 PRE_SPLIT_REGIONS=2 */",
     "CREATE TABLE t (id bigint PRIMARY KEY, b int) ENGINE=InnoDB"),
    ("CREATE TABLE t4 (col1 INT PRIMARY KEY /*T![clustered_index] NONCLUSTERED */, col2 INT)",
     "CREATE TABLE t4 (col1 INT PRIMARY KEY, col2 INT)"),
    ("CREATE TABLE `t`(`a` int)/*T![placement] PLACEMENT POLICY=`p` */", "CREATE TABLE `t`(`a` int)"),
    ("CREATE TABLE t (a int) /*T![ttl] TTL=`a` + INTERVAL 1 DAY */ /*T![ttl] TTL_ENABLE='ON' */",
     "CREATE TABLE t (a int)"),
    ("CREATE TABLE t (a int, UNIQUE KEY (a) /*T![global_index] GLOBAL */) PARTITION BY HASH (a) PARTITIONS 4",
     "CREATE TABLE t (a int, UNIQUE KEY (a)) PARTITION BY HASH (a) PARTITIONS 4"),
    # the same keywords written without comments
    ("CREATE TABLE t (id bigint AUTO_RANDOM(5, 54) PRIMARY KEY CLUSTERED, b int)",
     "CREATE TABLE t (id bigint PRIMARY KEY, b int)"),
    ("CREATE TABLE t (id bigint AUTO_RANDOM PRIMARY KEY)", "CREATE TABLE t (id bigint PRIMARY KEY)"),
    ("CREATE TABLE t (a int, b int, PRIMARY KEY (a, b) NONCLUSTERED)", "CREATE TABLE t (a int, b int, PRIMARY KEY (a, b))"),
    ("CREATE TABLE t (a int) AUTO_ID_CACHE=1 SHARD_ROW_ID_BITS = 4, PRE_SPLIT_REGIONS=2 AUTO_RANDOM_BASE 100 "
     "COMMENT='x'", "CREATE TABLE t (a int) COMMENT='x'"),
    ("CREATE TABLE t (a int) ENGINE=InnoDB, SHARD_ROW_ID_BITS=4, AUTO_INCREMENT=5",
     "CREATE TABLE t (a int) ENGINE=InnoDB, AUTO_INCREMENT=5"),
    ("CREATE TABLE t10 (id int PRIMARY KEY, created_at TIMESTAMP) TTL = `created_at` + INTERVAL 3 MONTH "
     "TTL_ENABLE = 'ON' TTL_JOB_INTERVAL='1h'", "CREATE TABLE t10 (id int PRIMARY KEY, created_at TIMESTAMP)"),
    ("CREATE TABLE t (a int) DEFAULT PLACEMENT POLICY = `p`", "CREATE TABLE t (a int)"),
    ("CREATE TABLE t (a int) PARTITION BY RANGE (a) (PARTITION p0 VALUES LESS THAN (10) PLACEMENT POLICY=p)",
     "CREATE TABLE t (a int) PARTITION BY RANGE (a) (PARTITION p0 VALUES LESS THAN (10))"),
    ("CREATE TABLE t (a int) STATS_BUCKETS=10 STATS_COL_CHOICE='list'", "CREATE TABLE t (a int)"),
    ("ALTER TABLE t10 TTL = `created_at` + INTERVAL 1 MONTH", "ALTER TABLE t10"),
    ("ALTER TABLE t10 TTL_ENABLE = 'OFF'", "ALTER TABLE t10"),
    ("ALTER TABLE t10 REMOVE TTL", "ALTER TABLE t10"),
    ("ALTER TABLE t ADD COLUMN c int, SHARD_ROW_ID_BITS=4", "ALTER TABLE t ADD COLUMN c int"),
    ("ALTER TABLE t SHARD_ROW_ID_BITS=4, ADD COLUMN c int", "ALTER TABLE t ADD COLUMN c int"),
    ("ALTER TABLE t MODIFY COLUMN id BIGINT AUTO_RANDOM(6)", "ALTER TABLE t MODIFY COLUMN id BIGINT"),
    ("ALTER TABLE t ADD PRIMARY KEY (a) NONCLUSTERED", "ALTER TABLE t ADD PRIMARY KEY (a)"),
    ("ALTER DATABASE d PLACEMENT POLICY = p", "ALTER DATABASE d"),
    ("CREATE TABLE t (a int);", "CREATE TABLE t (a int);"),
])
def test_neutralise(query, expected):
    assert neutralise_tidb(query) == expected
    assert public_neutralise(query) == expected


@pytest.mark.parametrize("query", [
    # the words inside string literals and quoted identifiers, and as plain column names
    "CREATE TABLE t (clustered int, ttl int, `AUTO_RANDOM` int, c varchar(20) DEFAULT 'AUTO_RANDOM(5) CLUSTERED',"
    " d int COMMENT 'SHARD_ROW_ID_BITS=4')",
    "CREATE TABLE t (`PLACEMENT POLICY` int, `/*T! x */` int) COMMENT = 'TTL = a + INTERVAL 1 DAY'",
    "ALTER TABLE t ADD COLUMN ttl int",
    "ALTER TABLE t ADD shard_row_id_bits int",
    "ALTER TABLE t CHANGE a ttl int",
    "ALTER TABLE t ALTER ttl SET DEFAULT 4",
    "CREATE VIEW v AS SELECT ttl = 1, clustered FROM t",
    "INSERT INTO t VALUES ('/*T! x */')",
])
def test_neutralise_leaves_lookalikes_alone(query):
    assert neutralise_tidb(query) == query


def test_neutralise_keeps_mysql_versioned_comments():
    q = "CREATE TABLE t (a int) /*!40101 DEFAULT CHARSET=utf8mb4 */ /*!80016 DEFAULT ENCRYPTION='N' */"
    assert neutralise_tidb(q) == q


def test_neutralise_removes_tidb_keywords_inside_versioned_comments():
    assert neutralise_tidb("CREATE TABLE t (a int) /*!90000 SHARD_ROW_ID_BITS=4 */") == \
        "CREATE TABLE t (a int) /*!90000 */"


def test_neutralise_keeps_neighbours_apart():
    assert neutralise_tidb("CREATE TABLE t (a int PRIMARY KEY/*T![clustered_index] CLUSTERED */COMMENT 'x')") == \
        "CREATE TABLE t (a int PRIMARY KEY COMMENT 'x')"


def test_neutralise_on_workloads_only_touches_tidb_syntax(vectors):
    for f in sorted((vectors / "workloads").glob("*/*.sql")):
        for stmt in split_statements(f.read_text()):
            out = neutralise_tidb(stmt)
            if not any(t.kind == "tidb_comment" for t in tokenize(stmt)):
                assert out == stmt, (f, stmt)
            else:
                assert not any(t.kind == "tidb_comment" for t in tokenize(out))
                assert not any(t.is_word("CLUSTERED", "NONCLUSTERED") for t in sig(out))


# --------------------------------------------------------------------------------------------- statements


@pytest.mark.parametrize("query", [
    "ADMIN CHECK TABLE t", "ANALYZE TABLE t", "SPLIT TABLE t BETWEEN (0) AND (100) REGIONS 4",
    "CREATE SEQUENCE s START 1", "DROP SEQUENCE s", "ALTER SEQUENCE s RESTART",
    "CREATE PLACEMENT POLICY p PRIMARY_REGION='r1' REGIONS='r1'", "ALTER PLACEMENT POLICY p FOLLOWERS=4",
    "DROP PLACEMENT POLICY IF EXISTS p", "CREATE RESOURCE GROUP rg RU_PER_SEC = 500",
    "ALTER RESOURCE GROUP rg RU_PER_SEC = 100", "DROP RESOURCE GROUP rg",
    "ALTER DATABASE d SET TIFLASH REPLICA 1", "CREATE GLOBAL BINDING FOR SELECT 1 USING SELECT 1",
    "LOCK STATS t", "ALTER INSTANCE RELOAD TLS",
])
def test_tidb_only_statements(query):
    assert tidb_only_statement(sig(query))


@pytest.mark.parametrize("query", ["CREATE TABLE t (a int)", "ALTER TABLE t ADD c int", "ALTER DATABASE d CHARSET utf8",
                                   "DROP TABLE t", "LOAD DATA INFILE 'x' INTO TABLE t"])
def test_not_tidb_only(query):
    assert tidb_only_statement(sig(query)) is None


@pytest.mark.parametrize("query", ["RECOVER TABLE t", "FLASHBACK TABLE t TO t2", "FLASHBACK DATABASE d",
                                   "FLASHBACK CLUSTER TO TIMESTAMP '2024-01-01 00:00:00'"])
def test_data_restoring_statements(query):
    assert "cannot reproduce" in restores_data_statement(sig(query))


# --------------------------------------------------------------------------------------------- properties

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from applier.ddl import UnsupportedDDL, translate  # noqa: E402

_FRAGMENTS = st.sampled_from([
    "CREATE", "ALTER", "DROP", "TABLE", "INDEX", "ADD", "COLUMN", "MODIFY", "CHANGE", "RENAME", "TO", "ON", "KEY",
    "PRIMARY", "UNIQUE", "DEFAULT", "NOT", "NULL", "IF", "EXISTS", "LIKE", "VIEW", "AS", "SELECT", "FROM", "DATABASE",
    "TRUNCATE", "PARTITION", "AUTO_RANDOM", "CLUSTERED", "TTL", "=", "(", ")", ",", ".", ";", "+", "-", "t", "`a b`",
    "'x''y'", '"q"', "x'41'", "b'01'", "0x1F", "12", "3.5", "int", "varchar(10)", "bigint unsigned", "text",
    "enum('a','b')", "datetime(6)", "CURRENT_TIMESTAMP", "/*T![clustered_index] CLUSTERED */", "/*!40101 X */",
    "-- c\n", "#c\n", "/* c */", "INTERVAL", "1 DAY", "SET", "TIFLASH", "REPLICA", "USING", "BTREE", "表", "\n",
])


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_tokenize_round_trips_any_text(text):
    try:
        toks = tokenize(text)
    except LexError:
        return
    assert "".join(t.text for t in toks) == text


@settings(max_examples=500, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=25), st.sampled_from(["mysql", "mariadb", "postgresql"]))
def test_translate_fails_only_with_unsupported_ddl(parts, dialect):
    query = " ".join(parts)
    try:
        out = translate(dialect, query, schema="s", table="t", route=lambda s, t: (s, t))
    except UnsupportedDDL:
        return
    assert all(isinstance(s, str) and s for s in out.statements)
