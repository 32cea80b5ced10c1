"""Route modes: what a ``[[route]]`` rule's ``mode`` makes of a table's changes. Pure: no SQL, no database.

A route writes its tables in one of three modes (``applier.config``, key ``mode``; ``applier.routing``
``Router.write_mode``):

* ``replica`` (the default): the target holds the upstream table as it is now (``applier.sinks.plan``).
* ``history`` (a type-2 slowly changing dimension): the target keeps *every version* of every row. A version is
  identified by the upstream key plus ``_commit_ts`` (the target's primary key); ``_op`` says what made it
  (``insert``, ``update``, ``delete``: a delete is a version too, holding the old row), ``_valid_from`` is the
  physical time of its commit ts and ``_valid_to`` the ``_valid_from`` of the key's next version (NULL for the
  key's newest one). The current upstream table is ``WHERE _valid_to IS NULL AND _op <> 'delete'``.
* ``soft_delete``: like a replica, but a deleted row stays, with ``_deleted = true`` and ``_deleted_at`` = the
  physical time of the delete's commit ts; every write of a row sets ``_deleted = false, _deleted_at = NULL``.
  The current upstream table is ``WHERE NOT _deleted``.

What this module gives the rest of the applier:

* :func:`mode_columns` and :func:`mode_key`: the columns a mode adds and the target key it needs. **Stable API**
  (``[target] schema_evolution`` creates tables for moded routes with them): ``mode_columns(mode)`` is a tuple of
  :class:`ModeColumn` ``(name, MySQL column type text, nullable)`` (plus ``.pg_type`` and ``.default``);
  ``mode_key(mode, upstream_key)`` is the target's primary key for the upstream key.
* :func:`commit_time`: a TiDB TSO's physical time as a naive UTC datetime (what ``_valid_from`` and
  ``_deleted_at`` hold; the TSO's logical counter is below a millisecond and is dropped).
* :func:`conform`: what a table must gain (columns, primary key) or lose (unique keys) to be written in a mode,
  from its catalog shape (:class:`TableShape`); the dialect renders it (``Dialect.mode_statements``), after a
  replicated CREATE TABLE and in the error that stops a run on a table that is not ready.
* :func:`plan_history` and :func:`plan_soft_delete`: a table's ordered changes as the writes of each mode.

Why non-key unique keys go (:func:`conform`): versions of one row repeat its unique values, and a soft-deleted
row keeps holding values upstream has freed, so a unique key other than the mode's key would refuse rows upstream
accepted. They become plain indexes of the same name and columns (queries keep their index; a later upstream
DROP INDEX still finds it).
"""

from __future__ import annotations

import datetime as dt
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

from applier.events import Op, RowChange
from applier.report import tso_physical_ms
from applier.routing import WRITE_MODES
from applier.sinks.plan import plan_batch
from applier.sinks.table import ApplyError, TableMeta, shown

REPLICA = "replica"
HISTORY = "history"
SOFT_DELETE = "soft_delete"
#: every mode, the default first (the names the configuration accepts)
MODES = WRITE_MODES
assert MODES == (REPLICA, HISTORY, SOFT_DELETE)

COMMIT_TS = "_commit_ts"
OP = "_op"
VALID_FROM = "_valid_from"
VALID_TO = "_valid_to"
DELETED = "_deleted"
DELETED_AT = "_deleted_at"

#: ``_op`` values
OP_INSERT, OP_UPDATE, OP_DELETE = "insert", "update", "delete"


class ModeColumn(NamedTuple):
    """A column a mode adds: ``(name, MySQL column type text, nullable)``. ``pg_type`` is its PostgreSQL type
    (the PostgreSQL DDL translator's type map, ``applier/ddl/pg_types.py``, except ``BOOLEAN``, which is
    PostgreSQL's ``boolean`` so that ``NOT _deleted`` reads the same on both targets) and ``default`` its DEFAULT
    expression (a SQL keyword, the same in both dialects) or None."""

    name: str
    type: str
    nullable: bool

    @property
    def pg_type(self) -> str:
        return _PG_TYPES[self.type]

    @property
    def default(self) -> str | None:
        return _DEFAULTS.get(self.name)


