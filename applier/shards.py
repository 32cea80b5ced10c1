"""Safe shard merges: which DDL of one upstream table may not run on a target table that routes merge.

When ``[[route]]`` rules send several upstream tables (shards) into one target table, a DROP, TRUNCATE, RENAME,
DROP INDEX, DROP DATABASE or a reshaping ALTER of one shard would act on every shard's rows. The other shards of
a target are the upstream tables whose rows reached it (``applier_tables``, and this run's) that the current
routes send there; a shard that never had a row has nothing there to lose. An additive ALTER applies once for
all shards: the same ADD COLUMN from the next shard finds its columns and is recorded as already done.
"""

from __future__ import annotations

from typing import Any, Callable

from sqlalchemy.engine import Connection, Engine

from applier.ddl import TranslatedDDL
from applier.events import DDL
from applier.progress import ProgressStore
from applier.sinks.table import shown

Route = Callable[[str, str], "tuple[str, str] | None"]

# DDL kinds that act on every row or the name of a target table: run for one shard of a merged table, they act
# on all shards (see ShardGuard.conflict)
SHARD_DESTRUCTIVE = frozenset({"drop_table", "truncate_table", "rename_table", "drop_index", "drop_schema"})
# ALTER TABLE clauses (applier.ddl.ALTER_CLAUSES) that reshape what the other shards' rows live in: a dropped,
# retyped or renamed column, a dropped or changed key, a renamed table or index, partitioning
SHARD_RESHAPING_ALTERS = frozenset({
    "drop_column", "modify_column", "rename_column", "drop_index", "drop_primary_key", "add_primary_key",
    "rename_index", "rename_table", "partition", "drop_foreign_key", "drop_check",
})

ALREADY_ADDED = "\0already added"


def reshapes(tr: TranslatedDDL) -> str:
    """What a DDL does to a table's existing rows or to the columns and keys they live in, as words ('' when it
    only adds: a column with a default or NULL, an index, options). Such a DDL may not run for one shard of a
    merged table, nor before quarantined changes of its table (applier.setaside), since either would act on
    rows it must not."""
    if tr.kind == "alter_table":
        return ", ".join(sorted(tr.alters & SHARD_RESHAPING_ALTERS)).replace("_", " ")
    return tr.kind.replace("_", " ") if tr.kind in SHARD_DESTRUCTIVE else ""  # ShardGuard.conflict: every column the shard's ADD COLUMN adds is there


class ShardGuard:
    """Answers, for one DDL, whether running it would act on other shards' rows (see the module docstring)."""

    def __init__(self, engine: Engine, store: ProgressStore, route: Route,
                 reflect: Callable[[Connection, str, str], Any]) -> None:
        self.engine = engine
        self.store = store
        self.route = route
        self.reflect = reflect
        self._sources: set[tuple[str, str]] | None = None  # read once, then kept up to date by saw()

    def saw(self, schema: str, table: str) -> None:
        """Rows of this upstream table are being written in this run."""
        if self._sources is not None:
            self._sources.add((schema, table))

    def conflict(self, ev: DDL, tr: TranslatedDDL) -> str:
        """Safe shard merges: when routes merge several upstream tables into one target table, one shard's
        DROP, TRUNCATE, RENAME or DROP INDEX would act on every shard's rows. The shards are the upstream tables
        whose rows reached the target (applier_tables, and this run's) that the current routes send to the same
        target; a shard that never had a row has nothing there to lose. '' when the DDL is safe to run, the reason
        when it is not, or ALREADY_ADDED for an ADD COLUMN another shard already made."""
        if not tr.targets or not tr.statements:
            return ""
        alter = tr.kind == "alter_table"
        what = reshapes(tr)
        if not alter and not what:
            return ""
        if self._sources is None:
            with self.engine.connect() as other:
                self._sources = set(self.store.source_tables(other))
        own = {(s.casefold(), t.casefold()) for s, t in [(ev.schema, ev.table), *tr.sources]}
        own_schemas = {s for s, t in own if not t} if tr.kind == "drop_schema" else set()
        for schema, table in tr.targets:
            others = sorted(f"{s}.{t}" for s, t in self._sources
                            if (s.casefold(), t.casefold()) not in own and s.casefold() not in own_schemas
                            and (to := self.route(s, t)) is not None
                            and to[0] == schema and (not table or to[1] == table))
            if not others:
                continue
            if not what:
                # additive (ADD COLUMN, ADD INDEX, defaults, options): it applies once for every shard; the same
                # ADD COLUMN from the next shard finds its columns there (MySQL has no ADD COLUMN IF NOT EXISTS)
                if tr.alters == {"add_column"} and self.has_columns(schema, table, tr.added_columns):
                    return ALREADY_ADDED
                continue
            where = f"schema {schema}" if not table else shown(schema, table)
            more = f" and {len(others) - 5} more" if len(others) > 5 else ""
            return f"would {what} {where}, which the routes also fill from {', '.join(others[:5])}{more}"
        return ""

    def has_columns(self, schema: str, table: str, names: tuple[str, ...]) -> bool:
        if not names:
            return False
        with self.engine.connect() as other:
            try:
                meta = self.reflect(other, schema, table)
            except Exception:  # no such table: the DDL runs and fails (or not) on its own
                return False
        have = {c.casefold() for c in meta.columns}
        return all(n.casefold() in have for n in names)
