"""PostgreSQL writer.

Upserts COPY the batch into a temporary table and merge it with one
``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE`` (measured 140-180k rows/s here, against ~8.5k rows/s for
SQLAlchemy multi-row VALUES); deletes COPY the keys and run one ``DELETE ... USING``. The COPY is binary when
every column type and every value of the batch allow it (:func:`binary_copy_types`: half the driver CPU of a
text COPY and a faster load on the server), text otherwise; both store the same values. The staging tables are
``ON COMMIT DELETE ROWS`` temporaries kept for the session and named by a digest of the target's columns and their
catalog types, so a DDL that changes the shape gets a new one (see :meth:`PostgresSink._mode_stage`). All identifiers are quoted by SQLAlchemy's identifier preparer. PostgreSQL DDL is
transactional, so a DDL commits together with its history row and the progress.

Value adaptation (:func:`pg_converter`, picked by ``applier.dialect.PostgresDialect``, applied by
applier/sinks/adapt.py; the rules are tabled in ``docs/value-rules.md``): the event model carries MySQL values, and a few have no PostgreSQL form as they are.
Per target column type, read once per table from ``pg_catalog`` (``format_type`` plus the column comment that
``applier/ddl/postgres.py`` writes for ENUM/SET), one converter is built and cached per table and column set;
columns whose values pass unchanged get none, so a table of plain numbers and strings costs nothing per row.

* ENUM/SET ordinals and bitmasks (Open Protocol, Canal-JSON, Simple) -> the member names, from the column's
  ``applier:enum(...)`` / ``applier:set(...)`` comment; ordinal 0 is MySQL's '' error value. Names (Debezium,
  Avro) pass. An integer for a ``text`` column without such a comment is refused with an ApplyError telling to
  replicate the CREATE TABLE (or to write the comment by hand) - storing "2" would silently corrupt the column.
  (That is a check of the first non-NULL value of the column in each batch: a protocol sends a column either
  as ordinals or as text, never both.)
* BIT integers -> bit strings of the column's width (``bit varying(n)``: MySQL's BIT(n) always has n bits).
* TIMESTAMP: naive datetimes are UTC instants (TiCDC sends TIMESTAMP in the changefeed's time zone, UTC by
  default; the applier assumes UTC) -> aware datetimes, so the session TimeZone cannot shift them.
* Zero dates ('0000-00-00', '2020-00-15', '0000-00-00 00:00:00', which PostgreSQL cannot hold) -> '-infinity'
  for date, timestamp and timestamptz columns: it keeps NOT NULL columns writable and sorts before every real
  date like MySQL's zero date does; which zero date it was is lost. A TIMESTAMP of exactly 1970-01-01 00:00:00
  UTC is MySQL's zero TIMESTAMP (MySQL's range starts one second later; Debezium sends the zero TIMESTAMP so)
  and becomes '-infinity' too.
* TIME (timedelta) -> MySQL's own text ('-838:59:59', '100:00:00.5'), which PostgreSQL stores as one signed
  time span ('-35 days +01:00:01' is what psycopg would send for the same timedelta).
* FLOAT into ``real``: no converter. The float32's shortest repr (``3.4028235e+38``, ``1e-45``) goes as text and
  PostgreSQL's float4 input (``strtof``, PostgreSQL 12+) rounds it to that same float32, float32's largest value
  and subnormals included; negative zero stays negative. (MySQL/MariaDB need the exact double: see
  applier/sinks/mysql.py.) ``tests/e2e/test_float_limits.py`` holds both targets to it.

Rows are converted in place (they are the batch plan's own dicts); keys are rebuilt. Every converter returns a
value already in the target's form unchanged, so adapting twice is harmless.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import operator
import re
from decimal import Decimal
from typing import Any, Callable, Sequence

from sqlalchemy import Column, MetaData, Table, and_, bindparam, cast, delete, select, text, update

from sqlalchemy.dialects.postgresql import JSONB, REAL, insert as pg_insert
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, NoSuchTableError
from sqlalchemy.types import NullType

from psycopg import sql as psql

from applier.mysql_values import format_time, is_zero_date
from applier.ddl.pg_types import TYPE_COMMENT_PREFIX, parse_type_comment
from applier.sinks import postgres_csv
from applier.sinks.adapt import ValueRefused, acts_on
from applier.sinks.base import Sink
from applier.sinks.table import ApplyError, TableMeta, missing_table, reflect_table, shown
from applier.modes import (
    COMMIT_TS, DELETED, DELETED_AT, VALID_FROM, VALID_TO, HistoryPlan, SoftDeletePlan, TableShape, UniqueIndex,
    adapted_keys, prev_commit_ts_column,
)
from applier.sinks.plan import group_columns


# Staging tables one session keeps (least recently used dropped first): 2-3 per replicated table and shape.
SESSION_STAGES = 96


class PostgresSink(Sink):
    def __init__(self, batch_rows: int = 5000, **kw: Any) -> None:
        super().__init__(batch_rows * 4, **kw)  # COPY batches can be larger than statement batches
        self._stmts: dict[tuple[Any, ...], Any] = {}

    def begin(self, conn: Connection) -> None:
        conn.info.pop("applier_stages", None)  # staging tables used in this transaction (emptied at commit)

    def savepoint_state(self, conn: Connection) -> Any:
        return frozenset(conn.info.get("applier_stages", ()))

    def rolled_back_to(self, conn: Connection, state: Any) -> None:
        conn.info["applier_stages"] = set(state)  # staging tables created after the savepoint are gone

    def _stage(self, conn: Connection, meta: TableMeta, kind: str, cols: tuple[str, ...]) -> tuple[Table, str]:
        """The transaction's staging table of ``kind`` for these columns of the target (see :meth:`_mode_stage`),
        and a Table of it for SQLAlchemy statements."""
        name = self._mode_stage(conn, meta, kind, [(c, c) for c in cols])
        return Table(name, MetaData(), *(Column(c, NullType) for c in cols)), name

    def _copy(self, conn: Connection, name: str | tuple[str, ...], cols: tuple[str, ...],
              rows: list[tuple[Any, ...]], oids: list[int] | None = None) -> None:
        """COPY ``rows`` into the staging table (or the table ``(schema, name)``): in binary with ``oids`` (see
        :func:`binary_copy_types`), else in text."""
        # COPY goes to psycopg directly (no placeholder processing): quote with psycopg's own sql.Identifier
        stmt = psql.SQL("COPY {} ({}) FROM STDIN" + (" (FORMAT BINARY)" if oids else "")).format(
            psql.Identifier(*((name,) if isinstance(name, str) else name)),
            psql.SQL(", ").join(psql.Identifier(c) for c in cols))
        raw = conn.connection.dbapi_connection
        with raw.cursor() as cur:
            with cur.copy(stmt) as cp:
                if oids:
                    cp.set_types(oids)
                write_row = cp.write_row
                for r in rows:
                    write_row(r)

    def upsert_rows(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
        stage, name = self._stage(conn, meta, "up", cols)
        tuples = list(map(_tuple_getter(cols), rows))
        with self.timer.span("write.copy"):
            self._copy(conn, name, cols, tuples, binary_copy_types(meta, cols, tuples))
        conn.execute(self._merge(meta, stage, cols))

    def arrow_refusal(self, conn: Connection, meta: TableMeta, table: Any, kinds: dict[str, str]) -> str | None:
        """Why :meth:`upsert_arrow` would not store ``table`` exactly as :meth:`upsert_rows` stores its Python
        rows (applier/sinks/postgres_csv.py says when), or None."""
        if not table.num_rows:
            return "no rows"
        encoding = conn.connection.dbapi_connection.info.encoding
        if encoding != "utf-8":
            return f"the connection's client encoding is {encoding}, not UTF-8"
        return postgres_csv.refusal(meta, table, kinds, self._adapters.row(meta, tuple(table.column_names)))

    def upsert_arrow(self, conn: Connection, meta: TableMeta, table: Any, kinds: dict[str, str]) -> None:
        """The columnar lane's upserts (an Arrow table :meth:`takes_arrow` took), COPYed as CSV into the staging
        table and merged, in chunks of ``batch_rows`` as :meth:`upsert_rows` does."""
        cols = tuple(table.column_names)
        stmt = psql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)")
        raw = conn.connection.dbapi_connection
        for lo in range(0, table.num_rows, self.batch_rows):
            stage, name = self._stage(conn, meta, "up", cols)
            with self.timer.span("write.copy"):
                data = postgres_csv.csv_data(table.slice(lo, self.batch_rows))
                with raw.cursor() as cur:
                    with cur.copy(stmt.format(psql.Identifier(name),
                                              psql.SQL(", ").join(psql.Identifier(c) for c in cols))) as cp:
                        cp.write(data)
            conn.execute(self._merge(meta, stage, cols))

    def _merge(self, meta: TableMeta, stage: Table, cols: tuple[str, ...]) -> Any:
        """``INSERT INTO target (cols) SELECT cols FROM stage ON CONFLICT (key) DO UPDATE`` (cached per shape)."""
        ck = ("up", id(meta.table), cols)
        stmt = self._stmts.get(ck)
        if stmt is None:
            ins = pg_insert(meta.table).from_select(list(cols), select(*(stage.c[c] for c in cols)))
            updates = {c: ins.excluded[c] for c in cols if c not in meta.key}
            stmt = self._stmts[ck] = (
                ins.on_conflict_do_update(index_elements=list(meta.key), set_=updates) if updates
                else ins.on_conflict_do_nothing(index_elements=list(meta.key)))
        return stmt

    def bulk_insert(self, conn: Connection, meta: TableMeta, cols: tuple[str, ...],
                    rows: list[tuple[Any, ...]]) -> None:
        """COPY straight into the table (binary where :func:`binary_copy_types` allows it)."""
        target = (meta.schema, meta.name) if meta.schema else (meta.name,)
        with self.timer.span("write.copy"):
            self._copy(conn, target, cols, rows, binary_copy_types(meta, cols, rows))

    def delete_rows(self, conn: Connection, meta: TableMeta, keys: list[tuple[Any, ...]],
                    cols: tuple[str, ...] | None = None) -> None:
        cols = cols or meta.key
        stage, name = self._stage(conn, meta, "del", cols)
        with self.timer.span("write.copy"):
            self._copy(conn, name, cols, keys, binary_copy_types(meta, cols, keys))
        ck = ("del", id(meta.table), cols)
        stmt = self._stmts.get(ck)
        if stmt is None:
            t = meta.table
            stmt = self._stmts[ck] = delete(t).where(and_(*(t.c[c] == stage.c[c] for c in cols)))
        conn.execute(stmt)

    def own_schema(self, conn: Connection) -> str:
        return str(conn.exec_driver_sql("SELECT current_schema()").scalar() or "")

    def schema_exists(self, conn: Connection, schema: str) -> bool:
        return conn.execute(text("SELECT 1 FROM pg_namespace WHERE nspname = :s"), {"s": schema}).first() is not None

    def prepare_schema(self, conn: Connection, schema: str) -> None:
        """``CREATE SCHEMA IF NOT EXISTS``, safe against another transaction making the same schema at the same
        time (two apply streams each making a table of a new schema): PostgreSQL's IF NOT EXISTS does not see an
        uncommitted schema, waits for it and then fails on ``pg_namespace``'s unique index. In a savepoint, so that
        this failure, once the other's schema is there, leaves the transaction usable."""
        if not schema:
            return
        quoted = conn.dialect.identifier_preparer.quote_identifier(schema)
        try:
            with conn.begin_nested():
                conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quoted}")
        except IntegrityError:
            if not self.schema_exists(conn, schema):
                raise

    # ---- catalog types and value adaptation (see the module docstring) ----------------------------------

    def reflect(self, conn: Connection, schema: str, name: str) -> TableMeta:
        meta = reflect_table(conn, schema, name)
        meta.types, meta.type_oids = catalog(conn, schema, name)
        return meta

    # ---- keyless tables ----------------------------------------------------------------------------------
    # Sink.write_keyless applies a table without a key change by change; these are its two statements, one row
    # found by its physical address: ``DELETE FROM t WHERE ctid = (SELECT ctid FROM t AS applier_row WHERE
    # c1 IS NOT DISTINCT FROM %(b0)s AND ... LIMIT 1)``, and the same for ``UPDATE t SET c = %(a0)s, ...``.
    # SQLAlchemy Core builds them (every identifier quoted, every value bound), once per table and column set.
    # Values are bound as they are adapted for writing; the server casts an untyped (text) value to the column's
    # type. Two types need more (keyless_equal): ``real`` is compared with the value cast to real (a float4
    # column holding 0.1 is not equal to the float8 0.1), ``json`` has no equality and is compared as jsonb
    # (the translator makes MySQL's JSON jsonb, which has one). Types without any equality (xml, geometric
    # types) are refused with the table and column named.

    def keyless_delete(self, conn: Connection, meta: TableMeta, before: dict[str, Any]) -> int:
        cols = tuple(before)
        stmt = self.keyless_statement("pg-delete", meta, cols, lambda: keyless_delete_stmt(meta, cols))
        return int(conn.execute(stmt, keyless_binds(before, None)).rowcount)

    def keyless_update(self, conn: Connection, meta: TableMeta, before: dict[str, Any], after: dict[str, Any]) -> int:
        cols, sets = tuple(before), tuple(after)
        stmt = self.keyless_statement("pg-update", meta, (sets, cols), lambda: keyless_update_stmt(meta, sets, cols))
        return int(conn.execute(stmt, keyless_binds(before, after)).rowcount)

    # ---- history and soft-delete modes -------------------------------------------------------------------
    # The writes of route modes history and soft_delete (applier.modes plans them; applier.apply checks the table
    # with mode_shape first), through the session's staging tables filled by COPY, as the replica writes are:
    # * history: versions are COPYed and merged with ``INSERT ... SELECT ... ON CONFLICT (key, _commit_ts) DO
    #   NOTHING`` (a replayed version is left as it is); the versions they follow are closed by one
    #   ``UPDATE ... FROM`` a staged (key, commit ts, previous commit ts, valid from);
    # * soft delete: removed-and-rewritten keys are deleted as in replica mode, rows that end deleted get
    #   ``UPDATE ... SET _deleted = true, _deleted_at = s._deleted_at FROM`` a staged (key, deleted at), and the
    #   final rows are upserted as in replica mode, with _deleted = false and _deleted_at = NULL.

    def mode_shape(self, conn: Connection, schema: str, name: str) -> TableShape:
        """The table's columns, primary key (with its constraint name) and other unique keys (UNIQUE constraints
        and unique indexes), from SQLAlchemy's PostgreSQL inspector."""
        insp = inspect(conn)
        sch = schema or None
        try:
            cols = insp.get_columns(name, schema=sch)
        except NoSuchTableError:
            raise missing_table(schema, name) from None
        pk = insp.get_pk_constraint(name, schema=sch)
        uniques = [UniqueIndex(u["name"], tuple(u["column_names"]), constraint=True)
                   for u in insp.get_unique_constraints(name, schema=sch)]
        for ix in insp.get_indexes(name, schema=sch):
            if ix.get("unique") and not ix.get("duplicates_constraint"):
                uniques.append(UniqueIndex(ix["name"], tuple(ix.get("column_names") or ())))
        return TableShape(schema, name, tuple(c["name"] for c in cols),
                          frozenset(c["name"] for c in cols if not c["nullable"]),
                          tuple(pk.get("constrained_columns") or ()), pk.get("name"),
                          tuple(sorted(uniques, key=lambda u: u.name)))

    def write_history(self, conn: Connection, meta: TableMeta, plan: HistoryPlan) -> None:
        key = plan.key
        if plan.closes:
            prev = prev_commit_ts_column(key)
            name = self._mode_stage(conn, meta, "hclose", [*((c, c) for c in key), (COMMIT_TS, COMMIT_TS),
                                                           (COMMIT_TS, prev), (VALID_FROM, VALID_FROM)])
            keys = adapted_keys(self.adapt_rows, meta, key, [c[0] for c in plan.closes])
            with self.timer.span("write.copy"):
                self._copy(conn, name, key + (COMMIT_TS, prev, VALID_FROM),
                           [(*k, ts, before, vf) for k, (_, ts, before, vf) in zip(keys, plan.closes)])
            prep = conn.dialect.identifier_preparer
            q = prep.quote_identifier
            on = " AND ".join(f"o.{q(c)} = s.{q(c)}" for c in key)
            conn.exec_driver_sql(
                f"UPDATE {prep.format_table(meta.table)} AS o SET {q(VALID_TO)} = s.{q(VALID_FROM)} "
                f"FROM {q(name)} AS s WHERE {on} AND o.{q(VALID_TO)} IS NULL AND o.{q(COMMIT_TS)} < s.{q(COMMIT_TS)} "
                f"AND o.{q(COMMIT_TS)} >= s.{q(prev)}")
        for cols, rows in group_columns(plan.versions).items():
            for lo in range(0, len(rows), self.batch_rows):
                stage, name = self._stage(conn, meta, "hver", cols)
                tuples = list(map(_tuple_getter(cols), self.adapt_rows(meta, cols, rows[lo:lo + self.batch_rows])))
                with self.timer.span("write.copy"):
                    self._copy(conn, name, cols, tuples, binary_copy_types(meta, cols, tuples))
                ck = ("hver", id(meta.table), cols)
                stmt = self._stmts.get(ck)
                if stmt is None:
                    stmt = self._stmts[ck] = pg_insert(meta.table).from_select(
                        list(cols), select(*(stage.c[c] for c in cols))).on_conflict_do_nothing(
                        index_elements=list(meta.key))
                conn.execute(stmt)

    def write_soft_delete(self, conn: Connection, meta: TableMeta, plan: SoftDeletePlan) -> None:
        for lo in range(0, len(plan.hard_deletes), self.batch_rows):
            self.delete_rows(conn, meta, self.adapt_keys(meta, plan.hard_deletes[lo:lo + self.batch_rows]))
        if plan.soft_deletes:
            cols = tuple(meta.key) + (DELETED_AT,)
            stage, name = self._stage(conn, meta, "sdel", cols)
            keys = self.adapt_keys(meta, [k for k, _ in plan.soft_deletes])
            with self.timer.span("write.copy"):
                self._copy(conn, name, cols, [(*k, when) for k, (_, when) in zip(keys, plan.soft_deletes)])
            ck = ("sdel", id(meta.table))
            stmt = self._stmts.get(ck)
            if stmt is None:
                t = meta.table
                stmt = self._stmts[ck] = (update(t).where(and_(*(t.c[c] == stage.c[c] for c in meta.key)))
                                          .values({DELETED: True, DELETED_AT: stage.c[DELETED_AT]}))
            conn.execute(stmt)
        for cols, rows in group_columns(plan.upserts).items():
            for lo in range(0, len(rows), self.batch_rows):
                self.upsert_rows(conn, meta, cols, self.adapt_rows(meta, cols, rows[lo:lo + self.batch_rows]))

    def _mode_stage(self, conn: Connection, meta: TableMeta, kind: str, select_list: list[tuple[str, str]]) -> str:
        """A temporary table shaped like the target's columns, as ``(source column, name)`` pairs (one column may
        be staged twice under two names); its name.

        It lives as long as the session and is emptied at every commit (``ON COMMIT DELETE ROWS``): creating it
        in every transaction, as ``ON COMMIT DROP`` did, cost about 1.3 ms per table and kind, 12 ms of a live
        8-table micro-batch (docs/benchmarks.md, round 4). The name digests the columns *and their catalog
        types*, so after a DDL the new shape gets a new table and never inherits an old column type.
        ``IF NOT EXISTS`` makes a rolled-back creation (or a new connection) harmless without tracking commits;
        used twice in one transaction, it is truncated first. A session keeps at most ``SESSION_STAGES`` of them."""
        spec = ",".join(f"{src}>{alias}:{meta.types.get(src)}" for src, alias in select_list)
        digest = hashlib.sha1(f"{meta.schema}\x00{meta.name}\x00{kind}\x00{spec}".encode()).hexdigest()[:16]
        name = f"applier_{kind}_{digest}"
        prep = conn.dialect.identifier_preparer
        used: set[str] = conn.info.setdefault("applier_stages", set())
        qname = prep.quote(name)
        if name in used:
            conn.exec_driver_sql(f"TRUNCATE {qname}")
            return name
        collist = ", ".join(f"{prep.quote(src)} AS {prep.quote(alias)}" for src, alias in select_list)
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE IF NOT EXISTS {qname} ON COMMIT DELETE ROWS AS SELECT "
                             f"{collist} FROM {prep.format_table(meta.table)} WITH NO DATA")
        used.add(name)
        session: dict[str, None] = conn.info.setdefault("applier_session_stages", {})
        session.pop(name, None)
        session[name] = None  # most recently used last
        while len(session) > SESSION_STAGES:
            old = next(iter(session))
            if old in used:
                break
            del session[old]
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {prep.quote(old)}")
        return name


