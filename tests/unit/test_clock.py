"""Invariant 15 (applier.clock): a ts ahead of this host's clock beyond source.max_clock_skew, or one that does not
fit 63 bits, is untrusted input settled by the message's policy; it never advances a partition's resolved ts, the
applied ts or a restart offset. Also: a table no route can name is a per-message failure, not a crash."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest

import applier.decode as D
from applier import clock
from applier.codecs import get_decoder
from applier.config import ConfigError, parse_config
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.events import Column, DecodeError, KafkaMessage, Op, Resolved, RowChange, SourcePosition
from applier.pipeline import worker_spec
from applier.processor import BatchProcessor
from applier.progress import PipelineState, metadata
from applier.quarantine import HELD, SKIPPED
from applier.routing import Router, Rule
from tests.unit.apply_fakes import ProgressKept, RowsDialect, RowsSink

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "int"))
NOW_MS = int(time.time() * 1000)


def tso(ms: int, logical: int = 0) -> int:
    return (ms << 18) | logical


YEAR_2100 = tso(4_102_444_800_000)


def canal(ev, part: int, off: int, topic: str = "k") -> KafkaMessage:
    key, value = encode_canal_json(ev)
    return KafkaMessage(topic, part, off, key, value)


def insert(ts: int, key: int, val: int, table: str = "t", schema: str = "s") -> RowChange:
    return RowChange(schema, table, ts, Op.INSERT, None, {"id": key, "v": val}, COLS, SourcePosition("", 0, 0))


def watermark(ts: int) -> Resolved:
    return Resolved(ts, SourcePosition("", 0, 0))


def forged_watermark(part: int, off: int, ts: int) -> KafkaMessage:
    """A TIDB_WATERMARK with any ts, even one the encoder would not write (2^64 - 1)."""
    value = (b'{"id":0,"database":"","table":"","pkNames":null,"isDdl":false,"type":"TIDB_WATERMARK","es":0,'
             b'"ts":0,"sql":"","sqlType":null,"mysqlType":null,"data":null,"old":null,"_tidb":{"watermarkTs":'
             + str(ts).encode() + b"}}")
    return KafkaMessage("k", part, off, None, value)


# ---- the check itself ------------------------------------------------------------------------------------------

def test_the_limit_is_this_clock_plus_the_skew_and_never_beyond_63_bits() -> None:
    assert clock.clock_limit(60_000, now_ms=NOW_MS) == tso(NOW_MS + 60_000, 0x3FFFF)
    assert clock.clock_limit(None) == clock.TS_MAX == 2**63 - 1
    assert clock.clock_limit(10**30, now_ms=NOW_MS) == clock.TS_MAX


@pytest.mark.parametrize("ts, why", [
    (YEAR_2100, "ahead of this host's clock"),
    (2**64 - 1, "does not fit 63 bits"),
    (2**63, "does not fit 63 bits"),
    (-1, "does not fit 63 bits"),
])
def test_an_untrusted_ts_is_named_with_the_key_to_change(ts: int, why: str) -> None:
    limit = clock.clock_limit(60_000)
    ev, reason = clock.untrusted([watermark(tso(NOW_MS)), insert(ts, 1, 1)], limit)
    assert ev.commit_ts == ts and why in reason and clock.UNTRUSTED in reason
    if "ahead" in why:
        assert "source.max_clock_skew" in reason and "2100-01-01T00:00:00.000Z" in reason


def test_a_ts_within_the_skew_or_in_the_past_is_trusted() -> None:
    limit = clock.clock_limit(60_000)
    assert clock.untrusted([insert(tso(NOW_MS + 50_000), 1, 1), watermark(tso(NOW_MS - 10**9)), watermark(0)],
                           limit) is None


# ---- in the decode stage: the message becomes a bad record, none of its events goes on -------------------------

def _stream() -> list[KafkaMessage]:
    now = tso(NOW_MS - 5_000)
    return [canal(insert(now, 1, 10), 0, 0), canal(watermark(now + 1), 0, 1), forged_watermark(0, 2, YEAR_2100),
            canal(insert(now + 5, 2, 20), 0, 3), canal(insert(YEAR_2100, 3, 30, table="u"), 0, 4),
            canal(watermark(now + 10), 0, 5), forged_watermark(0, 6, 2**64 - 1)]


def test_decoding_refuses_far_future_and_oversized_ts_and_keeps_everything_else() -> None:
    d = D.decode_messages(get_decoder("canal-json"), _stream(), stop_at_error=False, max_skew_ms=60_000)
    assert [e.position.offset for e in d.events] == [0, 1, 3, 5]
    assert all((e.ts if isinstance(e, Resolved) else e.commit_ts) < YEAR_2100 for e in d.events)
    bad = {m.offset: exc for m, exc in d.errors}
    assert sorted(bad) == [2, 4, 6]
    assert bad[2].rowless and bad[2].table is None and "ahead of this host's clock" in bad[2].reason
    assert not bad[4].rowless and bad[4].table == ("s", "u")
    assert bad[6].rowless and "does not fit 63 bits" in bad[6].reason


def test_without_a_skew_a_ts_beyond_63_bits_is_still_refused() -> None:
    d = D.decode_messages(get_decoder("canal-json"), _stream(), stop_at_error=False)
    assert sorted(m.offset for m, _ in d.errors) == [6]


def test_under_stop_the_first_untrusted_message_stops_decoding_naming_it() -> None:
    with pytest.raises(DecodeError) as err:
        D.decode_messages(get_decoder("canal-json"), _stream(), stop_at_error=True, max_skew_ms=60_000)
    assert err.value.position == SourcePosition("k", 0, 2) and "max_clock_skew" in str(err.value)


def test_workers_refuse_the_same_messages_as_the_driver() -> None:
    msgs = _stream()
    rb = pa.RecordBatch.from_arrays(
        [pa.array([m.topic for m in msgs]), pa.array([m.partition for m in msgs], pa.int32()),
         pa.array([m.offset for m in msgs], pa.int64()), pa.array([m.key for m in msgs], pa.binary()),
         pa.array([m.value for m in msgs], pa.binary())], names=["topic", "partition", "offset", "key", "value"])
    spec = D.WorkerSpec("canal-json", (), False, max_skew_ms=60_000)
    out = D.Decoded()
    for chunk in D.decode_arrow_batches(spec, iter([rb])):
        out.extend(D.decode_chunk(chunk.column(0)[0].as_py()))
    assert [e.position.offset for e in out.events] == [0, 1, 3, 5]
    assert {m.offset: (e.rowless, e.table) for m, e in out.errors} == {2: (True, None), 4: (False, ("s", "u")),
                                                                         6: (True, None)}


def test_the_pipeline_hands_the_configured_skew_to_the_workers(tmp_path) -> None:
    def conf(**source) -> dict:
        return {"pipeline": {"name": "p", "checkpoint_dir": str(tmp_path)},
                "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "protocol": "canal-json", **source},
                "target": {"url": "mysql+pymysql://u@127.0.0.1/db"}}

    assert worker_spec(parse_config(conf())).max_skew_ms == clock.DEFAULT_MAX_SKEW_MS == 60_000
    assert worker_spec(parse_config(conf(max_clock_skew="5 seconds"))).max_skew_ms == 5_000
    with pytest.raises(ConfigError, match="source.max_clock_skew"):
        parse_config(conf(max_clock_skew="soon"))


# ---- in the processor: the policy settles it; the gate never sees the forged ts ---------------------------------

class KeptWithQuarantine(ProgressKept):
    def __init__(self) -> None:
        super().__init__()
        self.quarantined: list[tuple[int, str]] = []

    def quarantine(self, conn, msg, reason) -> None:
        self.quarantined.append((msg.offset, reason))


def _processor(policy: str, route=None) -> tuple[BatchProcessor, RowsSink, KeptWithQuarantine]:
    from sqlalchemy import create_engine

    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    sink, store = RowsSink(), KeptWithQuarantine()
    proc = BatchProcessor(engine=engine, decoder=get_decoder("canal-json"), route=route or (lambda s, t: ("main", t)),
                          store=store, state=PipelineState(), partitions=[("k", 0)], dialect=RowsDialect(sink),
                          on_decode_error=policy, max_skew_ms=60_000)
    return proc, sink, store


@pytest.mark.parametrize("policy", ["quarantine", "skip"])
def test_a_forged_watermark_is_recorded_holds_nothing_and_never_moves_the_gate(policy: str) -> None:
    now = tso(NOW_MS - 5_000)
    proc, sink, store = _processor(policy)
    # a transaction of two rows is half read when the forged watermark arrives
    rep = proc.process([canal(insert(now, 1, 10), 0, 0), forged_watermark(0, 1, YEAR_2100)])
    assert sink.rows == {} and proc.gate.global_resolved() == 0 and proc.gate.applied_ts == 0
    assert rep.quarantined == 1 and rep.untrusted == 1 and [o for o, _ in store.quarantined] == [1]
    assert proc.gate.restart_offsets()[("k", 0)] == 0  # the held row still pins the restart offset
    rep = proc.process([canal(insert(now, 2, 20), 0, 2), canal(watermark(now), 0, 3),
                        canal(insert(now + 7, 3, 30), 0, 4), canal(watermark(now + 7), 0, 5)])
    assert sink.rows == {1: 10, 2: 20, 3: 30}  # nothing dropped as "already applied", nothing held behind it
    assert proc.gate.applied_ts == now + 7 and store.saved[-1] == now + 7
    assert proc.totals.untrusted == 1


def test_a_far_future_row_under_quarantine_holds_its_table_not_its_partition() -> None:
    now = tso(NOW_MS - 5_000)
    proc, sink, store = _processor("quarantine")
    proc.process([canal(insert(YEAR_2100, 9, 90, table="u"), 0, 0), canal(insert(now, 1, 10), 0, 1),
                  canal(watermark(now), 0, 2)])
    assert sink.rows == {1: 10} and [o for o, _ in store.quarantined] == [0]
    assert proc.gate.applied_ts == now and proc.gate.held == 0


def test_settle_names_the_table_of_a_refused_row_and_holds_nothing_for_a_refused_watermark() -> None:
    proc, _sink, _store = _processor("quarantine")
    row_err = DecodeError(SourcePosition("k", 0, 4), f"{clock.UNTRUSTED}: x", table=("s", "u"))
    wm_err = DecodeError(SourcePosition("k", 0, 2), f"{clock.UNTRUSTED}: x", rowless=True)
    u = proc._settle(KafkaMessage("k", 0, 4, None, b"{}"), row_err)
    w = proc._settle(KafkaMessage("k", 0, 2, None, b"{}"), wm_err)
    assert (u.table, u.state) == (("s", "u"), HELD)
    assert (w.table, w.state, w.blocks_partition) == (None, SKIPPED, True)


# ---- a table no route can name: a per-message failure under on_decode_error -------------------------------------

LONG = "t" * 300


def _router_table_template() -> Router:
    return Router([Rule(match="s.*", schema="main", table="{table}")])


def test_a_name_no_route_can_make_stops_naming_the_message_under_stop() -> None:
    now = tso(NOW_MS - 5_000)
    proc, _sink, _store = _processor("stop", route=_router_table_template().route)
    with pytest.raises(DecodeError) as err:
        proc.process([canal(insert(now, 1, 10, table=LONG), 0, 0), canal(watermark(now), 0, 1)])
    assert err.value.position == SourcePosition("k", 0, 0) and "cannot be routed" in str(err.value)
    assert "[[route]]" in str(err.value)


def test_a_name_no_route_can_make_is_recorded_under_skip_and_the_rest_applies() -> None:
    now = tso(NOW_MS - 5_000)
    proc, sink, store = _processor("skip", route=_router_table_template().route)
    rep = proc.process([canal(insert(now, 1, 10, table=LONG), 0, 0), canal(insert(now, 2, 20), 0, 1),
                        canal(watermark(now), 0, 2)])
    assert sink.rows == {2: 20} and [o for o, _ in store.quarantined] == [0] and rep.quarantined == 1
    assert proc.gate.applied_ts == now and proc.gate.restart_offsets()[("k", 0)] == 3
