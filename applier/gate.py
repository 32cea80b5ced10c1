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
* Nothing lost on restart (7): :meth:`Gate.restart_offsets` is, per partition, the lowest offset of any event
  still held (in memory or spilled), so re-reading Kafka from there rebuilds the held set after a crash.
* Bounded memory (8): beyond ``budget_bytes`` the in-memory runs are merged into one sorted run on local disk,
  read back one block at a time when released; a transaction larger than memory flows through in bounded
  pieces.

Cost model (why the bookkeeping looks the way it does): a single upstream transaction can hold millions of
events for many micro-batches, so nothing that runs per micro-batch or per progress save may scan the held
events. Restart offsets, held bytes and the duplicate filter are maintained incrementally: work is done once
when an event is added and once when it is released. See :class:`_OffsetIndex` and :class:`BlockCodec` for
the two structures this needs.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import os
import pickle
import sys
import tempfile
from array import array
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple

from applier.blocks import BlockCodec
from applier.events import DDL, Event, Resolved, RowChange

TopicPartition = tuple[str, int]
Held = RowChange | DDL

# Estimated Python-object overhead per held event, on top of the bytes the protocol carried.
EVENT_OVERHEAD_BYTES = 400
# Events per spilled block. Reading a spilled run back keeps one decoded block per run in memory during the
# merge, so this bounds the read side: blocks x runs x ~1.5 KB per event.
SPILL_CHUNK_EVENTS = 2048

# C-level sort keys (operator.attrgetter builds the same tuples as sort_key/offset_key without a Python call).
_COMMIT_ORDER = attrgetter("commit_ts", "position.topic", "position.partition", "position.offset")
_OFFSET_ORDER = attrgetter("position.topic", "position.partition", "position.offset")
_COMMIT_TS = attrgetter("commit_ts")


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


def _content_hash(ev: RowChange) -> int:
    """Hash of a row change's content (not its position): a re-sent copy hashes the same.

    Keys and values are hashed as two tuples rather than as ``items()`` pairs: the same information (order
    included) without building one 2-tuple per column. ``_value_`` is the enum's plain attribute; ``.value``
    and ``Enum.__hash__`` are Python-level calls, too slow to pay once per held row."""
    b, a = ev.before, ev.after
    op = ev.op
    content = (ev.schema, ev.table, getattr(op, "_value_", op),
               None if b is None else tuple(b), None if b is None else tuple(b.values()),
               None if a is None else tuple(a), None if a is None else tuple(a.values()))
    try:
        return hash(content)
    except TypeError:  # an unhashable value (should not happen with decoded values): fall back to its text
        return hash(repr(content))


def row_fingerprint(ev: RowChange) -> tuple[int, int]:
    """Identity of a row change's content (not its position): a re-sent copy has the same fingerprint.
    Within one commit ts TiKV keeps one change per key, so two different changes never share it."""
    return (ev.commit_ts, _content_hash(ev))


def event_size(ev: Held) -> int:
    return (ev.size or 0) + EVENT_OVERHEAD_BYTES


@dataclass(frozen=True)
class PartitionCheckpoint:
    restart_offset: int  # re-read from here after a crash
    resolved_ts: int  # this partition's resolved ts as of restart_offset
    next_offset: int  # one past the last offset read (for status)


class SpillError(OSError):
    """Held events could not be written to or read back from the spill directory."""


# ---- restart-offset bookkeeping -------------------------------------------------------------------------

