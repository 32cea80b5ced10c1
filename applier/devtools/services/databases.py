"""Private MariaDB and PostgreSQL servers on 127.0.0.1 for the tests, the demo and the benchmark.

Neither touches a system-wide server: each has its own data directory, port and unix socket, and
is started detached from the Debian binaries (installed with apt-get when missing, with
/usr/sbin/policy-rc.d keeping the package scripts from starting the system-wide service).

MariaDB (``$APPLIER_HOME/mariadb``)
    ``my.cnf`` (rewritten at every start, read with ``--defaults-file`` so /etc/mysql is ignored),
    ``data/`` (datadir, made once by mariadb-install-db; socket ``mysqld.sock`` and pid file inside).
    ``mariadbd`` runs as root (``--user=root``) when started by root.  Test-server settings:
    ``local-infile=1`` (LOAD DATA LOCAL INFILE), ``innodb_flush_log_at_trx_commit=2`` (the redo log
    is written at each commit but flushed to disk about once a second: a crash of the machine, not
    of mariadbd, can lose the last second of commits; do not copy it to production),
    ``character-set-server=utf8mb4`` with ``collation-server=utf8mb4_bin`` (TiDB's default
    collation), ``skip-name-resolve``.  Root authenticates through the unix socket only; the
    ``mariadb`` client as root creates ``'applier'@'%'``, ``@'127.0.0.1'`` and ``@'localhost'``
    (password ``applier``, ALL PRIVILEGES ON *.* WITH GRANT OPTION) and database ``applier``.

PostgreSQL 15 (``/usr/lib/postgresql/15/bin``)
    PostgreSQL refuses to run as root, so when started by root, initdb and postgres run as the
    ``postgres`` system user and PGDATA is owned by it.  That user must be able to reach PGDATA:
    it goes to ``$APPLIER_HOME/postgres/data`` when ``postgres`` can traverse
    ``$APPLIER_HOME/postgres`` (checked by running ``test -x`` as that user), else -- typically
    ``$APPLIER_HOME`` under /root, which is mode 0700 -- to ``/var/tmp/applier-pg-<port>/data``
    (/var/tmp survives reboots, unlike /tmp).  The choice is recorded in
    ``$APPLIER_HOME/postgres/LOCATION`` and kept from then on.  Started by another user, everything
    stays under ``$APPLIER_HOME/postgres`` and runs as that user.  Settings: listen on 127.0.0.1
    only, unix socket in PGDATA, ``fsync`` on (default), local (socket) connections trusted, TCP
    connections by password (scram-sha-256), encoding UTF8 with the C locale (byte order, like
    utf8mb4_bin).  Role ``applier`` (LOGIN SUPERUSER, password ``applier``) owns database ``applier``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from applier.devtools.services.common import (
    DB_NAME,
    DB_PASSWORD,
    DB_USER,
    HOST,
    ServicesError,
    ServiceStatus,
    apt_install,
    home_dir,
    is_root,
    log_path,
    managed_pid,
    port,
    port_open,
    spawn,
    terminate,
    url_for,
    wait_until,
)

READY_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0
SOCKET_MAX = 107  # sun_path is 108 bytes including the NUL


def _run(argv: list[str], what: str, log: Path | None = None, **kwargs) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kwargs)
    if log is not None:
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n{r.stdout}{r.stderr}\n")
    if r.returncode != 0:
        raise ServicesError(f"{what} failed (exit {r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
    return r


# =============================================================================================
# MariaDB


def mariadb_cnf(
    *, datadir: Path, socket: Path, port_: int, error_log: Path, as_root: bool, host: str = HOST
) -> str:
    """The server's my.cnf (pure: unit-tested)."""
    user = "user = root\n" if as_root else ""
    return f"""\
# private MariaDB for tests (written by applier.devtools.services.databases)
[mysqld]
{user}datadir = {datadir}
socket = {socket}
pid-file = {datadir}/mariadbd.pid
port = {port_}
bind-address = {host}
skip-name-resolve
log-error = {error_log}
local-infile = 1
# test setting: flush the redo log about once a second instead of at every commit
innodb_flush_log_at_trx_commit = 2
innodb_buffer_pool_size = 512M
innodb_log_file_size = 256M
max_allowed_packet = 256M
max_connections = 300
character-set-server = utf8mb4
collation-server = utf8mb4_bin
"""


