"""Log lines for machines (``--log-format json``) and people (text, unchanged): applier/logs.py."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from applier import logs
from applier.cli import EXIT_CONFIG, EXIT_TARGET, build_parser, main
from applier.events import SourcePosition
from tests.unit.helpers import CLI_CONF, write_conf

REPO = Path(__file__).resolve().parents[2]

HOSTILE = [
    "line one\nline two\r\n\ttabbed",
    "quote \" backslash \\ brace } bracket ]",
    "nul \x00 bell \x07 escape \x1b[31mred\x1b[0m del \x7f csi \x9b2J",
    "separators \u2028 \u2029 bidi \u202e\u2066 done",
    "lone surrogates \udcff \ud800 and an astral \U0001f600",
    "not ascii: \u00e9\u4e2d\u0416",
    '{"level": "CRITICAL", "message": "forged"}\n{"level": "INFO"}',
    "%s %d %(x)s",  # format directives in the message itself (no args: not interpolated)
]


def record(msg: str, *args, level: int = logging.WARNING, name: str = "applier.test", exc_info=None,
           **extra) -> logging.LogRecord:
    rec = logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


@pytest.fixture(autouse=True)
def clean_logs():
    """No pipeline named before a test (another module's CLI test may have loaded one), and whatever a test sets
    up (the JSON handler, the pipeline name) is gone after it."""
    logs.set_pipeline(None)
    yield
    logs.uninstall()
    logs.set_pipeline(None)


@pytest.fixture
def stream_logger(clean_logs):
    """A logger 'applier.logtest' writing through a JSON handler (with the context filter) into a buffer."""
    buf = io.StringIO()
    h = logging.StreamHandler(buf)
    h.setFormatter(logs.JsonFormatter())
    h.addFilter(logs.ContextFilter())
    lg = logging.getLogger("applier.logtest")
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    lg.propagate = False
    yield lg, buf
    lg.removeHandler(h)
    lg.propagate = True


def lines_of(buf: io.StringIO) -> list[dict]:
    text = buf.getvalue()
    assert text.endswith("\n")
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("msg", HOSTILE)
def test_a_hostile_message_is_one_valid_json_line_that_says_it_exactly(msg: str) -> None:
    line = logs.JsonFormatter().format(record(msg))
    assert "\n" not in line and "\r" not in line
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]", line)
    doc = json.loads(line)
    assert doc["message"] == msg
    assert doc["level"] == "WARNING" and set(doc) == {"ts", "level", "logger", "message"}
    line.encode("utf-8")  # printable on a UTF-8 stream as it is


def test_hostile_arguments_are_formatted_into_the_message() -> None:
    doc = json.loads(logs.JsonFormatter().format(record("value %r at %s", "a\nb\x1b", 7)))
    assert doc["message"] == "value 'a\\nb\\x1b' at 7"


def test_the_fields_ts_level_logger_and_the_kafka_position() -> None:
    rec = record("skipped DDL at %s", SourcePosition("t\n1", 3, 42), level=logging.ERROR, name="applier.apply",
                 position=SourcePosition("t\n1", 3, 42))
    rec.created, rec.msecs = 1700000000.0 + 0.0071, 7.1
    doc = json.loads(logs.JsonFormatter().format(rec))
    assert doc == {"ts": "2023-11-14T22:13:20.007Z", "level": "ERROR", "logger": "applier.apply",
                   "message": "skipped DDL at topic=t\n1 partition=3 offset=42", "topic": "t\n1", "partition": 3,
                   "offset": 42}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", json.loads(logs.JsonFormatter().format(
        record("now")))["ts"])


def test_a_traceback_goes_in_exc() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        rec = record("failed", exc_info=sys.exc_info())
    doc = json.loads(logs.JsonFormatter().format(rec))
    assert doc["message"] == "failed"
    assert doc["exc"].startswith("Traceback (most recent call last):") and "ValueError: bad\nvalue" in doc["exc"]


def test_pipeline_and_batch_come_from_the_context(stream_logger) -> None:
    lg, buf = stream_logger
    lg.info("before")
    logs.set_pipeline("shop")
    lg.info("named")
    with logs.batch_context(17):
        lg.info("in batch")
        with logs.batch_context(18, pipeline="other"):
            lg.info("nested")
        lg.info("back")
    lg.info("after")
    got = [(d["message"], d.get("pipeline"), d.get("batch")) for d in lines_of(buf)]
    assert got == [("before", None, None), ("named", "shop", None), ("in batch", "shop", 17),
                   ("nested", "other", 18), ("back", "shop", 17), ("after", "shop", None)]


def test_the_batch_reaches_another_thread_only_when_set_there(stream_logger) -> None:
    lg, buf = stream_logger
    logs.set_pipeline("shop")

    def other(batch: int | None) -> None:
        if batch is None:
            lg.info("unset there")
        else:
            with logs.batch_context(batch):
                lg.info("set there")

    with logs.batch_context(5):
        for b in (None, 9):
            t = threading.Thread(target=other, args=(b,))
            t.start()
            t.join()
        lg.info("here")
    got = {d["message"]: (d.get("pipeline"), d.get("batch")) for d in lines_of(buf)}
    assert got == {"unset there": ("shop", None), "set there": ("shop", 9), "here": ("shop", 5)}


def test_per_batch_runs_the_work_in_its_batch_context_on_the_calling_thread(stream_logger) -> None:
    from applier.handoff import BatchHandoff

    lg, buf = stream_logger
    seen = []
    handoff = BatchHandoff(logs.per_batch(lambda item: (seen.append(logs.current()), lg.info("applied %s", item[1])),
                                          pipeline="p1"))
    for i, payload in ((3, "a"), (4, "b")):
        handoff.submit((i, payload))
    handoff.close()
    handoff.raise_if_failed()
    assert seen == [("p1", 3), ("p1", 4)]
    assert [(d["message"], d["pipeline"], d["batch"]) for d in lines_of(buf)] == [("applied a", "p1", 3),
                                                                                 ("applied b", "p1", 4)]
    assert logs.current() == (None, None)


def test_the_text_format_is_what_it_was(clean_logs) -> None:
    rec = record("applied DDL at %s", SourcePosition("t", 0, 1), name="applier.apply",
                 position=SourcePosition("t", 0, 1))
    text = logging.Formatter(logs.TEXT_FORMAT).format(rec)
    assert text.endswith(" WARNING applier.apply: applied DDL at topic=t partition=0 offset=1")
    assert logs.TEXT_FORMAT == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logs.configure("text")
    assert not [h for h in logging.getLogger().handlers if isinstance(h.formatter, logs.JsonFormatter)]


def test_the_option_before_or_after_the_subcommand_and_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(logs.ENV, raising=False)
    assert build_parser().parse_args(["status", "-c", "x"]).log_format == "text"
    assert build_parser().parse_args(["--log-format", "json", "status", "-c", "x"]).log_format == "json"
    assert build_parser().parse_args(["run", "-c", "x", "--log-format", "json"]).log_format == "json"
    assert build_parser().parse_args(["quarantine", "list", "-c", "x", "--log-format", "json"]).log_format == "json"
    monkeypatch.setenv(logs.ENV, "JSON")
    assert build_parser().parse_args(["run", "-c", "x"]).log_format == "json"
    assert build_parser().parse_args(["run", "-c", "x", "--log-format", "text"]).log_format == "text"
    monkeypatch.setenv(logs.ENV, "xml")
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["run", "-c", "x"])
    assert e.value.code == 2


def test_cli_writes_json_lines_to_stderr(tmp_path, capsys, monkeypatch, clean_logs) -> None:
    monkeypatch.delenv(logs.ENV, raising=False)
    cfg = write_conf(tmp_path, CLI_CONF)
    assert main(["status", "-c", cfg, "--log-format", "json"]) == EXIT_TARGET
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert lines and out.out == ""
    docs = [json.loads(line) for line in lines]
    last = docs[-1]
    assert last["level"] == "ERROR" and last["logger"] == "applier.cli" and last["pipeline"] == "p"
    assert last["message"].startswith("stopped: cannot use the target database") and "batch" not in last
    assert "Sup3rS3cret" not in out.err
    # the text format stays as it was: the same line, printed plainly
    assert main(["status", "-c", cfg]) == EXIT_TARGET
    assert capsys.readouterr().err == last["message"] + "\n"
    # a config that cannot be read: no pipeline named (not even the previous command's)
    assert main(["--log-format", "json", "validate", "-c", str(tmp_path / "missing.toml")]) == EXIT_CONFIG
    (doc,) = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert doc["message"].startswith("config error:") and "pipeline" not in doc


def test_the_environment_variable_reaches_the_supervised_run_child(tmp_path) -> None:
    """``applier run`` from a shell runs the pipeline in a child process (applier.crashguard): the format set
    by APPLIER_LOG_FORMAT (or --log-format, passed on in the child's argv) holds there."""
    cfg = write_conf(tmp_path, CLI_CONF)  # Kafka at 127.0.0.1:1: refused before Spark starts
    env = {**os.environ, logs.ENV: "json", "PYTHONPATH": str(REPO)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("APPLIER_SUPERVISED", None)
    proc = subprocess.run([sys.executable, "-m", "applier.cli", "run", "-c", cfg], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_TARGET, proc.stderr
    docs = [json.loads(line) for line in proc.stderr.splitlines()]
    assert docs[-1]["message"].startswith("stopped: cannot connect to any Kafka bootstrap server")
    assert docs[-1]["pipeline"] == "p" and docs[-1]["level"] == "ERROR"
