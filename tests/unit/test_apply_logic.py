"""The applier's transaction logic with in-memory fakes (no database server): what is written, when progress is
saved and committed, what a failure leaves behind, the stage timings it reports (applier.timing), and the DDL
replay logic (started / done / skipped history states). DDL is translated by the real MySQL translator and run
on an in-memory SQLite database, so "the statement already took effect" is a real error of a real engine."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from applier.apply import Applier
from applier.events import DDL, Column, KafkaMessage, Op, Resolved, RowChange, SourcePosition
from applier.gate import Gate
from applier.progress import ddl_key, metadata
from applier.quarantine import SKIPPED, UndecodableMessage
from applier.sinks.plan import BatchPlan
from applier.sinks.table import ApplyError
from applier.timing import StageTimer
from tests.unit.apply_fakes import FakeDialect, FakeSink, FakeStore

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "int"))


def row(ts: int, off: int, key: int, val: int | None) -> RowChange:
    pos = SourcePosition("k", 0, off)
    if val is None:
        return RowChange("s", "t", ts, Op.DELETE, {"id": key, "v": None}, None, COLS, pos)
    return RowChange("s", "t", ts, Op.INSERT, None, {"id": key, "v": val}, COLS, pos)


class Recorder(StageTimer):
    def __init__(self) -> None:
        self.stages: list[str] = []
        self.counts: dict[str, int] = {}

    def add(self, stage: str, seconds: float) -> None:
        assert seconds >= 0
        self.stages.append(stage)

    def count(self, what: str, n: int) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


def setup(sink: FakeSink, timer: StageTimer | None = None, *, transactional: bool = False,
          **kw) -> tuple[Applier, Gate]:
    engine = create_engine("sqlite://")  # one in-memory database per test (the pool keeps its connection)
    metadata.create_all(engine)  # the applier's own tables (the quarantine of row changes is real here)
    gate = Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={})
    if timer is not None:
        kw["timer"] = timer
    ap = Applier(engine, FakeDialect(sink, transactional), lambda s, t: ("main", t), FakeStore(sink.log), **kw)
    return ap, gate


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


def test_a_refused_chunk_names_the_row_the_target_refuses_and_the_event_that_set_it() -> None:
    sink = FakeSink(refuse_key=7)
    ap, gate = setup(sink)
    gate.add([row(10, i, i, i * 10) for i in range(12)] + [Resolved(10, SourcePosition("k", 0, 12))])
    with pytest.raises(ApplyError, match=r"writing 12 change\(s\) of upstream table s\.t .* at row 2.*"
                                         r"The refused row: id=7 \(set by the event at topic=k partition=0 offset=7\)"):
        ap.apply(gate.release())
    assert not [e for e in sink.log if e[0] == "save"] and gate.applied_ts == 0


def test_without_a_timer_nothing_is_measured() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    gate.add([row(10, 0, 1, 1), Resolved(10, SourcePosition("k", 0, 1))])
    assert ap.apply(gate.release()).rows == 1


# ---- DDL replay: the history row's states ---------------------------------------------------------------

def ddl(ts: int, off: int, query: str) -> DDL:
    return DDL("s", "t", ts, query, SourcePosition("k", 0, off))


def release_ddl(ap: Applier, gate: Gate, ev: DDL, resolved: int) -> None:
    gate.add([ev, Resolved(resolved, SourcePosition("k", 0, ev.position.offset + 1))])
    ap.apply(gate.release())


def columns(ap: Applier) -> list[str]:
    with ap.engine.connect() as c:
        return [r[1] for r in c.exec_driver_sql("PRAGMA table_info(t)")]


def test_a_non_transactional_ddl_is_marked_started_before_it_runs_and_done_with_the_progress() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    release_ddl(ap, gate, ddl(20, 0, "CREATE TABLE t (id INT PRIMARY KEY)"), 20)
    assert sink.log == [("begin", None), ("save", 19), ("ddl", "started"), ("ddl", "done"), ("save", 19),
                        ("forget", [("main", "t")]), ("begin", None), ("save", 20)]
    assert columns(ap) == ["id"] and ap.total.ddls == 1


def test_a_replay_after_a_crash_between_started_and_done_accepts_what_already_took_effect() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    release_ddl(ap, gate, ddl(20, 0, "CREATE TABLE t (id INT PRIMARY KEY)"), 20)
    add = ddl(30, 2, "ALTER TABLE t ADD COLUMN c INT")
    with ap.engine.begin() as c:  # the crash: the statement ran, the history row still says "started"
        c.exec_driver_sql("ALTER TABLE t ADD COLUMN c INT")
    ap.store.ddl[ddl_key(add)] = "started"
    release_ddl(ap, gate, add, 30)
    assert ap.store.ddl[ddl_key(add)] == "done" and columns(ap) == ["id", "c"]


def test_the_same_error_without_a_started_marker_stops_the_pipeline() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    release_ddl(ap, gate, ddl(20, 0, "CREATE TABLE t (id INT PRIMARY KEY)"), 20)
    with ap.engine.begin() as c:  # somebody added the column by hand: not a replay, so not "already done"
        c.exec_driver_sql("ALTER TABLE t ADD COLUMN c INT")
    add = ddl(30, 2, "ALTER TABLE t ADD COLUMN c INT")
    with pytest.raises(ApplyError, match=r"DDL at .* failed on the target: .*duplicate column.* Fix the target"):
        release_ddl(ap, gate, add, 30)
    # recorded as refused, not left "started": the rerun runs it afresh, so "duplicate column" is not taken for a
    # statement that took effect before a crash, and the run stops again until the target or the policy changes
    assert ap.store.ddl[ddl_key(add)] == "refused"
    assert ("save", 30) not in sink.log and gate.applied_ts == 20
    with pytest.raises(ApplyError, match=r"DDL at .* failed on the target: .*duplicate column"):
        _rerun(add, "stop")  # nothing changed: it stops again
    assert _rerun(add, "skip") == ("skipped", 30)  # the documented way on: record it as skipped


def _rerun(ev: DDL, policy: str) -> tuple[str, int]:
    """A new run over a target that has table t with columns id and c, whose history has ``ev`` as refused."""
    ap, gate = setup(FakeSink(), on_unsupported_ddl=policy)
    with ap.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t (id INT PRIMARY KEY, c INT)")
    ap.store.ddl[ddl_key(ev)] = "refused"
    release_ddl(ap, gate, ev, ev.commit_ts)
    return ap.store.ddl[ddl_key(ev)], gate.applied_ts


@pytest.mark.parametrize("state", ["done", "skipped"])
def test_a_ddl_the_history_has_as_done_or_skipped_never_runs_again(state: str) -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    ev = ddl(20, 0, "CREATE TABLE t (id INT PRIMARY KEY)")
    ap.store.ddl[ddl_key(ev)] = state
    release_ddl(ap, gate, ev, 20)
    assert columns(ap) == [] and ap.total.ddls == 0
    assert [e for e in sink.log if e[0] == "ddl"] == [] and sink.log[-1] == ("save", 20)


def test_an_unsupported_ddl_stops_or_is_recorded_as_skipped_by_policy() -> None:
    grant = ddl(20, 0, "GRANT ALL ON *.* TO 'u'@'%'")
    sink = FakeSink()
    ap, gate = setup(sink)
    with pytest.raises(ApplyError, match=r'cannot be applied to mysql: .* on_unsupported_ddl = "skip"'):
        release_ddl(ap, gate, grant, 20)
    assert ap.store.ddl == {} and gate.applied_ts == 0

    sink = FakeSink()
    ap, gate = setup(sink, on_unsupported_ddl="skip")
    release_ddl(ap, gate, grant, 20)
    assert ap.store.ddl == {ddl_key(grant): "skipped"} and ap.total.ddls_skipped == 1
    assert ("save", 19) in sink.log and gate.applied_ts == 20


def test_a_transactional_ddl_is_recorded_once_as_done_and_a_failure_records_nothing() -> None:
    sink = FakeSink()
    ap, gate = setup(sink, transactional=True)
    release_ddl(ap, gate, ddl(20, 0, "CREATE TABLE t (id INT PRIMARY KEY)"), 20)
    assert [e for e in sink.log if e[0] == "ddl"] == [("ddl", "done")]
    release_ddl(ap, gate, ddl(30, 2, "ALTER TABLE t ADD COLUMN c INT"), 30)
    bad = ddl(40, 4, "ALTER TABLE t ADD COLUMN c INT")  # the column is there: not a replay, so an error
    with pytest.raises(ApplyError, match="duplicate column"):
        release_ddl(ap, gate, bad, 40)
    assert ddl_key(bad) not in ap.store.ddl and gate.applied_ts == 30


def test_a_ddl_reaching_the_appliers_own_tables_is_refused() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    ap.route = lambda s, t: ("applier_home", t)
    with pytest.raises(ApplyError, match="reserved for the applier's own tables"):
        release_ddl(ap, gate, DDL("s", "applier_progress", 20, "DROP TABLE applier_progress",
                                  SourcePosition("k", 0, 0)), 20)


# ---- a DDL the target refuses (issue 24): settled by on_unsupported_ddl, never a stall for good ----------------

REFUSED = "ALTER TABLE missing ADD COLUMN c INT"  # the target has no such table: SQLite refuses it, not as a replay


def history(ap: Applier) -> list[tuple]:
    return [e for e in ap.store.log if e[0] == "ddl"]


@pytest.mark.parametrize("transactional", [False, True])
def test_a_ddl_the_target_refuses_stops_naming_position_table_error_and_key(transactional: bool) -> None:
    sink = FakeSink()
    ap, gate = setup(sink, transactional=transactional)
    ev = DDL("s", "missing", 20, REFUSED, SourcePosition("k", 0, 7))
    with pytest.raises(ApplyError) as err:
        release_ddl(ap, gate, ev, 20)
    msg = str(err.value)
    assert "DDL at topic=k partition=0 offset=7 (commit ts 20) of upstream table s.missing (target main.missing)" in msg
    assert "failed on the target: OperationalError: no such table" in msg and "statement: ALTER TABLE" in msg
    assert '[target] on_unsupported_ddl = "skip"' in msg and "Fix the target" in msg
    assert gate.applied_ts == 0 and ("save", 20) not in sink.log
    # MySQL's "started" marker becomes "refused" (the rerun is no replay); PostgreSQL's transaction recorded nothing
    assert ap.store.ddl.get(ddl_key(ev)) == (None if transactional else "refused")


def keep_details(ap: Applier) -> list[str]:
    """Every detail the store is asked to record, whole (FakeStore logs 40 characters of it)."""
    details: list[str] = []
    record = ap.store.ddl_record

    def keep(conn, ev, key, *, state, statements, detail=""):
        details.append(detail)
        record(conn, ev, key, state=state, statements=statements, detail=detail)

    ap.store.ddl_record = keep  # type: ignore[method-assign]
    return details


@pytest.mark.parametrize("transactional", [False, True])
def test_under_skip_a_refused_ddl_is_recorded_with_its_reason_and_position_and_the_rest_goes_on(
        transactional: bool) -> None:
    sink = FakeSink()
    ap, gate = setup(sink, transactional=transactional, on_unsupported_ddl="skip")
    details = keep_details(ap)
    ev = DDL("s", "missing", 20, REFUSED, SourcePosition("k", 0, 7))
    gate.add([row(10, 0, 1, 1), ev, row(30, 8, 2, 2), Resolved(30, SourcePosition("k", 0, 9))])
    stats = ap.apply(gate.release())
    assert ap.store.ddl == {ddl_key(ev): "skipped"} and stats.ddls_skipped == 1 and stats.ddls == 0
    # the rows on both sides of it are written, the skip commits with the progress up to it, the run goes on
    assert [e for e in sink.log if e[0] == "write"] == [("write", ([], [1])), ("write", ([], [2]))]
    skipped = sink.log.index(history(ap)[-1])
    assert history(ap)[-1][:2] == ("ddl", "skipped") and sink.log[skipped + 1] == ("save", 19)
    assert gate.applied_ts == 30 and sink.log[-1] == ("save", 30)
    # the record carries the target's error, the statement, the table and the Kafka position
    full = details[-1]
    assert full.startswith("refused by the target: OperationalError: no such table"), full
    assert "statement: ALTER TABLE `main`.`missing` ADD COLUMN c INT" in full and "upstream table s.missing" in full
    assert full.endswith("(DDL message at topic=k partition=0 offset=7)")


def test_a_refusal_after_a_crash_between_started_and_skipped_is_settled_the_same_way() -> None:
    sink = FakeSink()
    ap, gate = setup(sink, on_unsupported_ddl="skip")
    ev = DDL("s", "missing", 20, REFUSED, SourcePosition("k", 0, 7))
    ap.store.ddl[ddl_key(ev)] = "started"  # the crash: the marker committed, the skip did not
    release_ddl(ap, gate, ev, 20)
    assert ap.store.ddl[ddl_key(ev)] == "skipped" and gate.applied_ts == 20


def test_a_transient_refusal_is_never_skipped() -> None:
    sink = FakeSink()
    ap, gate = setup(sink, on_unsupported_ddl="skip")
    ap.dialect.is_transient = lambda exc: exc is not None  # type: ignore[method-assign]  # "lost connection"
    ev = DDL("s", "missing", 20, REFUSED, SourcePosition("k", 0, 7))
    with pytest.raises(ApplyError, match="failed on the target") as err:
        release_ddl(ap, gate, ev, 20)
    assert err.value.__cause__ is not None  # the driver's error stays in the chain: the run replays it
    assert ap.store.ddl[ddl_key(ev)] == "started" and gate.applied_ts == 0 and ap.total.ddls_skipped == 0


def test_a_fault_of_the_target_itself_stops_even_under_skip() -> None:
    sink = FakeSink()
    ap, gate = setup(sink, on_unsupported_ddl="skip")
    ap.dialect.is_target_fault = lambda exc: True  # type: ignore[method-assign]  # e.g. read-only
    ev = DDL("s", "missing", 20, REFUSED, SourcePosition("k", 0, 7))
    with pytest.raises(ApplyError, match=r"The target itself cannot run it .* fix the target, then restart"):
        release_ddl(ap, gate, ev, 20)
    assert ap.store.ddl[ddl_key(ev)] == "started" and gate.applied_ts == 0


def test_the_dialects_tell_a_fault_of_the_target_from_a_refused_statement() -> None:
    from sqlalchemy.exc import OperationalError

    from applier.dialect import MARIADB, MYSQL, POSTGRES

    class PgError(Exception):
        def __init__(self, sqlstate: str) -> None:
            super().__init__("pg")
            self.sqlstate = sqlstate

    def wrap(orig: Exception) -> ApplyError:
        err = ApplyError("DDL failed")
        err.__cause__ = OperationalError("stmt", {}, orig)
        return err

    for d in (MYSQL, MARIADB):
        assert d.is_target_fault(wrap(Exception(1290, "running with the --read-only option")))
        assert d.is_target_fault(wrap(Exception(1142, "ALTER command denied")))
        assert d.is_target_fault(wrap(Exception(1021, "Disk full")))
        assert not d.is_target_fault(wrap(Exception(1146, "Table doesn't exist")))
        assert not d.is_target_fault(wrap(Exception(1064, "You have an error in your SQL syntax")))
        assert not d.is_target_fault(wrap(Exception(2013, "Lost connection")))  # transient: retried instead
    assert POSTGRES.is_target_fault(wrap(PgError("25006")))  # read-only transaction
    assert POSTGRES.is_target_fault(wrap(PgError("42501")))  # insufficient privilege
    assert POSTGRES.is_target_fault(wrap(PgError("53100")))  # disk full
    assert not POSTGRES.is_target_fault(wrap(PgError("3F000")))  # no such schema: the statement's fault
    assert not POSTGRES.is_target_fault(wrap(PgError("57P01")))  # admin shutdown: transient, retried
    assert not POSTGRES.is_target_fault(ApplyError("no driver error"))


def test_dropped_executable_comment_options_are_logged_with_the_position(caplog) -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    with caplog.at_level("WARNING", logger="applier.apply"):
        release_ddl(ap, gate, ddl(20, 3, "CREATE TABLE t (id INT PRIMARY KEY) /*!50100 TABLESPACE ts */"), 20)
    assert columns(ap) == ["id"]
    (rec,) = [r for r in caplog.records if "executable comment" in r.getMessage()]
    assert "DDL at topic=k partition=0 offset=3" in rec.getMessage() and "TABLESPACE" in rec.getMessage()


@pytest.mark.parametrize("policy", ["stop", "skip"])
def test_a_smuggling_executable_comment_never_runs_and_is_settled_by_policy(policy: str) -> None:
    sink = FakeSink()
    ap, gate = setup(sink, on_unsupported_ddl=policy)
    release_ddl(ap, gate, ddl(20, 0, "CREATE TABLE t (id INT PRIMARY KEY)"), 20)
    with ap.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE x (id INT)")
    ev = DDL("s", "t", 30, "ALTER TABLE t ADD c INT /*!50000 , DROP TABLE x */", SourcePosition("k", 0, 5))
    if policy == "stop":
        with pytest.raises(ApplyError, match=r"DDL at topic=k partition=0 offset=5 .* executable comment"):
            release_ddl(ap, gate, ev, 30)
    else:
        release_ddl(ap, gate, ev, 30)
        assert ap.store.ddl[ddl_key(ev)] == "skipped"
    with ap.engine.connect() as c:
        tables = {r[0] for r in c.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "x" in tables and columns(ap) == ["id"]


# ---- shard merges: one shard's destructive DDL on a table the routes merge ---------------------------------

def merged(schema: str, table: str) -> tuple[str, str]:
    return ("main", "t") if table.startswith("shard") else ("main", table)


@pytest.mark.parametrize("query", ["DROP TABLE shard1", "TRUNCATE TABLE shard1", "RENAME TABLE shard1 TO old1"])
def test_a_shards_destructive_ddl_on_a_merged_table_stops_naming_the_other_shards(query: str) -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    ap.route = merged
    with ap.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t (id INT PRIMARY KEY)")
    ap.store.sources = [("s", "shard1"), ("s", "shard2"), ("s", "other")]
    ev = DDL("s", "shard1", 20, query, SourcePosition("k", 0, 0))
    with pytest.raises(ApplyError, match=r"would .* main\.t, which the routes also fill from s\.shard2\. .*"
                                         r'shard_ddl = "skip"'):
        release_ddl(ap, gate, ev, 20)
    assert columns(ap) == ["id"] and ap.store.ddl == {} and gate.applied_ts == 0


def test_a_shards_destructive_ddl_is_recorded_as_skipped_under_shard_ddl_skip() -> None:
    sink = FakeSink()
    ap, gate = setup(sink, shard_ddl="skip")
    ap.route = merged
    with ap.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t (id INT PRIMARY KEY)")
    ap.store.sources = [("s", "shard2")]
    ev = DDL("s", "shard1", 20, "DROP TABLE shard1", SourcePosition("k", 0, 0))
    release_ddl(ap, gate, ev, 20)
    assert columns(ap) == ["id"] and ap.store.ddl == {ddl_key(ev): "skipped"} and gate.applied_ts == 20
    assert ap.total.ddls_skipped == 1


def test_a_shard_seen_only_in_this_run_counts_and_a_lone_table_is_dropped_as_usual() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    ap.route = merged
    with ap.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t (id INT PRIMARY KEY)")
        c.exec_driver_sql("CREATE TABLE lone (id INT PRIMARY KEY)")
    ap.store.sources = [("s", "lone"), ("s", "shard1")]
    release_ddl(ap, gate, DDL("s", "lone", 20, "DROP TABLE lone", SourcePosition("k", 0, 0)), 20)
    with ap.engine.connect() as c:  # not merged: it runs
        assert [r[0] for r in c.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'applier%'")] == ["t"]
    shard2 = RowChange("s", "shard2", 30, Op.INSERT, None, {"id": 1, "v": 1}, COLS, SourcePosition("k", 0, 2))
    gate.add([shard2, Resolved(30, SourcePosition("k", 0, 3))])
    ap.apply(gate.release())  # shard2's rows reach main.t in this run
    with pytest.raises(ApplyError, match=r"also fill from s\.shard2"):
        release_ddl(ap, gate, DDL("s", "shard1", 40, "TRUNCATE TABLE shard1", SourcePosition("k", 0, 4)), 40)


def test_a_rename_of_an_unmerged_table_is_not_taken_for_a_shard_conflict() -> None:
    ap, _ = setup(FakeSink())
    ap.store.sources = [("s", "a"), ("s", "c")]
    ev = DDL("s", "b", 20, "RENAME TABLE a TO b", SourcePosition("k", 0, 0))  # TiCDC names the new table
    tr = ap.dialect.translate_ddl(ev.query, schema="s", table="b", route=ap.route)
    assert tr.kind == "rename_table" and ap.shards.conflict(ev, tr) == ""
    ap.route = lambda s, t: ("main", "merged" if t in ("a", "c") else t)  # a and c merged: c's rows would move
    tr = ap.dialect.translate_ddl(ev.query, schema="s", table="b", route=ap.route)
    assert "also fill from s.c" in ap.shards.conflict(ev, tr)


def test_a_shards_reshaping_alter_stops_and_an_additive_one_applies_once_for_all_shards() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    ap.route = merged
    with ap.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    ap.store.sources = [("s", "shard1"), ("s", "shard2")]
    with pytest.raises(ApplyError, match=r"would drop column main\.t, which the routes also fill from s\.shard2"):
        release_ddl(ap, gate, DDL("s", "shard1", 20, "ALTER TABLE shard1 DROP COLUMN v", SourcePosition("k", 0, 0)), 20)
    assert columns(ap) == ["id", "v"]

    ap, gate = setup(sink)
    ap.route = merged
    with ap.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE t (id INT PRIMARY KEY, v INT)")
    ap.store.sources = [("s", "shard1"), ("s", "shard2")]
    first = DDL("s", "shard1", 20, "ALTER TABLE shard1 ADD COLUMN w INT", SourcePosition("k", 0, 0))
    second = DDL("s", "shard2", 30, "ALTER TABLE shard2 ADD COLUMN w INT", SourcePosition("k", 0, 2))
    release_ddl(ap, gate, first, 20)
    release_ddl(ap, gate, second, 30)  # SQLite, like MySQL, has no ADD COLUMN IF NOT EXISTS: run twice, it fails
    assert columns(ap) == ["id", "v", "w"] and gate.applied_ts == 30
    assert ap.store.ddl == {ddl_key(first): "done", ddl_key(second): "skipped"}


# ---- rows the target refuses: on_apply_error = quarantine | skip -------------------------------------------

def held(ap: Applier) -> list[tuple[str, str, str, int]]:
    with ap.engine.connect() as c:
        return [(h.row_key, h.kind, h.state, h.commit_ts)
                for h in ap.rows_quarantine.find(c, states=("held", "skipped"))]


def test_a_refused_row_is_held_with_every_later_change_of_its_key_and_the_rest_applies() -> None:
    sink = FakeSink(refuse_key=7)
    ap, gate = setup(sink, on_apply_error="quarantine")
    gate.add([row(10, i, i, i * 10) for i in range(12)] + [Resolved(10, SourcePosition("k", 0, 12))])
    stats = ap.apply(gate.release())
    writes = [w for e, w in sink.log if e == "write"]
    assert writes[-1] == ([], [0, 1, 2, 3, 4, 5, 6, 8, 9, 10, 11])  # everything but key 7, in one transaction
    assert held(ap) == [("[7]", "refused", "held", 10)] and stats.quarantined_rows == 1
    assert sink.log[-1] == ("save", 10) and gate.applied_ts == 10
    sink.refuse_key = None  # the target would take it now: it is still held, and so is the next change of 7
    gate.add([row(11, 13, 7, 71), row(11, 14, 8, 81), Resolved(11, SourcePosition("k", 0, 15))])
    ap.apply(gate.release())
    assert [w for e, w in sink.log if e == "write"][-1] == ([], [8])
    assert held(ap) == [("[7]", "refused", "held", 10), ("[7]", "blocked", "held", 11)]
    with ap.engine.connect() as c:
        assert ap.rows_quarantine.counts(c) == (2, 1)  # held changes, blocked keys (applier status)
    ap2, gate2 = setup(FakeSink(), on_apply_error="stop")  # a new run (any policy) reloads the blocked keys
    ap2.engine, ap2.rows_quarantine = ap.engine, ap.rows_quarantine
    gate2.add([row(12, 16, 7, 72), Resolved(12, SourcePosition("k", 0, 17))])
    ap2.apply(gate2.release())
    assert held(ap)[-1] == ("[7]", "blocked", "held", 12) and not [e for e in ap2.sink.log if e[0] == "write"]


def test_under_skip_a_refused_row_is_recorded_and_later_changes_of_its_key_apply() -> None:
    sink = FakeSink(refuse_key=3)
    ap, gate = setup(sink, on_apply_error="skip")
    gate.add([row(10, i, i, i) for i in range(5)] + [Resolved(10, SourcePosition("k", 0, 5))])
    ap.apply(gate.release())
    assert held(ap) == [("[3]", "refused", "skipped", 10)]
    sink.refuse_key = None
    gate.add([row(11, 6, 3, 33), Resolved(11, SourcePosition("k", 0, 7))])
    ap.apply(gate.release())
    assert [w for e, w in sink.log if e == "write"][-1] == ([], [3])


def test_rows_that_fail_only_together_stop_the_run_even_under_quarantine() -> None:
    class Together(FakeSink):
        def write(self, conn, plan: BatchPlan) -> None:
            if len(plan.upserts) > 1:
                raise ValueError("deadlock between rows")
            super().write(conn, plan)

    sink = Together()
    ap, gate = setup(sink, on_apply_error="quarantine")
    gate.add([row(10, 0, 1, 1), row(10, 1, 2, 2), Resolved(10, SourcePosition("k", 0, 2))])
    with pytest.raises(ApplyError, match="no single row fails on its own"):
        ap.apply(gate.release())
    assert held(ap) == [] and gate.applied_ts == 0


def test_a_routes_own_policy_decides_for_its_tables() -> None:
    sink = FakeSink(refuse_key=2)
    ap, gate = setup(sink, on_apply_error="stop", apply_error_policy=lambda s, t: "quarantine" if t == "t" else None)
    gate.add([row(10, i, i, i) for i in range(4)] + [Resolved(10, SourcePosition("k", 0, 4))])
    ap.apply(gate.release())  # table t is quarantined by its route; with the global stop it would stop
    assert held(ap) == [("[2]", "refused", "held", 10)]
    ap2, gate2 = setup(FakeSink(refuse_key=2), on_apply_error="quarantine", apply_error_policy=lambda s, t: "stop")
    gate2.add([row(10, i, i, i) for i in range(4)] + [Resolved(10, SourcePosition("k", 0, 4))])
    with pytest.raises(ApplyError, match="The refused row: id=2"):
        ap2.apply(gate2.release())


def test_a_quarantine_the_target_cannot_store_stops_the_run_and_loses_nothing() -> None:
    sink = FakeSink(refuse_key=2)
    ap, gate = setup(sink, on_apply_error="quarantine")

    def full(*args, **kwargs) -> None:
        raise OSError("no space left on device")

    ap.rows_quarantine.hold = full  # type: ignore[method-assign]
    gate.add([row(10, i, i, i) for i in range(4)] + [Resolved(10, SourcePosition("k", 0, 4))])
    with pytest.raises(OSError, match="no space"):
        ap.apply(gate.release())
    assert not [e for e in sink.log if e[0] == "save"] and gate.applied_ts == 0  # a rerun applies it all again
    assert held(ap) == []


def test_an_undecodable_message_of_a_table_holds_every_later_change_of_that_table() -> None:
    sink = FakeSink()
    ap, gate = setup(sink, on_apply_error="quarantine")
    bad = KafkaMessage("k", 0, 3, b"key", b"garbage")
    gate.add([row(10, 0, 1, 1), Resolved(10, SourcePosition("k", 0, 1))])
    ap.apply(gate.release(), undecodable=[UndecodableMessage(bad, "cannot decode", ("s", "t"))])
    # released with it but read before it in its partition: older than it, so it goes on
    assert [w for e, w in sink.log if e == "write"] == [([], [1])]
    gate.add([row(11, 4, 2, 2), RowChange("s", "other", 11, Op.INSERT, None, {"id": 9, "v": 9}, COLS,
                                          SourcePosition("k", 0, 5)), Resolved(11, SourcePosition("k", 0, 6))])
    ap.apply(gate.release())
    assert [w for e, w in sink.log if e == "write"] == [([], [1]), ([], [9])]  # then only the other table
    assert [(k, kind) for k, kind, _, _ in held(ap)] == [("*", "undecodable"), ("[2]", "blocked")]


def other_row(ts: int, part: int, off: int, key: int) -> RowChange:
    return RowChange("s", "other", ts, Op.INSERT, None, {"id": key, "v": key}, COLS, SourcePosition("k", part, off))


def test_an_undecodable_message_whose_table_cannot_be_read_holds_the_rest_of_its_partition() -> None:
    sink = FakeSink()
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    gate = Gate(partitions=[("k", 0), ("k", 1)], applied_ts=0, partition_resolved={})
    ap = Applier(engine, FakeDialect(sink), lambda s, t: ("main", t), FakeStore(sink.log))
    bad = KafkaMessage("k", 0, 3, None, b"\xff")
    ap.apply(gate.release(), undecodable=[UndecodableMessage(bad, "not JSON", None)])
    # before the message in its partition, or in another partition: applied; after it in its partition: held,
    # whatever the table
    gate.add([row(10, 2, 1, 1), row(11, 4, 2, 2), other_row(11, 0, 6, 8), other_row(12, 1, 0, 9),
              Resolved(12, SourcePosition("k", 0, 7)), Resolved(12, SourcePosition("k", 1, 1))])
    ap.apply(gate.release())
    assert sorted(w for e, w in sink.log if e == "write") == [([], [1]), ([], [9])]
    with engine.connect() as c:
        rows = ap.rows_quarantine.find(c)
    assert [(h.schema, h.table, h.row_key, h.kind, h.position.offset) for h in rows] == [
        ("", "", "*", "undecodable", 3), ("s", "t", "[2]", "blocked", 4), ("s", "other", "[8]", "blocked", 6)]
    assert "whose table cannot be read" in rows[1].reason and "offset=3" in rows[1].reason
    # a later run loads the block from the target
    ap2 = Applier(engine, FakeDialect(sink), lambda s, t: ("main", t), FakeStore(sink.log))
    gate.add([row(13, 8, 5, 5), Resolved(13, SourcePosition("k", 0, 9)), Resolved(13, SourcePosition("k", 1, 2))])
    ap2.apply(gate.release())
    assert ([], [5]) not in [w for e, w in sink.log if e == "write"]


def test_a_message_read_again_after_a_restart_is_recorded_once_and_a_skipped_one_blocks_nothing() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    bad = KafkaMessage("k", 0, 3, None, b"\xff")
    for _ in range(2):  # a rerun reads it again
        ap.apply(gate.release(), undecodable=[UndecodableMessage(bad, "not JSON", ("s", "t"), SKIPPED)])
    gate.add([row(10, 4, 1, 1), Resolved(10, SourcePosition("k", 0, 5))])
    ap.apply(gate.release())
    assert [w for e, w in sink.log if e == "write"] == [([], [1])]
    assert held(ap) == [("*", "undecodable", "skipped", 0)]
    ap2, _ = setup(sink)
    held_bad = UndecodableMessage(bad, "not JSON", ("s", "t"))
    ap2.apply(Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={}).release(), undecodable=[held_bad])
    ap2.apply(Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={}).release(), undecodable=[held_bad])
    assert held(ap2) == [("*", "undecodable", "held", 0)]


@pytest.mark.parametrize("query", ["TRUNCATE TABLE t", "ALTER TABLE t DROP COLUMN v", "DROP TABLE t"])
def test_a_ddl_of_a_table_with_held_changes_waits_for_them(query: str) -> None:
    sink = FakeSink(refuse_key=7)
    ap, gate = setup(sink, on_apply_error="quarantine")
    gate.add([row(10, 0, 7, 7), row(10, 1, 8, 8), Resolved(10, SourcePosition("k", 0, 2))])
    ap.apply(gate.release())
    assert held(ap) == [("[7]", "refused", "held", 10)]
    with pytest.raises(ApplyError, match=r"was not run \(.*\): upstream table `?s`?\.`?t`? has quarantined row changes"):
        release_ddl(ap, gate, ddl(11, 3, query), 11)
    assert ("exec", query) not in sink.log and not [e for e in sink.log if e[0] == "exec"]


def test_a_ddl_waits_for_a_partition_block() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    ap.apply(gate.release(), undecodable=[UndecodableMessage(KafkaMessage("k", 0, 0, None, b"?"), "bad", None)])
    with pytest.raises(ApplyError, match="offset=0 is held and its table cannot be read"):
        release_ddl(ap, gate, ddl(11, 3, "TRUNCATE TABLE t"), 11)


def decode_policy_processor(on_decode_error: str, rules: dict[str, str]):
    """A BatchProcessor on SQLite with the canal-json decoder: routes keep every table but s.ignored, and
    ``rules`` gives a [[route]] rule's on_decode_error per table name."""
    from applier.codecs import get_decoder
    from applier.processor import BatchProcessor
    from applier.progress import ProgressStore

    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    store = ProgressStore("p", "canal-json")
    store.claim(engine)
    with engine.connect() as c:
        state = store.load(c)
    return BatchProcessor(
        engine=engine, decoder=get_decoder("canal-json"), store=store, state=state, partitions=[("k", 0)],
        route=lambda s, t: None if t == "ignored" else ("main", t), on_decode_error=on_decode_error,
        decode_error_policy=lambda s, t: rules.get(t), stops_at_decode_error=False, dialect=FakeDialect(FakeSink()))


