"""Upserts through ``LOAD DATA LOCAL INFILE`` for MySQL/MariaDB: the same rows, half the client CPU (issue 25).

Why: :meth:`MySQLSink.upsert_rows <applier.sinks.mysql.MySQLSink.upsert_rows>` hands a chunk to PyMySQL's
executemany, which formats every value into SQL text in Python: 14-20 us of client CPU per row. This path writes
the chunk once into a text file in LOAD DATA's own format, lets the server read it into a session TEMPORARY
staging table of the target's column types, and merges it with one ``INSERT INTO target (cols) SELECT cols FROM
stage ORDER BY seq ON DUPLICATE KEY UPDATE c = VALUES(c)``: the statement today's executemany sends, with the
rows coming from the stage instead of ``VALUES`` lists (key-only tables included). Then the stage is dropped
(``TRUNCATE`` would commit; ``DELETE`` cost the server as much as the LOAD). All of it runs inside the caller's
data transaction, and neither ``CREATE TEMPORARY TABLE`` nor ``DROP TEMPORARY TABLE`` commits (progress commits
with the data, invariant 6). Only the merge writes the target, so a rollback (whole, or to a savepoint) takes
back all the chunk wrote there; a stage that still exists when its next chunk comes (a LOAD whose transaction
was rolled back before the merge's end) is dropped first, so a replay after a transient fault starts from an
empty stage (invariant 14) whatever the stage's engine.

**The file** (:func:`encode_rows`): ``CHARACTER SET utf8mb4 FIELDS TERMINATED BY X'09' ENCLOSED BY ''
ESCAPED BY X'5C' LINES TERMINATED BY X'0A'`` (TAB, backslash, LF; hex literals, so that the statement means the
same whatever the session's ``NO_BACKSLASH_ESCAPES``). NULL is ``\\N``; in a string, ``\\``, TAB and LF are written as
``\\\\``, ``\\t``, ``\\n`` (the only bytes the reader treats specially; with no ENCLOSED BY, the text ``NULL``
and the text ``\\N`` stay strings). The whole file is the chunk's text encoded as strict UTF-8, which is
also what PyMySQL does to a query, so a string that cannot be encoded fails here as it does there. Values are
written as PyMySQL's literal of them reads back: ints and bools as digits, floats as ``repr`` (``inf``/``nan``
-> the chunk goes through executemany, which refuses them as today), Decimal as ``format(d, 'f')`` (its scale
kept), datetimes/dates/times as ``YYYY-MM-DD HH:MM:SS[.ffffff]`` etc. without any tzinfo (PyMySQL ignores it
too; the TIMESTAMP converter has already made aware values UTC), and strings as they are (TIME arrives as
text already). Three column kinds read text differently from a literal, so they go through a user variable:

* bytes (BINARY/VARBINARY/BLOB, and BIT given as bytes) are written as hex and set with ``UNHEX(@v)``: raw bytes
  would be read in the file's character set, and hex is byte-exact for any byte (0x00, 0x5C, 0x09, 0x0A,
  invalid UTF-8) with nothing to escape;
* ENUM, SET and BIT given as integers (index, bitmask, bits) are set with ``CAST(@v AS UNSIGNED)``: the text
  ``2`` would be the *name* '2' of an ENUM and the bytes of '2' in a BIT;
* YEAR given as an integer is set with ``CAST(@v AS SIGNED)``: the text ``0`` reads as 2000, the number 0 as
  0000.

Which value types each column kind takes is a fixed table (:data:`_ACCEPTS`); any other type in a chunk (a
float for a DECIMAL, an int for a DATETIME, str and int mixed in one ENUM column, a type the table does not
know) sends that chunk through executemany: a faster path beside an older one never guesses. Generated columns
are never in the chunk (the plan keeps writable columns only).

**Strictness**: with LOCAL, the server turns data errors (a value too long, out of range, NULL for NOT NULL) into
warnings and loads something anyway. So after the LOAD the writer checks the warning count and the rows loaded
(from the LOAD's own OK packet, no extra statement); any warning or another count empties the stage and sends
the chunk through executemany, which raises the strict-mode error exactly as today (same statement, same
message, same error path through :mod:`applier.setaside`). A note counts too (a DECIMAL rounded to a smaller
scale): executemany then stores the value as today, and so that such a table does not pay for both paths on every
chunk, its next 1, 2, 4, ... up to :data:`MAX_SKIP` chunks go straight to executemany after each LOAD that warned
(said once per table at INFO, with the server's first warning). A statement error of the merge that is not a
transient fault (a CHECK, a foreign key) sends the chunk through executemany as well. A transient fault is raised
as it is: the caller replays the whole transaction.

**The file guard** (:class:`LoadDataConnection`): with ``local_infile`` a MySQL client sends whatever local
file the *server* names in its reply to any statement, so a hostile server or proxy could read any file the
applier's user can. The engine's connections are of this PyMySQL subclass, which sends a file only while the
writer holds a one-shot permission for exactly the path it has just written (:meth:`~LoadDataConnection.sending`);
a request for any other path, or outside that window, is answered with an empty file (the protocol's way to
end the request, so the connection stays in step) and raised as :class:`LocalFileRefused`. The hook is
PyMySQL's per-result method ``MySQLResult._read_load_local_packet``, the one place (PyMySQL 1.0 to 2.2) where a
server's file request is answered, for buffered and unbuffered queries alike; the subclass reaches it by making
``_read_query_result`` build a :class:`_GuardedResult`. Both are private names of PyMySQL: if a release drops
them, :func:`enable_local_infile` refuses to start (``[target] load_data = "off"`` then keeps today's path)
rather than run unguarded.

**The stage**: one per connection and table shape and column set, ``applier_load_<n>`` in the connection's default
database (the applier's own), made for each chunk with ``CREATE TEMPORARY TABLE ... (seq BIGINT AUTO_INCREMENT
PRIMARY KEY) ENGINE=<the dialect's> SELECT cols FROM target LIMIT 0`` (the target's column types, character sets
and NOT NULL; no CHECK, no defaults, no generated columns: the merge into the target applies those) and dropped
after its merge; its name and statements are known through the pool's per-connection ``info`` (cleared when a
connection is replaced, as its session's temporary tables are) and made again when the table is read again after
a DDL. The engine is the dialect's ``stage_engine``: Aria on MariaDB (no undo, BLOB and TEXT kept; an InnoDB
temporary stage wrote every row twice with undo: 500k upserts in 5000-row chunks cost the server 8.8-9.8 CPU-s
for LOAD, merge and DELETE against 5.8 with Aria and a drop), the server's default on MySQL; a server that refuses
it gets its default, said once. Statements are built from identifiers quoted by SQLAlchemy and constants only (invariant
10), and go through PyMySQL's ``%`` formatting like every other statement of the writer (which undoes the
preparer's doubled ``%%``).

**When**: a chunk of at least :data:`MIN_ROWS` rows (smaller ones keep executemany: the path's three statements
and its file cost more than formatting a few rows), on a connection of an engine made by
:func:`enable_local_infile` (``[target] load_data`` "auto" or "on", see ``applier.pipeline``) whose server allows
``local_infile`` (``@@GLOBAL.local_infile``, read once per connection with the session set-up; a server that turns
it off later refuses the LOAD, and that connection then keeps executemany).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import operator
import os
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Iterator, Sequence

import pymysql
from pymysql.connections import MySQLResult
from pymysql.protocol import LoadLocalPacketWrapper
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from applier.sinks.table import TableMeta

log = logging.getLogger("applier.sinks")

#: the fewest rows a chunk needs to go through LOAD DATA. Measured (bench_columnar --only sink, 2 cores shared with
#: the server): the client CPU per row of both paths crosses near 32-40 rows, the wall time near 128; below 128 the
#: path's three statements and its file cost the server (and the chunk's latency) more than they save
MIN_ROWS = 128
#: the client error MySQL's own library raises for a refused LOCAL INFILE request
CR_LOAD_DATA_LOCAL_INFILE_REJECTED = 2068
#: server errors that mean "LOAD DATA LOCAL is not allowed" (MariaDB 4166, older MariaDB and MySQL 1148, MySQL 8 3948)
LOCAL_INFILE_DISABLED = frozenset({1148, 3948, 4166})
#: connection info keys (SQLAlchemy's pool clears ``info`` when a connection is replaced)
ALLOWED_KEY = "applier_load_data_allowed"
STAGES_KEY = "applier_load_data_stages"
ENGINE_REFUSED_KEY = "applier_load_data_stage_engine_refused"  # the server refused the dialect's stage engine
NULL = "\\N"
_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"))


class LocalFileRefused(pymysql.err.OperationalError):
    """The server asked for a local file this writer did not just write: refused (see the module docstring)."""


# ---------------------------------------------------------------------------------------------------------
# The file guard

class _GuardedResult(MySQLResult):
    """PyMySQL's result reader, answering a server's LOCAL INFILE request only for the permitted path."""

    def _read_load_local_packet(self, first_packet: Any) -> None:
        conn = self.connection
        name = LoadLocalPacketWrapper(first_packet).filename
        allowed = getattr(conn, "applier_allowed_file", None)
        conn.applier_allowed_file = None  # one request per permission
        if allowed is None or bytes(name) != allowed:
            conn.write_packet(b"")  # an empty file: the server ends the statement and the protocol stays in step
            with contextlib.suppress(pymysql.err.MySQLError):
                reply = conn._read_packet()
                if reply.is_ok_packet():
                    self._read_ok_packet(reply)
            shown = bytes(name)[:200].decode("utf-8", "backslashreplace")
            why = ("while no LOAD DATA of the applier was running" if allowed is None
                   else "instead of the file the applier had just written for its LOAD DATA")
            raise LocalFileRefused(
                CR_LOAD_DATA_LOCAL_INFILE_REJECTED,
                f"the target server asked this client for the local file {shown!r} {why}: refused, nothing was "
                "sent. The applier only sends the data file it wrote itself; a server or proxy that asks for "
                "other files is not to be trusted. Check what [target] url points at, or set [target] "
                'load_data = "off"')
        super()._read_load_local_packet(first_packet)
        conn.applier_load_result = (self.affected_rows, self.warning_count)


class LoadDataConnection(pymysql.connections.Connection):
    """A PyMySQL connection that sends a local file only for the writer's own LOAD DATA (module docstring).

    Why this hook: PyMySQL answers a server's file request in one method of its result reader,
    ``MySQLResult._read_load_local_packet`` (the same name and arguments from 1.0 to 2.2, for buffered and
    unbuffered reads), and builds that reader in one method of the connection, ``_read_query_result`` (whose
    few lines are repeated here). Overriding both on a subclass touches this engine's connections only. The
    other ways are worse: replacing the module function that opens the file (``_send_local_file``, 2.x only)
    would change every PyMySQL connection of the process; turning ``_local_infile`` off between statements
    makes PyMySQL raise *before* it answers the request, which leaves the server waiting for file data and the
    connection out of step; and a filter on packets cannot tell a file request from a row that starts with a
    NULL. Refusing here answers with an empty file first, so the connection stays usable.
    """

    applier_allowed_file: bytes | None = None
    applier_load_result: tuple[int, int] | None = None  # (rows loaded, warnings) of the last allowed LOAD

    @contextlib.contextmanager
    def sending(self, path: str) -> Iterator[None]:
        """Allow one request for exactly ``path`` while the block runs (the writer's LOAD statement)."""
        self.applier_allowed_file = os.fsencode(path)
        self.applier_load_result = None
        try:
            yield
        finally:
            self.applier_allowed_file = None

    def _read_query_result(self, unbuffered: bool = False) -> int:
        # PyMySQL's own body (1.0 to 2.2), reading with _GuardedResult
        self._result = None
        result = _GuardedResult(self)
        if unbuffered:
            try:
                result.init_unbuffered_query()
            except BaseException:
                result.unbuffered_active = False
                result.connection = None
                raise
        else:
            result.read()
        self._result = result
        if result.server_status is not None:
            self.server_status = result.server_status
        return result.affected_rows


def enable_local_infile(engine: Engine) -> None:
    """Make ``engine``'s new connections :class:`LoadDataConnection` with ``local_infile`` (call before it first
    connects). Refuses a PyMySQL without the hooks the guard needs, rather than connect unguarded."""
    if engine.dialect.driver != "pymysql":
        raise ValueError(f'[target] load_data needs the pymysql driver, not {engine.dialect.driver!r}: use a '
                         'mysql+pymysql or mariadb+pymysql url, or set load_data = "off"')
    missing = [n for n, owner in (("_read_load_local_packet", MySQLResult),
                                  ("_read_query_result", pymysql.connections.Connection),
                                  ("_read_ok_packet", MySQLResult)) if not callable(getattr(owner, n, None))]
    if missing:
        raise RuntimeError(f"PyMySQL {pymysql.__version__} lacks {', '.join(missing)}, which the guard of the LOAD "
                           'DATA file needs: set [target] load_data = "off", or install a PyMySQL from 1.1 to 2.2')

    @event.listens_for(engine, "do_connect")
    def _connect(dialect: Any, conn_rec: Any, cargs: tuple[Any, ...], cparams: dict[str, Any]) -> Any:
        return LoadDataConnection(*cargs, **{**cparams, "local_infile": True})


def server_allows_local_infile(conn: Connection) -> bool:
    """The server's ``@@GLOBAL.local_infile`` (MariaDB and MySQL: global only)."""
    return bool(int(conn.exec_driver_sql("SELECT @@GLOBAL.local_infile").scalar() or 0))


def guarded(conn: Connection) -> LoadDataConnection | None:
    """The connection's DBAPI connection when it is a guarded one, else None."""
    dbapi = conn.connection.dbapi_connection
    return dbapi if isinstance(dbapi, LoadDataConnection) else None


# ---------------------------------------------------------------------------------------------------------
# The file (pure)

_INTEGER = frozenset({"tinyint", "smallint", "mediumint", "int", "integer", "bigint", "bool", "boolean"})
_DECIMAL = frozenset({"decimal", "numeric", "dec", "fixed"})
_FLOAT = frozenset({"float", "double", "real"})
_CHAR = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "json"})
_BINARY = frozenset({"binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"})
_DATETIME = frozenset({"date", "datetime", "timestamp"})


