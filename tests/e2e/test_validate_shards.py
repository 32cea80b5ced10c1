"""`applier validate --target` on real MariaDB and PostgreSQL (issue 12, point 3): after two shards are merged by
the routes (their CREATE TABLE replicated, rows applied), the report names the merge, each shard's primary key
and the target's; one shared key is a warning (exit 0), a shard with another key a problem (exit 1); an
unreachable target exits 5 without printing the password."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import create_engine

from applier.cli import EXIT_TARGET, main
from applier.config import load_config
from applier.events import DDL, Column, Op, Resolved, RowChange
from applier.pipeline import router_for
from tests.e2e.helpers import POS, Feed, config, processor, target_url, write_toml

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"vs_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    yield request.param, engine, schema
    engine.dispose()


def merged_config(urls, kind: str, schema: str, unique: str, tmp_path) -> str:
    cfg = config(urls, kind, "open", f"vs-{unique}", schema, tmp_path / "ckpt")
    cfg["route"] = [{"match": "up.shard*", "schema": schema, "table": "merged"}]
    return str(write_toml(tmp_path / "applier.toml", cfg))


def replicate(engine, conf: str, create1: str, create2: str, key2: tuple[str, ...]) -> None:
    """Two shards created by replicated DDL and one row each applied into the merged table."""
    settings = load_config(conf)
    proc = processor(engine, settings.pipeline.name, router_for(settings).route)

    def row(table: str, ts: int, key: tuple[str, ...], i: int) -> RowChange:
        cols = tuple(Column(n, t, nullable=n not in key, key=n in key)
                     for n, t in (("id", "int"), ("region", "varchar"), ("v", "int")))
        return RowChange("up", table, ts, Op.INSERT, None, {"id": i, "region": table, "v": i}, cols, POS)

    proc.process(Feed().msgs(DDL("up", "shard1", 100, create1, POS), DDL("up", "shard2", 101, create2, POS),
                             row("shard1", 110, ("id",), 1), row("shard2", 111, key2, 2), Resolved(150, POS)))


CREATE = "CREATE TABLE `{}` (`id` INT NOT NULL, `region` VARCHAR(16) NOT NULL, `v` INT, PRIMARY KEY ({}))"


def test_a_shared_key_is_reported_as_a_warning(target, urls, unique, tmp_path, capsys) -> None:
    kind, engine, schema = target
    conf = merged_config(urls, kind, schema, unique, tmp_path)
    replicate(engine, conf, CREATE.format("shard1", "`id`"), CREATE.format("shard2", "`id`"), ("id",))
    assert main(["validate", "-c", conf, "--target"]) == 0
    out = capsys.readouterr().out
    assert f"{schema}.merged <- up.shard1, up.shard2" in out
    assert "shard up.shard1: primary key (id)" in out and "shard up.shard2: primary key (id)" in out
    assert f"target {schema}.merged: primary key (id)" in out
    assert "WARNING: all 2 shards merged into" in out and "ONE row in the target" in out
    assert "0 problem(s), 1 warning(s)" in out

    assert main(["validate", "-c", conf, "--target", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)["shard_merges"]
    [m] = doc["merges"]
    assert (m["target"], m["target_key"], doc["problems"], doc["warnings"]) == (f"{schema}.merged", ["id"], 0, 1)
    assert [s["primary_key"] for s in m["shards"]] == [["id"], ["id"]]


def test_a_shard_with_another_key_is_a_problem(target, urls, unique, tmp_path, capsys) -> None:
    kind, engine, schema = target
    conf = merged_config(urls, kind, schema, unique, tmp_path)
    replicate(engine, conf, CREATE.format("shard1", "`id`"), CREATE.format("shard2", "`id`, `region`"),
              ("id", "region"))
    assert main(["validate", "-c", conf, "--target"]) == 1
    out = capsys.readouterr().out
    assert "shard up.shard2: primary key (id, region)" in out
    assert "up.shard1: (id); up.shard2: (id, region)" in out
    assert f"target {schema}.merged has primary key (id), but up.shard2 has (id, region)" in out
    assert "differ only in region overwrite each other" in out
    assert "2 problem(s), 0 warning(s)" in out


@pytest.mark.parametrize("kind", ["mariadb", "postgres"])
def test_an_unreachable_target_exits_5_without_the_password(kind, urls, unique, tmp_path, capsys) -> None:
    cfg = config(urls, kind, "open", f"vs-{unique}", "x", tmp_path / "ckpt")
    scheme = "mysql+pymysql" if kind == "mariadb" else "postgresql+psycopg"
    cfg["target"]["url"] = f"{scheme}://applier:N0tTh1sS3cret@127.0.0.1:1/db"
    conf = str(write_toml(tmp_path / "applier.toml", cfg))
    assert main(["validate", "-c", conf, "--target"]) == EXIT_TARGET
    out = capsys.readouterr()
    assert "cannot use the target database" in out.err and "127.0.0.1" in out.err
    assert "N0tTh1sS3cret" not in out.out + out.err
