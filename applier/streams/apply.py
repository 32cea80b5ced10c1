"""A release written as parallel transaction streams that stay consistent as of one resolved ts (invariant 16).

:class:`StreamApplier` stands where :class:`applier.apply.Applier` stands (``BatchProcessor.applier``) when
``[target] apply_streams`` is above 1. It cuts each release of the gate at its DDLs into segments; a segment's row
changes (events and the columnar lane's batches) are split by table (:class:`StreamAssignment`: a table, and every
upstream table merged into the same target, always in the same stream) and each stream writes its share in a
target transaction of its own, on a connection and a thread of its own, ending with its progress
(:meth:`ProgressStore.save_stream`: the stream's applied ts, its tables' applied ts and rows) in that transaction.

How the guarantees hold:

* **One consistent ts.** Every stream finishes a segment before any starts the next, so no stream is ever more
  than one window ahead of another. Once every stream committed the release, the *marker* (``save`` with no
  tables: the pipeline's applied ts and the partitions' restart offsets) moves in a transaction of its own; the
  pipeline's applied ts (what status, verify, ``--until-ts`` and a restart use) is therefore at most every
  stream's.
* **Exactly once.** A crash between two streams' commits, or before the marker, restarts from the marker's
  offsets and re-reads the window; a table whose stream had committed it has an applied ts above the marker's
  (its floor, :attr:`PipelineState.table_floors`) and the gate drops its re-read changes, so nothing is applied
  twice (``rows_applied`` counts each change once) and nothing is skipped.
* **DDL is a barrier.** Every stream writes the rows before the DDL's commit ts, then the DDL runs once (history
  row, and the marker at the DDL's ts, as the single-stream path does), then the streams go on with fresh table
  metadata.
* **Fencing.** Every stream's transaction checks the writer epoch (invariant 13) before it commits, as every
  single-stream transaction does.
* **Quarantine.** A table's quarantined keys are that table's stream's to hold (its ``SetAside``). A release that
  carries undecodable messages (they may block a whole partition, across tables) is applied by one transaction,
  the single-stream way, which is the degenerate case of the same progress model.

Where the shares are written (``[target] apply_on``): by default on ``local[N]`` the streams are threads of the
driver (the database's work runs in parallel, the Python parts share the interpreter lock); on a cluster, or with
``apply_on = "executors"``, each segment's shares are Spark tasks (:mod:`applier.streams.remote`), and the driver
keeps the DDL barrier, the marker, serial releases and the coordinator. With ``apply_on = "one_transaction"``
(what "auto" picks on ``local[N]`` for a target on the same machine, whose cores the threads would only compete
for) every release is written the single-stream way by the coordinator, in one transaction per DDL segment, and
:class:`AllStreamsStore` moves each stream's progress in it: N = 1's transactions, the streams' identity kept.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

from applier.apply import Applier, ApplyStats
from applier.columnar import apply as lane_apply
from applier.events import DDL
from applier.gate import Release
from applier.progress import ProgressStore
from applier.quarantine import UndecodableMessage
from applier.streams.assign import StreamAssignment, split_segment
from applier.streams.remote import Share, ShareView
from applier.streams.store import AllStreamsStore, StreamStore


class _Share(ShareView):
    """One stream's share of one segment of a release, in the shape :meth:`Applier.apply` takes a release:
    its events in commit order, its lane batches, the ts it is applied up to; the gate is moved by the
    :class:`StreamApplier` once every stream committed (``forget`` is nothing here)."""

    __slots__ = ("events", "batches", "applied_ts", "_parent", "_lock")

    def __init__(self, events: list, batches: list, applied_ts: int, parent: Release, lock: threading.Lock) -> None:
        self.events = events
        self.batches = batches
        self.applied_ts = applied_ts
        self._parent = parent
        self._lock = lock

    def dropped_copies(self, n: int) -> None:
        if n:
            with self._lock:
                self._parent.dropped_copies(n)


class StreamApplier:
    """``n`` appliers (one per stream, each with its own writer, caches and quarantine view) and a coordinator
    (the DDL, the marker, and releases that carry undecodable messages), made by ``make(store)``."""

    def __init__(self, make: Callable[[Any], Applier], store: ProgressStore, assignment: StreamAssignment,
                 remote: Any = None, *, one_transaction: bool = False) -> None:
        """``remote``: a :class:`applier.streams.remote.RemoteApply` to write the shares in Spark tasks (None:
        threads of the driver). ``one_transaction``: every stream's share of a release in one transaction of the
        calling thread, with each stream's progress (``[target] apply_on = "one_transaction"``, what measures best
        where the target shares the driver's cores; see :meth:`apply`)."""
        self.store = store
        self.remote = remote
        # bumped whenever the streams must read the tables or the quarantine again (a DDL, a serial release): the
        # executors' cached appliers are per generation (applier.streams.remote)
        self.generation = 0
        self._known: dict[int, int] | None = None  # each stream's applied ts as last committed (remote only)
        self.assignment = assignment
        self.one_transaction = one_transaction and remote is None
        # the coordinator's transactions (a DDL, a release written whole) move every stream they carry rows of
        self.coordinator = make(AllStreamsStore(store, assignment.stream_of))
        self.streams = [] if self.one_transaction else [make(StreamStore(store, i)) for i in range(assignment.n)]
        for a in self.streams:
            a.shards = self.coordinator.shards  # which shards wrote rows decides a shard DDL (coordinator's)
        self.engine = self.coordinator.engine
        self.timer = self.coordinator.timer
        self.total = ApplyStats()
        self._pool = None if self.one_transaction else ThreadPoolExecutor(max_workers=assignment.n,
                                                                          thread_name_prefix="applier-stream")
        self._lock = threading.Lock()
        self._marked = False  # the pipeline's row exists (a stream's save needs it)

    # the Applier surface BatchProcessor and the pipeline use
    @property
    def aside(self) -> Any:
        return self.coordinator.aside

    @property
    def sink(self) -> Any:
        return self.coordinator.sink

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def apply(self, rel: Release, *, undecodable: Iterable[UndecodableMessage] = (), batches: int = 1) -> ApplyStats:
        undecodable = list(undecodable)
        if undecodable or self.one_transaction:
            return self._serial(rel, undecodable, batches)
        stats = ApplyStats()
        if not self._marked:
            self._mark(rel.applied_ts, rel.checkpoint(), 0)  # before any stream's first save: a valid point
        final_ts = max(rel.upto, rel.applied_ts)
        for ddl, seg, seg_batches in lane_apply.cut_at_ddls(list(rel), rel.batches):
            ts = final_ts if ddl is None else max(ddl.commit_ts - 1, rel.applied_ts)
            self._segment(seg, seg_batches, ts, rel, stats)
            if ddl is not None:
                self._ddl(ddl, rel, stats)
        rel.forget()
        self._mark(rel.applied_ts, rel.checkpoint(), batches)
        stats.transactions += 1
        self.total.add(stats)
        return stats

    # ---- the parts --------------------------------------------------------------------------------------
    def _segment(self, events: list, batches: list, ts: int, rel: Release, stats: ApplyStats) -> None:
        """Every stream writes its share of one segment (rows below the next DDL, or to the release's end), in
        parallel; returns once all have committed. A stream that fails leaves the others' commits in place (the
        table floors make the rerun exact) and its error is raised once they are all done."""
        parts = split_segment(events, batches, self.assignment.stream_of, self.assignment.n)
        if self.remote is not None:
            self._segment_remote(parts, ts, rel, stats)
            return
        work = [(i, _Share(ev, bs, ts, rel, self._lock)) for i, ev, bs in parts]
        if not work:
            return
        if len(work) == 1:
            i, share = work[0]
            results = [(i, self._run(i, share))]
        else:
            futures = [(i, self._pool.submit(self._run, i, share)) for i, share in work]
            results = [(i, f.result()) for i, f in futures]
        failed = [r for _, r in results if isinstance(r, BaseException)]
        committed = getattr(self.timer, "stream_applied", None)  # the metrics' per-stream applied ts
        for i, r in results:
            if isinstance(r, ApplyStats):
                stats.add(r)
                if committed is not None:
                    committed(i, ts)
        if failed:
            raise failed[0]

    def _segment_remote(self, parts: list[tuple[int, list, list]], ts: int, rel: Release, stats: ApplyStats) -> None:
        """:meth:`_segment` with the shares written in Spark tasks (one job, one task per stream with work). What
        the tasks report is taken as the threads' results are: stats added, the lane's dropped copies counted, the
        upstream tables they wrote told to the coordinator's shard guard, the first error raised once all ended."""
        if not parts:
            return
        if self._known is None:
            with self.engine.connect() as conn:
                self._known = self.store.streams_applied(conn)
        shares = [Share(i, self.generation, ev, bs, ts, self._known.get(i)) for i, ev, bs in parts]
        with self.timer.span("apply_remote"):
            results = self.remote.run(shares)
        committed = getattr(self.timer, "stream_applied", None)
        failed: list[BaseException] = []
        for r in sorted(results, key=lambda r: r.stream):
            if r.error is not None:
                failed.append(r.error)
                continue
            stats.add(r.stats)
            rel.dropped_copies(r.dropped)
            for schema, table in sorted(r.saw):
                self.coordinator.shards.saw(schema, table)
            self._known[r.stream] = ts
            if r.stats.ddls:  # the stream made a table from the stream's schema: the others read the tables again
                self.generation += 1
            if committed is not None:
                committed(r.stream, ts)
        if failed:
            self._known = None  # read again: a failed stream may or may not have committed
            raise failed[0]

    def _run(self, i: int, share: _Share) -> ApplyStats | BaseException:
        try:
            return self.streams[i].apply(share)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - returned, raised by _segment once every stream is done
            return exc

    def _ddl(self, ddl: DDL, rel: Release, stats: ApplyStats) -> None:
        """The DDL once, by the coordinator, between two segments every stream has committed; then every stream
        reads the tables again (a DDL may have changed any of them)."""
        stats.add(self.coordinator.run_ddl(ddl, rel))
        self.generation += 1
        for a in self.streams:
            a.forget_tables()

    def _mark(self, applied_ts: int, checkpoints: dict, batches: int) -> None:
        with self.engine.connect() as conn:
            with conn.begin():
                with self.timer.span("progress"):
                    self.store.save(conn, applied_ts=applied_ts, checkpoints=checkpoints, table_progress={},
                                    batches=batches)
        self._marked = True

    def _serial(self, rel: Release, undecodable: list[UndecodableMessage], batches: int) -> ApplyStats:
        """A release in one transaction of the coordinator (per DDL segment, as the single-stream path writes it),
        each stream's progress with its rows (:class:`AllStreamsStore`): every release in the one-transaction
        form, and a release with undecodable messages in the others (an undecodable message of an unknown table
        holds its whole partition, across streams), after which the streams reload what is held and the tables."""
        others = not self.one_transaction  # streams in threads or tasks may have held keys since
        if others:
            self.coordinator.aside.forget()
        stats = self.coordinator.apply(rel, undecodable=undecodable, batches=batches)
        self._marked = True
        if others:
            self.generation += 1
            self._known = None  # the streams' rows moved: read them again
            for a in self.streams:
                a.aside.forget()
                a.forget_tables()
        committed = getattr(self.timer, "stream_applied", None)
        if committed is not None:
            for i in range(self.assignment.n):  # every stream's changes up to the release's ts are committed
                committed(i, rel.applied_ts)
        self.total.add(stats)
        return stats