def column_kind(column_type: str | None) -> str | None:
    """The kind of a ``COLUMN_TYPE`` ("bigint(20) unsigned" -> "integer"), or None for a type this path does not
    write (anything but NULL in it sends the chunk through executemany)."""
    base = (column_type or "").lower().split("(", 1)[0].split(" ", 1)[0]
    if base in _INTEGER:
        return "integer"
    if base in _DECIMAL:
        return "decimal"
    if base in _FLOAT:
        return "float"
    if base in _CHAR:
        return "char"
    if base in _BINARY:
        return "binary"
    if base in _DATETIME:
        return "datetime"
    if base in ("time", "year", "bit", "enum", "set"):
        return base
    return None


# kind -> the sets of value types it takes, each with the load mode ("text": the field as it is; "hex": UNHEX(@v);
# "uint": CAST(@v AS UNSIGNED); "int": CAST(@v AS SIGNED)). A column's non-NULL value types must fit one set.
_NUMBER = frozenset({int, bool})
_ACCEPTS: dict[str | None, tuple[tuple[frozenset[type], str], ...]] = {
    "integer": ((frozenset({int, bool, str}), "text"),),
    "decimal": ((frozenset({int, bool, Decimal, str}), "text"),),
    "float": ((frozenset({int, bool, float, str}), "text"),),
    "char": ((frozenset({str}), "text"),),
    "binary": ((frozenset({bytes}), "hex"), (frozenset({str}), "text")),
    "datetime": ((frozenset({_dt.datetime, _dt.date, str}), "text"),),
    "time": ((frozenset({_dt.time, str}), "text"),),
    "year": ((_NUMBER, "int"), (frozenset({str}), "text")),
    "bit": ((_NUMBER, "uint"), (frozenset({bytes}), "hex")),
    "enum": ((_NUMBER, "uint"), (frozenset({str}), "text")),
    "set": ((_NUMBER, "uint"), (frozenset({str}), "text")),
    None: (),
}


