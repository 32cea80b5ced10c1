"""The apply stage of the columnar lane: one window's row batches, planned per table on Arrow arrays and written.

:class:`applier.apply.Applier` hands a release here when it holds row batches (:attr:`Release.batches`). A window
goes the columnar way only where that gives exactly what the per-event path gives:

* the release holds nothing but batches (no DDL, no row events of slices the lane did not take): otherwise the
  whole window becomes events (:func:`window_events`: the batches' rows turned back into events, merged into the
  release's commit order, copies dropped by the event gate's own identity) and goes the per-event way;
* ``[target] schema_evolution`` is off, or every column tuple of the window was already checked against the target;
* per table: routed, a target key (keyless tables plan change by change), ``on_apply_error = "stop"``, the replica
  mode, nothing of it quarantined, one topic, one set of column names and Arrow types, and a plan
  :func:`applier.columnar.plan.plan_arrow` takes; otherwise that table's rows become events for the per-event
  writer (tables are independent inside a window without DDL).

The columnar plan is handed to today's writers as Python rows (:func:`applier.columnar.plan.to_batch_plan`): the
rows left after the per-key collapse, not every change. A write the target refuses is worded as on the per-event
path (the refused-row search runs on the table's events).
"""

from __future__ import annotations

from operator import attrgetter
from typing import Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from applier.columnar import values as V
from applier.columnar.held import drop_copies
from applier.columnar.rows import RowBatch, concat_batches
from applier.events import DDL, Event, Op, RowChange

_COMMIT_ORDER = attrgetter("commit_ts", "position.topic", "position.partition", "position.offset")


def by_table(batches: Iterable[RowBatch]) -> dict[tuple[str, str], list[RowBatch]]:
    out: dict[tuple[str, str], list[RowBatch]] = {}
    for b in batches:
        out.setdefault((b.shape.schema, b.shape.table), []).append(b)
    return out


def segments(ddls: list[DDL], batches: list[RowBatch]) -> list[tuple[DDL | None, list[RowBatch]]]:
    """The batches' rows cut at the DDLs of a release (in commit order): per DDL the rows committed before it (and
    after the DDL before it), then (None, the rows after the last one)."""
    out: list[tuple[DDL | None, list[RowBatch]]] = []
    rest = batches
    for ddl in ddls:
        before, after = [], []
        for b in rest:
            ts = b.data.column("_ts")
            mask = pc.less(ts, ddl.commit_ts)
            n = pc.sum(mask).as_py() or 0
            if n == len(b):
                before.append(b)
            elif n == 0:
                after.append(b)
            else:
                before.append(RowBatch(b.shape, b.data.filter(mask)))
                after.append(RowBatch(b.shape, b.data.filter(pc.invert(mask))))
        out.append((ddl, before))
        rest = after
    out.append((None, rest))
    return out


def cut_at_ddls(events: list, batches: list[RowBatch]) -> Iterator[tuple[DDL | None, list, list[RowBatch]]]:
    """A release (its events in commit order and its batches) cut at its DDLs: per DDL the events and batch rows
    committed before it (and after the DDL before it), then (None, the events and rows after the last one)."""
    rows = iter(events)
    pending = next(rows, None)
    for ddl, seg in segments([e for e in events if type(e) is DDL], batches):
        seg_events = []
        while pending is not None and pending is not ddl:
            seg_events.append(pending)
            pending = next(rows, None)
        pending = next(rows, None) if pending is ddl else pending
        yield ddl, seg_events, seg


def window_events(events: list[Event], batches: list[RowBatch], identity: Any) -> tuple[list[Event], int]:
    """The release's events and its batches' rows as one list in commit order, the batches' copies of a change
    dropped (the same commit ts and ``identity(ev)``, the event gate's row identity, for changes of keyed tables,
    which are the only ones held as batches); and how many were dropped."""
    # the event gate compares identities within one commit ts (the same change at another ts is another change)
    seen = {(e.commit_ts, identity(e)) for e in events if type(e) is RowChange}
    extra: list[RowChange] = []
    dropped = 0
    for b in batches:
        for ev in b.to_events():
            h = (ev.commit_ts, identity(ev))
            if h in seen:
                dropped += 1
                continue
            seen.add(h)
            extra.append(ev)
    if not extra:
        return events, dropped
    merged = events + extra  # stable: one message's events stay in their order
    merged.sort(key=_COMMIT_ORDER)
    return merged, dropped


def unify(batches: list[RowBatch]) -> tuple[pa.Table, tuple[str, ...], tuple[str, ...]] | None:
    """One table's batches as one Arrow table in commit order (``_ts``, ``_part``, ``_off``, ``_op``, then ``b:`` and
    ``a:`` of every column), with the column names and kinds; None when the batches do not share one topic, one
    list of names and kinds and one Arrow type per column."""
    first = batches[0].shape
    if any((b.shape.topic, b.shape.names, b.shape.kinds) != (first.topic, first.names, first.kinds) for b in batches):
        return None
    try:
        whole = concat_batches(batches).data
    except (ValueError, pa.ArrowInvalid):
        return None
    cols = ["_ts", "_part", "_off", "_op", *(f"b:{n}" for n in first.names), *(f"a:{n}" for n in first.names)]
    table = pa.Table.from_batches([whole]).select(cols)
    order = pc.sort_indices(table, sort_keys=[("_ts", "ascending"), ("_part", "ascending"), ("_off", "ascending")])
    return table.take(order), first.names, first.kinds


def identity_columns(names: tuple[str, ...]) -> list[str]:
    """What a copy of a change repeats exactly: its commit ts, op and both images (never its position)."""
    return ["_ts", "_op", *(f"b:{n}" for n in names), *(f"a:{n}" for n in names)]


def probe_columns(shape: Any) -> list[str]:
    """The columns :func:`~applier.columnar.held.drop_copies` groups first: commit ts, op and the upstream key's
    columns in both images (within one commit ts TiKV keeps one change per key, so only copies repeat them)."""
    keys = [c.name for c in shape.variants[0] if c.key] if shape.variants else []
    return ["_ts", "_op", *(f"b:{k}" for k in keys), *(f"a:{k}" for k in keys)]


def python_values(kinds: dict[str, str]) -> Any:
    """``to_python(column, array)`` for :func:`applier.columnar.plan.to_batch_plan`: a column's Python values as the
    codec's converter gives them."""

    def to_python(column: str, arr: Any) -> list:
        return V.to_python(kinds.get(column, V.STR), None, arr)

    return to_python


__all__ = ["by_table", "window_events", "unify", "identity_columns", "python_values", "DDL"]
