"""An undecodable message under on_decode_error = "quarantine" blocks its table (invariant 12) on both targets:
every later change of that table is held behind it, the other tables go on, `applier quarantine retry` refuses
the table until the operator dealt with the message (made its change by hand, then discarded it), and then
applies the held changes in commit order, so the table ends equal to upstream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from applier.cli import main
from applier.devtools.encoders.open import encode_open
from applier.events import DDL, Column, KafkaMessage, Op, Resolved, RowChange
from tests.e2e.helpers import POS, TOPIC, Feed, config, processor, target_url, write_toml

pytestmark = pytest.mark.e2e

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"qu_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    yield request.param, engine, schema
    engine.dispose()


def ins(table: str, ts: int, key: int, v: str) -> RowChange:
    return RowChange("shop", table, ts, Op.INSERT, None, {"id": key, "v": v}, COLS, POS)


def upd(table: str, ts: int, key: int, old: str, v: str) -> RowChange:
    return RowChange("shop", table, ts, Op.UPDATE, {"id": key, "v": old}, {"id": key, "v": v}, COLS, POS)


def rows(kind: str, engine, schema: str, table: str) -> list[tuple]:
    q = (lambda n: f"`{n}`") if kind == "mariadb" else (lambda n: f'"{n}"')
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(text(f"SELECT id, v FROM {q(schema)}.{q(table)} ORDER BY id"))]


def test_an_undecodable_message_blocks_its_table_until_dealt_with(target, urls, unique, tmp_path: Path,
                                                                   capsys) -> None:
    kind, engine, schema = target
    topic = f"qu-{unique}"
    conf = str(write_toml(tmp_path / "c.toml", config(urls, kind, "open", topic, schema, tmp_path / "ck")))
    name = f"p-{topic}"
    route = lambda s, t: (schema, t)  # noqa: E731 - the config's route: shop.* -> schema
    f = Feed()
    proc = processor(engine, name, route, on_decode_error="quarantine")
    proc.process(f.msgs(DDL("shop", "a", 100, "CREATE TABLE `a` (`id` INT PRIMARY KEY, `v` VARCHAR(16))", POS),
                        DDL("shop", "b", 101, "CREATE TABLE `b` (`id` INT PRIMARY KEY, `v` VARCHAR(16))", POS),
                        ins("a", 110, 1, "one"), ins("b", 111, 1, "one"), Resolved(150, POS)))
    # the upstream sets a.1 to "two" at ts 200, but that message arrives damaged (its key still names shop.a)
    key, value = encode_open(upd("a", 200, 1, "one", "two"))
    damaged = KafkaMessage(TOPIC, 0, f.offset, key, value.replace(b'"two"', b'{"no": 1}', 1))
    f.offset += 1
    later = f.msgs(upd("a", 210, 1, "two", "three"), ins("a", 220, 2, "new"), ins("b", 230, 2, "two"),
                   Resolved(300, POS))
    proc.process([damaged, *later])
    assert rows(kind, engine, schema, "b") == [(1, "one"), (2, "two")]  # the other table goes on
    assert rows(kind, engine, schema, "a") == [(1, "one")]  # nothing after the damaged message overtook it

    assert main(["quarantine", "list", "-c", conf, "--json"]) == 0
    listing = capsys.readouterr().out
    assert '"*"' in listing and '"undecodable"' in listing, listing
    assert main(["quarantine", "retry", "-c", conf, "--table", "shop.a", "--key", "[1]"]) == 4
    err = capsys.readouterr().err
    assert "blocked by the undecodable message at" in err and "discard" in err, err
    assert rows(kind, engine, schema, "a") == [(1, "one")]

    # the operator makes the damaged message's change by hand, releases the table, and retries the rest
    q = (lambda n: f"`{n}`") if kind == "mariadb" else (lambda n: f'"{n}"')
    with engine.begin() as c:
        c.execute(text(f"UPDATE {q(schema)}.{q('a')} SET v = 'two' WHERE id = 1"))
    marker = next(g for g in json.loads(listing)["groups"] if g["key"] == "*")
    assert marker["kinds"] == ["undecodable"] and marker["changes"] == 1
    assert main(["quarantine", "discard", "-c", conf, "--table", "shop.a", "--key", "*",
                 "--reason", "applied a.1 = two by hand"]) == 0
    assert main(["quarantine", "retry", "-c", conf, "--table", "shop.a"]) == 0
    capsys.readouterr()
    assert rows(kind, engine, schema, "a") == [(1, "three"), (2, "new")]
