"""Key ranges: where each table is cut into chunks, and the WHERE condition that selects one chunk.

Why a module of its own: the ranges must hold the same keys on both servers whatever their collations, and
every key must fall in exactly one range (a replica row below or above every upstream key included). Pure: SQL
text from quoted names, no connection.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

DEFAULT_CHUNK_ROWS = 10_000


@dataclass(frozen=True)
class Chunk:
    """Keys above ``lower`` (exclusive) up to ``upper`` (inclusive); None is unbounded. Bounds are the upstream
    key values as its driver returns them, so they bind unchanged on both sides."""

    index: int
    lower: tuple[Any, ...] | None
    upper: tuple[Any, ...] | None


def plan_chunks(bounds: Sequence[tuple[Any, ...]]) -> list[Chunk]:
    """Ranges from the ordered boundary keys (every ``chunk_rows``-th upstream key): the first range is open
    below and the last open above, so a replica row below or above every upstream key is still compared."""
    out: list[Chunk] = []
    lower: tuple[Any, ...] | None = None
    for b in bounds:
        out.append(Chunk(len(out), lower, tuple(b)))
        lower = tuple(b)
    out.append(Chunk(len(out), lower, None))
    return out


def _tuple_compare(exprs: Sequence[str], values: Sequence[Any], op: str, prefix: str,
                   params: dict[str, Any]) -> str:
    """``(e1, e2) op (v1, v2)`` lexicographically, spelled out (``e1 > v1 OR (e1 = v1 AND e2 > v2)``): every
    server understands it and can use the key's index for the first column."""
    if len(exprs) != len(values):
        raise ValueError(f"{len(exprs)} key expressions for {len(values)} bound values")
    strict = ">" if op in (">", ">=") else "<"
    for i, v in enumerate(values):
        params[f"{prefix}{i}"] = v

    def level(i: int) -> str:
        e, ph = exprs[i], f":{prefix}{i}"
        if i == len(exprs) - 1:
            return f"{e} {op} {ph}"
        return f"{e} {strict} {ph} OR ({e} = {ph} AND ({level(i + 1)}))"

    return level(0)


def range_predicate(exprs: Sequence[str], chunk: Chunk) -> tuple[str, dict[str, Any]]:
    """The WHERE condition of a chunk over the key expressions, with its bind parameters."""
    params: dict[str, Any] = {}
    parts = []
    if chunk.lower is not None:
        parts.append(_tuple_compare(exprs, chunk.lower, ">", "lo", params))
    if chunk.upper is not None:
        parts.append(_tuple_compare(exprs, chunk.upper, "<=", "hi", params))
    return (" AND ".join(f"({c})" for c in parts) or "1 = 1"), params


def key_expr(flavour: str, col: str, kind: str, collation: str | None = None) -> str:
    """The expression a key column is ordered and compared by. Strings compare by code point on both sides
    (``utf8mb4_bin`` / ``COLLATE "C"``), so that a range holds the same keys on both servers whatever their
    collations; other types compare alike as they are."""
    if kind not in ("string", "enum", "set"):
        return col
    if flavour == "postgresql":
        return f'{col} COLLATE "C"'
    if kind == "string" and collation and (collation.lower().endswith("_bin") or collation.lower() == "binary"):
        return col  # already code point order: the index serves the range
    return f"CONVERT({col} USING utf8mb4) COLLATE utf8mb4_bin"
