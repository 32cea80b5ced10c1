"""A real TiDB for the e2e tests: ``tidb-server`` and Dumpling built from TiDB's Go module, run on 127.0.0.1.

What it builds: ``tools/tidb/`` is the project's own Go module (go.mod, go.sum, tools.go; no code of TiDB's). It
requires ``github.com/pingcap/tidb`` at one version and repeats the ``replace`` directives of TiDB's go.mod, which
is why ``go install pkg@version`` cannot be used (the go command refuses a module whose go.mod has replaces).
``go build -tags codes -ldflags "-s -w"`` of ``github.com/pingcap/tidb/cmd/tidb-server`` and
``github.com/pingcap/tidb/dumpling/cmd/dumpling`` (TiDB's Makefile builds both with the ``codes`` tag) writes
``$APPLIER_HOME/tidb/<version>/bin/{tidb-server,dumpling}``; a marker file records how and how long. The binaries
are built only when missing; Go keeps the modules in ``$(go env GOMODCACHE)`` (``~/go/pkg/mod``) and the compiled
packages in ``$(go env GOCACHE)`` (``~/.cache/go-build``), so a rebuild on a machine that kept them is quick.
The build runs under ``nice -n 19``. Cost, measured on this project's 2-core machine: README, "Tests".

Which Go: the first of ``$APPLIER_GO``, ``go`` on PATH and ``/usr/local/go/bin/go`` that runs. One at least
:data:`GO_MIN` builds with itself (``GOTOOLCHAIN=local``); an older one from 1.21 on is told
``GOTOOLCHAIN=<GO_TOOLCHAIN>``, so the go command fetches that toolchain from the Go module proxy (it is published
there as the module ``golang.org/toolchain``) and checks it against the checksum database. Without any Go, Debian's
``golang-go`` is installed (as root) for that purpose: Debian 12's own Go (1.19) is too old to build TiDB, but it
downloads the toolchain module with ``go mod download``, which verifies it, and the build uses that toolchain.

The server: ``tidb-server -store unistore -path <data> -host 127.0.0.1 -P <port> -status <status port>
-status-host 127.0.0.1``, TiDB's embedded store (one process, no PD, no TiKV). ``data/`` is emptied at every start,
so each start is a new cluster. Ports 14000 and 14080, or ``$APPLIER_TIDB_PORT`` and ``$APPLIER_TIDB_STATUS_PORT``.
Ready when ``SELECT tidb_version()`` answers; then the user ``applier`` (password ``applier``, all privileges) is
created, and the GC safe point row is written (below). Logs: ``logs/tidb.log`` (TiDB's own) and
``logs/tidb.out``. Started only on request (``start({"tidb"})``, ``--only tidb``), like the schema registry.

The GC safe point: a TiDB on TiKV has a GC worker that, every ``tidb_gc_run_interval``, moves the safe point to
now - ``tidb_gc_life_time`` and records it in ``mysql.tidb`` (``tikv_gc_safe_point``); ``SET @@tidb_snapshot``
compares the TSO asked for with that row and refuses an older one (error 8055, "snapshot is older than GC safe
point"). The embedded store has no GC worker, and without the row every snapshot read fails ("can not get
'tikv_gc_safe_point'"), so the start writes the row as a first GC run would (the safe point 2000-01-01, before
anything here). :func:`set_gc_safe_point` moves it, as a GC run does: how the tests make TiDB's GC pass a TSO
without waiting the 10-minute minimum of ``tidb_gc_life_time``; the refusal is TiDB's own.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from applier.devtools.services.common import (
    HOST,
    ServicesError,
    ServiceStatus,
    apt_install,
    await_ready,
    ensure_command,
    home_dir,
    is_root,
    log_path,
    managed_pid,
    managed_status,
    port,
    port_open,
    spawn,
    stop_managed,
    wait_until,
)
from applier.jars import applier_home, locked

NAME = "tidb"
MODULE = "github.com/pingcap/tidb"
PROGRAMS = {
    "tidb-server": "github.com/pingcap/tidb/cmd/tidb-server",
    "dumpling": "github.com/pingcap/tidb/dumpling/cmd/dumpling",
}
BUILD_TAGS = "codes"  # as TiDB's Makefile: leaves the test kits out
LDFLAGS = "-s -w"  # no symbol table or DWARF: smaller binaries, a shorter link
GO_MIN = (1, 23, 12)  # TiDB's go.mod: go 1.23.12
GO_TOOLCHAIN = "go1.23.12"
GO_TOOLCHAIN_FLOOR = (1, 21, 0)  # the first go command that fetches a toolchain by itself (GOTOOLCHAIN)
DEFAULT_STATUS_PORT = 14080
USER = PASSWORD = "applier"
READY_TIMEOUT = 180.0
STOP_TIMEOUT = 30.0
MARKER = "build.json"
GC_SAFE_POINT_ROW = "tikv_gc_safe_point"

INITIAL_SAFE_POINT = "20000101-00:00:00.000 +0000"

_REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------------------------
# the module and where its binaries go


def module_dir() -> Path:
    """The project's Go module that builds TiDB (``tools/tidb`` of the repository)."""
    d = _REPO / "tools" / "tidb"
    if not (d / "go.mod").is_file():
        raise ServicesError(f"{d}/go.mod is missing: TiDB is built from the repository's tools/tidb module, so run "
                            "this from a checkout of the project (an installed wheel does not carry it)")
    return d


