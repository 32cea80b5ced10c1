"""One object per target database, picked once, that every dialect decision goes through.

The applier writes to three servers that differ in ways that matter for correctness: which writer (COPY and
``ON CONFLICT`` on PostgreSQL, ``ON DUPLICATE KEY UPDATE`` on MySQL/MariaDB), how the upstream DDL is
translated (MariaDB spells some statements differently from MySQL), how a decoded MySQL value becomes what a
column stores, whether DDL is transactional, and which server errors mean "a fault that passes", "this DDL had
already taken effect" or "the target itself cannot work" (read-only, privileges, no space). Keeping all of those
on one :class:`Dialect` means the choice is made in one place (:func:`dialect_for`) and a fourth database is one
new class, not a hunt through the stages.

What a dialect *runs* (table reads, upsert/delete SQL, schema creation) lives in its writer under
``applier/sinks/``; what it *translates* lives under ``applier/ddl/``; this module only picks and classifies.
"""

from __future__ import annotations

import re
import ssl
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from applier.ddl import TranslatedDDL, translate
from applier.sinks.base import Sink
from applier.timing import NO_TIMING, StageTimer

if TYPE_CHECKING:
    from applier.modes import Conform, TableShape, UniqueIndex

Converter = Callable[[Any], Any]
Route = Callable[[str, str], "tuple[str, str] | None"]

# MySQL/MariaDB error codes of faults that pass: the whole target transaction is replayed (invariant 14).
MYSQL_TRANSIENT_ERRORS = frozenset({
    1040,  # too many connections
    1053,  # server shutdown in progress
    1205,  # lock wait timeout
    1213,  # deadlock
    1927,  # connection was killed (MariaDB)
    2003,  # can't connect (the server is restarting)
    2006,  # server has gone away
    2013,  # lost connection during query
    2055,  # lost connection
    4031,  # disconnected by the server
})

# MySQL/MariaDB error codes that, when a DDL is re-run after a crash, mean it already happened.
MYSQL_REPLAY_NOOP_ERRORS = frozenset({
    1007,  # database exists
    1008,  # database does not exist (drop)
    1050,  # table already exists
    1051,  # unknown table (drop)
    1054,  # unknown column (rename/drop re-run)
    1060,  # duplicate column name
    1061,  # duplicate key name
    1068,  # multiple primary key defined
    1091,  # can't drop; check that column/key exists
    1146,  # table doesn't exist (rename re-run)
    1505,  # partition management on a non-partitioned table
    1507,  # error in list of partitions to drop (already dropped)
    1508,  # cannot remove all partitions
    1517,  # duplicate partition name
})

# MySQL/MariaDB error codes that are faults of the target itself, not of the statement it refused: a DDL refused
# with one is never recorded as skipped by [target] on_unsupported_ddl (every later DDL would be skipped too while
# the target is read-only or full); the run stops until the target is fixed.
MYSQL_TARGET_FAULTS = frozenset({
    1021,  # disk full
    1026,  # error writing file
    1037, 1038, 1041,  # out of memory
    1044, 1045, 1142, 1143, 1227,  # access denied, a command or privilege the applier's user lacks
    1114,  # the table is full
    1203, 1226,  # user resource limits (max_user_connections, ...)
    1290,  # --read-only (or another server option) prevents the statement
    1836,  # read-only mode
})

# SQLSTATEs (and classes) of PostgreSQL faults that pass: the whole target transaction is replayed (invariant 14).
PG_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "53300", "55P03", "57P01", "57P02", "57P03"})
PG_TRANSIENT_SQLSTATE_CLASSES = ("08",)  # connection exceptions
# faults of the PostgreSQL server itself (see MYSQL_TARGET_FAULTS): a read-only transaction, a privilege the
# applier's role lacks; insufficient resources (53: disk full, out of memory), operator intervention (57: a
# cancelled statement, a shutdown), system errors (58: I/O) and internal errors (XX)
PG_TARGET_FAULT_SQLSTATES = frozenset({"25006", "42501"})
PG_TARGET_FAULT_SQLSTATE_CLASSES = ("53", "57", "58", "XX")


