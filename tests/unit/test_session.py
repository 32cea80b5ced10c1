"""The Spark session's settings and the start-up checks' pure parts (the live cluster is tests/e2e/test_cluster.py)."""

from __future__ import annotations

import socket
import stat
import zipfile
from pathlib import Path

import pytest

from applier.config import ConfigError, parse_config
from applier.decode import package_digest
from applier.session import (
    SetupError, check_master_reachable, java_binary, package_zip, python_failure, session_conf, standalone_masters,
    workers_python,
)


def settings(master: str = "local[2]", conf: dict | None = None, **pipeline):
    return parse_config({
        "pipeline": {"name": "p", "checkpoint_dir": "/var/lib/applier/p", **pipeline},
        "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "protocol": "canal-json"},
        "target": {"url": "mysql+pymysql://u@127.0.0.1:3306/d"},
        "spark": {"master": master, "conf": conf or {}},
    })


def test_loopback_is_forced_for_local_masters_only():
    local = session_conf(settings("local[2]"), "local[2]", jars=["/j/a.jar"], python="/v/bin/python", shipped=None)
    assert local["spark.driver.host"] == local["spark.driver.bindAddress"] == "127.0.0.1"
    assert local["spark.jars"] == "/j/a.jar" and local["spark.pyspark.python"] == "/v/bin/python"
    for master in ("spark://10.1.2.3:7077", "yarn", "k8s://https://api:6443"):
        conf = session_conf(settings(master), master, jars=[], python=None, shipped="/s/applier.zip")
        assert "spark.driver.host" not in conf and "spark.driver.bindAddress" not in conf, master
        assert conf["spark.submit.pyFiles"] == "/s/applier.zip"


def test_spark_conf_wins_and_py_files_are_merged():
    s = settings("spark://h:7077", {"spark.driver.host": "10.0.0.5", "spark.submit.pyFiles": "hdfs:///libs/x.zip",
                                    "spark.sql.shuffle.partitions": 64})
    conf = session_conf(s, "spark://h:7077", jars=[], python=None, shipped="/s/applier.zip")
    assert conf["spark.driver.host"] == "10.0.0.5"
    assert conf["spark.sql.shuffle.partitions"] == "64"
    assert conf["spark.submit.pyFiles"] == "hdfs:///libs/x.zip,/s/applier.zip"


def test_workers_python(monkeypatch):
    import sys

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert workers_python(settings("local[2]"), "local[2]") == sys.executable
    assert workers_python(settings("spark://h:7077"), "spark://h:7077") is None  # Spark's default on the nodes
    # under spark-submit the effective master decides, not [spark] master
    assert workers_python(settings("local[2]"), "yarn") is None
    s = settings("spark://h:7077", {"spark.pyspark.python": "/opt/py/bin/python"})
    assert workers_python(s, "spark://h:7077") == "/opt/py/bin/python"
    monkeypatch.setenv("PYSPARK_PYTHON", "/env/python")
    assert workers_python(settings("yarn"), "yarn") == "/env/python"


def test_standalone_master_urls():
    assert standalone_masters("spark://a:7077") == [("a", 7077)]
    assert standalone_masters("spark://a:7077,b:7078") == [("a", 7077), ("b", 7078)]
    assert standalone_masters("yarn") == []
    with pytest.raises(ValueError):
        standalone_masters("spark://a")


def test_unreachable_master_names_the_setting():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(ConfigError) as err:
            check_master_reachable(settings(f"spark://127.0.0.1:{port}"), timeout=2)
    assert err.value.key == "spark.master" and f"127.0.0.1:{port}" in err.value.message
    with pytest.raises(ConfigError) as err:
        check_master_reachable(settings("spark://nohostport"))
    assert err.value.key == "spark.master"
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        check_master_reachable(settings(f"spark://127.0.0.1:{srv.getsockname()[1]}"))  # answers: no error


def test_python_failure_finds_the_python_error_inside_a_java_trace():
    text = ("An error occurred while calling o12.collectToPython.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "worker.py", line 1, in main\n'
            "ModuleNotFoundError: No module named 'orjson'\n"
            "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:1)\n")
    assert python_failure(text) == "ModuleNotFoundError: No module named 'orjson'"
    assert python_failure("java.io.IOException: Cannot run program \"/x/python\": error=2") .startswith("java.io")


