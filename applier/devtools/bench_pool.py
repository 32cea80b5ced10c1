"""The pooled producer of the live benchmark (``bench --live``, ``--producer pooled``, Canal-JSON only).

Why: the per-row producer (``--producer encode``, :func:`applier.devtools.bench_live.send_encoded`) runs the
Python test encoder for every row change, 40-60 µs of CPU each, so on a 2-core machine it tops out near 9k
rows/s and takes CPU from the applier it measures. The pooled producer encodes a pool of transactions once,
before the run, and then only substitutes each transaction's commit ts into its bytes when it sends it (about
1.5 µs per row without Kafka, 3 µs with confluent-kafka's ``produce()``).

Layering: :mod:`applier.devtools.bench_live` runs the producer process and imports this module, so this one
takes what it needs from there as arguments (the workload the pool is built from, the ``Pacer``, the
``LiveWorkload`` that hands out live timestamps) instead of importing it back (``tests/unit/test_layout.py``
forbids import cycles).

**The pool.** Before it reports "started", the producer runs the live workload's generator (same seed, tables
and partitions, no replays) for about ``pool_rows`` row changes with one *placeholder* commit ts instead of the
wall clock and keeps every transaction as its encoded ``(partition, key, value)`` messages and its row count
(never more rows than the paced part of the run sends: :func:`pool_size_for`).
Canal-JSON writes the commit ts three times: ``_tidb.commitTs`` (the TSO), ``es`` (its physical ms) and ``ts``
(the build time; the bench passes the commit ts's physical ms there too). Each is found by a byte pattern that
includes its JSON key (``"commitTs":<tso>``, ``"es":<ms>``, ``"ts":<ms>``). Row data cannot contain such a
pattern (a quote inside a JSON string is escaped, so ``"key":`` never occurs in one), and the pool build checks
that every message holds each pattern exactly once, so a changed encoder fails loudly instead of sending wrong
timestamps. Open Protocol is not pooled: its batched messages carry binary length prefixes, which a
length-changing substitution would break.

**Sending** (:func:`send_pooled`) is paced like the per-row producer (:class:`~applier.devtools.bench_live.Pacer`;
a resolved ts on every partition every ``resolved_interval_ms`` of wall time from the same
:class:`~applier.devtools.bench_live.TsoClock`, so every transaction's real commit ts comes from the wall clock
and is above the last resolved ts sent). The pool is walked in order and started again at its beginning when it
ends (a *pass*); each transaction is sent with a fresh real commit ts substituted (``bytes.replace``).

**Why the checksum comparison still holds.** The applier applies each row change idempotently: insert and update
upsert the after image by primary key, delete removes the key. The workload starts from empty tables, so after
one pass the state holds exactly the keys the pool leaves alive, each with its last image in the pool. Applying
the pool's transactions again onto that state gives the same state: for every key the pool touches, its last
change in the pool decides it, whatever came before; keys it never touches are not in the state. Hence the
expected checksums are the generator's after one pass, **provided the last pass is complete** (a partial pass
re-inserts keys that the rest of the pass deletes, or leaves older images of keys it updates later). So at the
end of the duration the producer stops pacing (``t_end`` is taken then), sends the rest of the current pass
unpaced, then the final resolved ts (above every commit ts sent), and flushes. Replayed transactions get new
commit ts, so the applier's duplicate filter (which compares changes within one commit ts) keeps them, and within
a pass they come in the pool's order; no transaction touches a key twice, so the order inside one does not matter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from applier.config import TSO_LOGICAL_BITS
from applier.devtools.changefeed import tso

#: the placeholder commit ts of every pool transaction: far from any wall-clock ms (2069), distinctive digits
PLACEHOLDER_MS = 3_141_592_653_589
PLACEHOLDER_TSO = tso(PLACEHOLDER_MS, 27_182)

Message = tuple[int, "bytes | None", bytes]
Produce = Callable[[int, "bytes | None", bytes], None]


class PoolError(ValueError):
    """A pooled message does not hold each commit-ts pattern exactly once: substitution would be wrong."""


@dataclass(frozen=True, slots=True)
class TsPatterns:
    """The three places where Canal-JSON writes a row's commit ts, each with its JSON key (see the module doc)."""

    commit: bytes  # "commitTs":<tso>
    es: bytes  # "es":<physical ms>
    ts: bytes  # "ts":<build ms> (= the physical ms for the bench's rows)

    @classmethod
    def of(cls, commit_ts: int) -> TsPatterns:
        ms = commit_ts >> TSO_LOGICAL_BITS
        return cls(b'"commitTs":%d' % commit_ts, b'"es":%d' % ms, b'"ts":%d' % ms)

    def all(self) -> tuple[bytes, bytes, bytes]:
        return self.commit, self.es, self.ts


PLACEHOLDER = TsPatterns.of(PLACEHOLDER_TSO)


