"""Report: the live progress line on a terminal, and ``applier status`` from the progress tables."""

from __future__ import annotations

import sys
import time
from typing import Any

from sqlalchemy import func, inspect, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from applier import progress as p
from applier.quarantine import HELD, RowQuarantine
from applier.sinks.table import shown


def tso_physical_ms(ts: int) -> int:
    """TiDB TSO: physical milliseconds in the high bits, an 18-bit logical counter below."""
    return ts >> 18


def lag_seconds(ts: int, now: float | None = None) -> float | None:
    if ts <= 0:
        return None
    return round((now if now is not None else time.time()) - tso_physical_ms(ts) / 1000.0, 3)


class ProgressLine:
    """A one-line progress display on stderr when attached to a terminal (and silence otherwise)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.monotonic()
        self._shown = False

    def update(self, rep: Any, totals: Any) -> None:
        if not self.enabled:
            return
        el = time.monotonic() - self.start
        lag = lag_seconds(totals.applied_ts)
        msg = (f"\r{totals.messages:>10,} msgs  {totals.applied.rows:>10,} rows  {totals.applied.ddls:>4} DDL  "
               f"{totals.messages / el if el else 0:>9,.0f} msg/s  held {totals.held:>8,}  "
               f"lag {'-' if lag is None else f'{lag:,.1f}s'}   ")
        sys.stderr.write(msg)
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self.enabled and self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


def status(engine: Engine, pipeline: str, *, consistency: str = "") -> dict[str, Any]:
    """Everything an operator asks first: how far, how late, where each partition stands."""
    now = time.time()
    with engine.connect() as conn:
        pl = conn.execute(select(p.pipelines).where(p.pipelines.c.pipeline == pipeline)).mappings().first()
        parts = conn.execute(select(p.partitions).where(p.partitions.c.pipeline == pipeline)
                             .order_by(p.partitions.c.topic, p.partitions.c.kafka_partition)).mappings().all()
        tabs = conn.execute(select(p.tables).where(p.tables.c.pipeline == pipeline)
                            .order_by(p.tables.c.source_schema, p.tables.c.source_table)).mappings().all()
        ddl_counts = {}
        for r in conn.execute(select(p.ddl_history.c.state).where(p.ddl_history.c.pipeline == pipeline)):
            ddl_counts[r[0]] = ddl_counts.get(r[0], 0) + 1
        quarantined = len(conn.execute(select(p.quarantine.c.id).where(p.quarantine.c.pipeline == pipeline)).all())
        writer = _writer(conn, pipeline)
    held = held_rows(engine, pipeline)
    if pl is None:
        return {"pipeline": pipeline, "exists": False, "consistency": consistency, "writer": writer,
                "quarantined_rows": held}
    resolved = min((int(r["resolved_ts"]) for r in parts), default=0)
    return {
        "pipeline": pipeline,
        "exists": True,
        "protocol": pl["protocol"],
        "consistency": consistency,
        "applied_ts": int(pl["applied_ts"]),
        "applied_lag_seconds": lag_seconds(int(pl["applied_ts"]), now),
        "global_resolved_ts": resolved,
        "global_resolved_lag_seconds": lag_seconds(resolved, now),
        "batches": int(pl["batches"]),
        "rows_applied": int(pl["rows_applied"]),
        "updated_at": pl["updated_at"].isoformat() + "Z",
        "ddl": ddl_counts,
        "quarantined_messages": quarantined,
        "quarantined_rows": held,
        "writer": writer,
        "partitions": [
            {"topic": r["topic"], "partition": int(r["kafka_partition"]), "restart_offset": int(r["restart_offset"]),
             "next_offset": int(r["next_offset"]), "resolved_ts": int(r["resolved_ts"])}
            for r in parts
        ],
        "tables": [
            {"source": f"{r['source_schema']}.{r['source_table']}", "target": f"{r['target_schema']}.{r['target_table']}",
             "applied_ts": int(r["applied_ts"]), "rows_applied": int(r["rows_applied"])}
            for r in tabs
        ],
    }


FIRST_BLOCKED_KEYS = 5


def held_rows(engine: Engine, pipeline: str, first: int = FIRST_BLOCKED_KEYS) -> dict[str, Any] | None:
    """Held row changes and blocked keys (applier.quarantine), with the first few blocked keys in commit order;
    None for tables before revision 0010 or when they cannot be read: status must not need a migration, and it
    reads them on a connection of its own so a failure here cannot spoil the rest."""
    rows = p.quarantined_rows
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(rows.name):
                return None
            held, keys = RowQuarantine(pipeline).counts(conn)
            oldest = func.min(rows.c.commit_ts)
            firsts = conn.execute(
                select(rows.c.source_schema, rows.c.source_table, rows.c.row_key, func.count(), oldest)
                .where(rows.c.pipeline == pipeline, rows.c.state == HELD)
                .group_by(rows.c.source_schema, rows.c.source_table, rows.c.row_key)
                .order_by(oldest, rows.c.source_schema, rows.c.source_table, rows.c.row_key)
                .limit(first)).all() if held else []
    except SQLAlchemyError:
        return None
    return {"held_changes": held, "blocked_keys": keys,
            "first_blocked": [{"table": f"{s}.{t}", "key": k, "changes": int(n), "first_commit_ts": int(ts)}
                              for s, t, k, n, ts in firsts]}


def _held_line(h: dict[str, Any] | None) -> list[str]:
    if h is None:
        return []
    if not h["held_changes"]:
        return ["  held row changes: none"]
    keys = ", ".join(f"{shown(k['table'])} {_printable(k['key'])}" for k in h["first_blocked"])
    more = ", …" if h["blocked_keys"] > len(h["first_blocked"]) else ""
    return [f"  held row changes: {h['held_changes']} under {h['blocked_keys']} blocked key(s): {keys}{more} "
            "(applier quarantine list)"]


def _printable(s: str) -> str:
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def _writer(conn: Any, pipeline: str) -> dict[str, Any] | None:
    """The run that holds the pipeline (invariant 13), or None (never claimed, or tables before revision 0006:
    status must not need a migration)."""
    if not inspect(conn).has_table(p.writers.name):
        return None
    row = conn.execute(select(p.writers).where(p.writers.c.pipeline == pipeline)).mappings().first()
    if row is None:
        return None
    return {"epoch": int(row["epoch"]), "holder": row["holder"], "claimed_at": _utc(row["claimed_at"]),
            "heartbeat_at": _utc(row["heartbeat_at"])}


def _utc(t: Any) -> str | None:
    return None if t is None else t.isoformat() + "Z"


def _writer_line(w: dict[str, Any] | None) -> str:
    if not w:
        return "  writer: none claimed yet"
    return (f"  writer: epoch {w['epoch']}, {w['holder']}, claimed {w['claimed_at']}, "
            f"last transaction {w['heartbeat_at']}")


def format_status(st: dict[str, Any]) -> str:
    if not st.get("exists"):
        return "\n".join([f"pipeline {st['pipeline']}: no progress recorded yet (it has never applied a batch)",
                          _writer_line(st.get("writer")), *_held_line(st.get("quarantined_rows"))])
    lines = [
        f"pipeline {st['pipeline']} ({st['protocol']}, {st['consistency']})",
        f"  applied resolved ts  {st['applied_ts']}  (lag {st['applied_lag_seconds']} s)",
        f"  global resolved ts   {st['global_resolved_ts']}  (lag {st['global_resolved_lag_seconds']} s)",
        f"  batches {st['batches']}, rows applied {st['rows_applied']}, DDL {st['ddl'] or {}}, "
        f"quarantined {st['quarantined_messages']}, updated {st['updated_at']}",
        _writer_line(st.get("writer")),
        *_held_line(st.get("quarantined_rows")),
        "  partitions:",
    ]
    for r in st["partitions"]:
        lines.append(f"    {r['topic']}[{r['partition']}]  restart {r['restart_offset']}  next {r['next_offset']}  "
                     f"resolved {r['resolved_ts']}")
    lines.append("  tables:")
    for r in st["tables"]:
        lines.append(f"    {r['source']} -> {r['target']}  applied ts {r['applied_ts']}  rows {r['rows_applied']}")
    return "\n".join(lines)
