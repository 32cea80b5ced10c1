"""The decode stage: Kafka records -> events, in the driver or in Spark's Python workers.

Why workers: the driver's apply thread holds the GIL while it decodes, plans and writes, and decoding was about
half of its time (docs/benchmarks.md), so no thread layout in the driver could use a second core for it. Spark's
Python workers are separate processes. When the micro-batch's DataFrame is mapped through
:func:`decode_arrow_batches`, the workers decode batch N+1 while the driver's apply thread writes batch N.

Decoders whose events for a message depend on nothing but that message (``decodes_alone`` in the codec module)
run there as they are: a worker sees one Spark partition of the batch, and a fresh worker process starts with
empty caches. A protocol that keeps a schema across messages and holds rows until it arrives (Simple:
``decodes_with_schemas``) runs there with a snapshot of the driver's schemas (:func:`with_schemas`): the workers
decode what that snapshot (or a schema learnt in their own slice, checked by the driver) lets them decode, and
send everything else back as raw records, in place, for the driver's decoder, which stays the one owner of the
schema cache and the holds (:func:`decode_chunks`; the reasoning is in :mod:`applier.codecs.simple`).

What comes back from a worker is one *chunk* per slice of messages: the events as a compact columnar block
(:mod:`applier.blocks`; measured 4.7 us per event to rebuild, chunk unpickling included, against about 14 us
to decode), the positions of
messages that produced no events (the gate still needs their offsets) and every decode error with the raw
record, so the driver applies ``pipeline.on_decode_error`` exactly as if it had decoded the batch itself.
"""

from __future__ import annotations

import pickle
from array import array
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator

from applier.blocks import BlockCodec, gc_paused
from applier.clock import clock_limit, untrusted
from applier.codecs import WORKER_CHECK, WORKER_DONE, WORKER_RAW, Decoder, get_decoder
from applier.events import DDL, DecodeError, Event, KafkaMessage, RowChange

# Spark's schema of what decode_arrow_batches yields: one chunk (bytes) per row.
CHUNK_SCHEMA = "chunk binary"
# Messages per chunk. Bounds a worker's memory (an Open Protocol message holds up to 16 row changes) and the
# size of one binary cell; chunks are concatenated in the driver, so this does not change what is applied.
CHUNK_MESSAGES = 2048
_ARROW_CHUNK_VERSION = 4  # a slice the codec decoded into Arrow batches (applier.columnar.rows.encode_slice)
_CHUNK_VERSION = 3  # 2: a chunk may carry a fatal error (a decoder's passthrough error, e.g. the registry's);
# 3: a chunk may leave messages to the driver (decoders with schemas, see encode_worker_chunk)


@dataclass
class Decoded:
    """What decoding some messages gave, in message order per partition."""

    messages: int = 0
    events: list[Event] = field(default_factory=list)
    empty: list[tuple[str, int, int]] = field(default_factory=list)  # (topic, partition, offset) without events
    # the bad record (for a decoder that held messages, the held one that turned out bad) and the error
    errors: list[tuple[KafkaMessage, DecodeError]] = field(default_factory=list)
    # the columnar lane's row batches (applier.columnar.rows.RowBatch): row changes decoded into Arrow arrays
    batches: list = field(default_factory=list)

    def extend(self, other: "Decoded") -> None:
        self.messages += other.messages
        self.events.extend(other.events)
        self.empty.extend(other.empty)
        self.errors.extend(other.errors)
        self.batches.extend(other.batches)


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
                       f"source.protocol = \"{looks}\" matches the changefeed's protocol)", protocol=exc.protocol,
                       held_message=exc.held_message)


