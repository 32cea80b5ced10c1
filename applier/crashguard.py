"""Containing a decoder that kills the driver: a marker while decoding, a search on restart, a supervisor.

Why: protocols that keep a schema across messages (Simple), and any protocol with
``decode_on = "driver"``, decode in the driver process. A message that makes a native library fault (orjson
3.9 segfaulted on deep nesting) kills that process, and Python cannot catch it. Without help every rerun reads
the same message again and dies again, printing nothing about where.

What contains it:

1. Before the driver decodes a micro-batch it writes ``decoding.json`` in ``pipeline.local_dir``: the Kafka
   offset range per partition it is about to decode. The file is removed when decoding returns (or raises), so
   it is left behind only by a process that died while decoding.
2. ``applier run`` from the command line runs the pipeline in a child process (:func:`supervise`). When the
   child dies of a fault signal and the marker is there, it is started again, once per marker.
3. A start that finds the marker reads those records from Kafka again and decodes them in child processes,
   halving the range until single messages are left that kill a child (:func:`applier.decode.find_killers`).
   With ``on_decode_error = "stop"`` the run stops with exit 3 naming the message's topic/partition/offset;
   with ``"quarantine"`` those positions are never decoded again by this pipeline: they are quarantined like any
   undecodable message (the reason says the decoder process died) and everything else applies.

Costs: one small file written and removed per driver-decoded micro-batch; one extra Python process for
``applier run``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

from applier.decode import Decoded, decode_messages
from applier.events import DecodeError, KafkaMessage

MARKER_NAME = "decoding.json"
CHILD_ENV = "APPLIER_SUPERVISED"  # set in the supervised child: it must not supervise again
# Signals that mean the process faulted rather than was told to stop.
FAULT_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
MAX_RESTARTS = 20  # distinct killer messages one supervised run gets past (each restart quarantines one batch's)

Position = tuple[str, int, int]  # (topic, partition, offset)
Ranges = dict[tuple[str, int], tuple[int, int]]  # (topic, partition) -> (first, last) offset, inclusive


class DecodingMarker:
    """The file that outlives a driver that died while decoding."""

    def __init__(self, local_dir: Path) -> None:
        self.path = Path(local_dir) / MARKER_NAME

    def arm(self, messages: Iterable[KafkaMessage], batch: str = "") -> None:
        ranges: Ranges = {}
        for m in messages:
            tp = (m.topic, m.partition)
            lo_hi = ranges.get(tp)
            ranges[tp] = (m.offset, m.offset) if lo_hi is None else (min(lo_hi[0], m.offset), max(lo_hi[1], m.offset))
        body = {"pid": os.getpid(), "batch": batch,
                "ranges": [{"topic": t, "partition": p, "first": lo, "last": hi}
                           for (t, p), (lo, hi) in sorted(ranges.items())]}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        os.replace(tmp, self.path)  # a process killed mid-write leaves the old marker or none, never half a one

    def disarm(self) -> None:
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def pending(self) -> Ranges | None:
        """The ranges a dead driver was decoding, or None. An unreadable marker is named, never ignored."""
        try:
            body = json.loads(self.path.read_text())
            return {(r["topic"], int(r["partition"])): (int(r["first"]), int(r["last"])) for r in body["ranges"]}
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as exc:
            raise RuntimeError(f"{self.path} is not a marker this applier wrote ({exc}); a driver died while "
                               "decoding and the marker is damaged: delete the file and rerun") from exc

    def exists(self) -> bool:
        return self.path.exists()


def describe(ranges: Ranges) -> str:
    return ", ".join(f"topic={t} partition={p} offsets {lo}..{hi}" for (t, p), (lo, hi) in sorted(ranges.items()))


class DriverDecodeGuard:
    """Driver-side decoding with the marker armed, and known killers turned into decode errors unread."""

    def __init__(self, marker: DecodingMarker, poison: dict[Position, str], protocol: str) -> None:
        self.marker = marker
        self.poison = poison
        self.protocol = protocol

    def decode(self, decoder, messages: Iterable[KafkaMessage], *, stop_at_error: bool,
               max_skew_ms: int | None = None) -> Decoded:
        msgs = messages if isinstance(messages, list) else list(messages)
        poison = self.poison
        bad: list[KafkaMessage] = []
        if poison:
            clean = []
            for m in msgs:
                (bad if (m.topic, m.partition, m.offset) in poison else clean).append(m)
            msgs = clean
        if msgs:
            self.marker.arm(msgs)
            try:
                decoded = decode_messages(decoder, msgs, stop_at_error=stop_at_error, max_skew_ms=max_skew_ms)
            finally:
                self.marker.disarm()
        else:
            decoded = Decoded()
        for m in bad:
            decoded.messages += 1
            decoded.errors.insert(0, (m, DecodeError(m.position, poison[(m.topic, m.partition, m.offset)],
                                                     protocol=self.protocol)))
        return decoded


# ---- the supervisor ----------------------------------------------------------------------------------------

def supervise(argv: Sequence[str], marker: DecodingMarker, command: Sequence[str] | None = None) -> int:
    """Run ``applier <argv>`` in a child and start it again when it died of a fault while decoding.

    The child shares this process group, so a terminal's Ctrl-C and ``kill`` of the group reach it directly;
    SIGTERM and SIGHUP sent to this process alone are passed on, and the child dies with this process (Linux
    parent-death signal). Any other ending is passed through: the same exit code, or the same signal."""
    restarts = 0
    while True:
        cmd = [*(command or (sys.executable, "-m", "applier.cli")), *argv]
        proc = subprocess.Popen(cmd, env={**os.environ, CHILD_ENV: "1"})
        rc = _wait_forwarding(proc)
        if rc >= 0:
            return rc
        sig = -rc
        name = _signal_name(sig)
        if sig in FAULT_SIGNALS and marker.exists() and restarts < MAX_RESTARTS:
            restarts += 1
            print(f"applier: the pipeline process died of {name} while decoding a micro-batch ({marker.path}); "
                  "starting it again to find the message that kills the decoder", file=sys.stderr, flush=True)
            continue
        if sig in FAULT_SIGNALS:
            print(f"applier: the pipeline process died of {name}"
                  + (f" while decoding; gave up after {MAX_RESTARTS} restarts" if marker.exists() else
                     " outside decoding (no decoding marker); everything committed is consistent, rerun to go "
                     "on, and report the fault with the traceback above"), file=sys.stderr, flush=True)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # end the way the child ended, for whoever supervises us
        return 128 + sig


def _wait_forwarding(proc: subprocess.Popen) -> int:
    forward = (signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, lambda num, _frame: proc.send_signal(num)) for s in forward}
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to the child too
    try:
        while True:
            try:
                return proc.wait()
            except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
                continue
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        signal.signal(signal.SIGINT, old_int)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def as_supervised_child() -> None:
    """In the child: die with the supervisor (no orphan keeps writing if it is killed), and print a Python
    traceback on a fault, so the operator sees where it happened."""
    import faulthandler

    faulthandler.enable()
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the child outlives a killed parent
            pass
    if os.getppid() == 1:  # the supervisor died before prctl took effect
        os._exit(1)
