"""The live benchmark's pooled producer (applier.devtools.bench_pool) without Kafka: the commit-ts substitution
against the encoder and the applier's own decoder, the placeholder check, why replaying whole passes keeps the
expected checksums, and the send loop on a fake clock (the last pass completed, the final resolved ts above all)."""

from __future__ import annotations

import gc
import math
from typing import Any, Iterable

import pytest

from applier.codecs import get_decoder
from applier.devtools import bench_live as L
from applier.devtools import bench_pool as B
from applier.devtools.bench_stream import BENCH_COLUMNS, bench_checksum
from applier.events import DDL, KafkaMessage, Resolved, RowChange

KEY = [c.name for c in BENCH_COLUMNS if c.key]
WL = {"tables": 2, "partitions": 3, "seed": 11}


def pool_of(rows: int, **kw: Any) -> B.Pool:
    return B.build_pool(L._pool_workload_class()("canal-json", **{**WL, **kw}), rows)


@pytest.fixture(scope="module")
def pool() -> B.Pool:
    # enough rows for updates and deletes (they start once a table has 2 x 64 hot keys' worth of live rows)
    return pool_of(3000)


def decode(messages: Iterable[tuple[int, bytes | None, bytes]]) -> list[tuple[int, Any]]:
    """(partition, event) of every message, decoded by the applier's Canal-JSON decoder."""
    dec = get_decoder("canal-json")
    out = []
    for offset, (part, key, value) in enumerate(messages):
        out.extend((part, ev) for ev in dec.decode(KafkaMessage("t", part, offset, key, value)))
    return out


def view(ev: RowChange) -> tuple[Any, ...]:
    return ev.schema, ev.table, ev.op, ev.before, ev.after, ev.commit_ts


def pass_messages(pool: B.Pool, first_ts: int, txns: int | None = None) -> list[tuple[int, bytes | None, bytes]]:
    """The first ``txns`` transactions (all by default) of a pass, transaction i at commit ts ``first_ts + i``."""
    out = []
    for i, txn in enumerate(pool.txns[:txns]):
        real = B.TsPatterns.of(first_ts + i)
        out.extend((p, k, B.substitute(v, real)) for p, k, v in txn.messages)
    return out


class Model:
    """The target as the applier leaves it: upsert the after image by primary key, delete by key."""

    def __init__(self) -> None:
        self.tables: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {}

    def apply(self, events: Iterable[tuple[int, Any]]) -> None:
        for _, ev in events:
            if not isinstance(ev, RowChange):
                continue
            rows = self.tables.setdefault(ev.table, {})
            if ev.after is not None:
                rows[tuple(ev.after[k] for k in KEY)] = ev.after
            else:
                rows.pop(tuple(ev.before[k] for k in KEY), None)

    def checksums(self, names: Iterable[str]) -> dict[str, tuple[int, int]]:
        out = {}
        for name in names:
            cs = bench_checksum(self.tables.get(name, {}).values())
            out[name] = (cs.rows, cs.digest_sum)
        return out


# -- substitution --------------------------------------------------------------------------------------------

def test_a_pooled_message_with_its_real_ts_is_the_message_encoded_with_that_ts(pool: B.Pool) -> None:
    """The pool and a live workload on a frozen clock make the same rows (same seed); substituting the live
    workload's commit ts into the pooled bytes gives its bytes exactly, and the applier decodes both alike."""
    ms = 1_765_000_000_000
    live = L._live_workload_class()("canal-json", clock=lambda: ms, **WL)
    live.begin()
    checked = 0
    for txn in pool.txns[:40]:
        n, direct = live.transaction()
        assert n == txn.rows and len(direct) == len(txn.messages)
        (_, first), *_ = decode(direct[:1])
        real = B.TsPatterns.of(first.commit_ts)
        assert L.physical_ms(first.commit_ts) == ms + 1  # after the resolved ts of `begin`
        pooled = [(p, k, B.substitute(v, real)) for p, k, v in txn.messages]
        assert pooled == direct
        got, want = decode(pooled), decode(direct)
        assert [(p, view(e)) for p, e in got] == [(p, view(e)) for p, e in want]
        checked += len(got)
    assert checked >= 40
    ops = {e.op for _, e in decode(m for t in pool.txns for m in t.messages)}
    assert len(ops) == 3  # inserts, updates and deletes all went through the pool


def test_substitution_may_change_the_length() -> None:
    """Canal-JSON is text: a commit ts with fewer digits than the placeholder still decodes."""
    msgs = pool_of(5).txns[0].messages
    short = L.compose_tso(999_999_999_999, 7)  # 12-digit ms: shorter than the placeholder's 13
    (_, ev), *_ = decode([(p, k, B.substitute(v, B.TsPatterns.of(short))) for p, k, v in msgs])
    assert ev.commit_ts == short


def test_every_pooled_message_holds_each_placeholder_once(pool: B.Pool) -> None:
    for txn in pool.txns:
        for _, _, v in txn.messages:
            assert [v.count(p) for p in B.PLACEHOLDER.all()] == [1, 1, 1]
    assert B.PLACEHOLDER.all() == (b'"commitTs":%d' % B.PLACEHOLDER_TSO, b'"es":%d' % B.PLACEHOLDER_MS,
                                   b'"ts":%d' % B.PLACEHOLDER_MS)


