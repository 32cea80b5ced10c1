"""Tables without a key (no primary key, no unique key over NOT NULL columns): planning, the writers' order and
one-row rule, the MySQL/PostgreSQL statements, and quarantine holding the whole table. No database server: the
writer is the real :meth:`Sink.write_keyless` over a table held in a Python list, and the applier runs on an
in-memory SQLite database as in tests/unit/test_apply_logic.py. The same rules against real MariaDB and
PostgreSQL, through Kafka and Spark: tests/e2e/test_keyless.py."""

from __future__ import annotations

import datetime as dt
import struct
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.dialects import mysql as mysql_dialect, postgresql

from applier.apply import Applier
from applier.events import Column, Op, Resolved, RowChange, SourcePosition
from applier.gate import Gate
from applier.progress import metadata
from applier.quarantine import WHOLE_TABLE, keys_of
from applier.sinks import mysql as M
from applier.sinks import postgres as PG
from applier.sinks.base import Sink
from applier.sinks.plan import BatchPlan, plan_batch
from applier.sinks.table import ApplyError, TableMeta, build_meta
from tests.unit.apply_fakes import FakeDialect, FakeStore

COLS = (Column("v", "int"), Column("w", "varchar"))  # what the stream says: no key flags


def meta(generated: tuple[str, ...] = ()) -> TableMeta:
    cols = [("v", True, False), ("w", True, False)] + [(g, True, True) for g in generated]
    return build_meta("s", "t", cols, (), [])


def ch(op: Op, before=None, after=None, off: int = 0, ts: int = 10, table: str = "t") -> RowChange:
    return RowChange("s", table, ts, op, before, after, COLS, SourcePosition("k", 0, off))


def ins(v, w="a", off=0, **kw) -> RowChange:
    return ch(Op.INSERT, after={"v": v, "w": w}, off=off, **kw)


def upd(old, new, off=0, **kw) -> RowChange:
    return ch(Op.UPDATE, before={"v": old[0], "w": old[1]}, after={"v": new[0], "w": new[1]}, off=off, **kw)


def dele(v, w="a", off=0, **kw) -> RowChange:
    return ch(Op.DELETE, before={"v": v, "w": w}, off=off, **kw)


# ---- planning ---------------------------------------------------------------------------------------------------

def test_changes_are_kept_in_order_with_duplicates_and_nothing_collapses() -> None:
    changes = [ins(1), ins(1, off=1), upd((1, "a"), (2, "a"), off=2), dele(1, off=3), ins(1, off=4)]
    p = plan_batch(meta(), changes)
    assert p.deletes == [] and p.upserts == [] and p.unique_clears == {} and p.changes == 5
    assert [(o.op, o.before, o.after, o.position.offset) for o in p.keyless] == [
        (Op.INSERT, None, {"v": 1, "w": "a"}, 0), (Op.INSERT, None, {"v": 1, "w": "a"}, 1),
        (Op.UPDATE, {"v": 1, "w": "a"}, {"v": 2, "w": "a"}, 2), (Op.DELETE, {"v": 1, "w": "a"}, None, 3),
        (Op.INSERT, None, {"v": 1, "w": "a"}, 4)]
    # writers adapt the images in place: they are copies, never the events' own dicts
    images = [(o.after, c.after) for o, c in zip(p.keyless, changes)] + \
        [(o.before, c.before) for o, c in zip(p.keyless, changes)]
    assert all(mine is not theirs for mine, theirs in images if mine is not None)


def test_the_old_row_is_every_writable_column_and_generated_target_columns_are_left_out() -> None:
    p = plan_batch(meta(generated=("g",)), [ch(Op.DELETE, before={"w": "a", "g": 5, "v": 1})])
    assert p.keyless[0].before == {"v": 1, "w": "a"} and list(p.keyless[0].before) == ["v", "w"]


