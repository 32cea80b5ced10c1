"""Apply streams written in Spark tasks (``[target] apply_on``, applier/streams/remote.py), without Spark: the
split of a segment into shares and their pickling, the decision that a retried task's share was committed by an
earlier attempt, the executors' applier cache, the error a task sends back, the driver's handling of the
tasks' results, and the configuration key."""

from __future__ import annotations

import pickle
import threading

import pyarrow as pa
import pytest

from applier.apply import ApplyStats
from applier.columnar.rows import META, Shape, build_batch
from applier.config import ConfigError, parse_config
from applier.events import DDL, Column, Op, RowChange, SourcePosition
from applier.sinks import ApplyError
from applier.streams.apply import StreamApplier
from applier.streams.assign import StreamAssignment, split_segment
from applier.streams.remote import (
    ApplierCache, RemoteContext, RemoteTaskError, Share, ShareResult, already_committed, cache_key, committed_upto,
    portable_error,
)

COLS = (Column("id", "bigint", nullable=False, key=True), Column("v", "varchar"))


def row(table: str, ts: int, key: int) -> RowChange:
    return RowChange("s", table, ts, Op.INSERT, None, {"id": key, "v": "x"}, COLS, SourcePosition("t", 0, ts))


def batch(table: str, ts: int):
    shape = Shape("s", table, "t", ("id",), ("int",), (COLS[:1],))
    meta = [[ts], [0], [ts], [10], [0], [0]]
    assert len(meta) == len(META)
    return build_batch(shape, meta, [pa.array([None], pa.int64())], [pa.array([ts], pa.int64())])


def by_table(schema: str, table: str) -> int:
    return {"a": 0, "b": 2, "c": 2}[table]


def settings(_spark: dict | None = None, **target):
    return parse_config({
        "pipeline": {"name": "p", "checkpoint_dir": "/tmp/p"},
        "source": {"bootstrap_servers": "k:9092", "topics": ["t"], "protocol": "open"},
        "target": {"url": "postgresql+psycopg://u:s3cr%40t@db/replica", **target},
        **({"spark": _spark} if _spark else {}),
    })


# ---- the split ---------------------------------------------------------------------------------------------

def test_a_segment_splits_by_stream_in_commit_order_skipping_streams_without_work() -> None:
    events = [row("a", 1, 1), row("b", 2, 1), row("a", 3, 2), row("c", 4, 1)]
    batches = [batch("c", 5), batch("a", 6)]
    parts = split_segment(events, batches, by_table, 4)
    assert [i for i, _, _ in parts] == [0, 2]
    (_, ev0, b0), (_, ev2, b2) = parts
    assert [(e.table, e.commit_ts) for e in ev0] == [("a", 1), ("a", 3)]
    assert [(e.table, e.commit_ts) for e in ev2] == [("b", 2), ("c", 4)]
    assert [b.shape.table for b in b0] == ["a"] and [b.shape.table for b in b2] == ["c"]
    assert split_segment([], [], by_table, 4) == []


def test_a_share_pickles_with_its_events_and_arrow_batches_and_reads_as_a_release() -> None:
    share = Share(2, 7, [row("b", 2, 1)], [batch("c", 5)], 99, known_ts=50)
    back = pickle.loads(pickle.dumps(share))
    assert (back.stream, back.generation, back.applied_ts, back.known_ts) == (2, 7, 99, 50)
    assert list(back) == share.events
    assert back.batches[0].shape == share.batches[0].shape and back.batches[0].data.equals(share.batches[0].data)
    assert back.checkpoint() == {} and back.forget() is None
    back.dropped_copies(3)
    back.dropped_copies(0)
    assert back.dropped == 3
    assert back.tables() == {("s", "b"), ("s", "c")}
    assert "x" not in repr(back) and "events=1" in repr(back)  # never the rows


# ---- exactly once under task retries -----------------------------------------------------------------------

