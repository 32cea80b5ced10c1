"""Schema from the stream (``[target] schema_evolution``): the DDL that makes the target ready for a row change.

Every protocol sends each row with its columns' metadata (names, types, nullability, key flags; the full type
where the protocol has it: Canal-JSON's ``mysqlType``, Simple's ``dataType``, Avro's and Debezium's parameters).
With ``create``, a row of a routed table the target lacks creates that table; with ``evolve``, a column the
stream has and the target lacks is added too. That replaces "create it by hand" for streams that start mid-way
(no CREATE TABLE was ever seen) and for protocols that carry no DDL at all (Avro, Debezium).

How it stays safe and ordered:

* The result is one MySQL statement over the *upstream* names, which the apply stage runs as a DDL event at the
  row's commit ts (:func:`schema_ddl`): the dialect's DDL translator gives it the same routing, quoting and type
  map as a CREATE TABLE that TiCDC sent, and the DDL path gives it the same exactly-once ordering (progress up to
  the row committed first, a history row, MySQL's started/done markers).
* Types come from :attr:`Column.declared`, parsed with the DDL grammar and re-rendered from the parsed parts
  (a type name from a fixed set, integer parameters, members as escaped literals): nothing from a message is
  spliced into the statement. Where a protocol sends only the type name (Open Protocol), the defaults are wide
  enough for every value of that type (strings of unknown length are long text, VARCHAR(255) in a key; DECIMAL
  of unknown precision is DECIMAL(65,30); fractional seconds 6; BIT(64)), so no value is cut. What a full type
  declares is kept: DATETIME/TIMESTAMP/TIME get the declared fractional seconds (none declared: 0, as in MySQL;
  see :func:`declares_full_types` for telling a full ``timestamp`` from a bare type name) and TINYINT(1), the
  boolean, stays TINYINT(1) (other integer display widths are dropped: MySQL 8 deprecates them).
* A table is created with the key the rows carry (primary key or TiCDC's handle key) as its primary key; a table
  whose rows carry no key is created without one (keyless tables are applied by full-row match).
* Added columns are always nullable: rows already in the target have no value for them, and a NOT NULL column
  without a default could not be added to a non-empty table.
* A type the stream declares that the target column cannot hold without loss (a wider integer, a longer string,
  more decimal digits, more fractional seconds, ENUM members the target lacks, a number into a string's place...)
  is never changed implicitly: ``evolve`` stops with the column and both types named. Only clear losses are
  judged (:func:`loss`); a type the stream does not fully declare is not compared on what it leaves out.
* Rows whose types were guessed from values (Debezium without schemas) never create or add anything: the
  message does not carry a schema.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from applier.ddl.lexer import Cursor, LexError, Statement
from applier.ddl.mysql import mysql_quote_ident
from applier.ddl.syntax import MyType, parse_type
from applier.events import DDL, Column, RowChange
from applier.mysql_values import FSP_TYPES

MODES = ("none", "create", "evolve")

#: DDL events made here carry this type, so that history and logs tell them from replicated DDL
DDL_TYPE = "schema_evolution"


class SchemaRefused(Exception):
    """The stream's schema cannot be applied to the target: the reason names the table, the column(s) and what to
    do (the apply stage adds the event's position)."""


# ---------------------------------------------------------------------------------------------------------
# Column types: declared text -> parsed type -> MySQL type text rendered from the parsed parts

_INT_BITS = {"tinyint": 8, "smallint": 16, "mediumint": 24, "int": 32, "bigint": 64}
_TEXT_BYTES = {"tinytext": 255, "text": 65535, "mediumtext": 16777215, "longtext": 4294967295,
               "tinyblob": 255, "blob": 65535, "mediumblob": 16777215, "longblob": 4294967295}
_PARAMLESS = {"tinyint", "smallint", "mediumint", "int", "bigint", "float", "double", "date", "year", "json",
              "tinytext", "text", "mediumtext", "longtext", "tinyblob", "blob", "mediumblob", "longblob"}
_LIMITS = {"char": 255, "binary": 255, "varchar": 65535, "varbinary": 65535, "bit": 64}
KEY_STRING_LENGTH = 255  # a key column of unknown length: fits an InnoDB key even with utf8mb4 and several parts


def declared_type(col: Column) -> MyType | None:
    """The column's full type as the stream declares it (:attr:`Column.declared` parsed), or None where the
    protocol sent only the type name. A declared text that does not parse, or names another type than
    ``type_name``, counts as not declared (the type name decoded and checked by the codec is what counts)."""
    if not col.declared:
        return None
    try:
        c = Cursor(Statement.lex(col.declared).sig)
        t = parse_type(c)
    except LexError:
        return None
    if not c.at_end or not _same_type(t.name, col.type_name):
        return None
    if col.unsigned:
        t.unsigned = True
    return t


def stream_type(col: Column, *, full_types: bool = False) -> MyType:
    """:func:`declared_type`, else the type name alone, widened where the name is only a family (module
    docstring): strings of unknown length are long text (Avro says TEXT for every character type), binary ones
    long blobs. ``full_types`` (:func:`declares_full_types` of the row): a DATETIME/TIMESTAMP/TIME declared
    without fractional seconds has none; otherwise it may be a bare type name, and gets the widest default."""
    t = declared_type(col)
    if t is not None:
        if full_types and t.name in FSP_TYPES and not t.args:
            t.args = ["0"]
        return t
    name = col.type_name
    if name in ("char", "varchar", "tinytext", "text", "mediumtext"):
        return MyType("longtext")
    if name in ("binary", "varbinary", "tinyblob", "blob", "mediumblob"):
        return MyType("longblob")
    return MyType(name, unsigned=col.unsigned)


def _same_type(parsed: str, name: str) -> bool:
    return parsed == name or {parsed, name} <= {"bool", "tinyint"}


def declares_full_types(columns: Sequence[Column]) -> bool:
    """Whether the row's declared types are full MySQL column types, in which a DATETIME/TIMESTAMP/TIME without
    fractional seconds means fsp 0 rather than "not said".

    Why a row-wide test: Canal-JSON declares bare type names by default (``timestamp``, ``int``) and full types
    with TiCDC's ``content-compatible`` (``timestamp``, ``int(11)``), and the codec passes either on as declared.
    A full ``timestamp`` and a bare one read the same; creating fsp 0 from a bare name would round away every
    fraction the rows carry, without an error. The two listings differ on every type that has a parameter
    (integers, strings, DECIMAL, BIT, YEAR always get one in full), so a row in which some declared type carries
    one lists full types. ENUM/SET members do not count (some TiCDC versions send them in both forms). A row whose
    every column is of a type printed without parameters cannot tell, and keeps the wide default (fsp 6). Simple,
    Avro and Debezium declare fractional seconds explicitly (``timestamp(0)``) or not at all, so this changes
    nothing for them."""
    for col in columns:
        t = declared_type(col)
        if t is not None and t.args and t.name not in ("enum", "set"):
            return True
    return False


def render_type(t: MyType, *, key: bool = False) -> str:
    """MySQL type text for ``t``, from its parts only; defaults where a parameter is unknown (module docstring).
    Raises SchemaRefused for a type that cannot be created from what the stream says."""
    n = t.name
    args = [_int_arg(a) for a in t.args]
    unsigned = " unsigned" if t.unsigned and (n in _INT_BITS or n in ("decimal", "float", "double")) else ""
    if n == "bool" or (n == "tinyint" and args == [1]):
        # TINYINT(1) is how MySQL spells a boolean, and clients (JDBC, ORMs) read it as one: keep that width
        return "tinyint(1)" + unsigned
    if n in _PARAMLESS:
        if key and n in _TEXT_BYTES:  # a TEXT/BLOB cannot be a MySQL key without a prefix length
            return ("varbinary" if "blob" in n else "varchar") + f"({KEY_STRING_LENGTH})"
        return n + unsigned
    if n in ("enum", "set"):
        if not t.values:
            raise SchemaRefused(f"the stream sends {n.upper()} values without the list of members (Open Protocol "
                                "sends ordinals only), so the column cannot be created")
        return n + "(" + ",".join(_literal(v) for v in t.values) + ")"
    if n == "decimal":
        p = args[0] if args else 65
        s = args[1] if len(args) > 1 else (0 if args else 30)
        if not (1 <= p <= 65 and 0 <= s <= min(p, 30)):
            raise SchemaRefused(f"DECIMAL({p},{s}) is outside MySQL's DECIMAL (precision 1-65, scale 0-30)")
        return f"decimal({p},{s}){unsigned}"
    if n in ("datetime", "timestamp", "time"):
        fsp = args[0] if args else 6
        if not 0 <= fsp <= 6:
            raise SchemaRefused(f"{n.upper()}({fsp}): fractional seconds must be 0-6")
        return f"{n}({fsp})"
    if n in _LIMITS:
        if not args:
            if n == "bit":
                return "bit(64)"
            if key:
                return ("varbinary" if n in ("binary", "varbinary") else "varchar") + f"({KEY_STRING_LENGTH})"
            return "longblob" if n in ("binary", "varbinary") else "longtext"
        length = args[0]
        if not (1 if n == "bit" else 0) <= length <= _LIMITS[n]:
            raise SchemaRefused(f"{n.upper()}({length}) is outside MySQL's limit for {n.upper()}")
        return f"{n}({length})"
    raise SchemaRefused(f"column type {n.upper()} cannot be created from the stream")


def _int_arg(text: str) -> int:
    if not text.isdigit() or len(text) > 6:
        raise SchemaRefused(f"type parameter {text[:20]!r} is not a small whole number")
    return int(text)


def _literal(v: str) -> str:
    if "\0" in v:
        raise SchemaRefused("an ENUM/SET member holds a NUL character")
    return "'" + v.replace("\\", "\\\\").replace("'", "''") + "'"


def column_sql(col: Column, *, key: bool, nullable: bool | None = None, full_types: bool = False) -> str:
    """One MySQL column definition: quoted name, type, NULL/NOT NULL (keys are NOT NULL). ``full_types``: see
    :func:`stream_type`."""
    null = (col.nullable and not key) if nullable is None else nullable
    typ = render_type(stream_type(col, full_types=full_types), key=key)
    return f"{mysql_quote_ident(col.name)} {typ} {'NULL' if null else 'NOT NULL'}"


# ---------------------------------------------------------------------------------------------------------
# Statements over upstream names (the translator routes them)


def _table(schema: str, table: str) -> str:
    return f"{mysql_quote_ident(schema)}.{mysql_quote_ident(table)}" if schema else mysql_quote_ident(table)


def create_table_sql(schema: str, table: str, columns: Sequence[Column],
                     extra: Sequence[tuple[str, str, bool]] = (), key: Sequence[str] | None = None) -> str:
    """``CREATE TABLE`` for a row's columns. ``extra``: further columns as (name, MySQL type, nullable), for a
    route mode's own columns; ``key``: the primary key when it is not the columns' key flags (route modes)."""
    _check_names(schema, table, columns)
    keys = tuple(c.name for c in columns if c.key) if key is None else tuple(key)
    full = declares_full_types(columns)
    parts = [_named(schema, table, c, lambda c: column_sql(c, key=c.name in keys, full_types=full)) for c in columns]
    parts += [f"{mysql_quote_ident(n)} {t} {'NULL' if null else 'NOT NULL'}" for n, t, null in extra]
    if keys:
        parts.append("PRIMARY KEY (" + ", ".join(mysql_quote_ident(k) for k in keys) + ")")
    return f"CREATE TABLE {_table(schema, table)} (" + ", ".join(parts) + ")"


def add_columns_sql(schema: str, table: str, columns: Sequence[Column], *, full_types: bool | None = None) -> str:
    """``ALTER TABLE ... ADD COLUMN`` for columns the stream has and the target lacks (always nullable).
    ``full_types``: :func:`declares_full_types` of the whole row (the added columns alone may not tell); None:
    judged from ``columns``."""
    _check_names(schema, table, columns)
    full = declares_full_types(columns) if full_types is None else full_types
    adds = ", ".join(_named(schema, table, c,
                            lambda c: f"ADD COLUMN {column_sql(c, key=False, nullable=True, full_types=full)}")
                     for c in columns)
    return f"ALTER TABLE {_table(schema, table)} {adds}"


def _named(schema: str, table: str, col: Column, render: Callable[[Column], str]) -> str:
    """``render(col)``, a refusal naming the upstream table and the column."""
    try:
        return render(col)
    except SchemaRefused as exc:
        raise SchemaRefused(f"column {col.name!r} of upstream table {schema}.{table}: {exc}") from None


def _check_names(schema: str, table: str, columns: Sequence[Column]) -> None:
    for what, name in [("schema", schema), ("table", table)] + [("column", c.name) for c in columns]:
        if len(name) > 64 or "\0" in name or (not name and what != "schema"):
            raise SchemaRefused(f"{what} name {name[:80]!r} cannot be a MySQL/TiDB name (empty, over 64 characters "
                                "or holding a NUL)")


# ---------------------------------------------------------------------------------------------------------
# Deciding what a row needs


@dataclass(frozen=True)
class TargetShape:
    """What the apply stage knows of a target table: its columns and their catalog types."""

    columns: frozenset[str]
    types: dict[str, str]


def needed(mode: str, ev: RowChange, target: TargetShape | None, *, dialect: str,
           extra: Sequence[tuple[str, str, bool]] = (), key: Sequence[str] | None = None) -> str | None:
    """The MySQL DDL (upstream names) the target needs before ``ev`` can be written, or None.

    ``target`` is None when the routed table does not exist. Raises SchemaRefused when the stream's schema
    cannot be applied (see the module docstring)."""
    if mode == "none":
        return None
    cols = ev.columns
    if target is None:
        _declared_schema(ev, "create the missing target table")
        return create_table_sql(ev.schema, ev.table, cols, extra, key)
    if mode != "evolve":
        return None
    losses = [(c, target.types[c.name], why) for c in cols if c.name in target.types
              for t in [declared_type(c)] if t is not None
              for why in [loss(t, target.types[c.name], dialect)] if why]
    if losses:
        c, ttype, why = losses[0]
        more = f" (and {len(losses) - 1} more column(s))" if len(losses) > 1 else ""
        raise SchemaRefused(
            f"column {c.name!r} of upstream table {ev.schema}.{ev.table} is {render_safe(c)} in the stream but "
            f"{ttype} in the target: {why}{more}. Type changes that could lose data are never applied implicitly: "
            "change the target column by hand (ALTER TABLE ... MODIFY/ALTER COLUMN), then restart")
    missing = [c for c in cols if c.name not in target.columns]
    if not missing:
        return None
    _declared_schema(ev, "add the new column(s)")
    return add_columns_sql(ev.schema, ev.table, missing, full_types=declares_full_types(cols))


def _declared_schema(ev: RowChange, what: str) -> None:
    if not ev.columns or any(c.inferred for c in ev.columns):
        raise SchemaRefused(f"the messages of upstream table {ev.schema}.{ev.table} carry no schema (types guessed "
                            f"from values), so the applier cannot {what}: create or alter the target table by hand, "
                            "or send the stream with schemas, then restart")


def render_safe(col: Column) -> str:
    try:
        return render_type(stream_type(col))
    except SchemaRefused:
        return col.type_name


def schema_ddl(ev: RowChange, query: str) -> DDL:
    """The DDL event the apply stage runs for ``query`` (from :func:`needed`) at ``ev``'s commit ts and position."""
    return DDL(schema=ev.schema, table=ev.table, commit_ts=ev.commit_ts, query=query, position=ev.position,
               ddl_type=DDL_TYPE)


# ---------------------------------------------------------------------------------------------------------
# Lossy type changes


@dataclass(frozen=True)
class Capacity:
    """What a column type can hold, as far as :func:`loss` compares it. None: unbounded or not known."""

    family: str  # int decimal float string binary date datetime time year enum set bit json other
    lo: int | None = None  # int: range
    hi: int | None = None
    digits: int | None = None  # decimal: integer digits (precision - scale)
    scale: int | None = None  # decimal: scale; datetime/time: fractional seconds
    size: int | None = None  # string: characters; binary: bytes; bit: bits; float: 24 or 53
    text_bytes: int | None = None  # string/binary: a TEXT/BLOB family's byte limit
    members: tuple[str, ...] | None = None  # enum/set


def mysql_capacity(t: MyType) -> Capacity:
    n = t.name
    args = [int(a) for a in t.args if a.isdigit()]
    if n in _INT_BITS or n == "bool":
        bits = _INT_BITS.get(n, 8)
        return Capacity("int", *( (0, (1 << bits) - 1) if t.unsigned else (-(1 << bits - 1), (1 << bits - 1) - 1)))
    if n == "decimal":
        p = args[0] if args else None
        s = args[1] if len(args) > 1 else (0 if args else None)
        return Capacity("decimal", digits=None if p is None or s is None else p - s, scale=s)
    if n in ("float", "double"):
        return Capacity("float", size=53 if n == "double" or (args and args[0] > 24) else 24)
    if n in ("char", "varchar"):
        return Capacity("string", size=args[0] if args else None)
    if n in ("tinytext", "text", "mediumtext", "longtext"):
        return Capacity("string", text_bytes=_TEXT_BYTES[n])
    if n in ("binary", "varbinary"):
        return Capacity("binary", size=args[0] if args else None)
    if n in ("tinyblob", "blob", "mediumblob", "longblob"):
        return Capacity("binary", text_bytes=_TEXT_BYTES[n])
    if n in ("datetime", "timestamp", "time"):
        return Capacity("time" if n == "time" else "datetime", scale=args[0] if args else 0)
    if n in ("enum", "set"):
        return Capacity(n, members=tuple(t.values))
    if n == "bit":
        return Capacity("bit", size=args[0] if args else 1)
    if n in ("date", "year", "json"):
        return Capacity(n)
    return Capacity("other")


_PG_ARGS = re.compile(r"\((\d+)(?:,\s*(\d+))?\)")


def pg_capacity(text: str) -> Capacity:
    """Capacity of a PostgreSQL ``format_type()`` text (or the ``enum(...)``/``set(...)`` the writer reads from the
    column comment)."""
    t = text.strip().lower()
    if t.startswith(("enum(", "set(")):
        try:
            return mysql_capacity(parse_type(Cursor(Statement.lex(t).sig)))
        except LexError:
            return Capacity("other")
    m = _PG_ARGS.search(t)
    arg = [int(x) for x in m.groups() if x is not None] if m else []
    base = t.partition("(")[0].strip()
    if base in ("smallint", "integer", "bigint"):
        bits = {"smallint": 16, "integer": 32, "bigint": 64}[base]
        return Capacity("int", -(1 << bits - 1), (1 << bits - 1) - 1)
    if base == "numeric":
        if not arg:
            return Capacity("decimal")
        p, s = arg[0], arg[1] if len(arg) > 1 else 0
        return Capacity("decimal", digits=p - s, scale=s)
    if base in ("real", "double precision"):
        return Capacity("float", size=24 if base == "real" else 53)
    if base in ("character varying", "character", "varchar", "char"):
        return Capacity("string", size=arg[0] if arg else None)
    if base == "text":
        return Capacity("string")
    if base == "bytea":
        return Capacity("binary")
    if base.startswith("timestamp"):
        return Capacity("datetime", scale=arg[0] if arg else 6)
    if base.startswith(("interval", "time")):
        return Capacity("time", scale=arg[0] if arg else 6)
    if base in ("bit varying", "bit"):
        return Capacity("bit", size=arg[0] if arg else None)
    if base in ("json", "jsonb"):
        return Capacity("json")
    if base == "date":
        return Capacity("date")
    return Capacity("other")


def target_capacity(type_text: str, dialect: str) -> Capacity:
    if dialect == "postgresql":
        return pg_capacity(type_text)
    try:
        return mysql_capacity(parse_type(Cursor(Statement.lex(type_text).sig)))
    except LexError:
        return Capacity("other")


_NUMERIC = ("int", "decimal", "float")
_DIGITS_OF_INT = {8: 3, 16: 5, 24: 8, 32: 10, 64: 20}


def loss(stream: MyType, target_type: str, dialect: str) -> str | None:
    """Why a target column of ``target_type`` cannot hold every value of the stream's type, or None. Only clear
    losses count: what the stream leaves undeclared (a length, a precision) is not compared."""
    s = mysql_capacity(stream)
    declared = _declared_parts(stream)
    t = target_capacity(target_type, dialect)
    f, g = s.family, t.family
    if g == "other" or f == "other":
        return None
    if g == "int":
        if f == "int":
            if s.lo < t.lo or s.hi > t.hi:  # type: ignore[operator]
                return f"integers up to {s.hi} (from {s.lo}) do not fit"
            return None
        if f == "year" or (f == "bit" and t.hi is not None and s.size is not None and (1 << s.size) - 1 <= t.hi):
            return None
        return f"{_family(f)} values do not fit an integer column"
    if g == "decimal":
        if f == "int":
            need = len(str(max(abs(s.lo), s.hi)))  # type: ignore[arg-type]
            return f"integers of {need} digits do not fit" if t.digits is not None and need > t.digits else None
        if f == "decimal":
            if "scale" in declared and t.scale is not None and s.scale is not None and s.scale > t.scale:
                return f"a scale of {s.scale} does not fit {t.scale}"
            if "precision" in declared and t.digits is not None and s.digits is not None and s.digits > t.digits:
                return f"{s.digits} integer digits do not fit {t.digits}"
            return None
        return f"{_family(f)} values do not fit a decimal column" if f not in ("year", "bit") else None
    if g == "float":
        if f == "float" and (s.size or 0) > (t.size or 53):
            return "double-precision values do not fit a single-precision column"
        return None if f in _NUMERIC or f in ("year", "bit") else f"{_family(f)} values do not fit a float column"
    if g == "string":
        if f == "binary":
            return "binary values do not fit a character column"
        if f != "string":
            return None
        if s.size is not None and t.size is not None and s.size > t.size:
            return f"strings of {s.size} characters do not fit {t.size}"
        if s.text_bytes is not None and t.size is not None and s.text_bytes > t.size * 4:
            return f"text of up to {s.text_bytes} bytes does not fit {t.size} characters"
        if s.text_bytes is not None and t.text_bytes is not None and s.text_bytes > t.text_bytes:
            return f"text of up to {s.text_bytes} bytes does not fit {t.text_bytes}"
        if s.size is not None and t.text_bytes is not None and s.size * 4 > t.text_bytes:
            return f"strings of {s.size} characters do not fit {t.text_bytes} bytes"
        return None
    if g == "binary":
        if f != "binary":
            return None
        if s.size is not None and t.size is not None and s.size > t.size:
            return f"binary values of {s.size} bytes do not fit {t.size}"
        if s.text_bytes is not None and (t.size is not None or (t.text_bytes or 0) and s.text_bytes > t.text_bytes):
            return f"binary values of up to {s.text_bytes} bytes do not fit"
        return None
    if g in ("datetime", "time", "date"):
        if f in ("datetime", "time") and g == f:
            if "fsp" in declared and s.scale is not None and t.scale is not None and s.scale > t.scale:
                return f"{s.scale} fractional-second digits do not fit {t.scale}"
            return None
        if f == "datetime" and g == "date":
            return "the time of day does not fit a date column"
        return f"{_family(f)} values do not fit a {g} column" if f in _NUMERIC + ("string", "binary", "json") else None
    if g in ("enum", "set"):
        if f in ("enum", "set") and s.members is not None and t.members is not None:
            gone = [m for m in s.members if m not in t.members]
            if gone:
                return f"member(s) {', '.join(repr(m) for m in gone[:5])} are not in the target's list"
            return None
        return f"{_family(f)} values do not fit an {g.upper()} column" if f in ("string", "int", "decimal") else None
    if g == "bit":
        if f == "bit" and s.size is not None and t.size is not None and s.size > t.size:
            return f"{s.size} bits do not fit {t.size}"
        return None
    return None


def _declared_parts(t: MyType) -> set[str]:
    out: set[str] = set()
    if t.name == "decimal" and t.args:
        out.add("precision")
        if len(t.args) > 1:
            out.add("scale")
    if t.name in ("datetime", "timestamp", "time") and t.args:
        out.add("fsp")
    return out


def _family(f: str) -> str:
    return {"int": "integer", "decimal": "decimal", "float": "floating-point", "string": "character",
            "binary": "binary", "datetime": "date-time", "time": "time", "json": "JSON"}.get(f, f.upper())