@pytest.mark.parametrize("op", [Op.DELETE, Op.UPDATE])
def test_an_old_row_lacking_a_target_column_is_refused_never_matched_on_fewer(op: Op) -> None:
    """Protocols that send only the key columns of a delete (delete-only-output-handle-key-columns, Avro
    tombstones, handle-key-only large messages) give too little to find a row of a table without a key: matching
    the columns present could delete a row upstream kept."""
    bad = ch(op, before={"v": 1}, after={"v": 2, "w": "b"} if op is Op.UPDATE else None, off=7)
    with pytest.raises(ApplyError) as err:
        plan_batch(meta(), [ins(1, off=6), bad])
    msg = str(err.value)
    assert "s.t" in msg and "topic=k partition=0 offset=7" in msg and "'w'" in msg, msg
    assert "never by fewer columns" in msg and "primary key" in msg and "delete-only-output-handle-key-columns" in msg


@pytest.mark.parametrize("op", [Op.DELETE, Op.UPDATE])
def test_an_update_or_delete_without_its_old_row_is_refused(op: Op) -> None:
    with pytest.raises(ApplyError, match=r"s\.t .*offset=3 carries no old row.*old value"):
        plan_batch(meta(), [ch(op, before=None, after={"v": 1, "w": "a"} if op is Op.UPDATE else None, off=3)])


def test_images_with_a_column_the_target_lacks_or_without_a_new_row_are_refused() -> None:
    with pytest.raises(ApplyError, match=r"'x'.*apply the upstream DDL"):
        plan_batch(meta(), [ch(Op.DELETE, before={"v": 1, "w": "a", "x": 0})])
    with pytest.raises(ApplyError, match=r"'x'.*apply the upstream DDL"):
        plan_batch(meta(), [ch(Op.INSERT, after={"v": 1, "w": "a", "x": 0})])
    with pytest.raises(ApplyError, match="carries no row image"):
        plan_batch(meta(), [ch(Op.INSERT, after=None)])


# ---- the writer: order, batching, exactly one row -------------------------------------------------------------

class ListSink(Sink):
    """A target whose every table is a list of rows: the real :meth:`Sink.write_keyless`, with the inserts and the
    two one-row statements done in Python. ``refuse`` is a value of ``v`` the "server" refuses in a new row."""

    def __init__(self, batch_rows: int = 3, refuse: Any = None, **kw: Any) -> None:
        super().__init__(batch_rows, **kw)
        self.tables: dict[str, list[dict[str, Any]]] = {}
        self.calls: list[tuple[Any, ...]] = []
        self.refuse = refuse
        self.log: list[tuple[str, object]] = []  # what FakeDialect/FakeStore expect

    def reflect(self, conn, schema: str, name: str) -> TableMeta:
        return build_meta(schema, name, [("v", True, False), ("w", True, False)], (), [])

    def _check(self, row: dict[str, Any]) -> None:
        if self.refuse is not None and row.get("v") == self.refuse:
            raise ValueError(f"Out of range value for column 'v': {row['v']}")

    def bulk_insert(self, conn, meta: TableMeta, cols, rows) -> None:
        self.calls.append(("insert", meta.name, [r[cols.index("v")] for r in rows]))
        for r in rows:
            self._check(dict(zip(cols, r)))
            self.tables.setdefault(meta.name, []).append(dict(zip(cols, r)))

    def keyless_update(self, conn, meta: TableMeta, before, after) -> int:
        self.calls.append(("update", meta.name, dict(before)))
        rows = self.tables.setdefault(meta.name, [])
        for i, r in enumerate(rows):
            if r == before:
                self._check(after)
                rows[i] = {**r, **after}
                return 1
        return 0

    def keyless_delete(self, conn, meta: TableMeta, before) -> int:
        self.calls.append(("delete", meta.name, dict(before)))
        rows = self.tables.setdefault(meta.name, [])
        if before in rows:
            rows.remove(before)
            return 1
        return 0

    def savepoint_state(self, conn) -> Any:
        return {t: [dict(r) for r in rows] for t, rows in self.tables.items()}

    def rolled_back_to(self, conn, state: Any) -> None:
        self.tables = {t: [dict(r) for r in rows] for t, rows in state.items()}

    def upsert_rows(self, conn, meta, cols, rows) -> None:  # pragma: no cover - keyless tables only
        raise AssertionError("a keyless table was upserted")

    def delete_rows(self, conn, meta, keys, cols=None) -> None:  # pragma: no cover
        raise AssertionError("a keyless table was deleted from by key")

    def own_schema(self, conn) -> str:
        return "applier_home"

    def schema_exists(self, conn, schema: str) -> bool:
        return True


