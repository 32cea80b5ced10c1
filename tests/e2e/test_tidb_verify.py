"""``applier verify --upstream`` against a real TiDB that keeps changing (issue 27, point 1).

The upstream is a TiDB (applier/devtools/services/tidb.py); its changes reach Kafka as the Canal-JSON changefeed of
tests/e2e/tidb_feed.py (TiDB's own commit ts, a resolved ts after each transaction), and the pipeline applies them
to PostgreSQL. Then TiDB keeps changing from a thread while ``applier verify`` compares: it must read TiDB at the
replica's applied resolved ts (``tidb_snapshot``), so nothing TiDB commits meanwhile shows as a difference (the
test checks that TiDB's live rows did differ from the replica's, so the comparison could have failed). Injected
differences in the replica are then found, exactly those keys, and the --fix-sql file repairs them; the rest of the
changefeed applied, verify is equal at the new TSO. A TiDB whose GC passed the applied ts (its safe point moved as
a GC run moves it) stops verify with exit 5 naming tidb_gc_life_time and what to do; an unreachable TiDB with exit 5
naming the host and --upstream. The MySQL-upstream path (read live) is tests/e2e/test_verify_command.py's.
"""

from __future__ import annotations

import random

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.cli import main
from applier.config import parse_config
from applier.devtools.changefeed import produce
from applier.devtools.services import tidb as tidb_service
from applier.pipeline import run
from tests.e2e.helpers import apply_sql_file, target_url, write_toml
from tests.e2e.tidb_feed import ITEMS, Churn, Feed, connect, item, random_txn

pytestmark = pytest.mark.e2e

TARGET = "postgres"  # TiDB -> PostgreSQL: the checksums cannot run in SQL on both sides, rows are read and hashed


def _verify(capsys, cfg: str, upstream: str, *extra: str) -> tuple[int, str, str]:
    code = main(["verify", "-c", cfg, "--upstream", upstream, "--chunk-rows", "40", *extra])
    out = capsys.readouterr()
    print(out.out, out.err)
    return code, out.out, out.err


def _live_rows(url: str, schema: str) -> dict[int, tuple]:
    conn = connect(url, schema)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id, name, price, note, qty FROM items")
            return {r[0]: tuple(r[1:]) for r in cur.fetchall()}
    finally:
        conn.close()


def test_verify_reads_tidb_at_the_applied_tso_while_tidb_keeps_changing(urls, spark, tidb, tidb_database, unique,
                                                                         drop_schema, tmp_path, capsys) -> None:
    up, rep = f"tv_{unique}", f"tvr_{unique}"
    topic = f"e2e-tidb-verify-{unique}"
    tidb_database(up)
    drop_schema((TARGET, rep))
    rng = random.Random(3)
    feed = Feed(tidb.url, up, partitions=2)
    try:
        feed.create(ITEMS)
        for lo in range(1, 241, 40):
            feed.insert("items", *(item(rng, i) for i in range(lo, lo + 40)))
        for _ in range(40):
            feed.txn(random_txn(feed, rng))
        first = feed.last_ts
        produce(urls.kafka, topic, feed.records(), partitions=2)
        cfg = {
            "pipeline": {"name": f"p-{topic}", "checkpoint_dir": str(tmp_path / "ckpt")},
            "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": "canal-json"},
            "target": {"url": target_url(urls, TARGET)},
            "route": [{"match": "*.*", "ignore": True}, {"match": f"{up}.*", "schema": rep}],
        }
        conf = str(write_toml(tmp_path / "c.toml", cfg))
        settings = parse_config(cfg)
        run(settings, until_caught_up=True, spark=spark, progress=False)
        engine = create_engine(target_url(urls, TARGET))
        try:
            with engine.connect() as c:
                assert c.execute(select(P.pipelines.c.applied_ts)
                                 .where(P.pipelines.c.pipeline == settings.pipeline.name)).scalar() == first
        finally:
            engine.dispose()
        at_first = feed.rows_at("items", first)

        # TiDB keeps changing (nothing of it reaches Kafka yet) while verify reads it
        churn = Churn(feed).start(at_least=10)
        try:
            code, out, err = _verify(capsys, conf, tidb.url)
            assert code == 0, out + err
            assert f"consistent: upstream TiDB at TSO {first} (tidb_snapshot)" in out
            n = len(at_first)
            assert f"{up}.items -> {rep}.items: " in out and f"{n} rows upstream, {n} in replica: equal" in out
            live = _live_rows(tidb.url, up)
            assert live.keys() != at_first.keys() or any(
                live[k] != (r["name"], r["price"], r["note"], r["qty"]) for k, r in at_first.items()), \
                "TiDB did not change after the applied ts: the comparison proved nothing"

            # differences injected into the replica are found (only those, while TiDB still changes)
            keys = sorted(at_first)
            gone, changed = keys[3], keys[7]
            q = lambda n: f'"{n}"'  # noqa: E731
            engine = create_engine(target_url(urls, TARGET))
            try:
                with engine.begin() as c:
                    c.exec_driver_sql(f"DELETE FROM {q(rep)}.{q('items')} WHERE id = {gone}")
                    c.exec_driver_sql(f"UPDATE {q(rep)}.{q('items')} SET note = 'CHANGED' WHERE id = {changed}")
                    c.exec_driver_sql(f"INSERT INTO {q(rep)}.{q('items')} (id, name) VALUES (999999, 'stray')")
            finally:
                engine.dispose()
            fix = tmp_path / "fix.sql"
            code, out, err = _verify(capsys, conf, tidb.url, "--fix-sql", str(fix))
            assert code == 1, out + err
            assert f"    missing in replica (1):\n      id={gone}\n" in out
            assert "    extra in replica (1):\n      id=999999\n" in out
            assert f"    different (1):\n      id={changed}  columns: note\n" in out
            assert "3 differences (1 missing, 1 extra, 1 different) in 1 table" in out
            apply_sql_file(urls, TARGET, fix)
            code, out, err = _verify(capsys, conf, tidb.url)
            assert code == 0, out + err
        finally:
            made = churn.stop()
        assert made >= 10

        # the rest of the changefeed: equal again at the new applied ts, which is now TiDB's latest state
        produce(urls.kafka, topic, feed.records(after=first), partitions=2)
        run(settings, until_caught_up=True, spark=spark, progress=False)
        code, out, err = _verify(capsys, conf, tidb.url)
        assert code == 0, out + err
        n = len(feed.state["items"])
        assert f"consistent: upstream TiDB at TSO {feed.last_ts} (tidb_snapshot)" in out
        assert f"{n} rows upstream, {n} in replica: equal" in out

        # TiDB's GC passed the applied ts: exit 5, naming the setting and the fix, the password masked
        value = tidb_service.set_gc_safe_point(tidb.url, feed.last_ts + (1000 << 18))
        try:
            code, out, err = _verify(capsys, conf, tidb.url)
        finally:
            tidb_service.reset_gc_safe_point(tidb.url)
        assert code == 5, out + err
        assert f"TiDB cannot read at the replica's applied resolved ts {feed.last_ts}" in err
        assert "GC safe point" in err and value[:8] in err.replace("-", "")  # TiDB names the safe point's date
        assert "tidb_gc_life_time" in err and "applier run" in err
        assert ":applier@" not in out + err

        # an unreachable TiDB: exit 5 naming the host and --upstream
        code, out, err = _verify(capsys, conf, tidb_service.tidb_url(1))
        assert code == 5 and "127.0.0.1:1" in err and "--upstream" in err
    finally:
        feed.close()
