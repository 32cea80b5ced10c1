"""``applier load``: seed a replica from a Dumpling export taken at a TSO, and make that TSO the pipeline's start.

What it does, in this order (nothing is written before every check passed):

1. reads the export (:mod:`applier.dumpling`): the snapshot TSO ``S`` from ``metadata`` (or ``--snapshot-ts``),
   the tables the config's ``[[route]]`` rules keep, their CREATE TABLE and data files;
2. refuses when the pipeline already has progress or a recorded load (unless ``--replace``), when a target table
   that exists is not empty (unless ``--replace``) or lacks a column of the export, or when the stream could not
   honour ``S`` (a protocol without resolved ts, or ``starting_offsets = "latest"``, which would skip the changes
   between ``S`` and now);
3. claims the pipeline's writer epoch (:meth:`ProgressStore.claim`): a running ``applier run`` of the pipeline
   is fenced and stops at its next transaction (exit 6), and a run started during the load fences the load;
4. creates the target tables that do not exist from the export's CREATE TABLE, through the applier's own DDL
   translator and routes (as a replicated CREATE TABLE would be);
5. loads each target table in one transaction (``--threads`` tables at a time): ``--replace`` empties it first
   (TRUNCATE on PostgreSQL, DELETE on MySQL/MariaDB, where TRUNCATE would commit on its own), then every data
   file of every upstream table routed to it is read, converted and inserted in batches, and the table's
   ``applier_loads`` rows are written; the writer epoch is checked before the commit;
6. in one last transaction, writes the pipeline's ``applier_pipelines`` row with ``applied_ts = S`` (and
   ``applier_tables`` rows for the tables that got rows): the next ``applier run`` drops every change with
   commit ts <= S and applies the rest with its idempotent writes.

Values go the way replicated values go: text -> the event model's values (:mod:`applier.load_values`, the
codecs' MySQL parsers) -> the dialect's value converters (``Sink.adapt_rows``) -> the writer's bulk path
(``Sink.bulk_insert``: COPY on PostgreSQL, binary where the batch allows it; multi-row INSERT through
PyMySQL's executemany on MySQL/MariaDB). LOAD DATA LOCAL INFILE is not used: it needs ``local_infile`` enabled
on the server (a server-wide setting that lets the server read any file the client can) and, with LOCAL, MySQL
turns data errors into warnings and goes on, so a value the column cannot hold would be stored altered instead
of stopping the load.

Errors name the file and line: a value that is not valid for its upstream column type, or syntax that is not
Dumpling's, stops with exit 2; a row the target refuses (found by halving the failed batch inside savepoints)
with exit 4 and its key; an unusable target with exit 5. A failed table's transaction rolls back whole; tables
already committed stay loaded and recorded, and the pipeline gets no starting point, so rerun with
``--replace``.
"""

from __future__ import annotations

import logging
import operator
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import and_, func, inspect, insert, select
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from applier import migrate
from applier import progress as p
from applier.config import Settings
from applier.ddl import UnsupportedDDL
from applier.dialect import Dialect, dialect_for, target_engine, tls_failure
from applier.dumpling import (
    DataFile, ExportError, ReadOptions, SourceColumn, TableDef, TableExport, line_of, parse_table_schema,
    read_rows, read_text, scan,
)
from applier.load_values import first_error, row_function
from applier.progress import ProgressStore, TableProgress
from applier.routing import RoutingError
from applier.sinks import ApplyError, db_reason
from applier.sinks.base import VERBATIM, Sink
from applier.sinks.table import TableMeta, shown

__all__ = ["LoadError", "RowRefused", "TargetUnusable", "LoadOptions", "LoadResult", "load", "format_result"]

log = logging.getLogger("applier.load")

Route = Callable[[str, str], "tuple[str, str] | None"]


class LoadError(Exception):
    """The load cannot go on; the message says what is wrong and what to do. ``code`` is the exit code: 2 for
    the export, the options or the state of the target (nothing or nothing more was written)."""

    code = 2


class RowRefused(LoadError):
    """The target refused a row (or the CREATE TABLE of a table): exit 4."""

    code = 4


class TargetUnusable(LoadError):
    """The target database cannot be reached or used: exit 5."""

    code = 5


class _Stopped(Exception):
    """Another table failed: this one stops at its next batch and rolls back."""


