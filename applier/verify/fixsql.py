"""The fix-up SQL (``--fix-sql``): idempotent statements that make the replica equal the upstream rows compared.

Why a module of its own: the values must reach the replica as the writers would write them (through the target
dialect's converters) and be rendered as literals by SQLAlchemy, never pasted. Pure but for
:func:`write_fix_sql` (it reads the replica's sql_mode and writes the file): needs only a SQLAlchemy dialect to
quote and render literals.
"""

from __future__ import annotations

import datetime as _dt
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Sequence

from sqlalchemy import Float, Integer, Numeric, String, literal
from sqlalchemy.engine import Engine
from sqlalchemy.engine.interfaces import Dialect as SADialect

from applier.mysql_values import format_time
from applier.sinks.table import shown
from applier.verify.normalise import Canon, sorted_keys
from applier.verify.results import RowDiffs, VerifyResult
from applier.verify.tables import TablePlan


def _native(v: Canon, kind: str) -> Any:
    """A canonical value as the Python value the replica's converters and literal rendering expect."""
    if v is None:
        return None
    if kind == "decimal":
        try:
            return Decimal(str(v))
        except InvalidOperation:
            return v
    if kind in ("float", "double"):
        return float(v)  # type: ignore[arg-type]
    return v


def render_literal(v: Any, dialect: SADialect) -> str:
    """One value as a SQL literal of ``dialect``, rendered by SQLAlchemy's literal processors (strings are
    quoted and escaped by the dialect, never pasted); bytes as hexadecimal."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        hx = bytes(v).hex()
        return f"decode('{hx}', 'hex')" if dialect.name == "postgresql" else (f"X'{hx}'" if hx else "''")
    if isinstance(v, int):
        typ: Any = Integer()
    elif isinstance(v, Decimal):
        typ = Numeric()
    elif isinstance(v, float):
        typ = Float()
    else:
        if isinstance(v, _dt.datetime):
            v = v.isoformat(sep=" ")
        elif isinstance(v, _dt.date):
            v = v.isoformat()
        elif isinstance(v, _dt.timedelta):
            v = format_time(v)
        typ = String()
        v = str(v)
    return str(literal(v, typ).compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def literal_dialect(source: SADialect | Engine) -> SADialect:
    """A copy of the replica's dialect whose literals are meant for a SQL file, not a driver: no doubled '%'
    (pyformat drivers need that; psql and mysql do not). PostgreSQL strings are standard-conforming (the file
    sets ``standard_conforming_strings = on``); MySQL/MariaDB keep the server's backslash escaping, learnt on
    connecting (an engine that never connected connects once here)."""
    if isinstance(source, Engine):
        if source.dialect.server_version_info is None:
            with source.connect():
                pass
        source = source.dialect
    new = type(source)(paramstyle="named")
    for attr in ("server_version_info", "is_mariadb", "_server_ansiquotes"):
        try:
            setattr(new, attr, getattr(source, attr))
        except AttributeError:
            pass
    if source.name == "postgresql":
        new._backslash_escapes = False  # type: ignore[attr-defined]
    elif source.server_version_info is not None and hasattr(source, "_backslash_escapes"):
        new._backslash_escapes = source._backslash_escapes  # type: ignore[attr-defined]
    return new


def fix_header(dialect: SADialect, sql_mode: str | None = None) -> list[str]:
    """Session settings the statements rely on: UTF-8 (the file's encoding, whatever the client's locale), the
    string syntax the literals were rendered for, UTC for TIMESTAMP/timestamptz literals (canonical datetimes
    are UTC, as the writers' sessions are) and, on MySQL/MariaDB, a sql_mode that accepts zero dates."""
    if dialect.name == "postgresql":
        return ["SET client_encoding = 'UTF8'", "SET standard_conforming_strings = on", "SET TIME ZONE 'UTC'"]
    out = ["SET NAMES utf8mb4", "SET time_zone = '+00:00'"]
    if sql_mode is not None:
        out.append(f"SET SESSION sql_mode = {render_literal(sql_mode, dialect)}")
    return out


def fix_statements(plan: TablePlan, diffs: RowDiffs, dialect: SADialect,
                   convert: Callable[[str | None], Callable[[Any], Any] | None]) -> list[str]:
    """Idempotent statements that make the replica table equal the upstream rows compared: deletes of the
    extra keys, then upserts of the missing and different rows (``ON DUPLICATE KEY UPDATE`` /
    ``ON CONFLICT ... DO UPDATE``). Values go through the replica's own converters (``convert``: the target
    dialect's ``value_converter``, as the writers do: zero dates -> '-infinity', BIT -> bit strings...) and
    SQLAlchemy's literal rendering; identifiers through the dialect's identifier preparer."""
    prep = dialect.identifier_preparer
    q = prep.quote_identifier  # always quoted: names come from catalogs exactly as they are
    table = (f"{q(plan.target[0])}." if plan.target[0] else "") + q(plan.target[1])
    names = [c.target_name for c in plan.columns]
    convs = [convert(plan.target_types.get(c.target_name)) for c in plan.columns]

    def lit(i: int, v: Canon) -> str:
        val = _native(v, plan.columns[i].kind)
        if val is not None and convs[i] is not None:
            val = convs[i](val)  # type: ignore[misc]
        return render_literal(val, dialect)

    out: list[str] = []
    for k in sorted_keys(diffs.extra):
        cond = " AND ".join(f"{q(names[i])} = {lit(i, v)}" for i, v in enumerate(k))
        out.append(f"DELETE FROM {table} WHERE {cond}")
    rows = [diffs.missing[k] for k in sorted_keys(diffs.missing)]
    rows += [diffs.different[k][0] for k in sorted_keys(diffs.different)]
    if not rows:
        return out
    conflict = plan.target_key or tuple(names[: plan.key_len])
    cols = ", ".join(q(n) for n in names)
    rest = [n for n in names if n not in conflict]
    for row in rows:
        vals = ", ".join(lit(i, v) for i, v in enumerate(row))
        stmt = f"INSERT INTO {table} ({cols}) VALUES ({vals})"
        if dialect.name == "postgresql":
            target = ", ".join(q(n) for n in conflict)
            if rest:
                sets = ", ".join(f"{q(n)} = EXCLUDED.{q(n)}" for n in rest)
                stmt += f" ON CONFLICT ({target}) DO UPDATE SET {sets}"
            else:
                stmt += f" ON CONFLICT ({target}) DO NOTHING"
        else:
            upd = rest or [names[0]]
            stmt += " ON DUPLICATE KEY UPDATE " + ", ".join(f"{q(n)} = VALUES({q(n)})" for n in upd)
        out.append(stmt)
    return out


def fix_file_text(statements: Sequence[str], header: Sequence[str], comments: Sequence[str]) -> str:
    """The file ``--fix-sql`` writes: comments, the session header, and the statements in one transaction."""
    lines = [f"-- {shown(c)}" for c in comments]
    lines += [f"{s};" for s in header]
    lines.append("BEGIN;")
    lines += [f"{s};" for s in statements]
    lines.append("COMMIT;")
    return "\n".join(lines) + "\n"


def write_fix_sql(path: str, result: VerifyResult, target: Engine, dialect: SADialect) -> int:
    """Write every table's fix-up statements to ``path`` as one transaction after the session settings they
    need; returns how many statements."""
    stmts = [s for t in result.tables for s in t.fix]
    sql_mode = None
    if dialect.name != "postgresql":
        from applier.sinks.mysql import session_sql_mode

        with target.connect() as conn:
            sql_mode = session_sql_mode(conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar() or "")
    comments = [f"applier verify fix-up for pipeline {result.pipeline}: {len(stmts)} statement(s)",
                f"replica {result.replica}; upstream {result.upstream}", result.consistency]
    unfixable = [t.name for t in result.tables if t.schema_problems]
    if unfixable:
        comments.append("tables with schema differences (columns or the table itself) are not fixed here: "
                        + "; ".join(unfixable))
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(fix_file_text(stmts, fix_header(dialect, sql_mode), comments))
    return len(stmts)
