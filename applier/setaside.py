"""Rows the target refuses, under ``on_apply_error = "quarantine" | "skip"``: find them, set them aside, and keep
every later change of a quarantined key behind them.

A batch the target refuses is written again without the refused row: the row is found by halves, each try in a
savepoint that is rolled back (nothing of a try is kept; the writer forgets what it made inside it), and every
change of that row's key in the batch is set aside (:mod:`applier.quarantine`). Under quarantine the key is then
*blocked*: its later changes are held too, in commit order, whatever the policy of a later run, so nothing newer
overtakes the held change. Under skip they are recorded as skipped and later changes apply.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sqlalchemy.engine import Connection

from applier.events import RowChange
from applier.events import SourcePosition
from applier.quarantine import WHOLE_TABLE, RowQuarantine, key_text, keys_of
from applier.sinks import ApplyError, BatchPlan, Sink, db_reason, plan_batch
from applier.sinks.table import TableMeta, shown
from applier.timing import StageTimer

log = logging.getLogger("applier.setaside")

MAX_REFUSED_PER_CHUNK = 1000  # rows set aside in one table's chunk before the run stops instead


def find_refused(plan: BatchPlan, attempt: Callable[[BatchPlan], str | None]) -> tuple[tuple, str] | None:
    """The key of a row (upsert or delete) of ``plan`` that the target refuses on its own, and the reason, found
    by halves: ``attempt`` writes a sub-plan without keeping it and returns the refusal or None. None when the
    whole plan goes through, or no single row fails alone."""
    meta = plan.meta
    units: list[tuple[str, Any]] = [("d", k) for k in plan.deletes] + [("u", r) for r in plan.upserts]

    def sub(part: list[tuple[str, Any]]) -> str | None:
        return attempt(BatchPlan(meta, deletes=[u for t, u in part if t == "d"],
                                 upserts=[u for t, u in part if t == "u"]))

    reason = sub(units)
    if reason is None:
        return None
    while len(units) > 1:
        half = units[: len(units) // 2]
        r = sub(half)
        if r is None:
            half = units[len(units) // 2:]
            r = sub(half)
            if r is None:
                return None  # each half goes through alone: the rows only fail together
        units, reason = half, r
    kind, unit = units[0]
    return (tuple(unit) if kind == "d" else tuple(unit[k] for k in meta.key)), reason


class SetAside:
    """The blocked keys of one pipeline and the writes that set refused rows aside."""

    def __init__(self, sink: Sink, quarantine: RowQuarantine, timer: StageTimer, *, replace_mode: bool) -> None:
        self.sink = sink
        self.quarantine = quarantine
        self.timer = timer
        self.replace_mode = replace_mode
        # upstream (schema, table) -> its keys with held changes; loaded in the first transaction, dropped
        # whenever one rolls back (it may have added keys that were never committed)
        self._blocked: dict[tuple[str, str], set[str]] | None = None

    def load(self, conn: Connection) -> None:
        if self._blocked is None:
            self._blocked = {}
            for schema, table, k in self.quarantine.blocked(conn):
                self._blocked.setdefault((schema, table), set()).add(k)

    def forget(self) -> None:
        """The transaction rolled back: reload the blocked keys from the target next time."""
        self._blocked = None

    def block_table(self, conn: Connection, schema: str, table: str, position: SourcePosition, reason: str) -> None:
        """An undecodable message of this upstream table: hold every later change of the table behind it."""
        assert self._blocked is not None, "load() runs at the start of every transaction"
        self.quarantine.block_table(conn, schema, table, position, reason)
        self._blocked.setdefault((schema, table), set()).add(WHOLE_TABLE)

    def hold_blocked(self, conn: Connection, meta: TableMeta, changes: list[RowChange]) -> tuple[list[RowChange], int]:
        """Hold every change of a blocked key (in commit order, behind the held ones), whatever the policy in
        force now: letting it through would overtake the change that is held. Returns (the rest, held count)."""
        blocked = self._blocked.get((changes[0].schema, changes[0].table)) if self._blocked and changes else None
        if not blocked:
            return changes, 0
        keep = []
        n = 0
        whole = WHOLE_TABLE in blocked
        for ch in changes:
            ks = keys_of(ch, meta.key)
            hit = WHOLE_TABLE if whole else next((k for k in ks if k in blocked), None)
            if hit is None:
                keep.append(ch)
                continue
            blocked.update(ks)  # a key-changing update blocks its new key too
            why = ("held behind an undecodable message of this table" if hit == WHOLE_TABLE else
                   f"held behind an earlier change of key {hit} that is quarantined")
            for k in ks:
                self.quarantine.hold(conn, ch, k, kind="blocked", reason=why)
            n += 1
        return keep, n

    def write(self, conn: Connection, meta: TableMeta, changes: list[RowChange],
              policy: str) -> tuple[list[RowChange], int]:
        """Write the changes; when the target refuses the batch, find the refused row, set every change of its
        key in the batch aside (quarantine: held, and the key blocked; skip: recorded as skipped), and write the
        rest again. Returns (the changes written, the count set aside)."""
        aside_total = 0
        for _ in range(MAX_REFUSED_PER_CHUNK):
            if not changes:
                return changes, aside_total
            with self.timer.span("plan"):
                plan = plan_batch(meta, changes, replace=self.replace_mode)
            failed = self.in_savepoint(conn, lambda: self.sink.write(conn, plan))
            if failed is None:
                self.timer.count("rows_upserted", len(plan.upserts))
                self.timer.count("rows_deleted", len(plan.deletes))
                return changes, aside_total
            found = find_refused(
                plan, lambda sub: self.in_savepoint(conn, lambda: self.sink.write(conn, sub), keep=False))
            if found is None:
                first, last = changes[0].position, changes[-1].position
                raise ApplyError(
                    f"writing {len(changes)} change(s) of upstream table {shown(changes[0].schema, changes[0].table)} "
                    f"into {meta.display} failed (events from {first} to {last}): {failed}; no single row fails on "
                    "its own, so none can be set aside: fix the target and rerun")
            refused_key, reason = key_text(found[0]), found[1]
            aside = [ch for ch in changes if refused_key in keys_of(ch, meta.key)]
            changes = [ch for ch in changes if refused_key not in keys_of(ch, meta.key)]
            self._set_aside(conn, meta, aside, refused_key, reason, policy)
            aside_total += len(aside)
        raise ApplyError(f"more than {MAX_REFUSED_PER_CHUNK} rows of {meta.display} refused in one batch: stopping "
                         "rather than setting them all aside; fix the target and rerun")

    def _set_aside(self, conn: Connection, meta: TableMeta, aside: list[RowChange], refused_key: str, reason: str,
                   policy: str) -> None:
        state = "skipped" if policy == "skip" else "held"
        blocked = None
        if state == "held":
            assert self._blocked is not None, "load() runs at the start of every transaction"
            blocked = self._blocked.setdefault((aside[0].schema, aside[0].table), set())
        for i, ch in enumerate(aside):
            ks = keys_of(ch, meta.key)
            if blocked is not None:
                blocked.update(ks)
            for k in ks:
                self.quarantine.hold(conn, ch, k, kind="refused" if i == 0 else "blocked", state=state,
                                     reason=f"the target refused key {refused_key} of {meta.display}: {reason}")
        log.error("%s %d change(s) of key %s of upstream table %s (from %s): the target refused it: %s",
                  "skipped" if state == "skipped" else "quarantined", len(aside), refused_key,
                  shown(aside[0].schema, aside[0].table), aside[0].position, reason)

    def in_savepoint(self, conn: Connection, write: Callable[[], object], keep: bool = True) -> str | None:
        """Run ``write`` in a savepoint: None when it worked (kept, or rolled back when not ``keep``), else the
        database's reason, with the savepoint rolled back."""
        state: Any = self.sink.savepoint_state(conn)
        sp = conn.begin_nested()
        try:
            write()
        except Exception as exc:
            sp.rollback()
            self.sink.rolled_back_to(conn, state)
            return db_reason(exc)
        if keep:
            sp.commit()
        else:
            sp.rollback()
            self.sink.rolled_back_to(conn, state)
        return None
