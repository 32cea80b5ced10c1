"""``applier verify``: compare the replica with its upstream, chunk by chunk, and check the applier's own tables.

The flow of :func:`verify` (with ``--upstream``), top to bottom:

1. Open both sides at one read point (:mod:`.snapshot`): the replica in one REPEATABLE READ transaction at the
   pipeline's applied resolved ts, a TiDB upstream at that same TSO (a MySQL/MariaDB upstream is read live, and
   the output says so).
2. List the upstream tables the config's routes replicate and plan each one (:mod:`.tables`): its key (primary
   key, else a unique key over NOT NULL columns) and its columns matched with the replica's. A table of a history
   or soft_delete route (applier.modes) is compared by its current rows only (:func:`.tables.current_rows_filter`),
   without the mode's columns, and gets no fix-up SQL.
3. Compare each table chunk by chunk (:mod:`.compare`): as TiDB's sync-diff-inspector does, the table is cut into
   ranges of its key (:mod:`.chunks`), each range gets a row count and a checksum on both sides (:mod:`.checksums`:
   in SQL when both servers are MySQL-family and print every column alike, else in Python), and only the ranges
   whose checksums differ are read row by row to name the differing keys (:mod:`.results`). Values are compared in
   one canonical form, whichever server they come from (:mod:`.normalise`).
4. With ``--fix-sql``, render the statements that make the replica equal the upstream rows (:mod:`.fixsql`).
5. The CLI prints the report (:mod:`.output`).

Without ``--upstream``, the CLI checks the applier's own tables instead (:mod:`.selfcheck`); :mod:`.upstream`
parses the option and connects.

The modules, each importing only those listed before it:

* :mod:`.normalise` - column kinds, the canonical value of each kind, and the text each server is asked for;
* :mod:`.chunks` - key ranges and the WHERE condition of one range;
* :mod:`.checksums` - a range's row count and checksum, the SQL of the server-side one and the Python one;
* :mod:`.snapshot` - one connection per side (:class:`~.snapshot.Side`) and the point it is read at;
* :mod:`.results` - what a run finds: row differences, per-table and whole results;
* :mod:`.tables` - the routed upstream tables, their keys and matched columns (:class:`~.tables.TablePlan`);
* :mod:`.compare` - one table compared chunk by chunk, and the diff of two sets of rows;
* :mod:`.fixsql` - the fix-up SQL;
* :mod:`.selfcheck` - the applier's own tables, without an upstream;
* :mod:`.output` - the text printed: the report and the self-check's findings;
* :mod:`.upstream` - the ``--upstream`` option's URL and connection;
* this package - :func:`verify`, the whole run, and the names the CLI uses.

The pure modules (normalise, chunks, checksums, results, output and all of fixsql but :func:`write_fix_sql`) take
no connection and are unit-tested without a database (tests/unit/test_verify.py); the whole command runs against
MariaDB and PostgreSQL replicas in tests/e2e/test_verify_command.py. See docs/verify.md.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from sqlalchemy.engine import Engine
from sqlalchemy.engine.interfaces import Dialect as SADialect

from applier.routing import Router
from applier.verify.chunks import DEFAULT_CHUNK_ROWS
from applier.verify.compare import compare_table
from applier.verify.fixsql import fix_statements, literal_dialect, write_fix_sql
from applier.verify.output import format_findings, format_report
from applier.verify.results import TableResult, VerifyResult
from applier.verify.selfcheck import check_applier_tables, topic_matcher
from applier.verify.snapshot import (
    Side, VerifyError, applied_ts, begin_replica_snapshot, begin_upstream, replica_flavour, server_flavour,
)
from applier.verify.tables import plan_table, routed_tables, upstream_tables
from applier.verify.upstream import UpstreamUnreachable, connect_upstream, upstream_url

log = logging.getLogger("applier.verify")

__all__ = [
    "UpstreamUnreachable", "VerifyError", "check_applier_tables", "connect_upstream", "format_findings",
    "format_report", "literal_dialect", "topic_matcher", "upstream_url", "verify", "write_fix_sql",
]


def verify(target: Engine, upstream: Engine, *, pipeline: str, router: Router, writer: Any, gated: bool,
           upstream_shown: str, replica_shown: str, chunk_rows: int = DEFAULT_CHUNK_ROWS,
           fix: tuple[SADialect, Callable[[str | None], Any]] | None = None) -> VerifyResult:
    """Compare every routed upstream table with its replica table. ``writer`` is the target dialect's writer
    (its reflection gives the replica's columns, key and types); ``fix`` (a literal dialect and the target's
    ``value_converter``) makes each table's fix-up statements."""
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be >= 1")
    with target.connect() as tconn, upstream.connect() as uconn:
        down = Side(tconn, replica_flavour(tconn))
        begin_replica_snapshot(down)
        ts = applied_ts(down, pipeline)
        version = str(uconn.exec_driver_sql("SELECT VERSION()").scalar())
        up = Side(uconn, server_flavour(version))
        consistency = begin_upstream(up, ts)
        result = VerifyResult(pipeline, f"{upstream_shown} ({version})", replica_shown, consistency,
                              consistent=up.flavour == "tidb")
        if not gated:
            result.consistent = False
            result.notes.append("the source protocol keeps per-key order only (no resolved ts): the replica is not "
                                "transactionally consistent at any single ts")
        pairs, merged = routed_tables(upstream_tables(up), router)
        for src, dest in pairs:
            tr = TableResult(src, dest)
            result.tables.append(tr)
            if dest in merged:
                tr.skipped = (f"{len(merged[dest])} upstream tables merge into it (shard merge); verify compares "
                              "one upstream table with one replica table")
                continue
            started = time.monotonic()
            plan = plan_table(up, down, src, dest, writer, tr, mode=router.write_mode(*src))
            if plan is None:
                continue
            tr.columns = tuple(c.target_name for c in plan.columns)
            tr.key_columns = tr.columns[: plan.key_len]
            compare_table(up, down, plan, tr, chunk_rows)
            if fix is not None and tr.diffs.count and plan.mode != "replica":
                result.notes.append(f"{tr.name}: no fix-up SQL for a table of route mode {plan.mode} (its rows are "
                                    "versions or soft-deleted rows, not the upstream table's rows)")
            elif fix is not None and tr.diffs.count:
                tr.fix = fix_statements(plan, tr.diffs, fix[0], fix[1])
            log.info("%s: %d chunks, %d differences, %.1f s", tr.name, tr.chunks, tr.differences,
                     time.monotonic() - started)
        tconn.rollback()
        return result
