"""The benchmark's argument parsing and pure helpers (no services); the run itself is ``python -m applier.devtools.bench``."""

from __future__ import annotations

import collections
import datetime as dt
import json
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


# ---- --whole-process: the child's config and command, the process timing, the report -----------------------

SECRET = "s3cr3t-pw"
URL = f"postgresql+psycopg://applier:{SECRET}@127.0.0.1:15432/applier"


def _config(argv: list[str]) -> tuple:
    a = parse_args(argv)
    cfg = bench.applier_config(a, name="bench-x", ckpt=bench.Path("/tmp/ckpt-x"), kafka="127.0.0.1:19092",
                               topic="bench-x", url=URL, source_schema="bench", schema="bench_x")
    return a, cfg


def test_whole_process_config_is_the_default_config_without_the_password() -> None:
    import tomllib

    from applier.config import parse_config

    a, cfg = _config(["--whole-process"])
    child = bench.whole_process_config(a, cfg)
    text = bench.toml_text(child)
    assert SECRET not in text  # the password goes to the child through its environment only
    assert child["target"] == {"url": "postgresql+psycopg://applier@127.0.0.1:15432/applier",
                               "password_env": "APPLIER_BENCH_TARGET_PASSWORD"}
    assert child["pipeline"] == {"name": "bench-x", "checkpoint_dir": "/tmp/ckpt-x"}  # no bench tuning
    assert "spark" not in child
    assert cfg["target"]["url"] == URL and cfg["pipeline"]["max_offsets_per_trigger"] == 200_000  # not changed
    settings = parse_config(tomllib.loads(text), env={"APPLIER_BENCH_TARGET_PASSWORD": SECRET})
    inproc = parse_config(cfg)
    assert settings.target_url() == inproc.target_url()
    assert (settings.pipeline.name, settings.source.topics, settings.source.protocol, settings.routes) == (
        inproc.pipeline.name, inproc.source.topics, inproc.source.protocol, inproc.routes)
    assert settings.pipeline.max_offsets_per_trigger is None  # the product's default, as `applier run` has it
    assert SECRET not in repr(settings) and SECRET not in json.dumps(settings.redacted(), default=str)


def test_passwordless_url_gets_no_password_env() -> None:
    a, cfg = _config([])
    cfg["target"]["url"] = "postgresql+psycopg://applier@127.0.0.1:15432/applier"
    assert bench.whole_process_config(a, cfg)["target"] == {"url": cfg["target"]["url"]}
    assert bench.split_password(URL) == ("postgresql+psycopg://applier@127.0.0.1:15432/applier", SECRET)


def test_printed_rerun_command_takes_the_password_from_the_services_variable() -> None:
    import os
    import subprocess
    word = bench.password_from_env("APPLIER_PG_URL")
    assert SECRET not in word
    out = subprocess.run(["bash", "-c", f"X={word}; printf %s \"$X\""], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "APPLIER_PG_URL": URL.replace(SECRET, "p%40ss'w d")})
    assert out.stdout == "p@ss'w d", out.stderr


def test_whole_process_config_keeps_what_the_user_asked_for() -> None:
    a, cfg = _config(["--whole-process", "--max-offsets-per-trigger", "12500", "--batch-rows", "1000", "--cores", "1",
                      "--decode-on", "driver", "--spark-conf", "spark.x=1"])
    child = bench.whole_process_config(a, cfg)
    assert child["pipeline"]["max_offsets_per_trigger"] == 12_500 and child["pipeline"]["decode_on"] == "driver"
    assert "buffer_memory_mb" not in child["pipeline"]
    assert child["target"]["batch_rows"] == 1000
    assert child["spark"] == {"master": "local[1]", "conf": {"spark.x": "1"}}


def test_rerun_config_and_commands() -> None:
    a, cfg = _config(["--keep"])
    rerun = bench.rerun_config(bench.whole_process_config(a, cfg))
    assert rerun["pipeline"]["name"] == "bench-x-rerun" and rerun["route"][0]["schema"] == "bench_x_rerun"
    assert rerun["pipeline"]["checkpoint_dir"] == "/tmp/ckpt-x-rerun"
    assert cfg["route"][0]["schema"] == "bench_x"
    assert bench.applier_command("/c.toml", verbose=True)[1:] == ["-m", "applier", "-v", "run", "-c", "/c.toml",
                                                                   "--until-caught-up"]
    assert "-v" not in bench.applier_command("/c.toml")


def test_toml_text_round_trips() -> None:
    import tomllib
    cfg = {"pipeline": {"name": "n", "buffer_memory_mb": 5}, "spark": {"master": "local[1]", "conf": {"a.b": "x"}},
           "source": {"topics": ["t"]}, "route": [{"match": 'we"ird\n.*', "schema": "s"}]}
    assert tomllib.loads(bench.toml_text(cfg)) == cfg


def test_whole_process_rejects_in_process_only_options() -> None:
    for argv in (["--whole-process", "--profile", "/tmp/p"], ["--whole-process", "--startup", "1"]):
        with pytest.raises(SystemExit):
            parse_args(argv)


def test_child_output_parsing() -> None:
    assert bench.applied_rows_in("2026-01-01 INFO applier.pipeline: batch 3: 10 messages, 7 rows, 0 DDL, applied ts 5")
    assert not bench.applied_rows_in("... batch 0: 48 messages, 0 rows, 8 DDL, applied ts 0, held 0")
    assert not bench.applied_rows_in("nothing here")
    out = ("pipeline bench-x: 4 batch(es), 1200 messages, 50000 row changes, 8 DDL applied (0 skipped), applied "
           "resolved ts 9, 0 event(s) held above it\n")
    assert bench.parse_run_summary(out) == {"batches": 4, "messages": 1200, "row_changes_applied": 50000, "ddls": 8}
    assert bench.parse_run_summary("") == {}


