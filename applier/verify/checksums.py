"""A chunk's row count and checksum: in SQL on the servers where both print the values alike, else in Python.

Why: a replica of billions of rows cannot be compared row by row over the network; as TiDB's sync-diff-inspector
does, only the ranges whose checksums differ are read row by row. When both servers are MySQL-family (TiDB,
MySQL, MariaDB) and every compared column is of a kind in :data:`SERVER_CHECKSUM_KINDS`, each server computes
``BIT_XOR(CRC32(CONCAT_WS(...)))`` and ``COUNT(*)`` (:func:`mysql_checksum_sql`); everything else (any
PostgreSQL replica; FLOAT/DOUBLE/JSON columns) checksums the canonical rows in Python (:func:`chunk_sum`). A
server-side checksum can only err towards "differs" (the range is then read and compared row by row), never
hide a difference. Pure: no connection.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Sequence

from applier.verify.normalise import Row, read_expr

#: The flavours on which :func:`mysql_checksum_sql` runs (and prints the kinds below alike).
MYSQL_FAMILY = frozenset({"mysql", "mariadb", "tidb"})

#: Kinds whose text TiDB, MySQL and MariaDB print alike (through :func:`read_expr`), so that a checksum can be
#: computed in SQL on both sides. FLOAT/DOUBLE (digits printed differ) and JSON (TiDB/MySQL normalise it,
#: MariaDB keeps the text) are compared in Python.
SERVER_CHECKSUM_KINDS = frozenset({"int", "decimal", "string", "enum", "set", "binary", "date", "datetime",
                                   "timestamp", "time", "bit"})


def row_hash(row: Row) -> int:
    """64 bits of BLAKE2b over the row's canonical repr (repr of None/int/str/bytes is unambiguous)."""
    return int.from_bytes(hashlib.blake2b(repr(row).encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class ChunkSum:
    """A range's row count and checksum. ``server``: computed in SQL (comparable only with another server sum
    of the same SQL)."""

    rows: int
    checksum: int
    server: bool = False


def chunk_sum(rows: Iterable[Row]) -> ChunkSum:
    """Order-independent: the sum of the row hashes modulo 2**64 (keys are unique, so no two rows cancel)."""
    n = total = 0
    for r in rows:
        n += 1
        total = (total + row_hash(r)) & 0xFFFF_FFFF_FFFF_FFFF
    return ChunkSum(n, total)


def _checksum_element(col: str, kind: str, col_type: str, flavour: str) -> str:
    if kind == "binary":
        x = f"HEX({col})"
    elif kind == "bit":
        x = f"CAST({col} AS UNSIGNED)"
    elif kind in ("string", "enum", "set"):
        x = f"CONVERT({col} USING utf8mb4)"
    elif kind in ("date", "datetime", "timestamp"):
        x = read_expr(flavour, col, col_type)
    else:
        x = f"CAST({col} AS CHAR)"
    # length-prefixed, so ('a,b', 'c') and ('a', 'b,c') differ; 'N' (no digits) for NULL
    return f"IFNULL(CONCAT(LENGTH({x}), ':', {x}), 'N')"


def mysql_checksum_sql(table: str, cols: Sequence[tuple[str, str, str]], where: str, flavour: str) -> str:
    """``SELECT COUNT(*), BIT_XOR(CRC32(CONCAT_WS(...)))`` over a range; ``cols`` are (quoted name, kind, the
    side's column type). The same text on TiDB, MySQL and MariaDB for the kinds in SERVER_CHECKSUM_KINDS."""
    elems = ", ".join(_checksum_element(c, k, t, flavour) for c, k, t in cols)
    return f"SELECT COUNT(*), IFNULL(BIT_XOR(CRC32(CONCAT_WS(',', {elems}))), 0) FROM {table} WHERE {where}"
