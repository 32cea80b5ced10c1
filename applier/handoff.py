"""Overlap reading the next micro-batch with applying the current one.

Spark calls ``foreachBatch`` synchronously: while Python decodes and writes batch N the Kafka source fetches
nothing, and while Spark fetches batch N+1 Python and the database idle. A :class:`BatchHandoff` gives the
work to one long-lived thread and lets ``foreachBatch`` return as soon as the previous batch is done, so the
JVM fetches and converts batch N+1 while batch N is applied (and the database works on N's statements while
Python decodes). That is what lets a second core help.

Why this is safe: restart never depends on Spark's own offsets. Progress lives in the target, in the same
transaction as the data, and every start re-reads Kafka from the restart offsets stored there (the Spark
checkpoint folder is cleared at start). So Spark committing batch N+1 before batch N is applied loses nothing:
after a crash both are read again and the gate drops what is already applied.

Memory: at most two batches are in the driver, the one being applied and the one Spark just handed over;
``submit`` waits for the previous batch to finish before it returns, so Spark never runs two ahead.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Generic, TypeVar

log = logging.getLogger("applier.handoff")

T = TypeVar("T")

_STOP = object()


class BatchHandoff(Generic[T]):
    """One worker thread applying batches in submission order; the first error stops everything after it.

    Everything that touches the batch processor (which is not thread-safe) must go through ``submit``, so it
    runs on the worker thread only."""

    def __init__(self, work: Callable[[T], None], *, on_error: Callable[[BaseException], None] | None = None,
                 name: str = "applier-apply") -> None:
        self._work = work
        self._on_error = on_error
        self._cond = threading.Condition()
        self._item: object | None = None  # the batch handed over and not yet taken (at most one)
        self._busy = False  # the worker is applying a batch
        self._error: BaseException | None = None
        self._closed = False
        self.done = 0
        # daemon only as a backstop: close() always joins it before run() returns
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def error(self) -> BaseException | None:
        return self._error

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, item: T) -> None:
        """Hand ``item`` to the worker once the previous batch is applied; raise the worker's error if any."""
        with self._cond:
            while (self._busy or self._item is not None) and self._error is None:
                self._cond.wait()
            self.raise_if_failed()
            if self._closed:
                raise RuntimeError("batch hand-off is closed")
            self._item = item
            self._cond.notify_all()

    def close(self) -> None:
        """Let the worker finish what it has, stop it and join it. Does not raise: call raise_if_failed()."""
        with self._cond:
            while (self._busy or self._item is not None) and self._error is None:
                self._cond.wait()
            self._closed = True
            self._item = _STOP
            self._cond.notify_all()
        self._thread.join()

    def close_within(self, seconds: float, cancel: Callable[[], None]) -> bool:
        """:meth:`close`, calling ``cancel`` once if the batch being applied is not done ``seconds`` after the call
        (``cancel`` must make it end, e.g. by cancelling the Spark job it waits for); then it waits on. True when
        ``cancel`` was called. For a run that is stopping: what the cancelled batch did not commit is read again
        by the next run."""
        fired = threading.Event()

        def fire() -> None:
            fired.set()
            try:
                cancel()
            except Exception:  # noqa: BLE001 - a stopping run: the wait goes on, the error is only logged
                log.warning("could not cancel the batch being applied", exc_info=True)

        timer = threading.Timer(seconds, fire)
        timer.daemon = True
        timer.start()
        try:
            self.close()
        finally:
            timer.cancel()
        return fired.is_set()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._item is None:
                    self._cond.wait()
                item, self._item = self._item, None
                if item is _STOP:
                    return
                self._busy = True
                self._cond.notify_all()
            try:
                if self._error is None:
                    self._work(item)  # type: ignore[arg-type]
                    self.done += 1
            except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits on us
                with self._cond:
                    self._error = exc
                if self._on_error is not None:
                    try:
                        self._on_error(exc)
                    except Exception:  # pragma: no cover - stopping an already failing query
                        log.debug("stopping the query after a failed batch raised", exc_info=True)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
