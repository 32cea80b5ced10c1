"""The target table as the writers see it: its shape (columns, key), read from the database, and the error that
names it.

Keys come from the *target* table (its primary key, else a unique key over NOT NULL columns), reflected once
and cached until a DDL touches the table, so the writer never trusts a protocol's key flags for the SQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from sqlalchemy import Column as SAColumn, MetaData, Table, inspect
from sqlalchemy.types import NullType
from sqlalchemy.engine import Connection
from sqlalchemy.exc import NoSuchTableError


class ApplyError(Exception):
    """A change cannot be applied; the message names the table, the event's position and what to do."""


@dataclass
class TableMeta:
    schema: str
    name: str
    table: Table
    columns: tuple[str, ...]
    writable: frozenset[str]
    key: tuple[str, ...]
    unique_sets: tuple[tuple[str, ...], ...]  # every unique key, the primary key included
    types: dict[str, str] = field(default_factory=dict)  # column -> the catalog's type ("bit varying(5)", "enum('a','b')")
    type_oids: dict[str, int] = field(default_factory=dict)  # column -> its type's oid, where the dialect has them (PostgreSQL)

    @property
    def display(self) -> str:
        return shown(self.schema, self.name)


def shown(*parts: str | None) -> str:
    """A dotted name as an operator can read and paste it: names come from upstream, and a control character
    (a NUL from a hostile message) is escaped instead of reaching the terminal or log as is."""
    return ".".join(p if p.isprintable() else p.encode("unicode_escape").decode("ascii") for p in parts if p)


class MissingTable(ApplyError):
    """The target table does not exist (``[target] schema_evolution`` may create it)."""


def missing_table(schema: str | None, name: str) -> ApplyError:
    return MissingTable(
        f"target table {shown(schema, name)} does not exist: replicate its CREATE TABLE "
        "(start the changefeed before the table is created) or create it in the target before the applier "
        "reaches its rows"
    )


def build_meta(schema: str, name: str, columns: Sequence[tuple[str, bool, bool]], pk: tuple[str, ...],
               uniques: Sequence[tuple[str, ...]]) -> TableMeta:
    """A TableMeta from catalog facts: columns as (name, nullable, generated), the primary key, unique keys."""
    table = Table(name, MetaData(), *(SAColumn(c, NullType, primary_key=c in pk, nullable=nullable)
                                      for c, nullable, _ in columns), schema=schema or None)
    nullable = {c: n for c, n, _ in columns}
    key = pk
    if not key:
        key = next((u for u in uniques if all(not nullable.get(c, True) for c in u)), ())
    all_uniques = tuple(([pk] if pk else []) + [u for u in uniques if u != pk])
    return TableMeta(schema=schema or "", name=name, table=table, columns=tuple(c for c, _, _ in columns),
                     writable=frozenset(c for c, _, gen in columns if not gen), key=key, unique_sets=all_uniques)


def reflect_table(conn: Connection, schema: str | None, name: str) -> TableMeta:
    """Read the target table's columns and keys from the database catalog."""
    md = MetaData()
    try:
        table = Table(name, md, schema=schema or None, autoload_with=conn)
    except NoSuchTableError:
        raise missing_table(schema, name) from None
    insp = inspect(conn)
    pk = tuple(c.name for c in table.primary_key.columns)
    uniques: list[tuple[str, ...]] = []
    for uc in insp.get_unique_constraints(name, schema=schema or None):
        cols = tuple(uc["column_names"])
        if cols and cols not in uniques:
            uniques.append(cols)
    for ix in insp.get_indexes(name, schema=schema or None):
        cols = tuple(c for c in ix.get("column_names", []) if c)
        if ix.get("unique") and cols and cols not in uniques:
            uniques.append(cols)
    key = pk
    if not key:
        for cols in uniques:
            if all(not table.c[c].nullable for c in cols):
                key = cols
                break
    generated = {c.name for c in table.columns if c.computed is not None}
    all_uniques = tuple(([pk] if pk else []) + [u for u in uniques if u != pk])
    return TableMeta(
        schema=schema or "", name=name, table=table, columns=tuple(c.name for c in table.columns),
        writable=frozenset(c.name for c in table.columns if c.name not in generated), key=key,
        unique_sets=all_uniques,
    )
