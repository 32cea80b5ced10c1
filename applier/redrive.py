"""``applier quarantine list|show|retry|discard``: what an operator does with quarantined row changes.

A row change the target refused is held in ``applier_quarantined_rows`` with its key, and every later change of
that key is held behind it (applier.quarantine: the key is *blocked*). This module is the way out:

* ``retry`` applies every held change of the selected keys, in commit order (then Kafka order), in ONE target
  transaction, with the same routes, writer and batch planning the applier uses, and marks them ``retried`` in
  that same transaction. A key's changes go together or not at all: applying only some of them would let a
  later change overtake an earlier one, which is exactly what blocking prevents. Keys linked by one change (a
  key-changing update held under both its old and new key) go together for the same reason.
* ``discard`` gives them up, recording who and why; the replica may then differ from the upstream for those keys.

Both first claim the pipeline's writer epoch (invariant 13) and check it inside their transaction, as every
applier transaction does: a running ``applier run`` of the pipeline is fenced (it stops with exit code 6 at its
next transaction) and must be restarted, which reloads the blocked keys without the released ones. Without that,
a running applier would keep holding new changes of a key behind changes that were just applied, or apply them
while the retry's transaction is writing the same rows.

An undecodable message quarantined under ``on_decode_error`` is a *block* (key ``*``): every later change of its
table, or of its Kafka partition when not even its table could be read, was held behind it. ``retry`` decodes
its raw record (kept in ``applier_quarantine``) again with the decoder the config gives now (after the operator
upgraded the applier, or fixed ``[source.codec]``), and applies what it holds in commit order together with the
changes selected behind it; a retry of changes behind a block takes the block with it, since they must not
overtake it. A message that still cannot be decoded stays held with the new error. One whose content cannot be
applied from here (a DDL, or changes of another table than the one it blocked) is refused with what to do by
hand, then ``discard``.

Layout: selecting and grouping are plain functions over :class:`~applier.quarantine.HeldRow` (unit-tested on
SQLite); :class:`Redrive` does the I/O; :mod:`applier.redrive_text` formats; ``applier/cli.py`` parses options.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from sqlalchemy import inspect, select
from sqlalchemy.engine import Connection, Engine

from applier import progress as p
from applier.config import ConfigError
from applier.events import RowChange
from applier.progress import ProgressStore, holder_name
from applier.events import DDL, DecodeError, KafkaMessage
from applier.quarantine import HELD, STATES, UNDECODABLE, UNKNOWN_TABLE, WHOLE_TABLE, HeldRow, RowQuarantine
from applier.sinks import db_reason, plan_batch
from applier.sinks.table import shown

__all__ = [
    "DiscardResult", "KeyGroup", "Listing", "NothingMatched", "QuarantinedMessage", "Redrive", "RedriveError",
    "RetryFailed", "RetryResult", "Selection", "TableBatch", "TargetUnavailable", "UnreadableEvent",
    "UnreplayableMessage", "group_rows", "is_block", "with_blocks",
    "parse_key", "parse_table", "shown_key", "table_batches", "whole_keys", "who_am_i",
]

CLI = "command line"  # ConfigError's source for options
REASON_SHOWN = 160  # characters of a reason in `list`
VALUE_SHOWN = 2000  # characters of one value in `show` (--json gives the whole event)
LIST_STATES = (*STATES, "all")

Route = Callable[[str, str], "tuple[str, str] | None"]
TableName = tuple[str, str]


# ---- errors ---------------------------------------------------------------------------------------------------

class RedriveError(Exception):
    """The command cannot go on; the message says why and what to do. ``code`` is the CLI's exit code."""

    code = 1

    def __init__(self, message: str, *, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class NothingMatched(RedriveError):
    """No quarantined change matched the filters (exit 1)."""

    code = 1


class RetryFailed(RedriveError):
    """The target refused the retried changes: the transaction rolled back, they stay held with the new reason."""

    code = 4

    def __init__(self, message: str, *, reason: str, groups: Sequence["KeyGroup"], renoted: Sequence[int]) -> None:
        super().__init__(message)
        self.reason = reason
        self.groups = list(groups)
        self.renoted = list(renoted)


class TargetUnavailable(RedriveError):
    """The target failed in a way that passes (a lost connection, a restart, a deadlock): nothing changed."""

    code = 5


# ---- options --------------------------------------------------------------------------------------------------

_QUOTED = re.compile(r'^(`(?:[^`]|``)+`|"(?:[^"]|"")+")\.(`(?:[^`]|``)+`|"(?:[^"]|"")+")$')


def parse_table(text: str) -> TableName:
    """``--table SCHEMA.TABLE`` as the upstream names it (split at the first dot; quote a name that holds a dot,
    as `a.b`.`c` or "a.b"."c")."""
    m = _QUOTED.match(text.strip())
    if m:
        def unq(s: str) -> str:
            return s[1:-1].replace(s[0] * 2, s[0])
        return unq(m.group(1)), unq(m.group(2))
    schema, dot, table = text.strip().partition(".")
    if not dot or not schema or not table:
        raise ConfigError("--table", f"{text!r} is not SCHEMA.TABLE: give the upstream table as `applier quarantine "
                          "list` shows it, e.g. --table shop.orders", source=CLI)
    return schema, table


def parse_key(text: str) -> str:
    """``--key`` as ``list`` shows it (a JSON array of the key's values, e.g. ``[7]`` or ``[1,"a"]``), in the
    exact text ``row_key`` holds, so it compares by text in SQL. A single JSON scalar is taken as a one-column key;
    spaces do not matter. ``*`` is a table blocked by an undecodable message."""
    if text.strip() == WHOLE_TABLE:
        return WHOLE_TABLE
    try:
        value = json.loads(text)
    except ValueError:
        raise ConfigError("--key", f"{text!r} is not JSON: give the key as `applier quarantine list` shows it, e.g. "
                          "--key '[7]' or --key '[1,\"a\"]'", source=CLI) from None
    if not isinstance(value, list):
        value = [value]
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class Selection:
    """Which held changes ``retry``/``discard`` start from (filters combine with AND); whole keys are added."""

    table: TableName | None = None
    row_key: str | None = None
    ids: tuple[int, ...] = ()
    everything: bool = False

    def check(self, action: str) -> None:
        """A bare ``retry`` or ``discard`` acting on everything would be one typo away: ask for --all."""
        filtered = self.table is not None or self.row_key is not None or bool(self.ids)
        if self.everything and filtered:
            raise ConfigError("--all", f"{action} --all takes every held change; it cannot be combined with "
                              "--table, --key or --id (drop one or the other)", source=CLI)
        if not self.everything and not filtered:
            raise ConfigError("--all", f"{action} needs a filter (--table SCHEMA.TABLE, --key JSON, --id N) or --all "
                              "for every held change; `applier quarantine list` shows them", source=CLI)

    def describe(self) -> str:
        if self.everything:
            return "--all"
        parts = []
        if self.table is not None:
            parts.append(f"--table {shown(*self.table)}")
        if self.row_key is not None:
            parts.append(f"--key {shown_key(self.row_key)}")
        if self.ids:
            parts.append("--id " + " ".join(map(str, self.ids)))
        return " ".join(parts)


def who_am_i() -> str:
    """Who resolves held changes, for ``resolved_by``: the OS user and this process (never a URL or secret)."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in the environment nor in the password database
        user = "unknown user"
    return f"{user} ({holder_name()})"[:255]


# ---- grouping and selection (pure) ----------------------------------------------------------------------------

@dataclass(frozen=True)
class KeyGroup:
    """The quarantined changes of one key of one upstream table (in one state), in commit order."""

    schema: str
    table: str
    row_key: str
    state: str
    rows: tuple[HeldRow, ...]

    @property
    def ids(self) -> list[int]:
        return [h.id for h in self.rows]

    @property
    def first_ts(self) -> int:
        return self.rows[0].commit_ts

    @property
    def last_ts(self) -> int:
        return self.rows[-1].commit_ts

    @property
    def reason(self) -> str:
        """The first change's reason: the refusal that blocked the key (later ones were held behind it)."""
        return self.rows[0].reason

    @property
    def upstream(self) -> str:
        if (self.schema, self.table) == UNKNOWN_TABLE:
            p = self.rows[0].position
            return f"(table unknown: partition {p.partition} of {shown(p.topic)})"
        return shown(self.schema, self.table)

    @property
    def is_block(self) -> bool:
        return is_block(self.rows[0])

    def as_json(self) -> dict[str, Any]:
        first = self.rows[0]
        return {
            "schema": self.schema, "table": self.table, "key": self.row_key, "state": self.state,
            "changes": len(self.rows), "first_commit_ts": self.first_ts, "last_commit_ts": self.last_ts,
            "reason": self.reason, "ids": self.ids, "kinds": [h.kind for h in self.rows],
            "first_position": {"topic": first.position.topic, "partition": first.position.partition,
                               "offset": first.position.offset},
            "resolved_by": first.resolved_by, "note": first.note,
        }


def _order(h: HeldRow) -> tuple[Any, ...]:
    return (h.commit_ts, h.position.topic, h.position.partition, h.position.offset, h.id)


def group_rows(rows: Iterable[HeldRow]) -> list[KeyGroup]:
    """Group by (upstream table, key, state), each group in commit order then Kafka order; groups in the order of
    their first change."""
    groups: dict[tuple[str, str, str, str], list[HeldRow]] = {}
    for h in sorted(rows, key=_order):
        groups.setdefault((h.schema, h.table, h.row_key, h.state), []).append(h)
    return [KeyGroup(s, t, k, st, tuple(rs)) for (s, t, k, st), rs in groups.items()]


def event_identity(h: HeldRow) -> tuple[Any, ...]:
    """One row change, however many keys it was held under: a key-changing update blocks both its keys. The
    position alone is not enough (one Kafka message can carry several row changes)."""
    return (h.schema, h.table, h.commit_ts, h.position.topic, h.position.partition, h.position.offset, h.event)


def whole_keys(matched: Iterable[HeldRow], held: Iterable[HeldRow]) -> list[KeyGroup]:
    """Every held change of every key ``matched`` touches, and of every key linked to those by one change held
    under several keys, grouped per key (a key's changes are retried or discarded together, never some of them).
    ``held`` must hold every held change of the tables ``matched`` comes from."""
    held = [h for h in held if h.state == HELD]
    by_key: dict[tuple[str, str, str], list[HeldRow]] = {}
    keys_of_event: dict[tuple[Any, ...], set[tuple[str, str, str]]] = {}
    for h in held:
        k = (h.schema, h.table, h.row_key)
        by_key.setdefault(k, []).append(h)
        keys_of_event.setdefault(event_identity(h), set()).add(k)
    todo = [(h.schema, h.table, h.row_key) for h in matched if h.state == HELD]
    chosen: set[tuple[str, str, str]] = set()
    while todo:
        k = todo.pop()
        if k in chosen:
            continue
        chosen.add(k)
        for h in by_key.get(k, ()):
            todo.extend(keys_of_event[event_identity(h)] - chosen)
    return group_rows(h for k in chosen for h in by_key.get(k, ()))


@dataclass
class TableBatch:
    """One upstream table's share of a retry: its changes in commit order (each once), and every held id."""

    schema: str
    table: str
    changes: list[RowChange] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)

    @property
    def upstream(self) -> str:
        return shown(self.schema, self.table)


