"""``applier quarantine`` without a server: held events survive their JSON form with every value type, retry and
discard take whole keys in commit order, discard records who and why and fences a running pipeline, a bare
retry/discard is refused, and what is printed is safe for a terminal.

SQLite stands in for the target's own tables (``applier.progress.metadata``); retry's writes go to a recording
writer, so the selection, the one transaction and the failure path are checked here and the real writers in
tests/e2e/test_quarantine_redrive.py.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy
from sqlalchemy import select

from applier import progress as P
from applier.cli import EXIT_CONFIG, main
from applier.config import ConfigError
from applier.events import Column, Op, RowChange, SourcePosition
from applier.progress import ProgressStore, WriterFenced
from applier.quarantine import RowQuarantine, event_from_json, event_json, key_text, keys_of
from applier.redrive import (
    NothingMatched, Redrive, RedriveError, RetryFailed, Selection, group_rows, parse_key, parse_table, shown_key,
    table_batches, whole_keys,
)
from applier.redrive_text import (
    format_discard, format_held, format_listing, format_message, format_retry, readable, safe_preview,
)
from applier.report import format_status, held_rows
from applier.sinks.table import build_meta
from tests.unit.helpers import CLI_CONF

PIPE = "p1"
COLS = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))


@pytest.fixture
def engine():
    eng = sqlalchemy.create_engine("sqlite://")
    P.metadata.create_all(eng)
    yield eng
    eng.dispose()


def change(op: Op, key: int, v: str | None, ts: int, offset: int, *, before_key: int | None = None,
           schema: str = "shop", table: str = "items") -> RowChange:
    before = None if op is Op.INSERT else {"id": key if before_key is None else before_key, "v": "old"}
    after = None if op is Op.DELETE else {"id": key, "v": v}
    return RowChange(schema, table, ts, op, before, after, COLS, SourcePosition("t", 0, offset))


def hold(engine, ev: RowChange, *, kind: str = "blocked", reason: str = "blocked behind an earlier change",
         pipeline: str = PIPE, row_key: str | None = None) -> None:
    rk = row_key if row_key is not None else key_text([(ev.after or ev.before)["id"]])
    with engine.begin() as c:
        RowQuarantine(pipeline).hold(c, ev, rk, kind=kind, reason=reason)


def states(engine) -> dict[int, tuple[str, str | None, str | None, str]]:
    t = P.quarantined_rows
    with engine.connect() as c:
        return {r.id: (r.state, r.resolved_by, r.note, r.reason) for r in c.execute(select(t))}


# ---- values and events as JSON ----------------------------------------------------------------------------

EVERY_VALUE = {
    "none": None, "true": True, "false": False, "zero": 0, "neg": -42, "u64": 18446744073709551615,
    "big": -(2**70), "f": 0.1, "nan": math.nan, "inf": math.inf, "ninf": -math.inf, "negzero": -0.0,
    "dec": Decimal("-12345678901234567890.1230"), "dec_exp": Decimal("1E+30"), "bytes": b"\x00\xff\x01'\"\\",
    "empty_bytes": b"", "text": "it's \"quoted\" \\ % 🎉 ñ \x00 \n \u202e", "empty": "",
    "dt": dt.datetime(2024, 2, 29, 23, 59, 59, 999999), "dt0": dt.datetime(1, 1, 1),
    "aware": dt.datetime(2021, 6, 1, 12, 0, tzinfo=dt.timezone(dt.timedelta(hours=-3))),
    "date": dt.date(9999, 12, 31), "time": dt.time(23, 59, 59, 500000),
    "td_neg": -dt.timedelta(hours=838, minutes=59, seconds=59), "td_us": dt.timedelta(microseconds=1),
}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    if isinstance(a, float):
        return type(b) is float and a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


def test_an_event_with_every_value_type_survives_its_json_form() -> None:
    cols = tuple(Column(n, "varchar", nullable=n != "zero", key=n == "zero", unique=n == "u64", unsigned=n == "u64",
                        binary=n == "bytes", generated=n == "f", type_code=i) for i, n in enumerate(EVERY_VALUE))
    before = dict(EVERY_VALUE)
    after = {**EVERY_VALUE, "text": "after", "none": 1}
    ev = RowChange("s\x00hop", "ta.ble", 2**63 - 1, Op.UPDATE, before, after, cols, SourcePosition("tópic", 7, 2**62))
    text = event_json(ev)
    assert "\x00" not in text.replace("\\u0000", "")  # JSON escapes the NUL; never raw in the column
    back = event_from_json(text)
    assert (back.schema, back.table, back.commit_ts, back.op, back.columns, back.position) == \
        (ev.schema, ev.table, ev.commit_ts, ev.op, ev.columns, ev.position)
    for img, orig in ((back.before, before), (back.after, after)):
        assert list(img) == list(orig)
        for k in orig:
            assert same(orig[k], img[k]), (k, orig[k], img[k])
    assert event_from_json(event_json(back)).after["aware"].utcoffset() == dt.timedelta(hours=-3)
    for op in (Op.INSERT, Op.DELETE):
        ev2 = change(op, 3, "x", 5, 1)
        b2 = event_from_json(event_json(ev2))
        assert (b2.op, b2.before, b2.after) == (op, ev2.before, ev2.after)


def test_key_text_is_equal_for_equal_keys_and_keys_of_sees_both_keys_of_a_key_change() -> None:
    assert key_text([1, "a"]) == '[1,"a"]'
    assert key_text([Decimal("1.50")]) == key_text([Decimal("1.50")]) != key_text([Decimal("1.5")])
    assert key_text([b"\x00"]) == '[{"b":"AA=="}]'
    assert key_text(["é"]) == '["é"]'
    move = change(Op.UPDATE, 2, "x", 5, 1, before_key=1)
    assert keys_of(move, ("id",)) == [key_text([1]), key_text([2])]
    assert keys_of(change(Op.UPDATE, 2, "x", 5, 1), ("id",)) == [key_text([2])]
    assert keys_of(change(Op.DELETE, 2, None, 5, 1), ("id",)) == [key_text([2])]
    assert keys_of(change(Op.INSERT, 2, "x", 5, 1), ("nope",)) == []


def test_key_and_table_options_read_as_list_shows_them() -> None:
    assert parse_key("[ 1 , \"a\" ]") == key_text([1, "a"])
    assert parse_key("7") == key_text([7])
    assert parse_key('[{"d": "1.50"}]') == key_text([Decimal("1.50")])
    hostile = key_text(["a\u202eb\x00", "😀", "\U000e0001"])
    assert shown_key(hostile).isprintable() and parse_key(shown_key(hostile)) == hostile
    with pytest.raises(ConfigError) as e:
        parse_key("abc")
    assert e.value.key == "--key"
    assert parse_table("shop.items") == ("shop", "items")
    assert parse_table("shop.it.ems") == ("shop", "it.ems")
    assert parse_table("`a.b`.`c``d`") == ("a.b", "c`d")
    assert parse_table('"a.b"."c"') == ("a.b", "c")
    for bad in ("shop", ".items", "shop."):
        with pytest.raises(ConfigError) as e:
            parse_table(bad)
        assert e.value.key == "--table"


# ---- selection: whole keys, commit order, filters ------------------------------------------------------------

def seed(engine) -> None:
    """Key [1]: refused insert (ts 100), then an update (ts 300) held before a delete+insert pair... in the order
    the applier may write them; key [2]: one refused update; key [1] of another table; another pipeline's row."""
    hold(engine, change(Op.INSERT, 1, "toolong", 100, 10), kind="refused", reason="Data too long for column 'v'")
    hold(engine, change(Op.UPDATE, 1, "ok", 300, 30))  # id 2
    hold(engine, change(Op.UPDATE, 1, "mid", 200, 20))  # id 3: earlier commit, held later (another partition's)
    hold(engine, change(Op.UPDATE, 2, "x" * 9, 150, 15), kind="refused", reason="Data too long")  # id 4
    hold(engine, change(Op.INSERT, 1, "o", 120, 12, table="other"), kind="refused", reason="dup")  # id 5
    hold(engine, change(Op.INSERT, 9, "z", 50, 5), kind="refused", reason="other pipeline", pipeline="p2")  # id 6


