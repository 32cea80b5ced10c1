"""Resolved-ts gate: hold decoded events until upstream commit timestamps are known complete, then release
them in commit-ts order, with a memory budget beyond which held events spill to local disk.

Pure Python: no Spark, no database. The pipeline feeds it decoded events and asks it, once per micro-batch,
what is ready; the apply stage commits the released events and then tells the gate to forget them.

Why each rule exists (architecture invariants):

* Global resolved ts (1) is the minimum over *every* partition of every subscribed topic of the largest resolved
  ts seen there. A partition that never reported holds it at 0, so rows of a partition that is merely slow are
  never applied ahead of it. Replayed older watermarks are ignored: the per-partition value never moves back.
* Gating (2): only events with ``commit_ts <= global resolved`` are released.
* Order (3): released events come in ``(commit_ts, topic, partition, offset, index)`` order. One row key always
  lives in one partition, so this is TiCDC's per-key order, and the commit-ts order makes a DDL a barrier
  between the changes of its table before and after it.
* Duplicates (4): an event is dropped only when ``commit_ts <= applied_ts`` (the resolved ts already applied).
  Anything above it is kept even when it arrives after newer ones — dropping those lost rows in TiCDC's own
  consumer (ticdc#4051). Broadcast DDL (one copy per partition) is kept once.
* Nothing lost on restart (7): :meth:`Gate.restart_offsets` is, per partition, an offset at or below the lowest
  offset of any event still held, so re-reading Kafka from there rebuilds the held set after a crash.
* Bounded memory (8): beyond ``budget_bytes`` the in-memory runs are merged into one sorted run on local disk,
  read back in chunks when released; a transaction larger than memory flows through in bounded pieces.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import os
import pickle
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from applier.events import DDL, Event, Resolved, RowChange

TopicPartition = tuple[str, int]
Held = RowChange | DDL

# Estimated Python-object overhead per held event, on top of the bytes the protocol carried.
EVENT_OVERHEAD_BYTES = 400
SPILL_CHUNK_EVENTS = 4096


def sort_key(ev: Held) -> tuple[int, str, int, int]:
    """Commit order. Several events of one Kafka message share a key; stable sorting and merging keep the
    codec's order for them (runs are merged in the order they were added)."""
    p = ev.position
    return (ev.commit_ts, p.topic, p.partition, p.offset)


def offset_key(ev: Held) -> tuple[str, int, int]:
    """Arrival order per partition: the only order protocols without a watermark can give (per-key order)."""
    p = ev.position
    return (p.topic, p.partition, p.offset)


def ddl_identity(ev: DDL) -> tuple[int, str, str, str]:
    return (ev.commit_ts, ev.schema, ev.table, ev.query)


def row_fingerprint(ev: RowChange) -> tuple[int, int]:
    """Identity of a row change's content (not its position): a re-sent copy has the same fingerprint.
    Within one commit ts TiKV keeps one change per key, so two different changes never share it."""
    def image(d: dict | None) -> tuple | None:
        return None if d is None else tuple(d.items())
    content = (ev.schema, ev.table, ev.op.value, image(ev.before), image(ev.after))
    try:
        h = hash(content)
    except TypeError:  # an unhashable value (should not happen with decoded values): fall back to its text
        h = hash(repr(content))
    return (ev.commit_ts, h)


def event_size(ev: Held) -> int:
    return (ev.size or 0) + EVENT_OVERHEAD_BYTES


@dataclass(frozen=True)
class PartitionCheckpoint:
    restart_offset: int  # re-read from here after a crash
    resolved_ts: int  # this partition's resolved ts as of restart_offset
    next_offset: int  # one past the last offset read (for status)


