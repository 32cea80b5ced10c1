"""The clock check of the decode stage: a timestamp a topic carries is untrusted until it is checked.

Why (invariant 15): the gate trusts a resolved ts to mean "every change up to here has been sent". One forged
watermark of the year 2100 released every held transaction half-read, recorded 2100 as applied, and made the gate
drop every later change as "already applied"; a far-future row was held for ever and pinned its partition's
restart offset. TiCDC takes every ts from PD, whose TSO follows PD's wall clock, so no healthy changefeed sends a
ts whose physical time is ahead of the applier's own clock by more than the two clocks' skew.

So every decoded event's ts (a row's or DDL's commit ts, a resolved ts or watermark) is checked here, where the
raw message is still at hand, and a message that fails is a decode error of that message: the message's
``on_decode_error`` policy (stop / quarantine / skip) settles it, and none of its events reaches the gate, so it
never advances a partition's resolved ts, the applied ts or a restart offset.

* A ts that does not fit 63 bits (the progress tables store it as a signed BIGINT) is always refused.
* A ts whose physical part is more than ``[source] max_clock_skew`` ahead of this process's clock is refused.
  The limit is read once per call of :func:`clock_limit` (once per decoded slice of messages), so a slice that
  takes seconds to decode is judged a few seconds strictly, never loosely.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Iterable

from applier.events import DDL, Event, Resolved, RowChange

#: the largest ts the progress tables hold (signed BIGINT)
TS_MAX = 2**63 - 1
LOGICAL_BITS = 18  # a TiDB TSO is physical milliseconds << 18 | logical counter
#: every reason of a message refused here contains this (``applier status`` counts them by it)
UNTRUSTED = "untrusted timestamp"
#: ``[source] max_clock_skew``'s default. TiCDC's commit and resolved ts come from PD's clock and trail it; a
#: healthy deployment's clocks (NTP) agree within milliseconds. A forged ts within the skew can still pass, so
#: the default is small: a minute is far above any healthy skew and bounds what a forged one can move.
DEFAULT_MAX_SKEW_MS = 60_000


def clock_limit(max_skew_ms: int | None, now_ms: int | None = None) -> int:
    """The largest ts trusted now: this clock plus the skew, as a TSO (every logical value of that millisecond).
    ``max_skew_ms`` None checks only that a ts fits 63 bits."""
    if max_skew_ms is None:
        return TS_MAX
    if now_ms is None:
        now_ms = time.time_ns() // 1_000_000
    return min(TS_MAX, ((now_ms + max_skew_ms) << LOGICAL_BITS) | ((1 << LOGICAL_BITS) - 1))


def event_ts(ev: Event) -> int | None:
    """The ts an event carries (None for one that carries none, such as a table schema)."""
    t = type(ev)
    if t is RowChange or t is DDL:
        return ev.commit_ts  # type: ignore[union-attr]
    if t is Resolved:
        return ev.ts  # type: ignore[union-attr]
    return None


def untrusted(events: Iterable[Event], limit: int) -> tuple[Event, str] | None:
    """The first event whose ts is not trusted under ``limit`` (:func:`clock_limit`), with the reason; None
    when every ts is. Cheap enough for every event: one integer comparison each."""
    for ev in events:
        ts = event_ts(ev)
        if ts is None or 0 <= ts <= limit:
            continue
        return ev, untrusted_reason(ev, ts, limit)
    return None


def untrusted_reason(ev: Event, ts: int, limit: int) -> str:
    what = "resolved ts" if type(ev) is Resolved else "commit ts"
    if not isinstance(ts, int) or ts < 0 or ts > TS_MAX:
        return (f"{UNTRUSTED}: its {what} {ts} does not fit 63 bits, so it is no TiDB TSO; the message is "
                "corrupt or forged")
    ahead_ms = (ts >> LOGICAL_BITS) - (limit >> LOGICAL_BITS)
    return (f"{UNTRUSTED}: its {what} {ts} ({physical_text(ts)}) is ahead of this host's clock by more than "
            f"source.max_clock_skew (by {ahead_ms / 1000:.1f} s beyond it); trusting it would release transactions "
            "not fully read and drop later changes as already applied. If the clocks of this host and TiDB's PD "
            "truly differ, synchronise them (NTP) or raise source.max_clock_skew")


def physical_text(ts: int) -> str:
    """A TSO's physical time in words (UTC), or why it has none."""
    try:
        return (dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=ts >> LOGICAL_BITS)).isoformat(
            timespec="milliseconds") + "Z"
    except OverflowError:
        return "a physical time past the year 9999"