def test_a_filter_that_picks_one_change_takes_its_whole_key_in_commit_order(engine) -> None:
    seed(engine)
    red = Redrive(engine, PIPE, "open")
    groups = red.preview(Selection(ids=(2,)))
    assert [(g.table, g.row_key, g.ids) for g in groups] == [("items", "[1]", [1, 3, 2])]
    assert [h.commit_ts for h in groups[0].rows] == [100, 200, 300]
    assert groups[0].reason == "Data too long for column 'v'"
    by_table = red.preview(Selection(table=("shop", "items")))
    assert [(g.row_key, g.ids) for g in by_table] == [("[1]", [1, 3, 2]), ("[2]", [4])]
    by_key = red.preview(Selection(table=("shop", "items"), row_key=parse_key("[2]")))
    assert [g.ids for g in by_key] == [[4]]
    everything = red.preview(Selection(everything=True))
    assert sorted(i for g in everything for i in g.ids) == [1, 2, 3, 4, 5]  # never another pipeline's
    with pytest.raises(ConfigError) as e:  # key [1] is blocked in shop.items and shop.other
        red.preview(Selection(row_key="[1]"))
    assert e.value.key == "--table" and "shop.items" in str(e.value) and "shop.other" in str(e.value)
    with pytest.raises(NothingMatched):
        red.preview(Selection(ids=(6,)))  # p2's
    with pytest.raises(NothingMatched):
        red.preview(Selection(table=("shop", "nope")))
    assert red.missing_ids(Selection(ids=(2, 6)), red.preview(Selection(ids=(2, 6)))) == [6]


