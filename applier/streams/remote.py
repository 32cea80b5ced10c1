"""The apply streams' shares written in Spark tasks (``[target] apply_on``), so that on a cluster the driver does
no per-row write work (issue 26).

The driver still cuts each release at its DDLs and splits every segment by stream
(:func:`applier.streams.assign.split_segment`); :class:`StreamApplier` hands the segment's :class:`Share` s to
:class:`RemoteApply`, which runs them as one Spark job of one task per share and waits for all of them. The DDL
barrier, the marker, releases with undecodable messages and the coordinator stay in the driver, unchanged: a
task writes exactly what a driver thread would, in one target transaction ending with the stream's progress
(:meth:`ProgressStore.save_stream`).

What a task needs travels inside it (Spark's task binary, never logged): a :class:`RemoteContext` (the
:class:`Settings`, target password included, and the writer epoch the driver claimed) and the share (its events
and the columnar lane's batches, whose Arrow record batches pickle as Arrow buffers). Each Python worker keeps one
:class:`Applier` per stream (:class:`ApplierCache`), built from the settings as the driver builds its own
(:func:`applier.wiring.applier_options`), with a :class:`ProgressStore` that takes the driver's epoch as its
own instead of claiming (a claim would fence the driver): every task's transaction checks that epoch before it
commits, so a run another one took over writes nothing from any executor (invariant 13).

How the guarantees hold in tasks:

* **Fresh metadata after a DDL.** The driver bumps a *generation* whenever the thread path would make its
  streams read the tables or the quarantine again (after a DDL, after a serial release, after a stream made a
  table from the stream's schema); a worker whose cached applier is of an older generation builds a new one.
* **Quarantine.** Another worker may have held keys of a stream since this worker's applier read them, so every
  task reads the held keys again before it writes (:meth:`SetAside.forget`): a held key blocks its later changes
  whichever worker writes them.
* **Exactly once under task retries.** Spark runs a failed task again; an attempt that committed and then died
  (its worker lost after the commit) must not be applied twice. Each task reads its stream's applied ts first:
  :func:`committed_upto` tells from it, the share's ts and what the driver knew before the job how much of the
  share an earlier attempt committed (all of it: the task writes nothing; the rows before a table it made from
  the stream's schema: the task writes the rest).
* **Errors.** A task never raises into Spark (the operator would get a Py4J error around a Java trace): it
  returns the exception in its :class:`ShareResult`, and the driver raises the first one once every task ended,
  as the thread path does, with the class and message the thread path gives.
"""

from __future__ import annotations

import functools
import logging
import pickle
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

from applier.apply import ApplyStats

if TYPE_CHECKING:  # the executors import what they build lazily: this module is loaded by the driver first
    from sqlalchemy.engine import Engine

    from applier.apply import Applier
    from applier.config import Settings

log = logging.getLogger("applier.streams.remote")

MASK = "***"


@dataclass(frozen=True, repr=False)
class RemoteContext:
    """What every task of a run carries besides its share: the settings (target URL and password included: it
    reaches the executors inside Spark's task binary) and the writer epoch the driver claimed. ``repr`` shows
    neither the URL nor the password."""

    settings: "Settings"
    epoch: int

    def __post_init__(self) -> None:
        if self.epoch is None:
            raise ValueError("apply on executors: the driver's ProgressStore must claim the writer epoch first "
                             "(ProgressStore.claim), the tasks write under it (invariant 13)")

    @property
    def pipeline(self) -> str:
        return self.settings.pipeline.name

    def __repr__(self) -> str:
        return f"RemoteContext(pipeline={self.pipeline!r}, epoch={self.epoch})"


class ShareView:
    """What :meth:`Applier.apply` reads of a release, for a stream's share of one: its events in commit order;
    no restart offsets (the marker saves them) and no gate to move (the :class:`StreamApplier` moves it once
    every stream committed). Subclasses hold ``events``."""

    __slots__ = ()
    events: list

    def __iter__(self) -> Iterator:
        return iter(self.events)

    def checkpoint(self) -> dict:
        return {}

    def forget(self) -> None:
        pass


