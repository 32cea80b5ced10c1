"""Where the gate holds row batches (:class:`~applier.columnar.rows.RowBatch`) until their commit ts is released:
the columnar twin of :mod:`applier.spill`, for the same invariants.

* Gating (2): :meth:`BatchStore.take` hands out exactly the rows with ``_ts <= upto`` (a filter per batch) and
  keeps the rest.
* Nothing lost on restart (7): :meth:`BatchStore.min_offsets` lowers each partition's restart offset to the
  lowest offset a held row came from (taken rows count as held until :meth:`BatchStore.forget`). Kept per batch
  when it is added or cut, never by scanning at a progress save.
* Bounded memory (8): beyond the budget, batches go to Arrow IPC files in the spill directory and are read back
  only by a release that reaches their lowest commit ts.
* Duplicates (4): copies of a change (TiCDC re-sends) share its commit ts, so they are always released together:
  :func:`drop_copies` keeps the first of each within what one release takes, which is what the event gate's
  intake filter keeps (a copy split over two micro-batches cannot separate from its original).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.columnar.rows import RowBatch

TopicPartition = tuple[str, int]


@dataclass
class _Held:
    """One held batch: in memory (``batch``) or spilled (``path``), with what releases and restarts need without
    reading it."""

    shape: object
    rows: int
    min_ts: int
    offsets: dict[int, int]  # partition -> lowest offset of its rows
    nbytes: int
    batch: RowBatch | None = None
    path: Path | None = None


def offsets_per_partition(b: RowBatch, how: str) -> dict[int, int]:
    """Per partition of a batch, its lowest (``how`` "min") or highest ("max") offset. A worker's slice is one
    partition, so usually this is one min/max over the whole batch."""
    d = b.data
    parts = d.column("_part")
    lo, hi = pc.min_max(parts).values()
    if lo.as_py() == hi.as_py():
        return {lo.as_py(): getattr(pc, how)(d.column("_off")).as_py()}
    t = pa.table({"p": parts, "o": d.column("_off")}).group_by("p", use_threads=False).aggregate([("o", how)])
    return dict(zip(t.column("p").to_pylist(), t.column(f"o_{how}").to_pylist()))


def _summary(b: RowBatch) -> tuple[int, dict[int, int]]:
    """(lowest commit ts, per partition the lowest offset) of a batch."""
    return pc.min(b.data.column("_ts")).as_py(), offsets_per_partition(b, "min")


@dataclass
class BatchTaken:
    """What one release took: the rows (one batch per held batch it cut) and which held entries it emptied or cut,
    for :meth:`BatchStore.forget`."""

    upto: int
    batches: list[RowBatch] = field(default_factory=list)
    taken: list[tuple[_Held, _Held | None]] = field(default_factory=list)  # (entry, what is left of it)


class BatchStore:
    def __init__(self, *, budget_bytes: int, spill_dir: str | os.PathLike[str] | None,
                 stats: dict[str, int]) -> None:
        self.budget_bytes = budget_bytes
        self._spill_root = Path(spill_dir) if spill_dir else None
        self._dir: Path | None = None
        self._held: list[_Held] = []
        self._mem_bytes = 0
        self._files = 0
        self.stats = stats
        stats.setdefault("spills", 0)
        stats.setdefault("spilled_events", 0)

    # ---- state --------------------------------------------------------------------------------------
    @property
    def held(self) -> int:
        return sum(h.rows for h in self._held)

    @property
    def memory_bytes(self) -> int:
        return self._mem_bytes

    def min_offsets(self, out: dict[TopicPartition, int]) -> None:
        """Lower ``out[tp]`` to the lowest offset any held batch holds (taken but not forgotten counts)."""
        for h in self._held:
            topic = h.shape.topic  # type: ignore[attr-defined]
            for part, off in h.offsets.items():
                tp = (topic, part)
                if off < out.get(tp, off + 1):
                    out[tp] = off

    # ---- intake -------------------------------------------------------------------------------------
    def add(self, batches: Iterable[RowBatch], over_budget: int = 0) -> None:
        """Hold these batches; spill when this store's bytes plus ``over_budget`` (what the rest of the gate
        holds) pass the budget."""
        for b in batches:
            if not len(b):
                continue
            min_ts, offsets = _summary(b)
            nbytes = b.data.get_total_buffer_size()
            self._held.append(_Held(b.shape, len(b), min_ts, offsets, nbytes, batch=b))
            self._mem_bytes += nbytes
        if self._mem_bytes + over_budget > self.budget_bytes:
            self.spill()

    # ---- release ------------------------------------------------------------------------------------
    def take(self, upto: int) -> BatchTaken:
        """Every held row with ``_ts <= upto``, a batch per held batch that has some (in the order they were
        added); the rest stays held."""
        out = BatchTaken(upto)
        for h in self._held:
            if h.min_ts > upto:
                continue
            b = h.batch if h.batch is not None else self._read(h)
            ts = b.data.column("_ts")
            mask = pc.less_equal(ts, upto)
            n = pc.sum(mask).as_py() or 0
            if n == len(b):
                out.batches.append(b)
                out.taken.append((h, None))
                continue
            taken = RowBatch(b.shape, b.data.filter(mask))
            left = RowBatch(b.shape, b.data.filter(pc.invert(mask)))
            min_ts, offsets = _summary(left)
            out.batches.append(taken)
            out.taken.append((h, _Held(h.shape, len(left), min_ts, offsets, left.data.get_total_buffer_size(),
                                       batch=left)))
        return out

    def forget(self, taken: BatchTaken) -> None:
        """The taken rows are applied: drop them (a cut batch keeps its rest, in memory)."""
        if not taken.taken:
            return
        done = {id(h): rest for h, rest in taken.taken}
        kept: list[_Held] = []
        for h in self._held:
            if id(h) not in done:
                kept.append(h)
                continue
            if h.batch is not None:
                self._mem_bytes -= h.nbytes
            if h.path is not None:
                h.path.unlink(missing_ok=True)
            rest = done[id(h)]
            if rest is not None:
                kept.append(rest)
                self._mem_bytes += rest.nbytes
        self._held = kept

    # ---- spill --------------------------------------------------------------------------------------
    def spill(self) -> None:
        """Write every in-memory batch to its own Arrow IPC file."""
        spilled = 0
        for h in self._held:
            if h.batch is None:
                continue
            path = self._next_path()
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, h.batch.data.schema) as w:
                w.write_batch(h.batch.data)
            spilled += h.rows
            self._mem_bytes -= h.nbytes
            h.batch, h.path = None, path
        if spilled:
            self.stats["spills"] += 1
            self.stats["spilled_events"] += spilled

    def _read(self, h: _Held) -> RowBatch:
        assert h.path is not None
        with pa.memory_map(str(h.path), "r") as src:
            data = pa.ipc.open_file(src).get_batch(0)
            # copy out of the mapping: the file is deleted once the rows are applied
            data = pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in data.columns], schema=data.schema)
        return RowBatch(h.shape, data)  # type: ignore[arg-type]

    def _next_path(self) -> Path:
        if self._dir is None:
            root = self._spill_root or Path(tempfile.gettempdir())
            root.mkdir(parents=True, exist_ok=True)
            self._dir = Path(tempfile.mkdtemp(prefix="applier-batches-", dir=root))
        self._files += 1
        return self._dir / f"batch-{self._files:08d}.arrow"

    def close(self) -> None:
        for h in self._held:
            if h.path is not None:
                h.path.unlink(missing_ok=True)
        self._held = []
        self._mem_bytes = 0
        if self._dir is not None:
            try:
                self._dir.rmdir()
            except OSError:
                pass
            self._dir = None


def drop_copies(table: pa.Table, identity: list[str], probe: list[str] | None = None) -> tuple[pa.Table, int]:
    """``table`` (in release order) without the rows that repeat an earlier row's ``identity`` columns exactly; and
    how many were dropped. ``probe``, a subset of ``identity`` (commit ts, op and the key columns), is grouped first:
    rows that repeat the identity repeat the probe too, so only the rows of a probe group with more than one row
    are compared on every column (the costly grouping), usually none or a few."""
    n = table.num_rows
    if n < 2:
        return table, 0
    idx = pa.array(np.arange(n, dtype=np.int64))
    cand = idx
    if probe:
        g = table.select(probe).append_column("__i", idx).group_by(probe, use_threads=False).aggregate(
            [("__i", "count"), ("__i", "list")])
        if g.num_rows == n:
            return table, 0
        many = g.filter(pc.greater(g.column("__i_count"), 1))
        cand = pc.list_flatten(many.column("__i_list").combine_chunks())
    t = table.select(identity).take(cand).append_column("__i", cand)
    first = t.group_by(identity, use_threads=False).aggregate([("__i", "min")]).column("__i_min")
    if len(first) == len(cand):
        return table, 0
    keep = np.ones(n, dtype=bool)
    keep[cand.to_numpy()] = False
    keep[first.to_numpy()] = True
    dropped = int(n - keep.sum())
    return table.filter(pa.array(keep)), dropped
