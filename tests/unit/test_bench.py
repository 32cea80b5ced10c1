"""The benchmark's argument parsing and pure helpers (no services); the run itself is ``python -m applier.devtools.bench``."""

from __future__ import annotations

import collections
import datetime as dt
from decimal import Decimal

import pytest

from applier.devtools import bench
from applier.devtools.bench import StageClock, descendants, parse_args, parse_mix, ratio, rate, stage_split, tsv_line, tsv_value


def test_defaults_and_counts() -> None:
    a = parse_args([])
    assert (a.protocol, a.target, a.cores, a.json) == ("canal-json", "postgres", 2, False)
    a = parse_args(["--protocol", "open", "--target", "mariadb", "--events", "2M", "--big-txn-rows", "1_000_000",
                    "--max-offsets-per-trigger", "50k", "--cores", "1", "--json", "--spark-conf", "spark.x=1"])
    assert (a.protocol, a.target, a.events, a.big_txn_rows, a.max_offsets_per_trigger, a.cores, a.json) == (
        "open", "mariadb", 2_000_000, 1_000_000, 50_000, 1, True)
    assert a.spark_conf == {"spark.x": "1"}


@pytest.mark.parametrize("argv", [
    ["--events", "0"], ["--events", "10", "--big-txn-rows", "11"], ["--cores", "0"], ["--protocol", "avro"],
    ["--target", "oracle"], ["--events", "1.5x"], ["--dup-fraction", "1"], ["--spark-conf", "novalue"],
])
def test_bad_arguments_exit_2(argv) -> None:
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2


def test_mix() -> None:
    assert parse_mix("50,35,15") == pytest.approx((0.5, 0.35, 0.15))
    assert parse_mix("delete=1, insert=2, update=1") == pytest.approx((0.5, 0.25, 0.25))
    for bad in ("1,2", "a,b,c", "insert=1,update=1,upsert=1", "-1,1,1", "0,0,0"):
        with pytest.raises(Exception):
            parse_mix(bad)


def test_rates_and_names() -> None:
    assert rate(10, 2) == 5 and rate(1, 0) is None
    assert ratio(1, 4) == 0.25 and ratio(None, 4) is None and ratio(1, 0) is None
    assert bench.human_bytes(1536) == "1.5 KiB" and bench.human_bytes(None) == "n/a"
    assert bench.safe_name("canal-json_Postgres 2M") == "canal_json_postgres_2m"


def test_tsv_escaping_matches_load_data_defaults() -> None:
    assert tsv_value(None) == "\\N"
    assert tsv_value("a\tb\nc\\d\0") == "a\\tb\\nc\\\\d\\0"
    assert tsv_value(b"\x00\xff") == "00ff"
    assert tsv_value(Decimal("-1.50")) == "-1.50"
    assert tsv_value(0.015625) == "0.015625"
    assert tsv_value(dt.datetime(2020, 1, 2, 3, 4, 5)) == "2020-01-02 03:04:05.000000"
    assert tsv_value(dt.date(2020, 1, 2)) == "2020-01-02"
    assert tsv_line([1, "x", None]) == "1\tx\t\\N\n"
    with pytest.raises(TypeError):
        tsv_value(object())


def test_descendants() -> None:
    ppids = {2: 1, 3: 2, 4: 3, 5: 1, 6: 99}
    assert descendants(ppids, 2) == {3, 4}
    assert descendants(ppids, 1) == {2, 3, 4, 5}
    assert descendants(ppids, 6) == set()


def test_stage_split_adds_up_to_the_wall_time_per_thread() -> None:
    clock = StageClock()
    for stage, secs in {"on_batch": 8.0, "submit_wait": 3.0, "drain": 0.5, "process": 6.0, "plan": 0.5,
                        "write": 2.0, "progress": 0.1, "commit": 0.2}.items():
        clock.add(stage, secs)
    rows = stage_split(10.0, clock, {"decode": 2.0, "gate": 0.5, "apply": 3.4})
    by = {r["stage"]: r["seconds"] for r in rows if not r["stage"].startswith(" ")}
    spark = ("spark query overhead", "read", "wait for apply thread", "drain last batch")
    assert by["spark query overhead"] == 1.5 and by["read"] == 5.0
    assert by["apply: release+other"] == pytest.approx(0.6)
    assert sum(by[k] for k in spark) == pytest.approx(10.0)
    assert sum(v for k, v in by.items() if k not in spark) == pytest.approx(10.0)


def test_bench_workload_expected_state_matches_its_own_stream() -> None:
    """Decode the generated stream, apply it in (commit ts, partition, offset) order like the gate does, and
    compare with the generator's checksums: the expected state is right, replays included."""
    from applier.codecs import get_decoder
    from applier.events import KafkaMessage, Op, RowChange
    from applier.devtools.bench_stream import bench_checksum, generate_bench

    for protocol in ("open", "canal-json"):
        wl = generate_bench(protocol, tables=3, partitions=2, events=3000, big_txn_rows=500, seed=5,
                            dup_fraction=0.05, hot_keys=4)
        dec = get_decoder(protocol)
        offsets: collections.Counter = collections.Counter()
        changes = []
        for part, key, value in wl.messages():
            off = offsets[part]
            offsets[part] += 1
            for i, ev in enumerate(dec.decode(KafkaMessage("t", part, off, key, value))):
                if isinstance(ev, RowChange):
                    changes.append((ev.commit_ts, part, off, i, ev))
        changes.sort(key=lambda c: c[:4])
        state = {}
        for *_, ev in changes:
            k = (ev.table, (ev.after or ev.before)["id"])
            if ev.op is Op.DELETE:
                state.pop(k, None)
            else:
                state[k] = ev.after
        assert wl.stats.row_events == 3000 and wl.stats.duplicate_row_events > 0
        assert wl.stats.largest_txn_rows == 500
        for table, cs in wl.expected.items():
            got = bench_checksum(r for (t, _), r in state.items() if t == table)
            assert (got.rows, got.digest_sum) == (cs.rows, cs.digest_sum)