_COLUMNS: dict[str, tuple[ModeColumn, ...]] = {
    REPLICA: (),
    HISTORY: (
        ModeColumn(COMMIT_TS, "BIGINT UNSIGNED", False),
        ModeColumn(OP, "VARCHAR(6)", False),
        ModeColumn(VALID_FROM, "DATETIME(6)", False),
        ModeColumn(VALID_TO, "DATETIME(6)", True),
    ),
    SOFT_DELETE: (
        ModeColumn(DELETED, "BOOLEAN", False),
        ModeColumn(DELETED_AT, "DATETIME(6)", True),
    ),
}
_PG_TYPES = {"BIGINT UNSIGNED": "numeric(20,0)", "VARCHAR(6)": "varchar(6)",
             "DATETIME(6)": "timestamp(6) without time zone", "BOOLEAN": "boolean"}
# _deleted: so that adding the column to a table that already holds rows works (they are not deleted)
_DEFAULTS = {DELETED: "false"}
_ALL_MODE_COLUMNS = frozenset(c.name for cols in _COLUMNS.values() for c in cols)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown route mode {mode!r}: one of {', '.join(MODES)}")
    return mode


def mode_columns(mode: str) -> tuple[ModeColumn, ...]:
    """The columns ``mode`` adds to a target table, in the order they are added (none for ``replica``)."""
    return _COLUMNS[check_mode(mode)]


def mode_key(mode: str, upstream_key: Sequence[str]) -> tuple[str, ...]:
    """The target table's primary key in ``mode`` for a table whose upstream key is ``upstream_key``: the upstream
    key plus ``_commit_ts`` in history mode (one row per version), the upstream key otherwise."""
    key = tuple(upstream_key)
    return key + (COMMIT_TS,) if check_mode(mode) == HISTORY else key


def is_mode_column(name: str) -> bool:
    """Whether ``name`` is a column some mode adds (an upstream column of that name would collide with it)."""
    return name in _ALL_MODE_COLUMNS


_EPOCH = dt.datetime(1970, 1, 1)


def commit_time(ts: int) -> dt.datetime:
    """The physical time of TiDB TSO ``ts`` as a naive UTC datetime, exact to the millisecond (integer
    arithmetic: no float rounding)."""
    return _EPOCH + dt.timedelta(milliseconds=tso_physical_ms(ts))


# ---- table shape and what a mode needs of it -------------------------------------------------------------------

class ModeError(ValueError):
    """A table that cannot be written in a mode at all (no key); the message says what to do."""


@dataclass(frozen=True)
class UniqueIndex:
    """A unique key other than the primary key, as the catalog names it. ``constraint``: PostgreSQL's UNIQUE
    constraint (dropped with ALTER TABLE ... DROP CONSTRAINT) rather than a unique index. ``prefixes``: MySQL's
    key-part prefix lengths (None: the whole column), one per column, or empty. A column None is an expression."""

    name: str
    columns: tuple[str | None, ...]
    constraint: bool = False
    prefixes: tuple[int | None, ...] = ()


@dataclass(frozen=True)
class TableShape:
    """What the catalog says of a target table: columns, the NOT NULL ones, the primary key (and its constraint
    name, PostgreSQL) and the other unique keys."""

    schema: str
    name: str
    columns: tuple[str, ...]
    not_null: frozenset[str]
    primary_key: tuple[str, ...] = ()
    primary_name: str | None = None
    uniques: tuple[UniqueIndex, ...] = ()


@dataclass(frozen=True)
class Conform:
    """What a table lacks to be written in ``mode``: columns to add, the primary key to set (history; replacing
    the current one when there is one), unique keys to turn into plain indexes. False when nothing."""

    mode: str
    upstream_key: tuple[str, ...]
    add: tuple[ModeColumn, ...] = ()
    primary_key: tuple[str, ...] | None = None
    demote: tuple[UniqueIndex, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.primary_key or self.demote)

    def describe(self) -> str:
        """What is missing, in words: for the error that stops a run on such a table."""
        parts = []
        if self.add:
            parts.append("column(s) " + ", ".join(c.name for c in self.add))
        if self.primary_key:
            parts.append(f"primary key ({', '.join(self.primary_key)})")
        if self.demote:
            parts.append("no unique key besides the mode's key (found: "
                         + ", ".join(f"{u.name} ({', '.join(str(c) for c in u.columns)})" for u in self.demote) + ")")
        return "; ".join(parts)


