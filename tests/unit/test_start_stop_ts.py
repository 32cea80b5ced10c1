"""Start and stop at a TSO without services: ``source.start_ts`` (config, the seeding of a new pipeline's applied
resolved ts, progress winning over it), ``applier run --until-ts`` (the batch processor stops releasing at it and
records exactly it; a later run continues; an ungated protocol or a replica already past it is refused) and the
CLI's option and report. The gate's own rules are in test_gate.py ("start and stop at a TSO")."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from sqlalchemy import create_engine

from applier.codecs import get_decoder
from applier.config import ConfigError, parse_config, tso_problem
from applier.decode import Decoded
from applier.pipeline import check_until_ts, seed_start_ts, until_ts_reached
from applier.processor import BatchProcessor
from applier.progress import PipelineState, metadata
from tests.unit.apply_fakes import ProgressKept, RowsDialect, RowsSink
from tests.unit.gate_streams import res, row
from tests.unit.helpers import CLI_CONF, write_conf


def tso(year: int, ms: int = 0, logical: int = 0) -> int:
    return ((int(dt.datetime(year, 1, 1, tzinfo=dt.timezone.utc).timestamp()) * 1000 + ms) << 18) | logical


S = tso(2024, 1000)  # the snapshot's TSO
T = tso(2024, 3000)  # where the run stops


# ---- fakes: a sink that keeps the rows, a store that keeps the progress ---------------------------------------

def processor(sink: RowsSink, store: ProgressKept, state: PipelineState, **kw) -> BatchProcessor:
    engine = create_engine("sqlite://")
    metadata.create_all(engine)  # the quarantine's tables, which every apply reads
    return BatchProcessor(engine=engine, decoder=get_decoder("open"), route=lambda s, t: ("main", t), store=store,
                          state=state, partitions=[("k", 0), ("k", 1)], dialect=RowsDialect(sink), **kw)


def feed(proc: BatchProcessor, events: list) -> None:
    proc.process_decoded(Decoded(messages=len(events), events=events))


# ---- source.start_ts: a new pipeline starts at the snapshot ---------------------------------------------------

def test_a_new_pipeline_with_start_ts_skips_what_the_snapshot_holds_and_records_start_ts_at_once() -> None:
    state = PipelineState()
    seed_start_ts(state, S, "p")
    assert state.applied_ts == S
    sink, store = RowsSink({1: 1, 2: 2}), ProgressKept()  # the snapshot as of S
    proc = processor(sink, store, state)
    feed(proc, [row(S - 5, 0, 0, 1, 1), row(S, 1, 0, 2, 2), row(S + 1, 0, 1, 1, 5), res(S - 1, 0, 2)])
    assert sink.written == [] and store.saved == [S]  # nothing applied yet, but already consistent as of S
    feed(proc, [res(S + 10, 0, 3), res(S + 10, 1, 1)])
    assert sink.written == [1] and sink.rows == {1: 5, 2: 2} and store.saved[-1] == S + 10
    assert proc.gate.stats["duplicates_dropped"] == 2


def test_recorded_progress_wins_over_start_ts_and_says_so_in_one_line(caplog) -> None:
    state = PipelineState(applied_ts=T, exists=True)
    with caplog.at_level(logging.INFO, logger="applier.pipeline"):
        seed_start_ts(state, S, "p")
    assert state.applied_ts == T
    [line] = [r for r in caplog.records if "start_ts" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert f"source.start_ts = {S} is ignored" in line.getMessage() and "applier_pipelines" in line.getMessage()
    seed_start_ts(state, None, "p")
    assert state.applied_ts == T


# ---- --until-ts: the processor stops at exactly it, a later run continues -------------------------------------

def test_until_ts_applies_nothing_committed_after_it_records_exactly_it_and_a_later_run_continues() -> None:
    sink, store = RowsSink(), ProgressKept()
    proc = processor(sink, store, PipelineState(), until_ts=T)
    feed(proc, [row(T - 2, 0, 0, 1, 1), row(T, 1, 0, 2, 2), row(T + 1, 0, 1, 1, 3), row(T + 2, 1, 1, 3, 3),
                res(T + 5, 0, 2), res(T + 5, 1, 2)])
    assert sink.rows == {1: 1, 2: 2} and store.saved == [T] and proc.gate.reached_until_ts
    proc.close()
    # the next run (no --until-ts) resumes from the committed progress: it re-reads from the restart offsets
    state = store.state
    restart = {tp: cp.restart_offset for tp, cp in state.checkpoints.items()}
    assert restart == {("k", 0): 1, ("k", 1): 1}
    proc = processor(sink, store, state)
    feed(proc, [row(T + 1, 0, 1, 1, 3), row(T + 2, 1, 1, 3, 3), res(T + 5, 0, 2), res(T + 5, 1, 2)])
    assert sink.rows == {1: 3, 2: 2, 3: 3} and store.saved[-1] == T + 5
    proc.close()


def test_a_run_already_at_until_ts_has_nothing_to_do_and_one_past_it_is_refused() -> None:
    assert not until_ts_reached(PipelineState(applied_ts=T - 1, exists=True), T, "p")
    assert not until_ts_reached(PipelineState(applied_ts=T + 1, exists=True), None, "p")
    assert until_ts_reached(PipelineState(applied_ts=T, exists=True), T, "p")
    with pytest.raises(ConfigError) as err:
        until_ts_reached(PipelineState(applied_ts=T + 1, exists=True), T, "p")
    assert err.value.key == "--until-ts" and "cannot go back" in err.value.message and str(T + 1) in err.value.message


# ---- which protocols can honour them ---------------------------------------------------------------------------

def conf(**source) -> dict:
    return {
        "pipeline": {"name": "p", "checkpoint_dir": "/tmp/applier-p"},
        "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "protocol": "canal-json", **source},
        "target": {"url": "mysql+pymysql://u@127.0.0.1:3306/db"},
    }


@pytest.mark.parametrize("protocol,codec", [
    ("open", {}), ("canal-json", {}), ("simple", {}), ("debezium", {"gated": True}),
])
def test_gated_protocols_take_start_ts_and_until_ts(protocol: str, codec: dict) -> None:
    s = parse_config(conf(protocol=protocol, codec=codec, start_ts=S))
    assert s.source.start_ts == S and s.redacted()["source"]["start_ts"] == S
    check_until_ts(s, T)
    assert parse_config(conf()).source.start_ts is None


@pytest.mark.parametrize("protocol,codec", [
    ("canal-json", {"require_tidb_extension": False}), ("debezium", {}),
])
def test_ungated_protocols_refuse_start_ts_and_until_ts_naming_the_key_and_why(protocol: str, codec: dict) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(conf(protocol=protocol, codec=codec, start_ts=S))
    assert err.value.key == "source.start_ts"
    assert "no resolved ts" in err.value.message and "gated" in err.value.message
    s = parse_config(conf(protocol=protocol, codec=codec))
    check_until_ts(s, None)
    with pytest.raises(ConfigError) as err:
        check_until_ts(s, T)
    assert err.value.key == "--until-ts" and "no resolved ts" in err.value.message


@pytest.mark.parametrize("value,fragment", [
    ("449958940139667457", "expected an integer"),
    (True, "expected an integer"),
    (0, "between 1 and"),
    (-5, "between 1 and"),
    (1_716_000_000_000, "before 2015"),  # a Unix time in ms
    (1_716_000_000, "before 2015"),  # in seconds
    (int(dt.datetime(2030, 1, 1).timestamp() * 1e9), "in the future"),  # in ns: physical part in 2176
    (2**64, "between 1 and"),
])
def test_start_ts_must_be_a_tso(value, fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(conf(start_ts=value))
    assert err.value.key == "source.start_ts" and fragment in err.value.message
    assert "TSO" in err.value.message


def test_start_ts_with_latest_offsets_is_refused() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(conf(start_ts=S, starting_offsets="latest"))
    assert err.value.key == "source.start_ts" and '"earliest"' in err.value.message


def test_a_future_tso_is_a_point_to_stop_at_but_not_a_snapshot() -> None:
    future = tso(dt.datetime.now().year + 2)
    assert tso_problem(future, future_ok=True) is None
    assert "future" in (tso_problem(future) or "")


# ---- the CLI ----------------------------------------------------------------------------------------------------

def test_run_until_ts_passes_it_to_the_pipeline_and_says_where_it_stopped(tmp_path, capsys, monkeypatch) -> None:
    import applier.pipeline
    from applier.cli import main
    from applier.pipeline import RunResult
    from applier.processor import BatchReport

    seen: dict = {}

    def fake_run(settings, **kw):
        seen.update(kw)
        return RunResult(3, BatchReport(applied_ts=T), stopped_at=T)

    monkeypatch.setattr(applier.pipeline, "run", fake_run)
    assert main(["run", "-c", write_conf(tmp_path), "--until-ts", str(T)]) == 0
    assert seen["until_ts"] == T and seen["until_caught_up"] is False
    out = capsys.readouterr().out
    assert f"applied resolved ts {T}" in out and f"stopped at --until-ts {T}" in out
    assert "consistent as of exactly that TSO" in out


def test_run_until_ts_that_kafka_does_not_reach_yet_says_so(tmp_path, capsys, monkeypatch) -> None:
    import applier.pipeline
    from applier.cli import main
    from applier.pipeline import RunResult
    from applier.processor import BatchReport

    monkeypatch.setattr(applier.pipeline, "run", lambda settings, **kw: RunResult(1, BatchReport(applied_ts=S)))
    assert main(["run", "-c", write_conf(tmp_path), "--until-caught-up", "--until-ts", str(T)]) == 0
    out = capsys.readouterr().out
    assert f"caught up before --until-ts {T}" in out and f"consistent as of {S}" in out


@pytest.mark.parametrize("value,fragment", [("soon", "not a TSO"), ("1716000000000", "before 2015"), ("0", "between")])
def test_run_until_ts_must_be_a_tso(tmp_path, capsys, value: str, fragment: str) -> None:
    from applier.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "-c", write_conf(tmp_path), "--until-ts", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--until-ts" in err and fragment in err


def test_run_until_ts_on_an_ungated_stream_exits_2_before_anything_starts(tmp_path, capsys) -> None:
    from applier.cli import EXIT_CONFIG, main

    text = CLI_CONF.replace('protocol = "open"', 'protocol = "debezium"')
    assert main(["run", "-c", write_conf(tmp_path, text), "--until-ts", str(T)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--until-ts" in err and "no resolved ts" in err and "Kafka" not in err  # refused before Kafka is asked