def bad_of(table: str | None, offset: int) -> KafkaMessage:
    value = b"\xff" if table is None else (b'{"database":"s","table":"%s","type":"INSERT","data":5}' % table.encode())
    return KafkaMessage("k", 0, offset, None, value)


def quarantine_rows(proc) -> list[tuple[str, str, str]]:
    with proc.applier.engine.connect() as c:
        return [(f"{h.schema}.{h.table}", h.state, h.kind) for h in proc.applier.rows_quarantine.find(
            c, states=("held", "skipped"))]


def test_the_decode_error_policy_of_a_messages_table_decides_and_the_global_one_when_it_cannot_be_read() -> None:
    from applier.events import DecodeError

    proc = decode_policy_processor("stop", {"t": "quarantine", "audit": "skip"})
    rep = proc.process([bad_of("t", 0), bad_of("audit", 1), bad_of("ignored", 2)])
    assert rep.quarantined == 3
    assert quarantine_rows(proc) == [("s.t", "held", "undecodable"), ("s.audit", "skipped", "undecodable"),
                                     ("s.ignored", "skipped", "undecodable")]
    with pytest.raises(DecodeError, match="offset=3"):  # no table to look up: [pipeline] on_decode_error = stop
        proc.process([bad_of(None, 3)])
    with pytest.raises(DecodeError, match="offset=4"):  # a table whose rule says nothing: the global stop
        proc.process([bad_of("u", 4)])


