"""Turning one table's ordered row changes into one idempotent batch: deletes, then upserts.

A batch is planned per target table from row changes already in commit order. Several versions of one key
collapse to the last one: this is safe because a batch is always written inside the transaction that also
records the progress, so no reader sees the intermediate states and a crash rolls it all back (invariant 6).

An update that changes the primary key or any unique key is a delete of the old row and an insert of the new
one, deletes first (invariant 5): a key that saw a delete or such an update anywhere in the batch is deleted
in the delete phase and, if it has a final row, re-inserted in the upsert phase. That keeps unique-key swaps
and moves inside one batch from colliding.

Within one commit ts (gated streams), a removal - a delete, or the old key of a key-changing update - never
undoes a row another change of that ts wrote: TiKV keeps one change per row per transaction, so when two rows
swap primary keys (a table whose primary key is not its row handle), their updates 4->5 and 5->4 come in either
order, and the second one's removal of key 5 is the old row's, not the one the first update just put there.

A table without a key (no primary key, no unique key over NOT NULL columns) has no row identity but its content,
and may hold identical rows, so nothing can be collapsed: :func:`plan_keyless` keeps its changes as an ordered
list of :class:`RowOp` (insert the new row; update or delete exactly one row equal to the old row, every writable
column compared), which the writer applies one by one in commit order. Such a batch is not idempotent: applied
twice, its inserts duplicate rows. A restart never applies it twice (it commits with the progress), but a TiCDC
re-send can (README, "Keyless tables").
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from applier.events import Op, RowChange, SourcePosition
from applier.sinks.table import ApplyError, TableMeta


@dataclass
class BatchPlan:
    """One table's share of an applied window, ready for the writer."""

    meta: TableMeta
    deletes: list[tuple[Any, ...]] = field(default_factory=list)  # key tuples, in meta.key order
    upserts: list[dict[str, Any]] = field(default_factory=list)  # full rows, writable columns only
    changes: int = 0  # row changes that went into it (before collapsing)
    # replace mode: per non-key unique key, the values the upserts will hold; rows holding them go first
    unique_clears: dict[tuple[str, ...], list[tuple[Any, ...]]] = field(default_factory=dict)
    # a table without a key: its changes in commit order, applied one by one (then deletes/upserts are empty)
    keyless: list[RowOp] = field(default_factory=list)

    def written(self) -> tuple[int, int]:
        """(rows upserted, rows deleted) for the metrics: a keyless plan's inserts and updates count as upserts."""
        if not self.keyless:
            return len(self.upserts), len(self.deletes)
        deleted = sum(1 for op in self.keyless if op.op is Op.DELETE)
        return len(self.keyless) - deleted, deleted


@dataclass(slots=True)
class RowOp:
    """One change of a table without a key, as the writer applies it (see :func:`plan_keyless`).

    ``before`` (update, delete) holds every writable target column, in table order: the row to change is found
    by all of them, NULL-safe, never by fewer. ``after`` (insert, update) holds the new row's writable columns.
    Both are copies of the event's images, because writers adapt them in place."""

    op: Op
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    position: SourcePosition


