"""In-memory fakes of the apply stage's collaborators (writer, dialect, progress store), shared by the tests of the
applier's transaction logic (tests/unit/test_apply_logic.py and the tests of features built on it)."""

from __future__ import annotations

from applier.dialect import MySQLDialect
from applier.sinks.plan import BatchPlan
from applier.sinks.table import ApplyError, build_meta
from applier.progress import PipelineState
from applier.timing import StageTimer


class FakeSink:
    """Records every planned batch it is asked to write; can be told to fail."""

    def __init__(self, fail: bool = False, refuse_key: int | None = None) -> None:
        self.fail = fail
        self.refuse_key = refuse_key  # a row with this id makes the whole write fail, as a server does
        self.log: list[tuple[str, object]] = []

    def begin(self, conn) -> None:
        self.log.append(("begin", None))

    def table(self, conn, schema: str, name: str):
        return build_meta(schema, name, [("id", False, False), ("v", True, False)], ("id",), [])

    def write(self, conn, plan: BatchPlan) -> None:
        if self.fail:
            raise ApplyError("the target refused the row")
        if any(r["id"] == self.refuse_key for r in plan.upserts):
            raise ValueError("Out of range value for column 'v' at row 2")
        self.log.append(("write", (sorted(k for k in plan.deletes), sorted(r["id"] for r in plan.upserts))))

    def reflect(self, conn, schema: str, name: str):
        cols = [(r[1], True, False) for r in conn.exec_driver_sql(f"PRAGMA table_info({name})")]
        return build_meta(schema, name, cols, (cols[0][0],), [])

    def savepoint_state(self, conn) -> None:
        return None

    def rolled_back_to(self, conn, state) -> None:
        pass

    def own_schema(self, conn) -> str:
        return "applier_home"

    def schema_exists(self, conn, schema: str) -> bool:
        return True

    def prepare_schema(self, conn, schema: str) -> None:
        pass

    def forget_tables(self, targets) -> None:
        self.log.append(("forget", targets))


class FakeDialect(MySQLDialect):
    """MySQL's DDL translation and replay rules, with SQLite's words for "already done" and a fake writer."""

    def __init__(self, sink: FakeSink, transactional: bool = False) -> None:
        self.sink = sink
        self.ddl_is_transactional = transactional  # type: ignore[misc]

    def writer(self, batch_rows: int = 5000, timer: StageTimer | None = None) -> FakeSink:  # type: ignore[override]
        return self.sink

    def is_replay_noop(self, exc: BaseException) -> bool:
        return "already exists" in str(exc) or "duplicate column" in str(exc)


class FakeStore:
    pipeline = "p"

    def __init__(self, log: list) -> None:
        self.log = log
        self.ddl: dict[str, str] = {}  # ddl key -> history state
        self.sources: list[tuple[str, str]] = []  # upstream tables with applied rows (applier_tables)

    def save(self, conn, *, applied_ts: int, checkpoints, table_progress, batches: int = 0) -> None:
        self.log.append(("save", applied_ts))

    def quarantine(self, conn, msg, reason) -> None:  # pragma: no cover - not used here
        self.log.append(("quarantine", reason))

    def ddl_state(self, conn, key: str) -> str | None:
        return self.ddl.get(key)

    def ddl_record(self, conn, ev, key: str, *, state: str, statements: list[str], detail: str = "") -> None:
        self.ddl[key] = state
        self.log.append(("ddl", state, detail[:40]) if detail else ("ddl", state))

    def created_schema(self, conn, schema: str) -> bool:
        return False

    def source_tables(self, conn) -> list[tuple[str, str]]:
        return list(self.sources)

    def schema_created(self, conn, schema: str) -> None:
        pass


# ---- a target table t (id -> v) and progress as the next run would load them (tests of the gate + apply) --------

class RowsSink:
    """The target table ``t`` (id -> v) as the applier writes it."""

    def __init__(self, rows: dict[int, int | None] | None = None) -> None:
        self.rows = dict(rows or {})
        self.written: list[int] = []  # ids upserted, in order

    def begin(self, conn) -> None:
        pass

    def table(self, conn, schema: str, name: str):
        return build_meta(schema, name, [("id", False, False), ("v", True, False)], ("id",), [])

    def reflect(self, conn, schema: str, name: str):  # pragma: no cover - for DDL only
        return self.table(conn, schema, name)

    def write(self, conn, plan: BatchPlan) -> None:
        for (k,) in plan.deletes:
            self.rows.pop(k, None)
        for r in plan.upserts:
            self.rows[r["id"]] = r["v"]
            self.written.append(r["id"])


class RowsDialect(MySQLDialect):
    def __init__(self, sink: RowsSink) -> None:
        self.sink = sink

    def writer(self, batch_rows: int = 5000, timer=None) -> RowsSink:  # type: ignore[override]
        return self.sink


class ProgressKept:
    """ProgressStore's writes as the next run would load them."""

    pipeline = "p"

    def __init__(self) -> None:
        self.saved: list[int] = []  # applied_ts of every save
        self.state = PipelineState()

    def save(self, conn, *, applied_ts: int, checkpoints, table_progress, batches: int = 0) -> None:
        self.saved.append(applied_ts)
        self.state = PipelineState(applied_ts, 0, dict(checkpoints), exists=True)