def rows_of(sink: ListSink, table: str = "t") -> list[tuple[Any, Any]]:
    return sorted((r["v"], r["w"]) for r in sink.tables.get(table, []))


def test_inserts_are_batched_in_runs_and_updates_and_deletes_keep_their_place() -> None:
    """Consecutive inserts go in one statement (at most batch_rows, one column set each); an update or delete
    between them runs where it stands, so it finds the rows inserted before it and not those inserted after."""
    sink = ListSink(batch_rows=3)
    changes = [ins(1), ins(1), ins(2), ins(3), upd((1, "a"), (5, "a")), ins(1), dele(2),
               ch(Op.INSERT, after={"v": 9}), ins(4)]
    sink.write(None, plan_batch(meta(), changes))
    assert sink.calls == [("insert", "t", [1, 1, 2]), ("insert", "t", [3]), ("update", "t", {"v": 1, "w": "a"}),
                          ("insert", "t", [1]), ("delete", "t", {"v": 2, "w": "a"}), ("insert", "t", [9]),
                          ("insert", "t", [4])]
    assert sorted(sink.tables["t"], key=lambda r: (r["v"], r.get("w") or "")) == [
        {"v": 1, "w": "a"}, {"v": 1, "w": "a"}, {"v": 3, "w": "a"}, {"v": 4, "w": "a"}, {"v": 5, "w": "a"}, {"v": 9}]


@pytest.mark.parametrize("bad", [upd((8, "a"), (9, "a"), off=5), dele(8, off=5)])
def test_an_update_or_delete_that_finds_no_row_stops_loudly_naming_table_position_and_row(bad: RowChange) -> None:
    sink = ListSink()
    with pytest.raises(ApplyError) as err:
        sink.write(None, plan_batch(meta(), [ins(1, off=4), bad]))
    msg = str(err.value)
    assert "s.t" in msg and "topic=k partition=0 offset=5" in msg and "v=8, w='a'" in msg, msg
    assert "found no row" in msg and "differs from upstream" in msg and "applier load" in msg and "verify" in msg


def test_the_one_row_rule_counts_more_than_one_as_a_difference_too() -> None:
    class Greedy(ListSink):
        def keyless_delete(self, conn, meta, before) -> int:
            return 2

    with pytest.raises(ApplyError, match="found 2 rows .* differs from upstream"):
        Greedy().write(None, plan_batch(meta(), [dele(1)]))


def test_old_rows_are_adapted_like_new_rows_so_they_compare_in_the_stored_form() -> None:
    """A TIME value is written as MySQL's text ('25:00:00'); the old row must be compared in that same form."""
    def conv(column_type):
        return (lambda v: f"T{v.total_seconds():.0f}" if isinstance(v, dt.timedelta) else v) \
            if column_type == "time" else None

    sink = ListSink(convert=conv)
    m = meta()
    m.types = {"w": "time"}
    hour = dt.timedelta(hours=25)
    sink.tables["t"] = [{"v": 1, "w": "T90000"}]
    sink.write(None, plan_batch(m, [ch(Op.UPDATE, before={"v": 1, "w": hour}, after={"v": 2, "w": hour}),
                                    ch(Op.DELETE, before={"v": 2, "w": hour}, off=1)]))
    assert sink.calls[0] == ("update", "t", {"v": 1, "w": "T90000"}) and sink.tables["t"] == []


# ---- MySQL / MariaDB statements ---------------------------------------------------------------------------------

class RecordingConn:
    """What MySQLSink's keyless statements need of a connection: the dialect (for quoting) and exec_driver_sql."""

    def __init__(self, dialect, rowcount: int = 1) -> None:
        self.dialect = dialect
        self.rowcount = rowcount
        self.executed: list[tuple[str, Any]] = []

    def exec_driver_sql(self, sql: str, params: Any = None):
        self.executed.append((sql, params))
        return SimpleNamespace(rowcount=self.rowcount)


def mysql_meta() -> TableMeta:
    m = build_meta("s", "t", [("n", True, False), ("a`b%", True, False), ("j", True, False), ("f", True, False),
                              ("c", True, False)], (), [])
    m.types = {"n": "int(11)", "a`b%": "varchar(10)", "j": "json", "f": "float", "c": "char(3)"}
    return m


