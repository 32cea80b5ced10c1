"""Apply streams written in Spark tasks (``[target] apply_on = "executors"``, applier/streams/remote.py) against
real MariaDB and PostgreSQL, on the shared ``local[2]`` session (its Python workers are processes of their own, as
on a cluster): the generated changefeed (DDL inside windows, replays) fed through ``BatchProcessor`` with four
streams must leave exactly the expected tables and count each row change once; a task that fails stops the run
with the error a driver thread gives, and the rerun resumes exactly; a retried task whose first attempt committed
writes nothing; a held key blocks its later changes whichever worker writes them; a fenced run's tasks commit
nothing; and the tasks leave the same replica and progress as driver threads and as the one-transaction form on
random changefeeds."""

from __future__ import annotations

import pickle
import threading
import time

import pytest
from sqlalchemy import MetaData, Table, create_engine, func, select, text

from applier import migrate
from applier import progress as P
from applier.codecs import get_decoder
from applier.config import Settings, parse_config
from applier.pipeline import remote_apply, run
from applier.wiring import applier_options, router_for
from applier.processor import BatchProcessor
from applier.progress import PipelineState, ProgressStore, WriterFenced
from applier.sinks import ApplyError
from applier.timing import StageTimer
from applier.devtools.changefeed import generate, produce
from applier.devtools.verify import compare_tables
from applier.events import RowChange
from applier.streams.assign import target_stream
from applier.streams.remote import RemoteContext, Share, ShareResult, apply_share
from tests.e2e.helpers import config, target_url
from tests.e2e.streams_feed import PARTS, STREAMS, TOPIC, counts, exact, feed, target, wl_records  # noqa: F401

pytestmark = pytest.mark.e2e


def _settings(urls, which: str, name: str, schema: str, tmp_path, **target_keys) -> Settings:
    return parse_config({
        "pipeline": {"name": name, "checkpoint_dir": str(tmp_path / name)},
        "source": {"bootstrap_servers": urls.kafka, "topics": [TOPIC], "protocol": "open"},
        "target": {"url": target_url(urls, which), "apply_streams": STREAMS, "apply_on": "executors", **target_keys},
        "route": [{"match": "shop.*", "schema": schema}],
    })


def _processor(engine, settings: Settings, spark, remote=None) -> tuple[BatchProcessor, PipelineState]:
    """A run's processor, built from ``settings`` as applier.pipeline builds it, and the progress it resumed from."""
    migrate.upgrade(engine)
    store = ProgressStore(settings.pipeline.name, "open")
    store.claim(engine)
    with engine.connect() as c:
        state = store.load(c)
    router = router_for(settings)
    remote = remote or remote_apply(spark, settings, store)
    assert (remote is not None) == (settings.target.apply_on == "executors"), \
        "apply_on = executors must put the streams in Spark tasks, driver in threads"
    proc = BatchProcessor(engine=engine, decoder=get_decoder("open"), route=router.route, store=store, state=state,
                          partitions=[(TOPIC, p) for p in range(PARTS)], columnar=True,
                          apply_streams=settings.target.apply_streams, remote=remote,
                          one_transaction=settings.apply_form() == "one_transaction",
                          **applier_options(settings, router))
    return proc, state


def _which(engine) -> str:
    return "mariadb" if engine.dialect.name in ("mysql", "mariadb") else "postgres"


def _rows_match(tables: dict[str, int], wl) -> None:
    assert {t: n for t, n in tables.items() if n} == {t: n for t, n in wl.row_changes.items() if t in tables and n}


def test_four_streams_in_spark_tasks_apply_exactly(target, urls, spark, unique, tmp_path) -> None:
    engine, schema, wl = target
    settings = _settings(urls, _which(engine), f"exec-{unique}", schema, tmp_path)
    proc, state = _processor(engine, settings, spark)
    try:
        feed(proc, state, wl_records(wl))
    finally:
        proc.close()
    tables = exact(engine, schema, settings.pipeline.name, wl)
    _rows_match(tables, wl)
    sa = proc.applier
    applied, rows, _, stream_ts = counts(engine, settings.pipeline.name)
    assert len(stream_ts) >= 2 and all(ts <= applied for ts in stream_ts.values())
    assert sa.total.ddls >= 4  # type: ignore[union-attr] - the DDLs ran once, in the driver, as barriers
    assert sa.total.rows == rows  # type: ignore[union-attr] - what the tasks reported is what they committed
    assert all(a.total.rows == 0 for a in sa.streams)  # type: ignore[union-attr] - no driver thread wrote a row
    assert sa.generation >= 4  # type: ignore[union-attr]


