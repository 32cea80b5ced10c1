"""Value fidelity (issue 4): every column type, through every protocol that can carry it, into both targets.

One upstream table (MySQL DDL, translated for each target by ``applier.ddl.translate``, so the target tables
are the ones the applier itself would create) and a list of upstream rows (Python values as
``applier/events.py`` defines them; ENUM/SET as their names, which is what upstream holds). For each protocol
the rows become RowChange events in the shape that protocol's TiCDC encoder needs (ENUM/SET as ordinals for
Open Protocol, Canal-JSON and Simple; names for Debezium and Avro), are encoded with the protocol's encoder,
decoded by its decoder, gated and applied by :class:`applier.processor.BatchProcessor` (no Spark), and read
back with SQL. Each value read back must equal the upstream value under the rule of its type
(``docs/value-rules.md``); where a protocol or a target loses information, the documented lossy value is
expected instead, and the test also checks that the loss is real for that row (so a codec that became exact,
or a rule that no longer applies, shows up here and the docs get updated).

A failure lists every differing value as ``protocol / target / row / column: expected ..., got ...``.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any, Callable

import pytest
from sqlalchemy import create_engine

from applier import migrate
from applier.codecs import get_decoder
from applier import mysql_values as T
from applier.ddl import translate
from applier.devtools import services
from applier.events import Column, KafkaMessage, Op, Resolved, RowChange, SourcePosition, TableSchema
from applier.processor import BatchProcessor
from applier.progress import ProgressStore
from applier.sinks.base import VERBATIM
from tests.e2e.canonical import canonical_expected, debezium_decimal, read_back, zero
from tests.e2e.helpers import target_url

pytestmark = pytest.mark.e2e

TOPIC = "values"
POS = SourcePosition(TOPIC, 0, 0)
UP_SCHEMA = "up"

# ------------------------------------------------------------------------------------------- the upstream table

TYPES: dict[str, str] = {  # column -> its full MySQL type, in table order
    "id": "int",
    "ti": "tinyint", "tiu": "tinyint unsigned", "si": "smallint", "siu": "smallint unsigned",
    "mi": "mediumint", "miu": "mediumint unsigned", "i": "int", "iu": "int unsigned",
    "bi": "bigint", "biu": "bigint unsigned",
    "f": "float", "d": "double", "dc": "decimal(65,30)", "dm": "decimal(10,2)",
    "c": "char(10)", "vc": "varchar(64)", "bn": "binary(4)", "vb": "varbinary(16)",
    "tb": "tinyblob", "bl": "blob", "mb": "mediumblob", "lb": "longblob",
    "tt": "tinytext", "tx": "text", "mt": "mediumtext", "lt": "longtext",
    "dt": "date", "dtm": "datetime(6)", "ts": "timestamp(6)", "tm": "time(6)", "yr": "year",
    "b1": "bit(1)", "b64": "bit(64)",
    "e": "enum('a','b','c d','ü')", "st": "set('x','y','z')", "j": "json",
}
ENUM_MEMBERS = ("a", "b", "c d", "ü")
SET_MEMBERS = ("x", "y", "z")
BIT_WIDTH = {"b1": 1, "b64": 64}

UPSTREAM_DDL = "CREATE TABLE `all_types` (\n  `id` INT NOT NULL PRIMARY KEY,\n" + ",\n".join(
    f"  `{c}` {t}" + (" NULL" if t.startswith("timestamp") else "")
    for c, t in TYPES.items() if c != "id") + "\n) DEFAULT CHARSET = utf8mb4"

INTS = ("ti", "tiu", "si", "siu", "mi", "miu", "i", "iu", "bi", "biu", "yr")
TEXTS = ("c", "vc", "tt", "tx", "mt", "lt", "e", "st")
BINARIES = ("bn", "vb", "tb", "bl", "mb", "lb")
TEMPORALS = ("dt", "dtm", "ts")


def _column(name: str, full: str, key: bool = False) -> Column:
    base, unsigned = T.split_mysql_type(full)
    return Column(name, base, nullable=not key, key=key, unique=key, unsigned=unsigned,
                  binary=base in T.BINARY_TYPES)


COLUMNS = tuple(_column(c, t, key=(c == "id")) for c, t in TYPES.items())


def _pattern(n: int, mul: int) -> bytes:
    return bytes((i * mul + 7) % 256 for i in range(n))


ROWS: dict[str, dict[str, Any]] = {
    "max": {
        "id": 1, "ti": 127, "tiu": 255, "si": 32767, "siu": 65535, "mi": 8388607, "miu": 16777215,
        "i": 2147483647, "iu": 4294967295, "bi": 9223372036854775807, "biu": 18446744073709551615,
        "f": 3.4e38, "d": 1.7976931348623157e308,
        "dc": Decimal("12345678901234567890123456789012345.123456789012345678901234567890"),
        "dm": Decimal("99999999.99"),
        "c": "日本語テキスト!", "vc": "😀 emoji 🎉 ü ß ✓ 𝄞 \u00a0tab\tnl\n", "bn": b"\x00\xff\x00\xff",
        "vb": bytes([0, 255, 1, 254, 0x80, 0x7F, 0, 0]), "tb": _pattern(255, 1), "bl": _pattern(65535, 3),
        "mb": _pattern(70000, 37), "lb": _pattern(300000, 101),
        "tt": "°C ≠ ℃", "tx": "ü" * 30000, "mt": "😀" * 20000, "lt": "long ✓ " * 40000,
        "dt": dt.date(9999, 12, 31), "dtm": dt.datetime(9999, 12, 31, 23, 59, 59, 999999),
        "ts": dt.datetime(2038, 1, 19, 3, 14, 7, 999999), "tm": dt.timedelta(hours=838, minutes=59, seconds=59),
        "yr": 2155, "b1": 1, "b64": 2**64 - 1, "e": "ü", "st": "x,y,z",
        "j": '{"k": [1, 2.5, "ü", true, null], "nested": {"a": {"b": []}}, "big": 12345678901234567890}',
    },
    "min": {
        "id": 2, "ti": -128, "tiu": 0, "si": -32768, "siu": 0, "mi": -8388608, "miu": 0,
        "i": -2147483648, "iu": 0, "bi": -9223372036854775808, "biu": 0,
        "f": -3.4e38, "d": -1.7976931348623157e308,
        "dc": Decimal("-12345678901234567890123456789012345.123456789012345678901234567890"),
        "dm": Decimal("-99999999.99"),
        "c": "", "vc": "", "bn": b"\x00\x00\x00\x00", "vb": b"", "tb": b"", "bl": b"", "mb": b"", "lb": b"",
        "tt": "", "tx": "", "mt": "", "lt": "",
        "dt": dt.date(1000, 1, 1), "dtm": dt.datetime(1000, 1, 1), "ts": dt.datetime(1970, 1, 1, 0, 0, 1),
        "tm": -dt.timedelta(hours=838, minutes=59, seconds=59), "yr": 1901, "b1": 0, "b64": 0, "e": "a",
        "st": "", "j": "[]",
    },
    "fractions": {
        "id": 3, "ti": 0, "tiu": 1, "si": -1, "siu": 1, "mi": 0, "miu": 1, "i": -1, "iu": 1, "bi": -1,
        "biu": 9223372036854775808,  # 2**63: the first value a signed 64-bit integer cannot hold
        "f": 1.2345678, "d": 0.1, "dc": Decimal("0.000000000000000000000000000001"), "dm": Decimal("0.01"),
        "c": "a b", "vc": "quote ' \" \\ %s %(x)s ; --", "bn": b"\xff\xfe\xfd\xfc", "vb": b"\x00",
        "tb": b"\xff", "bl": b"\x00", "mb": b"\x00\xff", "lb": b"\xff\x00",
        "tt": "x", "tx": "ünïcödé", "mt": "a\u2028b", "lt": "<&>",
        "dt": dt.date(2024, 2, 29), "dtm": dt.datetime(2024, 2, 29, 12, 34, 56, 123456),
        "ts": dt.datetime(2024, 2, 29, 12, 34, 56, 654321), "tm": dt.timedelta(hours=100, microseconds=500000),
        "yr": 2024, "b1": 1, "b64": 0x8000000000000001, "e": "c d", "st": "x,z",
        "j": '{"b": 1, "a": {"c": [true, false, null]}, "s": "ü\\n\\"q\\""}',
    },
    "small": {
        "id": 4, "f": 1.17549435e-38, "d": 2.2250738585072014e-308, "dc": Decimal("-0.5"),
        "dm": Decimal("12345678.91"), "dtm": dt.datetime(1999, 12, 31, 23, 59, 59, 500000),
        "ts": dt.datetime(2000, 1, 1, 0, 0, 0, 1), "tm": -dt.timedelta(microseconds=1), "yr": 0,
        "b64": 5, "e": "b", "st": "y", "j": '"a string"',
    },
    "nulls": {"id": 5},  # every other column NULL
    "zero_dates": {
        "id": 6, "dt": "0000-00-00", "dtm": "0000-00-00 00:00:00", "ts": "0000-00-00 00:00:00",
        "j": "null",  # JSON null, not SQL NULL
    },
    "zero_parts": {"id": 7, "dt": "2020-00-15", "dtm": "2021-01-00 10:11:12"},
    "early_years": {"id": 8, "dt": dt.date(99, 12, 31), "dtm": dt.datetime(5, 6, 7, 8, 9, 10, 11)},
}
for _r in ROWS.values():
    for _c in TYPES:
        _r.setdefault(_c, None)

ROW_OF_ID = {r["id"]: name for name, r in ROWS.items()}

# Values a protocol cannot even deliver, replaced for that protocol only (each is a documented limit):
OVERRIDES: dict[str, dict[tuple[str, str], Any]] = {
    # Debezium's float64 DECIMAL: DECIMAL(65,30)'s extremes round to 1e35, wider than the column (the test at
    # the end shows that); the widest values this matrix sends are 25 integer digits + 30 fractional digits
    "debezium": {("max", "dc"): Decimal("1234567890123456789012345.123456789012345678901234567890"),
                 ("min", "dc"): Decimal("-1234567890123456789012345.123456789012345678901234567890")},
}


def upstream(protocol: str, row: str, col: str) -> Any:
    return OVERRIDES.get(protocol, {}).get((row, col), ROWS[row][col])

# ------------------------------------------------------------------------------------------- protocols

PROTOCOLS = ("open", "canal-json", "simple-json", "simple-avro", "debezium", "avro")
ORDINALS = {"open", "canal-json", "simple-json", "simple-avro"}  # send ENUM/SET as ordinal / bitmask


def wire_value(protocol: str, col: str, v: Any) -> Any:
    """What TiCDC hands this protocol's encoder for an upstream value (ENUM/SET ordinals where it uses them)."""
    if v is None or protocol not in ORDINALS:
        return v
    full = TYPES.get(col) or KEYED_TYPES.get(col, "")
    if full.startswith("enum"):
        return (ENUM_MEMBERS if col in TYPES else KEYED_ENUM).index(v) + 1
    if full.startswith("set"):
        return sum(1 << SET_MEMBERS.index(m) for m in v.split(",")) if v else 0
    return v