# What a driver says when TLS to the target cannot be set up for good (as opposed to a TLS connection lost, which
# passes like any lost connection): the server's certificate does not verify (an unknown CA, a name it does not
# hold, expired), the server refuses our client certificate, or offers no TLS. libpq's words (psycopg) and Python's
# ssl module's (PyMySQL).
_TLS_SERVER_CERT = re.compile(
    r"certificate verify failed|CERTIFICATE_VERIFY_FAILED|self[- ]signed certificate|unable to get local issuer|"
    r"certificate has expired|root certificate file .* does not exist|could not read root certificate", re.I)
_TLS_HOSTNAME = re.compile(r"does not match host name|IP address mismatch|Hostname mismatch|"
                           r"certificate is not valid for", re.I)
_TLS_CLIENT_CERT = re.compile(r"alert (unknown ca|bad certificate|certificate required)|certificate required|"
                              r"could not (load|read|open) (private key|certificate|client certificate)|"
                              r"private key file .* has group or world access", re.I)
_TLS_NOT_OFFERED = re.compile(r"SSL is required|server does not support SSL", re.I)


def tls_failure(exc: BaseException | None) -> str | None:
    """When ``exc`` (or an error it was raised from) says TLS to the target cannot work as configured, what to do
    about it, naming the settings; else None (a lost TLS connection is not such a failure). The same advice for
    every driver: the settings are the applier's."""
    texts = []
    for _ in range(20):
        if exc is None:
            break
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    text = "\n".join(texts)
    if _TLS_HOSTNAME.search(text):
        return ("the server's certificate does not name the host in target.url: connect with a host name the "
                "certificate holds (its subject alternative names), or have the certificate reissued for this name; "
                'target.ssl_mode = "verify-ca" skips the name check (the CA must still have signed it)')
    if _TLS_SERVER_CERT.search(text):
        return ("the server's certificate does not verify against target.ssl_ca: set ssl_ca to the PEM file of the "
                "CA that signed the server's certificate (without ssl_ca the system's trusted CAs are used), and "
                "check that the certificate has not expired")
    if _TLS_CLIENT_CERT.search(text):
        return ("the client certificate was refused or cannot be read: check target.ssl_cert and target.ssl_key (a "
                "certificate the server's CA signed, and its key readable only by this user)")
    if _TLS_NOT_OFFERED.search(text):
        return ("the server does not offer TLS: enable it on the server (MariaDB/MySQL ssl_cert and ssl_key, "
                'PostgreSQL ssl = on), or set target.ssl_mode = "disable" if the connection may go unencrypted')
    return None