def check_placeholders(value: bytes, where: str = "a pooled message") -> None:
    """Raise :class:`PoolError` unless ``value`` holds every placeholder pattern exactly once."""
    for pattern in PLACEHOLDER.all():
        n = value.count(pattern)
        if n != 1:
            raise PoolError(f"{where} holds {pattern.decode()} {n} times, not once, so its commit ts cannot be "
                            f"substituted reliably (did the Canal-JSON encoder change?): {value[:300]!r}")


def substitute(value: bytes, real: TsPatterns) -> bytes:
    """``value`` with the placeholder commit ts replaced by ``real`` (the pool build checked the patterns)."""
    return (value.replace(PLACEHOLDER.commit, real.commit, 1).replace(PLACEHOLDER.es, real.es, 1)
            .replace(PLACEHOLDER.ts, real.ts, 1))


# ---------------------------------------------------------------------------------------------------------
# The pool
# ---------------------------------------------------------------------------------------------------------

class PoolSource(Protocol):
    """What the pool is built from: the live workload with the placeholder commit ts and no resolved ts
    (``applier.devtools.bench_live``'s ``PoolWorkload``)."""

    protocol: str
    schema: str
    table_names: list[str]
    expected: dict[str, Any]

    def begin(self) -> list[Message]: ...
    def transaction(self) -> tuple[int, list[Message]]: ...
    def end(self) -> list[Message]: ...


@dataclass(frozen=True, slots=True)
class PoolTxn:
    rows: int
    messages: tuple[Message, ...]


@dataclass
class Pool:
    """The encoded transactions of one pass of the workload, and what the target holds after it (``expected``:
    table -> (rows, digest sum), as the per-row producer reports it)."""

    txns: list[PoolTxn]
    rows: int
    expected: dict[str, tuple[int, int]]
    table_names: list[str]
    schema: str
    build_seconds: float = 0.0

    @property
    def messages(self) -> int:
        return sum(len(t.messages) for t in self.txns)


def pooled_unsupported(protocol: str) -> str | None:
    """Why the pooled producer cannot send ``protocol`` (None when it can)."""
    if protocol == "canal-json":
        return None
    return (f"--producer pooled needs --protocol canal-json: {protocol} messages batch rows behind binary length "
            "prefixes, which substituting the commit ts (a change of length) would break; use --producer encode")


def emit(produce: Produce, msgs: Sequence[Message]) -> None:
    """Send messages that need no substitution (CREATE TABLEs, resolved ts, per-row encoded transactions)."""
    for part, key, value in msgs:
        produce(part, key, value)


def build_pool(source: PoolSource, rows: int) -> Pool:
    """About ``rows`` row changes of ``source`` (whole transactions, so up to one transaction more), each message
    checked to carry the placeholder commit ts exactly once (:func:`check_placeholders`). ``source`` is used up."""
    why = pooled_unsupported(source.protocol)
    if why:
        raise ValueError(why)
    if rows < 1:
        raise ValueError("a pool needs at least one row change")
    t = time.perf_counter()
    source.begin()  # the CREATE TABLEs: the sender sends its own, with live commit ts
    txns: list[PoolTxn] = []
    total = 0
    while total < rows:
        n, msgs = source.transaction()
        for i, (_, _, value) in enumerate(msgs):
            check_placeholders(value, f"pool transaction {len(txns)}, message {i}")
        txns.append(PoolTxn(n, tuple(msgs)))
        total += n
    source.end()
    expected = {name: (cs.rows, cs.digest_sum) for name, cs in source.expected.items()}
    return Pool(txns=txns, rows=total, expected=expected, table_names=list(source.table_names),
                schema=source.schema, build_seconds=time.perf_counter() - t)


def pool_size_for(pool_rows: int, rate: float, seconds: float) -> int:
    """The pool to build: ``pool_rows``, but no more than the paced part of the run sends (a larger pool would
    only lengthen the build before the start and the unpaced tail that completes the last pass)."""
    return max(1, min(pool_rows, int(rate * seconds) + 1))


# ---------------------------------------------------------------------------------------------------------
# Sending
# ---------------------------------------------------------------------------------------------------------

class Pacing(Protocol):
    """``applier.devtools.bench_live.Pacer``."""

    start: float

    def delay(self, done: int, now: float) -> float: ...
    def lateness(self, done: int, now: float) -> float: ...


class Control(Protocol):
    """The live timestamps and the messages that are encoded live (CREATE TABLEs, resolved ts): a
    ``LiveWorkload`` of ``applier.devtools.bench_live`` on the sender's clock that makes no transactions."""

    resolved_interval_ms: int
    last_resolved_ms: int
    prev_resolved_ts: int
    final_ts: int

    def begin(self) -> list[Message]: ...
    def commit_ts(self) -> int: ...
    def resolved_due(self) -> bool: ...
    def resolve_now(self) -> list[Message]: ...
    def end(self) -> list[Message]: ...


@dataclass(frozen=True)
class Paced:
    rows: int
    worst_lateness_s: float


