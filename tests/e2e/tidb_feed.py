"""A real TiDB as the e2e tests' upstream, and the Canal-JSON changefeed of what the tests do in it.

TiCDC cannot run here: it needs PD and TiKV, and the test TiDB (applier/devtools/services/tidb.py) runs on its
embedded store. So :class:`Feed` records the changefeed of the test's own transactions as TiCDC's Canal-JSON
encoder writes it (the project's test encoder, with the TiDB extension): every row change of a transaction with
the transaction's commit ts as TiDB reports it (``@@tidb_last_txn_info`` right after the COMMIT), a primary-key
change as a DELETE and an INSERT (as TiCDC splits it), a CREATE TABLE at a TSO read after it finished, and a
resolved ts (TIDB_WATERMARK) in every partition after each transaction. Transactions of one Feed are serialised
(each commits, then is recorded), so a resolved ts never overtakes a change. The row images are what the test
wrote; what the tests compare the replica with is TiDB itself (``applier verify --upstream``, or its rows read
directly), never this record.

:class:`Churn` keeps changing a table from a thread, for "while TiDB keeps changing".
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pymysql
import pymysql.constants

from applier import mysql_values as T
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.devtools.encoders.largemsg import LargeMessage
from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition


@dataclass(frozen=True)
class TiDB:
    """The test TiDB: its URL (mysql+pymysql, user applier) and the Dumpling built with it."""

    url: str
    dumpling: Path

    @property
    def port(self) -> int:
        from sqlalchemy.engine import make_url

        return int(make_url(self.url).port)


def column(name: str, full: str, key: tuple[str, ...]) -> Column:
    base, unsigned = T.split_mysql_type(full)
    return Column(name, base, nullable=name not in key, key=name in key, unique=name in key, unsigned=unsigned,
                  binary=base in T.BINARY_TYPES, declared=full)


@dataclass
class Table:
    """An upstream table: its columns' full MySQL types in order; ``key`` is its primary key."""

    name: str
    types: dict[str, str]
    key: tuple[str, ...] = ("id",)

    @property
    def columns(self) -> tuple[Column, ...]:
        return tuple(column(c, t, self.key) for c, t in self.types.items())

    def create_sql(self) -> str:
        cols = ",\n".join(f"  `{c}` {t}{' NOT NULL' if c in self.key else ' NULL'}" for c, t in self.types.items())
        return (f"CREATE TABLE `{self.name}` (\n{cols},\n  PRIMARY KEY ({', '.join(f'`{k}`' for k in self.key)})"
                "\n) DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin")


def members(full: str) -> list[str]:
    """The members of an ENUM or SET type, in order."""
    return [m.replace("''", "'") for m in re.findall(r"'((?:[^']|'')*)'", full)]


def sql_value(v: Any) -> Any:
    """A value as PyMySQL should send it: TIME as MySQL's text (PyMySQL writes a negative timedelta wrong)."""
    return T.format_time(v) if isinstance(v, dt.timedelta) else v


def connect(url: str, database: str | None = None) -> pymysql.connections.Connection:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    conn = pymysql.connect(host=u.host, port=u.port or 4000, user=u.username, password=u.password or "",
                           database=database, autocommit=False, charset="utf8mb4", connect_timeout=10,
                           client_flag=pymysql.constants.CLIENT.FOUND_ROWS)  # rowcount: rows matched
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        # TiDB's default less NO_ZERO_DATE and NO_ZERO_IN_DATE: zero dates are values the tests write too
        cur.execute("SET sql_mode = 'ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,"
                    "NO_AUTO_CREATE_USER,NO_ENGINE_SUBSTITUTION'")
    conn.commit()
    return conn


def tso(conn) -> int:
    """A fresh TSO from TiDB: the start ts of an empty transaction."""
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("SELECT @@tidb_current_ts")
        ts = int(cur.fetchone()[0])
        cur.execute("ROLLBACK")
    return ts


def last_commit_ts(conn) -> int:
    """The commit ts of this session's last transaction (TiDB's ``@@tidb_last_txn_info``)."""
    with conn.cursor() as cur:
        cur.execute("SELECT @@tidb_last_txn_info")
        info = json.loads(cur.fetchone()[0])
    return int(info["commit_ts"])


@dataclass
class Message:
    commit_ts: int
    partition: int
    key: bytes | None
    value: bytes


