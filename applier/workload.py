"""A TiCDC-shaped changefeed generator for the demo, the end-to-end tests and the benchmark.

It writes what a TiCDC changefeed writes into Kafka: a CREATE TABLE per table broadcast to every partition,
row changes dispatched by primary key to a partition, upstream transactions touching several tables,
primary-key-changing updates split into delete + insert (TiCDC's default for MQ sinks), unique-key swaps,
deletes, an ALTER TABLE ADD COLUMN mid-stream, resolved ts broadcast to every partition at a cadence, and
at-least-once replays (a TiCDC restart re-sends everything after an older checkpoint and an older resolved
ts). Alongside it keeps the expected final state of every table, so a test can compare the target row for row.

Protocols (``generate(protocol, ...)``; :attr:`Workload.source_protocol` and :attr:`Workload.codec` say how to
configure the applier's ``[source]`` for each):

================  ==============================================================================================
``open``          Open Protocol, rows batched per message (``rows_per_message``); resolved events.
``canal-json``    Canal-JSON with ``enable-tidb-extension=true`` (commit ts, ``TIDB_WATERMARK``).
``canal-json-     Canal-JSON without the extension: no commit ts and no watermark (ungated). DDL goes to
noext``           partition 0 only, as TiCDC does for canal/canal-json (``PartitionZero``).
``simple``        Simple protocol, JSON: DDL carry the table schema (``tableSchema``/``preTableSchema``), DML
                  carry ``schemaVersion``, WATERMARK broadcast, BOOTSTRAP of every table to every partition
                  after the CREATEs and every ``bootstrap_every`` transactions (send-bootstrap-interval).
``simple-avro``   The same in the Simple protocol's Avro encoding (``encoding_format = "avro"``).
``debezium``      TiCDC's Debezium JSON (schema envelope, no TiDB extension: ungated); schema-change messages
                  for the DDL, broadcast to every partition like TiCDC's ``PartitionAll``.
``avro``          TiCDC's flat Avro with a Confluent registry (``registry=``, e.g. a RegistryClient): one topic
                  per table (``<topic_prefix>-<table>``, so messages are 4-tuples with their topic), the TiDB
                  extension on (``AvroEncoder``'s default), deletes as tombstones, no DDL and no watermark.
================  ==============================================================================================

Protocols without a watermark (canal-json-noext, debezium, avro; :attr:`Workload.gated` is False) are applied
in per-partition offset order, which keeps the order of each *key*. The generator therefore dispatches the rows
of a table with a unique key besides its primary key (``customers``: its unique-key swaps move an e-mail from
one id to another) by table, to one partition - TiCDC's default ``table`` dispatcher; ``orders`` stays
dispatched by primary key. With key dispatch such a swap could be applied half on one partition before the
other half's delete on another partition, which no per-partition order can fix.

DDL the stream does not carry - every DDL for ``avro``, the CREATE TABLEs when a Simple consumer starts
``mid_stream`` - is listed in :attr:`Workload.target_ddl` as ``(index, DDL)``: the operator must have applied
it to the target (:func:`apply_target_ddl`) before the applier consumes ``messages[index]``. Applying all of
them up front is fine for this generator's DDL (CREATE TABLEs and one nullable ADD COLUMN).

``mid_stream=True`` (Simple only) writes the stream a consumer sees when it starts after the tables were created
(after a retention cut, or a changefeed started later, with a replica seeded while the tables were empty): no
CREATE TABLE and no first BOOTSTRAP, so the first messages are row changes the decoder cannot decode yet and
must hold; the first periodic BOOTSTRAP (transaction ``bootstrap_every``) - or the ALTER TABLE message, whose
``preTableSchema`` describes the old version - releases them.
"""

from __future__ import annotations

import datetime as dt
import random
import time
import zlib
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Callable, Iterable

from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition, TableSchema

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

#: every table's columns at CREATE TABLE, and the column list each ALTER TABLE leaves (for the protocols whose
#: DDL messages carry the table's schema: simple, debezium)
TABLE_COLS = {"orders": ORDERS_COLS, "customers": CUSTOMERS_COLS, "audit_log": AUDIT_COLS}
ALTER_COLS = {ALTER_DDL: ORDERS_COLS_V2}
#: full MySQL types the event model does not carry (debezium's schema envelope, avro's DECIMAL(M, D))
FIELD_TYPES = {"orders": {"amount": "decimal(12,2)", "created": "datetime(6)"}}

PROTOCOLS = ("open", "canal-json", "canal-json-noext", "simple", "simple-avro", "debezium", "avro")
#: protocols whose stream has no watermark: the applier applies them in per-partition offset order
UNGATED_PROTOCOLS = frozenset({"canal-json-noext", "debezium", "avro"})
#: tables with a unique key besides the primary key: dispatched by table for ungated protocols (module docs)
TABLE_DISPATCHED = frozenset({"customers"})


def tso(physical_ms: int, logical: int = 0) -> int:
    return (physical_ms << 18) + logical


#: (partition, key, value) for the caller's topic, or (partition, key, value, topic) (avro: one topic per
#: table). ``value`` is None only for avro's delete tombstones.
Message = tuple[int, bytes | None, bytes] | tuple[int, bytes | None, bytes | None, str]


