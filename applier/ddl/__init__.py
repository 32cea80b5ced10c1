"""Upstream TiDB DDL -> target DDL.

TiCDC hands the applier a DDL as the upstream query text plus the schema and table it applies to. This
package turns it into statements for the target:

* ``translate("mysql" | "mariadb", ...)``: the statement keeps its text, minus TiDB-only syntax, with every
  table reference rewritten through routing to a fully qualified, backtick-quoted name, and made idempotent
  where MySQL/MariaDB allow it (see ``applier/ddl/mysql.py``). Use ``"mariadb"`` when the target is MariaDB:
  it also adds MariaDB's ``IF [NOT] EXISTS`` forms and maps what MariaDB spells differently.
* ``translate("postgresql", ...)``: the MySQL DDL is parsed and PostgreSQL DDL is rendered from an explicit
  type map (see ``applier/ddl/postgres.py``).

Routing is a callable ``route(schema, table) -> (schema, table) | None``; ``None`` means the table is
ignored downstream. Schema-level DDL (CREATE/DROP/ALTER DATABASE) calls ``route(schema, "")`` and uses the
returned schema. Unqualified names in the query belong to the event's schema.

Multi-table statements (``RENAME TABLE a TO b, c TO d``, ``DROP TABLE a, b``, ``DROP VIEW a, b``) may
arrive once per table with the same full query, or already split. When the query names several tables and
the event's table is one of them, only that table's part is translated (for RENAME the event's table is
matched against the new names first - TiCDC reports the new name - then the old ones); when the event's table
matches none of them, the whole statement is translated.

The result's ``targets`` lists the downstream ``(schema, table)`` pairs the DDL touches (after routing), so
the caller can forget cached table shapes; schema-level DDL reports ``(schema, "")``. ``statements == []``
means there is nothing to run downstream (an ignored table, or a TiDB-only statement).

:class:`UnsupportedDDL` is raised for DDL that cannot be translated faithfully; its message names the
query and what to do. Nothing from the message is ever spliced into SQL unquoted: identifiers are always
quoted and literals re-rendered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NoReturn, Sequence

__all__ = ["TranslatedDDL", "UnsupportedDDL", "translate", "neutralise_tidb", "KINDS"]

Route = Callable[[str, str], "tuple[str, str] | None"]

KINDS = frozenset({
    "create_table", "drop_table", "alter_table", "rename_table", "truncate_table", "create_schema",
    "drop_schema", "create_index", "drop_index", "create_view", "drop_view", "other",
})


@dataclass(frozen=True)
class TranslatedDDL:
    statements: list[str]  # to run in order; empty = nothing to do downstream (e.g. ignored table)
    kind: str  # one of KINDS
    targets: list[tuple[str, str]] = field(default_factory=list)  # downstream (schema, table) pairs touched
    # upstream (schema, table) names the statement touches, as parsed from its text ("" table: schema-level);
    # the applier confines a DDL to these being in its routes (invariant 11)
    sources: list[tuple[str, str]] = field(default_factory=list, compare=False)


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


def translate(dialect: str, query: str, *, schema: str, table: str, route: Route) -> TranslatedDDL:
    """Translate one upstream DDL for ``dialect`` ("mysql", "mariadb" or "postgresql")."""
    from applier.ddl.tidb import LexError

    d = dialect.lower()
    if d in ("mysql", "mariadb"):
        from applier.ddl.mysql import translate_mysql as impl
    elif d in ("postgresql", "postgres", "pg"):
        from applier.ddl.postgres import translate_postgres as impl
        d = "postgresql"
    else:
        raise ValueError(f"unknown DDL target dialect {dialect!r}: use 'mysql', 'mariadb' or 'postgresql'")
    ctx = Context(dialect=d, query=query, schema=schema or "", table=table or "", route=route)
    try:
        result = impl(ctx)
    except LexError as exc:
        ctx.fail(f"cannot parse the statement ({exc})")
    assert result.kind in KINDS, result.kind
    if not result.statements and result.targets:
        return TranslatedDDL([], result.kind, [])  # nothing runs, nothing is touched
    return TranslatedDDL(result.statements, result.kind, result.targets, list(dict.fromkeys(ctx.touched)))


def neutralise_tidb(query: str) -> str:
    """Strip TiDB-only syntax from ``query`` (see ``applier/ddl/tidb.py``); everything else stays verbatim."""
    from applier.ddl.tidb import neutralise_tidb as impl

    return impl(query)


# ---------------------------------------------------------------------------------------------------------
# Shared by the dialect modules


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
    dialect: str
    query: str
    schema: str
    table: str
    route: Route
    touched: list[tuple[str, str]] = field(default_factory=list)  # every upstream name routed (see sources)

    def fail(self, reason: str, kind: str = "other") -> NoReturn:
        raise UnsupportedDDL(reason, query=self.query, dialect=self.dialect, kind=kind)

    def table_ref(self, cursor) -> TableRef:
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
        """Which items of a multi-table statement this event is about (see the module docstring).

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


SYSTEM_SCHEMAS = frozenset({"mysql", "information_schema", "performance_schema", "sys", "metrics_schema"})
