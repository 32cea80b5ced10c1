"""A TiCDC-shaped changefeed generator for the demo and the end-to-end tests, with its expected final tables.

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

From the command line, a sample changefeed goes into a topic of one's own, to try a configuration against it::

    python -m applier.devtools.changefeed --bootstrap HOST:PORT --topic T --protocol canal-json
        [--partitions 3] [--txns 300] [--seed 7] [--start-ms MS] [--registry URL (avro)] [--expected FILE]

It creates the topic when it is missing (``--partitions`` partitions; an existing topic must have at least that
many), writes the messages and prints what it wrote, the ``[source]`` settings that read it, and the tables a
replica of it ends with (``--expected FILE``: their rows as JSON). ``avro`` writes one topic per table, named
``<T>-<table>``, and registers its schemas with the registry at ``--registry``.

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
from typing import Any, Callable, Iterable, Mapping

from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition, TableSchema

SCHEMA = "shop"

ORDERS_DDL = ("CREATE TABLE `orders` (`id` INT NOT NULL, `customer` VARCHAR(64) NOT NULL, "
              "`amount` DECIMAL(12,2) NOT NULL, `note` TEXT NULL, `created` DATETIME(6) NOT NULL, "
              "PRIMARY KEY (`id`) /*T![clustered_index] CLUSTERED */) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")
CUSTOMERS_DDL = ("CREATE TABLE `customers` (`id` BIGINT NOT NULL, `email` VARCHAR(128) NOT NULL, "
                 "`name` VARCHAR(64) NULL, PRIMARY KEY (`id`), UNIQUE KEY `uk_email` (`email`))")
AUDIT_DDL = "CREATE TABLE `audit_log` (`id` INT NOT NULL PRIMARY KEY, `what` VARCHAR(64))"
ALTER_DDL = "ALTER TABLE `orders` ADD COLUMN `status` VARCHAR(16) NULL"

# (``declared``: the full types of the DDL above, which Simple's table schemas carry as TiCDC fills them)
ORDERS_COLS = (
    Column("id", "int", nullable=False, key=True),
    Column("customer", "varchar", nullable=False, declared="varchar(64)"),
    Column("amount", "decimal", nullable=False, declared="decimal(12,2)"),
    Column("note", "text"),
    Column("created", "datetime", nullable=False, declared="datetime(6)"),
)
ORDERS_COLS_V2 = ORDERS_COLS + (Column("status", "varchar", declared="varchar(16)"),)
CUSTOMERS_COLS = (
    Column("id", "bigint", nullable=False, key=True),
    Column("email", "varchar", nullable=False, unique=True, declared="varchar(128)"),
    Column("name", "varchar", declared="varchar(64)"),
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
    ``changes`` is every upstream change once, in commit order (no replayed or broadcast copies): what a test needs
    to work out the tables as of a TSO (a snapshot to seed a replica with, or where ``--until-ts`` stops).
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
    changes: list[RowChange | DDL] = field(default_factory=list)

    def target_ddl_before(self, index: int) -> list[DDL]:
        """The operator's DDL that must be in place before ``messages[index]`` is read."""
        return [d for i, d in self.target_ddl if i <= index]


