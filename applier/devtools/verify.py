"""Compare a target schema with an expected state, row for row (used by the demo, tests and benchmark)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from applier.dialect import dialect_for


def read_table(engine: Engine, schema: str, table: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    """All rows keyed by the table's key, read through the writer's own reflection (so names match)."""
    with engine.connect() as conn:
        meta = dialect_for(engine).writer().reflect(conn, schema, table)
        rows = conn.execute(select(meta.table)).mappings().all()
    return {tuple(r[c] for c in meta.key): dict(r) for r in rows}


def normalise(v: Any) -> Any:
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def compare_tables(engine: Engine, schema: str, expected: dict[str, dict[tuple[Any, ...], dict[str, Any]]]) -> list[str]:
    """Differences as readable lines (empty when the target equals the expectation)."""
    diffs: list[str] = []
    for table, rows in expected.items():
        got = read_table(engine, schema, table)
        for k in sorted(set(rows) | set(got), key=repr):
            want, have = rows.get(k), got.get(k)
            if want is None:
                diffs.append(f"{table}{list(k)}: unexpected row {have}")
            elif have is None:
                diffs.append(f"{table}{list(k)}: missing, expected {want}")
            else:
                bad = {c: (v, normalise(have.get(c))) for c, v in want.items() if normalise(have.get(c)) != v}
                if bad:
                    diffs.append(f"{table}{list(k)}: column(s) differ (expected, got): {bad}")
    return diffs
