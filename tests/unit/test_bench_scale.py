"""The scale-out benchmark's pure parts (applier.devtools.bench_scale) and the loopback cluster's parsing of the
master's /json/ document (applier.devtools.cluster): arguments, each protocol's pipeline settings and decode-only
read (Simple's schema snapshot; the Avro bench stream), the per-run verdicts, the read model, and a conclusion whose
numbers come from the runs."""

from __future__ import annotations

import argparse
import time

import pytest

from applier.devtools import bench_scale as B
from applier.devtools import cluster as C


# ---- arguments --------------------------------------------------------------------------------------------------

def test_defaults_compare_one_and_two_workers_on_postgres() -> None:
    a = B.parse_args([])
    assert (a.workers, a.target, a.protocol, a.events, a.partitions) == ([1, 2], "postgres", "canal-json", 200_000, 6)
    assert a.spark_conf == {} and a.max_offsets_per_trigger == 25_000


def test_arguments_parse_counts_workers_and_conf() -> None:
    a = B.parse_args(["--events", "100k", "--workers", "2,1,2", "--target", "mariadb", "--spark-conf",
                      "spark.x = 1", "--max-offsets-per-trigger", "10k"])
    assert (a.events, a.workers, a.target, a.max_offsets_per_trigger) == (100_000, [1, 2], "mariadb", 10_000)
    assert a.spark_conf == {"spark.x": "1"}


@pytest.mark.parametrize("argv", [["--workers", "0,1"], ["--workers", "one"], ["--workers", ","],
                                  ["--events", "0"], ["--spark-conf", "novalue"], ["--decode-repeat", "0"],
                                  ["--events", "10", "--big-txn-rows", "11"], ["--target", "oracle"]])
def test_bad_arguments_are_refused(argv, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        B.parse_args(argv)
    assert exc.value.code == 2


def test_parse_workers_and_conf_directly() -> None:
    assert B.parse_workers(" 3, 1 ") == [1, 3]
    with pytest.raises(argparse.ArgumentTypeError):
        B.parse_workers("-1")
    assert B.parse_args(["--spark-conf", "a=b=c"]).spark_conf == {"a": "b=c"}
    with pytest.raises(SystemExit):
        B.parse_args(["--spark-conf", "=x"])


def test_every_protocol_of_the_bench_stream_is_accepted() -> None:
    from applier.devtools.bench_stream import BENCH_PROTOCOLS

    assert set(B.PROTOCOLS) == set(BENCH_PROTOCOLS) == {"open", "canal-json", "simple", "debezium", "avro"}
    for protocol in BENCH_PROTOCOLS:
        assert B.parse_args(["--protocol", protocol]).protocol == protocol
    with pytest.raises(SystemExit) as exc:
        B.parse_args(["--protocol", "maxwell"])
    assert exc.value.code == 2


# ---- each protocol's settings and decode-only read ----------------------------------------------------------------

def _workload(protocol: str) -> B.Workload:
    from applier.codecs import get_decoder
    from applier.devtools.bench_stream import BENCH_COLUMN_NAMES, DEBEZIUM_BENCH_COLUMN_NAMES

    codec = B.source_codec(protocol, "http://127.0.0.1:18081/apis/ccompat/v7")
    columns = DEBEZIUM_BENCH_COLUMN_NAMES if protocol == "debezium" else BENCH_COLUMN_NAMES
    return B.Workload("127.0.0.1:19092", "postgresql+psycopg://u:p@127.0.0.1:15432/db", "bench-x", "x", 10, 10, {},
                      1, {}, codec, columns, get_decoder(protocol, **codec).gated)


@pytest.mark.parametrize("protocol,gated", [("open", True), ("canal-json", True), ("simple", True),
                                            ("debezium", False), ("avro", True)])
def test_each_protocol_gets_the_pipeline_settings_of_the_other_benches(protocol, gated, tmp_path) -> None:
    from applier.pipeline import decoder_for, worker_spec

    wl = _workload(protocol)
    assert wl.gated is gated  # debezium without the TiDB extension has no watermark: ungated, as in bench_peer
    a = B.parse_args(["--protocol", protocol])
    settings = B.scale_settings(a, wl, master="spark://127.0.0.1:7077", conf={}, schema="bench_x", name="scale-x",
                                checkpoint=tmp_path)
    assert settings.source.protocol == protocol and settings.pipeline.decode_on == "executors"
    assert settings.decodes_on_executors()  # every one decodes in the workers (Simple with the driver's schemas)
    assert decoder_for(settings).gated is gated
    assert dict(worker_spec(settings).options) == wl.codec
    if protocol == "avro":
        assert wl.codec == {"registry_url": "http://127.0.0.1:18081/apis/ccompat/v7", "enable_watermark": True}
    else:
        assert wl.codec == {}
    with pytest.raises(ValueError):
        B.source_codec("avro")


def _record_batch(msgs) -> "pa.RecordBatch":
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array([m.topic for m in msgs], pa.string()), pa.array([m.partition for m in msgs], pa.int32()),
         pa.array([m.offset for m in msgs], pa.int64()), pa.array([m.key for m in msgs], pa.binary()),
         pa.array([m.value for m in msgs], pa.binary())], names=["topic", "partition", "offset", "key", "value"])


