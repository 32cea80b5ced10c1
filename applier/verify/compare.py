"""One table compared chunk by chunk: the upstream's chunk bounds, each chunk's sums on both sides, and the rows
of the chunks whose sums differ, diffed by key.
"""

from __future__ import annotations

from typing import Any, Mapping

from sqlalchemy import text

from applier.verify.checksums import ChunkSum, chunk_sum, mysql_checksum_sql
from applier.verify.chunks import Chunk, key_expr, plan_chunks, range_predicate
from applier.verify.normalise import Key, Row, read_expr, row_canonicaliser
from applier.verify.results import RowDiffs, TableResult, differing_columns
from applier.verify.snapshot import Side
from applier.verify.tables import TablePlan


def _key_exprs(side: Side, plan: TablePlan, upstream: bool) -> list[str]:
    """The expressions the key columns are ordered and compared by on this side (:func:`key_expr`)."""
    return [key_expr(side.flavour, side.q(c.name if upstream else c.target_name), c.kind,
                     c.up_collation if upstream else None) for c in plan.key_columns]


def _table(side: Side, plan: TablePlan, upstream: bool) -> str:
    """The compared table's quoted name on this side."""
    return side.table(*(plan.upstream if upstream else plan.target))


def upstream_bounds(up: Side, plan: TablePlan, chunk_rows: int) -> list[tuple[Any, ...]]:
    """Every ``chunk_rows``-th upstream key in key order (one index walk per chunk, as sync-diff's limit
    iterator does)."""
    exprs = _key_exprs(up, plan, True)
    sel = ", ".join(up.q(c.name) for c in plan.key_columns)
    order = ", ".join(exprs)
    table = _table(up, plan, True)
    bounds: list[tuple[Any, ...]] = []
    offset = int(chunk_rows) - 1
    while True:
        where, params = ("1 = 1", {}) if not bounds else range_predicate(exprs, Chunk(0, bounds[-1], None))
        got = up.rows(f"SELECT {sel} FROM {table} WHERE {where} ORDER BY {order} LIMIT 1 OFFSET {offset}", params)
        if not got:
            return bounds
        bounds.append(got[0])


def _side_columns(side: Side, plan: TablePlan, upstream: bool) -> list[tuple[str, str]]:
    """(quoted name, the side's type) per compared column."""
    return [(side.q(c.name if upstream else c.target_name), c.up_type if upstream else c.down_type)
            for c in plan.columns]


def _where(side: Side, plan: TablePlan, chunk: Chunk, upstream: bool) -> tuple[str, dict[str, Any]]:
    """The chunk's range; on the replica of a history or soft_delete route, only its current rows in it."""
    where, params = range_predicate(_key_exprs(side, plan, upstream), chunk)
    if not upstream and plan.target_filter:
        where = f"({where}) AND {plan.target_filter}"
    return where, params


def server_sum(side: Side, plan: TablePlan, chunk: Chunk, upstream: bool) -> ChunkSum:
    cols = [(q, c.kind, t) for (q, t), c in zip(_side_columns(side, plan, upstream), plan.columns)]
    where, params = _where(side, plan, chunk, upstream)
    table = _table(side, plan, upstream)
    n, s = side.rows(mysql_checksum_sql(table, cols, where, side.flavour), params)[0]
    return ChunkSum(int(n), int(s), server=True)


def read_rows(side: Side, plan: TablePlan, chunk: Chunk, upstream: bool) -> dict[Key, Row]:
    """The range's rows in canonical form, keyed by their canonical key."""
    exprs = ", ".join(read_expr(side.flavour, q, t) for q, t in _side_columns(side, plan, upstream))
    where, params = _where(side, plan, chunk, upstream)
    table = _table(side, plan, upstream)
    canon, n = row_canonicaliser(plan.kinds, plan.collapse_zero_dates), plan.key_len
    out: dict[Key, Row] = {}
    for raw in side.conn.execute(text(f"SELECT {exprs} FROM {table} WHERE {where}"), params):
        row = canon(raw)
        out[row[:n]] = row
    return out


def diff_rows(up: Mapping[Key, Row], down: Mapping[Key, Row]) -> RowDiffs:
    """The differences between two sets of canonical rows keyed alike."""
    d = RowDiffs()
    for k, row in up.items():
        other = down.get(k)
        if other is None:
            d.missing[k] = row
        elif other != row:
            d.different[k] = (row, differing_columns(row, other))
    for k, row in down.items():
        if k not in up:
            d.extra[k] = row
    return d


def compare_table(up: Side, down: Side, plan: TablePlan, result: TableResult, chunk_rows: int) -> None:
    """Chunk the table, compare each chunk's sums, read the rows of the chunks that differ."""
    chunks = plan_chunks(upstream_bounds(up, plan, chunk_rows))
    server = plan.server_checksums(up.flavour, down.flavour)
    result.chunks = len(chunks)
    for chunk in chunks:
        if server:
            a, b = server_sum(up, plan, chunk, True), server_sum(down, plan, chunk, False)
            result.rows_upstream += a.rows
            result.rows_replica += b.rows
            if a == b:
                continue
            ur, dr = read_rows(up, plan, chunk, True), read_rows(down, plan, chunk, False)
        else:
            ur, dr = read_rows(up, plan, chunk, True), read_rows(down, plan, chunk, False)
            result.rows_upstream += len(ur)
            result.rows_replica += len(dr)
            if chunk_sum(ur.values()) == chunk_sum(dr.values()):
                continue
        d = diff_rows(ur, dr)
        if d.count:
            result.chunks_differing += 1
            result.diffs.merge(d)
    result.diffs.reconcile()
