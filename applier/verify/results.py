"""What a run finds: each table's row differences, counts and schema problems, and the run's whole result.

Why a module of its own: the comparison fills these in, and the report and the fix-up SQL read them; neither
needs the other. Pure: no connection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from applier.sinks.table import shown
from applier.verify.normalise import Key, Row


@dataclass
class RowDiffs:
    """Differences of one table: upstream rows the replica lacks, replica rows the upstream lacks, and rows
    whose values differ (key -> the differing column positions). Rows are kept for the fix-up SQL."""

    missing: dict[Key, Row] = field(default_factory=dict)  # key -> upstream row
    extra: dict[Key, Row] = field(default_factory=dict)  # key -> replica row
    different: dict[Key, tuple[Row, tuple[int, ...]]] = field(default_factory=dict)  # key -> (upstream row, cols)

    @property
    def count(self) -> int:
        return len(self.missing) + len(self.extra) + len(self.different)

    def merge(self, other: "RowDiffs") -> None:
        self.missing.update(other.missing)
        self.extra.update(other.extra)
        self.different.update(other.different)

    def reconcile(self) -> None:
        """A key missing from one range and extra in another is one row the two servers put in different
        ranges (their orders differ, e.g. ENUM keys sort by index upstream and by name in PostgreSQL): compare
        it as a row. So range boundaries can never turn equal data into differences."""
        for k in [k for k in self.missing if k in self.extra]:
            up, down = self.missing.pop(k), self.extra.pop(k)
            cols = differing_columns(up, down)
            if cols:
                self.different[k] = (up, cols)


def differing_columns(up: Row, down: Row) -> tuple[int, ...]:
    return tuple(i for i, (a, b) in enumerate(zip(up, down)) if a != b)


@dataclass
class TableResult:
    upstream: tuple[str, str]
    target: tuple[str, str]
    columns: tuple[str, ...] = ()
    key_columns: tuple[str, ...] = ()
    chunks: int = 0
    chunks_differing: int = 0
    rows_upstream: int = 0
    rows_replica: int = 0
    diffs: RowDiffs = field(default_factory=RowDiffs)
    schema_problems: list[str] = field(default_factory=list)  # counted as differences
    skipped: str = ""  # why the table was not compared (not a difference, but said)
    fix: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return self.diffs.count + len(self.schema_problems)

    @property
    def name(self) -> str:
        return f"{shown(*self.upstream)} -> {shown(*self.target)}"


@dataclass
class VerifyResult:
    pipeline: str
    upstream: str  # redacted URL and server version
    replica: str
    consistency: str  # one line: at which point each side was read
    consistent: bool
    tables: list[TableResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        return sum(t.differences for t in self.tables)
