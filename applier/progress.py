"""The applier's own tables in the target: progress, DDL history, quarantine, the writer's epoch.

They live in the target database so that progress commits in the same transaction as the data it describes
(invariant 6). Their DDL is owned by the Alembic migrations in ``migrations/``; the ``Table`` objects here only
describe them for queries. Progress writes use UPDATE-then-INSERT, which is portable across the dialects and
only ever runs once per partition/table per transaction.

One writer per pipeline (invariant 13): a run claims the pipeline in ``applier_writers`` by raising its epoch
(:meth:`ProgressStore.claim`) before it reads its progress, and every data transaction ends its writes through
:meth:`ProgressStore.save`, :meth:`ProgressStore.save_stream` (an apply stream's) or
:meth:`ProgressStore.ddl_record`, which first update the writer row *where the epoch is still ours*. No row
matched means a newer run claimed the pipeline: :class:`WriterFenced` is raised and the caller's transaction rolls
back, so a fenced run changes nothing. The row lock that update takes serializes against a concurrent claim (the
claimer's UPDATE waits for our commit), so once a claim has committed, every transaction of the older run either
committed before it, and the new run reads its progress, or fails its check. (It serializes the commits of
concurrent apply streams too: each holds the writer row, and the pipeline's row it adds its rows to, from its
progress save to its commit.)
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any, Mapping

from sqlalchemy import (
    BigInteger, Column, DateTime, Index, Integer, LargeBinary, MetaData, String, Table, Text, and_, insert, select,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from applier.events import DDL, KafkaMessage
from applier.gate import PartitionCheckpoint

metadata = MetaData()

pipelines = Table(
    "applier_pipelines", metadata,
    Column("pipeline", String(64), primary_key=True),
    Column("protocol", String(32), nullable=False),
    Column("applied_ts", BigInteger, nullable=False),
    Column("batches", BigInteger, nullable=False),
    Column("rows_applied", BigInteger, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

partitions = Table(
    "applier_partitions", metadata,
    Column("pipeline", String(64), primary_key=True),
    Column("topic", String(249), primary_key=True),
    Column("kafka_partition", Integer, primary_key=True, autoincrement=False),
    Column("restart_offset", BigInteger, nullable=False),
    Column("next_offset", BigInteger, nullable=False),
    Column("resolved_ts", BigInteger, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

tables = Table(
    "applier_tables", metadata,
    Column("pipeline", String(64), primary_key=True),
    Column("source_schema", String(64), primary_key=True),
    Column("source_table", String(64), primary_key=True),
    Column("target_schema", String(64), nullable=False),
    Column("target_table", String(64), nullable=False),
    Column("applied_ts", BigInteger, nullable=False),
    Column("rows_applied", BigInteger, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

ddl_history = Table(
    "applier_ddl_history", metadata,
    Column("pipeline", String(64), primary_key=True),
    Column("ddl_key", String(64), primary_key=True),
    Column("commit_ts", BigInteger, nullable=False),
    Column("source_schema", String(64), nullable=False),
    Column("source_table", String(64), nullable=False),
    Column("query", Text, nullable=False),
    Column("statements", Text, nullable=False),
    Column("state", String(16), nullable=False),  # started | done | skipped
    Column("detail", Text, nullable=False),
    Column("started_at", DateTime, nullable=False),
    Column("finished_at", DateTime, nullable=True),
)

quarantine = Table(
    "applier_quarantine", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("pipeline", String(64), nullable=False),
    Column("topic", String(249), nullable=False),
    Column("kafka_partition", Integer, nullable=False),
    Column("kafka_offset", BigInteger, nullable=False),
    Column("reason", Text, nullable=False),
    Column("msg_key", LargeBinary(2**32 - 1), nullable=True),
    Column("msg_value", LargeBinary(2**32 - 1), nullable=True),
    Column("created_at", DateTime, nullable=False),
    Index("uq_applier_quarantine_position", "pipeline", "topic", "kafka_partition", "kafka_offset", unique=True),
)

quarantined_rows = Table(
    "applier_quarantined_rows", metadata,
    Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("pipeline", String(64), nullable=False),
    Column("source_schema", String(64), nullable=False),
    Column("source_table", String(64), nullable=False),
    Column("row_key", String(1024), nullable=False),
    Column("commit_ts", BigInteger, nullable=False),
    Column("topic", String(249), nullable=False),
    Column("kafka_partition", Integer, nullable=False),
    Column("kafka_offset", BigInteger, nullable=False),
    Column("kind", String(16), nullable=False),  # refused | blocked
    Column("state", String(16), nullable=False),  # held | retried | discarded | skipped
    Column("reason", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("created_at", DateTime, nullable=False),
    Column("resolved_at", DateTime, nullable=True),
    Column("resolved_by", String(255), nullable=True),
    Column("note", Text, nullable=True),
)

schemas = Table(
    "applier_schemas", metadata,
    Column("schema_name", String(64), primary_key=True),
    Column("pipeline", String(64), nullable=False),  # the pipeline whose DDL created it
    Column("created_at", DateTime, nullable=False),
)

writers = Table(
    "applier_writers", metadata,
    Column("pipeline", String(64), primary_key=True),
    Column("epoch", BigInteger, nullable=False),
    Column("holder", String(255), nullable=False),  # host name and pid of the claiming process
    Column("claimed_at", DateTime),
    Column("heartbeat_at", DateTime),  # the last data transaction the holder committed (or tried to)
)

loads = Table(
    "applier_loads", metadata,  # applier load: what a Dumpling export put into the target, per upstream table
    Column("pipeline", String(64), primary_key=True),
    Column("source_schema", String(64), primary_key=True),
    Column("source_table", String(64), primary_key=True),
    Column("target_schema", String(64), nullable=False),
    Column("target_table", String(64), nullable=False),
    Column("rows", BigInteger, nullable=False),
    Column("snapshot_ts", BigInteger, nullable=False),
    Column("files", Integer, nullable=False),  # how many data files
    Column("loaded_at", DateTime, nullable=False),
)

streams = Table(
    "applier_streams", metadata,  # [target] apply_streams: how far each stream committed (issue 26, invariant 16)
    Column("pipeline", String(64), primary_key=True),
    Column("stream", Integer, primary_key=True, autoincrement=False),
    Column("applied_ts", BigInteger, nullable=False),
    Column("rows_applied", BigInteger, nullable=False),
    Column("updated_at", DateTime, nullable=False),
)

VERSION_TABLE = "applier_schema_version"


class WriterFenced(Exception):
    """Another run claimed this pipeline after this one did: this run must stop without writing."""


class NotClaimed(RuntimeError):
    """A ProgressStore was asked to write before :meth:`ProgressStore.claim` (a programming error)."""


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None, microsecond=0)


def holder_name() -> str:
    """Who claims: host name and pid, enough for an operator to find the process (never a URL or secret)."""
    return f"{socket.gethostname()} pid {os.getpid()}"[:255]


def _lost_claim_race(exc: DBAPIError) -> bool:
    """A concurrent claim won: duplicate primary key, or a deadlock/serialization failure between the two."""
    if isinstance(exc, IntegrityError):
        return True
    orig = exc.orig
    code = orig.args[0] if orig is not None and orig.args else None
    return code in (1205, 1213) or getattr(orig, "sqlstate", None) in ("40001", "40P01")


def ddl_key(ev: DDL) -> str:
    raw = f"{ev.commit_ts}\x00{ev.schema}\x00{ev.table}\x00{ev.query}".encode()
    return hashlib.sha256(raw).hexdigest()


@dataclass
class PipelineState:
    """What a restart needs: where each partition resumes and what was applied.

    With apply streams a crash can fall between two streams' commits of a window: ``applied_ts`` (the marker's) is
    then below what some streams committed. ``streams`` is each stream's own applied ts, and ``table_floors`` the
    upstream tables applied past ``applied_ts`` (their applier_tables rows), which the gate needs so that their
    re-read changes are not applied twice (:class:`applier.gate.Gate`'s ``table_floors``)."""

    applied_ts: int = 0
    batches: int = 0
    checkpoints: dict[tuple[str, int], PartitionCheckpoint] = field(default_factory=dict)
    exists: bool = False
    table_floors: dict[tuple[str, str], int] = field(default_factory=dict)
    streams: dict[int, int] = field(default_factory=dict)


@dataclass
class TableProgress:
    target_schema: str
    target_table: str
    rows: int = 0


class ProgressStore:
    """Reads and writes one pipeline's rows; every write happens on the caller's connection/transaction.

    Writing needs a claim first (:meth:`claim`): an unclaimed store refuses to write rather than claiming
    lazily, because a lazy claim would come after the progress was loaded, and a run that loaded before a
    newer run committed would then write on top of progress it never saw."""

    def __init__(self, pipeline: str, protocol: str) -> None:
        self.pipeline = pipeline
        self.protocol = protocol
        self.epoch: int | None = None  # the writer epoch this store claimed
        self.holder = holder_name()

    # ---- one writer per pipeline (invariant 13) --------------------------------------------------------
    def claim(self, engine: Engine, *, attempts: int = 5) -> int:
        """Become the pipeline's writer: raise its epoch in a transaction of its own and remember it.

        Call it before :meth:`load`, so that the progress read afterwards is the last the previous writer
        committed. Two first claims racing to insert the row: the loser's INSERT fails on the primary key once
        the winner commits (or, on InnoDB, the two collide as a deadlock on the gap both UPDATEs locked), and
        it retries, as an UPDATE of the row the winner committed, so the two end with distinct epochs."""
        for attempt in range(1, attempts + 1):
            try:
                with engine.begin() as conn:
                    self.epoch = self._claim(conn)
                return self.epoch
            except DBAPIError as exc:
                if attempt == attempts or not _lost_claim_race(exc):
                    raise
        raise AssertionError("attempts must be at least 1")

    def _claim(self, conn: Connection) -> int:
        ts = now()
        mine = writers.c.pipeline == self.pipeline
        vals = dict(holder=self.holder, claimed_at=ts, heartbeat_at=ts)
        if conn.execute(update(writers).where(mine).values(epoch=writers.c.epoch + 1, **vals)).rowcount == 0:
            conn.execute(insert(writers).values(pipeline=self.pipeline, epoch=1, **vals))
        return int(conn.execute(select(writers.c.epoch).where(mine)).scalar_one())

    def check_writer(self, conn: Connection) -> None:
        """Inside the caller's transaction, before it commits: raise :class:`WriterFenced` unless the epoch
        this store claimed is still the pipeline's. The update's row lock holds off a concurrent claim until
        the caller's transaction ends."""
        if self.epoch is None:
            raise NotClaimed(
                f"pipeline {self.pipeline!r}: ProgressStore.claim(engine) must run before the first write "
                "(and before load), so that one writer per pipeline holds (invariant 13)")
        res = conn.execute(update(writers)
                           .where(writers.c.pipeline == self.pipeline, writers.c.epoch == self.epoch)
                           .values(heartbeat_at=now()))
        if res.rowcount == 0:
            raise WriterFenced(self._fenced_message(conn))

    def _fenced_message(self, conn: Connection) -> str:
        # a locking read: it sees the claim that fenced us even where the transaction's snapshot predates it
        row = conn.execute(select(writers).where(writers.c.pipeline == self.pipeline)
                           .with_for_update(read=True)).mappings().first()
        if row is None:
            who = "its row in applier_writers is gone (deleted by hand?)"
        else:
            at = row["claimed_at"].isoformat() + "Z" if row["claimed_at"] is not None else "an unknown time"
            who = f"writer epoch {row['epoch']} was claimed by {row['holder']} at {at}"
        return (f"pipeline {self.pipeline!r}: this run ({self.holder}) held writer epoch {self.epoch}, but {who}. "
                "This run stopped without applying its batch (its transaction was rolled back, so nothing was "
                "written after the takeover). Run one applier per pipeline.name: stop the other one or give this "
                "one another pipeline.name")

    def load(self, conn: Connection) -> PipelineState:
        st = PipelineState()
        row = conn.execute(select(pipelines).where(pipelines.c.pipeline == self.pipeline)).mappings().first()
        if row is None:
            return st
        st.exists = True
        st.applied_ts = int(row["applied_ts"])
        st.batches = int(row["batches"])
        for r in conn.execute(select(partitions).where(partitions.c.pipeline == self.pipeline)).mappings():
            st.checkpoints[(r["topic"], int(r["kafka_partition"]))] = PartitionCheckpoint(
                int(r["restart_offset"]), int(r["resolved_ts"]), int(r["next_offset"])
            )
        for schema, table, ts in conn.execute(
                select(tables.c.source_schema, tables.c.source_table, tables.c.applied_ts)
                .where(tables.c.pipeline == self.pipeline, tables.c.applied_ts > st.applied_ts)):
            st.table_floors[(schema, table)] = int(ts)
        st.streams = self.streams_applied(conn)
        return st

    def streams_applied(self, conn: Connection) -> dict[int, int]:
        """Each apply stream's applied ts (its row in applier_streams): what a stream committed, read by the
        streams' Spark tasks to tell a share an earlier attempt committed (applier.streams.remote)."""
        return {int(n): int(ts) for n, ts in conn.execute(
            select(streams.c.stream, streams.c.applied_ts).where(streams.c.pipeline == self.pipeline))}

    def save(
        self,
        conn: Connection,
        *,
        applied_ts: int,
        checkpoints: Mapping[tuple[str, int], PartitionCheckpoint],
        table_progress: Mapping[tuple[str, str], TableProgress],
        batches: int = 0,
    ) -> None:
        """Record progress in the caller's transaction (the one that wrote the data), after checking that this
        run is still the pipeline's writer (every data transaction calls this, :meth:`save_stream` or
        :meth:`ddl_record`).

        With apply streams, ``table_progress={}`` is the marker: once every stream committed a window
        (:meth:`save_stream`), it moves the pipeline's applied ts and the partitions' checkpoints, and adds no
        rows (the streams counted theirs)."""
        self.check_writer(conn)
        ts = now()
        rows_total = sum(t.rows for t in table_progress.values())
        upd = conn.execute(
            update(pipelines)
            .where(pipelines.c.pipeline == self.pipeline)
            .values(applied_ts=applied_ts, batches=pipelines.c.batches + batches,
                    rows_applied=pipelines.c.rows_applied + rows_total, updated_at=ts, protocol=self.protocol)
        )
        if upd.rowcount == 0:
            conn.execute(insert(pipelines).values(pipeline=self.pipeline, protocol=self.protocol, applied_ts=applied_ts,
                                                  batches=batches, rows_applied=rows_total, updated_at=ts))
        for (topic, part), cp in checkpoints.items():
            where = and_(partitions.c.pipeline == self.pipeline, partitions.c.topic == topic,
                         partitions.c.kafka_partition == part)
            vals = dict(restart_offset=cp.restart_offset, next_offset=cp.next_offset, resolved_ts=cp.resolved_ts,
                        updated_at=ts)
            if conn.execute(update(partitions).where(where).values(**vals)).rowcount == 0:
                conn.execute(insert(partitions).values(pipeline=self.pipeline, topic=topic, kafka_partition=part, **vals))
        self._save_tables(conn, applied_ts, table_progress, ts)

    def save_stream(self, conn: Connection, *, stream: int, applied_ts: int,
                    table_progress: Mapping[tuple[str, str], TableProgress]) -> None:
        """Record one apply stream's progress in the caller's transaction (the one that wrote the stream's rows),
        after checking that this run is still the pipeline's writer (invariant 13): the stream's row in
        applier_streams (its applied ts, its rows added), its rows added to the pipeline's ``rows_applied``, and
        its tables' rows in applier_tables at ``applied_ts``, as :meth:`save` writes them.

        ``applied_ts`` must be a ts the stream has committed every change of its tables up to: a table's row
        becomes its floor after a crash (:attr:`PipelineState.table_floors`), below which its changes are dropped
        as applied. The pipeline's applied ts and the partitions' checkpoints are not touched: the marker
        (:meth:`save` with ``table_progress={}``) moves them once every stream committed the window, and it must
        have created the pipeline's row before a stream's first save (a RuntimeError says so otherwise)."""
        self.check_writer(conn)
        ts = now()
        rows_total = sum(t.rows for t in table_progress.values())
        upd = conn.execute(update(pipelines).where(pipelines.c.pipeline == self.pipeline)
                           .values(rows_applied=pipelines.c.rows_applied + rows_total, updated_at=ts))
        if upd.rowcount == 0:
            raise RuntimeError(
                f"pipeline {self.pipeline!r}: apply stream {stream} cannot save its progress: the pipeline has no row "
                "in applier_pipelines yet. The marker (ProgressStore.save with table_progress={}) must be saved "
                "first, before any stream's first transaction")
        self._save_stream_row(conn, stream, applied_ts, rows_total, ts)
        self._save_tables(conn, applied_ts, table_progress, ts)

    def save_with_streams(self, conn: Connection, *, applied_ts: int,
                          checkpoints: Mapping[tuple[str, int], PartitionCheckpoint],
                          table_progress: Mapping[tuple[str, str], TableProgress], stream_rows: Mapping[int, int],
                          batches: int = 0) -> None:
        """:meth:`save` for a transaction that wrote several streams' shares at once (``[target] apply_on =
        "one_transaction"``, or a release with undecodable messages): the marker, the tables, and each stream in
        ``stream_rows`` (stream -> its rows in ``table_progress``) moved to ``applied_ts`` with its rows added, all
        in the caller's transaction, as :meth:`save_stream` would have recorded the streams one by one."""
        self.save(conn, applied_ts=applied_ts, checkpoints=checkpoints, table_progress=table_progress,
                  batches=batches)
        ts = now()
        for stream in sorted(stream_rows):
            self._save_stream_row(conn, stream, applied_ts, stream_rows[stream], ts)

    def _save_stream_row(self, conn: Connection, stream: int, applied_ts: int, rows: int, ts: dt.datetime) -> None:
        """One apply stream's row in applier_streams: its applied ts, its rows added."""
        where = and_(streams.c.pipeline == self.pipeline, streams.c.stream == stream)
        if conn.execute(update(streams).where(where).values(
                applied_ts=applied_ts, rows_applied=streams.c.rows_applied + rows, updated_at=ts)).rowcount == 0:
            conn.execute(insert(streams).values(pipeline=self.pipeline, stream=stream, applied_ts=applied_ts,
                                                rows_applied=rows, updated_at=ts))

    def _save_tables(self, conn: Connection, applied_ts: int, table_progress: Mapping[tuple[str, str], TableProgress],
                     ts: dt.datetime) -> None:
        """Each upstream table's row in applier_tables: its target, ``applied_ts``, and its rows added."""
        for (schema, table), tp in table_progress.items():
            where = and_(tables.c.pipeline == self.pipeline, tables.c.source_schema == schema,
                         tables.c.source_table == table)
            vals = dict(target_schema=tp.target_schema, target_table=tp.target_table, applied_ts=applied_ts,
                        updated_at=ts)
            if conn.execute(update(tables).where(where).values(rows_applied=tables.c.rows_applied + tp.rows, **vals)).rowcount == 0:
                conn.execute(insert(tables).values(pipeline=self.pipeline, source_schema=schema, source_table=table,
                                                   rows_applied=tp.rows, **vals))

    def start_at(self, conn: Connection, *, applied_ts: int, tables_loaded: Mapping[tuple[str, str], TableProgress],
                 replace: bool = False) -> None:
        """``applier load``: make ``applied_ts`` (the export's snapshot TSO) the pipeline's applied resolved ts,
        in the caller's transaction and after checking the writer epoch, so that the next run drops every change
        with commit ts <= it. ``tables_loaded``: the upstream tables whose rows the load put in the target (they
        count as applied, e.g. for shard merges). ``replace`` first forgets the pipeline's progress: its Kafka
        positions (the next run reads from ``source.starting_offsets``), its per-table and per-stream rows, and
        marks the DDL it ran after ``applied_ts`` as ``started``: the next run replays them as after a crash (a DDL
        already in effect counts as done), so a table the load created again at the snapshot's shape gets them
        too."""
        self.check_writer(conn)
        if replace:
            for t in (partitions, tables, streams, pipelines):
                conn.execute(t.delete().where(t.c.pipeline == self.pipeline))
            conn.execute(update(ddl_history).where(ddl_history.c.pipeline == self.pipeline,
                                                   ddl_history.c.commit_ts > applied_ts, ddl_history.c.state == "done")
                         .values(state="started", finished_at=None))
        ts = now()
        conn.execute(insert(pipelines).values(pipeline=self.pipeline, protocol=self.protocol, applied_ts=applied_ts,
                                              batches=0, rows_applied=0, updated_at=ts))
        for (schema, table), tp in tables_loaded.items():
            conn.execute(insert(tables).values(
                pipeline=self.pipeline, source_schema=schema, source_table=table, target_schema=tp.target_schema,
                target_table=tp.target_table, applied_ts=applied_ts, rows_applied=0, updated_at=ts))

    # ---- DDL history -----------------------------------------------------------------------------------
    def ddl_state(self, conn: Connection, key: str) -> str | None:
        return conn.execute(
            select(ddl_history.c.state).where(ddl_history.c.pipeline == self.pipeline, ddl_history.c.ddl_key == key)
        ).scalar()

    def ddl_record(self, conn: Connection, ev: DDL, key: str, *, state: str, statements: list[str],
                   detail: str = "") -> None:
        """Record a DDL's state in the caller's transaction, after checking that this run is still the
        pipeline's writer (the MySQL "started" marker commits alone, before the DDL runs)."""
        self.check_writer(conn)
        ts = now()
        vals: dict[str, Any] = dict(state=state, statements=";\n".join(statements), detail=detail)
        if state != "started":
            vals["finished_at"] = ts
        where = and_(ddl_history.c.pipeline == self.pipeline, ddl_history.c.ddl_key == key)
        if conn.execute(update(ddl_history).where(where).values(**vals)).rowcount == 0:
            conn.execute(insert(ddl_history).values(
                pipeline=self.pipeline, ddl_key=key, commit_ts=ev.commit_ts, source_schema=ev.schema,
                source_table=ev.table, query=ev.query, started_at=ts, **vals))

    # ---- target schemas the applier created (a DROP SCHEMA ... CASCADE is only for those) ----------------
    def source_tables(self, conn: Connection) -> list[tuple[str, str]]:
        """Every upstream table this pipeline has applied rows of (applier_tables)."""
        return [(s, t) for s, t in conn.execute(
            select(tables.c.source_schema, tables.c.source_table).where(tables.c.pipeline == self.pipeline))]

    def schema_created(self, conn: Connection, schema: str) -> None:
        if conn.execute(select(schemas.c.schema_name).where(schemas.c.schema_name == schema)).first() is None:
            conn.execute(insert(schemas).values(schema_name=schema, pipeline=self.pipeline, created_at=now()))

    def created_schema(self, conn: Connection, schema: str) -> bool:
        return conn.execute(select(schemas.c.schema_name).where(schemas.c.schema_name == schema)).first() is not None

    def schema_dropped(self, conn: Connection, schema: str) -> None:
        conn.execute(schemas.delete().where(schemas.c.schema_name == schema))

    def quarantined_with(self, conn: Connection, text: str) -> dict[tuple[str, int, int], str]:
        """Quarantined positions whose reason contains ``text``, with the reason: the messages that killed the
        decoder are never decoded again (applier.crashguard)."""
        rows = conn.execute(select(quarantine.c.topic, quarantine.c.kafka_partition, quarantine.c.kafka_offset,
                                   quarantine.c.reason)
                            .where(quarantine.c.pipeline == self.pipeline, quarantine.c.reason.contains(text)))
        return {(t, int(p), int(o)): r for t, p, o, r in rows}

    def quarantine(self, conn: Connection, msg: KafkaMessage, reason: str) -> None:
        """Keep an undecodable message once per Kafka position: a rerun that reads it again (its restart offset
        lies before it) finds the row and adds nothing (a unique index backs this, migration 0008)."""
        where = and_(quarantine.c.pipeline == self.pipeline, quarantine.c.topic == msg.topic,
                     quarantine.c.kafka_partition == msg.partition, quarantine.c.kafka_offset == msg.offset)
        if conn.execute(select(quarantine.c.id).where(where)).first() is not None:
            return
        conn.execute(insert(quarantine).values(
            pipeline=self.pipeline, topic=msg.topic, kafka_partition=msg.partition, kafka_offset=msg.offset,
            reason=reason, msg_key=msg.key, msg_value=msg.value, created_at=now()))