class Feed:
    """Encodes events with one protocol's encoder into KafkaMessages on one partition."""

    def __init__(self, protocol: str, table: str, columns: tuple[Column, ...], full_types: dict[str, str],
                 avro_specs: dict | None = None) -> None:
        self.protocol = protocol
        self.table = table
        self.columns = columns
        self.full_types = full_types
        self.offset = 0
        self.registry = None
        if protocol == "avro":
            from applier.devtools.encoders.avro import AvroEncoder
            from applier.devtools.encoders.registry import InMemoryRegistry

            self.registry = InMemoryRegistry()
            self.avro = AvroEncoder(self.registry, column_specs={f"{UP_SCHEMA}.{table}": avro_specs or {}})
        self.table_schema = TableSchema(UP_SCHEMA, table, 1, columns)

    def decoder(self):
        p = self.protocol
        if p == "simple-json":
            return get_decoder("simple", encoding_format="json")
        if p == "simple-avro":
            return get_decoder("simple", encoding_format="avro")
        if p == "debezium":
            return get_decoder("debezium", require_tidb_extension=True)
        if p == "avro":
            from applier.codecs.avro import AvroDecoder

            return AvroDecoder(registry=self.registry)
        return get_decoder(p)

    def _msg(self, key: bytes | None, value: bytes | None) -> KafkaMessage:
        m = KafkaMessage(TOPIC, 0, self.offset, key, value)
        self.offset += 1
        return m

    def bootstrap(self) -> list[KafkaMessage]:
        if self.protocol.startswith("simple"):
            from applier.devtools.encoders.simple import encode_simple

            return [self._msg(*encode_simple(self.table_schema, encoding_format=self.protocol[7:], build_ts_ms=0))]
        return []

    def encode(self, ev) -> list[KafkaMessage]:
        p = self.protocol
        if isinstance(ev, Resolved) and p in ("debezium", "avro"):
            return []  # ungated by default: no watermark in the stream
        if p == "open":
            from applier.devtools.encoders.open import encode_open

            return [self._msg(*encode_open(ev))]
        if p == "canal-json":
            from applier.devtools.encoders.canal_json import encode_canal_json

            return [self._msg(*encode_canal_json(ev, build_ts_ms=0))]
        if p.startswith("simple"):
            from applier.devtools.encoders.simple import encode_simple

            return [self._msg(*encode_simple(ev, encoding_format=p[7:], table_schema=self.table_schema,
                                             build_ts_ms=0))]
        if p == "debezium":
            from applier.devtools.encoders.debezium import encode_debezium

            return [self._msg(*encode_debezium(ev, enable_tidb_extension=True, field_types=self.full_types,
                                               ts_ms=0))]
        return [self._msg(k, v) for k, v in self.avro.encode(ev, TOPIC)]

    def messages(self, events) -> list[KafkaMessage]:
        out = self.bootstrap()
        for ev in events:
            out.extend(self.encode(ev))
        return out


