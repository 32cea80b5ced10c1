"""Where held events live until they are released: sorted runs in memory, merged into block files on local disk
beyond a memory budget (invariant 8), and read back as one ordered stream, each run carrying the index of the
lowest Kafka offsets it still holds (invariant 7).

This module decides nothing about *what* is held or *when* it may go: :mod:`applier.gate` filters events
(watermarks, duplicates) and names the commit ts to release up to. Kept apart so the storage (file format,
merge, byte accounting) can change without touching the rules, and so the rules can be read without the
storage.

Cost model: a single upstream transaction can hold millions of events for many micro-batches, so nothing that
runs per micro-batch or per progress save may scan the held events. Held bytes and restart offsets are kept
incrementally (work once when an event is added, once when it is released); see :class:`_OffsetIndex` and
:class:`~applier.blocks.BlockCodec` for the two structures this needs.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import os
import pickle
import tempfile
from array import array
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from applier.blocks import BlockCodec
from applier.events import DDL, RowChange

TopicPartition = tuple[str, int]
Held = RowChange | DDL

# Estimated Python-object overhead per held event, on top of the bytes the protocol carried.
EVENT_OVERHEAD_BYTES = 400
# Events per spilled block. Reading a spilled run back keeps one decoded block per run in memory during the
# merge, so this bounds the read side: blocks x runs x ~1.5 KB per event.
SPILL_CHUNK_EVENTS = 2048

# Sort keys built in C by operator.attrgetter: no Python call per event. Gated streams go in commit order
# (ties keep the codec's order of one message's events: sorts are stable, merges prefer the older run);
# ungated ones in arrival order per partition, the only order a protocol without a watermark can give.
COMMIT_ORDER = attrgetter("commit_ts", "position.topic", "position.partition", "position.offset")
OFFSET_ORDER = attrgetter("position.topic", "position.partition", "position.offset")
_COMMIT_TS = attrgetter("commit_ts")


class SpillError(OSError):
    """Held events could not be written to or read back from the spill directory."""


class Arrivals:
    """One partition's held events of one micro-batch, as the gate's intake loop collects them.

    The intake loop already touches every event's partition and offset, so it records here, at no extra pass,
    what :meth:`RunStore.add` needs: the events in arrival order (to put a presorted run together without a
    sort) and the raw restart-offset entries (see :class:`_OffsetIndex`), one per change of commit ts or
    backwards step of offset. Slots, not a dict or a list by position: the loop updates these per event.
    """

    __slots__ = ("last_offset", "last_ts", "offsets", "tss", "in_order", "events")

    def __init__(self, offset: int, ts: int, event: Held) -> None:
        self.last_offset = offset
        self.last_ts = ts
        self.offsets = [offset]
        self.tss = [ts]
        self.in_order = True  # offsets never went backwards
        self.events: list[Held] = [event]


# ---- restart-offset bookkeeping -------------------------------------------------------------------------

class _PartitionOffsets:
    """One partition of an :class:`_OffsetIndex`: ``(offset, ts)`` entries sorted by offset, and a cursor past
    the released ones."""

    __slots__ = ("offsets", "tss", "cursor")

    def __init__(self, offsets: list[int] | array, tss: list[int] | array) -> None:
        self.offsets = offsets
        self.tss = tss
        self.cursor = 0


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

    def __init__(self, parts: dict[TopicPartition, _PartitionOffsets]) -> None:
        self._parts = parts

    @classmethod
    def build(cls, arrivals: dict[TopicPartition, Arrivals]) -> "_OffsetIndex":
        parts: dict[TopicPartition, _PartitionOffsets] = {}
        for tp, a in arrivals.items():
            offs, tss = a.offsets, a.tss
            if not a.in_order:  # arrival was not in offset order: sort the entries (stable for equal offsets)
                pairs = sorted(zip(offs, tss), key=lambda p: p[0])
                offs = [p[0] for p in pairs]
                tss = [p[1] for p in pairs]
            parts[tp] = _PartitionOffsets(offs, tss)
        return cls(parts)

    def release_upto(self, upto: int) -> None:
        """Events with ``commit_ts <= upto`` are released and forgotten."""
        for p in self._parts.values():
            tss, i = p.tss, p.cursor
            n = len(tss)
            while i < n and tss[i] <= upto:
                i += 1
            p.cursor = i

    def min_offsets(self, out: dict[TopicPartition, int]) -> None:
        """Lower ``out[tp]`` to the lowest offset still held here."""
        for tp, p in self._parts.items():
            if p.cursor < len(p.offsets):
                off = p.offsets[p.cursor]
                if off < out.get(tp, off + 1):
                    out[tp] = off

    def compact(self) -> None:
        """Drop released entries and store the rest as machine integers: a spilled run keeps this index
        while its events are on disk, so it must cost bytes, not Python objects, per entry."""
        for p in self._parts.values():
            offs, tss = p.offsets[p.cursor:], p.tss[p.cursor:]
            try:
                offs, tss = array("q", offs), array("q", tss)
            except (OverflowError, TypeError):  # values beyond int64: keep the lists
                pass
            p.offsets, p.tss, p.cursor = offs, tss, 0


# ---- merge ----------------------------------------------------------------------------------------------

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


# ---- runs -----------------------------------------------------------------------------------------------

class _Block(NamedTuple):
    offset: int  # file offset of the core
    core_len: int
    rest_len: int
    start: int  # run position of the block's first event
    count: int
    max_ts: int  # lets a release below it skip the per-event test, and one far below it skip the file


@dataclass
class _MemRun:
    """Held events sorted by the store's order; ``start`` marks the released prefix not yet forgotten."""

    events: list[Held]
    index: _OffsetIndex  # lowest offsets still held, per partition
    bytes: int = 0  # estimated bytes of the events from ``start`` on
    start: int = 0

    def __len__(self) -> int:
        return len(self.events) - self.start