def _topic(wl) -> list[list]:
    """The stream as a topic: per partition, its records in offset order."""
    from applier.events import KafkaMessage

    parts: dict[int, list] = {}
    for part, key, value in wl.messages():
        msgs = parts.setdefault(part, [])
        msgs.append(KafkaMessage("bench-x", part, len(msgs), key, value))
    return [parts[p] for p in sorted(parts)]


def _workers_read(spec, topic: list[list]) -> list[bytes]:
    """What read_chunks returns, with this process as the Python worker of every Spark partition (one per Kafka
    partition, in order)."""
    from applier.decode import decode_arrow_batches

    return [rb.column(0)[0].as_py() for msgs in topic for rb in decode_arrow_batches(spec, iter([_record_batch(msgs)]))]


def test_simple_decode_only_carries_the_schemas_a_driver_learnt_from_a_first_pass(monkeypatch) -> None:
    """The decode-only passes of Simple: a first pass without a snapshot teaches the driver decoder every table's
    schema; with its snapshot the workers decode every row and leave only the schema messages to the driver, and
    the rebuilt read is the whole topic."""
    import orjson

    import applier.decode as D
    from applier.codecs import get_decoder
    from applier.decode import WorkerSpec, with_schemas
    from applier.devtools import bench_stream
    from applier.devtools.bench_stream import generate_bench
    from applier.events import RowChange

    monkeypatch.setattr(D, "_worker_decoders", {})  # fresh worker processes
    monkeypatch.setattr(bench_stream, "SIMPLE_BOOTSTRAP_MESSAGES", 100)
    wl = generate_bench("simple", tables=3, partitions=2, events=900, seed=3, hot_keys=4)
    topic = _topic(wl)
    kinds = [orjson.loads(m.value)["type"] for msgs in topic for m in msgs]
    schema_messages = kinds.count("CREATE") + kinds.count("BOOTSTRAP")
    assert kinds.count("BOOTSTRAP") > 0
    spec = WorkerSpec("simple", (), stop_at_error=True)
    driver = get_decoder("simple")

    first = _workers_read(spec, topic)
    _, cold = B.rebuild(first, get_decoder("simple"))
    assert cold["provisional"] > 0  # without a snapshot the workers decode with what they learnt, for checking
    assert B.learn_schemas(driver, first) == 3

    decoded, left = B.rebuild(_workers_read(with_schemas(spec, driver), topic), driver)
    assert left == {"left_to_driver": schema_messages, "provisional": 0}
    assert decoded.messages == sum(len(msgs) for msgs in topic) == wl.stats.messages
    rows = sum(isinstance(ev, RowChange) for ev in decoded.events)
    assert rows == wl.stats.row_events + wl.stats.duplicate_row_events