def test_keys_linked_by_one_change_go_together_and_the_change_is_written_once(engine) -> None:
    hold(engine, change(Op.INSERT, 1, "a", 100, 1), kind="refused", reason="r")  # id 1, key [1]
    hold(engine, change(Op.INSERT, 2, "b", 110, 2), kind="refused", reason="r")  # id 2, key [2]
    move = change(Op.UPDATE, 2, "a", 120, 3, before_key=1)  # moves [1] to [2]: held under both keys
    hold(engine, move, row_key="[1]")  # id 3
    hold(engine, move, row_key="[2]")  # id 4
    hold(engine, change(Op.INSERT, 3, "c", 130, 4), kind="refused", reason="r")  # id 5, unrelated
    red = Redrive(engine, PIPE, "open")
    groups = red.preview(Selection(ids=(1,)))
    assert sorted((g.row_key, tuple(g.ids)) for g in groups) == [("[1]", (1, 3)), ("[2]", (2, 4))]
    (batch,) = table_batches(groups)
    assert batch.ids == [1, 2, 3, 4]
    assert [(c.op, c.commit_ts) for c in batch.changes] == [(Op.INSERT, 100), (Op.INSERT, 110), (Op.UPDATE, 120)]


def test_whole_keys_and_grouping_are_pure_functions_of_the_rows(engine) -> None:
    seed(engine)
    with engine.connect() as c:
        held = RowQuarantine(PIPE).find(c)
    assert group_rows(reversed(held)) == group_rows(held)  # order comes from commit ts, not input order
    matched = [h for h in held if h.id == 3]
    assert [g.ids for g in whole_keys(matched, held)] == [[1, 3, 2]]
    assert whole_keys([], held) == []


# ---- retry (recording writer) ---------------------------------------------------------------------------------

class FakeWriter:
    def __init__(self, log: list, fail: str | None) -> None:
        self.log, self.fail = log, fail

    def begin(self, conn) -> None:
        self.log.append("begin")

    def table(self, conn, schema: str, name: str):
        return build_meta(schema, name, [("id", False, False), ("v", True, False)], ("id",), [])

    def write(self, conn, plan) -> None:
        if self.fail:
            raise RuntimeError(self.fail)
        self.log.append((plan.meta.schema, plan.meta.name, plan.deletes, plan.upserts))


class FakeDialect:
    def __init__(self, fail: str | None = None) -> None:
        self.log: list = []
        self.fail = fail

    def writer(self, batch_rows: int = 5000) -> FakeWriter:
        return FakeWriter(self.log, self.fail)

    def is_transient(self, exc: BaseException | None) -> bool:
        return False


def route(schema: str, table: str):
    return None if table == "other" else ("replica", table)