MARIADB_BOOTSTRAP_SQL = "".join(
    f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{h}' IDENTIFIED BY '{DB_PASSWORD}';\n"
    f"GRANT ALL PRIVILEGES ON *.* TO '{DB_USER}'@'{h}' WITH GRANT OPTION;\n"
    for h in ("%", "127.0.0.1", "localhost")
) + f"CREATE DATABASE IF NOT EXISTS `{DB_NAME}`;\nFLUSH PRIVILEGES;\n"


def _which(*names: str) -> str | None:
    for n in names:
        found = shutil.which(n) or next(
            (p for p in (f"/usr/sbin/{n}", f"/usr/bin/{n}") if os.access(p, os.X_OK)), None
        )
        if found:
            return found
    return None


@dataclass
class MariaDB:
    name: str = "mariadb"

    # ---- paths
    @property
    def base(self) -> Path:
        return home_dir("mariadb")

    @property
    def datadir(self) -> Path:
        return self.base / "data"

    @property
    def cnf(self) -> Path:
        return self.base / "my.cnf"

    @property
    def socket(self) -> Path:
        sock = self.datadir / "mysqld.sock"
        if len(str(sock)) <= SOCKET_MAX:
            return sock
        return Path(f"/tmp/applier-mariadb-{port(self.name)}.sock")

    def _marker(self) -> str:
        return str(self.cnf)

    # ---- binaries
    def _binaries(self) -> tuple[str, str, str]:
        server = _which("mariadbd", "mysqld")
        if server is None:
            apt_install("mariadb-server")
            server = _which("mariadbd", "mysqld")
        install_db = _which("mariadb-install-db", "mysql_install_db")
        client = _which("mariadb", "mysql")
        if not (server and install_db and client):
            raise ServicesError("mariadb-server is installed but mariadbd/mariadb-install-db/mariadb are missing")
        return server, install_db, client

    # ---- steps
    def _write_cnf(self) -> None:
        self.cnf.write_text(
            mariadb_cnf(
                datadir=self.datadir,
                socket=self.socket,
                port_=port(self.name),
                error_log=log_path("mariadb.err"),
                as_root=is_root(),
            )
        )

    def _initialise(self, install_db: str) -> None:
        done = self.datadir / ".applier-initialised"
        if done.exists():
            return
        shutil.rmtree(self.datadir, ignore_errors=True)
        self.datadir.mkdir(parents=True)
        _run(
            [
                install_db,
                f"--defaults-file={self.cnf}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
            ],
            "mariadb-install-db",
            log=log_path("mariadb-install.log"),
        )
        done.write_text("ok\n")

    def _client(self, client: str, sql: str) -> None:
        user = pwd.getpwuid(os.geteuid()).pw_name
        _run(
            [client, "--no-defaults", "--protocol=socket", f"--socket={self.socket}", f"-u{user}",
             "--batch", "-e", sql],
            "mariadb client",
        )

    def check_login(self) -> bool:
        import pymysql

        conn = pymysql.connect(
            host=HOST, port=port(self.name), user=DB_USER, password=DB_PASSWORD, database=DB_NAME,
            connect_timeout=3,
        )
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1")
                return cur.fetchone() == (1,)
        finally:
            conn.close()

    # ---- API
    def start(self) -> None:
        p = port(self.name)
        pid = managed_pid(self.name, self._marker())
        if pid is None and port_open(p):
            self._check_external()
            return
        server, install_db, client = self._binaries()
        if pid is None:
            self._write_cnf()
            self._initialise(install_db)
            pid = spawn(self.name, [server, f"--defaults-file={self.cnf}"], "mariadb.out", cwd=self.base)
        logs = [log_path("mariadb.out"), log_path("mariadb.err")]
        try:
            wait_until(
                f"mariadb on {self.socket}",
                lambda: self._client(client, "SELECT 1") or True,
                timeout=READY_TIMEOUT, pid=pid, log=logs,
            )
            self._client(client, MARIADB_BOOTSTRAP_SQL)
            wait_until(f"mariadb at {HOST}:{p}", self.check_login, timeout=20, pid=pid, log=logs)
        except ServicesError:
            if managed_pid(self.name, self._marker()) == pid:
                terminate(self.name, pid, signal.SIGTERM, timeout=20)
            raise

    def _check_external(self) -> None:
        try:
            wait_until(f"mariadb at {HOST}:{port(self.name)} (external)", self.check_login, timeout=10)
        except ServicesError as exc:
            raise ServicesError(
                f"something not started from {home_dir()} answers on {HOST}:{port(self.name)} but the "
                f"applier/applier login to database {DB_NAME} fails there; stop it or set "
                f"APPLIER_MARIADB_PORT.\n{exc}"
            ) from None

    def stop(self) -> None:
        pid = managed_pid(self.name, self._marker())
        if pid is not None:
            terminate(self.name, pid, signal.SIGTERM, timeout=STOP_TIMEOUT)

    def status(self) -> ServiceStatus:
        pid = managed_pid(self.name, self._marker())
        up = port_open(port(self.name))
        if pid is not None:
            return ServiceStatus(self.name, url_for(self.name), "running" if up else "starting", pid,
                                 f"datadir: {self.datadir}")
        if up:
            return ServiceStatus(self.name, url_for(self.name), "external", None,
                                 "not started from this state home")
        return ServiceStatus(self.name, url_for(self.name), "stopped")