@dataclass
class Workload:
    """Messages per partition, in the order TiCDC would have written them, and the expected state.

    ``source_protocol``/``codec`` are the applier's ``source.protocol`` and ``[source.codec]`` for the stream
    (``protocol`` is the generator's name, e.g. "simple-avro"); ``gated`` whether the stream has watermarks.
    ``topics`` lists the topics the 4-tuple messages name (avro), in first-use order; empty when every message
    goes to the one topic the caller passes to :func:`produce`. ``target_ddl`` is the DDL the stream does not
    carry, as ``(index into messages, DDL)``: apply each to the target before the applier reads that message.
    """

    protocol: str
    partitions: int
    messages: list[Message] = field(default_factory=list)
    expected: dict[str, dict[tuple[Any, ...], dict[str, Any]]] = field(default_factory=dict)
    events: int = 0
    final_ts: int = 0
    row_changes: dict[str, int] = field(default_factory=dict)  # per table, replays not counted
    source_protocol: str = ""
    codec: dict[str, Any] = field(default_factory=dict)
    gated: bool = True
    topics: list[str] = field(default_factory=list)
    target_ddl: list[tuple[int, DDL]] = field(default_factory=list)

    def target_ddl_before(self, index: int) -> list[DDL]:
        """The operator's DDL that must be in place before ``messages[index]`` is read."""
        return [d for i, d in self.target_ddl if i <= index]


