"""Test fixture, loaded only by processes whose PYTHONPATH names this folder: stands in for a native fault in the
JSON library. Any JSON document containing the marker kills the process with SIGSEGV, as orjson 3.9 did on deep
nesting, so the tests can check that such a message is contained (named or quarantined), whatever the cause."""

import ctypes

MARKER = b"APPLIER-TEST-SEGFAULT"

try:
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

if orjson is not None:
    _real_loads = orjson.loads

    def _loads(data, *args, **kwargs):
        if MARKER in bytes(data):
            # a real fault in the calling thread (os.kill would let this thread run on until another one dies)
            ctypes.string_at(0)
        return _real_loads(data, *args, **kwargs)

    orjson.loads = _loads