def decode_messages(decoder: Decoder, messages: Iterable[KafkaMessage], *, stop_at_error: bool,
                    max_skew_ms: int | None = None) -> Decoded:
    """Decode ``messages`` in order. With ``stop_at_error`` the first DecodeError (with a protocol hint) is
    raised; otherwise every bad record is collected with its error and decoding goes on.

    Every event's ts is checked against this host's clock (:mod:`applier.clock`; ``max_skew_ms`` None checks
    only that it fits 63 bits): a message with an untrusted ts is a bad record like any undecodable one.

    Each row/DDL event gets ``size``: its share of the record's bytes, what the gate's memory budget counts."""
    out = Decoded()
    events = out.events
    decode = decoder.decode
    limit = clock_limit(max_skew_ms)
    n = 0
    for msg in messages:
        n += 1
        try:
            evs = decode(msg)
        except DecodeError as exc:
            exc = with_protocol_hint(exc, decoder, msg)
            if stop_at_error:
                raise exc
            # a decoder that held messages (waiting for a schema) may find one of *those* bad
            out.errors.append((exc.held_message or msg, exc))
            continue
        if evs:
            bad = untrusted(evs, limit)
            if bad is not None:
                evs = _refuse_untrusted(decoder, msg, evs, bad, limit, out, stop_at_error)
        if not evs:
            out.empty.append((msg.topic, msg.partition, msg.offset))
            continue
        size = (len(msg.value or b"") + len(msg.key or b"")) // len(evs)
        for ev in evs:
            if type(ev) is RowChange or type(ev) is DDL:
                ev.size = size
        events.extend(evs)
    out.messages = n
    return out


def decode_records(decoder: Decoder, messages: Iterable[KafkaMessage], *, stop_at_error: bool,
                   max_skew_ms: int | None = None, columnar: bool = False) -> Decoded:
    """:func:`decode_messages` for the driver, with the columnar lane (``[pipeline] columnar``): a codec with
    ``decode_arrow`` first takes each partition's records a slice of :data:`CHUNK_MESSAGES` at a time into row
    batches, as Spark's workers do, and a slice it does not take is decoded record by record. Events come per
    partition in offset order (the gate takes partitions in any order)."""
    arrow = getattr(decoder, "decode_arrow", None) if columnar else None
    if arrow is None:
        return decode_messages(decoder, messages, stop_at_error=stop_at_error, max_skew_ms=max_skew_ms)
    per: dict[tuple[str, int], list[KafkaMessage]] = {}
    for m in messages:
        per.setdefault((m.topic, m.partition), []).append(m)
    limit = clock_limit(max_skew_ms)
    out = Decoded()
    for msgs in per.values():
        for lo in range(0, len(msgs), CHUNK_MESSAGES):
            part = msgs[lo:lo + CHUNK_MESSAGES]
            s = arrow(part, limit)
            if s is None:
                out.extend(decode_messages(decoder, part, stop_at_error=stop_at_error, max_skew_ms=max_skew_ms))
            else:
                out.extend(Decoded(s.messages, s.extras, [], [], s.batches))
    return out


def _refuse_untrusted(decoder: Decoder, msg: KafkaMessage, evs: list[Event], bad: tuple[Event, str] | None,
                      limit: int, out: Decoded, stop_at_error: bool) -> list[Event]:
    """A message with an untrusted ts (applier.clock) becomes a bad record: none of its events goes on. The events
    of other messages a decoder released in the same call (Simple's held rows) go on, each message judged alone
    (a later one of them may be refused in turn). Returns the events that go on."""
    while bad is not None:
        ev, reason = bad
        pos = ev.position
        assert pos is not None
        mine = [e for e in evs if e.position == pos and (type(e) is RowChange or type(e) is DDL)]
        exc = DecodeError(pos, reason, protocol=getattr(decoder, "name", ""),
                          held_message=None if pos == msg.position else
                          KafkaMessage(pos.topic, pos.partition, pos.offset, None, None),
                          table=_one_table(mine), rowless=not mine)
        if stop_at_error:
            raise exc
        # a held message's bytes went with the decoder's hold: the record names its position (Kafka has the bytes)
        out.errors.append((exc.held_message or msg, exc))
        evs = [e for e in evs if e.position != pos]
        bad = untrusted(evs, limit)
    return evs


def _one_table(events: list[Event]) -> tuple[str, str] | None:
    """The one upstream table ``events`` name (None when they name several, or none)."""
    names = {(e.schema, e.table) for e in events}  # type: ignore[union-attr]
    return names.pop() if len(names) == 1 else None