def _refuse(engine, schema: str, table: str, where: str = "TRUE") -> None:
    """Make the target refuse writes of ``table``'s rows matching ``where`` (a trigger): a task's failure that
    is no fault of the applier's."""
    with engine.begin() as c:
        if _which(engine) == "mariadb":
            for op in ("INSERT", "UPDATE"):
                c.execute(text(f"CREATE TRIGGER `{schema}`.`refuse_{op.lower()}` BEFORE {op} ON `{schema}`.`{table}` "
                               f"FOR EACH ROW BEGIN IF {where.replace('ROW.', 'NEW.')} THEN SIGNAL SQLSTATE '45000' "
                               "SET MESSAGE_TEXT = 'forced failure'; END IF; END"))
        else:
            c.execute(text(f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
                           f"IF {where.replace('ROW.', 'NEW.')} THEN RAISE EXCEPTION 'forced failure'; END IF; "
                           "RETURN NEW; END $$"))
            c.execute(text(f'CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON "{schema}"."{table}" FOR EACH ROW '
                           f'EXECUTE FUNCTION "{schema}".refuse()'))


def _allow(engine, schema: str, table: str) -> None:
    with engine.begin() as c:
        if _which(engine) == "mariadb":
            for op in ("insert", "update"):
                c.execute(text(f"DROP TRIGGER IF EXISTS `{schema}`.`refuse_{op}`"))
        else:
            c.execute(text(f'DROP TRIGGER IF EXISTS refuse ON "{schema}"."{table}"'))


def test_a_failed_task_stops_the_run_like_a_thread_and_the_rerun_resumes_exactly(target, urls, spark, unique,
                                                                                  tmp_path) -> None:
    engine, schema, wl = target
    records = wl_records(wl)
    settings = _settings(urls, _which(engine), f"exec-fail-{unique}", schema, tmp_path)
    proc, state = _processor(engine, settings, spark)
    half = len(records) // 2
    try:
        feed(proc, state, records[:half])
        _refuse(engine, schema, "customers")
        with pytest.raises(ApplyError, match="forced failure") as info:
            feed(proc, state, records[half:])
    finally:
        proc.close()
    # the thread path's error as it is: its class, the table, the target's reason and the refused row
    assert type(info.value) is ApplyError
    assert "upstream table shop.customers" in str(info.value) and "The refused row: id=" in str(info.value)
    assert settings.target_url().password not in str(info.value)
    _, _, tables_before, _ = counts(engine, settings.pipeline.name)
    _allow(engine, schema, "customers")

    again, resumed = _processor(engine, settings, spark)
    assert resumed.table_floors, "the other streams committed past the marker"
    try:
        feed(again, resumed, records)
    finally:
        again.close()
    _rows_match(exact(engine, schema, settings.pipeline.name, wl), wl)
    assert again.gate.stats["duplicates_dropped"] > 0  # the committed streams' re-read rows


class _CommittedThenLost:
    """Every task as if its first attempt committed and then died before Spark got its result (an executor lost
    after the commit): the first attempt runs, its result is dropped, Spark's retry runs the same share again
    from its pickled form. Both attempts run here, in the driver's process, with the executors' code."""

    def __init__(self, context) -> None:
        self.context = context
        self.skipped = 0

    def run(self, shares: list[Share]) -> list[ShareResult]:
        out = []
        for share in shares:
            first = apply_share(self.context, pickle.loads(pickle.dumps(share)))
            assert first.error is None, first.error
            retry = apply_share(self.context, pickle.loads(pickle.dumps(share)))
            assert retry.error is None and retry.skipped and retry.stats.rows == 0
            self.skipped += 1
            out.append(retry)
        return out


