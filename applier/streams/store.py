"""An apply stream's view of the pipeline's progress store (both ways of running the streams use it: threads of
the driver, applier.streams.apply, and Spark tasks, applier.streams.remote)."""

from __future__ import annotations

from typing import Any, Callable

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


class AllStreamsStore:
    """The pipeline's store for a transaction that writes every stream's share of a release at once (the
    one-transaction form, ``[target] apply_on = "one_transaction"``, and a release with undecodable messages):
    ``save`` is the marker's (:meth:`ProgressStore.save`, the tables' rows with it) and moves each stream whose
    tables it carries to the same ts with its rows, in the same transaction (:meth:`ProgressStore.save_with_streams`),
    so a later run with the streams in threads or tasks finds each stream where its rows are."""

    def __init__(self, store: ProgressStore, stream_of: Callable[[str, str], int]) -> None:
        self._store = store
        self._stream_of = stream_of

    def save(self, conn: Connection, *, applied_ts: int, checkpoints: Any,
             table_progress: dict[tuple[str, str], TableProgress], batches: int = 0) -> None:
        stream_rows: dict[int, int] = {}
        for (schema, table), tp in table_progress.items():
            s = self._stream_of(schema, table)
            stream_rows[s] = stream_rows.get(s, 0) + tp.rows
        self._store.save_with_streams(conn, applied_ts=applied_ts, checkpoints=checkpoints,
                                      table_progress=table_progress, stream_rows=stream_rows, batches=batches)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
