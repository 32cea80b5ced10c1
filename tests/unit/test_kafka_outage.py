"""A Kafka outage while running is retried like a target outage (invariant 14): which failures of the Kafka source
count as an outage (real Java exception texts captured from runs against a real broker, in ``kafka_errors/``), the
backoff that starts again after every applied batch, the ``source.retry_seconds`` budget and the exit it ends in.
The real outage is ``tests/e2e/test_kafka_outage.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier import pipeline as P
from applier.config import ConfigError, parse_config
from applier.pipeline import OutageClock, SourceUnreachable, java_summary, kafka_transient
from applier.processor import BatchReport

ERRORS = Path(__file__).parent / "kafka_errors"


def text(name: str) -> str:
    return (ERRORS / f"{name}.txt").read_text()


# ---- which failures are an outage ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "query_broker_gone",  # the live query's offset request after the broker stopped (StreamingQueryException)
    "list_topics_broker_gone",  # kafka_partitions() at a restart or in the periodic refresh, broker stopped
    "position_timeout",  # the Java consumer's position() with no broker (Spark's executor-side reads call it)
])
def test_a_broker_that_does_not_answer_is_an_outage(name) -> None:
    assert kafka_transient(text(name))


@pytest.mark.parametrize("name", [
    "data_loss",  # failOnDataLoss: Kafka no longer holds the restart offsets (records deleted under them)
    "topic_deleted_while_running",  # UnknownTopicOrPartitionException
    "sasl_wrong_password_list_topics",  # SaslAuthenticationException, from kafka_partitions()
    "sasl_wrong_password_spark_read",  # the same through the Spark source
    "topic_not_authorized_spark_read",  # TopicAuthorizationException (a broker with ACLs)
    "topic_not_authorized_spark_assign",
])
def test_what_waiting_does_not_repair_is_not_an_outage(name) -> None:
    assert not kafka_transient(text(name))


def test_only_the_exception_lines_count_not_the_stack_frames() -> None:
    frame = "\tat org.apache.spark.sql.kafka010.KafkaDataConsumer.failOnDataLoss(KafkaDataConsumer.scala:1)\n"
    assert kafka_transient(text("query_broker_gone") + frame)
    frame = "\tat org.apache.kafka.common.errors.TimeoutException.<init>(TimeoutException.java:1)\n"
    assert not kafka_transient("java.lang.IllegalStateException: something else\n" + frame)


def test_no_java_text_is_no_outage() -> None:
    assert not kafka_transient("")
    assert not kafka_transient("ValueError: a plain Python error")


def test_the_one_line_cause_is_the_innermost_exception() -> None:
    assert java_summary(text("query_broker_gone")) == (
        "org.apache.kafka.common.errors.TimeoutException: Timed out waiting for a node assignment. Call: listNodes")
    assert java_summary(text("list_topics_broker_gone")) == (
        "org.apache.kafka.common.errors.TimeoutException: Timeout expired while fetching topic metadata")
    assert "\n" not in java_summary(text("data_loss"))


def test_a_source_failure_carries_its_cause() -> None:
    exc = SourceUnreachable("cannot list topics", cause=text("list_topics_broker_gone"),
                            reason="org.apache.kafka.common.errors.TimeoutException: Timeout expired")
    assert exc.transient and not exc.running and exc.reason.startswith("org.apache.kafka")
    assert not SourceUnreachable("refused", cause=text("sasl_wrong_password_list_topics")).transient
    assert not SourceUnreachable("cannot connect to any Kafka bootstrap server").transient


# ---- the backoff and the budget --------------------------------------------------------------------------------

class FakeTime:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_the_backoff_doubles_per_failed_try_and_starts_again_after_a_batch_applied() -> None:
    now = FakeTime()
    clock = OutageClock(now)
    waits = []
    for _ in range(7):
        now.t += 1
        clock.failed()
        waits.append(clock.wait())
    assert waits == [0.5, 1, 2, 4, 8, 15, 15]
    assert clock.spent() == 6
    now.t += 100
    clock.batch_applied()  # the outage is over: a later one starts from the shortest wait and a fresh budget
    now.t += 1000
    clock.failed()
    assert clock.wait() == 0.5 and clock.spent() == 0
    now.t += 3
    clock.failed()
    assert clock.wait() == 1 and clock.spent() == 3


def settings(source_retry: int = 60, target_retry: int = 300):
    return parse_config({
        "pipeline": {"name": "p", "checkpoint_dir": "/tmp/p"},
        "source": {"bootstrap_servers": "kafka-1:9092,kafka-2:9092", "topics": ["t"], "protocol": "canal-json",
                   "retry_seconds": source_retry},
        "target": {"url": "mysql+pymysql://u@h/db", "retry_seconds": target_retry},
    })


class NoTransientTarget:
    def is_transient(self, exc) -> bool:
        return False


def outage(running: bool = True, name: str = "query_broker_gone") -> SourceUnreachable:
    cause = text(name)
    return SourceUnreachable(f"the Kafka source failed: {java_summary(cause)}", cause=cause, running=running)


def retrying(monkeypatch, outcomes, *, now: FakeTime, source_retry: int = 60, step: float = 1.0):
    """``_run_retrying`` over a ``_run`` that takes its outcomes in turn (an exception is raised, "applied" marks a
    batch applied and raises the next outcome, anything else is returned); returns (result or exception, sleeps)."""
    calls = iter(outcomes)
    sleeps: list[float] = []

    def fake_run(settings, spark, engine, dialect, until_caught_up, progress, mark, timer, *, until_ts=None):
        now.t += step
        item = next(calls)
        if item == "applied":
            mark.batch_applied()
            now.t += step
            item = next(calls)
        if isinstance(item, BaseException):
            raise item
        return item

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now.t += seconds

    monkeypatch.setattr(P, "_run", fake_run)
    try:
        res = P._run_retrying(settings(source_retry), object(), None, NoTransientTarget(), False, False,
                              clock=OutageClock(now), sleep=sleep)
    except Exception as exc:  # noqa: BLE001 - returned for the test to look at
        res = exc
    return res, sleeps


def test_a_kafka_outage_while_running_starts_over_with_backoff_that_restarts_after_a_batch(monkeypatch, caplog) -> None:
    done = P.RunResult(3, BatchReport())
    at_restart = outage(running=False, name="list_topics_broker_gone")  # kafka_partitions() at a restart attempt
    res, sleeps = retrying(monkeypatch, [outage(), at_restart, at_restart, "applied", outage(), at_restart, done],
                           now=FakeTime())
    assert res is done
    assert sleeps == [0.5, 1, 2, 0.5, 1]
    lines = [r.getMessage() for r in caplog.records if "Kafka failed while running" in r.getMessage()]
    assert len(lines) == 5
    assert all("\n" not in ln and "source.bootstrap_servers = kafka-1:9092,kafka-2:9092" in ln
               and "source.retry_seconds = 60" in ln and "org.apache.kafka.common.errors.TimeoutException" in ln
               for ln in lines), lines


def test_after_source_retry_seconds_the_run_stops_naming_the_bootstrap_servers(monkeypatch) -> None:
    res, sleeps = retrying(monkeypatch, [outage()] * 50, now=FakeTime(), source_retry=60, step=10)
    assert isinstance(res, SourceUnreachable) and res.running
    assert "kafka-1:9092,kafka-2:9092 (source.bootstrap_servers)" in str(res)
    assert "source.retry_seconds = 60" in str(res) and "\n" not in str(res)
    assert "Timed out waiting for a node assignment" in str(res)
    assert 0 < len(sleeps) < 10


def test_no_retry_seconds_stops_at_the_first_outage(monkeypatch) -> None:
    res, sleeps = retrying(monkeypatch, [outage()] * 3, now=FakeTime(), source_retry=0)
    assert isinstance(res, SourceUnreachable) and "source.retry_seconds = 0" in str(res) and sleeps == []


def test_kafka_unusable_at_start_is_not_retried(monkeypatch) -> None:
    first = outage(running=False, name="list_topics_broker_gone")  # the first try's kafka_partitions(), no query yet
    res, sleeps = retrying(monkeypatch, [first, P.RunResult(0, BatchReport())], now=FakeTime())
    assert res is first and sleeps == []


@pytest.mark.parametrize("name", ["sasl_wrong_password_spark_read", "topic_not_authorized_spark_read", "data_loss"])
def test_a_refusal_or_data_loss_while_running_stops_at_once(monkeypatch, name) -> None:
    refused = outage(name=name)
    res, sleeps = retrying(monkeypatch, [refused, P.RunResult(0, BatchReport())], now=FakeTime())
    assert res is refused and sleeps == []


class TargetDown(Exception):
    pass


class TransientTarget:
    def is_transient(self, exc) -> bool:
        return isinstance(exc, TargetDown)


def test_a_target_outage_keeps_its_own_budget_and_its_backoff_restarts_too(monkeypatch, caplog) -> None:
    now = FakeTime()
    outcomes = iter([TargetDown("gone"), TargetDown("gone"), "applied", TargetDown("gone"), outage()] +
                    [TargetDown("gone")] * 100)
    sleeps: list[float] = []

    def fake_run(settings_, spark, engine, dialect, until_caught_up, progress, mark, timer, *, until_ts=None):
        now.t += 5
        item = next(outcomes)
        if item == "applied":
            mark.batch_applied()
            now.t += 5
            item = next(outcomes)
        raise item

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        now.t += seconds

    monkeypatch.setattr(P, "_run", fake_run)
    monkeypatch.setattr("applier.sinks.db_reason", lambda exc: str(exc))
    with pytest.raises(P.TargetLost, match="target.retry_seconds = 120"):
        P._run_retrying(settings(source_retry=600, target_retry=120), object(), None, TransientTarget(), False, False,
                        clock=OutageClock(now), sleep=sleep)
    assert sleeps[:4] == [0.5, 1, 0.5, 1]  # a Kafka failure within a target outage is the same outage
    assert any("(target.retry_seconds = 120)" in r.getMessage() for r in caplog.records)
    assert any("(source.retry_seconds = 600)" in r.getMessage() for r in caplog.records)


def test_a_pipeline_stop_is_not_retried(monkeypatch) -> None:
    stopped = P.PipelineStopped("the Spark query stopped: something else")
    res, sleeps = retrying(monkeypatch, [stopped, P.RunResult(0, BatchReport())], now=FakeTime())
    assert res is stopped and sleeps == []


# ---- the setting -----------------------------------------------------------------------------------------------

def test_source_retry_seconds_defaults_to_300_and_is_checked() -> None:
    cfg = {"pipeline": {"name": "p", "checkpoint_dir": "/tmp/p"},
           "source": {"bootstrap_servers": "k:9092", "topics": ["t"], "protocol": "canal-json"},
           "target": {"url": "mysql+pymysql://u@h/db"}}
    assert parse_config(cfg).source.retry_seconds == 300
    assert parse_config(cfg).redacted()["source"]["retry_seconds"] == 300
    for bad in (-1, "5 minutes", 1.5):
        cfg["source"]["retry_seconds"] = bad
        with pytest.raises(ConfigError) as info:
            parse_config(cfg)
        assert info.value.key == "source.retry_seconds"


def test_kafka_lost_for_good_exits_5_with_one_line(tmp_path, capsys, monkeypatch) -> None:
    from applier.cli import EXIT_TARGET, main
    from tests.unit.helpers import CLI_CONF, write_conf

    def lost(*args, **kw):
        res, _ = retrying(monkeypatch, [outage()] * 50, now=FakeTime(), source_retry=60, step=10)
        raise res

    monkeypatch.setattr(P, "run", lost)
    assert main(["run", "-c", write_conf(tmp_path, CLI_CONF)]) == EXIT_TARGET
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("stopped: lost Kafka while running: kafka-1:9092,kafka-2:9092 "
                              "(source.bootstrap_servers) did not come back within source.retry_seconds = 60"), err


def test_a_private_broker_never_takes_a_port_in_use(tmp_path) -> None:
    import socket

    from applier.devtools.services.common import ServicesError
    from applier.devtools.services.kafka import Broker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        broker = Broker(s.getsockname()[1], tmp_path / "kafka")
        with pytest.raises(ServicesError, match="is taken"):
            broker.start()
    assert not broker.running() and not (tmp_path / "kafka" / "data").exists()
    broker.stop()  # nothing started: nothing to do


def test_a_stop_signal_during_an_outage_ends_the_run_at_the_next_try_without_waiting_out_the_budget(monkeypatch) -> None:
    import signal

    from applier.crashguard import STOP

    now = FakeTime()
    calls = []

    def fake_run(*args, **kwargs):
        calls.append(1)
        raise outage()

    def sleep(seconds: float) -> None:  # the operator's SIGTERM arrives while the run waits to start over
        now.t += seconds
        STOP.signum = signal.SIGTERM

    monkeypatch.setattr(P, "_run", fake_run)
    try:
        res = P._run_retrying(settings(600), object(), None, NoTransientTarget(), False, False,
                              clock=OutageClock(now), sleep=sleep)
    finally:
        STOP.signum = None
    assert isinstance(res, P.RunResult) and res.signal == signal.SIGTERM and len(calls) == 1


def test_the_backoff_wait_returns_as_soon_as_a_stop_is_requested() -> None:
    import signal
    import threading
    import time as _time

    from applier.crashguard import STOP

    threading.Timer(0.3, lambda: setattr(STOP, "signum", signal.SIGINT)).start()
    t0 = _time.monotonic()
    try:
        P._sleep_unless_stopped(10)
    finally:
        STOP.signum = None
    assert _time.monotonic() - t0 < 2
