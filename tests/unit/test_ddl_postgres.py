"""DDL translation for PostgreSQL targets (applier/ddl/postgres.py)."""

from __future__ import annotations

import re

import pytest

from applier.ddl import TranslatedDDL, UnsupportedDDL, translate
from applier.ddl.lexer import Cursor, significant, split_statements, split_top_level, tokenize
from applier.ddl.pg_sql import pg_index_name
from applier.ddl.pg_types import parse_type_comment, type_comment
from applier.ddl.syntax import MyType
from tests.unit.helpers import workload_ddl


def route(schema: str, table: str):
    """shop -> replica, orders -> orders_v2; schema "ignored" and tables tmp_* are not replicated."""
    if schema == "ignored" or table.startswith("tmp_"):
        return None
    return {"shop": "replica"}.get(schema, schema), {"orders": "orders_v2"}.get(table, table)


def same(schema: str, table: str):
    return schema, table


def pg(query: str, schema: str = "s", table: str = "", *, r=same) -> TranslatedDDL:
    return translate("postgresql", query, schema=schema, table=table, route=r)


def stmts(query: str, **kw) -> list[str]:
    return pg(query, **kw).statements


def column(typedef: str) -> str:
    """The PostgreSQL column definition rendered for ``c <typedef>``."""
    first = stmts(f"CREATE TABLE t (c {typedef})")[0]
    (line,) = [ln.strip() for ln in first.splitlines() if ln.strip().startswith('"c"')]
    return line.rstrip(",")[4:]


# --------------------------------------------------------------------------------------------- type map


@pytest.mark.parametrize("mysql, postgres", [
    ("tinyint", "smallint"), ("tinyint unsigned", "smallint"), ("tinyint(1)", "smallint"), ("bool", "smallint"),
    ("boolean", "smallint"), ("smallint", "smallint"), ("smallint unsigned", "integer"),
    ("mediumint", "integer"), ("mediumint unsigned", "integer"), ("int", "integer"), ("int(11)", "integer"),
    ("integer", "integer"), ("int unsigned", "bigint"), ("int(10) unsigned zerofill", "bigint"),
    ("int zerofill", "bigint"), ("bigint", "bigint"), ("bigint(20) unsigned", "numeric(20,0)"),
    ("serial", "numeric(20,0) NOT NULL"),
    ("decimal", "numeric(10,0)"), ("decimal(10, 4)", "numeric(10,4)"), ("decimal(12)", "numeric(12,0)"),
    ("numeric(65,30) unsigned", "numeric(65,30)"), ("dec(5,2)", "numeric(5,2)"), ("fixed(5,2)", "numeric(5,2)"),
    ("float", "real"), ("float unsigned", "real"), ("float(7,4)", "real"), ("float(24)", "real"),
    ("float(25)", "double precision"), ("double", "double precision"), ("double precision", "double precision"),
    ("double(10,2) unsigned", "double precision"), ("real", "double precision"),
    ("char", "varchar(1)"), ("char(16)", "varchar(16)"), ("character(3)", "varchar(3)"), ("nchar(2)", "varchar(2)"),
    ("national char(2)", "varchar(2)"), ("varchar(16)", "varchar(16)"), ("character varying(5)", "varchar(5)"),
    ("nvarchar(9)", "varchar(9)"), ("varchar(0)", "text"), ("varchar(64) CHARACTER SET gbk", "varchar(64)"),
    ("varchar(64) BINARY", "varchar(64)"), ("varchar(20) charset utf8mb4 collate utf8mb4_general_ci", "varchar(20)"),
    ("varchar(64) CHARACTER SET binary", "bytea"), ("text CHARACTER SET binary", "bytea"),
    ("tinytext", "text"), ("text", "text"), ("text(100)", "text"), ("mediumtext", "text"), ("longtext", "text"),
    ("long varchar", "text"), ("binary(16)", "bytea"), ("varbinary(16)", "bytea"), ("tinyblob", "bytea"),
    ("blob", "bytea"), ("mediumblob", "bytea"), ("longblob", "bytea"), ("long varbinary", "bytea"),
    ("date", "date"), ("datetime", "timestamp(0) without time zone"),
    ("datetime(6)", "timestamp(6) without time zone"), ("timestamp", "timestamp(0) with time zone"),
    ("timestamp(3)", "timestamp(3) with time zone"), ("time", "interval(0)"), ("time(5)", "interval(5)"),
    ("year", "smallint"), ("year(4)", "smallint"), ("bit", "bit varying(1)"), ("bit(64)", "bit varying(64)"),
    ("enum('a','b','c')", "text"), ("enum ('a','b') CHARACTER SET utf8", "text"), ("set('a','b','c')", "text"),
    ("json", "jsonb"), ("vector(5)", "text"),
])
def test_type_map(mysql, postgres):
    assert column(mysql) == postgres


@pytest.mark.parametrize("typedef", ["geometry", "point", "polygon NOT NULL", "linestring"])
def test_spatial_types_are_refused(typedef):
    with pytest.raises(UnsupportedDDL, match="spatial"):
        pg(f"CREATE TABLE t (id int, c {typedef})")


def test_unknown_type_is_refused():
    with pytest.raises(UnsupportedDDL, match="unknown column type"):
        pg("CREATE TABLE t (c money)")


# --------------------------------------------------------------------------------------------- attributes


