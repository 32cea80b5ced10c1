"""Apply streams (``[target] apply_streams``, issue 26, invariant 16) against real MariaDB and PostgreSQL, without
Spark: a generated changefeed (DDL inside windows, replays, key changes) fed through ``BatchProcessor`` in small
micro-batches with four streams must leave exactly the tables and the counts one stream leaves; a crash between two
streams' commits must resume to exactly that; a fenced run's streams write nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, func, select

from applier import migrate
from applier import progress as P
from applier.codecs import get_decoder
from applier.devtools.changefeed import generate
from applier.devtools.verify import compare_tables
from applier.events import KafkaMessage
from applier.processor import BatchProcessor
from applier.progress import PipelineState, ProgressStore, WriterFenced
from applier.streams.assign import target_stream
from tests.e2e.helpers import target_url

pytestmark = pytest.mark.e2e

TOPIC = "streams"
PARTS = 3
STREAMS = 4


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    engine = create_engine(target_url(urls, request.param))
    wl = generate("open", partitions=PARTS, txns=300, seed=11, replays=2)
    # a schema name that puts the tables in different streams (the stream is a hash of the target's name)
    schema = next(s for s in (f"st{i}_{unique}" for i in range(100))
                  if len({target_stream(s, t, STREAMS) for t in wl.expected}) == len(wl.expected))
    drop_schema((request.param, schema))
    drop_schema((request.param, f"{schema}_one"))  # the one-stream run beside it
    yield engine, schema, wl
    engine.dispose()


def _records(wl) -> list[KafkaMessage]:
    offsets: dict[int, int] = {}
    out = []
    for part, key, value in wl.messages:
        off = offsets.get(part, 0)
        offsets[part] = off + 1
        out.append(KafkaMessage(TOPIC, part, off, key, value))
    return out


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


def _feed(proc: BatchProcessor, state: PipelineState, records: list[KafkaMessage], per_batch: int = 40) -> None:
    """The records from each partition's restart offset on (what Spark re-reads after a restart), in batches."""
    start = {tp: cp.restart_offset for tp, cp in state.checkpoints.items()}
    todo = [r for r in records if r.offset >= start.get((r.topic, r.partition), 0)]
    for lo in range(0, len(todo), per_batch):
        proc.process(todo[lo:lo + per_batch])


def _counts(engine, name: str) -> tuple[int, int, dict[str, int], dict[int, int]]:
    with engine.connect() as c:
        applied, rows = c.execute(select(P.pipelines.c.applied_ts, P.pipelines.c.rows_applied)
                                  .where(P.pipelines.c.pipeline == name)).one()
        tables = dict(c.execute(select(P.tables.c.source_table, P.tables.c.rows_applied)
                                .where(P.tables.c.pipeline == name)).all())
        streams = dict(c.execute(select(P.streams.c.stream, P.streams.c.applied_ts)
                                 .where(P.streams.c.pipeline == name)).all())
    return applied, rows, tables, streams


def _exact(engine, schema: str, name: str, wl) -> dict[str, int]:
    """The target equals upstream, the pipeline is at the stream's last resolved ts and its row count is its
    tables'; returns the rows applied per table."""
    assert compare_tables(engine, schema, wl.expected) == []
    applied, rows, tables, _ = _counts(engine, name)
    assert applied == wl.final_ts
    assert rows == sum(tables.values())
    return tables


def test_four_streams_apply_what_one_applies(target, unique) -> None:
    engine, schema, wl = target
    records = _records(wl)
    seen = {}
    for streams in (1, STREAMS):
        name = f"streams-{streams}-{unique}"
        s = schema if streams == STREAMS else f"{schema}_one"
        proc, state = _processor(engine, name, s, streams)
        try:
            _feed(proc, state, records)
        finally:
            proc.close()
        seen[streams] = _exact(engine, s, name, wl)
        if streams == STREAMS:
            applied, _, _, stream_ts = _counts(engine, name)
            assert len(stream_ts) >= 2, f"the tables went to one stream: {stream_ts}"
            assert all(ts <= applied for ts in stream_ts.values())
            assert proc.applier.total.ddls >= 4  # type: ignore[union-attr] - the DDLs ran once, as barriers
    assert seen[STREAMS] == seen[1]
    assert {t: n for t, n in seen[1].items() if n} == {t: n for t, n in wl.row_changes.items() if t in seen[1] and n}


def test_a_crash_between_two_streams_commits_resumes_exactly(target, unique) -> None:
    engine, schema, wl = target
    records = _records(wl)
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
        _feed(proc, state, records)
    proc.close()
    _, rows_before, tables_before, _ = _counts(engine, name)
    assert tables_before.get("orders", 0) > 0

    again, resumed = _processor(engine, name, schema, STREAMS)
    assert resumed.table_floors, "the other streams committed past the marker"
    try:
        _feed(again, resumed, records)
    finally:
        again.close()
    tables = _exact(engine, schema, name, wl)
    assert {t: n for t, n in tables.items() if n} == {t: n for t, n in wl.row_changes.items() if t in tables and n}
    assert again.gate.stats["duplicates_dropped"] > 0  # the committed streams' re-read rows


def test_a_fenced_run_writes_nothing_from_any_stream(target, unique) -> None:
    engine, schema, wl = target
    records = _records(wl)
    name = f"streams-fenced-{unique}"
    proc, state = _processor(engine, name, schema, STREAMS)
    half = len(records) // 2
    _feed(proc, state, records[:half])
    before = _counts(engine, name)
    ProgressStore(name, "open").claim(engine)  # a second run takes the pipeline over
    with pytest.raises(WriterFenced):
        _feed(proc, state, records[half:])
    proc.close()
    assert _counts(engine, name) == before
    with engine.connect() as c:
        assert c.execute(select(func.count()).select_from(P.streams).where(P.streams.c.pipeline == name)).scalar() >= 1
