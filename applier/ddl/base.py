"""What every DDL module shares: the translation result, the errors, and the per-event context.

The dialect translators and the helpers under them all return :class:`TranslatedDDL`, refuse through
:class:`UnsupportedDDL` (or :class:`Untranslatable` where no :class:`Context` is at hand), and route every
table name through the :class:`Context` of the event, which also records the upstream names a statement
touches (``TranslatedDDL.sources``). They live here, under every DDL module but the lexer, so that no module
has to import the package ``applier.ddl`` (or a sibling it would otherwise have no reason to know) to reach
them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, NoReturn, Sequence

if TYPE_CHECKING:
    from applier.ddl.lexer import Cursor

__all__ = [
    "ALTER_CLAUSES",
    "KINDS",
    "Context",
    "Route",
    "TableRef",
    "TranslatedDDL",
    "UnsupportedDDL",
    "Untranslatable",
]

Route = Callable[[str, str], "tuple[str, str] | None"]

KINDS = frozenset({
    "create_table", "drop_table", "alter_table", "rename_table", "truncate_table", "create_schema",
    "drop_schema", "create_index", "drop_index", "create_view", "drop_view", "other",
})

# What ``TranslatedDDL.alters`` may hold: one name per kind of clause an ALTER TABLE contains, so that a caller
# merging several upstream tables into one target table can tell a harmless ALTER from one that reshapes or
# destroys the shared table without reading SQL. Where a clause could be several kinds (DROP CONSTRAINT, a
# column definition that cannot be read), every kind it could be is reported: a caller that refuses a kind must
# see it whenever it may be there.
ALTER_CLAUSES = frozenset({
    "add_column",  # ADD [COLUMN] c ... / ADD [COLUMN] (c ..., d ...): names in TranslatedDDL.added_columns
    "drop_column",  # DROP [COLUMN] c
    "modify_column",  # MODIFY c ..., CHANGE a b ... (restates the whole definition), CONVERT TO CHARACTER SET
    "rename_column",  # RENAME COLUMN a TO b, CHANGE a b ... with b != a (case-sensitive, as the writers quote)
    "alter_column_default",  # ALTER [COLUMN] c SET DEFAULT v / DROP DEFAULT
    "add_index",  # ADD INDEX|KEY|UNIQUE|FULLTEXT|SPATIAL, ADD CONSTRAINT UNIQUE, a column's inline UNIQUE
    "drop_index",  # DROP INDEX|KEY i (DROP INDEX `PRIMARY` is drop_primary_key)
    "add_primary_key",  # ADD [CONSTRAINT] PRIMARY KEY, a column's inline PRIMARY KEY
    "drop_primary_key",  # DROP PRIMARY KEY, DROP INDEX `PRIMARY`
    "rename_index",  # RENAME INDEX|KEY a TO b
    "rename_table",  # RENAME [TO|AS] n (the statement's kind is then "rename_table")
    "partition",  # any partition clause: PARTITION BY, ADD/DROP/TRUNCATE/EXCHANGE/... PARTITION, REMOVE PARTITIONING
    "table_option",  # ENGINE, [DEFAULT] CHARSET/COLLATE, COMMENT, AUTO_INCREMENT, ROW_FORMAT, ... (and CONVERT TO)
    "add_foreign_key",  # ADD [CONSTRAINT [s]] FOREIGN KEY
    "drop_foreign_key",  # DROP FOREIGN KEY fk
    "add_check",  # ADD [CONSTRAINT [s]] CHECK (...), a column's inline CHECK
    "drop_check",  # DROP CHECK c
    "other",  # anything else: ORDER BY, FORCE, ALGORITHM/LOCK, ALTER INDEX|COLUMN visibility, [NOT] ENFORCED, ...
})


@dataclass(frozen=True)
class TranslatedDDL:
    statements: list[str]  # to run in order; empty = nothing to do downstream (e.g. ignored table)
    kind: str  # one of KINDS
    targets: list[tuple[str, str]] = field(default_factory=list)  # downstream (schema, table) pairs touched
    # upstream (schema, table) names the statement touches, as parsed from its text ("" table: schema-level);
    # the applier confines a DDL to these being in its routes (invariant 11)
    sources: list[tuple[str, str]] = field(default_factory=list, compare=False)
    # for an ALTER TABLE (kind "alter_table", or "rename_table" when it renames the table): the kinds of clause it
    # holds (ALTER_CLAUSES), read from the upstream statement, not from what the target runs, so that the caller
    # judges the same ALTER the same way whatever the dialect. TiDB-only clauses (TiFlash, CACHE, ...) are left out:
    # they never reach the target. Empty for every other statement.
    alters: frozenset[str] = field(default=frozenset(), compare=False)
    # the upstream names of the columns an "add_column" clause adds, in statement order, so the caller can tell
    # whether the target table already has them (another shard added them first)
    added_columns: tuple[str, ...] = field(default=(), compare=False)
    # what the translation dropped from the statement that an operator should hear of (an executable comment's
    # storage options, applier/ddl/comments.py): the caller logs each as a warning naming the message's position
    notes: tuple[str, ...] = field(default=(), compare=False)


class UnsupportedDDL(Exception):
    """A DDL that cannot be translated for the target. The message names the query and what to do."""

    def __init__(self, reason: str, *, query: str = "", dialect: str = "", kind: str = "other") -> None:
        self.reason = reason
        self.query = query
        self.dialect = dialect
        self.kind = kind
        target = {"postgresql": "PostgreSQL", "mysql": "MySQL", "mariadb": "MariaDB"}.get(dialect, dialect)
        where = f" for {target}" if target else ""
        super().__init__(
            f"cannot translate DDL{where}: {reason}. Query: {shorten(query)!r}. Apply an equivalent change on "
            f"the target by hand if it is needed there, then set [target] on_unsupported_ddl = \"skip\" to "
            f"record and skip this DDL"
        )


def shorten(query: str, limit: int = 160) -> str:
    flat = " ".join(query.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


class Untranslatable(Exception):
    """Raised by the PostgreSQL helpers, which have no :class:`Context` to fail through; the PostgreSQL entry
    point turns it into :class:`UnsupportedDDL` with the event's query."""

    def __init__(self, reason: str, kind: str = "other") -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