_CATALOG_TYPES = text(
    "SELECT a.attname, format_type(a.atttypid, a.atttypmod), col_description(a.attrelid, a.attnum), a.atttypid "
    "FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class c ON c.oid = a.attrelid "
    "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = coalesce(CAST(:s AS name), current_schema()) AND c.relname = :t "
    "AND a.attnum > 0 AND NOT a.attisdropped"
)


def catalog(conn: Connection, schema: str | None, name: str) -> tuple[dict[str, str], dict[str, int]]:
    """Per column: its type for the writer (see :func:`catalog_types`) and its type's oid (for binary COPY)."""
    types: dict[str, str] = {}
    oids: dict[str, int] = {}
    for col, typ, comment, oid in conn.execute(_CATALOG_TYPES, {"s": schema or None, "t": name}):
        if typ == "text" and parse_type_comment(comment) is not None:
            typ = comment[len(TYPE_COMMENT_PREFIX):]
        types[col] = typ
        oids[col] = int(oid)
    return types, oids


def catalog_types(conn: Connection, schema: str | None, name: str) -> dict[str, str]:
    """column -> its type for the writer: ``format_type()`` ("bit varying(64)", "timestamp(6) with time zone"),
    except a ``text`` column carrying an ``applier:enum(...)``/``applier:set(...)`` comment, which is given as
    that upstream type ("enum('a','b')")."""
    return catalog(conn, schema, name)[0]


