"""MySQL column types and defaults in PostgreSQL: the type map, DEFAULT expressions, and the column comments
that keep what a PostgreSQL type cannot say (ENUM/SET members).

The type map and the rules for defaults are the PostgreSQL target's contract and are tabled in
``applier/ddl/postgres.py``; this module implements them for one parsed column (:mod:`applier.ddl.syntax`).
:func:`type_comment` writes a column's comment and :func:`parse_type_comment` reads it back for the writer
(``applier/sinks/postgres.py``).
"""

from __future__ import annotations

import re

from applier.ddl.base import Untranslatable
from applier.ddl.lexer import LexError
from applier.ddl.pg_sql import lit, qi
from applier.ddl.syntax import ColDef, Default, MyType

__all__ = ["TYPE_COMMENT_PREFIX", "pg_type", "pg_default", "column_sql", "type_comment", "parse_type_comment"]

_INT_TYPES = {"tinyint", "smallint", "mediumint", "int", "bigint"}
_SPATIAL = {"geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon",
            "geometrycollection", "geomcollection"}


def pg_type(t: MyType) -> str:
    """The PostgreSQL type for a parsed MySQL type (the type map in ``applier/ddl/postgres.py``)."""
    n = t.name
    args = [int(float(a)) for a in t.args]
    if n in _SPATIAL:
        raise Untranslatable(f"spatial type {n.upper()} has no PostgreSQL equivalent without PostGIS")
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
    raise Untranslatable(f"column type {n.upper()} is not supported")


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
        raise Untranslatable(f"bit default {value} is wider than BIT({width})")
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
    if k in ("number", "bool"):
        return _number_default(d.value, cat, t)
    if k == "string":
        return _string_default(d.value, cat, t)
    if k == "hex":
        return _hex_default(bytes.fromhex(d.value), cat, t)
    if k == "bit":
        return _bit_default(d.value, cat, t)
    return None


def _number_default(value: str, cat: str | None, t: MyType | None) -> str | None:
    """A numeric literal (TRUE/FALSE are 1/0): MySQL converts it to the column's type, so must we."""
    num = _number_text(value)
    if cat in ("int", "numeric", None):
        return num
    if cat in ("string", "enum", "set", "json"):
        return lit(value)
    if cat == "binary":
        return _bytes_literal(value.encode(), t)
    if cat == "bit":
        return _bits_literal(int(float(value)), t) if num and "." not in num else None
    if cat in ("date", "datetime", "timestamp"):
        return None  # 0 is the zero date; other numeric dates are not worth guessing
    if cat == "time" and num is not None and re.fullmatch(r"-?\d+", num):
        v = int(num)
        sign, v = ("-" if v < 0 else ""), abs(v)
        return lit(f"{sign}{v // 10000}:{v // 100 % 100:02d}:{v % 100:02d}")
    return None


def _string_default(v: str, cat: str | None, t: MyType | None) -> str | None:
    """A string literal; zero dates have no PostgreSQL value."""
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


def _hex_default(data: bytes, cat: str | None, t: MyType | None) -> str | None:
    """``x'..'`` / ``0x..``: bytes, read as a number or as UTF-8 text where the column wants one."""
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


def _bit_default(bits: str, cat: str | None, t: MyType | None) -> str | None:
    """``b'..'`` / ``0b..``: a number, or bytes for a binary column."""
    value = int(bits, 2) if bits else 0
    if cat == "bit":
        return _bits_literal(value, t)
    if cat in ("int", "numeric"):
        return str(value)
    if cat == "binary":
        return _bytes_literal(value.to_bytes(max(1, (len(bits) + 7) // 8), "big"), t)
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
                raise Untranslatable(f"the default of new column {col.name!r} has no PostgreSQL form, and existing "
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
