"""TiCDC-shaped event streams for the gate's tests: row/resolved builders, and random per-partition message
logs with replays after simulated TiCDC restarts, plus the final table state they must converge to."""

from __future__ import annotations

import random
from dataclasses import dataclass

from applier.events import Column, Op, Resolved, RowChange, SourcePosition

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "int"))


def row(ts: int, part: int, off: int, key: int, val: int | None, table: str = "t", topic: str = "k") -> RowChange:
    pos = SourcePosition(topic, part, off)
    if val is None:
        return RowChange("s", table, ts, Op.DELETE, {"id": key, "v": None}, None, COLS, pos)
    return RowChange("s", table, ts, Op.INSERT, None, {"id": key, "v": val}, COLS, pos)


def res(ts: int, part: int, off: int, topic: str = "k") -> Resolved:
    return Resolved(ts, SourcePosition(topic, part, off))


@dataclass
class Msg:
    part: int
    off: int
    ev: object


def make_stream(rng: random.Random, parts: int, txns: int, replay: bool) -> tuple[dict[int, list[Msg]], dict]:
    """Per-partition message lists as TiCDC would write them, and the expected final table state."""
    logs: dict[int, list[Msg]] = {p: [] for p in range(parts)}
    truth: dict[tuple[str, int], tuple[int, int | None]] = {}
    ts = 100
    emitted: list[tuple[int, int, object]] = []  # (ts, part, factory) for replays
    for _ in range(txns):
        ts += rng.randint(1, 5)
        in_txn: set[tuple[str, int]] = set()
        for _ in range(rng.randint(1, 4)):
            table = rng.choice(["a", "b"])
            key = rng.randint(1, 12)
            if (table, key) in in_txn:
                continue  # TiKV keeps one change per key per transaction
            in_txn.add((table, key))
            p = key % parts
            if (table, key) in truth and truth[(table, key)][1] is not None and rng.random() < 0.25:
                # a unique-key-changing update: TiCDC sends delete + insert of the same key in one transaction
                val = rng.randint(0, 1000)
                for payload in (("row", ts, key, None, table), ("row", ts, key, val, table)):
                    logs[p].append(Msg(p, len(logs[p]), payload))
                    emitted.append((ts, p, payload))
                truth[(table, key)] = (ts, val)
                continue
            val = None if rng.random() < 0.2 else rng.randint(0, 1000)
            p = key % parts
            logs[p].append(Msg(p, len(logs[p]), ("row", ts, key, val, table)))
            truth[(table, key)] = (ts, val)
            emitted.append((ts, p, ("row", ts, key, val, table)))
        if rng.random() < 0.4:
            for p in range(parts):
                logs[p].append(Msg(p, len(logs[p]), ("res", ts)))
        if replay and rng.random() < 0.1 and emitted:
            # TiCDC restarted from an older checkpoint: re-send a suffix of events and an old watermark
            cut = rng.randint(max(0, len(emitted) - 8), len(emitted) - 1)
            old = emitted[cut][0] - 1
            for p in range(parts):
                logs[p].append(Msg(p, len(logs[p]), ("res", old)))
            for ets, p, payload in emitted[cut:]:
                logs[p].append(Msg(p, len(logs[p]), payload))
    ts += 1
    for p in range(parts):
        logs[p].append(Msg(p, len(logs[p]), ("res", ts)))
    return logs, {k: v[1] for k, v in truth.items() if v[1] is not None}


def materialise(m: Msg):
    kind = m.ev[0]
    if kind == "res":
        return res(m.ev[1], m.part, m.off)
    _, ts, key, val, table = m.ev
    return row(ts, m.part, m.off, key, val, table=table)


def apply(state: dict, ev: RowChange) -> None:
    """Apply a released change to ``state`` ((table, id) -> v), as the target would."""
    k = (ev.table, (ev.after or ev.before)["id"])
    if ev.op is Op.DELETE:
        state.pop(k, None)
    else:
        state[k] = ev.after["v"]
