"""``applier load`` of an export made by the real Dumpling from a real TiDB, then the changefeed spanning its TSO
(issue 27, point 1).

TiDB (applier/devtools/services/tidb.py) holds two tables: ``items`` (400 rows, changed all the time by a thread)
and ``t_types`` (every column type, with values that trip up text formats: quotes, backslashes, ``NULL`` and
``\\N`` as strings, line breaks, binary bytes, zero dates, BIT, DECIMAL scales, ENUM/SET, JSON), and ``skip_me``,
which the routes ignore. Dumpling, built with TiDB, exports the database while ``items`` keeps changing, at its
snapshot TSO S, in several files per table (``--filesize 4KiB``): SQL into MariaDB, gzipped CSV into PostgreSQL.
Every transaction, before and after S, is in the Canal-JSON changefeed of tests/e2e/tidb_feed.py. ``applier load`` seeds the target (``applier verify --upstream``
then finds it equal to TiDB at S), the pipeline drops exactly the changes committed at or before S and applies the
rest (an ADD COLUMN among them), and the target ends equal to TiDB. A second load is refused (exit 2); ``--replace``
(one table dropped by hand before, so created again) reloads, restarts the pipeline at S, and the next run ends equal
to TiDB again.

An export cut short stops ``applier load`` with exit 2, naming the file and the fix, and nothing loaded: a data file
that ends mid-row (SQL) or whose gzip stream stops early (CSV), and an export without the ``metadata`` file Dumpling
writes last (what a Dumpling that was stopped or failed leaves).
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from sqlalchemy import create_engine, inspect, select

from applier import progress as P
from applier.cli import main
from applier.config import parse_config
from applier.devtools.changefeed import produce
from applier.dumpling import parse_metadata
from applier.pipeline import run
from tests.e2e.helpers import target_url, write_toml
from tests.e2e.tidb_feed import ITEMS, Churn, Feed, Table, item
from tests.e2e.tricky_values import TRICKY, TYPES

pytestmark = pytest.mark.e2e

T_TYPES = Table("t_types", dict(TYPES))
SKIP_ME = Table("skip_me", {"id": "int", "v": "varchar(32)"})  # in the export, ignored by the routes


def _types_rows(rng: random.Random) -> list[dict]:
    """Rows with every tricky value at least once, in order, the rest random."""
    rows = []
    for i in range(1, 61):
        row = {"id": i}
        for c in TYPES:
            if c != "id":
                vals = TRICKY[c]
                row[c] = vals[i - 1] if i <= len(vals) else (None if rng.random() < 0.15 else rng.choice(vals))
        rows.append(row)
    return rows


def dumpling(tidb, db: str, out: Path, filetype: str, *extra: str) -> Path:
    """Run the real Dumpling on TiDB database ``db`` into ``out``."""
    argv = [str(tidb.dumpling), "--host", "127.0.0.1", "--port", str(tidb.port), "--user", "applier",
            "--password", "applier", "--database", db, "--output", str(out), "--filetype", filetype,
            "--filesize", "4KiB", "--threads", "2", "--logfile", str(out.parent / f"dumpling-{out.name}.log"),
            "--status-addr", "127.0.0.1:0", *extra]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"dumpling failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return out


def _data_files(export: Path, db: str, table: str) -> list[Path]:
    return sorted(p for p in export.iterdir() if p.name.startswith(f"{db}.{table}.") and "-schema" not in p.name)


def _verify(capsys, conf: str, upstream: str) -> tuple[int, str]:
    code = main(["verify", "-c", conf, "--upstream", upstream, "--max-keys", "5"])
    r = capsys.readouterr()
    return code, r.out + r.err


CASES = [("sql", "mariadb", ()), ("csv", "postgres", ("--compress", "gzip"))]


@pytest.mark.parametrize("filetype,target,extra", CASES, ids=[f"{f}-{t}" for f, t, _ in CASES])
def test_load_of_a_real_dumpling_export_then_the_changefeed_converges(urls, spark, tidb, tidb_database, unique,
                                                                       drop_schema, tmp_path, capsys, filetype,
                                                                       target, extra) -> None:
    up, schema = f"tl_{unique}_{filetype}", f"tlr_{unique}"
    topic = f"e2e-tidb-load-{target}-{unique}"
    tidb_database(up)
    drop_schema((target, schema))
    rng = random.Random(9)
    feed = Feed(tidb.url, up, partitions=2)
    try:
        feed.create(ITEMS)
        feed.create(T_TYPES)
        feed.create(SKIP_ME)
        for lo in range(1, 401, 50):
            feed.insert("items", *(item(rng, i) for i in range(lo, lo + 50)))
        feed.insert("t_types", *_types_rows(rng))
        feed.insert("skip_me", *({"id": i, "v": f"not routed {i}"} for i in range(1, 6)))
        churn = Churn(feed, seed=rng.randrange(1000)).start(at_least=10)
        try:
            export = dumpling(tidb, up, tmp_path / "export", filetype, *extra)
            churn.wait_for(len(churn.commits) + 10)  # TiDB goes on changing after the snapshot
        finally:
            churn.stop()
        for k in (1, 2, 3):  # and t_types too, after S
            feed.update("t_types", k, c="after S", tx=None, j='{"after": "S"}')
        feed.add_column("items", "extra", "varchar(16)")  # a DDL after S, and rows that use it
        live = sorted(feed.state["items"])
        feed.txn([("update", "items", k, {"extra": v}) for k, v in zip(live[:4], TRICKY["extra"])]
                 + [("insert", "items", dict(item(rng, 5000), extra="new"))])
        snapshot = parse_metadata((export / "metadata").read_text()).snapshot_ts
        assert snapshot is not None
        stamps = [ts for ts, *_ in feed.history]
        assert min(stamps) < snapshot < max(stamps)
        for t in ("items", "t_types"):
            files = _data_files(export, up, t)
            assert len(files) >= 2 and all(p.name.endswith(f".{filetype}" + (".gz" if extra else "")) for p in files), \
                [p.name for p in export.iterdir()]

        produce(urls.kafka, topic, feed.records(), partitions=2)
        cfg = {
            "pipeline": {"name": f"p-{topic}", "checkpoint_dir": str(tmp_path / "ckpt")},
            "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": "canal-json"},
            "target": {"url": target_url(urls, target)},
            "route": [{"match": "*.*", "ignore": True}, {"match": f"{up}.*", "schema": schema},
                      {"match": f"{up}.skip_*", "ignore": True}],
        }
        conf = str(write_toml(tmp_path / "c.toml", cfg))
        settings = parse_config(cfg)
        assert main(["load", "-c", conf, "--dumpling", str(export), "--threads", "2"]) == 0
        out = capsys.readouterr().out
        assert f"starts after snapshot ts {snapshot}" in out and f"ignored by the routes: {up}.skip_me" in out, out
        # the load alone is TiDB at S: verify reads TiDB at the applied ts, which the load set to S
        code, out = _verify(capsys, conf, tidb.url)
        assert code == 0 and f"upstream TiDB at TSO {snapshot}" in out and out.count("in replica: equal") == 3, out

        res = run(settings, until_caught_up=True, spark=spark, progress=False)
        # exactly the changes of the routed tables committed at or before S were dropped (CREATE TABLE copies too)
        at_or_before = sum(1 for m in feed.messages if m.commit_ts <= snapshot
                           and orjson.loads(m.value).get("type") != "TIDB_WATERMARK"
                           and orjson.loads(m.value)["table"] != "skip_me")
        assert res.gate["duplicates_dropped"] == at_or_before
        engine = create_engine(target_url(urls, target))
        try:
            with engine.connect() as c:
                assert c.execute(select(P.pipelines.c.applied_ts)
                                 .where(P.pipelines.c.pipeline == settings.pipeline.name)).scalar() == feed.last_ts
        finally:
            engine.dispose()
        code, out = _verify(capsys, conf, tidb.url)
        assert code == 0 and f"upstream TiDB at TSO {feed.last_ts}" in out and out.count("in replica: equal") == 3, \
            out
        n = len(feed.state["items"])
        assert f"{n} rows upstream, {n} in replica: equal" in out

        # a second load is refused: the pipeline has progress and a recorded load
        assert main(["load", "-c", conf, "--dumpling", str(export)]) == 2
        err = capsys.readouterr().err
        assert "already has progress" in err and "applier_loads" in err and "--replace" in err, err
        # --replace: t_types dropped by the operator is created again at the snapshot's shape, items (with the
        # column added after S) emptied and reloaded, the pipeline restarted at S; its next run replays the
        # changes after S, the ADD COLUMN already in effect, and ends equal to TiDB again
        engine = create_engine(target_url(urls, target))
        try:
            q = "`" if target == "mariadb" else '"'
            with engine.begin() as c:
                c.exec_driver_sql(f"DROP TABLE {q}{schema}{q}.{q}t_types{q}")
            assert main(["load", "-c", conf, "--dumpling", str(export), "--replace"]) == 0, capsys.readouterr()
            capsys.readouterr()
            with engine.connect() as c:
                assert c.execute(select(P.pipelines.c.applied_ts)
                                 .where(P.pipelines.c.pipeline == settings.pipeline.name)).scalar() == snapshot
                assert not inspect(c).has_table("skip_me", schema=schema)
        finally:
            engine.dispose()
        run(settings, until_caught_up=True, spark=spark, progress=False)
        code, out = _verify(capsys, conf, tidb.url)
        assert code == 0 and f"upstream TiDB at TSO {feed.last_ts}" in out and out.count("in replica: equal") == 3, \
            out
    finally:
        feed.close()

    _cut_short(urls, target, export, up, filetype, bool(extra), tmp_path, capsys, unique)


def _cut_short(urls, target: str, export: Path, up: str, filetype: str, gz: bool, tmp_path: Path, capsys,
               unique: str) -> None:
    """The same export cut short, into a new schema of a new pipeline: exit 2, nothing loaded."""
    schema = f"tlc_{unique}"
    cfg = {
        "pipeline": {"name": f"p-cut-{unique}-{target}", "checkpoint_dir": str(tmp_path / "ckpt-cut")},
        "source": {"bootstrap_servers": urls.kafka, "topics": ["none"], "protocol": "canal-json"},
        "target": {"url": target_url(urls, target)},
        "route": [{"match": "*.*", "schema": schema}],
    }
    conf = str(write_toml(tmp_path / "cut.toml", cfg))
    engine = create_engine(target_url(urls, target))
    try:
        # a data file that ends in the middle of a row (the last file Dumpling was writing when it stopped)
        cut = tmp_path / "cut"
        shutil.copytree(export, cut)
        victim = _data_files(cut, up, "items")[-1]
        data = victim.read_bytes()
        if gz:  # the compressed stream stops two thirds of the way
            victim.write_bytes(data[:len(data) * 2 // 3])
        else:  # a dozen bytes into a row
            victim.write_bytes(data[:data.rfind(b"\n", 0, len(data) * 2 // 3) + 12])
        assert main(["load", "-c", conf, "--dumpling", str(cut)]) == 2
        err = capsys.readouterr().err
        assert victim.name in err and "cut short" in err and "Take the export again" in err, err
        assert ("cannot be read to its end" if gz else f"ends in the middle of a {'statement' if filetype == 'sql' else 'record'}") in err, err
        _nothing_loaded(engine, target, schema, cfg["pipeline"]["name"])

        # an export without the metadata file Dumpling writes last: refused before anything is written
        cut2 = tmp_path / "cut2"
        shutil.copytree(export, cut2)
        (cut2 / "metadata").unlink()
        assert main(["load", "-c", conf, "--dumpling", str(cut2), "--replace"]) == 2
        err = capsys.readouterr().err
        assert "has no 'metadata' file" in err and "unfinished" in err and "Take the export again" in err, err
        _nothing_loaded(engine, target, schema, cfg["pipeline"]["name"])
    finally:
        engine.dispose()


def _nothing_loaded(engine, target: str, schema: str, pipeline: str) -> None:
    with engine.connect() as c:
        if schema in inspect(c).get_schema_names() and "items" in inspect(c).get_table_names(schema=schema):
            q = (lambda n: f"`{n}`") if target == "mariadb" else (lambda n: f'"{n}"')  # noqa: E731
            assert c.exec_driver_sql(f"SELECT count(*) FROM {q(schema)}.{q('items')}").scalar() == 0
        assert c.execute(select(P.loads).where(P.loads.c.pipeline == pipeline)).first() is None
        assert c.execute(select(P.pipelines).where(P.pipelines.c.pipeline == pipeline)).first() is None
