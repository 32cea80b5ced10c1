"""One micro-batch, end to end, without Spark: decode -> route -> gate -> order/apply -> report.

Spark's ``foreachBatch`` hands the raw Kafka records to :meth:`BatchProcessor.process`; tests drive the same
object directly. Keeping this free of Spark keeps the pipeline's logic testable against real databases in
seconds.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from sqlalchemy.engine import Engine

from applier.apply import Applier, ApplyStats
from applier.clock import UNTRUSTED
from applier.codecs import Decoder, HoldsMessages, plausible_table, table_of
from applier.crashguard import DriverDecodeGuard
from applier.decode import KILLED, Decoded, decode_chunks, decode_records
from applier.dialect import Dialect, dialect_for
from applier.events import DDL, DecodeError, KafkaMessage, RowChange
from applier.gate import Gate
from applier.progress import PipelineState, ProgressStore
from applier.quarantine import HELD, SKIPPED, UndecodableMessage
from applier.routing import RoutingError
from applier.streams.apply import StreamApplier
from applier.streams.assign import StreamAssignment
from applier.timing import NO_TIMING, StageTimer

log = logging.getLogger("applier.processor")


@dataclass
class BatchReport:
    messages: int = 0
    events: int = 0
    quarantined: int = 0
    untrusted: int = 0  # of those, messages refused for an untrusted ts (applier.clock)
    applied: ApplyStats = field(default_factory=ApplyStats)
    global_resolved: int = 0
    applied_ts: int = 0
    held: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


class BatchProcessor:
    def __init__(self, *, engine: Engine, decoder: Decoder, route, store: ProgressStore, state: PipelineState,
                 partitions: Iterable[tuple[str, int]], on_decode_error: str = "stop",
                 decode_error_policy: Callable[[str, str], str | None] | None = None,
                 stops_at_decode_error: bool | None = None,
                 budget_bytes: int = 512 * 1024 * 1024, spill_dir: str | None = None, batch_rows: int = 5000,
                 on_unsupported_ddl: str = "stop", shard_ddl: str = "stop", on_apply_error: str = "stop",
                 apply_error_policy=None, ddl_scope=None, guard: DriverDecodeGuard | None = None,
                 write_mode: Callable[[str, str], str] | None = None,
                 timer: StageTimer = NO_TIMING, dialect: Dialect | None = None,
                 until_ts: int | None = None, schema_evolution: str = "none",
                 max_skew_ms: int | None = None, columnar: bool = False, apply_streams: int = 1,
                 remote=None, one_transaction: bool = False) -> None:
        """``state`` is where the run resumes: its ``applied_ts`` becomes the gate's (for a new pipeline with
        ``source.start_ts``, that TSO: :func:`applier.pipeline.seed_start_ts`). ``until_ts`` makes the gate release
        nothing committed after it (``applier run --until-ts``; gated protocols only). ``apply_streams`` above 1
        writes each release as that many parallel transactions (applier.streams; gated protocols only); ``remote`` (an
        :class:`applier.streams.remote.RemoteApply`) writes them in Spark tasks rather than threads of the driver;
        ``one_transaction`` writes every stream's share of a release in one transaction (applier.streams.apply)."""
        self.timer = timer
        self.decoder = decoder
        self.max_skew_ms = max_skew_ms  # [source] max_clock_skew, for what the driver decodes (applier.clock)
        self.columnar = columnar  # [pipeline] columnar: what the driver decodes goes the lane's way too
        self.guard = guard  # driver-side decoding under the crash marker (applier.crashguard)
        self.route = route
        self.on_decode_error = on_decode_error  # stop | quarantine | skip, for a message whose table is unknown
        # a [[route]] rule's own on_decode_error for the tables it decides (None: the one above)
        self.decode_error_policy = decode_error_policy or (lambda schema, table: None)
        self.stop_at_error = on_decode_error == "stop" if stops_at_decode_error is None else stops_at_decode_error
        holds = None
        if isinstance(decoder, HoldsMessages):
            holds = lambda: (decoder.held_offsets(), decoder.held_min_commit_ts())  # noqa: E731
        self.gate = Gate(
            partitions=partitions, applied_ts=state.applied_ts,
            partition_resolved={tp: cp.resolved_ts for tp, cp in state.checkpoints.items()},
            budget_bytes=budget_bytes, spill_dir=spill_dir, gated=decoder.gated,
            upstream_holds=holds, until_ts=until_ts, table_floors=state.table_floors,
        )
        for tp, cp in state.checkpoints.items():
            self.gate.next_offsets[tp] = cp.restart_offset
        make = functools.partial(Applier, engine, dialect or dialect_for(engine), route, batch_rows=batch_rows,
                                 on_unsupported_ddl=on_unsupported_ddl, shard_ddl=shard_ddl,
                                 on_apply_error=on_apply_error, apply_error_policy=apply_error_policy,
                                 write_mode=write_mode, replace_mode=not self.gate.gated,
                                 ddl_scope=ddl_scope, timer=timer, schema_evolution=schema_evolution)
        if apply_streams > 1:
            if not self.gate.gated:
                raise ValueError("apply streams need a gated stream (the configuration refuses this: "
                                 "target.apply_streams)")
            self.applier: Applier | StreamApplier = StreamApplier(make, store, StreamAssignment(apply_streams, route),
                                                                  remote, one_transaction=one_transaction)
        else:
            self.applier = make(store)
        self.batches = 0
        self.totals = BatchReport()
        self._routed: dict[tuple[str, str], bool] = {}
        self._unroutable: dict[tuple[str, str], RoutingError] = {}  # tables no route can name (see _route_events)
        self._interned: dict[tuple, tuple] = {}  # column tuples of worker-decoded events (see decode_chunks)

    def process(self, messages: Iterable[KafkaMessage]) -> BatchReport:
        """One micro-batch of raw records, decoded here (in the calling thread)."""
        with self.timer.span("process"):
            return self._process(messages)

    def _process(self, messages: Iterable[KafkaMessage]) -> BatchReport:
        t0 = time.perf_counter()
        if self.guard is not None:
            decoded = self.guard.decode(self.decoder, messages, stop_at_error=self.stop_at_error,
                                        max_skew_ms=self.max_skew_ms, columnar=self.columnar)
        else:
            decoded = decode_records(self.decoder, messages, stop_at_error=self.stop_at_error,
                                     max_skew_ms=self.max_skew_ms, columnar=self.columnar)
        return self.process_decoded(decoded, time.perf_counter() - t0)

    def process_chunks(self, chunks: Iterable[bytes]) -> BatchReport:
        """One micro-batch decoded by Spark's Python workers (:func:`applier.decode.decode_arrow_batches`). What
        they left to the driver (Simple: rows of schemas they did not have, BOOTSTRAP and DDL messages) is decoded
        here with this processor's decoder, in Kafka order and under the crash guard
        (:func:`applier.decode.decode_chunks`)."""
        with self.timer.span("process"):
            return self._process_chunks(chunks)

    def _process_chunks(self, chunks: Iterable[bytes]) -> BatchReport:
        t0 = time.perf_counter()
        decoded = decode_chunks(chunks, self._interned, self.decoder, stop_at_error=self.stop_at_error,
                                max_skew_ms=self.max_skew_ms, guard=self.guard)
        return self.process_decoded(decoded, time.perf_counter() - t0)

    def process_decoded(self, decoded: Decoded, decode_seconds: float = 0.0) -> BatchReport:
        rep = BatchReport()
        t0 = time.perf_counter()
        gate = self.gate
        undecodable = [self._settle(bad, exc) for bad, exc in decoded.errors]
        for bad, exc in decoded.errors:
            if exc.held_message is None:
                gate.note_offset(bad.topic, bad.partition, bad.offset)
        for topic, partition, offset in decoded.empty:
            gate.note_offset(topic, partition, offset)
        events = self._route_events(decoded.events, undecodable)
        batches = self._route_batches(decoded.batches, events, undecodable)
        rep.messages = decoded.messages
        rep.events = len(events) + sum(map(len, batches))
        rep.quarantined = len(undecodable)
        rep.untrusted = sum(1 for _bad, exc in decoded.errors if UNTRUSTED in exc.reason)
        t1 = time.perf_counter()
        gate.add(events)
        if batches:
            gate.add_batches(batches)
        t2 = time.perf_counter()
        self.batches += 1
        rep.applied = self.applier.apply(gate.release(), undecodable=undecodable)
        t3 = time.perf_counter()
        rep.seconds = {"decode": decode_seconds + t1 - t0, "gate": t2 - t1, "apply": t3 - t2}
        for stage, secs in rep.seconds.items():
            self.timer.add(stage, secs)
        rep.global_resolved = gate.global_resolved()
        rep.applied_ts = gate.applied_ts
        rep.held = gate.held
        self._total(rep)
        return rep

    def _route_events(self, decoded: list, undecodable: list[UndecodableMessage]) -> list:
        """The decoded events their routes keep. Routing is pure configuration, so its answer per (schema, table)
        is remembered (the router's own cache still costs a call per event).

        A table no route can name (a rename template that makes an empty or over-long name, e.g. ``{table}`` of
        a 300-character name) fails each message of it like an undecodable one: ``on_decode_error`` settles it
        with its Kafka position (stop / quarantine / skip), never an unhandled error that every rerun meets again.
        Such a message's events were decoded (maybe by a worker), so its record names the position and leaves the
        bytes in Kafka."""
        gate = self.gate
        route = self.route
        routed = self._routed
        events = []
        failed: dict[object, RoutingError] = {}  # position -> why its table cannot be routed
        for ev in decoded:
            if type(ev) is RowChange or type(ev) is DDL:
                tk = (ev.schema, ev.table)
                keep = routed.get(tk)
                if keep is None:
                    try:
                        keep = route(ev.schema, ev.table) is not None
                    except RoutingError as exc:
                        keep = False
                        self._unroutable[tk] = exc
                    routed[tk] = keep
                if not keep:
                    pos = ev.position
                    err = self._unroutable.get(tk)
                    if err is None:
                        gate.note_offset(pos.topic, pos.partition, pos.offset)
                    else:
                        failed.setdefault(pos, err)
                    continue
            events.append(ev)
        if failed:  # every event of a failed message goes with it (a message is settled whole)
            events = [ev for ev in events if ev.position not in failed]
            for pos, err in failed.items():
                stub = KafkaMessage(pos.topic, pos.partition, pos.offset, None, None)
                exc = DecodeError(pos, f"its table {err.schema}.{err.table} cannot be routed: {err}. Fix that "
                                  "[[route]] rule's template (or add an ignore rule for the table)",
                                  protocol=getattr(self.decoder, "name", ""))
                undecodable.append(self._settle(stub, exc))
                if not undecodable[-1].blocks_partition:
                    gate.note_offset(pos.topic, pos.partition, pos.offset)
        return events

    def _route_batches(self, batches: list, events: list, undecodable: list[UndecodableMessage]) -> list:
        """The row batches whose table a route keeps (the columnar lane): a batch of a table no route keeps is
        dropped with its offsets noted, as :meth:`_route_events` drops such events; a batch whose table no route can
        name becomes events for :meth:`_route_events`, which settles its messages."""
        if not batches:
            return batches
        kept = []
        for b in batches:
            tk = (b.shape.schema, b.shape.table)
            keep = self._routed.get(tk)
            if keep is None:
                try:
                    keep = self.route(*tk) is not None
                except RoutingError as exc:
                    keep = False
                    self._unroutable[tk] = exc
                self._routed[tk] = keep
            if keep:
                kept.append(b)
            elif tk in self._unroutable:
                events.extend(self._route_events(b.to_events(), undecodable))
            else:
                parts = b.data.column("_part").to_pylist()
                offs = b.data.column("_off").to_pylist()
                for part, off in set(zip(parts, offs)):
                    self.gate.note_offset(b.shape.topic, part, off)
        return kept

    def _settle(self, bad: KafkaMessage, exc: DecodeError) -> UndecodableMessage:
        """What the policy in force does with a message that cannot be decoded: stop (raise), or quarantine it
        so nothing later of its table (its partition, when the table cannot be read) overtakes it (invariant
        12), or skip it with a record. A message of a table no route keeps is recorded as skipped: it would
        have been dropped anyway."""
        # a message that killed the decoder process is not parsed again, not even for its table name; one whose
        # events were decoded and then refused (an untrusted ts) names their table
        if exc.table is not None:
            named = plausible_table(exc.table)
        else:
            named = None if KILLED in exc.reason else table_of(self.decoder, bad)
        reason = f"the message at {bad.position} cannot be decoded: {exc.reason}"
        try:
            routed = named is None or self.route(*named) is not None
        except Exception:  # a name a [[route]] template cannot make a target name of: treat it as unreadable
            named, routed = None, True
        if exc.rowless and named is None:
            # a watermark carries no change: nothing of any table follows it in commit order, so nothing is held
            # behind it (holding its partition would stall the replica for one forged watermark)
            policy = self.on_decode_error
            if policy == "stop":
                raise exc
            log.error("%s %s; it carries no row change, so nothing is held behind it",
                      "skipped" if policy == "skip" else "quarantined", exc, extra={"position": bad.position})
            return UndecodableMessage(bad, f"{reason} (no row change: recorded, nothing held)", None, SKIPPED)
        if not routed:
            assert named is not None
            log.warning("skipped %s (its table %s.%s is not routed)", exc, *named, extra={"position": bad.position})
            return UndecodableMessage(bad, f"{reason} (its table is not routed: recorded, nothing held)", named,
                                      SKIPPED)
        policy = (self.decode_error_policy(*named) if named is not None else None) or self.on_decode_error
        if policy == "stop":
            raise exc
        log.error("%s %s%s", "skipped" if policy == "skip" else "quarantined", exc,
                  "" if named is not None or policy == "skip" else
                  "; its table cannot be read, so every later change of its partition is held behind it",
                  extra={"position": bad.position})
        return UndecodableMessage(bad, reason, named, SKIPPED if policy == "skip" else HELD)

    def _total(self, rep: BatchReport) -> None:
        t = self.totals
        t.messages += rep.messages
        t.events += rep.events
        t.quarantined += rep.quarantined
        t.untrusted += rep.untrusted
        t.global_resolved, t.applied_ts, t.held = rep.global_resolved, rep.applied_ts, rep.held
        for k, v in rep.seconds.items():
            t.seconds[k] = t.seconds.get(k, 0.0) + v
        t.applied = self.applier.total

    def close(self) -> None:
        self.gate.close()
        if isinstance(self.applier, StreamApplier):
            self.applier.close()
