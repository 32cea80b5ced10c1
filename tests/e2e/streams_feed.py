"""What the apply streams' end-to-end tests share (tests/e2e/test_apply_streams.py, test_apply_on_executors.py):
a generated changefeed on a target whose tables fall in different streams, fed through a processor in small
micro-batches from each partition's restart offset, and the checks that the replica and its counts are exact."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.devtools.changefeed import generate
from applier.devtools.verify import compare_tables
from applier.events import KafkaMessage
from applier.processor import BatchProcessor
from applier.progress import PipelineState
from applier.streams.assign import target_stream
from tests.e2e.helpers import target_url

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


def wl_records(wl) -> list[KafkaMessage]:
    offsets: dict[int, int] = {}
    out = []
    for part, key, value in wl.messages:
        off = offsets.get(part, 0)
        offsets[part] = off + 1
        out.append(KafkaMessage(TOPIC, part, off, key, value))
    return out


def feed(proc: BatchProcessor, state: PipelineState, records: list[KafkaMessage], per_batch: int = 40) -> None:
    """The records from each partition's restart offset on (what Spark re-reads after a restart), in batches."""
    start = {tp: cp.restart_offset for tp, cp in state.checkpoints.items()}
    todo = [r for r in records if r.offset >= start.get((r.topic, r.partition), 0)]
    for lo in range(0, len(todo), per_batch):
        proc.process(todo[lo:lo + per_batch])


def counts(engine, name: str) -> tuple[int, int, dict[str, int], dict[int, int]]:
    with engine.connect() as c:
        applied, rows = c.execute(select(P.pipelines.c.applied_ts, P.pipelines.c.rows_applied)
                                  .where(P.pipelines.c.pipeline == name)).one()
        tables = dict(c.execute(select(P.tables.c.source_table, P.tables.c.rows_applied)
                                .where(P.tables.c.pipeline == name)).all())
        streams = dict(c.execute(select(P.streams.c.stream, P.streams.c.applied_ts)
                                 .where(P.streams.c.pipeline == name)).all())
    return applied, rows, tables, streams


def exact(engine, schema: str, name: str, wl) -> dict[str, int]:
    """The target equals upstream, the pipeline is at the stream's last resolved ts and its row count is its
    tables'; returns the rows applied per table."""
    assert compare_tables(engine, schema, wl.expected) == []
    applied, rows, tables, _ = counts(engine, name)
    assert applied == wl.final_ts
    assert rows == sum(tables.values())
    return tables