@pytest.mark.parametrize("mysql, postgres", [
    ("int NOT NULL", "integer NOT NULL"), ("int NULL", "integer"), ("int DEFAULT NULL", "integer"),
    ("int DEFAULT 0", "integer DEFAULT 0"), ("int DEFAULT -1", "integer DEFAULT -1"),
    ("int DEFAULT '15'", "integer DEFAULT 15"), ("int unsigned DEFAULT +7", "bigint DEFAULT 7"),
    ("decimal(12, 6) default 179394.2333", "numeric(12,6) DEFAULT 179394.2333"),
    ("double DEFAULT 2.7182818284", "double precision DEFAULT 2.7182818284"),
    ("bool DEFAULT TRUE", "smallint DEFAULT 1"), ("tinyint(1) DEFAULT false", "smallint DEFAULT 0"),
    ("varchar(255) default '测试Varchar default'", "varchar(255) DEFAULT '测试Varchar default'"),
    ('varchar(255) default "null"', "varchar(255) DEFAULT 'null'"),
    ("varchar(10) DEFAULT 'it''s'", "varchar(10) DEFAULT 'it''s'"),
    ("varchar(10) DEFAULT 'a\\\\b'", "varchar(10) DEFAULT 'a\\b'"),
    ("varchar(10) DEFAULT _utf8mb4'x'", "varchar(10) DEFAULT 'x'"), ("varchar(10) DEFAULT 'a' 'b'", "varchar(10) DEFAULT 'ab'"),
    ("varchar(10) DEFAULT 5", "varchar(10) DEFAULT '5'"), ("text DEFAULT ''", "text DEFAULT ''"),
    ("enum('a','b') DEFAULT 'b'", "text DEFAULT 'b'"), ("set('a','b') DEFAULT 'a,b'", "text DEFAULT 'a,b'"),
    ("varbinary(100) DEFAULT b'01101110011101010110110001101100'", "bytea DEFAULT '\\x6e756c6c'::bytea"),
    ("varbinary(10) DEFAULT 'ab'", "bytea DEFAULT '\\x6162'::bytea"),
    ("binary(4) DEFAULT 'ab'", "bytea DEFAULT '\\x61620000'::bytea"),
    ("varbinary(10) DEFAULT x'4142'", "bytea DEFAULT '\\x4142'::bytea"),
    ("varbinary(10) DEFAULT 0x4142", "bytea DEFAULT '\\x4142'::bytea"),
    ("bit(10) default b'1010101010'", "bit varying(10) DEFAULT B'1010101010'"),
    ("bit(8) DEFAULT b'1'", "bit varying(8) DEFAULT B'00000001'"), ("bit(4) DEFAULT 5", "bit varying(4) DEFAULT B'0101'"),
    ("bit(8) DEFAULT 0x0F", "bit varying(8) DEFAULT B'00001111'"), ("int DEFAULT 0x10", "integer DEFAULT 16"),
    ("int DEFAULT b'101'", "integer DEFAULT 5"),
    ("date default '2023-12-27'", "date DEFAULT '2023-12-27'"),
    ("datetime default '2023-12-27 12:27:23'", "timestamp(0) without time zone DEFAULT '2023-12-27 12:27:23'"),
    ("datetime DEFAULT CURRENT_TIMESTAMP", "timestamp(0) without time zone DEFAULT LOCALTIMESTAMP"),
    ("datetime(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)",
     "timestamp(3) without time zone DEFAULT LOCALTIMESTAMP NOT NULL"),
    ("timestamp default now()", "timestamp(0) with time zone DEFAULT CURRENT_TIMESTAMP"),
    ("timestamp NULL DEFAULT LOCALTIMESTAMP", "timestamp(0) with time zone DEFAULT CURRENT_TIMESTAMP"),
    ("timestamp(6) default '2024-03-11 08:51:01.461270'",
     "timestamp(6) with time zone DEFAULT '2024-03-11 08:51:01.461270'"),
    ("date DEFAULT (CURRENT_DATE)", "date DEFAULT CURRENT_DATE"), ("date DEFAULT (curdate())", "date DEFAULT CURRENT_DATE"),
    ("time default '12:27:23'", "interval(0) DEFAULT '12:27:23'"), ("time DEFAULT 123", "interval(0) DEFAULT '0:01:23'"),
    ("year default 2023", "smallint DEFAULT 2023"),
    ("json DEFAULT ('{}')", "jsonb DEFAULT '{}'"),
    # zero dates have no PostgreSQL value; expression defaults are not translated (CREATE TABLE)
    ("datetime DEFAULT 0", "timestamp(0) without time zone"),
    ("datetime NOT NULL DEFAULT '0000-00-00 00:00:00'", "timestamp(0) without time zone NOT NULL"),
    ("timestamp DEFAULT 0", "timestamp(0) with time zone"), ("date DEFAULT '2020-00-10'", "date"),
    ("varchar(36) DEFAULT (uuid())", "varchar(36)"),
    # dropped attributes
    ("int AUTO_INCREMENT UNIQUE KEY COMMENT 'x' COLUMN_FORMAT FIXED STORAGE DISK", "integer"),
    ("varchar(10) COLLATE utf8mb4_bin CHARACTER SET utf8mb4 INVISIBLE", "varchar(10)"),
    ("int CHECK (c > 0) NOT ENFORCED", "integer"), ("int CONSTRAINT ck CHECK (c > 0)", "integer"),
    ("int REFERENCES p (id) ON DELETE CASCADE ON UPDATE SET NULL", "integer"),
    ("varchar(255) as (concat(a, \"test\")) stored", "varchar(255)"),
    ("int GENERATED ALWAYS AS (a + 1) VIRTUAL NOT NULL", "integer NOT NULL"),
])
def test_column_attributes(mysql, postgres):
    assert column(mysql) == postgres


# --------------------------------------------------------------------------------------------- CREATE TABLE


def test_create_table_full(vectors):
    text = (vectors / "workloads" / "canal_json_basic" / "data.sql").read_text()
    q = next(s for s in split_statements(text) if "create table tp_other" in s)
    assert pg(q, schema="test", table="tp_other") == TranslatedDDL([
        'CREATE TABLE IF NOT EXISTS "test"."tp_other" (\n'
        '  "id" integer NOT NULL,\n'
        '  "c_enum" text,\n'
        '  "c_set" text,\n'
        '  "c_bit" bit varying(64),\n'
        '  "c_json" jsonb,\n'
        '  CONSTRAINT "tp_other_pkey" PRIMARY KEY ("id")\n'
        ')',
        # the members ENUM/SET ordinals refer to, for the writer (text cannot say them)
        'COMMENT ON COLUMN "test"."tp_other"."c_enum" IS \'applier:enum(\'\'a\'\',\'\'b\'\',\'\'c\'\')\'',
        'COMMENT ON COLUMN "test"."tp_other"."c_set" IS \'applier:set(\'\'a\'\',\'\'b\'\',\'\'c\'\')\'',
    ], "create_table", [("test", "tp_other")])