def _escape(s: str) -> str:
    for a, b in _ESCAPES:
        if a in s:
            s = s.replace(a, b)
    return s


def _int_text(v: Any) -> str:
    return str(int(v))  # bool -> '1'/'0', as PyMySQL's escape_bool


def _decimal_text(v: Decimal) -> str:
    return format(v, "f")  # PyMySQL's Decimal2Literal: the scale kept, no exponent


def _naive_text(v: Any) -> str:
    """A datetime or time as PyMySQL writes it: its fields, any tzinfo ignored."""
    return str(v.replace(tzinfo=None) if v.tzinfo is not None else v)


_TEXT_OF: dict[type, Callable[[Any], str]] = {
    int: str, bool: _int_text, float: repr, Decimal: _decimal_text, str: _escape,
    _dt.datetime: _naive_text, _dt.date: str, _dt.time: _naive_text, bytes: bytes.hex,
}
_NONE = type(None)
# Bulk forms of a column of one value type (C-level maps over the whole column; None comes out as 'None', which no
# text of these types can be, and is then swapped for \N), each with the check that sends the column through the
# per-value form (_TEXT_OF) instead: an aware datetime/time (str() would add the offset), a Decimal that str()
# writes with an exponent (format 'f' does not); a non-finite float or Decimal sends the chunk to executemany.
_BULK = frozenset({int, float, Decimal, _dt.datetime, _dt.date, _dt.time})
_NAIVE_LENGTHS = {_dt.datetime: frozenset({4, 19, 26}), _dt.time: frozenset({4, 8, 15})}
_NULL_OF = {"None": NULL}
# in a str column: None is marked with U+0001 and the values joined with U+0000 (neither may occur in the data), so
# that escaping and NULL are three C-level replaces over the whole column
_STR_NULL, _STR_SEP = "\x01", "\x00"
_STR_MARK = {None: _STR_NULL}