def test_mysql_statements_match_null_safe_one_row_with_quoted_names_and_bound_values() -> None:
    sink = M.MySQLSink()
    conn = RecordingConn(mysql_dialect.pymysql.dialect())
    before = {"n": None, "a`b%": "x", "j": '{"k": 1}', "f": 0.1, "c": "ab  "}
    assert sink.keyless_delete(conn, mysql_meta(), dict(before)) == 1
    assert sink.keyless_update(conn, mysql_meta(), dict(before), {"n": 5, "a`b%": "y"}) == 1
    (dsql, dparams), (usql, uparams) = conn.executed
    where = ("n <=> %s AND CAST(CONVERT(`a``b%%` USING utf8mb4) AS BINARY) <=> CAST(CONVERT(%s USING utf8mb4) AS "
             "BINARY) AND j <=> CAST(%s AS JSON) AND f <=> %s AND CAST(CONVERT(c USING utf8mb4) AS BINARY) <=> "
             "CAST(CONVERT(%s USING utf8mb4) AS BINARY)")  # the preparer quotes what needs it (% doubled for PyMySQL)
    assert dsql == f"DELETE FROM s.t WHERE {where} LIMIT 1"
    assert usql == f"UPDATE s.t SET n = %s, `a``b%%` = %s WHERE {where} LIMIT 1"
    f32 = struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert f32 != 0.1
    assert dparams == (None, "x", '{"k": 1}', f32, "ab") and uparams == (5, "y") + dparams
    assert not any(v in dsql or v in usql for v in ("'x'", "'ab", '{"k": 1}', "0.1"))  # values are bound, not text


def test_mysql_compares_text_byte_for_byte_json_as_json_and_float_at_single_precision() -> None:
    """Case- or accent-insensitive and PAD SPACE collations take 'a' = 'A' = 'a ': a table without a key may hold
    such rows side by side, so text is compared as utf8mb4 bytes. A FLOAT column holding 0.1 holds the nearest
    single-precision value, which the double 0.1 is not."""
    assert M.keyless_comparison("`x`", "varchar(5)").startswith("CAST(CONVERT(`x` USING utf8mb4) AS BINARY)")
    assert M.keyless_comparison("`x`", "longtext") == M.keyless_comparison("`x`", "text")  # MariaDB's JSON
    assert M.keyless_comparison("`x`", "json") == "`x` <=> CAST(%s AS JSON)"
    for t in ("int(11)", "enum('a','b')", "decimal(10,2)", "double", "varbinary(4)", "datetime(6)", "time"):
        assert M.keyless_comparison("`x`", t) == "`x` <=> %s", t
    single = M.keyless_match_value("float")
    assert single is M.keyless_match_value("float(7,4) unsigned")
    assert single(0.1) == struct.unpack("<f", struct.pack("<f", 0.1))[0] and single(1e300) == 1e300
    assert single(None) is None and single(3) == 3
    assert M.keyless_match_value("double") is None and M.keyless_match_value("varchar(3)") is None
    assert M.keyless_match_value("char(3)")("a  ") == "a"


def test_mysql_reports_the_rows_the_statement_found() -> None:
    with pytest.raises(ApplyError, match="found no row"):
        M.MySQLSink().write(RecordingConn(mysql_dialect.pymysql.dialect(), rowcount=0),
                            plan_batch(mysql_meta(), [ch(Op.DELETE, before={"n": 1, "a`b%": "x", "j": None,
                                                                            "f": None, "c": None})]))


# ---- PostgreSQL statements ----------------------------------------------------------------------------------------

def pg_meta(**types: str) -> TableMeta:
    m = build_meta("s", "t", [(c, True, False) for c in types], (), [])
    m.types = dict(types)
    return m


def compiled(stmt) -> str:
    return str(stmt.compile(dialect=postgresql.psycopg.dialect()))