class _Gen:
    def __init__(self, protocol: str, partitions: int, seed: int, rows_per_message: int, *,
                 registry: Any = None, topic_prefix: str | None = None, mid_stream: bool = False) -> None:
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
        # the protocols added after open/canal-json (none of this touches the rng, so those two stay as they were)
        self.ungated = protocol in UNGATED_PROTOCOLS
        self.mid_stream = mid_stream
        self.topic_prefix = topic_prefix
        self.table_cols: dict[str, tuple[Column, ...]] = dict(TABLE_COLS)
        self.schemas: dict[tuple[str, tuple[Column, ...]], TableSchema] = {}  # simple: (table, columns) -> schema
        self.base_version = tso(self.ts_ms - 1000)  # simple: a table's schema version without a CREATE TABLE
        self.ddl_schemas: dict[tuple[int, str, str], tuple[tuple[Column, ...] | None, tuple[Column, ...]]] = {}
        self.avro = None
        wl = self.wl
        wl.gated = not self.ungated
        wl.source_protocol = {"canal-json-noext": "canal-json", "simple-avro": "simple"}.get(protocol, protocol)
        if protocol == "canal-json-noext":
            wl.codec = {"require_tidb_extension": False}
        elif protocol == "simple-avro":
            wl.codec = {"encoding_format": "avro"}
        elif protocol == "avro":
            from applier.codecs.avro import AvroEncoder, ColumnSpec
            specs = {f"{SCHEMA}.{t}": {c: ColumnSpec(precision=int(p), scale=int(s))
                                       for c, ft in cols.items() if ft.startswith("decimal(")
                                       for p, s in [ft[len("decimal("):-1].split(",")]}
                     for t, cols in FIELD_TYPES.items()}
            self.avro = AvroEncoder(registry, column_specs=specs)
            url = getattr(registry, "url", None)
            if isinstance(url, str) and url.startswith(("http://", "https://")):
                wl.codec = {"registry_url": url}  # without credentials: a RegistryClient keeps them apart

    # -- time and encoding -------------------------------------------------------------------------------
    def next_ts(self) -> int:
        self.ts_ms += self.rng.randint(1, 20)
        return tso(self.ts_ms, self.rng.randint(0, 100))

    def _emit(self, part: int, ev: Any) -> None:
        if self.ungated and isinstance(ev, Resolved):
            return  # these protocols carry no watermark
        self.wl.events += 1
        if self.protocol == "open" and isinstance(ev, RowChange):
            self.pending[part].append(ev)
            if len(self.pending[part]) >= self.rows_per_message:
                self._flush(part)
            return
        self._flush(part)
        if self.protocol not in ("open", "canal-json"):
            self.wl.messages.extend(self._encode_more(part, ev))
            return
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

    def _encode_more(self, part: int, ev: Any) -> list[Message]:
        """The messages of one event in the protocols other than open/canal-json."""
        proto = self.protocol
        if proto == "canal-json-noext":
            from applier.codecs.canal_json import encode_canal_json
            return [(part, *encode_canal_json(ev, enable_tidb_extension=False, build_ts_ms=self._build_ms(ev)))]
        if proto in ("simple", "simple-avro"):
            from applier.codecs.simple import encode_simple
            fmt = "avro" if proto == "simple-avro" else "json"
            if isinstance(ev, TableSchema):
                return [(part, *encode_simple(ev, encoding_format=fmt, build_ts_ms=self.ts_ms))]
            if isinstance(ev, DDL):
                before, after = self.ddl_schemas[(ev.commit_ts, ev.table, ev.query)]
                return [(part, *encode_simple(
                    ev, encoding_format=fmt, table_schema=self.table_schema(ev.table, after),
                    pre_table_schema=None if before is None else self.table_schema(ev.table, before),
                    build_ts_ms=self._build_ms(ev)))]
            if isinstance(ev, RowChange):
                return [(part, *encode_simple(ev, encoding_format=fmt, build_ts_ms=self._build_ms(ev),
                                              table_schema=self.table_schema(ev.table, ev.columns)))]
            return [(part, *encode_simple(ev, encoding_format=fmt, build_ts_ms=self.ts_ms))]
        if proto == "debezium":
            from applier.codecs.debezium import encode_debezium
            ftypes = FIELD_TYPES.get(ev.table, {})
            if isinstance(ev, DDL):
                _, after = self.ddl_schemas[(ev.commit_ts, ev.table, ev.query)]
                return [(part, *encode_debezium(ev, table_columns=after, field_types=ftypes,
                                                ts_ms=self._build_ms(ev)))]
            return [(part, *encode_debezium(ev, field_types=ftypes, ts_ms=self._build_ms(ev)))]
        if proto == "avro":
            if not isinstance(ev, RowChange):
                return []  # no DDL or watermark in this protocol (DDL goes to Workload.target_ddl)
            topic = self.avro_topic(ev.table)
            return [(part, k, v, topic) for k, v in self.avro.encode(ev, topic)]
        raise ValueError(f"unknown protocol {proto!r}")  # pragma: no cover - generate() checks

    @staticmethod
    def _build_ms(ev: Any) -> int:
        return ev.commit_ts >> 18  # the commit's physical time (TiCDC writes the wall clock; this is stable)

    def avro_topic(self, table: str) -> str:
        return f"{self.topic_prefix}-{table}"

    def table_schema(self, table: str, cols: tuple[Column, ...], version: int | None = None) -> TableSchema:
        """Simple: the table's schema for one column list; its version is the commit ts of the DDL that made it
        (TiCDC sends the table info's UpdateTS), or a fixed older one for a table without a CREATE TABLE."""
        key = (table, cols)
        ts = self.schemas.get(key)
        if ts is None:
            ts = self.schemas[key] = TableSchema(SCHEMA, table, version or self.base_version, cols)
        return ts

    def bootstrap(self) -> None:
        """Simple: a BOOTSTRAP of every table's current schema to every partition (send-bootstrap-to-all-
        partition); not part of the replayable history."""
        for table, cols in self.table_cols.items():
            schema = self.table_schema(table, cols)
            for p in range(self.parts):
                self._emit(p, schema)

    def flush_all(self) -> None:
        for p in range(self.parts):
            self._flush(p)

    # -- events -----------------------------------------------------------------------------------------
    def ddl(self, table: str, query: str) -> None:
        ts = self.next_ts()
        if self.protocol not in ("open", "canal-json"):
            before = None if query.startswith("CREATE") else self.table_cols[table]
            after = TABLE_COLS[table] if before is None else ALTER_COLS[query]
            self.table_cols[table] = after
            self.ddl_schemas[(ts, table, query)] = (before, after)
            self.table_schema(table, after, version=ts)
            carried = not (self.protocol == "avro" or (self.mid_stream and before is None))
            if not carried:  # the operator applies it to the target (Workload.target_ddl)
                ev = DDL(SCHEMA, table, ts, query, SourcePosition("", 0, 0), ddl_type=3 if before is None else 5)
                self.wl.target_ddl.append((len(self.wl.messages), ev))
                return
            if self.protocol == "canal-json-noext":  # TiCDC sends canal(-json) DDL to partition 0 only
                ev = DDL(SCHEMA, table, ts, query, SourcePosition("", 0, 0), ddl_type=3 if before is None else 5)
                self._emit(0, ev)
                self.history.append((ts, 0, ev))
                return
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
        if self.ungated and table in TABLE_DISPATCHED:  # by table: see the module docstring
            part = zlib.crc32(table.encode()) % self.parts
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
             with_ddl: bool = True, rows_per_message: int = 4, registry: Any = None,
             topic_prefix: str | None = None, mid_stream: bool = False, bootstrap_every: int = 50) -> Workload:
    """A complete changefeed: DDL, ``txns`` transactions with resolved ts at a cadence, replays, final resolved.

    ``protocol`` is one of :data:`PROTOCOLS` (see the module docstring). ``avro`` needs ``registry`` (an object
    with ``register(subject, schema) -> id``, e.g. :class:`applier.codecs.registry.RegistryClient`; the schemas
    are registered while generating) and ``topic_prefix`` (its topics are ``<topic_prefix>-<table>``).
    Simple only: ``bootstrap_every`` transactions between periodic BOOTSTRAPs (0: none besides the first),
    ``mid_stream`` to leave out the CREATE TABLEs and the first BOOTSTRAP (they go to ``target_ddl``).
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; one of {', '.join(PROTOCOLS)}")
    simple = protocol in ("simple", "simple-avro")
    if protocol == "avro" and (registry is None or not topic_prefix):
        raise ValueError("the avro workload needs registry= (e.g. a RegistryClient) and topic_prefix=")
    if mid_stream and not simple:
        raise ValueError("mid_stream is for the simple protocol (the only one that holds rows for a schema)")
    g = _Gen(protocol, partitions, seed, rows_per_message, registry=registry, topic_prefix=topic_prefix,
             mid_stream=mid_stream)
    if with_ddl:
        g.ddl("orders", ORDERS_DDL)
        g.ddl("customers", CUSTOMERS_DDL)
        g.ddl("audit_log", AUDIT_DDL)
    if simple and not mid_stream:
        g.bootstrap()  # TiCDC bootstraps a table when it first writes it
    g.resolved()
    customers_next, order_next = [1], [1]
    replay_at = set(g.rng.sample(range(10, max(11, txns)), min(replays, max(0, txns - 10))))
    alter_at = txns // 2 if with_ddl else -1
    for i in range(txns):
        if simple and bootstrap_every > 0 and i and i % bootstrap_every == 0:
            g.flush_all()
            g.bootstrap()
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
    if protocol == "avro":
        g.wl.topics = list(dict.fromkeys(m[3] for m in g.wl.messages))
    return g.wl


def produce(bootstrap: str, topic: str | None, messages: Iterable[Message], *,
            partitions: int, create: bool = True, on_progress: Callable[[int], None] | None = None) -> int:
    """Write messages with their partitions, creating their topics first (``partitions`` each; an existing
    topic is fine). Returns the count.

    A message is (partition, key, value) for ``topic``, or (partition, key, value, topic) naming its own topic
    (avro's one topic per table; ``topic`` may then be None). ``topic`` is created up front, a message's own
    topic when it first appears."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap}) if create else None
    known: set[str] = set()

    def ensure(name: str) -> None:
        known.add(name)
        if admin is None:
            return
        fut = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name]
        try:
            fut.result(30)
        except Exception as exc:  # an existing topic is fine
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise

    if topic is not None:
        ensure(topic)
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True,
                     "compression.type": "lz4", "message.max.bytes": 10_000_000})
    n = 0
    for msg in messages:
        if len(msg) > 3:
            part, key, value, dest = msg  # type: ignore[misc]
            if dest not in known:
                ensure(dest)
        elif topic is None:
            raise ValueError("a (partition, key, value) message needs the topic argument")
        else:
            part, key, value = msg  # type: ignore[misc]
            dest = topic
        while True:
            try:
                prod.produce(dest, value=value, key=key, partition=part)
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
        raise RuntimeError(f"{left} message(s) to {', '.join(sorted(known))} were not acknowledged by {bootstrap}")
    return n


