"""A real Spark standalone cluster on loopback: a master and two workers from PySpark's own distribution.

The applier runs as a user would run it (the ``applier`` CLI in a subprocess, ``[spark] master = "spark://..."``),
ships itself to the executors, and decodes in their Python workers. Spark's event log says which executor read
(and so decoded: the Kafka scan and ``mapInArrow`` are one stage) each record; the workers' folders say which
worker ran which executor. Bad environments stop with exit code 2 and the setting to fix, before anything is
applied.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from sqlalchemy import create_engine, inspect

from applier.config import ConfigError, parse_config
from applier.pipeline import run
from applier.devtools.cluster import Cluster, free_port, standalone_cluster
from applier.devtools.verify import compare_tables
from applier.devtools.changefeed import generate, produce
from tests.e2e.helpers import config, target_url, write_toml

pytestmark = pytest.mark.e2e

WORKERS = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    with standalone_cluster(WORKERS, root=tmp_path_factory.mktemp("spark-cluster")) as c:
        yield c


def _cluster_conf(cluster: Cluster, **extra: str) -> dict:
    # the nodes' Python is this test's (the venv CI built); everything stays on loopback, on a real cluster leave
    # the driver's host to Spark's defaults
    return cluster.driver_conf(extra=extra)


def _applier(*argv: str, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYSPARK_PYTHON", None)  # what the config says must be enough
    return subprocess.run([sys.executable, "-m", "applier.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def _decoding_executors(events_dir: Path) -> tuple[str, dict[str, int]]:
    """The application id and, per executor id, the Kafka records its tasks read, from Spark's event log
    (reading and decoding share one stage, so a task that read records also decoded them)."""
    logs = [p for p in events_dir.iterdir() if p.is_file()]
    assert len(logs) == 1, logs
    records: dict[str, int] = {}
    for line in logs[0].read_text().splitlines():
        ev = json.loads(line)
        if ev.get("Event") != "SparkListenerTaskEnd":
            continue
        read = ((ev.get("Task Metrics") or {}).get("Input Metrics") or {}).get("Records Read", 0)
        if read:
            ex = ev["Task Info"]["Executor ID"]
            records[ex] = records.get(ex, 0) + read
    return logs[0].name.split(".")[0], records


def test_replica_on_a_standalone_cluster(urls, cluster, unique, drop_schema, tmp_path) -> None:
    topic = f"e2e-cluster-{unique}"
    schema = f"shop_{unique}"
    drop_schema(("mariadb", schema))
    wl = generate("canal-json", partitions=4, txns=150, seed=11, replays=2)
    produce(urls.kafka, topic, wl.messages, partitions=4)
    events = tmp_path / "events"
    events.mkdir()
    cfg = config(urls, "mariadb", "canal-json", topic, schema, tmp_path, decode_on="executors",
                 max_offsets_per_trigger=120)
    cfg["pipeline"]["checkpoint_dir"] = (tmp_path / "ckpt").as_uri()  # a URI reaches Spark unchanged
    cfg["spark"] = {"master": cluster.url, "conf": _cluster_conf(
        cluster, **{"spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
                    "spark.eventLog.rolling.enabled": "false", "spark.eventLog.compress": "false"})}
    res = _applier("run", "-c", str(write_toml(tmp_path / "cluster.toml", cfg)), "--until-caught-up")
    assert res.returncode == 0, res.stderr[-4000:]

    engine = create_engine(urls.mariadb_url)
    try:
        assert compare_tables(engine, schema, wl.expected) == []
    finally:
        engine.dispose()
    assert (tmp_path / "ckpt" / "query" / "offsets").is_dir()  # Spark wrote where the URI says

    app, decoded = _decoding_executors(events)
    # a worker keeps a folder per executor it ran: <work dir>/<app id>/<executor id>
    per_worker = {d.name: {ex: n for ex, n in decoded.items() if (d / app / ex).is_dir()} for d in cluster.work_dirs}
    assert all(per_worker.values()), f"executors that decoded, per worker: {per_worker}"
    assert sum(decoded.values()) >= len(wl.messages)  # every record was read (and decoded) on an executor


def test_spark_submit_client_mode(urls, cluster, unique, drop_schema, tmp_path) -> None:
    """The README's spark-submit form: spark-submit's --master and --jars decide, the config's master is ignored
    (with a warning), the applier ships itself, and the replica is exact."""
    import pyspark

    import applier
    from applier.devtools.services import spark_kafka_jars

    topic = f"e2e-submit-{unique}"
    schema = f"shop_{unique}"
    drop_schema(("mariadb", schema))
    wl = generate("open", partitions=2, txns=60, seed=5, replays=1)
    produce(urls.kafka, topic, wl.messages, partitions=2)
    cfg = config(urls, "mariadb", "open", topic, schema, tmp_path / "ckpt", decode_on="executors")
    cfg["spark"] = {"master": "local[1]"}
    home = Path(pyspark.__file__).parent
    conf = _cluster_conf(cluster)
    argv = [str(home / "bin" / "spark-submit"), "--master", cluster.url, "--jars", ",".join(spark_kafka_jars())]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    argv += [str(Path(applier.__file__).parent / "__main__.py"), "run", "-c",
             str(write_toml(tmp_path / "submit.toml", cfg)), "--until-caught-up"]
    env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP="127.0.0.1")
    env.pop("PYSPARK_PYTHON", None)
    res = subprocess.run(argv, capture_output=True, text=True, timeout=420, env=env, stdin=subprocess.DEVNULL,
                         cwd=tmp_path)
    out = res.stdout + res.stderr  # spark-submit merges the Python process's stderr into its stdout
    assert res.returncode == 0, out[-4000:]
    assert f"its --master {cluster.url} is used" in out, out[-3000:]
    engine = create_engine(urls.mariadb_url)
    try:
        assert compare_tables(engine, schema, wl.expected) == []
    finally:
        engine.dispose()


def test_unreachable_master_is_named(tmp_path, urls, unique) -> None:
    topic = f"never-read-{unique}"
    produce(urls.kafka, topic, [], partitions=1)  # it exists (a missing topic is found before Spark starts)
    cfg = config(urls, "mariadb", "canal-json", topic, "shop_never", tmp_path / "ckpt")
    cfg["spark"] = {"master": f"spark://127.0.0.1:{free_port()}"}
    t0 = time.monotonic()
    res = _applier("run", "-c", str(write_toml(tmp_path / "c.toml", cfg)), "--until-caught-up", timeout=120)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "spark.master" in res.stderr and "no Spark master answers" in res.stderr
    assert "Traceback" not in res.stderr
    assert time.monotonic() - t0 < 60


def test_executors_without_the_dependencies_stop_the_run(urls, cluster, unique, tmp_path) -> None:
    bare = tmp_path / "bare"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(bare)],
                   check=True)
    topic = f"e2e-cluster-bad-{unique}"
    wl = generate("canal-json", partitions=1, txns=5, seed=1, replays=0)
    produce(urls.kafka, topic, wl.messages, partitions=1)
    schema = f"shop_{unique}"
    cfg = config(urls, "mariadb", "canal-json", topic, schema, tmp_path / "ckpt", decode_on="executors")
    cfg["spark"] = {"master": cluster.url, "startup_timeout_seconds": 90,
                    "conf": _cluster_conf(cluster, **{"spark.pyspark.python": str(bare / "bin" / "python")})}
    res = _applier("run", "-c", str(write_toml(tmp_path / "c.toml", cfg)), "--until-caught-up")
    assert res.returncode == 2, res.stderr[-3000:]
    assert "spark.pyspark.python" in res.stderr and "No module named" in res.stderr, res.stderr[-3000:]
    # no traceback of the applier's own (one starts a line); Spark's log may quote the executor's, mid-line, when
    # it reports the stage's other task as killed after the first failure (timing decides whether it does)
    assert not [ln for ln in res.stderr.splitlines() if ln.startswith("Traceback")], res.stderr[-6000:]
    assert res.stderr.strip().splitlines()[-1].startswith("config error:")
    engine = create_engine(urls.mariadb_url)
    try:
        assert schema not in inspect(engine).get_schema_names()  # nothing was applied
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["s3a://applier-bucket/ck", "file:///proc/applier-checkpoint"])
def test_checkpoint_spark_cannot_write_stops_before_applying(urls, spark, unique, tmp_path, where) -> None:
    topic = f"e2e-ckpt-{unique}"
    wl = generate("canal-json", partitions=1, txns=5, seed=1, replays=0)
    produce(urls.kafka, topic, wl.messages, partitions=1)
    schema = f"shop_{unique}"
    cfg = config(urls, "mariadb", "canal-json", topic, schema, tmp_path / "ckpt")
    cfg["pipeline"]["checkpoint_dir"] = where
    cfg["pipeline"]["local_dir"] = str(tmp_path / "local")
    with pytest.raises(ConfigError) as err:
        run(parse_config(cfg), until_caught_up=True, spark=spark, progress=False)
    assert err.value.key == "pipeline.checkpoint_dir" and where in str(err.value)
    engine = create_engine(target_url(urls, "mariadb"))
    try:
        assert schema not in inspect(engine).get_schema_names()
    finally:
        engine.dispose()