def plan_batch(meta: TableMeta, changes: Sequence[RowChange], *, replace: bool = False) -> BatchPlan:
    """Collapse ordered row changes of one table into deletes then upserts (see the module docstring).

    ``replace`` (used where there is no commit ts to order by, i.e. ungated protocols, whose at-least-once
    replays can bring an older row back while another row holds its unique value): before the upserts, rows
    holding any of their non-key unique values are deleted, as TiCDC's own safe mode (REPLACE) does.

    This runs once per row change, so the common case is kept cheap: key tuples come from a C-level getter
    (:func:`_key` only runs to word the error when that fails), and whether a row's columns are all writable
    is decided once per column-name tuple (:func:`_writable_row` only runs for rows that need filtering or
    hold unknown columns). Upsert rows are copies of the events' dicts, because writers adapt them in place."""
    if not meta.key:
        return plan_keyless(meta, changes)
    key_cols = meta.key
    key_of = _key_getter(key_cols)
    single_key = len(key_cols) == 1
    key0 = key_cols[0]
    other_uniques = tuple(cols for cols in meta.unique_sets if cols != key_cols)
    writable = meta.writable
    all_writable: dict[tuple[str, ...], bool] = {}  # column names of a row -> every one is writable
    final: dict[tuple[Any, ...], dict[str, Any] | None] = {}
    must_delete: dict[tuple[Any, ...], None] = {}
    # Gated: the commit ts that last wrote each key. Within one commit ts a removal never undoes a write (see the
    # module docstring); ungated events have no usable commit ts, and there order alone decides.
    written_at: dict[tuple[Any, ...], int] | None = None if replace else {}
    delete_op, update_op = Op.DELETE, Op.UPDATE
    for ch in changes:
        op = ch.op
        if op is delete_op:
            try:
                k = key_of(ch.before)
            except (KeyError, TypeError):
                k = _key(meta, ch, ch.before, key_cols)  # raises, naming what is missing
            must_delete[k] = None
            if written_at is None or written_at.get(k) != ch.commit_ts:
                final.pop(k, None)
                final[k] = None
            continue
        after = ch.after
        if after:
            names = tuple(after)
            ok = all_writable.get(names)
            if ok is None:
                ok = all_writable[names] = writable.issuperset(names)
            row = dict(after) if ok else _writable_row(meta, ch)
            try:
                k = key_of(after)
            except (KeyError, TypeError):
                k = _key(meta, ch, after, key_cols)
        else:
            row = _writable_row(meta, ch)
            k = _key(meta, ch, after, key_cols)  # raises: no row image
        if op is update_op and ch.before:
            old = ch.before
            if (key0 in old) if single_key else any(c in old for c in key_cols):
                try:
                    ok_ = key_of(old)
                except KeyError:
                    ok_ = _key(meta, ch, old, key_cols)  # raises: part of the key is missing
                if ok_ != k:
                    must_delete[ok_] = None
                    if written_at is None or written_at.get(ok_) != ch.commit_ts:
                        final.pop(ok_, None)
                        final[ok_] = None
            for cols in other_uniques:  # a key change is handled above
                if any(c in old and c in after and old[c] != after[c] for c in cols):
                    must_delete[k] = None
                    break
        final.pop(k, None)
        final[k] = row
        if written_at is not None:
            written_at[k] = ch.commit_ts
    plan = BatchPlan(meta, changes=len(changes))
    plan.deletes = list(must_delete)
    plan.upserts = [row for row in final.values() if row is not None]
    if replace:
        for cols in other_uniques:
            vals = [v for row in plan.upserts
                    if (v := tuple(row.get(c) for c in cols)) and all(x is not None for x in v) and all(c in row for c in cols)]
            if vals:
                plan.unique_clears[cols] = list(dict.fromkeys(vals))
    return plan


