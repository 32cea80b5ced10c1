"""PostgreSQL target: parse the MySQL/TiDB DDL and render PostgreSQL DDL from an explicit type map.

The upstream text is neutralised (``applier/ddl/tidb.py``), tokenised and parsed here with a small
recursive-descent parser for the DDL subset below; nothing of the upstream text is copied into the output
except identifiers (always double-quoted) and literal values (always re-rendered as PostgreSQL literals).

Type map (MySQL/TiDB -> PostgreSQL)
===================================

=====================================  ===========================  ==================================================
MySQL / TiDB                           PostgreSQL                   why
=====================================  ===========================  ==================================================
tinyint, tinyint unsigned              smallint                     -128..255 fits
smallint                               smallint
smallint unsigned                      integer                      0..65535 does not fit smallint
mediumint [unsigned], int              integer
int unsigned                           bigint                       0..4294967295
bigint                                 bigint
bigint unsigned, serial                numeric(20,0)                0..18446744073709551615; exact, no wrap-around
bool, boolean, tinyint(1)              smallint                     MySQL booleans are tinyint(1) and can hold any
                                                                    -128..127 value; PostgreSQL boolean would lose
                                                                    values and reject the integers rows carry
decimal(p,s) / numeric / dec / fixed   numeric(p,s)                 decimal = decimal(10,0), decimal(p) = (p,0)
float, float(p<=24), float(m,d)        real
double, real, float(p>24)              double precision             (REAL is DOUBLE unless REAL_AS_FLOAT)
char(n), varchar(n), nchar, nvarchar   varchar(n)                   MySQL CHAR strips trailing spaces when read, so
                                                                    the values TiCDC sends carry no padding;
                                                                    PostgreSQL char(n) would pad them back and
                                                                    compare differently. n counts characters in
                                                                    both. char/varchar(0) -> text.
tinytext, text, mediumtext, longtext   text                         also char/varchar/text ``CHARACTER SET binary``
                                                                    -> bytea (they are binary strings)
binary(n), varbinary(n), *blob         bytea
date                                   date
datetime(n)                            timestamp(n) without time    n defaults to 0 as in MySQL
                                       zone
timestamp(n)                           timestamp(n) with time zone  MySQL TIMESTAMP is an instant (stored UTC)
time(n)                                interval(n)                  MySQL TIME ranges over -838:59:59..838:59:59 (an
                                                                    elapsed time, not a time of day); PostgreSQL
                                                                    time only holds 00:00:00..24:00:00
year                                   smallint
bit(n)                                 bit varying(n)               keeps the bits and the width limit; bit(64)
                                                                    values exceed bigint. Defaults are written as
                                                                    n-digit bit strings; writers send bit strings.
enum(...), set(...)                    text                         the text form of the value (no CHECK: ALTERs that
                                                                    add members would need it rewritten); the members
                                                                    are kept in the column's COMMENT (below)
json                                   jsonb
vector(n) (TiDB)                       text                         the TiDB text form '[1,2,3]' (no pgvector)
geometry / point / ... (spatial)       UnsupportedDDL
=====================================  ===========================  ==================================================

Upstream type comments: PostgreSQL's ``text`` cannot say which members an ENUM or SET had, yet the Open
Protocol, Canal-JSON and Simple send ENUM/SET values as ordinals / bitmasks, which the writer must turn back into
member names. So every ENUM/SET column gets ``COMMENT ON COLUMN .. IS 'applier:enum(''a'',''b'')'`` (or
``applier:set(...)``; members as in MySQL, quotes doubled, trailing spaces removed as MySQL removes them) right
after CREATE TABLE / ADD COLUMN / MODIFY / CHANGE, and a MODIFY/CHANGE to any other type clears the comment.
``CREATE TABLE .. LIKE`` copies comments. :func:`type_comment` writes the comment and
:func:`parse_type_comment` reads it back (``applier/sinks/postgres.py`` uses it); upstream column COMMENTs are
dropped, so a column comment on a replicated table is always the applier's own.

Column attributes: NOT NULL is kept; DEFAULT literals are re-rendered for the target type (strings,
numbers, ``x'..'``/``0x..`` and ``b'..'``/``0b..`` literals, TRUE/FALSE, CURRENT_TIMESTAMP/NOW()/LOCALTIME[STAMP]
-> CURRENT_TIMESTAMP for timestamptz and LOCALTIMESTAMP for timestamp, CURRENT_DATE); zero dates
('0000-00-00 ...', 0) have no PostgreSQL value and are dropped; other expression defaults are dropped in
CREATE TABLE / MODIFY (every replicated row carries every column, so a default only matters for rows that
existed before an ADD COLUMN) and refused in ADD COLUMN. AUTO_INCREMENT is dropped (values come from upstream),
ON UPDATE CURRENT_TIMESTAMP is dropped (upstream computes the value and sends it), COMMENT, COLLATE,
CHARACTER SET, COLUMN_FORMAT, STORAGE, VISIBLE/INVISIBLE and CHECK constraints are dropped, FOREIGN KEY /
REFERENCES are dropped (the applier writes tables in batches, not in upstream statement order across tables;
upstream enforced them). Generated columns (``AS (expr) [VIRTUAL|STORED]``) become ordinary columns: MySQL
expressions cannot be translated reliably, so the column holds the value upstream computed - the writer must
therefore write generated columns' values on PostgreSQL. Adding a generated column to an existing table is
refused (the values of existing rows would be missing).

Table options (ENGINE, CHARSET, COLLATE, COMMENT, AUTO_INCREMENT, ROW_FORMAT, PARTITION BY ...) are dropped:
the target table is a plain, unpartitioned table.

Statements
==========

=================================================  ===============================================================
MySQL / TiDB                                       PostgreSQL
=================================================  ===============================================================
CREATE TABLE [IF NOT EXISTS] t (...)               CREATE TABLE IF NOT EXISTS "s"."t" (... , CONSTRAINT "t_pkey"
                                                   PRIMARY KEY (...)) + CREATE [UNIQUE] INDEX IF NOT EXISTS per
                                                   UNIQUE KEY / KEY / INDEX. Prefix parts ``col(n)``: dropped on
                                                   short columns (varchar(n<=512), [var]binary(n<=2000)), else
                                                   indexed as ``substring(col from 1 for n)`` (long values cannot
                                                   exceed the ~2.7 kB btree entry limit; such an index is not made
                                                   UNIQUE: upstream enforces it, writers cannot see it). A
                                                   primary key always uses whole columns (writers need them for ON
                                                   CONFLICT): a TEXT/BLOB primary key value above ~2.7 kB fails.
CREATE TABLE t LIKE s                              CREATE TABLE IF NOT EXISTS t (LIKE s INCLUDING DEFAULTS INCLUDING
                                                   COMMENTS) + a DO
                                                   block that copies s's primary key and indexes under t's names
DROP TABLE [IF EXISTS] a, b                        DROP TABLE IF EXISTS "s"."a", "s"."b"
TRUNCATE [TABLE] t                                 TRUNCATE TABLE "s"."t"
RENAME TABLE a TO b / ALTER TABLE a RENAME [TO] b  ALTER TABLE IF EXISTS "s"."a" RENAME TO "b" (+ ALTER TABLE IF
                                                   EXISTS .. SET SCHEMA "s2" when the schema changes) + a DO block
                                                   renaming the table's indexes to the new table's names
ALTER TABLE ADD [COLUMN] c ...                     ADD COLUMN IF NOT EXISTS (NOT NULL without DEFAULT: filled with
                                                   MySQL's implicit default - 0, '', first enum member, zero bytes -
                                                   like upstream, then the default is dropped; temporal NOT NULL
                                                   columns without a default are added nullable: their implicit
                                                   default is a zero date)
ALTER TABLE DROP [COLUMN] c                        DROP COLUMN IF EXISTS
ALTER TABLE MODIFY c ... / CHANGE a b ...          [RENAME COLUMN a TO b], DROP DEFAULT, ALTER COLUMN TYPE t USING
                                                   "c"::t, [SET DEFAULT], SET NOT NULL or DROP NOT NULL (skipped for
                                                   primary key columns, which MySQL keeps NOT NULL). FIRST/AFTER
                                                   are dropped (column order does not matter to the applier).
ALTER TABLE ALTER [COLUMN] c SET/DROP DEFAULT      ALTER COLUMN SET/DROP DEFAULT (a default with no PostgreSQL form
                                                   is skipped: it only affects rows inserted without the column)
ALTER TABLE RENAME COLUMN a TO b                   RENAME COLUMN
ALTER TABLE ADD INDEX/KEY/UNIQUE, CREATE INDEX     CREATE [UNIQUE] INDEX IF NOT EXISTS
ALTER TABLE ADD PRIMARY KEY                        DO block: ADD CONSTRAINT "t_pkey" PRIMARY KEY unless one exists
ALTER TABLE DROP INDEX/KEY, DROP INDEX i ON t      DROP INDEX IF EXISTS ("PRIMARY" -> drop the primary key)
ALTER TABLE DROP PRIMARY KEY                       ALTER TABLE .. DROP CONSTRAINT IF EXISTS "t_pkey"
ALTER TABLE RENAME INDEX a TO b                    ALTER INDEX IF EXISTS .. RENAME TO ..
CREATE DATABASE|SCHEMA d                           CREATE SCHEMA IF NOT EXISTS "d"
DROP DATABASE|SCHEMA d                             DROP SCHEMA IF EXISTS "d" CASCADE (refused when routing renames
                                                   the schema, or for public/pg_*/system schemas)
DROP VIEW [IF EXISTS] v                            DROP VIEW IF EXISTS
ALTER DATABASE, table options, ALTER INDEX ..      nothing (statements == [])
VISIBLE, ADD/REORGANIZE/COALESCE/REMOVE
PARTITION(ING), PARTITION BY, FULLTEXT/SPATIAL
and non-unique expression indexes (performance
only), FOREIGN KEY / CHECK changes, TiDB-only
statements (see applier/ddl/mysql.py)
=================================================  ===============================================================

Index names: PostgreSQL index names are unique per schema, so an index ``i`` of table ``t`` is named
``t__i`` (MySQL index names are case-insensitive, so ``i`` is lower-cased; the primary key is ``t_pkey``);
when that exceeds PostgreSQL's 63-byte limit it becomes ``i_<md5(t || '.' || i)>`` (``pk_<md5(t)>``) and
the MySQL name is kept in the index's COMMENT. Unnamed MySQL indexes get MySQL's name (first column,
then ``_2``, ``_3``) so a later ``DROP INDEX`` finds them. Renaming a table renames its indexes the same way.

Raises UnsupportedDDL for: CREATE VIEW / ALTER VIEW (MySQL SELECT syntax), CREATE TABLE ... SELECT,
TRUNCATE / DROP / EXCHANGE PARTITION (they change rows that TiCDC does not send, and the target table has no
partitions), unique expression indexes, spatial types, ADD COLUMN with a generated column, AUTO_INCREMENT or
an expression default that has no PostgreSQL form, RECOVER/FLASHBACK, and statements not listed above.

Identifiers keep their case and are always quoted, as the writers quote them; a MySQL statement that refers
to a column with a different letter case than it was created with will not find it on PostgreSQL.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Sequence

from applier.ddl import Context, TranslatedDDL
from applier.ddl.mysql import alter_specs, checked_drop_schema, drop_list, rename_tables
from applier.ddl.tidb import (
    Cursor,
    LexError,
    Token,
    neutralise_tidb,
    pg_quote_ident,
    pg_quote_literal,
    restores_data_statement,
    significant,
    split_top_level,
    strip_terminator,
    tidb_only_statement,
    tokenize,
)

__all__ = ["translate_postgres", "pg_index_name", "pg_type", "type_comment", "parse_type_comment"]

_PG_SYSTEM = frozenset({"public", "information_schema", "pg_catalog", "pg_toast", "mysql",
                        "performance_schema", "sys", "metrics_schema"})
_NAME_BYTES = 63


def qi(name: str) -> str:
    return pg_quote_ident(name)


def qn(schema: str, table: str) -> str:
    return f"{qi(schema)}.{qi(table)}"


lit = pg_quote_literal


def pg_index_name(table: str, index: str) -> str:
    """The PostgreSQL name of MySQL index ``index`` of table ``table`` (see the module docstring)."""
    if index.upper() == "PRIMARY":
        cand = f"{table}_pkey"
        return cand if len(cand.encode()) <= _NAME_BYTES else "pk_" + hashlib.md5(table.encode()).hexdigest()
    cand = f"{table}__{index.lower()}"
    if len(cand.encode()) <= _NAME_BYTES:
        return cand
    return "i_" + hashlib.md5(f"{table}.{index.lower()}".encode()).hexdigest()


def _is_hashed(table: str, index: str) -> bool:
    return index.upper() != "PRIMARY" and len(f"{table}__{index.lower()}".encode()) > _NAME_BYTES


def _do(body: str) -> str:
    """A DO block whose dollar-quote tag does not occur in the body."""
    n = 0
    tag = "$ddl$"
    while tag in body:
        n += 1
        tag = f"$ddl{n}$"
    return f"DO {tag}\n{body}\n{tag}"


# ---------------------------------------------------------------------------------------------------------
# Parsed model


@dataclass
class MyType:
    name: str  # canonical lower-case MySQL type name
    args: list[str] = field(default_factory=list)
    unsigned: bool = False
    values: list[str] = field(default_factory=list)  # ENUM / SET members
    charset: str | None = None


@dataclass
class Default:
    kind: str  # null string number hex bit bool now curdate expr
    value: str = ""


@dataclass
class ColDef:
    name: str
    type: MyType
    not_null: bool | None = None
    default: Default | None = None
    auto_increment: bool = False
    primary: bool = False
    unique: bool = False
    generated: bool = False


@dataclass
class IndexPart:
    column: str | None  # None: an expression
    desc: bool = False
    prefix: int | None = None  # MySQL prefix length, col(n)


@dataclass
class IndexDef:
    kind: str  # primary unique index fulltext spatial vector foreign check
    name: str | None
    parts: list[IndexPart] = field(default_factory=list)

    @property
    def has_expression(self) -> bool:
        return any(p.column is None for p in self.parts)


_INT_TYPES = {"tinyint", "smallint", "mediumint", "int", "bigint"}
_TYPE_ALIASES = {
    "INTEGER": "int", "INT1": "tinyint", "INT2": "smallint", "INT3": "mediumint", "MIDDLEINT": "mediumint",
    "INT4": "int", "INT8": "bigint", "DEC": "decimal", "NUMERIC": "decimal", "FIXED": "decimal",
    "FLOAT4": "float", "FLOAT8": "double", "REAL": "double", "BOOLEAN": "bool", "NCHAR": "char",
    "NVARCHAR": "varchar", "CHARACTER": "char",
}
_KNOWN_TYPES = {
    "tinyint", "smallint", "mediumint", "int", "bigint", "decimal", "float", "double", "bit", "bool",
    "char", "varchar", "binary", "varbinary", "tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob",
    "mediumblob", "longblob", "date", "datetime", "timestamp", "time", "year", "enum", "set", "json", "vector",
    "serial", "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
    "geometrycollection", "geomcollection",
}
_SPATIAL = {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
            "geometrycollection", "geomcollection"}


def parse_type(c: Cursor) -> MyType:
    tok = c.next()
    if tok.kind != "word":
        raise LexError(f"expected a data type, found {tok.text!r}")
    w = tok.upper
    if w == "DOUBLE":
        c.accept_kw("PRECISION")
        name = "double"
    elif w == "NATIONAL":
        nxt = c.expect_kw("CHAR", "CHARACTER", "VARCHAR")
        name = "varchar" if nxt.upper == "VARCHAR" or c.accept_kw("VARYING") else "char"
    elif w in ("CHAR", "CHARACTER", "NCHAR"):
        name = "varchar" if c.accept_kw("VARYING") else "char"
        if name == "char" and c.accept_kw("BYTE"):
            name = "binary"
    elif w == "LONG":
        if c.accept_kw("VARBINARY"):
            name = "mediumblob"
        else:
            c.accept_kw("VARCHAR", "VARCHARACTER")
            name = "mediumtext"
    else:
        name = _TYPE_ALIASES.get(w, w.lower())
    if name not in _KNOWN_TYPES:
        raise _TypeError(f"unknown column type {tok.text}")
    t = MyType(name)
    if c.is_op("("):
        lo, hi = c.skip_group()
        for a, b in split_top_level(c.toks, lo, hi):
            if b - a != 1:
                raise LexError(f"unexpected type parameter in {tok.text}")
            p = c.toks[a]
            if name in ("enum", "set"):
                if p.kind != "string":
                    raise LexError(f"{name.upper()} members must be strings")
                t.values.append(p.value)
            elif p.kind == "number":
                t.args.append(p.value)
            else:
                raise LexError(f"unexpected type parameter {p.text!r}")
    while True:
        if c.accept_kw("UNSIGNED"):
            t.unsigned = True
        elif c.accept_kw("ZEROFILL"):
            t.unsigned = True
        elif c.accept_kw("SIGNED", "ASCII", "UNICODE", "BYTE"):
            pass
        elif c.is_kw("BINARY") and name in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext",
                                            "enum", "set"):
            c.next()  # binary collation, still a character string
        elif c.is_kw("CHARACTER", "CHAR") and c.is_kw("SET", k=1):
            c.pos += 2
            t.charset = _name_value(c).lower()
        elif c.is_kw("CHARSET"):
            c.next()
            t.charset = _name_value(c).lower()
        elif c.is_kw("COLLATE"):
            c.next()
            _name_value(c)
        else:
            break
    return t


class _TypeError(LexError):
    pass


def _name_value(c: Cursor) -> str:
    c.accept_op("=")
    tok = c.next()
    if tok.kind == "string":
        return tok.value
    if tok.is_ident:
        return tok.ident
    if tok.kind == "number":
        return tok.value
    raise LexError(f"expected a name, found {tok.text!r}")


def pg_type(t: MyType) -> str:
    """The PostgreSQL type for a parsed MySQL type (see the module docstring)."""
    n = t.name
    args = [int(float(a)) for a in t.args]
    if n in _SPATIAL:
        raise _Unsupported(f"spatial type {n.upper()} has no PostgreSQL equivalent without PostGIS")
    if n in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext") and t.charset == "binary":
        return "bytea"
    if n == "tinyint" or n == "bool":
        return "smallint"
    if n == "smallint":
        return "integer" if t.unsigned else "smallint"
    if n == "mediumint":
        return "integer"
    if n == "int":
        return "bigint" if t.unsigned else "integer"
    if n == "bigint":
        return "numeric(20,0)" if t.unsigned else "bigint"
    if n == "serial":
        return "numeric(20,0)"
    if n == "decimal":
        p = args[0] if args else 10
        s = args[1] if len(args) > 1 else 0
        return f"numeric({p},{s})"
    if n == "float":
        if len(args) == 1 and args[0] > 24:
            return "double precision"
        return "real"
    if n == "double":
        return "double precision"
    if n in ("char", "varchar"):
        if n == "varchar" and not args:
            raise LexError("VARCHAR needs a length")
        length = args[0] if args else 1
        return f"varchar({length})" if length > 0 else "text"
    if n in ("tinytext", "text", "mediumtext", "longtext", "enum", "set", "vector"):
        return "text"
    if n in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return "bytea"
    if n == "date":
        return "date"
    if n == "datetime":
        return f"timestamp({args[0] if args else 0}) without time zone"
    if n == "timestamp":
        return f"timestamp({args[0] if args else 0}) with time zone"
    if n == "time":
        return f"interval({args[0] if args else 0})"
    if n == "year":
        return "smallint"
    if n == "bit":
        return f"bit varying({args[0] if args else 1})"
    if n == "json":
        return "jsonb"
    raise _Unsupported(f"column type {n.upper()} is not supported")


TYPE_COMMENT_PREFIX = "applier:"


def type_comment(t: MyType) -> str | None:
    """The column comment recording what the PostgreSQL type loses of upstream type ``t`` (ENUM/SET members:
    ``applier:enum('a','b')``), or None when the PostgreSQL type says it all. MySQL removes trailing spaces from
    member names when it creates the table, so they are removed here too."""
    if t.name not in ("enum", "set") or any("\0" in m for m in t.values):
        return None  # (a NUL cannot be in a PostgreSQL comment: the writer then refuses ordinals, saying why)
    members = ",".join("'" + m.rstrip(" ").replace("'", "''") + "'" for m in t.values)
    return f"{TYPE_COMMENT_PREFIX}{t.name}({members})"


def parse_type_comment(comment: str | None) -> tuple[str, tuple[str, ...]] | None:
    """``applier:enum('a','b')`` -> ("enum", ("a", "b")); None for any other comment (or a malformed one)."""
    if not comment or not comment.startswith(TYPE_COMMENT_PREFIX):
        return None
    body = comment[len(TYPE_COMMENT_PREFIX):]
    kind, sep, rest = body.partition("(")
    if kind not in ("enum", "set") or not sep or not rest.endswith(")"):
        return None
    rest = rest[:-1]
    members: list[str] = []
    i, n = 0, len(rest)
    while i < n:
        if rest[i] != "'":
            return None
        j = i + 1
        buf = []
        while True:
            k = rest.find("'", j)
            if k < 0:
                return None
            buf.append(rest[j:k])
            if k + 1 < n and rest[k + 1] == "'":
                buf.append("'")
                j = k + 2
                continue
            break
        members.append("".join(buf))
        i = k + 1
        if i < n:
            if rest[i] != ",":
                return None
            i += 1
            if i == n:
                return None
    return kind, tuple(members)


def _comment_sql(tbl: "_Table", column: str, t: MyType | None) -> str:
    """COMMENT ON COLUMN recording ``t``'s members (or clearing the comment when ``t`` needs none)."""
    note = type_comment(t) if t is not None else None
    return f"COMMENT ON COLUMN {tbl.q}.{qi(column)} IS {lit(note) if note is not None else 'NULL'}"


