"""The two connections and the point they are read at.

Why: the comparison means something only if each side is read at one point. The replica is read in one
REPEATABLE READ transaction that first reads the pipeline's applied resolved ts, so it is read exactly as of
that ts (progress commits with the data). A TiDB upstream is read at that same TSO (``SET @@tidb_snapshot``); a
MySQL/MariaDB upstream has no TSO and is read live (in one consistent-snapshot transaction), so in-flight changes
may show as differences, which the 'read at' line says. :class:`Side` holds a connection for the whole run (the
snapshot lives in its session/transaction) and says what kind of server it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from sqlalchemy import inspect, select, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from applier import progress as p


class VerifyError(Exception):
    """Verify cannot go on (no progress to read a snapshot at, a TiDB snapshot past the GC safe point...); the
    message says what to do. ``code`` is the exit code: 2 for the pipeline's state (nothing to read at), 5 when the
    upstream cannot serve the read."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Side:
    """A connection to one server, held for the whole run (the snapshot lives in its session/transaction)."""

    conn: Connection
    flavour: str  # tidb | mysql | mariadb | postgresql

    def q(self, name: str) -> str:
        return self.conn.dialect.identifier_preparer.quote_identifier(name)

    def table(self, schema: str, name: str) -> str:
        return (f"{self.q(schema)}." if schema else "") + self.q(name)

    def rows(self, sql: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.conn.execute(text(sql), dict(params or {}))]


def server_flavour(version: str) -> str:
    """The upstream's flavour from its ``SELECT VERSION()``."""
    v = version.lower()
    if "tidb" in v:
        return "tidb"
    if "mariadb" in v:
        return "mariadb"
    return "mysql"


def replica_flavour(conn: Connection) -> str:
    """The replica's flavour from its SQLAlchemy dialect."""
    if conn.dialect.name == "postgresql":
        return "postgresql"
    return "mariadb" if getattr(conn.dialect, "is_mariadb", False) else "mysql"


def error_line(exc: DBAPIError) -> str:
    """What the server said, in one line of at most 300 characters (for a message that names what to do)."""
    return str(exc.orig if exc.orig is not None else exc).splitlines()[0][:300]


def _utc(side: Side) -> None:
    """UTC, as the writers' sessions use: TIMESTAMP values are read as the writers wrote them."""
    side.conn.exec_driver_sql("SET SESSION time_zone = '+00:00'")


def _mysql_snapshot(side: Side) -> None:
    """A MySQL/MariaDB REPEATABLE READ transaction whose snapshot is taken now, not at its first read."""
    side.conn.exec_driver_sql("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    side.conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")


def begin_replica_snapshot(side: Side) -> None:
    """Open the replica's one read transaction: every later read sees the same committed state, and the
    applied resolved ts read first in it is the ts that state is consistent at."""
    if side.flavour == "postgresql":
        side.conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        side.conn.exec_driver_sql("SET TIME ZONE 'UTC'")
    else:
        _utc(side)
        _mysql_snapshot(side)


def applied_ts(side: Side, pipeline: str) -> int | None:
    """The pipeline's applied resolved ts, or None when the applier's tables or its row do not exist."""
    if not inspect(side.conn).has_table(p.pipelines.name):
        return None
    v = side.conn.execute(select(p.pipelines.c.applied_ts).where(p.pipelines.c.pipeline == pipeline)).scalar()
    return None if v is None else int(v)


def begin_upstream(side: Side, ts: int | None) -> str:
    """Session settings (UTC, as the writers use) and the read point; returns the 'read at' line."""
    _utc(side)
    if side.flavour == "tidb":
        if not ts:
            raise VerifyError("the pipeline has no applied resolved ts yet (applier_pipelines has no progress for "
                              "it): there is no TSO to read the upstream at; run the applier first")
        try:
            side.conn.execute(text("SET @@tidb_snapshot = :ts"), {"ts": str(ts)})
        except DBAPIError as exc:
            reason = error_line(exc)
            if "GC safe point" in reason or getattr(exc.orig, "args", (None,))[0] == 8055:
                raise VerifyError(
                    f"TiDB cannot read at the replica's applied resolved ts {ts}: {reason}. TiDB's GC has passed "
                    "the point the replica is consistent at, so the upstream rows as of it are gone. Let the applier "
                    "catch up (applier run) so that its applied ts is newer than the safe point, and keep "
                    "tidb_gc_life_time upstream longer than the applier lags (e.g. SET GLOBAL tidb_gc_life_time = "
                    "'24h'); then rerun verify", code=5) from None
            raise VerifyError(
                f"TiDB cannot read at the replica's applied resolved ts {ts}: {reason}. Check that --upstream is the "
                "changefeed's upstream TiDB and that its user may set tidb_snapshot; then rerun", code=5) from None
        return (f"consistent: upstream TiDB at TSO {ts} (tidb_snapshot), replica in one transaction at applied "
                f"resolved ts {ts}")
    _mysql_snapshot(side)
    at = (f"as of its applied resolved ts {ts}" if ts is not None
          else "in one transaction (the pipeline has no recorded progress)")
    return (f"NOT a consistent snapshot: the upstream is {side.flavour}, not TiDB, so it is read live (in one "
            f"transaction) while the replica is read {at}; changes in flight can show as differences (rerun, or "
            "stop upstream writes, to confirm them)")
