"""The applier's transaction logic with in-memory fakes (no database server): what is written, when progress is
saved and committed, what a failure leaves behind, and the stage timings it reports (applier.timing)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from applier.apply import Applier
from applier.events import Column, Op, Resolved, RowChange, SourcePosition
from applier.gate import Gate
from applier.sinks.plan import BatchPlan
from applier.sinks.table import ApplyError, build_meta
from applier.timing import StageTimer

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "int"))


def row(ts: int, off: int, key: int, val: int | None) -> RowChange:
    pos = SourcePosition("k", 0, off)
    if val is None:
        return RowChange("s", "t", ts, Op.DELETE, {"id": key, "v": None}, None, COLS, pos)
    return RowChange("s", "t", ts, Op.INSERT, None, {"id": key, "v": val}, COLS, pos)


class FakeSink:
    """Records every planned batch it is asked to write; can be told to fail."""

    dialect = "mysql"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.log: list[tuple[str, object]] = []

    def begin(self, conn) -> None:
        self.log.append(("begin", None))

    def table(self, conn, schema: str, name: str):
        return build_meta(schema, name, [("id", False, False), ("v", True, False)], ("id",), [])

    def write(self, conn, plan: BatchPlan) -> None:
        if self.fail:
            raise ApplyError("the target refused the row")
        self.log.append(("write", (sorted(k for k in plan.deletes), sorted(r["id"] for r in plan.upserts))))


class FakeStore:
    def __init__(self, log: list) -> None:
        self.log = log

    def save(self, conn, *, applied_ts: int, checkpoints, table_progress, batches: int = 0) -> None:
        self.log.append(("save", applied_ts))

    def quarantine(self, conn, msg, reason) -> None:  # pragma: no cover - not used here
        self.log.append(("quarantine", reason))


class Recorder(StageTimer):
    def __init__(self) -> None:
        self.stages: list[str] = []
        self.counts: dict[str, int] = {}

    def add(self, stage: str, seconds: float) -> None:
        assert seconds >= 0
        self.stages.append(stage)

    def count(self, what: str, n: int) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


def setup(sink: FakeSink, timer: StageTimer | None = None) -> tuple[Applier, Gate]:
    engine = create_engine("sqlite://")
    gate = Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={})
    kw = {"timer": timer} if timer is not None else {}
    return Applier(engine, sink, lambda s, t: ("r", t), FakeStore(sink.log), **kw), gate


def test_released_rows_and_progress_commit_together_and_only_up_to_the_resolved_ts() -> None:
    sink = FakeSink()
    timer = Recorder()
    ap, gate = setup(sink, timer)
    gate.add([row(10, 0, 1, 1), row(11, 1, 2, 2), row(12, 2, 1, None), Resolved(11, SourcePosition("k", 0, 3)),
              row(13, 4, 3, 3)])
    stats = ap.apply(gate.release())
    # the delete at ts 12 and the insert at 13 wait above the resolved ts 11
    assert sink.log == [("begin", None), ("write", ([], [1, 2])), ("save", 11)]
    assert stats.rows == 2 and stats.transactions == 1 and gate.applied_ts == 11
    assert timer.stages.count("commit") == 1 and timer.stages.count("progress") == 1
    assert {"plan", "write"} <= set(timer.stages)
    assert timer.counts == {"rows_upserted": 2, "rows_deleted": 0}
    gate.add([Resolved(13, SourcePosition("k", 0, 5))])
    ap.apply(gate.release())
    assert sink.log[-2:] == [("write", ([(1,)], [3])), ("save", 13)]


def test_a_refused_write_saves_no_progress_and_commits_nothing() -> None:
    sink = FakeSink(fail=True)
    timer = Recorder()
    ap, gate = setup(sink, timer)
    gate.add([row(10, 0, 1, 1), Resolved(10, SourcePosition("k", 0, 1))])
    with pytest.raises(ApplyError, match="refused"):
        ap.apply(gate.release())
    assert ("save", 10) not in sink.log and "commit" not in timer.stages
    assert gate.applied_ts == 0  # nothing released counts as applied: a rerun writes it again


def test_without_a_timer_nothing_is_measured() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    gate.add([row(10, 0, 1, 1), Resolved(10, SourcePosition("k", 0, 1))])
    assert ap.apply(gate.release()).rows == 1
