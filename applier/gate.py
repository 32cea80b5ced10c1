"""Resolved-ts gate: decide which decoded events to hold, and release them once upstream commit timestamps are
known complete, in commit-ts order.

Pure Python: no Spark, no database. The pipeline feeds it decoded events and asks it, once per micro-batch,
what is ready; the apply stage commits the :class:`Release` and then forgets it. Where held events live (in
memory, or spilled to disk beyond a budget) is :mod:`applier.spill`'s job; this module keeps the rules.

Why each rule exists (architecture invariants):

* Global resolved ts (1) is the minimum over *every* partition of every subscribed topic of the largest resolved
  ts seen there. A partition that never reported holds it at 0, so rows of a partition that is merely slow are
  never applied ahead of it. Replayed older watermarks are ignored: the per-partition value never moves back.
* Gating (2): only events with ``commit_ts <= global resolved`` are released.
* Order (3): released events come in ``(commit_ts, topic, partition, offset, index)`` order. One row key always
  lives in one partition, so this is TiCDC's per-key order, and the commit-ts order makes a DDL a barrier
  between the changes of its table before and after it.
* Duplicates (4): an event is dropped only when ``commit_ts <= applied_ts`` (the resolved ts already applied, or
  for a new pipeline ``source.start_ts``: the snapshot the replica was seeded from already holds those changes),
  or at or below its table's floor (``table_floors``: with apply streams, a table whose stream committed past the
  pipeline's applied ts before a crash), or when it is the same change as one still held (:func:`_row_identity`:
  compared exactly, never by a hash alone). Anything else above the applied ts is kept even when it arrives after
  newer ones — dropping those lost rows in TiCDC's own consumer (ticdc#4051). Broadcast DDL (one copy per
  partition) is kept once. A change of a table without key columns is never taken for a copy by its content,
  since such a table may hold identical rows (:func:`_keyless_identity`): its re-sent copies are kept
  (at-least-once; README, "Keyless tables").
* Nothing lost on restart (7): :meth:`Gate.restart_offsets` is, per partition, the lowest offset of any event
  still held (in memory or spilled), so re-reading Kafka from there rebuilds the held set after a crash.
* Bounded memory (8): held events beyond ``budget_bytes`` spill to local disk (:class:`applier.spill.RunStore`).
* Stopping at a ts (``applier run --until-ts``): ``until_ts`` caps every release, so the applied resolved ts stops
  at exactly that ts even when the global resolved ts is beyond it, and the replica is consistent as of it.

Cost model: a single upstream transaction can hold millions of events for many micro-batches, so nothing that
runs per micro-batch or per progress save may scan the held events. The duplicate filter is kept per commit ts
and dropped a whole ts at a time; restart offsets and held bytes are kept incrementally by the run store.
"""

from __future__ import annotations

import bisect
import heapq
import os
import sys
from dataclasses import dataclass
from operator import attrgetter
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Mapping

from applier.events import DDL, Event, Resolved, RowChange
from applier.spill import Arrivals, Held, RunStore, Taken, TopicPartition

if TYPE_CHECKING:
    from applier.columnar.held import BatchStore, BatchTaken
    from applier.columnar.rows import RowBatch

_COMMIT_TS = attrgetter("commit_ts")


def ddl_identity(ev: DDL) -> tuple[int, str, str, str]:
    return (ev.commit_ts, ev.schema, ev.table, ev.query)


def _content(ev: RowChange) -> tuple:
    """A row change's content (not its position): a re-sent copy has the same. Keys and values go as two tuples
    rather than as ``items()`` pairs: the same information (order included) without building one 2-tuple per
    column. ``_value_`` is the enum's plain attribute; ``.value`` and ``Enum.__hash__`` are Python-level calls,
    too slow to pay once per held row."""
    b, a = ev.before, ev.after
    op = ev.op
    return (ev.schema, ev.table, getattr(op, "_value_", op),
            None if b is None else tuple(b), None if b is None else tuple(b.values()),
            None if a is None else tuple(a), None if a is None else tuple(a.values()))


def _content_hash(content: tuple) -> int:
    try:
        return hash(content)
    except TypeError:  # an unhashable value (should not happen with decoded values): fall back to its text
        return hash(repr(content))


