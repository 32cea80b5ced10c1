"""Tables without a key (no primary key, no unique key over NOT NULL columns) on real MariaDB and PostgreSQL.

* Through the whole pipeline (Open Protocol messages in real Kafka, the shared Spark session, the gate): a
  replicated CREATE TABLE without a key, one transaction inserting identical rows (two copies in one batched
  Kafka message, two in separate messages), then an update of one of two identical rows, a delete of one, and a
  delete that must tell 'a' from 'A' in a case-insensitive column and find a FLOAT 0.1 and a JSON value. The
  target must hold exactly the multiset of rows the change list leaves. A TiCDC re-send of those transactions
  after they were applied changes nothing (the applied-ts filter); an update whose old row the replica does not
  hold stops the run loudly, naming the table and the Kafka position, and applies nothing of its batch.
* The writers alone, on hand-made tables: MariaDB text compared byte for byte (a latin1 case- and
  accent-insensitive column, trailing spaces), FLOAT(7,4); PostgreSQL ``json`` (no equality of its own) and
  ``real``.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from applier.config import parse_config
from applier.devtools.changefeed import produce, tso
from applier.devtools.encoders.open import encode_open, encode_open_batch
from applier.dialect import dialect_for
from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition
from applier.pipeline import run
from applier.sinks import ApplyError, plan_batch
from tests.e2e.helpers import config, target_url

pytestmark = pytest.mark.e2e

TARGETS = ["mariadb", "postgres"]
COLS = (Column("id", "int"), Column("v", "varchar"), Column("f", "float"), Column("j", "json"))
CREATE = ("CREATE TABLE `kl` (`id` INT, `v` VARCHAR(16) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci, "
          "`f` FLOAT, `j` JSON)")
_POS = SourcePosition("", 0, 0)  # the encoder ignores it; Kafka gives the real one
_F32 = struct.Struct("<f")


def _row(id_: Any, v: Any, f: Any, j: Any) -> dict[str, Any]:
    return {"id": id_, "v": v, "f": f, "j": j}


A = _row(1, "a", 0.1, '{"k": 1}')
A2 = _row(1, "b", 0.1, '{"k": 2}')
NULLS = _row(2, None, None, None)
UPPER = _row(3, "A", 1.5, "[1, 2]")
LOWER = _row(3, "a", 1.5, "[1, 2]")
GHOST = _row(9, "z", 2.5, "{}")  # never inserted


def _ch(ts: int, op: Op, before: dict | None, after: dict | None) -> RowChange:
    return RowChange("shop", "kl", ts, op, before, after, COLS, _POS)


def _txns(t1: int, t2: int) -> tuple[list[list[RowChange]], list[RowChange]]:
    """The two transactions, as Kafka messages (lists of row changes batched in one message), and the changes."""
    t1_msgs = [[_ch(t1, Op.INSERT, None, A), _ch(t1, Op.INSERT, None, A)],  # identical rows, one message
               [_ch(t1, Op.INSERT, None, NULLS)], [_ch(t1, Op.INSERT, None, NULLS)],  # identical rows, two messages
               [_ch(t1, Op.INSERT, None, UPPER)], [_ch(t1, Op.INSERT, None, LOWER)]]
    t2_msgs = [[_ch(t2, Op.UPDATE, A, A2)], [_ch(t2, Op.DELETE, NULLS, None)], [_ch(t2, Op.DELETE, LOWER, None)]]
    msgs = t1_msgs + t2_msgs
    return msgs, [c for m in msgs for c in m]


def _messages(groups: list[list[Any]]) -> list[tuple[int, bytes, bytes]]:
    return [(0, *(encode_open_batch(g) if len(g) > 1 else encode_open(g[0]))) for g in groups]


def _canon(r: dict[str, Any]) -> tuple[Any, ...]:
    """A row as both targets and the reference can agree on: FLOAT at single precision, JSON parsed."""
    f, j = r["f"], r["j"]
    return (r["id"], r["v"], None if f is None else _F32.unpack(_F32.pack(float(f)))[0],
            None if j is None else json.dumps(json.loads(j) if isinstance(j, str) else j, sort_keys=True))


def _reference(changes: list[RowChange]) -> Counter:
    """The multiset of rows the changes leave, applied in order: an update or delete takes one equal row."""
    rows: Counter = Counter()
    for c in changes:
        if c.before is not None:
            k = _canon(c.before)
            assert rows[k] > 0, f"the test's own change list removes a row it never had: {c}"
            rows[k] -= 1
        if c.after is not None:
            rows[_canon(c.after)] += 1
    return +rows


def _target_rows(engine, schema: str) -> Counter:
    prep = engine.dialect.identifier_preparer
    with engine.connect() as c:
        got = c.execute(text(f"SELECT id, v, f, j FROM {prep.quote(schema)}.{prep.quote('kl')}")).mappings().all()
    return Counter(_canon(dict(r)) for r in got)


@pytest.mark.parametrize("target", TARGETS)
def test_keyless_table_replicates_duplicates_and_a_missed_match_stops_loudly(urls, spark, unique, drop_schema,
                                                                             tmp_path, target) -> None:
    topic = f"e2e-keyless-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    ms = 1_700_000_000_000
    t0, t1, t2, t3 = (tso(ms + i * 1000) for i in range(4))
    groups, changes = _txns(t1, t2)
    ddl = DDL("shop", "kl", t0, CREATE, _POS, ddl_type=3)
    first: list[list[Any]] = [[ddl], [Resolved(t0, _POS)], *groups[:5], [Resolved(t1, _POS)], *groups[5:],
                              [Resolved(t2, _POS)]]
    produce(urls.kafka, topic, _messages(first), partitions=1)
    settings = parse_config(config(urls, target, "open", topic, schema, tmp_path / "ckpt", max_offsets_per_trigger=4))
    engine = create_engine(target_url(urls, target))
    try:
        res = run(settings, until_caught_up=True, spark=spark, progress=False)
        assert res.batches > 1  # the first transaction waited across micro-batches for its resolved ts
        expected = _reference(changes)
        assert expected[_canon(A)] == 1 and expected[_canon(NULLS)] == 1 and expected[_canon(UPPER)] == 1
        assert _target_rows(engine, schema) == expected

        # TiCDC restarts from an older checkpoint and re-sends both transactions: at or below the applied
        # resolved ts, they are dropped, duplicates and all
        produce(urls.kafka, topic, _messages([[Resolved(t0, _POS)], *groups, [Resolved(t2, _POS)]]), partitions=1)
        run(settings, until_caught_up=True, spark=spark, progress=False)
        assert _target_rows(engine, schema) == expected

        # an update of a row the replica does not hold: loud, and nothing of its batch applies
        bad = [[_ch(t3, Op.INSERT, None, A)], [_ch(t3, Op.UPDATE, GHOST, A2)], [Resolved(t3, _POS)]]
        produce(urls.kafka, topic, _messages(bad), partitions=1)
        with pytest.raises(ApplyError) as err:
            run(settings, until_caught_up=True, spark=spark, progress=False)
        msg = str(err.value)
        assert f"{schema}.kl" in msg and f"topic={topic} partition=0" in msg and "found no row" in msg, msg
        assert "differs from upstream" in msg and "id=9" in msg, msg
        assert _target_rows(engine, schema) == expected
    finally:
        engine.dispose()


# ---- the writers alone, on tables made by hand -----------------------------------------------------------------

def _write(engine, schema: str, changes: list[RowChange]) -> None:
    sink = dialect_for(engine).writer()
    with engine.connect() as conn:
        with conn.begin():
            sink.begin(conn)
            sink.write(conn, plan_batch(sink.table(conn, schema, "hand"), changes))


def _kl(op: Op, before: dict | None = None, after: dict | None = None, off: int = 0) -> RowChange:
    return RowChange("shop", "hand", 1, op, before, after, (), SourcePosition("t", 0, off))


def _hand_rows(engine, schema: str, cols: str) -> list[tuple]:
    prep = engine.dialect.identifier_preparer
    with engine.connect() as c:
        return sorted(tuple(r) for r in c.execute(text(f"SELECT {cols} FROM {prep.quote(schema)}.hand")))


def test_mariadb_compares_text_byte_for_byte_and_float_as_stored(urls, unique, drop_schema) -> None:
    """In a latin1 case- and accent-insensitive column 'Ä' = 'ä' and 'x' = 'x ' (PAD SPACE): deleting the second
    of each pair must not take the first. A FLOAT(7,4) holding 1.2346 is not the double 1.2346."""
    schema = f"kl_hand_{unique}"
    drop_schema(("mariadb", schema))
    engine = create_engine(urls.mariadb_url)
    try:
        with engine.begin() as c:
            c.execute(text(f"CREATE DATABASE `{schema}`"))
            c.execute(text(f"CREATE TABLE `{schema}`.hand (s VARCHAR(8) CHARACTER SET latin1 COLLATE "
                           "latin1_swedish_ci, g FLOAT(7,4), c CHAR(4))"))
        rows = [{"s": "Ä", "g": 1.2346, "c": "x"}, {"s": "ä", "g": 1.2346, "c": "x"},
                {"s": "x", "g": None, "c": None}, {"s": "x ", "g": None, "c": None}]
        _write(engine, schema, [_kl(Op.INSERT, after=r, off=i) for i, r in enumerate(rows)])
        _write(engine, schema, [_kl(Op.DELETE, before=rows[1], off=10), _kl(Op.DELETE, before=rows[3], off=11),
                                _kl(Op.UPDATE, before=rows[0], after={"s": "Ä", "g": 2.5, "c": "y  "}, off=12),
                                _kl(Op.DELETE, before={"s": "Ä", "g": 2.5, "c": "y  "}, off=13)])
        assert _hand_rows(engine, schema, "s, g, c") == [("x", None, None)]
        with pytest.raises(ApplyError, match=r"offset=14 found no row .*differs from upstream"):
            _write(engine, schema, [_kl(Op.DELETE, before={"s": "X", "g": None, "c": None}, off=14)])
    finally:
        engine.dispose()


def test_postgres_compares_json_as_jsonb_and_real_through_a_cast(urls, unique, drop_schema) -> None:
    schema = f"kl_hand_{unique}"
    drop_schema(("postgres", schema))
    engine = create_engine(urls.pg_url)
    try:
        with engine.begin() as c:
            c.execute(text(f'CREATE SCHEMA "{schema}"'))
            c.execute(text(f'CREATE TABLE "{schema}".hand (j json, r real, b jsonb, t text)'))
        one = {"j": '{"a": 1, "b": [1, 2]}', "r": 0.1, "b": '{"x": null}', "t": "a"}
        _write(engine, schema, [_kl(Op.INSERT, after=dict(one), off=0), _kl(Op.INSERT, after=dict(one), off=1),
                                _kl(Op.INSERT, after={"j": None, "r": None, "b": None, "t": None}, off=2)])
        # the old row as another producer might format the same JSON: equal as jsonb, not as text
        spaced = dict(one, j='{"b": [1,2], "a": 1}')
        _write(engine, schema, [_kl(Op.UPDATE, before=spaced, after=dict(one, t="b"), off=3),
                                _kl(Op.DELETE, before={"j": None, "r": None, "b": None, "t": None}, off=4)])
        assert _hand_rows(engine, schema, "t") == [("a",), ("b",)]
        with pytest.raises(ApplyError, match=r"offset=5 found no row .*differs from upstream"):
            _write(engine, schema, [_kl(Op.DELETE, before=dict(one, r=0.2), off=5)])
    finally:
        engine.dispose()
