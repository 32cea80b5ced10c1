"""Apply streams (``[target] apply_streams``, issue 26, invariant 16) against real MariaDB and PostgreSQL, without
Spark: a generated changefeed (DDL inside windows, replays, key changes) fed through ``BatchProcessor`` in small
micro-batches with four streams must leave exactly the tables and the counts one stream leaves; a crash between two
streams' commits must resume to exactly that; a fenced run's streams write nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from applier import migrate
from applier import progress as P
from applier.codecs import get_decoder
from applier.processor import BatchProcessor
from applier.progress import PipelineState, ProgressStore, WriterFenced
from applier.streams.assign import target_stream
from tests.e2e.streams_feed import PARTS, STREAMS, TOPIC, counts, exact, feed, target, wl_records  # noqa: F401

pytestmark = pytest.mark.e2e


def _processor(engine, name: str, schema: str, streams: int) -> tuple[BatchProcessor, PipelineState]:
    """A run's processor and the progress it resumed from."""
    migrate.upgrade(engine)
    store = ProgressStore(name, "open")
    store.claim(engine)
    with engine.connect() as c:
        state = store.load(c)
    proc = BatchProcessor(engine=engine, decoder=get_decoder("open"), route=lambda s, t: (schema, t), store=store,
                          state=state, partitions=[(TOPIC, p) for p in range(PARTS)], columnar=True,
                          apply_streams=streams)
    return proc, state


def test_four_streams_apply_what_one_applies(target, unique) -> None:
    engine, schema, wl = target
    records = wl_records(wl)
    seen = {}
    for streams in (1, STREAMS):
        name = f"streams-{streams}-{unique}"
        s = schema if streams == STREAMS else f"{schema}_one"
        proc, state = _processor(engine, name, s, streams)
        try:
            feed(proc, state, records)
        finally:
            proc.close()
        seen[streams] = exact(engine, s, name, wl)
        if streams == STREAMS:
            applied, _, _, stream_ts = counts(engine, name)
            assert len(stream_ts) >= 2, f"the tables went to one stream: {stream_ts}"
            assert all(ts <= applied for ts in stream_ts.values())
            assert proc.applier.total.ddls >= 4  # type: ignore[union-attr] - the DDLs ran once, as barriers
    assert seen[STREAMS] == seen[1]
    assert {t: n for t, n in seen[1].items() if n} == {t: n for t, n in wl.row_changes.items() if t in seen[1] and n}


def test_a_crash_between_two_streams_commits_resumes_exactly(target, unique) -> None:
    engine, schema, wl = target
    records = wl_records(wl)
    name = f"streams-crash-{unique}"
    proc, state = _processor(engine, name, schema, STREAMS)
    victim = proc.applier.streams[target_stream(schema, "customers", STREAMS)]  # type: ignore[union-attr]
    calls = [0]
    real = victim.apply

    def dies_on_the_fifth(share, **kw):
        calls[0] += 1
        if calls[0] == 5:
            raise RuntimeError("killed between two streams' commits")
        return real(share, **kw)

    victim.apply = dies_on_the_fifth  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="killed between"):
        feed(proc, state, records)
    proc.close()
    _, rows_before, tables_before, _ = counts(engine, name)
    assert tables_before.get("orders", 0) > 0

    again, resumed = _processor(engine, name, schema, STREAMS)
    assert resumed.table_floors, "the other streams committed past the marker"
    try:
        feed(again, resumed, records)
    finally:
        again.close()
    tables = exact(engine, schema, name, wl)
    assert {t: n for t, n in tables.items() if n} == {t: n for t, n in wl.row_changes.items() if t in tables and n}
    assert again.gate.stats["duplicates_dropped"] > 0  # the committed streams' re-read rows


def test_a_fenced_run_writes_nothing_from_any_stream(target, unique) -> None:
    engine, schema, wl = target
    records = wl_records(wl)
    name = f"streams-fenced-{unique}"
    proc, state = _processor(engine, name, schema, STREAMS)
    half = len(records) // 2
    feed(proc, state, records[:half])
    before = counts(engine, name)
    ProgressStore(name, "open").claim(engine)  # a second run takes the pipeline over
    with pytest.raises(WriterFenced):
        feed(proc, state, records[half:])
    proc.close()
    assert counts(engine, name) == before
    with engine.connect() as c:
        assert c.execute(select(func.count()).select_from(P.streams).where(P.streams.c.pipeline == name)).scalar() >= 1
