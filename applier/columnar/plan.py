"""The per-key plan of one target table's window on Arrow arrays: exactly what :func:`applier.sinks.plan.plan_batch`
(gated: ``replace=False``) gives for the same row changes, or :class:`NotColumnar`.

The input is one table's released row changes of a window as one ``pyarrow.Table`` in commit order: ``_ts``
(commit ts), ``_op`` (0 insert, 1 update, 2 delete; ``_part`` and ``_off`` may be there, they are not used) and
for each image column ``c`` (``names``, the upstream columns: every row of a window has exactly these)
``b:c`` (before image) and ``a:c`` (after image), nulls where an op has no such image (insert: no before;
delete: no after; update: both).

plan_batch walks the changes one by one; here each change becomes up to three *actions* at a sequence number
``3 * row + sub`` that keeps plan_batch's order:

* ``R`` (sub 0), a removal of a key: a delete's key, or the old key of an update whose key changed (the before
  and after key's group ids differ). It puts the key in the deletes and, unless ``written_at`` says otherwise,
  makes the key's final state "no row";
* ``U`` (sub 1), an update that changed a non-key unique key's value (both images have the unique columns and
  one differs, NULL-safe): its new key goes in the deletes;
* ``W`` (sub 2), an insert's or update's after image: the key's final state is that row.

Keys become dense group ids (one ``dictionary_encode`` per key column over both images, nulls encoded as one
value like Python's ``None``; a compound key's column ids combined and encoded again). Then each rule is a
per-key reduction (``np.minimum.at`` / ``np.maximum.at`` into an array indexed by key id) or a scan:

* deletes = the first R or U of each key, in sequence order (plan_batch's ``must_delete`` dict keeps first
  insertion order, and the first insertion's key object: the key values are taken from that action's image);
* the ``written_at`` rule: an R is ineffective when the last W of its key before it has the R's commit ts. Only
  the keys that have an R are sorted by (key id, sequence); a forward fill of the W positions within each key
  run finds that W;
* upserts = per key, the last W or effective R (``final.pop(k); final[k] = ...`` moves a key to the end), kept
  where that is a W, in sequence order; the row is that change's after image, writable target columns only.

Sequence order costs no sort: the chosen sequence numbers are marked in a boolean array of ``3 * rows`` and read
back with ``flatnonzero``.

Where Arrow's equality is not Python's, the window is refused (or normalized) rather than planned differently:
``-0.0`` and ``0.0`` are one key (floats are grouped after adding ``0.0``); NaN never equals itself in Python
(refused); a string column may hold decimals as text, where ``"1.5"`` equals ``"1.50"`` as Decimals: refused
when two distinct texts of a key or unique column are equal as decimals. Whatever plan_batch raises ApplyError
for is refused too (the caller runs plan_batch on events, which words the error), as is an image that is all
null (an absent image and an image of nulls cannot be told apart here).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from applier.sinks.plan import BatchPlan
from applier.sinks.table import TableMeta

INSERT, UPDATE, DELETE = 0, 1, 2
_R, _U, _W = 0, 1, 2  # action kinds, also their sub-position inside one change

_DECIMAL_RE = r"^-?[0-9]+(\.[0-9]+)?$"


class NotColumnar(Exception):
    """This window needs the per-event path (the message says why)."""


@dataclass
class ArrowPlan:
    """One table's plan: ``deletes`` holds the key columns (named as ``meta.key``), ``upserts`` the after images'
    writable columns (named as the target columns), both in plan_batch's order; ``changes`` the row changes."""

    deletes: pa.Table
    upserts: pa.Table
    changes: int


