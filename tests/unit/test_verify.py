"""``applier verify``'s pure parts, without a database: canonical values (equal data on MySQL/TiDB/MariaDB and on
PostgreSQL must give equal values), chunk planning and range predicates (every key in exactly one chunk), row
diffs, the report, the fix-up SQL, the progress-table checks and the upstream option's errors."""

from __future__ import annotations

import datetime as dt
import sqlite3
from decimal import Decimal

import pytest
from sqlalchemy.dialects import mysql as sa_mysql
from sqlalchemy.dialects import postgresql as sa_pg

from applier.cli import EXIT_CONFIG, main
from applier.config import ConfigError
from applier.dialect import MYSQL, POSTGRES
from applier.mysql_values import float32
from applier.verify.checksums import ChunkSum, chunk_sum, mysql_checksum_sql
from applier.verify.chunks import Chunk, key_expr, plan_chunks, range_predicate
from applier.verify.compare import diff_rows
from applier.verify.fixsql import fix_file_text, fix_header, fix_statements, literal_dialect
from applier.verify.normalise import (
    ZERO_DATE, ZERO_DATETIME, base_type, canonical, column_kind, read_expr, row_canonicaliser,
)
from applier.verify.output import format_report, show_key
from applier.verify.results import RowDiffs, TableResult, VerifyResult
from applier.verify.selfcheck import check_progress_rows, topic_matcher
from applier.verify.snapshot import Side, VerifyError, begin_upstream, server_flavour
from applier.verify.tables import ColumnPlan, TablePlan
from applier.verify.upstream import UpstreamUnreachable, connect_upstream, upstream_url
from tests.unit.helpers import CLI_CONF as GOOD, write_conf as write


# ---- column kinds -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data_type, kind", [
    ("int", "int"), ("BIGINT", "int"), ("year", "int"), ("decimal", "decimal"), ("float", "float"),
    ("double", "double"), ("varchar", "string"), ("longtext", "string"), ("enum", "enum"), ("set", "set"),
    ("varbinary", "binary"), ("blob", "binary"), ("date", "date"), ("datetime", "datetime"),
    ("timestamp", "timestamp"), ("time", "time"), ("bit", "bit"), ("json", "json"), ("geometry", "other"),
])
def test_column_kind(data_type: str, kind: str) -> None:
    assert column_kind(data_type) == kind


def test_base_type() -> None:
    assert base_type("decimal(10,2) unsigned") == "decimal"
    assert base_type("timestamp(6) with time zone") == "timestamp"
    assert base_type("double precision") == "double precision"
    assert base_type("enum('a','b')") == "enum"


# ---- canonical values: what each driver returns for the same data compares equal ------------------------------

def c(v, kind, **kw):
    return canonical(v, kind, **kw)


def test_decimals_compare_by_value_not_by_scale_and_keep_all_digits() -> None:
    assert c(Decimal("1.50"), "decimal") == c(Decimal("1.5"), "decimal") == c("1.500", "decimal") == "1.5"
    assert c(Decimal("100"), "decimal") == c(Decimal("1E+2"), "decimal") == "100"
    assert c(Decimal("-0.00"), "decimal") == c(Decimal("0"), "decimal") == "0"
    wide = "12345678901234567890123456789012345.123456789012345678901234567891"
    assert c(Decimal(wide), "decimal") == wide  # no 28-digit context rounding
    assert c(Decimal("1.5"), "decimal") != c(Decimal("1.51"), "decimal")


def test_integers_from_any_driver_type() -> None:
    # BIGINT UNSIGNED is numeric(20,0) on PostgreSQL: psycopg returns a Decimal
    assert c(18446744073709551615, "int") == c(Decimal("18446744073709551615"), "int") == 18446744073709551615


