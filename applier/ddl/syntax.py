"""The MySQL/TiDB DDL grammar both translators read: column types, column definitions and defaults, index
definitions, and the split of ALTER TABLE into its specifications.

Parsing yields small models (:class:`MyType`, :class:`Default`, :class:`ColDef`, :class:`IndexDef`). The
PostgreSQL translator renders DDL from them; the MySQL translator keeps the statement text and reads them only
to check what MariaDB refuses. :func:`alter_summary` names the kinds of clause of an ALTER TABLE
(``TranslatedDDL.alters``) for both translators, so that one ALTER is judged the same whatever the target.

Everything here works on the neutralised statement (``applier/ddl/tidb.py``) and raises
:class:`~applier.ddl.lexer.LexError` on what it cannot read (but :func:`alter_summary`, which calls it "other");
it knows nothing of routing or targets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from applier.ddl.lexer import Cursor, LexError, Token, split_top_level
from applier.ddl.tidb import tidb_only_spec

__all__ = [
    "MyType",
    "Default",
    "ColDef",
    "IndexPart",
    "IndexDef",
    "parse_type",
    "parse_default",
    "parse_column",
    "parse_key_parts",
    "parse_index_def",
    "starts_index",
    "alter_specs",
    "AlterSummary",
    "alter_summary",
]


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
    check: bool = False  # an inline CHECK constraint (MySQL enforces it; PostgreSQL does not get it)


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


# ---------------------------------------------------------------------------------------------------------
# Column types

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
        raise LexError(f"unknown column type {tok.text}")
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
            col.check = True
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


# ---------------------------------------------------------------------------------------------------------
# Index definitions


def starts_index(c: Cursor) -> bool:
    """Does an index or constraint, rather than a column, start at the cursor (an element of CREATE TABLE's
    column list, or what follows ALTER TABLE .. ADD)?"""
    tok = c.peek()
    if tok is None or tok.kind != "word":
        return False
    if tok.is_word("CONSTRAINT", "PRIMARY", "UNIQUE", "KEY", "INDEX", "FULLTEXT", "SPATIAL", "FOREIGN", "CHECK"):
        return True
    return tok.is_word("VECTOR", "COLUMNAR") and c.is_kw("INDEX", "KEY", k=1)


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


# ---------------------------------------------------------------------------------------------------------
# ALTER TABLE specifications

_PARTITION_OPS = ("PARTITION", "ADD", "DROP", "TRUNCATE", "COALESCE", "REORGANIZE", "EXCHANGE", "ANALYZE",
                  "CHECK", "OPTIMIZE", "REBUILD", "REPAIR", "DISCARD", "IMPORT", "REMOVE", "FIRST", "LAST")


def alter_specs(sig: Sequence[Token], lo: int, hi: int) -> list[tuple[int, int]]:
    """The comma-separated ALTER TABLE specifications; partition maintenance is one spec (it has commas)."""
    if lo >= hi:
        return []
    first = sig[lo]
    second = sig[lo + 1] if lo + 1 < hi else None
    if first.is_word(*_PARTITION_OPS) and (
            first.is_word("PARTITION", "REMOVE", "FIRST", "LAST")
            or (second is not None and second.is_word("PARTITION", "PARTITIONING"))):
        if not (first.is_word("PARTITION") and second is not None and second.is_word("BY")):
            return [(lo, hi)]
    # a trailing PARTITION BY clause belongs to the last spec: its commas are inside parentheses
    return split_top_level(sig, lo, hi)


# ---------------------------------------------------------------------------------------------------------
# What an ALTER TABLE does, clause by clause


@dataclass(frozen=True)
class AlterSummary:
    """The kinds of clause of one ALTER TABLE (names of ``applier.ddl.base.ALTER_CLAUSES``) and the columns it
    adds: what a caller merging shards needs to judge the statement, read from the upstream text."""

    clauses: frozenset[str] = frozenset()
    added_columns: tuple[str, ...] = ()


# table options: each is read as its keyword(s), an optional ``=`` and one value (a token or a group)
_TABLE_OPTIONS = frozenset({
    "AUTO_INCREMENT", "AUTOEXTEND_SIZE", "AVG_ROW_LENGTH", "CHARSET", "CHECKSUM", "COLLATE", "COMMENT",
    "COMPRESSION", "CONNECTION", "DELAY_KEY_WRITE", "ENCRYPTION", "ENGINE", "ENGINE_ATTRIBUTE", "INSERT_METHOD",
    "KEY_BLOCK_SIZE", "MAX_ROWS", "MIN_ROWS", "PACK_KEYS", "PASSWORD", "ROW_FORMAT", "SECONDARY_ENGINE",
    "SECONDARY_ENGINE_ATTRIBUTE", "STATS_AUTO_RECALC", "STATS_PERSISTENT", "STATS_SAMPLE_PAGES", "TABLESPACE",
    "STORAGE", "TYPE", "UNION",
})
_TWO_WORD_OPTIONS = {"CHARACTER": "SET", "DATA": "DIRECTORY", "INDEX": "DIRECTORY"}


def alter_summary(sig: Sequence[Token], specs: Sequence[tuple[int, int]]) -> AlterSummary:
    """Name the clauses of the ALTER TABLE specifications ``specs`` (from :func:`alter_specs`) of ``sig``.

    TiDB-only specifications are left out, as both translators leave them out of the target statement. Never
    raises: the MySQL translator passes through text this grammar does not fully read, so what cannot be read is
    reported as "other" rather than refused here."""
    clauses: set[str] = set()
    added: list[str] = []
    for lo, hi in specs:
        if lo >= hi or tidb_only_spec(sig, lo, hi):
            continue
        try:
            _spec_clauses(sig, lo, hi, clauses, added)
        except LexError:
            clauses.add("other")
    return AlterSummary(frozenset(clauses), tuple(dict.fromkeys(added)))


def _spec_clauses(sig: Sequence[Token], lo: int, hi: int, clauses: set[str], added: list[str]) -> None:
    """Add the clause kinds of one specification sig[lo:hi] to ``clauses`` (and added columns to ``added``)."""
    # a trailing PARTITION BY belongs to the statement, not to the specification it follows (see alter_specs)
    depth = 0
    for i in range(lo, hi):
        t = sig[i]
        depth += 1 if t.is_op("(") else -1 if t.is_op(")") else 0
        if depth == 0 and i > lo and t.is_word("PARTITION") and i + 1 < hi and sig[i + 1].is_word("BY"):
            clauses.add("partition")
            hi = i
            break
    c = Cursor(sig, lo, hi)
    w = sig[lo].upper
    nxt = sig[lo + 1].upper if lo + 1 < hi else ""
    if w in ("PARTITION", "REMOVE", "FIRST", "LAST") or (
            w in _PARTITION_OPS + ("UPGRADE",) and nxt in ("PARTITION", "PARTITIONING")):
        clauses.add("partition")
    elif w == "ADD":
        c.next()
        _add_clauses(c, clauses, added)
    elif w == "DROP":
        c.next()
        _drop_clauses(c, clauses)
    elif w in ("MODIFY", "CHANGE"):
        c.next()
        c.accept_kw("COLUMN")
        c.accept_seq("IF", "EXISTS")
        old = c.ident().ident if w == "CHANGE" else None
        clauses.add("modify_column")  # CHANGE restates the whole definition, whatever it renames
        name = _column_clauses(c, clauses)
        if old is not None and old != name:
            clauses.add("rename_column")
    elif w == "ALTER":
        c.next()
        if c.accept_kw("INDEX", "KEY", "CHECK", "CONSTRAINT"):
            clauses.add("other")  # index visibility, constraint enforcement
            return
        c.accept_kw("COLUMN")
        c.ident()
        if c.accept_seq("SET", "DEFAULT") or c.accept_seq("DROP", "DEFAULT"):
            clauses.add("alter_column_default")
        else:
            clauses.add("other")  # SET VISIBLE / INVISIBLE
    elif w == "RENAME":
        clauses.add({"COLUMN": "rename_column", "INDEX": "rename_index", "KEY": "rename_index"}.get(
            nxt, "rename_table"))
    elif w == "CONVERT":
        clauses.update(("modify_column", "table_option"))  # every character column, and the table default
    elif w in _TABLE_OPTIONS or w in _TWO_WORD_OPTIONS or w == "DEFAULT":
        _table_option_clauses(c, clauses)
    else:
        clauses.add("other")  # ALGORITHM, LOCK, FORCE, ORDER BY, ENABLE|DISABLE KEYS, [DISCARD|IMPORT] TABLESPACE


def _add_clauses(c: Cursor, clauses: set[str], added: list[str]) -> None:
    """After ADD: columns (one, or a parenthesised list, which MySQL lets hold keys too) or one index/key."""
    if not c.accept_kw("COLUMN") and starts_index(c):
        _key_clause(c, clauses)
        return
    c.accept_seq("IF", "NOT", "EXISTS")
    if not c.is_op("("):
        clauses.add("add_column")
        added.append(_column_clauses(c, clauses))
        return
    lo, hi = c.skip_group()
    for a, b in split_top_level(c.toks, lo, hi):
        ec = Cursor(c.toks, a, b)
        if starts_index(ec):
            _key_clause(ec, clauses)
        else:
            clauses.add("add_column")
            added.append(_column_clauses(ec, clauses))


def _key_clause(c: Cursor, clauses: set[str]) -> None:
    """An index or constraint definition (what follows ADD): its leading words say which (as for
    :func:`parse_index_def`), and the rest need not be readable for that."""
    if c.accept_kw("CONSTRAINT") and not c.is_kw("PRIMARY", "UNIQUE", "FOREIGN", "CHECK"):
        c.ident()  # the constraint's symbol
    if c.is_kw("PRIMARY"):
        clauses.add("add_primary_key")
    elif c.is_kw("FOREIGN"):
        clauses.add("add_foreign_key")
    elif c.is_kw("CHECK"):
        clauses.add("add_check")
    else:
        clauses.add("add_index")  # INDEX, KEY, UNIQUE, FULLTEXT, SPATIAL


def _column_clauses(c: Cursor, clauses: set[str]) -> str:
    """A column definition (ADD, MODIFY, CHANGE's new one): its name, and the keys or checks it adds inline.
    One the grammar cannot read still has its name, but may add anything: "other"."""
    start = c.pos
    try:
        col = parse_column(c)
    except LexError:
        clauses.add("other")
        return Cursor(c.toks, start, c.end).ident().ident
    if col.primary:
        clauses.add("add_primary_key")
    if col.unique:
        clauses.add("add_index")
    if col.check:
        clauses.add("add_check")
    return col.name


def _drop_clauses(c: Cursor, clauses: set[str]) -> None:
    """After DROP (DROP PARTITION and DROP STATS_EXTENDED are the caller's)."""
    if c.accept_seq("PRIMARY", "KEY"):
        clauses.add("drop_primary_key")
    elif c.accept_kw("INDEX", "KEY"):
        c.accept_seq("IF", "EXISTS")
        primary = c.ident().ident.upper() == "PRIMARY"  # MySQL's name of the primary key
        clauses.add("drop_primary_key" if primary else "drop_index")
    elif c.accept_seq("FOREIGN", "KEY"):
        clauses.add("drop_foreign_key")
    elif c.accept_kw("CHECK"):
        clauses.add("drop_check")
    elif c.accept_kw("CONSTRAINT"):
        c.accept_seq("IF", "EXISTS")
        if c.ident().ident.upper() == "PRIMARY":
            clauses.add("drop_primary_key")
        else:  # a unique key, a foreign key or a check: the statement does not say which
            clauses.update(("drop_index", "drop_foreign_key", "drop_check"))
    else:
        c.accept_kw("COLUMN")
        c.accept_seq("IF", "EXISTS")
        c.ident()
        c.accept_kw("RESTRICT", "CASCADE")
        clauses.add("drop_column" if c.at_end else "other")


def _table_option_clauses(c: Cursor, clauses: set[str]) -> None:
    """Space-separated table options (``ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COMMENT 'x'``)."""
    while not c.at_end:
        c.accept_kw("DEFAULT")
        tok = c.next()
        if tok.upper in _TWO_WORD_OPTIONS:
            c.expect_kw(_TWO_WORD_OPTIONS[tok.upper])
        elif tok.upper not in _TABLE_OPTIONS:
            clauses.add("other")
            return
        c.accept_op("=")
        if c.is_op("("):
            c.skip_group()
        else:
            c.next()
        clauses.add("table_option")


def column_list(c: Cursor) -> tuple[list[ColDef], list[IndexDef]]:
    """The columns and the indexes of CREATE TABLE's list; a column's inline PRIMARY KEY / UNIQUE becomes a
    table-level key, so that keys are rendered in one place."""
    if not c.is_op("("):
        raise LexError("expected the column list")
    lo, hi = c.skip_group()
    columns: list[ColDef] = []
    indexes: list[IndexDef] = []
    for a, b in split_top_level(c.toks, lo, hi):
        ec = Cursor(c.toks, a, b)
        if ec.at_end:
            raise LexError("empty element in the column list")
        if starts_index(ec):
            indexes.append(parse_index_def(ec))
        else:
            columns.append(parse_column(ec))
        if not ec.at_end:
            raise LexError(f"unexpected {ec.peek().text!r}")
    for col in columns:
        if col.primary:
            indexes.insert(0, IndexDef("primary", "PRIMARY", [IndexPart(col.name)]))
        if col.unique:
            indexes.append(IndexDef("unique", None, [IndexPart(col.name)]))
    return columns, indexes