class _OffsetIndex:
    """Per partition, the lowest offset a run still holds, maintained incrementally.

    Releases take, from every run, exactly the events with ``commit_ts <= upto`` (gated: runs are sorted by
    commit ts, so that is a prefix; ungated: ``upto`` is infinite). So "lowest offset still held" is the
    lowest offset among entries with ``ts > upto``. Each partition keeps ``(offset, ts)`` entries sorted by
    offset and a cursor; releasing advances the cursor past entries whose ts is released, and the entry under
    the cursor is the answer. Each entry is passed once, so a progress save costs O(partitions), not
    O(held events) as a scan did.

    Consecutive events of a partition with the same ts and non-decreasing offsets are collapsed into the first
    one: it is released together with them and its offset is no higher, so the answer never changes. A large
    transaction therefore costs one entry per partition and micro-batch.
    """

    __slots__ = ("_parts",)

    def __init__(self, parts: dict[TopicPartition, list]) -> None:
        # tp -> [offsets, commit tss, cursor]
        self._parts = parts

    @classmethod
    def build(cls, raw: dict[TopicPartition, list]) -> "_OffsetIndex":
        """``raw`` is what :meth:`Gate.add` collected: tp -> [last_off, last_ts, offsets, tss, in_order, ...]."""
        parts: dict[TopicPartition, list] = {}
        for tp, ent in raw.items():
            offs, tss = ent[2], ent[3]
            if not ent[4]:  # arrival was not in offset order: sort the entries (stable for equal offsets)
                pairs = sorted(zip(offs, tss), key=lambda p: p[0])
                offs = [p[0] for p in pairs]
                tss = [p[1] for p in pairs]
            parts[tp] = [offs, tss, 0]
        return cls(parts)

    def release_upto(self, upto: int) -> None:
        """Events with ``commit_ts <= upto`` are released and forgotten."""
        for ent in self._parts.values():
            tss, i = ent[1], ent[2]
            n = len(tss)
            while i < n and tss[i] <= upto:
                i += 1
            ent[2] = i

    def min_offsets(self, out: dict[TopicPartition, int]) -> None:
        """Lower ``out[tp]`` to the lowest offset still held here."""
        for tp, (offs, _, i) in self._parts.items():
            if i < len(offs):
                off = offs[i]
                if off < out.get(tp, off + 1):
                    out[tp] = off

    def compact(self) -> None:
        """Drop released entries and store the rest as machine integers: a spilled run keeps this index
        while its events are on disk, so it must cost bytes, not Python objects, per entry."""
        for ent in self._parts.values():
            offs, tss, i = ent
            offs, tss = offs[i:], tss[i:]
            try:
                offs, tss = array("q", offs), array("q", tss)
            except (OverflowError, TypeError):  # values beyond int64: keep the lists
                pass
            ent[0], ent[1], ent[2] = offs, tss, 0


def _merge_slices(streams: list[Iterator[tuple[list[Held], int, int]]],
                   key: Callable[[Held], Any]) -> Iterator[list[Held]]:
    """Merge sorted streams, each given as ``(list, lo, hi)`` pieces, into lists of events in ``key`` order.

    Equal keys come in stream order (like ``heapq.merge``), so the codec's order of one message's events is
    kept. Instead of a heap step per event (heapq.merge costs 0.5-1 us per event in Python), the stream with
    the smallest head hands over, with one binary search, everything up to the next stream's head: runs of one
    big transaction spilled at different times interleave in long stretches (per partition), so a release of
    a million events takes a few thousand steps.
    """
    heap: list[tuple[Any, int, list[Held], int, int]] = []
    for no, stream in enumerate(streams):
        for blk, lo, hi in stream:
            if lo < hi:
                heap.append((key(blk[lo]), no, blk, lo, hi))
                break
    heapq.heapify(heap)
    while heap:
        _, no, blk, lo, hi = heap[0]
        if len(heap) == 1:
            yield blk if lo == 0 and hi == len(blk) else blk[lo:hi]
            for blk, lo, hi in streams[no]:
                if lo < hi:
                    yield blk if lo == 0 and hi == len(blk) else blk[lo:hi]
            return
        nxt = heap[1] if len(heap) == 2 or heap[1] < heap[2] else heap[2]
        # take what sorts before the next head: equal keys go to the lower stream number
        if no < nxt[1]:
            cut = bisect.bisect_right(blk, nxt[0], lo, hi, key=key)
        else:
            cut = bisect.bisect_left(blk, nxt[0], lo, hi, key=key)
        yield blk if lo == 0 and cut == len(blk) else blk[lo:cut]
        if cut < hi:
            heapq.heapreplace(heap, (key(blk[cut]), no, blk, cut, hi))
            continue
        for blk, lo, hi in streams[no]:
            if lo < hi:
                heapq.heapreplace(heap, (key(blk[lo]), no, blk, lo, hi))
                break
        else:
            heapq.heappop(heap)


class _Block(NamedTuple):
    offset: int  # file offset of the core
    core_len: int
    rest_len: int
    start: int  # run position of the block's first event
    count: int
    first_ts: int
    max_ts: int


# ---- runs -----------------------------------------------------------------------------------------------