# ---- chunks: a worker's Decoded as bytes -------------------------------------------------------------------

def encode_chunk(d: Decoded) -> bytes:
    codec = BlockCodec()
    core, rest = codec.encode(d.events)  # type: ignore[arg-type]  # Resolved events travel in the block's rest
    return pickle.dumps((_CHUNK_VERSION, d.messages, codec.shape_table(), core, rest, d.empty, d.errors, None, None),
                        protocol=5)


def fatal_chunk(exc: BaseException) -> bytes:
    """A chunk that makes the driver raise ``exc`` where it rebuilds the chunks: an error the decoder lets pass
    (``passthrough_errors``, e.g. an unreachable schema registry) stops the run there with its own message, as
    when the driver decodes, rather than as a failed Spark task."""
    return pickle.dumps((_CHUNK_VERSION, 0, [], b"", b"", [], [], exc, None), protocol=5)


@dataclass
class Leftovers:
    """What a worker left to the driver in one chunk of a decoder that decodes with schemas (see
    :func:`encode_worker_chunk`). The chunk's events are those of its other messages, one per message, in order."""

    origin: str  # the driver decoder whose schema snapshot the worker had ("" for none)
    at: list[int]  # index in the chunk of each message below, ascending
    kinds: bytes  # per message: WORKER_RAW, or WORKER_CHECK (its event is in the block too)
    raw: list[KafkaMessage]  # per message: the record, for the driver to decode
    uses: list[int]  # per WORKER_CHECK message: its schema, an index into ``learnt``
    learnt: list[tuple[tuple, tuple]]  # (schema key, Column tuple) the worker learnt and used
    sizes: bytes  # array('q'): per event, its record's key + value bytes


def encode_worker_chunk(decoder: Any, msgs: Iterable[KafkaMessage], limit: int) -> bytes:
    """A worker's chunk for a decoder that decodes with schemas (``decode_in_worker``): the messages it decoded as
    events (one each, with a ts trusted under ``limit``), the others as raw records in their place."""
    events: list[Event] = []
    sizes = array("q")
    at: list[int] = []
    kinds = bytearray()
    raw: list[KafkaMessage] = []
    uses: list[int] = []
    learnt: dict[tuple, int] = {}
    learnt_cols: list[tuple[tuple, tuple]] = []
    decode = decoder.decode_in_worker
    n = 0
    for i, msg in enumerate(msgs):
        n += 1
        kind, ev, key, cols = decode(msg)
        if kind != WORKER_RAW and untrusted((ev,), limit) is not None:
            kind = WORKER_RAW  # the driver refuses it with its own clock (and keeps the record's bytes)
        if kind == WORKER_DONE:
            events.append(ev)
            sizes.append(len(msg.value or b"") + len(msg.key or b""))
            continue
        at.append(i)
        raw.append(msg)
        if kind == WORKER_CHECK:
            ident = (key, cols)
            u = learnt.get(ident)  # type: ignore[arg-type]
            if u is None:
                u = learnt[ident] = len(learnt_cols)  # type: ignore[index]
                learnt_cols.append(ident)
            uses.append(u)
            events.append(ev)
            sizes.append(len(msg.value or b"") + len(msg.key or b""))
        kinds.append(kind)
    codec = BlockCodec()
    core, rest = codec.encode(events)  # type: ignore[arg-type]
    left = Leftovers(decoder.seeded_origin, at, bytes(kinds), raw, uses, learnt_cols, sizes.tobytes())
    return pickle.dumps((_CHUNK_VERSION, n, codec.shape_table(), core, rest, [], [], None, left), protocol=5)