def _mode_for(kind: str | None, types: set[type]) -> str | None:
    for accepted, mode in _ACCEPTS.get(kind, ()):
        if types <= accepted:
            return mode
    return None


def _str_texts(values: Sequence[Any], nulls: bool) -> list[str] | None:
    """A str column's fields in bulk, or None when a value holds U+0000 or U+0001 (then: value by value)."""
    marked = list(map(_STR_MARK.get, values, values)) if nulls else values
    joined = _STR_SEP.join(marked)
    if joined.count(_STR_SEP) != len(values) - 1 or joined.count(_STR_NULL) != (values.count(None) if nulls else 0):
        return None
    for a, b in _ESCAPES:
        if a in joined:
            joined = joined.replace(a, b)
    if nulls:
        joined = joined.replace(_STR_NULL, NULL)
    return joined.split(_STR_SEP)


def column_texts(values: Sequence[Any], kind: str | None) -> tuple[list[str], str] | None:
    """One column's fields (``\\N`` for NULL) and its load mode, or None when a value is not one this path
    writes exactly (then the chunk goes through executemany)."""
    types = set(map(type, values))
    nulls = _NONE in types
    types.discard(_NONE)
    if not types:
        return [NULL] * len(values), "text"
    mode = _mode_for(kind, types)
    if mode is None:
        return None
    texts: list[str] | None = None
    if types == {str}:
        texts = _str_texts(values, nulls)
    elif len(types) == 1 and (t := next(iter(types))) in _BULK:
        bulk = list(map(repr if t is float else str, values))
        if t is float or t is Decimal:
            joined = "".join(bulk)
            if "i" in joined or "a" in joined or "I" in joined:  # inf, nan, NaN, sNaN, Infinity: executemany
                return None  # refuses them ('None' has none of these letters)
            if t is float or "E" not in joined:
                texts = bulk
        elif t in _NAIVE_LENGTHS:
            if set(map(len, bulk)) <= _NAIVE_LENGTHS[t]:
                texts = bulk
        else:
            texts = bulk
        if texts is not None and nulls:
            texts = list(map(_NULL_OF.get, texts, texts))
    if texts is None:
        texts = [NULL if v is None else _TEXT_OF[type(v)](v) for v in values]
        if float in types or Decimal in types:
            joined = "".join(texts)
            if "i" in joined or "a" in joined or "I" in joined:
                return None
    return texts, mode