def test_decode_error_skip_records_the_message_and_blocks_nothing() -> None:
    proc = decode_policy_processor("skip", {})
    proc.process([bad_of(None, 0), bad_of("t", 1)])
    assert quarantine_rows(proc) == [(".", "skipped", "undecodable"), ("s.t", "skipped", "undecodable")]
    with proc.applier.engine.connect() as c:
        assert proc.applier.rows_quarantine.blocked(c) == set()
        assert proc.applier.rows_quarantine.blocks(c) == {}


def test_a_table_block_holds_the_tables_changes_from_other_partitions_whatever_their_offset() -> None:
    sink = FakeSink()
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    gate = Gate(partitions=[("k", 0), ("k", 1)], applied_ts=0, partition_resolved={})
    ap = Applier(engine, FakeDialect(sink), lambda s, t: ("main", t), FakeStore(sink.log))
    ap.apply(gate.release(), undecodable=[UndecodableMessage(KafkaMessage("k", 0, 5, None, b"?"), "bad", ("s", "t"))])
    other_part = RowChange("s", "t", 10, Op.INSERT, None, {"id": 4, "v": 4}, COLS, SourcePosition("k", 1, 0))
    gate.add([other_part, row(10, 2, 3, 3), Resolved(10, SourcePosition("k", 0, 3)), Resolved(10, SourcePosition("k", 1, 1))])
    ap.apply(gate.release())
    assert [w for e, w in sink.log if e == "write"] == [([], [3])]  # before it in its own partition: goes on
    assert [(k, kind) for k, kind, _, _ in held(ap)] == [("*", "undecodable"), ("[4]", "blocked")]
    gate.add([DDL("s", "t", 11, "ALTER TABLE t DROP COLUMN v", SourcePosition("k", 0, 3)),
              Resolved(11, SourcePosition("k", 0, 4)), Resolved(11, SourcePosition("k", 1, 2))])
    with pytest.raises(ApplyError, match="has quarantined row changes older than it"):  # [4] is held now
        ap.apply(gate.release())