class _Unsupported(Exception):
    """Raised inside the parser/renderer; turned into UnsupportedDDL by the entry point."""

    def __init__(self, reason: str, kind: str = "other") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def _category(t: MyType) -> str:
    n = t.name
    if n in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext") and t.charset == "binary":
        return "binary"
    if n in _INT_TYPES or n in ("bool", "serial", "year"):
        return "int"
    if n in ("decimal", "float", "double"):
        return "numeric"
    if n in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext", "vector"):
        return "string"
    if n in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return "binary"
    return n  # date datetime timestamp time bit enum set json


# ---------------------------------------------------------------------------------------------------------
# Column definitions and defaults

_NOW_WORDS = ("CURRENT_TIMESTAMP", "NOW", "LOCALTIME", "LOCALTIMESTAMP", "UTC_TIMESTAMP", "SYSDATE")


def parse_default(c: Cursor) -> Default:
    tok = c.peek()
    if tok is None:
        raise LexError("DEFAULT without a value")
    if tok.is_op("("):
        lo, hi = c.skip_group()
        inner = Cursor(c.toks, lo, hi)
        try:
            d = parse_default(inner)
            if inner.at_end:
                return d
        except LexError:
            pass
        return Default("expr", " ".join(t.text for t in c.toks[lo:hi]))
    if tok.is_word("NULL"):
        c.next()
        return Default("null")
    if tok.is_word("TRUE", "FALSE"):
        c.next()
        return Default("bool", "1" if tok.upper == "TRUE" else "0")
    if tok.is_op("+", "-"):
        c.next()
        num = c.next()
        if num.kind != "number":
            raise LexError("expected a number after a sign")
        return Default("number", ("-" if tok.text == "-" else "") + num.value)
    if tok.kind == "number":
        c.next()
        return Default("number", tok.value)
    if tok.kind in ("hexstr", "hexnum"):
        c.next()
        digits = tok.value[2:] if tok.kind == "hexnum" else tok.value
        if len(digits) % 2:
            digits = "0" + digits
        return Default("hex", digits.lower())
    if tok.kind in ("bitstr", "bitnum"):
        c.next()
        return Default("bit", tok.value[2:] if tok.kind == "bitnum" else tok.value)
    if tok.kind == "word" and (tok.upper.startswith("_") or tok.upper == "N") and c.peek(1) is not None \
            and c.peek(1).kind in ("string", "hexstr", "bitstr") and c.peek(1).start == tok.end:
        c.next()  # charset introducer: _utf8mb4'abc', N'abc'
        return parse_default(c)
    if tok.kind == "string":
        parts = []
        while c.peek() is not None and c.peek().kind == "string":
            parts.append(c.next().value)  # adjacent literals concatenate
        return Default("string", "".join(parts))
    if tok.is_word(*_NOW_WORDS):
        c.next()
        if c.is_op("("):
            c.skip_group()
        return Default("now")
    if tok.is_word("CURRENT_DATE", "CURDATE", "UTC_DATE"):
        c.next()
        if c.is_op("("):
            c.skip_group()
        return Default("curdate")
    if tok.kind == "word":
        c.next()
        if c.is_op("("):
            lo, hi = c.skip_group()
            return Default("expr", tok.text + "(" + " ".join(t.text for t in c.toks[lo:hi]) + ")")
        return Default("expr", tok.text)
    raise LexError(f"unexpected DEFAULT value {tok.text!r}")


