"""Blocking quarantine of row changes: a change the target refuses is kept with its key, and so is every later
change of that key, until an operator retries or discards them.

Why blocking: keeping the refused change aside while later changes of the same row still applied would leave a
row that never existed upstream (a quarantined insert followed by an applied update), or none at all. So a key
with a held change is *blocked*: its later changes are held too, in commit order, and ``applier quarantine
retry`` applies them all in that order once the cause is fixed (the target table altered, the config changed,
the applier upgraded), within one target transaction; ``discard`` records who gave them up and why. Keys are
per upstream table (the names the stream carries), so a routing change does not lose a block.

Held changes are stored as JSON with typed values (never pickle: the table is data an operator may edit, and
retry must not execute what it reads). ``row_key`` is the key's values in the same encoding, so it compares by
text in SQL and shows as readable text in ``applier quarantine list``.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Iterable, Sequence

from sqlalchemy import and_, func, insert, select, update
from sqlalchemy.engine import Connection

from applier.events import Column, KafkaMessage, Op, RowChange, SourcePosition
from applier.progress import now, quarantined_rows as rows

HELD = "held"
SKIPPED = "skipped"
STATES = ("held", "retried", "discarded", "skipped")
#: the row_key of a block: an undecodable message (its row key cannot be read) holds every later change of its
#: table behind it, or, when not even its table can be read, every later change of its Kafka partition. Also the
#: row_key of every held change of a table without a key (:func:`keys_of`): it holds the whole table.
WHOLE_TABLE = "*"
UNDECODABLE = "undecodable"  # the kind of such a block's row
#: the (schema, table) of a partition block: the message's table is unknown
UNKNOWN_TABLE = ("", "")
BlockedKey = tuple[str, str, str]  # (upstream schema, upstream table, row_key)
Partition = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class UndecodableMessage:
    """A message that cannot be decoded, as the policy in force settled it (applier.processor).

    ``table`` is the upstream table the message names, when that much of it can be read; None when not even
    that can (it then blocks its Kafka partition: with TiCDC's table, index-value and column dispatchers every
    later change of its row is in the same partition). ``state`` is ``held`` (quarantine: it blocks) or
    ``skipped`` (recorded, nothing held)."""

    message: KafkaMessage
    reason: str
    table: tuple[str, str] | None
    state: str = HELD

    @property
    def blocks_partition(self) -> bool:
        return self.table is None


# ---- values and events as JSON ------------------------------------------------------------------------------

def _value(v: Any) -> Any:
    """A decoded value as JSON: the types JSON lacks become one-key objects, so they come back as they were."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return {"f": repr(v)}  # also NaN and inf, which plain JSON cannot hold
    if isinstance(v, Decimal):
        return {"d": str(v)}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"b": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, dt.datetime):
        return {"dt": v.isoformat()}
    if isinstance(v, dt.date):
        return {"da": v.isoformat()}
    if isinstance(v, dt.timedelta):
        return {"td": [v.days, v.seconds, v.microseconds]}
    if isinstance(v, dt.time):
        return {"t": v.isoformat()}
    raise TypeError(f"no JSON form for a {type(v).__name__} value")


def _unvalue(j: Any) -> Any:
    if not isinstance(j, dict):
        return j
    (tag, v), = j.items()
    if tag == "f":
        return float(v)
    if tag == "d":
        return Decimal(v)
    if tag == "b":
        return base64.b64decode(v)
    if tag == "dt":
        return dt.datetime.fromisoformat(v)
    if tag == "da":
        return dt.date.fromisoformat(v)
    if tag == "td":
        return dt.timedelta(days=v[0], seconds=v[1], microseconds=v[2])
    if tag == "t":
        return dt.time.fromisoformat(v)
    raise ValueError(f"unknown value tag {tag!r}")


