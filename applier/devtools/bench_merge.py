"""PostgreSQL's own idempotent merge path, measured by ``python -m applier.devtools.bench`` (issue 15, target 2).

A bulk COPY into an empty table is no yardstick for an applier that must be idempotent: TiCDC delivers at least
once, so every write has to be an upsert or a delete by key. The yardstick here is the fastest idempotent path the
target itself offers, fed the benchmark's own row changes (the same generator, seed and options, so the same count,
insert/update/delete mix, hot keys and row values; see ``BenchWorkload.row_changes``) and timed on this machine in
the same run:

* transactions of ``txn_rows`` row changes (the benchmark's micro-batch size, ``--max-offsets-per-trigger``: the
  applier commits once per micro-batch too);
* per transaction, the last change per primary key (``ON CONFLICT`` cannot touch one row twice in a statement; the
  applier's ``plan_batch`` collapses the same way);
* in chunks of ``chunk_rows`` (the applier's PostgreSQL COPY chunk, ``4 * batch_rows``): the upserted rows COPYed
  into a temporary staging table, then ``INSERT INTO t SELECT ... FROM staging ON CONFLICT (id) DO UPDATE SET
  col = EXCLUDED.col, ...``; the deleted keys COPYed into a second staging table, then ``DELETE FROM t USING
  staging``; the staging tables emptied between chunks; commit.

The COPY is binary where the product's own rule (``applier.sinks.postgres.binary_copy_types``) allows it, as the
applier's writer does: a text COPY would make the yardstick slower than what the applier already uses, and the
ratio flattering. The staging tables are created once and emptied by each commit (``ON COMMIT DELETE ROWS``): what
the server can do at best, and what the applier does since round 4.

All bench tables' changes go into one fresh table shaped like the first bench table; their keys are made
distinct as ``key * tables + table number``, so every table's key pattern (hot keys included) stays as it was.

Timed: collapsing, building the tuples, COPY (psycopg's formatting included, as for the bulk load), both
statements and the commit. Not timed: generating the row changes (the workload generator's work).
"""

from __future__ import annotations

import time
from itertools import zip_longest
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence, TypeVar

from applier.devtools.bench_parts import rate, ratio
from applier.devtools.bench_stream import BENCH_COLUMN_NAMES, BenchWorkload, TableChecksum
from applier.events import Op, RowChange

KEY = "id"
MERGE_TABLE = "bench_merge_path"
STAGE_UPSERT = "bench_merge_up"
STAGE_DELETE = "bench_merge_del"
METHOD = ("per batch of row changes, one transaction: last change per key, COPY into a temporary staging table "
          "(binary where the applier's rule allows), INSERT ... SELECT ... ON CONFLICT (id) DO UPDATE, COPY of the "
          "deleted keys, DELETE ... USING, commit; into a fresh table with the same primary key")

T = TypeVar("T")
Row = tuple[Any, ...]


# ---------------------------------------------------------------------------------------------------------
# Pure parts
# ---------------------------------------------------------------------------------------------------------

def chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """Consecutive lists of ``size`` items (the last one shorter)."""
    if size < 1:
        raise ValueError("chunk size must be >= 1")
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def collapse(changes: Iterable[tuple[Hashable, Row | None]]) -> tuple[list[Row], list[tuple[Hashable]]]:
    """(key, row) changes of one batch, ``None`` for a delete, in commit order -> (rows to upsert, keys to delete)
    with only the last change of each key: a key ends up in at most one of them, so the two statements never
    touch the same row and their order does not matter."""
    last: dict[Hashable, Row | None] = {}
    for key, row in changes:
        last[key] = row
    upserts = [row for row in last.values() if row is not None]
    deletes = [(key,) for key, row in last.items() if row is None]
    return upserts, deletes


def change_getter(table_names: Sequence[str], columns: Sequence[str] = BENCH_COLUMN_NAMES,
                  key: str = KEY) -> Callable[[RowChange], tuple[int, Row | None]]:
    """RowChange -> (merged key, row tuple in ``columns`` order, or None for a delete), where the merged key
    ``key * len(table_names) + table number`` keeps the keys of different bench tables apart in one table."""
    number = {name: i for i, name in enumerate(table_names)}
    n = len(table_names)
    at = list(columns).index(key)

    def get(ev: RowChange) -> tuple[int, Row | None]:
        merged = (ev.after or ev.before)[key] * n + number[ev.table]  # type: ignore[index]
        if ev.op is Op.DELETE:
            return merged, None
        after = ev.after
        row = [after[c] for c in columns]  # type: ignore[index]
        row[at] = merged
        return merged, tuple(row)
    return get