# ---------------------------------------------------------------------------------------------------------
# Binary COPY. psycopg formats a text COPY row at ~3.4 us of driver CPU (11 mixed columns), a binary one at
# ~1.8 us, and the server loads binary rows about twice as fast. Binary is only used where it stores exactly
# what text would: for these column types, and only when every value of the batch has a type whose binary
# form psycopg writes as that same value. Anything else (a zero date turned '-infinity', TIME as MySQL text,
# BIT strings, JSON, real/float4, whose binary form would round differently, types without a binary dumper,
# an integer outside its column's range, which binary would wrap around instead of refusing, a NUL in a
# string, which both refuse but with different errors) sends that batch as text, exactly as before.

_INT2, _INT4, _INT8, _FLOAT8, _NUMERIC = 21, 23, 20, 701, 1700
_TEXT, _VARCHAR, _BYTEA, _DATE, _TIMESTAMP, _TIMESTAMPTZ = 25, 1043, 17, 1082, 1114, 1184

#: oid -> the Python types whose binary COPY form stores the same value as their text form
BINARY_COPY_VALUE_TYPES: dict[int, frozenset[type]] = {
    _INT2: frozenset({int}), _INT4: frozenset({int}), _INT8: frozenset({int}),
    _FLOAT8: frozenset({float}),
    _NUMERIC: frozenset({Decimal, int}),
    _TEXT: frozenset({str}), _VARCHAR: frozenset({str}),
    _BYTEA: frozenset({bytes}),
    _DATE: frozenset({_dt.date}),
    _TIMESTAMP: frozenset({_dt.datetime}), _TIMESTAMPTZ: frozenset({_dt.datetime}),
}
_INT_RANGES = {_INT2: (-(1 << 15), (1 << 15) - 1), _INT4: (-(1 << 31), (1 << 31) - 1),
               _INT8: (-(1 << 63), (1 << 63) - 1)}
