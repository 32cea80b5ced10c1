"""Containing a decoder that kills the driver (applier.crashguard): the marker, the guard, the supervisor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from applier import crashguard
from applier.crashguard import DecodingMarker, DriverDecodeGuard, supervise
from applier.decode import Decoded
from applier.events import DecodeError, KafkaMessage

REPO = Path(__file__).resolve().parents[2]


def msg(offset: int, partition: int = 0, topic: str = "t") -> KafkaMessage:
    return KafkaMessage(topic, partition, offset, None, b"{}")


def test_marker_records_each_partitions_range_and_is_gone_after_disarm(tmp_path) -> None:
    m = DecodingMarker(tmp_path)
    assert m.pending() is None
    m.arm([msg(7), msg(5), msg(9), msg(3, partition=1)])
    assert m.pending() == {("t", 0): (5, 9), ("t", 1): (3, 3)}
    m.disarm()
    assert m.pending() is None and not m.exists()
    m.disarm()  # idempotent


def test_damaged_marker_is_named_not_ignored(tmp_path) -> None:
    (tmp_path / crashguard.MARKER_NAME).write_text("{not json")
    with pytest.raises(RuntimeError, match="delete the file and rerun"):
        DecodingMarker(tmp_path).pending()


class Recording:
    """A decoder stand-in that says which messages it was asked to decode and whether the marker was armed."""

    def __init__(self, marker: DecodingMarker) -> None:
        self.marker = marker
        self.seen: list[int] = []
        self.armed: list[bool] = []

    def decode(self, m: KafkaMessage):
        self.seen.append(m.offset)
        self.armed.append(self.marker.exists())
        return []


def test_guard_arms_the_marker_while_decoding_and_never_decodes_a_known_killer(tmp_path) -> None:
    marker = DecodingMarker(tmp_path)
    dec = Recording(marker)
    guard = DriverDecodeGuard(marker, {("t", 0, 2): "decoding this message killed the decoder process (x)"}, "open")
    d = guard.decode(dec, [msg(1), msg(2), msg(3)], stop_at_error=False)
    assert dec.seen == [1, 3] and all(dec.armed)
    assert not marker.exists()
    assert d.messages == 3 and [(m.offset, type(e)) for m, e in d.errors] == [(2, DecodeError)]
    assert "killed the decoder" in d.errors[0][1].reason


def test_guard_disarms_when_the_decoder_raises(tmp_path) -> None:
    marker = DecodingMarker(tmp_path)

    class Boom:
        def decode(self, m):
            raise ValueError("a bug, not a crash")

    with pytest.raises(ValueError):
        DriverDecodeGuard(marker, {}, "open").decode(Boom(), [msg(1)], stop_at_error=True)
    assert not marker.exists()  # a Python exception is no reason to search for a killer on the next start


def test_guard_with_only_killers_decodes_nothing(tmp_path) -> None:
    marker = DecodingMarker(tmp_path)
    dec = Recording(marker)
    d = DriverDecodeGuard(marker, {("t", 0, 1): "killed"}, "open").decode(dec, [msg(1)], stop_at_error=False)
    assert dec.seen == [] and d.messages == 1 and len(d.errors) == 1 and isinstance(d, Decoded)


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_supervisor_passes_the_exit_code_through(tmp_path) -> None:
    assert supervise([], DecodingMarker(tmp_path), command=_child("import sys; sys.exit(3)")) == 3


def test_supervisor_restarts_a_child_that_faulted_while_decoding(tmp_path) -> None:
    marker = DecodingMarker(tmp_path)
    marker.arm([msg(1)])
    runs = tmp_path / "runs"
    # first run: dies of SIGSEGV with the marker in place; second run: finds the marker, clears it, exits 0
    code = (f"import os, pathlib, signal; r = pathlib.Path({str(runs)!r}); n = int(r.read_text()) if r.exists() "
            f"else 0; r.write_text(str(n + 1))\n"
            f"if n == 0: os.kill(os.getpid(), signal.SIGSEGV)\n"
            f"pathlib.Path({str(marker.path)!r}).unlink()")
    assert supervise([], marker, command=_child(code)) == 0
    assert runs.read_text() == "2"


def test_supervisor_does_not_restart_a_fault_outside_decoding(tmp_path, monkeypatch, capsys) -> None:
    killed: list[int] = []
    monkeypatch.setattr(crashguard.os, "kill", lambda pid, sig: killed.append(sig))
    monkeypatch.setattr(crashguard.signal, "signal", lambda *a: signal.SIG_DFL)
    code = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    assert supervise([], DecodingMarker(tmp_path), command=_child(code)) == 128 + signal.SIGSEGV
    assert killed == [signal.SIGSEGV]  # ends the way its child ended
    assert "outside decoding" in capsys.readouterr().err


def _supervised(tmp_path: Path, child_code: str) -> subprocess.Popen:
    script = (f"import sys; from applier.crashguard import DecodingMarker, supervise; "
              f"sys.exit(supervise([], DecodingMarker({str(tmp_path)!r}), command=[sys.executable, '-c', "
              f"{child_code!r}]))")
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO)


def _wait_for(path: Path) -> int:
    deadline = time.monotonic() + 20
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return int(path.read_text())


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


CHILD = ("import os, pathlib, time; from applier.crashguard import as_supervised_child; as_supervised_child(); "
         "pathlib.Path({pidfile!r}).write_text(str(os.getpid())); time.sleep(60)")


def test_sigterm_to_the_supervisor_reaches_the_child(tmp_path) -> None:
    pidfile = tmp_path / "child.pid"
    sup = _supervised(tmp_path, CHILD.format(pidfile=str(pidfile)))
    child = _wait_for(pidfile)
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=20) == -signal.SIGTERM  # it ends as its child did
    assert _gone(child)


def test_the_child_dies_with_a_killed_supervisor(tmp_path) -> None:
    pidfile = tmp_path / "child.pid"
    sup = _supervised(tmp_path, CHILD.format(pidfile=str(pidfile)))
    child = _wait_for(pidfile)
    sup.kill()
    sup.wait(timeout=20)
    assert _gone(child), "an orphaned pipeline process would go on writing"
