"""Stage timing: one optional hook that the pipeline's stages report their durations and row counts to.

Why: the benchmark splits a run's wall time into stages, and metrics will export the same figures. Both used to
wrap product internals from outside (monkeypatching the processor, the hand-off, the planner, the sink's COPY and
the dialect's commit), which a rename in the product silently broke. The stages call this hook instead; the
default does nothing and costs one method call per stage per micro-batch (or per written chunk).

Stages (what each measures, and on which thread):

==============  ==========================================================================================
``on_batch``    Spark thread: one ``foreachBatch`` call (read the micro-batch, hand it over)
``submit_wait`` Spark thread: waiting for the apply thread to take the batch
``drain``       Spark thread: after the query ends, waiting for the last batch to apply
``partition_refresh`` Spark thread: asking Kafka for new partitions (every 30 s, before a batch's read)
``process``     apply thread: one micro-batch end to end (decode, route, gate, apply)
``decode``,     apply thread: the processor's own split of ``process``
``gate``,
``apply``
``plan``        apply thread: planning one table's chunk of row changes (``plan_batch``)
``write``       apply thread: writing one planned chunk (``Sink.write``)
``write.copy``  apply thread, PostgreSQL: the COPY into the staging table, inside ``write``
``progress``    apply thread: writing the progress rows, inside the data transaction
``commit``      apply thread: committing data and progress
==============  ==========================================================================================

Counts: ``rows_upserted``, ``rows_deleted``, ``batches``.

Events: :meth:`StageTimer.resumed` when a run (or a retry of it) has loaded its progress, and
:meth:`StageTimer.applied` after each micro-batch is applied and committed (apply thread), with the batch's
report and the gate: the metrics (applier.metrics) take positions and counts from there.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any


class StageTimer:
    """The hook. Subclass and override :meth:`add` and :meth:`count` (and :meth:`span`, to act at a stage's
    start and end on its own thread, e.g. to profile it)."""

    def add(self, stage: str, seconds: float) -> None:
        """``stage`` took ``seconds`` (called once per occurrence)."""

    def count(self, what: str, n: int) -> None:
        """``n`` more of ``what``."""

    def span(self, stage: str) -> AbstractContextManager[Any]:
        """A context that times ``stage`` and reports it to :meth:`add`."""
        return _Span(self, stage)

    def resumed(self, state: Any) -> None:
        """The run loaded its progress (a ``PipelineState``): where it starts from."""

    def applied(self, report: Any, gate: Any) -> None:
        """A micro-batch was applied and committed: its ``BatchReport`` and the gate after it."""


class _Span:
    __slots__ = ("timer", "stage", "t0")

    def __init__(self, timer: StageTimer, stage: str) -> None:
        self.timer = timer
        self.stage = stage
        self.t0 = 0.0

    def __enter__(self) -> None:
        self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.timer.add(self.stage, time.perf_counter() - self.t0)


class NoTiming(StageTimer):
    """The default: nothing is measured."""

    _NULL = nullcontext()

    def span(self, stage: str) -> AbstractContextManager[Any]:
        return self._NULL


NO_TIMING = NoTiming()
