"""``applier status`` (applier.report) on an in-memory SQLite database: lags against a fixed clock, the partition
that holds the global resolved ts back, per-table freshness, held rows including partition blocks, and the
shapes a missing pipeline or an unmigrated target give. Rows are inserted directly into the progress tables so
that each figure the report prints is known exactly."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Iterator

import pytest
from sqlalchemy import create_engine, insert
from sqlalchemy.engine import Engine

from applier import progress as P
from applier.report import format_status, held_rows, lag_seconds, resolved_stuck_by, status, tso_physical_ms

PIPE = "p1"
NOW = 1_700_000_100.0  # the fixed clock every lag is measured against
UPDATED = dt.datetime(2023, 11, 14, 22, 15, 0)


def tso(seconds_before_now: float, logical: int = 7) -> int:
    """A TiDB TSO whose physical time is ``seconds_before_now`` before NOW (the logical bits must not count)."""
    return (round((NOW - seconds_before_now) * 1000) << 18) | logical


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = create_engine("sqlite://")  # one in-memory database per test (the pool keeps its connection)
    P.metadata.create_all(eng)
    yield eng
    eng.dispose()


def add_pipeline(engine: Engine, applied_ts: int, *, pipeline: str = PIPE) -> None:
    with engine.begin() as c:
        c.execute(insert(P.pipelines).values(pipeline=pipeline, protocol="canal-json", applied_ts=applied_ts,
                                             batches=3, rows_applied=42, updated_at=UPDATED))


def add_partitions(engine: Engine, *parts: tuple[str, int, int], pipeline: str = PIPE) -> None:
    with engine.begin() as c:
        for topic, n, resolved in parts:
            c.execute(insert(P.partitions).values(pipeline=pipeline, topic=topic, kafka_partition=n,
                                                  restart_offset=10 * n, next_offset=10 * n + 5,
                                                  resolved_ts=resolved, updated_at=UPDATED))


def add_table(engine: Engine, schema: str, table: str, applied_ts: int, rows: int = 1) -> None:
    with engine.begin() as c:
        c.execute(insert(P.tables).values(pipeline=PIPE, source_schema=schema, source_table=table,
                                          target_schema="main", target_table=table, applied_ts=applied_ts,
                                          rows_applied=rows, updated_at=UPDATED))


def add_held(engine: Engine, schema: str, table: str, key: str, commit_ts: int, topic: str, partition: int,
             offset: int, *, kind: str = "blocked", state: str = "held") -> None:
    with engine.begin() as c:
        c.execute(insert(P.quarantined_rows).values(
            pipeline=PIPE, source_schema=schema, source_table=table, row_key=key, commit_ts=commit_ts, topic=topic,
            kafka_partition=partition, kafka_offset=offset, kind=kind, state=state, reason="r", event="{}",
            created_at=UPDATED))


# ---- clock and TSO ----------------------------------------------------------------------------------------

def test_tso_physical_time_ignores_the_logical_counter_and_zero_has_no_lag() -> None:
    assert tso_physical_ms((1234 << 18) | (2**18 - 1)) == 1234
    assert lag_seconds(tso(2.5), NOW) == 2.5
    assert lag_seconds(0, NOW) is None


# ---- lags, freshness, the partition holding the global resolved ts back -----------------------------------

def test_lags_per_table_freshness_and_the_lowest_partition_with_a_fixed_clock(engine: Engine) -> None:
    applied = tso(2.5)
    add_pipeline(engine, applied)
    add_partitions(engine, ("t", 0, tso(1.0)), ("t", 1, tso(4.0)), ("t", 2, tso(1.5)))
    add_table(engine, "shop", "items", tso(60.0), rows=40)  # last changed a minute ago
    add_table(engine, "shop", "orders", applied, rows=2)  # changed in the last applied batch
    st = status(engine, PIPE, consistency="transactional (resolved-ts gated)", now=NOW)

    assert st["applied_ts"] == applied and st["consistent_as_of_ts"] == applied
    assert st["applied_lag_seconds"] == 2.5
    assert st["global_resolved_ts"] == tso(4.0) and st["global_resolved_lag_seconds"] == 4.0
    # t[1] is the minimum; the next slowest partition (t[2]) is 2.5 s ahead of it
    assert st["resolved_stuck_by"] == [
        {"topic": "t", "partition": 1, "resolved_ts": tso(4.0), "reason": "lowest", "behind_seconds": 2.5}]
    assert st["tables"] == [
        {"source": "shop.items", "target": "main.items", "applied_ts": tso(60.0), "rows_applied": 40,
         "last_change_lag_seconds": 60.0, "freshness_lag_seconds": 2.5},
        {"source": "shop.orders", "target": "main.orders", "applied_ts": applied, "rows_applied": 2,
         "last_change_lag_seconds": 2.5, "freshness_lag_seconds": 2.5},
    ]
    # the keys that existed before stay as they were
    assert {k: st[k] for k in ("pipeline", "exists", "protocol", "batches", "rows_applied", "updated_at", "ddl",
                               "quarantined_messages", "writer")} == {
        "pipeline": PIPE, "exists": True, "protocol": "canal-json", "batches": 3, "rows_applied": 42,
        "updated_at": "2023-11-14T22:15:00Z", "ddl": {}, "quarantined_messages": 0, "writer": None}
    assert st["partitions"][1] == {"topic": "t", "partition": 1, "restart_offset": 10, "next_offset": 15,
                                   "resolved_ts": tso(4.0)}

    text = format_status(st).splitlines()
    assert text[:4] == [
        f"pipeline {PIPE} (canal-json, transactional (resolved-ts gated))",
        f"  applied resolved ts  {applied}  (lag 2.5 s)",
        f"  global resolved ts   {tso(4.0)}  (lag 4.0 s)",
        "  global resolved ts held back by: t[1] (2.5 s behind the next slowest partition)",
    ]
    assert text[-2:] == [
        f"    shop.items -> main.items  applied ts {tso(60.0)}  row changes 40  last change 60.0 s ago  "
        "freshness lag 2.5 s",
        f"    shop.orders -> main.orders  applied ts {applied}  row changes 2  last change 2.5 s ago  "
        "freshness lag 2.5 s",
    ]
    # the counts are of row changes applied (an update counts once), not rows in the table: say so
    assert text[4].startswith("  batches 3, row changes applied 42, DDL {}, ")
    assert json.loads(json.dumps(st, default=str))["resolved_stuck_by"][0]["behind_seconds"] == 2.5


def test_partitions_that_never_reported_a_resolved_ts_are_named_as_the_reason(engine: Engine) -> None:
    add_pipeline(engine, 0)
    # t[0] is behind t[1], but t[2] and u[0] have never reported: they are why the global resolved ts is 0
    add_partitions(engine, ("t", 0, tso(9.0)), ("t", 1, tso(1.0)), ("t", 2, 0), ("u", 0, 0))
    st = status(engine, PIPE, now=NOW)
    assert st["global_resolved_ts"] == 0 and st["global_resolved_lag_seconds"] is None
    assert st["applied_lag_seconds"] is None
    assert st["resolved_stuck_by"] == [
        {"topic": "t", "partition": 2, "resolved_ts": 0, "reason": "never_reported", "behind_seconds": None},
        {"topic": "u", "partition": 0, "resolved_ts": 0, "reason": "never_reported", "behind_seconds": None},
    ]
    text = format_status(st).splitlines()
    assert text[1:4] == [
        "  applied resolved ts  0  (lag -)",
        "  global resolved ts   0  (lag -)",
        "  global resolved ts held back by: t[2], u[0] (never reported a resolved ts)",
    ]


def test_a_single_partition_that_never_reported_is_named() -> None:
    assert resolved_stuck_by([{"topic": "t", "kafka_partition": 0, "resolved_ts": 0}]) == [
        {"topic": "t", "partition": 0, "resolved_ts": 0, "reason": "never_reported", "behind_seconds": None}]


def test_nothing_holds_back_partitions_at_the_same_resolved_ts_or_a_single_one() -> None:
    same = [{"topic": "t", "kafka_partition": n, "resolved_ts": tso(3.0)} for n in range(3)]
    assert resolved_stuck_by(same) == []
    assert resolved_stuck_by(same[:1]) == []
    assert resolved_stuck_by([]) == []


def test_every_partition_tied_at_the_minimum_is_named() -> None:
    parts = [{"topic": "t", "kafka_partition": 0, "resolved_ts": tso(5.0, 1)},
             {"topic": "t", "kafka_partition": 1, "resolved_ts": tso(0.25)},
             {"topic": "t", "kafka_partition": 2, "resolved_ts": tso(5.0, 1)}]
    stuck = resolved_stuck_by(parts)
    assert [(s["partition"], s["reason"], s["behind_seconds"]) for s in stuck] == [(0, "lowest", 4.75),
                                                                                   (2, "lowest", 4.75)]


def test_a_long_list_of_silent_partitions_is_shortened_on_the_text_line_only(engine: Engine) -> None:
    add_pipeline(engine, tso(1.0))
    add_partitions(engine, *[("t", n, 0) for n in range(11)])
    st = status(engine, PIPE, now=NOW)
    assert len(st["resolved_stuck_by"]) == 11
    line = format_status(st).splitlines()[3]
    assert line == ("  global resolved ts held back by: t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], … (3 more) "
                    "(never reported a resolved ts)")


def test_a_control_character_in_a_topic_is_escaped_on_the_stuck_line(engine: Engine) -> None:
    add_pipeline(engine, tso(1.0))
    add_partitions(engine, ("ok", 0, tso(1.0)), ("bad\x1b[31m", 0, 0))
    line = format_status(status(engine, PIPE, now=NOW)).splitlines()[3]
    assert line == "  global resolved ts held back by: bad\\x1b[31m[0] (never reported a resolved ts)"


def test_status_reads_the_clock_when_no_now_is_given(engine: Engine) -> None:
    add_pipeline(engine, (1 << 18))  # 1 ms after the epoch: the lag is the clock's age, decades
    st = status(engine, PIPE)
    assert st["applied_lag_seconds"] > 50 * 365 * 86400


# ---- held rows and partition blocks -----------------------------------------------------------------------

def test_held_rows_show_a_partition_block_by_its_kafka_position(engine: Engine) -> None:
    add_pipeline(engine, tso(1.0))
    add_held(engine, "shop", "items", "[1]", 100, "t", 0, 5)
    add_held(engine, "shop", "items", "[1]", 120, "t", 0, 9)
    add_held(engine, "shop", "items", "[2]", 90, "t", 0, 4, state="retried")  # released: not counted
    add_held(engine, "", "", "*", 0, "t", 3, 41, kind="undecodable")  # the partition block
    held = held_rows(engine, PIPE)
    assert held == {"held_changes": 3, "blocked_keys": 2, "first_blocked": [
        {"table": None, "key": "*", "changes": 1, "first_commit_ts": 0, "partition_block": True,
         "topic": "t", "partition": 3, "offset": 41},
        {"table": "shop.items", "key": "[1]", "changes": 2, "first_commit_ts": 100},
    ]}
    st = status(engine, PIPE, now=NOW)
    assert st["quarantined_rows"] == held
    assert ("  held row changes: 3 under 2 blocked key(s): (unknown table) at t:3:41, shop.items [1] "
            "(applier quarantine list)") in format_status(st).splitlines()


def test_partition_blocks_of_two_partitions_stay_two_entries_and_a_table_block_keeps_its_name(
        engine: Engine) -> None:
    add_held(engine, "shop", "items", "*", 0, "t", 1, 7, kind="undecodable")  # a table block: its table is known
    add_held(engine, "", "", "*", 0, "t", 2, 30, kind="undecodable")
    add_held(engine, "", "", "*", 0, "u", 0, 12, kind="undecodable")
    add_held(engine, "shop", "items", "[5]", 300, "t", 1, 80)
    firsts = held_rows(engine, PIPE)["first_blocked"]
    assert [(f["table"], f["key"], f.get("topic"), f.get("partition"), f.get("offset")) for f in firsts] == [
        (None, "*", "t", 2, 30), (None, "*", "u", 0, 12), ("shop.items", "*", None, None, None),
        ("shop.items", "[5]", None, None, None)]
    assert [f["table"] for f in held_rows(engine, PIPE, first=2)["first_blocked"]] == [None, None]
    text = format_status({"pipeline": PIPE, "exists": False, "writer": None,
                          "quarantined_rows": held_rows(engine, PIPE)})
    assert "(unknown table) at t:2:30, (unknown table) at u:0:12, shop.items *, shop.items [5]" in text


def test_no_held_rows_says_none(engine: Engine) -> None:
    add_pipeline(engine, tso(1.0))
    st = status(engine, PIPE, now=NOW)
    assert st["quarantined_rows"] == {"held_changes": 0, "blocked_keys": 0, "first_blocked": []}
    assert "  held row changes: none" in format_status(st).splitlines()


# ---- a pipeline that does not exist, tables before migrations ---------------------------------------------

def test_a_pipeline_that_never_applied_a_batch(engine: Engine) -> None:
    add_pipeline(engine, tso(1.0), pipeline="other")
    add_partitions(engine, ("t", 0, 0), pipeline="other")
    st = status(engine, PIPE, consistency="c", now=NOW)
    assert st == {"pipeline": PIPE, "exists": False, "consistency": "c", "writer": None,
                  "quarantined_rows": {"held_changes": 0, "blocked_keys": 0, "first_blocked": []}}
    assert format_status(st) == (f"pipeline {PIPE}: no progress recorded yet (it has never applied a batch)\n"
                                 "  writer: none claimed yet\n"
                                 "  held row changes: none")


def test_status_on_tables_before_the_quarantine_and_writer_migrations() -> None:
    later = {P.quarantine.name, P.quarantined_rows.name, P.writers.name, P.streams.name}
    eng = create_engine("sqlite://")
    try:
        P.metadata.create_all(eng, tables=[t for t in P.metadata.sorted_tables if t.name not in later])
        add_pipeline(eng, tso(2.0))
        add_partitions(eng, ("t", 0, tso(2.0)))
        st = status(eng, PIPE, now=NOW)
        assert (st["quarantined_messages"], st["quarantined_rows"], st["writer"]) == (None, None, None)
        assert st["streams"] == []
        assert st["resolved_stuck_by"] == [] and st["global_resolved_lag_seconds"] == 2.0
        text = format_status(st)
        assert ", quarantined -, updated 2023-11-14T22:15:00Z" in text
        assert "  writer: none claimed yet" in text.splitlines()
        assert "held row changes" not in text and "held back by" not in text
    finally:
        eng.dispose()


def test_writer_ddl_and_quarantined_messages_are_counted(engine: Engine) -> None:
    add_pipeline(engine, tso(1.0))
    with engine.begin() as c:
        c.execute(insert(P.writers).values(pipeline=PIPE, epoch=4, holder="host pid 7", claimed_at=UPDATED,
                                           heartbeat_at=UPDATED + dt.timedelta(seconds=30)))
        for off in (3, 8):
            c.execute(insert(P.quarantine).values(pipeline=PIPE, topic="t", kafka_partition=0, kafka_offset=off,
                                                  reason="r", created_at=UPDATED))
        c.execute(insert(P.quarantine).values(pipeline="other", topic="t", kafka_partition=0, kafka_offset=3,
                                              reason="r", created_at=UPDATED))
        for i, state in enumerate(("done", "done", "skipped")):
            c.execute(insert(P.ddl_history).values(pipeline=PIPE, ddl_key=str(i), commit_ts=i, source_schema="s",
                                                   source_table="t", query="q", statements="[]", state=state,
                                                   detail="", started_at=UPDATED))
    st: dict[str, Any] = status(engine, PIPE, now=NOW)
    assert st["quarantined_messages"] == 2 and st["ddl"] == {"done": 2, "skipped": 1}
    assert st["writer"] == {"epoch": 4, "holder": "host pid 7", "claimed_at": "2023-11-14T22:15:00Z",
                            "heartbeat_at": "2023-11-14T22:15:30Z"}
    assert ("  writer: epoch 4, host pid 7, claimed 2023-11-14T22:15:00Z, last transaction 2023-11-14T22:15:30Z"
            in format_status(st).splitlines())


def test_each_apply_stream_shows_its_applied_ts(engine: Engine) -> None:
    add_pipeline(engine, tso(3.0))
    with engine.begin() as c:
        for n, ago, rows in ((1, 1.0, 30), (0, 3.0, 12)):
            c.execute(insert(P.streams).values(pipeline=PIPE, stream=n, applied_ts=tso(ago), rows_applied=rows,
                                               updated_at=UPDATED))
        c.execute(insert(P.streams).values(pipeline="other", stream=2, applied_ts=tso(9.0), rows_applied=1,
                                           updated_at=UPDATED))
    st = status(engine, PIPE, now=NOW)
    assert st["applied_ts"] == tso(3.0)
    assert st["streams"] == [{"stream": 0, "applied_ts": tso(3.0), "rows_applied": 12, "lag_seconds": 3.0},
                             {"stream": 1, "applied_ts": tso(1.0), "rows_applied": 30, "lag_seconds": 1.0}]
    text = format_status(st).splitlines()
    assert [t for t in text if t.startswith("  stream ")] == [
        f"  stream 0  applied ts {tso(3.0)}  (lag 3.0 s)  row changes 12",
        f"  stream 1  applied ts {tso(1.0)}  (lag 1.0 s)  row changes 30"]


def test_no_stream_lines_without_apply_streams(engine: Engine) -> None:
    add_pipeline(engine, tso(3.0))
    st = status(engine, PIPE, now=NOW)
    assert st["streams"] == [] and not [t for t in format_status(st).splitlines() if "stream " in t]