@dataclass(repr=False)
class Share(ShareView):
    """One stream's share of one segment, in the shape :meth:`Applier.apply` takes a release: its events in
    commit order, its lane batches, the ts it is applied up to. ``generation``: the driver's (see the module
    docstring); ``known_ts``: the stream's applied ts as the driver knew it before this job (None: no row yet).
    The gate is moved by the driver once every stream committed (``forget`` is nothing here); copies of a change
    the lane drops are counted in ``dropped`` and reported back."""

    stream: int
    generation: int
    events: list
    batches: list
    applied_ts: int
    known_ts: int | None = None
    dropped: int = field(default=0, init=False)

    def dropped_copies(self, n: int) -> None:
        self.dropped += n

    def after(self, ts: int) -> "Share":
        """The share without its changes committed at or before ``ts`` (what an earlier attempt committed)."""
        import pyarrow.compute as pc

        from applier.columnar.rows import RowBatch

        batches = []
        for b in self.batches:
            data = b.data.filter(pc.greater(b.data.column("_ts"), ts))
            if data.num_rows:
                batches.append(RowBatch(b.shape, data))
        return Share(self.stream, self.generation, [e for e in self.events if e.commit_ts > ts], batches,
                     self.applied_ts, self.known_ts)

    def tables(self) -> frozenset[tuple[str, str]]:
        """The upstream tables whose rows the share carries."""
        return frozenset({(e.schema, e.table) for e in self.events}
                         | {(b.shape.schema, b.shape.table) for b in self.batches})

    def __repr__(self) -> str:  # never the rows: they may be anyone's data
        return (f"Share(stream={self.stream}, generation={self.generation}, events={len(self.events)}, "
                f"batches={len(self.batches)}, applied_ts={self.applied_ts})")


@dataclass
class ShareResult:
    """What a task gives back: its stream's stats, the lane's dropped copies, the upstream tables it wrote
    (replayed into the coordinator's shard guard), whether an earlier attempt had committed the share
    (``skipped``), or the error it failed with."""

    stream: int
    stats: ApplyStats = field(default_factory=ApplyStats)
    dropped: int = 0
    saw: frozenset[tuple[str, str]] = frozenset()
    skipped: bool = False
    error: BaseException | None = None


class RemoteTaskError(RuntimeError):
    """An apply stream's task failed with an exception that cannot travel back to the driver as it is (not
    picklable, or its message held the target's password): its class name and (masked) message."""


def committed_upto(row_ts: int | None, share_ts: int, known_ts: int | None) -> int | None:
    """The ts up to which earlier attempts of a task committed its share's changes, or None when they committed
    nothing this can tell; from the stream's applied ts read now (``row_ts``; None: no row), the share's ts and the
    stream's applied ts the driver knew before the job (``known_ts``).

    Only the stream's own commits move its row. When the driver knew it below the share's ts (or knew none), a row
    past what the driver knew was written by an attempt of this share: all of it (at or past the share's ts) or
    the part before a table it made from the stream's schema (``[target] schema_evolution`` commits the rows before
    such a DDL first). When the driver already knew it at or past the share's ts (a restart with another
    ``apply_streams``, whose old rows say nothing about the new split's tables), the row cannot tell: None, and
    the share is written whole (the writes are idempotent; skipping could lose rows)."""
    if row_ts is None:
        return None
    if known_ts is not None and (known_ts >= share_ts or row_ts <= known_ts):
        return None
    return min(row_ts, share_ts)


def already_committed(row_ts: int | None, share_ts: int, known_ts: int | None) -> bool:
    """Whether an earlier attempt of a task committed its whole share (see :func:`committed_upto`)."""
    done = committed_upto(row_ts, share_ts, known_ts)
    return done is not None and done >= share_ts


def cache_key(context: RemoteContext, share: Share) -> tuple[str, int, int, int]:
    """(pipeline, writer epoch, stream, generation): an applier built for another epoch (a later run) or an
    older generation (before a DDL) is never used for a share."""
    return (context.pipeline, context.epoch, share.stream, share.generation)


