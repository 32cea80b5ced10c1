"""Simple decodes in Spark's Python workers with a snapshot of the driver's schemas (applier.codecs.simple, module
docstring; applier.decode.decode_chunks). Differential: random Simple streams (JSON and Avro, started mid-stream or
not, BOOTSTRAPs every few transactions, an ALTER changing a schema, replays, bad and forged messages), cut into
random micro-batches and random worker slices decoded by several worker "processes" with snapshots that lag a
batch or are cut short, must rebuild in the driver into exactly what the driver decodes alone: the same events in
the same order (values, types, columns, sizes), the same empty offsets and errors, and after every batch the same
held offsets and lowest held commit ts."""

from __future__ import annotations

import pickle
import random

import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import applier.decode as D
from applier.codecs import WORKER_CHECK, WORKER_DONE, WORKER_RAW, decodes_alone, decodes_on_workers, get_decoder
from applier.codecs.simple import SchemaSnapshot, SimpleDecoder
from applier.config import parse_config
from applier.devtools.changefeed import generate
from applier.events import DecodeError, KafkaMessage, RowChange
from tests.unit.helpers import same_events

TOPIC = "t"


# ---- streams ------------------------------------------------------------------------------------------------

def _stream(rng: random.Random, encoding: str, *, mid_stream: bool, bad: bool) -> tuple[list[list[bytes]], dict]:
    """Per partition, the record values of a generated Simple changefeed (with injected bad records when ``bad``),
    and the codec options."""
    parts = rng.choice((1, 2, 3))
    wl = generate(encoding, partitions=parts, txns=rng.randint(8, 45), seed=rng.randrange(1 << 30),
                  replays=rng.randint(0, 2), mid_stream=mid_stream, bootstrap_every=rng.choice((0, 3, 7, 15)))
    per: list[list[bytes]] = [[] for _ in range(parts)]
    for part, key, value in wl.messages:
        assert key is None
        per[part].append(value)
    options = dict(wl.codec)
    if rng.random() < 0.2:
        options["max_held_messages_per_table"] = rng.randint(3, 30)
    if bad:
        for _ in range(rng.randint(1, 4)):
            p = rng.randrange(parts)
            per[p].insert(rng.randint(0, len(per[p])), _bad_value(rng, encoding, per))
    return per, options


def _bad_value(rng: random.Random, encoding: str, per: list[list[bytes]]) -> bytes:
    if encoding != "simple":
        return rng.choice((b"\x16garbage", b"{}", b"\x16" + bytes(rng.randrange(256) for _ in range(20))))
    docs = [d for vs in per for v in vs if type(d := _json(v)) is dict and "type" in d]
    kind = rng.choice(("garbage", "value", "future-dml", "future-watermark", "other-schema", "unknown-column"))
    dmls = [d for d in docs if d["type"] in ("INSERT", "UPDATE", "DELETE")]
    boots = [d for d in docs if d["type"] == "BOOTSTRAP"]
    if kind == "garbage" or not dmls:
        return b"{not json"
    d = dict(rng.choice(dmls))
    if kind == "value":  # a value its column cannot take: an error at once, or when a held row is released
        img = "data" if d.get("data") else "old"
        d[img] = dict(d[img], id="not a number")
    elif kind == "unknown-column":
        img = "data" if d.get("data") else "old"
        d[img] = dict(d[img], no_such_column="1")
    elif kind == "future-dml":  # a commit ts beyond 63 bits: untrusted (applier.clock)
        d["commitTs"] = 2**63 + 5
    elif kind == "future-watermark":
        d = {"version": 1, "type": "WATERMARK", "commitTs": 2**63 + 7, "buildTs": 0}
    elif kind == "other-schema" and boots:
        # a BOOTSTRAP claiming an existing (schema, table, version) with other columns: the first copy the driver
        # meets wins, so a worker that learnt the other one must not decide
        d = orjson.loads(orjson.dumps(rng.choice(boots)))
        for c in d["tableSchema"]["columns"]:
            if c["name"] != "id":
                c["nullable"] = not c["nullable"]
    return orjson.dumps(d)


def _json(v: bytes):
    try:
        return orjson.loads(v)
    except orjson.JSONDecodeError:
        return None


def _kafka(per: list[list[bytes]]) -> list[list[KafkaMessage]]:
    return [[KafkaMessage(TOPIC, p, off, None, v) for off, v in enumerate(vs)] for p, vs in enumerate(per)]


