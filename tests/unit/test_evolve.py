"""Schema from the stream (applier/evolve.py): the DDL a row needs, the types it creates, the losses it refuses."""

from __future__ import annotations

import pytest

from applier import evolve as E
from applier.ddl import translate
from applier.ddl.pg_types import pg_type
from applier.events import Column, Op, RowChange, SourcePosition

POS = SourcePosition("t", 0, 5)


def row(cols, schema="shop", table="items") -> RowChange:
    after = {c.name: None for c in cols}
    return RowChange(schema, table, 100, Op.INSERT, None, after, tuple(cols), POS)


def route(schema, table):
    return ("rep", table)


COLS = (
    Column("id", "bigint", nullable=False, key=True, unsigned=True),
    Column("name", "varchar", declared="varchar(40)"),
    Column("amount", "decimal", nullable=False, declared="decimal(12,4)"),
    Column("kind", "enum", declared="enum('a','it''s','back\\\\slash')"),
    Column("at", "datetime", declared="datetime(3)"),
    Column("note", "text"),
)


def test_none_and_create_and_evolve_decide_differently() -> None:
    ev = row(COLS)
    assert E.needed("none", ev, None, dialect="mariadb") is None
    create = E.needed("create", ev, None, dialect="mariadb")
    assert create.startswith("CREATE TABLE `shop`.`items` (")
    have = E.TargetShape(frozenset({"id", "name"}), {"id": "bigint(20) unsigned", "name": "varchar(40)"})
    assert E.needed("create", ev, have, dialect="mariadb") is None  # create never alters an existing table
    add = E.needed("evolve", ev, have, dialect="mariadb")
    assert add.startswith("ALTER TABLE `shop`.`items` ADD COLUMN `amount` decimal(12,4) NULL, ADD COLUMN `kind`")
    full = E.TargetShape(frozenset(c.name for c in COLS), {})
    assert E.needed("evolve", ev, full, dialect="mariadb") is None


def test_created_table_types_keys_and_nullability() -> None:
    q = E.create_table_sql("shop", "items", COLS)
    assert "`id` bigint unsigned NOT NULL" in q
    assert "`name` varchar(40) NULL" in q
    assert "`amount` decimal(12,4) NOT NULL" in q  # declared NOT NULL stays
    assert "`kind` enum('a','it''s','back\\\\slash') NULL" in q
    assert "`at` datetime(3) NULL" in q
    assert "`note` longtext NULL" in q  # a type name alone: the widest of its family
    assert q.endswith("PRIMARY KEY (`id`))")


@pytest.mark.parametrize("col,expected", [
    (Column("v", "varchar"), "longtext"),
    (Column("v", "char"), "longtext"),
    (Column("v", "varbinary", binary=True), "longblob"),
    (Column("v", "decimal"), "decimal(65,30)"),
    (Column("v", "datetime"), "datetime(6)"),
    (Column("v", "time"), "time(6)"),
    (Column("v", "bit"), "bit(64)"),
    (Column("v", "int", unsigned=True), "int unsigned"),
    (Column("v", "json"), "json"),
    (Column("v", "decimal", declared="decimal(10,2) unsigned", unsigned=True), "decimal(10,2) unsigned"),
    (Column("v", "varchar", declared="int(11)"), "longtext"),  # a declared text for another type is ignored
    (Column("v", "varchar", declared="varchar(10); DROP TABLE x"), "longtext"),  # not a type: ignored
])
def test_column_types(col, expected) -> None:
    assert E.render_type(E.stream_type(col)) == expected


# Canal-JSON with content-compatible: full types, where a DATETIME/TIMESTAMP/TIME without fraction says none
FULL = (Column("id", "int", nullable=False, key=True, declared="int(11)"),
        Column("ts", "timestamp", declared="timestamp"), Column("t", "time", declared="time"),
        Column("dt", "datetime", declared="datetime(3)"), Column("flag", "tinyint", declared="tinyint(1)"),
        Column("small", "tinyint", declared="tinyint(3) unsigned", unsigned=True),
        Column("ub", "tinyint", declared="tinyint(1) unsigned", unsigned=True))