def upstream_key_of(mode: str, shape: TableShape) -> tuple[str, ...]:
    """The upstream key a table's shape implies: its primary key (without ``_commit_ts`` in history mode), else its
    first unique key over NOT NULL columns (as the writers choose a key), else ()."""
    pk = shape.primary_key
    if mode == HISTORY and COMMIT_TS in pk:
        pk = tuple(c for c in pk if c != COMMIT_TS)
    if pk:
        return pk
    for u in shape.uniques:
        cols = u.columns
        if cols and all(c is not None and c in shape.not_null and not is_mode_column(c) for c in cols):
            return tuple(c for c in cols if c is not None)
    return ()


def conform(mode: str, shape: TableShape, upstream_key: Sequence[str] | None = None) -> Conform:
    """What ``shape`` must gain or lose to be written in ``mode`` (see the module docstring). ``upstream_key`` is
    the key the stream says the upstream table has, where it says one; else it is read from the shape
    (:func:`upstream_key_of`). Raises ModeError for a table without a key."""
    check_mode(mode)
    key = tuple(upstream_key) if upstream_key else upstream_key_of(mode, shape)
    if mode == REPLICA:
        return Conform(mode, key)
    where = f"target table {_display(shape)}"
    if not key:
        raise ModeError(
            f"{where} has no primary key and no unique key over NOT NULL columns, so it cannot be written in route "
            f"mode {mode} (a {'version' if mode == HISTORY else 'row'} is found by its key): give the table a primary "
            "key (upstream and target), or route it with mode = \"replica\"")
    collide = [c for c in key if is_mode_column(c)]
    if collide:
        raise ModeError(f"{where}: the key column(s) {', '.join(collide)} collide with the columns route mode {mode} "
                        "adds: route the table with mode = \"replica\"")
    have = set(shape.columns)
    add = tuple(c for c in mode_columns(mode) if c.name not in have)
    pk = None
    keep: tuple[str, ...] = ()
    if mode == HISTORY:
        want = mode_key(mode, key)
        if shape.primary_key != want:
            pk = want
    elif not shape.primary_key:
        keep = key  # soft delete without a primary key: its unique NOT NULL key is the row's identity
    demote = tuple(u for u in shape.uniques if tuple(u.columns) != keep)
    return Conform(mode, key, add, pk, demote)


def _display(shape: TableShape) -> str:
    return shown(shape.schema, shape.name)


# ---- planning: history -----------------------------------------------------------------------------------------

@dataclass
class HistoryPlan:
    """One table's share of a window in history mode.

    ``versions``: rows to insert (writable columns of the image, plus the four mode columns), each identified by
    key + ``_commit_ts``; a version already in the target is left as it is (a replay).
    ``closes``: ``(key, commit_ts, prev_commit_ts, valid_from)`` per version, in order: an open version of that key
    already in the target (``_valid_to IS NULL``) with ``prev_commit_ts <= _commit_ts < commit_ts`` gets
    ``_valid_to = valid_from`` (the intervals of one key are disjoint, so at most one applies). Normally that is
    the key's newest version before the window, closed by the window's first version (``prev_commit_ts`` 0); the
    later intervals matter when a replay straddles what the target already holds: the target's newest version is
    then one of the window's (or between two of them), and the next version of the window closes it."""

    key: tuple[str, ...]
    versions: list[dict[str, Any]] = field(default_factory=list)
    closes: list[tuple[tuple[Any, ...], int, int, dt.datetime]] = field(default_factory=list)
    changes: int = 0


_DEL, _INS, _UPD = 0, 1, 2  # a change's parts at one commit ts: removal of a key, new key, same key rewritten