def tidb_version(mod: Path | None = None) -> str:
    """The version of github.com/pingcap/tidb that tools/tidb/go.mod requires."""
    text = ((mod or module_dir()) / "go.mod").read_text()
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(MODULE)}\s+(v\S+)", text, re.M)
    if m is None:
        raise ServicesError(f"tools/tidb/go.mod does not require {MODULE} at a version")
    return m.group(1)


def install_dir(version: str | None = None) -> Path:
    return applier_home() / "tidb" / (version or tidb_version())


def binaries(version: str | None = None) -> dict[str, Path]:
    d = install_dir(version) / "bin"
    return {name: d / name for name in PROGRAMS}


def _built(version: str) -> dict[str, Path] | None:
    bins = binaries(version)
    ok = (install_dir(version) / MARKER).is_file() and all(p.is_file() and os.access(p, os.X_OK)
                                                           for p in bins.values())
    return bins if ok else None


def build_info(version: str | None = None) -> dict:
    """What the marker file recorded of the build (empty when not built)."""
    try:
        return json.loads((install_dir(version) / MARKER).read_text())
    except (OSError, ValueError):
        return {}


# ---------------------------------------------------------------------------------------------
# Go


def go_version(go: str) -> tuple[int, int, int] | None:
    """``go version``'s release as a tuple, or None when it does not run."""
    try:
        r = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, GOTOOLCHAIN="local"))
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"go(\d+)\.(\d+)(?:\.(\d+))?", r.stdout.strip())
    if r.returncode != 0 or m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def _candidates() -> list[str]:
    out = []
    for c in (os.environ.get("APPLIER_GO"), shutil.which("go"), "/usr/local/go/bin/go", "/usr/lib/go/bin/go"):
        if c and c not in out and os.path.isfile(c) and os.access(c, os.X_OK):
            out.append(c)
    return out


@dataclass(frozen=True)
class Go:
    """The go command the build runs, and the GOTOOLCHAIN it runs with."""

    path: str
    version: tuple[int, int, int]
    toolchain: str  # "local" or "go1.x.y" (fetched through the module proxy)

    def describe(self) -> str:
        v = "go" + ".".join(map(str, self.version))
        return f"{self.path} ({v})" + ("" if self.toolchain == "local" else f" with GOTOOLCHAIN={self.toolchain}")


