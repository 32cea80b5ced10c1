"""Without ``--upstream``: check the applier's own tables of a pipeline (the invariants its progress rows keep,
and that every table it applied to still exists).

Why: the replica's rows cannot be compared without the upstream, but a broken progress row (a restart offset past
the next offset, a partition behind the applied ts, a DDL stuck half-run) shows a replica that is or will be
wrong.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from sqlalchemy import inspect, select
from sqlalchemy.engine import Engine

from applier import progress as p
from applier.sinks.table import shown


@dataclass(frozen=True)
class Finding:
    problem: bool
    text: str


TSO_FUTURE_SLACK_MS = 3_600_000  # clock skew allowed between PD and this host


def _tso_ms(ts: int) -> int:
    return ts >> 18


def check_progress_rows(pipeline_row: Mapping[str, Any] | None, partitions: Sequence[Mapping[str, Any]],
                        tables: Sequence[Mapping[str, Any]], ddl: Sequence[Mapping[str, Any]], *, gated: bool,
                        subscribed: Callable[[str], bool], now_ms: int | None = None,
                        streams: Sequence[Mapping[str, Any]] = ()) -> list[Finding]:
    """The invariants the progress rows keep (pure: rows in, findings out).

    The per-partition resolved ts is the partition's resolved ts *as of its restart offset* (applier/gate.py),
    which may lie below the applied ts while the partition holds events; only a partition holding nothing
    (restart offset = next offset) must have reached the applied ts. A table is applied past the pipeline's
    applied ts only by an apply stream that committed a window the others have not (``streams``, the
    applier_streams rows): never past the furthest stream."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    out: list[Finding] = []
    applied = int(pipeline_row["applied_ts"]) if pipeline_row is not None else None
    if applied is not None and _tso_ms(applied) > now_ms + TSO_FUTURE_SLACK_MS:
        out.append(Finding(True, f"applier_pipelines.applied_ts {applied} lies "
                           f"{(_tso_ms(applied) - now_ms) // 1000} s in the future (a TSO from another clock, or a "
                           "row written by hand)"))
    for r in partitions:
        where = f"applier_partitions {shown(str(r['topic']))}[{r['kafka_partition']}]"
        restart, nxt, res = int(r["restart_offset"]), int(r["next_offset"]), int(r["resolved_ts"])
        if restart < 0 or nxt < 0:
            out.append(Finding(True, f"{where}: negative offset (restart {restart}, next {nxt})"))
        if restart > nxt:
            out.append(Finding(True, f"{where}: restart offset {restart} > next offset {nxt}: a restart would skip "
                               f"offsets {nxt}..{restart - 1}"))
        if _tso_ms(res) > now_ms + TSO_FUTURE_SLACK_MS:
            out.append(Finding(True, f"{where}: resolved ts {res} lies {(_tso_ms(res) - now_ms) // 1000} s in the "
                               "future"))
        if (gated and applied is not None and restart == nxt and res < applied and subscribed(str(r["topic"]))):
            out.append(Finding(True, f"{where}: holds no events (restart offset = next offset) but its resolved ts "
                               f"{res} is below the applied ts {applied}: rows above its resolved ts were applied"))
    ceiling = max([applied or 0, *(int(s["applied_ts"]) for s in streams)])
    for r in tables:
        name = f"{shown(str(r['source_schema']), str(r['source_table']))}"
        if applied is not None and int(r["applied_ts"]) > ceiling:
            whose = "the pipeline's" if ceiling == applied else "every apply stream's, the furthest at"
            out.append(Finding(True, f"applier_tables {name}: applied ts {r['applied_ts']} is above {whose} "
                               f"{ceiling}"))
    for r in ddl:
        if r["state"] == "started":
            out.append(Finding(True, f"applier_ddl_history {r['ddl_key']} (commit ts {r['commit_ts']}, "
                               f"{shown(str(r['source_schema']), str(r['source_table']))}) is stuck in 'started' "
                               f"since {r['started_at']}: the applier stopped while running it. Restart the "
                               f"applier (it runs it again) and check the table; the query: "
                               f"{str(r['query'])[:200]!r}"))
    return out


def check_applier_tables(engine: Engine, *, pipeline: str, gated: bool,
                         subscribed: Callable[[str], bool]) -> list[Finding]:
    """Read the applier's tables of ``pipeline`` and check them (:func:`check_progress_rows`), plus that every
    table in applier_tables exists in the target."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(p.pipelines.name):
            return [Finding(True, "the applier's tables do not exist in the target: run `applier migrate -c CONF` "
                            "(or `applier run`, which creates them)")]
        row = conn.execute(select(p.pipelines).where(p.pipelines.c.pipeline == pipeline)).mappings().first()
        parts = conn.execute(select(p.partitions).where(p.partitions.c.pipeline == pipeline)
                             .order_by(p.partitions.c.topic, p.partitions.c.kafka_partition)).mappings().all()
        tabs = conn.execute(select(p.tables).where(p.tables.c.pipeline == pipeline)).mappings().all()
        ddl = conn.execute(select(p.ddl_history).where(p.ddl_history.c.pipeline == pipeline)
                           .order_by(p.ddl_history.c.commit_ts)).mappings().all()
        quarantined = conn.execute(select(p.quarantine.c.id).where(p.quarantine.c.pipeline == pipeline)).all()
        streams = (conn.execute(select(p.streams).where(p.streams.c.pipeline == pipeline)).mappings().all()
                   if inspect(conn).has_table(p.streams.name) else [])
        out = check_progress_rows(row, parts, tabs, ddl, gated=gated, subscribed=subscribed, streams=streams)
        for r in tabs:
            ts, tt = str(r["target_schema"]), str(r["target_table"])
            if not inspect(conn).has_table(tt, schema=ts or None):
                out.append(Finding(True, f"applier_tables {shown(str(r['source_schema']), str(r['source_table']))}"
                                   f": its target {shown(ts, tt)} does not exist (dropped by hand?)"))
    if row is None:
        out.insert(0, Finding(False, f"pipeline {pipeline!r} has no progress yet (it has never applied a batch)"))
    else:
        out.insert(0, Finding(False, f"pipeline {pipeline!r}: applied ts {row['applied_ts']}, {len(parts)} "
                              f"partition(s), {len(tabs)} table(s), {len(ddl)} DDL recorded"))
    if quarantined:
        out.append(Finding(False, f"{len(quarantined)} message(s) quarantined (applier_quarantine): their changes "
                           "are not in the replica"))
    return out


def topic_matcher(topics: Sequence[str] | None, pattern: str | None) -> Callable[[str], bool]:
    """Whether a topic is one the config subscribes to (progress rows of other topics are an older config's)."""
    import re

    if topics is not None:
        names = set(topics)
        return names.__contains__
    rx = re.compile(pattern or ".*")
    return lambda t: rx.fullmatch(t) is not None
