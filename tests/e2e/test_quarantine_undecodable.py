"""An undecodable message under on_decode_error = "quarantine" blocks (invariant 12), on both targets: its table
when the message still names it, its Kafka partition when not even that can be read. Every later change of what it
blocks is held behind it while the rest goes on; `applier quarantine retry` decodes the message again with the
decoder the config gives now and applies it first, then what was held behind it, so the tables end equal to
upstream; a message that still cannot be decoded stays held with the new error until it is discarded.

"Now" differs from "then" the way an applier upgrade does: the run decodes with :class:`OlderApplier`, which
cannot read one value the current decoder reads (the CLI's retry builds the current decoder from the config)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from applier.cli import main
from applier.codecs import get_decoder
from applier.events import DDL, Column, DecodeError, KafkaMessage, Op, Resolved, RowChange
from tests.e2e.helpers import POS, TOPIC, Feed, config, processor, target_url, write_toml

pytestmark = pytest.mark.e2e

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))


class OlderApplier:
    """The Open Protocol decoder of an applier that could not read the messages at ``offsets`` (a bug fixed
    since); it still reads their table from the key, as the real one does."""

    def __init__(self, offsets: set[int]) -> None:
        self.real = get_decoder("open")
        self.gated = self.real.gated
        self.offsets = offsets

    def decode(self, msg: KafkaMessage) -> list:
        if msg.offset in self.offsets:
            raise DecodeError(msg.position, "this applier cannot read the value of column v", protocol="open")
        return self.real.decode(msg)

    def table_of(self, msg: KafkaMessage):
        return self.real.table_of(msg)


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


def test_an_undecodable_message_blocks_until_retried_or_discarded(target, urls, unique, tmp_path: Path,
                                                                 capsys) -> None:
    kind, engine, schema = target
    topic = f"qu-{unique}"
    conf = str(write_toml(tmp_path / "c.toml", config(urls, kind, "open", topic, schema, tmp_path / "ck")))
    name = f"p-{topic}"
    route = lambda s, t: (schema, t)  # noqa: E731 - the config's route: shop.* -> schema
    f = Feed()
    proc = processor(engine, name, route, on_decode_error="quarantine")
    proc.decoder = OlderApplier({5})  # offset 5: the message of a.1 = "two" below (after five of setup)
    proc.process(f.msgs(DDL("shop", "a", 100, "CREATE TABLE `a` (`id` INT PRIMARY KEY, `v` VARCHAR(16))", POS),
                        DDL("shop", "b", 101, "CREATE TABLE `b` (`id` INT PRIMARY KEY, `v` VARCHAR(16))", POS),
                        ins("a", 110, 1, "one"), ins("b", 111, 1, "one"), Resolved(150, POS)))
    # the upstream sets a.1 to "two" at ts 200: this applier cannot decode it, but the key still names shop.a
    proc.process(f.msgs(upd("a", 200, 1, "one", "two"), upd("a", 210, 1, "two", "three"), ins("a", 220, 2, "new"),
                        ins("b", 230, 2, "two"), Resolved(300, POS)))
    assert rows(kind, engine, schema, "b") == [(1, "one"), (2, "two")]  # the other table goes on
    assert rows(kind, engine, schema, "a") == [(1, "one")]  # nothing after the message overtook it
    # then bytes that are no message at all: not even their table can be read, so the partition is blocked
    garbage = KafkaMessage(TOPIC, 0, f.offset, b"\x00junk", b"\xff\xfe")
    f.offset += 1
    proc.process([garbage, *f.msgs(ins("b", 310, 3, "three"), Resolved(400, POS))])
    assert rows(kind, engine, schema, "b") == [(1, "one"), (2, "two")]

    assert main(["quarantine", "list", "-c", conf, "--json"]) == 0
    blocks = [g for g in json.loads(capsys.readouterr().out)["groups"] if g["key"] == "*"]
    assert [(g["schema"], g["table"], g["kinds"]) for g in blocks] == [
        ("shop", "a", ["undecodable"]), ("", "", ["undecodable"])]
    # the fixed applier decodes a's message: it is applied first, then what waited behind it
    assert main(["quarantine", "retry", "-c", conf, "--table", "shop.a", "--key", "[1]"]) == 0
    out = capsys.readouterr().out
    assert "decoded again, 1 row change(s)" in out, out
    assert main(["quarantine", "retry", "-c", conf, "--table", "shop.a"]) == 0
    capsys.readouterr()
    assert rows(kind, engine, schema, "a") == [(1, "three"), (2, "new")]
    # b.3 was read after the garbage: its retry takes the garbage along, which still cannot be decoded
    assert main(["quarantine", "retry", "-c", conf, "--table", "shop.b"]) == 4
    err = capsys.readouterr().err
    assert "still cannot be decoded" in err and "table unknown: partition 0" in err, err
    assert rows(kind, engine, schema, "b") == [(1, "one"), (2, "two")]
    garbage_id = blocks[1]["ids"][0]
    assert main(["quarantine", "discard", "-c", conf, "--id", str(garbage_id), "--reason", "not a TiCDC message"]) == 0
    assert main(["quarantine", "retry", "-c", conf, "--table", "shop.b"]) == 0
    capsys.readouterr()
    assert rows(kind, engine, schema, "b") == [(1, "one"), (2, "two"), (3, "three")]
    assert main(["quarantine", "list", "-c", conf, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["groups"] == []