def _key_getter(cols: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """A C-level function image -> key tuple (operator.itemgetter returns a bare value for one name, so a
    one-column key is wrapped). Raises KeyError for a missing column and TypeError for no image."""
    if len(cols) == 1:
        c = cols[0]

        def one(image: Any) -> tuple[Any, ...]:
            return (image[c],)

        return one
    return operator.itemgetter(*cols)


def _key(meta: TableMeta, ch: RowChange, image: dict[str, Any] | None, cols: tuple[str, ...]) -> tuple[Any, ...]:
    if not image:
        raise ApplyError(f"{ch.op.value} on {meta.display} at {ch.position} carries no row image")
    try:
        return tuple(image[c] for c in cols)
    except KeyError as exc:
        raise ApplyError(
            f"{ch.op.value} on {meta.display} at {ch.position} lacks key column {exc.args[0]!r} of the target's "
            f"key ({', '.join(cols)}): the upstream and target keys differ; make the target key match upstream"
        ) from None


def _writable_row(meta: TableMeta, ch: RowChange) -> dict[str, Any]:
    after = ch.after or {}
    unknown = [c for c in after if c not in meta.writable and c not in meta.columns]
    if unknown:
        raise ApplyError(
            f"{ch.op.value} on upstream table {ch.schema}.{ch.table} at {ch.position} has column(s) "
            f"{', '.join(repr(c) for c in unknown)} that target table {meta.display} lacks: apply the upstream "
            "DDL to the target (or let the applier replicate DDL, or set [target] schema_evolution = \"evolve\" to add "
            "columns from the stream), then restart"
        )
    # Only columns generated on the *target* are skipped: a column generated upstream can be a plain
    # column downstream (PostgreSQL cannot take MySQL's expressions), and then its value must be written.
    return {c: v for c, v in after.items() if c in meta.writable}


# ---- keyless tables ------------------------------------------------------------------------------------------

def plan_keyless(meta: TableMeta, changes: Sequence[RowChange]) -> BatchPlan:
    """The changes of a table without a key as :class:`RowOp` values in commit order, nothing collapsed: two
    identical rows are two rows, and which of them an update changes does not matter, but how many there are
    does. Refused (ApplyError naming the table, the position and the fix): an insert or update without a new
    row, an update or delete without the old row or lacking one of the target's writable columns (some
    protocols send only key columns; matching fewer columns could change a row upstream did not), and images
    holding columns the target lacks."""
    match_cols = keyless_match_columns(meta)
    known = frozenset(meta.columns)
    ops: list[RowOp] = []
    insert_op, delete_op = Op.INSERT, Op.DELETE
    for ch in changes:
        op = ch.op
        before = None if op is insert_op else _old_row(meta, ch, match_cols, known)
        if op is delete_op:
            after = None
        elif ch.after:
            after = _writable_row(meta, ch)
        else:
            raise ApplyError(f"{op.value} on {meta.display} at {ch.position} carries no row image")
        ops.append(RowOp(op, before, after, ch.position))
    return BatchPlan(meta, changes=len(changes), keyless=ops)


def keyless_match_columns(meta: TableMeta) -> tuple[str, ...]:
    """The columns an update or delete of a table without a key is matched by: every writable column, in table
    order. Columns generated on the target are left out: they follow from the others."""
    return tuple(c for c in meta.columns if c in meta.writable)


def _old_row(meta: TableMeta, ch: RowChange, match_cols: tuple[str, ...], known: frozenset[str]) -> dict[str, Any]:
    """The old row an update or delete must find, as a new dict of ``match_cols``; refused when incomplete."""
    image = ch.before
    what = (f"{ch.op.value} on target table {meta.display} (no primary key, no unique key over NOT NULL columns) "
            f"at {ch.position}")
    if not image:
        raise ApplyError(
            f"{what} carries no old row, and a table without a key is matched by its whole old row: make the "
            "changefeed send old values (TiCDC's old value output; Avro sends updates without them and cannot be "
            "used for such tables), or give the table a primary key (upstream and target), then restart")
    missing = [c for c in match_cols if c not in image]
    if missing:
        raise ApplyError(
            f"{what} lacks column(s) {', '.join(repr(c) for c in missing)} of the old row, which the target table "
            "has. A table without a key is matched by its whole old row, never by fewer columns (that could change "
            "a row upstream did not): make the changefeed send whole old rows (turn off TiCDC's "
            "delete-only-output-handle-key-columns; Avro deletes are key-only tombstones), drop the column(s) from "
            "the target if upstream has no such column, or give the table a primary key, then restart")
    unknown = [c for c in image if c not in known]
    if unknown:
        raise ApplyError(
            f"{what} has column(s) {', '.join(repr(c) for c in unknown)} that target table {meta.display} lacks: "
            "apply the upstream DDL to the target (or let the applier replicate DDL, or set [target] schema_evolution = \"evolve\" to add "
            "columns from the stream), then restart")
    return {c: image[c] for c in match_cols}


def group_columns(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """Rows with the same column set go into one statement."""
    out: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(tuple(r), []).append(r)
    return out