def test_time_process_times_the_child_and_fails_loudly(tmp_path) -> None:
    import sys
    ok = ("import sys, time; print('batch 0: 3 messages, 0 rows, 1 DDL', file=sys.stderr, flush=True); "
          "time.sleep(0.2); print('batch 1: 3 messages, 2 rows, 0 DDL', file=sys.stderr, flush=True); time.sleep(0.3);"
          "print('pipeline p: 2 batch(es), 6 messages, 2 row changes, 1 DDL applied')")
    res = bench.time_process([sys.executable, "-c", ok], {}, lambda m: None)
    assert res["wall_seconds"] >= 0.5 and 0.2 <= res["first_applied_batch_seconds"] < res["wall_seconds"]
    assert res["messages"] == 6 and res["batches"] == 2
    logged: list[str] = []
    bad = "import sys; [print('line', i, file=sys.stderr) for i in range(100)]; sys.exit(3)"
    with pytest.raises(RuntimeError, match="exited with 3"):
        bench.time_process([sys.executable, "-c", bad], {}, logged.append)
    assert logged[-1] == "  | line 99" and len(logged) == 1 + bench.STDERR_TAIL_LINES


def test_write_private_is_owner_only(tmp_path) -> None:
    import os
    p = tmp_path / "c.toml"
    bench.write_private(p, "x = 1\n")
    assert p.read_text() == "x = 1\n" and os.stat(p).st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        bench.write_private(p, "again")


def _result(**over) -> dict:
    """A result as run_bench returns it for the in-process mode (figures made up)."""
    r = {
        "params": {"protocol": "canal-json", "target": "postgres", "cores": 2, "tables": 8, "partitions": 6,
                   "big_txn_rows": 100, "seed": 1},
        "versions": {"python": "3.11"},
        "workload": {"row_events": 50_000, "duplicate_row_events": 10, "inserts": 25_000, "updates": 17_500,
                     "deletes": 7_500, "key_changes": 100, "transactions": 3000, "largest_txn_rows": 100,
                     "messages": 50_100, "bytes": 40_000_000},
        "verify": {"ok": True, "rows": 20_000, "tables": 8, "differences": {}},
        "spark_startup_seconds": 4.0,
        "applier": {"whole_process": False, "wall_seconds": 5.0, "events_per_s": 10_000.0,
                    "rows_written_per_s": 8_000.0, "rows_written": 40_000, "rows_upserted": 30_000,
                    "rows_deleted": 10_000, "messages_per_s": 10_020.0, "batches": 1},
        "kafka_raw": {"messages_per_s": 100_000.0, "bytes_per_s": 1e8},
        "bulk_load": {"rows_per_s": 200_000.0, "method": "COPY"},
        "memory": {"driver_peak_rss_during_run": 2**29, "driver_peak_rss_lifetime": 2**30,
                   "children_sampled": {"jvm": 2**30}, "rusage_children_maxrss": 2**20},
        "ratios": {"events_per_s_to_bulk_load_rows_per_s": 0.05, "events_per_s_to_bulk_load_only_rows_per_s": None,
                   "messages_per_s_to_kafka_raw_messages_per_s": 0.1},
        "stages": [{"stage": "read", "seconds": 1.0, "share": 0.2, "what": "reading"}],
        "stages_not_measured": ["something"],
    }
    r.update(over)
    return r


def test_report_in_process_unchanged_without_the_new_fields() -> None:
    text = bench.format_report(_result())
    assert "wall time (run)" in text and "Spark session start 4.0 s" in text
    assert "driver peak RSS" in text and "stage split" in text and "rows written/s" in text
    assert "merge path" not in text and "rerun" not in text and "whole process" not in text


def test_report_with_merge_path_and_whole_process() -> None:
    merge = {"rows": 50_000, "rows_per_s": 40_000.0, "batches": 10, "batch_rows": 5000, "rows_written": 41_000,
             "copy_format": "binary"}
    r = _result(merge_path=merge)
    r["ratios"]["events_per_s_to_merge_path_rows_per_s"] = 0.25
    assert "ratio to PG merge path              0.250" in bench.format_report(r)
    whole = _result(merge_path=merge, applier={
        "whole_process": True, "wall_seconds": 12.5, "events_per_s": 4_000.0, "messages_per_s": 4_008.0, "batches": 2,
        "time_to_first_applied_batch_seconds": 9.25},
        rerun={"command": "APPLIER_BENCH_TARGET_PASSWORD=... python -m applier run -c /x --until-caught-up"})
    for key in ("memory", "stages", "stages_not_measured", "spark_startup_seconds"):
        del whole[key]
    text = bench.format_report(whole)
    assert "wall time (whole process)" in text and "12.5 s" in text
    assert "first batch with rows applied after 9.2" in text
    assert "driver peak RSS" not in text and "stage split" not in text and "rows written/s" not in text
    assert "PG merge path rows/s" in text and "APPLIER_BENCH_TARGET_PASSWORD=... python -m applier run" in text


def test_run_ratios_include_the_merge_path_only_when_measured() -> None:
    r = _result()
    assert "events_per_s_to_merge_path_rows_per_s" not in bench.run_ratios(r, 10_000.0, 10_000.0)
    r["merge_path"] = {"rows_per_s": 40_000.0}
    ra = bench.run_ratios(r, 10_000.0, 10_000.0)
    assert ra["events_per_s_to_merge_path_rows_per_s"] == 0.25 and ra["events_per_s_to_bulk_load_rows_per_s"] == 0.05