def apply_target_ddl(engine: Any, ddls: Iterable[DDL], route: Callable[[str, str], tuple[str, str] | None]) -> None:
    """What the operator does for DDL the stream does not carry (:attr:`Workload.target_ddl`): run each upstream
    DDL on the target, translated for its dialect and routed by ``route`` (e.g. ``settings.router().route``)
    with the applier's own DDL translator. Nothing is recorded in the applier's tables."""
    from applier.ddl import translate
    from applier.sinks import sink_for
    from applier.sinks.base import VERBATIM

    sink = sink_for(engine)
    with engine.connect() as conn:
        dialect = sink.ddl_dialect(conn)
        for ev in ddls:
            tr = translate(dialect, ev.query, schema=ev.schema, table=ev.table, route=route)
            if tr.kind == "create_table":
                for schema in dict.fromkeys(s for s, _ in tr.targets):
                    sink.prepare_schema(conn, schema)
            for stmt in tr.statements:
                conn.exec_driver_sql(stmt, execution_options=VERBATIM)
            conn.commit()


# ---------------------------------------------------------------------------------------------------------
# Benchmark workload (``python -m applier.bench``): millions of events streamed, a compact expected state.
#
# The generator above keeps every message and the final rows in memory, which is right for tests and wrong for
# a 2M-event benchmark. ``generate_bench`` yields the messages instead, and keeps per table only an array of
# row versions (8 bytes per key ever used) plus a live-key list: a row's values are a pure function of
# (seed, table, key, version) (``bench_row``), so any earlier image can be rebuilt on demand. The expected final
# state is a per-table ``TableChecksum`` (row count + sum of 64-bit row digests, maintained incrementally),
# and the benchmark computes the same checksum from the target's rows.
# ---------------------------------------------------------------------------------------------------------

import array as _array
import collections as _collections
import hashlib as _hashlib
from typing import Iterator as _Iterator, Mapping as _Mapping

BENCH_SCHEMA = "bench"

