"""The hand-off that overlaps Spark's read of batch N+1 with applying batch N (applier/handoff.py)."""

from __future__ import annotations

import threading
import time

import pytest

from applier.handoff import BatchHandoff


def test_next_batch_is_accepted_while_the_previous_one_is_applied():
    started, release = threading.Event(), threading.Event()
    applied: list[int] = []

    def work(n: int) -> None:
        if n == 1:
            started.set()
            assert release.wait(5)
        applied.append(n)

    h = BatchHandoff(work)
    h.submit(1)
    assert started.wait(5)
    # batch 1 is still being applied, yet submit(2) returns: the caller (Spark) is free to fetch batch 3
    t = time.monotonic()
    done = threading.Event()
    threading.Thread(target=lambda: (h.submit(2), done.set())).start()
    # submit waits for batch 1 only when it hands over the next one, so at most two batches are in memory
    assert not done.wait(0.2)
    release.set()
    assert done.wait(5)
    h.close()
    assert applied == [1, 2]
    assert time.monotonic() - t < 5


def test_submit_returns_before_the_batch_is_applied():
    gate = threading.Event()
    h = BatchHandoff(lambda n: gate.wait(5))
    t = time.monotonic()
    h.submit(1)
    assert time.monotonic() - t < 0.5  # returned while the work still blocks
    gate.set()
    h.close()
    assert h.done == 1


def test_error_surfaces_with_the_original_exception_and_stops_later_batches():
    class Boom(Exception):
        pass

    applied: list[int] = []
    stopped: list[BaseException] = []

    def work(n: int) -> None:
        if n == 2:
            raise Boom("batch 2 failed at topic t partition 0 offset 7")
        applied.append(n)

    h = BatchHandoff(work, on_error=stopped.append)
    h.submit(1)
    h.submit(2)
    with pytest.raises(Boom, match="offset 7"):
        h.submit(3)  # the next hand-over raises batch 2's error instead of queueing more work
    h.close()
    assert applied == [1]
    assert isinstance(h.error, Boom) and stopped == [h.error]
    with pytest.raises(Boom):
        h.raise_if_failed()


def test_close_drains_the_last_batch():
    applied: list[int] = []

    def work(n: int) -> None:
        time.sleep(0.05)
        applied.append(n)

    h = BatchHandoff(work)
    for n in range(4):
        h.submit(n)
    h.close()
    assert applied == [0, 1, 2, 3]
    assert not h._thread.is_alive()


def test_error_in_the_last_batch_is_kept_for_the_caller():
    def work(n: int) -> None:
        raise ValueError("last batch")

    h = BatchHandoff(work)
    h.submit(1)
    h.close()
    with pytest.raises(ValueError, match="last batch"):
        h.raise_if_failed()


def test_one_worker_thread_runs_every_batch():
    threads: set[int] = set()
    h = BatchHandoff(lambda n: threads.add(threading.get_ident()))
    for n in range(20):
        h.submit(n)
    h.close()
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_close_within_cancels_a_batch_that_outlives_the_bound_and_waits_for_it_to_end():
    release = threading.Event()

    def waits_for_its_job(_: int) -> None:  # like RemoteApply.run: the cancelled job raises
        release.wait(30)
        raise RuntimeError("job cancelled")

    h: BatchHandoff[int] = BatchHandoff(waits_for_its_job)
    h.submit(1)
    cancelled = []
    t = time.monotonic()
    assert h.close_within(0.2, lambda: (cancelled.append(time.monotonic() - t), release.set())) is True
    assert len(cancelled) == 1 and 0.15 < cancelled[0] < 5
    assert isinstance(h.error, RuntimeError)  # the cancelled batch's error is the caller's to judge


def test_close_within_leaves_a_batch_that_ends_in_time_alone():
    done = []
    h: BatchHandoff[int] = BatchHandoff(done.append)
    h.submit(1)
    cancelled = []
    assert h.close_within(5.0, lambda: cancelled.append(True)) is False
    time.sleep(0.05)
    assert done == [1] and cancelled == [] and h.error is None


def test_close_within_goes_on_waiting_when_cancel_itself_fails():
    release = threading.Event()
    h: BatchHandoff[int] = BatchHandoff(lambda _: release.wait(30))

    def broken() -> None:
        threading.Timer(0.1, release.set).start()
        raise ValueError("Spark is gone")

    h.submit(1)
    assert h.close_within(0.1, broken) is True
    assert release.is_set() and h.error is None