def test_decode_only_refuses_a_read_with_decode_errors(monkeypatch) -> None:
    import applier.decode as D
    from applier.codecs import get_decoder
    from applier.decode import WorkerSpec
    from applier.events import KafkaMessage

    monkeypatch.setattr(D, "_worker_decoders", {})
    chunks = _workers_read(WorkerSpec("canal-json", (), stop_at_error=False),
                           [[KafkaMessage("bench-x", 0, 0, None, b"not json")]])
    with pytest.raises(RuntimeError, match="1 message\\(s\\) did not decode, first bench-x\\[0\\]@0"):
        B.rebuild(chunks, get_decoder("canal-json"))


def test_the_avro_stream_decodes_to_the_expected_tables() -> None:
    """The bench's Avro stream (schemas in a registry, TiDB extension and watermarks) decodes, applied in commit-ts
    order as the gate does, to the generator's checksums; it needs a registry and a topic, and only it takes them."""
    import collections

    from applier.codecs.avro import AvroDecoder
    from applier.devtools.bench_stream import bench_checksum, generate_bench
    from applier.devtools.encoders.registry import InMemoryRegistry
    from applier.events import DDL, KafkaMessage, Op, Resolved, RowChange

    reg = InMemoryRegistry()
    wl = generate_bench("avro", tables=3, partitions=2, events=2000, big_txn_rows=300, seed=5, hot_keys=4,
                        dup_fraction=0.05, registry=reg, topic="bench-x")
    dec = AvroDecoder(registry=reg, enable_watermark=True)
    kinds: collections.Counter = collections.Counter()
    changes = []
    for msgs in _topic(wl):
        for m in msgs:
            for ev in dec.decode(m):
                kinds[type(ev)] += 1
                if isinstance(ev, RowChange):
                    changes.append((ev.commit_ts, m.partition, m.offset, ev))
    assert kinds[DDL] == 3 * 2 and kinds[Resolved] == wl.stats.resolved_messages > 0
    assert wl.stats.duplicate_row_events > 0 and wl.stats.key_changes > 0
    assert reg.subjects() == ["bench-x-key", "bench-x-value"]
    state: dict = {}
    for *_, ev in sorted(changes, key=lambda c: c[:3]):
        k = (ev.table, (ev.after or ev.before)["id"])
        if ev.op is Op.DELETE:
            state.pop(k, None)
        else:
            state[k] = ev.after
    for table, cs in wl.expected.items():
        got = bench_checksum(r for (t, _), r in state.items() if t == table)
        assert (got.rows, got.digest_sum) == (cs.rows, cs.digest_sum)
    with pytest.raises(ValueError):
        generate_bench("avro", registry=reg)
    with pytest.raises(ValueError):
        generate_bench("open", registry=reg, topic="bench-x")


def test_stream_notes_say_how_an_ungated_run_is_verified_and_what_simple_left_to_the_driver() -> None:
    r = {"params": {"protocol": "debezium"}, "stream": {"gated": False, "columns": ["id", "ver"]},
         "runs": [{"workers": 1, "decode_only": {"us_per_event": 1.0}}]}
    (line,) = B.stream_notes(r)
    assert "debezium: an ungated stream" in line and "(id, ver), not the applied resolved ts" in line
    r = {"params": {"protocol": "simple"}, "stream": {"gated": True, "columns": ["id"]},
         "runs": [{"workers": 2, "decode_only": {"snapshot_tables": 8, "schema_pass_s": 3.25, "left_to_driver": 96,
                                                  "provisional": 0, "messages": 20_000}},
                  {"workers": 3, "error": "x"}]}
    (line,) = B.stream_notes(r)
    assert line.startswith("  2 worker(s): the decode-only passes carried the schema snapshot (8 tables)")
    assert "(3.2 s); the workers left 96 of 20,000 messages to the driver's decoder and sent 0 provisional rows" in line
    assert B.stream_notes({"params": {"protocol": "open"}, "runs": []}) == []


# ---- figures --------------------------------------------------------------------------------------------------

def _run(workers: int, read: float, apply: float, apply_cpu: float, decode: float | None = None,
         util: float = 0.8, busy: float = 0.6, through: float = 10.0) -> dict:
    run = {"workers": workers,
           "pipeline": {"read_us_per_event": read, "apply_us_per_event": apply, "apply_cpu_us_per_event": apply_cpu,
                        "apply_utilisation": util},
           "cpu": {"machine_busy_share": busy}}
    if decode is not None:
        run["decode_only"] = {"us_per_event": decode, "decode_us_per_event": decode - through}
    return run