class UnreadableEvent(RedriveError):
    """A held change's stored event cannot be read back (edited by hand?)."""

    code = 4

    def __init__(self, h: HeldRow, exc: Exception) -> None:
        super().__init__(f"held change id {h.id} (upstream table {shown(h.schema, h.table)}, key "
                         f"{shown_key(h.row_key)}) cannot be read back: {type(exc).__name__}: {exc}. Repair its "
                         "event column or discard its key")
        self.row = h


class UnreplayableMessage(RedriveError):
    """A blocking message decodes now, but into something a retry cannot apply in order: a DDL, or changes of
    another table than the one it blocked (whose later changes were not held)."""

    code = 4

    def __init__(self, h: HeldRow, what: str) -> None:
        super().__init__(
            f"the undecodable message at {h.position} (held id {h.id}) decodes now, but {what}. Make its change by "
            f"hand if it is needed (`applier quarantine show -c CONF --message ID` shows its bytes), then release "
            f"what it blocks with `applier quarantine discard -c CONF --id {h.id} --reason TEXT`")
        self.row = h


def is_block(h: HeldRow) -> bool:
    """Whether a held row is an undecodable message that blocks its table (or partition)."""
    return h.kind == UNDECODABLE and h.row_key == WHOLE_TABLE


def blocks_row(block: HeldRow, h: HeldRow) -> bool:
    """Whether ``block`` holds ``h`` back: its table's block, or its partition's (table unknown) when ``h`` was
    read after it."""
    if (block.schema, block.table) == UNKNOWN_TABLE:
        p, q = block.position, h.position
        return (p.topic, p.partition) == (q.topic, q.partition) and q.offset > p.offset
    return (block.schema, block.table) == (h.schema, h.table)