def test_postgres_finds_one_row_by_ctid_with_real_cast_and_json_compared_as_jsonb() -> None:
    m = pg_meta(n="integer", f="real", j="json", b="jsonb", **{'we"ird%': "text"})
    cols = tuple(m.columns)
    d = compiled(PG.keyless_delete_stmt(m, cols))
    u = compiled(PG.keyless_update_stmt(m, ("n", 'we"ird%'), cols))
    sub = ("(SELECT applier_row.ctid \nFROM s.t AS applier_row \nWHERE applier_row.n IS NOT DISTINCT FROM %(b0)s "
           "AND applier_row.f IS NOT DISTINCT FROM CAST(%(b1)s AS REAL) AND CAST(applier_row.j AS JSONB) IS NOT "
           "DISTINCT FROM CAST(%(b2)s AS JSONB) AND applier_row.b IS NOT DISTINCT FROM %(b3)s AND "
           'applier_row."we""ird%%" IS NOT DISTINCT FROM %(b4)s \n LIMIT %(param_1)s::INTEGER)')
    assert d == f"DELETE FROM s.t WHERE s.t.ctid = {sub}"
    assert u == f'UPDATE s.t SET n=%(a0)s, "we""ird%%"=%(a1)s WHERE s.t.ctid = {sub}'
    assert PG.keyless_binds({"n": 1, "f": 0.5}, {"n": 2}) == {"b0": 1, "b1": 0.5, "a0": 2}


@pytest.mark.parametrize("typ", ["xml", "point", "polygon", "json[]"])
def test_postgres_refuses_a_type_without_equality_naming_table_and_column(typ: str) -> None:
    with pytest.raises(ApplyError, match=rf"column 'g' of target table s\.t has type {typ.replace('[', '.')}.*primary key"):
        PG.keyless_delete_stmt(pg_meta(n="integer", g=typ), ("n", "g"))


# ---- quarantine: a held change of a keyless table holds the whole table --------------------------------------------

def test_keys_of_a_keyless_change_is_the_whole_table() -> None:
    assert keys_of(ins(1), ()) == [WHOLE_TABLE] and keys_of(dele(1), ()) == [WHOLE_TABLE]
    assert keys_of(RowChange("s", "t", 1, Op.INSERT, None, {"id": 1}, (), SourcePosition("k", 0, 0)), ("id",)) \
        == ["[1]"]


def setup(sink: ListSink, **kw) -> tuple[Applier, Gate]:
    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    gate = Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={})
    return Applier(engine, FakeDialect(sink), lambda s, t: ("main", t), FakeStore(sink.log), **kw), gate


def held(ap: Applier) -> list[tuple[str, str, str, str, int]]:
    with ap.engine.connect() as c:
        return [(h.table, h.row_key, h.kind, h.state, h.position.offset)
                for h in ap.rows_quarantine.find(c, states=("held", "skipped"))]


def res(ts: int, off: int) -> Resolved:
    return Resolved(ts, SourcePosition("k", 0, off))


def test_under_quarantine_a_refused_change_holds_every_later_change_of_its_keyless_table() -> None:
    """The changes before the refused one apply (they do not depend on it); it and every later change of the table
    are held under '*', in this batch and in later ones, also after a restart (the blocked keys are read back from
    the target, '*' included); another table goes on."""
    sink = ListSink(refuse=7)
    ap, gate = setup(sink, on_apply_error="quarantine")
    gate.add([ins(1, off=0), ins(2, off=1), ins(1, off=2), ins(7, off=3), ins(3, off=4), dele(1, off=5),
              ins(5, off=6, table="other"), res(10, 7)])
    stats = ap.apply(gate.release())
    assert rows_of(sink) == [(1, "a"), (1, "a"), (2, "a")] and rows_of(sink, "other") == [(5, "a")]
    assert held(ap) == [("t", "*", "refused", "held", 3), ("t", "*", "blocked", "held", 4),
                        ("t", "*", "blocked", "held", 5)]
    assert stats.quarantined_rows == 3 and gate.applied_ts == 10
    with ap.engine.connect() as c:
        assert "without a key" in ap.rows_quarantine.find(c)[0].reason
        assert "Out of range" in ap.rows_quarantine.find(c)[0].reason

    sink.refuse = None  # the target would take them now: they stay held, and so does the table's next change
    gate.add([ins(4, off=8, ts=11), ins(6, off=9, ts=11, table="other"), res(11, 10)])
    ap.apply(gate.release())
    assert rows_of(sink) == [(1, "a"), (1, "a"), (2, "a")] and rows_of(sink, "other") == [(5, "a"), (6, "a")]
    assert held(ap)[-1] == ("t", "*", "blocked", "held", 8)

    ap2, gate2 = setup(sink, on_apply_error="stop")  # a new run, any policy: loads '*' from the target
    ap2.engine, ap2.rows_quarantine = ap.engine, ap.rows_quarantine
    gate2.add([dele(2, off=11, ts=12), res(12, 12)])
    ap2.apply(gate2.release())
    assert rows_of(sink) == [(1, "a"), (1, "a"), (2, "a")]
    assert held(ap)[-1] == ("t", "*", "blocked", "held", 11)