def test_shipped_zip_holds_the_drivers_package(tmp_path):
    import applier

    z = package_zip(tmp_path, package_digest())
    assert z.name == f"applier-{package_digest()}.zip"
    with zipfile.ZipFile(z) as zf:
        names = set(zf.namelist())
    root = Path(applier.__file__).parent
    expected = {f"applier/{p.relative_to(root)}" for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    assert expected <= names and "applier/decode.py" in names
    assert not any("__pycache__" in n for n in names)
    assert package_zip(tmp_path, package_digest()) == z  # reused, not rebuilt


def test_digest_is_the_same_from_a_zip(tmp_path):
    """Executors import the shipped zip; the digest they report must equal the driver's for the same code."""
    import subprocess
    import sys

    z = package_zip(tmp_path, package_digest())
    out = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import applier.decode as d; "
                          "print(d.__file__); print(d.package_digest())", str(z)],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    assert out[0].startswith(str(z)) and out[1] == package_digest()


def test_missing_java_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SetupError) as err:
        java_binary()
    assert "apt-get install -y openjdk-17-jre-headless" in str(err.value)
    old = tmp_path / "java"
    old.write_text('#!/bin/sh\necho \'openjdk version "11.0.2" 2019-01-15\' >&2\n')
    old.chmod(old.stat().st_mode | stat.S_IEXEC)
    with pytest.raises(SetupError) as err:
        java_binary()
    assert "Java 11" in str(err.value) and "openjdk-17" in str(err.value)


# ---- Spark's own output (issue 24, point 5: a normal run prints only the applier's lines) -----------------------

def test_the_drivers_log4j_file_goes_first_so_one_of_spark_conf_wins(tmp_path):
    from applier.session import write_log_config

    path = write_log_config(tmp_path)
    ours = f"-XX:TieredStopAtLevel=1 -Dlog4j2.configurationFile={path.resolve().as_uri()}"  # C1 only: round 5
    conf = session_conf(settings(), "local[2]", jars=[], python=None, shipped=None, log_config=path)
    assert conf["spark.driver.extraJavaOptions"] == ours
    theirs = "-Dlog4j2.configurationFile=file:/etc/mine.properties -Xss4m"
    conf = session_conf(settings(conf={"spark.driver.extraJavaOptions": theirs}), "local[2]", jars=[], python=None,
                        shipped=None, log_config=path)
    assert conf["spark.driver.extraJavaOptions"] == f"{ours} {theirs}"  # the JVM takes the last -D: theirs
    assert "spark.driver.extraJavaOptions" not in session_conf(settings(), "local[2]", jars=[], python=None,
                                                               shipped=None)  # under spark-submit: none


def test_spark_logs_errors_only_unless_the_applier_logs_at_info(tmp_path):
    import logging

    from applier.session import QUIET_LOGGERS, spark_log_level, write_log_config

    log = logging.getLogger("applier")
    old = log.level
    try:
        log.setLevel(logging.WARNING)
        assert spark_log_level() == "ERROR"
        text = write_log_config(tmp_path).read_text()
        assert "rootLogger.level = error" in text
        # without the gateway's logger at the root's level Spark prints "Setting default log level" at each start
        assert "logger.repl.name = org.apache.spark.api.python.PythonGatewayServer" in text
        assert "logger.repl.level = error" in text
        assert all(f"name = {name}" in text for name in QUIET_LOGGERS)
        log.setLevel(logging.INFO)  # -v
        assert spark_log_level() == "WARN" and "rootLogger.level = warn" in write_log_config(tmp_path).read_text()
    finally:
        log.setLevel(old)


def test_the_jvms_incubator_notice_is_dropped_and_everything_else_passes(capfd):
    import subprocess
    import sys
    import time

    from applier.session import jvm_stderr_filtered

    code = ("import sys; sys.stderr.write('WARNING: Using incubator modules: jdk.incubator.vector\\n'); "
            "sys.stderr.write('26/11/28 06:18:03 ERROR Something: a real problem\\n'); "
            "sys.stderr.write('no newline')")
    with jvm_stderr_filtered():
        proc = subprocess.Popen([sys.executable, "-c", code])  # started inside: it keeps the pipe (as the JVM)
    proc.wait()
    sys.stderr.write("the applier's own line\n")
    deadline = time.monotonic() + 10
    err = ""
    while time.monotonic() < deadline:
        err += capfd.readouterr().err
        if "no newline" in err:
            break
        time.sleep(0.05)
    assert "incubator" not in err
    assert "ERROR Something: a real problem\n" in err and "the applier's own line\n" in err and "no newline" in err


