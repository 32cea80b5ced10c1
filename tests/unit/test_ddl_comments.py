"""No comment of a replicated DDL reaches the target (applier/ddl/comments.py, issue 24): a MySQL executable comment
``/*!NNNNN ... */`` becomes plain syntax (a character set, a collation, IF [NOT] EXISTS), is dropped with a note
(storage options), or refuses the DDL (anything else, a smuggled clause or statement above all); MariaDB's ``/*M!``
and plain comments are removed, so the target runs only the statement the translator read (invariant 11)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from applier.ddl import UnsupportedDDL, translate
from applier.ddl.comments import strip_comments
from applier.ddl.lexer import LexError, tokenize

DIALECTS = ["mysql", "mariadb", "postgresql"]


def route(schema: str, table: str) -> tuple[str, str] | None:
    return None if table.startswith("ign") else (f"{schema}_r", table)


def tr(dialect: str, query: str, table: str = "t"):
    return translate(dialect, query, schema="shop", table=table, route=route)


# ---- refused: the content is not options the applier can keep or drop ----------------------------------

SMUGGLED = [
    "ALTER TABLE t ADD c INT /*!50000 , DROP TABLE x.t */",  # the hostile producer's message of issue 24
    "ALTER TABLE t ADD c INT /*! , DROP COLUMN d */",
    "ALTER TABLE t ADD c INT /*!50000 , RENAME TO applier.applier_progress */",
    "ALTER TABLE t ENGINE=InnoDB /*!50000 ; DROP TABLE x.t */",
    "CREATE TABLE t (id INT) /*!50000 ENGINE=InnoDB; DROP TABLE x.t */",
    "CREATE TABLE t (id INT) /*!50100 PARTITION BY HASH(id) PARTITIONS 4 */",
    "CREATE TABLE t (id INT) /*!40101 CHARSET=utf8mb4, */",  # a trailing comma is not an option
    "CREATE TABLE t (id INT) /*!50100 ENGINE */",  # an option without its value
    "CREATE TABLE t (id INT) /*!50100 DEFAULT */",
    "CREATE TABLE t (id INT) /*!50100 ENGINE=InnoDB /* a comment inside */ */",
    "TRUNCATE TABLE t /*!50000 , x.t2 */",
    "DROP TABLE t /*!50000 , x.t2 */",
    "CREATE INDEX i ON t (v) /*!50000 , ALGORITHM=COPY */",
    "ALTER TABLE t DROP COLUMN c /*!80000 , DROP COLUMN d */",
    "CREATE DATABASE shop /*!40100 DEFAULT CHARACTER SET utf8mb4 */ /*!99999 , shop2 */",
]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("query", SMUGGLED)
def test_an_executable_comment_with_anything_but_options_refuses_the_ddl(dialect, query):
    with pytest.raises(UnsupportedDDL, match="executable comment") as err:
        tr(dialect, query)
    assert "write the statement without the comment" in str(err.value)
    assert 'on_unsupported_ddl = "skip"' in str(err.value)


def test_a_string_with_a_closer_inside_stays_inside_the_dropped_option():
    """MySQL lexes the content of /*! */ as SQL, so a '*/' inside a string does not end the comment: the whole
    COMMENT option (and its string) goes, nothing of it reaches the target."""
    out = tr("mariadb", "ALTER TABLE t ADD c INT /*!50000 COMMENT 'x*/ , DROP COLUMN d' */")
    assert out.statements == ["ALTER TABLE `shop_r`.`t` ADD IF NOT EXISTS c INT"]
    assert "COMMENT" in out.notes[0]


# ---- dropped: storage options -----------------------------------------------------------------------------

@pytest.mark.parametrize("dialect,expected", [
    ("mysql", "CREATE TABLE IF NOT EXISTS `shop_r`.`t` (id INT PRIMARY KEY) ENGINE=InnoDB"),
    ("mariadb", "CREATE TABLE IF NOT EXISTS `shop_r`.`t` (id INT PRIMARY KEY) ENGINE=InnoDB"),
])
def test_storage_options_in_an_executable_comment_are_dropped_with_a_note(dialect, expected):
    out = tr(dialect, "CREATE TABLE t (id INT PRIMARY KEY) ENGINE=InnoDB /*!50100 TABLESPACE ts STORAGE DISK */ "
                      "/*!50606 STATS_PERSISTENT=0, ROW_FORMAT=DYNAMIC */")
    assert out.statements == [expected]
    assert len(out.notes) == 2
    assert "/*!50100 TABLESPACE ts STORAGE DISK */" in out.notes[0] and "TABLESPACE" in out.notes[0]
    assert "STATS_PERSISTENT, ROW_FORMAT" in out.notes[1]


def test_an_invisible_index_mark_in_a_comment_is_dropped():
    out = tr("mysql", "ALTER TABLE t ADD INDEX i (v) /*!80000 INVISIBLE */")
    assert out.statements == ["ALTER TABLE `shop_r`.`t` ADD INDEX i (v)"] and "INVISIBLE" in out.notes[0]


def test_a_statement_left_empty_by_a_dropped_comment_runs_nothing():
    out = tr("mariadb", "ALTER TABLE t /*!50100 TABLESPACE ts */")
    assert out.statements == [] and out.notes


# ---- kept as plain syntax: character sets, collations, IF [NOT] EXISTS ------------------------------------

def test_a_collation_in_an_executable_comment_becomes_plain_syntax():
    q = "CREATE TABLE t (id INT PRIMARY KEY, v VARCHAR(8)) DEFAULT CHARSET=utf8mb4 /*!40101 COLLATE = utf8mb4_bin */"
    out = tr("mysql", q)
    assert out.statements == ["CREATE TABLE IF NOT EXISTS `shop_r`.`t` (id INT PRIMARY KEY, v VARCHAR(8)) "
                              "DEFAULT CHARSET=utf8mb4 COLLATE = utf8mb4_bin"]
    (note,) = out.notes  # the comment went, with a warning
    assert "/*!40101 COLLATE = utf8mb4_bin */" in note and "kept as plain syntax" in note


def test_a_mysqldump_create_database_keeps_its_character_set_and_drops_encryption():
    q = ("CREATE DATABASE /*!32312 IF NOT EXISTS*/ `shop` /*!40100 DEFAULT CHARACTER SET utf8mb4 COLLATE "
         "utf8mb4_0900_ai_ci */ /*!80016 DEFAULT ENCRYPTION='N' */")
    assert tr("mysql", q, table="").statements == [
        "CREATE DATABASE IF NOT EXISTS `shop_r` DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_ai_ci"]
    out = tr("mariadb", q, table="")  # MariaDB's spelling of the collation applies to it like to plain syntax
    assert out.statements == [
        "CREATE DATABASE IF NOT EXISTS `shop_r` DEFAULT CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_520_ci"]
    assert len(out.notes) == 3 and "ENCRYPTION" in out.notes[2] and "dropped" in out.notes[2]
    assert all("kept as plain syntax" in n for n in out.notes[:2])
    assert tr("postgresql", q, table="").statements == ['CREATE SCHEMA IF NOT EXISTS "shop_r"']


# ---- other comments: none reaches the target ----------------------------------------------------------------

@pytest.mark.parametrize("dialect", ["mysql", "mariadb"])
def test_a_mariadb_executable_comment_never_reaches_the_target(dialect):
    out = tr(dialect, "ALTER TABLE t ADD c INT /*M!100000 , DROP COLUMN d */, ADD e INT")
    assert all("DROP" not in s and "/*" not in s for s in out.statements), out.statements
    assert "MariaDB executable comment" in out.notes[0]


def test_plain_comments_are_removed_and_keep_tokens_apart():
    assert strip_comments("ALTER TABLE t ADD/**/c INT -- why\n, ADD d INT # more\n")[0] == \
        "ALTER TABLE t ADD c INT , ADD d INT "
    out = tr("mysql", "ALTER TABLE t /* a */ ADD c INT /*+ hint */")
    assert out.statements == ["ALTER TABLE `shop_r`.`t` ADD c INT"] and out.notes == ()


def test_a_query_without_comments_is_left_as_it_is():
    q = "CREATE TABLE t (a VARCHAR(8) DEFAULT '/*!50000 x */ -- y')"
    assert strip_comments(q) == (q, [])


_FRAGMENTS = st.sampled_from([
    "ALTER", "TABLE", "CREATE", "DROP", "ADD", "COLUMN", "t", "x.t", "c", "INT", ",", ";", "(", ")", "=", "'s*/'",
    "/*!50000", "/*!", "/*M!", "*/", "/*", "-- c\n", "#c\n", "ENGINE", "InnoDB", "CHARSET", "utf8mb4", "COLLATE",
    "TABLESPACE", "ts", "PARTITION", "BY", "HASH", "RENAME", "TO", "INDEX", "i", "DATABASE", "shop", "IF", "EXISTS",
    "NOT", "COMMENT", "'x'", "`q*/`", "\n",
])


@settings(max_examples=400, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=20), st.sampled_from(DIALECTS))
def test_no_translated_statement_carries_a_comment(parts, dialect):
    """Whatever the message, what the target gets has no comment in it (lexed as MySQL lexes it), and a
    translation fails only with UnsupportedDDL."""
    query = " ".join(parts)
    try:
        out = tr(dialect, query)
    except UnsupportedDDL:
        return
    for stmt in out.statements:
        try:
            toks = tokenize(stmt)
        except LexError:  # PostgreSQL text the MySQL lexer cannot read (none known): not a comment either
            continue
        assert not [t for t in toks if t.kind in ("comment", "tidb_comment", "vopen", "vclose")], stmt