def _batches(rng: random.Random, per: list[list[KafkaMessage]]) -> list[list[list[KafkaMessage]]]:
    """Random micro-batches: per batch, per partition (in a random order) a run of its records."""
    n = rng.randint(1, 6)
    cuts = []
    for msgs in per:
        inner = sorted(rng.randint(0, len(msgs)) for _ in range(n - 1))
        cuts.append([0, *inner, len(msgs)])
    out = []
    for b in range(n):
        order = list(range(len(per)))
        rng.shuffle(order)
        out.append([per[p][cuts[p][b]:cuts[p][b + 1]] for p in order if cuts[p][b] < cuts[p][b + 1]])
    return out


# ---- the two ways to decode ----------------------------------------------------------------------------------

def _map(rng: random.Random, batch: list[list[KafkaMessage]], snap: SchemaSnapshot | None, options: dict,
         workers: list[SimpleDecoder]) -> list[bytes]:
    """The chunks Spark's workers would send back: each partition's run cut into random slices, each decoded by a
    random worker process (they keep what they learnt across tasks and batches)."""
    spec = D.WorkerSpec("simple", tuple(sorted(options.items())), False, None, schemas=snap)
    if rng.random() < 0.5:
        spec = pickle.loads(pickle.dumps(spec))  # as the workers get it
    chunks = []
    for msgs in batch:
        i = 0
        while i < len(msgs):
            j = min(len(msgs), i + rng.randint(1, max(1, len(msgs) // 2 + 1)))
            w = rng.choice(workers)
            chunks.append(D.decode_slice(w, spec, msgs[i:j], D._worker_mode(w, spec)))
            i = j
    return chunks


def _same(got: D.Decoded, want: D.Decoded) -> None:
    assert got.messages == want.messages
    same_events(got.events, want.events)
    assert got.empty == want.empty
    assert [(m, str(e), e.position, e.held_message, e.table, e.rowless) for m, e in got.errors] == \
           [(m, str(e), e.position, e.held_message, e.table, e.rowless) for m, e in want.errors]


def _held(d: SimpleDecoder) -> tuple:
    return d.held_offsets(), d.held_min_commit_ts(), d.held_count()


def _differential(seed: int, encoding: str, mid_stream: bool, bad: bool, stop_at_error: bool) -> dict:
    rng = random.Random(seed)
    per, options = _stream(rng, encoding, mid_stream=mid_stream, bad=bad)
    batches = _batches(rng, _kafka(per))
    alone = get_decoder("simple", **options)  # the driver decoding everything itself
    driver = get_decoder("simple", **options)  # the driver with workers
    workers = [get_decoder("simple", **options) for _ in range(rng.randint(1, 3))]
    snap = driver.schema_snapshot()
    seen = {"batches": 0, "worker_events": 0, "raw": 0, "check": 0}
    for batch in batches:
        if rng.random() < 0.6:  # else the snapshot taken while the previous batch was still being applied
            snap = driver.schema_snapshot()
        if rng.random() < 0.15:
            snap = driver.schema_snapshot(limit=rng.choice((0, 200, 600)))  # cut short: older versions stay behind
        if rng.random() < 0.1:
            snap = None  # (decode_isolated's children and the crash search run with none)
        chunks = _map(rng, batch, snap, options, workers)
        for c in chunks:
            left = pickle.loads(c)[-1]
            if left is not None:
                seen["raw"] += left.kinds.count(WORKER_RAW)
                seen["check"] += left.kinds.count(WORKER_CHECK)
        flat = [m for msgs in batch for m in msgs]
        try:
            want = D.decode_messages(alone, flat, stop_at_error=stop_at_error)
        except DecodeError as exc:
            with pytest.raises(DecodeError) as err:
                D.decode_chunks(chunks, {}, driver, stop_at_error=True)
            assert (str(err.value), err.value.position, err.value.held_message) == \
                   (str(exc), exc.position, exc.held_message)
            seen["stopped"] = True
            return seen
        got = D.decode_chunks(chunks, {}, driver, stop_at_error=stop_at_error)
        _same(got, want)
        assert _held(driver) == _held(alone)
        seen["batches"] += 1
        seen["worker_events"] += len(got.events)
    return seen


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), encoding=st.sampled_from(["simple", "simple-avro"]), mid_stream=st.booleans(),
       bad=st.booleans())
def test_workers_and_driver_decode_exactly_what_the_driver_decodes_alone(seed, encoding, mid_stream, bad) -> None:
    _differential(seed, encoding, mid_stream, bad, stop_at_error=False)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32), encoding=st.sampled_from(["simple", "simple-avro"]), mid_stream=st.booleans())
def test_in_stop_mode_the_same_first_error_stops_both(seed, encoding, mid_stream) -> None:
    _differential(seed, encoding, mid_stream, True, stop_at_error=True)


