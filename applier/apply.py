"""Apply what the gate releases: batched row writes and DDL, with progress in the same transaction.

A release (every held event up to the global resolved ts, in commit order) is cut at each DDL into segments.
Rows of a segment are planned and written per target table in chunks, all inside one transaction that ends by
recording the progress (applied resolved ts, per-partition restart offsets and resolved ts, per-table counts),
so data and progress commit together (invariant 6). A DDL runs between segments:

* PostgreSQL: the DDL, its history row and the progress commit in one transaction.
* MySQL/MariaDB: DDL commits implicitly, so the history row is written as ``started`` and committed first, the
  statements run, then the row becomes ``done`` together with the progress. After a crash in between, the replay
  sees ``started`` and re-runs the statements, treating "already exists / does not exist" errors as done.

Every one of these transactions commits only after :meth:`ProgressStore.save` or
:meth:`ProgressStore.ddl_record` checked, inside it, that this run still holds the pipeline's writer epoch
(invariant 13); a run another one took over gets :class:`~applier.progress.WriterFenced` and rolls back. The
MySQL DDL statements themselves commit implicitly and cannot be checked: the "started" marker before them is.

A DDL that cannot be translated, or that the target refuses with an error that is neither transient (retried,
invariant 14) nor a fault of the target itself (read-only, privileges, space: :meth:`Dialect.is_target_fault`),
is settled by ``[target] on_unsupported_ddl``: ``stop`` (the message names the DDL's Kafka position, its table,
the target's error and the key), or ``skip``: recorded in ``applier_ddl_history`` as ``skipped`` with the reason and
the position, together with the progress past it, and the pipeline goes on. On MySQL/MariaDB the ``started`` row
committed before the statement becomes ``skipped`` in that transaction, so a crash in between replays the
statement, which is refused again (or found in effect) and settled the same way; under ``stop`` it becomes
``refused``, so that the rerun runs the statement afresh, not as a replay that would take "does not exist" for done.

Any other error stops the pipeline; restart resumes from the progress tables and converges (the gate drops what
is already applied and the writes are idempotent).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

import pyarrow.compute as pc
from sqlalchemy.engine import Connection, Engine, Transaction

from applier.ddl import TranslatedDDL, UnsupportedDDL
from applier import evolve
from applier.dialect import Dialect
from applier.events import DDL, RowChange
from applier import modes
from applier.columnar import apply as lane_apply
from applier.columnar.held import drop_copies
from applier.columnar.plan import NotColumnar, plan_arrow, to_batch_plan
from applier.gate import Release, row_identity
from applier.progress import ProgressStore, TableProgress, ddl_key
from applier.quarantine import RowQuarantine, UndecodableMessage, key_text, keys_of
from applier.setaside import SetAside, find_refused
from applier.shards import ALREADY_ADDED, ShardGuard, reshapes
from applier.sinks import ApplyError, BatchPlan, db_reason, plan_batch
from applier.sinks.base import VERBATIM
from applier.sinks.table import MissingTable, TableMeta, shown
from applier.timing import NO_TIMING, StageTimer

log = logging.getLogger("applier.apply")

Route = Callable[[str, str], "tuple[str, str] | None"]

_CREATE_SCHEMA = "create schema"  # what _exec names the target schema's preparation
CHUNK_EVENTS = 20_000  # row changes planned and written at a time: bounds memory for huge transactions


@dataclass
class ApplyStats:
    rows: int = 0
    ddls: int = 0
    ddls_skipped: int = 0
    quarantined_rows: int = 0  # refused or blocked row changes set aside (on_apply_error)
    transactions: int = 0
    write_seconds: float = 0.0
    tables: dict[tuple[str, str], int] = field(default_factory=dict)

    def add(self, s: "ApplyStats") -> None:
        """Count ``s`` in these totals (a run's, or a release's over its apply streams)."""
        self.rows += s.rows
        self.ddls += s.ddls
        self.ddls_skipped += s.ddls_skipped
        self.quarantined_rows += s.quarantined_rows
        self.transactions += s.transactions
        for k, v in s.tables.items():
            self.tables[k] = self.tables.get(k, 0) + v


class _DDLRefused(ApplyError):
    """A statement of a DDL failed on the target (and it was not a replay finding it in effect): carries what
    :meth:`Applier._ddl_refused` needs to stop or skip by policy; the driver's error is its ``__cause__``."""

    def __init__(self, message: str, statement: str, reason: str) -> None:
        super().__init__(message)
        self.statement = statement
        self.reason = reason


class _WriteRefused(ApplyError):
    """A chunk's write failed: carries what :meth:`Applier._refused_row` needs once the transaction is gone."""

    def __init__(self, message: str, plan: BatchPlan, changes: list[RowChange]) -> None:
        super().__init__(message)
        self.plan = plan
        self.changes = changes


