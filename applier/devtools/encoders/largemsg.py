"""Test fixture: what TiCDC's Kafka sink does with large messages, for the protocol encoders next to this module.

* :func:`compress` - ``large-message-handle-compression``: Snappy's block format (Go ``snappy.Encode``) or an LZ4
  frame (``lz4.NewWriter``), as TiCDC pkg/compression/compress.go writes them.
* :class:`ClaimCheckStorage` - ``large-message-handle-option = "claim-check"``: writes ``<uuid>.json`` holding Go's
  JSON of ``{"key": <bytes>, "value": <bytes>}`` (base64; a nil key is ``null``), or the bare value with
  ``claim-check-raw-value``, and returns the location TiCDC puts in the message (the storage URI without its
  parameters, ``/``, the file name). Files go through fsspec, so ``file://`` and ``s3://`` (with
  ``storage_options``) both work.
* :class:`LargeMessage` - which rows the encoders send as claim-check or handle-key-only messages: those whose
  encoded length (as TiCDC measures it) exceeds ``max_message_bytes``, or those ``is_large`` picks (tests).

The layouts and their sources are in docs/large-messages.md. The applier reads these with
:mod:`applier.codecs.largemsg`.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import orjson

#: sarama's per-record overhead TiCDC adds to a message's length (pkg/sink/codec/common/message.go
#: MaxRecordOverhead = 5*binary.MaxVarintLen32 + binary.MaxVarintLen64 + 1)
MAX_RECORD_OVERHEAD = 5 * 5 + 10 + 1
#: TiCDC's default max-message-bytes for Kafka sinks (10 MiB)
DEFAULT_MAX_MESSAGE_BYTES = 10 * 1024 * 1024
COMPRESSIONS = ("none", "snappy", "lz4")


def compress(method: str, data: bytes) -> bytes:
    """``data`` compressed as TiCDC's large-message-handle-compression does ("none" returns it unchanged)."""
    if method in ("", "none"):
        return bytes(data)
    import cramjam

    if method == "snappy":
        return bytes(cramjam.snappy.compress_raw(bytes(data)))
    if method == "lz4":
        return bytes(cramjam.lz4.compress(bytes(data)))
    raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {method!r}")


def _uuid_names() -> Iterator[str]:
    while True:
        yield f"{uuid.uuid4()}.json"


class ClaimCheckStorage:
    """TiCDC's claim-check writer (pkg/sink/kafka/claimcheck/claim_check.go) over an fsspec URL.

    ``uri`` is the changefeed's ``claim-check-storage-uri`` (``file:///folder`` or ``s3://bucket/prefix``; its
    query is dropped from the locations, as TiDB's storage ``URI()`` does); ``raw_value`` is
    ``claim-check-raw-value``; ``names`` pins the file names (default ``<uuid4>.json``). ``written`` lists the
    locations in order."""

    def __init__(self, uri: str, *, raw_value: bool = False, storage_options: dict | None = None,
                 names: Iterator[str] | None = None) -> None:
        import fsspec

        parts = urlsplit(uri if "://" in uri else "file://" + uri)
        self.prefix = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self.raw_value = raw_value
        self._fs, self._root = fsspec.core.url_to_fs(self.prefix, **(storage_options or {}))
        self._names = names or _uuid_names()
        self.written: list[str] = []
        if parts.scheme in ("", "file"):
            self._fs.makedirs(self._root, exist_ok=True)

    def write(self, key: bytes | None, value: bytes) -> str:
        """Store one message; returns its location (``FileNameWithPrefix``)."""
        name = next(self._names)
        if self.raw_value:
            data = bytes(value)
        else:  # Go's json.Marshal of ClaimCheckMessage{Key, Value []byte}
            data = orjson.dumps({"key": None if key is None else base64.b64encode(key).decode("ascii"),
                                 "value": None if value is None else base64.b64encode(value).decode("ascii")})
        with self._fs.open(f"{self._root.rstrip('/')}/{name}", "wb") as f:
            f.write(data)
        location = f"{self.prefix}/{name}"
        self.written.append(location)
        return location


@dataclass
class LargeMessage:
    """The changefeed's ``large-message-handle-option`` ("claim-check" or "handle-key-only") and which row
    messages it applies to: TiCDC's rule (the encoded length, counted as TiCDC counts it, is above
    ``max_message_bytes``), or ``is_large(event)`` when given (tests choose rows). ``claim_check`` is where
    claim-check files go."""

    option: str
    claim_check: ClaimCheckStorage | None = None
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    is_large: Callable[[Any], bool] | None = None
    sent: list[Any] = field(default_factory=list)  # the events sent as large-message variants, in order

    def __post_init__(self) -> None:
        if self.option not in ("claim-check", "handle-key-only"):
            raise ValueError(f"option must be 'claim-check' or 'handle-key-only', got {self.option!r}")
        if self.option == "claim-check" and self.claim_check is None:
            raise ValueError("claim-check needs claim_check=ClaimCheckStorage(...)")

    def too_large(self, event: Any, length: int) -> bool:
        large = self.is_large(event) if self.is_large is not None else length > self.max_message_bytes
        if large:
            self.sent.append(event)
        return large

    @property
    def claim(self) -> bool:
        return self.option == "claim-check"
