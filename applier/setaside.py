"""Rows the target refuses, under ``on_apply_error = "quarantine" | "skip"``: find them, set them aside, and keep
every later change of a quarantined key behind them.

A batch the target refuses is written again without the refused row: the row is found by halves, each try in a
savepoint that is rolled back (nothing of a try is kept; the writer forgets what it made inside it), and every
change of that row's key in the batch is set aside (:mod:`applier.quarantine`). Under quarantine the key is then
*blocked*: its later changes are held too, in commit order, whatever the policy of a later run, so nothing newer
overtakes the held change. Under skip they are recorded as skipped and later changes apply.

An undecodable message quarantined under ``on_decode_error`` blocks the same way, one level up: its whole table,
or, when not even its table can be read, every change read from its Kafka partition after it.

A table without a key has no row key to hold: its changes apply in order, each one depending on the rows the
earlier ones left, so the refused change is the first one a prefix of the batch fails on, and under quarantine it
and every later change of the table are held under the key ``*`` (the whole table is blocked); under skip only
the refused change is recorded and the rest is written again.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable

from sqlalchemy.engine import Connection

from applier.events import RowChange
from applier.events import SourcePosition
from applier.quarantine import (
    HELD, UNKNOWN_TABLE, WHOLE_TABLE, Partition, RowQuarantine, UndecodableMessage, key_text, keys_of,
)
from applier.sinks import ApplyError, BatchPlan, Sink, db_reason, plan_batch
from applier.sinks.table import TableMeta, shown
from applier.timing import StageTimer

log = logging.getLogger("applier.setaside")

MAX_REFUSED_PER_CHUNK = 1000  # rows set aside in one table's chunk before the run stops instead


def find_refused(plan: BatchPlan, attempt: Callable[[BatchPlan], str | None]) -> tuple[tuple, str] | None:
    """The key of a row (upsert or delete) of ``plan`` that the target refuses on its own, and the reason, found
    by halves: ``attempt`` writes a sub-plan without keeping it and returns the refusal or None. None when the
    whole plan goes through, or no single row fails alone, or the table has no key (a keyless plan)."""
    meta = plan.meta
    if plan.keyless:  # no row key to name, and its changes depend on each other: see SetAside.write
        return None
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
        # upstream (schema, table), or UNKNOWN_TABLE for messages whose table cannot be read -> (topic, partition)
        # -> offset of the first held undecodable message there
        self._blocks: dict[tuple[str, str], dict[Partition, int]] = {}

    def load(self, conn: Connection) -> None:
        if self._blocked is None:
            self._blocked = {}
            for schema, table, k in self.quarantine.blocked(conn):  # WHOLE_TABLE: a table without a key
                self._blocked.setdefault((schema, table), set()).add(k)
            self._blocks = self.quarantine.blocks(conn)

    def forget(self) -> None:
        """The transaction rolled back: reload the blocked keys from the target next time."""
        self._blocked = None
        self._blocks = {}

    def block(self, conn: Connection, u: UndecodableMessage) -> None:
        """An undecodable message: record it and, when held, hold every later change of its table (or of its
        partition, when its table is unknown) behind it."""
        assert self._blocked is not None, "load() runs at the start of every transaction"
        if not self.quarantine.block(conn, u) or u.state != HELD:
            return
        pos = u.message.position
        at = self._blocks.setdefault(u.table or UNKNOWN_TABLE, {})
        tp = (pos.topic, pos.partition)
        at[tp] = min(at.get(tp, pos.offset), pos.offset)

    def behind_block(self, table: tuple[str, str], pos: SourcePosition) -> SourcePosition | None:
        """The undecodable message that what was read at ``pos`` (of ``table``) must wait behind, or None.

        Within one partition the offsets give the order (TiCDC writes a partition in commit order), so what was
        read before the message goes on. Across partitions there is no order to rely on, so a change of a
        blocked table waits whatever partition it came from; a partition block (table unknown) holds only its
        own partition, which with TiCDC's table, index-value and column dispatchers holds every later change
        of the message's row."""
        if not self._blocks:
            return None
        tp = (pos.topic, pos.partition)
        for (topic, partition), at in self._blocks.get(table, {}).items():
            if (topic, partition) != tp or pos.offset > at:
                return SourcePosition(topic, partition, at)
        at = self._blocks.get(UNKNOWN_TABLE, {}).get(tp)
        return SourcePosition(pos.topic, pos.partition, at) if at is not None and pos.offset > at else None

    def ddl_waits_for(self, pos: SourcePosition, names: Iterable[tuple[str, str]]) -> str | None:
        """Why a DDL read at ``pos`` that acts on upstream ``names`` (``table == ""``: a whole schema) must not
        run yet, or None: quarantined changes older than it of a table it acts on, or an undecodable message it
        might overtake. Run first, it would change (or drop, or truncate) the table under them, and a later
        ``applier quarantine retry`` would apply them to the new table (re-creating rows a TRUNCATE removed
        upstream)."""
        assert self._blocked is not None, "load() runs at the start of every transaction"
        tables: set[tuple[str, str]] = set()
        for schema, table in names:
            known = set(self._blocked) | set(self._blocks)
            tables.update(t for t in known if t[0] == schema and (not table or t[1] == table))
        for t in sorted(tables):
            if self._blocked.get(t):
                return (f"upstream table {shown(*t)} has quarantined row changes older than it. Retry or discard them "
                        f"first (`applier quarantine retry -c CONF --table {shown(*t)}`, or `discard ... --reason "
                        "TEXT`)")
            at = self.behind_block(t, pos)
            if at is not None:
                return (f"upstream table {shown(*t)} is blocked by the undecodable message at {at}. Retry or discard "
                        "it first (`applier quarantine list` shows its id)")
        for (topic, partition), offset in sorted(self._blocks.get(UNKNOWN_TABLE, {}).items()):
            if (topic, partition) != (pos.topic, pos.partition) or pos.offset > offset:
                return (f"the undecodable message at {SourcePosition(topic, partition, offset)} is held and its table "
                        "cannot be read, so the DDL might overtake it. Retry or discard it first (`applier quarantine "
                        "list` shows its id)")
        return None

    def idle(self) -> bool:
        """Nothing is held back (no quarantined key, no undecodable message blocking a table or partition): every
        change may be written as it comes. Valid after :meth:`load`."""
        return not (self._blocked or self._blocks)

    def hold_blocked(self, conn: Connection, meta: TableMeta, changes: list[RowChange]) -> tuple[list[RowChange], int]:
        """Hold every change of a blocked key, and every change behind an undecodable message (in commit order,
        behind the held ones), whatever the policy in force now: letting it through would overtake the change
        that is held. Returns (the rest, held count)."""
        if not changes or not (self._blocked or self._blocks):
            return changes, 0
        assert self._blocked is not None, "load() runs at the start of every transaction"
        table = (changes[0].schema, changes[0].table)
        blocked = self._blocked.get(table)
        if not blocked and not self._blocks:
            return changes, 0
        keep = []
        n = 0
        for ch in changes:
            ks = keys_of(ch, meta.key)
            if not blocked:
                hit = None
            elif WHOLE_TABLE in blocked:  # held while the table had no key: everything waits behind it
                hit = WHOLE_TABLE
            else:
                hit = next((k for k in ks if k in blocked), None)
            behind = None if hit is not None else self.behind_block(table, ch.position)
            if hit is None and behind is None:
                keep.append(ch)
                continue
            if blocked is None:
                blocked = self._blocked[table] = set()
            blocked.update(ks)  # a key-changing update blocks its new key too
            if behind is None and hit == WHOLE_TABLE:
                why = "held behind an earlier change of this table (it has no key) that is quarantined"
            elif behind is None:
                why = f"held behind an earlier change of key {hit} that is quarantined"
            elif self._blocks.get(table, {}).get((behind.topic, behind.partition)) == behind.offset:
                why = f"held behind the undecodable message of this table at {behind}"
            else:
                why = f"held behind the undecodable message at {behind}, whose table cannot be read (it blocks its partition)"
            for k in ks:
                self.quarantine.hold(conn, ch, k, kind="blocked", reason=why)
            n += 1
        return keep, n

    def write(self, conn: Connection, meta: TableMeta, changes: list[RowChange],
              policy: str) -> tuple[list[RowChange], int]:
        """Write the changes; when the target refuses the batch, find the refused row, set every change of its
        key in the batch aside (quarantine: held, and the key blocked; skip: recorded as skipped), and write the
        rest again. Returns (the changes written, the count set aside). A table without a key: see the module
        docstring (:meth:`_write_keyless`)."""
        if not meta.key:
            return self._write_keyless(conn, meta, changes, policy)
        aside_total = 0
        for _ in range(MAX_REFUSED_PER_CHUNK):
            if not changes:
                return changes, aside_total
            with self.timer.span("plan"):
                plan = plan_batch(meta, changes, replace=self.replace_mode)
            failed = self.in_savepoint(conn, lambda: self.sink.write(conn, plan))
            if failed is None:
                upserted, deleted = plan.written()
                self.timer.count("rows_upserted", upserted)
                self.timer.count("rows_deleted", deleted)
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
        if refused_key == WHOLE_TABLE:
            refused = (f"the target refused the change at {aside[0].position} of {meta.display}, a table without a "
                       f"key (every later change of it waits behind it): {reason}")
        else:
            refused = f"the target refused key {refused_key} of {meta.display}: {reason}"
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
                                     reason=refused)
        log.error("%s %d change(s) of key %s of upstream table %s (from %s): the target refused it: %s",
                  "skipped" if state == "skipped" else "quarantined", len(aside), refused_key,
                  shown(aside[0].schema, aside[0].table), aside[0].position, reason,
                  extra={"position": aside[0].position})

    # ---- keyless tables ----------------------------------------------------------------------------------

    def _write_keyless(self, conn: Connection, meta: TableMeta, changes: list[RowChange],
                       policy: str) -> tuple[list[RowChange], int]:
        """:meth:`write` for a table without a key: the refused change is the first one the shortest failing
        prefix ends with (found by halves, each try in a savepoint rolled back); what precedes it is written and
        kept. Quarantine holds it and every later change of the table under :data:`WHOLE_TABLE`; skip records it
        alone and writes the rest again."""
        written: list[RowChange] = []
        aside_total = 0
        for _ in range(MAX_REFUSED_PER_CHUNK):
            if not changes:
                return written, aside_total
            failed = self._try_keyless(conn, meta, changes, keep=True)
            if failed is None:
                return written + changes, aside_total
            n, reason = self._first_refused(conn, meta, changes, failed)
            if n and self._try_keyless(conn, meta, changes[:n], keep=True) is not None:
                raise ApplyError(  # it went through a moment ago in this same transaction
                    f"writing the {n} change(s) of {meta.display} before the refused one at {changes[n].position} "
                    "failed on a second try: fix the target and rerun")
            written += changes[:n]
            aside = changes[n:n + 1] if policy == "skip" else changes[n:]
            changes = changes[n + 1:] if policy == "skip" else []
            self._set_aside(conn, meta, aside, WHOLE_TABLE, reason, policy)
            aside_total += len(aside)
        raise ApplyError(f"more than {MAX_REFUSED_PER_CHUNK} rows of {meta.display} refused in one batch: stopping "
                         "rather than setting them all aside; fix the target and rerun")

    def _first_refused(self, conn: Connection, meta: TableMeta, changes: list[RowChange],
                       reason: str) -> tuple[int, str]:
        """The index of the change the shortest failing prefix of ``changes`` ends with, and its refusal: a
        prefix that fails stays failing when longer (the changes apply in order), so halving finds it."""
        ok, bad = 0, len(changes)  # the prefix of length ok goes through, the one of length bad fails
        while bad - ok > 1:
            mid = (ok + bad) // 2
            r = self._try_keyless(conn, meta, changes[:mid], keep=False)
            if r is None:
                ok = mid
            else:
                bad, reason = mid, r
        return bad - 1, reason

    def _try_keyless(self, conn: Connection, meta: TableMeta, changes: list[RowChange], *, keep: bool) -> str | None:
        with self.timer.span("plan"):
            plan = plan_batch(meta, changes, replace=self.replace_mode)
        return self.in_savepoint(conn, lambda: self.sink.write(conn, plan), keep=keep)

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
