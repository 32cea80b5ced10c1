"""The Spark session a pipeline runs in, on this host (``local[N]``) or on a cluster, and the checks that make a
bad environment stop the run before anything is applied.

Local masters keep every Spark socket on loopback and run the Python workers with the driver's own interpreter
and applier package. Any other master (``spark://``, ``yarn``, ``k8s://``) gets Spark's own defaults for the
driver's address (or what ``[spark.conf]`` says), and the applier ships itself to the executors: a zip of the
driver's package goes through ``spark.submit.pyFiles``, so executors decode with exactly the driver's code. The
executors' Python still needs the applier's dependencies (pyarrow, orjson, fastavro, ...), which a start-up job
checks on the executors themselves, naming what is missing and how to fix it.

Spark's own output: the driver's JVM logs through a log4j2 configuration the applier writes into
``pipeline.local_dir`` (ERROR and above on stderr; WARN with ``-v``), so a normal run prints only the applier's
lines; ``[spark.conf] "spark.driver.extraJavaOptions"`` with ``-Dlog4j2.configurationFile=...`` picks another.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from applier.config import ConfigError, Settings, is_local_master
from applier.decode import WorkerSpec, package_digest, worker_identity

log = logging.getLogger("applier.session")

JAVA_INSTALL = "apt-get install -y openjdk-17-jre-headless (or set JAVA_HOME to a Java 17+ installation)"


class SetupError(Exception):
    """Something this host lacks (Java, ...): the message names the command that installs it."""


def _config_error(settings: Settings, key: str, message: str) -> ConfigError:
    return ConfigError(key, message, source=str(settings.source_path or "<config>"))


# ---- prerequisites --------------------------------------------------------------------------------------------

def java_binary() -> str:
    """The ``java`` Spark will start (``$JAVA_HOME/bin/java``, else the one on PATH), checked to be 17 or newer:
    without this pyspark dies with a Java gateway stack trace that names nothing to install."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise SetupError(f"Spark needs Java 17 or newer ({where}): {JAVA_INSTALL}")
    out = java_version_text(java)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):  # "1.8.0_x" is Java 8
        major = int(m.group(2))
    if major < 17:
        raise SetupError(f"Spark 4 needs Java 17 or newer; {java} is Java {major or '?'}: {JAVA_INSTALL}")
    return java


@functools.lru_cache(maxsize=4)
def java_version_text(java: str) -> str:
    """What ``java -version`` prints (once per binary and process: the class archive's name includes it)."""
    try:
        return subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"{java} -version failed ({exc}): {JAVA_INSTALL}") from None


def standalone_masters(master: str) -> list[tuple[str, int]]:
    """The (host, port) pairs of a ``spark://h1:p1[,h2:p2]`` master URL (several for a ZooKeeper-HA setup)."""
    if not master.startswith("spark://"):
        return []
    out = []
    for item in master[len("spark://"):].split(","):
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(item)
        out.append((host.strip("[]"), int(port)))
    return out


def check_master_reachable(settings: Settings, master: str | None = None, timeout: float = 5.0) -> None:
    """A standalone master nobody answers for makes Spark retry for a minute and then stop the context from a
    background thread; asking the port first gives the operator the setting to fix at once."""
    master = master or settings.spark.master
    try:
        hosts = standalone_masters(master)
    except ValueError:
        raise _config_error(settings, "spark.master",
                            f"{master!r} is not a standalone master URL: write spark://HOST:PORT[,HOST:PORT]") from None
    if not hosts:
        return
    errors = []
    for host, port in hosts:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return
        except OSError as exc:
            errors.append(f"{host}:{port} ({exc.strerror or exc})")
    raise _config_error(settings, "spark.master",
                        f"no Spark master answers at {', '.join(errors)}: start the master "
                        "(sbin/start-master.sh, or spark-class org.apache.spark.deploy.master.Master) or fix "
                        "[spark] master")


# ---- shipping the applier ---------------------------------------------------------------------------------------