def test_a_retried_task_whose_first_attempt_committed_writes_nothing(target, urls, spark, unique, tmp_path) -> None:
    engine, schema, wl = target
    settings = _settings(urls, _which(engine), f"exec-retry-{unique}", schema, tmp_path)
    lost = _CommittedThenLost(None)
    proc, state = _processor(engine, settings, spark, remote=lost)
    lost.context = RemoteContext(settings, proc.applier.store.epoch)  # type: ignore[union-attr]
    try:
        feed(proc, state, wl_records(wl))
    finally:
        proc.close()
    assert lost.skipped > 10
    _rows_match(exact(engine, schema, settings.pipeline.name, wl), wl)  # each row change counted once


def _victim(wl) -> int:
    """An order whose row changes at least twice in the last quarter of the stream (after the ALTER of orders:
    a DDL waits for a table's held changes): its first change there is refused, the later ones must be held
    behind it. (Not a customer: their unique e-mail makes one held change refuse others' changes too.)"""
    rows = [c for c in wl.changes if isinstance(c, RowChange)]
    late: dict[int, int] = {}
    for c in rows[int(len(rows) * 0.75):]:
        if c.table == "orders":
            k = (c.after or c.before)["id"]
            late[k] = late.get(k, 0) + 1
    key, n = max(late.items(), key=lambda kv: (kv[1], -kv[0]))
    assert n >= 2, late
    return key


@pytest.mark.parametrize("apply_on", ["executors", "driver", "one_transaction"])
def test_a_held_key_blocks_its_later_changes_in_any_stream(target, urls, spark, unique, tmp_path, apply_on) -> None:
    """``on_apply_error = "quarantine"`` with four streams, in Spark tasks, in driver threads and in one
    transaction: the refused row is set aside and every later change of its key is held behind it (invariant 12)."""
    engine, schema, wl = target
    records = wl_records(wl)
    settings = _settings(urls, _which(engine), f"exec-held-{unique}", schema, tmp_path, on_apply_error="quarantine",
                         apply_on=apply_on)
    victim = _victim(wl)
    proc, state = _processor(engine, settings, spark)
    part = len(records) * 2 // 3
    try:
        feed(proc, state, records[:part])
        _refuse(engine, schema, "orders", f"ROW.id = {victim}")
        feed(proc, state, records[part:])
    finally:
        proc.close()
        _allow(engine, schema, "orders")
    name = settings.pipeline.name
    with engine.connect() as c:
        kinds = dict(c.execute(select(P.quarantined_rows.c.kind, func.count())
                               .where(P.quarantined_rows.c.pipeline == name)
                               .group_by(P.quarantined_rows.c.kind)).all())
        keys_held = set(c.execute(select(P.quarantined_rows.c.source_table, P.quarantined_rows.c.row_key)
                                  .where(P.quarantined_rows.c.pipeline == name)).all())
    assert kinds.get("refused") == 1, kinds
    assert kinds.get("blocked", 0) >= 1, f"the victim's later changes were not held: {kinds}"
    assert keys_held == {("orders", str(victim))} or len(keys_held) == 1, keys_held  # its key alone
    # every other row is as upstream has it; the victim's row is as it was before its refused change
    others = {t: {k: v for k, v in rows.items() if not (t == "orders" and k[0] == victim)}
              for t, rows in wl.expected.items()}
    diffs = compare_tables(engine, schema, others)
    assert all(d.startswith(f"orders[{victim}]") for d in diffs), diffs


class _Stages(StageTimer):
    """Which stages the run timed, and its counters."""

    def __init__(self) -> None:
        self.stages: dict[str, int] = {}

    def add(self, stage: str, seconds: float) -> None:
        self.stages[stage] = self.stages.get(stage, 0) + 1

    def count(self, what: str, n: int) -> None:
        pass


@pytest.mark.parametrize("which", ["mariadb", "postgres"])
def test_a_run_through_kafka_writes_its_streams_in_spark_tasks(urls, spark, unique, drop_schema, tmp_path,
                                                               which) -> None:
    """``applier run``'s own wiring (applier.pipeline): Kafka, decoding on the workers, four streams written in
    Spark tasks, the replica exact and each row change counted once."""
    topic = f"e2e-apply-on-{which}-{unique}"
    wl = generate("canal-json", partitions=3, txns=300, seed=5, replays=2)
    produce(urls.kafka, topic, wl.messages, partitions=3)
    schema = f"aoe_{unique}"
    drop_schema((which, schema))
    cfg = config(urls, which, "canal-json", topic, schema, tmp_path / "ckpt", max_offsets_per_trigger=400,
                 decode_on="executors")
    cfg["target"].update(apply_streams=STREAMS, apply_on="executors")
    settings = parse_config(cfg)
    timer = _Stages()
    run(settings, until_caught_up=True, spark=spark, progress=False, timer=timer)
    engine = create_engine(target_url(urls, which))
    try:
        assert compare_tables(engine, schema, wl.expected) == []
        applied, rows, tables, stream_ts = counts(engine, settings.pipeline.name)
        assert applied == wl.final_ts and rows == sum(tables.values())
        _rows_match(tables, wl)
        assert stream_ts and all(ts <= applied for ts in stream_ts.values())
    finally:
        engine.dispose()
    assert timer.stages.get("apply_remote", 0) > 0, timer.stages  # the driver timed the tasks' job