def test_retry_writes_the_final_state_of_each_key_in_one_transaction_and_marks_them_retried(engine) -> None:
    seed(engine)
    old = ProgressStore(PIPE, "open")
    old.claim(engine)  # a running pipeline
    d = FakeDialect()
    res = Redrive(engine, PIPE, "open", route=route, dialect=d).retry(Selection(table=("shop", "items")), by="tester")
    assert d.log[0] == "begin"
    (write,) = d.log[1:]
    assert write == ("replica", "items", [], [{"id": 2, "v": "x" * 9}, {"id": 1, "v": "ok"}])  # key [1]: its last
    st = states(engine)
    assert [st[i][0] for i in (1, 2, 3, 4, 5, 6)] == ["retried"] * 4 + ["held", "held"]
    assert st[1][1] == "tester" and "writer epoch 2" in st[1][2]
    assert res.epoch == 2 and res.written == {("shop", "items"): (2, 0)}
    with engine.connect() as c, pytest.raises(WriterFenced):
        old.check_writer(c)  # the running pipeline stops at its next transaction
    text = format_retry(res)
    assert "shop.items -> replica.items  key [1]: 3 change(s) (insert, update), commit ts 100 .. 300" in text
    assert "exit code 6" in text and "Start it again" in text


def test_a_refused_retry_keeps_the_changes_held_with_the_new_reason(engine) -> None:
    seed(engine)
    red = Redrive(engine, PIPE, "open", route=route, dialect=FakeDialect(fail="Data too long for column 'v' again"))
    with pytest.raises(RetryFailed) as e:
        red.retry(Selection(ids=(3,)), by="tester")
    assert e.value.code == 4 and e.value.renoted == [1, 3, 2]
    assert "Data too long for column 'v' again" in str(e.value)
    st = states(engine)
    assert all(st[i][0] == "held" for i in st)
    assert all("retry failed" in st[i][3] and "again" in st[i][3] and "tester" in st[i][3] for i in (1, 2, 3))
    assert st[4][3] == "Data too long"  # another key of the table, not retried: its reason stays


def test_a_table_no_longer_routed_is_refused_before_anything_is_claimed(engine) -> None:
    seed(engine)
    red = Redrive(engine, PIPE, "open", route=route, dialect=FakeDialect())
    with pytest.raises(RedriveError) as e:
        red.retry(Selection(table=("shop", "other")))
    assert e.value.code == 2 and "shop.other is no longer routed" in str(e.value) and "discard" in str(e.value)
    with engine.connect() as c:
        assert c.execute(select(P.writers)).first() is None  # no running pipeline was fenced for nothing
    assert states(engine)[5][0] == "held"


def test_an_unreadable_held_event_names_its_id(engine) -> None:
    seed(engine)
    with engine.begin() as c:
        c.execute(P.quarantined_rows.update().where(P.quarantined_rows.c.id == 4).values(event="{not json"))
    with pytest.raises(RedriveError) as e:
        Redrive(engine, PIPE, "open", route=route, dialect=FakeDialect()).retry(Selection(ids=(4,)))
    assert e.value.code == 4 and "held change id 4" in str(e.value)


# ---- discard and refusals -------------------------------------------------------------------------------------

def test_discard_marks_whole_keys_with_who_and_why_and_fences_the_running_pipeline(engine) -> None:
    seed(engine)
    old = ProgressStore(PIPE, "open")
    old.claim(engine)
    res = Redrive(engine, PIPE, "open").discard(Selection(ids=(4,)), reason="  bad value upstream, fixed by hand ",
                                                by="alice (host pid 1)")
    st = states(engine)
    assert st[4][:3] == ("discarded", "alice (host pid 1)", "bad value upstream, fixed by hand")
    assert [st[i][0] for i in (1, 2, 3, 5, 6)] == ["held"] * 5
    with engine.connect() as c, pytest.raises(WriterFenced):
        old.check_writer(c)
    text = format_discard(res, config="c.toml")
    assert "may now differ from the upstream" in text and "applier verify -c c.toml" in text
    ls = Redrive(engine, PIPE, "open").listing(state="discarded")
    assert [g.ids for g in ls.groups] == [[4]] and ls.messages == [] and not ls.messages_listed
    assert "discarded by alice" in format_listing(ls)


