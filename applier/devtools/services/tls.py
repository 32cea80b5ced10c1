"""MariaDB and PostgreSQL with TLS, private to their owner: for the tests of TLS to the target (issue 27, point 3).

Like :class:`applier.devtools.services.kafka.Broker`, each is an object that starts its own server process on a port
of its own with everything under ``home`` (a data directory made at the first start) and stops it (``stop()``, or
leaving a ``with`` block); the shared services (``python -m applier.devtools.services``) are never touched::

    ca = make_ca(home / "ca"); cert = ca.issue(home / "db", ["localhost", "127.0.0.1"])
    with TlsPostgres(25432, home / "pg", cert, ca.cert_path, password="...") as pg:
        pg.url   # postgresql+psycopg://applier@127.0.0.1:25432/applier (no password: the config's business)

Both listen on 127.0.0.1 and 127.0.0.2 (loopback, which Linux routes as a whole 127.0.0.0/8), so a client may reach the
same server by an address the certificate does not name. Both accept only TLS from TCP clients: MariaDB's user
``applier`` is created ``REQUIRE SSL``, PostgreSQL's pg_hba.conf has only ``hostssl`` lines (scram-sha-256). The
binaries and the user that runs them are those of applier.devtools.services.databases (PostgreSQL runs as the
``postgres`` system user when started by root: ``home`` must then be a folder that user can reach, e.g. under
``/tmp`` with mode 0755, and the key is copied into PGDATA for it, as PostgreSQL requires).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from pathlib import Path

from applier.devtools.certs import Issued
from applier.devtools.services.common import (
    DB_NAME,
    DB_USER,
    HOST,
    ServicesError,
    _CHILDREN,
    is_root,
    port_open,
    wait_until,
)
from applier.devtools.services.databases import MariaDB, PostgreSQL, _run, mariadb_cnf, pg_server_args

READY_TIMEOUT = 60.0
#: the second loopback address both servers also listen on (a host name their certificate does not hold)
OTHER_HOST = "127.0.0.2"


class _Owned:
    """A server process this object started and stops (SIGTERM, then SIGKILL after ``timeout``)."""

    name = "server"
    stop_signal = signal.SIGTERM

    def __init__(self, port: int, home: Path) -> None:
        self.port = port
        self.home = Path(home)
        self._proc: subprocess.Popen | None = None

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _spawn(self, argv: list[str], **kwargs) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{self.name}.out", "ab") as out:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True, **kwargs)
        _CHILDREN[proc.pid] = proc
        self._proc = proc
        return proc

    def stop(self, timeout: float = 60.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        _CHILDREN.pop(proc.pid, None)
        if proc.poll() is not None:
            return
        proc.send_signal(self.stop_signal)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)

    def start(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TlsMariaDB(_Owned):
    """MariaDB with ``ssl_cert``/``ssl_key``/``ssl_ca`` from ``cert`` and ``ca``; user ``applier`` (``password``,
    ``REQUIRE SSL``) owns database ``applier``."""

    name = "mariadb"

    def __init__(self, port: int, home: Path, cert: Issued, ca: Path, *, password: str) -> None:
        super().__init__(port, home)
        self.cert, self.ca, self.password = cert, ca, password

    @property
    def url(self) -> str:
        return f"mariadb+pymysql://{DB_USER}@{HOST}:{self.port}/{DB_NAME}"

    @property
    def socket(self) -> Path:
        return self.home / "mysqld.sock"

    def start(self) -> None:
        if self.running():
            return
        if port_open(self.port):
            raise ServicesError(f"TLS MariaDB in {self.home}: port {self.port} is taken by another process")
        server, install_db, client = MariaDB()._binaries()
        datadir = self.home / "data"
        cnf = self.home / "my.cnf"
        self.logs.mkdir(parents=True, exist_ok=True)
        cnf.write_text(mariadb_cnf(datadir=datadir, socket=self.socket, port_=self.port,
                                   error_log=self.logs / "mariadb.err", as_root=is_root(),
                                   host=f"{HOST},{OTHER_HOST}")
                       .replace("innodb_buffer_pool_size = 512M", "innodb_buffer_pool_size = 64M")
                       .replace("innodb_log_file_size = 256M", "innodb_log_file_size = 48M")
                       + f"ssl_ca = {self.ca}\nssl_cert = {self.cert.cert_path}\nssl_key = {self.cert.key_path}\n")
        if not (datadir / ".applier-initialised").exists():
            shutil.rmtree(datadir, ignore_errors=True)
            datadir.mkdir(parents=True)
            _run([install_db, f"--defaults-file={cnf}", "--auth-root-authentication-method=socket", "--skip-test-db"],
                 "mariadb-install-db", log=self.logs / "install.log")
            (datadir / ".applier-initialised").write_text("ok\n")
        proc = self._spawn([server, f"--defaults-file={cnf}"], cwd=self.home)
        user = pwd.getpwuid(os.geteuid()).pw_name

        def sql(text: str) -> None:
            _run([client, "--no-defaults", "--protocol=socket", f"--socket={self.socket}", f"-u{user}", "--batch",
                  "-e", text], "mariadb client")

        try:
            wait_until(f"TLS mariadb on {self.socket}", lambda: sql("SELECT 1") or True, timeout=READY_TIMEOUT,
                       pid=proc.pid, log=[self.logs / "mariadb.out", self.logs / "mariadb.err"])
            sql("".join(f"CREATE USER IF NOT EXISTS '{DB_USER}'@'{h}' IDENTIFIED BY '{self.password}' REQUIRE SSL;\n"
                        f"GRANT ALL PRIVILEGES ON *.* TO '{DB_USER}'@'{h}';\n" for h in ("%", HOST, "localhost"))
                + f"CREATE DATABASE IF NOT EXISTS `{DB_NAME}`;\nFLUSH PRIVILEGES;\n")
        except ServicesError:
            self.stop(timeout=20)
            raise


class TlsPostgres(_Owned):
    """PostgreSQL with ``ssl = on`` and the certificate ``cert`` (its CA ``ca``); role ``applier`` (``password``)
    owns database ``applier``; TCP clients only over TLS."""

    name = "postgres"
    stop_signal = signal.SIGINT  # fast shutdown

    def __init__(self, port: int, home: Path, cert: Issued, ca: Path, *, password: str) -> None:
        super().__init__(port, home)
        self.cert, self.ca, self.password = cert, ca, password
        self.run_as = "postgres" if is_root() else None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{DB_USER}@{HOST}:{self.port}/{DB_NAME}"

    def _own(self, path: Path, mode: int) -> None:
        path.chmod(mode)
        if self.run_as is not None:
            pw = pwd.getpwnam(self.run_as)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def start(self) -> None:
        if self.running():
            return
        if port_open(self.port):
            raise ServicesError(f"TLS PostgreSQL in {self.home}: port {self.port} is taken by another process")
        bindir = PostgreSQL()._bindir()
        datadir = self.home / "data"
        as_user = {"user": self.run_as, "group": self.run_as, "extra_groups": []} if self.run_as else {}
        self.logs.mkdir(parents=True, exist_ok=True)
        self._own(self.logs, 0o777)  # the server's stdout goes to a file opened here; nothing else writes there
        if not (datadir / "PG_VERSION").exists():
            shutil.rmtree(datadir, ignore_errors=True)
            datadir.mkdir(parents=True)
            self._own(datadir, 0o700)
            env = dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8")
            env.pop("PGDATA", None)
            _run([str(bindir / "initdb"), "-D", str(datadir), "-U", "postgres", "-E", "UTF8", "--locale=C",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "--no-instructions"], "initdb",
                 log=self.logs / "initdb.log", cwd="/", env=env, **as_user)
        # TCP clients only over TLS (hostssl), with a password; the admin connects through the unix socket
        (datadir / "pg_hba.conf").write_text("local all all trust\nhostssl all all 127.0.0.0/8 scram-sha-256\n")
        for src, name in ((self.cert.cert_path, "server.crt"), (self.cert.key_path, "server.key"), (self.ca, "ca.crt")):
            shutil.copyfile(src, datadir / name)
            self._own(datadir / name, 0o600)
        argv = [str(bindir / "postgres"),
                *pg_server_args(datadir=datadir, socket_dir=datadir, port_=self.port, host=f"{HOST},{OTHER_HOST}"),
                "-c", "ssl=on", "-c", "ssl_cert_file=server.crt", "-c", "ssl_key_file=server.key",
                "-c", "ssl_ca_file=ca.crt", "-c", "shared_buffers=32MB", "-c", "max_connections=50"]
        proc = self._spawn(argv, cwd="/", **as_user)

        def admin():
            import psycopg

            return psycopg.connect(host=str(datadir), port=self.port, user="postgres", dbname="postgres",
                                   connect_timeout=3, autocommit=True)

        def ready() -> bool:
            with admin() as conn:
                return conn.execute("SELECT 1").fetchone() == (1,)

        try:
            wait_until(f"TLS postgres on {datadir}", ready, timeout=READY_TIMEOUT, pid=proc.pid,
                       log=[self.logs / "postgres.out"])
            with admin() as conn:
                if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (DB_USER,)).fetchone() is None:
                    conn.execute(f"CREATE ROLE {DB_USER} LOGIN SUPERUSER PASSWORD '{self.password}'")
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB_NAME,)).fetchone() is None:
                    conn.execute(f"CREATE DATABASE {DB_NAME} OWNER {DB_USER}")
        except ServicesError:
            self.stop(timeout=20)
            raise


__all__ = ["OTHER_HOST", "TlsMariaDB", "TlsPostgres"]
