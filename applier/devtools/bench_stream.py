"""Benchmark workload (``python -m applier.devtools.bench``): millions of events streamed, a compact expected state.

The test generator (:mod:`applier.devtools.changefeed`) keeps every message and the final rows in memory, which is right for tests and wrong for
a 2M-event benchmark. ``generate_bench`` yields the messages instead, and keeps per table only an array of
row versions (8 bytes per key ever used) plus a live-key list: a row's values are a pure function of
(seed, table, key, version) (``bench_row``), so any earlier image can be rebuilt on demand. The expected final
state is a per-table ``TableChecksum`` (row count + sum of 64-bit row digests, maintained incrementally),
and the benchmark computes the same checksum from the target's rows.

Protocols: Open Protocol, Canal-JSON (TiDB extension), TiCDC's Simple protocol (JSON), TiCDC's Debezium JSON
with the schema envelope (``debezium``: what ``applier.devtools.bench_peer`` races the Debezium JDBC sink on) and
TiCDC's flat Avro with a Confluent schema registry (``avro``: the TiDB extension and the test-only
``avro-enable-watermark``, so the stream is gated like the others). The Debezium stream has the
shape of :data:`DEBEZIUM_BENCH_COLUMN_NAMES`, which leaves out what TiCDC's Debezium encoding cannot carry
exactly (:data:`DEBEZIUM_AVOIDS`), so that every consumer can reproduce the upstream rows.
"""

from __future__ import annotations

import array as _array
import collections as _collections
import datetime as dt
import hashlib as _hashlib
import random
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterable, Iterator as _Iterator, Mapping as _Mapping

from applier.devtools.changefeed import tso
from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition, TableSchema

BENCH_SCHEMA = "bench"
BENCH_PROTOCOLS = ("open", "canal-json", "debezium", "simple", "avro")
#: Simple protocol: a BOOTSTRAP of a table to every partition after this many of its row messages (TiCDC's
#: send-bootstrap-in-msg-count default)
SIMPLE_BOOTSTRAP_MESSAGES = 10_000

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
#: column -> MySQL type without nullability ("int unsigned", "decimal(14,2)"): what TiCDC knows from the table schema
BENCH_TYPES: dict[str, str] = {s[0]: s[2].replace(" NOT NULL", "").replace(" NULL", "").lower() for s in _BENCH_SPEC}
#: the Debezium stream's columns: the bench shape without ``payload`` (DEBEZIUM_AVOIDS says why)
DEBEZIUM_BENCH_COLUMN_NAMES: tuple[str, ...] = tuple(n for n in BENCH_COLUMN_NAMES if n != "payload")
#: what the Debezium bench stream leaves out, and why (printed by the peer bench)
DEBEZIUM_AVOIDS = (
    "BINARY/VARBINARY/BLOB columns (without the TiDB extension TiCDC sends them as base64 text in plain string "
    "fields: no consumer can tell them from text, so both would store the base64)",
    "TIME and BIT columns (the Debezium JDBC sink fails on them unless they are left out with field.exclude.list)",
    "BIGINT UNSIGNED values >= 2^63 (sent as negative int64 without the TiDB extension) and DECIMALs wider than "
    "15 digits (sent as a JSON double): the shape's INT UNSIGNED and DECIMAL(14,2) travel exactly",
)

_M64 = (1 << 64) - 1
_CENT = Decimal("0.01")
_BENCH_EPOCH = dt.datetime(2020, 1, 1)
_BENCH_DAY0 = dt.date(2000, 1, 1)
_BENCH_NAMES = ("ann", "bo", "zoë", "ξένια", "李", "o'brien", "tab\there", "back\\slash")
_BENCH_NOTES = ("", "gift ☃", "rush order", "naïve 🚀", "line\nbreak", "plain ascii note for the benchmark")


def bench_table_ddl(table: str, columns: tuple[str, ...] = BENCH_COLUMN_NAMES) -> str:
    cols = ", ".join(f"`{name}` {sql}" for name, _, sql, _ in _BENCH_SPEC if name in columns)
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


