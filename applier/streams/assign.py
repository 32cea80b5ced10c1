"""Which apply stream an upstream table's changes go to.

A table always goes to the same stream, chosen from its *routed target* (schema, table): several upstream tables a
route merges into one target table (a shard merge) land in one stream, so their changes keep their commit-ts
order there and two transactions never write that table at once. The choice must be the same in every process
and every Python version (a restart, an executor, a newer interpreter must agree with the run that wrote the
progress): a CRC-32 of a fixed encoding of the names, never Python's ``hash()``, which is salted per process.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable

from applier.routing import Route


def target_key(schema: str, table: str) -> bytes:
    """The canonical bytes of a target table's name: UTF-8 (identifiers may hold any character but NUL, which
    MySQL and PostgreSQL both refuse in a name, so NUL separates the two unambiguously)."""
    return schema.encode("utf-8", "surrogatepass") + b"\x00" + table.encode("utf-8", "surrogatepass")


def target_stream(schema: str, table: str, n: int) -> int:
    """The stream (0..n-1) of a target table: CRC-32 of :func:`target_key` modulo ``n``."""
    return zlib.crc32(target_key(schema, table)) % n


@dataclass
class StreamAssignment:
    """The stream of each upstream table for ``n`` streams, through ``route`` (upstream (schema, table) -> target
    (schema, table), or None for a table no route keeps: stream 0, as such a table has nothing to write). A route
    that raises (a table no route can name) raises here too; the processor settles those tables before they are
    split. Answers are cached per upstream table: routing is configuration, fixed for the run."""

    n: int
    route: Route
    _cache: dict[tuple[str, str], int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"apply streams: n must be at least 1 (got {self.n})")

    def stream_of(self, schema: str, table: str) -> int:
        if self.n == 1:
            return 0
        key = (schema, table)
        s = self._cache.get(key)
        if s is None:
            target = self.route(schema, table)
            s = self._cache[key] = 0 if target is None else target_stream(target[0], target[1], self.n)
        return s


def split_segment(events: list, batches: list, stream_of: Callable[[str, str], int],
                  n: int) -> list[tuple[int, list, list]]:
    """One segment's row changes per stream: (stream, its events in commit order, its lane batches) for every
    stream that has any, in stream order. Both ways of running the streams (threads of the driver, Spark tasks)
    split the same way."""
    ev_parts: list[list] = [[] for _ in range(n)]
    b_parts: list[list] = [[] for _ in range(n)]
    for e in events:
        ev_parts[stream_of(e.schema, e.table)].append(e)
    for b in batches:
        b_parts[stream_of(b.shape.schema, b.shape.table)].append(b)
    return [(i, ev_parts[i], b_parts[i]) for i in range(n) if ev_parts[i] or b_parts[i]]