class _Gen:
    def __init__(self, protocol: str, partitions: int, seed: int, rows_per_message: int, *,
                 registry: Any = None, topic_prefix: str | None = None, mid_stream: bool = False,
                 omit_ddl: tuple[str, ...] = (), start_ms: int | None = None) -> None:
        from applier.devtools.encoders.open import encode_open, encode_open_batch
        self.protocol = protocol
        self.parts = partitions
        self.rng = random.Random(seed)
        self.wl = Workload(protocol, partitions)
        self.ts_ms = int(time.time() * 1000) - 60_000 if start_ms is None else start_ms
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
        self.omit_ddl = frozenset(k.upper() for k in omit_ddl)
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
            from applier.devtools.encoders.avro import AvroEncoder, ColumnSpec
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
        from applier.devtools.encoders.canal_json import encode_canal_json
        return encode_canal_json(ev)

    def _encode_more(self, part: int, ev: Any) -> list[Message]:
        """The messages of one event in the protocols other than open/canal-json."""
        proto = self.protocol
        if proto == "canal-json-noext":
            from applier.devtools.encoders.canal_json import encode_canal_json
            return [(part, *encode_canal_json(ev, enable_tidb_extension=False, build_ts_ms=self._build_ms(ev)))]
        if proto in ("simple", "simple-avro"):
            from applier.devtools.encoders.simple import encode_simple
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
            from applier.devtools.encoders.debezium import encode_debezium
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
        self.wl.changes.append(DDL(SCHEMA, table, ts, query, SourcePosition("", 0, 0)))
        omitted = query.split()[0].upper() in self.omit_ddl
        if self.protocol in ("open", "canal-json") and omitted:
            ev = DDL(SCHEMA, table, ts, query, SourcePosition("", 0, 0), ddl_type=3 if "CREATE" in query else 5)
            self.wl.target_ddl.append((len(self.wl.messages), ev))
            return
        if self.protocol not in ("open", "canal-json"):
            before = None if query.startswith("CREATE") else self.table_cols[table]
            after = TABLE_COLS[table] if before is None else ALTER_COLS[query]
            self.table_cols[table] = after
            self.ddl_schemas[(ts, table, query)] = (before, after)
            self.table_schema(table, after, version=ts)
            carried = not (self.protocol == "avro" or (self.mid_stream and before is None) or omitted)
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
        self.wl.changes.append(ev)
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
             topic_prefix: str | None = None, mid_stream: bool = False, bootstrap_every: int = 50,
             omit_ddl: tuple[str, ...] = (), start_ms: int | None = None) -> Workload:
    """A complete changefeed: DDL, ``txns`` transactions with resolved ts at a cadence, replays, final resolved.

    ``protocol`` is one of :data:`PROTOCOLS` (see the module docstring). ``avro`` needs ``registry`` (an object
    with ``register(subject, schema) -> id``, e.g. :class:`applier.codecs.registry.RegistryClient`; the schemas
    are registered while generating) and ``topic_prefix`` (its topics are ``<topic_prefix>-<table>``).
    Simple only: ``bootstrap_every`` transactions between periodic BOOTSTRAPs (0: none besides the first),
    ``mid_stream`` to leave out the CREATE TABLEs and the first BOOTSTRAP (they go to ``target_ddl``).
    ``omit_ddl``: statement kinds ("CREATE", "ALTER") the stream leaves out (they go to ``target_ddl``), as when a
    changefeed starts after them; the rows still carry the columns they add (schema from the stream).
    ``start_ms``: the physical time of the first commit ts (ms since the epoch; default a minute ago): with the
    same ``seed`` and options the same stream again, timestamps included.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; one of {', '.join(PROTOCOLS)}")
    simple = protocol in ("simple", "simple-avro")
    if protocol == "avro" and (registry is None or not topic_prefix):
        raise ValueError("the avro workload needs registry= (e.g. a RegistryClient) and topic_prefix=")
    if mid_stream and not simple:
        raise ValueError("mid_stream is for the simple protocol (the only one that holds rows for a schema)")
    g = _Gen(protocol, partitions, seed, rows_per_message, registry=registry, topic_prefix=topic_prefix,
             mid_stream=mid_stream, omit_ddl=omit_ddl, start_ms=start_ms)
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
            partitions: int, create: bool = True, on_progress: Callable[[int], None] | None = None,
            client: Mapping[str, Any] | None = None) -> int:
    """Write messages with their partitions, creating their topics first (``partitions`` each; an existing
    topic is fine). Returns the count. ``client``: librdkafka settings added to the producer's and the admin
    client's (a secured broker's login and trust: applier.devtools.services.kafka.Broker.client_config).

    A message is (partition, key, value) for ``topic``, or (partition, key, value, topic) naming its own topic
    (avro's one topic per table; ``topic`` may then be None). ``topic`` is created up front, a message's own
    topic when it first appears."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    # log_level 3: librdkafka's errors only (not its notes such as an idempotent producer's "Coordinator load in
    # progress: retrying" on a fresh broker)
    extra = {k: v for k, v in (client or {}).items() if k != "bootstrap.servers"}
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3, **extra}) if create else None
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
                     "compression.type": "lz4", "message.max.bytes": 10_000_000, "log_level": 3, **extra})
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
    DDL on the target, translated for its dialect and routed by ``route`` (e.g.
    ``applier.pipeline.router_for(settings).route``) with the applier's own DDL translator. Nothing is recorded
    in the applier's tables."""
    from applier.dialect import dialect_for
    from applier.sinks.base import VERBATIM

    dialect = dialect_for(engine)
    sink = dialect.writer()
    with engine.connect() as conn:
        for ev in ddls:
            tr = dialect.translate_ddl(ev.query, schema=ev.schema, table=ev.table, route=route)
            if tr.kind == "create_table":
                for schema in dict.fromkeys(s for s, _ in tr.targets):
                    sink.prepare_schema(conn, schema)
            for stmt in tr.statements:
                conn.exec_driver_sql(stmt, execution_options=VERBATIM)
            conn.commit()