def test_the_slower_side_bounds_a_run_and_each_side_has_its_ceiling() -> None:
    f = B.run_figures(_run(1, read=50.0, apply=40.0, apply_cpu=30.0))
    assert f["bound_by"] == "read"
    assert f["read_ceiling_events_per_s"] == pytest.approx(20_000)
    assert f["apply_ceiling_events_per_s"] == pytest.approx(25_000)
    assert f["apply_cpu_share"] == pytest.approx(0.75)
    assert B.run_figures(_run(2, read=30.0, apply=40.0, apply_cpu=30.0))["bound_by"] == "apply"


def test_per_event_and_ceiling_handle_empty_runs() -> None:
    assert B.per_event_us(2.0, 100_000) == pytest.approx(20.0)
    assert B.per_event_us(2.0, 0) is None and B.per_event_us(None, 5) is None
    assert B.ceiling(20.0) == pytest.approx(50_000) and B.ceiling(None) is None and B.ceiling(0.0) is None


def test_read_model_goes_through_both_points_and_finds_the_crossing() -> None:
    m = B.ReadModel.fit(1, 60.0, 2, 40.0)  # 20 + 40/n
    assert (m.fixed_us, m.spread_us) == (pytest.approx(20.0), pytest.approx(40.0))
    assert m.at(4) == pytest.approx(30.0)
    assert m.workers_below(40.0) == 2  # exactly at the measured point
    assert m.workers_below(30.0) == 4
    assert m.workers_below(61.0) == 1
    assert m.workers_below(20.0) is None  # the part that does not spread is already there
    flat = B.ReadModel.fit(1, 40.0, 2, 45.0)  # reading got slower with a worker more: it does not scale
    assert flat.workers_below(50.0) == 1 and flat.workers_below(30.0) is None
    with pytest.raises(ValueError):
        B.ReadModel.fit(2, 1.0, 2, 2.0)


def test_summary_and_conclusion_take_their_numbers_from_the_runs() -> None:
    runs = [_run(1, read=60.0, apply=35.0, apply_cpu=28.0, decode=45.0, busy=0.70),
            _run(2, read=40.0, apply=36.0, apply_cpu=27.0, decode=30.0, util=0.9, busy=0.85),
            {"workers": 3, "error": "ClusterError: no 3 ALIVE worker(s)"}]
    s = B.summarize(runs)
    assert [f["bound_by"] for f in s["runs"]] == ["read", "read"]
    assert s["best_apply_us_per_event"] == 35.0
    assert s["decode_scaling"]["ratio"] == pytest.approx(30 / 45)
    assert s["decode_scaling"]["decode_alone_us_per_event"] == [35.0, 20.0]
    assert s["decode_model"] == {"fixed_us_per_event": pytest.approx(15.0), "spread_us_per_event": pytest.approx(30.0),
                                 "below_apply_from_workers": 2}  # 15 + 30/n <= 35 from n = 1.5
    assert s["read_model"] == {"fixed_us_per_event": pytest.approx(20.0), "spread_us_per_event": pytest.approx(40.0),
                               "below_apply_from_workers": 3}  # 20 + 40/n <= 35 from n = 2.67
    assert s["apply_streams_to_match_read"] == 1  # 36 / 40
    assert s["machine_busy_share_max"] == 0.85 and not s["saturated"]
    text = B.conclusion(runs, s)
    assert "fell from 45.0 us (1 worker) to 30.0 us (2 workers), x0.67; decoding alone (minus the pass-through " \
           "query) 35.0 -> 20.0 us" in text
    assert "decode-only cost fits 15.0 + 30.0/n us/event: it gets below the apply thread's 35.0 us/event from " \
           "about 2 one-core worker(s)" in text
    assert "per-micro-batch costs) fits 20.0 + 40.0/n us/event" in text and "from about 3 one-core" in text
    assert "28,571 events/s" in text  # 1 / 35 us, the 1-worker run's apply ceiling
    assert "75% its own CPU" in text and "separate processes: most of its time is Python holding the GIL" in text
    assert "a second one pays only once the read gets below 36.0 us/event" in text
    assert "machine CPU busy 85%" in text and "Caveat" not in text and "already the limit" not in text
    assert "25,000 events/s" in text  # the best read ceiling, 1 / 40 us