@pytest.mark.parametrize("encoding", ["simple", "simple-avro"])
def test_the_workers_do_the_bulk_and_the_driver_only_the_leftovers(encoding) -> None:
    """With the driver's schemas known, every row and watermark is decoded by the workers; from a cold start they
    learn the schemas from the BOOTSTRAPs of their own slices and the driver confirms them."""
    wl = generate(encoding, partitions=3, txns=120, seed=11, replays=1, bootstrap_every=40)
    per = [[] for _ in range(3)]
    for part, _key, value in wl.messages:
        per[part].append(value)
    msgs = _kafka(per)
    flat = [m for ms in msgs for m in ms]
    options = dict(wl.codec)
    driver, alone = get_decoder("simple", **options), get_decoder("simple", **options)
    worker = get_decoder("simple", **options)

    def run(snap):
        spec = D.WorkerSpec("simple", tuple(sorted(options.items())), False, schemas=snap)
        chunks = [D.decode_slice(worker, spec, ms, D._worker_mode(worker, spec)) for ms in msgs]
        kinds = b"".join(pickle.loads(c)[-1].kinds for c in chunks)
        return chunks, kinds

    chunks, kinds = run(driver.schema_snapshot())  # cold: the snapshot is empty
    assert kinds.count(WORKER_CHECK) > len(flat) // 2  # learnt from the slices' own BOOTSTRAP/CREATE messages
    _same(D.decode_chunks(chunks, {}, driver), D.decode_messages(alone, flat, stop_at_error=False))
    snap = driver.schema_snapshot()
    assert snap.tables == 4 and driver.schema_snapshot() is snap  # orders v1, v2; customers; audit_log
    chunks, kinds = run(snap)  # warm: the same stream again (a replay): only BOOTSTRAP/DDL are left
    boot_ddl = sum(1 for m in flat if _kind(encoding, m.value) in ("BOOTSTRAP", "DDL"))
    assert kinds.count(WORKER_RAW) == boot_ddl and kinds.count(WORKER_CHECK) == 0
    _same(D.decode_chunks(chunks, {}, driver), D.decode_messages(alone, flat, stop_at_error=False))


def _kind(encoding: str, value: bytes) -> str:
    if encoding == "simple":
        t = orjson.loads(value)["type"]
        return t if t in ("BOOTSTRAP", "WATERMARK") else "DML" if t in ("INSERT", "UPDATE", "DELETE") else "DDL"
    return SimpleDecoder(encoding_format="avro")._parse(KafkaMessage("t", 0, 0, None, value)).kind


def test_a_worker_event_of_a_schema_the_driver_has_otherwise_is_decoded_again_by_the_driver() -> None:
    """Two BOOTSTRAPs claim one (schema, table, version) with other columns. The driver keeps the first it met
    (partition 0's); a worker that decoded partition 1 learnt the other one: the driver decodes those rows itself."""
    wl = generate("simple", partitions=1, txns=10, seed=2, replays=0, bootstrap_every=0)
    values = [v for _p, _k, v in wl.messages]
    boot = next(orjson.loads(v) for v in values if orjson.loads(v)["type"] == "BOOTSTRAP"
                and orjson.loads(v)["tableSchema"]["table"] == "orders")
    for c in boot["tableSchema"]["columns"]:
        c["nullable"] = True
    p0 = [KafkaMessage(TOPIC, 0, 0, None, orjson.dumps(boot))]
    p1 = [KafkaMessage(TOPIC, 1, i, None, v) for i, v in enumerate(values)]
    driver, alone, worker = (get_decoder("simple") for _ in range(3))
    spec = D.WorkerSpec("simple", (), False, schemas=driver.schema_snapshot())
    chunks = [D.decode_slice(worker, spec, ms, D._worker_mode(worker, spec)) for ms in (p0, p1)]
    got = D.decode_chunks(chunks, {}, driver)
    want = D.decode_messages(alone, p0 + p1, stop_at_error=False)
    _same(got, want)
    assert WORKER_CHECK in pickle.loads(chunks[1])[-1].kinds  # the worker decoded rows with what it learnt...
    orders = [e for e in got.events if isinstance(e, RowChange) and e.table == "orders"]
    # ...but the rows of that version carry the driver's first copy (the rows after the ALTER have a version of
    # their own)
    assert sum(all(c.nullable for c in e.columns) for e in orders) > 5