def test_the_placeholder_check_rejects_a_pattern_twice_or_missing(pool: B.Pool) -> None:
    v = pool.txns[0].messages[0][2]
    B.check_placeholders(v)
    twice = v[:-2] + b',' + B.PLACEHOLDER.commit + b'}}'
    with pytest.raises(B.PoolError, match="commitTs.* 2 times"):
        B.check_placeholders(twice)
    missing = v.replace(B.PLACEHOLDER.ts, b'"ts":1')
    with pytest.raises(B.PoolError, match='"ts":.* 0 times'):
        B.check_placeholders(missing)


def test_the_pool_build_refuses_messages_without_the_placeholder() -> None:
    """A source that writes real timestamps (the live workload, not the pool's) fails the build loudly."""
    live = L._live_workload_class()("canal-json", clock=lambda: 1_765_000_000_000, **WL)
    with pytest.raises(B.PoolError, match="pool transaction 0, message 0"):
        B.build_pool(live, 100)


def test_the_pool_build_refuses_open_protocol() -> None:
    with pytest.raises(ValueError, match="length prefixes"):
        B.build_pool(L._pool_workload_class()("open", **WL), 100)


def test_pool_size() -> None:
    assert B.pool_size_for(300_000, 30_000, 75) == 300_000
    assert B.pool_size_for(300_000, 1_000, 5) == 5001  # no bigger than the paced run
    assert B.pool_size_for(300_000, 1, 0) == 1
    p = pool_of(50)
    assert p.rows >= 50 and p.rows - p.txns[-1].rows < 50  # whole transactions, stopped at the first past 50
    assert p.rows == sum(t.rows for t in p.txns) and p.messages == p.rows  # Canal-JSON: a message per row


# -- why whole passes --------------------------------------------------------------------------------------