def bench_canonical(row: _Mapping[str, Any], columns: tuple[str, ...] = BENCH_COLUMN_NAMES) -> bytes:
    """One text form of a bench row whatever the driver returned (Decimal/int/float, bytes/memoryview, ...), of
    ``columns`` (the stream's shape; other columns of ``row`` are not read)."""
    parts = []
    for name in columns:
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


def bench_row_digest(row: _Mapping[str, Any], columns: tuple[str, ...] = BENCH_COLUMN_NAMES) -> int:
    return int.from_bytes(_hashlib.blake2b(bench_canonical(row, columns), digest_size=8).digest(), "little")


@dataclass
class TableChecksum:
    """Order-independent checksum of a set of rows: count and sum of row digests mod 2**64 (of ``columns``)."""

    rows: int = 0
    digest_sum: int = 0
    columns: tuple[str, ...] = BENCH_COLUMN_NAMES

    def add(self, row: _Mapping[str, Any]) -> None:
        self.rows += 1
        self.digest_sum = (self.digest_sum + bench_row_digest(row, self.columns)) & _M64

    def remove(self, row: _Mapping[str, Any]) -> None:
        self.rows -= 1
        self.digest_sum = (self.digest_sum - bench_row_digest(row, self.columns)) & _M64

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

    def __init__(self, idx: int, name: str, columns: tuple[str, ...] = BENCH_COLUMN_NAMES) -> None:
        self.idx = idx
        self.name = name
        self.ver = _array.array("q")  # per key ever used: current version, 0 = absent
        self.live = _array.array("q")  # live keys (unordered)
        self.pos = _array.array("q")  # per key: index in live, -1 = absent
        self.next_key = 0
        self.checksum = TableChecksum(columns=columns)