def avro_specs() -> dict:
    from applier.devtools.encoders.avro import ColumnSpec

    return {"dc": ColumnSpec(precision=65, scale=30), "dm": ColumnSpec(precision=10, scale=2),
            "e": ColumnSpec(allowed=ENUM_MEMBERS), "st": ColumnSpec(allowed=SET_MEMBERS),
            "b1": ColumnSpec(length=1), "b64": ColumnSpec(length=64)}


# ------------------------------------------------------------------------------------------- targets


@pytest.fixture(scope="module")
def urls():
    """Only the databases (no Kafka: BatchProcessor is fed directly), started if needed and left running."""
    return services.start({"mariadb", "postgres"})


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"val_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    migrate.upgrade(engine)
    yield request.param, engine, schema
    engine.dispose()


def create_table(kind: str, engine, schema: str, table: str, ddl: str) -> list[str]:
    """Create the target table from the upstream DDL with the applier's own translation."""
    tr = translate("mariadb" if kind == "mariadb" else "postgresql", ddl, schema=UP_SCHEMA, table=table,
                   route=lambda s, t: (schema, t))
    with engine.begin() as c:
        q = c.dialect.identifier_preparer.quote_identifier(schema)
        c.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS {q}" if kind == "mariadb" else f"CREATE SCHEMA IF NOT EXISTS {q}")
        for st in tr.statements:
            c.exec_driver_sql(st, execution_options=VERBATIM)
    return tr.statements