def find_go() -> Go:
    """A Go that can build TiDB (see the module's docstring for the order)."""
    found = [(c, go_version(c)) for c in _candidates()]
    for c, v in found:
        if v is not None and v >= GO_MIN:
            return Go(c, v, "local")
    for c, v in found:
        if v is not None and v >= GO_TOOLCHAIN_FLOOR:
            return Go(c, v, GO_TOOLCHAIN)
    return _toolchain_from_proxy([c for c, v in found if v is not None])


def _toolchain_from_proxy(old: list[str]) -> Go:
    """No Go from 1.21 on: download the toolchain module with whatever go command there is (Debian's when none),
    which verifies it against the checksum database, and use its bin/go."""
    if not old:
        if not is_root():
            raise ServicesError(f"no Go is installed: building TiDB needs Go >= {'.'.join(map(str, GO_MIN))} (or any "
                                "go command, which then fetches that toolchain): install Go, set APPLIER_GO, or run "
                                "as root so that Debian's golang-go is installed")
        apt_install("golang-go")
        old = [c for c in _candidates() if go_version(c) is not None]
        if not old:
            raise ServicesError("Debian's golang-go was installed but no go command runs")
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    mod = f"golang.org/toolchain@v0.0.1-{GO_TOOLCHAIN}.linux-{arch}"
    r = subprocess.run([old[0], "mod", "download", "-json", mod], capture_output=True, text=True,
                       env=dict(os.environ, GOTOOLCHAIN="local", GOFLAGS=""), cwd=home_dir("tidb"))
    try:
        folder = Path(json.loads(r.stdout)["Dir"])
    except (ValueError, KeyError):
        raise ServicesError(f"{old[0]} could not download the Go toolchain {mod} from the Go module proxy:\n"
                            f"{(r.stdout + r.stderr)[-2000:]}") from None
    go = folder / "bin" / "go"
    for sub in ("bin", f"pkg/tool/linux_{arch}"):  # module zips do not keep the executable bit
        for f in (folder / sub).iterdir():
            if f.is_file():
                f.chmod(0o555)
    v = go_version(str(go))
    if v is None:
        raise ServicesError(f"the Go toolchain downloaded to {folder} does not run")
    return Go(str(go), v, "local")


# ---------------------------------------------------------------------------------------------
# the build


def build_command(go: Go, out_dir: Path) -> list[str]:
    """The build's command line (pure: unit-tested): both programs in one ``go build``, niced."""
    argv = [go.path, "build", "-tags", BUILD_TAGS, "-ldflags", LDFLAGS, "-o", str(out_dir) + "/",
            *PROGRAMS.values()]
    nice = shutil.which("nice")
    return [nice, "-n", "19", *argv] if nice else argv


def build_env(go: Go) -> dict[str, str]:
    # go.sum is committed: nothing may change it; no VCS stamping (a fresh clone or a tarball builds alike)
    return dict(os.environ, GOTOOLCHAIN=go.toolchain, GOFLAGS="-mod=readonly -buildvcs=false", GOWORK="off")


