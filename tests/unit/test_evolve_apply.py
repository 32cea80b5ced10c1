"""Schema from the stream in the apply stage (SQLite standing in for the target): where the generated DDL runs
among the rows, that it runs once, and what stops."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from applier.apply import Applier
from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition
from applier.gate import Gate
from applier.progress import metadata
from applier.sinks import ApplyError
from applier.sinks.table import build_meta, missing_table
from tests.unit.apply_fakes import FakeDialect, FakeSink, FakeStore

V1 = (Column("id", "int", nullable=False, key=True), Column("v", "int"))
V2 = V1 + (Column("w", "varchar", declared="varchar(8)"),)


def ins(ts: int, off: int, key: int, cols=V1, table: str = "t") -> RowChange:
    after = {c.name: key for c in cols}
    return RowChange("s", table, ts, Op.INSERT, None, after, cols, SourcePosition("k", 0, off))


class CatalogSink(FakeSink):
    """FakeSink reading the real SQLite tables, so DDL the applier runs is seen by the next reflection."""

    def __init__(self) -> None:
        super().__init__()
        self.cache: dict = {}

    def table(self, conn, schema: str, name: str):
        meta = self.cache.get(name)
        if meta is None:
            info = list(conn.exec_driver_sql(f"PRAGMA table_info(`{name}`)"))
            if not info:
                raise missing_table(schema, name)
            meta = build_meta(schema, name, [(r[1], not r[3], False) for r in info],
                              tuple(r[1] for r in info if r[5]), [])
            meta.types = {r[1]: r[2].lower() for r in info}
            self.cache[name] = meta
        return meta

    def write(self, conn, plan) -> None:
        self.log.append(("write", plan.meta.name, sorted(r["id"] for r in plan.upserts), tuple(sorted(plan.meta.columns))))

    def forget_tables(self, targets) -> None:
        self.cache.clear()
        self.log.append(("forget", None))


def setup(mode: str) -> tuple[Applier, Gate, CatalogSink, FakeStore]:
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    with engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t (id int NOT NULL PRIMARY KEY, v int)")
    sink = CatalogSink()
    store = FakeStore(sink.log)
    ap = Applier(engine, FakeDialect(sink), lambda s, t: ("main", t), store, schema_evolution=mode)
    return ap, Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={}), sink, store


def ops(log) -> list:
    return [e for e in log if e[0] in ("write", "save", "ddl")]


def test_a_missing_table_is_created_between_the_rows_before_and_after_it() -> None:
    ap, gate, sink, store = setup("create")
    gate.add([ins(10, 0, 1), ins(11, 1, 7, table="n"), ins(12, 2, 2), ins(12, 3, 8, table="n"),
              Resolved(12, SourcePosition("k", 0, 4))])
    ap.apply(gate.release())
    assert ops(sink.log) == [
        ("write", "t", [1], ("id", "v")), ("save", 10),  # everything before the new table's first row commits first
        ("ddl", "started"), ("ddl", "done"), ("save", 10),
        ("write", "n", [7, 8], ("id", "v")), ("write", "t", [2], ("id", "v")), ("save", 12)]
    with ap.engine.connect() as c:
        assert [r[1] for r in c.exec_driver_sql("PRAGMA table_info(n)")] == ["id", "v"]
    # a second run over the same rows (a replay) finds the table there: nothing more is made
    before = len([e for e in sink.log if e[0] == "ddl"])
    gate2 = Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={})
    gate2.add([ins(11, 1, 7, table="n"), Resolved(12, SourcePosition("k", 0, 4))])
    ap.apply(gate2.release())
    assert len([e for e in sink.log if e[0] == "ddl"]) == before


def test_create_leaves_new_columns_to_the_operator_and_evolve_adds_them() -> None:
    ap, gate, sink, store = setup("create")
    gate.add([ins(10, 0, 1), ins(11, 1, 2, V2), Resolved(11, SourcePosition("k", 0, 2))])
    with pytest.raises(ApplyError, match="'w' that target table main.t lacks"):
        ap.apply(gate.release())
    assert [e for e in sink.log if e[0] == "ddl"] == []

    ap, gate, sink, store = setup("evolve")
    gate.add([ins(10, 0, 1), ins(11, 1, 2, V2), ins(12, 2, 3, V2), Resolved(12, SourcePosition("k", 0, 3))])
    ap.apply(gate.release())
    assert ops(sink.log) == [
        ("write", "t", [1], ("id", "v")), ("save", 10), ("ddl", "started"), ("ddl", "done"), ("save", 10),
        ("write", "t", [2, 3], ("id", "v", "w")), ("save", 12)]
    # the upstream ADD COLUMN arriving after the rows (another partition, ungated) is recorded as skipped
    gate.add([DDL("s", "t", 13, "ALTER TABLE t ADD COLUMN w VARCHAR(8)", SourcePosition("k", 0, 4)),
              Resolved(13, SourcePosition("k", 0, 5))])
    ap.apply(gate.release())
    assert ("ddl", "skipped", "every column it adds is already in the t") in sink.log


def test_a_lossy_declared_type_stops_naming_column_types_and_position() -> None:
    ap, gate, sink, store = setup("evolve")
    narrow = (Column("id", "int", nullable=False, key=True), Column("v", "bigint", declared="bigint(20)"))
    gate.add([ins(10, 0, 1), ins(11, 1, 2, narrow), Resolved(11, SourcePosition("k", 0, 2))])
    with pytest.raises(ApplyError) as err:
        ap.apply(gate.release())
    msg = str(err.value)
    assert "'v'" in msg and "bigint" in msg and "int in the target" in msg and "offset=1" in msg, msg
    assert ("save", 11) not in sink.log  # nothing of the release committed past the failure


def test_none_checks_nothing() -> None:
    ap, gate, sink, store = setup("none")
    gate.add([ins(10, 0, 1, table="n"), Resolved(10, SourcePosition("k", 0, 1))])
    with pytest.raises(ApplyError, match="does not exist"):
        ap.apply(gate.release())


def test_a_connection_lost_while_reading_the_target_stays_a_transient_fault() -> None:
    """A target restart while the shape is read must reach the retry as the lost connection it is: swallowed, the
    next statement on the dead transaction failed with a PendingRollbackError, which stopped the run (exit 4)
    instead of replaying the transaction."""
    from sqlalchemy.exc import OperationalError, PendingRollbackError

    class GoneSink(CatalogSink):
        """The first catalog read loses the connection; later ones fail as SQLAlchemy then does."""

        calls = 0

        def table(self, conn, schema: str, name: str):
            self.calls += 1
            if self.calls == 1:
                raise OperationalError("SELECT ...", {}, Exception("server closed the connection"),
                                       connection_invalidated=True)
            raise PendingRollbackError("Can't reconnect until invalid transaction is rolled back.")

    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    sink = GoneSink()
    ap = Applier(engine, FakeDialect(sink), lambda s, t: ("main", t), FakeStore(sink.log), schema_evolution="create")
    gate = Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={})
    gate.add([ins(10, 0, 1), Resolved(10, SourcePosition("k", 0, 1))])
    with pytest.raises(ApplyError) as err:
        ap.apply(gate.release())
    assert ap.dialect.is_transient(err.value), err.value
    assert "main.t" in str(err.value) and "offset=0" in str(err.value)


def test_rows_alternating_between_two_column_tuples_check_the_target_once_per_shape() -> None:
    """TiCDC's canal-json gives an INT UNSIGNED column sqlType INT or BIGINT by the row's value, so one table's
    rows alternate between two column tuples. Each shape is checked against the target once (until a DDL), not at
    every switch: the check reads the catalog and cost 6 us per row change when only the last shape was kept."""
    ap, gate, sink, store = setup("evolve")
    other = (V1[0], Column("v", "int", type_code=-5))
    assert other != V1
    reads = []
    check = ap._schema_from_stream
    ap._schema_from_stream = lambda conn, ev: reads.append(ev.table) or check(conn, ev)  # type: ignore
    gate.add([ins(10, i, i, V1 if i % 2 else other) for i in range(10)] + [Resolved(10, SourcePosition("k", 0, 10))])
    ap.apply(gate.release())
    assert reads == ["t", "t"]
    # a DDL forgets what was checked: the next rows are checked again
    gate.add([DDL("s", "t", 11, "ALTER TABLE t ADD COLUMN w VARCHAR(8)", SourcePosition("k", 0, 11)),
              ins(12, 12, 50, V1), ins(12, 13, 51, other), ins(12, 14, 52, V1), Resolved(12, SourcePosition("k", 0, 15))])
    reads.clear()
    ap.apply(gate.release())
    assert reads == ["t", "t"]