@dataclass(frozen=True)
class LoadOptions:
    export: Path
    replace: bool = False
    threads: int = 4
    snapshot_ts: int | None = None  # for exports whose metadata has no TSO (MySQL), or to confirm it
    read: ReadOptions = field(default_factory=ReadOptions)
    progress: bool | None = None  # a progress line on stderr; None: when stderr is a terminal


@dataclass
class TablePlan:
    source: tuple[str, str]
    target: tuple[str, str]
    export: TableExport
    table_def: TableDef

    @property
    def data_bytes(self) -> int:
        return sum(f.path.stat().st_size for f in self.export.data)


@dataclass
class TableLoaded:
    source: tuple[str, str]
    target: tuple[str, str]
    rows: int
    files: int


@dataclass
class LoadResult:
    pipeline: str
    snapshot_ts: int
    target_shown: str
    tables: list[TableLoaded] = field(default_factory=list)
    created: list[tuple[str, str]] = field(default_factory=list)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # upstream tables no route keeps
    not_loaded: list[str] = field(default_factory=list)  # views, routines ... files
    unknown: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)


# ---------------------------------------------------------------------------------------------------------
# the plan: what to load where (no database yet)


def snapshot_of(export_ts: int | None, given: int | None, root: Path) -> int:
    if given is not None:
        if given <= 0 or given >= 1 << 63:
            raise LoadError(f"--snapshot-ts {given} is not a TSO (a positive 64-bit integer)")
        if export_ts is not None and export_ts != given:
            raise LoadError(f"--snapshot-ts {given} differs from the snapshot TSO {export_ts} in {root}/metadata: "
                            "the export holds the data as of its own TSO; leave --snapshot-ts out")
        return given
    if export_ts is None:
        raise LoadError(
            f"{root}/metadata has no TiDB snapshot TSO (no 'SHOW MASTER STATUS' block with 'Log: tidb-binlog' and "
            "'Pos: <TSO>'): the export was not taken from TiDB, or not by Dumpling. The load must know the TSO its "
            "data is consistent at, so that the run skips exactly the changes already in it: pass --snapshot-ts TSO "
            "if you know it (e.g. the --snapshot the export was taken with)")
    return export_ts


def plan_tables(export_tables: dict[tuple[str, str], TableExport], route: Route
                ) -> tuple[list[TablePlan], list[tuple[str, str]]]:
    """The tables the routes keep (with their parsed CREATE TABLE) and those they ignore."""
    plans: list[TablePlan] = []
    ignored: list[tuple[str, str]] = []
    for (schema, table), te in export_tables.items():
        try:
            target = route(schema, table)
        except RoutingError as exc:
            raise LoadError(f"routing upstream table {shown(schema, table)}: {exc}") from None
        if target is None:
            ignored.append((schema, table))
            continue
        if te.schema_file is None:
            raise LoadError(
                f"the export has data files of {shown(schema, table)} but no {schema}.{table}-schema.sql: the load "
                "needs each table's CREATE TABLE to read its values; export again without --no-schemas (-m)")
        try:
            table_def = parse_table_schema(read_text(te.schema_file), where=te.schema_file.name)
        except ExportError as exc:
            raise LoadError(str(exc)) from None
        plans.append(TablePlan((schema, table), (target[0], target[1]), te, table_def))
    return plans, ignored


def group_by_target(plans: list[TablePlan]) -> dict[tuple[str, str], list[TablePlan]]:
    """Upstream tables per target table (several when routes merge shards), biggest targets first."""
    groups: dict[tuple[str, str], list[TablePlan]] = {}
    for pl in plans:
        groups.setdefault(pl.target, []).append(pl)
    return dict(sorted(groups.items(), key=lambda kv: -sum(p.data_bytes for p in kv[1])))


# ---------------------------------------------------------------------------------------------------------
# the load