def _load_chunk(data: bytes, interned: dict[tuple, tuple] | None) -> tuple[Decoded, Leftovers | None]:
    version, *fields = pickle.loads(data)
    if version == _ARROW_CHUNK_VERSION:
        from applier.columnar.rows import decode_slice as decode_arrow_slice

        s = decode_arrow_slice(fields[0])
        if interned is not None:
            for b in s.batches:
                variants = tuple(interned.setdefault(cols, cols) for cols in b.shape.variants)
                if any(v is not w for v, w in zip(variants, b.shape.variants)):
                    b.shape = replace(b.shape, variants=variants)
        return Decoded(s.messages, s.extras, [], [], s.batches), None
    if version != _CHUNK_VERSION:
        raise ValueError(f"decoded chunk of format {version}, this applier reads {_CHUNK_VERSION}: the Spark "
                         "workers run another version of the applier than the driver; install the same one")
    messages, shapes, core, rest, empty, errors, fatal, left = fields
    if fatal is not None:
        raise fatal
    if interned is not None:
        shapes = [(s, t, op, interned.setdefault(cols, cols), *more) for s, t, op, cols, *more in shapes]
    events = BlockCodec.from_shape_table(shapes).decode(core, rest) if shapes or rest else []
    return Decoded(messages, events, empty, errors), left


def decode_chunk(data: bytes, interned: dict[tuple, tuple] | None = None) -> Decoded:
    """A chunk back to a Decoded. ``interned`` (kept by the caller across chunks) makes equal column tuples
    of different chunks one object again, as the driver-side decoders keep them. A chunk that left messages to
    the driver's decoder is refused: :func:`decode_chunks` rebuilds those."""
    d, left = _load_chunk(data, interned)
    if left is not None:
        raise ValueError("this chunk left messages to the driver's decoder: rebuild it with decode_chunks()")
    return d


def decode_chunks(chunks: Iterable[bytes], interned: dict[tuple, tuple] | None = None, decoder: Any = None, *,
                  stop_at_error: bool = False, max_skew_ms: int | None = None, guard: Any = None) -> Decoded:
    """A micro-batch's chunks, in order, back to one Decoded.

    Chunks of a decoder that decodes alone are taken as they are. The chunks of one that decodes with schemas
    (Simple) are walked message by message in Kafka order with the driver's ``decoder``: the records the workers
    left are decoded here (:meth:`decode`, which holds, releases and raises as ever; with ``stop_at_error`` the
    first DecodeError is raised, as :func:`decode_messages` does), the workers' events pass through
    :meth:`accept` (a worker event of a schema it learnt itself only when :meth:`confirms` says the driver has the
    same schema now, else the record is decoded here), and every event's ts is checked against this host's clock.
    The result is what ``decode_messages(decoder, <the batch's records>)`` gives.

    ``guard`` (:class:`applier.crashguard.DriverDecodeGuard`) covers the records decoded here as it covers a
    driver-decoded batch: its marker is armed with them while they are decoded, and records known to kill the
    decoder are not decoded but become errors (put first, as the guard does)."""
    loaded = [_load_chunk(c, interned) for c in chunks]
    out = Decoded()
    if all(left is None for _, left in loaded):
        for d, _ in loaded:
            out.extend(d)
        return out
    if decoder is None or not getattr(decoder, "decodes_with_schemas", False):
        raise ValueError("these chunks left messages to the driver's decoder, and none was given")
    raw = [m for _, left in loaded if left is not None for m in left.raw]
    poison = getattr(guard, "poison", None) or {}
    poisoned: list[tuple[KafkaMessage, DecodeError]] = []
    marker = getattr(guard, "marker", None)
    if marker is not None and raw:
        marker.arm(raw)
    try:
        walk = _Walk(decoder, out, clock_limit(max_skew_ms), stop_at_error, poison, poisoned,
                     getattr(guard, "protocol", getattr(decoder, "name", "")))
        for d, left in loaded:
            if left is None:
                out.extend(d)
                if stop_at_error and d.errors:  # (a record that killed a worker): it stops the run here
                    break
            else:
                walk.chunk(d, left)
    finally:
        if marker is not None and raw:
            marker.disarm()
    if poisoned:
        out.errors[0:0] = poisoned
    return out