def plan_history(meta: TableMeta, key: Sequence[str], changes: Sequence[RowChange]) -> HistoryPlan:
    """Every change as a version (see the module docstring): insert and update -> the new row, delete -> the old
    row with ``_op = 'delete'``; a key-changing update -> a delete version of the old key and an insert version of
    the new one.

    Within one commit ts a key has one version: TiKV keeps one change per key per commit ts, and what looks like
    more is one logical change split up (TiCDC sends a key-changing update as delete + insert, and two updates
    swapping keys touch each key twice). So the parts of one commit ts are taken removals first (invariant 5),
    and a key's parts fold into one version: the last part's row, ``_op`` 'delete' if the key ends removed,
    'insert' if it did not exist before (first part an insert), else 'update'. Nothing is lost whatever order
    the protocol sent the parts of a swap in."""
    key = tuple(key)
    key_of = _key_getter(key)
    plan = HistoryPlan(key, changes=len(changes))
    per_key: dict[tuple[Any, ...], list[tuple[int, dict[str, Any]]]] = {}  # key -> [(ts, version row)]
    image = _ImageFilter(meta)
    ordered = sorted(changes, key=_COMMIT_TS_OF)  # stable: already in commit order from the gate
    i, n = 0, len(ordered)
    while i < n:
        ts = ordered[i].commit_ts
        j = i
        while j < n and ordered[j].commit_ts == ts:
            j += 1
        parts: list[tuple[int, tuple[Any, ...], dict[str, Any], RowChange]] = []
        for ch in ordered[i:j]:
            parts.extend(_parts(meta, ch, key, key_of))
        parts.sort(key=_PART_ORDER)  # removals first; stable within each kind
        folded: dict[tuple[Any, ...], list[Any]] = {}  # key -> [first kind, last kind, last image, change]
        for kind, k, img, ch in parts:
            f = folded.get(k)
            if f is None:
                folded[k] = [kind, kind, img, ch]
            else:
                f[1], f[2], f[3] = kind, img, ch
        when = commit_time(ts)
        for k, (first, last, img, ch) in folded.items():
            op = OP_DELETE if last == _DEL else OP_INSERT if first == _INS else OP_UPDATE
            row = image(ch, img)
            row[COMMIT_TS] = ts
            row[OP] = op
            row[VALID_FROM] = when
            row[VALID_TO] = None
            per_key.setdefault(k, []).append((ts, row))
        i = j
    for k, versions in per_key.items():
        prev = 0
        for idx, (ts, row) in enumerate(versions):
            if idx + 1 < len(versions):
                row[VALID_TO] = versions[idx + 1][1][VALID_FROM]
            plan.closes.append((k, ts, prev, row[VALID_FROM]))
            plan.versions.append(row)
            prev = ts
    return plan


def prev_commit_ts_column(key: Sequence[str]) -> str:
    """The writers' staging column for a close's previous commit ts (:attr:`HistoryPlan.closes`): a name none of
    the key columns has."""
    name = "_prev_commit_ts"
    while name in key:
        name += "_"
    return name


