"""MySQL and MariaDB writer.

Upserts are ``INSERT ... ON DUPLICATE KEY UPDATE col = VALUES(col)`` (MariaDB rejects MySQL 8.0.20's row
alias; MySQL 8 still accepts VALUES()), built once per table and column set and handed to the driver's
executemany, which PyMySQL rewrites into multi-row INSERTs. With ``[target] load_data`` (an engine made by
:func:`applier.sinks.mysql_load.enable_local_infile` and a server that allows ``local_infile``), a chunk of
:data:`~applier.sinks.mysql_load.MIN_ROWS` rows or more goes through ``LOAD DATA LOCAL INFILE`` into a temporary
staging table and one ``INSERT ... SELECT`` of the same shape instead (:mod:`applier.sinks.mysql_load`), falling
back to executemany for any chunk it cannot write exactly.
Deletes are ``DELETE ... WHERE key IN (...)`` per chunk. DDL is not transactional here: the applier records a
DDL as started before running it, and on a replay the errors listed in
``applier.dialect.MYSQL_REPLAY_NOOP_ERRORS`` mean the statement had already taken effect.

Values (rules tabled in ``docs/value-rules.md``): MySQL/MariaDB take almost every event-model value as it is -
ENUM ordinals and SET bitmasks as integers (MySQL reads an integer for an ENUM as its index and for a SET as
its bitmask), BIT as its integer, JSON as text, zero dates as their original strings. What the writer does:

* Session, once per database connection (:meth:`MySQLSink.begin`): ``time_zone = '+00:00'``, because
  TIMESTAMP values are UTC wall-clock times (TiCDC's changefeed time zone, UTC by default) and MySQL converts
  TIMESTAMP literals from the session zone; and ``NO_ZERO_DATE`` / ``NO_ZERO_IN_DATE`` are removed from the
  session ``sql_mode`` (MySQL 8 sets them by default) so that zero dates upstream kept reach the replica.
  Strict mode stays on: a value the column cannot hold still stops the pipeline instead of being truncated.
* TIME (timedelta) is sent as MySQL's own text ('-838:59:59', '100:00:00.500000'), in rows and keys. Keys
  matter most: deletes are SQLAlchemy Core statements, and SQLAlchemy types a bare timedelta parameter as
  ``Interval``, which on MySQL it sends as the datetime 1970-01-01 + delta, so a TIME key never matched. In
  rows it also avoids PyMySQL releases older than its fix for negative timedeltas (PyMySQL/PyMySQL#1262; the
  project accepts pymysql>=1.1), which sent -838:59:59 as '-839:00:01'.
* TIMESTAMP of exactly 1970-01-01 00:00:00 UTC (how Debezium sends the zero TIMESTAMP) is written as the
  zero TIMESTAMP, which is the same stored value; MySQL refuses the literal otherwise. Aware datetimes are
  converted to UTC.
* FLOAT (single precision) is sent as the exact double of the float32 the value stands for. The event model
  holds a FLOAT as the float32's shortest repr (TiCDC's text: ``3.4028235e+38`` for float32's largest value),
  which as a double lies just beyond FLT_MAX; MySQL/MariaDB range-check the double before rounding it to single
  precision, so strict mode refused the largest legal FLOAT (error 1264) and stopped the run. The exact double
  (``3.4028234663852886e+38``) passes and stores the same float32; subnormals and every other value store the
  same float32 either way. A value beyond FLOAT's range is left as it is, for strict mode to refuse.

Converters are built once per table and column set from the column types read with the table
(``information_schema.COLUMNS.COLUMN_TYPE``), only for the columns that need one.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Callable

from sqlalchemy import delete, text, tuple_, update
from sqlalchemy.engine import Connection

from applier.mysql_values import float32, format_time
from applier.columnar.apply import python_values
from applier.columnar.plan import python_rows
from applier.sinks.adapt import acts_on
from applier.sinks.base import Sink
from applier.sinks import mysql_arrow
from applier.sinks.mysql_load import ALLOWED_KEY, LoadDataUpserter, guarded
from applier.sinks.table import TableMeta, build_meta, missing_table
from applier.modes import (
    COMMIT_TS, DELETED, DELETED_AT, VALID_FROM, VALID_TO, HistoryPlan, SoftDeletePlan, TableShape, UniqueIndex,
    adapted_keys, prev_commit_ts_column,
)
from applier.sinks.plan import group_columns


class MySQLSink(Sink):
    def __init__(self, batch_rows: int = 5000, *, transient: Callable[[BaseException], bool] | None = None,
                 stage_engine: str | None = None, **kw: Any) -> None:
        """``transient`` is the dialect's judgement of a statement error (a fault that passes, which the LOAD DATA
        path raises rather than falls back on); ``stage_engine`` the dialect's engine for that path's stage."""
        super().__init__(batch_rows, **kw)
        self._sql: dict[tuple[Any, ...], str] = {}
        self.load_data = LoadDataUpserter(transient, stage_engine=stage_engine)

    def upsert_rows(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
        if self.load_data.usable(conn, len(rows)) and self.load_data.upsert(conn, meta, cols, rows):
            return
        self._execute_upserts(conn, meta, cols, rows)

    def arrow_refusal(self, conn: Connection, meta: TableMeta, table: Any, kinds: dict[str, str]) -> str | None:
        """With LOAD DATA on this connection, the lane's upserts are written as its file by Arrow
        (applier/sinks/mysql_arrow.py says when)."""
        if not self.load_data.usable(conn, table.num_rows):
            return "no LOAD DATA on this connection, or fewer rows than it takes"
        return mysql_arrow.refusal(meta, table, kinds, self._adapters.row(meta, tuple(table.column_names)))

    def upsert_arrow(self, conn: Connection, meta: TableMeta, table: Any, kinds: dict[str, str]) -> None:
        """In chunks of ``batch_rows`` as :meth:`upsert_rows`: each through LOAD DATA with the file Arrow makes,
        or, where that path does not take the chunk, through executemany with its Python rows."""
        cols = tuple(table.column_names)
        for lo in range(0, table.num_rows, self.batch_rows):
            part = table.slice(lo, self.batch_rows)
            n = part.num_rows
            if self.load_data.usable(conn, n) and self.load_data.load(
                    conn, meta, cols, n, lambda column_kinds: mysql_arrow.encode_arrow(column_kinds, part, kinds)):
                continue
            rows = python_rows(part, python_values(kinds))  # as the lane makes them
            self._execute_upserts(conn, meta, cols, self.adapt_rows(meta, cols, rows))

    def _execute_upserts(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...],
                         rows: list[dict[str, Any]]) -> None:
        ck = (id(meta.table), cols)
        sql = self._sql.get(ck)
        if sql is None:
            sql = self._sql[ck] = self._upsert_sql(conn, meta, cols)
        conn.exec_driver_sql(sql, [tuple(r[c] for c in cols) for r in rows])

    @staticmethod
    def _upsert_sql(conn: Connection, meta: TableMeta, cols: tuple[str, ...]) -> str:
        """``INSERT ... VALUES (%s, ...) ON DUPLICATE KEY UPDATE c = VALUES(c)``, identifiers quoted by
        SQLAlchemy's preparer. Written out rather than compiled from ``insert().on_duplicate_key_update()``
        because (a) SQLAlchemy doubles ``%`` twice inside ``VALUES()`` for names holding ``%``, and (b) only
        this exact shape is rewritten by PyMySQL's executemany into multi-row INSERTs; MySQL 8's row-alias
        form would fall back to one statement per row. ``VALUES()`` works on MariaDB and MySQL 8 (where it is
        deprecated but supported)."""
        prep = conn.dialect.identifier_preparer
        q = [prep.quote(c) for c in cols]
        updates = [f"{qc} = VALUES({qc})" for c, qc in zip(cols, q) if c not in meta.key]
        if not updates:  # key-only table: a no-op update keeps the statement idempotent
            k = prep.quote(meta.key[0])
            updates = [f"{k} = {k}"]
        return (f"INSERT INTO {prep.format_table(meta.table)} ({', '.join(q)}) VALUES ({', '.join(['%s'] * len(cols))}) "
                f"ON DUPLICATE KEY UPDATE {', '.join(updates)}")

    def bulk_insert(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...],
                    rows: list[tuple[Any, ...]]) -> None:
        """A plain ``INSERT ... VALUES`` through executemany, which PyMySQL sends as multi-row statements."""
        ck = ("insert", id(meta.table), cols)
        sql = self._sql.get(ck)
        if sql is None:
            prep = conn.dialect.identifier_preparer
            sql = self._sql[ck] = (f"INSERT INTO {prep.format_table(meta.table)} ({', '.join(map(prep.quote, cols))}) "
                                   f"VALUES ({', '.join(['%s'] * len(cols))})")
        conn.exec_driver_sql(sql, rows)

    def delete_rows(self, conn: Connection, meta: TableMeta, keys: list[tuple[Any, ...]],
                    cols: tuple[str, ...] | None = None) -> None:
        t = meta.table
        cols = cols or meta.key
        if len(cols) == 1:
            cond = t.c[cols[0]].in_([k[0] for k in keys])
        else:
            cond = tuple_(*(t.c[c] for c in cols)).in_(keys)
        conn.execute(delete(t).where(cond))

    def reflect(self, conn: Connection, schema: str, name: str) -> TableMeta:
        """Read the table from information_schema: SQLAlchemy's MySQL reflection parses SHOW CREATE TABLE and
        leaves doubled backticks in names (a column named ``a`b`` comes back as ``a``b``), which would then
        be quoted again and miss the column."""
        db = schema or conn.exec_driver_sql("SELECT DATABASE()").scalar()
        cols = conn.execute(
            text("SELECT COLUMN_NAME, IS_NULLABLE, EXTRA, GENERATION_EXPRESSION, COLUMN_TYPE "
                 "FROM information_schema.COLUMNS "
                 "WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t ORDER BY ORDINAL_POSITION"), {"s": db, "t": name}
        ).all()
        if not cols:
            raise missing_table(schema, name)
        columns = [(c, nullable == "YES", bool(gen) or "GENERATED" in (extra or "").upper())
                   for c, nullable, extra, gen, _ in cols]
        idx: dict[str, list[str]] = {}
        for index_name, col in conn.execute(
            text("SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = :s AND "
                 "TABLE_NAME = :t AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX"), {"s": db, "t": name}
        ):
            idx.setdefault(index_name, []).append(col)
        pk = tuple(idx.pop("PRIMARY", ()))
        uniques = [tuple(v) for _, v in sorted(idx.items())]
        meta = build_meta(schema, name, columns, pk, uniques)
        meta.types = {c: _text(ctype) for c, _, _, _, ctype in cols}
        return meta

    # ---- session and value adaptation (see the module docstring) ----------------------------------------

    def begin(self, conn: Connection) -> None:
        """Prepare the session once per DBAPI connection (the pool's ``info`` lives as long as the connection
        and is cleared when it is replaced). A connection made for LOAD DATA (:mod:`applier.sinks.mysql_load`)
        also reads whether the server allows ``local_infile``, in the same statement."""
        info = conn.connection.info
        if info.get(_SESSION_READY):
            return
        if guarded(conn) is not None:
            row = conn.exec_driver_sql("SELECT @@SESSION.sql_mode, @@GLOBAL.local_infile").one()
            mode = row[0] or ""
            info[ALLOWED_KEY] = bool(int(row[1] or 0))
        else:
            mode = conn.exec_driver_sql("SELECT @@SESSION.sql_mode").scalar() or ""
        kept = session_sql_mode(mode)
        if kept != mode:
            conn.exec_driver_sql("SET SESSION time_zone = '+00:00', SESSION sql_mode = %s", (kept,))
        else:
            conn.exec_driver_sql("SET SESSION time_zone = '+00:00'")
        info[_SESSION_READY] = True

    def own_schema(self, conn: Connection) -> str:
        return str(conn.exec_driver_sql("SELECT DATABASE()").scalar() or "")

    def schema_exists(self, conn: Connection, schema: str) -> bool:
        return conn.execute(text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :s"),
                            {"s": schema}).first() is not None

    def prepare_schema(self, conn: Connection, schema: str) -> None:
        if schema:
            quoted = conn.dialect.identifier_preparer.quote_identifier(schema)
            conn.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS {quoted}")

    # ---- keyless tables ----------------------------------------------------------------------------------
    # Sink.write_keyless applies a table without a key change by change; these are its two statements:
    # ``DELETE FROM t WHERE c1 <=> %s AND ... LIMIT 1`` and ``UPDATE t SET c = %s, ... WHERE ... LIMIT 1``,
    # written out like _upsert_sql (identifiers quoted by SQLAlchemy's preparer, every value a bound parameter).
    # How a column is compared follows its COLUMN_TYPE (keyless_comparison, keyless_match_value):
    # * character columns (CHAR, VARCHAR, *TEXT; MariaDB's JSON is a LONGTEXT) byte for byte as utf8mb4: their
    #   collation may hold 'a' = 'A' = 'a ' (case- or accent-insensitive, PAD SPACE), and a table without a key
    #   may hold rows that differ only so; CHAR values lose trailing spaces on the way in, so the old value does
    #   too before it is compared;
    # * MySQL's JSON (a normalised binary document): as JSON, CAST(%s AS JSON);
    # * FLOAT: the value rounded to single precision first, which is what the column stored (a FLOAT column holding
    #   0.1 is not equal to the double 0.1);
    # * everything else: ``<=>`` with the value as adapted for writing.
    # An UPDATE's rowcount counts found rows (SQLAlchemy's MySQL dialects set CLIENT.FOUND_ROWS), so an update
    # that sets the values the row already holds still counts as one.

    def keyless_delete(self, conn: Connection, meta: TableMeta, before: dict[str, Any]) -> int:
        cols = tuple(before)
        sql = self.keyless_statement("mysql-delete", meta, cols, lambda: keyless_sql(conn, meta, (), cols))
        return int(conn.exec_driver_sql(sql, self._keyless_old(meta, cols, before)).rowcount)

    def keyless_update(self, conn: Connection, meta: TableMeta, before: dict[str, Any], after: dict[str, Any]) -> int:
        cols, sets = tuple(before), tuple(after)
        sql = self.keyless_statement("mysql-update", meta, (sets, cols), lambda: keyless_sql(conn, meta, sets, cols))
        params = tuple(after[c] for c in sets) + self._keyless_old(meta, cols, before)
        return int(conn.exec_driver_sql(sql, params).rowcount)

    def _keyless_old(self, meta: TableMeta, cols: tuple[str, ...], before: dict[str, Any]) -> tuple[Any, ...]:
        """The old row's values as the WHERE clause binds them (see keyless_match_value)."""
        fixes = self.keyless_statement("mysql-match-values", meta, cols,
                                       lambda: tuple(keyless_match_value(meta.types.get(c)) for c in cols))
        return tuple(v if f is None or v is None else f(v) for f, v in zip(fixes, (before[c] for c in cols)))

    # ---- history and soft-delete modes -------------------------------------------------------------------
    # The writes of route modes history and soft_delete (applier.modes plans them; applier.apply checks the table
    # with mode_shape first). Identifiers are quoted by SQLAlchemy's preparer, every value is a bound parameter.
    # * history: a version is inserted with ``INSERT ... ON DUPLICATE KEY UPDATE <key> = <key>`` (a replayed
    #   version is left as it is; never INSERT IGNORE, which would turn a value the column cannot hold into a
    #   warning); the versions it follows are closed through a temporary table of (key, commit ts, previous commit
    #   ts, valid from) joined to the table in one UPDATE (a temporary table neither commits the transaction nor
    #   outlives the statement group: it is dropped at once);
    # * soft delete: removed-and-rewritten keys are deleted as in replica mode, rows that end deleted get
    #   ``UPDATE ... SET _deleted = true, _deleted_at = %s WHERE key IN (...)`` (one statement per delete time),
    #   and the final rows are upserted as in replica mode, with _deleted = false and _deleted_at = NULL.

    def mode_shape(self, conn: Connection, schema: str, name: str) -> TableShape:
        """The table's columns, primary key and other unique keys, from information_schema (as :meth:`reflect`)."""
        db = schema or conn.exec_driver_sql("SELECT DATABASE()").scalar()
        cols = conn.execute(
            text("SELECT COLUMN_NAME, IS_NULLABLE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = :s AND "
                 "TABLE_NAME = :t ORDER BY ORDINAL_POSITION"), {"s": db, "t": name}).all()
        if not cols:
            raise missing_table(schema, name)
        idx: dict[str, list[tuple[str | None, int | None]]] = {}
        for index_name, col, sub_part in conn.execute(
            text("SELECT INDEX_NAME, COLUMN_NAME, SUB_PART FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = :s "
                 "AND TABLE_NAME = :t AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX"), {"s": db, "t": name}
        ):
            idx.setdefault(_text(index_name), []).append((None if col is None else _text(col),
                                                          None if sub_part is None else int(sub_part)))
        pk = tuple(c for c, _ in idx.pop("PRIMARY", ()) if c is not None)
        uniques = tuple(UniqueIndex(n, tuple(c for c, _ in parts), prefixes=tuple(p for _, p in parts))
                        for n, parts in sorted(idx.items()))
        return TableShape(schema, name, tuple(_text(c) for c, _ in cols),
                          frozenset(_text(c) for c, nullable in cols if nullable == "NO"), pk, None, uniques)

    def write_history(self, conn: Connection, meta: TableMeta, plan: HistoryPlan) -> None:
        key = plan.key
        for lo in range(0, len(plan.closes), self.batch_rows):
            part = plan.closes[lo:lo + self.batch_rows]
            keys = adapted_keys(self.adapt_rows, meta, key, [c[0] for c in part])
            self._close_versions(conn, meta, key, [(*k, ts, prev, vf) for k, (_, ts, prev, vf) in zip(keys, part)])
        for cols, rows in group_columns(plan.versions).items():
            sql = self._mode_sql(conn, meta, "version", cols)
            for lo in range(0, len(rows), self.batch_rows):
                chunk = self.adapt_rows(meta, cols, rows[lo:lo + self.batch_rows])
                conn.exec_driver_sql(sql, [tuple(r[c] for c in cols) for r in chunk])

    def _close_versions(self, conn: Connection, meta: TableMeta, key: tuple[str, ...],
                        rows: list[tuple[Any, ...]]) -> None:
        """Set ``_valid_to`` of each open version that a staged (key, commit ts, previous commit ts, valid from)
        follows: see :class:`applier.modes.HistoryPlan`."""
        prep = conn.dialect.identifier_preparer
        q = prep.quote_identifier
        prev = prev_commit_ts_column(key)
        stage = q(f"applier_close_{id(meta.table):x}")
        stage_cols = key + (COMMIT_TS, prev, VALID_FROM)
        conn.exec_driver_sql(f"DROP TEMPORARY TABLE IF EXISTS {stage}")
        select = ", ".join([*(q(c) for c in key), q(COMMIT_TS), f"{q(COMMIT_TS)} AS {q(prev)}", q(VALID_FROM)])
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE {stage} AS SELECT {select} FROM {prep.format_table(meta.table)} "
                             "LIMIT 0")
        try:
            conn.exec_driver_sql(f"INSERT INTO {stage} ({', '.join(map(q, stage_cols))}) "
                                 f"VALUES ({', '.join(['%s'] * len(stage_cols))})", rows)
            on = " AND ".join(f"o.{q(c)} = s.{q(c)}" for c in key)
            conn.exec_driver_sql(
                f"UPDATE {prep.format_table(meta.table)} AS o JOIN {stage} AS s ON {on} "
                f"SET o.{q(VALID_TO)} = s.{q(VALID_FROM)} WHERE o.{q(VALID_TO)} IS NULL "
                f"AND o.{q(COMMIT_TS)} < s.{q(COMMIT_TS)} AND o.{q(COMMIT_TS)} >= s.{q(prev)}")
        finally:
            conn.exec_driver_sql(f"DROP TEMPORARY TABLE IF EXISTS {stage}")

    def write_soft_delete(self, conn: Connection, meta: TableMeta, plan: SoftDeletePlan) -> None:
        for lo in range(0, len(plan.hard_deletes), self.batch_rows):
            self.delete_rows(conn, meta, self.adapt_keys(meta, plan.hard_deletes[lo:lo + self.batch_rows]))
        by_time: dict[Any, list[tuple[Any, ...]]] = {}
        for k, when in plan.soft_deletes:
            by_time.setdefault(when, []).append(k)
        t = meta.table
        for when, keys in by_time.items():
            for lo in range(0, len(keys), self.batch_rows):
                chunk = self.adapt_keys(meta, keys[lo:lo + self.batch_rows])
                if len(meta.key) == 1:
                    cond = t.c[meta.key[0]].in_([k[0] for k in chunk])
                else:
                    cond = tuple_(*(t.c[c] for c in meta.key)).in_(chunk)
                conn.execute(update(t).where(cond).values({DELETED: True, DELETED_AT: when}))
        for cols, rows in group_columns(plan.upserts).items():
            for lo in range(0, len(rows), self.batch_rows):
                self.upsert_rows(conn, meta, cols, self.adapt_rows(meta, cols, rows[lo:lo + self.batch_rows]))

    def _mode_sql(self, conn: Connection, meta: TableMeta, kind: str, cols: tuple[str, ...]) -> str:
        """``INSERT ... VALUES (%s, ...) ON DUPLICATE KEY UPDATE <first key column> = itself``: a version already in
        the table stays as it is. The shape PyMySQL's executemany sends as multi-row INSERTs (see _upsert_sql)."""
        ck = (kind, id(meta.table), cols)
        sql = self._sql.get(ck)
        if sql is None:
            prep = conn.dialect.identifier_preparer
            k = prep.quote(meta.key[0])
            sql = self._sql[ck] = (
                f"INSERT INTO {prep.format_table(meta.table)} ({', '.join(map(prep.quote, cols))}) "
                f"VALUES ({', '.join(['%s'] * len(cols))}) ON DUPLICATE KEY UPDATE {k} = {k}")
        return sql

# ---------------------------------------------------------------------------------------------------------
# Session settings and value converters (pure; unit-tested in tests/unit/test_value_adapt.py)

_SESSION_READY = "applier_mysql_session"
_ZERO_DATE_MODES = frozenset({"NO_ZERO_DATE", "NO_ZERO_IN_DATE"})
_UTC = _dt.timezone.utc
_EPOCH = _dt.datetime(1970, 1, 1)
ZERO_TIMESTAMP = "0000-00-00 00:00:00"

def _text(v: Any) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


def session_sql_mode(mode: str) -> str:
    """The session sql_mode the writer uses: the server's, minus the modes that refuse zero dates."""
    parts = [m for m in mode.split(",") if m and m.upper() not in _ZERO_DATE_MODES]
    return ",".join(parts)


def mysql_converter(column_type: str | None) -> Callable[[Any], Any] | None:
    """The converter for a column of this ``COLUMN_TYPE`` ("timestamp(6)", "time(3)", ...), or None."""
    if not column_type:
        return None
    t = column_type.lower()
    if t.startswith("timestamp"):
        return _timestamp
    if t.startswith("time"):
        return _time
    if _base_type(t) == "float":
        return _single_precision
    return None


def _timestamp(v: Any) -> Any:
    if type(v) is _dt.datetime:
        if v.tzinfo is not None:
            v = v.astimezone(_UTC).replace(tzinfo=None)
        if v == _EPOCH:
            return ZERO_TIMESTAMP  # the zero TIMESTAMP: MySQL stores both as 0 and refuses the 1970 literal
    return v


def _time(v: Any) -> Any:
    if type(v) is _dt.timedelta:
        return format_time(v)
    return v


# ---------------------------------------------------------------------------------------------------------
# Keyless tables: statements and comparisons (pure; see MySQLSink's keyless section)

_CHAR_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext"})


def _base_type(column_type: str | None) -> str:
    """"varchar(16)" -> "varchar", "float unsigned" -> "float", "json" -> "json"."""
    return (column_type or "").lower().split("(", 1)[0].split(" ", 1)[0]


def keyless_comparison(quoted: str, column_type: str | None) -> str:
    """The WHERE term that compares the column ``quoted`` (already quoted) with one bound value, NULL-safe."""
    base = _base_type(column_type)
    if base in _CHAR_TYPES:
        return f"CAST(CONVERT({quoted} USING utf8mb4) AS BINARY) <=> CAST(CONVERT(%s USING utf8mb4) AS BINARY)"
    if base == "json":
        return f"{quoted} <=> CAST(%s AS JSON)"
    return f"{quoted} <=> %s"


def keyless_sql(conn: Connection, meta: TableMeta, sets: tuple[str, ...], cols: tuple[str, ...]) -> str:
    """``UPDATE t SET sets... WHERE cols... LIMIT 1`` (``sets`` empty: ``DELETE FROM t WHERE ... LIMIT 1``)."""
    prep = conn.dialect.identifier_preparer
    where = " AND ".join(keyless_comparison(prep.quote(c), meta.types.get(c)) for c in cols)
    table = prep.format_table(meta.table)
    if sets:
        assign = ", ".join(f"{prep.quote(c)} = %s" for c in sets)
        return f"UPDATE {table} SET {assign} WHERE {where} LIMIT 1"
    return f"DELETE FROM {table} WHERE {where} LIMIT 1"


def keyless_match_value(column_type: str | None) -> Callable[[Any], Any] | None:
    """What an old value goes through before it is compared with a column of this type, or None."""
    base = _base_type(column_type)
    if base == "float":
        return _single_precision
    if base == "char":
        return _char_value
    return None


def _single_precision(v: Any) -> Any:
    """A float as the FLOAT column stores it: the nearest single-precision value, as its exact double. Used both
    to write (the server range-checks the double it parses, so float32's largest value must arrive exact, see
    the module docstring) and to compare a keyless table's old row (a FLOAT holding 0.1 is not the double 0.1)."""
    if type(v) is float:
        try:
            return float32(v)
        except OverflowError:  # beyond FLOAT's range: the column cannot hold it; strict mode refuses it as sent
            return v
    return v


acts_on(_single_precision, float)  # ints (and anything else) go as they are


def _char_value(v: Any) -> Any:
    """A CHAR value as the column returns it: MySQL drops trailing spaces of CHAR values."""
    return v.rstrip(" ") if type(v) is str else v