def test_a_ddl_read_before_an_undecodable_message_in_its_partition_runs_and_one_after_it_waits() -> None:
    sink = FakeSink()
    ap, gate = setup(sink)
    release_ddl(ap, gate, ddl(10, 1, "CREATE TABLE t (id INT PRIMARY KEY)"), 10)
    ap.apply(gate.release(), undecodable=[UndecodableMessage(KafkaMessage("k", 0, 5, None, b"?"), "bad", ("s", "t"))])
    release_ddl(ap, gate, ddl(11, 3, "ALTER TABLE t ADD COLUMN w INT NULL"), 11)
    assert sink.log.count(("ddl", "done")) == 2
    release_ddl(ap, gate, ddl(12, 6, "ALTER TABLE t ADD COLUMN x INT NULL"), 12)  # additive: runs after it too
    assert sink.log.count(("ddl", "done")) == 3
    with pytest.raises(ApplyError, match="blocked by the undecodable message at topic=k partition=0 offset=5"):
        release_ddl(ap, gate, DDL("s", "t", 13, "TRUNCATE TABLE t", SourcePosition("k", 0, 7)), 13)


def test_a_table_name_no_tidb_table_could_have_reads_as_unknown_and_blocks_the_partition() -> None:
    proc = decode_policy_processor("quarantine", {})
    proc.process([bad_of("x" * 65, 0), bad_of("a\x00b", 1)])
    assert quarantine_rows(proc) == [(".", "held", "undecodable"), (".", "held", "undecodable")]