_NONE_TYPE = type(None)
_TZINFO = operator.attrgetter("tzinfo")


def binary_copy_types(meta: TableMeta, cols: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[int] | None:
    """The type oids to COPY ``rows`` (tuples in ``cols`` order) in binary, or None when they must go as text
    (see above). Cost: a few C-level passes over each column's values."""
    oids = [meta.type_oids.get(c) for c in cols]
    if not all(o in BINARY_COPY_VALUE_TYPES for o in oids):
        return None
    for oid, values in zip(oids, zip(*rows)):
        kinds = set(map(type, values))
        kinds.discard(_NONE_TYPE)
        if not kinds:
            continue
        if not kinds <= BINARY_COPY_VALUE_TYPES[oid]:
            return None
        if oid in _INT_RANGES:
            lo, hi = _INT_RANGES[oid]
            present = [v for v in values if v is not None]
            if min(present) < lo or max(present) > hi:
                return None
        elif oid == _TEXT or oid == _VARCHAR:
            if "\x00" in "".join(filter(None, values)):
                return None
        elif oid == _TIMESTAMP or oid == _TIMESTAMPTZ:
            zones = set(map(_TZINFO, (v for v in values if v is not None)))
            naive_only = oid == _TIMESTAMP  # timestamp takes naive datetimes only, timestamptz aware ones only
            if (zones != {None}) if naive_only else (None in zones):
                return None
    return oids


def _tuple_getter(cols: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """row dict -> tuple of its ``cols`` values, in C (operator.itemgetter gives a bare value for one name)."""
    if len(cols) == 1:
        c = cols[0]
        return lambda r: (r[c],)
    return operator.itemgetter(*cols)


# ---------------------------------------------------------------------------------------------------------
# Value converters: pure functions of one value, built once per target column type. They return their input
# unchanged when it is already in the target's form (so adapting twice is harmless) and raise ValueRefused
# (turned into an ApplyError naming the table and column) for a value the column cannot take.

NEG_INFINITY = "-infinity"
_UTC = _dt.timezone.utc
_EPOCH = _dt.datetime(1970, 1, 1)
_BIT_TYPE = re.compile(r"bit(?: varying)?(?:\((\d+)\))?")


def pg_converter(typ: str | None) -> Callable[[Any], Any] | None:
    """The converter for a column of (writer) type ``typ`` (see :func:`catalog_types`), or None."""
    if not typ:
        return None
    if typ.startswith(("enum(", "set(")):
        parsed = parse_type_comment(TYPE_COMMENT_PREFIX + typ)
        if parsed is not None:
            kind, members = parsed
            return _enum_converter(members) if kind == "enum" else _set_converter(members)
    if typ == "text":
        return _plain_text
    if typ == "date" or typ.startswith("timestamp") and typ.endswith("without time zone"):
        return _zero_date
    if typ.startswith("timestamp") and typ.endswith("with time zone"):
        return _timestamptz
    if typ.startswith("interval"):
        return _interval
    m = _BIT_TYPE.fullmatch(typ)
    if m is not None:
        return _bit_converter(int(m.group(1)) if m.group(1) else None)
    return None


def _enum_converter(members: tuple[str, ...]) -> Callable[[Any], Any]:
    names = ("",) + members  # ordinal 0 is MySQL's '' (the error value of an invalid ENUM)
    n = len(names)

    def enum_name(v: Any) -> Any:
        if type(v) is int:
            if 0 <= v < n:
                return names[v]
            raise ValueRefused(f"ENUM ordinal {v} is not one of the {n - 1} members recorded in the column "
                               "comment: the comment is stale (apply the upstream ALTER TABLE)")
        return v

    acts_on(enum_name, int)
    return enum_name


def _set_converter(members: tuple[str, ...]) -> Callable[[Any], Any]:
    k = len(members)
    memo: dict[int, str] = {}

    def set_names(v: Any) -> Any:
        if type(v) is int:
            out = memo.get(v)
            if out is None:
                if v < 0 or v >> k:
                    raise ValueRefused(f"SET bitmask {v} has bits beyond the {k} members recorded in the column "
                                       "comment: the comment is stale (apply the upstream ALTER TABLE)")
                out = ",".join(m for i, m in enumerate(members) if v >> i & 1)
                if len(memo) < 4096:
                    memo[v] = out
            return out
        return v

    acts_on(set_names, int)
    return set_names


def _plain_text(v: Any) -> Any:
    """A check, not a conversion: a column is sent either as ordinals or as text, so adapt_rows tests only the
    first non-NULL value of each batch (ints here would be every value of the column)."""
    if type(v) is int:
        raise ValueRefused(
            f"the stream sends integers (ENUM ordinals or SET bitmasks, value {v}) for this text column, and "
            "the member names are unknown: it has no 'applier:enum(...)' / 'applier:set(...)' comment. Replicate "
            "the table's CREATE TABLE through the applier (start the changefeed before the table is created), or "
            "record the members by hand, e.g. COMMENT ON COLUMN <table>.<column> IS 'applier:enum(''a'',''b'')', "
            "then restart"
        )
    return v


_plain_text.check_only = True  # type: ignore[attr-defined]
acts_on(_plain_text, int)  # what it may refuse (applier/sinks/postgres_csv.py reads it)


def _bit_converter(width: int | None) -> Callable[[Any], Any]:
    fmt = f"0{width}b" if width else "b"

    def bits(v: Any) -> Any:
        if isinstance(v, (bytes, bytearray)):
            v = int.from_bytes(v, "big")
        elif not isinstance(v, int):
            return v  # already a bit string
        if v < 0 or (width and v >> width):
            raise ValueRefused(f"BIT value {v} does not fit in {width} bits")
        return format(v, fmt)

    acts_on(bits, bytes, bytearray, int)
    return bits


def _zero_date(v: Any) -> Any:
    if type(v) is str and is_zero_date(v):
        return NEG_INFINITY
    return v


def _timestamptz(v: Any) -> Any:
    if type(v) is _dt.datetime:
        if v.tzinfo is not None:
            return v
        if v == _EPOCH:
            return NEG_INFINITY  # MySQL's zero TIMESTAMP (its range starts at 1970-01-01 00:00:01 UTC)
        # (the positional constructor is about twice as fast as v.replace(tzinfo=...))
        return _dt.datetime(v.year, v.month, v.day, v.hour, v.minute, v.second, v.microsecond, _UTC)
    if type(v) is str and is_zero_date(v):
        return NEG_INFINITY
    return v


def _interval(v: Any) -> Any:
    if type(v) is _dt.timedelta:
        return format_time(v)
    return v


# What each converter can change (applier.sinks.adapt.acts_on): a column without such values is skipped.
acts_on(_zero_date, str)
acts_on(_timestamptz, _dt.datetime, str)
acts_on(_interval, _dt.timedelta)


# ---------------------------------------------------------------------------------------------------------
# Keyless tables: statements (see PostgresSink's keyless section)

#: types PostgreSQL has no equality operator for, so a row holding one cannot be found by its values
NO_EQUALITY = frozenset({"xml", "point", "line", "lseg", "box", "path", "polygon", "circle"})


def _keyless_table(meta: TableMeta) -> Table:
    """The target table as SQLAlchemy sees it, with the system column ``ctid`` (a row's physical address)."""
    return Table(meta.name, MetaData(), Column("ctid", NullType), *(Column(c, NullType) for c in meta.columns),
                 schema=meta.schema or None)


def keyless_equal(meta: TableMeta, column: Any, value: Any, name: str) -> Any:
    """``column IS NOT DISTINCT FROM value``, for the column's type (see PostgresSink's keyless section)."""
    typ = meta.types.get(name, "")
    if typ == "real":
        return column.is_not_distinct_from(cast(value, REAL))
    if typ == "json":
        return cast(column, JSONB).is_not_distinct_from(cast(value, JSONB))
    if typ.rstrip("[]") in NO_EQUALITY or typ == "json[]":  # (arrays compare by their elements)
        raise ApplyError(
            f"column {shown(name)!r} of target table {meta.display} has type {typ}, which PostgreSQL cannot compare "
            "for equality, and the table has no primary key (no unique key over NOT NULL columns), so its rows "
            "can only be found by comparing every column: give the table a primary key, or change the column's "
            "type, then restart")
    return column.is_not_distinct_from(value)


def _keyless_row(meta: TableMeta, t: Table, cols: tuple[str, ...]) -> Any:
    """``(SELECT ctid FROM t AS applier_row WHERE <every column of the old row> LIMIT 1)``: an alias, so the
    subquery reads its own copy of the table instead of being correlated with the statement's."""
    inner = t.alias("applier_row")
    conds = [keyless_equal(meta, inner.c[c], bindparam(f"b{i}"), c) for i, c in enumerate(cols)]
    return select(inner.c.ctid).where(and_(*conds)).limit(1).scalar_subquery()


def keyless_delete_stmt(meta: TableMeta, cols: tuple[str, ...]) -> Any:
    t = _keyless_table(meta)
    return delete(t).where(t.c.ctid == _keyless_row(meta, t, cols))


def keyless_update_stmt(meta: TableMeta, sets: tuple[str, ...], cols: tuple[str, ...]) -> Any:
    t = _keyless_table(meta)
    return (update(t).where(t.c.ctid == _keyless_row(meta, t, cols))
            .values({t.c[c]: bindparam(f"a{i}") for i, c in enumerate(sets)}))


def keyless_binds(before: dict[str, Any], after: dict[str, Any] | None) -> dict[str, Any]:
    """The parameters of a keyless statement: ``b<i>`` the old row's values, ``a<i>`` the new row's, by position
    (column names are data and never become parameter names)."""
    out = {f"b{i}": v for i, v in enumerate(before.values())}
    if after is not None:
        out.update((f"a{i}", v) for i, v in enumerate(after.values()))
    return out