def test_float_mariadb_double_read_equals_postgres_real_and_mysql_shortest() -> None:
    stored = float32(3.14159)          # what a FLOAT column holds
    mariadb_cast_double = stored       # CAST(c AS DOUBLE): the float32's exact double
    mysql_text = 3.14159               # MySQL 8 / TiDB print the shortest float32 repr
    pg_real = 3.14159                  # PostgreSQL real, shortest repr as well
    assert c(mariadb_cast_double, "float") == c(mysql_text, "float") == c(pg_real, "float") == "3.14159"
    assert c(3.1416, "float") != c(3.14159, "float")


def test_double_exact() -> None:
    assert c(0.1 + 0.2, "double") == repr(0.30000000000000004)
    assert c(1.7976931348623157e308, "double") == "1.7976931348623157e+308"


def test_datetimes_from_sql_text_and_from_driver_objects_agree() -> None:
    mysql = "2020-02-20 02:20:20.123000"                      # DATE_FORMAT(..., '%f')
    pg = "2020-02-20 02:20:20.123000"                         # to_char(..., 'US')
    obj = dt.datetime(2020, 2, 20, 2, 20, 20, 123000)
    aware = dt.datetime(2020, 2, 20, 3, 20, 20, 123000, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert c(mysql, "datetime") == c(pg, "datetime") == c(obj, "datetime") == c(aware, "timestamp") == mysql
    assert c("2020-02-20 02:20:20", "datetime") == "2020-02-20 02:20:20.000000"
    assert c("2020-02-20 02:20:20.5", "datetime") == "2020-02-20 02:20:20.500000"
    assert c(dt.datetime(999, 1, 2), "datetime") == "0999-01-02 00:00:00.000000"  # zero-padded year


def test_zero_dates_collapse_only_against_postgres() -> None:
    # PostgreSQL keeps every zero date as -infinity: against it, all zero dates are one value
    assert c("0000-00-00", "date", collapse_zero_dates=True) == c("-infinity", "date", collapse_zero_dates=True)
    assert c("2020-00-15", "date", collapse_zero_dates=True) == ZERO_DATE
    assert c("0000-00-00 00:00:00.000000", "datetime", collapse_zero_dates=True) == \
        c("-infinity", "timestamp", collapse_zero_dates=True) == ZERO_DATETIME
    # MySQL to MySQL: which zero date it is still counts
    assert c("2020-00-15", "date") != c("0000-00-00", "date")
    assert c(dt.date(2020, 1, 5), "date") == c("2020-01-05", "date") == "2020-01-05"


def test_time_as_timedelta_and_as_text() -> None:
    td = -dt.timedelta(hours=838, minutes=59, seconds=59)
    assert c(td, "time") == c("-838:59:59", "time") == "-838:59:59"
    # psycopg returns PostgreSQL's '-35 days +01:00:01' as days + seconds: the same signed span
    assert c(dt.timedelta(days=-35, seconds=3601), "time") == c(dt.timedelta(hours=-839, seconds=1), "time")
    assert c(dt.timedelta(seconds=1, microseconds=500000), "time") == "00:00:01.500000"


def test_bits_from_pymysql_bytes_and_postgres_bit_strings() -> None:
    assert c(b"\x05", "bit") == c("00000101", "bit") == c(5, "bit") == 5
    assert c(b"\xff" * 8, "bit") == c("1" * 64, "bit") == 2**64 - 1


def test_json_semantic_equality() -> None:
    mysql = '{"b": [1, 2.50, "x"], "a": null, "c": {"y": true, "x": 1.0}}'
    jsonb = '{"a": null, "b": [1, 2.5, "x"], "c": {"x": 1.0, "y": true}}'
    assert c(mysql, "json") == c(jsonb, "json") == '{"a":null,"b":[1,2.5,"x"],"c":{"x":1,"y":true}}'
    assert c('"null"', "json") != c("null", "json")  # a JSON string is not JSON null
    assert c("not json", "json") == "not json"
    assert c('{"é": "ü"}', "json") == '{"é":"ü"}'


def test_binary_and_strings() -> None:
    assert c(memoryview(b"\x00\xff"), "binary") == c(b"\x00\xff", "binary") == b"\x00\xff"
    assert c("naïve 🎉", "string") == c("naïve 🎉".encode(), "string") == "naïve 🎉"
    assert c(None, "string") is None
    assert c("a,c", "set") == "a,c"


def test_chunk_sum_is_order_independent_and_sees_each_value() -> None:
    rows = [(1, "a"), (2, None), (3, b"\x00")]
    assert chunk_sum(rows) == chunk_sum(reversed(rows))
    assert chunk_sum(rows) != chunk_sum([(1, "a"), (2, ""), (3, b"\x00")])  # NULL is not ''
    assert chunk_sum(rows).rows == 3
    assert chunk_sum([]) == ChunkSum(0, 0)


# ---- chunks and ranges --------------------------------------------------------------------------------------

def test_plan_chunks_covers_below_between_and_above() -> None:
    chunks = plan_chunks([(10,), (20,)])
    assert [(ch.lower, ch.upper) for ch in chunks] == [(None, (10,)), ((10,), (20,)), ((20,), None)]
    assert [(ch.lower, ch.upper) for ch in plan_chunks([])] == [(None, None)]


def test_range_predicate_text() -> None:
    where, params = range_predicate(["`a`", "`b`"], Chunk(1, (1, "x"), (5, "y")))
    assert where == ("(`a` > :lo0 OR (`a` = :lo0 AND (`b` > :lo1))) AND "
                     "(`a` < :hi0 OR (`a` = :hi0 AND (`b` <= :hi1)))")
    assert params == {"lo0": 1, "lo1": "x", "hi0": 5, "hi1": "y"}
    assert range_predicate(["`a`"], Chunk(0, None, None)) == ("1 = 1", {})


def test_every_key_falls_in_exactly_one_chunk() -> None:
    """Run the predicates on SQLite over a composite key: the chunks partition the key space."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a INTEGER, b TEXT, PRIMARY KEY (a, b))")
    keys = [(a, b) for a in range(-2, 7) for b in ("", "a", "b", "bb", "c")]
    db.executemany("INSERT INTO t VALUES (?, ?)", keys)
    ordered = sorted(keys)
    bounds = ordered[6::7]  # every 7th key, as upstream_bounds picks them
    seen: list[tuple[int, str]] = []
    for ch in plan_chunks(bounds):
        where, params = range_predicate(["a", "b"], ch)
        got = db.execute(f"SELECT a, b FROM t WHERE {where}", params).fetchall()
        assert len(got) <= 7
        seen += got
    assert sorted(seen) == ordered  # none twice, none lost
    # and a replica row beyond every upstream key lands in the last chunk
    db.execute("INSERT INTO t VALUES (99, 'z')")
    where, params = range_predicate(["a", "b"], plan_chunks(bounds)[-1])
    assert (99, "z") in db.execute(f"SELECT a, b FROM t WHERE {where}", params).fetchall()


def test_key_expressions_compare_strings_by_code_point_on_both_sides() -> None:
    assert key_expr("postgresql", '"k"', "string") == '"k" COLLATE "C"'
    assert key_expr("tidb", "`k`", "string", "utf8mb4_bin") == "`k`"  # the index serves the range
    assert key_expr("mariadb", "`k`", "string", "utf8mb4_general_ci") == \
        "CONVERT(`k` USING utf8mb4) COLLATE utf8mb4_bin"
    assert key_expr("mysql", "`k`", "enum", "utf8mb4_bin") == "CONVERT(`k` USING utf8mb4) COLLATE utf8mb4_bin"
    assert key_expr("mysql", "`k`", "int") == "`k`"


def test_read_expressions() -> None:
    assert read_expr("mysql", "`d`", "datetime") == "DATE_FORMAT(`d`, '%Y-%m-%d %H:%i:%s.%f')"
    # TiDB's DATE_FORMAT gives NULL for zero dates: its CAST, padded to six fractional digits (a TiDB with zero
    # dates verified against MariaDB and PostgreSQL replicas: tests/e2e/test_tidb_load.py)
    assert read_expr("tidb", "`d`", "date") == "CAST(`d` AS CHAR)"
    assert read_expr("tidb", "`d`", "datetime") == \
        "RPAD(CONCAT(CAST(`d` AS CHAR), IF(INSTR(CAST(`d` AS CHAR), '.') > 0, '', '.')), 26, '0')"
    assert read_expr("mariadb", "`f`", "float") == "CAST(`f` AS DOUBLE)"
    assert read_expr("mysql", "`f`", "float") == "`f`"
    assert "AT TIME ZONE 'UTC'" in read_expr("postgresql", '"t"', "timestamp(6) with time zone")
    assert "isfinite" in read_expr("postgresql", '"d"', "date")
    assert read_expr("postgresql", '"j"', "jsonb") == 'CAST("j" AS text)'
    assert read_expr("postgresql", '"b"', "bit varying(8)") == 'CAST("b" AS text)'
    assert read_expr("postgresql", '"n"', "numeric(20,0)") == '"n"'


def test_server_checksum_sql_and_when_it_is_used() -> None:
    sql = mysql_checksum_sql("`s`.`t`", [("`id`", "int", "int"), ("`b`", "binary", "varbinary(4)")], "1 = 1",
                             "tidb")
    assert sql == ("SELECT COUNT(*), IFNULL(BIT_XOR(CRC32(CONCAT_WS(',', "
                   "IFNULL(CONCAT(LENGTH(CAST(`id` AS CHAR)), ':', CAST(`id` AS CHAR)), 'N'), "
                   "IFNULL(CONCAT(LENGTH(HEX(`b`)), ':', HEX(`b`)), 'N')))), 0) FROM `s`.`t` WHERE 1 = 1")
    cols = (ColumnPlan("id", "id", "int", "int", "int"), ColumnPlan("x", "x", "string", "text", "text"))
    plan = TablePlan(("a", "t"), ("b", "t"), cols, 1)
    assert plan.server_checksums("tidb", "mysql") and plan.server_checksums("mariadb", "mariadb")
    assert not plan.server_checksums("tidb", "postgresql")
    floaty = TablePlan(("a", "t"), ("b", "t"), cols + (ColumnPlan("f", "f", "float", "float", "float"),), 1)
    assert not floaty.server_checksums("tidb", "mysql")


# ---- diffs --------------------------------------------------------------------------------------------------

def test_diff_rows_names_missing_extra_and_different_columns() -> None:
    up = {(1,): (1, "a", None), (2,): (2, "b", 5), (3,): (3, "c", 1)}
    down = {(1,): (1, "a", None), (2,): (2, "B", None), (4,): (4, "d", 0)}
    d = diff_rows(up, down)
    assert d.missing == {(3,): (3, "c", 1)}
    assert d.extra == {(4,): (4, "d", 0)}
    assert d.different == {(2,): ((2, "b", 5), (1, 2))}
    assert d.count == 3


def test_reconcile_pairs_a_key_the_servers_put_in_different_chunks() -> None:
    d = RowDiffs()
    d.merge(diff_rows({("b",): ("b", 1), ("c",): ("c", 1)}, {}))  # chunk 1: upstream only
    d.merge(diff_rows({}, {("b",): ("b", 1), ("c",): ("c", 2)}))  # chunk 2: replica only
    d.reconcile()
    assert not d.missing and not d.extra
    assert d.different == {("c",): (("c", 1), (1,))}


# ---- report -------------------------------------------------------------------------------------------------

def _result(n_missing: int = 0) -> VerifyResult:
    t = TableResult(("up", "t"), ("rep", "t"), columns=("id", "name"), key_columns=("id",), chunks=2,
                    chunks_differing=1, rows_upstream=10, rows_replica=9)
    for i in range(n_missing):
        t.diffs.missing[(i,)] = (i, "x")
    t.diffs.extra[(100,)] = (100, "y")
    t.diffs.different[(5,)] = ((5, "z"), (1,))
    ok = TableResult(("up", "u"), ("rep", "u"), chunks=1, rows_upstream=3, rows_replica=3)
    skipped = TableResult(("up", "k"), ("rep", "k"), skipped="no primary key")
    return VerifyResult("p", "mysql+pymysql://root@h:4000/ (8.0.11-TiDB-v8.5.0)", "mysql+pymysql://r:***@x/db",
                        "consistent: ...", True, [t, ok, skipped])


def test_report_lists_keys_capped_with_counts() -> None:
    out = format_report(_result(25), max_keys=20)
    assert "  up.t -> rep.t: 2 chunks (1 differing), 10 rows upstream, 9 in replica: 27 differences" in out
    assert "    missing in replica (25):" in out and "      id=19" in out and "      id=20" not in out
    assert "      ... and 5 more" in out
    assert "    extra in replica (1):\n      id=100" in out
    assert "    different (1):\n      id=5  columns: name" in out
    assert "  up.u -> rep.u: 1 chunk, 3 rows upstream, 3 in replica: equal" in out
    assert "  up.k -> rep.k: not compared: no primary key" in out
    assert out.endswith("summary: 2 tables compared (1 not compared), 3 chunks (1 differing), 13 rows upstream, "
                        "12 in replica: 27 differences (25 missing, 1 extra, 1 different) in 1 table")


def test_report_equal_and_inconsistent() -> None:
    r = VerifyResult("p", "u", "r", "NOT a consistent snapshot: ...", False,
                     [TableResult(("a", "b"), ("a", "b"), chunks=1)])
    assert format_report(r).endswith("in replica: equal (not at a consistent snapshot: see 'read at')")
    assert r.differences == 0


def test_keys_are_shown_quoted_and_escaped() -> None:
    assert show_key(["k", "b"], ("a'\nb", b"\x00\x01")) == 'k="a\'\\nb", b=0x0001'
    assert show_key(["n"], (None,)) == "n=NULL"


# ---- fix-up SQL ---------------------------------------------------------------------------------------------

def _plan(target_types: dict[str, str], collapse: bool = False) -> TablePlan:
    cols = (ColumnPlan("id", "id", "int", "int", "int"),
            ColumnPlan("name", "na`me\"x", "string", "varchar(20)", "varchar(20)"),
            ColumnPlan("d", "d", "date", "date", "date"),
            ColumnPlan("b", "b", "bit", "bit(4)", target_types.get("b", "bit(4)")),
            ColumnPlan("raw", "raw", "binary", "varbinary(4)", "bytea"),
            ColumnPlan("price", "price", "decimal", "decimal(10,2)", "numeric(10,2)"))
    return TablePlan(("up", "t"), ("rep`s", "t\"1"), cols, 1, target_key=("id",), target_types=target_types,
                     collapse_zero_dates=collapse)


def _diffs() -> RowDiffs:
    d = RowDiffs()
    d.extra[(7,)] = (7, "gone", None, None, None, None)
    d.missing[(1,)] = (1, "it's 100% \\ ok", ZERO_DATE, 5, b"\x00\xff", "1.5")
    d.different[(2,)] = ((2, None, "2020-01-02", 0, b"", "0"), (1,))
    return d


@pytest.mark.parametrize("sa_dialect, target, target_types, collapse, sql_mode, delete, upsert, different, header", [
    pytest.param(
        sa_pg.psycopg.dialect(), POSTGRES, {"b": "bit varying(4)", "d": "date"}, True, None,
        'DELETE FROM "rep`s"."t""1" WHERE "id" = 7',
        'INSERT INTO "rep`s"."t""1" ("id", "na`me""x", "d", "b", "raw", "price") VALUES '
        "(1, 'it''s 100% \\ ok', '-infinity', '0101', decode('00ff', 'hex'), 1.5) ON CONFLICT (\"id\") DO UPDATE "
        'SET "na`me""x" = EXCLUDED."na`me""x", "d" = EXCLUDED."d", "b" = EXCLUDED."b", "raw" = EXCLUDED."raw", '
        '"price" = EXCLUDED."price"',
        "(2, NULL, '2020-01-02', '0000', decode('', 'hex'), 0)",
        ["SET client_encoding = 'UTF8'", "SET standard_conforming_strings = on", "SET TIME ZONE 'UTC'"],
        id="postgres converts values as the writer does"),
    pytest.param(
        sa_mysql.pymysql.dialect(), MYSQL, {"b": "bit(4)", "d": "date"}, False, "STRICT_TRANS_TABLES",
        "DELETE FROM `rep``s`.`t\"1` WHERE `id` = 7",
        "INSERT INTO `rep``s`.`t\"1` (`id`, `na``me\"x`, `d`, `b`, `raw`, `price`) VALUES "
        "(1, 'it''s 100% \\\\ ok', '0000-00-00', 5, X'00ff', 1.5) ON DUPLICATE KEY UPDATE "
        "`na``me\"x` = VALUES(`na``me\"x`), `d` = VALUES(`d`), `b` = VALUES(`b`), `raw` = VALUES(`raw`), "
        "`price` = VALUES(`price`)",
        "(2, NULL, '2020-01-02', 0, '', 0)",
        ["SET NAMES utf8mb4", "SET time_zone = '+00:00'", "SET SESSION sql_mode = 'STRICT_TRANS_TABLES'"],
        id="mysql escapes backslashes and quotes names"),
])
def test_fix_sql_converts_values_escapes_and_quotes_names(sa_dialect, target, target_types, collapse, sql_mode,
                                                          delete, upsert, different, header) -> None:
    dialect = literal_dialect(sa_dialect)
    stmts = fix_statements(_plan(target_types, collapse), _diffs(), dialect, target.value_converter)
    assert stmts[0] == delete
    assert stmts[1] == upsert
    assert different in stmts[2]
    assert fix_header(dialect, sql_mode) == header


def test_fix_file_is_one_transaction_and_comments_cannot_break_out() -> None:
    txt = fix_file_text(["DELETE FROM t WHERE id = 1"], ["SET TIME ZONE 'UTC'"], ["table a\nDROP TABLE x"])
    assert txt == ("-- table a\\nDROP TABLE x\nSET TIME ZONE 'UTC';\nBEGIN;\nDELETE FROM t WHERE id = 1;\n"
                   "COMMIT;\n")


def test_a_table_whose_columns_are_all_key_upserts_without_updating() -> None:
    plan = TablePlan(("u", "t"), ("r", "t"), (ColumnPlan("id", "id", "int", "int", "int"),), 1,
                     target_key=("id",))
    d = RowDiffs(missing={(1,): (1,)})
    pg = fix_statements(plan, d, literal_dialect(sa_pg.psycopg.dialect()), POSTGRES.value_converter)
    my = fix_statements(plan, d, literal_dialect(sa_mysql.pymysql.dialect()), MYSQL.value_converter)
    assert pg == ['INSERT INTO "r"."t" ("id") VALUES (1) ON CONFLICT ("id") DO NOTHING']
    assert my == ["INSERT INTO `r`.`t` (`id`) VALUES (1) ON DUPLICATE KEY UPDATE `id` = VALUES(`id`)"]


# ---- the applier's own tables -------------------------------------------------------------------------------

NOW_MS = 1_700_000_000_000


def ts(ms: int) -> int:
    return ms << 18


def _part(topic: str = "t", part: int = 0, restart: int = 5, nxt: int = 5, resolved: int = ts(NOW_MS)) -> dict:
    return {"topic": topic, "kafka_partition": part, "restart_offset": restart, "next_offset": nxt,
            "resolved_ts": resolved}


def check(pl, parts=(), tables=(), ddl=(), gated=True, streams=()):
    return [f.text for f in check_progress_rows(pl, parts, tables, ddl, gated=gated, subscribed=lambda t: t == "t",
                                                now_ms=NOW_MS, streams=streams) if f.problem]


def test_consistent_progress_has_no_problem() -> None:
    applied = ts(NOW_MS - 1000)
    parts = [_part(), _part(part=1, restart=3, nxt=9, resolved=ts(NOW_MS - 5000))]  # holds events: may lag
    tables = [{"source_schema": "s", "source_table": "x", "applied_ts": applied}]
    ddl = [{"state": "done", "ddl_key": "k", "commit_ts": 1, "source_schema": "s", "source_table": "x",
            "started_at": None, "query": "q"}]
    assert check({"applied_ts": applied}, parts, tables, ddl) == []


def test_each_broken_invariant_is_named() -> None:
    applied = ts(NOW_MS - 1000)
    problems = check(
        {"applied_ts": applied},
        [_part(restart=9, nxt=4), _part(part=1, resolved=ts(NOW_MS - 9000)),
         _part(topic="old", part=2, resolved=1),  # another config's topic: not held to the applied ts
         _part(part=3, resolved=ts(NOW_MS + 7_200_000))],
        [{"source_schema": "s", "source_table": "x", "applied_ts": applied + 1}],
        [{"state": "started", "ddl_key": "abc", "commit_ts": 42, "source_schema": "s", "source_table": "x",
          "started_at": "2026-01-01", "query": "ALTER TABLE x ADD c INT"}])
    assert len(problems) == 5, problems
    assert "applier_partitions t[0]: restart offset 9 > next offset 4" in problems[0]
    assert "t[1]: holds no events" in problems[1] and "below the applied ts" in problems[1]
    assert "t[3]: resolved ts" in problems[2] and "in the future" in problems[2]
    assert "applier_tables s.x: applied ts" in problems[3]
    assert "applier_ddl_history abc" in problems[4] and "stuck in 'started'" in problems[4]
    # per-key-order protocols have no resolved ts to hold to
    assert len(check({"applied_ts": applied}, [_part(part=1, resolved=0)], gated=False)) == 0


def test_a_table_an_apply_stream_committed_past_the_marker_is_no_problem_up_to_the_furthest_stream() -> None:
    applied = ts(NOW_MS - 1000)
    streams = [{"stream": 0, "applied_ts": applied + 5}, {"stream": 1, "applied_ts": applied}]
    ahead = [{"source_schema": "s", "source_table": "x", "applied_ts": applied + 5}]
    assert check({"applied_ts": applied}, tables=ahead, streams=streams) == []
    beyond = [{"source_schema": "s", "source_table": "x", "applied_ts": applied + 6}]
    assert check({"applied_ts": applied}, tables=beyond, streams=streams) == [
        f"applier_tables s.x: applied ts {applied + 6} is above every apply stream's, the furthest at {applied + 5}"]


def test_topic_matcher() -> None:
    assert topic_matcher(["a", "b"], None)("a") and not topic_matcher(["a"], None)("ab")
    assert topic_matcher(None, "tidb-.*")("tidb-x") and not topic_matcher(None, "tidb-.*")("x-tidb-x")


# ---- the --upstream option ----------------------------------------------------------------------------------

def test_malformed_upstream_names_the_option_without_the_password() -> None:
    with pytest.raises(ConfigError) as e:
        upstream_url("not a url with S3cretPw")
    assert e.value.key == "--upstream" and "S3cretPw" not in str(e.value)
    with pytest.raises(ConfigError) as e:
        upstream_url("postgresql+psycopg://u:S3cretPw@h/db")
    assert e.value.key == "--upstream" and "unsupported driver" in str(e.value) and "S3cretPw" not in str(e.value)
    with pytest.raises(ConfigError, match="missing host"):
        upstream_url("mysql+pymysql:///db")


def test_upstream_url_driver_and_password_env() -> None:
    url = upstream_url("mysql://root@tidb:4000/", password_env="UP_PW", env={"UP_PW": "S3cretPw"})
    assert url.drivername == "mysql+pymysql" and url.password == "S3cretPw"
    assert "S3cretPw" not in url.render_as_string(hide_password=True)
    with pytest.raises(ConfigError) as e:
        upstream_url("mysql://root@tidb:4000/", password_env="UP_PW", env={})
    assert e.value.key == "--upstream-password-env"


def test_unreachable_upstream_names_the_host_and_hides_the_password() -> None:
    url = upstream_url("mysql+pymysql://root:S3cretPw@127.0.0.1:1/")
    with pytest.raises(UpstreamUnreachable) as e:
        connect_upstream(url, timeout=3)
    msg = str(e.value)
    assert "127.0.0.1:1" in msg and "S3cretPw" not in msg and "--upstream" in msg


def test_cli_malformed_upstream_exits_2(tmp_path, capsys) -> None:
    cfg = write(tmp_path, GOOD)
    assert main(["verify", "-c", cfg, "--upstream", "mysql+pymysql://u:OtherS3cret@:x"]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--upstream" in err and "OtherS3cret" not in err and "Sup3rS3cret" not in err
    assert main(["verify", "-c", cfg, "--fix-sql", str(tmp_path / "f.sql")]) == EXIT_CONFIG
    assert "--fix-sql" in capsys.readouterr().err


# ---- the read point ----------------------------------------------------------------------------------------

class _StubConn:
    """Records what verify asks a server; enough for the session set-up, which has no result to read."""

    def __init__(self) -> None:
        self.sql: list[tuple[str, dict]] = []

    def exec_driver_sql(self, sql: str) -> None:
        self.sql.append((sql, {}))

    def execute(self, stmt, params=None) -> None:
        self.sql.append((str(stmt), dict(params or {})))


def test_tidb_is_read_at_the_applied_ts() -> None:
    conn = _StubConn()
    line = begin_upstream(Side(conn, "tidb"), 449567000000000000)  # type: ignore[arg-type]
    assert ("SET @@tidb_snapshot = :ts", {"ts": "449567000000000000"}) in conn.sql
    assert ("SET SESSION time_zone = '+00:00'", {}) in conn.sql
    assert line.startswith("consistent: upstream TiDB at TSO 449567000000000000")
    with pytest.raises(VerifyError, match="no applied resolved ts") as ei:
        begin_upstream(Side(_StubConn(), "tidb"), None)  # type: ignore[arg-type]
    assert ei.value.code == 2  # nothing to read at: the pipeline's state, not the upstream (GC passed: 5, e2e)


def test_mysql_upstream_is_read_live_and_says_so() -> None:
    conn = _StubConn()
    line = begin_upstream(Side(conn, "mysql"), 42)  # type: ignore[arg-type]
    assert ("START TRANSACTION WITH CONSISTENT SNAPSHOT", {}) in conn.sql
    assert not any("tidb_snapshot" in s for s, _ in conn.sql)
    assert line.startswith("NOT a consistent snapshot") and "as of its applied resolved ts 42" in line


def test_server_flavour() -> None:
    assert server_flavour("8.0.11-TiDB-v8.5.1") == "tidb"
    assert server_flavour("10.11.6-MariaDB-0+deb12u1") == "mariadb"
    assert server_flavour("8.4.3") == "mysql"


def test_the_row_fast_path_agrees_with_canonical() -> None:
    kinds = ("int", "string", "binary", "datetime", "date", "decimal", "json", "timestamp")
    rows = [
        (1, "a", b"\x00", "2020-01-02 03:04:05.000006", "2020-01-02", Decimal("1.50"), '{"b":1,"a":2}',
         "0000-00-00 00:00:00.000000"),
        (Decimal(2), b"b", memoryview(b"\x01"), dt.datetime(2020, 1, 2), dt.date(2020, 1, 2), "3", None,
         "-infinity"),
        (None,) * 8,
    ]
    for collapse in (False, True):
        canon = row_canonicaliser(kinds, collapse)
        for r in rows:
            assert canon(r) == tuple(canonical(v, k, collapse_zero_dates=collapse) for v, k in zip(r, kinds))


def test_a_negative_zero_float_compares_equal_to_the_zero_mysql_stores() -> None:
    """MariaDB stores -0.0 as 0 in FLOAT and DOUBLE columns: verify must not report that as a difference."""
    from applier.verify.normalise import _CANON

    for kind in ("float", "double"):
        assert _CANON[kind](-0.0, False) == _CANON[kind](0.0, False) == "0.0"
        assert _CANON[kind](-1.5, False) == "-1.5"