@dataclass(frozen=True)
class Encoded:
    """A chunk as a LOAD DATA file: its bytes and each column's load mode."""

    data: bytes
    modes: tuple[str, ...]


def encode_rows(kinds: Sequence[str | None], cols: Sequence[str], rows: Sequence[dict[str, Any]]) -> Encoded | None:
    """The chunk's file (module docstring), or None when a value cannot be written exactly."""
    if not rows:
        return None
    get = operator.itemgetter(*cols)
    # the chunk by column (one C-level pass per row, then a transpose)
    by_column = list(zip(*map(get, rows))) if len(cols) > 1 else [tuple(map(get, rows))]
    columns = []
    modes = []
    for values, kind in zip(by_column, kinds):
        got = column_texts(values, kind)
        if got is None:
            return None
        columns.append(got[0])
        modes.append(got[1])
    text = "\n".join(map("\t".join, zip(*columns)))
    try:
        data = text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a lone surrogate: PyMySQL's encoding of the query refuses it as well
        return None
    return Encoded(data, tuple(modes))


# ---------------------------------------------------------------------------------------------------------
# Statements

SEQ = "_applier_seq"


def load_statement(prep: Any, stage: str, cols: Sequence[str], modes: Sequence[str]) -> tuple[str, str]:
    """The LOAD DATA statement around its file name: (text before the quoted path, text after it)."""
    targets, sets = [], []
    for i, (c, mode) in enumerate(zip(cols, modes)):
        if mode == "text":
            targets.append(prep.quote(c))
            continue
        var = f"@applier_{i}"
        targets.append(var)
        expr = {"hex": f"UNHEX({var})", "uint": f"CAST({var} AS UNSIGNED)", "int": f"CAST({var} AS SIGNED)"}[mode]
        sets.append(f"{prep.quote(c)} = {expr}")
    # the separators as hex literals: no backslash in the statement, whatever NO_BACKSLASH_ESCAPES says
    after = (f" INTO TABLE {stage} CHARACTER SET utf8mb4 FIELDS TERMINATED BY X'09' ENCLOSED BY '' "
             f"ESCAPED BY X'5C' LINES STARTING BY '' TERMINATED BY X'0A' ({', '.join(targets)})")
    if sets:
        after += f" SET {', '.join(sets)}"
    return "LOAD DATA LOCAL INFILE ", after


