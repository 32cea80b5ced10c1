"""Target writers, one per SQL dialect; nothing outside this package knows a dialect's SQL."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from applier.sinks.base import ApplyError, BatchPlan, Sink, TableMeta, plan_batch


def sink_for(engine: Engine, batch_rows: int = 5000) -> Sink:
    name = engine.dialect.name
    if name in ("mysql", "mariadb"):
        from applier.sinks.mysql import MySQLSink
        return MySQLSink(batch_rows)
    if name == "postgresql":
        from applier.sinks.postgres import PostgresSink
        return PostgresSink(batch_rows)
    raise ValueError(f"unsupported target dialect {name!r}: use mysql+pymysql, mariadb+pymysql or postgresql+psycopg")


__all__ = ["ApplyError", "BatchPlan", "Sink", "TableMeta", "plan_batch", "sink_for"]
