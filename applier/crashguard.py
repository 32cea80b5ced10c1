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

Stopping: SIGINT, SIGTERM and SIGHUP ask a run to stop after its current micro-batch (:class:`StopRequest`). The
supervised child runs in a process group of its own, so a terminal's Ctrl-C reaches the supervisor alone (not the
child, its Spark JVM or Spark's Python workers); the supervisor passes each stop signal on once, and a second one
stops the child at once (:func:`supervise`).

Costs: one small file written and removed per driver-decoded micro-batch; one extra Python process for
``applier run``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from applier.decode import Decoded, decode_records
from applier.events import DecodeError, KafkaMessage

MARKER_NAME = "decoding.json"
CHILD_ENV = "APPLIER_SUPERVISED"  # set in the supervised child: it must not supervise again
# Signals that mean the process faulted rather than was told to stop.
FAULT_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})
MAX_RESTARTS = 20  # distinct killer messages one supervised run gets past (each restart quarantines one batch's)
# Signals that ask a run to stop after its current micro-batch (StopRequest); it then ends with 128 + the number.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

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
               max_skew_ms: int | None = None, columnar: bool = False) -> Decoded:
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
                decoded = decode_records(decoder, msgs, stop_at_error=stop_at_error, max_skew_ms=max_skew_ms,
                                         columnar=columnar)
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

    The child runs in a process group of its own: a terminal's Ctrl-C (sent to the terminal's foreground group)
    reaches this process only, never the child's Spark JVM or Spark's Python workers directly. A stop signal
    (SIGINT, SIGTERM, SIGHUP) sent to this process, alone or with its group, is passed on to the child once; the
    child stops after its current micro-batch and this process then ends by that signal (a shell shows 128 + its
    number: 130, 143, 129), which is how a script or a service manager learns the run was stopped. A second stop
    signal kills the child's process group at once (what was not committed rolls back). The child is started with
    the stop signals blocked and unblocks them once it handles them (:func:`as_supervised_child`), so a signal
    that comes while it starts waits for it instead of killing it half-way. The child dies with this process
    (Linux parent-death signal). Any other ending is passed through: the same exit code, or the same signal."""
    restarts = 0
    box: list[subprocess.Popen] = []
    asked: list[int] = []

    def on_stop_signal(num: int, _frame: Any) -> None:
        asked.append(num)
        if not box:
            return
        if len(asked) == 1:
            _send(box[0], num)
        elif len(asked) == 2 and box[0].poll() is None:
            print(f"applier: a second {_signal_name(num)}: stopping at once (the micro-batch being applied rolls "
                  "back; everything committed is consistent)", file=sys.stderr, flush=True)
            _send_group(box[0], signal.SIGKILL)

    saved = {s: signal.signal(s, on_stop_signal) for s in STOP_SIGNALS}
    try:
        while True:
            cmd = [*(command or (sys.executable, "-m", "applier.cli")), *argv]
            proc = subprocess.Popen(cmd, env={**os.environ, CHILD_ENV: "1"}, process_group=0,
                                    preexec_fn=_block_stop_signals)
            box[:] = [proc]
            if asked:  # asked to stop between two starts: the child stops before it begins
                _send(proc, asked[0])
            rc = _wait(proc)
            if asked and (rc < 0 or rc == 128 + asked[0]):
                sig = asked[0]  # stopped as asked (or killed by a second signal): end by the signal we were sent
                break
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
            break
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)  # end the way the child ended (or as we were told to), for whoever supervises us
    return 128 + sig


def _block_stop_signals() -> None:
    """In the child between fork and exec: the stop signals wait (pending) until it handles them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def _send(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:  # pragma: no cover - it ended meanwhile
        pass


def _send_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its group (process_group=0): it, its JVM and Spark's workers
    except (ProcessLookupError, PermissionError):  # pragma: no cover - it ended meanwhile
        pass


def _wait(proc: subprocess.Popen) -> int:
    while True:
        try:
            return proc.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def signal_name(sig: int) -> str:
    """``SIGTERM`` for 15 (``signal 99`` for a number with no name)."""
    return _signal_name(sig)


# ---- stopping on a signal --------------------------------------------------------------------------------------

class StopRequest:
    """A stop asked for by SIGINT, SIGTERM or SIGHUP: a run stops after its current micro-batch (applier.pipeline).

    The handler only records the first signal and starts the registered callbacks, each on a thread of its own: a
    callback that stops the Spark query talks to the JVM, and the main thread the handler interrupts may be in the
    middle of a py4j call itself (py4j cannot be re-entered from a signal handler; pyspark's own SIGINT handler
    does that, and a Ctrl-C then printed pages of py4j errors). Later signals change nothing (the supervisor turns
    a second one into a kill). Python runs signal handlers on the main thread, so the handlers are installed only
    from it; elsewhere :meth:`handling` does nothing and the caller stops its run itself."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._callbacks: list[Callable[[], None]] = []

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return "" if self.signum is None else _signal_name(self.signum)

    def install(self) -> bool:
        """Handle the stop signals in this process, also again where something replaced a handler (pyspark sets
        its own SIGINT handler when it creates a SparkContext). False off the main thread (nothing installed)."""
        if threading.current_thread() is not threading.main_thread():
            return False
        for s in STOP_SIGNALS:
            if signal.getsignal(s) != self._handle:
                signal.signal(s, self._handle)
        return True

    @contextlib.contextmanager
    def handling(self) -> Iterator["StopRequest"]:
        """Handle the stop signals inside the block (main thread only); afterwards the handlers that were there
        come back and the request is forgotten. A signal that came before the block still counts inside it."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        self.install()
        try:
            yield self
        finally:
            for s, h in saved.items():
                signal.signal(s, signal.SIG_DFL if h is None else h)
            if not all(h == self._handle for h in saved.values()):  # else an outer block (the supervised
                self.signum = None  # child's) still listens, and keeps the request
                self._callbacks.clear()

    def when_requested(self, callback: Callable[[], None], wait: float = 60.0) -> Callable[[], None]:
        """Run ``callback`` (on a thread of its own) when a stop is asked for, or now if it was already. Returns
        the function that unregisters it and, when it has started, waits up to ``wait`` seconds for it to end (so
        what it stops is not torn down under it). An error it raises is only logged (at DEBUG): what it was to stop
        may have ended meanwhile."""
        call = _Callback(callback)
        self._callbacks.append(call)
        if self.signum is not None:
            call.start()

        def remove() -> None:
            with contextlib.suppress(ValueError):
                self._callbacks.remove(call)
            if call.began.is_set():
                call.done.wait(wait)
        return remove

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        for call in list(self._callbacks):
            call.start()


class _Callback:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.began = threading.Event()
        self.done = threading.Event()

    def start(self) -> None:
        if self.began.is_set():
            return
        self.began.set()
        threading.Thread(target=self._run, name="applier-stop-on-signal", daemon=True).start()

    def _run(self) -> None:
        try:
            self.fn()
        except Exception as exc:  # noqa: BLE001 - see StopRequest.when_requested
            logging.getLogger("applier.crashguard").debug("stopping on a signal: %s", exc)
        finally:
            self.done.set()


#: the process's stop request (signals are process-wide)
STOP = StopRequest()


def as_supervised_child() -> None:
    """In the child: die with the supervisor (no orphan keeps writing if it is killed), and print a Python
    traceback on a fault, so the operator sees where it happened. Call it after installing the stop signals'
    handlers (:data:`STOP`): the supervisor started this process with them blocked, and they are unblocked here
    (one that came meanwhile is handled now)."""
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
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
