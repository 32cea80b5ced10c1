"""What every target writer shares: the ``Sink`` base class (table cache, batched writes, value adaptation).

The table's shape lives in :mod:`applier.sinks.table`, batch planning in :mod:`applier.sinks.plan`, the
per-column value converters' machinery in :mod:`applier.sinks.adapt`; each dialect's writer subclasses ``Sink``.
"""

from __future__ import annotations

import abc
import functools
import logging
from typing import Any, Callable, Iterable, Sequence

from sqlalchemy.engine import Connection

from applier.events import Op
from applier.sinks import adapt
from applier.sinks.plan import BatchPlan, RowOp, group_columns
from applier.sinks.table import ApplyError, TableMeta, reflect_table, shown
from applier.timing import NO_TIMING, StageTimer


log = logging.getLogger("applier.sinks")

# For SQL text we build ourselves (DDL, staging): send it as written, so a literal % (in a comment, a default
# or a quoted name) is not taken for a driver placeholder.
VERBATIM = {"no_parameters": True}


Converter = Callable[[Any], Any]


class Sink(abc.ABC):
    """A target's writer for one run: how to read a table, upsert and delete a planned batch, and prepare a
    schema. Built by its :class:`~applier.dialect.Dialect`, which hands it the value converters."""

    def __init__(self, batch_rows: int = 5000, *, convert: Callable[[str | None], Converter | None] | None = None,
                 timer: StageTimer = NO_TIMING) -> None:
        self.batch_rows = batch_rows
        self.timer = timer
        self._meta: dict[tuple[str, str], TableMeta] = {}
        self._adapters = adapt.AdapterCache(convert or (lambda column_type: None))

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
        if plan.keyless:
            self.write_keyless(conn, plan)
            return
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

    def adapt_rows(self, meta: TableMeta, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        adapters = self._adapters.row(meta, cols)
        return adapt.adapt_rows(meta, adapters, rows) if adapters[0] or adapters[1] else rows

    def adapt_keys(self, meta: TableMeta, keys: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        convs = self._adapters.key(meta)
        return adapt.adapt_keys(meta, convs, keys) if convs else keys

    def takes_arrow(self, conn: Connection, meta: TableMeta, table: Any, kinds: dict[str, str]) -> bool:
        """Whether this writer upserts the columnar lane's Arrow ``table`` (plan upserts, columns named as the
        target's; ``kinds``: column -> :mod:`applier.columnar.values` kind) itself, storing exactly what
        :meth:`upsert_rows` stores for its Python rows (:meth:`arrow_refusal` says why not); if not, the lane
        makes the Python rows."""
        why = self.arrow_refusal(conn, meta, table, kinds)
        if why is not None:
            log.debug("upserts of %s go as Python rows: %s", meta.display, why)
            return False
        return True

    def arrow_refusal(self, conn: Connection, meta: TableMeta, table: Any, kinds: dict[str, str]) -> str | None:
        """Why :meth:`takes_arrow` says no, or None."""
        return "this writer takes Python rows only"

    def upsert_arrow(self, conn: Connection, meta: TableMeta, table: Any, kinds: dict[str, str]) -> None:
        """Upsert an Arrow table :meth:`takes_arrow` took (with the same ``kinds``)."""
        raise NotImplementedError

    @abc.abstractmethod
    def upsert_rows(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> None: ...

    @abc.abstractmethod
    def delete_rows(self, conn: Connection, meta: TableMeta, keys: list[tuple[Any, ...]],
                    cols: tuple[str, ...] | None = None) -> None:
        """Delete the rows whose ``cols`` (default: the key) equal one of ``keys``."""

    def bulk_insert(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...],
                    rows: list[tuple[Any, ...]]) -> None:
        """Insert new rows (already adapted, as tuples in ``cols`` order) the fastest plain way the database
        has: ``applier load`` fills tables that are empty, so no row is an update and a duplicate key is an
        error, not something to merge."""
        raise NotImplementedError

    def begin(self, conn: Connection) -> None:
        """Called at the start of every transaction the applier opens on ``conn``."""

    def savepoint_state(self, conn: Connection) -> Any:
        """What the writer remembers about the open transaction, taken before a savepoint (see rolled_back_to)."""
        return None

    def rolled_back_to(self, conn: Connection, state: Any) -> None:
        """The transaction rolled back to a savepoint taken with ``state``: forget what was made after it."""

    @abc.abstractmethod
    def own_schema(self, conn: Connection) -> str:
        """The schema (MySQL: database) that holds the applier's own tables: the connection's default one,
        where the migrations created them. Replicated DDL may never drop or alter it."""

    @abc.abstractmethod
    def schema_exists(self, conn: Connection, schema: str) -> bool:
        """Whether the target has this schema (MySQL: database)."""

    def prepare_schema(self, conn: Connection, schema: str) -> None:
        """Make sure a target schema/database exists (used before a routed CREATE TABLE)."""

    # ---- keyless tables ----------------------------------------------------------------------------------
    # A table without a primary key or unique key over NOT NULL columns: plan_batch hands its changes over as an
    # ordered list of RowOp (applier.sinks.plan), applied here one by one in that order. Inserts are plain
    # inserts, consecutive ones batched (bulk_insert); each update and delete is one statement (the dialect's
    # keyless_update / keyless_delete) that changes exactly one row equal to the old row in every writable
    # column, NULL-safe. Any other count means the replica no longer holds the row upstream changed: loud.

    def write_keyless(self, conn: Connection, plan: BatchPlan) -> None:
        """Apply ``plan.keyless`` in order (see above)."""
        meta = plan.meta
        ops = plan.keyless
        self.adapt_keyless(meta, ops)
        i, n = 0, len(ops)
        while i < n:
            op = ops[i]
            if op.op is Op.INSERT:
                j = insert_run_end(ops, i, self.batch_rows)
                cols = tuple(op.after or ())
                self.bulk_insert(conn, meta, cols, [tuple((o.after or {})[c] for c in cols) for o in ops[i:j]])
                i = j
                continue
            assert op.before is not None, "plan_keyless gives every update and delete its old row"
            if op.op is Op.UPDATE:
                assert op.after is not None, "plan_keyless gives every update its new row"
                count = self.keyless_update(conn, meta, op.before, op.after)
            else:
                count = self.keyless_delete(conn, meta, op.before)
            if count != 1:
                raise keyless_mismatch(meta, op, count)
            i += 1

    def adapt_keyless(self, meta: TableMeta, ops: Sequence[RowOp]) -> None:
        """Convert the old and new rows in place with the converters keyed rows get (:meth:`adapt_rows`), so an
        old row is compared in the form its row was written in. Every old row has the same columns (all the
        writable ones), so they go in one call; new rows one call per column set."""
        befores = [o.before for o in ops if o.before is not None]
        if befores:
            self.adapt_rows(meta, tuple(befores[0]), befores)
        for cols, rows in group_columns(o.after for o in ops if o.after is not None).items():
            self.adapt_rows(meta, cols, rows)

    def keyless_update(self, conn: Connection, meta: TableMeta, before: dict[str, Any], after: dict[str, Any]) -> int:
        """Set ``after``'s columns in one row whose every column in ``before`` equals it (NULL-safe); return how
        many rows changed (matched, for MySQL: the driver counts found rows)."""
        raise NotImplementedError(f"{type(self).__name__} cannot write tables without a key")

    def keyless_delete(self, conn: Connection, meta: TableMeta, before: dict[str, Any]) -> int:
        """Delete one row whose every column in ``before`` equals it (NULL-safe); return how many rows went."""
        raise NotImplementedError(f"{type(self).__name__} cannot write tables without a key")

    @functools.cached_property
    def keyless_statements(self) -> dict[tuple[Any, ...], tuple[TableMeta, Any]]:
        """Built statements per (kind, id(meta), ...), each with the TableMeta it was built for: an id is only
        trusted while that TableMeta is the one cached (a re-reflected table after a DDL is a new object)."""
        return {}

    def keyless_statement(self, kind: str, meta: TableMeta, extra: tuple[Any, ...],
                          build: Callable[[], Any]) -> Any:
        """The statement ``build`` makes for ``(kind, meta, extra)``, built once."""
        cache = self.keyless_statements
        k = (kind, id(meta), extra)
        hit = cache.get(k)
        if hit is not None and hit[0] is meta:
            return hit[1]
        if len(cache) >= 4096:
            cache.clear()
        stmt = build()
        cache[k] = (meta, stmt)
        return stmt


def insert_run_end(ops: Sequence[RowOp], start: int, limit: int) -> int:
    """One past the last of the consecutive inserts from ``start`` with the same columns, at most ``limit``."""
    cols = tuple(ops[start].after or ())
    end = start + 1
    n = min(len(ops), start + limit)
    while end < n and ops[end].op is Op.INSERT and tuple(ops[end].after or ()) == cols:
        end += 1
    return end


def keyless_mismatch(meta: TableMeta, op: RowOp, count: int) -> ApplyError:
    """The error for an update or delete of a table without a key that did not change exactly one row."""
    found = "no row" if count == 0 else f"{count} rows"
    return ApplyError(
        f"the {op.op.value} at {op.position} found {found} of target table {meta.display} (no primary key, so "
        f"matched by its whole old row: {abbreviated(op.before)}) where upstream changed exactly one: the replica "
        "differs from upstream for this table (a row missing or changed outside replication). Re-seed the table from upstream (`applier load`, see README \"Seeding a replica\") or "
        "repair the row by hand, then restart; `applier verify` lists tables without a key as not compared, so "
        "compare them by hand")


def abbreviated(row: dict[str, Any] | None, width: int = 40, total: int = 300) -> str:
    """A row image short enough for an error message: each value cut at ``width`` characters, the whole at
    ``total``."""
    if not row:
        return "{}"
    text = ", ".join(f"{shown(k)}={v!r:.{width}}" for k, v in row.items())
    return text if len(text) <= total else text[:total] + " ..."