def with_blocks(groups: Sequence[KeyGroup], blocks: Iterable[HeldRow]) -> list[KeyGroup]:
    """``groups`` and the held blocks that hold any of their changes back: those must be retried first (in
    the same transaction), or the retried changes would overtake them."""
    blocks = [b for b in blocks if b.state == HELD and is_block(b)]
    chosen = {h.id for g in groups for h in g.rows}
    extra = [b for b in blocks if b.id not in chosen and any(blocks_row(b, h) for g in groups for h in g.rows)]
    return group_rows([h for g in groups for h in g.rows] + extra) if extra else list(groups)


def table_batches(groups: Sequence[KeyGroup],
                  decoded: Mapping[TableName, Sequence[RowChange]] | None = None) -> list[TableBatch]:
    """The changes to write, per upstream table, in commit order then Kafka order; a change held under two keys
    is written once. ``decoded``: the changes of blocking messages decoded again, merged in by the same order
    (the blocks' own ids are not in any batch). Raises :class:`UnreadableEvent` for an event that does not
    parse."""
    out: dict[TableName, TableBatch] = {}
    items: dict[TableName, list[tuple[tuple[Any, ...], int | None, RowChange | None, HeldRow | None]]] = {}
    for g in groups:
        if g.is_block:
            continue
        b = out.setdefault((g.schema, g.table), TableBatch(g.schema, g.table))
        b.keys.append(g.row_key)
        items.setdefault((g.schema, g.table), []).extend((_order(h), h.id, None, h) for h in g.rows)
    for t, evs in (decoded or {}).items():
        out.setdefault(t, TableBatch(*t))
        items.setdefault(t, []).extend(
            ((ev.commit_ts, ev.position.topic, ev.position.partition, ev.position.offset, -1), None, ev, None)
            for ev in evs)
    for t, its in items.items():
        b = out[t]
        seen: set[tuple[Any, ...]] = set()
        for _, row_id, ev, h in sorted(its, key=lambda it: it[0]):
            if h is None:
                assert ev is not None
                b.changes.append(ev)
                continue
            b.ids.append(h.id)
            ident = event_identity(h)
            if ident in seen:
                continue
            seen.add(ident)
            try:
                b.changes.append(h.change())
            except Exception as exc:
                raise UnreadableEvent(h, exc) from exc
    return list(out.values())