def load(settings: Settings, opts: LoadOptions) -> LoadResult:
    """Run ``applier load`` (see the module docstring)."""
    started = time.monotonic()
    problem = opts.read.check()
    if problem:
        raise LoadError(problem)
    if opts.threads < 1:
        raise LoadError(f"--threads must be at least 1, got {opts.threads}")
    _check_stream(settings)
    try:
        export = scan(opts.export)
    except ExportError as exc:
        raise LoadError(str(exc)) from None
    snapshot = snapshot_of(export.metadata.snapshot_ts if export.metadata else None, opts.snapshot_ts, opts.export)
    start_ts = getattr(settings.source, "start_ts", None)
    if start_ts and start_ts != snapshot:
        raise LoadError(f"source.start_ts = {start_ts} differs from the export's snapshot TSO {snapshot}: the load makes "
                        "the snapshot the pipeline's starting point itself; remove source.start_ts (or set it to "
                        f"{snapshot})")
    from applier.pipeline import router_for

    router = router_for(settings)
    plans, ignored = plan_tables(export.tables, router.route)
    if not plans:
        raise LoadError(f"no table of the export in {opts.export} is kept by the config's [[route]] rules "
                        f"({len(ignored)} ignored): check the routes, or the export's folder")
    result = LoadResult(settings.pipeline.name, snapshot, settings.target.url_redacted, ignored=ignored,
                        not_loaded=export.not_loaded, unknown=export.unknown)
    groups = group_by_target(plans)
    engine = target_engine(settings.target, pool_pre_ping=True, pool_size=opts.threads + 1, max_overflow=2)
    try:
        try:
            migrate.upgrade(engine)
            dialect = dialect_for(engine)
        except DBAPIError as exc:
            tls = tls_failure(exc)
            raise TargetUnusable(f"cannot use the target database {settings.target.url_redacted}: {db_reason(exc)}. "
                                 + (f"TLS: {tls}; then rerun" if tls else "Check [target] url (and password_env or "
                                    "password_file) and that the server is reachable; then rerun")) from None
        job = _Load(settings, opts, engine, dialect, router.route, snapshot, groups)
        job.check_target()
        job.store.claim(engine)
        result.created = job.create_tables()
        result.tables = job.run()
        job.finish(result.tables)
    finally:
        engine.dispose()
    result.seconds = time.monotonic() - started
    return result


def _check_stream(settings: Settings) -> None:
    from applier.pipeline import decoder_for

    if not decoder_for(settings).gated:
        raise LoadError(
            f"source.protocol = {settings.source.protocol!r} (with these [source.codec] options) carries no resolved "
            "ts, so `applier run` applies its changes in offset order without comparing commit ts: it cannot start "
            "after the export's snapshot TSO. Seed such a pipeline another way, or use a protocol with resolved ts "
            "(open, canal-json with enable-tidb-extension, simple, debezium with gated = true)")
    if settings.source.starting_offsets != "earliest":
        raise LoadError(
            f"source.starting_offsets = {settings.source.starting_offsets!r}: the first run after a load must read "
            "the topics from the earliest offset (it drops what the snapshot already holds by commit ts); with "
            "\"latest\" the changes committed between the snapshot and the first run would be lost. Set "
            "source.starting_offsets = \"earliest\"")