@dataclass
class Feed:
    """Runs transactions on TiDB database ``schema`` and records their changefeed (module docstring)."""

    url: str
    schema: str
    partitions: int = 2
    large: LargeMessage | None = None  # which row changes go out handle-key-only
    tables: dict[str, Table] = field(default_factory=dict)
    state: dict[str, dict[Any, dict[str, Any]]] = field(default_factory=dict)  # the rows now, as written
    messages: list[Message] = field(default_factory=list)
    history: list[tuple[int, str, Op, dict | None, dict | None]] = field(default_factory=list)  # (ts, table, ...)
    last_ts: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.conn = connect(self.url)
        with self.conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{self.schema}`")
            cur.execute(f"USE `{self.schema}`")
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    # ---- recording
    def _send(self, ts: int, part: int, ev: Any) -> None:
        large = self.large if isinstance(ev, RowChange) else None
        key, value = encode_canal_json(ev, build_ts_ms=0, large_message=large)
        self.messages.append(Message(ts, part, key, value))

    def _resolved(self, ts: int) -> None:
        for p in range(self.partitions):
            self._send(ts, p, Resolved(ts, SourcePosition("", p, 0)))
        self.last_ts = ts

    def _wire(self, table: str, row: dict[str, Any] | None) -> dict[str, Any] | None:
        """The row as TiCDC's encoders are handed it: ENUM by its ordinal, SET by its bitmask."""
        if row is None:
            return None
        out = dict(row)
        for c, full in self.tables[table].types.items():
            v, f = out.get(c), full.lower()
            if v is None or isinstance(v, int):
                continue
            if f.startswith("enum("):
                out[c] = members(full).index(v) + 1
            elif f.startswith("set("):
                ms = members(full)
                out[c] = sum(1 << ms.index(m) for m in v.split(",")) if v else 0
        return out

    def _part(self, table: str, row: dict[str, Any]) -> int:
        return hash(tuple(row[k] for k in self.tables[table].key)) % self.partitions

    # ---- DDL
    def create(self, table: Table) -> int:
        with self.lock:
            with self.conn.cursor() as cur:
                cur.execute(table.create_sql())
            self.conn.commit()
            self.tables[table.name] = Table(table.name, dict(table.types), table.key)  # add_column changes it
            self.state[table.name] = {}
            ts = tso(self.conn)  # after the DDL finished, before any change of the table
            for p in range(self.partitions):  # TiCDC broadcasts DDL
                self._send(ts, p, DDL(self.schema, table.name, ts, table.create_sql(), SourcePosition("", p, 0),
                                      ddl_type=3))
            self._resolved(ts)
            return ts

    def add_column(self, table: str, name: str, full: str) -> int:
        """ALTER TABLE ... ADD COLUMN, sent as TiCDC sends a DDL (at a TSO read after it finished)."""
        with self.lock:
            sql = f"ALTER TABLE `{table}` ADD COLUMN `{name}` {full} NULL"
            with self.conn.cursor() as cur:
                cur.execute(sql)
            self.conn.commit()
            self.tables[table].types[name] = full
            for row in self.state[table].values():
                row[name] = None
            ts = tso(self.conn)
            for p in range(self.partitions):
                self._send(ts, p, DDL(self.schema, table, ts, sql, SourcePosition("", p, 0), ddl_type=5))
            self._resolved(ts)
            return ts

    # ---- row changes
    def _key(self, table: str, row: dict[str, Any]) -> Any:
        k = self.tables[table].key
        return tuple(row[c] for c in k) if len(k) > 1 else row[k[0]]

    def _where(self, table: str) -> str:
        return " AND ".join(f"`{k}` = %s" for k in self.tables[table].key)

    def txn(self, ops: list[tuple]) -> int:
        """One transaction. ``ops``: ("insert", table, row), ("update", table, key, {col: value}) or ("delete",
        table, key); an update that changes the key is sent as a DELETE and an INSERT. Returns its commit ts."""
        with self.lock:
            events: list[tuple[str, Op, dict | None, dict | None]] = []
            state = {t: dict(rows) for t, rows in self.state.items()}
            try:
                with self.conn.cursor() as cur:
                    for op in ops:
                        kind, table = op[0], op[1]
                        cols = list(self.tables[table].types)
                        if kind == "insert":
                            row = {c: op[2].get(c) for c in cols}
                            cur.execute(f"INSERT INTO `{table}` ({', '.join(f'`{c}`' for c in cols)}) VALUES "
                                        f"({', '.join(['%s'] * len(cols))})", [sql_value(row[c]) for c in cols])
                            state[table][self._key(table, row)] = row
                            events.append((table, Op.INSERT, None, row))
                        elif kind == "update":
                            old = state[table][op[2]]
                            new = {**old, **op[3]}
                            sets = list(op[3])
                            cur.execute(f"UPDATE `{table}` SET {', '.join(f'`{c}` = %s' for c in sets)} WHERE "
                                        f"{self._where(table)}", [sql_value(op[3][c]) for c in sets]
                                        + [old[k] for k in self.tables[table].key])
                            assert cur.rowcount == 1, (table, op)
                            del state[table][op[2]]
                            state[table][self._key(table, new)] = new
                            if self._key(table, new) != op[2]:  # TiCDC splits a key change
                                events += [(table, Op.DELETE, old, None), (table, Op.INSERT, None, new)]
                            else:
                                events.append((table, Op.UPDATE, old, new))
                        elif kind == "delete":
                            old = state[table].pop(op[2])
                            cur.execute(f"DELETE FROM `{table}` WHERE {self._where(table)}",
                                        [old[k] for k in self.tables[table].key])
                            assert cur.rowcount == 1, (table, op)
                            events.append((table, Op.DELETE, old, None))
                        else:
                            raise ValueError(kind)
                self.conn.commit()
            except BaseException:
                self.conn.rollback()
                raise
            ts = last_commit_ts(self.conn)
            assert ts > self.last_ts, (ts, self.last_ts)
            self.state = state
            for table, op, before, after in events:
                part = self._part(table, after or before)
                self._send(ts, part, RowChange(self.schema, table, ts, op, self._wire(table, before),
                                               self._wire(table, after), self.tables[table].columns,
                                               SourcePosition("", part, 0)))
                self.history.append((ts, table, op, before, after))
            self._resolved(ts)
            return ts

    def insert(self, table: str, *rows: dict[str, Any]) -> int:
        return self.txn([("insert", table, r) for r in rows])

    def update(self, table: str, key: Any, **values: Any) -> int:
        return self.txn([("update", table, key, values)])

    def delete(self, table: str, *keys: Any) -> int:
        return self.txn([("delete", table, k) for k in keys])

    # ---- reading the record
    def records(self, upto: int | None = None, after: int | None = None) -> list[tuple[int, bytes | None, bytes]]:
        """(partition, key, value) of the messages with commit ts in (after, upto], for produce()."""
        return [(m.partition, m.key, m.value) for m in self.messages
                if (upto is None or m.commit_ts <= upto) and (after is None or m.commit_ts > after)]

    def rows_at(self, table: str, ts: int) -> dict[Any, dict[str, Any]]:
        """The table's rows as of ``ts``, from the record."""
        rows: dict[Any, dict[str, Any]] = {}
        for cts, t, op, before, after in self.history:
            if cts > ts or t != table:
                continue
            if before is not None:
                rows.pop(self._key(t, before), None)
            if after is not None:
                rows[self._key(t, after)] = after
        return rows


# ---- a table that keeps changing ---------------------------------------------------------------------------

ITEMS = Table("items", {"id": "int", "name": "varchar(64)", "price": "decimal(12,3)", "seen": "datetime(6)",
                        "note": "text", "raw": "varbinary(16)", "qty": "bigint unsigned"})


NAMES = ["plain", "O'Brien", "back\\slash", "ü 😀 李", ""]


def item(rng: random.Random, i: int) -> dict[str, Any]:
    return {
        "id": i, "name": f"{rng.choice(NAMES)} {i}" if rng.random() < 0.9 else None,
        "price": Decimal(rng.randint(-10**9, 10**9)) / 1000 if rng.random() < 0.9 else None,
        "seen": dt.datetime(2024, 1, 1) + dt.timedelta(seconds=rng.randint(0, 10**8), microseconds=rng.randint(0, 999999)),
        "note": rng.choice(["line\nbreak", "tab\tend", "'quoted'", "NULL", "\\N", None]),
        "raw": bytes(rng.randrange(256) for _ in range(rng.randint(0, 16))),
        "qty": rng.choice([0, 1, 2**63, 2**64 - 1, rng.randrange(2**32)]),
    }


def random_txn(feed: Feed, rng: random.Random, table: str = "items", next_id: list[int] | None = None) -> list[tuple]:
    """One transaction of 1-4 random changes: updates, inserts, deletes, key changes."""
    rows = feed.state[table]
    ops: list[tuple] = []
    used: set[Any] = set()
    for _ in range(rng.randint(1, 4)):
        live = [k for k in rows if k not in used]
        r = rng.random()
        if r < 0.25 or len(live) < 5:
            i = next_id[0] if next_id else max(list(rows) + [0]) + 1
            if next_id:
                next_id[0] += 1
            while i in rows or i in used:
                i += 1
            ops.append(("insert", table, item(rng, i)))
            used.add(i)
        elif r < 0.75:
            k = rng.choice(live)
            new = item(rng, k)
            cols = rng.sample([c for c in new if c != "id"], rng.randint(1, 3))
            ops.append(("update", table, k, {c: new[c] for c in cols}))
            used.add(k)
        elif r < 0.9:
            k = rng.choice(live)
            ops.append(("delete", table, k))
            used.add(k)
        else:  # a primary-key change
            k = rng.choice(live)
            new_id = k + 100_000
            if new_id in rows or new_id in used:
                continue
            ops.append(("update", table, k, {"id": new_id}))
            used.update({k, new_id})
    return ops


class Churn:
    """Keeps changing a table of ``feed`` from a thread (random transactions) until stopped."""

    def __init__(self, feed: Feed, table: str = "items", seed: int = 11, pause: float = 0.02) -> None:
        self.feed, self.table, self.pause = feed, table, pause
        self.rng = random.Random(seed)
        self.commits: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tidb-churn", daemon=True)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self.commits.append(self.feed.txn(random_txn(self.feed, self.rng, self.table)))
                time.sleep(self.pause)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def start(self, at_least: int = 5, timeout: float = 60) -> "Churn":
        self._thread.start()
        self.wait_for(at_least, timeout)
        return self

    def wait_for(self, commits: int, timeout: float = 60) -> None:
        """Until the thread has made ``commits`` transactions in all (it failing, or too slow, fails the test)."""
        deadline = time.monotonic() + timeout
        while len(self.commits) < commits:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"TiDB made {len(self.commits)} commits in {timeout} s"
            time.sleep(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive()
        if self.error is not None:
            raise self.error
        return len(self.commits)
