"""One hostile JSON message must never crash the applier: every JSON protocol turns deep nesting, huge numbers,
invalid UTF-8 and huge strings into a DecodeError with its position, in the driver and in the worker-decoding
path (issue 10). Each case runs in a child process, so a native crash (orjson before 3.10 segfaults on deep
nesting) fails the test instead of killing the test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent('''
    import struct, sys
    from applier.codecs import get_decoder
    from applier.decode import WorkerSpec, decode_arrow_batches, decode_chunk
    from applier.events import DecodeError, KafkaMessage

    HOSTILE = {
        "deep arrays": b"[" * 200_000 + b"]" * 200_000,
        "deep objects": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "deep inside a value": b'{"type":"INSERT","data":[' + b"[" * 100_000 + b"]" * 100_000 + b"]}",
        "huge number": b'{"ts":' + b"9" * 100_000 + b"}",
        "invalid utf-8": b'{"database":"\\xff\\xfe\\xfd","table":"t"}',
        "huge string": b'{"database":"' + b"a" * 20_000_000 + b'"}',
    }
    U64 = struct.Struct(">Q")

    def messages(protocol):
        for i, (name, body) in enumerate(HOSTILE.items()):
            if protocol == "open":
                good_key = b'{"ts":1,"scm":"s","tbl":"t","t":1}'
                yield name + " (key)", (U64.pack(1) + U64.pack(len(body)) + body, U64.pack(2) + b"{}")
                yield name + " (value)", (U64.pack(1) + U64.pack(len(good_key)) + good_key,
                                          U64.pack(len(body)) + body)
            else:
                yield name, (None, body)

    protocol = sys.argv[1]
    msgs = [KafkaMessage("t", 0, i, k, v) for i, (_, (k, v)) in enumerate(messages(protocol))]
    names = [n for n, _ in messages(protocol)]
    decoder = get_decoder(protocol)
    for name, msg in zip(names, msgs):
        try:
            decoder.decode(msg)
        except DecodeError as exc:
            assert exc.position.offset == msg.offset, (name, exc)
        else:
            raise AssertionError(f"{protocol}: {name} decoded without an error")
    if len(sys.argv) > 2:  # the path Spark's Python workers run
        import pyarrow as pa
        batch = pa.RecordBatch.from_arrays(
            [pa.array([m.topic for m in msgs]), pa.array([m.partition for m in msgs], pa.int32()),
             pa.array([m.offset for m in msgs], pa.int64()), pa.array([m.key for m in msgs], pa.binary()),
             pa.array([m.value for m in msgs], pa.binary())],
            names=["topic", "partition", "offset", "key", "value"])
        spec = WorkerSpec(protocol, (), stop_at_error=False)
        errors = [e for rb in decode_arrow_batches(spec, iter([batch]))
                  for chunk in rb.column(0).to_pylist() for e in decode_chunk(chunk).errors]
        assert [m.offset for m, _ in errors] == [m.offset for m in msgs], errors
    print("contained", len(msgs))
''')


@pytest.mark.parametrize("protocol,workers", [("open", True), ("canal-json", True), ("simple", False),
                                              ("debezium", False)])
def test_hostile_json_is_a_decode_error_not_a_crash(protocol, workers) -> None:
    argv = [sys.executable, "-c", CHILD, protocol] + (["workers"] if workers else [])
    res = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"exit {res.returncode} (negative: killed by signal)\n{res.stderr[-3000:]}"
    assert res.stdout.startswith("contained")