def create_statement(prep: Any, meta: TableMeta, stage: str, seq: str, cols: Sequence[str],
                     engine: str | None) -> str:
    """The stage's ``CREATE TEMPORARY TABLE``: an AUTO_INCREMENT ``seq`` that keeps the file's row order, then the
    target's ``cols`` with their types, character sets and nullability (``SELECT ... LIMIT 0``), in ``engine``
    (a constant of the dialect) or the server's default temporary engine."""
    engine_clause = f" ENGINE={engine}" if engine else ""
    return (f"CREATE TEMPORARY TABLE {stage} ({prep.quote(seq)} BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY)"
            f"{engine_clause} SELECT {', '.join(map(prep.quote, cols))} FROM {prep.format_table(meta.table)} LIMIT 0")


def merge_statement(prep: Any, meta: TableMeta, stage: str, seq: str, cols: Sequence[str]) -> str:
    """``INSERT INTO target (cols) SELECT cols FROM stage ORDER BY seq ON DUPLICATE KEY UPDATE c = VALUES(c)``:
    today's upsert (``MySQLSink._upsert_sql``) with the rows from the stage, in file order."""
    q = [prep.quote(c) for c in cols]
    updates = [f"{qc} = VALUES({qc})" for c, qc in zip(cols, q) if c not in meta.key]
    if not updates:  # key-only table: a no-op update keeps the statement idempotent
        k = prep.quote(meta.key[0])
        updates = [f"{k} = VALUES({k})"]
    return (f"INSERT INTO {prep.format_table(meta.table)} ({', '.join(q)}) SELECT {', '.join(q)} FROM {stage} "
            f"ORDER BY {prep.quote(seq)} ON DUPLICATE KEY UPDATE {', '.join(updates)}")


def path_literal(path: str) -> str | None:
    """The file name as a SQL string, or None for a name that would need escaping (a quote, a backslash, a control
    character: only in a strange TMPDIR), whose meaning would then depend on the session's sql_mode, or a ``%``
    (the statements go through PyMySQL's ``%`` formatting, which turns the identifiers' doubled ``%%`` back)."""
    if "'" in path or "\\" in path or "%" in path or not path.isprintable():
        return None
    return "'" + path + "'"


# ---------------------------------------------------------------------------------------------------------
# The writer

@dataclass
class LoadStats:
    """What the path did in this writer (tests and the benchmark read it)."""

    loaded_chunks: int = 0
    loaded_rows: int = 0
    fallback_values: int = 0  # a value type not written exactly
    fallback_warnings: int = 0  # the LOAD warned or loaded another count
    fallback_errors: int = 0  # a statement error that is not a transient fault
    skipped: int = 0  # chunks sent to executemany at once, after their table's LOAD warned (see _Shape)


#: after a LOAD of a table warned, that many of its next chunks go straight to executemany (doubling per warning
#: from 1 up to this): a table whose rows always warn (a DECIMAL rounded to a smaller scale) does not pay for a
#: LOAD and an executemany per chunk
MAX_SKIP = 64


@dataclass
class _Shape:
    """A table shape and column set as the writer sees it: its column kinds, and the skip after a warning."""

    meta: TableMeta
    kinds: tuple[str | None, ...]
    skip: int = 0  # chunks left to send to executemany at once
    backoff: int = 0  # the next skip
    told: bool = False  # the operator was told (once) why this table's chunks fall back


@dataclass
class _Stage:
    """One TEMPORARY staging table of a connection: for one target table shape and column set."""

    meta: TableMeta
    name: str  # quoted
    seq: str
    loads: dict[tuple[str, ...], tuple[str, str]] = field(default_factory=dict)  # modes -> load statement
    merge: str = ""
    creates: dict[str | None, str] = field(default_factory=dict)  # engine (None: the default) -> CREATE statement
    exists: bool = False  # created on this connection and not dropped since