def test_create_table_keys_and_index_names():
    q = ("CREATE TABLE IF NOT EXISTS `t1` (id VARCHAR(255), a INT, b CHAR(10), c text, PRIMARY KEY(id, b), "
         "UNIQUE KEY(b), KEY(a), KEY (a, b DESC), UNIQUE INDEX `UIdx` USING BTREE (c(20)) COMMENT 'x' INVISIBLE, "
         "FULLTEXT KEY ft (c), CONSTRAINT fk FOREIGN KEY (a) REFERENCES p (id), CHECK (a > 0)) "
         "ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin COMMENT='t' PARTITION BY KEY(id) PARTITIONS 4")
    assert stmts(q, schema="shop", r=route) == [
        'CREATE TABLE IF NOT EXISTS "replica"."t1" (\n'
        '  "id" varchar(255) NOT NULL,\n'
        '  "a" integer,\n'
        '  "b" varchar(10) NOT NULL,\n'
        '  "c" text,\n'
        '  CONSTRAINT "t1_pkey" PRIMARY KEY ("id", "b")\n'
        ')',
        'CREATE UNIQUE INDEX IF NOT EXISTS "t1__b" ON "replica"."t1" ("b")',
        'CREATE INDEX IF NOT EXISTS "t1__a" ON "replica"."t1" ("a")',
        'CREATE INDEX IF NOT EXISTS "t1__a_2" ON "replica"."t1" ("a", "b" DESC)',
        'CREATE INDEX IF NOT EXISTS "t1__uidx" ON "replica"."t1" ((substring("c" from 1 for 20)))',
    ]


def test_prefix_key_parts():
    out = stmts("CREATE TABLE t (a text, b varchar(100), c blob, d varchar(2000), e varbinary(16), "
                "PRIMARY KEY (a(5)), UNIQUE KEY (b(10)), KEY (c(20) DESC, b), KEY (d(100)), UNIQUE KEY (e(4)))")
    assert 'CONSTRAINT "t_pkey" PRIMARY KEY ("a")' in out[0]  # whole columns: writers need them
    assert out[1:] == [
        'CREATE UNIQUE INDEX IF NOT EXISTS "t__b" ON "s"."t" ("b")',  # short column: the prefix is dropped
        'CREATE INDEX IF NOT EXISTS "t__c" ON "s"."t" ((substring("c" from 1 for 20)) DESC, "b")',
        'CREATE INDEX IF NOT EXISTS "t__d" ON "s"."t" ((substring("d" from 1 for 100)))',
        'CREATE UNIQUE INDEX IF NOT EXISTS "t__e" ON "s"."t" ("e")',
    ]
    # the column type is not known in ALTER TABLE / CREATE INDEX: always the substring
    assert stmts("ALTER TABLE t ADD INDEX i (a(10))") == [
        'CREATE INDEX IF NOT EXISTS "t__i" ON "s"."t" ((substring("a" from 1 for 10)))']
    assert stmts("CREATE UNIQUE INDEX u ON t (b(3), x)") == [
        'CREATE INDEX IF NOT EXISTS "t__u" ON "s"."t" ((substring("b" from 1 for 3)), "x")']


def test_inline_keys_and_serial():
    assert stmts("CREATE TABLE t (id int KEY, u int UNIQUE, s serial)") == [
        'CREATE TABLE IF NOT EXISTS "s"."t" (\n  "id" integer NOT NULL,\n  "u" integer,\n  "s" numeric(20,0) NOT NULL,\n'
        '  CONSTRAINT "t_pkey" PRIMARY KEY ("id")\n)',
        'CREATE UNIQUE INDEX IF NOT EXISTS "t__u" ON "s"."t" ("u")',
        'CREATE UNIQUE INDEX IF NOT EXISTS "t__s" ON "s"."t" ("s")',
    ]


def test_expression_indexes():
    out = stmts("CREATE TABLE t (a int, b int, KEY k ((a + b)), KEY k2 (a))")
    assert out[1:] == ['CREATE INDEX IF NOT EXISTS "t__k2" ON "s"."t" ("a")']
    assert pg("CREATE INDEX idx1 ON t4 ((col1 + col2))") == TranslatedDDL([], "create_index", [])
    assert pg("ALTER TABLE t4 ADD INDEX ((col1 * 40) DESC)") == TranslatedDDL([], "alter_table", [])
    with pytest.raises(UnsupportedDDL, match="unique index .* on an expression"):
        pg("CREATE UNIQUE INDEX u ON t ((a + b))")


def test_long_index_names_are_hashed_and_remembered():
    long = "i" * 70
    name = pg_index_name("t", long)
    assert name.startswith("i_") and len(name) == 34 and name == pg_index_name("t", long.upper())
    assert stmts(f"CREATE INDEX {long} ON t (a)") == [
        f'CREATE INDEX IF NOT EXISTS "{name}" ON "s"."t" ("a")', f"COMMENT ON INDEX \"s\".\"{name}\" IS '{long}'"]
    assert stmts(f"DROP INDEX {long} ON t") == [f'DROP INDEX IF EXISTS "s"."{name}"']
    assert pg_index_name("表", "主键") == "表__主键"
    assert pg_index_name("t", "PRIMARY") == "t_pkey"
    assert pg_index_name("x" * 60, "primary").startswith("pk_")