class ApplierCache:
    """A Python worker's appliers, one per (pipeline, epoch, stream) at its latest generation; ``build(context,
    stream)`` makes one. A new epoch of a pipeline drops (and ``close``s) everything of its older ones."""

    def __init__(self, build: Callable[[RemoteContext, int], Any], close: Callable[[str, int], None] = lambda p, e: None
                 ) -> None:
        self._build = build
        self._close = close
        self._appliers: dict[tuple[str, int, int], tuple[int, Any]] = {}
        self._epochs: dict[str, int] = {}

    def get(self, context: RemoteContext, share: Share) -> Any:
        pipeline, epoch, stream, generation = cache_key(context, share)
        old = self._epochs.get(pipeline)
        if old != epoch:
            for k in [k for k in self._appliers if k[0] == pipeline]:
                del self._appliers[k]
            if old is not None:
                self._close(pipeline, old)
            self._epochs[pipeline] = epoch
        got = self._appliers.get((pipeline, epoch, stream))
        if got is None or got[0] != generation:
            got = (generation, self._build(context, stream))
            self._appliers[(pipeline, epoch, stream)] = got
        return got[1]


class _SawRecorder:
    """An applier's shard guard, noting which upstream tables it wrote rows of (the coordinator's guard in the
    driver is told afterwards: it decides a shard's DDL)."""

    def __init__(self, guard: Any) -> None:
        self._guard = guard
        self.seen: set[tuple[str, str]] = set()

    def saw(self, schema: str, table: str) -> None:
        self.seen.add((schema, table))
        self._guard.saw(schema, table)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._guard, name)


# ---- the executor side --------------------------------------------------------------------------------------

_engines: dict[tuple[str, int], "Engine"] = {}
#: runs (pipeline, epoch) whose engines a worker keeps: a worker outlives runs (one Spark session applies several
#: pipelines in tests and tools), and each engine holds pooled target connections
ENGINES_KEPT = 4


def _engine(context: RemoteContext) -> "Engine":
    """This worker's engine for the run (pipeline, epoch), made as the driver makes its own; the pools of the
    least recently made beyond :data:`ENGINES_KEPT` are closed (a later task of theirs opens new connections)."""
    key = (context.pipeline, context.epoch)
    engine = _engines.get(key)
    if engine is None:
        from applier.wiring import make_engine, settle_load_data

        engine = _engines[key] = settle_load_data(make_engine(context.settings, load_data=True), context.settings)
        while len(_engines) > ENGINES_KEPT:
            _engines.pop(next(iter(_engines))).dispose()
    return engine


def _dispose(pipeline: str, epoch: int) -> None:
    engine = _engines.pop((pipeline, epoch), None)
    if engine is not None:
        engine.dispose()


def build_applier(context: RemoteContext, stream: int) -> "Applier":
    """Stream ``stream``'s applier in a Spark task: the driver's settings, router and policies
    (:func:`applier.wiring.applier_options`), the worker's engine, and a store that writes under the driver's
    epoch without claiming it; no stage timer (the driver times the whole job)."""
    from applier.apply import Applier
    from applier.dialect import dialect_for
    from applier.progress import ProgressStore
    from applier.streams.store import StreamStore
    from applier.timing import NO_TIMING
    from applier.wiring import applier_options, router_for

    settings = context.settings
    engine = _engine(context)
    store = ProgressStore(settings.pipeline.name, settings.source.protocol)
    store.epoch = context.epoch  # the driver's claim: checked by every save (invariant 13), never claimed here
    router = router_for(settings)
    a = Applier(engine, dialect_for(engine), router.route, StreamStore(store, stream), replace_mode=False,
                timer=NO_TIMING, **applier_options(settings, router))
    a.shards = _SawRecorder(a.shards)  # type: ignore[assignment]
    return a


_CACHE = ApplierCache(build_applier, _dispose)