def run(feed: Feed, engine, schema: str, name: str, events) -> None:
    store = ProgressStore(name, feed.protocol)
    store.claim(engine)
    with engine.connect() as c:
        state = store.load(c)
    proc = BatchProcessor(engine=engine, decoder=feed.decoder(), route=lambda s, t: (schema, t), store=store,
                          state=state, partitions=[(TOPIC, 0)])
    try:
        proc.process(feed.messages(events))
    finally:
        proc.close()


# ------------------------------------------------------------------------------------------- value rules


def _debezium_year_shift(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        return v.replace(year=v.year + (2000 if v.year < 70 else 1900)) if v.year < 100 else v
    if isinstance(v, dt.date):
        return v.replace(year=v.year + (2000 if v.year < 70 else 1900)) if v.year < 100 else v
    return v


def _zero_to_null(v: Any) -> Any:
    return None if isinstance(v, str) else v


# (protocol, column) -> (rule name, what the protocol delivers for an upstream value). Every entry is a loss the
# codec's docstring documents; for the rows where it changes the value, the test asserts that it does.
LOSSES: dict[tuple[str, str], tuple[str, Callable[[Any], Any]]] = {
    ("debezium", "dc"): ("DECIMAL travels as float64 (about 15 significant digits)", debezium_decimal),
    ("debezium", "dm"): ("DECIMAL travels as float64 (exact up to 15 significant digits)", debezium_decimal),
    ("debezium", "dt"): ("zero dates become NULL; years 1-99 move to 2000-2069/1970-1999",
                         lambda v: _debezium_year_shift(_zero_to_null(v))),
    ("debezium", "dtm"): ("zero dates become NULL; years 1-99 move to 2000-2069/1970-1999",
                          lambda v: _debezium_year_shift(_zero_to_null(v))),
    ("debezium", "ts"): ("the zero TIMESTAMP becomes 1970-01-01 00:00:00 UTC (= MySQL's zero TIMESTAMP)",
                         lambda v: dt.datetime(1970, 1, 1) if isinstance(v, str) else v),
}
# rows where the loss must be visible in the target (the rule changes the value and nothing restores it; the
# zero TIMESTAMP Debezium sends as the epoch is restored by the writers, see canonical_expected)
LOSSY_ROWS = {
    ("debezium", "dc"): {"max", "min"},
    ("debezium", "dt"): {"zero_dates", "zero_parts", "early_years"},
    ("debezium", "dtm"): {"zero_dates", "zero_parts", "early_years"},
}


def expected_value(protocol: str, kind: str, row: str, col: str) -> Any:
    v = upstream(protocol, row, col)
    loss = LOSSES.get((protocol, col))
    if loss is not None and v is not None:
        v = loss[1](v)
    return canonical_expected(kind, col, TYPES[col], v)


def test_loss_rules_really_lose_something_for_the_rows_named() -> None:
    for (protocol, col), rows in LOSSY_ROWS.items():
        rule = LOSSES[(protocol, col)][1]
        for row in rows:
            up = upstream(protocol, row, col)
            assert rule(up) != up, (protocol, col, row, up)


# ------------------------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_every_type_round_trips(target, unique, protocol) -> None:
    kind, engine, schema = target
    statements = create_table(kind, engine, schema, "all_types", UPSTREAM_DDL)
    if kind == "postgres":  # the ENUM/SET members travel in column comments the writer reads
        assert any("applier:enum(" in s for s in statements) and any("applier:set(" in s for s in statements)
    feed = Feed(protocol, "all_types", COLUMNS, TYPES, avro_specs())
    events = []
    for n, name in enumerate(ROWS):
        after = {c: wire_value(protocol, c, upstream(protocol, name, c)) for c in TYPES}
        events.append(RowChange(UP_SCHEMA, "all_types", 1000 + n, Op.INSERT, None, after, COLUMNS, POS))
    events.append(Resolved(2000, POS))
    run(feed, engine, schema, f"val-{protocol}-{unique}", events)

    got = read_back(kind, engine, schema, "all_types", TYPES, "id")
    problems = []
    assert sorted(got) == sorted(ROW_OF_ID), f"{protocol} -> {kind}: rows {sorted(got)}"
    for rid, have in got.items():
        row = ROW_OF_ID[rid]
        for col in TYPES:
            want = expected_value(protocol, kind, row, col)
            if have[col] != want:
                problems.append(f"{protocol} / {kind} / row {row} / column {col} ({TYPES[col]}): "
                                f"expected {_short(want)}, got {_short(have[col])}")
    # the documented losses are real in what landed (not just in the rule table)
    for (p, col), rows in LOSSY_ROWS.items():
        if p != protocol:
            continue
        for row in rows:
            exact = canonical_expected(kind, col, TYPES[col], upstream(protocol, row, col))
            if got[ROWS[row]["id"]][col] == exact and exact != expected_value(protocol, kind, row, col):
                problems.append(f"{protocol} / {kind} / row {row} / column {col}: documented as lossy "
                                f"({LOSSES[(p, col)][0]}) but arrived exact: update docs/value-rules.md")
    assert not problems, f"{len(problems)} value(s) differ:\n" + "\n".join(problems)


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 120 else r[:100] + f"... ({len(r)} chars)"


# ------------------------------------------------------------------------------------------- key columns

KEYED_ENUM = ("p", "q", "r")
KEYED_TYPES: dict[str, str] = {"ke": "enum('p','q','r')", "kb": "bit(10)", "kts": "timestamp(6)",
                               "kt": "time(3)", "v": "int"}
KEYED_DDL = ("CREATE TABLE `keyed` (`ke` ENUM('p','q','r') NOT NULL, `kb` BIT(10) NOT NULL, "
             "`kts` TIMESTAMP(6) NOT NULL, `kt` TIME(3) NOT NULL, `v` INT, PRIMARY KEY (`ke`, `kb`, `kts`, `kt`))")
KEYED_COLUMNS = tuple(_column(c, t, key=(c != "v")) for c, t in KEYED_TYPES.items())
K1 = {"ke": "p", "kb": 5, "kts": dt.datetime(2001, 2, 3, 4, 5, 6, 700000), "kt": -dt.timedelta(hours=1, milliseconds=500)}
K2 = {"ke": "q", "kb": 1023, "kts": dt.datetime(2038, 1, 19, 3, 14, 7), "kt": dt.timedelta(hours=838, minutes=59, seconds=59)}
K3 = {"ke": "r", "kb": 0, "kts": dt.datetime(1970, 1, 1, 0, 0, 1), "kt": dt.timedelta(0)}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_updates_and_deletes_find_rows_by_keys_of_adapted_types(target, unique, protocol) -> None:
    """ENUM, BIT, TIMESTAMP and TIME key columns: deletes and updates must match the stored values (the writers'
    adapt_keys applies the same conversions as adapt_rows)."""
    kind, engine, schema = target
    create_table(kind, engine, schema, "keyed", KEYED_DDL)
    from applier.devtools.encoders.avro import ColumnSpec

    feed = Feed(protocol, "keyed", KEYED_COLUMNS, KEYED_TYPES,
                {"ke": ColumnSpec(allowed=KEYED_ENUM), "kb": ColumnSpec(length=10)})

    def w(row: dict) -> dict:
        return {c: wire_value(protocol, c, v) for c, v in row.items()}

    def ev(ts: int, op: Op, before: dict | None, after: dict | None) -> RowChange:
        return RowChange(UP_SCHEMA, "keyed", ts, op, w(before) if before else None, w(after) if after else None,
                         KEYED_COLUMNS, POS)

    events = [ev(100, Op.INSERT, None, {**K1, "v": 1}), ev(101, Op.INSERT, None, {**K2, "v": 2}),
              ev(102, Op.INSERT, None, {**K3, "v": 3}), Resolved(150, POS),
              ev(200, Op.UPDATE, {**K2, "v": 2}, {**K2, "v": 20}), ev(201, Op.DELETE, {**K1, "v": 1}, None),
              Resolved(300, POS)]
    # two micro-batches: the rows exist before the update and the delete reach them
    run(feed, engine, schema, f"key-{protocol}-{unique}", events[:4])
    run(feed, engine, schema, f"key-{protocol}-{unique}", events[4:])
    got = read_back(kind, engine, schema, "keyed", KEYED_TYPES, "v")
    want = {20: {**K2, "v": 20}, 3: {**K3, "v": 3}}
    want = {v: {c: canonical_expected(kind, c, KEYED_TYPES[c], x) for c, x in row.items()} for v, row in want.items()}
    assert got == want, f"{protocol} / {kind}: expected {want}, got {got}"


# ------------------------------------------------------------------------------------------- documented edges


def testdebezium_decimal_at_the_column_maximum_rounds_beyond_the_column() -> None:
    """DECIMAL(65,30)'s largest value travels as float64 1e35, one digit wider than the column: once decoded,
    the target refuses such a row (the pipeline stops naming it). Documented in docs/value-rules.md."""
    from applier.devtools.encoders.debezium import encode_debezium

    top = Decimal("9" * 35 + "." + "9" * 30)
    cols = (Column("id", "int", nullable=False, key=True), Column("dc", "decimal"))
    k, v = encode_debezium(RowChange(UP_SCHEMA, "t", 1, Op.INSERT, None, {"id": 1, "dc": top}, cols, POS),
                           enable_tidb_extension=True, field_types={"dc": "decimal(65,30)"})
    (row,) = get_decoder("debezium").decode(KafkaMessage(TOPIC, 0, 0, k, v))
    assert row.after["dc"] == Decimal(10) ** 35 != top


# ------------------------------------------------------------------------------------------- refusals and sessions


def _enum_feed_events(schema_ts: int = 100) -> tuple[Feed, list]:
    cols = (_column("id", "int", key=True), _column("e", "enum('a','b')"), _column("st", "set('x','y')"))
    feed = Feed("open", "hand_made", cols, {})
    row = {"id": 1, "e": 2, "st": 3}  # ordinals, as the Open Protocol sends them
    return feed, [RowChange(UP_SCHEMA, "hand_made", schema_ts, Op.INSERT, None, row, cols, POS),
                  Resolved(schema_ts + 1, POS)]


def test_enum_ordinals_into_a_postgres_table_without_member_comments_are_refused(urls, unique, drop_schema) -> None:
    """A table created by hand (not from a replicated CREATE TABLE) has plain text columns: the writer cannot
    know the member names and stops with what to do, instead of storing "2". With the comment added by hand,
    the same stream applies."""
    from applier.sinks import ApplyError

    schema = f"val_{unique}"
    drop_schema(("postgres", schema))
    engine = create_engine(urls.pg_url)
    try:
        migrate.upgrade(engine)
        with engine.begin() as c:
            c.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
            c.exec_driver_sql(f'CREATE TABLE "{schema}"."hand_made" (id integer PRIMARY KEY, e text, st text)')
        feed, events = _enum_feed_events()
        with pytest.raises(ApplyError, match=r"column 'e' of target table .*hand_made.*applier:enum"):
            run(feed, engine, schema, f"refuse-{unique}", events)
        with engine.begin() as c:
            c.exec_driver_sql(f"""COMMENT ON COLUMN "{schema}"."hand_made"."e" IS 'applier:enum(''a'',''b'')'""")
            c.exec_driver_sql(f"""COMMENT ON COLUMN "{schema}"."hand_made"."st" IS 'applier:set(''x'',''y'')'""")
        feed, events = _enum_feed_events()
        run(feed, engine, schema, f"refuse-{unique}", events)
        with engine.connect() as c:
            assert c.exec_driver_sql(f'SELECT id, e, st FROM "{schema}"."hand_made"').all() == [(1, "b", "x,y")]
    finally:
        engine.dispose()


def test_zero_dates_reach_mysql_when_the_server_forbids_them_by_default(urls, unique, drop_schema) -> None:
    """MySQL 8's default sql_mode has NO_ZERO_DATE and NO_ZERO_IN_DATE; the writer's session drops just those
    two (strict mode stays), so zero dates upstream kept still replicate. Emulated on MariaDB with a session
    that starts in MySQL 8's mode."""
    schema = f"val_{unique}"
    drop_schema(("mariadb", schema))
    mysql8_mode = ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
                   "NO_ENGINE_SUBSTITUTION")
    engine = create_engine(urls.mariadb_url, connect_args={"init_command": f"SET SESSION sql_mode = '{mysql8_mode}'"})
    try:
        migrate.upgrade(engine)
        create_table("mariadb", engine, schema, "z", "CREATE TABLE `z` (`id` INT PRIMARY KEY, `d` DATE NOT NULL, "
                     "`t` DATETIME(6), `ts` TIMESTAMP(6) NULL)")
        cols = (_column("id", "int", key=True), _column("d", "date"), _column("t", "datetime(6)"),
                _column("ts", "timestamp(6)"))
        feed = Feed("open", "z", cols, {})
        rows = [{"id": 1, "d": "0000-00-00", "t": "2020-00-15 00:00:00", "ts": "0000-00-00 00:00:00"},
                {"id": 2, "d": dt.date(2020, 1, 1), "t": dt.datetime(2020, 1, 1, 1, 2, 3, 4),
                 "ts": dt.datetime(2020, 6, 1, 12, 0, 0, 5)}]
        run(feed, engine, schema, f"zero-{unique}",
            [RowChange(UP_SCHEMA, "z", 100 + i, Op.INSERT, None, r, cols, POS) for i, r in enumerate(rows)]
            + [Resolved(200, POS)])
        got = read_back("mariadb", engine, schema, "z", {"id": "int", "d": "date", "t": "datetime(6)",
                                                          "ts": "timestamp(6)"}, "id")
        assert got == {1: {"id": 1, "d": zero("0000-00-00"), "t": zero("2020-00-15 00:00:00"),
                           "ts": zero("0000-00-00 00:00:00")},
                       2: {"id": 2, **{k: v for k, v in rows[1].items() if k != "id"}}}
        from applier.sinks.mysql import MySQLSink

        with engine.connect() as c:  # the writer's session: zero dates allowed, strict mode and the rest kept
            MySQLSink().begin(c)
            mode = c.exec_driver_sql("SELECT @@SESSION.sql_mode, @@SESSION.time_zone").one()
            assert mode == ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION",
                            "+00:00")
    finally:
        engine.dispose()


