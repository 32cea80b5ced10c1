"""What every target writer shares: the ``Sink`` base class (table cache, batched writes, value adaptation).

The table's shape lives in :mod:`applier.sinks.table`, batch planning in :mod:`applier.sinks.plan`, the
per-column value converters' machinery in :mod:`applier.sinks.adapt`; each dialect's writer subclasses ``Sink``.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Iterable

from sqlalchemy.engine import Connection

from applier.sinks import adapt
from applier.sinks.plan import BatchPlan, group_columns
from applier.sinks.table import TableMeta, reflect_table
from applier.timing import NO_TIMING, StageTimer


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
