"""Target writers, one per SQL dialect; nothing outside this package knows a dialect's SQL."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from applier.sinks.base import Sink
from applier.sinks.plan import BatchPlan, plan_batch
from applier.sinks.table import ApplyError, TableMeta


def is_transient(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a target fault that passes: a lost connection, a
    server restart, a deadlock or lock-wait timeout. Such a fault replays the whole target transaction."""
    from sqlalchemy.exc import DBAPIError

    from applier.sinks.mysql import TRANSIENT_ERRORS
    from applier.sinks.postgres import TRANSIENT_SQLSTATE_CLASSES, TRANSIENT_SQLSTATES

    seen = 0
    while exc is not None and seen < 20:
        if isinstance(exc, DBAPIError):
            if exc.connection_invalidated:
                return True
            orig = exc.orig
            sqlstate = getattr(orig, "sqlstate", None)
            if sqlstate is not None:
                return sqlstate in TRANSIENT_SQLSTATES or sqlstate.startswith(TRANSIENT_SQLSTATE_CLASSES)
            if type(orig).__module__.startswith("psycopg") and type(orig).__name__ == "OperationalError":
                return True  # no SQLSTATE: the connection itself failed
            code = orig.args[0] if orig is not None and orig.args else None
            return code in TRANSIENT_ERRORS
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def db_reason(exc: BaseException) -> str:
    """The database's own message without the SQL text and parameters (which may carry row data): from the first
    driver error in ``exc``'s cause chain, else ``exc`` itself."""
    cur: BaseException | None = exc
    for _ in range(20):
        if cur is None or getattr(cur, "orig", None) is not None:
            break
        cur = cur.__cause__ or cur.__context__
    shown = getattr(cur, "orig", None) if cur is not None else None
    shown = shown if shown is not None else exc
    return f"{type(shown).__name__}: {shown}".splitlines()[0][:500]


def sink_for(engine: Engine, batch_rows: int = 5000) -> Sink:
    name = engine.dialect.name
    if name in ("mysql", "mariadb"):
        from applier.sinks.mysql import MySQLSink
        return MySQLSink(batch_rows)
    if name == "postgresql":
        from applier.sinks.postgres import PostgresSink
        return PostgresSink(batch_rows)
    raise ValueError(f"unsupported target dialect {name!r}: use mysql+pymysql, mariadb+pymysql or postgresql+psycopg")


__all__ = ["ApplyError", "BatchPlan", "Sink", "TableMeta", "db_reason", "is_transient", "plan_batch", "sink_for"]