_NO_ROW = object()  # the before (insert) or after (delete) image a change does not have


def _row_identity(ev: RowChange, key_names: tuple[str, ...]) -> tuple:
    """What a held row change is compared by to decide that another one is its re-sent copy (invariant 4).

    Exact, not a hash: a 64-bit hash lets two different changes collide (Python hashes -1 and -2 alike, so
    the rows with keys -1 and -2 of one transaction once collided and one was dropped), and upstream values are
    untrusted input that could be made to collide on purpose. Within one commit ts TiKV keeps one change per
    row key, so (table, op, before key, after key) names one change exactly; it is much smaller than the row,
    and the held identities must not keep spilled rows in memory. The content hash rides along, so that a
    decoder's wrong key flags alone never make two different changes count as the same. A change without key
    columns is not compared here: see :func:`_keyless_identity`."""
    content = _content(ev)
    b, a = ev.before, ev.after
    if len(key_names) == 1:
        k = key_names[0]
        bk = _NO_ROW if b is None else b.get(k, _NO_ROW)
        ak = _NO_ROW if a is None else a.get(k, _NO_ROW)
    else:
        bk = _NO_ROW if b is None else tuple([b.get(k, _NO_ROW) for k in key_names])
        ak = _NO_ROW if a is None else tuple([a.get(k, _NO_ROW) for k in key_names])
    # content[2] is the op's plain value: Enum.__hash__ is a Python-level call, too slow once per held row
    return (_content_hash(content), content[2], ev.schema, ev.table, bk, ak)


def row_identity(ev: RowChange) -> tuple:
    """:func:`_row_identity` with the key names of the event's own columns (for a keyed change)."""
    return _row_identity(ev, tuple(c.name for c in ev.columns if c.key))


def _keyless_identity(ev: RowChange, nth: int) -> tuple:
    """The identity of a change without key columns (a table without a primary or unique key): where it was read
    (topic, partition, offset, and ``nth``, its place among such changes of that one Kafka message), not what it
    holds. Two identical rows inserted by one upstream transaction are two changes with equal content, and
    comparing by content dropped one of them; so only the same record read twice counts as a copy, and a
    TiCDC re-send (another offset) is kept: such tables are at-least-once (README, "Keyless tables")."""
    pos = ev.position
    return ("keyless", pos.topic, pos.partition, pos.offset, nth, _content_hash(_content(ev)))


def _live_floors(floors: Mapping[tuple[str, str], int] | None, applied_ts: int) -> dict[tuple[str, str], int]:
    """The table floors above ``applied_ts``: one at or below it drops nothing the applied ts does not."""
    return {t: ts for t, ts in (floors or {}).items() if ts > applied_ts}


@dataclass(frozen=True)
class PartitionCheckpoint:
    restart_offset: int  # re-read from here after a crash
    resolved_ts: int  # this partition's resolved ts as of restart_offset
    next_offset: int  # one past the last offset read (for status)