def test_held_rows_failing_on_release_in_front_of_worker_events_keep_the_driver_semantics() -> None:
    """Mid-stream rows are held in the driver; one of them is bad. The BOOTSTRAP that releases them raises for it
    (held_message), and the rows released before it come out with the next record: here, in the next batch, a
    worker's event, which the driver passes through accept()."""
    wl = generate("simple", partitions=1, txns=30, seed=5, replays=0, mid_stream=True, bootstrap_every=10)
    values = [v for _p, _k, v in wl.messages]
    docs = [orjson.loads(v) for v in values]
    boot = next(i for i, d in enumerate(docs) if d["type"] == "BOOTSTRAP" and d["tableSchema"]["table"] == "orders")
    held = [i for i, d in enumerate(docs[:boot]) if d["type"] == "INSERT" and d["table"] == "orders"]
    assert len(held) > 3
    bad_at = held[2]
    docs[bad_at]["data"]["amount"] = "not a number"
    values[bad_at] = orjson.dumps(docs[bad_at])
    mark = next(v for v, d in zip(values[boot::-1], docs[boot::-1]) if d["type"] == "WATERMARK")
    values.insert(boot + 1, mark)  # a watermark again right after the BOOTSTRAP: a worker decodes it
    msgs = [KafkaMessage(TOPIC, 0, i, None, v) for i, v in enumerate(values)]
    driver, alone = get_decoder("simple"), get_decoder("simple")
    cut = boot + 1  # the batch ends with the BOOTSTRAP; the next one starts with worker-decoded records
    errors = []
    for lo, hi in ((0, cut), (cut, len(msgs))):
        spec = D.WorkerSpec("simple", (), False, schemas=driver.schema_snapshot())
        worker = get_decoder("simple")
        worker.seed(spec.schemas)
        chunk = D.decode_slice(worker, spec, msgs[lo:hi], True)
        want = D.decode_messages(alone, msgs[lo:hi], stop_at_error=False)
        got = D.decode_chunks([chunk], {}, driver)
        _same(got, want)
        assert _held(driver) == _held(alone)
        errors += got.errors
        if lo:
            assert 0 not in pickle.loads(chunk)[-1].at  # the batch's first record was decoded by the worker
            assert got.events[0].position.offset < cut  # and the rows left from the BOOTSTRAP's call came first
    assert [(m.offset, e.held_message.offset) for m, e in errors] == [(bad_at, bad_at)]


class _Marker:
    def __init__(self) -> None:
        self.armed: list[list[tuple[int, int]]] = []
        self.disarmed = 0

    def arm(self, msgs, batch: str = "") -> None:
        self.armed.append([(m.partition, m.offset) for m in msgs])

    def disarm(self) -> None:
        self.disarmed += 1


def test_the_driver_decodes_the_leftovers_under_its_crash_guard() -> None:
    """The marker is armed with exactly the records the driver decodes (the leftovers), and a record known to kill
    the decoder is not decoded but becomes its error, as DriverDecodeGuard does for a driver-decoded batch."""
    from applier.crashguard import DriverDecodeGuard

    wl = generate("simple", partitions=1, txns=20, seed=3, replays=0, bootstrap_every=0)
    msgs = [KafkaMessage(TOPIC, 0, i, None, v) for i, (_p, _k, v) in enumerate(wl.messages)]
    killer = next(m for m in msgs if orjson.loads(m.value)["type"] == "CREATE")
    poison = {(killer.topic, killer.partition, killer.offset): "decoding this message killed the decoder process"}
    driver = get_decoder("simple")
    spec = D.WorkerSpec("simple", (), False, schemas=driver.schema_snapshot())
    worker = get_decoder("simple")
    chunk = D.decode_slice(worker, spec, msgs, D._worker_mode(worker, spec))
    marker = _Marker()
    guard = DriverDecodeGuard(marker, poison, "simple")  # type: ignore[arg-type]
    got = D.decode_chunks([chunk], {}, driver, guard=guard)
    left = pickle.loads(chunk)[-1]
    assert marker.armed == [[(m.partition, m.offset) for m in left.raw]] and marker.disarmed == 1
    ref_marker = _Marker()
    want = DriverDecodeGuard(ref_marker, poison, "simple").decode(get_decoder("simple"), msgs,  # type: ignore
                                                                 stop_at_error=False)
    _same(got, want)
    assert [m.offset for m, _e in got.errors] == [killer.offset]