def apply_share(context: RemoteContext, share: Share, cache: ApplierCache = _CACHE) -> ShareResult:
    """One share, in a task: skipped when an earlier attempt committed it, else written and committed with the
    stream's progress. Never raises an ``Exception``: it is returned (see :func:`portable_error`)."""
    try:
        a = cache.get(context, share)
        a.aside.forget()  # what another worker's applier of this stream held since: read again
        with a.engine.connect() as conn:
            row_ts = a.store.streams_applied(conn).get(share.stream)
        done = committed_upto(row_ts, share.applied_ts, share.known_ts)
        if done is not None and done >= share.applied_ts:
            log.info("apply stream %d: its share up to ts %d was committed by an earlier attempt of the task",
                     share.stream, share.applied_ts)
            return ShareResult(share.stream, saw=share.tables(), skipped=True)
        rest = share if done is None else share.after(done)  # an attempt committed the part before a made table
        a.shards.seen.clear()
        stats = a.apply(rest)
        return ShareResult(share.stream, stats, rest.dropped, frozenset(a.shards.seen) | share.tables() - rest.tables())
    except Exception as exc:  # noqa: BLE001 - returned: the driver raises it once every task ended
        return ShareResult(share.stream, error=portable_error(exc, _secrets(context)))


def run_shares(context: RemoteContext, shares: Iterable[Share]) -> Iterator[ShareResult]:
    """The ``mapPartitions`` function: every share of the task's partition (one per partition)."""
    for share in shares:
        yield apply_share(context, share)


def _secrets(context: RemoteContext) -> list[str]:
    pw = context.settings.target_url().password
    return [] if not pw else [str(pw)]


def portable_error(exc: BaseException, secrets: Iterable[str] = ()) -> BaseException:
    """``exc`` as it can travel back to the driver: itself when it pickles and its message holds no URL with a
    secret as its password (the driver then raises exactly what a driver thread would: the transient-fault retry
    and the apply-error policies see the same class), else a :class:`RemoteTaskError` with its class name and its
    message, secrets masked.

    Only the URL form (``:secret@``) counts as a leak: a bare substring test changed the class of ordinary errors
    whenever the password also spelled a database or table name ("Table 'applier.x' doesn't exist" with the
    password "applier"), and with it whether a transient fault was retried. A driver thread's error is not
    searched for the password either."""
    text = str(exc)
    masked = text
    for secret in secrets:
        for form in sorted({secret, urllib.parse.quote(secret, safe="")}, key=len, reverse=True):
            if form:
                masked = masked.replace(f":{form}@", f":{MASK}@")
    if masked == text:
        try:
            back = pickle.loads(pickle.dumps(exc))
            if type(back) is type(exc) and str(back) == text:
                return exc
        except Exception:  # noqa: BLE001 - not picklable as it is: sent as text
            pass
    return RemoteTaskError(f"{type(exc).__name__}: {masked}")


# ---- the driver side ---------------------------------------------------------------------------------------

class RemoteApply:
    """Runs a segment's shares as one Spark job, one task per share, and returns every task's result once all
    ended (a failed share's error is in its result: Spark sees only successful tasks).

    The jobs run in a job group of their own, so that :meth:`cancel` can end a wait that would otherwise last
    for ever: a task whose launch message an executor could not read is never run and never reported lost,
    and Spark waits for it without end (seen once on the loopback cluster, ``IllegalStateException: unread block
    data`` in the executor, as a live run's query was being stopped). A cancelled job raises in :meth:`run`, and
    Spark kills its tasks' Python workers: each share's transaction has either committed whole (with its stream's
    progress) or is rolled back by the database when the connection drops, as after a crash between two streams'
    commits."""

    def __init__(self, spark: Any, context: RemoteContext) -> None:
        self.spark = spark
        self.context = context
        self.group = f"applier-apply-{uuid.uuid4().hex[:12]}"

    def run(self, shares: list[Share]) -> list[ShareResult]:
        if not shares:
            return []
        sc = self.spark.sparkContext
        sc.setJobGroup(self.group, "applier: apply streams' shares", False)  # this thread's jobs from here on
        rdd = sc.parallelize(shares, len(shares))
        return rdd.mapPartitions(functools.partial(run_shares, self.context)).collect()

    def cancel(self) -> None:
        """Cancel the shares' job being waited for, if any (from any thread): :meth:`run` raises."""
        self.spark.sparkContext.cancelJobGroup(self.group)
