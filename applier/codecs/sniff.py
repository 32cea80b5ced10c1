"""Guess which TiCDC protocol a Kafka record's bytes are in, to fail fast when ``source.protocol`` is wrong.

:func:`sniff` looks only at the shape of one record, never decodes values, and never raises:

* ``"open"``: the key starts with the 8-byte big-endian batch version 1 followed by a length-prefixed JSON
  object (or, for hand-made data, the key is a bare Open Protocol key event ``{"ts": .., "t": 1|2|3}``).
* ``"avro"``: the Confluent wire format, magic byte 0 + a 4-byte schema id (> 0) + Avro binary, in the value
  (or, for a tombstone-like record, the key); also TiCDC's test-only avro watermark/DDL values (byte 1 +
  JSON object, byte 2 + 8-byte ts, with no key). Debezium-Avro is Confluent-framed too and reports "avro".
* ``"debezium"``: a JSON object ``{"payload": {...}, "schema": ...}`` (or a bare Debezium payload with
  ``op``/``source``, or a schema-change payload with ``ddl``/``tableChanges``) in the value, or such a
  key next to an empty value.
* ``"canal-json"``: a JSON object with ``isDdl``, or a ``type`` with ``data``/``old`` lists, or the
  ``TIDB_WATERMARK`` type.
* ``"simple"``: a JSON object with an integer ``version`` and a Simple message ``type`` (DML, DDL, WATERMARK,
  BOOTSTRAP and the DDL/DML type names) with ``commitTs``/``buildTs``.
* ``None``: anything else (compressed or claim-check values, Simple's Avro encoding, empty records, noise).
"""

from __future__ import annotations

import struct
from typing import Any

import orjson

__all__ = ["sniff", "describe_mismatch"]

_U64 = struct.Struct(">Q")
_SIMPLE_TYPES = frozenset({"DML", "DDL", "WATERMARK", "BOOTSTRAP", "INSERT", "UPDATE", "DELETE", "CREATE",
                           "ALTER", "ERASE", "RENAME", "TRUNCATE", "CINDEX", "DINDEX", "QUERY"})


def _json(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except (orjson.JSONDecodeError, TypeError):
        return None


def _is_open_key(key: bytes) -> bool:
    if len(key) < 8 or _U64.unpack_from(key, 0)[0] != 1:
        return False
    if len(key) == 8:
        return True  # the version header of an empty batch
    if len(key) < 16:
        return False
    (length,) = _U64.unpack_from(key, 8)
    if length > len(key) - 16 or length < 2:
        return False
    return type(_json(key[16 : 16 + length])) is dict


def _is_open_key_event(obj: Any) -> bool:
    return (type(obj) is dict and type(obj.get("ts")) is int and obj.get("t") in (1, 2, 3)
            and all(k in ("ts", "t", "scm", "tbl", "ptn", "rid", "ohk", "ccl") for k in obj))


def _is_confluent(data: bytes) -> bool:
    # magic 0 + schema id: ids start at 1 (an all-zero id is what an Open Protocol length prefix looks like)
    return len(data) >= 5 and data[0] == 0 and data[1:5] != b"\x00\x00\x00\x00"


def _debezium_payload(obj: dict) -> bool:
    op = obj.get("op")
    if type(op) is str and type(obj.get("source")) is dict:
        return True
    return type(obj.get("ddl")) is str and ("tableChanges" in obj or "databaseName" in obj)


def _json_protocol(obj: Any) -> str | None:
    if type(obj) is not dict:
        return None
    payload = obj.get("payload")
    if "payload" in obj and all(k in ("payload", "schema") for k in obj) and type(payload) is dict:
        return "debezium"
    if _debezium_payload(obj):
        return "debezium"
    t = obj.get("type")
    if "isDdl" in obj or t == "TIDB_WATERMARK":
        return "canal-json"
    if type(t) is str and (type(obj.get("data")) is list or type(obj.get("old")) is list):
        return "canal-json"
    if (type(obj.get("version")) is int and type(t) is str and t in _SIMPLE_TYPES
            and ("commitTs" in obj or "buildTs" in obj)):
        return "simple"
    return None


def sniff(key: bytes | None, value: bytes | None) -> str | None:
    """The protocol these Kafka key/value bytes look like: "open", "canal-json", "debezium", "simple",
    "avro", or None when they look like none of them (or like nothing at all)."""
    try:
        key = bytes(key) if key is not None else None
        value = bytes(value) if value is not None else None
    except TypeError:
        return None
    if key and _is_open_key(key):
        return "open"
    if value:
        if _is_confluent(value):
            return "avro"
        if key is None and len(value) == 9 and value[0] == 2:
            return "avro"  # TiCDC's avro-enable-watermark watermark: 0x02 + 8-byte big-endian ts
        if key is None and value[0] == 1 and type(_json(value[1:])) is dict:
            return "avro"  # TiCDC's avro-enable-watermark DDL: 0x01 + JSON
        proto = _json_protocol(_json(value))
        if proto is not None:
            return proto
    if key:
        if _is_confluent(key):
            return "avro"
        kobj = _json(key)
        if _is_open_key_event(kobj):
            return "open"
        if not value and type(kobj) is dict and "payload" in kobj and all(k in ("payload", "schema")
                                                                          for k in kobj):
            return "debezium"  # a Debezium tombstone: key only
    return None


def describe_mismatch(configured: str, key: bytes | None, value: bytes | None) -> str | None:
    """A helpful sentence when a record looks like another protocol than ``configured``; None if it matches
    or if its shape says nothing."""
    seen = sniff(key, value)
    if seen is None or seen == configured:
        return None
    return (f"source.protocol is {configured!r} but this record looks like {seen!r}; "
            f"check the changefeed's protocol (sink-uri ?protocol=...) and source.protocol")