def test_an_update_that_finds_no_row_is_held_under_quarantine_with_the_rest_of_its_table() -> None:
    sink = ListSink()
    ap, gate = setup(sink, on_apply_error="quarantine")
    gate.add([ins(1, off=0), upd((9, "a"), (10, "a"), off=1), ins(2, off=2), res(10, 3)])
    ap.apply(gate.release())
    assert rows_of(sink) == [(1, "a")]
    assert [(k, kind, off) for _, k, kind, _, off in held(ap)] == [("*", "refused", 1), ("*", "blocked", 2)]
    with ap.engine.connect() as c:
        assert "differs from upstream" in ap.rows_quarantine.find(c)[0].reason


def test_under_skip_only_the_refused_keyless_change_is_recorded_and_the_rest_applies() -> None:
    sink = ListSink(refuse=7)
    ap, gate = setup(sink, on_apply_error="skip")
    gate.add([ins(1, off=0), ins(7, off=1), ins(2, off=2), dele(1, off=3), res(10, 4)])
    ap.apply(gate.release())
    assert rows_of(sink) == [(2, "a")]
    assert held(ap) == [("t", "*", "refused", "skipped", 1)]


def test_under_stop_a_keyless_write_that_finds_no_row_stops_with_its_position() -> None:
    sink = ListSink()
    ap, gate = setup(sink)
    gate.add([ins(1, off=0), dele(2, off=1), res(10, 2)])
    with pytest.raises(ApplyError, match=r"delete at topic=k partition=0 offset=1 found no row of target table "
                                         r"main\.t .*differs from upstream"):
        ap.apply(gate.release())
    assert gate.applied_ts == 0 and held(ap) == []


def test_a_whole_table_block_holds_a_table_that_has_a_key_now() -> None:
    """Changes held while the target had no key stay under '*' when the table gains one (an operator added a
    primary key): the block still holds every later change, not only those of some row key."""
    class Keyed(ListSink):
        def reflect(self, conn, schema, name):
            return build_meta(schema, name, [("v", False, False), ("w", True, False)], ("v",), [])

        def write(self, conn, plan: BatchPlan) -> None:
            self.calls.append(("write", [r["v"] for r in plan.upserts]))

    sink = Keyed()
    ap, gate = setup(sink, on_apply_error="quarantine")
    with ap.engine.begin() as c:
        ap.rows_quarantine.hold(c, ins(1, off=0), WHOLE_TABLE, kind="refused", reason="earlier, without a key")
    gate.add([ins(2, off=1), ins(3, off=2, table="other"), res(10, 3)])
    ap.apply(gate.release())
    assert sink.calls == [("write", [3])]
    assert [(t, k, kind) for t, k, kind, _, _ in held(ap)] == [("t", "*", "refused"), ("t", "[2]", "blocked")]


def test_a_keyless_plan_counts_its_rows_for_the_metrics() -> None:
    from applier.sinks.plan import BatchPlan, RowOp

    pos = SourcePosition("t", 0, 1)
    plan = BatchPlan(None, keyless=[RowOp(Op.INSERT, None, {"v": 1}, pos), RowOp(Op.UPDATE, {"v": 1}, {"v": 2}, pos),
                                    RowOp(Op.DELETE, {"v": 2}, None, pos)])  # type: ignore[arg-type]
    assert plan.written() == (2, 1)
    assert BatchPlan(None, deletes=[(1,)], upserts=[{"id": 2}, {"id": 3}]).written() == (2, 1)  # type: ignore[arg-type]