def test_conclusion_when_apply_already_bounds_and_decoding_does_not_scale() -> None:
    runs = [_run(1, read=30.0, apply=50.0, apply_cpu=10.0, decode=20.0, busy=0.95),
            _run(2, read=31.0, apply=52.0, apply_cpu=10.0, decode=21.0)]
    s = B.summarize(runs)
    assert [f["bound_by"] for f in s["runs"]] == ["apply", "apply"]
    assert s["read_model"]["below_apply_from_workers"] == 1
    assert s["apply_streams_to_match_read"] == 2  # ceil(52 / 30)
    assert s["saturated"]
    text = B.conclusion(runs, s)
    assert "did not fall" in text and "the apply side bounds it" in text
    assert "already the limit with 1 worker(s)" in text
    assert "Caveat: the machine was up to 95% busy" in text
    assert "threads or processes: 81% of its time is not its own CPU" in text and "2 stream(s)" in text


def test_crossing_names_a_part_that_does_not_spread() -> None:
    text = B._crossing("X", {"fixed_us_per_event": 50.0, "spread_us_per_event": 10.0,
                             "below_apply_from_workers": None}, 40.0)
    assert "at no worker count (its part that does not spread, 50.0 us/event" in text
    flat = B._crossing("X", {"fixed_us_per_event": 50.0, "spread_us_per_event": -1.0,
                             "below_apply_from_workers": None}, 40.0)
    assert "it did not fall" in flat
    assert B._crossing("X", None, 1.0) is None


def test_steady_state_leaves_the_first_batch_out() -> None:
    st = B.steady_state(on_batch=[5.0, 1.1, 1.2], submit_wait=[0.0, 0.1, 0.2], process=[0.5, 0.4, 0.4],
                        messages=[1000, 2000, 2000], events=4500)
    assert st["batches"] == 2 and st["events"] == 3600  # 4500 * 4000 / 5000
    assert st["read_us_per_event"] == pytest.approx(2.0e6 / 3600)
    assert st["apply_us_per_event"] == pytest.approx(0.8e6 / 3600)
    assert (st["first_batch_read_s"], st["first_batch_apply_s"], st["first_batch_messages"]) == (5.0, 0.5, 1000)
    assert B.steady_state([1.0], [0.0], [1.0], [10], 10) is None  # one batch: nothing after the first
    assert B.steady_state([1.0, 1.0], [0.0], [1.0, 1.0], [10, 10], 20) is None  # lists that do not line up
    assert B.steady_state([1.0, 1.0], [0.0, 0.0], [1.0, 1.0], [10, 0], 20) is None  # nothing after the first


def test_verdict_uses_the_steady_state_when_there_is_one() -> None:
    run = _run(1, read=100.0, apply=40.0, apply_cpu=20.0)
    run["pipeline"]["steady"] = {"read_us_per_event": 30.0, "apply_us_per_event": 35.0}
    f = B.run_figures(run)
    assert (f["basis"], f["bound_by"], f["read_us_per_event"]) == ("after the first micro-batch", "apply", 30.0)
    assert f["apply_cpu_share"] == pytest.approx(0.5)  # CPU share over the whole run
    assert B.read_apply(_run(1, read=1.0, apply=2.0, apply_cpu=1.0)["pipeline"]) == (1.0, 2.0, "whole run")


def test_conclusion_without_a_completed_run() -> None:
    runs = [{"workers": 1, "error": "x"}]
    assert B.conclusion(runs, B.summarize(runs)).startswith("no run completed")