class _Walk:
    """The driver's pass over worker chunks (decode_chunks): what decode_messages does per record, with the
    workers' events standing in for the decode() of the records they decoded."""

    def __init__(self, decoder: Any, out: Decoded, limit: int, stop_at_error: bool, poison: dict,
                 poisoned: list, protocol: str) -> None:
        self.decoder = decoder
        self.out = out
        self.limit = limit
        self.stop_at_error = stop_at_error
        self.poison = poison
        self.poisoned = poisoned
        self.protocol = protocol

    def chunk(self, d: Decoded, left: Leftovers) -> None:
        decoder = self.decoder
        if left.origin and left.origin != decoder.origin:
            raise RuntimeError("a worker decoded with the schema snapshot of another decoder than this one")
        self.out.messages += d.messages
        events = d.events
        sizes = array("q")
        sizes.frombytes(left.sizes)
        confirmed: dict[int, bool] = {}
        j = 0  # next worker event
        prev = 0  # next message index
        c = 0  # next WORKER_CHECK message
        for k, i in enumerate(left.at):
            if i > prev:  # the worker's events of messages prev..i-1
                self.done(events, sizes, j, j + i - prev)
                j += i - prev
            prev = i + 1
            msg = left.raw[k]
            if left.kinds[k] == WORKER_CHECK:
                u = left.uses[c]
                c += 1
                ok = confirmed.get(u)
                if not ok:
                    ok = confirmed[u] = decoder.confirms(*left.learnt[u])  # once true, true for good
                j += 1
                if ok:
                    self.done(events, sizes, j - 1, j)
                    continue
            self.decode(msg)
        if d.messages > prev:
            self.done(events, sizes, j, j + d.messages - prev)

    def done(self, events: list, sizes: Any, lo: int, hi: int) -> None:
        """The worker's events ``lo..hi-1``, one per message."""
        decoder = self.decoder
        run = events[lo:hi]
        if decoder.idle() and untrusted(run, self.limit) is None:
            self.out.events.extend(run)  # what decode() of each would return, and every ts trusted
            return
        for n, ev in enumerate(run):
            pos = ev.position
            stub = KafkaMessage(pos.topic, pos.partition, pos.offset, None, None)
            try:
                evs = decoder.accept(pos, [ev])
            except DecodeError as exc:
                exc = with_protocol_hint(exc, decoder, stub)
                if self.stop_at_error:
                    raise exc
                self.out.errors.append((exc.held_message or stub, exc))
                continue
            self.take(stub, evs, sizes[lo + n])

    def decode(self, msg: KafkaMessage) -> None:
        if self.poison:
            reason = self.poison.get((msg.topic, msg.partition, msg.offset))
            if reason is not None:
                self.poisoned.append((msg, DecodeError(msg.position, reason, protocol=self.protocol)))
                return
        try:
            evs = self.decoder.decode(msg)
        except DecodeError as exc:
            exc = with_protocol_hint(exc, self.decoder, msg)
            if self.stop_at_error:
                raise exc
            self.out.errors.append((exc.held_message or msg, exc))
            return
        self.take(msg, evs, len(msg.value or b"") + len(msg.key or b""))

    def take(self, msg: KafkaMessage, evs: list, nbytes: int) -> None:
        """decode_messages' handling of one record's events (``nbytes``: the record's key + value bytes)."""
        out = self.out
        if evs:
            bad = untrusted(evs, self.limit)
            if bad is not None:
                evs = _refuse_untrusted(self.decoder, msg, evs, bad, self.limit, out, self.stop_at_error)
        if not evs:
            out.empty.append((msg.topic, msg.partition, msg.offset))
            return
        size = nbytes // len(evs)
        for ev in evs:
            if type(ev) is RowChange or type(ev) is DDL:
                ev.size = size
        out.events.extend(evs)


# ---- the function Spark's Python workers run (DataFrame.mapInArrow) -----------------------------------------

