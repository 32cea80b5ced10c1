"""The Spark-floor benchmark's pure parts (applier.devtools.bench_floor): arguments, per-message figures and the
report, which must name a failed mode rather than hide it."""

from __future__ import annotations

import pytest

from applier.devtools import bench_floor as F


def test_defaults_measure_every_mode_on_two_local_cores() -> None:
    a = F.parse_args([])
    assert a.modes == ["count", "passthrough", "decode"]
    assert (a.cores, a.max_offsets_per_trigger, a.events, a.topic, a.spark_conf) == (2, 200_000, 1_000_000, None, {})


def test_arguments_take_a_kept_topic_modes_and_conf() -> None:
    a = F.parse_args(["--topic", "bench-x", "--modes", "decode, count", "--spark-conf", "spark.a=b", "--cores", "1"])
    assert (a.topic, a.modes, a.spark_conf, a.cores) == ("bench-x", ["decode", "count"], {"spark.a": "b"}, 1)


@pytest.mark.parametrize("argv", [["--modes", "count,read"], ["--modes", ","], ["--cores", "0"],
                                  ["--events", "10", "--big-txn-rows", "20"], ["--spark-conf", "novalue"]])
def test_bad_arguments_exit_with_usage(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        F.parse_args(argv)
    assert exc.value.code == 2


def test_figures_per_message_and_total() -> None:
    f = F.figures("decode", 30.0, 1_000_000, {"driver": 0.6, "jvm": 23.5, "python-worker": 27.4})
    assert f["messages_per_s"] == 33_333
    assert f["cpu_us_per_message"] == {"driver": 0.6, "jvm": 23.5, "python-worker": 27.4}
    assert f["cpu_us_per_message_total"] == 51.5
    assert F.figures("count", 0.0, 0, {"jvm": 1.0})["cpu_us_per_message_total"] is None


def test_report_names_a_failed_mode() -> None:
    ok = F.figures("count", 11.4, 1_005_844, {"driver": 0.2, "jvm": 16.3})
    r = {"topic": "t", "messages": 1_005_844, "cores": 2, "max_offsets_per_trigger": 200_000,
         "modes": [ok, {"mode": "decode", "error": "RuntimeError: boom\nmore"}]}
    text = F.format_report(r)
    assert "count" in text and "jvm 16.2" in text and "88,232 msg/s" in text
    assert "decode       FAILED: RuntimeError: boom" in text and "more" not in text