def parse_column(c: Cursor) -> ColDef:
    name = c.ident().ident
    col = ColDef(name, parse_type(c))
    if col.type.name == "serial":
        col.not_null = True
        col.unique = True
    while not c.at_end:
        if c.accept_seq("NOT", "NULL"):
            col.not_null = True
        elif c.accept_kw("NULL"):
            col.not_null = False
        elif c.accept_kw("DEFAULT"):
            if c.accept_seq("SERIAL", "VALUE"):  # SERIAL DEFAULT VALUE = NOT NULL AUTO_INCREMENT UNIQUE
                col.not_null = True
                col.unique = True
            else:
                col.default = parse_default(c)
        elif c.accept_kw("AUTO_INCREMENT"):
            col.auto_increment = True
        elif c.accept_kw("UNIQUE"):
            c.accept_kw("KEY", "INDEX")
            col.unique = True
        elif c.accept_seq("PRIMARY", "KEY") or c.accept_kw("KEY"):
            col.primary = True
        elif c.accept_kw("COMMENT"):
            c.next()
        elif c.is_kw("COLLATE", "CHARSET", "COLUMN_FORMAT", "STORAGE", "ENGINE_ATTRIBUTE",
                     "SECONDARY_ENGINE_ATTRIBUTE", "SRID"):
            c.next()
            _name_value(c)
        elif c.is_kw("CHARACTER", "CHAR") and c.is_kw("SET", k=1):
            c.pos += 2
            col.type.charset = _name_value(c).lower()
        elif c.accept_seq("ON", "UPDATE"):
            parse_default(c)
        elif c.accept_seq("GENERATED", "ALWAYS") or c.is_kw("AS"):
            c.expect_kw("AS")
            c.skip_group()
            c.accept_kw("VIRTUAL", "STORED", "PERSISTENT")
            col.generated = True
        elif c.is_kw("REFERENCES"):
            _skip_references(c)
        elif c.accept_kw("CONSTRAINT"):
            if not c.is_kw("CHECK"):
                c.ident()
        elif c.accept_kw("CHECK"):
            c.skip_group()
            c.accept_kw("NOT")
            c.accept_kw("ENFORCED")
        elif c.accept_kw("VISIBLE", "INVISIBLE"):
            pass
        elif c.is_kw("FIRST", "AFTER"):
            break  # ALTER TABLE position, handled by the caller
        else:
            raise LexError(f"unexpected {c.peek().text!r} in the definition of column {name!r}")
    return col