@dataclass
class _DiskRun:
    """A sorted run spilled to a local file in blocks; ``consumed`` events were released and forgotten."""

    path: Path
    codec: BlockCodec
    blocks: list[_Block]
    count: int
    indexes: list[_OffsetIndex]  # those of the memory runs merged into it, compacted
    consumed: int = 0
    next_ts: int = 0  # commit ts of the first unconsumed event (gated order: nothing below it is left)

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

    def open(self) -> Any:
        try:
            return open(self.path, "rb")
        except OSError as exc:
            raise SpillError(
                f"cannot read spilled events back from {self.path}: {exc.strerror or exc}. Was the spill "
                "directory cleaned while the applier ran? Restart the applier: held events are re-read from Kafka"
            ) from exc

    def __len__(self) -> int:
        return self.count - self.consumed


class Taken:
    """A cut through every run at one commit ts: what one release hands out, recorded so that
    :meth:`RunStore.forget` drops exactly that. Runs are sorted, so the cut is a position per run; for a
    spilled run it is known only once its blocks were read, so iterating :meth:`parts` fills it in. The cut's
    fields are the store's to read and write."""

    __slots__ = ("upto", "store", "mem_ends", "disk_taken", "disk_next")

    def __init__(self, store: "RunStore", upto: int, mem_ends: list[int], disk_next: list[int | None]) -> None:
        self.upto = upto
        self.store = store
        self.mem_ends = mem_ends  # per memory run: one past its last taken event
        self.disk_taken = [0] * len(disk_next)  # per spilled run: how many events were read out
        self.disk_next = disk_next  # per spilled run: commit ts of its first event left (None: none left)

    def parts(self) -> Iterator[list[Held]]:
        """The taken events in the store's order, as lists (iterate once)."""
        return self.store.merged(self)