def _dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def resolve(progress=None) -> dict[str, Path]:
    """The paths of tidb-server and dumpling, built once per TiDB version (then cached). ``progress``: a
    function that takes a line for the person waiting (the build of a cold machine takes many minutes)."""
    mod = module_dir()
    version = tidb_version(mod)
    bins = _built(version)
    if bins:
        return bins
    folder = install_dir(version)
    with locked(folder.parent / f".{folder.name}.lock"):
        bins = _built(version)
        if bins:
            return bins
        ensure_command("gcc", "gcc", "TiDB's build uses cgo")
        go = find_go()
        tmp = folder / f"bin.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log = log_path("tidb-build.log")
        argv = build_command(go, tmp)
        if progress:
            progress(f"tidb: building tidb-server and dumpling ({MODULE} {version}) with {go.describe()}; "
                     f"a cold build takes many minutes (log: {log})")
        t0 = time.monotonic()
        with open(log, "ab") as out:
            out.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} in {mod}: {shlex.join(argv)}\n".encode())
            out.flush()
            r = subprocess.run(argv, cwd=mod, env=build_env(go), stdin=subprocess.DEVNULL, stdout=out,
                               stderr=subprocess.STDOUT)
        seconds = time.monotonic() - t0
        if r.returncode != 0 or not all((tmp / n).is_file() for n in PROGRAMS):
            shutil.rmtree(tmp, ignore_errors=True)
            lines = log.read_text(errors="replace").splitlines()[-25:]
            raise ServicesError(
                f"building TiDB ({MODULE} {version}) failed after {seconds:.0f} s with {go.describe()} (exit "
                f"{r.returncode}); the end of {log}:\n" + "\n".join(lines) + "\nThe build needs the Go module proxy "
                "(GOPROXY) to be reachable, gcc, and a few GB of disk for Go's module and build caches")
        final = folder / "bin"
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        (folder / MARKER).write_text(json.dumps({
            "module": MODULE, "version": version, "go": go.describe(), "seconds": round(seconds, 1),
            "command": argv, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "bytes": {n: (final / n).stat().st_size for n in PROGRAMS},
        }, indent=2) + "\n")
        if progress:
            progress(f"tidb: built in {seconds:.0f} s into {final}")
        bins = _built(version)
        assert bins is not None
        return bins


# ---------------------------------------------------------------------------------------------
# the server


def status_port() -> int:
    raw = os.environ.get("APPLIER_TIDB_STATUS_PORT")
    if not raw:
        return DEFAULT_STATUS_PORT
    try:
        value = int(raw)
    except ValueError:
        raise ServicesError(f"APPLIER_TIDB_STATUS_PORT={raw!r} is not a port number") from None
    if not 0 < value < 65536:
        raise ServicesError(f"APPLIER_TIDB_STATUS_PORT={raw!r} is not a port number")
    return value


def tidb_url(p: int | None = None, host: str = HOST, *, user: str = USER, password: str | None = PASSWORD) -> str:
    cred = user if password is None else f"{user}:{password}"
    return f"mysql+pymysql://{cred}@{host}:{p or port(NAME)}/"


def server_command(server: Path, data: Path, tmp: Path, p: int, sp: int, host: str = HOST) -> list[str]:
    """tidb-server's command line (pure: unit-tested)."""
    return [str(server), "-store", "unistore", "-path", str(data), "-host", host, "-P", str(p),
            "-status", str(sp), "-status-host", host, "-L", "warn", "-log-file", str(log_path("tidb.log")),
            "-temp-dir", str(tmp), "-log-slow-query", str(log_path("tidb-slow.log")),
            "-socket", str(tmp / "tidb.sock")]  # (its default is /tmp/tidb-<port>.sock)


def _connect(p: int, user: str = "root", password: str = "", timeout: float = 3):
    import pymysql

    return pymysql.connect(host=HOST, port=p, user=user, password=password, connect_timeout=timeout,
                           autocommit=True)


def _sql(p: int, statements: list[tuple[str, tuple]], *, user: str = "root", password: str = "") -> list:
    conn = _connect(p, user, password)
    try:
        out = []
        with conn.cursor() as cur:
            for sql, args in statements:
                cur.execute(sql, args or None)
                out.append(cur.fetchall())
        return out
    finally:
        conn.close()


def ready(p: int, user: str = "root", password: str = "") -> bool:
    rows = _sql(p, [("SELECT tidb_version()", ())], user=user, password=password)[0]
    return bool(rows) and "Release Version" in str(rows[0][0])


BOOTSTRAP = [
    (f"CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'", ()),
    (f"GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'%' WITH GRANT OPTION", ()),
    ("INSERT INTO mysql.tidb (VARIABLE_NAME, VARIABLE_VALUE, COMMENT) VALUES (%s, %s, %s) "
     "ON DUPLICATE KEY UPDATE VARIABLE_VALUE = VALUES(VARIABLE_VALUE)",
     (GC_SAFE_POINT_ROW, INITIAL_SAFE_POINT, "written by applier.devtools.services.tidb: the embedded store has no "
      "GC worker")),
]


