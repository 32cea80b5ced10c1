"""The driver JVM's class archive (``[spark] class_archive``, applier.session): the first ``applier run`` that
ends cleanly leaves an archive of Spark's classes, the next run's JVM maps them from it, and both replicas are
exact. Java's own class-loading log tells where each class came from: "shared objects file (top)" is the
archive the applier wrote (the JDK's base archive is "shared objects file")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from applier.devtools.changefeed import generate, produce
from applier.devtools.verify import compare_tables
from applier.jars import jars_home
from tests.e2e.helpers import config, target_url, write_toml

pytestmark = pytest.mark.e2e

FROM_OUR_ARCHIVE = "source: shared objects file (top)"


def _classes_from_archive(folder: Path, pid_logs: set[Path]) -> int:
    logs = set(folder.glob("classes-*.log")) - pid_logs
    assert len(logs) == 1, sorted(logs)  # one driver JVM per run
    log = logs.pop()
    pid_logs.add(log)
    return sum(1 for line in log.read_text(errors="replace").splitlines() if FROM_OUR_ARCHIVE in line)


def test_the_first_run_writes_the_archive_and_the_next_maps_it(urls, unique, drop_schema, tmp_path) -> None:
    topic = f"e2e-cds-{unique}"
    wl = generate("canal-json", partitions=1, txns=20, seed=7, replays=0)
    produce(urls.kafka, topic, wl.messages, partitions=1)
    home = tmp_path / "home"  # the archive folder is $APPLIER_HOME/class-archive: this test's own
    home.mkdir()
    (home / "jars").symlink_to(jars_home(), target_is_directory=True)  # the resolved Kafka jars, not resolved again
    env = dict(os.environ, APPLIER_HOME=str(home))
    applier = Path(sys.executable).parent / "applier"
    seen: set[Path] = set()
    counts = []
    for run in ("first", "second"):
        schema = f"shop_{unique}_{run}"
        drop_schema(("postgres", schema))
        cfg = config(urls, "postgres", "canal-json", topic, schema, tmp_path / f"ckpt-{run}")
        cfg["pipeline"]["name"] = f"p-{topic}-{run}"
        # the same options in both runs (they are part of the archive's name): Java's class-loading log, per JVM
        cfg["spark"] = {"conf": {"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={tmp_path}/classes-%p.log"}}
        res = subprocess.run([str(applier), "-v", "run", "-c", str(write_toml(tmp_path / f"{run}.toml", cfg)),
                              "--until-caught-up"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stderr[-3000:]
        archives = sorted((home / "class-archive").glob("*.jsa"))
        assert len(archives) == 1 and archives[0].stat().st_size > 10 * 2**20, archives
        assert not list((home / "class-archive").glob("*.dump-*"))  # the JVM's dump was kept whole or removed
        assert ("wrote the driver JVM's class archive" in res.stderr) == (run == "first"), res.stderr[-3000:]
        counts.append(_classes_from_archive(tmp_path, seen))
        engine = create_engine(target_url(urls, "postgres"))
        try:
            assert compare_tables(engine, schema, wl.expected) == []
        finally:
            engine.dispose()
    first, second = counts
    assert first == 0  # no archive of ours yet: the first JVM loaded Spark from its jars
    assert second > 5000, second  # Spark's classes came from the archive the first run wrote