class RunStore:
    """Held events as sorted runs: in memory up to ``budget_bytes``, then merged into one file per spill."""

    def __init__(self, *, gated: bool, budget_bytes: int, spill_dir: str | os.PathLike[str] | None,
                 stats: dict[str, int]) -> None:
        """``stats`` is the owner's counter dict (``spills`` and ``spilled_events`` are counted into it), so one
        dict reports the whole gate."""
        self.gated = gated
        self.key = COMMIT_ORDER if gated else OFFSET_ORDER
        self.budget_bytes = budget_bytes
        self._spill_root = Path(spill_dir) if spill_dir else None
        self._spill_dir: Path | None = None
        self._mem: list[_MemRun] = []
        self._disk: list[_DiskRun] = []
        self._mem_bytes = 0
        self.stats = stats
        stats.setdefault("spills", 0)
        stats.setdefault("spilled_events", 0)

    # ---- state --------------------------------------------------------------------------------------
    @property
    def held(self) -> int:
        return sum(len(r) for r in self._mem) + sum(len(r) for r in self._disk)

    @property
    def memory_bytes(self) -> int:
        return self._mem_bytes

    def min_offsets(self, out: dict[TopicPartition, int]) -> None:
        """Lower ``out[tp]`` to the lowest offset any run holds (taken but not forgotten counts as held)."""
        for r in self._mem:
            r.index.min_offsets(out)
        for d in self._disk:
            for ix in d.indexes:
                ix.min_offsets(out)

    # ---- intake -------------------------------------------------------------------------------------
    def add(self, run: list[Held], run_bytes: int, arrivals: dict[TopicPartition, Arrivals]) -> None:
        """Hold one micro-batch: ``run`` in arrival order, ``run_bytes`` the protocol bytes it carried,
        ``arrivals`` its events per partition. Spills when the budget is passed."""
        # Each partition's events are in arrival order. Put together in partition order they are already in
        # store order when every partition is in offset order and (gated) one commit ts covers the whole batch,
        # as in the micro-batches of a large transaction: no key per event, no sort. Otherwise a stable sort
        # of the arrival order (events of one message keep the codec's order), which TiCDC's commit-ts order
        # across partitions makes nearly sorted already.
        parts = [arrivals[tp] for tp in sorted(arrivals)]
        if self.gated:
            presorted = all(len(a.tss) == 1 for a in parts) and len({a.last_ts for a in parts}) == 1
        else:
            presorted = all(a.in_order for a in parts)
        if presorted:
            if len(parts) > 1:
                run = list(itertools.chain.from_iterable(a.events for a in parts))
        else:
            run.sort(key=self.key)
        run_bytes += EVENT_OVERHEAD_BYTES * len(run)
        self._mem.append(_MemRun(run, _OffsetIndex.build(arrivals), run_bytes))
        self._mem_bytes += run_bytes
        if self._mem_bytes > self.budget_bytes:
            self.spill()

    # ---- release ------------------------------------------------------------------------------------
    def take(self, upto: int) -> Taken:
        """Cut every run after its events with ``commit_ts <= upto`` (gated runs are sorted by commit ts, so
        that is a prefix; ungated, ``upto`` is ``sys.maxsize`` and takes all)."""
        mem_ends = [bisect.bisect_right(r.events, upto, lo=r.start, key=_COMMIT_TS) for r in self._mem]
        return Taken(self, upto, mem_ends, [d.next_ts for d in self._disk])

    def merged(self, taken: Taken) -> Iterator[list[Held]]:
        """The events ``taken`` cut off, all runs merged into the store's order, as lists."""
        streams: list[Iterator[tuple[list[Held], int, int]]] = []
        for r, end in zip(self._mem, taken.mem_ends):
            if end > r.start:
                streams.append(iter(((r.events, r.start, end),)))
        for i, d in enumerate(self._disk):
            if len(d) and (not self.gated or d.next_ts <= taken.upto):
                streams.append(self._disk_blocks(d, i, taken))
        return _merge_slices(streams, self.key)

    def _disk_blocks(self, d: _DiskRun, i: int, taken: Taken) -> Iterator[tuple[list[Held], int, int]]:
        """``(events, lo, hi)`` per block: the events of a spilled run with ``commit_ts <= taken.upto``, from its
        first unconsumed one, one decoded block in memory at a time.

        Gated runs are sorted by commit ts, so whole blocks below the limit go out without a per-event test and
        the block holding the limit is cut with a binary search. Records how many events were taken and the
        commit ts of the next one (so later releases that cannot reach it do not read the file at all)."""
        upto = taken.upto
        pos = d.consumed
        blocks = d.blocks
        bi = max(0, bisect.bisect_right([b.start for b in blocks], pos) - 1)
        with d.open() as fh:
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
                taken.disk_taken[i] += cut - skip
                if cut < n:
                    taken.disk_next[i] = evs[cut].commit_ts
                    yield (evs, skip, cut)
                    return
                yield (evs, skip, n)
                pos = b.start + n
        taken.disk_next[i] = None

    def forget(self, taken: Taken) -> None:
        """The taken events are durably applied: drop them, their bytes, their offset entries and their files.
        ``taken.parts()`` must have been iterated to its end (the disk cut is recorded only then)."""
        upto = taken.upto
        for r, end in zip(self._mem, taken.mem_ends):
            if end > r.start:
                gone = sum(ev.size or 0 for ev in itertools.islice(r.events, r.start, end))
                gone += EVENT_OVERHEAD_BYTES * (end - r.start)
                r.bytes -= gone
                self._mem_bytes -= gone
                r.start = end
                r.index.release_upto(upto)
        for d, n, nxt in zip(self._disk, taken.disk_taken, taken.disk_next):
            if n:
                d.consumed += n
                for ix in d.indexes:
                    ix.release_upto(upto)
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
            merged.sort(key=self.key)
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
        chunk_events = SPILL_CHUNK_EVENTS  # read at each spill: tests shrink it to cut many blocks
        try:
            with os.fdopen(fd, "wb") as fh:
                for lo in range(0, len(merged), chunk_events):
                    chunk = merged[lo:lo + chunk_events]
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
                    blocks.append(_Block(pos, len(core), len(rest), lo, len(chunk), max(map(_COMMIT_TS, chunk))))
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
        next_ts = merged[0].commit_ts if self.gated else 0
        self._disk.append(_DiskRun(path, codec, blocks, len(merged), indexes, 0, next_ts))
        self.stats["spills"] += 1
        self.stats["spilled_events"] += len(merged)
        self._mem = []
        self._mem_bytes = 0

    def close(self) -> None:
        """Remove every spill file and the run directory (held events are re-read from Kafka on restart)."""
        for d in self._disk:
            d.path.unlink(missing_ok=True)
        self._disk = []
        if self._spill_dir is not None:
            try:
                self._spill_dir.rmdir()
            except OSError:
                pass