def test_tables_made_from_the_stream_in_spark_tasks(target, urls, spark, unique, tmp_path) -> None:
    """``schema_evolution = "evolve"`` with no CREATE or ALTER in the stream: the streams' tasks make the tables and
    add the column (a DDL each, in the task's stream), and the other workers' appliers read them again."""
    engine, schema, _ = target
    wl = generate("open", partitions=PARTS, txns=300, seed=11, replays=2, omit_ddl=("CREATE", "ALTER"))
    settings = _settings(urls, _which(engine), f"exec-evolve-{unique}", schema, tmp_path, schema_evolution="evolve")
    proc, state = _processor(engine, settings, spark)
    try:
        feed(proc, state, wl_records(wl))
    finally:
        proc.close()
    _rows_match(exact(engine, schema, settings.pipeline.name, wl), wl)
    assert proc.applier.total.ddls >= 3  # type: ignore[union-attr] - made by the streams' tasks
    assert proc.applier.coordinator.total.ddls == 0  # type: ignore[union-attr]


def _snapshot(engine, schema: str, tables) -> dict[str, list[tuple]]:
    """Every row of ``tables`` in ``schema``, sorted: the data as it is, whatever the progress tables say."""
    out = {}
    with engine.connect() as c:
        for t in tables:
            table = Table(t, MetaData(), schema=schema, autoload_with=c)
            out[t] = sorted(tuple(str(v) for v in row) for row in c.execute(select(table)).all())
    return out


def test_a_fenced_run_writes_nothing_from_any_task(target, urls, spark, unique, tmp_path) -> None:
    """Invariant 13 with the writes in Spark tasks: the tasks write under the driver's epoch and never claim it, so
    once another run has claimed the pipeline no task commits a row (the data, not only the progress, is as it
    was) and the run stops with the driver threads' error."""
    engine, schema, wl = target
    records = wl_records(wl)
    settings = _settings(urls, _which(engine), f"exec-fenced-{unique}", schema, tmp_path)
    name = settings.pipeline.name
    proc, state = _processor(engine, settings, spark)
    half = len(records) // 2
    try:
        feed(proc, state, records[:half])
        before = counts(engine, name)
        data = _snapshot(engine, schema, before[2])
        ProgressStore(name, "open").claim(engine)  # a second run takes the pipeline over
        with pytest.raises(WriterFenced):
            feed(proc, state, records[half:])
    finally:
        proc.close()
    assert counts(engine, name) == before
    assert _snapshot(engine, schema, before[2]) == data


def _twin_schemas(unique: str, tables, n: int = 2) -> tuple[str, ...]:
    """``n`` schema names that put every table in the same one of STREAMS streams (the stream is a hash of the
    target's name), spread over at least two streams: the runs' per-stream progress can then be compared."""
    def assignment(s: str) -> tuple[int, ...]:
        return tuple(target_stream(s, t, STREAMS) for t in sorted(tables))

    alike: dict[tuple[int, ...], list[str]] = {}
    for name in (f"tw{i}_{unique}" for i in range(2000)):
        a = assignment(name)
        if len(set(a)) < 2:
            continue
        alike.setdefault(a, []).append(name)
        if len(alike[a]) == n:
            return tuple(alike[a])
    raise AssertionError(f"no {n} schema names share a stream assignment")


FORMS = ("driver", "executors", "one_transaction")