class Applier:
    def __init__(self, engine: Engine, dialect: Dialect, route: Route, store: ProgressStore, *,
                 batch_rows: int = 5000, on_unsupported_ddl: str = "stop", shard_ddl: str = "stop",
                 on_apply_error: str = "stop", chunk_events: int = CHUNK_EVENTS,
                 replace_mode: bool = False, ddl_scope: Callable[[str, str], bool] | None = None,
                 apply_error_policy: Callable[[str, str], str | None] | None = None,
                 schema_evolution: str = "none",
                 write_mode: Callable[[str, str], str] | None = None,
                 timer: StageTimer = NO_TIMING) -> None:
        self.engine = engine
        self.dialect = dialect
        self.sink = dialect.writer(batch_rows, timer)
        self.timer = timer
        self.route = route
        # names a DDL may touch beyond its message's own schema: those a [[route]] rule keeps on purpose
        self.ddl_scope = ddl_scope or (lambda schema, table: False)
        self._own_schema: str | None = None
        self.store = store
        self.on_unsupported_ddl = on_unsupported_ddl
        self.shard_ddl = shard_ddl
        self.on_apply_error = on_apply_error  # stop | quarantine | skip (applier.quarantine)
        # a [[route]] rule's own on_apply_error for the tables it decides (None: the one above)
        self.apply_error_policy = apply_error_policy or (lambda schema, table: None)
        self.rows_quarantine = RowQuarantine(store.pipeline)
        self.aside = SetAside(self.sink, self.rows_quarantine, timer, replace_mode=replace_mode)
        self.shards = ShardGuard(engine, store, lambda schema, table: self.route(schema, table), self.sink.reflect)
        self.chunk_events = chunk_events
        self.replace_mode = replace_mode  # ungated streams: clear unique-key holders before upserts
        self.total = ApplyStats()
        # how an upstream table is written: replica | history | soft_delete (a [[route]] rule's mode, applier.modes)
        self.write_mode = write_mode or (lambda schema, table: modes.REPLICA)
        self._modes: dict[tuple[str, str], str] = {}  # upstream table -> its mode
        self._mode_tables: dict[int, tuple[TableMeta, tuple[str, ...]]] = {}  # id(meta) -> (meta, upstream key)
        # [target] schema_evolution (applier/evolve.py): none | create | evolve
        self.schema_evolution = schema_evolution
        # upstream table -> the column tuples checked since the last DDL (a few per table: TiCDC's canal-json gives
        # an INT UNSIGNED column sqlType INT or BIGINT by the row's value, so a table's rows alternate between two
        # column tuples, and remembering only the last one re-checked every other row: 6 us per row change)
        self._shape_ready: dict[tuple[str, str], list[tuple]] = {}
        self._ran: list[str] = []  # the statements of the DDL being applied that ran (for a refusal's record)

    # ---- entry point -----------------------------------------------------------------------------------
    def apply(self, rel: Release, *, undecodable: Iterable[UndecodableMessage] = (), batches: int = 1) -> ApplyStats:
        """Apply a release of the gate and record progress, even when nothing was released. ``undecodable``:
        messages the policy quarantined or skipped, recorded in this transaction; a held one holds every later
        change of its table, or of its partition when its table is unknown (invariant 12)."""
        stats = ApplyStats()
        with self.engine.connect() as conn:
            tx = conn.begin()
            self.sink.begin(conn)
            try:
                self.aside.load(conn)
                for u in undecodable:
                    self.store.quarantine(conn, u.message, u.reason)
                    self.aside.block(conn, u)
                progress: dict[tuple[str, str], TableProgress] = {}
                chunk: list[RowChange] = []
                evolving = self.schema_evolution != "none"
                ready = self._shape_ready
                for ev in self._lane_source(conn, rel, progress, stats):
                    if isinstance(ev, DDL):
                        tx = self._between(conn, tx, ev, chunk, progress, rel, stats)
                        chunk = []
                        progress.clear()  # saved with the segment; the same dict goes on (the lane writes into it)
                        ready.clear()  # a DDL may have changed any table's shape
                        continue
                    if evolving and not _is_ready(ready.get((ev.schema, ev.table)), ev.columns):
                        made = self._schema_from_stream(conn, ev)
                        if made is not None:
                            tx = self._between(conn, tx, made, chunk, progress, rel, stats)
                            chunk = []
                            progress.clear()
                            # the other shapes are checked again against the changed table; (a skipped one fails
                            # at the write, loudly)
                            ready[(ev.schema, ev.table)] = [ev.columns]
                    chunk.append(ev)
                    if len(chunk) >= self.chunk_events:
                        self._write_rows(conn, chunk, progress, stats)
                        chunk = []
                self._write_rows(conn, chunk, progress, stats)
                rel.forget()
                with self.timer.span("progress"):
                    self.store.save(conn, applied_ts=rel.applied_ts, checkpoints=rel.checkpoint(),
                                    table_progress=progress, batches=batches)
                with self.timer.span("commit"):
                    tx.commit()
                stats.transactions += 1
            except _WriteRefused as exc:
                self.aside.forget()
                if tx.is_active:
                    tx.rollback()  # first: the search below must not wait for this transaction's locks
                raise ApplyError(str(exc) + self._refused_row(exc.plan, exc.changes)) from exc.__cause__
            except BaseException:
                self.aside.forget()
                if tx.is_active:
                    tx.rollback()
                raise
        self._accumulate(stats)
        return stats

    def run_ddl(self, ev: DDL, rel: Release) -> ApplyStats:
        """Apply one DDL alone, on a connection of its own, between segments of a release whose rows other
        transactions committed (the apply streams' barrier, :mod:`applier.streams.apply`): what is held is read
        again first (a DDL that reshapes a table waits for the held changes before it)."""
        stats = ApplyStats()
        self.aside.forget()
        with self.engine.connect() as conn:
            with conn.begin():
                self.aside.load(conn)
            self._apply_ddl(conn, ev, rel, stats)
        self.forget_tables()
        self._accumulate(stats)
        return stats

    def forget_tables(self) -> None:
        """Read every target table's shape again (another applier ran a DDL)."""
        self.sink.forget_tables(None)
        self._shape_ready.clear()

    def _between(self, conn: Connection, tx: Transaction, ev: DDL, chunk: list[RowChange],
                 progress: dict[tuple[str, str], TableProgress], rel: Release, stats: ApplyStats) -> Transaction:
        """Run a DDL between two segments: everything before it is written and committed with its progress first
        (a MySQL DDL commits implicitly), then the DDL, then a new transaction for what follows."""
        self._write_rows(conn, chunk, progress, stats)
        with self.timer.span("progress"):
            self.store.save(conn, applied_ts=max(ev.commit_ts - 1, rel.applied_ts),
                            checkpoints=rel.checkpoint(), table_progress=progress)
        with self.timer.span("commit"):
            tx.commit()
        stats.transactions += 1
        self._apply_ddl(conn, ev, rel, stats)
        tx = conn.begin()
        self.sink.begin(conn)
        return tx

    # ---- the columnar lane (applier/columnar/apply.py) ----------------------------------------------------
    def _lane_source(self, conn: Connection, rel: Release, progress: dict[tuple[str, str], TableProgress],
                     stats: ApplyStats) -> Iterable:
        """What the per-event loop iterates. With row batches in the release (the columnar lane, see
        :mod:`applier.columnar.apply`) the release is cut at its DDLs; in each segment, the batches of a table
        with no row events there, for which the target is ready, are written the columnar way just before the
        loop takes the segment's DDL (or at the end), and every other row goes to the loop as events, in commit
        order."""
        batches = rel.batches
        if not batches:
            return rel
        return self._segments(conn, list(rel), batches, progress, stats, rel)

    def _segments(self, conn: Connection, events: list, batches: list, progress: dict[tuple[str, str], TableProgress],
                  stats: ApplyStats, rel: Release) -> Iterator:
        for ddl, seg_events, seg in lane_apply.cut_at_ddls(events, batches):
            with_events = {(e.schema, e.table) for e in seg_events}
            lane = [b for b in seg if (b.shape.schema, b.shape.table) not in with_events]
            ready = self._lane_ready(conn, lane) if lane else set()
            columnar = [b for b in lane if (b.shape.schema, b.shape.table) in ready]
            if columnar:
                self._write_batches(conn, columnar, progress, stats, rel)
            others = [b for b in seg if (b.shape.schema, b.shape.table) not in ready]
            if others:
                merged, dropped = lane_apply.window_events(seg_events, others, row_identity)
                rel.dropped_copies(dropped)
                yield from merged
            else:
                yield from seg_events
            if ddl is not None:
                yield ddl

    def _lane_ready(self, conn: Connection, batches: list) -> set[tuple[str, str]]:
        """The tables of these batches whose every column tuple schema evolution finds the target ready for
        (checked as the per-event loop checks them, with one row of each; a tuple that needs a DDL leaves its table
        to that loop)."""
        tables = {(b.shape.schema, b.shape.table) for b in batches}
        if self.schema_evolution == "none":
            return tables
        ready = self._shape_ready
        out = set(tables)
        for b in batches:
            table = (b.shape.schema, b.shape.table)
            if table not in out:
                continue
            for i, cols in enumerate(b.shape.variants):
                if _is_ready(ready.get(table), cols):
                    continue
                first = pc.index(b.data.column("_var"), i).as_py()
                if first < 0:
                    continue
                ev = lane_apply.RowBatch(b.shape, b.data.slice(first, 1)).to_events()[0]
                if self._schema_from_stream(conn, ev) is not None:
                    out.discard(table)
                    break
        return out

    def _write_batches(self, conn: Connection, batches: list, progress: dict[tuple[str, str], TableProgress],
                       stats: ApplyStats, rel: Release) -> None:
        for (schema, table), bs in lane_apply.by_table(batches).items():
            target = self.route(schema, table)
            if target is None:
                continue
            try:
                meta = self.sink.table(conn, *target)
            except Exception as exc:  # as in _write_rows
                what = str(exc) if isinstance(exc, ApplyError) else (
                    f"reading target table {shown(*target)} failed: {db_reason(exc)}")
                raise ApplyError(f"{what} (upstream table {shown(schema, table)})") from exc
            aplan = None
            unified = None
            tk = (schema, table)
            if tk not in self._modes:
                self._modes[tk] = self.write_mode(*tk)
            if (meta.key and self.aside.idle() and not self.replace_mode and self._modes[tk] == modes.REPLICA
                    and (self.apply_error_policy(schema, table) or self.on_apply_error) == "stop"):
                unified = lane_apply.unify(bs)
            if unified is not None:
                rows, names, kinds = unified
                rows, dropped = drop_copies(rows, lane_apply.identity_columns(names),
                                            lane_apply.probe_columns(bs[0].shape))
                rel.dropped_copies(dropped)
                try:
                    with self.timer.span("plan"):
                        aplan = plan_arrow(meta, rows, names)
                        by_name = dict(zip(names, kinds))
                        to_python = lane_apply.python_values(by_name)
                        arrow = self.sink.takes_arrow(conn, meta, aplan.upserts, by_name)
                        plan = to_batch_plan(meta, aplan, to_python, upserts=not arrow)
                except NotColumnar as exc:
                    log.debug("columnar lane: %s.%s goes per event: %s", schema, table, exc)
                    aplan = None
            if aplan is None:
                events, dropped = lane_apply.window_events([], bs, row_identity)
                rel.dropped_copies(dropped)
                self._write_rows(conn, events, progress, stats)  # type: ignore[arg-type]
                continue
            self._write_plan(conn, meta, plan, lambda: lane_apply.window_events([], bs, row_identity)[0],
                             (aplan.upserts, by_name) if arrow else None, lambda: to_batch_plan(meta, aplan, to_python))
            n = rows.num_rows
            self.timer.count("rows_columnar", n)
            tp = progress.setdefault(tk, TableProgress(*target))
            self.shards.saw(schema, table)
            tp.rows += n
            stats.rows += n
            stats.tables[tk] = stats.tables.get(tk, 0) + n

    # ---- schema from the stream (applier/evolve.py) -----------------------------------------------------
    def _schema_from_stream(self, conn: Connection, ev: RowChange) -> DDL | None:
        """The DDL event that makes the target ready for ``ev``'s columns, or None (and the column tuple is then
        remembered as ready, so the check costs one identity test per row until the shape changes)."""
        target = self.route(ev.schema, ev.table)
        query = None
        if target is not None:
            try:
                meta: TableMeta | None = self.sink.table(conn, *target)
            except MissingTable:
                meta = None
            except Exception as exc:  # a lost connection (kept in the chain: transient) or a name the catalog refuses
                raise ApplyError(f"reading target table {shown(*target)} failed: {db_reason(exc)} (upstream table "
                                 f"{shown(ev.schema, ev.table)}, row change at {ev.position})") from exc
            shape = None if meta is None else evolve.TargetShape(frozenset(meta.columns), meta.types)
            try:
                query = evolve.needed(self.schema_evolution, ev, shape, dialect=self.dialect.name)
            except evolve.SchemaRefused as exc:
                raise ApplyError(f"{exc} (row change at {ev.position}, commit ts {ev.commit_ts}; [target] "
                                 f"schema_evolution = \"{self.schema_evolution}\")") from None
        if query is None:
            _mark_ready(self._shape_ready, (ev.schema, ev.table), ev.columns)
            return None
        log.info("schema from the stream: %s needs %s", shown(*target), query[:300], extra={"position": ev.position})
        return evolve.schema_ddl(ev, query)

    # ---- rows ------------------------------------------------------------------------------------------
    def _write_rows(self, conn: Connection, chunk: list[RowChange], progress: dict[tuple[str, str], TableProgress],
                    stats: ApplyStats) -> None:
        if not chunk:
            return
        by_table: dict[tuple[str, str], list[RowChange]] = {}
        for ch in chunk:
            by_table.setdefault((ch.schema, ch.table), []).append(ch)
        for (schema, table), changes in by_table.items():
            target = self.route(schema, table)
            if target is None:
                continue
            try:
                meta = self.sink.table(conn, *target)
            except Exception as exc:  # a missing table, or a name the catalog query refuses (NUL on PostgreSQL)
                first, last = changes[0].position, changes[-1].position
                what = str(exc) if isinstance(exc, ApplyError) else (
                    f"reading target table {shown(*target)} failed: {db_reason(exc)}")
                raise ApplyError(f"{what} (upstream table {shown(schema, table)}, events from {first} to {last})"
                                 ) from exc
            changes, held = self.aside.hold_blocked(conn, meta, changes)
            stats.quarantined_rows += held
            policy = self.apply_error_policy(schema, table) or self.on_apply_error
            if policy != "stop":
                changes, aside = self.aside.write(conn, meta, changes, policy)
                stats.quarantined_rows += aside
            else:
                self._write(conn, meta, changes)
            tp = progress.setdefault((schema, table), TableProgress(*target))
            self.shards.saw(schema, table)
            tp.rows += len(changes)
            stats.rows += len(changes)
            stats.tables[(schema, table)] = stats.tables.get((schema, table), 0) + len(changes)

    def _write(self, conn: Connection, meta: TableMeta, changes: list[RowChange]) -> None:
        if not changes:
            return
        tk = (changes[0].schema, changes[0].table)
        mode = self._modes.get(tk)
        if mode is None:
            mode = self._modes[tk] = self.write_mode(*tk)  # configuration: fixed for the run
        if mode != modes.REPLICA:
            self._write_moded(conn, meta, changes, mode)
            return
        with self.timer.span("plan"):
            plan = plan_batch(meta, changes, replace=self.replace_mode)
        self._write_plan(conn, meta, plan, lambda: changes)

    def _write_plan(self, conn: Connection, meta: TableMeta, plan: BatchPlan,
                    changes: Callable[[], list[RowChange]], arrow: Any = None,
                    whole: Callable[[], BatchPlan] | None = None) -> None:
        """Write one table's plan; a refusal names the changes (``changes()``: the lane makes them only then).
        ``arrow``: the plan's upserts as the lane's Arrow table and its columns' kinds, which the writer took
        (``plan`` then holds the deletes only; ``whole()`` makes the plan with its upserts as Python rows, for
        the refused-row search)."""
        try:
            with self.timer.span("write"):
                self.sink.write(conn, plan)
                if arrow is not None:
                    self.sink.upsert_arrow(conn, meta, *arrow)
            upserted, deleted = plan.written()
            if arrow is not None:
                upserted += arrow[0].num_rows
                self.timer.count("rows_upserted_from_arrow", arrow[0].num_rows)
            self.timer.count("rows_upserted", upserted)
            self.timer.count("rows_deleted", deleted)
        except ApplyError:
            raise
        except Exception as exc:
            if arrow is not None and whole is not None:
                plan = whole()
            evs = changes()
            first, last = evs[0].position, evs[-1].position
            raise _WriteRefused(
                f"writing {len(evs)} change(s) of upstream table {shown(evs[0].schema, evs[0].table)} "
                f"into {meta.display} failed (events from {first} to {last}): {db_reason(exc)}", plan, evs
            ) from exc

    # ---- history and soft-delete modes -----------------------------------------------------------------
    def _write_moded(self, conn: Connection, meta: TableMeta, changes: list[RowChange], mode: str) -> None:
        """Write a table's changes in route mode history or soft_delete (applier.modes plans them, the writer's
        section of that name writes them). A refused write stops with the database's reason; the refused row is
        not searched for (that search replays replica writes)."""
        key = self._mode_ready(conn, meta, changes, mode)
        try:
            with self.timer.span("plan"):
                if mode == modes.HISTORY:
                    hplan = modes.plan_history(meta, key, changes)
                else:
                    splan = modes.plan_soft_delete(meta, changes)
            with self.timer.span("write"):
                if mode == modes.HISTORY:
                    self.sink.write_history(conn, meta, hplan)  # type: ignore[attr-defined]
                    self.timer.count("rows_upserted", len(hplan.versions))
                else:
                    self.sink.write_soft_delete(conn, meta, splan)  # type: ignore[attr-defined]
                    self.timer.count("rows_upserted", len(splan.upserts))
                    self.timer.count("rows_deleted", len(splan.hard_deletes) + len(splan.soft_deletes))
        except ApplyError:
            raise
        except Exception as exc:
            first, last = changes[0].position, changes[-1].position
            raise ApplyError(
                f"writing {len(changes)} change(s) of upstream table {shown(changes[0].schema, changes[0].table)} "
                f"into {meta.display} (route mode {mode}) failed (events from {first} to {last}): {db_reason(exc)}"
            ) from exc

    def _mode_ready(self, conn: Connection, meta: TableMeta, changes: list[RowChange], mode: str) -> tuple[str, ...]:
        """The upstream key of a table written in ``mode``, once its shape was checked (once per table shape: a DDL
        re-reads the table). A table that lacks the mode's columns, has another key than the upstream key (+
        ``_commit_ts`` in history mode), keeps another unique key, or has no key at all stops the run, naming the
        statements that would make it ready (the ones run after a replicated CREATE TABLE)."""
        hit = self._mode_tables.get(id(meta))
        if hit is not None and hit[0] is meta:
            return hit[1]
        first = changes[0]
        where = f"(upstream table {shown(first.schema, first.table)}, first change at {first.position})"
        stream_key = first.key_columns if mode == modes.HISTORY else ()
        try:
            shape = self.sink.mode_shape(conn, meta.schema, meta.name)  # type: ignore[attr-defined]
            need = modes.conform(mode, shape, stream_key)
            fix = self.dialect.mode_statements(conn.dialect.identifier_preparer, shape, need) if need else []
        except modes.ModeError as exc:
            raise ApplyError(f"{exc} {where}") from None
        if need:
            raise ApplyError(
                f"target table {meta.display} is routed with mode = \"{mode}\" but lacks what the mode needs: "
                f"{need.describe()} {where}. Run on the target: {'; '.join(fix)} (a table that already holds rows "
                "needs values for the new NOT NULL columns first), or route the table with mode = \"replica\"; then "
                "restart")
        if len(self._mode_tables) >= 4096:
            self._mode_tables.clear()
        self._mode_tables[id(meta)] = (meta, need.upstream_key)
        return need.upstream_key

    def _refused_row(self, plan: BatchPlan, changes: list[RowChange]) -> str:
        """Which row the target refused, for the error: the failed statement carried a whole chunk, and an
        operator needs the key (and the event that set it) to decide what to fix. Searched after the failed
        transaction rolled back (its locks would stall the search), each try in a transaction of its own that
        is rolled back too; '' when no single row fails alone (a row that failed only next to earlier rows of
        the window) or the search itself fails."""

        def attempt(sub: BatchPlan) -> str | None:
            with self.engine.connect() as conn:
                tx = conn.begin()
                try:
                    self.sink.begin(conn)
                    self.sink.write(conn, sub)
                    return None
                except Exception as exc:
                    return db_reason(exc)
                finally:
                    if tx.is_active:
                        tx.rollback()

        try:
            found = find_refused(plan, attempt)
        except Exception:  # the search is a courtesy: the original error is what counts
            return ""
        if found is None:
            return ""
        key, _ = found
        meta = plan.meta
        where = next((ch.position for ch in reversed(changes) if key_text(key) in keys_of(ch, meta.key)), None)
        shown_key = ", ".join(f"{k}={v!r:.80}" for k, v in zip(meta.key, key))
        return f". The refused row: {shown_key}" + (f" (set by the event at {where})" if where else "")

    # ---- DDL -------------------------------------------------------------------------------------------
    def _apply_ddl(self, conn: Connection, ev: DDL, rel: Release, stats: ApplyStats) -> None:
        key = ddl_key(ev)
        with conn.begin():
            state = self.store.ddl_state(conn, key)
        if state in ("done", "skipped"):
            return
        try:
            tr = self.dialect.translate_ddl(ev.query, schema=ev.schema, table=ev.table, route=self.route)
            self._confine(ev, tr)
            self._refuse_for_mode(ev, tr)
        except UnsupportedDDL as exc:
            if self.on_unsupported_ddl != "skip":
                raise ApplyError(
                    f"DDL at {ev.position} (commit ts {ev.commit_ts}) of upstream table {shown(ev.schema, ev.table)} "
                    f"cannot be applied to {self.dialect.name}: {exc}. "
                    "Apply an equivalent change to the target by hand and set [target] on_unsupported_ddl = \"skip\" "
                    "to record and skip it, then restart"
                ) from None
            self._skip(conn, ev, key, rel, stats, str(exc))
            return
        for note in tr.notes:  # what the translation dropped (an executable comment's storage options)
            log.warning("DDL at %s (commit ts %d) of upstream table %s: %s", ev.position, ev.commit_ts,
                        shown(ev.schema, ev.table), note, extra={"position": ev.position})
        self._refuse_over_held(ev, tr)
        shared = self.shards.conflict(ev, tr)
        if shared == ALREADY_ADDED:
            self._skip(conn, ev, key, rel, stats, "shard DDL already applied: every column it adds is in the merged "
                                                  "target table (another shard added it)")
            return
        if self._already_evolved(ev, tr):
            self._skip(conn, ev, key, rel, stats, "every column it adds is already in the target (added from the "
                                                  "stream: [target] schema_evolution = \"evolve\")")
            return
        if shared:
            if self.shard_ddl != "skip":
                raise ApplyError(
                    f"DDL at {ev.position} (commit ts {ev.commit_ts}) from upstream table {shown(ev.schema, ev.table)} "
                    f"{shared}. Running it would destroy the other shards' rows, so it was not run. Make the change "
                    "by hand if all shards agree, and set [target] shard_ddl = \"skip\" to record and skip such DDL, "
                    "then restart"
                )
            self._skip(conn, ev, key, rel, stats, f"shard DDL not run on a merged table: {shared}")
            return
        self._ran = []
        try:
            if self.dialect.ddl_is_transactional:
                with conn.begin():
                    self.sink.begin(conn)
                    self._run_statements(conn, ev, tr, replay=False)
                    self.store.ddl_record(conn, ev, key, state="done", statements=tr.statements)
                    self._save_after_ddl(conn, ev, rel)
            else:
                with conn.begin():
                    self.store.ddl_record(conn, ev, key, state="started", statements=tr.statements)
                self._run_statements(conn, ev, tr, replay=state == "started")
                if conn.in_transaction():
                    conn.commit()  # the autobegun transaction around the (implicitly committing) DDL
                with conn.begin():
                    self.store.ddl_record(conn, ev, key, state="done", statements=tr.statements)
                    self._save_after_ddl(conn, ev, rel)
        except _DDLRefused as exc:
            if self.dialect.is_transient(exc.__cause__):
                raise  # a lost connection, a deadlock: the run replays the transaction (invariant 14)
            if conn.in_transaction():
                conn.rollback()
            self.sink.forget_tables(tr.targets or None)  # a statement before it may have changed a table
            self._ddl_refused(conn, ev, key, tr, rel, stats, exc)
            return
        self.sink.forget_tables(tr.targets or None)
        stats.ddls += 1
        stats.transactions += 1
        log.info("applied DDL at %s (commit ts %d): %s", ev.position, ev.commit_ts, "; ".join(tr.statements) or "(nothing to do downstream)",
                 extra={"position": ev.position})

    def _already_evolved(self, ev: DDL, tr: TranslatedDDL) -> bool:
        """An upstream ADD COLUMN whose columns ``evolve`` already added from the rows: in ungated streams a row
        with the new column can come before the DDL (another partition), and MySQL has no ADD COLUMN IF NOT
        EXISTS."""
        return (self.schema_evolution == "evolve" and ev.ddl_type != evolve.DDL_TYPE and tr.alters == {"add_column"}
                and bool(tr.targets) and all(self.shards.has_columns(s, t, tr.added_columns) for s, t in tr.targets))

    def _refuse_over_held(self, ev: DDL, tr: TranslatedDDL) -> None:
        """A DDL that drops, truncates or reshapes a table waits for the quarantined changes and undecodable
        messages older than it (see :meth:`SetAside.ddl_waits_for`): the run stops, and goes on once the operator
        retried or discarded them. An additive one runs: the held changes stay valid under it (a row retried
        later gets the added column's default, as it did upstream)."""
        what = reshapes(tr)
        if not what:
            return
        why = self.aside.ddl_waits_for(ev.position, {(ev.schema, ev.table), *tr.sources})
        if why is not None:
            raise ApplyError(f"DDL at {ev.position} (commit ts {ev.commit_ts}) was not run ({what}): {why}; then "
                             "restart")

    def _skip(self, conn: Connection, ev: DDL, key: str, rel: Release, stats: ApplyStats, detail: str) -> None:
        detail = f"{detail} (DDL message at {ev.position})"  # the history row keeps where the message was
        with conn.begin():
            self.store.ddl_record(conn, ev, key, state="skipped", statements=[], detail=detail)
            self._save_after_ddl(conn, ev, rel)
        stats.ddls_skipped += 1
        log.warning("skipped DDL at %s (commit ts %d) of upstream table %s: %s", ev.position, ev.commit_ts,
                    shown(ev.schema, ev.table), detail, extra={"position": ev.position})

    def _ddl_refused(self, conn: Connection, ev: DDL, key: str, tr: TranslatedDDL, rel: Release, stats: ApplyStats,
                     exc: _DDLRefused) -> None:
        """A statement of the DDL failed on the target, not transiently (a transient fault is replayed by the run,
        invariant 14, and never comes here). A fault of the target itself (read-only, privileges, space) stops
        whatever the policy, since every later DDL would fail alike; any other refusal is settled by ``[target]
        on_unsupported_ddl``: stop, naming the position, the tables, the target's error and the key, or skip,
        recorded with all of that."""
        cause = exc.__cause__
        tables = f"upstream table {shown(ev.schema, ev.table)}" if ev.table else f"upstream schema {shown(ev.schema)}"
        if tr.targets:
            tables += " (target " + ", ".join(shown(*t) for t in tr.targets) + ")"
        where = f"DDL at {ev.position} (commit ts {ev.commit_ts}) of {tables}"
        stmt = _printable(exc.statement[:500])
        ran = ""
        if self._ran and not self.dialect.ddl_is_transactional:
            ran = "; before it, these ran and took effect: " + _printable("; ".join(self._ran)[:500])
        if self.dialect.is_target_fault(cause):
            raise ApplyError(
                f"{where} failed on the target: {exc.reason}; statement: {stmt}{ran}. The target itself cannot run "
                "it (read-only, a privilege the applier's user lacks, no space or memory), so it is not skipped by "
                "[target] on_unsupported_ddl: fix the target, then restart") from cause
        if self.on_unsupported_ddl != "skip":
            if not self.dialect.ddl_is_transactional and not self._ran:
                self._mark_refused(conn, ev, key, tr, f"refused by the target: {exc.reason} (DDL message at "
                                                      f"{ev.position})")
            raise ApplyError(
                f"{where} failed on the target: {exc.reason}; statement: {stmt}{ran}. Fix the target so the statement "
                "can run, then restart; or apply an equivalent change by hand (or decide the replica goes without "
                "it) and set [target] on_unsupported_ddl = \"skip\" to record this DDL as skipped and go on"
            ) from cause
        self._skip(conn, ev, key, rel, stats, f"refused by the target: {exc.reason}; statement: {stmt}{ran}; "
                                              f"{tables}")

    def _mark_refused(self, conn: Connection, ev: DDL, key: str, tr: TranslatedDDL, detail: str) -> None:
        """MySQL/MariaDB: the ``started`` row of a DDL the target refused becomes ``refused``. A MySQL statement is
        atomic and none ran before it, so the rerun is not a replay: an "already exists / does not exist" error then
        stops again instead of passing for a statement that took effect before a crash."""
        try:
            with conn.begin():
                self.store.ddl_record(conn, ev, key, state="refused", statements=tr.statements, detail=detail)
        except Exception as exc:  # the stop that follows is what counts; a rerun then replays it as after a crash
            log.warning("could not record the refused DDL at %s: %s", ev.position, db_reason(exc),
                        extra={"position": ev.position})

    def _confine(self, ev: DDL, tr: TranslatedDDL) -> None:
        """Invariant 11: a DDL acts only on objects its routes give it. Where a statement acts is parsed from its
        SQL text, which the message's header does not vouch for, so every upstream name it touches must be in
        the header's schema or kept by a [[route]] rule (not merely by the default that keeps unmatched names),
        and nothing may drop or alter the schema holding the applier's tables or touch those tables."""
        def refuse(reason: str) -> None:
            raise UnsupportedDDL(reason, query=ev.query, dialect=self.dialect.name, kind=tr.kind)

        header = ev.schema.casefold()
        if not header and not ev.table and tr.kind in ("create_schema", "drop_schema") and len(tr.sources) == 1:
            # TiCDC's Simple protocol sends CREATE/DROP DATABASE without a schema: the statement names the one
            # schema it acts on, and routing still decides where (and whether) that lands
            header = tr.sources[0][0].casefold()
        for schema, table in tr.sources:
            if schema.casefold() != header and not self.ddl_scope(schema, table):
                name = f"{schema}.{table}" if table else f"schema {schema}"
                refuse(f"it acts on {name!r}, outside the message's own schema {ev.schema!r} and not routed by "
                       "any [[route]] rule (a DDL may only reach names its routes give it)")
        if self._own_schema is None:
            with self.engine.connect() as other:  # conn is between transactions here: leave it so
                self._own_schema = self.sink.own_schema(other)
        own = self._own_schema.casefold()
        if tr.kind == "drop_schema" and self.dialect.drop_schema_cascades:
            with self.engine.connect() as other:
                for schema, _ in tr.targets:
                    if not self.store.created_schema(other, schema):
                        refuse(f"it would drop schema {schema!r} with everything in it (DROP SCHEMA ... CASCADE), "
                               "and the applier did not create that schema: drop it by hand if that is intended")
        for schema, table in tr.targets:
            if schema.casefold() != own:
                continue
            if not table and tr.kind != "create_schema":
                refuse(f"it would change {schema!r}, the schema that holds the applier's own tables")
            if table.lower().startswith("applier_"):
                refuse(f"it would touch {schema}.{table}, a name reserved for the applier's own tables")

    def _run_statements(self, conn: Connection, ev: DDL, tr: TranslatedDDL, *, replay: bool) -> None:
        if tr.kind in ("create_table", "rename_table", "create_view", "create_schema"):
            for schema in dict.fromkeys(s for s, _ in tr.targets):
                fresh = not self.sink.schema_exists(conn, schema)
                self._exec(conn, ev, lambda: self.sink.prepare_schema(conn, schema), replay, _CREATE_SCHEMA)
                if fresh:  # only schemas the applier made may later be dropped with what is in them
                    self.store.schema_created(conn, schema)
        for stmt in tr.statements:
            self._exec(conn, ev, lambda: conn.exec_driver_sql(stmt, execution_options=VERBATIM), replay, stmt)
        if tr.kind in ("create_table", "alter_table", "create_index") and tr.statements:
            self._conform_for_mode(conn, ev, tr, replay)
        if tr.kind == "drop_schema":
            for schema, _ in tr.targets:
                self.store.schema_dropped(conn, schema)

    # ---- DDL on tables of history and soft-delete routes (applier.modes) --------------------------------
    def _refuse_for_mode(self, ev: DDL, tr: TranslatedDDL) -> None:
        """DDL that would destroy what a history or soft_delete route keeps is unsupported there (so
        ``on_unsupported_ddl`` decides: stop, or skip with a record): DROP TABLE, TRUNCATE, DROP DATABASE of a schema
        with such tables, partition clauses (DROP/TRUNCATE PARTITION; and a partitioning the mode's key would have
        to follow), a primary key change of a history table (its key is the upstream key + ``_commit_ts``), and a
        RENAME between tables routed with different modes (the table's columns fit one mode)."""
        def refuse(reason: str) -> None:
            raise UnsupportedDDL(reason, query=ev.query, dialect=self.dialect.name, kind=tr.kind)

        if tr.kind == "drop_schema":
            for schema in dict.fromkeys(s for s, _ in tr.sources or [(ev.schema, "")]):
                mode = self.write_mode(schema, "")
                if mode != modes.REPLICA:
                    refuse(f"it would drop schema {schema!r}, whose tables are routed with mode = \"{mode}\": what the "
                           "mode keeps (versions, deleted rows) would be lost with them; drop it by hand if intended")
            return
        tables = [(s, t) for s, t in tr.sources if t] or ([(ev.schema, ev.table)] if ev.table else [])
        found = {t: self.write_mode(*t) for t in dict.fromkeys(tables)}
        moded = {t: m for t, m in found.items() if m != modes.REPLICA}
        if not moded:
            return
        (schema, table), mode = next(iter(moded.items()))
        name = shown(schema, table)
        kept = "every version" if mode == modes.HISTORY else "the deleted rows"
        if tr.kind in ("drop_table", "truncate_table"):
            what = "drop" if tr.kind == "drop_table" else "empty"
            refuse(f"it would {what} table {name}, routed with mode = \"{mode}\", and with it {kept} the mode keeps; "
                   f"{what} the target table by hand if that is intended")
        if tr.kind == "rename_table" and len(set(found.values())) > 1:
            refuse("it renames between tables routed with different modes ("
                   + ", ".join(f"{shown(*t)}: {m}" for t, m in found.items())
                   + "), and a target table's columns fit one mode; route both names with the same mode")
        if "partition" in tr.alters:
            refuse(f"it changes the partitioning of table {name}, routed with mode = \"{mode}\" (dropping or "
                   f"emptying a partition would lose {kept}; partitioning must follow the mode's key)")
        if mode == modes.HISTORY and tr.alters & {"add_primary_key", "drop_primary_key"}:
            refuse(f"it changes the primary key of table {name}, routed with mode = \"history\", whose versions are "
                   "identified by the upstream key plus _commit_ts: change the target's key by hand (and decide what "
                   "the versions already kept become)")

    def _conform_for_mode(self, conn: Connection, ev: DDL, tr: TranslatedDDL, replay: bool) -> None:
        """After a replicated CREATE TABLE of a history or soft_delete route: give the new table the mode's columns
        and key, and turn its other unique keys into plain indexes (applier.modes.conform; the statements come from
        the dialect). After an ALTER TABLE or CREATE INDEX of a table already in its mode: turn a unique key it
        added into a plain index. Recomputed from the catalog, so a replay after a crash does only what is left."""
        prep = conn.dialect.identifier_preparer
        targets = set(tr.targets)
        for schema, table in dict.fromkeys(tr.sources or [(ev.schema, ev.table)]):
            mode = self.write_mode(schema, table) if table else modes.REPLICA
            dest = self.route(schema, table) if mode != modes.REPLICA else None
            if dest is None or dest not in targets:
                continue
            try:
                shape = self.sink.mode_shape(conn, *dest)  # type: ignore[attr-defined]
                if tr.kind != "create_table" and not all(c.name in shape.columns for c in modes.mode_columns(mode)):
                    continue  # not (yet) a table of its mode: writes stop and say what to run
                need = modes.conform(mode, shape)
                if tr.kind != "create_table":
                    need = modes.Conform(mode, need.upstream_key, demote=need.demote)
                statements = self.dialect.mode_statements(prep, shape, need) if need else []
            except (modes.ModeError, ApplyError) as exc:
                raise ApplyError(f"DDL at {ev.position} (commit ts {ev.commit_ts}) on {shown(*dest)}, routed with "
                                 f"mode = \"{mode}\": {exc}; then restart") from None
            for stmt in statements:
                self._exec(conn, ev, lambda: conn.exec_driver_sql(stmt), replay, stmt)
            if statements:
                log.info("DDL at %s: made %s a table of route mode %s: %s", ev.position, shown(*dest), mode,
                         "; ".join(statements), extra={"position": ev.position})

    def _exec(self, conn: Connection, ev: DDL, fn: Callable[[], object], replay: bool, what: str) -> None:
        try:
            fn()
        except Exception as exc:
            if replay and self.dialect.is_replay_noop(exc):
                log.info("DDL at %s had already taken effect before a restart (%s)", ev.position, db_reason(exc),
                         extra={"position": ev.position})
                if conn.in_transaction():
                    conn.rollback()
                return
            reason = db_reason(exc)
            raise _DDLRefused(  # settled by _ddl_refused: retried, stopped or skipped
                f"DDL at {ev.position} (commit ts {ev.commit_ts}) failed on the target: {reason}; statement: "
                f"{_printable(what[:500])}", what, reason
            ) from exc
        if what != _CREATE_SCHEMA:  # (idempotent: not a statement a rerun could find in effect)
            self._ran.append(what)

    def _save_after_ddl(self, conn: Connection, ev: DDL, rel: Release) -> None:
        # Rows with this commit ts do not exist (a DDL is its own transaction), but other DDLs with the same
        # commit ts can (a multi-table RENAME): they stay above the applied ts and are told apart by history.
        self.store.save(conn, applied_ts=max(ev.commit_ts - 1, rel.applied_ts), checkpoints=rel.checkpoint(),
                        table_progress={})

    def _accumulate(self, s: ApplyStats) -> None:
        self.total.add(s)


def _printable(text: str) -> str:
    """A statement for a message or a record: its names come from upstream, so a control character (a NUL from a
    hostile message) is escaped; everything else, non-ASCII names included, stays as it is."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


# column tuples remembered as ready per table; beyond this the oldest is forgotten (and checked again if it returns)
_READY_SHAPES = 8


def _is_ready(known: list[tuple] | None, columns: tuple) -> bool:
    """Whether ``columns`` (by identity: decoders share one tuple per shape) was checked since the last DDL."""
    if known is None:
        return False
    for c in known:
        if c is columns:
            return True
    return False


def _mark_ready(ready: dict[tuple[str, str], list[tuple]], table: tuple[str, str], columns: tuple) -> None:
    known = ready.setdefault(table, [])
    if not _is_ready(known, columns):
        if len(known) >= _READY_SHAPES:
            del known[0]
        known.append(columns)