class _Load:
    """One load: the checks against the target, table creation, the parallel loading and the final records."""

    def __init__(self, settings: Settings, opts: LoadOptions, engine: Engine, dialect: Dialect, route: Route,
                 snapshot: int, groups: dict[tuple[str, str], list[TablePlan]]) -> None:
        self.settings = settings
        self.opts = opts
        self.engine = engine
        self.dialect = dialect
        self.route = route
        self.snapshot = snapshot
        self.groups = groups
        self.store = ProgressStore(settings.pipeline.name, settings.source.protocol)
        self.sink = dialect.writer(settings.target.batch_rows)
        self.missing: list[tuple[str, str]] = []
        self.stop = threading.Event()
        self.counter = _Counter(len(groups), sum(len(p.export.data) for g in groups.values() for p in g))

    # ---- checks (nothing written yet) ---------------------------------------------------------------------
    def check_target(self) -> None:
        name = self.settings.pipeline.name
        with self.engine.connect() as conn:
            there = _existing_state(conn, name)
            if there and not self.opts.replace:
                raise LoadError(
                    f"pipeline {name!r} already has {there} in {self.settings.target.url_redacted}. A load seeds a "
                    "pipeline before its first run. To load again, run `applier load ... --replace`: it empties "
                    "every routed target table, loads it again and makes the new snapshot the pipeline's starting "
                    "point (its Kafka positions are forgotten: the next run reads from source.starting_offsets); "
                    "or give the new replica another pipeline.name")
            own = self.sink.own_schema(conn).casefold()
            insp = inspect(conn)
            not_empty: list[str] = []
            for target, plans in self.groups.items():
                schema, table = target
                if schema.casefold() == own and table.lower().startswith("applier_"):
                    raise LoadError(f"upstream table {shown(*plans[0].source)} routes to {shown(*target)}, a name "
                                    "reserved for the applier's own tables: route it elsewhere or ignore it")
                if not insp.has_table(table, schema=schema or None):
                    self.missing.append(target)
                    continue
                meta = self.sink.reflect(conn, schema, table)
                for pl in plans:
                    lacks = [c.name for c in pl.table_def.columns if not c.generated and c.name not in meta.columns]
                    if lacks:
                        raise LoadError(
                            f"target table {meta.display} lacks column(s) {', '.join(map(repr, lacks))} of upstream "
                            f"table {shown(*pl.source)}: add them (or drop the target table, and the load creates it "
                            "from the export's CREATE TABLE), then rerun")
                if not self.opts.replace and conn.execute(select(1).select_from(meta.table).limit(1)).first():
                    not_empty.append(meta.display)
            if not_empty:
                raise LoadError(
                    f"target table(s) {', '.join(not_empty)} already hold rows: a load inserts the export's rows into "
                    "empty tables. Run with --replace to empty every routed target table first, or empty them by "
                    "hand")

    # ---- tables that do not exist yet ---------------------------------------------------------------------
    def create_tables(self) -> list[tuple[str, str]]:
        created = []
        with self.engine.connect() as conn:
            for target in self.missing:
                pl = self.groups[target][0]
                try:
                    tr = self.dialect.translate_ddl(pl.table_def.create_sql, schema=pl.source[0], table=pl.source[1],
                                                    route=self.route)
                except UnsupportedDDL as exc:
                    raise LoadError(f"target table {shown(*target)} does not exist and the export's CREATE TABLE of "
                                    f"{shown(*pl.source)} cannot be created from it: {exc.reason}. Create the target "
                                    "table by hand, then rerun") from None
                try:
                    with conn.begin():
                        self.sink.begin(conn)
                        for schema in dict.fromkeys(s for s, _ in tr.targets):
                            fresh = not self.sink.schema_exists(conn, schema)
                            self.sink.prepare_schema(conn, schema)
                            if fresh:  # only schemas the applier made may later be dropped with what is in them
                                self.store.schema_created(conn, schema)
                        for stmt in tr.statements:
                            conn.exec_driver_sql(stmt, execution_options=VERBATIM)
                except DBAPIError as exc:
                    raise RowRefused(f"creating target table {shown(*target)} from the CREATE TABLE of "
                                     f"{shown(*pl.source)} failed: {db_reason(exc)}. Create it by hand, then rerun"
                                     ) from exc
                log.info("created %s: %s", shown(*target), "; ".join(tr.statements))
                created.append(target)
        return created

    # ---- loading, one transaction per target table --------------------------------------------------------
    def run(self) -> list[TableLoaded]:
        line = _ProgressLine(self.counter, sys.stderr.isatty() if self.opts.progress is None else self.opts.progress)
        results: list[TableLoaded] = []
        first: BaseException | None = None
        with ThreadPoolExecutor(max_workers=self.opts.threads, thread_name_prefix="applier-load") as pool:
            pending: set[Future[list[TableLoaded]]] = {
                pool.submit(self._load_target, target, plans) for target, plans in self.groups.items()}
            try:
                while pending:
                    done, pending = wait(pending, timeout=0.5, return_when=FIRST_EXCEPTION)
                    line.update()
                    for fut in done:
                        exc = fut.exception()
                        if exc is None:
                            results.extend(fut.result())
                        elif first is None or isinstance(first, _Stopped):
                            first = exc
                            self.stop.set()
            except BaseException:
                self.stop.set()
                raise
            finally:
                line.close()
        if first is not None:
            if results and isinstance(first, LoadError):
                loaded = ", ".join(shown(*t.source) for t in results)
                raise type(first)(f"{first} (committed before this: {loaded}; the pipeline got no starting point, so "
                                  "rerun with --replace once the cause is fixed)") from first.__cause__
            raise first
        return sorted(results, key=lambda t: t.source)

    def _load_target(self, target: tuple[str, str], plans: list[TablePlan]) -> list[TableLoaded]:
        sink = self.dialect.writer(self.settings.target.batch_rows)
        with self.engine.connect() as conn:
            tx = conn.begin()
            try:
                sink.begin(conn)
                meta = sink.table(conn, *target)
                if self.opts.replace:
                    self._empty(conn, meta)
                out = []
                for pl in plans:
                    rows = 0
                    for f in pl.export.data:
                        rows += self._load_file(conn, sink, meta, pl, f)
                        self.counter.file_done()
                    out.append(TableLoaded(pl.source, target, rows, len(pl.export.data)))
                self._record(conn, out)
                self.store.check_writer(conn)
                tx.commit()
            except ExportError as exc:  # a data file that is not Dumpling's syntax (file and line named)
                if tx.is_active:
                    tx.rollback()
                raise LoadError(f"{exc}. Nothing of {shown(*target)} was loaded (its transaction rolled back)"
                                ) from None
            except BaseException:
                if tx.is_active:
                    tx.rollback()
                raise
        self.counter.table_done()
        for t in out:
            log.info("loaded %s into %s: %d rows from %d file(s)", shown(*t.source), shown(*t.target), t.rows, t.files)
        return out

    def _empty(self, conn: Connection, meta: TableMeta) -> None:
        q = conn.dialect.identifier_preparer.format_table(meta.table)
        # TRUNCATE is transactional on PostgreSQL; on MySQL/MariaDB it commits on its own, DELETE does not
        conn.exec_driver_sql(f"TRUNCATE {q}" if self.dialect.ddl_is_transactional else f"DELETE FROM {q}")

    def _record(self, conn: Connection, loaded: list[TableLoaded]) -> None:
        name = self.settings.pipeline.name
        now = p.now()
        for t in loaded:
            conn.execute(p.loads.delete().where(and_(p.loads.c.pipeline == name, p.loads.c.source_schema == t.source[0],
                                                     p.loads.c.source_table == t.source[1])))
            conn.execute(insert(p.loads).values(
                pipeline=name, source_schema=t.source[0], source_table=t.source[1], target_schema=t.target[0],
                target_table=t.target[1], rows=t.rows, snapshot_ts=self.snapshot, files=t.files, loaded_at=now))

    def _load_file(self, conn: Connection, sink: Sink, meta: TableMeta, pl: TablePlan, f: DataFile) -> int:
        shapes: dict[tuple[tuple[str, ...] | None, bool], _Shape] = {}
        n = 0
        for batch in read_rows(f, self.opts.read, table_columns=pl.table_def.names, batch_rows=sink.batch_rows):
            if self.stop.is_set():
                raise _Stopped()
            shape = shapes.get((batch.columns, batch.undecodable))
            if shape is None:
                shape = shapes[(batch.columns, batch.undecodable)] = _Shape.build(pl, meta, f, batch.columns,
                                                                                  batch.undecodable)
            rows = []
            width = len(shape.source)
            convert = shape.convert
            for vals, off in zip(batch.rows, batch.offsets):
                if len(vals) != width:
                    raise LoadError(f"{f.name}, line {line_of(f, off)}: {len(vals)} value(s), but the row has {width} "
                                    f"column(s) ({', '.join(c.name for c in shape.source)}): is the export complete, "
                                    "and are --csv-separator/--csv-delimiter right?")
                try:
                    rows.append(convert(vals))
                except Exception:
                    bad = first_error(shape.source, vals, checked=batch.undecodable)
                    col, v, why = bad if bad is not None else (shape.source[0], vals[0], "cannot be converted")
                    raise LoadError(f"{f.name}, line {line_of(f, off)}: column {col.name!r} ({col.full}) of upstream "
                                    f"table {shown(*pl.source)}: {_preview(v)} is not a valid value: {why}. Fix the "
                                    "export (or the upstream value) and rerun") from None
            if not rows:
                continue
            cols = shape.target
            try:
                rows = sink.adapt_rows(meta, cols, rows)
            except ApplyError as exc:
                i = _first_unadaptable(sink, meta, cols, rows)
                where = f"{f.name}, line {line_of(f, batch.offsets[i])}" if i is not None else f.name
                raise RowRefused(f"{where}: {exc}. Nothing of {meta.display} was loaded (its transaction rolled back)"
                                 ) from None
            tuples = list(map(shape.getter, rows))
            self._write(conn, sink, meta, cols, tuples, rows, f, batch.offsets, pl)
            n += len(tuples)
            self.counter.add(len(tuples))
        return n

    def _write(self, conn: Connection, sink: Sink, meta: TableMeta, cols: tuple[str, ...],
               tuples: list[tuple[Any, ...]], rows: list[dict[str, Any]], f: DataFile, offsets: list[int],
               pl: TablePlan) -> None:
        sp = conn.begin_nested()
        try:
            sink.bulk_insert(conn, meta, cols, tuples)
        except Exception as exc:
            sp.rollback()
            if self.dialect.is_transient(exc):
                raise
            found = _first_refused(conn, sink, meta, cols, tuples)
            if found is None:
                raise RowRefused(f"{f.name}, lines {line_of(f, offsets[0])} to {line_of(f, offsets[-1])}: the target "
                                 f"refused these rows of upstream table {shown(*pl.source)} for {meta.display}: "
                                 f"{db_reason(exc)}. Nothing of {meta.display} was loaded (its transaction rolled back)"
                                 ) from exc
            i, reason = found
            key = ", ".join(f"{k}={rows[i].get(k)!r:.80}" for k in meta.key) or "(the table has no key)"
            raise RowRefused(f"{f.name}, line {line_of(f, offsets[i])}: the target refused the row {key} of upstream "
                             f"table {shown(*pl.source)} for {meta.display}: {reason}. Nothing of {meta.display} was "
                             "loaded (its transaction rolled back). Fix the target table (or the upstream value), then "
                             "rerun with --replace") from exc
        else:
            sp.commit()

    # ---- the pipeline's starting point ------------------------------------------------------------------
    def finish(self, loaded: list[TableLoaded]) -> None:
        name = self.settings.pipeline.name
        with self.engine.begin() as conn:
            self.store.start_at(conn, applied_ts=self.snapshot, replace=self.opts.replace, tables_loaded={
                t.source: TableProgress(*t.target) for t in loaded if t.rows})
            keep = {t.source for t in loaded}
            for s, t in conn.execute(select(p.loads.c.source_schema, p.loads.c.source_table)
                                     .where(p.loads.c.pipeline == name)).all():
                if (s, t) not in keep:  # recorded by an earlier load of tables this export does not have
                    conn.execute(p.loads.delete().where(and_(p.loads.c.pipeline == name, p.loads.c.source_schema == s,
                                                             p.loads.c.source_table == t)))


