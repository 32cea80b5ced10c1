"""Report: the live progress line on a terminal, and ``applier status`` from the progress tables."""

from __future__ import annotations

import sys
import time
from typing import Any, Mapping, Sequence

from sqlalchemy import and_, func, inspect, not_, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from applier import progress as p
from applier.clock import UNTRUSTED
from applier.quarantine import HELD, RowQuarantine
from applier.sinks.table import shown


def tso_physical_ms(ts: int) -> int:
    """TiDB TSO: physical milliseconds in the high bits, an 18-bit logical counter below."""
    return ts >> 18


def lag_seconds(ts: int, now: float | None = None) -> float | None:
    """Seconds from the physical time of TSO ``ts`` to ``now`` (default: the clock); None for 0, which means
    "nothing yet" rather than 1970."""
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


def status(engine: Engine, pipeline: str, *, consistency: str = "", now: float | None = None) -> dict[str, Any]:
    """Everything an operator asks first: how far, how late, where each partition stands, which partition holds
    the global resolved ts back, and how fresh each table is. ``now`` (Unix seconds) fixes the clock the lags
    are measured against, so that a test (or a caller comparing several reports) gets exact figures."""
    now = time.time() if now is None else now
    with engine.connect() as conn:
        pl = conn.execute(select(p.pipelines).where(p.pipelines.c.pipeline == pipeline)).mappings().first()
        parts = conn.execute(select(p.partitions).where(p.partitions.c.pipeline == pipeline)
                             .order_by(p.partitions.c.topic, p.partitions.c.kafka_partition)).mappings().all()
        tabs = conn.execute(select(p.tables).where(p.tables.c.pipeline == pipeline)
                            .order_by(p.tables.c.source_schema, p.tables.c.source_table)).mappings().all()
        ddl_counts: dict[str, int] = {}
        for r in conn.execute(select(p.ddl_history.c.state).where(p.ddl_history.c.pipeline == pipeline)):
            ddl_counts[r[0]] = ddl_counts.get(r[0], 0) + 1
        quarantined = _quarantined_messages(conn, pipeline)
        untrusted = _quarantined_messages(conn, pipeline, UNTRUSTED)
        writer = _writer(conn, pipeline)
        streams = _streams(conn, pipeline, now)
    held = held_rows(engine, pipeline)
    if pl is None:
        return {"pipeline": pipeline, "exists": False, "consistency": consistency, "writer": writer,
                "quarantined_rows": held}
    resolved = min((int(r["resolved_ts"]) for r in parts), default=0)
    applied = int(pl["applied_ts"])
    # gated, every table is consistent as of the pipeline's applied resolved ts (the gate releases a transaction
    # only once every partition's resolved ts passed it), so its lag is each table's freshness, whenever the
    # table last changed; ungated (per-key order) there is no such point and it is how far the applier has read
    fresh = lag_seconds(applied, now)
    return {
        "pipeline": pipeline,
        "exists": True,
        "protocol": pl["protocol"],
        "consistency": consistency,
        "applied_ts": applied,
        "applied_lag_seconds": fresh,
        "consistent_as_of_ts": applied,
        "global_resolved_ts": resolved,
        "global_resolved_lag_seconds": lag_seconds(resolved, now),
        "resolved_stuck_by": resolved_stuck_by(parts),
        "batches": int(pl["batches"]),
        "rows_applied": int(pl["rows_applied"]),
        "updated_at": pl["updated_at"].isoformat() + "Z",
        "ddl": ddl_counts,
        "quarantined_messages": quarantined,
        "untrusted_timestamps": untrusted,
        "quarantined_rows": held,
        "writer": writer,
        "streams": streams,
        "partitions": [
            {"topic": r["topic"], "partition": int(r["kafka_partition"]), "restart_offset": int(r["restart_offset"]),
             "next_offset": int(r["next_offset"]), "resolved_ts": int(r["resolved_ts"])}
            for r in parts
        ],
        "tables": [
            {"source": f"{r['source_schema']}.{r['source_table']}", "target": f"{r['target_schema']}.{r['target_table']}",
             "applied_ts": int(r["applied_ts"]), "rows_applied": int(r["rows_applied"]),
             "last_change_lag_seconds": lag_seconds(int(r["applied_ts"]), now),
             "freshness_lag_seconds": fresh}
            for r in tabs
        ],
    }


NEVER_REPORTED = "never_reported"  # a partition without a resolved ts yet: the global resolved ts stays 0
LOWEST = "lowest"  # the partition(s) whose resolved ts is the minimum, below every other partition's


