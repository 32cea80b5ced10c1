"""Upstream TiDB DDL -> target DDL.

TiCDC hands the applier a DDL as the upstream query text plus the schema and table it applies to. This
package turns it into statements for the target:

* ``translate("mysql" | "mariadb", ...)``: the statement keeps its text, minus TiDB-only syntax, with every
  table reference rewritten through routing to a fully qualified, backtick-quoted name, and made idempotent
  where MySQL/MariaDB allow it (see ``applier/ddl/mysql.py``). Use ``"mariadb"`` when the target is MariaDB:
  it also adds MariaDB's ``IF [NOT] EXISTS`` forms and maps what MariaDB spells differently.
* ``translate("postgresql", ...)``: the MySQL DDL is parsed and PostgreSQL DDL is rendered from an explicit
  type map (see ``applier/ddl/postgres.py``).

Before either, every comment leaves the statement (``applier/ddl/comments.py``): a MySQL executable comment
``/*!NNNNN ... */`` holding a character set, a collation or ``IF [NOT] EXISTS`` becomes plain syntax, one holding
storage options is dropped (``TranslatedDDL.notes`` says so), and anything else in one refuses the DDL.

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
means there is nothing to run downstream (an ignored table, or a TiDB-only statement). For an ALTER TABLE,
``alters`` names the kinds of clause it holds (``ALTER_CLAUSES``, from the upstream statement, the same for every
dialect) and ``added_columns`` the columns it adds, so that a caller merging several upstream tables into one
target table can hold back one shard's ALTER that would reshape the shared table.

:class:`UnsupportedDDL` is raised for DDL that cannot be translated faithfully; its message names the
query and what to do. Nothing from the message is ever spliced into SQL unquoted: identifiers are always
quoted and literals re-rendered.

Layout (each module imports only the ones below it): this package picks the dialect and runs the prelude every
dialect shares (:func:`translate`); ``mysql.py`` (with ``mariadb.py`` and ``rewrite.py``) and ``postgres.py``
(with ``pg_tables.py``, ``pg_types.py`` and ``pg_sql.py``) translate; ``common.py`` holds the statements both
route alike, ``syntax.py`` the MySQL DDL grammar, ``tidb.py`` the TiDB-only syntax, ``comments.py`` the
comments (none reaches the target), ``base.py`` the result, error and context types, and ``lexer.py`` the tokens.
"""

from __future__ import annotations

from dataclasses import replace

from applier.ddl.base import ALTER_CLAUSES, KINDS, Context, Route, TranslatedDDL, UnsupportedDDL, Untranslatable
from applier.ddl.comments import strip_comments
from applier.ddl.lexer import LexError, Statement
from applier.ddl.mysql import translate_mysql
from applier.ddl.postgres import translate_postgres
from applier.ddl.tidb import neutralise_tidb, restores_data_statement, tidb_only_statement

__all__ = ["TranslatedDDL", "UnsupportedDDL", "translate", "neutralise_tidb", "KINDS", "ALTER_CLAUSES"]


def translate(dialect: str, query: str, *, schema: str, table: str, route: Route) -> TranslatedDDL:
    """Translate one upstream DDL for ``dialect`` ("mysql", "mariadb" or "postgresql")."""
    d = dialect.lower()
    if d in ("mysql", "mariadb"):
        impl = translate_mysql
    elif d in ("postgresql", "postgres", "pg"):
        impl = translate_postgres
        d = "postgresql"
    else:
        raise ValueError(f"unknown DDL target dialect {dialect!r}: use 'mysql', 'mariadb' or 'postgresql'")
    ctx = Context(dialect=d, query=query, schema=schema or "", table=table or "", route=route)
    notes: list[str] = []
    try:
        stmt = _prepare(ctx, notes)
        result = TranslatedDDL([], "other", []) if stmt is None else impl(ctx, stmt)
    except LexError as exc:
        ctx.fail(f"cannot parse the statement ({exc})")
    assert result.kind in KINDS, result.kind
    assert result.alters <= ALTER_CLAUSES, result.alters
    if not result.statements and result.targets:
        return replace(result, targets=[], sources=[], notes=tuple(notes))  # nothing runs, nothing is touched
    return replace(result, sources=list(dict.fromkeys(ctx.touched)), notes=tuple(notes))


def _prepare(ctx: Context, notes: list[str]) -> Statement | None:
    """The prelude every dialect needs before it looks at the statement kind, so that both refuse and skip the
    same statements; None when there is nothing to run downstream (no statement, or a TiDB-only one). No comment
    survives it (``applier/ddl/comments.py``): an executable one becomes plain syntax, is dropped (``notes`` says
    so) or refuses the DDL, so the target runs only what the translator read as the statement."""
    try:
        text, dropped = strip_comments(neutralise_tidb(ctx.query))
    except Untranslatable as exc:
        ctx.fail(exc.reason)
    notes.extend(dropped)
    stmt = Statement.lex(text)
    if not stmt.sig:
        return None
    if any(t.is_op(";") for t in stmt.sig):
        ctx.fail("the event holds several statements")
    reason = restores_data_statement(stmt.sig)
    if reason:
        ctx.fail(reason)
    if tidb_only_statement(stmt.sig):
        return None
    return stmt
