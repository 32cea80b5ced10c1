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


def test_the_batch_size_hint_is_the_decoders_own() -> None:
    from applier.codecs import DEFAULT_MAX_OFFSETS_PER_TRIGGER, batch_hint
    from applier.codecs.open import OpenDecoder

    assert batch_hint("open") == OpenDecoder.max_offsets_per_trigger == 3_125  # 16 rows per message at most
    assert DEFAULT_MAX_OFFSETS_PER_TRIGGER == 50_000  # round 4: smaller batches overlap read and apply sooner
    assert batch_hint("canal-json") == batch_hint("simple") == DEFAULT_MAX_OFFSETS_PER_TRIGGER


def test_only_simple_declares_that_it_holds_messages() -> None:
    from applier.codecs import HoldsMessages, get_decoder

    assert isinstance(get_decoder("simple"), HoldsMessages)
    assert not isinstance(get_decoder("open"), HoldsMessages)