def _driver_error(exc: BaseException | None) -> DBAPIError | None:
    """The outermost DBAPI error in ``exc``'s cause chain (bounded: chains can loop)."""
    for _ in range(20):
        if exc is None or isinstance(exc, DBAPIError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


class Dialect:
    """A target database: its writer, its DDL translator, its value conversion and its error classes.

    Stateless and shared: a run builds one writer (:meth:`writer`), which holds the caches."""

    name: ClassVar[str]  # as operators read it and as applier.ddl.translate names it
    #: PostgreSQL: a DDL commits with its history row and the progress. MySQL/MariaDB commit DDL implicitly,
    #: so the applier marks it "started" first (applier/apply.py).
    ddl_is_transactional: ClassVar[bool] = False
    #: Whether dropping a schema drops what is in it (PostgreSQL's DROP SCHEMA ... CASCADE): such a DDL only
    #: runs for schemas the applier created.
    drop_schema_cascades: ClassVar[bool] = False

    def writer(self, batch_rows: int = 5000, timer: StageTimer = NO_TIMING) -> Sink:
        raise NotImplementedError

    def connect_args(self, target: Any) -> dict[str, Any]:
        """The driver's connect arguments for ``[target]``'s TLS settings (``ssl_mode``, ``ssl_ca``, ``ssl_cert``,
        ``ssl_key``: applier.config.TargetSettings); {} leaves the driver's defaults."""
        return {}

    def check_connection(self, dbapi_connection: Any, target: Any) -> None:
        """Called on every new connection of an engine made by :func:`target_engine`: refuse one that does not
        hold what ``[target]`` asked for (a driver that fell back to plain text)."""

    def translate_ddl(self, query: str, *, schema: str, table: str, route: Route) -> TranslatedDDL:
        """The upstream (TiDB) DDL as statements for this database (raises UnsupportedDDL)."""
        return translate(self.name, query, schema=schema, table=table, route=route)

    def value_converter(self, column_type: str | None) -> Converter | None:
        """The function that turns a decoded upstream value into what a column of this catalog type stores, or
        None when values go as they are (rules in docs/value-rules.md)."""
        return None

    def is_transient(self, exc: BaseException | None) -> bool:
        """Whether ``exc`` (or an exception it was raised from) is a target fault that passes: a lost
        connection, a server restart, a deadlock or lock-wait timeout. Such a fault replays the whole target
        transaction."""
        err = _driver_error(exc)
        if err is None or tls_failure(err) is not None:  # a certificate that does not verify will not verify later
            return False
        return err.connection_invalidated or self._transient_driver_error(err.orig)

    def is_replay_noop(self, exc: BaseException) -> bool:
        """True when re-running a DDL failed only because it had already taken effect."""
        return False

    def is_target_fault(self, exc: BaseException | None) -> bool:
        """Whether ``exc`` (or an exception it was raised from) says the target itself cannot work, whatever the
        statement: read-only, a privilege the applier's user lacks, a full disk, no memory. A DDL refused so is
        never skipped by policy: it would not be the only one."""
        err = _driver_error(exc)
        return err is not None and not self.is_transient(err) and self._target_fault_driver_error(err.orig)

    def _transient_driver_error(self, orig: BaseException | None) -> bool:
        return False

    def _target_fault_driver_error(self, orig: BaseException | None) -> bool:
        return False

    # ---- history and soft-delete modes (applier.modes) ----------------------------------------------------
    def mode_statements(self, prep: Any, shape: "TableShape", change: "Conform") -> list[str]:
        """The DDL that gives the table ``shape`` what a route mode needs (:func:`applier.modes.conform`): the mode's
        columns, its primary key, its other unique keys turned into plain indexes of the same name and columns.
        Identifiers are quoted with ``prep``, the connection's SQLAlchemy identifier preparer (run the statements
        through the driver's parameter processing, as every statement quoted so is); the column types are the
        applier's own constants. [] when nothing is needed."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.name} dialect>"


class MySQLDialect(Dialect):
    name = "mysql"
    # the engine of the LOAD DATA path's staging table (None: the server's default_tmp_storage_engine, InnoDB on
    # MySQL, whose MyISAM is deprecated and was the slowest stage measured)
    stage_engine: str | None = None

    def connect_args(self, target: Any) -> dict[str, Any]:
        """PyMySQL's ``ssl``: an :class:`ssl.SSLContext` built here, so every mode means exactly what it says
        (verify-full: the CA and the host name; verify-ca: the CA only; require: encrypted, unchecked);
        ``disable``: ``ssl_disabled``. Passing a context makes PyMySQL insist on TLS; :meth:`check_connection`
        checks it too, for PyMySQL versions that fell back to plain text silently."""
        mode = target.ssl_mode
        if not mode:
            return {}
        if mode == "disable":
            return {"ssl_disabled": True}
        ctx = ssl.create_default_context(cafile=target.ssl_ca) if mode != "require" else ssl.SSLContext(
            ssl.PROTOCOL_TLS_CLIENT)
        if mode == "require":
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = mode == "verify-full"
            ctx.verify_mode = ssl.CERT_REQUIRED
        if target.ssl_cert:
            ctx.load_cert_chain(target.ssl_cert, keyfile=target.ssl_key)
        return {"ssl": ctx}

    def check_connection(self, dbapi_connection: Any, target: Any) -> None:
        if target.ssl_mode in ("require", "verify-ca", "verify-full"):
            sock = getattr(dbapi_connection, "_sock", None)
            if sock is not None and not isinstance(sock, ssl.SSLSocket):
                import pymysql

                dbapi_connection.close()
                raise pymysql.err.OperationalError(2026, f"SSL is required (target.ssl_mode = {target.ssl_mode!r}) "
                                                   "but the server does not support SSL: the connection is not "
                                                   "encrypted")

    def writer(self, batch_rows: int = 5000, timer: StageTimer = NO_TIMING) -> Sink:
        from applier.sinks.mysql import MySQLSink

        return MySQLSink(batch_rows, convert=self.value_converter, timer=timer, transient=self.is_transient,
                         stage_engine=self.stage_engine)

    def value_converter(self, column_type: str | None) -> Converter | None:
        from applier.sinks.mysql import mysql_converter

        return mysql_converter(column_type)

    def _transient_driver_error(self, orig: BaseException | None) -> bool:
        code = orig.args[0] if orig is not None and orig.args else None
        return code in MYSQL_TRANSIENT_ERRORS

    def is_replay_noop(self, exc: BaseException) -> bool:
        if isinstance(exc, DBAPIError) and exc.orig is not None and exc.orig.args:
            return exc.orig.args[0] in MYSQL_REPLAY_NOOP_ERRORS
        return False

    def _target_fault_driver_error(self, orig: BaseException | None) -> bool:
        code = orig.args[0] if orig is not None and orig.args else None
        return code in MYSQL_TARGET_FAULTS

    def mode_statements(self, prep: Any, shape: "TableShape", change: "Conform") -> list[str]:
        """One ALTER TABLE (MySQL runs its clauses as one atomic change): ADD COLUMN per mode column, DROP PRIMARY
        KEY / ADD PRIMARY KEY, DROP INDEX u / ADD INDEX u (same columns and prefix lengths) per unique key."""
        q = prep.quote_identifier
        clauses = [f"ADD COLUMN {q(c.name)} {c.type} {'NULL' if c.nullable else 'NOT NULL'}"
                   + (f" DEFAULT {c.default}" if c.default else "") for c in change.add]
        if change.primary_key:
            if shape.primary_key:
                clauses.append("DROP PRIMARY KEY")
            clauses.append(f"ADD PRIMARY KEY ({', '.join(map(q, change.primary_key))})")
        for u in change.demote:
            parts = [q(_plain_column(shape, u, c)) + (f"({p})" if p else "")
                     for c, p in zip(u.columns, u.prefixes or (None,) * len(u.columns))]
            clauses += [f"DROP INDEX {q(u.name)}", f"ADD INDEX {q(u.name)} ({', '.join(parts)})"]
        if not clauses:
            return []
        return [f"ALTER TABLE {_qualified(prep, shape)} {', '.join(clauses)}"]


class MariaDBDialect(MySQLDialect):
    """MySQL's writer and values; DDL with MariaDB's own spellings and ``IF [NOT] EXISTS`` forms."""

    name = "mariadb"
    # the LOAD DATA path's staging table (applier.sinks.mysql_load): Aria, MariaDB's crash-safe MyISAM successor,
    # keeps BLOB and TEXT and writes no undo; measured against an InnoDB temporary stage, 500k upserts of 5000-row
    # chunks: the server's CPU for load + merge + clearing 8.8-9.8 -> 5.8 CPU-s
    stage_engine = "Aria"


class PostgresDialect(Dialect):
    name = "postgresql"
    ddl_is_transactional = True
    drop_schema_cascades = True

    def connect_args(self, target: Any) -> dict[str, Any]:
        """libpq's own parameters (psycopg passes them through): ``sslmode`` is the setting itself; without
        ``ssl_ca`` a verifying mode trusts the system's CAs (``sslrootcert=system``, libpq 16+), not libpq's
        default ``~/.postgresql/root.crt``."""
        mode = target.ssl_mode
        if not mode:
            return {}
        args: dict[str, Any] = {"sslmode": mode}
        if mode in ("verify-ca", "verify-full"):
            args["sslrootcert"] = target.ssl_ca or "system"
        if target.ssl_cert:
            args.update(sslcert=target.ssl_cert, sslkey=target.ssl_key)
        return args

    def writer(self, batch_rows: int = 5000, timer: StageTimer = NO_TIMING) -> Sink:
        from applier.sinks.postgres import PostgresSink

        return PostgresSink(batch_rows, convert=self.value_converter, timer=timer)

    def value_converter(self, column_type: str | None) -> Converter | None:
        from applier.sinks.postgres import pg_converter

        return pg_converter(column_type)

    def mode_statements(self, prep: Any, shape: "TableShape", change: "Conform") -> list[str]:
        """An ALTER TABLE with ADD COLUMN per mode column (the PostgreSQL types of applier.modes), the primary key
        replaced under its constraint name (``<table>_pkey`` as the DDL translator names it, when there was none)
        and UNIQUE constraints dropped; then DROP INDEX per unique index, and CREATE INDEX of the same name and
        columns per unique key (index names are per schema in PostgreSQL, hence after the drops)."""
        from applier.ddl.pg_sql import pg_index_name

        q = prep.quote_identifier
        table = _qualified(prep, shape)
        clauses = [f"ADD COLUMN {q(c.name)} {c.pg_type}{'' if c.nullable else ' NOT NULL'}"
                   + (f" DEFAULT {c.default}" if c.default else "") for c in change.add]
        if change.primary_key:
            name = shape.primary_name or pg_index_name(shape.name, "PRIMARY")
            if shape.primary_key:
                clauses.append(f"DROP CONSTRAINT {q(name)}")
            clauses.append(f"ADD CONSTRAINT {q(name)} PRIMARY KEY ({', '.join(map(q, change.primary_key))})")
        clauses += [f"DROP CONSTRAINT {q(u.name)}" for u in change.demote if u.constraint]
        out = [f"ALTER TABLE {table} {', '.join(clauses)}"] if clauses else []
        schema = f"{prep.quote_identifier(shape.schema)}." if shape.schema else ""
        out += [f"DROP INDEX {schema}{q(u.name)}" for u in change.demote if not u.constraint]
        out += [f"CREATE INDEX {q(u.name)} ON {table} ({', '.join(q(_plain_column(shape, u, c)) for c in u.columns)})"
                for u in change.demote]
        return out

    def _transient_driver_error(self, orig: BaseException | None) -> bool:
        sqlstate = getattr(orig, "sqlstate", None)
        if sqlstate is not None:
            return sqlstate in PG_TRANSIENT_SQLSTATES or sqlstate.startswith(PG_TRANSIENT_SQLSTATE_CLASSES)
        # no SQLSTATE: the connection itself failed
        return type(orig).__module__.startswith("psycopg") and type(orig).__name__ == "OperationalError"

    def _target_fault_driver_error(self, orig: BaseException | None) -> bool:
        sqlstate = getattr(orig, "sqlstate", None)
        return sqlstate is not None and (sqlstate in PG_TARGET_FAULT_SQLSTATES
                                         or sqlstate.startswith(PG_TARGET_FAULT_SQLSTATE_CLASSES))


def _qualified(prep: Any, shape: "TableShape") -> str:
    q = prep.quote_identifier
    return f"{q(shape.schema)}.{q(shape.name)}" if shape.schema else q(shape.name)


def _plain_column(shape: "TableShape", u: "UniqueIndex", column: str | None) -> str:
    """A unique key's column, to index it again as a plain index; a key part that is an expression cannot be
    rendered from the catalog's column list, so the operator is asked to do that one by hand."""
    if column is None:
        from applier.modes import ModeError
        from applier.sinks.table import shown

        raise ModeError(f"unique key {u.name!r} of {shown(shape.schema, shape.name)} has an expression key part, "
                        "which a route mode other than replica cannot keep unique: replace it by hand with a plain "
                        "index")
    return column


MYSQL = MySQLDialect()
MARIADB = MariaDBDialect()
POSTGRES = PostgresDialect()

_BY_NAME = {"mysql": MYSQL, "mariadb": MARIADB, "postgresql": POSTGRES}


def dialect_named(name: str) -> Dialect:
    """The dialect for ``"mysql"``, ``"mariadb"`` or ``"postgresql"``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unsupported target dialect {name!r}: use mysql+pymysql, mariadb+pymysql or "
                         "postgresql+psycopg") from None


def dialect_for(bind: Engine | Connection) -> Dialect:
    """The dialect of this engine's server. A ``mysql+pymysql`` URL may point at MariaDB, which only the
    server tells (SQLAlchemy learns it on the first connection), so an engine that never connected connects
    once here."""
    sa = bind.dialect
    if sa.name == "mysql" and sa.server_version_info is None and isinstance(bind, Engine):
        with bind.connect():
            pass
    if sa.name in ("mysql", "mariadb"):
        return MARIADB if getattr(sa, "is_mariadb", False) else MYSQL
    return dialect_named(sa.name)


def target_engine(target: Any, **kwargs: Any) -> Engine:
    """A SQLAlchemy engine on ``[target]`` (applier.config.TargetSettings): its URL with the password resolved and
    its dialect's connect arguments for TLS (merged under ``kwargs["connect_args"]``). Every connection the applier
    makes to the target goes through here, so the TLS settings hold for all of them."""
    dialect = dialect_named(target.dialect)
    connect_args = {**dialect.connect_args(target), **kwargs.pop("connect_args", {})}
    engine = create_engine(target.sqlalchemy_url(), connect_args=connect_args, **kwargs)
    if target.ssl_mode:
        event.listen(engine, "connect", lambda dbapi_connection, record: dialect.check_connection(dbapi_connection,
                                                                                                    target))
    return engine