@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build the same decoder as the driver (small and picklable)."""

    protocol: str
    options: tuple[tuple[str, Any], ...]
    stop_at_error: bool
    max_skew_ms: int | None = None  # [source] max_clock_skew (applier.clock); None: only the 63-bit check
    # a decoder that decodes with schemas: the driver decoder's schema snapshot for this micro-batch
    # (:func:`with_schemas`); not part of the worker decoder's identity (it is seeded with it per batch)
    schemas: Any = field(default=None, repr=False, compare=False)
    columnar: bool = False  # try the codec's decode_arrow first (applier.columnar; [pipeline] columnar)


def with_schemas(spec: WorkerSpec, decoder: Any) -> WorkerSpec:
    """``spec`` for one micro-batch: with the schema snapshot of the driver's ``decoder`` when it decodes with
    schemas (Simple), else ``spec`` itself. Called on the thread that maps the batch, while the apply thread may
    be decoding with ``decoder`` (``schema_snapshot`` allows that)."""
    if not getattr(decoder, "decodes_with_schemas", False):
        return spec
    return replace(spec, schemas=decoder.schema_snapshot())


_shared: dict[str, Any] = {}  # origin -> the Spark broadcast of its latest snapshot (see shared_schemas)


def shared_schemas(spec: WorkerSpec, spark_context: Any) -> WorkerSpec:
    """``spec`` with its schema snapshot's bytes in a Spark broadcast variable, made once per snapshot version:
    the executors then fetch a version once instead of receiving it with every task of every batch. The broadcast
    of the version before is destroyed (the batches that used it have been read: one thread maps them in turn)."""
    snap = spec.schemas
    if snap is None or snap.data is None:
        return spec
    have = _shared.get(snap.origin)
    if have is None or have[0] != snap.version:
        bc = spark_context.broadcast(snap.data)
        if have is not None:
            try:
                have[1].destroy(blocking=False)
            except Exception:  # noqa: BLE001 - freeing it is best effort
                pass
        if len(_shared) > 8:  # runs of earlier pipelines in this process
            _shared.clear()
        have = _shared[snap.origin] = (snap.version, bc)
    return replace(spec, schemas=replace(snap, data=None, shared=have[1]))


_worker_decoders: dict[str, Decoder] = {}  # per worker process (repr of its spec): warm caches across tasks


def worker_decoder(spec: WorkerSpec) -> Decoder:
    """This worker process's decoder for ``spec``, built once and kept warm across tasks."""
    key = repr(spec)
    decoder = _worker_decoders.get(key)
    if decoder is None:
        decoder = _worker_decoders[key] = get_decoder(spec.protocol, **dict(spec.options))
    return decoder


def _worker_mode(decoder: Any, spec: WorkerSpec) -> bool:
    """Whether ``decoder`` decodes here with schemas (then seeded with the spec's snapshot, or none)."""
    if not getattr(decoder, "decodes_with_schemas", False):
        return False
    decoder.seed(spec.schemas)
    return True


def decode_slice(decoder: Decoder, spec: WorkerSpec, msgs: Iterable[KafkaMessage], with_schemas: bool) -> bytes:
    """One chunk of a worker (or of a child of :func:`decode_isolated`). Raises what decode_messages raises."""
    if with_schemas:
        return encode_worker_chunk(decoder, msgs, clock_limit(spec.max_skew_ms))
    arrow = getattr(decoder, "decode_arrow", None) if spec.columnar else None
    if arrow is not None:
        msgs = msgs if isinstance(msgs, list) else list(msgs)
        s = arrow(msgs, clock_limit(spec.max_skew_ms))
        if s is not None:
            from applier.columnar.rows import encode_slice

            return pickle.dumps((_ARROW_CHUNK_VERSION, encode_slice(s)), protocol=5)
    return encode_chunk(decode_messages(decoder, msgs, stop_at_error=spec.stop_at_error,
                                        max_skew_ms=spec.max_skew_ms))