def resolved_stuck_by(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The partition(s) the global resolved ts (the minimum over partitions) waits for, empty when none holds
    it back (no partitions, a single partition that has reported, or all at the same resolved ts).

    A partition that never reported a resolved ts keeps the global one at 0 whatever the others say, so those
    partitions are the reason whenever there is one. Otherwise the partition(s) at the minimum are named with
    ``behind_seconds``: how far the next slowest partition is ahead of them, i.e. how much the global resolved
    ts would move if they caught up (TSO physical time, so milliseconds precision)."""
    pos = [(str(r["topic"]), int(r["kafka_partition"]), int(r["resolved_ts"])) for r in parts]
    never = [(t, n, ts) for t, n, ts in pos if ts <= 0]
    if never:
        return [{"topic": t, "partition": n, "resolved_ts": ts, "reason": NEVER_REPORTED, "behind_seconds": None}
                for t, n, ts in never]
    tss = sorted({ts for _, _, ts in pos})
    if len(tss) < 2:
        return []
    low, nxt = tss[0], tss[1]
    behind = round((tso_physical_ms(nxt) - tso_physical_ms(low)) / 1000.0, 3)
    return [{"topic": t, "partition": n, "resolved_ts": ts, "reason": LOWEST, "behind_seconds": behind}
            for t, n, ts in pos if ts == low]


def _quarantined_messages(conn: Connection, pipeline: str, reason: str | None = None) -> int | None:
    """Messages kept in applier_quarantine (those whose reason contains ``reason``, when given), counted by the
    database; None for tables before revision 0005 (status must not need a migration)."""
    if not inspect(conn).has_table(p.quarantine.name):
        return None
    q = select(func.count()).select_from(p.quarantine).where(p.quarantine.c.pipeline == pipeline)
    if reason is not None:
        q = q.where(p.quarantine.c.reason.contains(reason))
    return int(conn.execute(q).scalar() or 0)


FIRST_BLOCKED_KEYS = 5


def held_rows(engine: Engine, pipeline: str, first: int = FIRST_BLOCKED_KEYS) -> dict[str, Any] | None:
    """Held row changes and blocked keys (applier.quarantine), with the first few blocked keys in commit order;
    None for tables before revision 0010 or when they cannot be read: status must not need a migration, and it
    reads them on a connection of its own so a failure here cannot spoil the rest.

    A partition block's entry has ``table`` None and ``partition_block`` True, with the ``topic``,
    ``partition`` and ``offset`` of the message, since that position is all an operator can look it up by."""
    try:
        with engine.connect() as conn:
            if not inspect(conn).has_table(p.quarantined_rows.name):
                return None
            held, keys = RowQuarantine(pipeline).counts(conn)
            firsts = _first_blocked(conn, pipeline, first) if held else []
    except SQLAlchemyError:
        return None
    return {"held_changes": held, "blocked_keys": keys, "first_blocked": firsts}


def _first_blocked(conn: Connection, pipeline: str, first: int) -> list[dict[str, Any]]:
    """The ``first`` oldest blocked keys. A held row without a table (schema and table "") is a *partition
    block*: an undecodable message whose table could not be read, holding back every later change of its Kafka
    partition, which its topic, partition and offset name. Partition blocks are grouped by their partition
    rather than by their (empty) table name, so that blocks of two partitions stay two entries; they are read by
    a query of their own, which keeps both queries plain GROUP BYs that every dialect accepts."""
    rows = p.quarantined_rows
    held = and_(rows.c.pipeline == pipeline, rows.c.state == HELD)
    block = and_(rows.c.source_schema == "", rows.c.source_table == "")
    oldest = func.min(rows.c.commit_ts)
    keyed = conn.execute(
        select(rows.c.source_schema, rows.c.source_table, rows.c.row_key, func.count(), oldest)
        .where(held, not_(block))
        .group_by(rows.c.source_schema, rows.c.source_table, rows.c.row_key)
        .order_by(oldest, rows.c.source_schema, rows.c.source_table, rows.c.row_key)
        .limit(first)).all()
    blocks = conn.execute(
        select(rows.c.topic, rows.c.kafka_partition, rows.c.row_key, func.count(), oldest,
               func.min(rows.c.kafka_offset))
        .where(held, block)
        .group_by(rows.c.topic, rows.c.kafka_partition, rows.c.row_key)
        .order_by(oldest, rows.c.topic, rows.c.kafka_partition, rows.c.row_key)
        .limit(first)).all()
    found: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
        ((int(ts), s, t, k, "", -1),
         {"table": f"{s}.{t}", "key": k, "changes": int(n), "first_commit_ts": int(ts)})
        for s, t, k, n, ts in keyed]
    found += [
        ((int(ts), "", "", k, topic, int(part)),
         {"table": None, "key": k, "changes": int(n), "first_commit_ts": int(ts), "partition_block": True,
          "topic": topic, "partition": int(part), "offset": int(off)})
        for topic, part, k, n, ts, off in blocks]
    found.sort(key=lambda e: e[0])
    return [entry for _, entry in found[:first]]


def _blocked_name(k: dict[str, Any]) -> str:
    if k.get("partition_block"):
        return f"(unknown table) at {_printable(k['topic'])}:{k['partition']}:{k['offset']}"
    return f"{shown(k['table'])} {_printable(k['key'])}"


def _held_line(h: dict[str, Any] | None) -> list[str]:
    if h is None:
        return []
    if not h["held_changes"]:
        return ["  held row changes: none"]
    keys = ", ".join(_blocked_name(k) for k in h["first_blocked"])
    more = ", …" if h["blocked_keys"] > len(h["first_blocked"]) else ""
    return [f"  held row changes: {h['held_changes']} under {h['blocked_keys']} blocked key(s): {keys}{more} "
            "(applier quarantine list)"]


STUCK_NAMED = 8  # partitions named on the text line; the JSON lists them all


def _stuck_line(stuck: list[dict[str, Any]] | None) -> list[str]:
    if not stuck:
        return []
    names = ", ".join(f"{_printable(s['topic'])}[{s['partition']}]" for s in stuck[:STUCK_NAMED])
    if len(stuck) > STUCK_NAMED:
        names += f", … ({len(stuck) - STUCK_NAMED} more)"
    if stuck[0]["reason"] == NEVER_REPORTED:
        why = "never reported a resolved ts"
    else:
        why = f"{stuck[0]['behind_seconds']} s behind the next slowest partition"
    return [f"  global resolved ts held back by: {names} ({why})"]


def _seconds(lag: float | None) -> str:
    return "-" if lag is None else f"{lag} s"


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


def _streams(conn: Connection, pipeline: str, now: float) -> list[dict[str, Any]]:
    """Each apply stream's progress (applier_streams), in stream order; empty without apply streams or for tables
    before revision 0012 (status must not need a migration). A stream ahead of ``applied_ts`` committed a window
    the others have not finished yet."""
    if not inspect(conn).has_table(p.streams.name):
        return []
    rows = conn.execute(select(p.streams.c.stream, p.streams.c.applied_ts, p.streams.c.rows_applied)
                        .where(p.streams.c.pipeline == pipeline).order_by(p.streams.c.stream))
    return [{"stream": int(n), "applied_ts": int(ts), "rows_applied": int(r), "lag_seconds": lag_seconds(int(ts), now)}
            for n, ts, r in rows]


def _utc(t: Any) -> str | None:
    return None if t is None else t.isoformat() + "Z"


def _writer_line(w: dict[str, Any] | None) -> str:
    if not w:
        return "  writer: none claimed yet"
    return (f"  writer: epoch {w['epoch']}, {w['holder']}, claimed {w['claimed_at']}, "
            f"last transaction {w['heartbeat_at']}")


def _untrusted_line(n: int | None) -> list[str]:
    if not n:
        return []
    return [f"  untrusted timestamps: {n} message(s) refused, their commit or resolved ts ahead of this host's clock "
            "beyond source.max_clock_skew (or not a TSO); `applier quarantine list` shows them"]


def format_status(st: dict[str, Any]) -> str:
    """``applier status`` as text: one line per fact an operator checks, one per partition and per table."""
    if not st.get("exists"):
        return "\n".join([f"pipeline {st['pipeline']}: no progress recorded yet (it has never applied a batch)",
                          _writer_line(st.get("writer")), *_held_line(st.get("quarantined_rows"))])
    quarantined = st["quarantined_messages"]
    lines = [
        f"pipeline {st['pipeline']} ({st['protocol']}, {st['consistency']})",
        f"  applied resolved ts  {st['applied_ts']}  (lag {_seconds(st['applied_lag_seconds'])})",
        f"  global resolved ts   {st['global_resolved_ts']}  (lag {_seconds(st['global_resolved_lag_seconds'])})",
        *_stuck_line(st.get("resolved_stuck_by")),
        f"  batches {st['batches']}, row changes applied {st['rows_applied']}, DDL {st['ddl'] or {}}, "
        f"quarantined {'-' if quarantined is None else quarantined}, updated {st['updated_at']}",
        _writer_line(st.get("writer")),
        *_held_line(st.get("quarantined_rows")),
        *_untrusted_line(st.get("untrusted_timestamps")),
        *(f"  stream {s['stream']}  applied ts {s['applied_ts']}  (lag {_seconds(s['lag_seconds'])})  "
          f"row changes {s['rows_applied']}" for s in st.get("streams") or ()),
        "  partitions:",
    ]
    for r in st["partitions"]:
        lines.append(f"    {r['topic']}[{r['partition']}]  restart {r['restart_offset']}  next {r['next_offset']}  "
                     f"resolved {r['resolved_ts']}")
    lines.append("  tables:")
    for r in st["tables"]:
        lines.append(f"    {r['source']} -> {r['target']}  applied ts {r['applied_ts']}  "
                     f"row changes {r['rows_applied']}  last change {_seconds(r.get('last_change_lag_seconds'))} ago  "
                     f"freshness lag {_seconds(r.get('freshness_lag_seconds'))}")
    return "\n".join(lines)