def test_replaying_whole_passes_keeps_the_expected_state_and_a_partial_pass_does_not(pool: B.Pool) -> None:
    ts1 = L.compose_tso(1_765_000_000_000, 1)
    ts2 = L.compose_tso(1_765_000_100_000, 1)  # the second pass: new, higher commit ts
    assert sum(rows for rows, _ in pool.expected.values()) > 0
    model = Model()
    model.apply(decode(pass_messages(pool, ts1)))
    assert model.checksums(pool.table_names) == pool.expected  # one pass: the generator's expected state
    half = Model()
    half.tables = {t: dict(rows) for t, rows in model.tables.items()}
    model.apply(decode(pass_messages(pool, ts2)))
    assert model.checksums(pool.table_names) == pool.expected  # two passes: the same
    half.apply(decode(pass_messages(pool, ts2, txns=len(pool.txns) // 2)))
    assert half.checksums(pool.table_names) != pool.expected  # 1.5 passes: not (the last pass must complete)


# -- the send loop on a fake clock ----------------------------------------------------------------------------

class FakeTime:
    """now()/sleep() in seconds, and a produce() that records and costs ``per_message`` seconds."""

    def __init__(self, start: float, per_message: float = 0.0) -> None:
        self.t = start
        self.per_message = per_message
        self.sent: list[tuple[float, int, bytes | None, bytes]] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        assert s >= 0
        self.t += s

    def ms(self) -> int:
        return int(self.t * 1000)

    def produce(self, part: int, key: bytes | None, value: bytes) -> None:
        self.sent.append((self.t, part, key, value))
        self.t += self.per_message


def run(pool: B.Pool, *, rate: float, seconds: float, per_message: float = 0.0) -> tuple[B.SendResult, FakeTime]:
    clock = FakeTime(1_765_000_000.0, per_message)
    control = L._live_workload_class()("canal-json", clock=clock.ms, **WL)
    res = B.send_pooled(pool, control, L.Pacer(rate, clock.now()), produce=clock.produce, seconds=seconds,
                        now=clock.now, sleep=clock.sleep)
    return res, clock


def test_after_the_deadline_the_pass_is_completed_and_the_final_resolved_ts_is_above_everything() -> None:
    pool = pool_of(1300)
    rate, seconds = 1000, 3.5
    res, clock = run(pool, rate=rate, seconds=seconds, per_message=20e-6)
    paced = res.rows - res.tail_rows
    assert rate * seconds <= paced <= rate * seconds + max(t.rows for t in pool.txns)  # the rate held
    assert res.t_end == pytest.approx(clock.sent[0][0] + seconds, abs=0.01)
    assert res.passes == math.ceil(paced / pool.rows) == 3 and res.rows == 3 * pool.rows  # the 3rd pass completed
    assert res.tail_rows > 0 and res.transactions == 3 * len(pool.txns)
    assert all(t > res.t_end for t, *_ in clock.sent if t > res.t_end + 1e-9)

    events = decode((p, k, v) for _, p, k, v in clock.sent)
    last_resolved = {p: 0 for p in range(WL["partitions"])}
    commits = []
    for p, ev in events:
        if isinstance(ev, Resolved):
            assert ev.ts >= last_resolved[p]
            last_resolved[p] = ev.ts
        elif isinstance(ev, RowChange):
            assert ev.commit_ts > last_resolved[p]  # never at or below a resolved ts already sent (the gate drops it)
            commits.append(ev.commit_ts)
        else:
            assert isinstance(ev, DDL) and not commits  # the CREATE TABLEs come first
    assert len(commits) == res.rows
    assert set(last_resolved.values()) == {res.final_ts} and res.final_ts > max(commits)
    assert all(isinstance(ev, Resolved) for _, ev in events[-WL["partitions"]:])  # the final one, last everywhere
    assert len(set(commits)) == res.transactions  # one fresh commit ts per transaction: replays are not duplicates
    # a resolved ts about every second on the paced part, with the rows sent before each
    paced_resolved = [ts for ts, _ in res.resolved if L.physical_ms(ts) / 1000 <= res.t_end]
    assert len(paced_resolved) == pytest.approx(seconds + 1, abs=1)
    assert res.resolved[-1] == (res.final_ts, res.rows)
    # and what the three passes leave is the pool's expected state
    model = Model()
    model.apply(events)
    assert model.checksums(pool.table_names) == pool.expected


def test_a_deadline_at_a_pass_boundary_sends_no_tail() -> None:
    pool = pool_of(400)
    rate = 1000
    res, _ = run(pool, rate=rate, seconds=pool.rows / rate - 1e-6)
    assert (res.passes, res.rows, res.tail_rows) == (1, pool.rows, 0)


def test_a_run_that_ends_before_its_first_row_still_sends_one_pass() -> None:
    pool = pool_of(200)
    res, clock = run(pool, rate=1000, seconds=0)
    assert (res.passes, res.rows, res.tail_rows) == (1, pool.rows, pool.rows)
    model = Model()
    model.apply(decode((p, k, v) for _, p, k, v in clock.sent))
    assert model.checksums(pool.table_names) == pool.expected


def test_producer_text_names_the_pool() -> None:
    r = {"producer": "pooled", "pool_rows": 300_123, "pool_build_s": 21.5, "passes": 8, "tail_rows": 12_000,
         "tail_s": 0.4}
    assert L.producer_text(r) == ("pooled producer: pool 300,123 rows (built in 21.5 s), 8 passes, last pass "
                                  "completed unpaced: 12,000 rows in 0.4 s")
    assert L.producer_text({"producer": "encode"}) == "encode producer"


# -- the producer process's wiring, Kafka faked ------------------------------------------------------------

class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, int, bytes | None, bytes]] = []
        self.full_once = True

    def produce(self, topic: str, value: bytes, key: bytes | None, partition: int) -> None:
        if self.full_once:  # a full local queue: KafkaOut polls and tries again
            self.full_once = False
            raise BufferError
        self.sent.append((topic, partition, key, value))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        return 0


class FakeConn:
    def __init__(self) -> None:
        self.got: list[tuple[str, Any]] = []

    def send(self, item: tuple[str, Any]) -> None:
        self.got.append(item)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("producer", ["pooled", "encode"])
def test_producer_main_reports_what_it_sent(monkeypatch: pytest.MonkeyPatch, producer: str) -> None:
    fake = FakeProducer()
    monkeypatch.setattr(L, "_kafka_producer", lambda params: fake)
    conn = FakeConn()
    params = {"protocol": "canal-json", **WL, "resolved_interval_ms": 100, "bootstrap": "-", "topic": "t",
              "rate": 2000, "seconds": 0.3, "producer": producer, "pool_rows": 250}
    frozen = gc.get_freeze_count()
    try:
        L.producer_main(conn, params)
    finally:
        if not frozen:  # the pooled producer freezes its pool (its own process in a real run): not this one's
            gc.unfreeze()
    (kind, t0), (done, r) = conn.got
    assert (kind, done, r["producer"], r["t0"]) == ("started", "done", producer, t0)
    assert r["messages"] == len(fake.sent) and r["bytes"] == sum(len(v) for *_, v in fake.sent)
    events = decode((p, k, v) for _, p, k, v in fake.sent)
    # (what it sent, not how fast: 2000/s for 0.3 s is 600 rows on a quiet machine, fewer when the encoding
    # producer shares the cores with another run; the rate is the live bench's own check, producer_kept_up)
    assert r["rows"] == sum(isinstance(e, RowChange) for _, e in events) > 0
    assert r["final_ts"] == r["resolved"][-1][0] == events[-1][1].ts
    assert r["cpu_us_per_row"] > 0 and set(r["expected"]) == set(r["table_names"])
    model = Model()
    model.apply(events)
    assert model.checksums(r["table_names"]) == r["expected"]
    if producer == "pooled":
        assert r["pool_rows"] >= 250 and r["passes"] >= 2 and r["rows"] == r["passes"] * r["pool_rows"]
    else:
        assert r["pool_rows"] is None and r["passes"] is None