class BenchWorkload:
    """A large TiCDC-shaped changefeed, produced lazily by :meth:`messages`.

    * ``tables`` tables ``t00``.. of one mixed-type shape (:func:`bench_table_ddl`), CREATE TABLE broadcast;
    * ``events`` distinct row changes (replays come on top), of which ``big_txn_rows`` in one upstream
      transaction placed 40% of the way through (85% inserts, 15% updates of distinct keys);
    * other transactions of varying size (80% 1-4 rows, 17% 5-50, 3% 50-500) over random tables, ops drawn
      from the ``mix`` (insert, update, delete); ``key_change_fraction`` of updates change the primary key
      (TiCDC sends delete + insert); ``hot_fraction`` of updates hit the table's first ``hot_keys`` keys;
    * rows dispatched to partitions by key; Open Protocol batches up to ``rows_per_message`` rows per message
      (TiCDC's max-batch-size), the others one row per message;
    * Simple (JSON): the CREATE TABLEs carry the table schema, rows its version, resolved ts are WATERMARKs, and a
      table's BOOTSTRAP goes to every partition after each :data:`SIMPLE_BOOTSTRAP_MESSAGES` of its rows;
    * Debezium: TiCDC's Debezium JSON with the schema envelope, of the columns :data:`DEBEZIUM_BENCH_COLUMN_NAMES`;
      without ``tidb_extension`` (the default) no watermark is sent at all (an ungated stream, like TiCDC's), with
      it the resolved ts travel as ``op: "m"`` watermarks and every column schema carries ``tidb_type``;
    * Avro: the schemas registered in ``registry`` (``register(subject, schema) -> id``, e.g. a RegistryClient)
      under ``<topic>-key``/``<topic>-value``; TiDB extension and watermarks on (``enable_watermark`` in the
      decoder), so resolved ts are 0x02 watermarks, the CREATE TABLEs 0x01 DDL messages and deletes carry their
      commit ts. All tables share the one topic (TiCDC's avro sink wants a topic per table; the decoder does not
      depend on it, and a message decodes the same), so each subject holds one version per table;
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
                 rows_per_message: int = 16, schema: str = BENCH_SCHEMA, tidb_extension: bool = False,
                 registry: Any = None, topic: str | None = None) -> None:
        if protocol not in BENCH_PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(BENCH_PROTOCOLS)}, not {protocol!r}")
        if (protocol == "avro") != (registry is not None and bool(topic)):
            raise ValueError("the avro stream needs registry= and topic= (the subjects are named after the topic), "
                             "and only it takes them")
        if tidb_extension and protocol != "debezium":
            raise ValueError("tidb_extension is an option of the debezium stream (canal-json always has it)")
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
        self.tidb_extension = tidb_extension
        self.registry, self.topic = registry, topic
        self.columns = DEBEZIUM_BENCH_COLUMN_NAMES if protocol == "debezium" else BENCH_COLUMN_NAMES
        self._narrow = self.columns != BENCH_COLUMN_NAMES
        self.event_columns = tuple(c for c in BENCH_COLUMNS if c.name in self.columns)
        self.column_types = {n: BENCH_TYPES[n] for n in self.columns}  # what TiCDC's schema says
        self.watermarks = protocol != "debezium" or tidb_extension  # Debezium without the extension: none
        self.stats = BenchStats()
        self.expected: dict[str, TableChecksum] = {}
        self.final_ts = 0
        self._used = False
        self._plain = False  # row_changes(): RowChange events instead of encoded messages

    # -- public -----------------------------------------------------------------------------------------
    def messages(self) -> _Iterator[tuple[int, bytes | None, bytes]]:
        """(partition, key, value) in the order TiCDC would write them. Single use."""
        return self._stream()

    def row_changes(self) -> _Iterator[RowChange]:
        """The same upstream row changes :meth:`messages` encodes (same seed, same random draws, so the same
        ops, keys and values in the same order), as plain events: no DDL, no resolved ts and no replayed
        duplicates, which are TiCDC's doing, not the upstream's. For yardsticks that write the workload's rows
        themselves (``applier.devtools.bench_merge``) without paying for encoding. Single use, exclusive with
        :meth:`messages`; ``expected`` and ``stats`` are filled as with :meth:`messages`."""
        self._plain = True
        return self._stream()

    def final_rows(self, table: str) -> _Iterator[dict[str, Any]]:
        """The rows of ``table`` when the stream ends (all columns of the bench shape; after :meth:`messages` or
        :meth:`row_changes` is exhausted), rebuilt from the row versions: for row-by-row verification."""
        t = self.tables[self.table_names.index(table)]
        for k in t.live:
            yield bench_row(t.idx, k, t.ver[k], self.seed)

    def final_row(self, table: str, key: int) -> dict[str, Any] | None:
        """Row ``key`` of ``table`` when the stream ends, None if it is not there (as :meth:`final_rows`)."""
        t = self.tables[self.table_names.index(table)]
        if not 0 <= key < len(t.ver) or not t.ver[key]:
            return None
        return bench_row(t.idx, key, t.ver[key], self.seed)

    def _stream(self) -> _Iterator[Any]:
        """One pass of the upstream application, shared by both views so they cannot drift apart."""
        if self._used:
            raise RuntimeError("a BenchWorkload can be iterated once")
        self._used = True
        self._begin()
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
        self._end()
        yield from self._drain()

    def _begin(self) -> None:
        """State for one pass, then the CREATE TABLEs (broadcast) and a first resolved ts, left in ``self.out``.
        Shared with the live benchmark (``applier.devtools.bench_live``), which drives the transactions itself."""
        from applier.devtools.encoders.canal_json import encode_canal_json
        from applier.devtools.encoders.debezium import encode_debezium
        from applier.devtools.encoders.open import encode_open, encode_open_batch
        from applier.devtools.encoders.simple import encode_simple

        self._enc_canal, self._enc_open, self._enc_open_batch = encode_canal_json, encode_open, encode_open_batch
        self._enc_debezium, self._enc_simple = encode_debezium, encode_simple
        if self.protocol == "avro":
            from applier.devtools.encoders.avro import AvroEncoder, ColumnSpec

            # DECIMAL(14,2): the encoder writes the decimal's precision and scale into the schema only when told
            decimal = {"amount": ColumnSpec(precision=14, scale=2)}
            self._avro = AvroEncoder(self.registry, enable_watermark=True,
                                     column_specs={f"{self.schema}.{t}": decimal for t in self.table_names})
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
        self.tables = [_BenchTable(i, n, self.columns) for i, n in enumerate(self.table_names)]

        ts = self._next_ts()
        # Simple: each table's schema, versioned by its CREATE TABLE's commit ts; rows since the last BOOTSTRAP
        self.table_schemas = {t.name: TableSchema(self.schema, t.name, ts, self.event_columns) for t in self.tables}
        self.since_bootstrap = [0] * self.n_tables
        for t in self.tables:
            for p in range(self.partitions):
                self._emit_single(p, DDL(self.schema, t.name, ts, bench_table_ddl(t.name, self.columns),
                                         self.positions[p], ddl_type=3))
                self.stats.ddl_messages += 1
        self._resolved()

    def _end(self) -> None:
        """The last resolved ts (left in ``self.out``), ``final_ts`` and ``expected``."""
        self._flush_all()
        self.ts_ms += 1
        self._resolved()
        self.final_ts = tso(self.ts_ms, 0x3FFFF)
        self.expected = {t.name: t.checksum for t in self.tables}

    # -- time, resolved, replays -------------------------------------------------------------------------
    def _next_ts(self) -> int:
        self.ts_ms += self.rng.randint(1, 3)
        return tso(self.ts_ms, self.rng.randint(0, 1000))

    def _resolved(self) -> None:
        self._flush_all()
        ts = tso(self.ts_ms, 0x3FFFF)
        if self.watermarks:
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
            if self.watermarks:
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
        if self._plain:
            return
        self._flush(part)
        if self.protocol == "open":
            k, v = self._enc_open(ev)
        elif self.protocol == "debezium":
            k, v = self._enc_debezium(ev, table_columns=self.event_columns, field_types=self.column_types,
                                      enable_tidb_extension=self.tidb_extension, ts_ms=self.ts_ms)
        elif self.protocol == "avro":
            k, v = self._avro.encode_ddl(ev) if isinstance(ev, DDL) else self._avro.encode_resolved(ev.ts)
        elif self.protocol == "simple":  # a DDL carries its table's schema; a TableSchema becomes a BOOTSTRAP
            schema = self.table_schemas[ev.table] if isinstance(ev, DDL) else None
            k, v = self._enc_simple(ev, table_schema=schema, build_ts_ms=self.ts_ms)
        else:
            k, v = self._enc_canal(ev, build_ts_ms=self.ts_ms)
        self._out(part, k, v, 0, remember)

    def _emit_row(self, t: _BenchTable, ts: int, op: Op, key: int, before: dict | None, after: dict | None) -> None:
        part = (key * 0x9E3779B1 + t.idx * 0x85EBCA6B) % self.partitions
        if self._narrow:  # the images hold the stream's columns only
            before = None if before is None else {c: before[c] for c in self.columns}
            after = None if after is None else {c: after[c] for c in self.columns}
        ev = RowChange(self.schema, t.name, ts, op, before, after, self.event_columns, self.positions[part])
        self.stats.row_events += 1
        if self._plain:
            self.out.append(ev)  # type: ignore[arg-type]  # row_changes(): the event itself, not encoded
        elif self.protocol == "open":
            pend = self.pending[part]
            pend.append(ev)
            if len(pend) >= self.rows_per_message:
                self._flush(part)
        elif self.protocol == "debezium":
            k, v = self._enc_debezium(ev, field_types=self.column_types, enable_tidb_extension=self.tidb_extension,
                                      ts_ms=ts >> 18)
            self._out(part, k, v, 1)
        elif self.protocol == "simple":
            k, v = self._enc_simple(ev, table_schema=self.table_schemas[t.name], build_ts_ms=ts >> 18)
            self._out(part, k, v, 1)
            self.since_bootstrap[t.idx] += 1
            if self.since_bootstrap[t.idx] >= SIMPLE_BOOTSTRAP_MESSAGES:
                self.since_bootstrap[t.idx] = 0
                for p in range(self.partitions):
                    self._emit_single(p, self.table_schemas[t.name])
        elif self.protocol == "avro":  # one message: a key change is already a delete and an insert here
            for k, v in self._avro.encode(ev, self.topic):  # type: ignore[arg-type]
                self._out(part, k, v, 1)
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
