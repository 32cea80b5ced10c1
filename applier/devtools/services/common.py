"""What the local services share: ports and URLs, the state home, spawning, waiting, stopping, apt installs.

Why apart from the package's face (``__init__``): each service module imports these, and the face imports the
service modules, so keeping them in the face made an import loop.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from applier.jars import applier_home

SERVICES = ("kafka", "mariadb", "postgres")  # what start()/status() cover without arguments
OPTIONAL_SERVICES = ("registry", "tidb")  # started only when asked for by name
ALL_SERVICES = SERVICES + OPTIONAL_SERVICES
HOST = "127.0.0.1"
DEFAULT_PORTS = {"kafka": 19092, "mariadb": 13306, "postgres": 15432, "registry": 18081, "tidb": 14000}
PORT_ENV = {
    "kafka": "APPLIER_KAFKA_PORT",
    "mariadb": "APPLIER_MARIADB_PORT",
    "postgres": "APPLIER_PG_PORT",
    "registry": "APPLIER_REGISTRY_PORT",
    "tidb": "APPLIER_TIDB_PORT",  # its status port: APPLIER_TIDB_STATUS_PORT (tidb.py)
}
REGISTRY_PATH = "/apis/ccompat/v7"  # Apicurio Registry's Confluent-compatible API
DB_USER = DB_PASSWORD = DB_NAME = "applier"


class ServicesError(RuntimeError):
    """A service could not be resolved, started or stopped; the message says why."""


@dataclass(frozen=True)
class Urls:
    kafka: str
    mariadb_url: str
    pg_url: str
    # Confluent-compatible schema registry API base (only up when started with start({"registry"}))
    registry_url: str = f"http://{HOST}:{DEFAULT_PORTS['registry']}{REGISTRY_PATH}"


# ---------------------------------------------------------------------------------------------
# configuration


def home_dir(*parts: str) -> Path:
    p = applier_home().joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def port(service: str) -> int:
    raw = os.environ.get(PORT_ENV[service])
    if not raw:
        return DEFAULT_PORTS[service]
    try:
        value = int(raw)
    except ValueError:
        raise ServicesError(f"{PORT_ENV[service]}={raw!r} is not a port number") from None
    if not 0 < value < 65536:
        raise ServicesError(f"{PORT_ENV[service]}={raw!r} is not a port number")
    return value


def kafka_controller_port() -> int:
    raw = os.environ.get("APPLIER_KAFKA_CONTROLLER_PORT")
    return int(raw) if raw else port("kafka") + 1


def build_urls(
    kafka_port: int, mariadb_port: int, pg_port: int, host: str = HOST, registry_port: int | None = None
) -> Urls:
    cred = f"{DB_USER}:{DB_PASSWORD}"
    return Urls(
        kafka=f"{host}:{kafka_port}",
        mariadb_url=f"mysql+pymysql://{cred}@{host}:{mariadb_port}/{DB_NAME}",
        pg_url=f"postgresql+psycopg://{cred}@{host}:{pg_port}/{DB_NAME}",
        registry_url=f"http://{host}:{registry_port or DEFAULT_PORTS['registry']}{REGISTRY_PATH}",
    )


def urls() -> Urls:
    """The URLs of the services (whether they run or not)."""
    return build_urls(port("kafka"), port("mariadb"), port("postgres"), registry_port=port("registry"))


def url_for(service: str, u: Urls | None = None) -> str:
    if service == "tidb":
        return f"mysql+pymysql://{DB_USER}@{HOST}:{port('tidb')}/"
    u = u or urls()
    return {"kafka": u.kafka, "mariadb": u.mariadb_url, "postgres": u.pg_url, "registry": u.registry_url}[service]


def normalize_only(only: Iterable[str] | str | None, *, default: tuple[str, ...] = SERVICES) -> list[str]:
    """``None`` -> ``default`` (the non-optional services); accepts a set/list or a comma-separated string;
    keeps ALL_SERVICES order."""
    if only is None:
        return list(default)
    if isinstance(only, str):
        only = only.split(",")
    aliases = {"pg": "postgres", "postgresql": "postgres", "mysql": "mariadb", "schema-registry": "registry",
               "apicurio": "registry"}
    wanted = set()
    for item in only:
        item = item.strip().lower()
        if not item:
            continue
        item = aliases.get(item, item)
        if item not in ALL_SERVICES:
            raise ServicesError(f"unknown service {item!r}: choose among {', '.join(ALL_SERVICES)}")
        wanted.add(item)
    if not wanted:
        raise ServicesError("no service selected")
    return [s for s in ALL_SERVICES if s in wanted]


def env_lines(u: Urls | None = None, jars: list[str] | None = None, *, registry: bool = False) -> list[str]:
    """Shell ``export`` lines for the services (and the Spark Kafka jars when given; APPLIER_REGISTRY_URL
    when ``registry``)."""
    import shlex

    u = u or urls()
    lines = [
        f"export APPLIER_KAFKA={shlex.quote(u.kafka)}",
        f"export APPLIER_MARIADB_URL={shlex.quote(u.mariadb_url)}",
        f"export APPLIER_PG_URL={shlex.quote(u.pg_url)}",
    ]
    if registry:
        lines.append(f"export APPLIER_REGISTRY_URL={shlex.quote(u.registry_url)}")
    if jars is not None:
        lines.append(f"export APPLIER_SPARK_JARS={shlex.quote(','.join(jars))}")
    return lines


# ---------------------------------------------------------------------------------------------
# process helpers shared by kafka.py and databases.py

# Popen objects of the services started by this process: kept so that they are not garbage
# collected while running (ResourceWarning) and so that stop() in the same process reaps them.
_CHILDREN: dict[int, subprocess.Popen] = {}


def port_open(p: int, host: str = HOST, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, p), timeout=timeout):
            return True
    except OSError:
        return False


def pid_file(service: str) -> Path:
    return home_dir("run") / f"{service}.pid"


def log_path(name: str) -> Path:
    return home_dir("logs") / name


def tail(path: Path, n: int = 30) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return f"--- last lines of {path} ---\n" + "\n".join(lines[-n:])


def _reap(pid: int) -> None:
    child = _CHILDREN.get(pid)
    if child is not None:
        if child.poll() is not None:
            _CHILDREN.pop(pid, None)
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def pid_alive(pid: int) -> bool:
    _reap(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def managed_pid(service: str, marker: str) -> int | None:
    """The pid recorded for ``service`` if that process still runs and is ours.

    ``marker`` is a string that the process's command line contains (a path of this state home),
    which protects against a recycled pid.  A stale pid file is removed.
    """
    pf = pid_file(service)
    try:
        pid = int(pf.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if pid_alive(pid) and marker in cmdline(pid):
        return pid
    pf.unlink(missing_ok=True)
    return None


def spawn(
    service: str,
    argv: list[str],
    log_name: str,
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    user: str | None = None,
) -> int:
    """Start ``argv`` detached (own session, no stdin, stdout+stderr appended to logs/log_name)."""
    out = open(log_path(log_name), "ab")
    try:
        out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(argv)}\n".encode())
        out.flush()
        kwargs: dict = {}
        if user is not None:
            kwargs.update(user=user, group=user, extra_groups=[])
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
            **kwargs,
        )
    finally:
        out.close()
    _CHILDREN[proc.pid] = proc
    pid_file(service).write_text(f"{proc.pid}\n")
    return proc.pid


def terminate(service: str, pid: int, sig: int = signal.SIGTERM, timeout: float = 60.0) -> bool:
    """Send ``sig``, wait up to ``timeout`` s, then SIGKILL. True if it exited before the SIGKILL."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pid_file(service).unlink(missing_ok=True)
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            pid_file(service).unlink(missing_ok=True)
            return True
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for _ in range(100):
        if not pid_alive(pid):
            break
        time.sleep(0.1)
    pid_file(service).unlink(missing_ok=True)
    return False