@pytest.mark.parametrize("row_ts, share_ts, known_ts, committed", [
    (None, 100, None, False),  # the stream's first share, not committed
    (None, 100, 40, False),  # (a row the driver knew cannot vanish; nothing to skip)
    (40, 100, 40, False),  # the row as the driver knew it: not committed yet
    (100, 100, 40, True),  # an earlier attempt committed the share
    (100, 100, None, True),  # ... its first share
    (120, 100, 40, True),  # (past it: committed too)
    (100, 100, 100, False),  # the driver knew it there already (a restart with another apply_streams): write
    (150, 100, 150, False),
])
def test_a_retried_task_skips_only_a_share_an_earlier_attempt_committed(row_ts, share_ts, known_ts,
                                                                         committed) -> None:
    assert already_committed(row_ts, share_ts, known_ts) is committed


@pytest.mark.parametrize("row_ts, known_ts, upto", [
    (None, None, None), (40, 40, None),  # nothing committed
    (70, 40, 70), (70, None, 70),  # the part before a table made from the stream's schema
    (100, 40, 100), (120, 40, 100),  # all of it
    (70, 150, None), (150, 150, None),  # the driver knew the row past the share already: cannot tell
])
def test_what_an_earlier_attempt_committed_of_a_share(row_ts, known_ts, upto) -> None:
    assert committed_upto(row_ts, 100, known_ts) == upto


def test_the_rest_of_a_share_after_what_an_attempt_committed() -> None:
    share = Share(1, 0, [row("a", 5, 1), row("a", 7, 2), row("a", 9, 3)], [batch("a", 6), batch("a", 8)], 10,
                  known_ts=4)
    rest = share.after(7)
    assert [e.commit_ts for e in rest.events] == [9]
    assert [b.data.column("_ts").to_pylist() for b in rest.batches] == [[8]]
    assert (rest.stream, rest.generation, rest.applied_ts, rest.known_ts) == (1, 0, 10, 4)
    assert share.after(3).events == share.events and len(share.after(3).batches) == 2


# ---- the executors' applier cache --------------------------------------------------------------------------

def test_the_cache_keeps_an_applier_per_stream_until_the_generation_or_the_epoch_changes() -> None:
    s = settings(apply_streams=4)
    built: list[tuple[int, int]] = []
    closed: list[tuple[str, int]] = []

    def build(ctx: RemoteContext, stream: int) -> object:
        built.append((ctx.epoch, stream))
        return object()

    cache = ApplierCache(build, lambda p, e: closed.append((p, e)))
    ctx = RemoteContext(s, 5)
    sh = lambda stream, gen: Share(stream, gen, [], [], 10)  # noqa: E731
    assert cache_key(ctx, sh(1, 0)) == ("p", 5, 1, 0)
    a = cache.get(ctx, sh(1, 0))
    assert cache.get(ctx, sh(1, 0)) is a
    b = cache.get(ctx, sh(2, 0))
    assert b is not a and cache.get(ctx, sh(2, 0)) is b
    a2 = cache.get(ctx, sh(1, 1))  # a DDL since: built again
    assert a2 is not a and cache.get(ctx, sh(1, 1)) is a2
    assert cache.get(ctx, sh(2, 0)) is b  # the other stream's generation 0 is its own
    later = RemoteContext(s, 6)  # another run took the pipeline over: nothing of epoch 5 is used again
    c = cache.get(later, sh(1, 1))
    assert c is not a2 and closed == [("p", 5)]
    assert cache.get(later, sh(2, 0)) is not b
    assert built == [(5, 1), (5, 2), (5, 1), (6, 1), (6, 2)]


def test_a_context_needs_the_claimed_epoch_and_hides_the_url() -> None:
    s = settings(apply_streams=4)
    with pytest.raises(ValueError, match="claim"):
        RemoteContext(s, None)  # type: ignore[arg-type]
    ctx = pickle.loads(pickle.dumps(RemoteContext(s, 3)))
    assert ctx.settings.target_url().password == "s3cr@t"  # it travels in the task...
    assert "s3cr" not in repr(ctx) and "db" not in repr(ctx)  # ...and is never shown


# ---- a task's error, back in the driver --------------------------------------------------------------------

class _Unpicklable(Exception):
    def __init__(self, message: str, extra: object) -> None:
        super().__init__(message)
        self.extra = extra


