"""What every decoder shares: the rule that nothing but DecodeError leaves ``decode()``."""

from __future__ import annotations

from typing import Any, Callable

from applier.events import DecodeError, Event, KafkaMessage


class Malformed(Exception):
    """Raised inside a decoder with the reason only; :func:`guarded_decode` adds the message's position."""


class UpstreamUnusable(Malformed):
    """The message is fine, but the upstream TiDB that completes it (handle-key-only rows) cannot serve the read:
    unreachable, not TiDB, or its GC passed the ts. Becomes a DecodeError with ``upstream=True``."""


def decode_error(position: Any, e: Malformed, protocol: str) -> DecodeError:
    """The DecodeError of a Malformed reason at ``position``."""
    return DecodeError(position, str(e), protocol=protocol, upstream=isinstance(e, UpstreamUnusable))


def guarded_decode(protocol: str, decode: Callable[[KafkaMessage], list[Event]], msg: KafkaMessage,
                   passthrough: tuple[type[BaseException], ...] = ()) -> list[Event]:
    """Run a decoder's body so that malformed input of any kind surfaces as a DecodeError naming the
    topic, partition and offset (``passthrough`` lists errors that are not about the message, such as an
    unreachable schema registry, and must stop the pipeline as they are)."""
    try:
        return decode(msg)
    except DecodeError:
        raise
    except passthrough:
        raise
    except Malformed as e:
        raise decode_error(msg.position, e, protocol) from None
    except Exception as e:  # noqa: BLE001 - the contract is: nothing but DecodeError escapes
        raise DecodeError(msg.position, f"unexpected {type(e).__name__} while decoding: {e}", protocol=protocol) from e


def allowed_members(text: Any) -> tuple[str, ...]:
    """ENUM/SET members from an ``allowed`` parameter (Avro connect.parameters, Debezium parameters): TiCDC joins them with "," after escaping a comma
    inside a member as "\\," (pkg/sink/codec/common EscapeEnumAndSetOptions)."""
    if not isinstance(text, str) or not text:
        return ()
    out: list[str] = []
    cur: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] == ",":
            cur.append(",")
            i += 2
            continue
        if ch == ",":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    out.append("".join(cur))
    return tuple(out)