def test_create_table_like():
    out = pg("CREATE TABLE t6 LIKE t5")
    assert out.kind == "create_table" and out.targets == [("s", "t6")]
    assert out.statements[0] == 'CREATE TABLE IF NOT EXISTS "s"."t6" (LIKE "s"."t5" INCLUDING DEFAULTS INCLUDING COMMENTS)'
    assert out.statements[1].startswith("DO $ddl$") and "to_regclass('\"s\".\"t5\"')" in out.statements[1]
    with pytest.raises(UnsupportedDDL, match="source table is ignored"):
        pg("CREATE TABLE t6 (LIKE tmp_t5)", r=route)


def test_create_table_misc():
    assert pg("CREATE TABLE tmp_x (a int)", r=route) == TranslatedDDL([], "create_table", [])
    assert pg("CREATE TEMPORARY TABLE t (a int)") == TranslatedDDL([], "other", [])
    with pytest.raises(UnsupportedDDL, match="SELECT"):
        pg("CREATE TABLE t SELECT * FROM u")
    # TiDB syntax is gone before parsing
    assert stmts("CREATE TABLE t (id bigint /*T![auto_rand] AUTO_RANDOM(5) */ PRIMARY KEY "
                 "/*T![clustered_index] CLUSTERED */) /*T! SHARD_ROW_ID_BITS=4 */ TTL = `c` + INTERVAL 1 DAY") == [
        'CREATE TABLE IF NOT EXISTS "s"."t" (\n  "id" bigint NOT NULL,\n  CONSTRAINT "t_pkey" PRIMARY KEY ("id")\n)']
    # identifiers are quoted, whatever they contain
    assert stmts('CREATE TABLE `a"b` (`x""y` int)', schema='s"c')[0] == \
        'CREATE TABLE IF NOT EXISTS "s""c"."a""b" (\n  "x""""y" integer\n)'


# --------------------------------------------------------------------------------------------- ALTER TABLE


def test_add_column():
    assert stmts("ALTER TABLE t ADD COLUMN c2 INT NOT NULL") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "c2" integer DEFAULT 0 NOT NULL',
        'ALTER TABLE "s"."t" ALTER COLUMN "c2" DROP DEFAULT']
    assert stmts("alter table t1 add column col json not null") == [
        'ALTER TABLE "s"."t1" ADD COLUMN IF NOT EXISTS "col" jsonb DEFAULT \'null\' NOT NULL',
        'ALTER TABLE "s"."t1" ALTER COLUMN "col" DROP DEFAULT']
    assert stmts("ALTER TABLE t ADD e enum('x','y') NOT NULL, ADD b binary(2) NOT NULL FIRST") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "e" text DEFAULT \'x\' NOT NULL',
        'COMMENT ON COLUMN "s"."t"."e" IS \'applier:enum(\'\'x\'\',\'\'y\'\')\'',
        'ALTER TABLE "s"."t" ALTER COLUMN "e" DROP DEFAULT',
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "b" bytea DEFAULT \'\\x0000\'::bytea NOT NULL',
        'ALTER TABLE "s"."t" ALTER COLUMN "b" DROP DEFAULT']
    assert stmts("ALTER TABLE t ADD COLUMN d int NOT NULL DEFAULT 5 AFTER c") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "d" integer DEFAULT 5 NOT NULL']
    assert stmts("alter table t add column a double null") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "a" double precision']
    # temporal NOT NULL without default: upstream fills zero dates, which PostgreSQL cannot hold
    assert stmts("ALTER TABLE t ADD COLUMN d datetime NOT NULL") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "d" timestamp(0) without time zone']
    assert stmts("ALTER TABLE t ADD COLUMN d date NOT NULL DEFAULT '0000-00-00'") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "d" date']
    assert stmts("ALTER TABLE t ADD COLUMN (a int, b varchar(3) DEFAULT 'x')") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "a" integer',
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "b" varchar(3) DEFAULT \'x\'']
    assert stmts("ALTER TABLE t ADD COLUMN u int UNIQUE") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "u" integer',
        'CREATE UNIQUE INDEX IF NOT EXISTS "t__u" ON "s"."t" ("u")']


@pytest.mark.parametrize("query, reason", [
    ("ALTER TABLE t ADD COLUMN g int AS (a + 1) VIRTUAL", "generated column"),
    ("ALTER TABLE t ADD COLUMN id int AUTO_INCREMENT", "AUTO_INCREMENT"),
    ("ALTER TABLE t ADD COLUMN u varchar(36) NOT NULL DEFAULT (uuid())", "no PostgreSQL form"),
])
def test_add_column_refused(query, reason):
    with pytest.raises(UnsupportedDDL, match=reason) as exc:
        pg(query)
    assert exc.value.kind == "alter_table"


def test_drop_column():
    assert pg("ALTER TABLE t DROP COLUMN c_smallint") == TranslatedDDL(
        ['ALTER TABLE "s"."t" DROP COLUMN IF EXISTS "c_smallint"'], "alter_table", [("s", "t")])
    assert stmts("ALTER TABLE t DROP b, DROP COLUMN IF EXISTS c") == [
        'ALTER TABLE "s"."t" DROP COLUMN IF EXISTS "b"', 'ALTER TABLE "s"."t" DROP COLUMN IF EXISTS "c"']


def test_modify_column():
    out = stmts("ALTER TABLE t MODIFY COLUMN b VARCHAR (100) NOT NULL DEFAULT 'x' COMMENT 'c' FIRST")
    assert out == [
        'ALTER TABLE "s"."t" ALTER COLUMN "b" DROP DEFAULT',
        'ALTER TABLE "s"."t" ALTER COLUMN "b" TYPE varchar(100) USING "b"::varchar(100)',
        'COMMENT ON COLUMN "s"."t"."b" IS NULL',  # no longer an ENUM/SET (if it was one)
        'ALTER TABLE "s"."t" ALTER COLUMN "b" SET DEFAULT \'x\'',
        'ALTER TABLE "s"."t" ALTER COLUMN "b" SET NOT NULL',
    ]
    out = stmts("ALTER TABLE example1 MODIFY COLUMN b INT UNSIGNED")
    assert out[:2] == ['ALTER TABLE "s"."example1" ALTER COLUMN "b" DROP DEFAULT',
                       'ALTER TABLE "s"."example1" ALTER COLUMN "b" TYPE bigint USING "b"::bigint']
    # MySQL makes the column nullable unless it is in the primary key: a guarded DROP NOT NULL
    assert out[3].startswith("DO $ddl$") and "indisprimary AND a.attname = 'b'" in out[3]
    assert 'ALTER TABLE "s"."example1" ALTER COLUMN "b" DROP NOT NULL;' in out[3]