@dataclass(frozen=True)
class TableRef:
    """A table name as written in the query: upstream schema (event schema when unqualified) and table,
    plus the character span of the name in the (neutralised) statement text."""

    schema: str
    table: str
    start: int
    end: int
    qualified: bool


@dataclass
class Context:
    """One DDL event being translated. Every table name goes through :meth:`routed` or :meth:`routed_schema`,
    so the names a statement touches are recorded in one place, whatever the dialect."""

    dialect: str
    query: str
    schema: str
    table: str
    route: Route
    touched: list[tuple[str, str]] = field(default_factory=list)  # every upstream name routed (see sources)

    def fail(self, reason: str, kind: str = "other") -> NoReturn:
        raise UnsupportedDDL(reason, query=self.query, dialect=self.dialect, kind=kind)

    def table_ref(self, cursor: Cursor) -> TableRef:
        """Parse ``name`` or ``schema.name`` at the cursor."""
        first = cursor.ident()
        if cursor.is_op(".") and cursor.peek(1) is not None and cursor.peek(1).is_ident:
            cursor.next()
            second = cursor.ident()
            return TableRef(first.ident, second.ident, first.start, second.end, True)
        if not self.schema:
            self.fail(f"table {first.ident!r} is not qualified and the event names no schema")
        return TableRef(self.schema, first.ident, first.start, first.end, False)

    def routed(self, schema: str, table: str) -> tuple[str, str] | None:
        self.touched.append((schema, table))
        out = self.route(schema, table)
        if out is None:
            return None
        if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(x, str) for x in out)):
            raise TypeError(f"route({schema!r}, {table!r}) returned {out!r}, expected (schema, table) or None")
        if not out[0] or not out[1]:
            raise TypeError(f"route({schema!r}, {table!r}) returned an empty name: {out!r}")
        return out

    def routed_schema(self, schema: str) -> str | None:
        self.touched.append((schema, ""))
        out = self.route(schema, "")
        if out is None:
            return None
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str) and out[0]):
            raise TypeError(f"route({schema!r}, '') returned {out!r}, expected (schema, table) or None")
        return out[0]

    def pick(self, candidates: Sequence[Sequence[tuple[str, str]]]) -> list[int]:
        """Which items of a multi-table statement this event is about (see ``applier/ddl/__init__.py``).

        ``candidates[i]`` lists the upstream names identifying item i, in matching priority order.
        """
        n = len(candidates)
        if n <= 1 or not self.table:
            return list(range(n))
        ev = (self.schema.lower(), self.table.lower())
        depth = max(len(c) for c in candidates)
        for level in range(depth):
            hits = [i for i, c in enumerate(candidates)
                    if level < len(c) and (c[level][0].lower(), c[level][1].lower()) == ev]
            if hits:
                return hits[:1]
        return list(range(n))
