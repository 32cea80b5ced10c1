"""What ``applier quarantine`` prints: held changes, messages and the results of retry and discard as text an
operator reads on a terminal, every upstream value escaped (a hostile value must not act on the terminal).

Kept apart from :mod:`applier.redrive`, which selects and does the I/O, so each reads as one job."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any, Sequence

from applier.mysql_values import format_time
from applier.quarantine import HELD, HeldRow
from applier.redrive import (
    REASON_SHOWN, VALUE_SHOWN, DiscardResult, KeyGroup, Listing, QuarantinedMessage, RetryResult, escape_text,
    shown_key, utc_text,
)
from applier.sinks.table import shown


def shown_text(s: str, limit: int | None = None) -> str:
    """Free text (a reason, a note) on one line, escaped, truncated to ``limit`` characters."""
    one = escape_text(s)
    if limit is not None and len(one) > limit:
        return one[: limit - 1] + "…"
    return one


def readable(v: Any, limit: int = VALUE_SHOWN) -> str:
    """A decoded value as an operator reads it: NULL, numbers as written, text quoted and escaped, bytes as hex,
    temporal values in ISO form (TIME as MySQL writes it); long values are cut, saying how long they are."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, Decimal)):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        cut = b[: max(limit // 2, 1)]
        return f"x'{cut.hex()}'" + (f"… ({len(b)} bytes)" if len(cut) < len(b) else "")
    if isinstance(v, dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, (dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return format_time(v)
    s = v if isinstance(v, str) else repr(v)
    quoted = "'" + escape_text(s).replace("'", "\\'") + "'"
    if len(quoted) > limit:
        return quoted[: limit - 1] + f"…' ({len(s)} characters)"
    return quoted


def safe_preview(data: bytes | None, limit: int = 400) -> str:
    """Raw message bytes, safe to print: UTF-8 text escaped, anything else as a Python bytes literal (every
    byte outside printable ASCII as \\xNN); never the raw bytes themselves."""
    if data is None:
        return "(none)"
    cut = data[:limit]
    more = f"… ({len(data) - len(cut)} more bytes)" if len(cut) < len(data) else ""
    text = _utf8_text(cut, truncated=bool(more))
    if text is None:
        return repr(cut) + more
    return '"' + escape_text(text).replace('"', '\\"') + '"' + more


def _utf8_text(b: bytes, *, truncated: bool) -> str | None:
    """``b`` as UTF-8, or None; a character the preview's cut split in two is left out."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError as exc:
        if truncated and exc.end == len(b) and exc.start >= len(b) - 3:
            try:
                return b[:exc.start].decode("utf-8")
            except UnicodeDecodeError:
                return None
        return None


def tso_time(ts: int) -> str:
    """The wall-clock time in a TiDB commit ts (its physical milliseconds), or '' when it holds none."""
    ms = ts >> 18
    if ts <= 0 or ms < 1_000_000_000_000:  # before 2001: not a TSO (an ungated stream's stand-in)
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


# ---- text for the terminal -------------------------------------------------------------------------------------

def _ts_range(g: KeyGroup) -> str:
    return f"commit ts {g.first_ts}" if g.first_ts == g.last_ts else f"commit ts {g.first_ts} .. {g.last_ts}"


def _ids(ids: Sequence[int], limit: int = 12) -> str:
    s = ", ".join(map(str, ids[:limit]))
    return s + (f", … ({len(ids)} in all)" if len(ids) > limit else "")


def format_listing(ls: Listing, *, limit: int = 50, config: str = "CONF") -> str:
    changes = sum(len(g.rows) for g in ls.groups)
    what = "held" if ls.state == HELD else ("quarantined" if ls.state == "all" else ls.state)
    lines = [f"pipeline {ls.pipeline}: {changes} {what} row change(s) under {len(ls.groups)} key(s)"]
    for g in ls.groups[:limit]:
        state = f"  [{g.state}]" if ls.state == "all" else ""
        lines.append(f"  {g.upstream}  key {shown_key(g.row_key)}  {len(g.rows)} change(s)  {_ts_range(g)}  "
                     f"ids {_ids(g.ids)}{state}")
        lines.append(f"      reason: {shown_text(g.reason, REASON_SHOWN)}")
        if g.state != HELD and g.rows[0].resolved_by:
            lines.append(f"      {g.state} by {shown_text(g.rows[0].resolved_by)}"
                         + (f": {shown_text(g.rows[0].note or '', REASON_SHOWN)}" if g.rows[0].note else ""))
    if len(ls.groups) > limit:
        lines.append(f"  … and {len(ls.groups) - limit} more key(s) (--limit, or --json for all)")
    if ls.messages_listed:
        lines.append("quarantined messages (raw records that could not be decoded; one held under key * above blocks "
                     "its table or partition, and `retry` decodes it again; `show ID --message` shows its bytes): "
                     f"{len(ls.messages)}")
        for m in ls.messages[:limit]:
            lines.append(f"  id {m.id}  topic={shown(m.topic)} partition={m.partition} offset={m.offset}: "
                         f"{shown_text(m.reason, REASON_SHOWN)}")
        if len(ls.messages) > limit:
            lines.append(f"  … and {len(ls.messages) - limit} more (--limit, or --json for all)")
    if ls.groups and ls.state == HELD:
        lines.append(f"next: `applier quarantine show ID -c {config}` for a change in full; fix the cause, then "
                     f"`applier quarantine retry -c {config} --table S.T --key KEY` (or --all), or `discard ... "
                     "--reason TEXT`")
    return "\n".join(lines)


def held_json(h: HeldRow) -> dict[str, Any]:
    return {
        "id": h.id, "schema": h.schema, "table": h.table, "key": h.row_key, "state": h.state, "kind": h.kind,
        "commit_ts": h.commit_ts,
        "position": {"topic": h.position.topic, "partition": h.position.partition, "offset": h.position.offset},
        "reason": h.reason, "created_at": utc_text(h.created_at), "resolved_by": h.resolved_by, "note": h.note,
        "event": json.loads(h.event),
    }


def format_held(h: HeldRow) -> str:
    when = tso_time(h.commit_ts)
    lines = [
        f"quarantined row change id {h.id}: {h.state} ({h.kind})",
        f"  upstream table  {shown(h.schema, h.table)}",
        f"  key             {shown_key(h.row_key)}",
        f"  commit ts       {h.commit_ts}" + (f"  ({when})" if when else ""),
        f"  position        {shown(h.position.topic)} partition {h.position.partition} offset {h.position.offset}",
        f"  held since      {utc_text(h.created_at)}",
        f"  reason          {shown_text(h.reason)}",
    ]
    if h.resolved_by:
        lines.append(f"  {h.state} by{' ' * max(1, 13 - len(h.state))}{shown_text(h.resolved_by)}")
    if h.note:
        lines.append(f"  note            {shown_text(h.note)}")
    try:
        ev = h.change()
    except Exception as exc:
        lines.append(f"  event           cannot be read back: {type(exc).__name__}: {shown_text(str(exc), 300)}")
        return "\n".join(lines)
    lines.append(f"  change          {ev.op.value}")
    types = {c.name: c for c in ev.columns}
    names = list(types)
    for img in (ev.before, ev.after):
        names += [n for n in (img or {}) if n not in names]
    rows = [("column", "type", "before", "after")]
    for n in names:
        c = types.get(n)
        typ = (c.type_name + (" unsigned" if c.unsigned else "")) if c else "?"
        label = n + (" (key)" if c is not None and c.key else "")
        cell = [readable(img[n]) if img is not None and n in img else "-" for img in (ev.before, ev.after)]
        rows.append((shown(label) or "''", typ, cell[0], cell[1]))
    widths = [min(max(len(r[i]) for r in rows), 40) for i in range(3)]
    for r in rows:
        lines.append("    " + "  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    return "\n".join(lines)


def format_message(m: QuarantinedMessage, *, preview: int = 400) -> str:
    lines = [
        f"quarantined message id {m.id} (could not be decoded; `applier quarantine list` shows whether it still "
        "blocks its table or partition, under key *)",
        f"  position   {shown(m.topic)} partition {m.partition} offset {m.offset}",
        f"  held since {utc_text(m.created_at)}",
        f"  reason     {shown_text(m.reason)}",
    ]
    for name, data in (("key", m.key), ("value", m.value)):
        if data is None:
            lines.append(f"  {name:<10} (none)")
        else:
            lines.append(f"  {name:<10} {len(data)} bytes: {safe_preview(data, preview)}")
    return "\n".join(lines)


def _fence_note(pipeline: str, epoch: int) -> str:
    return (f"writer epoch {epoch} of pipeline {pipeline} was claimed for this: an `applier run` of it that is running "
            "stops at its next transaction (exit code 6) without writing. Start it again, so it reloads the "
            "blocked keys without the released ones.")


def format_retry(res: RetryResult) -> str:
    changes = sum(len(g.rows) for g in res.groups)
    lines = [f"retried {changes} held change(s) of {len(res.groups)} key(s) in one transaction "
             f"(pipeline {res.pipeline}, by {shown_text(res.by)}):"]
    for g in res.groups:
        if g.is_block:
            for h in g.rows:
                n = res.redecoded.get(h.id, 0)
                lines.append(f"  {g.upstream}  undecodable message at {shown(h.position.topic)} partition "
                             f"{h.position.partition} offset {h.position.offset} (id {h.id}): decoded again, "
                             f"{n} row change(s) applied with the rest")
            continue
        target = res.targets.get((g.schema, g.table))
        kinds = ", ".join(dict.fromkeys(_op(h) for h in g.rows))
        lines.append(f"  {g.upstream} -> {shown(*target) if target else '?'}  key {shown_key(g.row_key)}: "
                     f"{len(g.rows)} change(s) ({kinds}), {_ts_range(g)}, ids {_ids(g.ids)}")
    for t, (up, dl) in res.written.items():
        lines.append(f"  target {shown(*res.targets[t])}: {up} row(s) upserted, {dl} deleted")
    lines.append("now marked retried. " + _fence_note(res.pipeline, res.epoch))
    return "\n".join(lines)


def _op(h: HeldRow) -> str:
    try:
        return json.loads(h.event).get("op", "?")
    except ValueError:
        return "?"


def format_discard(res: DiscardResult, *, config: str = "CONF") -> str:
    changes = sum(len(g.rows) for g in res.groups)
    lines = [f"discarded {changes} held change(s) of {len(res.groups)} key(s) (pipeline {res.pipeline}, by "
             f"{shown_text(res.by)}, reason: {shown_text(res.reason, REASON_SHOWN)}):"]
    for g in res.groups:
        lines.append(f"  {g.upstream}  key {shown_key(g.row_key)}: {len(g.rows)} change(s), {_ts_range(g)}, "
                     f"ids {_ids(g.ids)}")
    lines.append("The replica may now differ from the upstream for these keys (their changes were never applied): "
                 f"compare them with `applier verify -c {config} --upstream URL`, and write the rows by hand where "
                 "needed.")
    lines.append(_fence_note(res.pipeline, res.epoch))
    return "\n".join(lines)