def test_enum_and_set_members_follow_replicated_ddl(target, unique) -> None:
    """CREATE TABLE, MODIFY (a member appended) and ADD COLUMN replicated through the applier: ordinals sent
    after each DDL map to the members of that moment (the writer re-reads the comments after a DDL)."""
    from applier.events import DDL

    kind, engine, schema = target
    if kind == "mariadb":
        with engine.begin() as c:
            c.exec_driver_sql(f"CREATE DATABASE IF NOT EXISTS `{schema}`")
    c1 = (_column("id", "int", key=True), _column("e", "enum('a','b')"))
    c2 = c1 + (_column("s", "set('x','y')"),)
    feed = Feed("open", "evolving", c1, {})
    events = [
        DDL(UP_SCHEMA, "evolving", 100, "CREATE TABLE `evolving` (`id` INT PRIMARY KEY, `e` ENUM('a','b'))", POS),
        RowChange(UP_SCHEMA, "evolving", 101, Op.INSERT, None, {"id": 1, "e": 2}, c1, POS),
        DDL(UP_SCHEMA, "evolving", 102, "ALTER TABLE `evolving` MODIFY `e` ENUM('a','b','c')", POS),
        RowChange(UP_SCHEMA, "evolving", 103, Op.INSERT, None, {"id": 2, "e": 3}, c1, POS),
        DDL(UP_SCHEMA, "evolving", 104, "ALTER TABLE `evolving` ADD COLUMN `s` SET('x','y')", POS),
        RowChange(UP_SCHEMA, "evolving", 105, Op.INSERT, None, {"id": 3, "e": 1, "s": 3}, c2, POS),
        Resolved(200, POS),
    ]
    run(feed, engine, schema, f"evo-{unique}", events)
    got = read_back(kind, engine, schema, "evolving", {"id": "int", "e": "enum", "s": "set"}, "id")
    assert got == {1: {"id": 1, "e": "b", "s": None}, 2: {"id": 2, "e": "c", "s": None},
                   3: {"id": 3, "e": "a", "s": "x,y"}}