def _marker() -> str:
    return str(applier_home() / "tidb")


def _say(line: str) -> None:
    import sys

    print(line, file=sys.stderr, flush=True)


def start(progress=_say) -> None:
    p, sp = port(NAME), status_port()
    pid = managed_pid(NAME, _marker())
    if pid is None and port_open(p):
        try:
            wait_until(f"TiDB at {HOST}:{p} (external)", lambda: ready(p, USER, PASSWORD), timeout=15)
        except ServicesError as exc:
            raise ServicesError(f"something not started from {applier_home()} answers on {HOST}:{p}, but the "
                                f"{USER}/{PASSWORD} login to a TiDB fails there; stop it or set APPLIER_TIDB_PORT."
                                f"\n{exc}") from None
        return
    if pid is None:
        if port_open(sp):
            raise ServicesError(f"the TiDB status port {HOST}:{sp} is taken; set APPLIER_TIDB_STATUS_PORT")
        bins = resolve(progress)
        base = home_dir("tidb")
        data, tmp = base / "data", base / "tmp"
        for d in (data, tmp):  # every start is a new cluster
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        pid = spawn(NAME, server_command(bins["tidb-server"], data, tmp, p, sp), "tidb.out", cwd=base)
    logs = [log_path("tidb.out"), log_path("tidb.log")]
    await_ready(NAME, _marker(), pid, f"TiDB at {HOST}:{p}", lambda: port_open(p) and ready(p), timeout=READY_TIMEOUT,
                logs=logs)
    _sql(p, BOOTSTRAP)


def stop() -> None:
    stop_managed(NAME, _marker(), STOP_TIMEOUT)


def status() -> ServiceStatus:
    version = tidb_version() if (_REPO / "tools" / "tidb" / "go.mod").is_file() else "?"
    return managed_status(NAME, _marker(), port(NAME), f"{MODULE} {version}, store unistore, data "
                          f"{applier_home() / 'tidb' / 'data'}; logs: {log_path('tidb.log')}")


def gc_time(when) -> str:
    """A UTC datetime in TiDB's GC time layout, "20060102-15:04:05.000 -0700" (milliseconds kept)."""
    return when.strftime("%Y%m%d-%H:%M:%S.") + f"{when.microsecond // 1000:03d} +0000"


def set_gc_safe_point(url_or_port, when_ts: int) -> str:
    """Move TiDB's GC safe point to the physical time of TSO ``when_ts`` (as a GC run would; see the module's
    docstring) and return the value written. A snapshot read older than it is then refused by TiDB."""
    import datetime as dt

    from sqlalchemy.engine import make_url

    p = url_or_port if isinstance(url_or_port, int) else make_url(url_or_port).port
    value = gc_time(dt.datetime.fromtimestamp((when_ts >> 18) / 1000, dt.timezone.utc))
    _sql(p, [("UPDATE mysql.tidb SET VARIABLE_VALUE = %s WHERE VARIABLE_NAME = %s", (value, GC_SAFE_POINT_ROW))])
    return value


def reset_gc_safe_point(url_or_port) -> None:
    from sqlalchemy.engine import make_url

    p = url_or_port if isinstance(url_or_port, int) else make_url(url_or_port).port
    _sql(p, [("UPDATE mysql.tidb SET VARIABLE_VALUE = %s WHERE VARIABLE_NAME = %s",
              (INITIAL_SAFE_POINT, GC_SAFE_POINT_ROW))])


__all__ = ["start", "stop", "status", "resolve", "find_go", "build_command", "server_command", "tidb_url",
           "tidb_version", "binaries", "build_info", "set_gc_safe_point", "reset_gc_safe_point", "Go"]