def package_zip(dest: Path, digest: str) -> Path:
    """A zip of the driver's applier package for ``spark.submit.pyFiles``, named by its ``digest`` so a changed
    package is never confused with an older zip."""
    import applier

    root = Path(applier.__file__).resolve().parent
    out = dest / f"applier-{digest}.zip"
    if out.exists():
        return out
    dest.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp-{os.getpid()}")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            if "__pycache__" in path.parts or not path.is_file() or path.suffix not in (".py", ".json"):
                continue
            zf.write(path, Path("applier") / path.relative_to(root))
    os.replace(tmp, out)
    return out


# ---- the session ---------------------------------------------------------------------------------------------------

def submitted_master() -> str | None:
    """The master spark-submit was given, when this process was started by spark-submit (it then owns the JVM,
    and its ``--master``/``--conf`` decide over ``[spark] master``), else None."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, whose system properties hold its conf
    return SparkConf().get("spark.master", None)


def spark_session(settings: Settings, app_name: str | None = None, *, owns_jvm: bool = False):
    """A SparkSession with the Kafka source jars on the classpath (resolved from Maven Central, no Ivy), checked
    to have executors that can decode for this pipeline.

    ``owns_jvm``: the caller ends the session with :func:`close_session` and nothing in this process uses Spark
    after it, so the driver's JVM may write the class archive at exit when none exists yet (:func:`class_archive`).
    A session without it still maps an archive that exists."""
    java = java_binary()
    submitted = submitted_master()
    master = submitted or settings.spark.master
    local = is_local_master(master)
    if submitted and submitted != settings.spark.master:
        log.warning("running under spark-submit: its --master %s is used, not [spark] master %s", submitted,
                    settings.spark.master)
    if not local:
        check_master_reachable(settings, master)
    from pyspark.sql import SparkSession

    from applier.jars import spark_kafka_jars

    python = workers_python(settings, master)
    if python:
        # pyspark takes the workers' interpreter from this variable only (spark.pyspark.python is read by
        # spark-submit, not by a SparkContext built in Python): without it they run whatever "python3" is first
        # on PATH, which lacks the applier's dependencies when the driver runs from a virtualenv.
        os.environ["PYSPARK_PYTHON"] = python
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # keep Spark's own traffic on loopback
        _local_workers_like_driver()
        shipped = None
    else:
        digest = package_digest()  # once: the code the executors get is compared with this, not with later edits
        shipped = str(package_zip(settings.pipeline.local_dir / "ship", digest))
    builder = SparkSession.builder.appName(app_name or f"applier-{settings.pipeline.name}")
    if not submitted:
        builder = builder.master(master)
    log_config = None if submitted else write_log_config(settings.pipeline.local_dir)
    archive = None if submitted else class_archive(settings, java, owns_jvm=owns_jvm)
    _JVM_QUIET.clear()
    for k, v in session_conf(settings, master, jars=spark_kafka_jars(), python=python, shipped=shipped,
                             log_config=log_config, archive=archive).items():
        builder = builder.config(k, v)
    with jvm_stderr_filtered():
        spark = builder.getOrCreate()
    if archive is not None and archive.dumping is not None:
        _DUMPING.append(archive)
    spark.sparkContext.setLogLevel(spark_log_level())
    if not local:
        try:
            check_executors(spark, settings, master, digest)
        except BaseException:
            spark.stop()
            raise
    return spark


# The driver JVM compiles with C1 only. On a local master it is also the executor: the Kafka source, the Arrow
# exchange with the Python workers and toArrow() all run in it. C2's compiler threads spend CPU on the same two
# cores for most of a catch-up (docs/benchmarks.md, round 5): without them Spark's Kafka read cost 7.1-8.4 instead
# of 10.4-12.5 us of JVM CPU per message over 2M messages, and a whole-process 1M Canal-JSON catch-up into
# PostgreSQL took 0.86x the time, its first batch applied 7 s sooner. A later -XX:TieredStopAtLevel in
# [spark.conf] "spark.driver.extraJavaOptions" wins (4 restores C2).
DRIVER_JIT = "-XX:TieredStopAtLevel=1"


def session_conf(settings: Settings, master: str, *, jars: list[str], python: str | None,
                 shipped: str | None, log_config: Path | None = None,
                 archive: ClassArchive | None = None) -> dict[str, str]:
    """Every Spark setting the session is built with: the applier's defaults, then ``[spark.conf]`` over them.

    Only a local master is pinned to loopback: on a cluster the executors must reach the driver, so its address
    is Spark's default (the host's name) unless ``[spark.conf]`` sets ``spark.driver.host``. ``log_config`` (the
    driver's log4j2 file, :func:`write_log_config`) goes first into ``spark.driver.extraJavaOptions``, so a
    ``-Dlog4j2.configurationFile`` of ``[spark.conf]``'s own comes later and wins."""
    conf = {
        "spark.jars": ",".join(jars),
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
    }
    if is_local_master(master):
        conf["spark.driver.host"] = conf["spark.driver.bindAddress"] = "127.0.0.1"
    if python:
        conf["spark.pyspark.python"] = python
    conf.update(settings.spark.conf)
    if log_config is not None:  # the applier starts the driver's JVM (under spark-submit it runs already)
        ours = f"{DRIVER_JIT} -Dlog4j2.configurationFile={log_config.resolve().as_uri()}"
        if archive is not None:
            ours = f"{ours} {archive.java_options()}"
        conf["spark.driver.extraJavaOptions"] = " ".join(
            p for p in (ours, settings.spark.conf.get("spark.driver.extraJavaOptions", "")) if p)
    if shipped:
        conf["spark.submit.pyFiles"] = ",".join(p for p in (conf.get("spark.submit.pyFiles", ""), shipped) if p)
    return conf


# ---- the driver JVM's class archive ---------------------------------------------------------------------------------

# A driver JVM loads and verifies some 15,000 classes from pyspark's jars at every start: about 4 of the 12 s before
# a first micro-batch is applied (docs/benchmarks.md, round 7). Java's class-data sharing maps them from an archive
# instead. The first run that owns its JVM has the JVM write one at exit (-XX:ArchiveClassesAtExit, into a file
# named by the process) and keeps it once the JVM has exited cleanly; later starts map it (-XX:SharedArchiveFile).
# The archive's name is a digest of everything the JVM checks it against (the java binary and its version,
# pyspark's jars, the driver's class path, memory and JVM options), so a changed installation gets a new archive;
# a JVM that still cannot use one (Java's own checks) runs without it, as -Xshare:auto does.
CLASS_ARCHIVES_KEPT = 2  # newest archives kept in the folder (each 150-200 MB)
# options by which [spark.conf] takes class-data sharing into its own hands: the applier adds none then
_OWN_SHARING = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit", "AutoCreateSharedArchive")
_DUMPING: list[ClassArchive] = []  # the archive this process's JVM writes at exit (close_session keeps it)


@dataclass(frozen=True)
class ClassArchive:
    """The driver JVM's class archive: mapped from ``path``, or (``dumping`` set) written there at the JVM's exit."""

    path: Path
    dumping: Path | None = None

    def java_options(self) -> str:
        # -Xlog:cds off: Java reports at the dump each class it cannot archive (old class-file versions in Spark's
        # jars), a warning per class that says nothing about the run
        if self.dumping is not None:
            return f"-XX:ArchiveClassesAtExit={self.dumping} -Xlog:cds*=off"
        return f"-XX:SharedArchiveFile={self.path} -Xlog:cds*=off"


def class_archive_dir() -> Path:
    from applier.jars import applier_home

    return applier_home() / "class-archive"


def class_archive_key(java: str, version_text: str, jars_dir: Path | None, conf: dict[str, str]) -> str:
    """A digest of what decides whether the JVM accepts an archive: the java binary and its version, the name, size
    and time of every jar in pyspark's folder, and the driver's class path, memory and JVM options."""
    h = hashlib.sha256()
    for part in (java, version_text, DRIVER_JIT, conf.get("spark.driver.extraClassPath", ""),
                 conf.get("spark.driver.memory", ""), conf.get("spark.driver.extraJavaOptions", "")):
        h.update(part.encode() + b"\0")
    if jars_dir is not None:
        for jar in sorted(jars_dir.iterdir()):
            with contextlib.suppress(OSError):
                st = jar.stat()
                h.update(f"{jar.name}:{st.st_size}:{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:24]


def class_archive(settings: Settings, java: str, *, owns_jvm: bool,
                  folder: Path | None = None) -> ClassArchive | None:
    """The archive the driver JVM of this session maps or writes, or None: ``[spark] class_archive = false``,
    ``[spark.conf]`` options that set class-data sharing themselves, or no archive yet and a session that does not
    own its JVM (:func:`spark_session`)."""
    if not settings.spark.class_archive:
        return None
    if any(opt in settings.spark.conf.get("spark.driver.extraJavaOptions", "") for opt in _OWN_SHARING):
        return None
    from applier.jars import pyspark_jars_dir

    folder = folder or class_archive_dir()
    key = class_archive_key(java, java_version_text(java), pyspark_jars_dir(), dict(settings.spark.conf))
    path = folder / f"spark-driver-{key}.jsa"
    if path.is_file() and path.stat().st_size > 0:
        return ClassArchive(path)
    if not owns_jvm:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_dumps(folder)
    except OSError as exc:
        log.info("no class archive for the driver's JVM (%s): Spark starts without one", exc)
        return None
    return ClassArchive(path, dumping=folder / f"{path.name}.dump-{os.getpid()}")


def _remove_abandoned_dumps(folder: Path) -> None:
    """Dumps whose process is gone (killed before its JVM finished, or never ended by :func:`close_session`)."""
    for dump in folder.glob("*.jsa.dump-*"):
        pid = dump.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                dump.unlink()


def close_session(spark, *, keep_archive: bool = True, timeout: float = 300.0) -> None:
    """Stop ``spark`` (a session from ``spark_session(owns_jvm=True)``). When its JVM writes the class archive, end
    the JVM now (the py4j gateway and the pipe whose end makes it exit), wait for it, and keep the archive if the
    JVM exited cleanly; nothing in this process may use Spark afterwards. ``keep_archive=False`` (an operator's
    stop signal: the stop must stay prompt) kills the JVM instead, before it writes anything. Running tasks are
    drained first (:func:`drain_tasks`)."""
    drain_tasks(spark, TASK_DRAIN_SECONDS if keep_archive else 2.0)
    spark.stop()
    if not _DUMPING:
        return
    archive = _DUMPING.pop()
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    dump = archive.dumping
    assert dump is not None
    if proc is None:  # not the JVM this process started
        return
    t = time.monotonic()
    with contextlib.suppress(Exception):
        gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if not keep_archive:
        proc.kill()
        proc.wait()
        with contextlib.suppress(OSError):
            dump.unlink()
        return
    with contextlib.suppress(OSError):
        proc.stdin.close()  # the gateway exits when its stdin ends
    try:
        code = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        log.warning("the driver's JVM did not exit within %.0f s of the session's end (writing its class archive "
                    "%s): left running; the next start removes the unfinished file", timeout, dump)
        return
    if code == 0 and dump.is_file() and dump.stat().st_size > 0:
        os.replace(dump, archive.path)
        _prune_archives(archive.path.parent)
        log.info("wrote the driver JVM's class archive %s (%.0f MB in %.1f s): later starts map Spark's classes "
                 "from it ([spark] class_archive)", archive.path, archive.path.stat().st_size / 2**20,
                 time.monotonic() - t)
    else:
        with contextlib.suppress(OSError):
            dump.unlink()
        log.info("the driver's JVM exited with code %s and no complete class archive: the next run tries again", code)


TASK_DRAIN_SECONDS = 10.0


def drain_tasks(spark, timeout: float) -> bool:
    """Cancel the session's jobs and wait (up to ``timeout`` s) until no task runs on any executor; True if none
    does. A query that failed in one task (a refused Kafka login) leaves its job's other tasks being killed:
    stopping the context under them clears ``SparkEnv`` while they still read their broadcast, and each logs a
    ``NullPointerException`` with its Java trace on stderr after the applier has already named the real cause.

    Two counts must reach zero: the status tracker's (the listener bus: a task's end has been seen) and the task
    scheduler's own (a killed task's final status update has been taken in). The tracker can show none running
    while a killed task's update is still on its way to the scheduler; stopping then shuts the scheduler's result
    pool first, and the late update is logged as ``Exception in statusUpdate`` with a
    ``RejectedExecutionException`` trace (CI, stop 35)."""
    try:
        spark.sparkContext.cancelAllJobs()
        context = spark.sparkContext._jsc.sc()
        tracker, scheduler = context.statusTracker(), context.taskScheduler()
        deadline = time.monotonic() + timeout
        while True:
            if (sum(info.numRunningTasks() for info in tracker.getExecutorInfos()) == 0
                    and _scheduled_tasks(scheduler) == 0):
                return True
            if time.monotonic() >= deadline:
                log.info("tasks still running %.0f s after their jobs were cancelled: stopping Spark under them",
                         timeout)
                return False
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - a context already stopped (or its gateway gone) has nothing to drain
        return True


def _scheduled_tasks(scheduler) -> int:
    """Tasks the task scheduler launched and has no final status update of yet, over all executors (0 when the
    scheduler cannot say: a Spark without ``runningTasksByExecutors``; the status tracker's count still holds)."""
    try:
        values = scheduler.runningTasksByExecutors().valuesIterator()
        total = 0
        while values.hasNext():
            total += values.next()
        return total
    except Exception:  # noqa: BLE001 - see above
        return 0


def _prune_archives(folder: Path) -> None:
    archives = sorted(folder.glob("*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[CLASS_ARCHIVES_KEPT:]:
        with contextlib.suppress(OSError):
            old.unlink()


def workers_python(settings: Settings, master: str) -> str | None:
    """The Python the executors run: ``spark.pyspark.python`` in ``[spark.conf]``, else ``$PYSPARK_PYTHON``; on a
    local master the driver's own interpreter (its virtualenv has the dependencies); on a cluster ``None``, which
    leaves Spark's default (``python3`` on each node)."""
    chosen = settings.spark.conf.get("spark.pyspark.python") or os.environ.get("PYSPARK_PYTHON")
    if chosen:
        return chosen
    return sys.executable if is_local_master(master) else None


def _local_workers_like_driver() -> None:
    """Local Spark's Python workers (they decode, applier.decode) inherit this environment: make them import
    the same applier package as the driver, also when it runs from a source folder that is not installed."""
    root = str(Path(__file__).resolve().parents[1])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])


# ---- Spark's own output ---------------------------------------------------------------------------------------------

# Loggers that speak at WARN in every run of a pipeline: a micro-batch longer than the trigger interval (a catch-up),
# adaptive execution switched off for streaming, no native Hadoop library. ERROR still shows.
QUIET_LOGGERS = (
    "org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",
    "org.apache.spark.sql.execution.streaming.ProcessingTimeExecutor",
    "org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream",
    "org.apache.spark.sql.execution.streaming.ResolveWriteToStream",
    "org.apache.hadoop.util.NativeCodeLoader",
)
# Loggers off: Spark's "Error in TaskCompletionListener" with its Java trace is the clean-up of a task whose query is
# already failing (a Kafka login refused while running), logged after the failure the applier reports itself in one
# line; with the class archive's faster start it lands on stderr before the run ends.
SILENT_LOGGERS = ("org.apache.spark.TaskContextImpl",)
# What the JVM itself prints at start (not log4j): Spark asks for the jdk.incubator.vector module, and Java says so
# on stderr with no option to turn it off.
JVM_NOISE = (b"WARNING: Using incubator modules:",)
# Set by silence(): the JVM's stderr is dropped whole (a run stopping on an operator's signal).
_JVM_QUIET = threading.Event()


def spark_log_level() -> str:
    """Spark's log4j level for the driver: ERROR, or WARN when the applier logs at INFO (``-v``)."""
    return "WARN" if logging.getLogger("applier").isEnabledFor(logging.INFO) else "ERROR"


def log_config_text(level: str) -> str:
    """A log4j2 configuration for the driver's JVM: Spark's console format on stderr at ``level``."""
    lines = [
        "# written by the applier at every start (applier/session.py); set -Dlog4j2.configurationFile in",
        "# [spark.conf] \"spark.driver.extraJavaOptions\" to use another",
        "status = error",
        "appender.console.type = Console",
        "appender.console.name = console",
        "appender.console.target = SYSTEM_ERR",
        "appender.console.layout.type = PatternLayout",
        "appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex",
        f"rootLogger.level = {level.lower()}",
        "rootLogger.appenderRef.stdout.ref = console",
        # pyspark's JVM counts as a shell: without its logger at the root's level Spark prints "Setting default
        # log level to ..." at every start
        "logger.repl.name = org.apache.spark.api.python.PythonGatewayServer",
        f"logger.repl.level = {level.lower()}",
    ]
    for i, name in enumerate(QUIET_LOGGERS):
        lines += [f"logger.quiet{i}.name = {name}", f"logger.quiet{i}.level = error"]
    for i, name in enumerate(SILENT_LOGGERS):
        lines += [f"logger.silent{i}.name = {name}", f"logger.silent{i}.level = off"]
    return "\n".join(lines) + "\n"


def write_log_config(local_dir: Path) -> Path:
    """The driver's log4j2 file in ``local_dir``, for :func:`spark_log_level`."""
    path = Path(local_dir) / "log4j2.properties"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(log_config_text(spark_log_level()))
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def jvm_stderr_filtered():
    """Inside the block this process's stderr is a pipe, so the JVM pyspark starts there (and Spark's Python
    workers, which it starts later) inherits it: a thread copies every line to the real stderr except
    :data:`JVM_NOISE`. The applier's own stderr is the real one again after the block."""
    try:
        sys.stderr.flush()
        real = os.dup(2)
        r, w = os.pipe()
    except (OSError, ValueError):  # no stderr to speak of
        yield
        return
    threading.Thread(target=_copy_stderr, args=(r, real), name="applier-jvm-stderr", daemon=True).start()
    saved = os.dup(2)
    os.dup2(w, 2)
    os.close(w)
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _copy_stderr(read_fd: int, out_fd: int) -> None:
    with os.fdopen(read_fd, "rb", buffering=0) as src, os.fdopen(out_fd, "wb", buffering=0) as out:
        for line in _lines(src):
            if line.startswith(JVM_NOISE) or _JVM_QUIET.is_set():
                continue
            with contextlib.suppress(OSError):
                out.write(line)


def _lines(src):
    """Lines as they come (a partial line is passed on when the pipe has nothing more for now)."""
    buf = b""
    while True:
        chunk = src.read(65536)
        if not chunk:
            if buf:
                yield buf
            return
        buf += chunk
        *whole, buf = buf.split(b"\n")
        for line in whole:
            yield line + b"\n"
        if buf and not buf.startswith(JVM_NOISE[0][: len(buf)]):
            yield buf
            buf = b""


def silence(spark) -> None:
    """Spark quiet, for a run stopping on an operator's signal: stopping the query cancels the micro-batch being
    read, and Spark 4.2 reports that as log4j errors, as py4j's error log of the failed ``foreachBatch`` call with
    its Java trace, and (the stream thread matching a regex against that trace) as a ``StackOverflowError`` of a
    thousand lines that the JVM prints on stderr itself. None of it is news then, and none of it changes what is
    committed: log4j off, py4j's and pyspark's Python loggers off, the JVM's stderr dropped."""
    _JVM_QUIET.set()
    for name in ("py4j", "pyspark"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    with contextlib.suppress(Exception):
        spark.sparkContext.setLogLevel("OFF")


_PY_ERROR = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def python_failure(text: str) -> str:
    """The Python exception line inside a Spark task failure (a Java stack trace around a Python traceback)."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if "Traceback (most recent call last)" in ln), None)
    for ln in lines[start or 0:]:
        m = _PY_ERROR.match(ln)
        if m and not m.group(1).startswith(("java.", "org.", "py4j.", "scala.")):
            return f"{m.group(1)}: {m.group(2)}"[:400]
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    return first[:400]


def check_executors(spark, settings: Settings, master: str, digest: str) -> list[tuple[str, int, str, str, str]]:
    """Run one small job on the executors before the pipeline starts: they must exist within
    ``spark.startup_timeout_seconds``, import the applier the driver shipped (its source ``digest``), and build
    the pipeline's decoder.
    Returns what each task reported (host, pid, python, applier file, package digest)."""
    import functools

    sc = spark.sparkContext
    timeout = settings.spark.startup_timeout_seconds
    spec = (WorkerSpec(settings.source.protocol, tuple(sorted(settings.source.codec.items())), True)
            if settings.decodes_on_executors() else None)
    tasks = max(2, sc.defaultParallelism)
    box: dict[str, Any] = {}

    def job() -> None:
        try:
            # a failing check is reported below in one line; Spark's per-attempt task warnings would repeat the
            # executors' Python traceback four times above it
            sc.setLogLevel("ERROR")
            sc.setJobGroup("applier-startup-check", "applier: executors import the applier", True)
            box["result"] = sc.parallelize(range(tasks), tasks).map(
                functools.partial(worker_identity, spec)).collect()
        except BaseException as exc:  # reported by the caller's thread
            box["error"] = exc

    t = threading.Thread(target=job, name="applier-executor-check", daemon=True)
    t.start()
    t.join(timeout)
    sc.setLogLevel(spark_log_level())
    python = workers_python(settings, master) or "python3"
    if t.is_alive():
        sc.cancelJobGroup("applier-startup-check")
        t.join(30)
        raise _config_error(
            settings, "spark.master",
            f"no executor of {master} ran a task within {timeout} s "
            "(spark.startup_timeout_seconds): check that workers are registered with the master and have the free "
            "cores and memory that spark.executor.cores / spark.executor.memory ask for, and that the executors "
            "can connect back to this driver (set spark.driver.host in [spark.conf] to an address they reach)")
    if "error" in box:
        reason = python_failure(str(box["error"]))
        raise _config_error(
            settings, "spark.conf",
            f"the executors cannot run the applier's decoder: {reason}. Their Python ({python}; set "
            "\"spark.pyspark.python\" in [spark.conf]) needs the applier's dependencies: install the same "
            f"ticdc-applier {_version()} wheel into a virtualenv on every node (pip wheel --no-deps . builds it) "
            "and point spark.pyspark.python at it; the applier's own code is shipped with the job")
    result = box["result"]
    other = sorted({f"{host} ({path})" for host, _, _, path, theirs in result if theirs != digest})
    if other:
        raise _config_error(
            settings, "spark.conf",
            f"executors on {', '.join(other)} import another applier than the driver's: remove that copy from "
            "the executors' Python, or drop it from spark.submit.pyFiles, so the shipped one is used")
    log.info("executors ready: %s", ", ".join(sorted({f"{h}:{p}" for h, p, *_ in result})))
    return result


def _version() -> str:
    import applier

    return applier.__version__


# ---- the query's checkpoint --------------------------------------------------------------------------------------

def reset_checkpoint(spark, settings: Settings) -> str:
    """Clear the query's checkpoint (working state only; progress lives in the target) through Hadoop's file
    system API, which is what Spark will write it with, and prove it writable; returns the query location.

    The location is handed over as a URI, unchanged: ``hdfs://nn:8020/x`` must reach Hadoop as written."""
    location = settings.pipeline.checkpoint_uri.rstrip("/") + "/query"
    jvm = spark.sparkContext._jvm
    try:
        path = jvm.org.apache.hadoop.fs.Path(location)
        fs = path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        fs.delete(path, True)
        probe = jvm.org.apache.hadoop.fs.Path(location + "/_applier_write_check")
        fs.create(probe, True).close()
        fs.delete(path, True)
    except Exception as exc:
        reason = str(exc).splitlines()
        cause = next((ln.strip() for ln in reason if "Exception:" in ln or "Error:" in ln), reason[0] if reason else "")
        raise _config_error(
            settings, "pipeline.checkpoint_dir",
            f"Spark cannot write the checkpoint at {location}: {cause[:400]}. Use a local path on the driver or a "
            "URI whose file system is on Spark's classpath and writable (hdfs:// needs the namenode reachable; "
            "s3a:// needs hadoop-aws in spark.jars and credentials)") from None
    return location