#: (name, event Column, upstream SQL type, checksum kind): mixed types, one primary key
_BENCH_SPEC: tuple[tuple[str, Column, str, str], ...] = (
    ("id", Column("id", "bigint", nullable=False, key=True), "BIGINT NOT NULL", "int"),
    ("grp", Column("grp", "int", nullable=False, unsigned=True), "INT UNSIGNED NOT NULL", "int"),
    ("name", Column("name", "varchar", nullable=False), "VARCHAR(64) NOT NULL", "str"),
    ("amount", Column("amount", "decimal", nullable=False), "DECIMAL(14,2) NOT NULL", "dec2"),
    ("ratio", Column("ratio", "double", nullable=False), "DOUBLE NOT NULL", "float"),
    ("created", Column("created", "datetime", nullable=False), "DATETIME(6) NOT NULL", "datetime"),
    ("day", Column("day", "date", nullable=False), "DATE NOT NULL", "date"),
    ("flag", Column("flag", "tinyint", nullable=False), "TINYINT NOT NULL", "int"),
    ("note", Column("note", "text"), "TEXT NULL", "str"),
    ("payload", Column("payload", "varbinary", binary=True), "VARBINARY(64) NULL", "bytes"),
    ("ver", Column("ver", "bigint", nullable=False), "BIGINT NOT NULL", "int"),
)
BENCH_COLUMNS: tuple[Column, ...] = tuple(s[1] for s in _BENCH_SPEC)
BENCH_COLUMN_NAMES: tuple[str, ...] = tuple(s[0] for s in _BENCH_SPEC)
BENCH_KINDS: dict[str, str] = {s[0]: s[3] for s in _BENCH_SPEC}

_M64 = (1 << 64) - 1
_CENT = Decimal("0.01")
_BENCH_EPOCH = dt.datetime(2020, 1, 1)
_BENCH_DAY0 = dt.date(2000, 1, 1)
_BENCH_NAMES = ("ann", "bo", "zoë", "ξένια", "李", "o'brien", "tab\there", "back\\slash")
_BENCH_NOTES = ("", "gift ☃", "rush order", "naïve 🚀", "line\nbreak", "plain ascii note for the benchmark")


def bench_table_ddl(table: str) -> str:
    cols = ", ".join(f"`{name}` {sql}" for name, _, sql, _ in _BENCH_SPEC)
    return f"CREATE TABLE `{table}` ({cols}, PRIMARY KEY (`id`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-mixed 64-bit hash of an int."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def bench_row(table: int, key: int, version: int, seed: int = 0) -> dict[str, Any]:
    """The values of row ``key`` of bench table number ``table`` at ``version`` (a pure function)."""
    h = _mix64((seed * 0x9E3779B97F4A7C15 + table * 0xD1B54A32D192ED03 + key * 0xABC98388FB8FAC03 + version) & _M64)
    g = _mix64(h ^ 0x5851F42D4C957F2D)
    return {
        "id": key,
        "grp": h & 0xFFFFFFFF,  # INT UNSIGNED: half of them above 2**31
        "name": _BENCH_NAMES[(h >> 32) & 7] + str(key % 1000),
        "amount": Decimal((h >> 20) % 10**13 - 5 * 10**12).scaleb(-2),
        "ratio": ((g & 0xFFFFF) - 0x80000) / 64.0,  # exact in binary and in short decimal
        "created": _BENCH_EPOCH + dt.timedelta(microseconds=(g >> 20) % (5 * 365 * 86400 * 10**6)),
        "day": _BENCH_DAY0 + dt.timedelta(days=(g >> 8) % 18000),
        "flag": ((g >> 56) & 0xFF) - 128,
        "note": None if h % 5 == 0 else _BENCH_NOTES[(h >> 3) % len(_BENCH_NOTES)] * (1 + (g >> 2) % 3),
        "payload": None if h % 7 == 0 else g.to_bytes(8, "little") * (1 + (h >> 8) % 4),
        "ver": version,
    }


def bench_canonical(row: _Mapping[str, Any]) -> bytes:
    """One text form of a bench row whatever the driver returned (Decimal/int, bytes/memoryview, ...)."""
    parts = []
    for name in BENCH_COLUMN_NAMES:
        v = row[name]
        kind = BENCH_KINDS[name]
        if v is None:
            parts.append("\\N")
        elif kind == "int":
            parts.append(str(int(v)))
        elif kind == "dec2":
            parts.append(str(Decimal(v).quantize(_CENT)))
        elif kind == "float":
            parts.append(repr(float(v)))
        elif kind == "datetime":
            parts.append(v.isoformat(sep=" ", timespec="microseconds"))
        elif kind == "date":
            parts.append(v.isoformat())
        elif kind == "bytes":
            parts.append(bytes(v).hex())
        else:
            parts.append(str(v))
    return "\x1f".join(parts).encode("utf-8", "surrogatepass")


def bench_row_digest(row: _Mapping[str, Any]) -> int:
    return int.from_bytes(_hashlib.blake2b(bench_canonical(row), digest_size=8).digest(), "little")


@dataclass
class TableChecksum:
    """Order-independent checksum of a set of rows: count and sum of row digests mod 2**64."""

    rows: int = 0
    digest_sum: int = 0

    def add(self, row: _Mapping[str, Any]) -> None:
        self.rows += 1
        self.digest_sum = (self.digest_sum + bench_row_digest(row)) & _M64

    def remove(self, row: _Mapping[str, Any]) -> None:
        self.rows -= 1
        self.digest_sum = (self.digest_sum - bench_row_digest(row)) & _M64

    def __str__(self) -> str:
        return f"{self.rows} rows / {self.digest_sum:016x}"


def bench_checksum(rows: Iterable[_Mapping[str, Any]]) -> TableChecksum:
    cs = TableChecksum()
    for r in rows:
        cs.add(r)
    return cs