def wait_until(
    what: str,
    check,
    *,
    timeout: float,
    pid: int | None = None,
    log: Path | list[Path] | None = None,
    interval: float = 0.25,
):
    """Call ``check()`` until it returns a true value (returned) or raises nothing for ``timeout`` s.

    ``check`` may raise; the last exception is reported.  If ``pid`` dies, fail at once.
    """
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    logs = [log] if isinstance(log, Path) else list(log or [])

    def tails() -> str:
        return "".join("\n" + tail(p) for p in logs)

    while True:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - reported below
            last = exc
        if pid is not None and not pid_alive(pid):
            raise ServicesError(
                f"{what}: the process (pid {pid}) exited"
                + (f"; last error: {last}" if last else "")
                + tails()
            )
        if time.monotonic() > deadline:
            raise ServicesError(
                f"{what}: not ready after {timeout:.0f} s"
                + (f"; last error: {last}" if last else "")
                + tails()
            )
        time.sleep(interval)


@contextmanager
def services_lock() -> Iterator[None]:
    """One start/stop at a time per state home (e.g. parallel test workers)."""
    with open(home_dir("run") / "services.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def is_root() -> bool:
    return os.geteuid() == 0


_APT_UPDATED = False


def apt_install(*packages: str) -> None:
    """``apt-get install -y`` (after one ``apt-get update`` per process), services kept from starting.

    Debian's maintainer scripts start a freshly installed server system-wide through invoke-rc.d
    unless /usr/sbin/policy-rc.d says no; if there is no such file, one that says no (exit 101) is put
    there for the duration of the install and removed afterwards, so the install never starts or
    touches a system-wide service.
    """
    global _APT_UPDATED
    if not is_root():
        raise ServicesError(f"{' '.join(packages)} is missing and only root can install it (apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    policy = Path("/usr/sbin/policy-rc.d")
    created = False
    try:
        if not policy.exists():
            policy.write_text("#!/bin/sh\n# temporary, from applier.devtools.services\nexit 101\n")
            policy.chmod(0o755)
            created = True
        if not _APT_UPDATED:
            r = subprocess.run(["apt-get", "update"], env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise ServicesError("apt-get update failed:\n" + (r.stdout + r.stderr)[-3000:])
            _APT_UPDATED = True
        r = subprocess.run(
            ["apt-get", "install", "-y", "--no-install-recommends", *packages],
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
        )
        if r.returncode != 0:
            raise ServicesError(
                f"apt-get install {' '.join(packages)} failed:\n" + (r.stdout + r.stderr)[-3000:]
            )
    finally:
        if created:
            policy.unlink(missing_ok=True)


JAVA_PACKAGE = "openjdk-17-jre-headless"
MAVEN_PACKAGE = "maven"


def ensure_command(command: str, package: str, needed_for: str) -> str:
    """The path of ``command``, installing Debian's ``package`` first when it is missing and we are root (as the
    databases are); otherwise a ServicesError that names the command to run."""
    found = shutil.which(command)
    if found is None and is_root():
        apt_install(package)
        found = shutil.which(command)
    if found is None:
        raise ServicesError(f"{command} is not installed ({needed_for}): run apt-get install -y {package} as root "
                            "(or bash .ci/setup, which installs every prerequisite)")
    return found


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    url: str
    state: str  # "running" (started here), "external" (answers, not ours), "stopped"
    pid: int | None = None
    detail: str = ""

    @property
    def up(self) -> bool:
        return self.state in ("running", "external")


def await_ready(service: str, marker: str, pid: int, what: str, ready: Callable[[], bool], *, timeout: float,
                logs: list[Path]) -> None:
    """Wait until a process this state home spawned answers; kill it if it never does (its log tail is in
    the error)."""
    try:
        wait_until(what, ready, timeout=timeout, pid=pid, log=logs)
    except ServicesError:
        if managed_pid(service, marker) == pid:
            terminate(service, pid, signal.SIGKILL, timeout=10)
        raise


def stop_managed(service: str, marker: str, timeout: float) -> None:
    pid = managed_pid(service, marker)
    if pid is not None:
        terminate(service, pid, signal.SIGTERM, timeout=timeout)


def managed_status(service: str, marker: str, port_number: int, detail: str) -> "ServiceStatus":
    """Running (started here), external (something else answers on the port) or stopped."""
    pid = managed_pid(service, marker)
    up = port_open(port_number)
    if pid is not None:
        return ServiceStatus(service, url_for(service), "running" if up else "starting", pid, detail)
    if up:
        return ServiceStatus(service, url_for(service), "external", None, "not started from this state home")
    return ServiceStatus(service, url_for(service), "stopped")