# ---- readable values (pure) ------------------------------------------------------------------------------------

def escape_text(s: str) -> str:
    """Text with every non-printable character (control characters, NUL, bidi overrides...) escaped, so a
    hostile value cannot act on the terminal."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def shown_key(row_key: str) -> str:
    """A row key as one can read and paste it into ``--key``: JSON, with non-printable characters (which only
    occur inside its strings) as JSON escapes."""
    out = []
    for c in row_key:
        if c.isprintable():
            out.append(c)
        else:
            for unit in (c.encode("utf-16-be")[i:i + 2] for i in range(0, len(c.encode("utf-16-be")), 2)):
                out.append(f"\\u{int.from_bytes(unit, 'big'):04x}")
    return "".join(out)


# ---- what the commands return ------------------------------------------------------------------------------

@dataclass(frozen=True)
class QuarantinedMessage:
    """The raw record of an undecodable message in ``applier_quarantine`` (its block row, if held, is retried)."""

    id: int
    topic: str
    partition: int
    offset: int
    reason: str
    created_at: dt.datetime | None
    key: bytes | None = None
    value: bytes | None = None
    key_length: int | None = None
    value_length: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "topic": self.topic, "partition": self.partition, "offset": self.offset,
                "reason": self.reason, "created_at": utc_text(self.created_at),
                "key_length": self.key_length, "value_length": self.value_length}


@dataclass
class Listing:
    pipeline: str
    state: str
    groups: list[KeyGroup]
    messages: list[QuarantinedMessage]
    messages_listed: bool  # messages are listed for --state held/all only (they have no state)

    @property
    def empty(self) -> bool:
        return not self.groups and not self.messages

    def as_json(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline, "state": self.state,
            "changes": sum(len(g.rows) for g in self.groups), "keys": len(self.groups),
            "groups": [g.as_json() for g in self.groups],
            "quarantined_messages": len(self.messages),
            "messages": [m.as_json() for m in self.messages],
        }


@dataclass
class RetryResult:
    pipeline: str
    epoch: int
    groups: list[KeyGroup]
    targets: dict[TableName, TableName]  # upstream table -> target table
    written: dict[TableName, tuple[int, int]]  # upstream table -> (rows upserted, rows deleted)
    by: str
    redecoded: dict[int, int] = field(default_factory=dict)  # id of a blocking message -> row changes it held


@dataclass
class Redecoded:
    """What the blocking messages of a retry hold, decoded again: row changes per upstream table (those of
    tables no longer routed are left out, as the pipeline leaves them out), and the count per block id."""

    changes: dict[TableName, list[RowChange]] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)


class _StillUndecodable(Exception):
    def __init__(self, block: HeldRow, reason: str) -> None:
        super().__init__(reason)
        self.block = block
        self.reason = reason


@dataclass
class DiscardResult:
    pipeline: str
    epoch: int
    groups: list[KeyGroup]
    by: str
    reason: str


def utc_text(t: dt.datetime | None) -> str | None:
    return None if t is None else t.isoformat() + "Z"


# ---- the I/O --------------------------------------------------------------------------------------------------

class Redrive:
    """One pipeline's quarantine, as ``applier quarantine`` acts on it.

    ``route``, ``gated`` and ``dialect`` are what the pipeline applies with (:meth:`from_settings` wires them from
    the config); ``dialect`` is found from the engine when first needed, so listing needs no writer."""

    def __init__(self, engine: Engine, pipeline: str, protocol: str, *, route: Route | None = None,
                 gated: bool = True, batch_rows: int = 5000, dialect: Any = None,
                 decoder: Callable[[], Any] | None = None) -> None:
        self.engine = engine
        self.decoder = decoder  # a fresh decoder of the pipeline's protocol and [source.codec], per retry
        self.pipeline = pipeline
        self.protocol = protocol
        self.route = route
        self.gated = gated
        self.batch_rows = batch_rows
        self._dialect = dialect
        self.rq = RowQuarantine(pipeline)

    @classmethod
    def from_settings(cls, engine: Engine, settings: Any) -> "Redrive":
        from applier.pipeline import decoder_for, router_for
        router = router_for(settings)
        return cls(engine, settings.pipeline.name, settings.source.protocol, route=router.route,
                   gated=decoder_for(settings).gated, batch_rows=settings.target.batch_rows,
                   decoder=lambda: decoder_for(settings))

    @property
    def dialect(self) -> Any:
        if self._dialect is None:
            from applier.dialect import dialect_for
            self._dialect = dialect_for(self.engine)
        return self._dialect

    # ---- reading ---------------------------------------------------------------------------------------
    def require_tables(self, conn: Connection) -> None:
        """The quarantine tables exist (migration 0010), else say how to create them (exit 2)."""
        if not inspect(conn).has_table(p.quarantined_rows.name):
            raise RedriveError(
                f"the target has no {p.quarantined_rows.name} table (the applier's tables predate revision 0010): "
                "run `applier migrate -c CONF` (an `applier run` also migrates when it starts)", code=2)

    def listing(self, *, state: str = HELD, table: TableName | None = None,
                row_key: str | None = None) -> Listing:
        states = STATES if state == "all" else (state,)
        with self.engine.connect() as conn:
            self.require_tables(conn)
            rows = self.rq.find(conn, states=states, table=table, row_key=row_key)
            listed = state in (HELD, "all")
            messages = self._messages(conn) if listed else []
        return Listing(self.pipeline, state, group_rows(rows), messages, listed)

    def _messages(self, conn: Connection, ids: Iterable[int] | None = None, *,
                  raw: bool = False) -> list[QuarantinedMessage]:
        q = p.quarantine
        cols = [q.c.id, q.c.topic, q.c.kafka_partition, q.c.kafka_offset, q.c.reason, q.c.created_at]
        if raw:
            cols += [q.c.msg_key, q.c.msg_value]
        stmt = select(*cols).where(q.c.pipeline == self.pipeline)
        if ids is not None:
            stmt = stmt.where(q.c.id.in_(list(ids)))
        stmt = stmt.order_by(q.c.topic, q.c.kafka_partition, q.c.kafka_offset)
        out = []
        for r in conn.execute(stmt).mappings():
            k, v = (r["msg_key"], r["msg_value"]) if raw else (None, None)
            out.append(QuarantinedMessage(
                int(r["id"]), r["topic"], int(r["kafka_partition"]), int(r["kafka_offset"]), r["reason"],
                r["created_at"], None if k is None else bytes(k), None if v is None else bytes(v),
                None if k is None else len(k), None if v is None else len(v)))
        return out

    def held(self, row_id: int) -> HeldRow:
        """One quarantined change (any state)."""
        with self.engine.connect() as conn:
            self.require_tables(conn)
            found = self.rq.find(conn, states=STATES, ids=[row_id])
        if not found:
            raise NothingMatched(f"pipeline {self.pipeline!r} has no quarantined row change with id {row_id} "
                                 "(`applier quarantine list --state all` lists them; --message shows an "
                                 "undecodable message's id)")
        return found[0]

    def message(self, msg_id: int) -> QuarantinedMessage:
        with self.engine.connect() as conn:
            self.require_tables(conn)
            found = self._messages(conn, [msg_id], raw=True)
        if not found:
            raise NothingMatched(f"pipeline {self.pipeline!r} has no quarantined message with id {msg_id} "
                                 "(`applier quarantine list` lists them)")
        return found[0]

    def select(self, conn: Connection, sel: Selection) -> list[KeyGroup]:
        """The held changes ``sel`` picks, widened to whole keys (see :func:`whole_keys`)."""
        matched = self.rq.find(conn, table=sel.table, row_key=sel.row_key, ids=sel.ids or None)
        if not matched:
            raise NothingMatched(f"no held change of pipeline {self.pipeline!r} matches {sel.describe()} "
                                 "(`applier quarantine list` shows the held ones; --state all also the resolved)")
        if sel.row_key is not None and sel.table is None:
            tables = sorted({(h.schema, h.table) for h in matched})
            if len(tables) > 1:
                raise ConfigError("--table", f"key {shown_key(sel.row_key)} is blocked in {len(tables)} upstream "
                                  f"tables ({', '.join(shown(*t) for t in tables)}): add --table SCHEMA.TABLE",
                                  source=CLI)
        if sel.everything:
            candidates = matched
        else:  # every held change of the matched tables: the keys' other changes, and linked keys
            candidates = [h for t in sorted({(h.schema, h.table) for h in matched})
                          for h in self.rq.find(conn, table=t)]
        return with_blocks(whole_keys(matched, candidates), self.rq.find(conn, kind=UNDECODABLE))

    def _raw(self, conn: Connection, block: HeldRow) -> KafkaMessage:
        q = p.quarantine
        pos = block.position
        row = conn.execute(select(q.c.msg_key, q.c.msg_value).where(
            q.c.pipeline == self.pipeline, q.c.topic == pos.topic, q.c.kafka_partition == pos.partition,
            q.c.kafka_offset == pos.offset)).first()
        if row is None:
            raise RedriveError(f"the raw record of the undecodable message at {pos} (held id {block.id}) is not in "
                               f"{q.name} (deleted by hand?), so it cannot be decoded again: make its change by hand "
                               f"if it is needed, then `applier quarantine discard -c CONF --id {block.id} --reason "
                               "TEXT`", code=4)
        k, v = row
        return KafkaMessage(pos.topic, pos.partition, pos.offset, None if k is None else bytes(k),
                            None if v is None else bytes(v))

    def redecode(self, conn: Connection, groups: Sequence[KeyGroup]) -> Redecoded:
        """Decode the blocking messages among ``groups`` again, in Kafka order, with a fresh decoder of the
        config in force. Raises :class:`_StillUndecodable` for one that still fails, and
        :class:`UnreplayableMessage` for one whose content a retry cannot apply in order."""
        from applier.codecs import HoldsMessages

        blocks = sorted((h for g in groups if g.is_block for h in g.rows),
                        key=lambda h: (h.position.topic, h.position.partition, h.position.offset))
        out = Redecoded()
        if not blocks:
            return out
        if self.decoder is None:
            raise RedriveError("no decoder given: build Redrive with decoder= (Redrive.from_settings does)", code=2)
        decoder = self.decoder()
        for b in blocks:
            msg = self._raw(conn, b)
            try:
                evs = decoder.decode(msg)
            except DecodeError as exc:
                raise _StillUndecodable(b, f"the message still cannot be decoded: {exc.reason}") from exc
            if isinstance(decoder, HoldsMessages) and decoder.held_offsets():
                raise _StillUndecodable(b, "the message can only be decoded with its table's schema from an earlier "
                                           "message of the stream, which the quarantine does not keep")
            n = 0
            for ev in evs:
                if isinstance(ev, DDL):
                    raise UnreplayableMessage(b, f"into a DDL ({ev.query[:200]!r}), which a retry does not run")
                if type(ev) is not RowChange:
                    continue  # a resolved ts or a schema: nothing to apply
                if (b.schema, b.table) != UNKNOWN_TABLE and (ev.schema, ev.table) != (b.schema, b.table):
                    raise UnreplayableMessage(b, f"into changes of upstream table {shown(ev.schema, ev.table)}, "
                                                 f"not of {shown(b.schema, b.table)} whose later changes it held")
                if self.route is not None and self.route(ev.schema, ev.table) is None:
                    continue
                out.changes.setdefault((ev.schema, ev.table), []).append(ev)
                n += 1
            out.counts[b.id] = n
        return out

    def preview(self, sel: Selection) -> list[KeyGroup]:
        """The selection before anything is claimed: nothing matched, or a table no longer routed, must not
        fence a running pipeline for nothing."""
        with self.engine.connect() as conn:
            self.require_tables(conn)
            return self.select(conn, sel)

    def missing_ids(self, sel: Selection, groups: Sequence[KeyGroup]) -> list[int]:
        """--id values that picked no held change (already resolved, another pipeline's, or no such id)."""
        have = {i for g in groups for i in g.ids}
        return [i for i in sel.ids if i not in have]

    def targets(self, batches: Sequence[TableBatch]) -> dict[TableName, TableName]:
        """Where each upstream table goes now; a table no longer routed cannot be retried (exit 2)."""
        if self.route is None:
            raise RedriveError("no routes given: build Redrive with route= (Redrive.from_settings does)", code=2)
        out = {}
        for b in batches:
            try:
                target = self.route(b.schema, b.table)
            except Exception as exc:  # a [[route]] template that makes an empty or over-long name
                raise RedriveError(f"routing upstream table {b.upstream} failed: {exc}. Fix the [[route]] rules in "
                                   "the config", code=2) from exc
            if target is None:
                raise RedriveError(
                    f"upstream table {b.upstream} is no longer routed (the [[route]] rules ignore it or none keeps "
                    f"it), so its held changes have nowhere to go: route it again in the config, or give them up "
                    f"with `applier quarantine discard --table {b.upstream} --reason TEXT`", code=2)
            out[(b.schema, b.table)] = target
        return out

    # ---- acting --------------------------------------------------------------------------------------------
    def _claim(self) -> ProgressStore:
        store = ProgressStore(self.pipeline, self.protocol)
        store.claim(self.engine)
        return store

    def retry(self, sel: Selection, *, by: str | None = None) -> RetryResult:
        """Apply every held change of the selected keys in one transaction and mark them retried in it; on a
        refusal, roll back, keep them held with the new reason and raise :class:`RetryFailed`."""
        sel.check("retry")
        by = by or who_am_i()
        groups = self.preview(sel)
        with self.engine.connect() as conn:
            decoded = self._redecode_or_renote(conn, groups, by)
        self.targets(table_batches(groups, decoded.changes))  # refuse before claiming: unreadable event, unrouted
        store = self._claim()
        assert store.epoch is not None
        writer = self.dialect.writer(self.batch_rows)
        failed: tuple[TableBatch, str, BaseException] | None = None
        with self.engine.connect() as conn:
            tx = conn.begin()
            try:
                writer.begin(conn)
                store.check_writer(conn)  # holds off a newer claim until this transaction ends
                groups = self.select(conn, sel)  # again, now that the pipeline is fenced: it may have held more
                try:  # the same bytes and decoder as a moment ago, so this fails only if a block was just added
                    decoded = self.redecode(conn, groups)
                except _StillUndecodable as exc:
                    raise RedriveError(f"{exc.reason} (held id {exc.block.id}, held while this retry started): "
                                       "nothing was applied; run the command again", code=4) from None
                batches = table_batches(groups, decoded.changes)
                targets = self.targets(batches)
                written: dict[TableName, tuple[int, int]] = {}
                for b in batches:
                    target = targets[(b.schema, b.table)]
                    try:
                        meta = writer.table(conn, *target)
                    except Exception as exc:
                        what = str(exc) if not hasattr(exc, "orig") else \
                            f"reading target table {shown(*target)} failed: {db_reason(exc)}"
                        failed = (b, f"{what} (upstream table {b.upstream})", exc)
                        break
                    try:
                        plan = plan_batch(meta, b.changes, replace=not self.gated)
                        writer.write(conn, plan)
                    except Exception as exc:  # the database's reason first: `list` shows a reason's start
                        failed = (b, f"{db_reason(exc)} (writing {len(b.changes)} change(s) of upstream table "
                                     f"{b.upstream} into {meta.display}, {_span(b.changes)})", exc)
                        break
                    written[(b.schema, b.table)] = (len(plan.upserts), len(plan.deletes))
                if failed is None:
                    ids = [i for g in groups for i in g.ids]
                    n = self.rq.resolve(conn, ids, state="retried", by=by,
                                        note=f"applied by `applier quarantine retry` ({len(ids)} change(s) of "
                                             f"{len(groups)} key(s) in one transaction, writer epoch {store.epoch})")
                    if n != len(ids):
                        raise RedriveError(f"{len(ids) - n} of the {len(ids)} selected change(s) were resolved by "
                                           "someone else meanwhile; nothing was applied: run the command again")
                    tx.commit()
            finally:
                if tx.is_active:
                    tx.rollback()
        if failed is not None:
            b, message, exc = failed
            if self.dialect.is_transient(exc):
                raise TargetUnavailable(f"{message}. The target failed in a way that passes (a lost connection, a "
                                        "restart, a deadlock); nothing was applied: run the command again")
            reason = f"retry failed: {message} [{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M:%S}Z, {by}]"
            with self.engine.begin() as conn:
                self.rq.renote(conn, b.ids, reason)
            raise RetryFailed(message, reason=reason, groups=groups, renoted=b.ids)
        return RetryResult(self.pipeline, store.epoch, groups, targets, written, by, decoded.counts)

    def _redecode_or_renote(self, conn: Connection, groups: Sequence[KeyGroup], by: str) -> Redecoded:
        """:meth:`redecode`, with a message that still cannot be decoded kept held with the new error (and
        :class:`RetryFailed` raised), before anything is claimed."""
        try:
            return self.redecode(conn, groups)
        except _StillUndecodable as exc:
            b = exc.block
            reason = f"retry failed: {exc.reason} [{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M:%S}Z, {by}]"
            self.rq.renote(conn, [b.id], reason)
            conn.commit()
            raise RetryFailed(f"the undecodable message at {b.position} (held id {b.id}) blocks "
                              f"{KeyGroup(b.schema, b.table, b.row_key, b.state, (b,)).upstream}: {exc.reason}",
                              reason=reason, groups=groups, renoted=[b.id]) from None

    def discard(self, sel: Selection, *, reason: str, by: str | None = None) -> DiscardResult:
        """Give up every held change of the selected keys, recording who and why (one transaction)."""
        sel.check("discard")
        if not reason or not reason.strip():
            raise ConfigError("--reason", "discard needs --reason TEXT saying why these changes are given up (it is "
                              "recorded with them)", source=CLI)
        by = by or who_am_i()
        self.preview(sel)
        store = self._claim()
        assert store.epoch is not None
        with self.engine.connect() as conn:
            with conn.begin():
                store.check_writer(conn)
                groups = self.select(conn, sel)
                ids = [i for g in groups for i in g.ids]
                n = self.rq.resolve(conn, ids, state="discarded", by=by, note=reason.strip())
                if n != len(ids):
                    raise RedriveError(f"{len(ids) - n} of the {len(ids)} selected change(s) were resolved by "
                                       "someone else meanwhile; nothing was discarded: run the command again")
        return DiscardResult(self.pipeline, store.epoch, groups, by, reason.strip())


def _span(changes: Sequence[RowChange]) -> str:
    first, last = changes[0].position, changes[-1].position
    return f"the event at {first}" if first == last else f"events from {first} to {last}"