# the same table in Canal-JSON's default bare type names: no fractional seconds are said, so the widest
BARE = tuple(Column(c.name, c.type_name, nullable=c.nullable, key=c.key, unsigned=c.unsigned,
                    declared=c.type_name + (" unsigned" if c.unsigned else "")) for c in FULL)


def test_full_types_keep_their_fractional_seconds_and_the_boolean_width() -> None:
    q = E.create_table_sql("shop", "t", FULL)
    for want in ("`id` int NOT NULL", "`ts` timestamp(0) NULL", "`t` time(0) NULL", "`dt` datetime(3) NULL",
                 "`flag` tinyint(1) NULL", "`small` tinyint unsigned NULL", "`ub` tinyint(1) unsigned NULL"):
        assert want in q, (want, q)
    assert E.declares_full_types(FULL) and not E.declares_full_types(BARE)


def test_bare_type_names_keep_the_wide_defaults() -> None:
    """A bare ``timestamp`` says nothing about fractions: fsp 0 would round every fraction away, silently."""
    q = E.create_table_sql("shop", "t", BARE)
    for want in ("`ts` timestamp(6) NULL", "`t` time(6) NULL", "`dt` datetime(6) NULL", "`flag` tinyint NULL"):
        assert want in q, (want, q)
    enum_only = (Column("e", "enum", declared="enum('a','b')"), Column("ts", "timestamp", declared="timestamp"))
    assert not E.declares_full_types(enum_only)  # members come in both listings
    assert "`ts` timestamp(6) NULL" in E.create_table_sql("shop", "t", enum_only)


def test_explicit_fractional_seconds_are_kept_whatever_the_row() -> None:
    """Simple, Avro and Debezium declare fsp explicitly (mysql_values.declared_type) or not at all."""
    cols = (Column("id", "int", nullable=False, key=True), Column("ts", "timestamp", declared="timestamp(0)"),
            Column("t", "time", declared="time(2)"), Column("dt", "datetime"))
    q = E.create_table_sql("shop", "t", cols)
    assert "`ts` timestamp(0) NULL" in q and "`t` time(2) NULL" in q and "`dt` datetime(6) NULL" in q, q


def test_added_columns_are_judged_by_the_whole_row() -> None:
    """The added columns alone (TIMESTAMP, TIME) cannot tell full types from bare names; the row's others can."""
    have = E.TargetShape(frozenset({"id", "dt", "flag", "small", "ub"}),
                         {"id": "int(11)", "dt": "datetime(3)", "flag": "tinyint(1)", "small": "tinyint(3) unsigned",
                          "ub": "tinyint(1) unsigned"})
    q = E.needed("evolve", row(FULL), have, dialect="mariadb")
    assert q == "ALTER TABLE `shop`.`items` ADD COLUMN `ts` timestamp(0) NULL, ADD COLUMN `t` time(0) NULL", q
    assert "timestamp(6)" in E.needed("evolve", row(BARE), have, dialect="mariadb")


@pytest.mark.parametrize("dialect, wants", [
    ("mariadb", ("`ts` timestamp(0) NULL", "`t` time(0) NULL", "`dt` datetime(3) NULL", "`flag` tinyint(1) NULL")),
    ("mysql", ("`ts` timestamp(0) NULL", "`flag` tinyint(1) NULL")),
    ("postgresql", ('"ts" timestamp(0) with time zone', '"t" interval(0)', '"dt" timestamp(3) without time zone',
                    '"flag" smallint', '"small" smallint')),
])
def test_full_types_survive_the_translator(dialect, wants) -> None:
    """The created statement goes through the dialect's DDL translator like a replicated CREATE TABLE: MySQL and
    MariaDB keep the types; PostgreSQL maps TINYINT(1) to smallint, as it does for a replicated TINYINT(1)."""
    tr = translate(dialect, E.create_table_sql("shop", "t", FULL), schema="shop", table="t", route=route)
    text = " ".join(tr.statements)
    for want in wants:
        assert want in text, (want, text)
    replicated = translate(dialect, "CREATE TABLE t (id INT PRIMARY KEY, flag TINYINT(1))", schema="shop",
                           table="t", route=route)
    assert ("smallint" if dialect == "postgresql" else "TINYINT(1)") in " ".join(replicated.statements)


