"""What every target writer shares: the target table's shape, and turning ordered row changes into one
idempotent batch (deletes, then upserts).

A batch is planned per target table from row changes already in commit order. Several versions of one key
collapse to the last one: this is safe because a batch is always written inside the transaction that also
records the progress, so no reader sees the intermediate states and a crash rolls it all back (invariant 6).

Keys come from the *target* table (its primary key, else a unique key over NOT NULL columns), reflected once
and cached until a DDL touches the table, so the writer never trusts a protocol's key flags for the SQL.
An update that changes the primary key or any unique key is a delete of the old row and an insert of the new
one, deletes first (invariant 5): a key that saw a delete or such an update anywhere in the batch is deleted
in the delete phase and, if it has a final row, re-inserted in the upsert phase. That keeps unique-key swaps
and moves inside one batch from colliding.
"""

from __future__ import annotations

import abc
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from sqlalchemy import Column as SAColumn, MetaData, Table, inspect
from sqlalchemy.types import NullType
from sqlalchemy.engine import Connection
from sqlalchemy.exc import NoSuchTableError

from applier.events import Op, RowChange


# For SQL text we build ourselves (DDL, staging): send it as written, so a literal % (in a comment, a default
# or a quoted name) is not taken for a driver placeholder.
VERBATIM = {"no_parameters": True}


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


