"""``applier quarantine`` against real MariaDB and PostgreSQL: held row changes are listed, a retry the target
still refuses rolls back as a whole and keeps them held with the new reason (exit 4), a discard records who and
why, and once the cause is fixed (the column widened) ``retry --all`` applies every key's changes in commit order
in one transaction, and marks them retried.

The held rows are written with ``RowQuarantine.hold``, as the applier writes them under
``on_apply_error = "quarantine"``, so this needs no Kafka or Spark.

Note on the data: a key's held changes are planned like one applied window, so its versions collapse to the last
one. Key [1] (a refused insert of 'toolong', then an update to 'ok') therefore fits VARCHAR(4) as a whole; key [2]
(a refused insert of 'longer-value') is the one a narrow column keeps refusing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select, text

from applier import migrate
from applier import progress as P
from applier.cli import EXIT_APPLY, main
from applier.events import Column, KafkaMessage, Op, RowChange, SourcePosition
from applier.progress import ProgressStore, WriterFenced
from applier.quarantine import RowQuarantine, key_text
from tests.e2e.helpers import config, target_url, write_toml

pytestmark = pytest.mark.e2e

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))


def ev(op: Op, key: int, v: str, ts: int, offset: int, old: str | None = None) -> RowChange:
    before = {"id": key, "v": old} if op is not Op.INSERT else None
    return RowChange("shop", "items", ts, op, before, {"id": key, "v": v}, COLS, SourcePosition("t", 0, offset))


def held(engine, pipeline: str) -> dict[int, dict]:
    t = P.quarantined_rows
    with engine.connect() as c:
        return {r["id"]: dict(r) for r in c.execute(select(t).where(t.c.pipeline == pipeline)).mappings()}


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_list_retry_discard_on_a_real_target(target, urls, unique, drop_schema, tmp_path: Path, capsys) -> None:
    schema = f"qr_{unique}"
    url = target_url(urls, target)
    engine = create_engine(url)
    drop_schema((target, schema))
    q = (lambda n: f"`{n}`") if target == "mariadb" else (lambda n: f'"{n}"')
    with engine.begin() as c:
        c.execute(text(f"CREATE DATABASE {q(schema)}" if target == "mariadb" else f"CREATE SCHEMA {q(schema)}"))
        c.execute(text(f"CREATE TABLE {q(schema)}.items (id INT PRIMARY KEY, v VARCHAR(4))"))
    migrate.upgrade(engine)
    cfg = config(urls, target, "open", f"qr-{unique}", schema, tmp_path / "ck")
    conf = str(write_toml(tmp_path / "c.toml", cfg))
    pipeline = cfg["pipeline"]["name"]
    rq = RowQuarantine(pipeline)
    refused = "writing 1 change(s) of upstream table shop.items failed: Data too long for column 'v'"
    with engine.begin() as c:
        rq.hold(c, ev(Op.INSERT, 1, "toolong", 100, 1), key_text([1]), kind="refused", reason=refused)  # id a
        rq.hold(c, ev(Op.INSERT, 2, "longer-value", 150, 2), key_text([2]), kind="refused", reason=refused)
        rq.hold(c, ev(Op.UPDATE, 1, "ok", 200, 3, old="toolong"), key_text([1]), kind="blocked",
                reason="blocked behind an earlier change of its key")
        rq.hold(c, ev(Op.INSERT, 3, "zzz", 250, 4), key_text([3]), kind="refused", reason="duplicate entry")
        ProgressStore(pipeline, "open").quarantine(c, KafkaMessage("t", 0, 9, b"k", b"\x00\xffnot json\x1b[2J"),
                                                   "cannot decode open message: bad header")
    ids = sorted(held(engine, pipeline))
    one_insert, two, one_update, three = ids

    # list --json: grouped by key, in commit order
    code, out, _ = cli(capsys, "quarantine", "list", "-c", conf, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["pipeline"] == pipeline and (doc["changes"], doc["keys"]) == (4, 3)
    assert [(g["table"], g["key"], g["changes"], g["ids"], g["first_commit_ts"], g["last_commit_ts"])
            for g in doc["groups"]] == [("items", "[1]", 2, [one_insert, one_update], 100, 200),
                                       ("items", "[2]", 1, [two], 150, 150), ("items", "[3]", 1, [three], 250, 250)]
    assert doc["groups"][0]["reason"] == refused and doc["groups"][0]["kinds"] == ["refused", "blocked"]
    assert doc["quarantined_messages"] == 1 and doc["messages"][0]["offset"] == 9
    code, out, _ = cli(capsys, "quarantine", "list", "-c", conf)
    assert code == 0 and "shop.items  key [1]  2 change(s)  commit ts 100 .. 200" in out
    code, out, _ = cli(capsys, "quarantine", "show", str(one_insert), "-c", conf)
    assert code == 0 and "'toolong'" in out and "id (key)" in out
    msg_id = doc["messages"][0]["id"]
    code, out, _ = cli(capsys, "quarantine", "show", str(msg_id), "--message", "-c", conf)
    assert code == 0 and "b'\\x00\\xffnot json\\x1b[2J'" in out and "\x1b" not in out

    # a retry the column still refuses: exit 4, nothing applied, the key stays held with the new reason
    code, out, err = cli(capsys, "quarantine", "retry", "-c", conf, "--table", "shop.items", "--key", "[2]")
    assert code == EXIT_APPLY, err
    assert ("Data too long" if target == "mariadb" else "value too long") in err and "stay held" in err
    rows = held(engine, pipeline)
    assert rows[two]["state"] == "held" and rows[two]["reason"].startswith("retry failed")
    assert rows[one_insert]["reason"] == refused  # another key: not touched
    # --all is one transaction: key [1] would fit, but key [2] still fails, so nothing is applied
    code, _, err = cli(capsys, "quarantine", "retry", "-c", conf, "--all")
    assert code == EXIT_APPLY, err
    with engine.connect() as c:
        assert c.execute(text(f"SELECT COUNT(*) FROM {q(schema)}.items")).scalar() == 0
    assert all(r["state"] == "held" for r in held(engine, pipeline).values())

    # discard another key: who and why are recorded
    code, out, err = cli(capsys, "quarantine", "discard", "-c", conf, "--id", str(three),
                         "--reason", "row exists upstream only by mistake")
    assert code == 0, err
    assert "may now differ from the upstream" in out and "applier verify" in out
    rows = held(engine, pipeline)
    assert rows[three]["state"] == "discarded" and rows[three]["note"] == "row exists upstream only by mistake"
    assert "pid" in rows[three]["resolved_by"] and rows[three]["resolved_at"] is not None

    # the cause fixed: every key's changes apply, in commit order, and are marked retried
    with engine.begin() as c:
        c.execute(text(f"ALTER TABLE {q(schema)}.items MODIFY v VARCHAR(16)" if target == "mariadb" else
                       f"ALTER TABLE {q(schema)}.items ALTER COLUMN v TYPE VARCHAR(16)"))
    running = ProgressStore(pipeline, "open")
    running.claim(engine)  # an applier run of the pipeline, started before the retry
    code, out, err = cli(capsys, "quarantine", "retry", "-c", conf, "--all")
    assert code == 0, err
    assert "retried 3 held change(s) of 2 key(s) in one transaction" in out
    assert f"shop.items -> {schema}.items  key [1]: 2 change(s) (insert, update), commit ts 100 .. 200" in out
    assert "exit code 6" in out
    with engine.connect() as c:
        got = c.execute(text(f"SELECT id, v FROM {q(schema)}.items ORDER BY id")).all()
    assert [tuple(r) for r in got] == [(1, "ok"), (2, "longer-value")]  # the update applied after the insert
    rows = held(engine, pipeline)
    assert [rows[i]["state"] for i in ids] == ["retried", "retried", "retried", "discarded"]
    assert "writer epoch" in rows[one_update]["note"]
    with engine.connect() as c, pytest.raises(WriterFenced):
        running.check_writer(c)  # the running pipeline is fenced and must restart

    # nothing held any more: list says so (exit 1 only when there is nothing at all to show)
    code, out, _ = cli(capsys, "quarantine", "list", "-c", conf, "--json", "--state", "all")
    doc = json.loads(out)
    assert code == 0 and sorted((g["key"], g["state"]) for g in doc["groups"]) == \
        [("[1]", "retried"), ("[2]", "retried"), ("[3]", "discarded")]
    code, out, err = cli(capsys, "quarantine", "retry", "-c", conf, "--all")
    assert code == 1 and "nothing matched" in err
    code, out, _ = cli(capsys, "status", "-c", conf, "--json")
    assert code == 0 and json.loads(out)["quarantined_rows"]["held_changes"] == 0
    with engine.begin() as c:  # leave no rows of this pipeline behind in the shared applier tables
        for t in (P.quarantined_rows, P.quarantine, P.writers):
            c.execute(t.delete().where(t.c.pipeline == pipeline))
    engine.dispose()