def test_retry_and_discard_refuse_without_a_filter_or_all_or_a_reason(engine) -> None:
    seed(engine)
    red = Redrive(engine, PIPE, "open", route=route, dialect=FakeDialect())
    for call in (lambda: red.retry(Selection()), lambda: red.discard(Selection(), reason="r")):
        with pytest.raises(ConfigError) as e:
            call()
        assert e.value.key == "--all"
    with pytest.raises(ConfigError) as e:
        red.retry(Selection(table=("shop", "items"), everything=True))
    assert e.value.key == "--all"
    for reason in ("", "   "):
        with pytest.raises(ConfigError) as e:
            red.discard(Selection(everything=True), reason=reason)
        assert e.value.key == "--reason"
    assert all(s[0] == "held" for s in states(engine).values())
    with engine.connect() as c:
        assert c.execute(select(P.writers)).first() is None




@pytest.mark.parametrize("argv, key", [
    (["retry"], "--all"),
    (["discard", "--all"], "--reason"),
    (["discard", "--all", "--reason", " "], "--reason"),
    (["discard", "--reason", "why"], "--all"),
    (["retry", "--all", "--id", "3"], "--all"),
    (["retry", "--key", "nope"], "--key"),
    (["retry", "--table", "items"], "--table"),
    (["list", "--limit", "0"], "--limit"),
])
def test_the_cli_refuses_bad_options_with_exit_2_before_connecting(tmp_path: Path, capsys, argv, key) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(CLI_CONF.format(ckpt=tmp_path / "ck"))
    assert main(["quarantine", argv[0], "-c", str(cfg), *argv[1:]]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert key in err and "Sup3rS3cret" not in err


def test_the_cli_names_the_subcommand_in_its_help(capsys) -> None:
    from applier.cli import build_parser
    assert "quarantine" in build_parser().format_help()
    with pytest.raises(SystemExit):
        main(["quarantine", "--help"])
    out = capsys.readouterr().out
    assert all(a in out for a in ("list", "show", "retry", "discard"))


# ---- what is printed ------------------------------------------------------------------------------------------

def test_values_and_raw_bytes_print_escaped() -> None:
    assert readable(None) == "NULL"
    assert readable(Decimal("1.50")) == "1.50"
    assert readable("it's\x1b[2J\u202e") == "'it\\'s\\x1b[2J\\u202e'"
    assert readable(b"\x00\xff") == "x'00ff'"
    assert readable(dt.timedelta(hours=-838)) == "-838:00:00"
    assert readable("x" * 5000, limit=50).endswith("(5000 characters)")
    assert readable(b"\x01" * 5000, limit=50).endswith("(5000 bytes)")
    assert safe_preview(None) == "(none)"
    assert safe_preview(b'{"a":"\x1b]0;pwned\x07"}') == '"{\\"a\\":\\"\\x1b]0;pwned\\x07\\"}"'
    assert safe_preview(b"\x00\x01\xfe\xffabc") == "b'\\x00\\x01\\xfe\\xffabc'"
    assert safe_preview("é".encode() * 10, limit=5) == '"éé"… (15 more bytes)'  # a cut character is left out
    for out in (safe_preview(bytes(range(256))), safe_preview(bytes(range(256)), limit=7)):
        assert out.isprintable()


def test_list_show_and_status_text(engine) -> None:
    hold(engine, change(Op.INSERT, 1, "bad\x1b[31m", 100, 10), kind="refused",
         reason="Data too long\nfor column 'v'" + "x" * 500)
    hold(engine, change(Op.UPDATE, 1, "ok", 200, 11))
    with engine.begin() as c:
        ProgressStore(PIPE, "open").quarantine(c, _msg(), "cannot decode: bad \x00 JSON")
    red = Redrive(engine, PIPE, "open")
    ls = red.listing()
    text = format_listing(ls, config="c.toml")
    assert all(line.isprintable() for line in text.splitlines())
    assert "shop.items  key [1]  2 change(s)  commit ts 100 .. 200  ids 1, 2" in text
    assert "`retry` decodes it again; `show ID --message` shows its bytes): 1" in text
    assert "offset=7" in text and "…" in text
    doc = ls.as_json()
    assert json.loads(json.dumps(doc, default=str))["groups"][0]["ids"] == [1, 2]
    assert doc["quarantined_messages"] == 1 and doc["messages"][0]["offset"] == 7
    shown = format_held(red.held(1))
    assert all(line.isprintable() for line in shown.splitlines())
    assert "'bad\\x1b[31m'" in shown and "id (key)" in shown and "insert" in shown
    msg = format_message(red.message(ls.messages[0].id), preview=8)
    assert '3 bytes: "k\\x00y"' in msg and "13 bytes: b'\\xff\\xfe\\x00value'… (5 more bytes)" in msg
    assert all(line.isprintable() for line in msg.splitlines())
    with pytest.raises(NothingMatched):
        red.held(99)
    with pytest.raises(NothingMatched):
        red.message(99)
    h = held_rows(engine, PIPE)
    assert h == {"held_changes": 2, "blocked_keys": 1,
                 "first_blocked": [{"table": "shop.items", "key": "[1]", "changes": 2, "first_commit_ts": 100}]}
    st = format_status({"pipeline": PIPE, "exists": False, "writer": None, "quarantined_rows": h})
    assert "held row changes: 2 under 1 blocked key(s): shop.items [1]" in st


def _msg():
    from applier.events import KafkaMessage
    return KafkaMessage("t", 0, 7, b"k\x00y", b"\xff\xfe\x00value+more")


def test_status_without_the_quarantine_table_shows_nothing() -> None:
    eng = sqlalchemy.create_engine("sqlite://")
    try:
        P.metadata.create_all(eng, tables=[t for t in P.metadata.sorted_tables if t is not P.quarantined_rows])
        assert held_rows(eng, PIPE) is None
        st = format_status({"pipeline": PIPE, "exists": False, "writer": None, "quarantined_rows": None})
        assert "held row changes" not in st
        with pytest.raises(RedriveError) as e:
            Redrive(eng, PIPE, "open").listing()
        assert e.value.code == 2 and "applier migrate" in str(e.value)
    finally:
        eng.dispose()


def test_an_unreachable_target_exits_5_without_the_password(tmp_path: Path, capsys) -> None:
    from applier.cli import EXIT_TARGET
    cfg = tmp_path / "c.toml"
    cfg.write_text(CLI_CONF.format(ckpt=tmp_path / "ck"))
    assert main(["quarantine", "list", "-c", str(cfg)]) == EXIT_TARGET
    err = capsys.readouterr().err
    assert "[target] url" in err and "Sup3rS3cret" not in err


def block(engine, table: tuple[str, str] | None, offset: int, value: bytes | None = b"raw", *, partition: int = 0,
          pipeline: str = PIPE) -> None:
    """An undecodable message, quarantined as the pipeline does: its raw record and its block row."""
    from applier.events import KafkaMessage
    from applier.quarantine import UndecodableMessage

    msg = KafkaMessage("t", partition, offset, b"k", value)
    with engine.begin() as c:
        ProgressStore(pipeline, "open").quarantine(c, msg, "cannot decode")
        RowQuarantine(pipeline).block(c, UndecodableMessage(msg, "cannot decode", table))


class StubDecoder:
    """Decodes a quarantined record into whatever the test says it now holds (or still fails)."""

    def __init__(self, by_offset: dict[int, Any]) -> None:
        self.by_offset = by_offset

    def decode(self, msg) -> list:
        from applier.events import DecodeError

        got = self.by_offset[msg.offset]
        if isinstance(got, str):
            raise DecodeError(msg.position, got)
        return got


def test_star_names_a_table_block_and_a_retry_behind_it_takes_the_block_first(engine) -> None:
    assert parse_key(" * ") == "*"
    block(engine, ("shop", "items"), 9)  # id 1
    hold(engine, change(Op.UPDATE, 1, "after", 300, 12))  # id 2, held behind the block
    now = {9: [change(Op.INSERT, 1, "first", 200, 9), change(Op.INSERT, 3, "three", 200, 9)]}
    d = FakeDialect()
    res = Redrive(engine, PIPE, "open", route=route, dialect=d, decoder=lambda: StubDecoder(now)).retry(
        Selection(row_key=key_text([1]), table=("shop", "items")), by="tester")
    (write,) = d.log[1:]  # the message's changes come first (commit ts 200), then the held update (300)
    assert write[:3] == ("replica", "items", []) and sorted(write[3], key=lambda r: r["id"]) == [
        {"id": 1, "v": "after"}, {"id": 3, "v": "three"}]
    assert [states(engine)[i][0] for i in (1, 2)] == ["retried", "retried"] and res.redecoded == {1: 2}
    assert "decoded again" in format_retry(res)


def test_a_message_that_still_cannot_be_decoded_stays_held_with_the_new_error(engine) -> None:
    block(engine, ("shop", "items"), 9)
    hold(engine, change(Op.UPDATE, 1, "after", 300, 12))
    d = FakeDialect()
    red = Redrive(engine, PIPE, "open", route=route, dialect=d, decoder=lambda: StubDecoder({9: "bad checksum"}))
    with pytest.raises(RetryFailed) as e:
        red.retry(Selection(table=("shop", "items")), by="tester")
    assert e.value.code == 4 and e.value.renoted == [1] and "still cannot be decoded: bad checksum" in str(e.value)
    st = states(engine)
    assert st[1][0] == st[2][0] == "held" and "retry failed" in st[1][3] and "tester" in st[1][3]
    assert d.log == []
    with engine.connect() as c:
        assert c.execute(select(P.writers)).first() is None  # nothing claimed


def test_a_partition_block_holds_only_what_was_read_after_it_in_its_partition(engine) -> None:
    from applier.redrive import with_blocks

    block(engine, None, 10)  # id 1: its table is unknown
    hold(engine, change(Op.INSERT, 1, "a", 100, 5))  # id 2: before it
    hold(engine, change(Op.INSERT, 2, "b", 100, 11, table="other"))  # id 3: after it, another table
    with engine.connect() as c:
        rows = RowQuarantine(PIPE).find(c)
        parts = RowQuarantine(PIPE).blocks(c)
    assert parts == {("", ""): {("t", 0): 10}}
    by_id = {h.id: h for h in rows}
    assert [g.row_key for g in with_blocks(group_rows([by_id[2]]), rows)] == ["[1]"]
    got = with_blocks(group_rows([by_id[3]]), rows)
    assert [(g.upstream, g.row_key) for g in got] == [("(table unknown: partition 0 of t)", "*"), ("shop.other", "[2]")]
    # the block decodes into changes of any table; unrouted ones are left out, as the pipeline leaves them
    now = {10: [change(Op.INSERT, 7, "x", 90, 10), change(Op.INSERT, 8, "y", 90, 10, table="other")]}
    d = FakeDialect()
    res = Redrive(engine, PIPE, "open", route=route, dialect=d, decoder=lambda: StubDecoder(now)).retry(
        Selection(ids=(1,)), by="tester")
    assert d.log[1:] == [("replica", "items", [], [{"id": 7, "v": "x"}])]
    assert res.redecoded == {1: 1} and [states(engine)[i][0] for i in (1, 2, 3)] == ["retried", "held", "held"]


@pytest.mark.parametrize("now,what", [
    ("ddl", "into a DDL"), ("other", "into changes of upstream table shop.other, not of shop.items"),
])
def test_a_message_that_a_retry_cannot_apply_in_order_is_refused_with_what_to_do(engine, now, what) -> None:
    from applier.events import DDL

    block(engine, ("shop", "items"), 9)
    evs = [DDL("shop", "items", 5, "TRUNCATE TABLE items", SourcePosition("t", 0, 9))] if now == "ddl" else \
        [change(Op.INSERT, 1, "x", 5, 9, table="other")]
    red = Redrive(engine, PIPE, "open", route=route, dialect=FakeDialect(), decoder=lambda: StubDecoder({9: evs}))
    with pytest.raises(RedriveError) as e:
        red.retry(Selection(ids=(1,)))
    assert e.value.code == 4 and what in str(e.value) and "discard -c CONF --id 1" in str(e.value)
    assert states(engine)[1][0] == "held"


def test_a_block_whose_raw_record_is_gone_says_to_discard_it(engine) -> None:
    block(engine, ("shop", "items"), 9)
    with engine.begin() as c:
        c.execute(P.quarantine.delete())
    with pytest.raises(RedriveError) as e:
        Redrive(engine, PIPE, "open", route=route, dialect=FakeDialect(), decoder=lambda: StubDecoder({})).retry(
            Selection(ids=(1,)))
    assert e.value.code == 4 and "not in applier_quarantine" in str(e.value)