# ---- the driver JVM's class archive (round 7: about 4 s less start-up) ---------------------------------------

def _jars(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for n in names:
        (folder / n).write_bytes(n.encode())
    return folder


def test_the_archive_name_changes_with_what_the_jvm_checks_it_against(tmp_path):
    from applier.session import class_archive_key

    jars = _jars(tmp_path / "jars", "spark-core.jar", "scala-library.jar")
    key = class_archive_key("/usr/bin/java", 'openjdk version "17.0.15"', jars, {})
    assert key == class_archive_key("/usr/bin/java", 'openjdk version "17.0.15"', jars, {"spark.ui.port": "1"})
    assert key != class_archive_key("/opt/jdk/bin/java", 'openjdk version "17.0.15"', jars, {})
    assert key != class_archive_key("/usr/bin/java", 'openjdk version "17.0.16"', jars, {})
    for conf in ({"spark.driver.memory": "8g"}, {"spark.driver.extraClassPath": "/x.jar"},
                 {"spark.driver.extraJavaOptions": "-Xss4m"}):
        assert key != class_archive_key("/usr/bin/java", 'openjdk version "17.0.15"', jars, conf), conf
    (jars / "spark-core.jar").write_bytes(b"a newer spark-core")
    assert key != class_archive_key("/usr/bin/java", 'openjdk version "17.0.15"', jars, {})


def test_a_run_that_owns_its_jvm_writes_the_archive_and_later_starts_map_it(tmp_path, monkeypatch):
    import os
    import shutil

    from applier import session

    java = shutil.which("java") or "/usr/bin/java"
    monkeypatch.setattr(session, "java_version_text", lambda j: 'openjdk version "17.0.15"')
    folder = tmp_path / "archives"
    assert session.class_archive(settings(), java, owns_jvm=False, folder=folder) is None  # nothing to map yet
    first = session.class_archive(settings(), java, owns_jvm=True, folder=folder)
    assert first is not None and first.dumping == folder / f"{first.path.name}.dump-{os.getpid()}"
    assert f"-XX:ArchiveClassesAtExit={first.dumping}" in first.java_options()
    assert "SharedArchiveFile" not in first.java_options()
    first.path.write_bytes(b"an archive")  # what close_session keeps once the JVM exited cleanly
    for owns in (True, False):
        later = session.class_archive(settings(), java, owns_jvm=owns, folder=folder)
        assert later == session.ClassArchive(first.path)
        assert f"-XX:SharedArchiveFile={first.path}" in later.java_options()
    conf = session_conf(settings(), "local[2]", jars=[], python=None, shipped=None, log_config=tmp_path / "l.p",
                        archive=later)
    assert conf["spark.driver.extraJavaOptions"].endswith(later.java_options())


def test_no_archive_when_turned_off_or_when_spark_conf_sets_class_sharing_itself(tmp_path, monkeypatch):
    from applier import session

    monkeypatch.setattr(session, "java_version_text", lambda j: "17")
    off = parse_config({
        "pipeline": {"name": "p", "checkpoint_dir": "/var/lib/applier/p"},
        "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "protocol": "canal-json"},
        "target": {"url": "mysql+pymysql://u@127.0.0.1:3306/d"},
        "spark": {"class_archive": False},
    })
    assert off.spark.class_archive is False
    assert session.class_archive(off, "/usr/bin/java", owns_jvm=True, folder=tmp_path) is None
    for opts in ("-Xshare:off", "-XX:SharedArchiveFile=/mine.jsa", "-XX:ArchiveClassesAtExit=/x.jsa"):
        s = settings(conf={"spark.driver.extraJavaOptions": opts})
        assert session.class_archive(s, "/usr/bin/java", owns_jvm=True, folder=tmp_path) is None, opts
    with pytest.raises(ConfigError) as err:
        parse_config({
            "pipeline": {"name": "p", "checkpoint_dir": "/var/lib/applier/p"},
            "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "protocol": "canal-json"},
            "target": {"url": "mysql+pymysql://u@127.0.0.1:3306/d"},
            "spark": {"class_archive": "yes"},
        })
    assert "spark.class_archive" in str(err.value)


def test_a_dump_whose_process_is_gone_is_removed_and_a_live_ones_kept(tmp_path, monkeypatch):
    import os
    import subprocess

    from applier import session

    monkeypatch.setattr(session, "java_version_text", lambda j: "17")
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = tmp_path / f"spark-driver-x.jsa.dump-{gone.pid}"
    alive = tmp_path / f"spark-driver-y.jsa.dump-{os.getppid()}"
    for p in (dead, alive):
        p.write_bytes(b"half an archive")
    session.class_archive(settings(), "/usr/bin/java", owns_jvm=True, folder=tmp_path)
    assert not dead.exists() and alive.exists()


def test_only_the_newest_archives_are_kept(tmp_path):
    import os

    from applier.session import CLASS_ARCHIVES_KEPT, _prune_archives

    paths = [tmp_path / f"spark-driver-{i}.jsa" for i in range(CLASS_ARCHIVES_KEPT + 2)]
    for i, p in enumerate(paths):
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
    _prune_archives(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths[-CLASS_ARCHIVES_KEPT:])


def test_a_failing_querys_task_clean_up_is_not_logged():
    from applier.session import log_config_text

    text = log_config_text("ERROR")
    assert "logger.silent0.name = org.apache.spark.TaskContextImpl" in text
    assert "logger.silent0.level = off" in text


class _Executor:
    def __init__(self, tracker):
        self.tracker = tracker

    def numRunningTasks(self):  # noqa: N802 - Spark's Java name
        return self.tracker.running.pop(0) if self.tracker.running else 0


class _Tracker:
    def __init__(self, running):
        self.running = list(running)
        self.cancelled = 0

    def getExecutorInfos(self):  # noqa: N802
        return [_Executor(self)]


class _Values:
    def __init__(self, values):
        self.values = list(values)

    def hasNext(self):  # noqa: N802
        return bool(self.values)

    def next(self):
        return self.values.pop(0)


class _Scheduler:
    """The task scheduler's running tasks per executor: one poll's map from ``scheduled``, then none."""

    def __init__(self, scheduled):
        self.scheduled = list(scheduled)

    def runningTasksByExecutors(self):  # noqa: N802
        counts = self.scheduled.pop(0) if self.scheduled else [0]
        return type("M", (), {"valuesIterator": lambda _self: _Values(counts)})()


class _Spark:
    """What drain_tasks reads of a session: cancelAllJobs, the executors' running-task counts and the scheduler's."""

    def __init__(self, running, scheduled=()):
        self.tracker = _Tracker(running)
        self.scheduler = _Scheduler(scheduled)
        outer = self

        class _Sc:
            def cancelAllJobs(self):  # noqa: N802
                outer.tracker.cancelled += 1

            class _jsc:  # noqa: N801
                @staticmethod
                def sc():
                    return type("S", (), {"statusTracker": staticmethod(lambda: outer.tracker),
                                          "taskScheduler": staticmethod(lambda: outer.scheduler)})()

        self.sparkContext = _Sc()


def test_the_session_stops_only_once_its_cancelled_tasks_have_ended():
    from applier.session import drain_tasks

    spark = _Spark([2, 1, 1, 0])
    assert drain_tasks(spark, 5.0) is True
    assert spark.tracker.cancelled == 1 and spark.tracker.running == []  # polled until no task ran


def test_a_killed_tasks_update_still_on_its_way_to_the_scheduler_holds_the_stop():
    """The status tracker shows none running while the scheduler still waits for a killed task's last update:
    stopping then would log that update's RejectedExecutionException trace."""
    from applier.session import drain_tasks

    spark = _Spark([0] * 10, scheduled=[[0, 1], [1], [0, 0]])
    assert drain_tasks(spark, 5.0) is True
    assert spark.scheduler.scheduled == []  # polled until the scheduler's count was zero too


def test_a_task_that_never_ends_bounds_the_drain():
    from applier.session import drain_tasks

    spark = _Spark([1] * 10_000)
    assert drain_tasks(spark, 0.2) is False


def test_a_stopped_context_has_nothing_to_drain():
    from applier.session import drain_tasks

    class Gone:
        @property
        def sparkContext(self):  # noqa: N802
            raise RuntimeError("stopped")

    assert drain_tasks(Gone(), 5.0) is True
