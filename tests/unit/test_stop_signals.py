"""Stopping ``applier run`` on a signal (issue 24, point 5), without Spark: the supervisor passes SIGINT/SIGTERM/SIGHUP
on to its child once, whether the signal came to its PID alone or to its whole process group (a terminal's Ctrl-C),
ends by that signal, kills the child at once on a second one, and loses no signal that comes while the child starts;
:class:`applier.crashguard.StopRequest` records the first signal and runs the stop callbacks off the main thread.
The same with the real pipeline (Kafka, Spark, a database): tests/e2e/test_signals.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from applier.crashguard import STOP, STOP_SIGNALS, StopRequest
REPO = Path(__file__).resolve().parents[2]

# A child that behaves like the pipeline's: it counts the stop signals it gets (STOP records only the first),
# writes its pid and process group, and once asked to stop waits a little (a duplicate signal would arrive then),
# writes how many it got and ends with 128 + the signal's number.
CHILD = """
import os, pathlib, signal, sys, time
from applier.crashguard import STOP, STOP_SIGNALS, as_supervised_child
got = []
def count(num, frame):
    got.append(num)
for s in STOP_SIGNALS:
    signal.signal(s, count)
time.sleep({delay})  # the stop signals are still blocked here: one sent now waits
as_supervised_child()
out = pathlib.Path({out!r})
(out / "pid").write_text(f"{{os.getpid()}} {{os.getpgrp()}}")
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(1.0)
(out / "count").write_text(str(len(got)))
sys.exit(128 + got[0] if got else 1)
"""


def supervised(tmp_path: Path, child: str, **popen) -> subprocess.Popen:
    """``applier run``'s supervisor around ``child``, in a session of its own (as a shell starts a job)."""
    script = (f"import sys; from applier.crashguard import DecodingMarker, supervise; "
              f"sys.exit(supervise([], DecodingMarker({str(tmp_path)!r}), command=[sys.executable, '-c', "
              f"{child!r}]))")
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, start_new_session=True,
                            stderr=subprocess.PIPE, text=True, **popen)


def wait_for(path: Path, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_supervisors_group_reaches_the_child_once(tmp_path, sig) -> None:
    """Ctrl-C in a terminal signals the whole foreground group: the child must not get it twice (directly and
    passed on), and it is in a group of its own, so its JVM and Spark's workers get nothing from the terminal."""
    sup = supervised(tmp_path, CHILD.format(delay=0, out=str(tmp_path)))
    child_pid, child_group = map(int, wait_for(tmp_path / "pid").split())
    assert child_group == child_pid != os.getpgid(sup.pid)
    os.killpg(sup.pid, sig)
    assert sup.wait(timeout=30) == -sig  # it ends by the signal it was sent (a shell shows 128 + sig)
    assert (tmp_path / "count").read_text() == "1"


def test_a_signal_to_the_supervisors_pid_alone_reaches_the_child(tmp_path) -> None:
    """As ``kill PID`` or a service manager does: the supervisor used to ignore SIGINT (10 minutes, no stop)."""
    sup = supervised(tmp_path, CHILD.format(delay=0, out=str(tmp_path)))
    wait_for(tmp_path / "pid")
    sup.send_signal(signal.SIGINT)
    assert sup.wait(timeout=30) == -signal.SIGINT
    assert (tmp_path / "count").read_text() == "1"
    assert sup.stderr.read() == ""  # the child's line is the only one; the supervisor adds nothing


def test_a_signal_while_the_child_starts_waits_for_it(tmp_path) -> None:
    """The child starts with the stop signals blocked: one sent before it handles them is handled then, not
    killing it half-way through its imports (SIGTERM's default) or printing a KeyboardInterrupt trace."""
    sup = supervised(tmp_path, CHILD.format(delay=2, out=str(tmp_path)))
    time.sleep(0.8)  # the child exists and sleeps with the signals blocked
    assert not (tmp_path / "pid").exists()
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=30) == -signal.SIGTERM
    assert (tmp_path / "count").read_text() == "1"


def test_a_second_signal_kills_the_child_at_once(tmp_path) -> None:
    slow = ("import pathlib, time; from applier.crashguard import STOP, as_supervised_child; STOP.install(); "
            f"as_supervised_child(); pathlib.Path({str(tmp_path / 'pid')!r}).write_text('1 1'); time.sleep(120)")
    sup = supervised(tmp_path, slow)
    wait_for(tmp_path / "pid")
    sup.send_signal(signal.SIGTERM)  # recorded by the child, which (here) never stops by itself
    time.sleep(0.5)
    assert sup.poll() is None
    t0 = time.monotonic()
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=20) == -signal.SIGTERM and time.monotonic() - t0 < 10
    assert "a second SIGTERM: stopping at once" in sup.stderr.read()


def test_the_child_exit_code_passes_through_when_no_stop_was_asked(tmp_path) -> None:
    sup = supervised(tmp_path, "import sys; sys.exit(143)")  # e.g. the pipeline process got SIGTERM directly
    assert sup.wait(timeout=30) == 143


# ---- StopRequest -----------------------------------------------------------------------------------------------

def test_stop_request_records_the_first_signal_and_calls_back_off_the_main_thread() -> None:
    stop = StopRequest()
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    calls: list[str] = []
    with stop.handling():
        assert all(signal.getsignal(s) == stop._handle for s in STOP_SIGNALS)
        forget = stop.when_requested(lambda: (time.sleep(0.3), calls.append(threading.current_thread().name)))
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # a second one changes nothing
        time.sleep(0.05)  # the handlers run on the main thread between bytecodes
        assert stop.requested and stop.signum == signal.SIGTERM and stop.name == "SIGTERM"
        forget()  # waits for the running callback: what it stops is not torn down under it
        assert calls == ["applier-stop-on-signal"]
        late: list[int] = []
        stop.when_requested(lambda: late.append(1))()  # registered after the signal: called at once
        assert late == [1]
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before
    assert not stop.requested  # forgotten after the block


def test_stop_request_handles_again_after_pyspark_replaced_the_sigint_handler() -> None:
    stop = StopRequest()
    with stop.handling():
        signal.signal(signal.SIGINT, signal.default_int_handler)  # what a new SparkContext does (its own handler)
        assert stop.install()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert stop.signum == signal.SIGINT


def test_an_error_of_the_callback_is_not_raised_and_an_outer_block_keeps_the_request() -> None:
    stop = StopRequest()
    with stop.handling():
        with stop.handling():  # run()'s block inside the supervised child's: the request outlives it
            forget = stop.when_requested(lambda: 1 / 0)  # e.g. the query ended meanwhile
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.05)
            forget()
        assert stop.signum == signal.SIGHUP
    assert not stop.requested


def test_off_the_main_thread_nothing_is_installed() -> None:
    box: dict = {}

    def work() -> None:
        with StopRequest().handling() as s:
            box["installed"] = s.install()

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert box == {"installed": False}
    assert not STOP.requested
