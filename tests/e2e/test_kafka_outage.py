"""Invariant 14 for the source: a Kafka broker stopped for 90 s during a live ``applier run`` is not a failure. The
run starts over from the progress tables by itself, one warning line per try naming Kafka, the bootstrap servers and
the cause (no Java trace, no Kafka client chatter), keeps running, and the target ends exact.

The broker is the test's own (its port, its data under tmp_path, started and stopped here): the shared one on
19092 serves other tests meanwhile."""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.devtools.changefeed import generate, produce
from applier.devtools.services.kafka import Broker
from applier.devtools.verify import compare_tables
from tests.e2e.helpers import REPO, config, target_url, write_toml

pytestmark = pytest.mark.e2e

OUTAGE_SECONDS = 90
APPLIER = Path(sys.executable).parent / "applier"  # the console script operators run
JAVA_TRACE = re.compile(r"^\s+at [\w$.<>]+\(|^Caused by: |^Traceback |^\s+\.\.\. \d+ more")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _applied_ts(engine, name: str) -> int:
    try:
        with engine.connect() as c:
            return int(c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == name)).scalar() or 0)
    except Exception:  # the tables are not there yet
        return -1


def _wait(what: str, ok, proc: subprocess.Popen, log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ok():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the applier exited ({proc.returncode}) before {what}:\n{log.read_text()[-6000:]}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-6000:]}")


def test_live_run_rides_through_a_kafka_outage(urls, unique, drop_schema, tmp_path) -> None:
    client, controller = _free_ports(2)
    broker = Broker(client, tmp_path / "kafka", controller_port=controller)
    broker.start()
    proc = None
    engine = create_engine(target_url(urls, "mariadb"), pool_pre_ping=True)
    try:
        topic = f"e2e-kafka-outage-{unique}"
        schema = f"shop_{unique}"
        drop_schema(("mariadb", schema))
        wl = generate("canal-json", partitions=3, txns=200, seed=11, replays=1)
        half = len(wl.messages) // 2
        produce(broker.bootstrap, topic, wl.messages[:half], partitions=3)
        cfg = config(dataclasses.replace(urls, kafka=broker.bootstrap), "mariadb", "canal-json", topic, schema,
                     tmp_path / "ckpt", trigger_interval="1 second", local_dir=str(tmp_path / "local"))
        cfg["source"]["retry_seconds"] = 180
        name = cfg["pipeline"]["name"]
        log = tmp_path / "applier.log"
        proc = subprocess.Popen([str(APPLIER), "run", "-c", str(write_toml(tmp_path / "c.toml", cfg))], cwd=REPO,
                                stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
        _wait("the first half to apply", lambda: _applied_ts(engine, name) > 0, proc, log, 240)

        broker.stop()
        down = time.monotonic()
        try:
            _wait("the applier to meet the outage", lambda: "Kafka failed while running" in log.read_text(),
                  proc, log, OUTAGE_SECONDS)
            _wait("the end of the outage", lambda: time.monotonic() - down >= OUTAGE_SECONDS, proc, log,
                  OUTAGE_SECONDS + 5)
        finally:
            broker.start()
        produce(broker.bootstrap, topic, wl.messages[half:], partitions=3)  # written after the outage
        _wait("everything to apply after the outage", lambda: _applied_ts(engine, name) == wl.final_ts, proc, log,
              300)
        assert proc.poll() is None, "the applier stopped instead of riding through the outage"
        assert compare_tables(engine, schema, wl.expected) == []
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        broker.stop()
        engine.dispose()

    text = log.read_text()
    lines = text.splitlines()
    tries = [ln for ln in lines if "Kafka failed while running" in ln]
    assert tries, text[-6000:]
    for ln in tries:  # one line per try: Kafka's address, the setting, the Java client's cause
        assert "WARNING" in ln and f"source.bootstrap_servers = {broker.bootstrap}" in ln, ln
        assert "source.retry_seconds = 180" in ln and "org.apache.kafka.common.errors." in ln, ln
    assert not [ln for ln in lines if JAVA_TRACE.match(ln)], text[-6000:]
    assert "could not be established" not in text, "the Kafka client's reconnect warnings reached stderr"
    assert "Error in attempt" not in text and "terminated with error" not in text, text[-6000:]


class _JavaError(Exception):
    """Stands for pyspark's CapturedException: its Java trace is in ``_stackTrace``."""

    def __init__(self, trace: str) -> None:
        super().__init__(trace.splitlines()[0])
        self._stackTrace = trace


@pytest.mark.parametrize("where", ["refresh", "read"])
def test_kafka_lost_within_a_batch_starts_over_from_the_progress_tables(urls, spark, unique, drop_schema, tmp_path,
                                                                        monkeypatch, caplog, where) -> None:
    """Kafka found gone within a micro-batch -- by the periodic partition refresh (in the Spark thread, before the
    batch is read) or reading the batch's records -- stops the query without applying that batch or any later one;
    the run starts over from the progress tables and ends exact. The failures are real Java texts
    (tests/unit/kafka_errors: a listTopics call and a consumer's position() against a stopped broker)."""
    from applier import pipeline
    from applier.config import parse_config
    from applier.pipeline import SourceUnreachable

    errors = Path(__file__).parents[1] / "unit" / "kafka_errors"
    calls = []
    if where == "refresh":
        real = pipeline.kafka_partitions

        def flaky(spark_, settings_):
            calls.append(1)
            if len(calls) == 2:  # the first refresh of the first query
                raise SourceUnreachable("cannot list topics on the brokers",
                                        cause=(errors / "list_topics_broker_gone.txt").read_text())
            return real(spark_, settings_)

        monkeypatch.setattr(pipeline, "kafka_partitions", flaky)
        monkeypatch.setattr(pipeline, "PARTITION_REFRESH_SECONDS", 0.0)
        expected = "Timeout expired while fetching topic metadata"
    else:
        def failing_once(real):
            def read(*args, **kw):
                calls.append(1)
                if len(calls) == 2:  # the second batch of the first query
                    raise _JavaError((errors / "position_timeout.txt").read_text())
                return real(*args, **kw)
            return read

        monkeypatch.setattr(pipeline, "read_chunks", failing_once(pipeline.read_chunks))
        monkeypatch.setattr(pipeline, "read_messages", failing_once(pipeline.read_messages))
        expected = "before the position for partition tidb-cdc-0 could be determined"
    topic = f"e2e-kafka-{where}-{unique}"
    schema = f"shop_{unique}"
    drop_schema(("mariadb", schema))
    wl = generate("canal-json", partitions=3, txns=60, seed=5, replays=1)
    produce(urls.kafka, topic, wl.messages, partitions=3)
    cfg = config(urls, "mariadb", "canal-json", topic, schema, tmp_path / "ckpt", local_dir=str(tmp_path / "local"),
                 max_offsets_per_trigger=40)
    engine = create_engine(target_url(urls, "mariadb"))
    try:
        with caplog.at_level("WARNING", logger="applier.pipeline"):
            pipeline.run(parse_config(cfg), until_caught_up=True, spark=spark, progress=False)
        tries = [r.getMessage() for r in caplog.records if "Kafka failed while running" in r.getMessage()]
        assert len(tries) == 1 and expected in tries[0], tries
        assert len(calls) > 2  # started over
        assert compare_tables(engine, schema, wl.expected) == []
    finally:
        engine.dispose()
