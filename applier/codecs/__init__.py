"""Codecs: Kafka record bytes of one TiCDC protocol -> :mod:`applier.events` objects.

``get_decoder(protocol, **options)`` builds the decoder for a protocol name. Every decoder satisfies the
:class:`Decoder` protocol: ``decode(msg)`` returns the events of one Kafka record in order and raises
:class:`applier.events.DecodeError` (never anything else) for input it cannot decode; ``gated`` says whether
the protocol carries resolved ts / watermarks, i.e. whether the pipeline can hold events until the global
resolved ts passes them.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, runtime_checkable

from applier.events import Event, KafkaMessage

__all__ = ["Decoder", "HoldsMessages", "NamesTables", "batch_hint", "decodes_alone", "decodes_on_workers",
           "decodes_with_schemas", "get_decoder", "plausible_table", "protocols", "table_of"]

# What a decoder that decodes "with schemas" (below) says a Spark worker did with one message
# (``decode_in_worker``; applier.decode carries it to the driver):
WORKER_DONE = 0  # decoded with a schema the driver handed out: the event is final
WORKER_RAW = 1  # not decoded: the driver decodes the message itself
WORKER_CHECK = 2  # decoded with a schema the worker learnt itself: final only if the driver has the same schema

# Kafka messages per micro-batch when [pipeline] max_offsets_per_trigger is not set. A decoder class may say
# otherwise with a class attribute ``max_offsets_per_trigger`` (Open Protocol batches up to 16 row changes per
# message, so 200k of its messages, ~3.2M rows, overran the Spark JVM's heap in the benchmark).
# 50k rather than 200k: the first batch is read before anything applies, and the last is applied after the read
# has ended, so smaller batches start and end the read/apply overlap sooner. Whole-process catch-up of 1M
# Canal-JSON row changes on MariaDB: 77.3 s with 200k, 62.3 s with 50k; the first commit came at 16.5 s instead
# of 31.2 s (docs/benchmarks.md, round 4).
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 50_000


@runtime_checkable
class Decoder(Protocol):
    name: str
    gated: bool

    def decode(self, msg: KafkaMessage) -> list[Event]:
        """All events of one Kafka record, in order; raises DecodeError for malformed input."""
        ...


@runtime_checkable
class HoldsMessages(Protocol):
    """A decoder that may hold messages back until it can decode them (Simple, waiting for a table's schema).
    The gate asks it, so that no offset past a held message is committed as done and nothing at or above a held
    message's commit ts is applied before it."""

    def held_offsets(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> lowest offset of a held message."""
        ...

    def held_min_commit_ts(self) -> int | None:
        """The lowest commit ts among held messages (None when nothing is held or it is unknown)."""
        ...


@runtime_checkable
class NamesTables(Protocol):
    """A decoder that can often still read which table an undecodable message belongs to (the parts of it that
    do parse): the pipeline then holds every later change of that table behind the quarantined message."""

    def table_of(self, msg: KafkaMessage) -> "tuple[str, str] | None":
        """(schema, table) of the message as far as it can be read, or None; never raises."""
        ...


def table_of(decoder: Any, msg: KafkaMessage) -> "tuple[str, str] | None":
    """The table a (bad) message belongs to, when its decoder can tell; None otherwise, whatever happens."""
    if not isinstance(decoder, NamesTables):
        return None
    try:
        named = decoder.table_of(msg)
    except Exception:
        return None
    return plausible_table(named)


def plausible_table(named: Any) -> "tuple[str, str] | None":
    """``named`` as (schema, table) when TiDB could have such names, else None. A name TiDB could not have (and
    the quarantine's columns could not hold) reads as no name: the message then blocks its partition rather than
    failing the transaction that records it."""
    if not isinstance(named, (tuple, list)) or len(named) != 2 or not all(
            isinstance(x, str) and 0 < len(x) <= 64 and "\x00" not in x for x in named):
        return None
    return named[0], named[1]


def _decoder_class(protocol: str) -> type | None:
    entry = _DECODERS.get(protocol)
    if entry is None:
        return None
    module, cls_name = entry
    return getattr(importlib.import_module(module), cls_name)


# protocol name -> (module, class). Imported lazily so one broken codec does not break the others.
_DECODERS: dict[str, tuple[str, str]] = {
    "open": ("applier.codecs.open", "OpenDecoder"),
    "canal-json": ("applier.codecs.canal_json", "CanalJSONDecoder"),
    "avro": ("applier.codecs.avro", "AvroDecoder"),
    "simple": ("applier.codecs.simple", "SimpleDecoder"),
    "debezium": ("applier.codecs.debezium", "DebeziumDecoder"),
}


def protocols() -> list[str]:
    """The protocol names get_decoder accepts."""
    return sorted(_DECODERS)


def decodes_alone(protocol: str) -> bool:
    """Whether a message of ``protocol`` decodes without anything learnt from earlier messages (no schema
    cache, no held messages), so Spark's Python workers may decode it (see applier.decode). Decoders say so
    with a class attribute ``decodes_alone = True``; Simple (held rows, schemas from BOOTSTRAP) does not."""
    cls = _decoder_class(protocol)
    return cls is not None and bool(getattr(cls, "decodes_alone", False))


def decodes_with_schemas(protocol: str) -> bool:
    """Whether Spark's Python workers decode ``protocol``'s messages given a snapshot of what the driver's decoder
    learnt from earlier messages, leaving the rest to the driver (class attribute ``decodes_with_schemas =
    True``: Simple; its module docstring says how): ``schema_snapshot()``/``idle()``/``accept()``/``confirms()``
    in the driver, ``seed()``/``decode_in_worker()`` in the workers."""
    cls = _decoder_class(protocol)
    return cls is not None and bool(getattr(cls, "decodes_with_schemas", False))


def decodes_on_workers(protocol: str) -> bool:
    """Whether Spark's Python workers may decode ``protocol`` (alone, or with the driver's schemas)."""
    return decodes_alone(protocol) or decodes_with_schemas(protocol)


def batch_hint(protocol: str) -> int:
    """Kafka messages per micro-batch for ``protocol`` when the config does not say (see above)."""
    cls = _decoder_class(protocol)
    return int(getattr(cls, "max_offsets_per_trigger", DEFAULT_MAX_OFFSETS_PER_TRIGGER))


def get_decoder(protocol: str, **options: Any) -> Decoder:
    """A decoder for ``protocol`` ("open", "canal-json") configured with protocol-specific ``options``.

    open:       strict_values=True, legacy_base64_strings=False
    canal-json: require_tidb_extension=True
    open, canal-json and simple also take TiCDC's large-message options (applier.codecs.largemsg):
                large_message_handle_compression, claim_check_uri, claim_check_location_prefix,
                claim_check_raw_value (not open), upstream_url, upstream_time_zone, upstream_read_current_state

    Raises ValueError naming the valid protocols for an unknown name, or naming the valid options for an
    unknown option.
    """
    cls = _decoder_class(protocol)
    if cls is None:
        raise ValueError(f"unknown protocol {protocol!r}; valid protocols: {', '.join(protocols())}")
    try:
        return cls(**options)
    except TypeError as e:
        import inspect

        valid = [p for p in inspect.signature(cls).parameters if p != "self"]
        raise ValueError(
            f"invalid options for protocol {protocol!r}: {e}; valid options: {', '.join(valid) or 'none'}"
        ) from None