def split_checksums(rows: Iterable[Mapping[str, Any]], table_names: Sequence[str],
                    key: str = KEY) -> dict[str, TableChecksum]:
    """The merged table's rows, given back their bench table and key (the inverse of :func:`change_getter`), as
    the per-table checksums the generator keeps: the merge path's result is checked like the applier's."""
    n = len(table_names)
    out = {t: TableChecksum() for t in table_names}
    for row in rows:
        merged = row[key]
        original = dict(row)
        original[key] = merged // n
        out[table_names[merged % n]].add(original)
    return out


def merge_statements(table: str, stage_up: str, stage_del: str, columns: Sequence[str], key: str,
                     quote: Callable[[str], str]) -> dict[str, str]:
    """The SQL of one batch, from already quoted table names and a quoting function for columns."""
    cols = ", ".join(quote(c) for c in columns)
    k = quote(key)
    sets = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in columns if c != key)
    return {
        "drop_stages": f"DROP TABLE IF EXISTS pg_temp.{stage_up}, pg_temp.{stage_del}",
        "create_up": f"CREATE TEMPORARY TABLE {stage_up} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {table} "
                     "WITH NO DATA",
        "create_del": f"CREATE TEMPORARY TABLE {stage_del} ON COMMIT DELETE ROWS AS SELECT {k} FROM {table} "
                      "WITH NO DATA",
        "truncate": f"TRUNCATE {stage_up}, {stage_del}",
        "copy_up": f"COPY {stage_up} ({cols}) FROM STDIN",
        "upsert": f"INSERT INTO {table} ({cols}) SELECT {cols} FROM {stage_up} "
                  f"ON CONFLICT ({k}) DO UPDATE SET {sets}",
        "copy_del": f"COPY {stage_del} ({k}) FROM STDIN",
        "delete": f"DELETE FROM {table} AS t USING {stage_del} AS d WHERE t.{k} = d.{k}",
    }


def merge_ratios(events_per_s: float | None, merge: Mapping[str, Any] | None) -> dict[str, float | None]:
    """The applier's events/s against the merge path's row changes/s; nothing when there was no merge path."""
    if not merge:
        return {}
    return {"events_per_s_to_merge_path_rows_per_s": ratio(events_per_s, merge.get("rows_per_s"))}


def format_merge(merge: Mapping[str, Any] | None, ratios: Mapping[str, Any]) -> list[str]:
    """The report's lines for the merge path (none when it was not measured, e.g. on MariaDB)."""
    if not merge:
        return []
    r = ratios.get("events_per_s_to_merge_path_rows_per_s")
    rps = merge.get("rows_per_s")
    return [
        f"  PG merge path rows/s       {'n/a' if rps is None else format(rps, ',.0f'):>14}   ({merge['rows']:,} row "
        f"changes in {merge['batches']:,} transactions of {merge['batch_rows']:,} (COPY chunks of "
        f"{merge.get('chunk_rows', merge['batch_rows']):,}), {merge['rows_written']:,} rows "
        f"written after per-key collapse, COPY {merge['copy_format']})",
        f"  ratio to PG merge path     {'n/a' if r is None else format(r, '.3f'):>14}   (issue 15 target: >= 0.5)",
    ]


# ---------------------------------------------------------------------------------------------------------
# The measurement
# ---------------------------------------------------------------------------------------------------------