def test_quarantine_log_lines_carry_the_kafka_position_for_json_logs(caplog) -> None:
    """``--log-format json`` (applier/logs.py) gives topic/partition/offset fields to the lines about a refused row
    and an undecodable message, and the batch and pipeline they were logged in; the text stays as it was."""
    import json
    import logging

    from applier import logs

    ap, gate = setup(FakeSink(refuse_key=7), on_apply_error="quarantine")
    gate.add([row(10, i, i, i * 10) for i in range(12)] + [Resolved(10, SourcePosition("k", 0, 12))])
    proc = decode_policy_processor("quarantine", {})
    caplog.handler.addFilter(logs.ContextFilter())  # stamps the context when logged (formatted after the batch)
    with caplog.at_level(logging.WARNING, logger="applier"):
        with logs.batch_context(4, pipeline="shop"):
            ap.apply(gate.release())
            proc.process([bad_of("t", 3), bad_of("ignored", 5)])
    got = {r.name + " " + r.getMessage()[:11]: json.loads(logs.JsonFormatter().format(r)) for r in caplog.records
           if r.name in ("applier.setaside", "applier.processor")}
    assert {k: (d["topic"], d["partition"], d["offset"], d["batch"], d["pipeline"]) for k, d in got.items()} == {
        "applier.setaside quarantined": ("k", 0, 7, 4, "shop"),
        "applier.processor quarantined": ("k", 0, 3, 4, "shop"),
        "applier.processor skipped can": ("k", 0, 5, 4, "shop"),
    }
    assert "topic=k partition=0 offset=7" in got["applier.setaside quarantined"]["message"]
