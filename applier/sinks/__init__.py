"""Target writers, one per SQL dialect (picked by applier.dialect); nothing outside this package writes a
dialect's SQL."""

from __future__ import annotations

from applier.sinks.base import Sink
from applier.sinks.plan import BatchPlan, plan_batch
from applier.sinks.table import ApplyError, TableMeta


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


__all__ = ["ApplyError", "BatchPlan", "Sink", "TableMeta", "db_reason", "plan_batch"]