class LoadDataUpserter:
    """The LOAD DATA path of one writer (module docstring). :meth:`upsert` returns False when the chunk must go
    through executemany instead; a transient fault is raised."""

    def __init__(self, transient: Callable[[BaseException], bool] | None = None, min_rows: int = MIN_ROWS,
                 scratch_dir: str | None = None, stage_engine: str | None = None) -> None:
        # without a dialect's judgement every statement error is raised (never a fallback on a lost transaction)
        self.transient = transient or (lambda exc: True)
        self.stage_engine = stage_engine  # the dialect's (module docstring, "The stage"); None: the server's default
        self.min_rows = min_rows
        self.scratch_dir = scratch_dir
        self.stats = LoadStats()
        self._shapes: dict[tuple[int, tuple[str, ...]], _Shape] = {}
        self._warned: set[str] = set()

    def usable(self, conn: Connection, rows: int) -> bool:
        return rows >= self.min_rows and bool(conn.connection.info.get(ALLOWED_KEY))

    def upsert(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> bool:
        return self.load(conn, meta, cols, len(rows), lambda kinds: encode_rows(kinds, cols, rows))

    def load(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...], n: int,
             encode: Callable[[tuple[str | None, ...]], Encoded | None]) -> bool:
        """Upsert a chunk of ``n`` rows whose file ``encode(column kinds)`` makes (None: not exactly), or return
        False: :meth:`upsert` for Python rows, applier/sinks/mysql_arrow.py for the lane's Arrow tables."""
        shape = self._shape(meta, cols)
        if shape.skip:
            shape.skip -= 1
            self.stats.skipped += 1
            return False
        encoded = encode(shape.kinds)
        if encoded is None:
            self.stats.fallback_values += 1
            return False
        dbapi = guarded(conn)
        if dbapi is None:
            return False
        try:
            stage = self._stage(conn, meta, cols)
        except DBAPIError as exc:
            return self._failed(conn, exc, meta, None)
        fd, path = tempfile.mkstemp(prefix="applier-load-", suffix=".tsv", dir=self.scratch_dir)
        literal = path_literal(path)
        try:
            if literal is None:
                os.close(fd)
                self._warn(f"the temporary directory's path {os.path.dirname(path)!r} needs escaping in SQL; set "
                           "TMPDIR to a plain path")
                return False
            with os.fdopen(fd, "wb", closefd=True) as f:
                f.write(encoded.data)
            before, after = self._load_sql(conn, stage, cols, encoded.modes)
            try:
                with dbapi.sending(path):
                    conn.exec_driver_sql(before + literal + after)
                loaded, warnings = dbapi.applier_load_result or (-1, -1)
                if loaded != n or warnings:
                    self.stats.fallback_warnings += 1
                    self._warned_chunk(conn, shape, loaded, n, warnings)
                    self._clear(conn, stage)
                    return False
                conn.exec_driver_sql(stage.merge)
            except DBAPIError as exc:
                return self._failed(conn, exc, meta, stage)
            self._clear(conn, stage)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        shape.backoff = 0
        self.stats.loaded_chunks += 1
        self.stats.loaded_rows += n
        return True

    # ---- helpers --------------------------------------------------------------------------------------

    def _shape(self, meta: TableMeta, cols: tuple[str, ...]) -> _Shape:
        k = (id(meta), cols)
        hit = self._shapes.get(k)
        if hit is not None and hit.meta is meta:
            return hit
        if len(self._shapes) >= 4096:
            self._shapes.clear()
        shape = self._shapes[k] = _Shape(meta, tuple(column_kind(meta.types.get(c)) for c in cols))
        return shape

    def _warned_chunk(self, conn: Connection, shape: _Shape, loaded: int, rows: int, warnings: int) -> None:
        """A LOAD warned (a value the column cannot hold as sent): this chunk and the next few of the table go
        through executemany, which raises today's error if the value is refused. Said once per table, with the
        server's first warning (read before the stage's DELETE clears it)."""
        shape.backoff = min(MAX_SKIP, shape.backoff * 2 or 1)
        shape.skip = shape.backoff
        if shape.told:
            return
        shape.told = True
        first = conn.exec_driver_sql("SHOW WARNINGS LIMIT 1").first() if warnings else None
        log.info("[target] load_data: LOAD DATA of %d rows of %s loaded %d with %d warning(s)%s; this chunk goes "
                 "through executemany (which refuses a value the column cannot hold, as without load_data), and so do "
                 "up to %d later chunks of the table after each such LOAD", rows, shape.meta.display, loaded,
                 warnings, f" (first: {' '.join(map(str, first))[:300]})" if first else "", MAX_SKIP)

    def _stage(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...]) -> _Stage:
        """The connection's staging table for this table shape and column set, created for this chunk (``CREATE
        TEMPORARY TABLE ... SELECT cols FROM target LIMIT 0``: the target's column types, charsets and
        nullability, plus an AUTO_INCREMENT key that keeps the file's row order; it does not commit) after
        dropping one a rolled-back chunk left. A re-read table (after a DDL) gets a new name and statements."""
        info = conn.connection.info
        stages: dict[tuple[str, str, tuple[str, ...]], _Stage] = info.setdefault(STAGES_KEY, {})
        key = (meta.schema, meta.name, cols)
        stage = stages.get(key)
        prep = conn.dialect.identifier_preparer
        if stage is not None and stage.meta is not meta:  # the table changed since: a new stage of its new shape
            stages.pop(key)
            if stage.exists:
                self._clear(conn, stage)
            stage = None
        if stage is None:
            seq = SEQ
            while seq in cols:
                seq += "_"
            n = info.get(STAGES_KEY + "_n", 0) + 1
            info[STAGES_KEY + "_n"] = n
            name = prep.quote(f"applier_load_{n}")
            conn.exec_driver_sql(f"DROP TEMPORARY TABLE IF EXISTS {name}")
            stage = _Stage(meta, name, seq, merge=merge_statement(prep, meta, name, seq, cols))
            stages[key] = stage
        elif stage.exists:  # rows of a chunk that never reached its merge's end (a rolled-back transaction)
            self._clear(conn, stage)
        self._create(conn, stage, cols)
        return stage

    def _create(self, conn: Connection, stage: _Stage, cols: tuple[str, ...]) -> None:
        """Create the (dropped) stage, in the dialect's engine unless this connection's server refused it."""
        info = conn.connection.info
        engine = None if info.get(ENGINE_REFUSED_KEY) else self.stage_engine
        create = stage.creates.get(engine)
        if create is None:
            create = stage.creates[engine] = create_statement(conn.dialect.identifier_preparer, stage.meta,
                                                              stage.name, stage.seq, cols, engine)
        try:
            conn.exec_driver_sql(create)
        except DBAPIError as exc:
            if engine is None or self.transient(exc):
                raise
            info[ENGINE_REFUSED_KEY] = True
            self._warn(f"the server refused a staging table in ENGINE={engine} ({str(exc.orig)[:200]}); the stage "
                       "is in its default temporary engine")
            self._create(conn, stage, cols)
            return
        stage.exists = True

    def _load_sql(self, conn: Connection, stage: _Stage, cols: tuple[str, ...],
                  modes: tuple[str, ...]) -> tuple[str, str]:
        sql = stage.loads.get(modes)
        if sql is None:
            sql = stage.loads[modes] = load_statement(conn.dialect.identifier_preparer, stage.name, cols, modes)
        return sql

    def _clear(self, conn: Connection, stage: _Stage) -> None:
        """Drop the stage (module docstring, "The stage": cheaper than emptying it, and in a non-transactional
        engine the only way a chunk's rows never reach the next). It is created again for the next chunk."""
        conn.exec_driver_sql(f"DROP TEMPORARY TABLE IF EXISTS {stage.name}")
        stage.exists = False

    def _failed(self, conn: Connection, exc: DBAPIError, meta: TableMeta, stage: _Stage | None) -> bool:
        """A statement of the path failed. A transient fault or a refused file request is raised; anything else
        sends the chunk through executemany (which raises today's error if the rows are at fault). A server that
        no longer allows LOCAL INFILE turns the path off for the connection."""
        if isinstance(exc.orig, LocalFileRefused) or self.transient(exc):
            raise exc
        code = exc.orig.args[0] if exc.orig is not None and exc.orig.args else None
        self.stats.fallback_errors += 1
        if stage is not None:
            self._clear(conn, stage)
        if code in LOCAL_INFILE_DISABLED:
            conn.connection.info[ALLOWED_KEY] = False
            self._warn("the server no longer allows LOAD DATA LOCAL (its local_infile is OFF)")
        elif stage is None:
            self._warn(f"the staging table for {meta.display} could not be made ({str(exc.orig)[:300]})")
        return False

    def _warn(self, reason: str) -> None:
        """Log a reason for executemany once per writer."""
        if reason not in self._warned:
            self._warned.add(reason)
            log.warning("[target] load_data: %s; those upserts go through executemany", reason)
