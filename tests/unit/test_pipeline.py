"""Pipeline pieces that need no Spark."""

from __future__ import annotations

import pytest


def test_bulk_gc_relaxes_the_collector_for_the_run_and_restores_it() -> None:
    import gc

    from applier.pipeline import BULK_GC_THRESHOLD, bulk_gc

    before = gc.get_threshold()
    assert before != BULK_GC_THRESHOLD
    with pytest.raises(RuntimeError):
        with bulk_gc():
            assert gc.get_threshold() == BULK_GC_THRESHOLD
            assert gc.get_freeze_count() > 0  # what existed at start is out of the collector's walks
            raise RuntimeError("the run failed")
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