def missing_table(schema: str | None, name: str) -> ApplyError:
    return ApplyError(
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


@dataclass
class BatchPlan:
    """One table's share of an applied window, ready for the writer."""

    meta: TableMeta
    deletes: list[tuple[Any, ...]] = field(default_factory=list)  # key tuples, in meta.key order
    upserts: list[dict[str, Any]] = field(default_factory=list)  # full rows, writable columns only
    changes: int = 0  # row changes that went into it (before collapsing)
    # replace mode: per non-key unique key, the values the upserts will hold; rows holding them go first
    unique_clears: dict[tuple[str, ...], list[tuple[Any, ...]]] = field(default_factory=dict)


def plan_batch(meta: TableMeta, changes: Sequence[RowChange], *, replace: bool = False) -> BatchPlan:
    """Collapse ordered row changes of one table into deletes then upserts (see the module docstring).

    ``replace`` (used where there is no commit ts to order by, i.e. ungated protocols, whose at-least-once
    replays can bring an older row back while another row holds its unique value): before the upserts, rows
    holding any of their non-key unique values are deleted, as TiCDC's own safe mode (REPLACE) does.

    This runs once per row change, so the common case is kept cheap: key tuples come from a C-level getter
    (:func:`_key` only runs to word the error when that fails), and whether a row's columns are all writable
    is decided once per column-name tuple (:func:`_writable_row` only runs for rows that need filtering or
    hold unknown columns). Upsert rows are copies of the events' dicts, because writers adapt them in place."""
    if not meta.key:
        first = changes[0]
        raise ApplyError(
            f"target table {meta.display} has no primary key and no unique key over NOT NULL columns, so "
            f"changes cannot be applied idempotently (first change at {first.position}). Add a primary key to "
            "the target table, or route the upstream table with ignore = true"
        )
    key_cols = meta.key
    key_of = _key_getter(key_cols)
    single_key = len(key_cols) == 1
    key0 = key_cols[0]
    other_uniques = tuple(cols for cols in meta.unique_sets if cols != key_cols)
    writable = meta.writable
    all_writable: dict[tuple[str, ...], bool] = {}  # column names of a row -> every one is writable
    final: dict[tuple[Any, ...], dict[str, Any] | None] = {}
    must_delete: dict[tuple[Any, ...], None] = {}
    delete_op, update_op = Op.DELETE, Op.UPDATE
    for ch in changes:
        op = ch.op
        if op is delete_op:
            try:
                k = key_of(ch.before)
            except (KeyError, TypeError):
                k = _key(meta, ch, ch.before, key_cols)  # raises, naming what is missing
            final.pop(k, None)
            final[k] = None
            must_delete[k] = None
            continue
        after = ch.after
        if after:
            names = tuple(after)
            ok = all_writable.get(names)
            if ok is None:
                ok = all_writable[names] = writable.issuperset(names)
            row = dict(after) if ok else _writable_row(meta, ch)
            try:
                k = key_of(after)
            except (KeyError, TypeError):
                k = _key(meta, ch, after, key_cols)
        else:
            row = _writable_row(meta, ch)
            k = _key(meta, ch, after, key_cols)  # raises: no row image
        if op is update_op and ch.before:
            old = ch.before
            if (key0 in old) if single_key else any(c in old for c in key_cols):
                try:
                    ok_ = key_of(old)
                except KeyError:
                    ok_ = _key(meta, ch, old, key_cols)  # raises: part of the key is missing
                if ok_ != k:
                    final.pop(ok_, None)
                    final[ok_] = None
                    must_delete[ok_] = None
            for cols in other_uniques:  # a key change is handled above
                if any(c in old and c in after and old[c] != after[c] for c in cols):
                    must_delete[k] = None
                    break
        final.pop(k, None)
        final[k] = row
    plan = BatchPlan(meta, changes=len(changes))
    plan.deletes = list(must_delete)
    plan.upserts = [row for row in final.values() if row is not None]
    if replace:
        for cols in other_uniques:
            vals = [v for row in plan.upserts
                    if (v := tuple(row.get(c) for c in cols)) and all(x is not None for x in v) and all(c in row for c in cols)]
            if vals:
                plan.unique_clears[cols] = list(dict.fromkeys(vals))
    return plan


def _key_getter(cols: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A C-level function image -> key tuple (operator.itemgetter returns a bare value for one name, so a
    one-column key is wrapped). Raises KeyError for a missing column and TypeError for no image."""
    if len(cols) == 1:
        c = cols[0]

        def one(image: Any) -> tuple[Any, ...]:
            return (image[c],)

        return one
    return operator.itemgetter(*cols)


def _key(meta: TableMeta, ch: RowChange, image: dict[str, Any] | None, cols: tuple[str, ...]) -> tuple[Any, ...]:
    if not image:
        raise ApplyError(f"{ch.op.value} on {meta.display} at {ch.position} carries no row image")
    try:
        return tuple(image[c] for c in cols)
    except KeyError as exc:
        raise ApplyError(
            f"{ch.op.value} on {meta.display} at {ch.position} lacks key column {exc.args[0]!r} of the target's "
            f"key ({', '.join(cols)}): the upstream and target keys differ; make the target key match upstream"
        ) from None


def _writable_row(meta: TableMeta, ch: RowChange) -> dict[str, Any]:
    after = ch.after or {}
    unknown = [c for c in after if c not in meta.writable and c not in meta.columns]
    if unknown:
        raise ApplyError(
            f"{ch.op.value} on upstream table {ch.schema}.{ch.table} at {ch.position} has column(s) "
            f"{', '.join(repr(c) for c in unknown)} that target table {meta.display} lacks: apply the upstream "
            "DDL to the target (or let the applier replicate DDL), then restart"
        )
    # Only columns generated on the *target* are skipped: a column generated upstream can be a plain
    # column downstream (PostgreSQL cannot take MySQL's expressions), and then its value must be written.
    return {c: v for c, v in after.items() if c in meta.writable}


def group_columns(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Rows with the same column set go into one statement."""
    out: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(tuple(r), []).append(r)
    return out


class Sink(abc.ABC):
    """A target dialect: how to upsert and delete a planned batch, and which DDL errors mean 'already done'."""

    dialect: str  # "mysql" or "postgresql", as the DDL translator names them

    def __init__(self, batch_rows: int = 5000) -> None:
        from applier.sinks.adapt import AdapterCache

        self.batch_rows = batch_rows
        self._meta: dict[tuple[str, str], TableMeta] = {}
        self._adapters = AdapterCache(self.value_converter)

    def table(self, conn: Connection, schema: str, name: str) -> TableMeta:
        k = (schema, name)
        meta = self._meta.get(k)
        if meta is None:
            meta = self._meta[k] = self.reflect(conn, schema, name)
        return meta

    def reflect(self, conn: Connection, schema: str, name: str) -> TableMeta:
        return reflect_table(conn, schema, name)

    def forget_tables(self, targets: Iterable[tuple[str, str]] | None = None) -> None:
        """Drop cached table shapes after a DDL (all of them when the DDL's targets are not known)."""
        if targets is None:
            self._meta.clear()
            return
        for t in targets:
            self._meta.pop(t, None)

    def write(self, conn: Connection, plan: BatchPlan) -> None:
        meta = plan.meta
        for lo in range(0, len(plan.deletes), self.batch_rows):
            keys = self.adapt_keys(meta, plan.deletes[lo:lo + self.batch_rows])
            self.delete_rows(conn, meta, keys)
        for cols, values in plan.unique_clears.items():
            for lo in range(0, len(values), self.batch_rows):
                dicts = self.adapt_rows(meta, cols, [dict(zip(cols, v)) for v in values[lo:lo + self.batch_rows]])
                self.delete_rows(conn, meta, [tuple(d[c] for c in cols) for d in dicts], cols)
        for cols, rows in group_columns(plan.upserts).items():
            for lo in range(0, len(rows), self.batch_rows):
                self.upsert_rows(conn, meta, cols, self.adapt_rows(meta, cols, rows[lo:lo + self.batch_rows]))

    def value_converter(self, column_type: str | None) -> "Callable[[Any], Any] | None":
        """The function that turns a decoded upstream value into what a target column of this catalog type
        stores, or None when the value goes as it is (dialect specific; see applier/sinks/adapt.py)."""
        return None

    def adapt_rows(self, meta: TableMeta, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        from applier.sinks.adapt import adapt_rows
        adapters = self._adapters.row(meta, cols)
        return adapt_rows(meta, adapters, rows) if adapters[0] or adapters[1] else rows

    def adapt_keys(self, meta: TableMeta, keys: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        from applier.sinks.adapt import adapt_keys
        convs = self._adapters.key(meta)
        return adapt_keys(meta, convs, keys) if convs else keys

    @abc.abstractmethod
    def upsert_rows(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> None: ...

    @abc.abstractmethod
    def delete_rows(self, conn: Connection, meta: TableMeta, keys: list[tuple[Any, ...]],
                    cols: tuple[str, ...] | None = None) -> None:
        """Delete the rows whose ``cols`` (default: the key) equal one of ``keys``."""

    def ddl_dialect(self, conn: Connection) -> str:
        """The name the DDL translator uses for this server ("mysql", "mariadb" or "postgresql")."""
        return self.dialect

    def begin(self, conn: Connection) -> None:
        """Called at the start of every transaction the applier opens on ``conn``."""

    @property
    def ddl_is_transactional(self) -> bool:
        return False

    def is_replay_noop_error(self, exc: BaseException) -> bool:
        """True when re-running a DDL failed only because it had already taken effect."""
        return False

    @abc.abstractmethod
    def own_schema(self, conn: Connection) -> str:
        """The schema (MySQL: database) that holds the applier's own tables: the connection's default one,
        where the migrations created them. Replicated DDL may never drop or alter it."""

    @abc.abstractmethod
    def schema_exists(self, conn: Connection, schema: str) -> bool:
        """Whether the target has this schema (MySQL: database)."""

    #: Whether dropping a schema drops what is in it (PostgreSQL's DROP SCHEMA ... CASCADE): such a DDL only
    #: runs for schemas the applier created.
    drop_schema_cascades = False

    def prepare_schema(self, conn: Connection, schema: str) -> None:
        """Make sure a target schema/database exists (used before a routed CREATE TABLE)."""