def plan_arrow(meta: TableMeta, rows: pa.Table, names: tuple[str, ...]) -> ArrowPlan:
    """plan_batch(meta, <rows as RowChange events>) on the arrays (see the module docstring)."""
    names = tuple(names)
    n = rows.num_rows
    key = meta.key
    if not key:
        raise NotColumnar(f"{meta.display} has no key: its changes are applied one by one")
    missing = [c for c in key if c not in names]
    if missing:
        raise NotColumnar(f"key column(s) {missing} of {meta.display} are not in the row images")
    # the columns the target lacks: plan_batch refuses them in an insert's or update's row
    unknown = [c for c in names if c not in meta.writable and c not in meta.columns]
    cols_out = [c for c in names if c in meta.writable]
    if n == 0:
        return ArrowPlan(_empty(rows, key, "b:"), _empty(rows, tuple(cols_out), "a:"), 0)

    ops = _numpy(_column(rows, "_op"), "_op").astype(np.int8, copy=False)
    ts = _numpy(_column(rows, "_ts"), "_ts").astype(np.int64, copy=False)
    if ((ops < INSERT) | (ops > DELETE)).any():
        raise NotColumnar("an _op outside 0..2")
    is_del = ops == DELETE
    is_upd = ops == UPDATE
    has_after = ~is_del
    has_before = ops != INSERT
    if has_after.any():
        if unknown:
            raise NotColumnar(f"column(s) {unknown} that {meta.display} lacks")
        if not cols_out:
            raise NotColumnar(f"no writable column of {meta.display} in the row images")
    _refuse_null_images(rows, names, has_before, has_after)

    both = {c: _both(rows, c) for c in _compared_columns(meta, names)}  # b: then a:, 2n values
    for c, arr in both.items():
        if not any(f(arr.type) for f in _GROUPABLE):
            raise NotColumnar(f"column {c!r} of type {arr.type} is not compared here")
    # dense key ids over both images: [0, n) the before keys, [n, 2n) the after keys
    dense = []
    for c in key:
        ids, size, distinct = _dense(_groupable(both[c]))
        _check_equality(c, distinct)
        dense.append((ids, size))
    for c in both:
        if c not in key:
            _check_equality(c, both[c])
    ids, groups = _group_ids(dense)
    kb, ka = ids[:n], ids[n:]

    # the actions: kind R, U or W at sequence 3 * row + kind
    rows_idx = np.arange(n, dtype=np.int64)
    r_rows = rows_idx[is_del | (is_upd & (kb != ka))]
    u_rows = rows_idx[is_upd & _unique_changed(meta, names, both, n, is_upd)]
    w_rows = rows_idx[has_after]
    r_key, u_key, w_key = kb[r_rows], ka[u_rows], ka[w_rows]
    r_seq, u_seq, w_seq = 3 * r_rows + _R, 3 * u_rows + _U, 3 * w_rows + _W
    span = 3 * n

    # deletes: the first R or U of each key, in sequence order (its key values from its own image)
    first = np.full(groups, span, dtype=np.int64)
    np.minimum.at(first, r_key, r_seq)
    np.minimum.at(first, u_key, u_seq)
    del_seq = _in_order(first[first < span], span)
    del_img = del_seq // 3 + n * (del_seq % 3 == _U)

    # written_at: an R is ineffective when its key's last W before it has the R's commit ts. Only keys with an R
    # need the sort by (key, sequence) that finds that W.
    effective_r = np.ones(len(r_rows), dtype=bool)
    if len(r_rows):
        has_r = np.zeros(groups, dtype=bool)
        has_r[r_key] = True
        w_sub = has_r[w_key]
        a_key = np.concatenate((r_key, w_key[w_sub]))
        a_seq = np.concatenate((r_seq, w_seq[w_sub]))
        order = np.argsort(a_key * span + a_seq)  # (key, sequence): every value distinct
        k_s, seq_s = a_key[order], a_seq[order]
        m = len(order)
        pos = np.arange(m, dtype=np.int64)
        is_w = seq_s % 3 == _W
        run_start = np.ones(m, dtype=bool)
        run_start[1:] = k_s[1:] != k_s[:-1]
        last_w = np.maximum.accumulate(np.where(is_w, pos, -1))
        start_of = np.maximum.accumulate(np.where(run_start, pos, 0))
        prior = ~is_w & (last_w >= start_of)
        blocked = np.zeros(m, dtype=bool)
        blocked[prior] = ts[seq_s[last_w[prior]] // 3] == ts[seq_s[prior] // 3]
        is_r = order < len(r_rows)  # the R actions came first in a_key
        effective_r[order[is_r]] = ~blocked[is_r]

    # upserts: per key, the last W or effective R; kept where it is a W, in sequence order
    last = np.full(groups, -1, dtype=np.int64)
    np.maximum.at(last, w_key, w_seq)
    np.maximum.at(last, r_key[effective_r], r_seq[effective_r])
    last = last[last >= 0]
    up_rows = _in_order(last[last % 3 == _W], span) // 3

    deletes = pa.table([both[c].take(pa.array(del_img)) for c in key], names=list(key))
    upserts = pa.table([_column(rows, "a:" + c).take(pa.array(up_rows)) for c in cols_out], names=cols_out)
    return ArrowPlan(deletes, upserts, n)


def to_batch_plan(meta: TableMeta, plan: ArrowPlan, to_python: Callable[[str, pa.Array], list],
                  upserts: bool = True) -> BatchPlan:
    """The plan as today's writers take it: deletes as key tuples (``meta.key`` order), upserts as dicts in the
    image's column order; ``to_python(column, array)`` gives a column's Python values. ``upserts=False``: the
    deletes only (the writer takes the upserts as Arrow, :meth:`applier.sinks.base.Sink.takes_arrow`)."""
    out = BatchPlan(meta, changes=plan.changes)
    d, u = plan.deletes, plan.upserts
    if d.num_rows:
        out.deletes = list(zip(*(to_python(c, _array(d.column(c))) for c in d.column_names)))
    if u.num_rows and upserts:
        out.upserts = python_rows(u, to_python)
    return out


def python_rows(table: pa.Table, to_python: Callable[[str, pa.Array], list]) -> list[dict[str, Any]]:
    """``table``'s rows as dicts in its column order, ``to_python(column, array)`` giving a column's values."""
    cols = table.column_names
    values = [to_python(c, _array(table.column(c))) for c in cols]
    return list(map(dict, map(zip, repeat(cols), zip(*values))))


# ---- helpers -------------------------------------------------------------------------------------------------

def _numpy(col: pa.ChunkedArray, what: str) -> np.ndarray:
    if col.null_count:
        raise NotColumnar(f"{what} has nulls")
    return col.to_numpy()


def _array(col: pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _empty(rows: pa.Table, cols: tuple[str, ...], prefix: str) -> pa.Table:
    schema = rows.schema
    fields = [pa.field(c, schema.field(prefix + c).type if prefix + c in schema.names else pa.null()) for c in cols]
    return pa.schema(fields).empty_table()


def _column(rows: pa.Table, name: str) -> pa.ChunkedArray:
    try:
        return rows.column(name)
    except KeyError:
        raise NotColumnar(f"no column {name!r} in the window's table") from None


def _both(rows: pa.Table, c: str) -> pa.ChunkedArray:
    """Both images of column ``c`` as one chunked array: the before values, then the after values."""
    b, a = _column(rows, "b:" + c), _column(rows, "a:" + c)
    if b.type != a.type:
        if pa.types.is_null(b.type):
            b = pa.chunked_array([pa.nulls(len(b), a.type)], a.type)
        elif pa.types.is_null(a.type):
            a = pa.chunked_array([pa.nulls(len(a), b.type)], b.type)
        else:
            raise NotColumnar(f"column {c!r} has type {b.type} before and {a.type} after")
    return pa.chunked_array(b.chunks + a.chunks, b.type)


def _compared_columns(meta: TableMeta, names: tuple[str, ...]) -> list[str]:
    """The key columns, then the columns of other unique keys that the images hold (compared per update)."""
    out = list(meta.key)
    for cols in meta.unique_sets:
        if cols != meta.key:
            out.extend(c for c in cols if c in names and c not in out)
    return out


def _refuse_null_images(rows: pa.Table, names: tuple[str, ...], has_before: np.ndarray,
                        has_after: np.ndarray) -> None:
    """An image that is null in every column: either absent (plan_batch refuses it, or skips an update's old key)
    or an image of nulls; the arrays cannot tell which."""
    for prefix, needed in (("b:", has_before), ("a:", has_after)):
        if not needed.any():
            continue
        all_null = needed.copy()
        for c in names:
            col = _column(rows, prefix + c)
            if col.null_count == 0:
                all_null = None
                break
            all_null &= _is_null(col)
            if not all_null.any():
                all_null = None
                break
        if all_null is not None and all_null.any():
            raise NotColumnar(f"a row change whose {'before' if prefix == 'b:' else 'after'} image is all null "
                              "(an absent image cannot be told from an image of nulls)")


def _is_null(col: pa.ChunkedArray) -> np.ndarray:
    return pc.is_null(col).to_numpy(zero_copy_only=False)


_GROUPABLE = (pa.types.is_integer, pa.types.is_floating, pa.types.is_string, pa.types.is_large_string,
              pa.types.is_binary, pa.types.is_large_binary, pa.types.is_timestamp, pa.types.is_date32,
              pa.types.is_null)


def _check_equality(c: str, values: pa.Array | pa.ChunkedArray) -> None:
    """Refuse a key or unique column whose Arrow equality could differ from its Python values' equality
    (``values``: the column's values, or its distinct values)."""
    t = values.type
    if pa.types.is_floating(t):
        if pc.any(pc.is_nan(values)).as_py():
            raise NotColumnar(f"column {c!r} holds NaN, which Python never finds equal to itself")
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        _check_decimal_text(c, pc.unique(values) if isinstance(values, pa.ChunkedArray) else values)


def _check_decimal_text(c: str, arr: pa.Array) -> None:
    """A string column may hold decimals as text (``kinds``), whose Python values (Decimal) are equal when the
    numbers are: "1.5" == "1.50", "-0" == "0", "01" == "1". Text equality is exact only when no two distinct
    texts of the column are equal as numbers; otherwise the window is refused. ``arr``: the distinct values."""
    dec = pc.match_substring_regex(arr, _DECIMAL_RE)
    if not pc.any(dec).as_py():
        return
    texts = arr.filter(dec)  # distinct already
    # canonical text: no trailing fraction zeros, no leading zeros, no negative zero
    canon = pc.replace_substring_regex(texts, r"^(-?[0-9]+\.[0-9]*?)0+$", r"\1")
    canon = pc.replace_substring_regex(canon, r"^(-?[0-9]+)\.$", r"\1")
    canon = pc.replace_substring_regex(canon, r"^(-?)0+([0-9])", r"\1\2")
    canon = pc.replace_substring_regex(canon, r"^-0$", "0")
    if len(pc.unique(canon)) != len(texts):
        raise NotColumnar(f"column {c!r} holds distinct texts of one decimal value (e.g. '1.5' and '1.50')")


def _groupable(arr: pa.ChunkedArray) -> pa.ChunkedArray:
    """Values whose Arrow hash equality is Python's: -0.0 becomes 0.0 (NaN is refused before)."""
    if pa.types.is_floating(arr.type):
        return pc.add(arr, pa.scalar(0.0, arr.type))
    return arr


def _dense(arr: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, int, pa.Array]:
    """Per value, the id of its distinct value (nulls are one value, as None is), how many ids there are (some
    may be unused), and the distinct values (empty for integers: nothing to check in them)."""
    if pa.types.is_null(arr.type):
        return np.zeros(len(arr), dtype=np.int64), 1, pa.nulls(1)
    if pa.types.is_integer(arr.type) and len(arr):
        bounds = pc.min_max(arr)
        lo, hi = bounds["min"].as_py(), bounds["max"].as_py()
        if lo is not None and hi - lo < 2 * len(arr):  # a dense range: the value's offset is its id, no hashing
            span = hi - lo + 1
            offsets = pc.subtract(arr, pa.scalar(lo, arr.type)).cast(pa.int64())
            if arr.null_count:  # NULL: one more id
                return pc.fill_null(offsets, span).to_numpy(), span + 1, pa.array([], arr.type)
            return offsets.to_numpy(), span, pa.array([], arr.type)
    enc = pc.dictionary_encode(arr, null_encoding="encode")
    if isinstance(enc, pa.ChunkedArray):
        chunks = enc.chunks
        if not chunks:
            return np.zeros(0, dtype=np.int64), 0, pa.array([], arr.type)
        distinct = chunks[-1].dictionary  # every chunk's dictionary is a prefix of the last one's
        ids = np.concatenate([ch.indices.to_numpy(zero_copy_only=False) for ch in chunks])
    else:
        distinct = enc.dictionary
        ids = enc.indices.to_numpy(zero_copy_only=False)
    return ids.astype(np.int64, copy=False), len(distinct), distinct


def _group_ids(columns: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, int]:
    """Dense ids of the value tuples of a compound key, from its columns' ids (equal exactly where the tuples are),
    and how many there are."""
    ids, size = columns[0]
    for more, msize in columns[1:]:
        ids, size, _ = _dense(pa.array(ids * msize + more))
    return ids, size


def _in_order(seqs: np.ndarray, span: int) -> np.ndarray:
    """Distinct sequence numbers below ``span``, sorted (a mark per number: no sort)."""
    marks = np.zeros(span, dtype=bool)
    marks[seqs] = True
    return np.flatnonzero(marks)


def _unique_changed(meta: TableMeta, names: tuple[str, ...], both: dict[str, pa.ChunkedArray], n: int,
                    is_upd: np.ndarray) -> np.ndarray:
    """Per row, whether a non-key unique key's value differs between the images (NULL-safe, as Python's !=)."""
    out = np.zeros(n, dtype=bool)
    if not is_upd.any():
        return out
    for cols in meta.unique_sets:
        if cols == meta.key:
            continue
        for c in cols:
            if c not in names:
                continue
            arr = both[c]
            if pa.types.is_null(arr.type):  # NULL in both images of every row: never different
                continue
            b, a = arr.slice(0, n), arr.slice(n)
            differ = pc.fill_null(pc.not_equal(b, a), pc.xor(pc.is_null(b), pc.is_null(a)))
            out |= differ.to_numpy(zero_copy_only=False)
    return out
