"""Invariant 14 on real servers: a MariaDB or PostgreSQL restart during a live run is not a failure. The run
starts over from the progress tables by itself, keeps running, and the target ends exact."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.devtools import services
from applier.devtools.verify import compare_tables
from applier.devtools.changefeed import generate, produce
from tests.e2e.helpers import REPO, config, target_url, write_toml

pytestmark = pytest.mark.e2e


def _applied_ts(engine, name: str) -> int:
    try:
        with engine.connect() as c:
            return int(c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == name)).scalar() or 0)
    except Exception:  # the server is down or the tables are not there yet
        return -1


def _wait(what: str, ok, proc: subprocess.Popen, log, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ok():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the applier exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-4000:]}")


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_live_run_rides_through_a_target_restart(urls, unique, drop_schema, tmp_path, target) -> None:
    topic = f"e2e-restart-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    wl = generate("canal-json", partitions=3, txns=200, seed=9, replays=1)
    half = len(wl.messages) // 2
    produce(urls.kafka, topic, wl.messages[:half], partitions=3)
    cfg = config(urls, target, "canal-json", topic, schema, tmp_path / "ckpt", trigger_interval="1 second")
    cfg["target"]["retry_seconds"] = 180
    name = cfg["pipeline"]["name"]
    log = tmp_path / "applier.log"
    engine = create_engine(target_url(urls, target), pool_pre_ping=True)
    proc = subprocess.Popen([sys.executable, "-m", "applier.cli", "run", "-c", str(write_toml(tmp_path / "c.toml", cfg))],
                            cwd=REPO, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait("the first half to apply", lambda: _applied_ts(engine, name) > 0, proc, log, 180)
        engine.dispose()
        services.stop({target})
        try:
            produce(urls.kafka, topic, wl.messages[half:], partitions=3)  # arrives while the target is down
            _wait("the applier to meet the outage", lambda: "starting over from the progress tables" in log.read_text(),
                  proc, log, 60)
            time.sleep(3)  # a few failed attempts with backoff
        finally:
            services.start({target})
        _wait("everything to apply after the restart", lambda: _applied_ts(engine, name) == wl.final_ts, proc, log, 240)
        assert proc.poll() is None, "the applier stopped instead of riding through the restart"
        assert compare_tables(engine, schema, wl.expected) == []
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        engine.dispose()
