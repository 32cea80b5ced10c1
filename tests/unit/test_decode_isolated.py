"""A message that kills the decoder process is found and named, and every other message of the batch decodes as
usual, in order (issue 10: no single message may crash or stall the applier)."""

from __future__ import annotations

import os
from pathlib import Path

from applier.codecs import get_decoder
from applier.decode import WorkerSpec, decode_chunk, decode_isolated, decode_messages, worker_crashed
from applier.events import KafkaMessage

CRASHING = Path(__file__).resolve().parents[1] / "crashing_decoder"


def test_the_killing_message_is_isolated_and_the_rest_decodes(monkeypatch) -> None:
    from applier.devtools.changefeed import generate

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(CRASHING), os.environ.get("PYTHONPATH", "")]))
    good = [(k, v) for _, k, v in generate("canal-json", partitions=1, txns=8, seed=1, replays=0).messages][:12]
    records = good[:3] + [(None, b'{"data": "APPLIER-TEST-SEGFAULT"}')] + good[3:]
    msgs = [KafkaMessage("t", 0, 100 + i, k, v) for i, (k, v) in enumerate(records)]
    spec = WorkerSpec("canal-json", (), stop_at_error=False)
    decoded = [decode_chunk(c) for c in decode_isolated(spec, msgs)]
    errors = [e for d in decoded for e in d.errors]
    killed = [(m.offset, str(exc)) for m, exc in errors if "killed the decoder process" in str(exc)]
    assert [o for o, _ in killed] == [103] and "SIGSEGV" in killed[0][1]
    # everything else decodes exactly as in the driver, in order
    direct = decode_messages(get_decoder("canal-json"), msgs[:3] + msgs[4:], stop_at_error=False)
    assert [e for d in decoded for e in d.events] == direct.events
    assert sum(d.messages for d in decoded) == len(msgs)


def test_worker_crash_is_told_apart_from_decoder_errors() -> None:
    assert worker_crashed(RuntimeError("org.apache.spark.SparkException: Python worker exited unexpectedly "
                                       "(crashed): Fatal Python error: Segmentation fault"))
    assert not worker_crashed(RuntimeError("DecodeError: topic=t partition=0 offset=3: not JSON"))