def test_decode_arrow_batches_and_decode_isolated_send_leftovers_for_simple() -> None:
    """The Spark entry points: the same chunks from mapInArrow's body and from decode_isolated's children."""
    wl = generate("simple", partitions=1, txns=15, seed=8, replays=0)
    msgs = [KafkaMessage(TOPIC, 0, i, None, v) for i, (_p, _k, v) in enumerate(wl.messages)]
    driver = get_decoder("simple")
    D.decode_messages(driver, msgs[: len(msgs) // 2], stop_at_error=False)  # the driver knows the schemas
    rest = msgs[len(msgs) // 2:]
    spec = D.with_schemas(D.WorkerSpec("simple", (), False), driver)
    assert spec.schemas is not None and spec.schemas.tables >= 3
    rb = pa.RecordBatch.from_pylist([{"topic": m.topic, "partition": m.partition, "offset": m.offset, "key": m.key,
                                      "value": m.value} for m in rest])
    chunks = [c for out in D.decode_arrow_batches(spec, iter([rb])) for c in out.column(0).to_pylist()]
    left = pickle.loads(chunks[0])[-1]
    assert left.origin == driver.origin and WORKER_DONE not in left.kinds
    assert len(left.raw) < len(rest) // 4  # the rows and watermarks were decoded by the worker
    with pytest.raises(ValueError, match="decode_chunks"):
        D.decode_chunk(chunks[0])
    isolated = D.decode_isolated(spec, rest)
    alone = get_decoder("simple")
    D.decode_messages(alone, msgs[: len(msgs) // 2], stop_at_error=False)
    want = D.decode_messages(alone, rest, stop_at_error=False)
    twin = get_decoder("simple")
    D.decode_messages(twin, msgs[: len(msgs) // 2], stop_at_error=False)
    _same(D.decode_chunks(chunks, {}, driver), want)
    # decode_isolated's children were seeded with the other driver's snapshot: rebuild with a decoder of that origin
    twin.origin = driver.origin
    _same(D.decode_chunks(isolated, {}, twin), want)


def test_snapshots_are_cached_by_version_bounded_and_safe_to_pickle() -> None:
    wl = generate("simple", partitions=2, txns=60, seed=4, replays=0, bootstrap_every=20)
    msgs = [KafkaMessage(TOPIC, p, i, None, v) for i, (p, _k, v) in enumerate(wl.messages)]
    driver = get_decoder("simple")
    empty = driver.schema_snapshot()
    assert empty.tables == 0 and driver.schema_snapshot() is empty
    D.decode_messages(driver, msgs, stop_at_error=False)
    full = driver.schema_snapshot()
    assert full is not empty and full.version > empty.version and full.tables == 4
    assert driver.schema_snapshot() is full  # unchanged cache: the same bytes, not rebuilt
    back = pickle.loads(pickle.dumps(full))
    assert back.entries() == full.entries()
    assert len(full.data) < 600  # about 90 bytes per table here
    small = driver.schema_snapshot(limit=len(full.data) - 1)
    assert 0 < small.tables < full.tables and len(small.data) < len(full.data)
    assert driver.schema_snapshot() is full
    # the newest version of each table first: orders' newest version (after the ALTER) is kept, its older one not
    kept = {(s, t, v) for s, t, v, _id, _cols in small.entries()}
    newest = max(v for s, t, v, _id, _cols in full.entries() if t == "orders")
    assert ("shop", "orders", newest) in kept


def test_simple_decodes_on_executors_with_its_crash_guard_in_the_driver() -> None:
    from applier.pipeline import DecodePlacement

    assert not decodes_alone("simple") and decodes_on_workers("simple")

    def cfg(decode_on):
        pipeline = {"name": "p", "checkpoint_dir": "/tmp/x", **({"decode_on": decode_on} if decode_on else {})}
        return parse_config({"pipeline": pipeline, "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"],
                                                              "protocol": "simple"},
                             "target": {"url": "postgresql+psycopg://u@127.0.0.1/db"}})

    pinned = DecodePlacement.for_settings(cfg("executors"))
    pinned.saw(1)
    assert pinned.executors and pinned.on_executors() and pinned.driver  # leftovers: the guard is needed
    assert pinned.describe() == "Spark's Python workers"
    auto = DecodePlacement.for_settings(cfg(None))
    assert auto.executors and auto.driver and auto.on_executors()
    auto.saw(1)
    assert not auto.on_executors()
    driver = DecodePlacement.for_settings(cfg("driver"))
    assert not driver.executors and driver.driver and not driver.on_executors()


def test_a_worker_never_holds_and_never_raises() -> None:
    worker = get_decoder("simple")
    worker.seed(None)
    for value in (b"", b"{not json", b'{"version": 1, "type": "INSERT", "database": "s", "table": "t", '
                  b'"commitTs": 5, "schemaVersion": 1, "data": {"id": "1"}}'):
        assert worker.decode_in_worker(KafkaMessage(TOPIC, 0, 0, None, value)) == (WORKER_RAW, None, None, None)
    assert worker.held_count() == 0 and worker.held_offsets() == {}