@pytest.mark.parametrize("seed, per_batch", [(3, 25), (7, 60), (19, 13)])
def test_tasks_threads_and_one_transaction_leave_the_same_replica_and_progress(target, urls, spark, unique, tmp_path,
                                                                              drop_schema, seed, per_batch) -> None:
    """The differential proof of the three forms of the apply streams against each other (driver threads, Spark
    tasks, every share in one transaction): random changefeeds (DDL inside windows, key changes, replays) in
    micro-batches of different sizes, four streams each way, must leave the same tables, the same pipeline ts and
    counts, the same per-table counts and the same per-stream applied ts."""
    engine, _, _ = target
    which = _which(engine)
    wl = generate("open", partitions=PARTS, txns=200, seed=seed, replays=3)
    schemas = _twin_schemas(unique, wl.expected, len(FORMS))
    seen = []
    for schema, apply_on in zip(schemas, FORMS):
        drop_schema((which, schema))
        settings = _settings(urls, which, f"twin-{apply_on}-{seed}-{unique}", schema, tmp_path, apply_on=apply_on)
        proc, state = _processor(engine, settings, spark)
        try:
            feed(proc, state, wl_records(wl), per_batch=per_batch)
        finally:
            proc.close()
        assert compare_tables(engine, schema, wl.expected) == []
        seen.append(counts(engine, settings.pipeline.name))
    assert seen[1] == seen[0]
    assert seen[2] == seen[0]
    assert len(seen[0][3]) >= 2


def test_a_stopping_run_cancels_a_window_whose_tasks_never_end(urls, spark, unique, drop_schema, tmp_path,
                                                                monkeypatch, caplog) -> None:
    """A live run whose window is written in Spark tasks that never end (seen once on the loopback cluster: a task
    launch an executor could not read, which Spark then waits for without end) must still stop when its query is
    stopped: it waits ``STOP_APPLY_GRACE_SECONDS``, cancels the job and returns, and the next run applies that
    window exactly."""
    import applier.pipeline as pipeline
    import applier.streams.remote as remote

    which = "postgres"
    topic = f"e2e-apply-hang-{unique}"
    wl = generate("canal-json", partitions=3, txns=120, seed=7, replays=0)
    produce(urls.kafka, topic, wl.messages, partitions=3)
    schema = f"aoh_{unique}"
    drop_schema((which, schema))
    cfg = config(urls, which, "canal-json", topic, schema, tmp_path / "ckpt", decode_on="driver")
    cfg["target"].update(apply_streams=STREAMS, apply_on="executors")
    settings = parse_config(cfg)

    def never_ends(context, shares):  # pickled by value into the task: sleeps until Spark kills its worker
        import time as t
        t.sleep(600)
        yield from ()

    started = threading.Event()
    real_run = remote.RemoteApply.run

    def run_and_tell(self, shares):
        started.set()
        return real_run(self, shares)

    monkeypatch.setattr(remote, "run_shares", never_ends)
    monkeypatch.setattr(remote.RemoteApply, "run", run_and_tell)
    monkeypatch.setattr(pipeline, "STOP_APPLY_GRACE_SECONDS", 3.0)
    asked: list[float] = []

    def stop_once_stuck() -> None:
        if started.wait(180):  # (else stop anyway: the asserts below say what went wrong)
            time.sleep(1.0)
        asked.append(time.monotonic())
        for q in spark.streams.active:
            q.stop()

    stopper = threading.Thread(target=stop_once_stuck, daemon=True)
    stopper.start()
    with caplog.at_level("WARNING", logger="applier"):
        run(settings, spark=spark, progress=False)
    assert started.is_set(), "no window reached the Spark tasks"
    took = time.monotonic() - asked[0]
    assert 2.5 < took < 45, took  # the grace, then the cancelled job ends the wait
    assert "its job was cancelled" in caplog.text
    engine = create_engine(target_url(urls, which))
    try:
        with engine.connect() as c:
            applied_before = c.execute(select(P.pipelines.c.applied_ts)
                                       .where(P.pipelines.c.pipeline == settings.pipeline.name)).scalar()
        assert (applied_before or 0) < wl.final_ts  # the stuck window was not marked applied

        monkeypatch.undo()
        run(settings, until_caught_up=True, spark=spark, progress=False)
        assert compare_tables(engine, schema, wl.expected) == []
        applied, rows, tables, _ = counts(engine, settings.pipeline.name)
        assert applied == wl.final_ts and rows == sum(tables.values())
        _rows_match(tables, wl)
    finally:
        engine.dispose()