# ---- the command line: a sample changefeed into a topic of one's own --------------------------------------------

SAMPLE_DEFAULTS = {"partitions": 3, "txns": 300, "seed": 7}


def _toml(v: Any) -> str:
    import json

    return json.dumps(v) if isinstance(v, (str, bool, int, float)) else json.dumps(str(v))


def describe(wl: Workload, bootstrap: str, topic: str, written: int) -> str:
    """What :func:`main` prints: the messages written, the ``[source]`` that reads them, the expected tables."""
    topics = wl.topics or [topic]
    lines = [f"wrote {written} TiCDC {wl.protocol} messages ({wl.events} events) to {', '.join(topics)} on "
             f"{bootstrap} ({wl.partitions} partition(s) each)",
             "",
             "read it with (consistency: " + ("transactional, resolved-ts gated)" if wl.gated else
                                             "per-key order: this protocol has no watermark)"),
             "  [source]",
             f"  bootstrap_servers = {_toml(bootstrap)}",
             f"  topics = [{', '.join(_toml(t) for t in topics)}]",
             f"  protocol = {_toml(wl.source_protocol)}"]
    if wl.codec:
        lines.append("  [source.codec]")
        lines += [f"  {k} = {_toml(v)}" for k, v in sorted(wl.codec.items())]
    lines += ["  [[route]]", '  match = "shop.*"', '  schema = "shop_replica"    # any target schema',
              "  [[route]]", '  match = "shop.audit_*"     # shop.audit_log is in the stream, not in the tables below',
              "  ignore = true"]
    if wl.target_ddl:
        lines += ["", "the stream carries no DDL for these: create the tables in the target first (the applier's "
                  "translation of this upstream DDL), or set [target] schema_evolution = \"evolve\":"]
        lines += [f"  {d.query}" for _, d in wl.target_ddl]
    total = sum(len(rows) for rows in wl.expected.values())
    lines += ["", f"expected tables once everything is applied ({total} rows; upstream schema {SCHEMA}):"]
    lines += [f"  {SCHEMA}.{t}: {len(rows)} rows, {wl.row_changes.get(t, 0)} row changes"
              for t, rows in sorted(wl.expected.items())]
    return "\n".join(lines)


def write_expected(path: str, wl: Workload) -> None:
    import json

    doc = {f"{SCHEMA}.{t}": [row for _, row in sorted(rows.items(), key=lambda kv: repr(kv[0]))]
           for t, rows in sorted(wl.expected.items())}
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, default=str)