def test_change_column():
    assert stmts("ALTER TABLE foo.t1 CHANGE COL COL2 VARCHAR(255) NOT NULL") == [
        'ALTER TABLE "foo"."t1" RENAME COLUMN "COL" TO "COL2"',
        'ALTER TABLE "foo"."t1" ALTER COLUMN "COL2" DROP DEFAULT',
        'ALTER TABLE "foo"."t1" ALTER COLUMN "COL2" TYPE varchar(255) USING "COL2"::varchar(255)',
        'COMMENT ON COLUMN "foo"."t1"."COL2" IS NULL',
        'ALTER TABLE "foo"."t1" ALTER COLUMN "COL2" SET NOT NULL',
    ]
    assert stmts("ALTER TABLE t CHANGE a a bigint NOT NULL")[0] == 'ALTER TABLE "s"."t" ALTER COLUMN "a" DROP DEFAULT'


def test_alter_column_default_and_renames():
    assert stmts("ALTER TABLE bar ALTER COL SET DEFAULT 3") == ['ALTER TABLE "s"."bar" ALTER COLUMN "COL" SET DEFAULT 3']
    assert stmts("ALTER TABLE bar ALTER COLUMN c SET DEFAULT 'x'") == [
        'ALTER TABLE "s"."bar" ALTER COLUMN "c" SET DEFAULT \'x\'']
    assert stmts("ALTER TABLE bar ALTER COLUMN c DROP DEFAULT") == ['ALTER TABLE "s"."bar" ALTER COLUMN "c" DROP DEFAULT']
    assert stmts("ALTER TABLE bar ALTER COLUMN c SET DEFAULT '0000-00-00'") == []
    assert stmts("ALTER TABLE bar ALTER COLUMN c SET DEFAULT (rand())") == []
    assert stmts("ALTER TABLE bar RENAME COLUMN a TO b") == ['ALTER TABLE "s"."bar" RENAME COLUMN "a" TO "b"']
    assert stmts("ALTER TABLE t4 RENAME INDEX idx2 TO new_idx2") == [
        'ALTER INDEX IF EXISTS "s"."t4__idx2" RENAME TO "t4__new_idx2"']


def test_alter_indexes_and_keys():
    assert stmts("ALTER TABLE test_ddl ADD INDEX test_add_index (c1)") == [
        'CREATE INDEX IF NOT EXISTS "test_ddl__test_add_index" ON "s"."test_ddl" ("c1")']
    assert stmts("ALTER TABLE t ADD CONSTRAINT uq UNIQUE (a, b), ADD UNIQUE KEY (c)") == [
        'CREATE UNIQUE INDEX IF NOT EXISTS "t__uq" ON "s"."t" ("a", "b")',
        'CREATE UNIQUE INDEX IF NOT EXISTS "t__c" ON "s"."t" ("c")']
    add_pk = stmts("ALTER TABLE t4 ADD PRIMARY KEY pk(col1)")
    assert len(add_pk) == 1 and add_pk[0].startswith("DO $ddl$")
    assert 'ALTER TABLE "s"."t4" ADD CONSTRAINT "t4_pkey" PRIMARY KEY ("col1");' in add_pk[0]
    assert stmts("ALTER TABLE t4 DROP PRIMARY KEY") == ['ALTER TABLE "s"."t4" DROP CONSTRAINT IF EXISTS "t4_pkey"']
    assert stmts("drop index `primary` on t4") == ['ALTER TABLE "s"."t4" DROP CONSTRAINT IF EXISTS "t4_pkey"']
    assert stmts("ALTER TABLE t DROP INDEX i, DROP KEY j") == [
        'DROP INDEX IF EXISTS "s"."t__i"', 'DROP INDEX IF EXISTS "s"."t__j"']
    assert stmts("ALTER TABLE t ADD FULLTEXT INDEX ft (c), ADD CONSTRAINT fk FOREIGN KEY (a) REFERENCES p (id), "
                 "ADD CHECK (a > 0), DROP FOREIGN KEY fk2, DROP CHECK ck, ALTER INDEX i INVISIBLE") == []
    assert pg("DROP INDEX test_add_index ON test_ddl") == TranslatedDDL(
        ['DROP INDEX IF EXISTS "s"."test_ddl__test_add_index"'], "drop_index", [("s", "test_ddl")])
    assert pg("CREATE UNIQUE INDEX IF NOT EXISTS `Idx` USING HASH ON t (a DESC, b) ALGORITHM=INPLACE") == \
        TranslatedDDL(['CREATE UNIQUE INDEX IF NOT EXISTS "t__idx" ON "s"."t" ("a" DESC, "b")'], "create_index",
                      [("s", "t")])


