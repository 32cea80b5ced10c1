"""Log lines for people (text, the default) or for machines (``--log-format json``: one JSON object per line).

Text is what it always was: ``<asctime> <LEVEL> <logger>: <message>``. JSON lines carry

- ``ts``: UTC, ISO-8601 with milliseconds and ``Z``; ``level``; ``logger``; ``message``: the formatted message;
- ``pipeline``: the pipeline's name, once a configuration is loaded (:func:`set_pipeline`);
- ``batch``: the micro-batch id while one is being handed over or applied (:func:`batch_context`), else absent;
- ``topic``, ``partition``, ``offset``: when the record concerns a Kafka position (``extra={"position": pos}``
  with a :class:`applier.events.SourcePosition`; the text format shows the position in its message, as before);
- ``exc``: the formatted traceback, when there is one.

Every line is valid JSON whatever a message holds: JSON escapes newlines and control characters, and what JSON
would leave raw but a terminal or an editor might act on (DEL and C1 controls, line/paragraph separators,
bidirectional overrides, lone surrogates) is written as ``\\uXXXX`` too. Nothing is added that the text format
does not show (messages already mask passwords).

The pipeline's name is process-wide (one pipeline per ``applier`` process) and can be overridden per thread; the
batch id is per thread (a :mod:`contextvars` variable): it is set on the thread that handles the batch (the
``foreachBatch`` callback and the apply thread), never seen by another.

The format reaches the supervised child of ``applier run`` (applier.crashguard) without help: the child is
started with the same arguments and environment (``APPLIER_LOG_FORMAT``).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import logging
import os
import re
import sys
import time
from typing import Any, Callable, Iterator, TypeVar

ENV = "APPLIER_LOG_FORMAT"  # the default --log-format (spark-submit deployments set it in the environment)
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
NOISY = ("py4j", "pyspark")  # kept at WARNING even with -v

T = TypeVar("T")

_pipeline: str | None = None  # process-wide, set when a configuration is loaded
_pipeline_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("applier_log_pipeline", default=None)
_batch_var: contextvars.ContextVar[int | None] = contextvars.ContextVar("applier_log_batch", default=None)
_format = "text"  # what configure() last set up: decides how say() reports
_OURS = "_applier_log_handler"  # marks the handler configure() installed, so a second call replaces it


# ---- context -------------------------------------------------------------------------------------------------

def set_pipeline(name: str | None) -> None:
    """The pipeline every later record of this process names (unless a thread set its own)."""
    global _pipeline
    _pipeline = name


@contextlib.contextmanager
def batch_context(batch: int, pipeline: str | None = None) -> Iterator[None]:
    """Records logged on this thread inside the block name micro-batch ``batch`` (and ``pipeline``, if given)."""
    tb = _batch_var.set(batch)
    tp = None if pipeline is None else _pipeline_var.set(pipeline)
    try:
        yield
    finally:
        if tp is not None:
            _pipeline_var.reset(tp)
        _batch_var.reset(tb)


def per_batch(work: Callable[[T], Any], *, pipeline: str | None = None) -> Callable[[T], None]:
    """``work`` for a batch hand-off whose items are ``(batch_id, ...)`` tuples, run inside
    :func:`batch_context` on whatever thread calls it (the apply thread)."""
    def run(item: T) -> None:
        with batch_context(item[0], pipeline):  # type: ignore[index]
            work(item)
    return run


def current() -> tuple[str | None, int | None]:
    """(pipeline, batch) as a record logged now on this thread would name them."""
    return _pipeline_var.get() or _pipeline, _batch_var.get()


class ContextFilter(logging.Filter):
    """Stamps ``pipeline`` and ``batch`` on a record when it is handled (on the thread that logged it), so a
    formatter running later or elsewhere still sees them. An ``extra`` of the same name wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        pipeline, batch = current()
        if not hasattr(record, "pipeline"):
            record.pipeline = pipeline
        if not hasattr(record, "batch"):
            record.batch = batch
        return True