def adapted_keys(adapt_rows: Callable[[TableMeta, tuple[str, ...], list[dict[str, Any]]], list[dict[str, Any]]],
                 meta: TableMeta, key: Sequence[str], keys: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Key tuples of the upstream ``key`` columns with their values converted by ``adapt_rows`` (the writer's
    ``Sink.adapt_rows``), as the same values are in rows: a history table's own key has ``_commit_ts`` too, so the
    writer's ``adapt_keys`` (for the target key) does not fit."""
    key = tuple(key)
    rows = adapt_rows(meta, key, [dict(zip(key, k)) for k in keys])
    return [tuple(r[c] for c in key) for r in rows]


_COMMIT_TS_OF = operator.attrgetter("commit_ts")
_PART_ORDER = operator.itemgetter(0)


def _parts(meta: TableMeta, ch: RowChange, key: tuple[str, ...], key_of: Callable[[Any], tuple[Any, ...]]
           ) -> list[tuple[int, tuple[Any, ...], dict[str, Any], RowChange]]:
    """A change as (kind, key, image) parts: a delete removes its old key; an insert adds its new key; an update
    rewrites its key, or removes the old key and adds the new one when the key changed."""
    op = ch.op
    if op is Op.DELETE:
        return [(_DEL, _image_key(meta, ch, ch.before, key, key_of), ch.before or {}, ch)]
    new = _image_key(meta, ch, ch.after, key, key_of)
    after = ch.after or {}
    if op is Op.INSERT:
        return [(_INS, new, after, ch)]
    before = ch.before
    if before and all(c in before for c in key):
        old = key_of(before)
        if old != new:
            return [(_DEL, old, before, ch), (_INS, new, after, ch)]
    return [(_UPD, new, after, ch)]


def _image_key(meta: TableMeta, ch: RowChange, image: dict[str, Any] | None, key: tuple[str, ...],
               key_of: Callable[[Any], tuple[Any, ...]]) -> tuple[Any, ...]:
    if not image:
        raise ApplyError(f"{ch.op.value} on {meta.display} at {ch.position} carries no row image")
    try:
        return key_of(image)
    except KeyError as exc:
        raise ApplyError(
            f"{ch.op.value} on {meta.display} at {ch.position} lacks key column {exc.args[0]!r} of the upstream key "
            f"({', '.join(key)}) the target's key is made of: make the target key match upstream") from None


def _key_getter(cols: tuple[str, ...]) -> Callable[[Any], tuple[Any, ...]]:
    if len(cols) == 1:
        c = cols[0]
        return lambda image: (image[c],)
    getter = operator.itemgetter(*cols)
    return lambda image: tuple(getter(image))


class _ImageFilter:
    """A row image as a new dict of the target's writable columns (columns generated on the target are left out),
    decided once per column-name tuple; an image column the target lacks stops the run, as in replica mode, and
    one named like a mode column is refused (it would be overwritten)."""

    def __init__(self, meta: TableMeta) -> None:
        self.meta = meta
        self._ok: dict[tuple[str, ...], bool] = {}

    def __call__(self, ch: RowChange, image: dict[str, Any]) -> dict[str, Any]:
        names = tuple(image)
        ok = self._ok.get(names)
        if ok is None:
            ok = self._ok[names] = self._check(ch, names)
        if ok:
            return dict(image)
        return {c: v for c, v in image.items() if c in self.meta.writable}

    def _check(self, ch: RowChange, names: tuple[str, ...]) -> bool:
        meta = self.meta
        clash = [c for c in names if is_mode_column(c)]
        if clash:
            raise ApplyError(
                f"{ch.op.value} on upstream table {ch.schema}.{ch.table} at {ch.position} has column(s) "
                f"{', '.join(map(repr, clash))}, which the route's mode writes itself: route the table with "
                "mode = \"replica\" (or rename the upstream column)")
        unknown = [c for c in names if c not in meta.writable and c not in meta.columns]
        if unknown:
            raise ApplyError(
                f"{ch.op.value} on upstream table {ch.schema}.{ch.table} at {ch.position} has column(s) "
                f"{', '.join(repr(c) for c in unknown)} that target table {meta.display} lacks: apply the upstream "
                "DDL to the target (or let the applier replicate DDL), then restart")
        return meta.writable.issuperset(names)


# ---- planning: soft delete -------------------------------------------------------------------------------------

@dataclass
class SoftDeletePlan:
    """One table's share of a window in soft-delete mode.

    ``hard_deletes``: keys removed and written again in the window (a key change moved back, a delete then a
    re-insert, a unique-key swap): their row ends present, so it is deleted and re-inserted as in replica mode
    (invariant 5: deletes first); nothing of the soft-delete state is lost, since a present row has
    ``_deleted = false`` anyway.
    ``upserts``: the final rows: present ones with ``_deleted = false, _deleted_at = NULL``; and the rows the window
    wrote (inserted or updated) that end deleted, with their last values, ``_deleted = true`` and ``_deleted_at`` =
    the physical time of their last removal. Those are written whole because the target may not hold them yet: a
    row inserted and deleted in one window is kept as deleted, as it is when the two fall in two windows.
    ``soft_deletes``: the other keys that end deleted (their row is in the target from an earlier window; the
    removal may carry only the key, so the row is not rewritten): ``(key, deleted at)``."""

    hard_deletes: list[tuple[Any, ...]] = field(default_factory=list)
    upserts: list[dict[str, Any]] = field(default_factory=list)
    soft_deletes: list[tuple[tuple[Any, ...], dt.datetime]] = field(default_factory=list)
    changes: int = 0


def plan_soft_delete(meta: TableMeta, changes: Sequence[RowChange]) -> SoftDeletePlan:
    """Replica mode's collapsing (:func:`applier.sinks.plan.plan_batch`: per key the last version, deletes first),
    with the keys that end deleted kept as deleted rows (see :class:`SoftDeletePlan`)."""
    if not meta.key:
        raise ApplyError(f"target table {meta.display} has no key: route mode soft_delete needs one")
    key_of = _key_getter(tuple(meta.key))
    changes = removals_first(changes, tuple(meta.key), key_of)
    batch = plan_batch(meta, changes)
    present = {key_of(row) for row in batch.upserts}
    gone = [k for k in batch.deletes if k not in present]
    plan = SoftDeletePlan(hard_deletes=[k for k in batch.deletes if k in present], changes=len(changes))
    for row in batch.upserts:
        row[DELETED] = False
        row[DELETED_AT] = None
    plan.upserts = batch.upserts
    if gone:
        last = _last_rows(meta, changes, key_of, set(gone))
        for k in gone:
            row, ts, written = last[k]
            if written:
                row[DELETED] = True
                row[DELETED_AT] = commit_time(ts)
                plan.upserts.append(row)
            else:
                plan.soft_deletes.append((k, commit_time(ts)))
    return plan


def removals_first(changes: Sequence[RowChange], key: tuple[str, ...],
                   key_of: Callable[[Any], tuple[Any, ...]] | None = None) -> list[RowChange]:
    """The changes with, within each commit ts, every removal of a key before every write of one: a key-changing
    update becomes a delete of the old key and an insert of the new one. What one commit ts holds is one state
    change per key (TiKV), so its order is free, but collapsing it in arrival order is not: two updates swapping
    their keys (4 -> 5, then 5 -> 4) would end with key 5 removed. Commit-ts order is kept (the gate's)."""
    key_of = key_of or _key_getter(key)
    out: list[RowChange] = []
    i, n = 0, len(changes)
    while i < n:
        ts = changes[i].commit_ts
        j = i
        while j < n and changes[j].commit_ts == ts:
            j += 1
        if j - i == 1:
            out.append(changes[i])
            i = j
            continue
        removals: list[RowChange] = []
        writes: list[RowChange] = []
        for ch in changes[i:j]:
            op = ch.op
            if op is Op.DELETE:
                removals.append(ch)
            elif (op is Op.UPDATE and ch.before and ch.after and all(c in ch.before for c in key)
                  and all(c in ch.after for c in key) and key_of(ch.before) != key_of(ch.after)):
                removals.append(RowChange(ch.schema, ch.table, ts, Op.DELETE, ch.before, None, ch.columns, ch.position))
                writes.append(RowChange(ch.schema, ch.table, ts, Op.INSERT, None, ch.after, ch.columns, ch.position))
            else:
                writes.append(ch)
        out += removals
        out += writes
        i = j
    return out


def _last_rows(meta: TableMeta, changes: Sequence[RowChange], key_of: Callable[[Any], tuple[Any, ...]],
               keys: set[tuple[Any, ...]]) -> dict[tuple[Any, ...], tuple[dict[str, Any], int, bool]]:
    """For keys that end deleted: the row's last values the window knows (its last new row, overlaid with the old
    row its removal carries), the commit ts of that removal, and whether the window wrote the row (an insert or
    update of the key: then the values are a whole row, as a replica upsert writes it)."""
    image = _ImageFilter(meta)
    out: dict[tuple[Any, ...], tuple[dict[str, Any], int, bool]] = {}
    for ch in changes:
        if ch.op is not Op.DELETE and ch.after:
            k = key_of(ch.after)
            if k in keys:
                out[k] = (image(ch, ch.after), 0, True)
        if ch.op is Op.INSERT or not ch.before or not all(c in ch.before for c in meta.key):
            continue
        old = key_of(ch.before)
        if old in keys and (ch.op is Op.DELETE or (ch.after and key_of(ch.after) != old)):
            row, _, written = out.get(old, ({}, 0, False))
            row = dict(row)
            row.update(image(ch, ch.before))
            out[old] = (row, ch.commit_ts, written)
    return out