@pytest.mark.parametrize("query", [
    "ALTER TABLE bar AUTO_INCREMENT=310", "ALTER TABLE bar COMMENT = 'New table comment'",
    "ALTER TABLE bar CHARACTER SET = utf8mb4 COLLATE utf8mb4_unicode_ci", "ALTER TABLE bar ENGINE=InnoDB",
    "ALTER TABLE bar CONVERT TO CHARACTER SET utf8mb4", "ALTER TABLE bar DEFAULT CHARSET=utf8mb4",
    "ALTER TABLE bar ALGORITHM=INPLACE, LOCK=NONE", "ALTER TABLE bar FORCE", "ALTER TABLE bar ORDER BY a",
    "ALTER TABLE t2 ADD PARTITION (PARTITION p3 VALUES LESS THAN (2002))",
    "ALTER TABLE t2 REORGANIZE PARTITION p31,p32,p33,p2 INTO (PARTITION p21 VALUES LESS THAN (2008))",
    "ALTER TABLE t2 PARTITION BY HASH(id) PARTITIONS 10", "ALTER TABLE t6 REMOVE PARTITIONING",
    "ALTER TABLE t COALESCE PARTITION 2", "ALTER TABLE t LAST PARTITION LESS THAN (100)",
])
def test_alter_with_nothing_to_do(query):
    assert pg(query) == TranslatedDDL([], "alter_table", [])


@pytest.mark.parametrize("query", [
    "ALTER TABLE t2 TRUNCATE PARTITION p0", "ALTER TABLE t2 DROP PARTITION p0, p1",
    "ALTER TABLE foo.t5 EXCHANGE PARTITION p0 WITH TABLE foo.t6",
])
def test_partition_data_changes_are_refused(query):
    with pytest.raises(UnsupportedDDL, match="PARTITION changes rows"):
        pg(query)


@pytest.mark.parametrize("query", [
    "ALTER TABLE t SET TIFLASH REPLICA 1", "ALTER TABLE t CACHE", "ALTER TABLE t NOCACHE",
    "ALTER TABLE t ATTRIBUTES='merge_option=deny'", "ALTER TABLE t REMOVE TTL", "ALTER TABLE t TTL_ENABLE = 'OFF'",
    "ALTER TABLE t ADD VECTOR INDEX vi ((VEC_COSINE_DISTANCE(v)))", "ALTER TABLE t COMPACT",
    "ALTER TABLE t PARTITION p0 ATTRIBUTES 'x'",
])
def test_tidb_only_alter(query):
    assert pg(query) == TranslatedDDL([], "other", [])


def test_alter_table_unknown_spec_is_refused():
    with pytest.raises(UnsupportedDDL, match="not supported"):
        pg("ALTER TABLE t SOMETHING NEW")


def test_alter_of_ignored_table():
    assert pg("ALTER TABLE tmp_t ADD COLUMN c int", r=route) == TranslatedDDL([], "alter_table", [])


# --------------------------------------------------------------------------------------------- RENAME


def test_rename_table():
    out = pg("RENAME TABLE t1 TO t1_1")
    assert out.kind == "rename_table" and out.targets == [("s", "t1"), ("s", "t1_1")]
    assert out.statements[0] == 'ALTER TABLE IF EXISTS "s"."t1" RENAME TO "t1_1"'
    block = out.statements[1]
    assert block.startswith("DO $ddl$") and block.endswith("$ddl$")
    assert "to_regclass('\"s\".\"t1_1\"')" in block and "'t1__'" in block and "'t1_1_pkey'" in block


def test_rename_table_across_schemas():
    out = stmts("RENAME TABLE `foo`.`rename_t8` TO `test`.`t8`")
    assert out[:2] == ['ALTER TABLE IF EXISTS "foo"."rename_t8" RENAME TO "t8"',
                       'ALTER TABLE IF EXISTS "foo"."t8" SET SCHEMA "test"']
    assert "to_regclass('\"test\".\"t8\"')" in out[2]
    assert stmts("RENAME TABLE a.t TO b.t") == ['ALTER TABLE IF EXISTS "a"."t" SET SCHEMA "b"']


def test_rename_tables_per_event():
    q = "RENAME TABLE `rename_t1` TO `rename_t4`, `rename_t2` TO `rename_t1`, `rename_t3` TO `rename_t2`"
    assert stmts(q, table="rename_t1")[0] == 'ALTER TABLE IF EXISTS "s"."rename_t2" RENAME TO "rename_t1"'
    whole = stmts(q)
    assert [s for s in whole if not s.startswith("DO")] == [
        'ALTER TABLE IF EXISTS "s"."rename_t1" RENAME TO "rename_t4"',
        'ALTER TABLE IF EXISTS "s"."rename_t2" RENAME TO "rename_t1"',
        'ALTER TABLE IF EXISTS "s"."rename_t3" RENAME TO "rename_t2"']


def test_alter_table_rename_goes_last():
    out = pg("ALTER TABLE a RENAME TO b, ADD COLUMN c int")
    assert out.kind == "rename_table" and out.targets == [("s", "a"), ("s", "b")]
    assert out.statements[0] == 'ALTER TABLE "s"."a" ADD COLUMN IF NOT EXISTS "c" integer'
    assert out.statements[1] == 'ALTER TABLE IF EXISTS "s"."a" RENAME TO "b"'


def test_rename_between_kept_and_ignored_is_refused():
    with pytest.raises(UnsupportedDDL, match="replicated name"):
        pg("RENAME TABLE a TO tmp_a", r=route)
    with pytest.raises(UnsupportedDDL, match="replicated name"):
        pg("ALTER TABLE tmp_a RENAME TO a", r=route)
    assert pg("RENAME TABLE tmp_a TO tmp_b", r=route) == TranslatedDDL([], "rename_table", [])


def test_dollar_quote_tag_never_occurs_in_the_body():
    out = stmts("RENAME TABLE `a$ddl$` TO `b$ddl$`")
    assert out[1].startswith("DO $ddl1$") and out[1].endswith("$ddl1$")


# --------------------------------------------------------------------------------------------- other statements


