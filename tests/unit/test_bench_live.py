"""The live benchmark's pure parts (no services): TSO math, the pacer, percentiles and the staleness windows.
The runs themselves are ``python -m applier.devtools.bench --live/--startup/--micro-batch`` (docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from applier.devtools import bench_live as L
from applier.devtools.bench import parse_args


def test_tso_round_trip() -> None:
    ts = L.compose_tso(1_700_000_000_123, 5)
    assert L.physical_ms(ts) == 1_700_000_000_123
    assert ts & L.MAX_LOGICAL == 5
    with pytest.raises(ValueError):
        L.compose_tso(1, L.MAX_LOGICAL + 1)


def test_tso_clock_commit_ts_increase_and_never_at_or_below_a_resolved_ts() -> None:
    c = L.TsoClock()
    a = c.commit_ts(1000)
    b = c.commit_ts(1000)  # same millisecond: logical part grows
    assert b > a and L.physical_ms(b) == 1000
    r = c.resolved_ts(1000)
    assert r > b and r == L.compose_tso(1000, L.MAX_LOGICAL)
    after = c.commit_ts(1000)  # the wall clock has not moved: next millisecond
    assert after > r and L.physical_ms(after) == 1001
    assert c.commit_ts(999) > after  # a clock going back never makes a smaller ts
    r2 = c.resolved_ts(995)
    assert r2 >= after and r2 > r


def test_tso_clock_logical_overflow_moves_to_the_next_millisecond() -> None:
    c = L.TsoClock()
    c.commit_ts(5)
    c.logical = L.MAX_LOGICAL - 1
    ts = c.commit_ts(5)
    assert L.physical_ms(ts) == 6 and ts & L.MAX_LOGICAL == 1


def test_pacer() -> None:
    p = L.Pacer(1000, start=100.0)
    assert p.due(500) == pytest.approx(100.5)
    assert p.delay(500, 100.2) == pytest.approx(0.3)
    assert p.delay(500, 101.0) == 0.0
    assert p.lateness(500, 101.0) == pytest.approx(0.5)
    assert p.lateness(500, 100.0) == 0.0
    with pytest.raises(ValueError):
        L.Pacer(0, 0.0)


def test_percentiles_like_numpy_linear() -> None:
    v = [1.0, 2.0, 3.0, 4.0]
    assert L.percentile(v, 50) == pytest.approx(2.5)
    assert L.percentile(v, 0) == 1.0 and L.percentile(v, 100) == 4.0
    assert L.percentile(list(map(float, range(101))), 99) == pytest.approx(99.0)
    assert L.percentile([], 50) is None
    assert L.percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        L.percentile(v, 101)
    s = L.summarize([3.0, 1.0, 2.0])
    assert (s["n"], s["p50"], s["max"], s["mean"]) == (3, 2.0, 3.0, 2.0)
    assert L.summarize([])["p99"] is None


def _c(wall: float, ms: int, rows: int = 1) -> L.Commit:
    return L.Commit(wall, L.compose_tso(ms, L.MAX_LOGICAL), rows, 1)


def test_staleness_per_commit_counts_only_commits_that_moved_the_applied_ts() -> None:
    commits = [_c(10.5, 10_000), _c(10.7, 10_000, 0), _c(11.4, 11_000), _c(12.9, 12_000), _c(30.0, 13_000)]
    stale, age = L.staleness_per_commit(commits, lo=10.0, hi=20.0)
    assert stale == pytest.approx([0.5, 0.4, 0.9])
    assert age == pytest.approx([1.4, 1.9])  # commit time - the previously applied resolved ts


def test_staleness_per_resolved_covers_skipped_and_unapplied_resolved_ts() -> None:
    resolved = [L.compose_tso(ms, L.MAX_LOGICAL) for ms in (9_000, 10_000, 11_000, 12_000, 13_000)]
    commits = [_c(10.3, 10_000), _c(12.5, 12_000)]  # 11_000 was applied by the commit that applied 12_000
    vals, censored = L.staleness_per_resolved(resolved, commits, lo=10.0, stop=13.5)
    assert vals == pytest.approx([0.3, 1.5, 0.5, 0.5])  # 13_000 unapplied at 13.5: counts 0.5 (a lower bound)
    assert censored == 1


def test_highest_rate_under_stops_at_the_first_miss() -> None:
    assert L.highest_rate_under({5000: 1.1, 10000: 1.6, 20000: 2.4, 30000: 1.9}) == 10000
    assert L.highest_rate_under({5000: 2.5}) is None
    assert L.highest_rate_under({5000: None, 10000: 1.0}) is None


def test_live_arguments() -> None:
    a = parse_args(["--live", "5k", "--duration", "300", "--target", "mariadb"])
    assert (a.live, a.duration, a.warmup, a.verify, a.sweep) == (5000, 300.0, 15.0, True, None)
    a = parse_args(["--sweep", "30k,5k,10k", "--no-verify"])
    assert a.sweep == [5000, 10000, 30000] and not a.verify
    with pytest.raises(SystemExit):
        parse_args(["--sweep", "0"])


def test_live_settings_on_local_or_on_a_cluster(tmp_path) -> None:
    """``--cluster-workers`` runs the live pipeline on the cluster main_live started (its URL in ``a.master``),
    with the apply streams where ``--apply-on`` puts them; without it, on ``local[--cores]``."""
    kw = dict(name="n", topic="t", url="postgresql+psycopg://u:p@127.0.0.1:1/d", kafka="127.0.0.1:9",
              schema="s", checkpoint=tmp_path)
    a = parse_args(["--live", "10k", "--apply-streams", "4", "--apply-on", "executors", "--cluster-workers", "2"])
    assert a.cluster_workers == 2
    local = L.bench_settings(a, **kw)
    assert local.spark.master == "local[2]" and local.target.apply_on == "executors"
    a.master = "spark://127.0.0.1:7077"
    on_cluster = L.bench_settings(a, **kw)
    assert on_cluster.spark.master == "spark://127.0.0.1:7077"
    assert on_cluster.target.apply_streams == 4 and on_cluster.applies_on_executors()
    assert parse_args(["--live", "10k"]).apply_on == "auto"
    with pytest.raises(SystemExit):
        parse_args(["--events", "1k", "--cluster-workers", "2"])  # catch-up on a cluster is bench_scale's


def test_live_workload_paces_wall_clock_timestamps() -> None:
    now = [1_700_000_000_000]
    LiveWorkload = L._live_workload_class()
    wl = LiveWorkload("canal-json", tables=2, partitions=2, seed=3, clock=lambda: now[0])
    first = wl.begin()
    assert len(first) == 2 * 2 + 2  # CREATE TABLE per table and partition, then a resolved ts per partition
    first_resolved = wl.resolved_log[-1][0]
    n, msgs = wl.transaction()
    assert n >= 1 and len(msgs) >= n
    now[0] += 1000
    n2, msgs2 = wl.transaction()  # a second has passed: a resolved ts follows the transaction on every partition
    assert wl.resolved_log[-1][0] > first_resolved
    assert L.physical_ms(wl.resolved_log[-1][0]) == now[0]
    end = wl.end()
    assert len(end) == 2 and wl.final_ts == wl.resolved_log[-1][0]
    assert sum(cs.rows for cs in wl.expected.values()) >= 1


def test_live_clock_sums_the_apply_threads_stages_per_batch() -> None:
    c = L.LiveClock()
    for plan, write in ((0.001, 0.010), (0.002, 0.020)):  # two table chunks in batch 1
        c.add("plan", plan)
        c.add("write", write)
    c.add("progress", 0.005)
    c.add("commit", 0.004)
    c.add("apply", 0.050)
    c.add("process", 0.100)
    c.add("write", 0.030)  # batch 2: one chunk
    c.add("apply", 0.040)
    c.add("process", 0.060)
    assert [round(b["write"], 3) for b in c.per_batch] == [0.030, 0.030]
    m = c.batch_medians_ms()
    assert m["process"] == pytest.approx(80.0) and m["write"] == pytest.approx(30.0)
    assert m["apply other"] == pytest.approx((0.050 - 0.042 + 0.010) / 2 * 1000)


def test_split_staleness_at_the_batch_start() -> None:
    commits = [_c(10.9, 10_000), _c(11.5, 10_000, 0), _c(12.2, 11_000)]
    starts = [10.4, 11.2, 11.6]
    wait, inside = L.split_staleness(commits, starts, lo=10.0, hi=20.0)
    assert wait == pytest.approx([0.4, 0.6]) and inside == pytest.approx([0.5, 0.6])
    assert L.split_staleness(commits, starts[:2], lo=10.0, hi=20.0) == ([], [])


def test_producer_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    a = parse_args(["--live", "30k"])
    assert (a.producer, a.pool_rows) == ("pooled", 300_000)  # Canal-JSON: pooled by default
    assert parse_args(["--live", "5k", "--protocol", "open"]).producer == "encode"
    a = parse_args(["--live", "5k", "--producer", "encode", "--pool-rows", "1.5M"])
    assert (a.producer, a.pool_rows) == ("encode", 1_500_000)
    assert parse_args(["--sweep", "5k,30k", "--pool-rows", "50k"]).pool_rows == 50_000
    with pytest.raises(SystemExit):
        parse_args(["--live", "5k", "--protocol", "open", "--producer", "pooled"])
    assert "length prefixes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--live", "5k", "--pool-rows", "0"])


def test_the_per_row_producer_paces_its_rows_between_resolved_ts() -> None:
    """``send_encoded`` on a fake clock: the rate holds, a resolved ts every second on every partition, no commit
    ts at or below a resolved ts before it, the final resolved ts last and above every commit ts."""
    import json

    t = [1_765_000_000.0]
    sent: list[tuple[int, bytes]] = []

    def produce(part: int, key: bytes | None, value: bytes) -> None:
        sent.append((part, value))
        t[0] += 20e-6

    def sleep(s: float) -> None:
        t[0] += s

    wl = L._live_workload_class()("canal-json", tables=2, partitions=2, seed=3, clock=lambda: int(t[0] * 1000))
    rate, seconds = 2000, 3.0
    res = L.send_encoded(wl, L.Pacer(rate, t[0]), produce=produce, seconds=seconds, now=lambda: t[0], sleep=sleep)
    assert rate * seconds <= res.rows <= rate * seconds + 500 and res.rows == wl.stats.row_events
    last = {0: 0, 1: 0}
    commits = []
    for part, value in sent:
        m = json.loads(value)
        if "watermarkTs" in m.get("_tidb", {}):
            last[part] = m["_tidb"]["watermarkTs"]
        elif not m["isDdl"]:
            assert m["_tidb"]["commitTs"] > last[part]
            commits.append(m["_tidb"]["commitTs"])
    assert len(commits) == res.rows
    assert set(last.values()) == {wl.final_ts} and wl.final_ts > max(commits)
    assert len(wl.resolved_log) == pytest.approx(seconds + 2, abs=1)  # begin, one a second, the final one