# ---- the JSON format -----------------------------------------------------------------------------------------

# Characters JSON allows raw inside strings but that should not reach a terminal or an editor unescaped. They can
# only occur inside JSON strings (JSON's own syntax is ASCII), where \uXXXX means the same character.
_RAW_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match) -> str:
    return f"\\u{ord(m.group()):04x}"


def utc_ts(created: float, msecs: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module's docstring for the fields)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": utc_ts(record.created, record.msecs), "level": record.levelname,
                               "logger": record.name, "message": record.getMessage()}
        pipeline, batch = current()
        pipeline = getattr(record, "pipeline", pipeline)
        batch = getattr(record, "batch", batch)
        if pipeline is not None:
            doc["pipeline"] = pipeline
        if batch is not None:
            doc["batch"] = batch
        pos = getattr(record, "position", None)
        if pos is not None:
            if all(hasattr(pos, a) for a in ("topic", "partition", "offset")):
                doc.update(topic=pos.topic, partition=pos.partition, offset=pos.offset)
            else:
                doc["position"] = str(pos)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return dumps(doc)


def dumps(doc: dict[str, Any]) -> str:
    """``doc`` as one line of JSON, safe to print whatever its strings hold."""
    return _RAW_UNSAFE.sub(_escape, json.dumps(doc, ensure_ascii=False, default=str))


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted (as :data:`logging.lastResort` does)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


# ---- the command line --------------------------------------------------------------------------------------

def _log_format(value: str) -> str:
    fmt = value.strip().lower()
    if fmt not in FORMATS:
        raise argparse.ArgumentTypeError(f"expected text or json, got {value!r} (the option, or ${ENV} which "
                                         "sets its default)")
    return fmt


def add_option(parser: argparse.ArgumentParser) -> None:
    """``--log-format text|json`` on ``parser`` and on every subcommand below it, so it may be given before or
    after the subcommand. Default: ``$APPLIER_LOG_FORMAT``, else text."""
    parser.add_argument("--log-format", type=_log_format, default=os.environ.get(ENV) or "text",
                        metavar="text|json", help=f"log lines as text (default) or one JSON object per line "
                        f"(default from ${ENV})")
    seen = {id(parser)}
    todo = [parser]
    while todo:
        p = todo.pop()
        for action in p._actions:
            if not isinstance(action, argparse._SubParsersAction):
                continue
            for sp in action.choices.values():
                if id(sp) in seen:
                    continue
                seen.add(id(sp))
                todo.append(sp)
                sp.add_argument("--log-format", type=_log_format, default=argparse.SUPPRESS, metavar="text|json",
                                help="log lines as text or one JSON object per line")


def configure(fmt: str = "text", *, verbose: bool = False) -> None:
    """Set up the root logger for ``fmt``. Text does exactly what the applier always did (``basicConfig``: a
    no-op where the host already configured logging); JSON installs a stderr handler with
    :class:`JsonFormatter` (replacing the one an earlier call installed). A new command names no pipeline
    until it loads a configuration."""
    global _format
    root = logging.getLogger()
    uninstall()
    set_pipeline(None)
    level = logging.INFO if verbose else logging.WARNING
    if fmt == "json":
        handler = StderrHandler()
        handler.setFormatter(JsonFormatter())
        handler.addFilter(ContextFilter())
        setattr(handler, _OURS, True)
        root.addHandler(handler)
        root.setLevel(level)
    else:
        logging.basicConfig(level=level, format=TEXT_FORMAT)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    _format = fmt


def uninstall() -> None:
    """Remove the handler :func:`configure` installed, if any; say() prints again."""
    global _format
    root = logging.getLogger()
    for h in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(h)
    _format = "text"


def say(message: str, *, level: int = logging.ERROR, logger: str = "applier.cli") -> None:
    """A line for the operator on stderr, such as why the command stopped: printed as it is with the text
    format, a log record (so a JSON line) with the JSON format."""
    if _format == "json":
        logging.getLogger(logger).log(level, message)
    else:
        print(message, file=sys.stderr)