# =============================================================================================
# PostgreSQL

PG_VERSION = "15"


def pg_bindir() -> Path | None:
    env = os.environ.get("APPLIER_PG_BINDIR")
    if env:
        return Path(env)
    preferred = Path(f"/usr/lib/postgresql/{PG_VERSION}/bin")
    if (preferred / "initdb").exists():
        return preferred
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda s: int(Path(s).parts[-3]) if Path(s).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def pg_server_args(*, datadir: Path, socket_dir: Path, port_: int, host: str = HOST) -> list[str]:
    """``postgres`` arguments after the binary (pure: unit-tested)."""
    return [
        "-D", str(datadir),
        "-p", str(port_),
        "-c", f"listen_addresses={host}",
        "-c", f"unix_socket_directories={socket_dir}",
        "-c", "max_connections=200",
        "-c", "shared_buffers=256MB",
        "-c", "max_wal_size=2GB",
        "-c", "logging_collector=off",
    ]


@dataclass
class PostgreSQL:
    name: str = "postgres"

    # ---- who runs it, where
    @property
    def run_as(self) -> str | None:
        """The system user that runs initdb/postgres (None: the current user)."""
        return "postgres" if is_root() else None

    def _as_user_ok(self, argv: list[str]) -> bool:
        r = subprocess.run(argv, user=self.run_as, group=self.run_as, extra_groups=[],
                           capture_output=True, stdin=subprocess.DEVNULL, cwd="/")
        return r.returncode == 0

    def _recorded_base(self) -> Path | None:
        try:
            recorded = (home_dir("postgres") / "LOCATION").read_text().strip()
        except OSError:
            return None
        return Path(recorded) if recorded else None

    def _choose_base(self) -> Path:
        """Where PGDATA's parent goes (decided once, recorded in LOCATION); needs the binaries."""
        recorded = self._recorded_base()
        if recorded is not None:
            return recorded
        home = home_dir("postgres")
        if self.run_as is None or self._as_user_ok(["test", "-x", str(home)]):
            base = home
        else:
            base = Path(f"/var/tmp/applier-pg-{port(self.name)}")
        (home / "LOCATION").write_text(f"{base}\n")
        return base

    @property
    def base(self) -> Path:
        return self._recorded_base() or home_dir("postgres")

    @property
    def datadir(self) -> Path:
        return self.base / "data"

    @property
    def socket_dir(self) -> Path:
        d = self.datadir
        if len(str(d / f".s.PGSQL.{port(self.name)}")) <= SOCKET_MAX:
            return d
        return Path("/tmp")

    def _managed_pid(self) -> int | None:
        if self._recorded_base() is None:  # never initialised from this state home
            return None
        return managed_pid(self.name, str(self.datadir))

    # ---- steps
    def _install(self) -> None:
        apt_install("postgresql")

    def _bindir(self) -> Path:
        b = pg_bindir()
        if b is None:
            self._install()
            b = pg_bindir()
        if b is None or not (b / "postgres").exists():
            raise ServicesError("PostgreSQL binaries not found under /usr/lib/postgresql/*/bin")
        return b

    def _chown(self, path: Path) -> None:
        if self.run_as is not None:
            pw = pwd.getpwnam(self.run_as)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def _initialise(self, bindir: Path) -> None:
        base = self._choose_base()
        done = base / ".applier-initialised"
        if done.exists() and (self.datadir / "PG_VERSION").exists():
            return
        base.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.datadir, ignore_errors=True)
        self.datadir.mkdir(mode=0o700)
        self._chown(self.datadir)
        env = dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8")
        env.pop("PGDATA", None)
        argv = [
            str(bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres", "-E", "UTF8",
            "--locale=C", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-instructions",
        ]
        kwargs: dict = {"cwd": "/", "env": env}
        if self.run_as is not None:
            kwargs.update(user=self.run_as, group=self.run_as, extra_groups=[])
        _run(argv, "initdb", log=log_path("postgres-initdb.log"), **kwargs)
        done.write_text("ok\n")

    def _connect_admin(self):
        import psycopg

        return psycopg.connect(
            host=str(self.socket_dir), port=port(self.name), user="postgres", dbname="postgres",
            connect_timeout=3, autocommit=True,
        )

    def _admin_ready(self) -> bool:
        with self._connect_admin() as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    def _bootstrap(self) -> None:
        with self._connect_admin() as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (DB_USER,)).fetchone() is None:
                conn.execute(f"CREATE ROLE {DB_USER} LOGIN SUPERUSER PASSWORD '{DB_PASSWORD}'")
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone() is None:
                conn.execute(f"CREATE DATABASE {DB_NAME} OWNER {DB_USER}")

    def check_login(self) -> bool:
        import psycopg

        with psycopg.connect(
            host=HOST, port=port(self.name), user=DB_USER, password=DB_PASSWORD, dbname=DB_NAME,
            connect_timeout=3,
        ) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)

    # ---- API
    def start(self) -> None:
        p = port(self.name)
        pid = self._managed_pid()
        if pid is None and port_open(p):
            self._check_external()
            return
        if pid is None:
            bindir = self._bindir()
            self._initialise(bindir)
            argv = [str(bindir / "postgres"),
                    *pg_server_args(datadir=self.datadir, socket_dir=self.socket_dir, port_=p)]
            pid = spawn(self.name, argv, "postgres.out", cwd=Path("/"), user=self.run_as)
        logs = [log_path("postgres.out")]
        try:
            wait_until(f"postgres on {self.socket_dir}", self._admin_ready,
                       timeout=READY_TIMEOUT, pid=pid, log=logs)
            self._bootstrap()
            wait_until(f"postgres at {HOST}:{p}", self.check_login, timeout=20, pid=pid, log=logs)
        except ServicesError:
            if self._managed_pid() == pid:
                terminate(self.name, pid, signal.SIGINT, timeout=20)
            raise

    def _check_external(self) -> None:
        try:
            wait_until(f"postgres at {HOST}:{port(self.name)} (external)", self.check_login, timeout=10)
        except ServicesError as exc:
            raise ServicesError(
                f"something not started from {home_dir()} answers on {HOST}:{port(self.name)} but the "
                f"applier/applier login to database {DB_NAME} fails there; stop it or set "
                f"APPLIER_PG_PORT.\n{exc}"
            ) from None

    def stop(self) -> None:
        pid = self._managed_pid()
        if pid is not None:
            # SIGINT = PostgreSQL's "fast" shutdown: roll back sessions, checkpoint, exit
            terminate(self.name, pid, signal.SIGINT, timeout=STOP_TIMEOUT)

    def status(self) -> ServiceStatus:
        pid = self._managed_pid()
        up = port_open(port(self.name))
        if pid is not None:
            return ServiceStatus(self.name, url_for(self.name), "running" if up else "starting", pid,
                                 f"datadir: {self.datadir}")
        if up:
            return ServiceStatus(self.name, url_for(self.name), "external", None,
                                 "not started from this state home")
        return ServiceStatus(self.name, url_for(self.name), "stopped")


MARIADB = MariaDB()
POSTGRES = PostgreSQL()

__all__ = ["MARIADB", "POSTGRES", "MariaDB", "PostgreSQL", "mariadb_cnf", "pg_server_args", "pg_bindir"]