def _image(d: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if d is None else {k: _value(v) for k, v in d.items()}


def _unimage(d: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if d is None else {k: _unvalue(v) for k, v in d.items()}


def event_json(ev: RowChange) -> str:
    return json.dumps({
        "schema": ev.schema, "table": ev.table, "commit_ts": ev.commit_ts, "op": ev.op.value,
        "before": _image(ev.before), "after": _image(ev.after),
        "columns": [[c.name, c.type_name, c.nullable, c.key, c.unique, c.unsigned, c.binary, c.generated,
                     c.type_code] for c in ev.columns],
        "position": [ev.position.topic, ev.position.partition, ev.position.offset],
    }, ensure_ascii=False, separators=(",", ":"))


def event_from_json(text: str) -> RowChange:
    d = json.loads(text)
    return RowChange(d["schema"], d["table"], int(d["commit_ts"]), Op(d["op"]), _unimage(d["before"]),
                     _unimage(d["after"]), tuple(Column(*c) for c in d["columns"]), SourcePosition(*d["position"]))


def key_text(values: Sequence[Any]) -> str:
    """A key's values as the text ``row_key`` holds (equal keys, equal text)."""
    return json.dumps([_value(v) for v in values], ensure_ascii=False, separators=(",", ":"))


def keys_of(ev: RowChange, key: Sequence[str]) -> list[str]:
    """The row keys a change touches: the before image's and the after image's (two for a key-changing update).
    A table without a key has no row key: its changes are all under :data:`WHOLE_TABLE`, so a held one holds
    every later change of the table."""
    if not key:
        return [WHOLE_TABLE]
    out = []
    for img in (ev.before, ev.after):
        if img is not None and all(k in img for k in key):
            t = key_text([img[k] for k in key])
            if t not in out:
                out.append(t)
    return out


# ---- the table ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HeldRow:
    id: int
    schema: str
    table: str
    row_key: str
    commit_ts: int
    position: SourcePosition
    kind: str
    state: str
    reason: str
    event: str
    created_at: dt.datetime
    resolved_by: str | None = None
    note: str | None = None

    def change(self) -> RowChange:
        return event_from_json(self.event)


class RowQuarantine:
    """One pipeline's quarantined row changes. Writes happen in the caller's transaction: the applier's, which
    ends with the progress save and its writer-epoch check, so a fenced run quarantines nothing."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline

    def blocked(self, conn: Connection) -> set[BlockedKey]:
        """Every key with a held change: its later changes are held too (undecodable messages: :meth:`blocks`)."""
        q = select(rows.c.source_schema, rows.c.source_table, rows.c.row_key).where(
            rows.c.pipeline == self.pipeline, rows.c.state == HELD, rows.c.kind != UNDECODABLE).distinct()
        return {(s, t, k) for s, t, k in conn.execute(q)}

    def blocks(self, conn: Connection) -> dict[tuple[str, str], dict[Partition, int]]:
        """Held undecodable messages: per upstream table (:data:`UNKNOWN_TABLE` for those whose table cannot be
        read), the offset of the first one in each partition. What was read after it waits behind it."""
        q = select(rows.c.source_schema, rows.c.source_table, rows.c.topic, rows.c.kafka_partition,
                   func.min(rows.c.kafka_offset)).where(
            rows.c.pipeline == self.pipeline, rows.c.state == HELD, rows.c.kind == UNDECODABLE).group_by(
            rows.c.source_schema, rows.c.source_table, rows.c.topic, rows.c.kafka_partition)
        out: dict[tuple[str, str], dict[Partition, int]] = {}
        for s, t, topic, p, o in conn.execute(q):
            out.setdefault((s, t), {})[(topic, int(p))] = int(o)
        return out

    def hold(self, conn: Connection, ev: RowChange, row_key: str, *, kind: str, reason: str,
             state: str = HELD) -> None:
        conn.execute(insert(rows).values(
            pipeline=self.pipeline, source_schema=ev.schema, source_table=ev.table, row_key=row_key[:1024],
            commit_ts=ev.commit_ts, topic=ev.position.topic, kafka_partition=ev.position.partition,
            kafka_offset=ev.position.offset, kind=kind, state=state, reason=reason[:4000], event=event_json(ev),
            created_at=now()))

    def block(self, conn: Connection, u: UndecodableMessage) -> bool:
        """Record an undecodable message (its raw bytes are in ``applier_quarantine``) under its table, or under
        :data:`UNKNOWN_TABLE` with its partition. Held, every later change of the table (or partition) is held
        behind this row until ``applier quarantine retry`` decodes it again or ``discard`` gives it up. Once per
        Kafka position: a rerun that reads the message again (its restart offset lies before it) adds nothing,
        not even after a discard. Returns whether a row was added."""
        pos = u.message.position
        seen = select(rows.c.id).where(
            rows.c.pipeline == self.pipeline, rows.c.kind == UNDECODABLE, rows.c.topic == pos.topic,
            rows.c.kafka_partition == pos.partition, rows.c.kafka_offset == pos.offset)
        if conn.execute(seen).first() is not None:
            return False
        schema, table = u.table or UNKNOWN_TABLE
        conn.execute(insert(rows).values(
            pipeline=self.pipeline, source_schema=schema, source_table=table, row_key=WHOLE_TABLE, commit_ts=0,
            topic=pos.topic, kafka_partition=pos.partition, kafka_offset=pos.offset,
            kind=UNDECODABLE, state=u.state, reason=u.reason[:4000],
            event=json.dumps({"undecodable": [pos.topic, pos.partition, pos.offset]}),
            created_at=now()))
        return True

    def find(self, conn: Connection, *, states: Iterable[str] = (HELD,), table: tuple[str, str] | None = None,
             row_key: str | None = None, ids: Iterable[int] | None = None, kind: str | None = None) -> list[HeldRow]:
        """Quarantined changes in commit order (then Kafka order), filtered."""
        cond = [rows.c.pipeline == self.pipeline, rows.c.state.in_(list(states))]
        if kind is not None:
            cond.append(rows.c.kind == kind)
        if table is not None:
            cond += [rows.c.source_schema == table[0], rows.c.source_table == table[1]]
        if row_key is not None:
            cond.append(rows.c.row_key == row_key)
        if ids is not None:
            cond.append(rows.c.id.in_(list(ids)))
        q = select(rows).where(and_(*cond)).order_by(rows.c.commit_ts, rows.c.topic, rows.c.kafka_partition,
                                                     rows.c.kafka_offset, rows.c.id)
        return [HeldRow(r.id, r.source_schema, r.source_table, r.row_key, r.commit_ts,
                        SourcePosition(r.topic, r.kafka_partition, r.kafka_offset), r.kind, r.state, r.reason,
                        r.event, r.created_at, r.resolved_by, r.note) for r in conn.execute(q)]

    def resolve(self, conn: Connection, ids: Iterable[int], *, state: str, by: str, note: str = "") -> int:
        """Mark held changes retried or discarded (their keys are released with them)."""
        assert state in STATES and state != HELD, state
        res = conn.execute(update(rows).where(rows.c.pipeline == self.pipeline, rows.c.state == HELD,
                                              rows.c.id.in_(list(ids)))
                           .values(state=state, resolved_at=now(), resolved_by=by[:255], note=note or None))
        return res.rowcount or 0

    def renote(self, conn: Connection, ids: Iterable[int], reason: str) -> None:
        """A retry failed again: the changes stay held with the new error."""
        conn.execute(update(rows).where(rows.c.pipeline == self.pipeline, rows.c.id.in_(list(ids)))
                     .values(reason=reason[:4000]))

    def counts(self, conn: Connection) -> tuple[int, int]:
        """(held changes, blocked keys) for ``applier status``, counted by the database."""
        held = and_(rows.c.pipeline == self.pipeline, rows.c.state == HELD)
        n = conn.execute(select(func.count()).select_from(rows).where(held)).scalar() or 0
        keys = select(rows.c.source_schema, rows.c.source_table, rows.c.row_key).where(held).distinct().subquery()
        return int(n), int(conn.execute(select(func.count()).select_from(keys)).scalar() or 0)