@dataclass
class _MemRun:
    """Held events sorted by commit order; ``start`` marks the released prefix not yet forgotten."""

    events: list[Held]
    start: int = 0

    def min_offsets(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for ev in itertools.islice(self.events, self.start, None):
            tp = (ev.position.topic, ev.position.partition)
            off = ev.position.offset
            if off < out.get(tp, off + 1):
                out[tp] = off
        return out

    def __len__(self) -> int:
        return len(self.events) - self.start


@dataclass
class _DiskRun:
    """A sorted run spilled to a local file as pickled chunks; ``cursor`` is the first unreleased event."""

    path: Path
    count: int
    min_offsets: dict[TopicPartition, int]
    first_ts: int
    consumed: int = 0  # events released and forgotten

    def iter_from(self, skip: int) -> Iterator[Held]:
        with open(self.path, "rb") as fh:
            seen = 0
            while True:
                try:
                    chunk: list[Held] = pickle.load(fh)
                except EOFError:
                    return
                if seen + len(chunk) <= skip:
                    seen += len(chunk)
                    continue
                for ev in chunk[max(0, skip - seen):]:
                    yield ev
                seen += len(chunk)

    def __len__(self) -> int:
        return self.count - self.consumed


@dataclass
class Release:
    """Events released up to ``upto`` (a resolved ts); iterate once, then :meth:`Gate.forget` it."""

    upto: int
    _gate: "Gate"
    _mem_ends: list[int] = field(default_factory=list)
    _disk_taken: list[int] = field(default_factory=list)
    _iterated: bool = False
    exhausted: bool = False
    max_ts: int = 0

    def __iter__(self) -> Iterator[Held]:
        if self._iterated:
            raise RuntimeError("a Release can be iterated once")
        self._iterated = True
        yield from self._gate._merge(self)
        self.exhausted = True


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
    ) -> None:
        """``gated=False`` is for protocols without a watermark: everything is released at once, in offset
        order per partition, and nothing is dropped by commit ts (it may be unknown).

        ``upstream_holds`` reports what an earlier stage (a decoder waiting for a table schema) holds: the
        lowest offset per partition and the smallest commit ts. The gate never releases at or above that ts
        and never reports a restart offset above those offsets, so held messages are neither overtaken nor
        lost on restart.
        """
        self.gated = gated
        self._key = sort_key if gated else offset_key
        self._upstream_holds = upstream_holds
        self.applied_ts = applied_ts
        self.resolved: dict[TopicPartition, int] = {tp: 0 for tp in partitions}
        for tp, ts in (partition_resolved or {}).items():
            self.resolved[tp] = max(self.resolved.get(tp, 0), ts)
        self.budget_bytes = budget_bytes
        self._spill_root = Path(spill_dir) if spill_dir else None
        self._spill_dir: Path | None = None
        self._mem: list[_MemRun] = []
        self._disk: list[_DiskRun] = []
        self._mem_bytes = 0
        self._held_ddl: set[tuple[int, str, str, str]] = set(seen_ddl)
        self._held_rows: set[tuple[int, int]] = set()  # (commit_ts, fingerprint) of held row changes
        self.stats = {"duplicates_dropped": 0, "ddl_duplicates_dropped": 0, "spills": 0, "spilled_events": 0}
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
        run: list[Held] = []
        run_bytes = 0
        for ev in events:
            pos = ev.position
            if pos is not None:
                tp = (pos.topic, pos.partition)
                if pos.offset + 1 > self.next_offsets.get(tp, -1):
                    self.next_offsets[tp] = pos.offset + 1
            if isinstance(ev, Resolved):
                tp = (ev.position.topic, ev.position.partition)
                if ev.ts > self.resolved.get(tp, 0):
                    self.resolved[tp] = ev.ts
                    self._rlog.setdefault(tp, []).append((ev.position.offset, ev.ts))
                else:
                    self.resolved.setdefault(tp, 0)
                continue
            if not isinstance(ev, (RowChange, DDL)):
                continue
            self.resolved.setdefault((pos.topic, pos.partition), 0)
            if self.gated and ev.commit_ts <= self.applied_ts:
                self.stats["duplicates_dropped"] += 1
                continue
            if isinstance(ev, DDL):
                # Gated, a broadcast DDL is kept once (commit order makes it a barrier for every partition).
                # Ungated, release is in offset order per partition, so each partition's copy must stay as
                # that partition's barrier; the DDL history runs it once.
                if self.gated:
                    ident = ddl_identity(ev)
                    if ident in self._held_ddl:
                        self.stats["ddl_duplicates_dropped"] += 1
                        continue
                    self._held_ddl.add(ident)
            elif self.gated:
                # A TiCDC restart re-sends whole transactions. A copy of an event still held is dropped: were it
                # kept, a micro-batch boundary cutting the copy in two could release its delete now and drop its
                # insert later (as at or below the applied ts), losing the row.
                fp = row_fingerprint(ev)
                if fp in self._held_rows:
                    self.stats["duplicates_dropped"] += 1
                    continue
                self._held_rows.add(fp)
            run.append(ev)
            run_bytes += event_size(ev)
        if not run:
            return
        run.sort(key=self._key)  # stable: events of one message keep the codec's order
        self._mem.append(_MemRun(run))
        self._mem_bytes += run_bytes
        if self._mem_bytes > self.budget_bytes:
            self.spill()

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
        return sum(len(r) for r in self._mem) + sum(len(r) for r in self._disk)

    @property
    def memory_bytes(self) -> int:
        return self._mem_bytes

    def restart_offsets(self) -> dict[TopicPartition, int]:
        """Per partition, the offset to re-read from after a crash so that no held event is lost.

        For a partition with held events this is at or below the lowest held offset (a spilled run answers
        with the lowest offset it ever held: conservative, re-reading a little more is harmless because the
        applied-ts rule drops what was already applied). Otherwise it is the next offset after what was read.
        """
        out = dict(self.next_offsets)
        if self._upstream_holds is not None:
            for tp, off in self._upstream_holds()[0].items():
                if off < out.get(tp, off + 1):
                    out[tp] = off
        for mins in itertools.chain((r.min_offsets() for r in self._mem), (d.min_offsets for d in self._disk)):
            for tp, off in mins.items():
                if off < out.get(tp, off + 1):
                    out[tp] = off
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
        """Events with ``commit_ts <= upto`` (default: the global resolved ts), in commit order."""
        if not self.gated:
            limit = sys.maxsize
        else:
            limit = self.global_resolved() if upto is None else upto
            if self._upstream_holds is not None:
                held_ts = self._upstream_holds()[1]
                if held_ts is not None:
                    limit = min(limit, held_ts - 1)
        rel = Release(limit, self)
        for r in self._mem:
            # runs are sorted by commit_ts first, so the released part is a prefix
            lo, hi = r.start, len(r.events)
            while lo < hi:
                mid = (lo + hi) // 2
                if r.events[mid].commit_ts <= limit:
                    lo = mid + 1
                else:
                    hi = mid
            rel._mem_ends.append(lo)
        rel._disk_taken = [0] * len(self._disk)
        return rel

    def _merge(self, rel: Release) -> Iterator[Held]:
        streams: list[Iterator[Held]] = []
        for r, end in zip(self._mem, rel._mem_ends):
            streams.append(itertools.islice(r.events, r.start, end))
        for i, d in enumerate(self._disk):
            streams.append(self._disk_stream(d, i, rel))
        for ev in heapq.merge(*streams, key=self._key):
            if ev.commit_ts > rel.max_ts:
                rel.max_ts = ev.commit_ts
            yield ev

    @staticmethod
    def _disk_stream(d: _DiskRun, i: int, rel: Release) -> Iterator[Held]:
        if d.first_ts > rel.upto and d.consumed == 0:
            return
        for ev in d.iter_from(d.consumed):
            if ev.commit_ts > rel.upto:
                return
            rel._disk_taken[i] += 1
            yield ev

    def forget(self, rel: Release) -> None:
        """The released events are durably applied: drop them and advance the applied resolved ts."""
        if not rel._iterated:
            for _ in rel:  # count what the disk runs release
                pass
        if not rel.exhausted:
            raise RuntimeError("forget() needs a Release that was iterated to its end")
        for r, end in zip(self._mem, rel._mem_ends):
            r.start = end
        for d, taken in zip(self._disk, rel._disk_taken):
            d.consumed += taken
        for d in [d for d in self._disk if len(d) == 0]:
            d.path.unlink(missing_ok=True)
        self._disk = [d for d in self._disk if len(d) > 0]
        self._mem = [r for r in self._mem if len(r) > 0]
        for r in self._mem:
            if r.start > 0:
                del r.events[: r.start]
                r.start = 0
        self._mem_bytes = sum(event_size(ev) for r in self._mem for ev in r.events)
        done_ts = rel.upto if self.gated else rel.max_ts
        if done_ts > self.applied_ts:
            self.applied_ts = done_ts
        self._held_ddl = {k for k in self._held_ddl if k[0] > self.applied_ts}
        self._held_rows = {k for k in self._held_rows if k[0] > self.applied_ts}

    # ---- spill --------------------------------------------------------------------------------------
    def spill(self) -> None:
        """Merge every in-memory run into one sorted file on local disk."""
        if not self._mem:
            return
        if self._spill_dir is None:
            root = self._spill_root or Path(tempfile.gettempdir())
            root.mkdir(parents=True, exist_ok=True)
            self._spill_dir = Path(tempfile.mkdtemp(prefix="gate-", dir=root))
        fd, name = tempfile.mkstemp(prefix="run-", suffix=".pickle", dir=self._spill_dir)
        count = 0
        mins: dict[TopicPartition, int] = {}
        first_ts: int | None = None
        merged = heapq.merge(
            *(itertools.islice(r.events, r.start, None) for r in self._mem), key=self._key
        )
        with os.fdopen(fd, "wb") as fh:
            while True:
                chunk = list(itertools.islice(merged, SPILL_CHUNK_EVENTS))
                if not chunk:
                    break
                if first_ts is None:
                    first_ts = chunk[0].commit_ts
                for ev in chunk:
                    tp = (ev.position.topic, ev.position.partition)
                    if ev.position.offset < mins.get(tp, ev.position.offset + 1):
                        mins[tp] = ev.position.offset
                pickle.dump(chunk, fh, protocol=pickle.HIGHEST_PROTOCOL)
                count += len(chunk)
        self._disk.append(_DiskRun(Path(name), count, mins, first_ts or 0))
        self.stats["spills"] += 1
        self.stats["spilled_events"] += count
        self._mem = []
        self._mem_bytes = 0

    def close(self) -> None:
        for d in self._disk:
            d.path.unlink(missing_ok=True)
        self._disk = []
        if self._spill_dir is not None:
            try:
                self._spill_dir.rmdir()
            except OSError:
                pass