@dataclass
class _MemRun:
    """Held events sorted by commit order; ``start`` marks the released prefix not yet forgotten."""

    events: list[Held]
    index: _OffsetIndex  # lowest offsets still held, per partition
    bytes: int = 0  # event_size() of the events from ``start`` on
    start: int = 0

    def min_offsets(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        self.index.min_offsets(out)
        return out

    def __len__(self) -> int:
        return len(self.events) - self.start


@dataclass
class _DiskRun:
    """A sorted run spilled to a local file in blocks; ``consumed`` events were released and forgotten."""

    path: Path
    codec: BlockCodec
    blocks: list[_Block]
    count: int
    indexes: list[_OffsetIndex]
    first_ts: int
    consumed: int = 0
    next_ts: int = 0  # commit ts of the first unconsumed event (gated order: nothing below it is left)

    @property
    def min_offsets(self) -> dict[TopicPartition, int]:
        out: dict[TopicPartition, int] = {}
        for ix in self.indexes:
            ix.min_offsets(out)
        return out

    def read_block(self, fh: Any, b: _Block) -> list[Held]:
        fh.seek(b.offset)
        data = fh.read(b.core_len + b.rest_len)
        if len(data) != b.core_len + b.rest_len:
            raise SpillError(
                f"spill file {self.path} is truncated (block at byte {b.offset}): it was changed or removed "
                "while the applier ran. Restart the applier: held events are re-read from Kafka"
            )
        view = memoryview(data)
        try:
            return self.codec.decode(view[: b.core_len], view[b.core_len:])
        except SpillError:
            raise
        except Exception as exc:
            raise SpillError(
                f"spill file {self.path} is corrupt (block at byte {b.offset}: {type(exc).__name__}: {exc}). "
                "Restart the applier: held events are re-read from Kafka"
            ) from exc

    def iter_from(self, skip: int) -> Iterator[Held]:
        """Every event from run position ``skip`` on (one decoded block in memory at a time)."""
        starts = [b.start for b in self.blocks]
        i = max(0, bisect.bisect_right(starts, skip) - 1)
        with self._open() as fh:
            for b in self.blocks[i:]:
                evs = self.read_block(fh, b)
                yield from evs[max(0, skip - b.start):]

    def _open(self) -> Any:
        try:
            return open(self.path, "rb")
        except OSError as exc:
            raise SpillError(
                f"cannot read spilled events back from {self.path}: {exc.strerror or exc}. Was the spill "
                "directory cleaned while the applier ran? Restart the applier: held events are re-read from Kafka"
            ) from exc

    def __len__(self) -> int:
        return self.count - self.consumed


@dataclass
class Release:
    """Events released up to ``upto`` (a resolved ts); iterate once, then :meth:`Gate.forget` it."""

    upto: int
    _gate: "Gate"
    _mem_ends: list[int] = field(default_factory=list)
    _disk_taken: list[int] = field(default_factory=list)
    _disk_next: list[int | None] = field(default_factory=list)
    _iterated: bool = False
    exhausted: bool = False
    max_ts: int = 0

    def __iter__(self) -> Iterator[Held]:
        if self._iterated:
            raise RuntimeError("a Release can be iterated once")
        self._iterated = True
        for part in self._gate._slices(self):
            top = max(map(_COMMIT_TS, part))
            if top > self.max_ts:
                self.max_ts = top
            yield from part
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
        self._key = _COMMIT_ORDER if gated else _OFFSET_ORDER
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
        # Content hashes of held row changes per commit ts (see _content_hash), and a heap of those ts: once a
        # ts is applied its whole set goes at once, instead of rebuilding one big set at every forget().
        self._held_rows: dict[int, set[int]] = {}
        self._held_row_ts: list[int] = []
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
        run: list[Held] = []  # held events in arrival order
        run_bytes = 0
        # tp -> [last offset, last ts, offsets, tss, in offset order, events]: the raw restart-offset index (see
        # _OffsetIndex), collected here because this loop already has every event's partition and offset, and
        # the held events per partition (in arrival order), from which a presorted run is put together below.
        raw_index: dict[TopicPartition, list] = {}
        next_offsets = self.next_offsets
        resolved = self.resolved
        gated = self.gated
        applied = self.applied_ts
        held_rows = self._held_rows
        stats = self.stats
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
                h = _content_hash(ev)
                seen = held_rows.get(ts)
                if seen is None:
                    held_rows[ts] = {h}
                    heapq.heappush(self._held_row_ts, ts)
                elif h in seen:
                    stats["duplicates_dropped"] += 1
                    continue
                else:
                    seen.add(h)
            run.append(ev)
            run_bytes += ev.size or 0
            ent = raw_index.get(tp)
            if ent is None:
                raw_index[tp] = [off, ts, [off], [ts], True, [ev]]
                continue
            ent[5].append(ev)
            if ts != ent[1] or off < ent[0]:
                if off < ent[0]:
                    ent[4] = False
                ent[2].append(off)
                ent[3].append(ts)
                ent[0], ent[1] = off, ts
            else:
                ent[0] = off  # same ts, later offset: covered by the entry already there
        if not run:
            return
        # Each partition's events are in arrival order. Put together in partition order they are already in
        # gate order when every partition is in offset order and (gated) one commit ts covers the whole batch,
        # as in the micro-batches of a large transaction: no key per event, no sort. Otherwise a stable sort
        # of the arrival order (events of one message keep the codec's order), which TiCDC's commit-ts order
        # across partitions makes nearly sorted already.
        parts = [raw_index[tp] for tp in sorted(raw_index)]
        if self.gated:
            presorted = all(len(ent[3]) == 1 for ent in parts) and len({ent[1] for ent in parts}) == 1
        else:
            presorted = all(ent[4] for ent in parts)
        if presorted:
            if len(parts) > 1:
                run = list(itertools.chain.from_iterable(ent[5] for ent in parts))
        else:
            run.sort(key=self._key)
        for ent in parts:
            ent[5] = None
        run_bytes += EVENT_OVERHEAD_BYTES * len(run)
        self._mem.append(_MemRun(run, _OffsetIndex.build(raw_index), run_bytes))
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

        For a partition with held events (in memory or spilled) this is the lowest held offset, kept up to date
        by :class:`_OffsetIndex` as releases are forgotten; events released but not yet forgotten still count
        as held. Otherwise it is the next offset after what was read.
        """
        out = dict(self.next_offsets)
        if self._upstream_holds is not None:
            for tp, off in self._upstream_holds()[0].items():
                if off < out.get(tp, off + 1):
                    out[tp] = off
        for r in self._mem:
            r.index.min_offsets(out)
        for d in self._disk:
            for ix in d.indexes:
                ix.min_offsets(out)
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
            rel._mem_ends.append(bisect.bisect_right(r.events, limit, lo=r.start, key=_COMMIT_TS))
        rel._disk_taken = [0] * len(self._disk)
        rel._disk_next = [d.next_ts for d in self._disk]
        return rel

    def _slices(self, rel: Release) -> Iterator[list[Held]]:
        """The released events in order, as lists: the merge of every run's released part."""
        streams: list[Iterator[tuple[list[Held], int, int]]] = []
        for r, end in zip(self._mem, rel._mem_ends):
            if end > r.start:
                streams.append(iter(((r.events, r.start, end),)))
        for i, d in enumerate(self._disk):
            if len(d) and (not self.gated or d.next_ts <= rel.upto):
                streams.append(self._disk_blocks(d, i, rel))
        return _merge_slices(streams, self._key)

    def _disk_blocks(self, d: _DiskRun, i: int, rel: Release) -> Iterator[tuple[list[Held], int, int]]:
        """``(events, lo, hi)`` per block: the events of a spilled run with ``commit_ts <= rel.upto``, from its
        first unconsumed one, one decoded block in memory at a time.

        Gated runs are sorted by commit ts, so whole blocks below the limit go out without a per-event test and
        the block holding the limit is cut with a binary search. Records how many events were taken and the
        commit ts of the next one (so later releases that cannot reach it do not read the file at all)."""
        upto = rel.upto
        pos = d.consumed
        blocks = d.blocks
        bi = max(0, bisect.bisect_right([b.start for b in blocks], pos) - 1)
        with d._open() as fh:
            for b in blocks[bi:]:
                evs = d.read_block(fh, b)
                skip = pos - b.start
                n = len(evs)
                if n != b.count:
                    raise SpillError(f"spill file {d.path} is corrupt: block at byte {b.offset} holds {n} "
                                     f"events, expected {b.count}. Restart the applier: held events are re-read "
                                     "from Kafka")
                if b.max_ts <= upto:
                    cut = n
                elif self.gated:
                    cut = bisect.bisect_right(evs, upto, lo=skip, key=_COMMIT_TS)
                else:
                    cut = skip
                    while cut < n and evs[cut].commit_ts <= upto:
                        cut += 1
                rel._disk_taken[i] += cut - skip
                if cut < n:
                    rel._disk_next[i] = evs[cut].commit_ts
                    yield (evs, skip, cut)
                    return
                yield (evs, skip, n)
                pos = b.start + n
        rel._disk_next[i] = None

    def forget(self, rel: Release) -> None:
        """The released events are durably applied: drop them and advance the applied resolved ts."""
        if not rel._iterated:
            for _ in rel:  # count what the disk runs release
                pass
        if not rel.exhausted:
            raise RuntimeError("forget() needs a Release that was iterated to its end")
        for r, end in zip(self._mem, rel._mem_ends):
            if end > r.start:
                gone = sum(ev.size or 0 for ev in itertools.islice(r.events, r.start, end))
                gone += EVENT_OVERHEAD_BYTES * (end - r.start)
                r.bytes -= gone
                self._mem_bytes -= gone
                r.start = end
                r.index.release_upto(rel.upto)
        for d, taken, nxt in zip(self._disk, rel._disk_taken, rel._disk_next):
            if taken:
                d.consumed += taken
                for ix in d.indexes:
                    ix.release_upto(rel.upto)
            if nxt is not None:
                d.next_ts = nxt
        for d in [d for d in self._disk if len(d) == 0]:
            d.path.unlink(missing_ok=True)
        self._disk = [d for d in self._disk if len(d) > 0]
        self._mem = [r for r in self._mem if len(r) > 0]
        for r in self._mem:
            if r.start > 0:
                del r.events[: r.start]
                r.start = 0
        if not self._mem:
            self._mem_bytes = 0
        done_ts = rel.upto if self.gated else rel.max_ts
        if done_ts > self.applied_ts:
            self.applied_ts = done_ts
        if self._held_ddl:
            self._held_ddl = {k for k in self._held_ddl if k[0] > self.applied_ts}
        heap, rows = self._held_row_ts, self._held_rows
        while heap and heap[0] <= self.applied_ts:
            rows.pop(heapq.heappop(heap), None)

    # ---- spill --------------------------------------------------------------------------------------
    def spill(self) -> None:
        """Merge every in-memory run into one sorted file on local disk."""
        if not self._mem:
            return
        if self._spill_dir is None:
            root = self._spill_root or Path(tempfile.gettempdir())
            try:
                root.mkdir(parents=True, exist_ok=True)
                self._spill_dir = Path(tempfile.mkdtemp(prefix="gate-", dir=root))
            except OSError as exc:
                raise SpillError(
                    f"held events exceed [pipeline] buffer_memory_mb and cannot spill to {root}: "
                    f"{exc.strerror or exc}. Make [pipeline] spill_dir a writable local directory"
                ) from exc
        runs = [r for r in self._mem if len(r)]
        if len(runs) == 1 and runs[0].start == 0:
            merged = runs[0].events
        else:
            # Concatenate in the order the runs were added and sort stably: timsort merges the sorted runs in
            # C with one key per event, instead of heapq.merge's Python-level step per event.
            merged = list(itertools.chain.from_iterable(itertools.islice(r.events, r.start, None) for r in runs))
            merged.sort(key=self._key)
        if not merged:
            self._mem = []
            self._mem_bytes = 0
            return
        try:
            fd, name = tempfile.mkstemp(prefix="run-", suffix=".spill", dir=self._spill_dir)
        except OSError as exc:
            raise SpillError(
                f"held events exceed [pipeline] buffer_memory_mb and no spill file can be created in "
                f"{self._spill_dir}: {exc.strerror or exc}. Make [pipeline] spill_dir a writable local directory "
                "and do not clean it while the applier runs"
            ) from exc
        path = Path(name)
        codec = BlockCodec()
        blocks: list[_Block] = []
        pos = 0
        try:
            with os.fdopen(fd, "wb") as fh:
                for lo in range(0, len(merged), SPILL_CHUNK_EVENTS):
                    chunk = merged[lo:lo + SPILL_CHUNK_EVENTS]
                    try:
                        core, rest = codec.encode(chunk)
                    except (pickle.PicklingError, TypeError, AttributeError, RecursionError) as exc:
                        raise SpillError(
                            f"held events exceed [pipeline] buffer_memory_mb but one of the events from "
                            f"{chunk[0].position} to {chunk[-1].position} cannot be written to disk "
                            f"({type(exc).__name__}: {exc}). Raise buffer_memory_mb so that it stays in memory, "
                            "and report the message"
                        ) from exc
                    fh.write(core)
                    if rest:
                        fh.write(rest)
                    tss = list(map(_COMMIT_TS, chunk))
                    blocks.append(_Block(pos, len(core), len(rest), lo, len(chunk), tss[0], max(tss)))
                    pos += len(core) + len(rest)
        except OSError as exc:
            path.unlink(missing_ok=True)
            if isinstance(exc, SpillError):
                raise
            raise SpillError(
                f"held events exceed [pipeline] buffer_memory_mb and writing them to {path} failed: "
                f"{exc.strerror or exc}. Free space under [pipeline] spill_dir or raise buffer_memory_mb"
            ) from exc
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        codec.finish()
        indexes = []
        for r in runs:
            r.index.compact()
            indexes.append(r.index)
        first_ts = merged[0].commit_ts if merged else 0
        self._disk.append(_DiskRun(path, codec, blocks, len(merged), indexes, first_ts, 0,
                                   first_ts if self.gated else 0))
        self.stats["spills"] += 1
        self.stats["spilled_events"] += len(merged)
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