def test_drop_truncate_schema_view():
    assert pg("DROP TABLE t3, t4") == TranslatedDDL(['DROP TABLE IF EXISTS "s"."t3", "s"."t4"'], "drop_table",
                                                    [("s", "t3"), ("s", "t4")])
    assert stmts("drop table t3, t4", table="t4") == ['DROP TABLE IF EXISTS "s"."t4"']
    assert pg("TRUNCATE TABLE orders", schema="shop", r=route) == TranslatedDDL(
        ['TRUNCATE TABLE "replica"."orders_v2"'], "truncate_table", [("replica", "orders_v2")])
    assert pg("create database `common_1`") == TranslatedDDL(['CREATE SCHEMA IF NOT EXISTS "common_1"'],
                                                             "create_schema", [("common_1", "")])
    assert pg("drop database if exists test") == TranslatedDDL(['DROP SCHEMA IF EXISTS "test" CASCADE'],
                                                               "drop_schema", [("test", "")])
    assert pg("ALTER DATABASE foo CHARACTER SET utf8mb4") == TranslatedDDL([], "other", [])
    assert pg("DROP VIEW IF EXISTS V1", schema="foo") == TranslatedDDL(['DROP VIEW IF EXISTS "foo"."V1"'],
                                                                        "drop_view", [("foo", "V1")])
    with pytest.raises(UnsupportedDDL, match="views are written in MySQL") as exc:
        pg("CREATE VIEW v1 AS SELECT * FROM t1 WHERE c1 > 2")
    assert exc.value.kind == "create_view"
    assert pg("CREATE VIEW tmp_v AS SELECT 1", r=route) == TranslatedDDL([], "create_view", [])


@pytest.mark.parametrize("query, reason", [
    ("DROP DATABASE public", "refused"), ("DROP DATABASE pg_temp_1", "refused"),
    ("DROP DATABASE shop", "other upstream schemas"),
])
def test_dangerous_schema_drops_are_refused(query, reason):
    with pytest.raises(UnsupportedDDL, match=reason):
        pg(query, r=route)


@pytest.mark.parametrize("query", ["ADMIN CHECK TABLE t", "CREATE SEQUENCE s", "ANALYZE TABLE t",
                                   "CREATE PLACEMENT POLICY p FOLLOWERS=4", "DROP RESOURCE GROUP rg"])
def test_tidb_only_statements(query):
    assert pg(query) == TranslatedDDL([], "other", [])


def test_data_restoring_statements_are_refused():
    with pytest.raises(UnsupportedDDL, match="cannot reproduce") as exc:
        pg("RECOVER TABLE recover_and_insert")
    assert "PostgreSQL" in str(exc.value) and 'on_unsupported_ddl = "skip"' in str(exc.value)


# --------------------------------------------------------------------------------------------- workloads


_DOCUMENTED = ("views are written in MySQL's SELECT syntax", "PARTITION changes rows", "restores dropped")
_MYSQL_ONLY = re.compile(r"`|\b(AUTO_INCREMENT|UNSIGNED|ZEROFILL|ENGINE|CHARSET|COLLATE|COMMENT|TINYINT|MEDIUMINT|"
                         r"DATETIME|LONGTEXT|MEDIUMTEXT|TINYTEXT|BLOB|ENUM|JSON|YEAR|CURRENT_TIMESTAMP\(|NOW\(|ON UPDATE|"
                         r"PARTITION|CLUSTERED)\b", re.I)


def _assert_type_comment(stmt: str) -> None:
    """A COMMENT ON COLUMN the translator wrote: NULL, or an applier:enum/set comment that parses back."""
    m = re.fullmatch(r'COMMENT ON COLUMN "(?:[^"]|"")+"\."(?:[^"]|"")+"\."(?:[^"]|"")+" IS (NULL|\'(.*)\')', stmt, re.S)
    assert m, stmt
    if m.group(1) != "NULL":
        assert parse_type_comment(m.group(2).replace("''", "'")) is not None, stmt


def test_every_workload_ddl_translates(vectors):
    translated = refused = 0
    for workload, schema, stmt in workload_ddl(vectors):
        try:
            out = pg(stmt, schema=schema)
        except UnsupportedDDL as exc:
            assert any(d in exc.reason for d in _DOCUMENTED), (workload, stmt, exc.reason)
            refused += 1
            continue
        translated += 1
        for s in out.statements:
            if s.startswith("COMMENT ON COLUMN "):
                _assert_type_comment(s)
            elif not s.startswith("DO "):
                assert not _MYSQL_ONLY.search(s), (workload, stmt, s)
    assert translated > 150 and refused < 20


def test_every_workload_create_table(vectors):
    count = 0
    for workload, schema, stmt in workload_ddl(vectors):
        sig = significant(tokenize(stmt))
        if not (sig[0].is_word("CREATE") and sig[1].is_word("TABLE")):
            continue
        count += 1
        table_schema, name = (sig[2].ident, sig[4].ident) if sig[3].is_op(".") else (schema, sig[2].ident)
        out = pg(stmt, schema=schema, table=name)
        assert out.kind == "create_table" and out.targets == [(table_schema, name)]
        first = out.statements[0]
        if sig[3].is_word("LIKE"):
            assert first.startswith(f'CREATE TABLE IF NOT EXISTS "{table_schema}"."{name}" (LIKE ')
            continue
        assert first.startswith(f'CREATE TABLE IF NOT EXISTS "{table_schema}"."{name}" (\n')
        # one PostgreSQL column per MySQL column, nothing MySQL-only left
        body = [ln.strip() for ln in first.splitlines()[1:-1]]
        cols = [ln for ln in body if ln.startswith('"')]
        open_at = next(i for i, t in enumerate(sig) if t.is_op("("))
        close_at = Cursor(sig).matching(open_at)
        elements = split_top_level(sig, open_at + 1, close_at)
        upstream_cols = [sig[a].ident for a, b in elements if not sig[a].is_word(
            "PRIMARY", "UNIQUE", "KEY", "INDEX", "CONSTRAINT", "FULLTEXT", "CHECK", "FOREIGN")]
        assert [ln.split('"')[1] for ln in cols] == upstream_cols, (workload, stmt)
        for s in out.statements:
            if s.startswith("COMMENT ON COLUMN "):
                _assert_type_comment(s)
            else:
                assert not _MYSQL_ONLY.search(s), (workload, s)
        for ln in cols:
            assert re.match(r'^"[^"]+" (smallint|integer|bigint|numeric\(\d+,\d+\)|real|double precision|'
                            r'varchar\(\d+\)|text|bytea|date|timestamp\(\d\) with(out)? time zone|interval\(\d\)|'
                            r'bit varying\(\d+\)|jsonb)( DEFAULT .+?)?( NOT NULL)?,?$', ln), (workload, ln)
    assert count > 90


