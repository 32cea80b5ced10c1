"""One micro-batch, end to end, without Spark: decode -> route -> gate -> order/apply -> report.

Spark's ``foreachBatch`` hands the raw Kafka records to :meth:`BatchProcessor.process`; tests drive the same
object directly. Keeping this free of Spark keeps the pipeline's logic testable against real databases in
seconds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterable

from sqlalchemy.engine import Engine

from applier.apply import Applier, ApplyStats
from applier.codecs import Decoder
from applier.events import DDL, DecodeError, KafkaMessage, RowChange
from applier.gate import Gate
from applier.progress import PipelineState, ProgressStore
from applier.sinks import sink_for

log = logging.getLogger("applier.processor")


@dataclass
class BatchReport:
    messages: int = 0
    events: int = 0
    quarantined: int = 0
    applied: ApplyStats = field(default_factory=ApplyStats)
    global_resolved: int = 0
    applied_ts: int = 0
    held: int = 0
    seconds: dict[str, float] = field(default_factory=dict)


def with_protocol_hint(exc: DecodeError, decoder: Decoder, msg: KafkaMessage) -> DecodeError:
    """When the bytes look like another protocol, say so: a wrong source.protocol is the usual cause."""
    try:
        from applier.codecs.sniff import sniff
    except ImportError:  # pragma: no cover - sniffing is optional
        return exc
    looks = sniff(msg.key, msg.value)
    if looks is None or looks == getattr(decoder, "name", None):
        return exc
    return DecodeError(exc.position, f"{exc.reason} (the message looks like {looks!r}: check that "
                       f"source.protocol = \"{looks}\" matches the changefeed's protocol)", protocol=exc.protocol)


class BatchProcessor:
    def __init__(self, *, engine: Engine, decoder: Decoder, route, store: ProgressStore, state: PipelineState,
                 partitions: Iterable[tuple[str, int]], on_decode_error: str = "stop",
                 budget_bytes: int = 512 * 1024 * 1024, spill_dir: str | None = None, batch_rows: int = 5000,
                 on_unsupported_ddl: str = "stop") -> None:
        self.decoder = decoder
        self.route = route
        self.on_decode_error = on_decode_error
        holds = None
        if hasattr(decoder, "held_offsets") and hasattr(decoder, "held_min_commit_ts"):
            holds = lambda: (decoder.held_offsets(), decoder.held_min_commit_ts())  # noqa: E731
        self.gate = Gate(
            partitions=partitions, applied_ts=state.applied_ts,
            partition_resolved={tp: cp.resolved_ts for tp, cp in state.checkpoints.items()},
            budget_bytes=budget_bytes, spill_dir=spill_dir, gated=getattr(decoder, "gated", True),
            upstream_holds=holds,
        )
        for tp, cp in state.checkpoints.items():
            self.gate.next_offsets[tp] = cp.restart_offset
        self.applier = Applier(engine, sink_for(engine, batch_rows), route, store,
                               on_unsupported_ddl=on_unsupported_ddl, replace_mode=not self.gate.gated)
        self.batches = 0
        self.totals = BatchReport()

    def process(self, messages: Iterable[KafkaMessage]) -> BatchReport:
        rep = BatchReport()
        t0 = time.perf_counter()
        events = []
        quarantined: list[tuple[KafkaMessage, str]] = []
        # This loop runs once per message and once per event: keep the per-event work to a dict lookup.
        # Routing is pure configuration, so its answer per (schema, table) is remembered for the batch (the
        # router's own cache still costs a call per event); a routing error is raised by the first call.
        decode = self.decoder.decode
        route = self.route
        routed: dict[tuple[str, str], bool] = {}
        n_messages = 0
        for msg in messages:
            n_messages += 1
            try:
                evs = decode(msg)
            except DecodeError as exc:
                exc = with_protocol_hint(exc, self.decoder, msg)
                if self.on_decode_error != "quarantine":
                    raise exc
                # a decoder that held messages (waiting for a schema) may find one of *those* bad
                bad = getattr(exc, "held_message", None) or msg
                quarantined.append((bad, exc.reason))
                if bad is msg:
                    self.gate.note_offset(msg.topic, msg.partition, msg.offset)
                log.error("quarantined %s", exc)
                continue
            if not evs:
                self.gate.note_offset(msg.topic, msg.partition, msg.offset)
                continue
            size = (len(msg.value or b"") + len(msg.key or b"")) // len(evs)
            for ev in evs:
                if isinstance(ev, (RowChange, DDL)):
                    tk = (ev.schema, ev.table)
                    keep = routed.get(tk)
                    if keep is None:
                        keep = routed[tk] = route(ev.schema, ev.table) is not None
                    if not keep:
                        self.gate.note_offset(msg.topic, msg.partition, msg.offset)
                        continue
                    ev.size = size
                events.append(ev)
        rep.messages = n_messages
        rep.events = len(events)
        rep.quarantined = len(quarantined)
        t1 = time.perf_counter()
        self.gate.add(events)
        t2 = time.perf_counter()
        self.batches += 1
        rep.applied = self.applier.apply(self.gate, quarantined=quarantined)
        t3 = time.perf_counter()
        rep.seconds = {"decode": t1 - t0, "gate": t2 - t1, "apply": t3 - t2}
        rep.global_resolved = self.gate.global_resolved()
        rep.applied_ts = self.gate.applied_ts
        rep.held = self.gate.held
        self._total(rep)
        return rep

    def _total(self, rep: BatchReport) -> None:
        t = self.totals
        t.messages += rep.messages
        t.events += rep.events
        t.quarantined += rep.quarantined
        t.global_resolved, t.applied_ts, t.held = rep.global_resolved, rep.applied_ts, rep.held
        for k, v in rep.seconds.items():
            t.seconds[k] = t.seconds.get(k, 0.0) + v
        t.applied = self.applier.total

    def close(self) -> None:
        self.gate.close()