def test_an_error_travels_back_as_itself_or_as_text_with_the_password_masked() -> None:
    err = ApplyError("row refused by the target (target.on_apply_error)")
    assert portable_error(err, ["s3cr@t"]) is err
    odd = portable_error(_Unpicklable("no way back", threading.Lock()), [])
    assert isinstance(odd, RemoteTaskError) and str(odd) == "_Unpicklable: no way back"
    leak = portable_error(ApplyError("could not connect to postgresql://u:s3cr%40t@db or mysql://u:s3cr@t@db"),
                          ["s3cr@t"])
    assert isinstance(leak, RemoteTaskError)
    assert "s3cr" not in str(leak)
    assert str(leak) == "ApplyError: could not connect to postgresql://u:***@db or mysql://u:***@db"
    named = ApplyError("Table 'applier.x' doesn't exist")  # the password spelled as a name is not a leak
    assert portable_error(named, ["applier"]) is named


# ---- the driver's side of a segment ------------------------------------------------------------------------

class _Guard:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def saw(self, schema: str, table: str) -> None:
        self.seen.append((schema, table))


class _Timer:
    def __init__(self) -> None:
        self.spans: list[str] = []
        self.streams: dict[int, int] = {}

    def span(self, stage: str):
        import contextlib

        self.spans.append(stage)
        return contextlib.nullcontext()

    def stream_applied(self, i: int, ts: int) -> None:
        self.streams[i] = ts


class _Conn:
    def __enter__(self):
        return self

    def __exit__(self, *a) -> None:
        pass


class _Engine:
    def connect(self) -> _Conn:
        return _Conn()


class _Coordinator:
    def __init__(self, timer: _Timer) -> None:
        self.shards = _Guard()
        self.engine = _Engine()
        self.timer = timer
        self.ddls = 0

    def run_ddl(self, ddl, rel) -> ApplyStats:
        self.ddls += 1
        return ApplyStats(ddls=1)

    def forget_tables(self) -> None:
        pass


class _Store:
    def streams_applied(self, conn) -> dict[int, int]:
        return {0: 5}


class _Release:
    def __init__(self) -> None:
        self.dropped = 0

    def dropped_copies(self, n: int) -> None:
        self.dropped += n


