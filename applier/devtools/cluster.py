"""A Spark standalone cluster on loopback, from PySpark's own distribution: one master and N workers.

Why: the scale-out benchmark (applier.devtools.bench_scale) and anything else that must see the applier on a
real ``spark://`` master need one on this host without installing Spark separately. The pip package ``pyspark``
ships ``bin/spark-class`` and every jar the daemons need, so ``SPARK_HOME`` is simply the package folder.

Everything runs on 127.0.0.1 with free ports, in a temporary folder (work dirs, local dirs, logs), and every
process is started in its own session so that killing its process group also ends what it started (a worker's
executors and their Python workers). :func:`standalone_cluster` kills them all when its block ends, on errors
too. Tooling: the product never imports it; tests/e2e/test_cluster.py starts its cluster with it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

LOOPBACK = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class ClusterError(RuntimeError):
    """The cluster did not come up; the message carries the tail of the daemons' logs."""


# ---- pure helpers (unit-tested) ------------------------------------------------------------------------------

def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (the daemons bind it a moment later; a clash fails loudly)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def master_alive(state: Mapping[str, Any]) -> bool:
    """Whether the master's ``/json/`` document says it is the active master."""
    return state.get("status") == "ALIVE"


def alive_workers(state: Mapping[str, Any]) -> int:
    """Workers the master counts as ALIVE in its ``/json/`` document. The list is authoritative: a worker that
    registered again after a restart appears twice, once DEAD; ``aliveworkers`` is only the fallback for a
    document without the list."""
    workers = state.get("workers")
    if isinstance(workers, list):
        return sum(1 for w in workers if isinstance(w, Mapping) and w.get("state") == "ALIVE")
    return int(state.get("aliveworkers") or 0)


def alive_cores(state: Mapping[str, Any]) -> int:
    """Cores offered by the ALIVE workers (what ``spark.cores.max`` may claim)."""
    workers = state.get("workers")
    if not isinstance(workers, list):
        return int(state.get("cores") or 0)
    return sum(int(w.get("cores") or 0) for w in workers if isinstance(w, Mapping) and w.get("state") == "ALIVE")


