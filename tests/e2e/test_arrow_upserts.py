"""The columnar lane's upserts written by the writers from Arrow (``Sink.takes_arrow``: PostgreSQL's CSV COPY,
MariaDB's LOAD DATA file) against the same lane writing them as Python rows: the processor on a generated
changefeed (DDL inside windows, key changes, TiCDC replays), in small micro-batches, once each way,
must leave the same tables (equal to upstream) and the same progress, and the Arrow way must have written rows.
The values at their edges are tests/e2e/test_pg_csv_copy.py's and test_mysql_arrow_load.py's."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from applier import migrate
from applier.codecs import get_decoder
from applier.devtools.changefeed import generate
from applier.processor import BatchProcessor
from applier.progress import ProgressStore
from applier.sinks import mysql_load as L
from applier.sinks.base import Sink
from applier.sinks.mysql import MySQLSink
from applier.sinks.postgres import PostgresSink
from tests.e2e.helpers import CountingTimer, target_url
from tests.e2e.streams_feed import PARTS, TOPIC, exact, feed, wl_records

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
@pytest.mark.parametrize("protocol", ["open", "canal-json"])
def test_the_lane_writes_from_arrow_what_it_writes_as_python_rows(urls, unique, drop_schema, monkeypatch, target,
                                                                   protocol) -> None:
    engine = create_engine(target_url(urls, target))
    if target == "mariadb":
        L.enable_local_infile(engine)
        # LOAD DATA for chunks of any size (mysql_load.MIN_ROWS is 128), both ways: small micro-batches
        init = L.LoadDataUpserter.__init__

        def any_size(self, *a, **k) -> None:
            init(self, *a, **k)
            self.min_rows = 1

        monkeypatch.setattr(L.LoadDataUpserter, "__init__", any_size)
    wl = generate(protocol, partitions=PARTS, txns=300, seed=13, replays=2)
    seen = {}
    try:
        for arrow in (True, False):
            if not arrow:
                for cls in (MySQLSink, PostgresSink):
                    monkeypatch.setattr(cls, "arrow_refusal", Sink.arrow_refusal)
            schema, name = f"arrow_{arrow}_{unique}", f"arrow-{protocol}-{arrow}-{unique}"
            drop_schema((target, schema))
            migrate.upgrade(engine)
            store = ProgressStore(name, protocol)
            store.claim(engine)
            with engine.connect() as c:
                state = store.load(c)
            counts = CountingTimer()
            proc = BatchProcessor(engine=engine, decoder=get_decoder(protocol), route=lambda s, t: (schema, t),
                                  store=store, state=state, partitions=[(TOPIC, p) for p in range(PARTS)],
                                  columnar=True, timer=counts)
            try:
                feed(proc, state, wl_records(wl))
            finally:
                proc.close()
            seen[arrow] = exact(engine, schema, name, wl)
            assert counts.counts.get("rows_columnar", 0) > 0
            from_arrow = counts.counts.get("rows_upserted_from_arrow", 0)
            assert (from_arrow > 0) if arrow else (from_arrow == 0), counts.counts
        assert seen[True] == seen[False]
    finally:
        engine.dispose()