def test_report_prints_every_run_and_the_conclusion() -> None:
    runs = [_run(1, read=60.0, apply=35.0, apply_cpu=28.0, decode=45.0), {"workers": 2, "error": "Boom: x\ny"}]
    for run in runs[:1]:
        run["pipeline"].update(wall_s=10.0, events_per_s=1000.0, batches=4, read_s=6.0, apply_s=3.5,
                               outside_batches_s=2.0, apply_split_s={"decode": 1.0})
        run["decode_only"].update(passthrough_us_per_event=10.0, cpu={"machine_busy_share": 0.5})
        run.update(verify={"ok": True}, cluster_start_s=9.0, spark_session_s=12.0)
    r = {"params": {"protocol": "canal-json", "target": "postgres", "partitions": 6, "max_offsets_per_trigger": 25_000},
         "workload": {"row_events": 10_000, "messages": 10_100}, "machine": {"cpus": 2}, "runs": runs,
         "summary": B.summarize(runs), "conclusion": "C.", "measuring_seconds": 99.0}
    text = B.format_report(r)
    assert "      1 |             45.0 |          10.0 |   50% |   10.0 |    1,000 |    60.0 |     35.0 |" in text
    assert "      2 | FAILED: Boom: x" in text and "conclusion: C." in text


def test_thread_cpu_clock_counts_only_the_spans_own_thread() -> None:
    clock = B.ThreadCpuClock()
    with clock.span("process"):
        t = time.thread_time()
        while time.thread_time() - t < 0.02:
            pass
    with clock.span("on_batch"):
        time.sleep(0.05)
    assert clock.cpu["process"] >= 0.02 and clock.seconds["process"] >= 0.02
    assert clock.cpu["on_batch"] < 0.02 <= clock.seconds["on_batch"]  # sleeping is wall, not CPU
    assert clock.calls["process"] == 1 and clock.first_batch_at is not None


def test_all_verified_needs_every_run() -> None:
    assert B.all_verified({"runs": [{"verify": {"ok": True}}, {"verify": {"ok": True}}]})
    assert not B.all_verified({"runs": [{"verify": {"ok": True}}, {"workers": 2, "error": "x"}]})
    assert not B.all_verified({"runs": [{"verify": {"ok": False}}]})


# ---- the cluster's master document ---------------------------------------------------------------------------

MASTER_JSON = {
    "url": "spark://127.0.0.1:7077", "status": "ALIVE", "aliveworkers": 2, "cores": 3, "coresused": 0,
    "workers": [
        {"id": "worker-1", "host": "127.0.0.1", "cores": 1, "state": "ALIVE"},
        {"id": "worker-2", "host": "127.0.0.1", "cores": 1, "state": "ALIVE"},
        {"id": "worker-0", "host": "127.0.0.1", "cores": 1, "state": "DEAD"},
    ],
    "activeapps": [], "completedapps": [],
}


def test_master_document_is_read_from_the_worker_list() -> None:
    assert C.master_alive(MASTER_JSON)
    assert not C.master_alive({"status": "STANDBY"}) and not C.master_alive({})
    assert C.alive_workers(MASTER_JSON) == 2
    assert C.alive_cores(MASTER_JSON) == 2  # the DEAD worker's core is not offered
    stale = dict(MASTER_JSON, aliveworkers=3)  # the list decides
    assert C.alive_workers(stale) == 2
    assert C.alive_workers({"aliveworkers": 1}) == 1 and C.alive_workers({}) == 0
    assert C.alive_cores({"cores": 4}) == 4


def test_driver_conf_pins_loopback_and_claims_every_core() -> None:
    conf = C.driver_conf(2, python="/venv/bin/python", extra={"spark.locality.wait": "3s", "spark.y": "1"})
    assert conf["spark.cores.max"] == "2" and conf["spark.executor.cores"] == "1"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert conf["spark.pyspark.python"] == "/venv/bin/python"
    assert conf["spark.locality.wait"] == "3s" and conf["spark.y"] == "1"  # extra settings win
    cl = C.Cluster("spark://127.0.0.1:1", "http://127.0.0.1:2", workers=3, cores_per_worker=2, root=C.Path("/x"))
    assert cl.cores == 6 and cl.driver_conf()["spark.cores.max"] == "6"


def test_cluster_refuses_nonsense_before_starting_anything() -> None:
    with pytest.raises(ValueError):
        with C.standalone_cluster(0):
            pass


def test_free_port_is_bindable() -> None:
    import socket

    port = C.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