def test_key_strings_of_unknown_length_fit_a_mysql_key() -> None:
    key = Column("k", "varchar", nullable=False, key=True)
    assert E.column_sql(key, key=True) == "`k` varchar(255) NOT NULL"
    blob = Column("b", "blob", nullable=False, key=True, binary=True)
    assert E.column_sql(blob, key=True) == "`b` varbinary(255) NOT NULL"


def test_what_cannot_be_created_is_refused() -> None:
    with pytest.raises(E.SchemaRefused, match="without the list of members"):
        E.render_type(E.stream_type(Column("e", "enum")))  # Open Protocol: ordinals only
    with pytest.raises(E.SchemaRefused, match="^column 'e' of upstream table shop.items: the stream sends ENUM"):
        E.needed("create", row(COLS[:1] + (Column("e", "enum"),)), None, dialect="mariadb")
    with pytest.raises(E.SchemaRefused, match="outside MySQL's DECIMAL"):
        E.render_type(E.stream_type(Column("d", "decimal", declared="decimal(90,2)")))
    with pytest.raises(E.SchemaRefused, match="cannot be a MySQL/TiDB name"):
        E.create_table_sql("shop", "x" * 65, COLS)
    with pytest.raises(E.SchemaRefused, match="cannot be a MySQL/TiDB name"):
        E.create_table_sql("shop", "t", (Column("a\0b", "int"),))
    guessed = tuple(Column(c.name, c.type_name, key=c.key, inferred=True) for c in COLS)
    with pytest.raises(E.SchemaRefused, match="carry no schema"):
        E.needed("create", row(guessed), None, dialect="postgresql")


@pytest.mark.parametrize("dialect", ["mysql", "mariadb", "postgresql"])
def test_hostile_names_stay_quoted_through_the_translator(dialect) -> None:
    cols = (Column("id`; DROP TABLE x; --", "int", nullable=False, key=True),
            Column("e", "enum", declared="enum('x'');DROP TABLE y;--','\"q\"')"))
    q = E.create_table_sql("sh`op", "it\"ems", cols)
    tr = translate(dialect, q, schema="sh`op", table="it\"ems", route=route)
    assert tr.kind == "create_table" and tr.targets == [("rep", 'it"ems')]
    text = " ".join(tr.statements)
    if dialect == "postgresql":
        assert '"id`; DROP TABLE x; --"' in text
        # the members, in the comment the writer reads back (a SQL literal: its quotes doubled once more)
        assert "IS 'applier:enum(''x'''');DROP TABLE y;--'',''\"q\"'')'" in text  # member 1: x');DROP...
    else:
        assert "`id``; DROP TABLE x; --`" in text


def test_created_types_translate_for_postgresql() -> None:
    tr = translate("postgresql", E.create_table_sql("shop", "items", COLS), schema="shop", table="items",
                   route=route)
    text = tr.statements[0]
    for want in ('"id" numeric(20,0) NOT NULL', '"name" varchar(40)', '"amount" numeric(12,4) NOT NULL',
                 '"at" timestamp(3) without time zone', '"note" text', 'PRIMARY KEY ("id")'):
        assert want in text, (want, text)


def test_added_columns_are_always_nullable() -> None:
    q = E.add_columns_sql("shop", "items", (Column("z", "int", nullable=False),))
    assert q == "ALTER TABLE `shop`.`items` ADD COLUMN `z` int NULL"


