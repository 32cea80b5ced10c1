"""The one event model every codec produces and every later stage consumes.

Codecs turn protocol bytes into these objects; nothing after the codec knows which protocol an event came
from. Values inside ``before``/``after`` are already Python values with exact semantics (Decimal for
DECIMAL, int for every integer including BIGINT UNSIGNED above 2**63, bytes for binary types,
datetime/date/timedelta for temporal types with fractional seconds kept, str for ENUM/SET text), so the
writers never parse protocol strings.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SourcePosition:
    """Where an event was read; every error about an event names this."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"topic={self.topic} partition={self.partition} offset={self.offset}"


class Op(enum.Enum):
    INSERT = "insert"
    UPDATE = "update"
    DELETE = "delete"


@dataclass(frozen=True, slots=True)
class Column:
    """What the protocol says about one column.

    ``type_name`` is the lower-case MySQL type name without parameters ("bigint", "varchar", "decimal",
    "datetime", ...). ``key`` marks the columns that identify a row downstream: the primary key, or
    TiCDC's handle key when the table has no primary key (a not-null unique key).
    """

    name: str
    type_name: str
    nullable: bool = True
    key: bool = False
    unique: bool = False
    unsigned: bool = False
    binary: bool = False
    generated: bool = False
    type_code: int | None = None  # Open Protocol type code / canal sqlType, where the protocol sends one
    # The column's full MySQL type as the protocol declares it ("decimal(10,2) unsigned", "enum('a','b')",
    # "varchar(64)"), where it carries more than the type name: what ``[target] schema_evolution`` creates the
    # column as (applier/evolve.py parses it; it is never spliced into SQL). None: only ``type_name`` is known.
    declared: str | None = None
    # The type was guessed from a value (Debezium without schemas), not declared: never used to create a column.
    inferred: bool = False


@dataclass(slots=True)
class RowChange:
    schema: str
    table: str
    commit_ts: int
    op: Op
    before: dict[str, Any] | None  # delete: the old row (all columns, or only the key columns)
    after: dict[str, Any] | None  # insert/update: the new row
    columns: tuple[Column, ...]
    position: SourcePosition
    size: int = 0  # approximate bytes held in memory, for the buffer budget

    @property
    def key_columns(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns if c.key)


@dataclass(slots=True)
class DDL:
    schema: str
    table: str  # "" for schema-level DDL (CREATE/DROP DATABASE)
    commit_ts: int
    query: str
    position: SourcePosition
    ddl_type: int | str | None = None  # Open Protocol DDL type code, canal "type", Simple DDL type
    size: int = 0


@dataclass(frozen=True, slots=True)
class Resolved:
    """Resolved ts / watermark: every event of this partition with commit_ts <= ts has been sent."""

    ts: int
    position: SourcePosition


@dataclass(frozen=True, slots=True)
class TableSchema:
    schema: str
    table: str
    version: int
    columns: tuple[Column, ...]
    position: SourcePosition | None = None


Event = RowChange | DDL | Resolved | TableSchema


# Not frozen: a frozen dataclass's generated __init__ sets each field through object.__setattr__ (0.86 us per
# record against 0.21, measured), and a record is made for every Kafka message. Nothing assigns to one; the hash is
# still the fields' (unsafe_hash), as it was when frozen. Only what the codecs read: a record's timestamp and
# headers were fields once, read by nothing, and their defaults (a new dict per record for the headers) cost 30%
# of its making (0.60 against 0.42 us, measured beside a decode run).
@dataclass(slots=True, unsafe_hash=True)
class KafkaMessage:
    """One raw Kafka record as Spark hands it over (key/value may be None). Treated as immutable."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    @property
    def position(self) -> SourcePosition:
        return SourcePosition(self.topic, self.partition, self.offset)


class DecodeError(Exception):
    """A message that cannot be decoded. Carries where it was and why; the pipeline stops or quarantines."""

    def __init__(self, position: SourcePosition, reason: str, *, protocol: str = "",
                 held_message: "KafkaMessage | None" = None, table: "tuple[str, str] | None" = None,
                 rowless: bool = False, upstream: bool = False) -> None:
        self.position = position
        self.reason = reason
        self.protocol = protocol
        # The upstream table the message's events name, when they were decoded and refused afterwards (an
        # untrusted ts, a name no route can place): the policy then holds that table, not the whole partition.
        self.table = table
        # The message carries no row or DDL (a watermark / resolved ts): under quarantine it is recorded, and
        # nothing is held behind it, since nothing of any table follows it in commit order.
        self.rowless = rowless
        # A decoder that held messages (waiting for a schema) may find one of *those* bad while decoding a later
        # message: this is the bad one, to quarantine instead of the message being decoded (whose offset the
        # gate must not take as done, since its own events come back with the next call).
        self.held_message = held_message
        # Nothing is wrong with the message: what completes it (the upstream TiDB of a handle-key-only row) could
        # not be had - unreachable, or its GC passed the ts. Under on_decode_error = "stop", `applier run` exits 5
        # (a source it needs is unusable) rather than 3, and the reason names the setting and the fix.
        self.upstream = upstream
        where = f"{protocol} message at {position}" if protocol else f"message at {position}"
        super().__init__(f"cannot decode {where}: {reason}")

    def __reduce__(self) -> tuple:
        # errors found in a Spark Python worker travel to the driver pickled; keep every attribute
        # (held_message too), which the default (re-calling __init__ with the message text) would not
        return (_decode_error, (self.position, self.reason, self.protocol), dict(self.__dict__))


def _decode_error(position: SourcePosition, reason: str, protocol: str) -> DecodeError:
    return DecodeError(position, reason, protocol=protocol)