def _topic_partitions(bootstrap: str, topic: str) -> int | None:
    """How many partitions ``topic`` has (None: it does not exist)."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3}).list_topics(timeout=30)
    t = meta.topics.get(topic)
    return None if t is None or t.error is not None else len(t.partitions)


def _unreachable(bootstrap: str) -> str:
    """'' when a bootstrap server accepts a connection, else what each said (librdkafka would retry for ever)."""
    import socket

    errors = []
    for item in bootstrap.split(","):
        host, _, port = item.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                return ""
        except (OSError, ValueError) as exc:
            errors.append(f"{item.strip()} ({getattr(exc, 'strerror', None) or exc})")
    return ", ".join(errors)


def main(argv: list[str] | None = None) -> int:
    """``python -m applier.devtools.changefeed``: see the module docstring. Exit 0 written, 2 a bad option or
    a topic with too few partitions, 5 Kafka (or the registry) unreachable."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m applier.devtools.changefeed",
                                 description="Write a sample TiCDC changefeed (several tables, DDL, key-changing "
                                 "updates, at-least-once replays) into a Kafka topic, to try an applier "
                                 "configuration against it.")
    ap.add_argument("--bootstrap", required=True, metavar="HOST:PORT", help="Kafka bootstrap server(s)")
    ap.add_argument("--topic", required=True, help="the topic (created when missing); avro: the prefix of its "
                    "per-table topics")
    ap.add_argument("--protocol", default="canal-json", choices=PROTOCOLS,
                    help="canal-json (with the TiDB extension), canal-json-noext, open, simple, simple-avro, "
                    "debezium, avro (default canal-json)")
    ap.add_argument("--partitions", type=int, default=SAMPLE_DEFAULTS["partitions"],
                    help="partitions of a topic created here, and the partitions the changefeed dispatches to")
    ap.add_argument("--txns", type=int, default=SAMPLE_DEFAULTS["txns"], help="upstream transactions (default 300)")
    ap.add_argument("--seed", type=int, default=SAMPLE_DEFAULTS["seed"], help="random seed (the same seed and "
                    "options write the same rows)")
    ap.add_argument("--start-ms", type=int, metavar="MS", help="physical time of the first commit ts, in ms since "
                    "the epoch (default: a minute ago); with the same --seed the same stream, timestamps included")
    ap.add_argument("--registry", metavar="URL", help="schema registry (Confluent API) for --protocol avro")
    ap.add_argument("--expected", metavar="FILE", help="also write the expected tables' rows as JSON")
    args = ap.parse_args(argv)
    if args.partitions < 1 or args.txns < 1:
        print("--partitions and --txns must be at least 1", file=sys.stderr)
        return 2
    registry = None
    if args.protocol == "avro":
        if not args.registry:
            print("--protocol avro needs --registry URL (a Confluent-compatible schema registry)", file=sys.stderr)
            return 2
        from applier.codecs.registry import RegistryClient

        registry = RegistryClient(args.registry, timeout=10, retries=3)
    unreachable = _unreachable(args.bootstrap)
    if unreachable:
        print(f"cannot connect to Kafka at {unreachable}", file=sys.stderr)
        return 5
    try:
        if args.protocol != "avro":
            have = _topic_partitions(args.bootstrap, args.topic)
            if have is not None and have < args.partitions:
                print(f"topic {args.topic} has {have} partition(s): pass --partitions {have} (or fewer), or use a "
                      "new topic", file=sys.stderr)
                return 2
        wl = generate(args.protocol, partitions=args.partitions, txns=args.txns, seed=args.seed, registry=registry,
                      topic_prefix=args.topic if args.protocol == "avro" else None, start_ms=args.start_ms)
        n = produce(args.bootstrap, None if wl.topics else args.topic, wl.messages, partitions=args.partitions)
    except Exception as exc:  # noqa: BLE001 - Kafka or the registry: one line, not a traceback
        print(f"cannot write the changefeed to {args.bootstrap}: {exc}", file=sys.stderr)
        return 5
    print(describe(wl, args.bootstrap, args.topic, n))
    if args.expected:
        write_expected(args.expected, wl)
        print(f"expected rows written to {args.expected}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