def test_large_event_table_types(vectors):
    text = (vectors / "workloads" / "codec_large_event" / "large_event.sql").read_text()
    q = next(s for s in split_statements(text) if "create table" in s.lower())
    first = pg(q, schema="test").statements[0]
    types = dict(re.findall(r'^\s+"(\w+)" (.+?)(?: DEFAULT .*?)?(?: NOT NULL)?,?$', first, flags=re.M))
    assert types == {
        "t": "smallint", "tu1": "smallint", "tu2": "smallint", "tu3": "smallint", "tu4": "smallint",
        "s": "smallint", "su1": "integer", "su2": "integer", "su3": "integer", "su4": "integer",
        "m": "integer", "mu1": "integer", "mu2": "integer", "mu3": "integer", "mu4": "integer",
        "i": "integer", "iu1": "bigint", "iu2": "bigint", "iu3": "bigint", "iu4": "bigint",
        "bi": "bigint", "biu1": "numeric(20,0)", "biu2": "numeric(20,0)", "biu3": "numeric(20,0)",
        "biu4": "numeric(20,0)", "floatT": "real", "doubleT": "double precision", "decimalT": "numeric(12,6)",
        "floatTu": "real", "doubleTu": "double precision", "decimalTu": "numeric(12,6)", "decimalTu2": "numeric(5,4)",
        "varcharT": "varchar(255)", "charT": "varchar(255)", "binaryT": "bytea", "varbinaryT": "bytea",
        "tinytextT": "text", "textT": "text", "mediumtextT": "text", "longtextT": "text", "tinyblobT": "bytea",
        "blobT": "bytea", "mediumblobT": "bytea", "longblobT": "bytea", "dateT": "date",
        "datetimeT": "timestamp(0) without time zone", "timestampT": "timestamp(0) with time zone",
        "timestampT2": "timestamp(6) with time zone", "timeT": "interval(0)", "yearT": "smallint",
        "enumT": "text", "setT": "text", "bitT": "bit varying(10)", "vectorT": "text", "jsonT": "jsonb",
    }
    assert '"timestampT" timestamp(0) with time zone DEFAULT CURRENT_TIMESTAMP,' in first
    assert '"bitT" bit varying(10) DEFAULT B\'1010101010\',' in first
    assert 'CONSTRAINT "t_pkey" PRIMARY KEY ("tu1")' in first


# --------------------------------------------------------------------------------------------- ENUM/SET member comments


def test_enum_and_set_members_are_recorded_in_column_comments():
    out = stmts("CREATE TABLE t (id int PRIMARY KEY, e ENUM('a','b ','it''s','x,y','') NOT NULL, "
                "s SET('r','w') DEFAULT 'r', v varchar(3))")
    assert out[1:] == [
        'COMMENT ON COLUMN "s"."t"."e" IS \'applier:enum(\'\'a\'\',\'\'b\'\',\'\'it\'\'\'\'s\'\',\'\'x,y\'\',\'\'\'\')\'',
        'COMMENT ON COLUMN "s"."t"."s" IS \'applier:set(\'\'r\'\',\'\'w\'\')\'',
    ]
    # MySQL drops the trailing spaces of member names; the comment holds the names rows will carry
    assert parse_type_comment("applier:enum('a','b','it''s','x,y','')") == ("enum", ("a", "b", "it's", "x,y", ""))
    assert stmts("ALTER TABLE t ADD COLUMN s2 SET('x') NULL") == [
        'ALTER TABLE "s"."t" ADD COLUMN IF NOT EXISTS "s2" text',
        'COMMENT ON COLUMN "s"."t"."s2" IS \'applier:set(\'\'x\'\')\'']
    # MODIFY to a wider ENUM records the new members; CHANGE keeps them on the new name
    out = stmts("ALTER TABLE t MODIFY e ENUM('a','b','c')")
    assert out[2] == 'COMMENT ON COLUMN "s"."t"."e" IS \'applier:enum(\'\'a\'\',\'\'b\'\',\'\'c\'\')\''
    out = stmts("ALTER TABLE t CHANGE e e2 ENUM('a')")
    assert 'COMMENT ON COLUMN "s"."t"."e2" IS \'applier:enum(\'\'a\'\')\'' in out


@pytest.mark.parametrize("comment", [
    None, "", "a user comment", "applier:", "applier:enum", "applier:enum(", "applier:enum('a'", "applier:enum(a)",
    "applier:enum('a',)", "applier:enum('a''b)", "applier:bit(3)", "applier:enum('a' ,'b')", "xapplier:enum('a')",
])
def test_other_or_malformed_comments_are_not_type_comments(comment):
    assert parse_type_comment(comment) is None


def test_empty_member_lists_and_unicode():
    assert parse_type_comment("applier:set()") == ("set", ())
    t = MyType("enum", values=["ü", "😀", "'", "''", "a\nb"])
    assert parse_type_comment(type_comment(t)) == ("enum", ("ü", "😀", "'", "''", "a\nb"))
    assert type_comment(MyType("varchar", ["3"])) is None
    assert type_comment(MyType("enum", values=["a\0"])) is None  # PostgreSQL text cannot hold NUL


try:
    from hypothesis import given, strategies as st
except ImportError:  # pragma: no cover
    given = None

if given is not None:
    @given(st.sampled_from(["enum", "set"]), st.lists(st.text().map(lambda m: m.rstrip(" ").replace("\0", "")), max_size=8))
    def test_type_comment_round_trips(kind, members):
        assert parse_type_comment(type_comment(MyType(kind, values=members))) == (kind, tuple(members))