@pytest.mark.parametrize("declared,target,dialect,why", [
    ("decimal(12,4)", "decimal(10,2)", "mariadb", "scale of 4"),
    ("decimal(14,2)", "numeric(10,2)", "postgresql", "12 integer digits"),
    ("varchar(64)", "varchar(16)", "mariadb", "64 characters"),
    ("varchar(64)", "character varying(16)", "postgresql", "64 characters"),
    ("bigint(20)", "int(11)", "mariadb", "do not fit"),
    ("bigint(20)", "integer", "postgresql", "do not fit"),
    ("int(10) unsigned", "int(11)", "mysql", "do not fit"),
    ("datetime(6)", "datetime", "mariadb", "6 fractional-second digits"),
    ("datetime(6)", "timestamp(0) without time zone", "postgresql", "6 fractional-second"),
    ("enum('a','b','c')", "enum('a','b')", "mariadb", "'c'"),
    ("enum('a','b','c')", "enum('a','b')", "postgresql", "'c'"),
    ("varchar(10)", "int(11)", "mariadb", "character values"),
    ("longtext", "text", "mariadb", "bytes does not fit"),
    ("double", "real", "postgresql", "single-precision"),
    ("varbinary(32)", "varbinary(8)", "mariadb", "32 bytes"),
    ("bit(10)", "bit varying(4)", "postgresql", "10 bits"),
])
def test_lossy_type_changes_are_named(declared, target, dialect, why) -> None:
    from applier.ddl.lexer import Cursor, Statement
    from applier.ddl.syntax import parse_type

    t = parse_type(Cursor(Statement.lex(declared).sig))
    reason = E.loss(t, target, dialect)
    assert reason is not None and why in reason, reason


def test_a_loss_stops_evolve_naming_the_column_and_both_types() -> None:
    cols = (Column("id", "int", key=True, nullable=False), Column("amount", "decimal", declared="decimal(12,4)"))
    have = E.TargetShape(frozenset({"id", "amount"}), {"id": "integer", "amount": "numeric(10,2)"})
    with pytest.raises(E.SchemaRefused) as err:
        E.needed("evolve", row(cols), have, dialect="postgresql")
    msg = str(err.value)
    assert "'amount'" in msg and "decimal(12,4)" in msg and "numeric(10,2)" in msg and "by hand" in msg
    # an undeclared type (Open Protocol sends names only) is not compared on what it leaves out
    plain = (Column("id", "int", key=True, nullable=False), Column("amount", "decimal"))
    assert E.needed("evolve", row(plain), have, dialect="postgresql") is None


WIDE = ["tinyint(4)", "smallint(6) unsigned", "mediumint(9)", "int(11)", "int(10) unsigned", "bigint(20)",
        "bigint(20) unsigned", "decimal(12,4)", "decimal(65,30)", "float", "double", "char(3)", "varchar(40)",
        "binary(4)", "varbinary(16)", "tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob",
        "longblob", "date", "datetime(3)", "datetime(6)", "timestamp(6)", "time(2)", "year", "bit(7)", "json",
        "enum('a','b')", "set('x','y')", "tinyint(1)", "tinyint(1) unsigned", "timestamp(0)", "time(0)",
        "datetime(0)", "timestamp", "time", "datetime"]


@pytest.mark.parametrize("declared", WIDE)
@pytest.mark.parametrize("dialect", ["mariadb", "postgresql"])
def test_a_created_column_never_fails_its_own_check(declared, dialect) -> None:
    """What create makes must hold what the stream declares: the created type, read back as the target's
    catalog would give it, is never judged a loss."""
    from applier.ddl.lexer import Cursor, Statement
    from applier.ddl.syntax import parse_type

    base = declared.split("(")[0].split()[0]
    col = Column("c", base, declared=declared, unsigned="unsigned" in declared)
    made = parse_type(Cursor(Statement.lex(E.render_type(E.stream_type(col))).sig))
    target = pg_type(made) if dialect == "postgresql" else E.render_type(made)
    if dialect == "postgresql" and base in ("enum", "set"):
        target = declared  # the writer reads ENUM/SET members back from the column comment
    assert E.loss(E.stream_type(col), target, dialect) is None, (declared, target)
