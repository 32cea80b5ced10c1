"""The columnar-path benchmark's pure parts (applier.devtools.bench_columnar): arguments, figures and the report,
and the columnar pieces themselves, held to today's path on small inputs: a columnar step that is fast but wrong
would make the issue-25 projection worthless, so its checks must catch a wrong value or a wrong row."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal

import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from applier.devtools import bench_columnar as C
from applier.devtools.bench_stream import BENCH_COLUMN_NAMES, BENCH_TYPES, bench_table_ddl, generate_bench
from applier.events import Column, Op, Resolved, RowChange, SourcePosition


# ---- arguments, figures, report ------------------------------------------------------------------------------

def test_defaults_run_every_part() -> None:
    a = C.parse_args([])
    assert (a.only, a.rows, a.repeat, a.csv_null, a.json) == (list(C.PARTS), 100_000, 3, "NULL", False)


def test_arguments_take_counts_and_a_subset() -> None:
    a = C.parse_args(["--rows", "20k", "--repeat", "1", "--only", "pg, decode", "--csv-null", "", "--json"])
    assert (a.rows, a.repeat, a.only, a.csv_null, a.json) == (20_000, 1, ["pg", "decode"], "", True)


@pytest.mark.parametrize("argv", [["--only", "decode,spark"], ["--only", ","], ["--rows", "5"], ["--repeat", "0"],
                                  ["--rows", "lots"]])
def test_bad_arguments_exit_with_usage(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        C.parse_args(argv)
    assert exc.value.code == 2


def test_best_of_runs_setup_untimed_before_each_run_and_keeps_the_last_result() -> None:
    calls: list[str] = []
    timing, out = C.best_of(lambda: calls.append("run") or len(calls), 3, setup=lambda: calls.append("setup"))
    assert calls == ["setup", "run"] * 3 and out == 6
    assert timing.runs == 3 and timing.cpu_s >= 0 and timing.wall_s >= 0


def test_figures_sum_per_side_and_the_ratio_is_today_over_columnar() -> None:
    t = C.Timing(cpu_s=0.25, wall_s=0.5, runs=1)
    figs = [C.figure("today", "a", t, 10_000, "message"), C.figure("today", "b", C.Timing(0.05, 0.1, 1), 10_000,
                                                                    "message"),
            C.figure("columnar", "c", C.Timing(0.06, 0.1, 1), 10_000, "message", wall=True),
            C.figure("columnar", "d", C.Timing(9.0, 9.0, 1), 10_000, "row", total=False)]
    assert figs[0]["cpu_us"] == 25.0 and "wall_us" not in figs[0] and figs[2]["wall_us"] == 10.0
    assert C.side_totals(figs) == {"today": 30.0, "columnar": 6.0}
    assert C.ratio(30.0, 6.0) == 5.0 and C.ratio(None, 6.0) is None and C.ratio(3.0, 0.0) is None
    assert C.per_unit(1.0, 0) is None


def _part(**over):
    t = C.Timing(0.2, 0.3, 1)
    part = {"title": "something", "figures": [C.figure("today", "the old way", t, 1000, "row"),
                                               C.figure("columnar", "the new way", C.Timing(0.02, 0.3, 1), 1000, "row",
                                                        wall=True)]}
    part.update(over)
    return part


def test_report_shows_both_sides_the_ratio_and_a_mismatch_with_its_first_example() -> None:
    bad = C.compare_columns({"id": [1, 2], "note": ["", "x"]}, [{"id": 1, "note": None}, {"id": 2, "note": "x"}],
                            ["id", "note"])
    r = {"repeat": 3, "parts": {
        "mariadb": _part(checks={"LOAD DATA path": bad}, notes=["client CPU only"]),
        "pg": _part(skipped=[f"adbc_ingest: not installed ({C.ADBC_INSTALL})"]),
        "gate": {"error": "RuntimeError: boom\nmore"},
    }}
    text = C.format_report(r)
    assert "best of 3" in text
    assert "the old way" in text and "200.00 µs/row" in text and "20.00 µs/row (wall 300.0)" in text
    assert "today 200.0 / columnar 20.0 µs: 10.0x" in text
    assert "check LOAD DATA path: MISMATCH, 2 rows compared" in text
    assert "exact: id" in text and "note: 1 mismatches, first row 0: got '', want None" in text
    assert "skipped   adbc_ingest: not installed (pip install adbc-driver-postgresql)" in text
    assert "gate: \n  FAILED: RuntimeError: boom" in text and "more" not in text
    assert "note: client CPU only" in text
    # parts print in their fixed order, whatever order they ran in
    assert text.index("gate:") < text.index("pg:") < text.index("mariadb:")


def test_a_part_is_ok_only_when_it_ran_and_every_check_passed() -> None:
    good = C.compare_columns({"a": [1]}, [{"a": 1}], ["a"])
    short = C.compare_columns({"a": [1]}, [{"a": 1}, {"a": 2}], ["a"])
    assert C.check_ok(good) and not C.check_ok(short)
    assert C.part_ok(_part(checks={"x": good, "y": {"ok": True}}))
    assert not C.part_ok(_part(checks={"x": short}))
    assert not C.part_ok(_part(checks={"y": {"ok": False}}))
    assert not C.part_ok({"error": "boom"})


# ---- value comparison -------------------------------------------------------------------------------------------

def test_same_value_is_exact_in_type_and_text() -> None:
    assert C.same_value(Decimal("1.10"), Decimal("1.10")) and not C.same_value(Decimal("1.10"), Decimal("1.1"))
    assert not C.same_value(0.0, -0.0) and C.same_value(1.5, 1.5)
    assert not C.same_value("ab", b"ab") and not C.same_value(1, True) and not C.same_value(1, 1.0)
    assert C.same_value(None, None) and not C.same_value(None, "")


def test_canonical_equal_takes_what_drivers_return_for_the_same_value() -> None:
    assert C.canonical_equal("payload")(memoryview(b"\x00\x01"), b"\x00\x01")
    assert C.canonical_equal("amount")(Decimal("5"), Decimal("5.00"))
    assert not C.canonical_equal("note")("", None)


def test_compare_columns_counts_per_column_and_names_the_first_row() -> None:
    got = {"id": [1, 2, 3], "v": [1.0, 2.5, 3.0]}
    want = [{"id": 1, "v": 1.0}, {"id": 2, "v": 2.0}, {"id": 3, "v": 3.5}]
    check = C.compare_columns(got, want, ["id", "v"], label=lambda i: f"id {want[i]['id']}")
    assert check["rows"] == 3 and check["columns"]["id"] == {"mismatches": 0}
    assert check["columns"]["v"] == {"mismatches": 2, "first": "id 2: got 2.5, want 2.0"}
    assert C.exact_columns(check) == (["id"], ["v"])


# ---- Arrow helpers -----------------------------------------------------------------------------------------------

def test_arrow_types_of_the_bench_shape_are_the_narrowest_exact_ones() -> None:
    got = {c: C.arrow_type(BENCH_TYPES[c]) for c in BENCH_COLUMN_NAMES}
    assert got == {"id": pa.int64(), "grp": pa.uint32(), "name": pa.string(), "amount": pa.decimal128(14, 2),
                   "ratio": pa.float64(), "created": pa.timestamp("us"), "day": pa.date32(), "flag": pa.int8(),
                   "note": pa.string(), "payload": pa.binary(), "ver": pa.int64()}
    assert C.arrow_type("BIGINT  UNSIGNED") == pa.uint64() and C.arrow_type("decimal(65,30)") == pa.decimal256(65, 30)
    with pytest.raises(ValueError, match="no columnar type"):
        C.arrow_type("geometry")


def test_latin1_text_becomes_the_exact_bytes_nulls_and_slices_included() -> None:
    values = [bytes(range(256)), None, b"", b"\xc3\xa9plain", b"\x00\x7f\x80\xff" * 3]
    text = pa.array([None if v is None else v.decode("latin-1") for v in values], pa.string())
    assert C.latin1_to_binary(text).to_pylist() == values
    sliced = C.latin1_to_binary(text.slice(1, 3))
    sliced.validate(full=True)
    assert sliced.type == pa.binary() and sliced.to_pylist() == values[1:4]


def test_text_beyond_latin1_is_refused() -> None:
    with pytest.raises(ValueError, match="U\\+00FF"):
        C.latin1_to_binary(pa.array(["ok", "€"]))


def test_binary_becomes_hex_text_nulls_and_slices_included() -> None:
    values = [b"\x00\xff\x10", None, b"", bytes(range(256))]
    arr = pa.array(values, pa.binary())
    out = C.binary_to_hex(arr)
    out.validate(full=True)
    assert out.type == pa.string()
    assert out.to_pylist() == [None if v is None else v.hex() for v in values]
    assert C.binary_to_hex(arr.slice(1, 3)).to_pylist() == [None, "", bytes(range(256)).hex()]


def test_kafka_batches_number_offsets_per_partition_and_cut_batches() -> None:
    msgs, batches = C.kafka_batches([(1, None, b"a"), (0, b"k", b"b"), (1, None, b"c"), (1, None, b"d")], batch=2)
    assert [(m.partition, m.offset, m.value) for m in msgs] == [(0, 0, b"b"), (1, 0, b"a"), (1, 1, b"c"),
                                                                (1, 2, b"d")]
    assert [b.num_rows for b in batches] == [1, 2, 1]
    assert batches[1].column_names == ["topic", "partition", "offset", "key", "value"]
    assert batches[2].column(2).to_pylist() == [2]


# ---- the columnar decode against the Python decoder ---------------------------------------------------------

def _decoded(events: int = 300):
    from applier.codecs import get_decoder
    from applier.decode import decode_messages

    w = generate_bench("canal-json", events=events, big_txn_rows=events // 10, seed=3)
    msgs, batches = C.kafka_batches(w.messages(), batch=128)
    return w, msgs, batches, decode_messages(get_decoder("canal-json"), msgs, stop_at_error=True).events


def test_columnar_decode_gives_the_python_decoders_values_exactly() -> None:
    _, msgs, batches, events = _decoded()
    types = {c: BENCH_TYPES[c] for c in BENCH_COLUMN_NAMES}
    arrow_types = {c: C.arrow_type(t) for c, t in types.items()}
    outs = [C.columnar_decode(b, C.canal_schema(types), arrow_types) for b in batches]
    rows = [e for e in events if type(e) is RowChange]
    image = {c: pa.concat_arrays([o["image"][c] for o in outs]).to_pylist() for c in BENCH_COLUMN_NAMES}
    check = C.compare_columns(image, [e.before if e.op is Op.DELETE else e.after for e in rows], BENCH_COLUMN_NAMES)
    assert C.check_ok(check), check
    updates = [e for e in rows if e.op is Op.UPDATE]
    old = {c: pa.concat_arrays([o["old"][c] for o in outs]).to_pylist() for c in BENCH_COLUMN_NAMES}
    assert updates and C.check_ok(C.compare_columns(old, [e.before for e in updates], BENCH_COLUMN_NAMES))
    assert pa.concat_arrays([o["commit_ts"] for o in outs]).to_pylist() == [e.commit_ts for e in rows]
    assert pa.concat_arrays([o["offset"] for o in outs]).to_pylist() == [e.position.offset for e in rows]
    assert pa.concat_arrays([o["type"] for o in outs]).to_pylist() == [e.op.value.upper() for e in rows]
    marks = [e for e in events if isinstance(e, Resolved)]
    assert pa.concat_arrays([o["watermarks"]["ts"] for o in outs]).to_pylist() == [e.ts for e in marks]
    assert sum(len(o["ddl_rows"]) for o in outs) == sum(1 for m in msgs if b'"isDdl":true' in m.value)


def test_the_check_catches_an_unconverted_binary_column() -> None:
    _, _, batches, events = _decoded(60)
    types = {c: BENCH_TYPES[c] for c in BENCH_COLUMN_NAMES}
    as_text = {c: (pa.string() if c == "payload" else C.arrow_type(t)) for c, t in types.items()}
    out = C.columnar_decode(batches[0], C.canal_schema(types), as_text)
    rows = [e for e in events if type(e) is RowChange][:len(out["image"]["id"])]
    check = C.compare_columns({c: a.to_pylist() for c, a in out["image"].items()},
                              [e.before if e.op is Op.DELETE else e.after for e in rows], BENCH_COLUMN_NAMES)
    exact, inexact = C.exact_columns(check)
    assert inexact == ["payload"] and "id" in exact


# ---- the columnar gate against Gate + plan_batch ----------------------------------------------------------------

def test_columnar_gate_leaves_the_rows_of_today_s_gate_and_plan() -> None:
    """On a stream long enough for updates and deletes (the generator makes them once a table holds more than twice
    its hot keys): a shorter one is all inserts of distinct keys, where picking the wrong rows goes unseen."""
    w, _, _, events = _decoded(1200)
    cut = C.applied_cut(events, 0.1)
    assert 0 < sum(1 for e in events if type(e) is RowChange and e.commit_ts <= cut)
    today = C.today_gate(events, C.bench_metas(w.table_names), cut, w.partitions)
    arrow_types = {c: C.arrow_type(BENCH_TYPES[c]) for c in BENCH_COLUMN_NAMES}
    rows, marks = C.gate_tables(events, w.table_names, arrow_types)
    col = C.columnar_gate(rows, marks, cut, w.partitions)
    upserts, deletes = C.survivors_today(today["plans"], w.table_names)
    assert deletes and len(upserts) + len(deletes) < today["released"]  # keys collapsed, keys deleted
    assert col["released"] == today["released"]
    assert C.survivors_columnar(col) == (upserts, deletes)


COLS = (Column("id", "bigint", key=True, nullable=False), Column("ver", "bigint"))


def _ch(ts: int, part: int, off: int, op: Op, key: int, ver: int) -> RowChange:
    img = {"id": key, "ver": ver}
    before = img if op is Op.DELETE else ({"id": key, "ver": ver - 1} if op is Op.UPDATE else None)
    return RowChange("s", "t", ts, op, before, None if op is Op.DELETE else img, COLS, SourcePosition(C.TOPIC, part, off))


def test_columnar_gate_drops_applied_and_copies_orders_by_commit_ts_and_keeps_deletes() -> None:
    events = [
        _ch(5, 0, 0, Op.INSERT, 1, 1),  # at the applied ts: dropped
        _ch(20, 0, 1, Op.UPDATE, 1, 3),  # later commit ts, earlier offset: must win over ts 10
        _ch(10, 1, 0, Op.INSERT, 1, 2),
        _ch(10, 1, 0, Op.INSERT, 1, 2),  # a copy
        _ch(11, 1, 1, Op.INSERT, 2, 1),
        _ch(12, 1, 2, Op.DELETE, 2, 1),  # deleted and gone
        _ch(13, 0, 2, Op.DELETE, 3, 7),
        _ch(14, 0, 3, Op.INSERT, 3, 8),  # deleted, then inserted again: deleted and upserted
        Resolved(30, SourcePosition(C.TOPIC, 0, 9)), Resolved(30, SourcePosition(C.TOPIC, 1, 9)),
    ]
    types = {"id": pa.int64(), "ver": pa.int64()}
    rows, marks = C.gate_tables(events, ["t"], types)
    col = C.columnar_gate(rows, marks, 5, 2)
    assert col["released"] == 6
    assert C.survivors_columnar(col) == ({(0, 1, 3), (0, 3, 8)}, {(0, 2), (0, 3)})
    from applier.sinks.table import build_meta

    meta = {"t": build_meta("s", "t", [("id", False, False), ("ver", True, False)], ("id",), [("id",)])}
    today = C.today_gate(events, meta, 5, 2)
    assert C.survivors_today(today["plans"], ["t"]) == C.survivors_columnar(col)
    # a partition that never reported holds everything back
    assert C.columnar_gate(rows, marks.slice(0, 1), 5, 2)["released"] == 0


def test_applied_cut_is_a_commit_ts_quantile_whatever_the_order() -> None:
    evs = [_ch(ts, 0, i, Op.INSERT, i, 1) for i, ts in enumerate([50, 10, 40, 20, 30])]
    assert C.applied_cut(evs, 0.0) == 10 and C.applied_cut(evs, 0.4) == 30 and C.applied_cut(evs, 1.0) == 50
    assert C.applied_cut([], 0.5) == 0


# ---- the MariaDB load -------------------------------------------------------------------------------------------

def test_mariadb_statements_upsert_like_the_writer_and_load_binary_as_hex() -> None:
    cols = ("id", "note", "payload")
    sql = C.mariadb_statements("`t`", "`s`", cols, "id", "'/dev/shm/x.tsv'", binary=["payload"])
    assert sql["upsert"] == ("INSERT INTO `t` (`id`, `note`, `payload`) VALUES (%s, %s, %s) ON DUPLICATE KEY UPDATE "
                             "`note` = VALUES(`note`), `payload` = VALUES(`payload`)")
    assert sql["load"].startswith("LOAD DATA LOCAL INFILE '/dev/shm/x.tsv' INTO TABLE `s` CHARACTER SET utf8mb4 ")
    assert "ESCAPED BY ''" in sql["load"] and "OPTIONALLY ENCLOSED BY '\"'" in sql["load"]
    assert sql["load"].endswith("(`id`, `note`, @payload) SET `payload` = UNHEX(@payload)")
    assert sql["merge"] == ("INSERT INTO `t` (`id`, `note`, `payload`) SELECT `id`, `note`, `payload` FROM `s` "
                            "ON DUPLICATE KEY UPDATE `note` = VALUES(`note`), `payload` = VALUES(`payload`)")
    plain = C.mariadb_statements("`t`", "`s`", ("id", "v"), "id", "'f'")
    assert plain["load"].endswith("(`id`, `v`)")


def test_the_load_file_writes_null_unquoted_and_every_string_quoted() -> None:
    """LOAD DATA (ENCLOSED BY '"', ESCAPED BY '') reads an unquoted NULL as NULL and an empty field as '': so NULL
    must be the word, and the text 'NULL' must be quoted to stay text."""
    t = pa.table({"id": [1, 2, 3], "note": pa.array([None, "NULL", ""], pa.string()),
                  "d": pa.array([dt.date(2020, 1, 2), None, dt.date(2000, 1, 1)], pa.date32())})
    buf = io.BytesIO()
    pcsv.write_csv(t, buf, C.csv_write_options())
    assert buf.getvalue() == b'1\tNULL\t2020-01-02\n2\t"NULL"\tNULL\n3\t""\t2000-01-01\n'
    old = io.BytesIO()
    pcsv.write_csv(t, old, C.csv_write_options(""))  # the first prototype: NULL and '' are both read as ''
    assert old.getvalue().splitlines()[0] == b"1\t\t2020-01-02"


def test_the_load_table_is_the_bench_shape() -> None:
    assert "`payload` VARBINARY(64) NULL" in bench_table_ddl("today")
    assert [r["id"] for r in C.bench_rows(3)] == [0, 1, 2]