def driver_conf(cores: int, *, python: str | None = None, executor_memory: str = "512m",
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``[spark.conf]`` for a driver on this host using a loopback cluster of ``cores`` one-core executors.

    The driver is pinned to loopback (the executors connect back to it), every executor gets one core and the
    application may claim all of them. ``spark.locality.wait = 0`` lets a task run on any free core: the Kafka
    source prefers one executor per partition, which otherwise serialises the tasks of several partitions on one
    executor for the locality wait (3 s) while the other idles. ``spark.pyspark.python`` is the driver's
    interpreter: its virtualenv has the applier's dependencies."""
    conf = {
        "spark.pyspark.python": python or sys.executable,
        "spark.driver.host": LOOPBACK,
        "spark.driver.bindAddress": LOOPBACK,
        "spark.executor.cores": "1",
        "spark.executor.memory": executor_memory,
        "spark.cores.max": str(cores),
        "spark.locality.wait": "0",
    }
    conf.update(extra or {})
    return conf


# ---- the cluster ---------------------------------------------------------------------------------------------

@dataclass
class Cluster:
    """A running loopback cluster: its master URL, web UI and folders."""

    url: str  # spark://127.0.0.1:PORT
    webui: str  # http://127.0.0.1:PORT
    workers: int
    cores_per_worker: int
    root: Path
    work_dirs: list[Path] = field(default_factory=list)

    @property
    def cores(self) -> int:
        return self.workers * self.cores_per_worker

    def state(self, timeout: float = 5.0) -> dict[str, Any]:
        """The master's ``/json/`` document (workers, their state and cores, applications)."""
        return master_state(self.webui, timeout)

    def driver_conf(self, **kwargs: Any) -> dict[str, str]:
        return driver_conf(self.cores, **kwargs)


def master_state(webui: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(f"{webui.rstrip('/')}/json/", timeout=timeout) as r:
        return json.load(r)


def spark_home() -> Path:
    """PySpark's package folder: it has ``bin/spark-class`` and ``jars/``, all a standalone daemon needs."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class _Daemons:
    """The started daemon processes, each the leader of its own process group, and their logs."""

    def __init__(self, root: Path, env: Mapping[str, str]) -> None:
        self.root = root
        self.env = dict(env)
        self.spark_class = str(spark_home() / "bin" / "spark-class")
        self.procs: list[subprocess.Popen] = []

    def start(self, name: str, *argv: str) -> None:
        with open(self.root / f"{name}.log", "wb") as log:  # the child keeps its own descriptor
            self.procs.append(subprocess.Popen(
                [self.spark_class, *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True))

    def wait_for(self, what: str, ok: Callable[[], bool], seconds: float) -> None:
        """Poll ``ok`` until it holds; fail with the logs when a daemon exits or time runs out."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if ok():
                    return
            except (OSError, ValueError):  # not listening yet, or a half-written document
                pass
            dead = [p for p in self.procs if p.poll() is not None]
            if dead:
                raise ClusterError(f"Spark standalone cluster: a daemon exited (code {dead[0].returncode}) before "
                                   f"{what}\n{self.log_tails()}")
            time.sleep(0.5)
        raise ClusterError(f"Spark standalone cluster: no {what} within {seconds:.0f} s\n{self.log_tails()}")

    def log_tails(self, chars: int = 2000) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-chars:]}"
                         for f in sorted(self.root.glob("*.log")))

    def kill_all(self, grace: float = 20.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after ``grace`` seconds."""
        for p in self.procs:
            _signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait(10)
        for p in self.procs:  # the leader may be gone while executors of its group linger
            _signal_group(p, signal.SIGKILL)


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def daemon_env(root: Path) -> dict[str, str]:
    """The daemons' environment: Spark from the pyspark package, everything on loopback, every folder under
    ``root`` (executors' scratch space included), small daemon heaps."""
    env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP=LOOPBACK, SPARK_DAEMON_MEMORY="256m",
               SPARK_LOG_DIR=str(root / "logs"), SPARK_PID_DIR=str(root),
               SPARK_LOCAL_DIRS=str(root / "local"))
    env.pop("PYSPARK_GATEWAY_PORT", None)  # a daemon must not think it runs under a driver's spark-submit
    return env


@contextmanager
def standalone_cluster(workers: int = 2, *, cores: int = 1, memory: str = "1g", root: Path | None = None,
                       timeout: float = 120.0, keep_dir: bool = False,
                       log: Callable[[str], None] | None = None) -> Iterator[Cluster]:
    """Start a master and ``workers`` workers of ``cores`` cores and ``memory`` each on loopback, wait until
    the master reports all of them ALIVE, yield the :class:`Cluster`, and kill every process when the block
    ends (also on errors or Ctrl-C). The temporary folder goes too, unless ``keep_dir`` (or ``root`` was
    given): it holds the daemons' logs and the executors' stderr."""
    if workers < 1 or cores < 1:
        raise ValueError("a cluster needs at least one worker with at least one core")
    own_root = root is None
    root = Path(tempfile.mkdtemp(prefix="applier-spark-cluster-")) if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    (root / "local").mkdir(exist_ok=True)
    daemons = _Daemons(root, daemon_env(root))
    port, webui_port = free_port(), free_port()
    url, webui = f"spark://{LOOPBACK}:{port}", f"http://{LOOPBACK}:{webui_port}"
    try:
        daemons.start("master", MASTER_CLASS, "--host", LOOPBACK, "--port", str(port),
                      "--webui-port", str(webui_port))
        daemons.wait_for("master answering", lambda: master_alive(master_state(webui)), timeout)
        dirs = []
        for i in range(workers):
            d = root / f"worker{i}"
            dirs.append(d)
            daemons.start(f"worker{i}", WORKER_CLASS, url, "--host", LOOPBACK, "--cores", str(cores),
                          "--memory", memory, "--webui-port", str(free_port()), "--work-dir", str(d))
        daemons.wait_for(f"{workers} ALIVE worker(s)", lambda: alive_workers(master_state(webui)) >= workers,
                         timeout)
        if log:
            log(f"Spark standalone cluster up: {url}, {workers} worker(s) x {cores} core(s), folder {root}")
        yield Cluster(url, webui, workers, cores, root, dirs)
    finally:
        daemons.kill_all()
        if own_root and not keep_dir:
            shutil.rmtree(root, ignore_errors=True)