def _skip_references(c: Cursor) -> None:
    c.expect_kw("REFERENCES")
    c.ident()
    if c.accept_op("."):
        c.ident()
    if c.is_op("("):
        c.skip_group()
    while not c.at_end:
        if c.accept_kw("MATCH"):
            c.next()
        elif c.accept_seq("ON", "DELETE") or c.accept_seq("ON", "UPDATE"):
            if not (c.accept_kw("RESTRICT", "CASCADE") or c.accept_seq("SET", "NULL")
                    or c.accept_seq("SET", "DEFAULT") or c.accept_seq("NO", "ACTION")):
                raise LexError("unexpected referential action")
        else:
            break


_ZERO_DATE = re.compile(r"^\s*(\d{4}-0{1,2}-|\d{4}-\d{1,2}-0{1,2}(\D|$)|0{4}-)")
_ALL_ZEROS = re.compile(r"^\s*[0:\-. ]*$")


def _zero_date(value: str, *, typed: bool = True) -> bool:
    """A MySQL zero date ('0000-00-00 ...', a zero month or day); with ``typed``, also '0' and ''."""
    if _ZERO_DATE.match(value):
        return True
    return typed and bool(_ALL_ZEROS.match(value))


def _number_text(value: str) -> str | None:
    v = value.strip()
    if re.fullmatch(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?", v):
        return v.lstrip("+")
    return None


def _bytes_literal(data: bytes, t: MyType | None) -> str:
    if t is not None and t.name == "binary":
        n = int(t.args[0]) if t.args else 1
        data = data[:n].ljust(n, b"\0")  # BINARY(n) pads with zero bytes
    return lit("\\x" + data.hex()) + "::bytea"


def _bits_literal(value: int, t: MyType | None) -> str:
    width = int(t.args[0]) if t is not None and t.args else 1
    bits = format(value, "b")
    if len(bits) > width:
        raise _Unsupported(f"bit default {value} is wider than BIT({width})")
    return "B" + lit(bits.rjust(width, "0"))


def pg_default(d: Default, t: MyType | None) -> str | None:
    """PostgreSQL DEFAULT expression for ``d`` on a column of type ``t`` (None: not representable).

    ``t`` is None when the column type is unknown (ALTER COLUMN .. SET DEFAULT): then only literals whose
    PostgreSQL form does not depend on the type are rendered.
    """
    cat = _category(t) if t is not None else None
    k = d.kind
    if k == "null":
        return "NULL"
    if k == "expr":
        return None
    if k == "now":
        if cat in ("timestamp", None):
            return "CURRENT_TIMESTAMP"
        if cat == "datetime":
            return "LOCALTIMESTAMP"
        if cat == "date":
            return "CURRENT_DATE"
        return None
    if k == "curdate":
        return "CURRENT_DATE" if cat in ("date", None) else None
    if k == "bool":
        d = Default("number", d.value)
        k = "number"
    if k == "number":
        num = _number_text(d.value)
        if cat in ("int", "numeric", None):
            return num
        if cat in ("string", "enum", "set", "json"):
            return lit(d.value)
        if cat == "binary":
            return _bytes_literal(d.value.encode(), t)
        if cat == "bit":
            return _bits_literal(int(float(d.value)), t) if num and "." not in num else None
        if cat in ("date", "datetime", "timestamp"):
            return None  # 0 is the zero date; other numeric dates are not worth guessing
        if cat == "time" and num is not None and re.fullmatch(r"-?\d+", num):
            v = int(num)
            sign, v = ("-" if v < 0 else ""), abs(v)
            return lit(f"{sign}{v // 10000}:{v // 100 % 100:02d}:{v % 100:02d}")
        return None
    if k == "string":
        v = d.value
        if cat in ("int", "numeric"):
            return _number_text(v)
        if cat in ("string", "enum", "set", "json", "time"):
            return lit(v)
        if cat is None:
            return None if _zero_date(v, typed=False) else lit(v)
        if cat == "binary":
            return _bytes_literal(v.encode(), t)
        if cat == "bit":
            return _bits_literal(int.from_bytes(v.encode(), "big"), t) if v else None
        if cat in ("date", "datetime", "timestamp"):
            return None if _zero_date(v) else lit(v)
        return None
    if k == "hex":
        data = bytes.fromhex(d.value)
        if cat == "binary":
            return _bytes_literal(data, t)
        if cat in ("int", "numeric"):
            return str(int.from_bytes(data, "big"))
        if cat == "bit":
            return _bits_literal(int.from_bytes(data, "big"), t)
        if cat in ("string", "enum", "set"):
            try:
                return lit(data.decode("utf-8"))
            except UnicodeDecodeError:
                return None
        return None
    if k == "bit":
        value = int(d.value, 2) if d.value else 0
        if cat == "bit":
            return _bits_literal(value, t)
        if cat in ("int", "numeric"):
            return str(value)
        if cat == "binary":
            return _bytes_literal(value.to_bytes(max(1, (len(d.value) + 7) // 8), "big"), t)
        return None
    return None


def _implicit_default(t: MyType) -> str | None:
    """MySQL's implicit default of a NOT NULL column (what existing rows get on ADD COLUMN ... NOT NULL)."""
    cat = _category(t)
    if cat in ("int", "numeric"):
        return "0"
    if cat in ("string", "set"):
        return "''"
    if cat == "enum":
        return lit(t.values[0]) if t.values else "''"
    if cat == "binary":
        return _bytes_literal(b"", t)
    if cat == "bit":
        return _bits_literal(0, t)
    if cat == "json":
        return "'null'"
    if cat == "time":
        return "'00:00:00'"
    return None  # date / datetime / timestamp: the zero date


def column_sql(col: ColDef, *, for_add: bool = False) -> tuple[str, bool]:
    """``"name" type [DEFAULT x] [NOT NULL]``; the flag says whether a default was added only to fill
    existing rows (ADD COLUMN NOT NULL without DEFAULT) and must be dropped afterwards."""
    pgt = pg_type(col.type)
    parts = [qi(col.name), pgt]
    temporary_default = False
    not_null = bool(col.not_null)
    default_sql = None
    if col.default is not None and not col.generated:
        default_sql = pg_default(col.default, col.type)
        if default_sql is None and for_add and col.default.kind != "null":
            cat = _category(col.type)
            if col.default.kind in ("string", "number") and cat in ("date", "datetime", "timestamp"):
                not_null = False  # a zero date: no PostgreSQL value; existing rows stay NULL
            else:
                raise _Unsupported(f"the default of new column {col.name!r} has no PostgreSQL form, and existing "
                                   "rows would get a different value than upstream", kind="alter_table")
        if default_sql == "NULL":
            default_sql = None
    elif for_add and not_null and not col.generated:
        default_sql = _implicit_default(col.type)
        if default_sql is None:
            not_null = False  # temporal NOT NULL without default: upstream fills zero dates
        else:
            temporary_default = True
    if default_sql is not None:
        parts.append(f"DEFAULT {default_sql}")
    if not_null or col.primary:
        parts.append("NOT NULL")
    return " ".join(parts), temporary_default


# ---------------------------------------------------------------------------------------------------------
# Index definitions


def parse_key_parts(c: Cursor) -> list[IndexPart]:
    lo, hi = c.skip_group()
    parts: list[IndexPart] = []
    for a, b in split_top_level(c.toks, lo, hi):
        pc = Cursor(c.toks, a, b)
        column: str | None = None
        prefix: int | None = None
        if pc.is_op("("):
            pc.skip_group()
        elif pc.peek() is not None and pc.peek().is_ident:
            column = pc.ident().ident
            if pc.is_op("("):
                glo, ghi = pc.skip_group()
                if ghi - glo != 1 or c.toks[glo].kind != "number":
                    raise LexError("unexpected index prefix length")
                prefix = int(c.toks[glo].value)
        else:
            raise LexError("unexpected index part")
        desc = bool(pc.accept_kw("DESC"))
        pc.accept_kw("ASC")
        if not pc.at_end:
            column = None  # an expression written without parentheses
        parts.append(IndexPart(column, desc, prefix))
    return parts


_INDEX_OPTION_WORDS = ("USING", "KEY_BLOCK_SIZE", "COMMENT", "WITH", "VISIBLE", "INVISIBLE", "ENGINE_ATTRIBUTE",
                       "SECONDARY_ENGINE_ATTRIBUTE", "TYPE", "IGNORED", "NOT", "CLUSTERED", "NONCLUSTERED",
                       "GLOBAL", "LOCAL")


def parse_index_def(c: Cursor) -> IndexDef:
    """An index/constraint element of CREATE TABLE or ALTER TABLE ADD (after ADD)."""
    symbol = None
    if c.accept_kw("CONSTRAINT"):
        if not c.is_kw("PRIMARY", "UNIQUE", "FOREIGN", "CHECK"):
            symbol = c.ident().ident
    if c.accept_kw("CHECK") or c.accept_seq("FOREIGN", "KEY"):
        kind = "check" if c.toks[c.pos - 1].is_word("CHECK") else "foreign"
        c.pos = c.end  # [NOT] ENFORCED / (cols) REFERENCES ...: nothing of it reaches PostgreSQL
        return IndexDef(kind, symbol)
    if c.accept_kw("PRIMARY"):
        c.expect_kw("KEY")
        kind = "primary"
    elif c.accept_kw("UNIQUE"):
        c.accept_kw("KEY", "INDEX")
        kind = "unique"
    elif c.accept_kw("FULLTEXT", "SPATIAL", "VECTOR", "COLUMNAR"):
        kind = c.toks[c.pos - 1].upper.lower()
        c.accept_kw("KEY", "INDEX")
    else:
        c.expect_kw("KEY", "INDEX")
        kind = "index"
    name = None
    c.accept_seq("IF", "NOT", "EXISTS")
    if not c.is_op("(") and not c.is_kw("USING", "TYPE"):
        name = c.ident().ident
    while c.accept_kw("USING", "TYPE"):
        c.next()
    if kind == "primary":
        name = "PRIMARY"
    elif name is None:
        name = symbol
    if kind in ("fulltext", "spatial", "vector", "columnar"):
        c.pos = c.end  # key parts and options of an index PostgreSQL does not get
        return IndexDef(kind, name)
    idx = IndexDef(kind, name, parse_key_parts(c))
    _skip_index_options(c)
    return idx


def _skip_index_options(c: Cursor) -> None:
    while not c.at_end and c.is_kw(*_INDEX_OPTION_WORDS):
        w = c.next().upper
        if w in ("USING", "TYPE", "WITH", "KEY_BLOCK_SIZE", "COMMENT", "ENGINE_ATTRIBUTE",
                 "SECONDARY_ENGINE_ATTRIBUTE"):
            if w == "WITH":
                c.expect_kw("PARSER")
            c.accept_op("=")
            c.next()


class _Names:
    """MySQL's naming of unnamed indexes within one table: first column, then _2, _3, ..."""

    def __init__(self, taken: Sequence[str] = ()) -> None:
        self.taken = {n.lower() for n in taken}

    def name_for(self, idx: IndexDef) -> str:
        if idx.kind == "primary":
            return "PRIMARY"
        if idx.name:
            self.taken.add(idx.name.lower())
            return idx.name
        base = next((p.column for p in idx.parts if p.column), None) or "expression_index"
        name = base
        n = 2
        while name.lower() in self.taken or name.upper() == "PRIMARY":
            name = f"{base}_{n}"
            n += 1
        self.taken.add(name.lower())
        return name


# ---------------------------------------------------------------------------------------------------------
# Statement rendering helpers


class _Table:
    """A routed target table and the statements that touch it."""

    def __init__(self, schema: str, table: str) -> None:
        self.schema = schema
        self.table = table
        self.q = qn(schema, table)

    def index_statements(self, idx: IndexDef, name: str, types: dict[str, MyType] | None = None) -> list[str]:
        """CREATE INDEX for a MySQL index; ``types`` (lower-cased column name -> type) when known."""
        if idx.kind in ("foreign", "check", "fulltext", "spatial", "vector", "columnar"):
            return []
        if idx.has_expression:
            if idx.kind in ("unique", "primary"):
                raise _Unsupported(f"unique index {name!r} on an expression: MySQL expressions cannot be "
                                   "translated reliably", kind="create_index")
            return []  # a non-unique expression index only speeds up queries
        rendered = [_part_sql(p, types) for p in idx.parts]
        cols = ", ".join(rendered)
        if idx.kind == "primary":
            return [self.add_primary_key([p.column for p in idx.parts])]
        pg_name = pg_index_name(self.table, name)
        # a unique prefix over a long column becomes a plain index: upstream enforces the uniqueness, and the
        # writers (which order unique-key swaps by the unique indexes they can see) cannot see expressions
        unique = "UNIQUE " if idx.kind == "unique" and not any(r.startswith("(") for r in rendered) else ""
        out = [f"CREATE {unique}INDEX IF NOT EXISTS {qi(pg_name)} ON {self.q} ({cols})"]
        if _is_hashed(self.table, name):
            out.append(f"COMMENT ON INDEX {qn(self.schema, pg_name)} IS {lit(name.lower())}")
        return out

    def add_primary_key(self, columns: Sequence[str]) -> str:
        cols = ", ".join(qi(c) for c in columns)
        return _do(
            "BEGIN\n"
            f"  IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass({lit(self.q)}) "
            "AND indisprimary) THEN\n"
            f"    ALTER TABLE {self.q} ADD CONSTRAINT {qi(pg_index_name(self.table, 'PRIMARY'))} "
            f"PRIMARY KEY ({cols});\n"
            "  END IF;\n"
            "END;"
        )

    def drop_primary_key(self) -> str:
        return f"ALTER TABLE {self.q} DROP CONSTRAINT IF EXISTS {qi(pg_index_name(self.table, 'PRIMARY'))}"

    def drop_index(self, name: str) -> str:
        if name.upper() == "PRIMARY":
            return self.drop_primary_key()
        return f"DROP INDEX IF EXISTS {qn(self.schema, pg_index_name(self.table, name))}"

    def drop_not_null_unless_pk(self, column: str) -> str:
        return _do(
            "BEGIN\n"
            "  IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY (i.indkey)\n"
            f"                 WHERE i.indrelid = to_regclass({lit(self.q)}) AND i.indisprimary "
            f"AND a.attname = {lit(column)}) THEN\n"
            f"    ALTER TABLE {self.q} ALTER COLUMN {qi(column)} DROP NOT NULL;\n"
            "  END IF;\n"
            "END;"
        )


_SHORT_CHARS = 512  # varchar(n) up to this many characters (4 bytes each) fits a btree entry (~2700 bytes)
_SHORT_BYTES = 2000


def _part_sql(p: IndexPart, types: dict[str, MyType] | None) -> str:
    """One key part. A MySQL prefix ``col(n)`` is dropped when the column is known to be short; otherwise
    the index covers ``substring(col from 1 for n)``: the same prefix semantics (also for UNIQUE), and
    a long TEXT/BLOB value cannot exceed PostgreSQL's btree entry limit and stop replication."""
    col = qi(p.column)
    if p.prefix is not None:
        t = types.get(p.column.lower()) if types else None
        n = int(float(t.args[0])) if t is not None and t.args else 1
        short = t is not None and (
            (t.name in ("char", "varchar") and t.charset != "binary" and n <= _SHORT_CHARS)
            or (t.name in ("binary", "varbinary") and n <= _SHORT_BYTES))
        if not short:
            col = f"(substring({col} from 1 for {p.prefix}))"
    return col + (" DESC" if p.desc else "")


def _index_name_sql(table: str, var: str) -> str:
    """plpgsql expression computing pg_index_name(table, <var>) for a non-primary index."""
    prefix = lit(table + "__")
    return (f"CASE WHEN octet_length({prefix} || {var}) <= {_NAME_BYTES} THEN {prefix} || {var} "
            f"ELSE 'i_' || md5({lit(table + '.')} || {var}) END")


def rename_indexes_block(schema: str, old_table: str, new_table: str) -> str:
    """Rename the indexes of (already renamed) table schema.new_table from old_table's names to new_table's."""
    reg = lit(qn(schema, new_table))
    prefix = old_table + "__"
    return _do(
        "DECLARE\n  r record;\n  v_my text;\n  v_new text;\n"
        "BEGIN\n"
        "  FOR r IN SELECT c.relname::text AS relname, i.indisprimary, obj_description(c.oid, 'pg_class') AS note\n"
        "           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid\n"
        f"           WHERE i.indrelid = to_regclass({reg})\n"
        "  LOOP\n"
        "    IF r.indisprimary THEN\n"
        f"      v_new := {lit(pg_index_name(new_table, 'PRIMARY'))};\n"
        "    ELSE\n"
        f"      IF left(r.relname, {len(prefix)}) = {lit(prefix)} THEN\n"
        f"        v_my := substr(r.relname, {len(prefix) + 1});\n"
        "      ELSE\n"
        "        v_my := r.note;\n"
        "      END IF;\n"
        "      CONTINUE WHEN v_my IS NULL;\n"
        f"      v_new := {_index_name_sql(new_table, 'v_my')};\n"
        f"      IF v_new <> {lit(new_table + '__')} || v_my THEN\n"
        f"        EXECUTE format('COMMENT ON INDEX %I.%I IS %L', {lit(schema)}, r.relname, v_my);\n"
        "      END IF;\n"
        "    END IF;\n"
        "    IF v_new <> r.relname THEN\n"
        f"      EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', {lit(schema)}, r.relname, v_new);\n"
        "    END IF;\n"
        "  END LOOP;\n"
        "END;"
    )


def copy_indexes_block(src: _Table, dst: _Table) -> str:
    """CREATE TABLE .. LIKE: give dst the primary key and indexes of src, under dst's index names."""
    prefix = src.table + "__"
    return _do(
        "DECLARE\n  r record;\n  v_cols text;\n  v_my text;\n  v_new text;\n"
        "BEGIN\n"
        "  FOR r IN SELECT i.indexrelid, i.indisprimary, i.indisunique, i.indnkeyatts, c.relname::text AS relname,\n"
        "                  obj_description(c.oid, 'pg_class') AS note\n"
        "           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid\n"
        f"           WHERE i.indrelid = to_regclass({lit(src.q)})\n"
        "  LOOP\n"
        "    SELECT string_agg(pg_get_indexdef(r.indexrelid, k, true), ', ' ORDER BY k) INTO v_cols\n"
        "      FROM generate_series(1, r.indnkeyatts) AS k;\n"
        "    IF r.indisprimary THEN\n"
        f"      IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass({lit(dst.q)}) "
        "AND indisprimary) THEN\n"
        f"        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (%s)', {lit(dst.q)}, "
        f"{lit(pg_index_name(dst.table, 'PRIMARY'))}, v_cols);\n"
        "      END IF;\n"
        "      CONTINUE;\n"
        "    END IF;\n"
        f"    IF left(r.relname, {len(prefix)}) = {lit(prefix)} THEN\n"
        f"      v_my := substr(r.relname, {len(prefix) + 1});\n"
        "    ELSE\n"
        "      v_my := r.note;\n"
        "    END IF;\n"
        "    CONTINUE WHEN v_my IS NULL;\n"
        f"    v_new := {_index_name_sql(dst.table, 'v_my')};\n"
        "    EXECUTE format('CREATE %sINDEX IF NOT EXISTS %I ON %s (%s)', "
        f"CASE WHEN r.indisunique THEN 'UNIQUE ' ELSE '' END, v_new, {lit(dst.q)}, v_cols);\n"
        f"    IF v_new <> {lit(dst.table + '__')} || v_my THEN\n"
        f"      EXECUTE format('COMMENT ON INDEX %I.%I IS %L', {lit(dst.schema)}, v_new, v_my);\n"
        "    END IF;\n"
        "  END LOOP;\n"
        "END;"
    )


def rename_table_statements(old: tuple[str, str], new: tuple[str, str]) -> list[str]:
    (s1, a), (s2, b) = old, new
    out = []
    if a != b:
        out.append(f"ALTER TABLE IF EXISTS {qn(s1, a)} RENAME TO {qi(b)}")
    if s1 != s2:
        out.append(f"ALTER TABLE IF EXISTS {qn(s1, b)} SET SCHEMA {qi(s2)}")
    if a != b:
        out.append(rename_indexes_block(s2, a, b))
    return out


# ---------------------------------------------------------------------------------------------------------
# Entry point


def translate_postgres(ctx: Context) -> TranslatedDDL:
    text = neutralise_tidb(ctx.query)
    sig = strip_terminator(significant(tokenize(text)))
    if not sig:
        return TranslatedDDL([], "other", [])
    if any(t.is_op(";") for t in sig):
        ctx.fail("the event holds several statements")
    reason = restores_data_statement(sig)
    if reason:
        ctx.fail(reason)
    if tidb_only_statement(sig):
        return TranslatedDDL([], "other", [])
    try:
        return _dispatch(ctx, sig)
    except _Unsupported as exc:
        ctx.fail(exc.reason, kind=exc.kind)


def _dispatch(ctx: Context, sig: list[Token]) -> TranslatedDDL:
    c = Cursor(sig)
    head = c.next().upper
    if head == "CREATE":
        or_replace = c.accept_seq("OR", "REPLACE")
        if c.is_kw("TEMPORARY") or (c.is_kw("GLOBAL", "LOCAL") and c.is_kw("TEMPORARY", k=1)):
            return TranslatedDDL([], "other", [])
        if c.accept_kw("TABLE"):
            if or_replace:
                ctx.fail("CREATE OR REPLACE TABLE is not TiDB syntax", kind="create_table")
            return _create_table(ctx, c)
        if c.accept_kw("DATABASE", "SCHEMA"):
            c.accept_seq("IF", "NOT", "EXISTS")
            name = c.ident().ident
            target = ctx.routed_schema(name)
            if target is None:
                return TranslatedDDL([], "create_schema", [])
            return TranslatedDDL([f"CREATE SCHEMA IF NOT EXISTS {qi(target)}"], "create_schema", [(target, "")])
        if c.is_kw("UNIQUE", "FULLTEXT", "SPATIAL", "INDEX", "KEY", "VECTOR", "COLUMNAR", "ONLINE", "OFFLINE"):
            return _create_index(ctx, c)
        if c.is_kw("ALGORITHM", "DEFINER", "SQL", "VIEW"):
            return _view(ctx, c)
        ctx.fail(f"CREATE {c.peek().text.upper() if c.peek() else ''} is not supported")
    if head == "DROP":
        if c.accept_kw("TEMPORARY"):
            return TranslatedDDL([], "other", [])
        if c.accept_kw("TABLE", "TABLES"):
            return drop_list(ctx, c, "drop_table",
                             lambda refs: "DROP TABLE IF EXISTS " + ", ".join(qn(*r) for r in refs))
        if c.accept_kw("VIEW"):
            return drop_list(ctx, c, "drop_view",
                             lambda refs: "DROP VIEW IF EXISTS " + ", ".join(qn(*r) for r in refs))
        if c.accept_kw("DATABASE", "SCHEMA"):
            c.accept_seq("IF", "EXISTS")
            name = c.ident().ident
            target = checked_drop_schema(ctx, name, _PG_SYSTEM)
            if target is None or target.lower().startswith("pg_"):
                if target is not None:
                    ctx.fail(f"dropping the target schema {target!r} is refused", kind="drop_schema")
                return TranslatedDDL([], "drop_schema", [])
            return TranslatedDDL([f"DROP SCHEMA IF EXISTS {qi(target)} CASCADE"], "drop_schema", [(target, "")])
        c.accept_kw("ONLINE", "OFFLINE")
        if c.accept_kw("INDEX", "KEY"):
            c.accept_seq("IF", "EXISTS")
            name = c.ident().ident
            c.expect_kw("ON")
            ref = ctx.table_ref(c)
            r = ctx.routed(ref.schema, ref.table)
            if r is None:
                return TranslatedDDL([], "drop_index", [])
            return TranslatedDDL([_Table(*r).drop_index(name)], "drop_index", [r])
        ctx.fail(f"DROP {c.peek().text.upper() if c.peek() else ''} is not supported")
    if head == "ALTER":
        c.accept_kw("ONLINE", "OFFLINE")
        c.accept_kw("IGNORE")
        if c.is_kw("DATABASE", "SCHEMA"):
            return TranslatedDDL([], "other", [])  # charset/collation/placement: nothing in PostgreSQL
        if c.is_kw("ALGORITHM", "DEFINER", "SQL", "VIEW"):
            return _view(ctx, c)
        if c.accept_kw("TABLE"):
            return _alter_table(ctx, c)
        ctx.fail(f"ALTER {c.peek().text.upper() if c.peek() else ''} is not supported")
    if head == "TRUNCATE":
        c.accept_kw("TABLE")
        ref = ctx.table_ref(c)
        if not c.at_end:
            ctx.fail(f"unexpected {c.peek().text!r}")
        r = ctx.routed(ref.schema, ref.table)
        if r is None:
            return TranslatedDDL([], "truncate_table", [])
        return TranslatedDDL([f"TRUNCATE TABLE {qn(*r)}"], "truncate_table", [r])
    if head == "RENAME":
        if not c.accept_kw("TABLE", "TABLES"):
            ctx.fail("only RENAME TABLE is supported")
        return rename_tables(ctx, c, lambda pairs: [s for a, b in pairs for s in rename_table_statements(a, b)])
    ctx.fail(f"{head} statements are not DDL this applier understands")


def _view(ctx: Context, c: Cursor) -> TranslatedDDL:
    while not c.at_end and not c.is_kw("VIEW"):
        c.next()
    c.expect_kw("VIEW")
    ref = ctx.table_ref(c)
    if ctx.routed(ref.schema, ref.table) is None:
        return TranslatedDDL([], "create_view", [])
    ctx.fail("views are written in MySQL's SELECT syntax, which is not translated to PostgreSQL; create the "
             "view on the target by hand", kind="create_view")


# ---------------------------------------------------------------------------------------------------------
# CREATE TABLE / CREATE INDEX


def _create_table(ctx: Context, c: Cursor) -> TranslatedDDL:
    c.accept_seq("IF", "NOT", "EXISTS")
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    if r is None:
        return TranslatedDDL([], "create_table", [])
    if any(t.is_word("SELECT") for t in c.toks[c.pos:c.end]):
        raise _Unsupported("CREATE TABLE ... SELECT copies rows upstream that may not all reach the target as "
                           "row changes; create the table by hand", kind="create_table")
    tbl = _Table(*r)
    like = c.accept_kw("LIKE") is not None
    if not like and c.is_op("(") and c.is_kw("LIKE", k=1):
        c.pos += 2
        like = True
    if like:
        src_ref = ctx.table_ref(c)
        rs = ctx.routed(src_ref.schema, src_ref.table)
        if rs is None:
            raise _Unsupported(f"CREATE TABLE ... LIKE {src_ref.schema}.{src_ref.table}: the source table is "
                               "ignored by routing, so it does not exist on the target", kind="create_table")
        src = _Table(*rs)
        return TranslatedDDL([
            f"CREATE TABLE IF NOT EXISTS {tbl.q} (LIKE {src.q} INCLUDING DEFAULTS INCLUDING COMMENTS)",
            copy_indexes_block(src, tbl),
        ], "create_table", [r])
    if not c.is_op("("):
        raise LexError("expected the column list")
    lo, hi = c.skip_group()
    columns: list[ColDef] = []
    indexes: list[IndexDef] = []
    for a, b in split_top_level(c.toks, lo, hi):
        ec = Cursor(c.toks, a, b)
        if ec.at_end:
            raise LexError("empty element in the column list")
        if _starts_index(ec):
            indexes.append(parse_index_def(ec))
        else:
            columns.append(parse_column(ec))
        if not ec.at_end:
            raise LexError(f"unexpected {ec.peek().text!r}")
    # inline PRIMARY KEY / UNIQUE on columns become table-level keys
    for col in columns:
        if col.primary:
            indexes.insert(0, IndexDef("primary", "PRIMARY", [IndexPart(col.name)]))
        if col.unique:
            indexes.append(IndexDef("unique", None, [IndexPart(col.name)]))
    pk = next((i for i in indexes if i.kind == "primary"), None)
    if pk is not None and pk.has_expression:
        raise _Unsupported("a primary key on an expression", kind="create_table")
    pk_cols = {p.column.lower() for p in pk.parts} if pk else set()
    lines = []
    for col in columns:
        sql, _ = column_sql(col)
        if col.name.lower() in pk_cols and not sql.endswith("NOT NULL"):
            sql += " NOT NULL"
        lines.append("  " + sql)
    if pk is not None:
        cols = ", ".join(qi(p.column) for p in pk.parts)
        lines.append(f"  CONSTRAINT {qi(pg_index_name(tbl.table, 'PRIMARY'))} PRIMARY KEY ({cols})")
    stmts = [f"CREATE TABLE IF NOT EXISTS {tbl.q} (\n" + ",\n".join(lines) + "\n)"]
    stmts.extend(_comment_sql(tbl, col.name, col.type) for col in columns if type_comment(col.type) is not None)
    names = _Names([i.name for i in indexes if i.name])
    types = {col.name.lower(): col.type for col in columns}
    for idx in indexes:
        if idx.kind == "primary":
            continue
        stmts.extend(tbl.index_statements(idx, names.name_for(idx), types))
    return TranslatedDDL(stmts, "create_table", [r])


def _starts_index(c: Cursor) -> bool:
    tok = c.peek()
    if tok is None or tok.kind != "word":
        return False
    if tok.is_word("CONSTRAINT", "PRIMARY", "UNIQUE", "KEY", "INDEX", "FULLTEXT", "SPATIAL", "FOREIGN", "CHECK"):
        return True
    return tok.is_word("VECTOR", "COLUMNAR") and c.is_kw("INDEX", "KEY", k=1)


def _create_index(ctx: Context, c: Cursor) -> TranslatedDDL:
    c.accept_kw("ONLINE", "OFFLINE")
    kind_tok = c.accept_kw("UNIQUE", "FULLTEXT", "SPATIAL", "VECTOR", "COLUMNAR")
    c.expect_kw("INDEX", "KEY")
    c.accept_seq("IF", "NOT", "EXISTS")
    name = c.ident().ident
    while c.accept_kw("USING", "TYPE"):
        c.next()
    c.expect_kw("ON")
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    kind = kind_tok.upper.lower() if kind_tok else "index"
    if r is None or kind in ("fulltext", "spatial", "vector", "columnar"):
        return TranslatedDDL([], "create_index", [])  # TiFlash / full-text / spatial: performance only
    idx = IndexDef(kind, name, parse_key_parts(c))
    stmts = _Table(*r).index_statements(idx, name)
    return TranslatedDDL(stmts, "create_index", [r] if stmts else [])


# ---------------------------------------------------------------------------------------------------------
# ALTER TABLE

_TABLE_OPTION_WORDS = {
    "AUTO_INCREMENT", "AVG_ROW_LENGTH", "CHARACTER", "CHARSET", "CHECKSUM", "COLLATE", "COMMENT", "COMPRESSION",
    "CONNECTION", "DATA", "INDEX", "DELAY_KEY_WRITE", "ENCRYPTION", "ENGINE", "ENGINE_ATTRIBUTE", "INSERT_METHOD",
    "KEY_BLOCK_SIZE", "MAX_ROWS", "MIN_ROWS", "PACK_KEYS", "PASSWORD", "ROW_FORMAT", "SECONDARY_ENGINE",
    "SECONDARY_ENGINE_ATTRIBUTE", "STATS_AUTO_RECALC", "STATS_PERSISTENT", "STATS_SAMPLE_PAGES", "TABLESPACE",
    "UNION", "ALGORITHM", "LOCK", "FORCE", "ORDER", "ENABLE", "DISABLE", "WITH", "WITHOUT", "CONVERT",
    "DEFAULT", "SECONDARY_LOAD", "SECONDARY_UNLOAD",
}


def _alter_table(ctx: Context, c: Cursor) -> TranslatedDDL:
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    specs = alter_specs(c.toks, c.pos, c.end)
    tbl = _Table(*r) if r else None
    stmts: list[str] = []
    tail: list[str] = []  # the table rename, always last
    targets = [r] if r else []
    kind = "alter_table"
    names = _Names()
    only_tidb = True  # every specification was TiDB-only (or there were none): kind "other"
    for lo, hi in specs:
        sc = Cursor(c.toks, lo, hi)
        if sc.at_end:
            continue
        w = sc.peek().upper
        # RENAME TO / AS: routed even for an ignored table (a kept/ignored mix is refused)
        if w == "RENAME" and not sc.is_kw("COLUMN", "INDEX", "KEY", k=1):
            sc.next()
            sc.accept_kw("TO", "AS")
            new = ctx.table_ref(sc)
            rn = ctx.routed(new.schema, new.table)
            kind = "rename_table"
            only_tidb = False
            if (r is None) != (rn is None):
                raise _Unsupported(f"ALTER TABLE {ref.schema}.{ref.table} RENAME TO {new.schema}.{new.table} moves "
                                   "a table between a replicated name and an ignored one; change the routing rules "
                                   "so both names are replicated or both ignored", kind="rename_table")
            if rn is not None and rn != r:
                tail.extend(rename_table_statements(r, rn))
                targets.append(rn)
            continue
        if tbl is None:
            only_tidb = False
            continue
        out = _alter_spec(ctx, tbl, sc, names)
        if out is not None:
            only_tidb = False
            stmts.extend(out)
    if r is None:
        return TranslatedDDL([], kind, [])
    if only_tidb:
        return TranslatedDDL([], "other", [])
    return TranslatedDDL(stmts + tail, kind, list(dict.fromkeys(targets)))


def _alter_spec(ctx: Context, tbl: _Table, c: Cursor, names: _Names) -> list[str] | None:
    w = c.peek().upper
    nxt = c.peek(1).upper if c.peek(1) is not None else ""
    t = tbl.q
    # TiDB-only specifications: None (as opposed to [] for "nothing to do in PostgreSQL")
    if (w == "SET" and nxt in ("TIFLASH", "HYPO")) or w in ("CACHE", "NOCACHE", "COMPACT", "ATTRIBUTES") \
            or (w in ("ADD", "DROP") and nxt == "STATS_EXTENDED"):
        return None
    if w == "PARTITION" and nxt != "BY" and (c.peek(2) is None or c.is_kw("ATTRIBUTES", "SET", k=2)):
        return None
    # partitions
    if w == "PARTITION" and nxt == "BY":
        return []
    if w in ("TRUNCATE", "DROP", "EXCHANGE") and nxt == "PARTITION":
        raise _Unsupported(f"{w} PARTITION changes rows that TiCDC does not send as row changes, and the "
                           "PostgreSQL table is not partitioned; delete the affected rows on the target by hand",
                           kind="alter_table")
    if w in ("ADD", "COALESCE", "REORGANIZE", "ANALYZE", "CHECK", "OPTIMIZE", "REBUILD", "REPAIR", "DISCARD",
             "IMPORT") and nxt in ("PARTITION", "TABLESPACE"):
        return []
    if (w == "REMOVE" and nxt == "PARTITIONING") or (w in ("FIRST", "LAST") and nxt == "PARTITION") \
            or w == "PARTITION":
        return []
    if w == "ADD":
        c.next()
        if c.is_kw("VECTOR", "COLUMNAR") and c.is_kw("INDEX", "KEY", k=1):
            return None  # TiFlash-only index
        if _starts_index(c):
            idx = parse_index_def(c)
            _expect_spec_end(c)
            if idx.kind == "primary":
                if idx.has_expression:
                    raise _Unsupported("a primary key on an expression", kind="alter_table")
                return [tbl.add_primary_key([p.column for p in idx.parts])]
            return tbl.index_statements(idx, names.name_for(idx))
        c.accept_kw("COLUMN")
        c.accept_seq("IF", "NOT", "EXISTS")
        if c.is_op("("):
            lo, hi = c.skip_group()
            cols = [parse_column(Cursor(c.toks, a, b)) for a, b in split_top_level(c.toks, lo, hi)]
        else:
            cols = [parse_column(c)]
            _skip_position(c)
        _expect_spec_end(c)
        out = []
        for col in cols:
            if col.generated:
                raise _Unsupported(f"adding generated column {col.name!r}: its values for existing rows are "
                                   "computed upstream and not sent", kind="alter_table")
            if col.auto_increment:
                raise _Unsupported(f"adding AUTO_INCREMENT column {col.name!r}: the values upstream assigns to "
                                   "existing rows are not sent", kind="alter_table")
            sql, temp_default = column_sql(col, for_add=True)
            out.append(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {sql}")
            if type_comment(col.type) is not None:
                out.append(_comment_sql(tbl, col.name, col.type))
            if temp_default:
                out.append(f"ALTER TABLE {t} ALTER COLUMN {qi(col.name)} DROP DEFAULT")
            out.extend(_inline_keys(tbl, col, names))
        return out
    if w == "DROP":
        c.next()
        if c.accept_seq("PRIMARY", "KEY"):
            _expect_spec_end(c)
            return [tbl.drop_primary_key()]
        if c.accept_kw("INDEX", "KEY"):
            c.accept_seq("IF", "EXISTS")
            name = c.ident().ident
            _expect_spec_end(c)
            return [tbl.drop_index(name)]
        if c.accept_seq("FOREIGN", "KEY") or c.accept_kw("CHECK"):
            c.accept_seq("IF", "EXISTS")
            c.ident()
            _expect_spec_end(c)
            return []
        if c.accept_kw("CONSTRAINT"):
            c.accept_seq("IF", "EXISTS")
            name = c.ident().ident  # a CHECK, a foreign key or a unique key: drop the index if it is one
            _expect_spec_end(c)
            return [tbl.drop_index(name)]
        c.accept_kw("COLUMN")
        c.accept_seq("IF", "EXISTS")
        name = c.ident().ident
        c.accept_kw("RESTRICT", "CASCADE")
        _expect_spec_end(c)
        return [f"ALTER TABLE {t} DROP COLUMN IF EXISTS {qi(name)}"]
    if w in ("MODIFY", "CHANGE"):
        c.next()
        c.accept_kw("COLUMN")
        c.accept_seq("IF", "EXISTS")
        old = c.ident().ident if w == "CHANGE" else None
        col = parse_column(c)
        _skip_position(c)
        _expect_spec_end(c)
        return _modify(tbl, col, old, names)
    if w == "ALTER":
        c.next()
        if c.accept_kw("INDEX", "KEY", "CHECK", "CONSTRAINT"):
            return []  # visibility / enforcement
        c.accept_kw("COLUMN")
        name = c.ident().ident
        if c.accept_seq("SET", "DEFAULT"):
            d = parse_default(c)
            _expect_spec_end(c)
            sql = pg_default(d, None)
            if sql is None:
                return []
            return [f"ALTER TABLE {t} ALTER COLUMN {qi(name)} SET DEFAULT {sql}"]
        if c.accept_seq("DROP", "DEFAULT"):
            _expect_spec_end(c)
            return [f"ALTER TABLE {t} ALTER COLUMN {qi(name)} DROP DEFAULT"]
        if c.accept_kw("SET") and c.accept_kw("VISIBLE", "INVISIBLE"):
            return []
        raise LexError("unsupported ALTER COLUMN action")
    if w == "RENAME":
        c.next()
        if c.accept_kw("COLUMN"):
            a = c.ident().ident
            c.expect_kw("TO")
            b = c.ident().ident
            _expect_spec_end(c)
            return [f"ALTER TABLE {t} RENAME COLUMN {qi(a)} TO {qi(b)}"]
        c.expect_kw("INDEX", "KEY")
        a = c.ident().ident
        c.expect_kw("TO")
        b = c.ident().ident
        _expect_spec_end(c)
        out = [f"ALTER INDEX IF EXISTS {qn(tbl.schema, pg_index_name(tbl.table, a))} "
               f"RENAME TO {qi(pg_index_name(tbl.table, b))}"]
        if _is_hashed(tbl.table, b):
            out.append(f"COMMENT ON INDEX {qn(tbl.schema, pg_index_name(tbl.table, b))} IS {lit(b.lower())}")
        return out
    if w in _TABLE_OPTION_WORDS or w in ("CHARACTER", "CHARSET"):
        return []  # table options, ALGORITHM/LOCK, CONVERT TO CHARACTER SET, ...
    raise _Unsupported(f"ALTER TABLE ... {w} is not supported", kind="alter_table")


def _skip_position(c: Cursor) -> None:
    if c.accept_kw("FIRST"):
        return
    if c.accept_kw("AFTER"):
        c.ident()


def _expect_spec_end(c: Cursor) -> None:
    if not c.at_end:
        raise LexError(f"unexpected {c.peek().text!r}")


def _inline_keys(tbl: _Table, col: ColDef, names: _Names) -> list[str]:
    out = []
    if col.primary:
        out.append(tbl.add_primary_key([col.name]))
    if col.unique:
        idx = IndexDef("unique", None, [IndexPart(col.name)])
        out.extend(tbl.index_statements(idx, names.name_for(idx)))
    return out


def _modify(tbl: _Table, col: ColDef, old: str | None, names: _Names) -> list[str]:
    t = tbl.q
    c = qi(col.name)
    out = []
    if old is not None and old != col.name:
        out.append(f"ALTER TABLE {t} RENAME COLUMN {qi(old)} TO {c}")
    pgt = pg_type(col.type)
    out.append(f"ALTER TABLE {t} ALTER COLUMN {c} DROP DEFAULT")
    out.append(f"ALTER TABLE {t} ALTER COLUMN {c} TYPE {pgt} USING {c}::{pgt}")
    out.append(_comment_sql(tbl, col.name, col.type))  # the new members, or no comment for other types
    if col.default is not None and not col.generated:
        d = pg_default(col.default, col.type)
        if d is not None and d != "NULL":
            out.append(f"ALTER TABLE {t} ALTER COLUMN {c} SET DEFAULT {d}")
    if col.not_null or col.primary:
        out.append(f"ALTER TABLE {t} ALTER COLUMN {c} SET NOT NULL")
    else:
        out.append(tbl.drop_not_null_unless_pk(col.name))
    out.extend(_inline_keys(tbl, col, names))
    return out