def _existing_state(conn: Connection, pipeline: str) -> str:
    """What the target already holds for the pipeline, in words ('' when nothing)."""
    parts = []
    row = conn.execute(select(p.pipelines).where(p.pipelines.c.pipeline == pipeline)).mappings().first()
    if row is not None:
        parts.append(f"progress (applied resolved ts {row['applied_ts']}, {row['batches']} batch(es), "
                     f"{row['rows_applied']} row change(s) applied, updated {row['updated_at']})")
    n, ts, at = conn.execute(select(func.count(), func.max(p.loads.c.snapshot_ts), func.max(p.loads.c.loaded_at))
                             .where(p.loads.c.pipeline == pipeline)).one()
    if n:
        parts.append(f"a load recorded in applier_loads ({n} table(s), snapshot ts {ts}, loaded {at})")
    return " and ".join(parts)


@dataclass
class _Shape:
    """How the rows of one file (one column list) are converted: upstream columns in file order, the target
    columns written (those the target can take: not generated there), the row function and a tuple getter."""

    source: list[SourceColumn]
    target: tuple[str, ...]
    convert: Callable[[Any], dict[str, Any]]
    getter: Callable[[dict[str, Any]], tuple[Any, ...]]

    @classmethod
    def build(cls, pl: TablePlan, meta: TableMeta, f: DataFile, columns: tuple[str, ...] | None,
              checked: bool) -> "_Shape":
        by_name = {c.name: c for c in pl.table_def.columns}
        if columns is None:
            # an INSERT without a column list has every column; a CSV without a header the ones Dumpling selects
            source = [c for c in pl.table_def.columns if f.format == "sql" or not c.generated]
        else:
            unknown = [c for c in columns if c not in by_name]
            if unknown:
                raise LoadError(f"{f.name}: column(s) {', '.join(map(repr, unknown))} are not in the CREATE TABLE of "
                                f"{shown(*pl.source)} ({pl.export.schema_file.name if pl.export.schema_file else ''})")
            source = [by_name[c] for c in columns]
        lacks = [c.name for c in source if c.name not in meta.columns]
        if lacks:
            raise LoadError(f"target table {meta.display} lacks column(s) {', '.join(map(repr, lacks))} that "
                            f"{f.name} has values for: add them, then rerun")
        target = tuple(c.name for c in source if c.name in meta.writable)
        if not target:
            raise LoadError(f"{f.name}: none of its columns can be written in {meta.display}")
        getter: Callable[[dict[str, Any]], tuple[Any, ...]]
        if len(target) == 1:
            only = target[0]
            getter = lambda r: (r[only],)  # noqa: E731
        else:
            getter = operator.itemgetter(*target)
        return cls(source, target, row_function([c.name for c in source], source, checked=checked), getter)