class Gate:
    """Holds row and DDL events above the applied resolved ts until the global resolved ts passes them."""

    def __init__(
        self,
        *,
        partitions: Iterable[TopicPartition] = (),
        applied_ts: int = 0,
        partition_resolved: dict[TopicPartition, int] | None = None,
        budget_bytes: int = 512 * 1024 * 1024,
        spill_dir: str | os.PathLike[str] | None = None,
        seen_ddl: Iterable[tuple[int, str, str, str]] = (),
        gated: bool = True,
        upstream_holds: Callable[[], tuple[dict[TopicPartition, int], int | None]] | None = None,
        until_ts: int | None = None,
        table_floors: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        """``gated=False`` is for protocols without a watermark: everything is released at once, in offset
        order per partition, and nothing is dropped by commit ts (it may be unknown).

        ``upstream_holds`` reports what an earlier stage (a decoder waiting for a table schema) holds: the
        lowest offset per partition and the smallest commit ts. The gate never releases at or above that ts
        and never reports a restart offset above those offsets, so held messages are neither overtaken nor
        lost on restart.

        ``table_floors`` (gated only; an ungated gate ignores them, as it drops nothing by commit ts) maps an
        upstream (schema, table) to the ts already applied for that table (``applier_tables.applied_ts``): with
        apply streams a crash between two streams' commits leaves some tables applied past the pipeline's applied
        ts, and a row or DDL event of such a table with ``commit_ts <= floor`` is a duplicate (counted in
        ``duplicates_dropped``, as the events at or below the applied ts are). Other tables are unaffected, and a
        floor at or below the applied ts says nothing more than the applied ts: those are dropped here, and the
        others once :meth:`forget` moves the applied ts past them.

        ``until_ts`` (gated only) caps every release at that ts: nothing committed after it is released even when
        the global resolved ts is beyond it, so once the global resolved ts reaches it the applied resolved ts is
        exactly ``until_ts`` (:attr:`reached_until_ts`). Events above it stay held, and so stay in the restart
        offsets, for a later run. An ungated stream has no resolved ts that could say everything up to a ts
        arrived, so it is refused.
        """
        if until_ts is not None and not gated:
            raise ValueError("until_ts needs a gated stream: without resolved ts nothing says when every change up "
                             "to it has arrived")
        self.until_ts = until_ts
        # upstream (schema, table) -> the ts applied for it above applied_ts; only those mean anything (see
        # _live_floors), so with none the intake pays one test of an empty local per event
        self._floors: dict[tuple[str, str], int] = _live_floors(table_floors, applied_ts) if gated else {}
        self.gated = gated
        self._upstream_holds = upstream_holds
        self.applied_ts = applied_ts
        self.resolved: dict[TopicPartition, int] = {tp: 0 for tp in partitions}
        for tp, ts in (partition_resolved or {}).items():
            self.resolved[tp] = max(self.resolved.get(tp, 0), ts)
        self.stats = {"duplicates_dropped": 0, "ddl_duplicates_dropped": 0, "spills": 0, "spilled_events": 0}
        self._runs = RunStore(gated=gated, budget_bytes=budget_bytes, spill_dir=spill_dir, stats=self.stats)
        self._budget_bytes = budget_bytes
        self._spill_dir = spill_dir
        self._batches: BatchStore | None = None  # row batches of the columnar lane (applier.columnar.held)
        self._held_ddl: set[tuple[int, str, str, str]] = set(seen_ddl)
        # Identities of held row changes per commit ts (see _row_identity), and a heap of those ts: once a ts
        # is applied its whole set goes at once, instead of rebuilding one big set at every forget().
        self._held_rows: dict[int, set[tuple]] = {}
        # key column names per column tuple (decoders share one tuple per table shape)
        self._key_names: dict[int, tuple[tuple, tuple[str, ...]]] = {}
        self._held_row_ts: list[int] = []
        self.next_offsets: dict[TopicPartition, int] = {}
        # Resolved events seen per partition as (offset, ts), kept from the restart offset on: after a crash
        # the partition's resolved ts must be restored as of its restart offset, not as of the newest event
        # read, or the re-read held events would be released late and out of order.
        self._rlog: dict[TopicPartition, list[tuple[int, int]]] = {}
        self._rbase: dict[TopicPartition, int] = dict(self.resolved)

    # ---- intake -------------------------------------------------------------------------------------
    def add_partitions(self, partitions: Iterable[TopicPartition]) -> None:
        """Make the gate wait for these partitions too (a partition that never reported holds it at 0)."""
        for tp in partitions:
            self.resolved.setdefault(tp, 0)

    def add(self, events: Iterable[Event]) -> None:
        """Take one micro-batch of decoded events (any order across partitions, offset order within one)."""
        run: list[Held] = []  # held events in arrival order
        run_bytes = 0
        # Per partition, what the run store builds the run and its restart-offset index from, collected here
        # because this loop already has every event's partition and offset (see spill.Arrivals).
        arrivals: dict[TopicPartition, Arrivals] = {}
        next_offsets = self.next_offsets
        resolved = self.resolved
        gated = self.gated
        applied = self.applied_ts
        held_rows = self._held_rows
        key_names = self._key_names
        stats = self.stats
        keyless_at: tuple[TopicPartition, int] | None = None  # the message the last keyless change came from
        keyless_nth = 0  # its place among that message's keyless changes
        floors = self._floors or None  # per-table applied ts above `applied` (apply streams), usually none
        for ev in events:
            pos = ev.position
            if pos is None:
                if isinstance(ev, (Resolved, RowChange, DDL)):
                    raise ValueError(f"{type(ev).__name__} without a source position cannot be gated: {ev!r:.200}")
                continue
            tp = (pos.topic, pos.partition)
            off = pos.offset
            if off >= next_offsets.get(tp, -1):
                next_offsets[tp] = off + 1
            cls = type(ev)
            is_row = cls is RowChange or (cls is not DDL and isinstance(ev, RowChange))
            if not is_row and not isinstance(ev, DDL):
                if isinstance(ev, Resolved):
                    if ev.ts > resolved.get(tp, 0):
                        resolved[tp] = ev.ts
                        self._rlog.setdefault(tp, []).append((off, ev.ts))
                    else:
                        resolved.setdefault(tp, 0)
                continue
            if tp not in resolved:
                resolved[tp] = 0
            ts = ev.commit_ts
            if gated and ts <= applied:
                stats["duplicates_dropped"] += 1
                continue
            if floors is not None:
                floor = floors.get((ev.schema, ev.table))
                if floor is not None and ts <= floor:
                    stats["duplicates_dropped"] += 1
                    continue
            if not is_row:
                # Gated, a broadcast DDL is kept once (commit order makes it a barrier for every partition).
                # Ungated, release is in offset order per partition, so each partition's copy must stay as
                # that partition's barrier; the DDL history runs it once.
                if gated:
                    ident = ddl_identity(ev)
                    if ident in self._held_ddl:
                        stats["ddl_duplicates_dropped"] += 1
                        continue
                    self._held_ddl.add(ident)
            elif gated:
                # A TiCDC restart re-sends whole transactions. A copy of an event still held is dropped: were it
                # kept, a micro-batch boundary cutting the copy in two could release its delete now and drop its
                # insert later (as at or below the applied ts), losing the row.
                cols = ev.columns
                kn = key_names.get(id(cols))
                if kn is None or kn[0] is not cols:
                    if len(key_names) >= 4096:
                        key_names.clear()
                    kn = key_names[id(cols)] = (cols, tuple(c.name for c in cols if c.key))
                if kn[1]:
                    h = _row_identity(ev, kn[1])
                else:  # a message's changes arrive together: count them within it
                    if keyless_at == (tp, off):
                        keyless_nth += 1
                    else:
                        keyless_at, keyless_nth = (tp, off), 0
                    h = _keyless_identity(ev, keyless_nth)
                seen = held_rows.get(ts)
                if seen is None:
                    seen = held_rows[ts] = set()
                    heapq.heappush(self._held_row_ts, ts)
                try:
                    dup = h in seen
                except TypeError:  # an unhashable key value (the decoders make none): the whole content
                    h = _content(ev)
                    dup = h in seen
                if dup:
                    stats["duplicates_dropped"] += 1
                    continue
                seen.add(h)
            run.append(ev)
            run_bytes += ev.size or 0
            a = arrivals.get(tp)
            if a is None:
                arrivals[tp] = Arrivals(off, ts, ev)
                continue
            a.events.append(ev)
            # a new index entry only where the ts changes or the offset steps back: a same-ts event at a later
            # offset is covered by the entry already there
            if ts != a.last_ts or off < a.last_offset:
                if off < a.last_offset:
                    a.in_order = False
                a.offsets.append(off)
                a.tss.append(ts)
                a.last_ts = ts
            a.last_offset = off
        if run:
            self._runs.add(run, run_bytes, arrivals)

    def add_batches(self, batches: Iterable["RowBatch"]) -> None:
        """Take the row batches of one micro-batch (the columnar lane, gated streams only): rows at or below the
        applied ts (or their table's floor) are dropped as in :meth:`add`, the rest held as batches. Copies of a
        change are dropped when they are released (:func:`applier.columnar.held.drop_copies`): they share its commit
        ts, so one release takes them all. A batch of a table without key columns goes in as events: its copies are
        told apart by position (:func:`_keyless_identity`), which only the event path keeps."""
        if not self.gated:
            raise ValueError("row batches need a gated stream")
        import pyarrow as pa
        import pyarrow.compute as pc

        from applier.columnar.held import BatchStore, offsets_per_partition

        from applier.columnar.rows import concat_batches

        same: dict[tuple, list] = {}  # one batch per table, topic, names and kinds: per-batch work is Arrow calls
        for b in batches:
            if len(b):
                sh = b.shape
                same.setdefault((sh.schema, sh.table, sh.topic, sh.names, sh.kinds), []).append(b)
        kept = []
        as_events: list[Event] = []
        applied = self.applied_ts
        floors = self._floors
        for group in same.values():
            try:
                merged = [concat_batches(group)]
            except (ValueError, pa.ArrowInvalid):  # a column's Arrow type differs (uint64 in one slice)
                merged = group
            for b in merged:
                d = b.data
                topic = b.shape.topic
                for part, top in offsets_per_partition(b, "max").items():
                    tp = (topic, part)
                    self.resolved.setdefault(tp, 0)
                    if top + 1 > self.next_offsets.get(tp, -1):
                        self.next_offsets[tp] = top + 1
                sh = b.shape
                fresh = pc.greater(d.column("_ts"), floors.get((sh.schema, sh.table), applied) if floors else applied)
                n = pc.sum(fresh).as_py() or 0
                if n < len(b):
                    self.stats["duplicates_dropped"] += len(b) - n
                    if not n:
                        continue
                    b = type(b)(b.shape, d.filter(fresh))
                if not all(any(c.key for c in cols) for cols in b.shape.variants):
                    as_events.extend(b.to_events())
                    continue
                kept.append(b)
        if as_events:
            self.add(as_events)
        if kept:
            if self._batches is None:
                self._batches = BatchStore(budget_bytes=self._budget_bytes, spill_dir=self._spill_dir,
                                           stats=self.stats)
            self._batches.add(kept, over_budget=self._runs.memory_bytes)

    def note_offset(self, topic: str, partition: int, offset: int) -> None:
        """Record that a message was read even when it produced no event (e.g. routed away, quarantined)."""
        tp = (topic, partition)
        self.resolved.setdefault(tp, 0)
        if offset + 1 > self.next_offsets.get(tp, -1):
            self.next_offsets[tp] = offset + 1

    # ---- state --------------------------------------------------------------------------------------
    def global_resolved(self) -> int:
        if not self.resolved:
            return 0
        return min(self.resolved.values())

    @property
    def held(self) -> int:
        return self._runs.held + (self._batches.held if self._batches is not None else 0)

    @property
    def memory_bytes(self) -> int:
        return self._runs.memory_bytes + (self._batches.memory_bytes if self._batches is not None else 0)

    @property
    def table_floors(self) -> dict[tuple[str, str], int]:
        """The per-table floors still above the applied ts (see ``table_floors`` in the constructor)."""
        return dict(self._floors)

    @property
    def reached_until_ts(self) -> bool:
        """The applied resolved ts reached ``until_ts``: the replica is consistent as of exactly it."""
        return self.until_ts is not None and self.applied_ts >= self.until_ts

    def restart_offsets(self) -> dict[TopicPartition, int]:
        """Per partition, the offset to re-read from after a crash so that no held event is lost.

        For a partition with held events (in memory or spilled) this is the lowest held offset, kept up to date
        by the run store as releases are forgotten; events released but not yet forgotten still count as held.
        Otherwise it is the next offset after what was read.
        """
        out = dict(self.next_offsets)
        if self._upstream_holds is not None:
            for tp, off in self._upstream_holds()[0].items():
                if off < out.get(tp, off + 1):
                    out[tp] = off
        self._runs.min_offsets(out)
        if self._batches is not None:
            self._batches.min_offsets(out)
        return out

    def checkpoint(self) -> dict[TopicPartition, PartitionCheckpoint]:
        """What to store with the applied data so that a restart rebuilds this gate exactly.

        ``resolved_ts`` is the partition's resolved ts as of ``restart_offset`` (resolved events at or after
        that offset are re-read on restart), so restoring it never releases a re-read event early.
        """
        out: dict[TopicPartition, PartitionCheckpoint] = {}
        restart = self.restart_offsets()
        for tp in set(self.resolved) | set(restart):
            off = restart.get(tp, 0)
            log = self._rlog.get(tp, [])
            cut = bisect.bisect_left(log, (off, -1))
            if cut:
                self._rbase[tp] = max(self._rbase.get(tp, 0), log[cut - 1][1])
                del log[:cut]
            out[tp] = PartitionCheckpoint(off, self._rbase.get(tp, 0), self.next_offsets.get(tp, off))
        return out

    # ---- release ------------------------------------------------------------------------------------
    def release(self, upto: int | None = None) -> Release:
        """Events with ``commit_ts <= upto`` (default: the global resolved ts; never past ``until_ts``), in commit
        order."""
        if not self.gated:
            limit = sys.maxsize
        else:
            limit = self.global_resolved() if upto is None else upto
            if self.until_ts is not None and limit > self.until_ts:
                limit = self.until_ts  # never past the ts the run stops at, so applied_ts lands exactly on it
            if self._upstream_holds is not None:
                held_ts = self._upstream_holds()[1]
                if held_ts is not None:
                    limit = min(limit, held_ts - 1)
        return Release(self, self._runs.take(limit),
                       self._batches.take(limit) if self._batches is not None else None)

    def forget(self, rel: Release) -> None:
        """The released events are durably applied: drop them and advance the applied resolved ts."""
        self._runs.forget(rel.finish())
        if rel.batch_taken is not None and self._batches is not None:
            self._batches.forget(rel.batch_taken)
        done_ts = rel.upto if self.gated else rel.max_ts
        if done_ts > self.applied_ts:
            self.applied_ts = done_ts
        if self._floors:
            self._floors = _live_floors(self._floors, self.applied_ts)
        if self._held_ddl:
            self._held_ddl = {k for k in self._held_ddl if k[0] > self.applied_ts}
        heap, rows = self._held_row_ts, self._held_rows
        while heap and heap[0] <= self.applied_ts:
            rows.pop(heapq.heappop(heap), None)

    def close(self) -> None:
        self._runs.close()
        if self._batches is not None:
            self._batches.close()


class Release:
    """Events released up to ``upto`` (a resolved ts): iterate once, apply them, then :meth:`forget` it.

    It also answers what the apply stage stores with the applied events (:meth:`checkpoint`,
    :attr:`applied_ts`), so that stage works from the release alone."""

    __slots__ = ("upto", "max_ts", "exhausted", "_gate", "_taken", "_iterated", "batch_taken")

    def __init__(self, gate: Gate, taken: Taken, batch_taken: "BatchTaken | None" = None) -> None:
        self.upto = taken.upto
        self.batch_taken = batch_taken  # the columnar lane's rows of this release (applier.columnar.held)
        self.max_ts = 0  # highest commit ts iterated: ungated, the applied ts once forgotten
        self.exhausted = False
        self._gate = gate
        self._taken = taken
        self._iterated = False

    def __iter__(self) -> Iterator[Held]:
        if self._iterated:
            raise RuntimeError("a Release can be iterated once")
        self._iterated = True
        for part in self._taken.parts():
            top = max(map(_COMMIT_TS, part))
            if top > self.max_ts:
                self.max_ts = top
            yield from part
        self.exhausted = True

    @property
    def applied_ts(self) -> int:
        """The gate's applied resolved ts: before :meth:`forget`, what earlier releases applied."""
        return self._gate.applied_ts

    def checkpoint(self) -> dict[TopicPartition, PartitionCheckpoint]:
        """Per-partition progress to store with the applied data (see :meth:`Gate.checkpoint`). Until
        :meth:`forget`, the events of this release still count as held."""
        return self._gate.checkpoint()

    def forget(self) -> None:
        """This release is durably applied (see :meth:`Gate.forget`)."""
        self._gate.forget(self)

    def dropped_copies(self, n: int) -> None:
        """Count copies of changes the apply stage dropped from this release (the columnar lane's)."""
        if n:
            self._gate.stats["duplicates_dropped"] += n

    @property
    def batches(self) -> list["RowBatch"]:
        """The columnar lane's rows of this release, a batch per held batch it cut (copies not yet dropped)."""
        return self.batch_taken.batches if self.batch_taken is not None else []

    def finish(self) -> Taken:
        """The cut through the held runs, for the gate to drop. A release never iterated is iterated here (the
        cut through spilled runs is known only once they were read); a partly iterated one is refused:
        forgetting it would drop events that were never applied."""
        if not self._iterated:
            for _ in self:
                pass
        if not self.exhausted:
            raise RuntimeError("forget() needs a Release that was iterated to its end")
        return self._taken