def run_paced(send_txn: Callable[[], int], *, pacer: Pacing, deadline: float, control: Control,
              resolve_if_due: Callable[[], None], now: Callable[[], float] = time.time,
              sleep: Callable[[float], None] = time.sleep) -> Paced:
    """Call ``send_txn()`` (it sends one transaction and returns its row count, emitting a resolved ts when one
    is due) at ``pacer``'s rate until ``deadline``. While ahead of the rate it sleeps, but never past the next
    resolved ts, which ``resolve_if_due`` then sends: the resolved cadence holds at any rate. Shared by both
    producers (per-row encoding and pooled)."""
    rows = 0
    worst_late = 0.0
    interval = control.resolved_interval_ms / 1000
    while True:
        t = now()
        if t >= deadline:
            break
        wait = pacer.delay(rows, t)
        if wait > 0:
            next_resolved = control.last_resolved_ms / 1000 + interval - t
            sleep(max(0.0, min(wait, next_resolved, deadline - t)))
            resolve_if_due()
            continue
        worst_late = max(worst_late, pacer.lateness(rows, t))
        rows += send_txn()
    return Paced(rows, worst_late)


@dataclass
class SendResult:
    t_end: float  # when pacing stopped (the deadline); the tail that completes the last pass comes after it
    rows: int  # every row change sent, all passes
    transactions: int
    passes: int  # complete passes (all of them: the last one is completed after t_end)
    tail_rows: int  # rows sent unpaced after t_end to complete the last pass
    tail_seconds: float
    final_ts: int  # the final resolved ts sent
    worst_lateness_s: float
    resolved: list[tuple[int, int]] = field(default_factory=list)  # (resolved ts, rows sent before it)


class PoolSender:
    """Walks the pool in order, pass after pass, sending each transaction with a fresh live commit ts."""

    def __init__(self, pool: Pool, control: Control, produce: Produce) -> None:
        if not pool.txns:
            raise ValueError("an empty pool")
        self.txns = pool.txns
        self.control = control
        self.produce = produce
        self.next = 0  # index of the next transaction in the pool
        self.rows = 0
        self.transactions = 0
        self.passes = 0
        self.resolved: list[tuple[int, int]] = []

    def begin(self) -> None:
        """The CREATE TABLEs and a first resolved ts, encoded live."""
        emit(self.produce, self.control.begin())
        self.resolved.append((self.control.prev_resolved_ts, 0))

    def resolve_if_due(self) -> None:
        if self.control.resolved_due():
            emit(self.produce, self.control.resolve_now())
            self.resolved.append((self.control.prev_resolved_ts, self.rows))

    def send_next(self) -> int:
        """Send the next pool transaction (its commit ts from the control's TsoClock: above every resolved ts
        sent so far), then a resolved ts if one is due; returns its row count."""
        txn = self.txns[self.next]
        real = TsPatterns.of(self.control.commit_ts())
        produce = self.produce
        for part, key, value in txn.messages:
            produce(part, key, substitute(value, real))
        self.rows += txn.rows
        self.transactions += 1
        self.next += 1
        if self.next == len(self.txns):
            self.next = 0
            self.passes += 1
        self.resolve_if_due()
        return txn.rows

    def pass_incomplete(self) -> bool:
        """In the middle of a pass, or before the first one (a run that sent nothing still sends one pass)."""
        return self.next != 0 or self.passes == 0

    def end(self) -> int:
        """The final resolved ts (above every commit ts sent); returns it."""
        emit(self.produce, self.control.end())
        final = self.control.final_ts
        self.resolved.append((final, self.rows))
        return final


def send_pooled(pool: Pool, control: Control, pacer: Pacing, *, produce: Produce, seconds: float,
                now: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep) -> SendResult:
    """The pooled producer's run, without Kafka (``produce(partition, key, value)`` sends one message).

    From ``pacer.start`` (``now()`` seconds: the producer reported it as its start) to ``pacer.start + seconds``:
    the CREATE TABLEs and a first resolved ts, then pool transactions at the pacer's rate with the control's
    resolved ts cadence. Then, unpaced, the rest of the current pass, and the final resolved ts (the module doc
    says why the last pass must be complete). ``control`` and ``now`` must read the same clock."""
    s = PoolSender(pool, control, produce)
    s.begin()
    paced = run_paced(s.send_next, pacer=pacer, deadline=pacer.start + seconds, control=control,
                      resolve_if_due=s.resolve_if_due, now=now, sleep=sleep)
    t_end = now()
    while s.pass_incomplete():
        s.send_next()
    tail_seconds = now() - t_end
    final = s.end()
    return SendResult(t_end=t_end, rows=s.rows, transactions=s.transactions, passes=s.passes,
                      tail_rows=s.rows - paced.rows, tail_seconds=tail_seconds, final_ts=final,
                      worst_lateness_s=paced.worst_lateness_s, resolved=s.resolved)