def _preview(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 80 else r[:70] + f"... ({len(r)} chars)"


def _first_unadaptable(sink: Sink, meta: TableMeta, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> int | None:
    for i, r in enumerate(rows):
        try:
            sink.adapt_rows(meta, cols, [dict(r)])
        except ApplyError:
            return i
    return None


def _first_refused(conn: Connection, sink: Sink, meta: TableMeta, cols: tuple[str, ...],
                   tuples: list[tuple[Any, ...]]) -> tuple[int, str] | None:
    """The first row of a failed batch the target refuses, with the database's reason: halves inserted inside
    savepoints (a half that goes in stays in, so a row refused only next to earlier rows, a duplicate key, is
    found too); None when it cannot be reproduced. The caller's transaction is rolled back afterwards."""

    def attempt(lo: int, hi: int) -> str | None:
        sp = conn.begin_nested()
        try:
            sink.bulk_insert(conn, meta, cols, tuples[lo:hi])
        except Exception as exc:
            sp.rollback()
            return db_reason(exc)
        sp.commit()
        return None

    try:
        lo, hi = 0, len(tuples)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if attempt(lo, mid) is not None:
                hi = mid
            else:
                lo = mid
        reason = attempt(lo, hi) if hi > lo else None
    except Exception:  # the search is a courtesy: the original error is what counts
        return None
    return None if reason is None else (lo, reason)


# ---------------------------------------------------------------------------------------------------------
# progress and the summary


class _Counter:
    """Rows, files and tables done, shared by the loading threads."""

    def __init__(self, tables: int, files: int) -> None:
        self.lock = threading.Lock()
        self.tables_total = tables
        self.files_total = files
        self.rows = 0
        self.files = 0
        self.tables = 0

    def add(self, rows: int) -> None:
        with self.lock:
            self.rows += rows

    def file_done(self) -> None:
        with self.lock:
            self.files += 1

    def table_done(self) -> None:
        with self.lock:
            self.tables += 1


class _ProgressLine:
    """One line on stderr, redrawn by the main thread while the tables load (the style of ``applier run``'s)."""

    def __init__(self, counter: _Counter, enabled: bool) -> None:
        self.counter = counter
        self.enabled = enabled
        self.start = time.monotonic()
        self.shown = False

    def update(self) -> None:
        if not self.enabled:
            return
        c = self.counter
        el = time.monotonic() - self.start
        sys.stderr.write(f"\r{c.tables:>5}/{c.tables_total} tables  {c.files:>6}/{c.files_total} files  "
                         f"{c.rows:>12,} rows  {c.rows / el if el else 0:>9,.0f} rows/s   ")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.enabled:
            self.update()
            sys.stderr.write("\n")
            sys.stderr.flush()


def format_result(res: LoadResult) -> str:
    out = []
    for t in res.tables:
        out.append(f"  {shown(*t.source)} -> {shown(*t.target)}: {t.rows:,} rows from {t.files} file(s)"
                   + ("  (table created)" if t.target in res.created else ""))
    if res.ignored:
        out.append(f"  ignored by the routes: {', '.join(shown(*s) for s in res.ignored)}")
    if res.not_loaded:
        out.append(f"  not loaded (views, routines, triggers, sequences, policies): {', '.join(res.not_loaded)}")
    if res.unknown:
        out.append(f"  not Dumpling files, left alone: {', '.join(res.unknown)}")
    rate = res.rows / res.seconds if res.seconds else 0.0
    return (f"loaded {res.rows:,} rows of {len(res.tables)} table(s) into {res.target_shown} in {res.seconds:.1f} s "
            f"({rate:,.0f} rows/s)\n" + "\n".join(out) + "\n"
            f"pipeline {res.pipeline!r} starts after snapshot ts {res.snapshot_ts}: `applier run` applies the changes "
            "committed after it")
