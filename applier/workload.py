"""A TiCDC-shaped changefeed generator for the demo, the end-to-end tests and the benchmark.

It writes what a TiCDC changefeed writes into Kafka, in either protocol: a CREATE TABLE per table broadcast
to every partition, row changes dispatched by primary key to a partition, upstream transactions touching
several tables, primary-key-changing updates split into delete + insert (TiCDC's default for MQ sinks),
unique-key swaps, deletes, an ALTER TABLE ADD COLUMN mid-stream, resolved ts broadcast to every partition at
a cadence, and at-least-once replays (a TiCDC restart re-sends everything after an older checkpoint and an
older resolved ts). Alongside it keeps the expected final state of every table, so a test can compare the
target row for row.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Iterable

from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition

SCHEMA = "shop"

ORDERS_DDL = ("CREATE TABLE `orders` (`id` INT NOT NULL, `customer` VARCHAR(64) NOT NULL, "
              "`amount` DECIMAL(12,2) NOT NULL, `note` TEXT NULL, `created` DATETIME(6) NOT NULL, "
              "PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")
CUSTOMERS_DDL = ("CREATE TABLE `customers` (`id` BIGINT NOT NULL, `email` VARCHAR(128) NOT NULL, "
                 "`name` VARCHAR(64) NULL, PRIMARY KEY (`id`), UNIQUE KEY `uk_email` (`email`))")
AUDIT_DDL = "CREATE TABLE `audit_log` (`id` INT NOT NULL PRIMARY KEY, `what` VARCHAR(64))"
ALTER_DDL = "ALTER TABLE `orders` ADD COLUMN `status` VARCHAR(16) NULL"

ORDERS_COLS = (
    Column("id", "int", nullable=False, key=True),
    Column("customer", "varchar", nullable=False),
    Column("amount", "decimal", nullable=False),
    Column("note", "text"),
    Column("created", "datetime", nullable=False),
)
ORDERS_COLS_V2 = ORDERS_COLS + (Column("status", "varchar"),)
CUSTOMERS_COLS = (
    Column("id", "bigint", nullable=False, key=True),
    Column("email", "varchar", nullable=False, unique=True),
    Column("name", "varchar"),
)
AUDIT_COLS = (Column("id", "int", nullable=False, key=True), Column("what", "varchar"))


def tso(physical_ms: int, logical: int = 0) -> int:
    return (physical_ms << 18) + logical


@dataclass
class Workload:
    """Messages per partition, in the order TiCDC would have written them, and the expected state."""

    protocol: str
    partitions: int
    messages: list[tuple[int, bytes | None, bytes]] = field(default_factory=list)
    expected: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict)
    events: int = 0
    final_ts: int = 0
    row_changes: dict[str, int] = field(default_factory=dict)  # per table, replays not counted


class _Gen:
    def __init__(self, protocol: str, partitions: int, seed: int, rows_per_message: int) -> None:
        from applier.codecs.open import encode_open, encode_open_batch
        self.protocol = protocol
        self.parts = partitions
        self.rng = random.Random(seed)
        self.wl = Workload(protocol, partitions)
        self.ts_ms = int(time.time() * 1000) - 60_000
        self.logical = 0
        self.history: list[tuple[int, int, Any]] = []  # (ts, partition, event) for replays
        self.pending: dict[int, list[Any]] = {p: [] for p in range(partitions)}
        self.rows_per_message = rows_per_message
        self._open_one = encode_open
        self._open_batch = encode_open_batch
        self.state: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = {"orders": {}, "customers": {}}
        self.orders_cols = ORDERS_COLS

    # -- time and encoding -------------------------------------------------------------------------------
    def next_ts(self) -> int:
        self.ts_ms += self.rng.randint(1, 20)
        return tso(self.ts_ms, self.rng.randint(0, 100))

    def _emit(self, part: int, ev: Any) -> None:
        self.wl.events += 1
        if self.protocol == "open" and isinstance(ev, RowChange):
            self.pending[part].append(ev)
            if len(self.pending[part]) >= self.rows_per_message:
                self._flush(part)
            return
        self._flush(part)
        self.wl.messages.append((part, *self._encode(ev)))

    def _flush(self, part: int) -> None:
        if self.pending[part]:
            k, v = self._open_batch(self.pending[part])
            self.wl.messages.append((part, k, v))
            self.pending[part] = []

    def _encode(self, ev: Any) -> tuple[bytes | None, bytes]:
        if self.protocol == "open":
            return self._open_one(ev)
        from applier.codecs.canal_json import encode_canal_json
        return encode_canal_json(ev)

    def flush_all(self) -> None:
        for p in range(self.parts):
            self._flush(p)

    # -- events -----------------------------------------------------------------------------------------
    def ddl(self, table: str, query: str) -> None:
        ts = self.next_ts()
        for p in range(self.parts):  # TiCDC broadcasts DDL to every partition
            ev = DDL(SCHEMA, table, ts, query, SourcePosition("", p, 0), ddl_type=3 if "CREATE" in query else 5)
            self._emit(p, ev)
            self.history.append((ts, p, ev))

    def resolved(self) -> None:
        ts = tso(self.ts_ms, 0x3FFFF)  # everything up to this millisecond was sent
        for p in range(self.parts):
            self._emit(p, Resolved(ts, SourcePosition("", p, 0)))

    def row(self, ts: int, table: str, op: Op, before: dict | None, after: dict | None, cols) -> None:
        key = (after or before)["id"]
        part = hash(key) % self.parts
        ev = RowChange(SCHEMA, table, ts, op, before, after, cols, SourcePosition("", part, 0))
        self.wl.row_changes[table] = self.wl.row_changes.get(table, 0) + 1
        self._emit(part, ev)
        self.history.append((ts, part, ev))

    def replay(self) -> None:
        """A TiCDC restart: an older resolved ts, then every event since a checkpoint re-sent."""
        if len(self.history) < 4:
            return
        cut = self.rng.randint(max(0, len(self.history) - 40), len(self.history) - 1)
        old = self.history[cut][0] - 1
        self.flush_all()
        for p in range(self.parts):
            self._emit(p, Resolved(old, SourcePosition("", p, 0)))
        for _, p, ev in self.history[cut:]:
            self._emit(p, ev)

    # -- the upstream application -----------------------------------------------------------------------
    def txn(self, orders_live: bool, customers_next: list[int], order_next: list[int]) -> None:
        ts = self.next_ts()
        rng = self.rng
        touched: set[tuple[str, Any]] = set()
        for _ in range(rng.randint(1, 5)):
            table = rng.choice(["orders", "orders", "customers"]) if orders_live else "customers"
            st = self.state[table]
            kind = rng.random()
            if table == "customers":
                if kind < 0.5 or len(st) < 4:
                    cid = customers_next[0]
                    customers_next[0] += 1
                    if ("customers", cid) in touched:
                        continue
                    row = {"id": cid, "email": f"user{cid}@example.com", "name": rng.choice(["Ann", "Bo", "Zoë", None])}
                    self.row(ts, "customers", Op.INSERT, None, row, CUSTOMERS_COLS)
                    st[(cid,)] = row
                    touched.add(("customers", cid))
                elif kind < 0.75:
                    # swap two customers' emails (a unique-key change on both rows in one transaction)
                    a, b = rng.sample(sorted(st), 2)
                    if ("customers", a[0]) in touched or ("customers", b[0]) in touched:
                        continue
                    ra, rb = st[a], st[b]
                    na, nb = dict(ra, email=rb["email"]), dict(rb, email=ra["email"])
                    # TiCDC splits unique-key-changing updates into delete + insert; send the deletes first
                    for old in (ra, rb):
                        self.row(ts, "customers", Op.DELETE, old, None, CUSTOMERS_COLS)
                    for new in (na, nb):
                        self.row(ts, "customers", Op.INSERT, None, new, CUSTOMERS_COLS)
                    st[a], st[b] = na, nb
                    touched |= {("customers", a[0]), ("customers", b[0])}
                else:
                    k = rng.choice(sorted(st))
                    if ("customers", k[0]) in touched:
                        continue
                    self.row(ts, "customers", Op.DELETE, st[k], None, CUSTOMERS_COLS)
                    del st[k]
                    touched.add(("customers", k[0]))
                continue
            # orders
            if kind < 0.45 or len(st) < 3:
                oid = order_next[0]
                order_next[0] += 1
                row = self._order(oid)
                self.row(ts, "orders", Op.INSERT, None, row, self.orders_cols)
                st[(oid,)] = row
                touched.add(("orders", oid))
            elif kind < 0.75:
                k = rng.choice(sorted(st))
                if ("orders", k[0]) in touched:
                    continue
                old = st[k]
                new = dict(old, amount=Decimal(rng.randint(0, 10**7)) / 100, note=rng.choice([None, "gift ☃", "rush"]))
                if "status" in new:
                    new["status"] = rng.choice(["paid", "sent", None])
                self.row(ts, "orders", Op.UPDATE, old, new, self.orders_cols)
                st[k] = new
                touched.add(("orders", k[0]))
            elif kind < 0.87:
                # primary-key change: TiCDC sends delete(old key) + insert(new key)
                k = rng.choice(sorted(st))
                nid = order_next[0]
                order_next[0] += 1
                if ("orders", k[0]) in touched:
                    continue
                old = st.pop(k)
                new = dict(old, id=nid)
                self.row(ts, "orders", Op.DELETE, old, None, self.orders_cols)
                self.row(ts, "orders", Op.INSERT, None, new, self.orders_cols)
                st[(nid,)] = new
                touched |= {("orders", k[0]), ("orders", nid)}
            else:
                k = rng.choice(sorted(st))
                if ("orders", k[0]) in touched:
                    continue
                self.row(ts, "orders", Op.DELETE, st.pop(k), None, self.orders_cols)
                touched.add(("orders", k[0]))

    def _order(self, oid: int) -> dict[str, Any]:
        rng = self.rng
        row = {
            "id": oid,
            "customer": rng.choice(["Ann", "Bo", "Zoë", "Ξένια", "李"]),
            "amount": Decimal(rng.randint(0, 10**8)) / 100,
            "note": rng.choice([None, "", "first order", "naïve ☃ 🚀"]),
            "created": dt.datetime(2026, 1, 1) + dt.timedelta(seconds=rng.randint(0, 10**7), microseconds=rng.randint(0, 999999)),
        }
        if self.orders_cols is ORDERS_COLS_V2:
            row["status"] = rng.choice(["new", None])
        return row


def generate(protocol: str, *, partitions: int = 3, txns: int = 300, seed: int = 7, replays: int = 3,
             with_ddl: bool = True, rows_per_message: int = 4) -> Workload:
    """A complete changefeed: DDL, ``txns`` transactions with resolved ts at a cadence, replays, final resolved."""
    g = _Gen(protocol, partitions, seed, rows_per_message)
    if with_ddl:
        g.ddl("orders", ORDERS_DDL)
        g.ddl("customers", CUSTOMERS_DDL)
        g.ddl("audit_log", AUDIT_DDL)
    g.resolved()
    customers_next, order_next = [1], [1]
    replay_at = set(g.rng.sample(range(10, max(11, txns)), min(replays, max(0, txns - 10))))
    alter_at = txns // 2 if with_ddl else -1
    for i in range(txns):
        if i == alter_at:
            g.flush_all()
            g.ddl("orders", ALTER_DDL)
            g.orders_cols = ORDERS_COLS_V2
        g.txn(True, customers_next, order_next)
        if g.rng.random() < 0.1:
            ts = g.next_ts()
            g.row(ts, "audit_log", Op.INSERT, None, {"id": i, "what": "ignored by routing"}, AUDIT_COLS)
        if g.rng.random() < 0.3:
            g.flush_all()
            g.resolved()
        if i in replay_at:
            g.replay()
    g.flush_all()
    g.ts_ms += 1
    g.resolved()
    g.flush_all()
    g.wl.final_ts = tso(g.ts_ms, 0x3FFFF)
    if with_ddl:
        for row in g.state["orders"].values():
            row.setdefault("status", None)
    g.wl.expected = {t: dict(rows) for t, rows in g.state.items()}
    return g.wl


def produce(bootstrap: str, topic: str, messages: Iterable[tuple[int, bytes | None, bytes]], *,
            partitions: int, create: bool = True, on_progress: Callable[[int], None] | None = None) -> int:
    """Write messages to ``topic`` with their partitions (creating the topic first). Returns the count."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    if create:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        fut = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic]
        try:
            fut.result(30)
        except Exception as exc:  # an existing topic is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True,
                     "compression.type": "lz4", "message.max.bytes": 10_000_000})
    n = 0
    for part, key, value in messages:
        while True:
            try:
                prod.produce(topic, value=value, key=key, partition=part)
                break
            except BufferError:
                prod.poll(0.1)
        n += 1
        if n % 10000 == 0:
            prod.poll(0)
            if on_progress:
                on_progress(n)
    left = prod.flush(60)
    if left:
        raise RuntimeError(f"{left} message(s) to {topic} were not acknowledged by {bootstrap}")
    return n
