"""The Debezium JDBC sink (applier.devtools.peers.debezium_jdbc) for real: Kafka Connect standalone on a tiny bench
topic (500 row changes of TiCDC's Debezium JSON with the TiDB extension, 2 partitions) into MariaDB.

* With the transforms TiCDC's stream needs (DDL messages and ``op: "m"`` watermarks dropped), the run ends when the
  sink's consumer group has committed each partition up to its last row change (every partition ends with
  watermarks here, which the sink never commits), the process is gone, and the target equals the generator's
  final rows (the bench's row-by-row verification).
* Without the watermark filter a task fails on the first watermark: the run ends with the task's error, promptly,
  and the process is gone.

Cost: two JVM starts (about 10 s each on this machine). The first run on a machine without the jars in
``$APPLIER_HOME/jars`` resolves them from Maven Central first (about 20 s with an empty ~/.m2, 5-7 s with a warm
one, plus a few seconds for debezium-scripting); later runs find them in the cache.
"""

from __future__ import annotations

import os
import time

import pytest
from sqlalchemy import create_engine

from applier.devtools.bench_parts import create_schema, produce_stream
from applier.devtools.bench_peer import expected_digests, verify_rows
from applier.devtools.bench_stream import generate_bench
from applier.devtools.peers import debezium_jdbc as dj

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def topic(urls):
    """One small topic for both cases; its name carries a token conftest deletes at the end."""
    import uuid

    from tests.e2e.helpers import made_topic

    token = uuid.uuid4().hex[:8]
    made_topic(token)
    name = f"e2e-peer-{token}"
    wl = generate_bench("debezium", tables=2, partitions=2, events=500, big_txn_rows=0, seed=3, hot_keys=4,
                        dup_fraction=0.05, tidb_extension=True)
    produce_stream(urls.kafka, name, wl.messages(), partitions=2)
    return name, wl


@pytest.fixture
def target(urls, unique, drop_schema):
    """A new MariaDB database for one sink run (dropped afterwards) and an engine on the server."""
    schema = f"peer_{unique}"
    drop_schema(("mariadb", schema))
    engine = create_engine(urls.mariadb_url)
    create_schema(engine, schema)
    yield schema, engine
    engine.dispose()


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_sink_catches_up_and_its_target_verifies(urls, topic, target, unique) -> None:
    name, wl = topic
    schema, engine = target
    run = dj.run_sink(bootstrap=urls.kafka, topic=name, target_url=urls.mariadb_url, schema=schema, run_id=unique,
                      column_types=wl.column_types, tidb_extension=True, timeout=120)
    assert _gone(run.pid)
    assert run.rest_seconds is not None and run.first_commit_seconds is not None
    assert 0 < run.rest_seconds <= run.first_commit_seconds <= run.seconds

    # caught up: every partition committed up to its last row change, not to its end (trailing watermarks)
    offsets = dj.topic_offsets(urls.kafka, name)
    ends = dj.sink_ends(offsets, dj.read_range(urls.kafka, name))
    assert all(ends[p][1] < offsets[p][1] for p in offsets)
    from confluent_kafka.admin import AdminClient
    committed = dj.committed_offsets(AdminClient({"bootstrap.servers": urls.kafka}),
                                     dj.consumer_group(dj.connector_name(unique)), name, ends)
    assert dj.caught_up(committed, ends), (committed, ends)

    check = verify_rows(engine, schema, wl, expected_digests(wl, wl.columns), wl.columns)
    assert check["ok"], check
    assert check["rows_equal"] == sum(cs.rows for cs in wl.expected.values()) > 0


def test_a_failing_task_ends_the_run_with_its_error(urls, topic, target, unique) -> None:
    name, wl = topic
    schema, _ = target
    t = time.perf_counter()
    with pytest.raises(dj.PeerError) as err:  # no watermark filter: the first op "m" fails the task
        dj.run_sink(bootstrap=urls.kafka, topic=name, target_url=urls.mariadb_url, schema=schema, run_id=unique,
                    column_types=wl.column_types, tidb_extension=False, timeout=120)
    assert time.perf_counter() - t < 90
    msg = str(err.value)
    assert "FAILED" in msg and "after is not a valid field name" in msg, msg
    assert err.value.pid is not None and _gone(err.value.pid)
