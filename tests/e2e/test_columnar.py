"""The columnar lane end to end (issue 25): a TiCDC-shaped Canal-JSON changefeed through real Kafka, Spark's
Python workers and real MariaDB and PostgreSQL, once with ``[pipeline] columnar = true`` and once with ``false``,
each into its own schema. Both replicas must equal the upstream row for row, record the same progress (applied
ts, rows applied per table), and the lane must have written most rows (a lane that silently fell back to the
per-event path everywhere would pass the equality and fail here).

The changefeed has what the lane must get right around: CREATE TABLE and ALTER TABLE inside windows (segments
cut at the DDL), key-changing updates and unique-key swaps, deletes and re-inserts, TiCDC-restart replays (copies
dropped at release), micro-batches cutting transactions in two (row batches cut at the resolved ts), and a table
routed away.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.config import parse_config
from applier.devtools.changefeed import generate, produce
from applier.devtools.verify import compare_tables
from applier.pipeline import run
from tests.e2e.helpers import CountingTimer, config, target_url

pytestmark = pytest.mark.e2e


def _progress(engine, pipeline: str) -> tuple[int, dict[str, int]]:
    with engine.connect() as c:
        applied = c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == pipeline)).scalar()
        rows = dict(c.execute(select(P.tables.c.source_table, P.tables.c.rows_applied)
                              .where(P.tables.c.pipeline == pipeline)).all())
    return applied, rows


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
@pytest.mark.parametrize("per_batch", [400, 100_000])
def test_the_lane_applies_what_the_event_path_applies(urls, spark, unique, drop_schema, tmp_path, target,
                                                      per_batch) -> None:
    topic = f"e2e-columnar-{target}-{per_batch}-{unique}"
    wl = generate("canal-json", partitions=3, txns=600, seed=11, replays=4)
    produce(urls.kafka, topic, wl.messages, partitions=3)
    engine = create_engine(target_url(urls, target))
    seen = {}
    try:
        for columnar in (True, False):
            schema = f"col_{'on' if columnar else 'off'}_{unique}"
            drop_schema((target, schema))
            cfg = config(urls, target, "canal-json", topic, schema, tmp_path / f"ckpt-{columnar}",
                         max_offsets_per_trigger=per_batch, decode_on="executors", columnar=columnar)
            cfg["pipeline"]["name"] = f"p-{topic}-{columnar}"
            settings = parse_config(cfg)
            counts = CountingTimer()
            run(settings, until_caught_up=True, spark=spark, progress=False, timer=counts)
            assert compare_tables(engine, schema, wl.expected) == []
            applied, rows = _progress(engine, settings.pipeline.name)
            assert applied == wl.final_ts
            seen[columnar] = rows
            lane = counts.counts.get("rows_columnar", 0)
            if columnar:
                total = sum(rows.values())
                assert lane > total // 2, f"the lane wrote {lane} of {total} row changes"
            else:
                assert lane == 0
        assert seen[True] == seen[False]  # rows applied per table: copies dropped alike
    finally:
        engine.dispose()