class _Remote:
    """Answers a job the way the tasks would, from ``answer(share)``."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.jobs: list[list[Share]] = []

    def run(self, shares: list[Share]) -> list[ShareResult]:
        self.jobs.append(shares)
        return [self.answer(s) for s in reversed(shares)]  # in any order


def _streams(remote: _Remote) -> tuple[StreamApplier, _Timer]:
    timer = _Timer()
    made = []

    def make(store):
        made.append(_Coordinator(timer))
        return made[-1]

    sa = StreamApplier(make, _Store(), StreamAssignment(4, lambda s, t: (s, t)), remote)  # type: ignore[arg-type]
    sa.assignment.stream_of = by_table  # type: ignore[method-assign]
    return sa, timer


def test_the_driver_adds_what_the_tasks_report_and_raises_the_first_error_once_all_ended() -> None:
    def answer(share: Share) -> ShareResult:
        if share.stream == 2 and share.applied_ts == 30:
            return ShareResult(2, error=ApplyError("stream 2 refused"))
        return ShareResult(share.stream, ApplyStats(rows=len(share.events)), dropped=1,
                           saw=share.tables())

    remote = _Remote(answer)
    sa, timer = _streams(remote)
    rel, stats = _Release(), ApplyStats()
    sa._segment([row("a", 1, 1), row("b", 2, 1), row("a", 3, 2)], [], 20, rel, stats)  # type: ignore[arg-type]
    (job,) = remote.jobs
    assert [(s.stream, s.applied_ts, s.known_ts, s.generation) for s in job] == [(0, 20, 5, 0), (2, 20, None, 0)]
    assert stats.rows == 3 and rel.dropped == 2 and timer.spans == ["apply_remote"]
    assert sorted(sa.coordinator.shards.seen) == [("s", "a"), ("s", "b")]
    assert timer.streams == {0: 20, 2: 20}
    # the known ts moved with the commits; a DDL bumps the generation the executors' appliers are kept by
    sa._ddl(DDL("s", "a", 25, "alter table a add c int", SourcePosition("t", 0, 9)), rel, stats)  # type: ignore[arg-type]
    with pytest.raises(ApplyError, match="stream 2 refused"):
        sa._segment([row("a", 26, 3), row("c", 27, 1)], [], 30, rel, stats)  # type: ignore[arg-type]
    assert [(s.stream, s.known_ts, s.generation) for s in remote.jobs[1]] == [(0, 20, 1), (2, 20, 1)]
    assert stats.rows == 4 and timer.streams == {0: 30, 2: 20}  # stream 0's commit counted, stream 2's error raised


def test_an_empty_segment_runs_no_job() -> None:
    remote = _Remote(lambda s: ShareResult(s.stream))
    sa, _ = _streams(remote)
    sa._segment([], [], 20, _Release(), ApplyStats())  # type: ignore[arg-type]
    assert remote.jobs == []


# ---- configuration -----------------------------------------------------------------------------------------

def test_apply_on_chooses_where_the_streams_write() -> None:
    assert settings().target.apply_on == "auto"
    assert not settings(apply_streams=4).applies_on_executors()  # auto on local[N]: driver threads
    assert settings(apply_streams=4, _spark={"master": "spark://h:7077"}).applies_on_executors()  # auto on a cluster
    assert not settings(apply_streams=4, apply_on="driver", _spark={"master": "spark://h:7077"}).applies_on_executors()
    assert settings(apply_streams=4, apply_on="executors").applies_on_executors()  # also on local[N]
    assert not settings(apply_streams=1, apply_on="executors").applies_on_executors()  # one stream: nothing to spread
    assert settings(apply_on="executors").redacted()["target"]["apply_on"] == "executors"


@pytest.mark.parametrize("url, here", [
    ("postgresql+psycopg://u:p@db/replica", False),
    ("postgresql+psycopg://u:p@10.0.0.7:5432/replica", False),
    ("mysql+pymysql://u:p@replica.example.com/replica", False),
    ("postgresql+psycopg://u:p@[2001:db8::1]:5432/replica", False),
    ("postgresql+psycopg://u:p@127.0.0.1:15432/replica", True),
    ("postgresql+psycopg://u:p@127.3.2.1/replica", True),
    ("mysql+pymysql://u:p@localhost/replica", True),
    ("mysql+pymysql://u:p@LocalHost:3306/replica", True),
    ("postgresql+psycopg://u:p@[::1]:5432/replica", True),
])
def test_a_target_on_this_machine_is_told_by_its_host(url, here) -> None:
    assert settings(url=url).target.on_this_machine() is here


def test_auto_writes_one_transaction_for_a_target_on_this_machine_and_threads_for_another() -> None:
    """``apply_on = "auto"`` (Settings.apply_form): executors on a cluster, wherever the target is; on local[N],
    driver threads for a target on another machine, one transaction for one on this machine (it shares the cores
    Spark and the applier use); an explicit form is kept; one stream is always the single path."""
    here, there = "postgresql+psycopg://u:p@127.0.0.1/replica", "postgresql+psycopg://u:p@db/replica"
    cluster = {"master": "spark://h:7077"}
    assert settings(apply_streams=4, url=here).apply_form() == "one_transaction"
    assert settings(apply_streams=4, url=there).apply_form() == "driver"
    assert settings(apply_streams=4, url=here, _spark=cluster).apply_form() == "executors"
    assert settings(apply_streams=4, url=there, _spark=cluster).apply_form() == "executors"
    for form in ("driver", "executors", "one_transaction"):
        assert settings(apply_streams=4, url=here, apply_on=form).apply_form() == form
        assert settings(apply_streams=4, url=there, apply_on=form, _spark=cluster).apply_form() == form
        assert settings(apply_streams=1, apply_on=form).apply_form() == "single"
    assert not settings(apply_streams=4, url=here, apply_on="one_transaction", _spark=cluster).applies_on_executors()


def test_a_bad_apply_on_names_the_key_and_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        settings(apply_streams=4, apply_on="executor")
    err = info.value
    assert err.key == "target.apply_on"
    assert "executors" in err.message and "driver" in err.message and "auto" in err.message
    assert "one_transaction" in err.message
    with pytest.raises(ConfigError) as info:
        settings(apply_on=4)
    assert info.value.key == "target.apply_on"
