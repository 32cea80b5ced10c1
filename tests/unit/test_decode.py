"""The decode stage in Spark's Python workers (applier.decode), without Spark: what the workers send back must
rebuild into exactly the events, empty offsets and errors the driver would have decoded itself, in order."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

import applier.decode as D
from applier.codecs import decodes_alone, get_decoder
from applier.config import ConfigError, parse_config
from applier.events import DDL, DecodeError, KafkaMessage, Resolved, RowChange, SourcePosition
from applier.devtools.changefeed import generate
from tests.unit.helpers import same_events

OPTIONS = {"open": (), "canal-json": ()}


def _messages(protocol: str, *, partitions: int = 2, txns: int = 60, seed: int = 5) -> list[KafkaMessage]:
    wl = generate(protocol, partitions=partitions, txns=txns, seed=seed, replays=2)
    per_part: dict[int, int] = {}
    out = []
    for part, key, value in wl.messages:
        off = per_part.get(part, 0)
        per_part[part] = off + 1
        out.append(KafkaMessage("t", part, off, key, value))
    return out


def _batch(msgs: list[KafkaMessage]) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [pa.array([m.topic for m in msgs], pa.string()), pa.array([m.partition for m in msgs], pa.int32()),
         pa.array([m.offset for m in msgs], pa.int64()), pa.array([m.key for m in msgs], pa.binary()),
         pa.array([m.value for m in msgs], pa.binary())],
        names=["topic", "partition", "offset", "key", "value"])


def _on_workers(protocol: str, msgs: list[KafkaMessage], *, stop_at_error: bool, slices: int = 1) -> D.Decoded:
    """What the driver rebuilds from the chunks of ``msgs`` fed as ``slices`` record batches."""
    spec = D.WorkerSpec(protocol, OPTIONS[protocol], stop_at_error)
    step = max(1, len(msgs) // slices)
    batches = [_batch(msgs[i:i + step]) for i in range(0, len(msgs), step)]
    out = D.Decoded()
    interned: dict = {}
    for rb in D.decode_arrow_batches(spec, iter(batches)):
        assert rb.schema.names == ["chunk"]
        for chunk in rb.column(0).to_pylist():
            out.extend(D.decode_chunk(chunk, interned))
    return out


@pytest.mark.parametrize("protocol", ["open", "canal-json"])
@pytest.mark.parametrize("chunk_messages", [2048, 7])
def test_worker_chunks_rebuild_the_driver_decode_in_order(protocol, chunk_messages, monkeypatch) -> None:
    monkeypatch.setattr(D, "CHUNK_MESSAGES", chunk_messages)
    msgs = _messages(protocol)
    want = D.decode_messages(get_decoder(protocol), msgs, stop_at_error=True)
    got = _on_workers(protocol, msgs, stop_at_error=True, slices=3)
    assert got.messages == want.messages == len(msgs)
    assert {type(e) for e in want.events} >= {RowChange, DDL, Resolved}
    assert all(e.size > 0 for e in want.events if isinstance(e, (RowChange, DDL)))
    same_events(got.events, want.events)
    assert got.empty == want.empty and got.errors == want.errors == []


def test_rebuilt_events_share_column_tuples_across_chunks(monkeypatch) -> None:
    monkeypatch.setattr(D, "CHUNK_MESSAGES", 5)
    got = _on_workers("canal-json", _messages("canal-json"), stop_at_error=True)
    rows = [e for e in got.events if isinstance(e, RowChange)]
    by_table: dict = {}
    for e in rows:
        by_table.setdefault((e.table, e.columns), set()).add(id(e.columns))
    assert all(len(ids) == 1 for ids in by_table.values())


def _with_garbage(msgs: list[KafkaMessage], at: int) -> list[KafkaMessage]:
    m = msgs[at]
    out = list(msgs)
    out[at] = KafkaMessage(m.topic, m.partition, m.offset, m.key, b"{not json")
    return out


def test_bad_record_comes_back_with_its_bytes_and_later_records_still_decode() -> None:
    msgs = _with_garbage(_messages("canal-json"), 10)
    got = _on_workers("canal-json", msgs, stop_at_error=False)
    assert [(m.offset, m.value) for m, _ in got.errors] == [(msgs[10].offset, b"{not json")]
    exc = got.errors[0][1]
    assert isinstance(exc, DecodeError) and exc.position == msgs[10].position and "not valid JSON" in exc.reason
    want = D.decode_messages(get_decoder("canal-json"), msgs, stop_at_error=False)
    same_events(got.events, want.events)


def test_in_stop_mode_the_first_bad_record_is_what_the_driver_raises() -> None:
    msgs = _with_garbage(_with_garbage(_messages("open"), 7), 12)
    got = _on_workers("open", msgs, stop_at_error=True)
    # each partition's slice stops at its own first bad record; the driver raises the first in Kafka order
    assert got.errors[0][0].position == msgs[7].position
    with pytest.raises(DecodeError) as err:
        D.decode_messages(get_decoder("open"), msgs, stop_at_error=True)
    assert str(got.errors[0][1]) == str(err.value)


def test_partition_runs_cut_a_batch_at_each_change_of_topic_or_partition() -> None:
    msgs = [KafkaMessage(t, p, o, None, b"") for t, p, o in
            [("t", 0, 0), ("t", 0, 1), ("t", 1, 0), ("u", 1, 0), ("u", 1, 1), ("t", 0, 2)]]
    runs = D.partition_runs(_batch(msgs))
    assert [(r.column(0).to_pylist(), r.column(1).to_pylist(), r.column(2).to_pylist()) for r in runs] == [
        (["t", "t"], [0, 0], [0, 1]), (["t"], [1], [0]), (["u", "u"], [1, 1], [0, 1]), (["t"], [0], [2])]
    one = _batch(msgs[:2])
    assert D.partition_runs(one) == [one] and D.partition_runs(one)[0] is one  # the usual batch: no copy, no cut
    for few in (_batch(msgs[:1]), _batch([])):
        assert D.partition_runs(few) == [few]


def test_a_coalesced_batch_names_the_bad_record_of_its_own_partition() -> None:
    """A Spark task of a small batch reads several Kafka partitions (pipeline.read_chunks coalesces them) and its
    Arrow batch runs across their seam; partitions reuse offsets, so the error must come back with the record of
    the partition it names, not the first record with that offset."""
    good = [m for m in _messages("canal-json", partitions=2) if m.partition == 0][:5]
    other = [KafkaMessage("t", 1, m.offset, m.key, m.value) for m in good]
    other[2] = KafkaMessage("t", 1, other[2].offset, None, b"{not json")
    got = _on_workers("canal-json", good + other, stop_at_error=True)
    assert [(m.partition, m.offset, m.value) for m, _ in got.errors] == [(1, other[2].offset, b"{not json")]
    assert got.errors[0][1].position == other[2].position
    want = D.decode_messages(get_decoder("canal-json"), good, stop_at_error=True)
    same_events(got.events, want.events)  # partition 1's slice comes back as its error alone (stop mode)


def test_a_wrong_protocol_is_named_by_the_worker_too() -> None:
    msgs = _messages("canal-json")[:3]
    got = _on_workers("open", msgs, stop_at_error=True)
    assert 'source.protocol = "canal-json"' in got.errors[0][1].reason


def test_decode_error_survives_pickling_with_every_attribute() -> None:
    e = DecodeError(SourcePosition("t", 1, 9), "bad", protocol="simple")
    e.held_message = KafkaMessage("t", 1, 4, None, b"x")  # type: ignore[attr-defined]
    back = pickle.loads(pickle.dumps(e))
    assert (str(back), back.position, back.reason, back.protocol) == (str(e), e.position, e.reason, e.protocol)
    assert back.held_message == e.held_message


def test_a_chunk_from_another_format_version_is_refused() -> None:
    data = pickle.dumps((99, 0, [], b"", b"", [], []))
    with pytest.raises(ValueError, match="same one"):
        D.decode_chunk(data)


def test_only_protocols_that_decode_message_by_message_run_on_executors() -> None:
    assert all(decodes_alone(p) for p in ("open", "canal-json", "debezium", "avro"))
    assert not any(decodes_alone(p) for p in ("simple", "nope"))


def _cfg(protocol: str, decode_on: str | None) -> dict:
    pipeline = {"name": "p", "checkpoint_dir": "/tmp/x"}
    if decode_on is not None:
        pipeline["decode_on"] = decode_on
    return {"pipeline": pipeline, "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"],
                                              "protocol": protocol},
            "target": {"url": "postgresql+psycopg://u@127.0.0.1/db"}}


def test_decode_on_setting() -> None:
    assert parse_config(_cfg("canal-json", None)).decodes_on_executors()
    assert not parse_config(_cfg("canal-json", "driver")).decodes_on_executors()
    # Simple decodes in the workers with the driver's schemas (tests/unit/test_decode_simple_workers.py)
    assert parse_config(_cfg("simple", None)).decodes_on_executors()
    assert parse_config(_cfg("simple", "executors")).decodes_on_executors()
    assert not parse_config(_cfg("simple", "driver")).decodes_on_executors()
    with pytest.raises(ConfigError, match="pipeline.decode_on"):
        parse_config(_cfg("open", "workers"))


def test_auto_decodes_small_batches_in_the_driver_and_big_ones_in_the_workers() -> None:
    from applier.pipeline import COALESCE_BELOW_EVENTS, SMALL_BATCH_EVENTS, DecodePlacement

    auto = DecodePlacement.for_settings(parse_config(_cfg("canal-json", None)))
    assert auto.executors and auto.driver  # the driver needs its crash guard too
    assert auto.on_executors()  # the first batch: a restart usually starts with a backlog
    auto.saw(SMALL_BATCH_EVENTS - 1)
    assert not auto.on_executors()
    auto.saw(SMALL_BATCH_EVENTS)
    assert auto.on_executors()
    auto.saw(0)  # an idle live batch
    assert not auto.on_executors()
    assert auto.tasks(2) == 2 and auto.tasks(0) == 1  # a small batch: one Spark task per core
    auto.saw(COALESCE_BELOW_EVENTS)
    assert auto.tasks(2) is None  # catch-up: one task per Kafka partition
    assert DecodePlacement.for_settings(parse_config(_cfg("canal-json", None))).tasks(2) is None  # the first batch
    assert "driver" in auto.describe() and "workers" in auto.describe()

    pinned = DecodePlacement.for_settings(parse_config(_cfg("canal-json", "executors")))
    pinned.saw(1)
    assert pinned.on_executors() and not pinned.driver
    for driver_only in (parse_config(_cfg("canal-json", "driver")), parse_config(_cfg("simple", "driver"))):
        placement = DecodePlacement.for_settings(driver_only)
        assert not placement.on_executors() and placement.driver and not placement.executors
        assert placement.describe() == "the driver"


def test_the_warm_up_builds_the_decoder_and_yields_no_chunks() -> None:
    spec = D.WorkerSpec("canal-json", (), stop_at_error=True)
    D._worker_decoders.pop(repr(spec), None)
    assert list(D.warm_decoder(spec, iter([object(), object()]))) == []
    assert repr(spec) in D._worker_decoders


def test_records_without_events_come_back_as_offsets_for_the_gate() -> None:
    import struct

    msgs = _messages("open")[:20]
    m = msgs[4]
    msgs[4] = KafkaMessage(m.topic, m.partition, m.offset, struct.pack(">Q", 1), b"")  # a batch of no events
    got = _on_workers("open", msgs, stop_at_error=True)
    assert got.empty == [(m.topic, m.partition, m.offset)]
    assert m.position not in {e.position for e in got.events}



@pytest.mark.parametrize("options", [(), (("gated", True),)])
def test_debezium_decodes_alone_and_its_worker_chunks_rebuild_the_driver_decode(options, monkeypatch) -> None:
    """Debezium records carry their own schema envelope, so the workers may decode them: what comes back must be
    exactly what the driver decodes (values, types, column metadata, the inferred flags), in order."""
    monkeypatch.setattr(D, "CHUNK_MESSAGES", 13)
    monkeypatch.setitem(OPTIONS, "debezium", options)
    assert decodes_alone("debezium")
    wl = generate("debezium", partitions=2, txns=80, seed=3, replays=2)
    msgs = []
    per_part: dict[int, int] = {}
    for part, key, value in wl.messages:
        off = per_part.get(part, 0)
        per_part[part] = off + 1
        msgs.append(KafkaMessage("t", part, off, key, value))
    want = D.decode_messages(get_decoder("debezium", **dict(options)), msgs, stop_at_error=True)
    got = _on_workers("debezium", msgs, stop_at_error=True, slices=3)
    assert got.messages == want.messages == len(msgs)
    assert {type(e) for e in want.events} >= {RowChange, DDL}
    same_events(got.events, want.events)
    assert got.empty == want.empty and got.errors == want.errors == []


def _avro_messages(registry) -> list[KafkaMessage]:
    wl = generate("avro", partitions=2, txns=60, seed=4, replays=1, registry=registry, topic_prefix="av")
    out, offsets = [], {}
    for part, key, value, *topic in wl.messages:
        t = topic[0] if topic else "av"
        off = offsets.get((t, part), 0)
        offsets[(t, part)] = off + 1
        out.append(KafkaMessage(t, part, off, key, value))
    return out


def test_avro_decodes_alone_and_its_worker_chunks_rebuild_the_driver_decode(monkeypatch) -> None:
    """Avro messages depend on themselves and the registry's schema of the ids they name, so the workers decode
    them, each with its own registry client: what comes back must be exactly the driver's decode."""
    from applier.codecs.avro import AvroDecoder
    from applier.devtools.encoders.registry import InMemoryRegistry

    assert decodes_alone("avro")
    reg = InMemoryRegistry()
    msgs = _avro_messages(reg)
    monkeypatch.setattr(D, "CHUNK_MESSAGES", 11)
    monkeypatch.setitem(OPTIONS, "avro", ())
    spec = D.WorkerSpec("avro", (), True)
    monkeypatch.setitem(D._worker_decoders, repr(spec), AvroDecoder(registry=reg))  # this worker's client
    want = D.decode_messages(AvroDecoder(registry=reg), msgs, stop_at_error=True)
    got = _on_workers("avro", msgs, stop_at_error=True, slices=2)
    assert sum(type(e) is RowChange for e in want.events) > 100  # (flat Avro carries no DDL)
    same_events(got.events, want.events)
    assert got.empty == want.empty and got.errors == want.errors == []


def test_an_unreachable_registry_in_a_worker_stops_the_driver_with_the_registry_error(monkeypatch) -> None:
    from applier.codecs.avro import AvroDecoder
    from applier.codecs.registry import RegistryUnavailable
    from applier.devtools.encoders.registry import InMemoryRegistry

    msgs = _avro_messages(InMemoryRegistry())

    class Down:
        def schema_by_id(self, schema_id: int):
            raise RegistryUnavailable("cannot reach the schema registry at http://reg:8081 (connection refused)",
                                      url="http://reg:8081", status=None)

    monkeypatch.setitem(OPTIONS, "avro", ())
    spec = D.WorkerSpec("avro", (), False)
    monkeypatch.setitem(D._worker_decoders, repr(spec), AvroDecoder(registry=Down()))
    with pytest.raises(RegistryUnavailable) as err:
        _on_workers("avro", msgs, stop_at_error=False)
    assert "connection refused" in str(err.value) and err.value.url == "http://reg:8081"
    assert "message at topic=" in str(err.value)  # the context the decoder adds: which message needed it