def decode_arrow_batches(spec: WorkerSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body: record batches of (topic, partition, offset, key, value) -> batches of chunks.

    With ``stop_at_error`` a slice ends at its first bad record (the driver stops there anyway)."""
    import pyarrow as pa

    decoder = worker_decoder(spec)
    schemas = _worker_mode(decoder, spec)
    passthrough = tuple(getattr(decoder, "passthrough_errors", ()))
    for whole in batches:
        for rb in partition_runs(whole):
            for lo in range(0, rb.num_rows, CHUNK_MESSAGES):
                part = rb.slice(lo, CHUNK_MESSAGES)
                msgs = map(KafkaMessage, *(part.column(i).to_pylist() for i in range(5)))
                fatal = False
                try:
                    with gc_paused():  # what a slice allocates is acyclic and freed by reference counting
                        chunk = decode_slice(decoder, spec, msgs, schemas)
                except DecodeError as exc:
                    chunk = encode_chunk(Decoded(errors=[(_bad_record(part, exc), exc)]))
                except passthrough as exc:
                    chunk, fatal = fatal_chunk(exc), True
                yield pa.RecordBatch.from_arrays([pa.array([chunk], type=pa.binary())], names=["chunk"])
                if fatal:  # the driver stops on this chunk: decoding the rest would only ask the registry again
                    return


def partition_runs(rb: Any) -> list[Any]:
    """``rb`` cut where its (topic, partition) changes: every slice a worker decodes holds one Kafka partition.

    A Spark partition of a small micro-batch carries several Kafka partitions one after another
    (:func:`applier.pipeline.read_chunks` coalesces them), and Spark's Arrow batches do not stop at their seams. A
    slice must not mix them: an error names its record by offset within the slice (:func:`_bad_record`), and
    Simple's workers use a schema learnt in their own slice only for that partition's later rows. Two vectorised
    comparisons per batch; a batch of one partition (every batch of an uncoalesced read) comes back whole."""
    import pyarrow.compute as pc

    n = rb.num_rows
    if n < 2:
        return [rb]
    topics, parts = rb.column(0), rb.column(1)
    seams = pc.or_(pc.not_equal(parts.slice(1), parts.slice(0, n - 1)),
                   pc.not_equal(topics.slice(1), topics.slice(0, n - 1)))
    cuts = pc.indices_nonzero(seams).to_pylist()
    if not cuts:
        return [rb]
    bounds = [0, *(c + 1 for c in cuts), n]
    return [rb.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]


def warm_decoder(spec: WorkerSpec, batches: Iterator[Any]) -> Iterator[Any]:
    """``mapInArrow`` body of the start-up warm-up: build this worker's decoder (its imports and caches) and
    yield nothing, so the first micro-batch finds Python workers that are already up (Spark reuses them)."""
    worker_decoder(spec)
    for _ in batches:
        pass
    return iter(())


def _bad_record(part: Any, exc: DecodeError) -> KafkaMessage:
    """The record an error names. These decoders raise for the message being decoded, so its offset is in the
    slice (one Spark partition: one topic-partition); anything else is a bug and fails the task loudly."""
    i = part.column(2).to_pylist().index(exc.position.offset)
    return KafkaMessage(*(part.column(c)[i].as_py() for c in range(5)))


# ---- which applier the workers run -------------------------------------------------------------------------

def package_digest() -> str:
    """A digest of the applier's own source files, the same whether the package is a folder or a zip that Spark
    shipped (``importlib.resources`` reads both): on a cluster the driver compares it with what each executor
    imported, because a worker with other decoding code would apply other values without any error."""
    import hashlib
    from importlib.resources import files

    h = hashlib.sha256()

    def walk(node: Any, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            name = f"{prefix}{child.name}"
            if child.is_dir():
                if child.name != "__pycache__":
                    walk(child, name + "/")
            elif child.name.endswith((".py", ".json")):
                h.update(name.encode() + b"\0" + child.read_bytes() + b"\0")

    walk(files("applier"), "")
    return h.hexdigest()[:16]


def worker_identity(spec: WorkerSpec | None, _index: int) -> tuple[str, int, str, str, str]:
    """Run by the start-up check on the executors: builds the pipeline's decoder when the executors will decode
    (so a missing dependency of the codec fails here, not in the first micro-batch) and says where this worker
    runs and which applier it has."""
    import os
    import socket
    import sys

    import pyarrow  # noqa: F401  (mapInArrow needs it in every worker)

    import applier

    if spec is not None:
        get_decoder(spec.protocol, **dict(spec.options))
    return socket.gethostname(), os.getpid(), sys.executable, applier.__file__ or "?", package_digest()


# ---- containing a decoder that crashes its process -----------------------------------------------------------

def worker_crashed(exc: BaseException) -> bool:
    """Whether a Spark job failed because a Python worker process died (a native fault while decoding), as
    opposed to an error the decoder raised."""
    text = str(exc)
    return "Python worker exited unexpectedly" in text or ("Python worker" in text and "crashed" in text)


KILLED = "killed the decoder process"  # in every reason of such a message (crash positions are found by it)


def killed_reason(how: str) -> str:
    return (f"decoding this message {KILLED} ({how}); it was found by decoding the micro-batch again in child "
            "processes")


def decode_isolated(spec: WorkerSpec, messages: list[KafkaMessage]) -> list[bytes]:
    """Decode ``messages`` in child processes and return chunks as the workers would, with every message whose
    decoding kills the process turned into a DecodeError naming its position.

    Why: one message that crashes the decoder (a segfault in a native library) would otherwise fail every retry
    of its micro-batch, with no position, for good. Order is kept (see :func:`_bisect`), so the chunks
    concatenate to the batch's order."""
    chunks: list[bytes] = []

    def killed(msg: KafkaMessage, how: str) -> None:
        err = DecodeError(msg.position, killed_reason(how), protocol=spec.protocol)
        chunks.append(encode_chunk(Decoded(messages=1, errors=[(msg, err)])))

    _bisect(spec, list(messages), chunks.append, killed)
    return chunks


def find_killers(spec: WorkerSpec, messages: list[KafkaMessage]) -> list[tuple[KafkaMessage, str]]:
    """The messages whose decoding kills a process, each with how it died, in order.

    Decode errors and events are of no interest here: a decoder that keeps a schema across messages will refuse
    some messages in a child that starts with empty caches, which is not a crash (so every message is tried)."""
    found: list[tuple[KafkaMessage, str]] = []
    _bisect(replace(spec, stop_at_error=False), list(messages), lambda _chunk: None,
            lambda msg, how: found.append((msg, how)))
    return found


def _bisect(spec: WorkerSpec, messages: list[KafkaMessage], ok: Callable[[bytes], None],
            killed: Callable[[KafkaMessage, str], None]) -> None:
    """Decode in a child; if it dies, each half is tried, down to the single messages that kill it. Left half
    first, so ``ok`` and ``killed`` are called in message order. About two child starts per halving, only after
    a crash."""
    if not messages:
        return
    out, how = _decode_in_child(spec, messages)
    if out is not None:
        ok(out)
    elif len(messages) == 1:
        killed(messages[0], how)
    else:
        mid = len(messages) // 2
        _bisect(spec, messages[:mid], ok, killed)
        _bisect(spec, messages[mid:], ok, killed)


def _decode_in_child(spec: WorkerSpec, messages: list[KafkaMessage]) -> tuple[bytes | None, str]:
    import os
    import signal
    import subprocess
    import sys

    payload = pickle.dumps((spec, messages), protocol=5)
    proc = subprocess.run([sys.executable, "-c", "from applier.decode import _child_main; _child_main()"],
                          input=payload, capture_output=True, env=os.environ.copy())
    if proc.returncode == 0 and proc.stdout:
        return proc.stdout, ""
    if proc.returncode < 0:
        try:
            how = f"signal {signal.Signals(-proc.returncode).name}"
        except ValueError:
            how = f"signal {-proc.returncode}"
    else:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()
        how = f"exit {proc.returncode}" + (f": {tail[-1][:200]}" if tail else "")
    return None, how


def _child_main() -> None:
    """The child of :func:`decode_isolated`: (spec, records) pickled on stdin, one chunk on stdout."""
    import sys

    spec, msgs = pickle.loads(sys.stdin.buffer.read())
    decoder = get_decoder(spec.protocol, **dict(spec.options))
    try:
        chunk = decode_slice(decoder, spec, msgs, _worker_mode(decoder, spec))
    except DecodeError as exc:
        bad = next(m for m in msgs if m.partition == exc.position.partition and m.offset == exc.position.offset)
        chunk = encode_chunk(Decoded(errors=[(bad, exc)]))
    sys.stdout.buffer.write(chunk)
    sys.stdout.flush()
