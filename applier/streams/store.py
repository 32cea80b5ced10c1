"""An apply stream's view of the pipeline's progress store (both ways of running the streams use it: threads of
the driver, applier.streams.apply, and Spark tasks, applier.streams.remote)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Connection

from applier.progress import ProgressStore, TableProgress


class StreamStore:
    """A stream's view of the pipeline's :class:`ProgressStore`: ``save`` records the stream's own progress
    (:meth:`ProgressStore.save_stream`); everything else (DDL history, quarantine, the writer check) is the
    pipeline's store. The per-stream :class:`Applier` saves through it unchanged."""

    def __init__(self, store: ProgressStore, stream: int) -> None:
        self._store = store
        self.stream = stream

    def save(self, conn: Connection, *, applied_ts: int, checkpoints: Any,
             table_progress: dict[tuple[str, str], TableProgress], batches: int = 0) -> None:
        self._store.save_stream(conn, stream=self.stream, applied_ts=applied_ts, table_progress=table_progress)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