@dataclass
class BenchStats:
    messages: int = 0
    bytes: int = 0  # key + value bytes
    row_events: int = 0  # distinct upstream row changes (first sending)
    duplicate_row_events: int = 0  # row changes sent again by replays
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    key_changes: int = 0  # PK-changing updates (sent as delete + insert, counted in both)
    transactions: int = 0
    largest_txn_rows: int = 0
    resolved_messages: int = 0
    ddl_messages: int = 0
    replays: int = 0


class _BenchTable:
    __slots__ = ("idx", "name", "ver", "live", "pos", "next_key", "checksum")

    def __init__(self, idx: int, name: str) -> None:
        self.idx = idx
        self.name = name
        self.ver = _array.array("q")  # per key ever used: current version, 0 = absent
        self.live = _array.array("q")  # live keys (unordered)
        self.pos = _array.array("q")  # per key: index in live, -1 = absent
        self.next_key = 0
        self.checksum = TableChecksum()


class BenchWorkload:
    """A large TiCDC-shaped changefeed, produced lazily by :meth:`messages`.

    * ``tables`` tables ``t00``.. of one mixed-type shape (:func:`bench_table_ddl`), CREATE TABLE broadcast;
    * ``events`` distinct row changes (replays come on top), of which ``big_txn_rows`` in one upstream
      transaction placed 40% of the way through (85% inserts, 15% updates of distinct keys);
    * other transactions of varying size (80% 1-4 rows, 17% 5-50, 3% 50-500) over random tables, ops drawn
      from the ``mix`` (insert, update, delete); ``key_change_fraction`` of updates change the primary key
      (TiCDC sends delete + insert); ``hot_fraction`` of updates hit the table's first ``hot_keys`` keys;
    * rows dispatched to partitions by key; Open Protocol batches up to ``rows_per_message`` rows per message
      (TiCDC's max-batch-size), Canal-JSON one row per message;
    * resolved ts broadcast every ``resolved_interval_ms`` of upstream time (TiCDC's cadence is about 1 s);
    * ``replays`` TiCDC restarts spread over the stream: an older resolved ts, then the most recent messages
      of every partition again, sized so that about ``dup_fraction`` of the row changes are duplicates.

    After :meth:`messages` is exhausted, ``expected`` holds the per-table checksum of the final state,
    ``final_ts`` the last resolved ts and ``stats`` the counts.
    """

    def __init__(self, protocol: str, *, tables: int = 8, partitions: int = 6, events: int = 100_000,
                 big_txn_rows: int = 0, seed: int = 1, mix: tuple[float, float, float] = (0.5, 0.35, 0.15),
                 hot_keys: int = 64, hot_fraction: float = 0.5, key_change_fraction: float = 0.05,
                 dup_fraction: float = 0.005, replays: int = 8, resolved_interval_ms: int = 1000,
                 rows_per_message: int = 16, schema: str = BENCH_SCHEMA) -> None:
        if protocol not in ("open", "canal-json"):
            raise ValueError(f"protocol must be open or canal-json, not {protocol!r}")
        if tables < 1 or partitions < 1 or events < 0 or big_txn_rows < 0:
            raise ValueError("tables and partitions must be >= 1, events and big_txn_rows >= 0")
        if big_txn_rows > events:
            raise ValueError(f"big_txn_rows ({big_txn_rows}) cannot exceed events ({events})")
        total = sum(mix)
        if len(mix) != 3 or total <= 0 or min(mix) < 0:
            raise ValueError("mix is three non-negative weights (insert, update, delete)")
        self.protocol = protocol
        self.n_tables = tables
        self.partitions = partitions
        self.events = events
        self.big_txn_rows = big_txn_rows
        self.seed = seed
        self.mix = (mix[0] / total, (mix[0] + mix[1]) / total)
        self.hot_keys = hot_keys
        self.hot_fraction = hot_fraction
        self.key_change_fraction = key_change_fraction
        self.dup_fraction = dup_fraction
        self.replays = max(1, replays)
        # rows re-sent per replay, and per partition per replay (each partition re-sends its recent suffix)
        self.replay_rows = dup_fraction * max(0, events) / self.replays
        self.replay_part_rows = max(1, int(self.replay_rows / partitions))
        self.resolved_interval_ms = resolved_interval_ms
        self.rows_per_message = max(1, rows_per_message)
        self.schema = schema
        self.table_names = [f"t{i:02d}" for i in range(tables)]
        self.stats = BenchStats()
        self.expected: dict[str, TableChecksum] = {}
        self.final_ts = 0
        self._used = False

    # -- public -----------------------------------------------------------------------------------------
    def messages(self) -> _Iterator[tuple[int, bytes | None, bytes]]:
        """(partition, key, value) in the order TiCDC would write them. Single use."""
        if self._used:
            raise RuntimeError("BenchWorkload.messages() can be iterated once")
        self._used = True
        from applier.codecs.canal_json import encode_canal_json
        from applier.codecs.open import encode_open, encode_open_batch

        self._enc_canal, self._enc_open, self._enc_open_batch = encode_canal_json, encode_open, encode_open_batch
        self.rng = random.Random(self.seed)
        self.ts_ms = 1_700_000_000_000
        self.last_resolved_ms = self.ts_ms
        self.prev_resolved_ts = 0
        self.out: list[tuple[int, bytes | None, bytes]] = []
        self.pending: list[list[RowChange]] = [[] for _ in range(self.partitions)]
        self.ring = [_collections.deque() for _ in range(self.partitions)]
        self.ring_rows = [0] * self.partitions
        self.dup_credit = 0.0
        self.positions = [SourcePosition("", p, 0) for p in range(self.partitions)]
        self.tables = [_BenchTable(i, n) for i, n in enumerate(self.table_names)]

        ts = self._next_ts()
        for t in self.tables:
            for p in range(self.partitions):
                self._emit_single(p, DDL(self.schema, t.name, ts, bench_table_ddl(t.name), self.positions[p], ddl_type=3))
                self.stats.ddl_messages += 1
        self._resolved()
        yield from self._drain()

        big_at = (self.events - self.big_txn_rows) * 2 // 5 if self.big_txn_rows else -1
        done = 0
        small_budget = self.events - self.big_txn_rows
        while done < small_budget or big_at >= 0:
            if big_at >= 0 and done >= big_at:
                yield from self._big_txn()
                big_at = -1
            elif done < small_budget:
                done += self._txn(min(self._txn_size(), small_budget - done))
            self._after_txn()
            yield from self._drain()
        self._flush_all()
        self.ts_ms += 1
        self._resolved()
        yield from self._drain()
        self.final_ts = tso(self.ts_ms, 0x3FFFF)
        self.expected = {t.name: t.checksum for t in self.tables}

    def expected_rows(self, table: str) -> _Iterator[dict[str, Any]]:
        """The expected final rows of one table, rebuilt from the version array (after :meth:`messages`)."""
        t = self.tables[self.table_names.index(table)]
        for k in t.live:
            yield bench_row(t.idx, k, t.ver[k], self.seed)

    # -- time, resolved, replays -------------------------------------------------------------------------
    def _next_ts(self) -> int:
        self.ts_ms += self.rng.randint(1, 3)
        return tso(self.ts_ms, self.rng.randint(0, 1000))

    def _resolved(self) -> None:
        self._flush_all()
        ts = tso(self.ts_ms, 0x3FFFF)
        for p in range(self.partitions):
            self._emit_single(p, Resolved(ts, self.positions[p]))
            self.stats.resolved_messages += 1
        self.prev_resolved_ts = ts
        self.last_resolved_ms = self.ts_ms

    def _after_txn(self) -> None:
        if self.ts_ms - self.last_resolved_ms >= self.resolved_interval_ms:
            self._resolved()
        if self.dup_fraction > 0 and self.dup_credit >= self.replay_rows and sum(self.ring_rows):
            self._replay()

    def _replay(self) -> None:
        """A TiCDC restart: an older resolved ts on every partition, then each partition's recent messages again
        (a suffix of the partition, so every later change of a replayed key is replayed too)."""
        self._flush_all()
        self.stats.replays += 1
        old = max(0, self.prev_resolved_ts - (self.resolved_interval_ms << 18))
        for p in range(self.partitions):
            self._emit_single(p, Resolved(old, self.positions[p]), remember=False)
            self.stats.resolved_messages += 1
            for key, value, nrows in list(self.ring[p]):
                self._out(p, key, value, nrows, remember=False)
                self.stats.duplicate_row_events += nrows
                self.dup_credit -= nrows
            self.ring[p].clear()
            self.ring_rows[p] = 0

    # -- encoding ------------------------------------------------------------------------------------------
    def _out(self, part: int, key: bytes | None, value: bytes, nrows: int, remember: bool = True) -> None:
        self.out.append((part, key, value))
        self.stats.messages += 1
        self.stats.bytes += len(value) + (len(key) if key else 0)
        if remember:
            ring = self.ring[part]
            ring.append((key, value, nrows))
            self.ring_rows[part] += nrows
            # keep just the suffix a replay re-sends (about replay_part_rows rows; bounded in messages too)
            while len(ring) > 1 and (self.ring_rows[part] - ring[0][2] >= self.replay_part_rows or len(ring) > 4096):
                self.ring_rows[part] -= ring.popleft()[2]

    def _emit_single(self, part: int, ev: Any, remember: bool = True) -> None:
        self._flush(part)
        if self.protocol == "open":
            k, v = self._enc_open(ev)
        else:
            k, v = self._enc_canal(ev, build_ts_ms=self.ts_ms)
        self._out(part, k, v, 0, remember)

    def _emit_row(self, t: _BenchTable, ts: int, op: Op, key: int, before: dict | None, after: dict | None) -> None:
        part = (key * 0x9E3779B1 + t.idx * 0x85EBCA6B) % self.partitions
        ev = RowChange(self.schema, t.name, ts, op, before, after, BENCH_COLUMNS, self.positions[part])
        self.stats.row_events += 1
        if self.protocol == "open":
            pend = self.pending[part]
            pend.append(ev)
            if len(pend) >= self.rows_per_message:
                self._flush(part)
        else:
            k, v = self._enc_canal(ev, build_ts_ms=ts >> 18)
            self._out(part, k, v, 1)

    def _flush(self, part: int) -> None:
        pend = self.pending[part]
        if pend:
            k, v = self._enc_open_batch(pend)
            self._out(part, k, v, len(pend))
            self.pending[part] = []

    def _flush_all(self) -> None:
        for p in range(self.partitions):
            self._flush(p)

    def _drain(self) -> _Iterator[tuple[int, bytes | None, bytes]]:
        out, self.out = self.out, []
        yield from out

    # -- the upstream application --------------------------------------------------------------------------
    def _txn_size(self) -> int:
        r = self.rng.random()
        if r < 0.80:
            return self.rng.randint(1, 4)
        if r < 0.97:
            return self.rng.randint(5, 50)
        return self.rng.randint(50, 500)

    def _insert(self, t: _BenchTable, ts: int) -> None:
        k = t.next_key
        t.next_key += 1
        t.ver.append(1)
        t.pos.append(len(t.live))
        t.live.append(k)
        row = bench_row(t.idx, k, 1, self.seed)
        t.checksum.add(row)
        self.stats.inserts += 1
        self._emit_row(t, ts, Op.INSERT, k, None, row)

    def _update(self, t: _BenchTable, ts: int, k: int) -> None:
        v = t.ver[k]
        old = bench_row(t.idx, k, v, self.seed)
        new = bench_row(t.idx, k, v + 1, self.seed)
        t.ver[k] = v + 1
        t.checksum.remove(old)
        t.checksum.add(new)
        self.stats.updates += 1
        self._emit_row(t, ts, Op.UPDATE, k, old, new)

    def _delete(self, t: _BenchTable, ts: int, k: int) -> None:
        old = bench_row(t.idx, k, t.ver[k], self.seed)
        t.ver[k] = 0
        i = t.pos[k]
        last = t.live.pop()
        if last != k:
            t.live[i] = last
            t.pos[last] = i
        t.pos[k] = -1
        t.checksum.remove(old)
        self.stats.deletes += 1
        self._emit_row(t, ts, Op.DELETE, k, old, None)

    def _pick(self, t: _BenchTable, touched: set, *, hot: bool) -> int | None:
        rng = self.rng
        if hot and t.next_key and rng.random() < self.hot_fraction:
            k = rng.randrange(min(self.hot_keys, t.next_key))
            if t.ver[k] and (t.idx, k) not in touched:
                return k
        for _ in range(4):
            if not t.live:
                return None
            k = t.live[rng.randrange(len(t.live))]
            if (t.idx, k) not in touched and (hot or k >= self.hot_keys):
                return k
        return None

    def _txn(self, size: int) -> int:
        """One upstream transaction of about ``size`` row changes; returns how many it made."""
        rng = self.rng
        ts = self._next_ts()
        touched: set[tuple[int, int]] = set()
        n = 0
        while n < size:
            t = self.tables[rng.randrange(self.n_tables)]
            r = rng.random()
            k = None
            if r >= self.mix[0] and len(t.live) > 2 * self.hot_keys:
                k = self._pick(t, touched, hot=r < self.mix[1])
            if k is None:
                touched.add((t.idx, t.next_key))
                self._insert(t, ts)
                n += 1
            elif r < self.mix[1] and not (rng.random() < self.key_change_fraction and k >= self.hot_keys and n + 2 <= size):
                touched.add((t.idx, k))
                self._update(t, ts, k)
                n += 1
            elif r < self.mix[1]:
                # a primary-key change: TiCDC's MQ sinks send it as delete(old key) + insert(new key)
                touched.add((t.idx, k))
                touched.add((t.idx, t.next_key))
                self._delete(t, ts, k)
                self._insert(t, ts)
                self.stats.key_changes += 1
                n += 2
            else:
                touched.add((t.idx, k))
                self._delete(t, ts, k)
                n += 1
        self._txn_done(n)
        return n

    def _txn_done(self, n: int) -> None:
        self.stats.transactions += 1
        self.stats.largest_txn_rows = max(self.stats.largest_txn_rows, n)
        self.dup_credit += self.dup_fraction * n

    def _big_txn(self) -> _Iterator[tuple[int, bytes | None, bytes]]:
        """One transaction of ``big_txn_rows`` changes: inserts, and updates of distinct existing keys."""
        ts = self._next_ts()
        cursors = [0] * self.n_tables
        limits = [len(t.live) for t in self.tables]
        for i in range(self.big_txn_rows):
            t = self.tables[i % self.n_tables]
            if i % 100 < 15 and cursors[t.idx] < limits[t.idx]:
                k = t.live[cursors[t.idx]]  # inserts only append past limits, so these keys are distinct
                cursors[t.idx] += 1
                self._update(t, ts, k)
            else:
                self._insert(t, ts)
            if len(self.out) >= 1024:
                yield from self._drain()
        self._txn_done(self.big_txn_rows)
        yield from self._drain()


def generate_bench(protocol: str, **options: Any) -> BenchWorkload:
    """A large benchmark changefeed; iterate ``.messages()`` (once) and then read ``.expected``."""
    return BenchWorkload(protocol, **options)
