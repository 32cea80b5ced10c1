"""Start and stop at a TSO on the real services (issue 13, point 5): Kafka, Spark, MariaDB and PostgreSQL.

TiDB's way to start a replica is a snapshot at a TSO S (Dumpling or BR) and a changefeed from S. Here the topic
holds a whole generated Canal-JSON changefeed (CREATE TABLEs, an ALTER TABLE halfway, key changes, replays), and
the test writes the snapshot as of S into the target itself: the tables as the DDL up to S made them, and every
row as of S, both worked out from the generator's list of upstream changes.

1. ``source.start_ts = S`` and ``run(settings, until_ts=T)``: the new pipeline skips every change committed at or
   before S (none of the CREATE TABLEs runs again, and no row change up to S is counted as applied), applies the
   rest up to T and stops by itself, leaving the replica equal to upstream as of exactly T, with
   ``applier_pipelines.applied_ts == T`` although Kafka's resolved ts is far beyond it.
   Run again with the same T, it has nothing to do and returns at once.
2. A second run without ``until_ts`` continues from there (start_ts is ignored now: the progress wins, and says so)
   and ends equal to upstream's final state; a run with T now is refused (the replica cannot go back).
"""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import MetaData, Table, create_engine, select

from applier import progress as P
from applier.config import ConfigError, parse_config
from applier.devtools.changefeed import Workload, apply_target_ddl, generate, produce
from applier.devtools.verify import compare_tables
from applier.events import DDL, RowChange
from applier.pipeline import router_for, run
from tests.e2e.helpers import config, state_as_of, target_url

pytestmark = pytest.mark.e2e

TXNS = 150
MAX_OFFSETS = 200  # several micro-batches before T, and Kafka's resolved ts well past T when the run stops
SEED = 7


def seed_snapshot(engine, wl: Workload, ts: int, route) -> None:
    """What Dumpling + a load would leave in the target: the routed tables as the DDL up to ``ts`` made them, and
    their rows as of ``ts``."""
    ddl = [ch for ch in wl.changes if isinstance(ch, DDL) and ch.commit_ts <= ts and route(ch.schema, ch.table)]
    apply_target_ddl(engine, ddl, route)
    with engine.begin() as conn:
        for table, rows in state_as_of(wl, ts).items():
            schema, name = route("shop", table)
            if rows:
                conn.execute(Table(name, MetaData(), schema=schema, autoload_with=conn).insert(), list(rows.values()))


def commit_ts_at(wl: Workload, fraction: float) -> int:
    """The commit ts of the transaction that far into the stream (rows of one transaction share it)."""
    commits = sorted({ch.commit_ts for ch in wl.changes if isinstance(ch, RowChange)})
    return commits[int(len(commits) * fraction)]


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_start_at_a_snapshot_stop_at_exactly_until_ts_then_continue(urls, spark, unique, drop_schema, tmp_path,
                                                                    caplog, target) -> None:
    topic = f"e2e-tso-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    wl = generate("canal-json", partitions=3, txns=TXNS, seed=SEED, replays=3)
    produce(urls.kafka, topic, wl.messages, partitions=3)
    s, t = commit_ts_at(wl, 0.3), commit_ts_at(wl, 0.7)
    [alter] = [ch for ch in wl.changes if isinstance(ch, DDL) and "ADD COLUMN" in ch.query]
    assert s < alter.commit_ts < t < wl.final_ts  # the snapshot predates the ALTER; the first run applies it

    cfg = config(urls, target, "canal-json", topic, schema, tmp_path / "ckpt", max_offsets_per_trigger=MAX_OFFSETS,
                 trigger_interval="200 ms")
    cfg["source"]["start_ts"] = s
    settings = parse_config(cfg)
    name = settings.pipeline.name
    engine = create_engine(target_url(urls, target))
    try:
        seed_snapshot(engine, wl, s, router_for(settings).route)
        assert compare_tables(engine, schema, state_as_of(wl, s)) == []

        res = run(settings, until_ts=t, spark=spark, progress=False)
        assert res.stopped_at == t and res.report.applied_ts == t
        assert res.report.global_resolved > t and res.report.held > 0  # Kafka's resolved ts was past T: capped
        assert compare_tables(engine, schema, state_as_of(wl, t)) == []
        routed = [ch for ch in wl.changes if isinstance(ch, RowChange) and ch.table != "audit_log"]
        with engine.connect() as c:
            applied, rows = c.execute(select(P.pipelines.c.applied_ts, P.pipelines.c.rows_applied)
                                      .where(P.pipelines.c.pipeline == name)).one()
            history = c.execute(select(P.ddl_history.c.query).where(P.ddl_history.c.pipeline == name)).scalars().all()
        assert applied == t
        # exactly the changes in (S, T]: nothing up to the snapshot again, nothing after T
        assert rows == sum(1 for ch in routed if s < ch.commit_ts <= t)
        assert history == [alter.query]  # the CREATE TABLEs are in the snapshot
        res = run(settings, until_ts=t, spark=spark, progress=False)  # already there: nothing to do, no waiting
        assert res.stopped_at == t and res.batches == 0

        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="applier.pipeline"):
            res = run(settings, until_caught_up=True, spark=spark, progress=False)
        assert res.stopped_at is None
        assert any(f"source.start_ts = {s} is ignored" in r.getMessage() for r in caplog.records)
        assert compare_tables(engine, schema, wl.expected) == []
        with engine.connect() as c:
            applied, rows = c.execute(select(P.pipelines.c.applied_ts, P.pipelines.c.rows_applied)
                                      .where(P.pipelines.c.pipeline == name)).one()
        assert applied == wl.final_ts
        assert rows == sum(1 for ch in routed if ch.commit_ts > s)
        with pytest.raises(ConfigError, match="cannot go back"):  # the replica is past T now
            run(settings, until_ts=t, spark=spark, progress=False)
    finally:
        engine.dispose()
