"""Helpers the columnar lane's differential tests share (tests/unit/test_canal_arrow.py, test_open_arrow.py,
test_debezium_arrow.py): the bench's stream as Kafka records, the stream cut per partition and into micro-batches,
and the gate differential that every codec's lane must pass."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable

from applier.clock import clock_limit
from applier.codecs import get_decoder
from applier.columnar.apply import window_events
from applier.decode import decode_messages
from applier.events import KafkaMessage
from applier.gate import Gate, row_identity

LIMIT = clock_limit(None)


def strict(plan: Any) -> tuple:
    """A BatchPlan as comparable data: order, column order, value types and representations all count."""
    def v(x: Any) -> tuple[str, str]:
        return type(x).__name__, repr(x)
    return ([tuple(map(v, k)) for k in plan.deletes],
            [[(c, *v(x)) for c, x in row.items()] for row in plan.upserts],
            plan.changes, plan.unique_clears, plan.keyless)


def bench_messages(protocol: str, events: int, seed: int, topic: str, **options) -> list[KafkaMessage]:
    """The bench's stream of ``protocol`` (``generate_bench`` options too) as Kafka records of ``topic``, offsets
    numbered per partition."""
    from applier.devtools.bench_stream import generate_bench

    w = generate_bench(protocol, events=events, big_txn_rows=events // 10, seed=seed, **options)
    offsets: dict[int, int] = {}
    out = []
    for part, key, value in w.messages():
        off = offsets.get(part, 0)
        offsets[part] = off + 1
        out.append(KafkaMessage(topic, part, off, key, value))
    return out


def per_partition(msgs: list[KafkaMessage]) -> dict[int, list[KafkaMessage]]:
    out: dict[int, list[KafkaMessage]] = {}
    for m in msgs:
        out.setdefault(m.partition, []).append(m)
    return out


def slices(msgs: list[KafkaMessage], size: int) -> list[list[KafkaMessage]]:
    return [ms[i:i + size] for ms in per_partition(msgs).values() for i in range(0, len(ms), size)]


def micro_batches(msgs: list[KafkaMessage], rng: random.Random, most: int) -> list[list[KafkaMessage]]:
    """The stream cut into micro-batches at random points per partition (Spark reads every partition each time),
    up to ``most`` records of each partition per batch."""
    per = per_partition(msgs)
    cuts = {p: 0 for p in per}
    out = []
    while any(cuts[p] < len(per[p]) for p in per):
        batch = []
        for p, ms in per.items():
            n = rng.randrange(0, most)
            batch.extend(ms[cuts[p]:cuts[p] + n])
            cuts[p] += n
        out.append(batch)
    return out


def gate_differential(protocol: str, msgs: list[KafkaMessage], rng: random.Random, budget: int, tmp_path: Path, *,
                      most: int, slice_size: int, same: Callable[[list, list], None],
                      options: dict | None = None) -> None:
    """Feed the same micro-batches to a gate of events (the record path) and to a gate of the lane's row batches;
    after every release ``same(lane's window as events, event gate's window)`` must hold, and the global resolved ts,
    checkpoints (before and after forgetting), restart offsets and applied ts must be equal. The lane must have
    taken slices and cut held batches at a release, or the comparison proved nothing. ``options``: the decoder's
    (Debezium's lane needs ``gated=True``)."""
    options = options or {}
    dec = get_decoder(protocol, **options)
    parts = sorted({(m.topic, m.partition) for m in msgs})
    events_gate = Gate(partitions=parts, budget_bytes=budget, spill_dir=tmp_path / "a")
    batch_gate = Gate(partitions=parts, budget_bytes=budget, spill_dir=tmp_path / "b")

    def record_by_record(ms: list[KafkaMessage]) -> list:
        return decode_messages(get_decoder(protocol, **options), ms, stop_at_error=True).events

    lane_used = cuts = 0
    for mb in micro_batches(msgs, rng, most):
        events_gate.add(record_by_record(mb))
        extras: list = []
        batches: list = []
        for s in slices(mb, slice_size):
            got = dec.decode_arrow(s, LIMIT)
            if got is None:
                extras.extend(record_by_record(s))
            else:
                lane_used += 1
                extras.extend(got.extras)
                batches.extend(got.batches)
        batch_gate.add(extras)
        batch_gate.add_batches(batches)
        assert batch_gate.global_resolved() == events_gate.global_resolved()
        ra, rb = events_gate.release(), batch_gate.release()
        cuts += sum(1 for _, rest in rb.batch_taken.taken if rest is not None) if rb.batch_taken else 0
        want = list(ra)
        got, _ = window_events(list(rb), rb.batches, row_identity)
        same(got, want)
        assert batch_gate.checkpoint() == events_gate.checkpoint()  # released, not yet forgotten: still held
        ra.forget()
        rb.forget()
        assert batch_gate.restart_offsets() == events_gate.restart_offsets()
        assert batch_gate.checkpoint() == events_gate.checkpoint()
        assert batch_gate.applied_ts == events_gate.applied_ts
    assert lane_used > 10 and cuts
    assert batch_gate.held == events_gate.held == 0
    events_gate.close()
    batch_gate.close()
