"""PostgreSQL spelling shared by the PostgreSQL translator's modules: quoted identifiers and literals, the
names MySQL indexes get, and DO blocks.

Index names: PostgreSQL index names are unique per schema, so an index ``i`` of table ``t`` is named
``t__i`` (MySQL index names are case-insensitive, so ``i`` is lower-cased; the primary key is ``t_pkey``);
when that exceeds PostgreSQL's 63-byte limit it becomes ``i_<md5(t || '.' || i)>`` (``pk_<md5(t)>``) and
the MySQL name is kept in the index's COMMENT. :func:`pg_index_name` computes the name in Python and
:func:`index_name_sql` in plpgsql, for the DO blocks that rename or copy a table's indexes.
"""

from __future__ import annotations

import hashlib

from applier.ddl.lexer import LexError

__all__ = ["qi", "qn", "lit", "pg_index_name", "is_hashed", "index_name_sql", "do_block"]

_NAME_BYTES = 63  # PostgreSQL identifiers longer than this are truncated


def qi(name: str) -> str:
    """A quoted identifier: every name is quoted, as the writers quote them, so case and keywords survive."""
    if "\0" in name:
        raise LexError("identifier contains a NUL character")
    return '"' + name.replace('"', '""') + '"'


def qn(schema: str, table: str) -> str:
    return f"{qi(schema)}.{qi(table)}"


def lit(value: str) -> str:
    """A PostgreSQL string literal (standard_conforming_strings = on, the default since 9.1)."""
    if "\0" in value:
        raise LexError("string contains a NUL character, which PostgreSQL text cannot hold")
    return "'" + value.replace("'", "''") + "'"


def pg_index_name(table: str, index: str) -> str:
    """The PostgreSQL name of MySQL index ``index`` of table ``table`` (see the module docstring)."""
    if index.upper() == "PRIMARY":
        cand = f"{table}_pkey"
        return cand if len(cand.encode()) <= _NAME_BYTES else "pk_" + hashlib.md5(table.encode()).hexdigest()
    cand = f"{table}__{index.lower()}"
    if len(cand.encode()) <= _NAME_BYTES:
        return cand
    return "i_" + hashlib.md5(f"{table}.{index.lower()}".encode()).hexdigest()


def is_hashed(table: str, index: str) -> bool:
    """Whether :func:`pg_index_name` hashes this index's name, so the MySQL name must go into its COMMENT."""
    return index.upper() != "PRIMARY" and len(f"{table}__{index.lower()}".encode()) > _NAME_BYTES


def do_block(body: str) -> str:
    """A DO block whose dollar-quote tag does not occur in the body."""
    n = 0
    tag = "$ddl$"
    while tag in body:
        n += 1
        tag = f"$ddl{n}$"
    return f"DO {tag}\n{body}\n{tag}"


def index_name_sql(table: str, var: str) -> str:
    """plpgsql expression computing pg_index_name(table, <var>) for a non-primary index."""
    prefix = lit(table + "__")
    return (f"CASE WHEN octet_length({prefix} || {var}) <= {_NAME_BYTES} THEN {prefix} || {var} "
            f"ELSE 'i_' || md5({lit(table + '.')} || {var}) END")