def merge_path_postgres(engine, schema: str, like: str, workload: BenchWorkload, batch_rows: int,
                        expected_row_changes: int | None = None, chunk_rows: int | None = None) -> dict[str, Any]:
    """Apply ``workload``'s row changes (a fresh, not yet iterated BenchWorkload made with the benchmark's options)
    to a fresh table LIKE ``schema.like`` through the merge path above; drop the table afterwards. The result is
    checked against the generator's per-table checksums (untimed), so a wrong merge cannot pass as a fast one."""
    from applier.dialect import dialect_for

    prep = engine.dialect.identifier_preparer
    table = f"{prep.quote_schema(schema)}.{prep.quote(MERGE_TABLE)}"
    sql = merge_statements(table, prep.quote(STAGE_UPSERT), prep.quote(STAGE_DELETE), BENCH_COLUMN_NAMES, KEY,
                           prep.quote)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
        like_table = f"{prep.quote_schema(schema)}.{prep.quote(like)}"
        conn.exec_driver_sql(f"CREATE TABLE {table} (LIKE {like_table} INCLUDING ALL)")
    with engine.connect() as conn:
        meta = dialect_for(engine).writer().reflect(conn, schema, MERGE_TABLE)
    raw = engine.raw_connection()
    try:
        figures = _merge_batches(raw.driver_connection, sql, meta, workload, batch_rows, chunk_rows or batch_rows)
    finally:
        raw.close()
    final_rows = _check_final_state(engine, meta, workload)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {table}")
    if expected_row_changes is not None and figures["rows"] != expected_row_changes:
        raise RuntimeError(f"merge path: {figures['rows']} row changes generated, the benchmark's stream had "
                           f"{expected_row_changes}")
    return {"method": METHOD, **figures, "final_rows": final_rows, "verified": True}


def _merge_batches(pg, sql: Mapping[str, str], meta, workload: BenchWorkload, batch_rows: int,
                   chunk_rows: int) -> dict[str, Any]:
    """The timed part: every batch of row changes as one transaction on the psycopg connection ``pg``, written
    in chunks of ``chunk_rows``."""
    from applier.sinks.postgres import binary_copy_types

    get = change_getter(workload.table_names)
    timed = 0.0
    batches = changes = written = 0
    formats: set[str] = set()
    with pg.cursor() as cur:  # the session may be a pooled one that ran this before
        cur.execute(sql["drop_stages"])
        cur.execute(sql["create_up"])
        cur.execute(sql["create_del"])
    pg.commit()
    for batch in chunks(workload.row_changes(), batch_rows):
        t = time.perf_counter()
        upserts, deletes = collapse(map(get, batch))
        with pg.cursor() as cur:
            for n, (up, dl) in enumerate(zip_longest(chunks(upserts, chunk_rows), chunks(deletes, chunk_rows))):
                if n:
                    cur.execute(sql["truncate"])
                if up:
                    formats.add(_copy(cur, sql["copy_up"], up, binary_copy_types(meta, BENCH_COLUMN_NAMES, up)))
                    cur.execute(sql["upsert"])
                if dl:
                    formats.add(_copy(cur, sql["copy_del"], dl, binary_copy_types(meta, (KEY,), dl)))
                    cur.execute(sql["delete"])
        pg.commit()
        timed += time.perf_counter() - t
        batches += 1
        changes += len(batch)
        written += len(upserts) + len(deletes)
    with pg.cursor() as cur:
        cur.execute(sql["drop_stages"])
    pg.commit()
    return {"rows": changes, "seconds": round(timed, 3), "rows_per_s": rate(changes, timed), "batches": batches,
            "batch_rows": batch_rows, "chunk_rows": chunk_rows, "rows_written": written, "copy_format": "/".join(sorted(formats)) or "none"}


def _check_final_state(engine, meta, workload: BenchWorkload) -> int:
    """The merged table's per-table checksums must be the generator's; returns its row count."""
    from sqlalchemy import select

    with engine.connect() as conn:
        rows = conn.execution_options(stream_results=True, yield_per=20_000).execute(select(meta.table)).mappings()
        got = split_checksums(rows, workload.table_names)
    bad = {t: (str(cs), str(got[t])) for t, cs in workload.expected.items()
           if (cs.rows, cs.digest_sum) != (got[t].rows, got[t].digest_sum)}
    if bad:
        raise RuntimeError(f"merge path: {MERGE_TABLE} does not hold the generator's final state: {bad}")
    return sum(cs.rows for cs in got.values())


def _copy(cur, stmt: str, rows: list[Row], oids: list[int] | None) -> str:
    """COPY ``rows`` with psycopg's ``write_row``, in binary with ``oids``; returns the format used."""
    with cur.copy(stmt + (" (FORMAT BINARY)" if oids else "")) as cp:
        if oids:
            cp.set_types(oids)
        write_row = cp.write_row
        for r in rows:
            write_row(r)
    return "binary" if oids else "text"
