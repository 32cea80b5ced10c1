"""Route modes history and soft_delete through real Kafka and Spark into MariaDB and PostgreSQL (applier.modes).

One TiCDC Open Protocol changefeed holds two upstream tables with the same life: inserts, updates, a key-changing
update (one UPDATE event whose key differs), two updates swapping their keys in one commit ts, a unique-key swap,
a TiCDC-style key change (delete + insert in one commit ts), deletes, re-inserts after a delete, an ADD COLUMN
halfway, seeded random transactions after it, and TiCDC restart replays (older resolved ts, events re-sent).
Table ``hist`` is routed with mode = "history", ``soft`` with mode = "soft_delete" (the rest as a replica).

The expected target is worked out from the upstream change list alone, by a simpler rule than the applier's: the
table's state after each commit ts, diffed with the state before it (a key whose row appeared, changed or went is
one version, op insert / update / delete). So the test does not share the planner's logic.

Runs, each checked against that reference: pipeline A stops at a TSO halfway (``--until-ts``), so the target holds
history up to it; pipeline B, a new pipeline name (fresh progress and checkpoint), replays the whole topic over it:
its first windows straddle what A wrote (versions already there are left, the newest one is closed by the first
new one); B again with its checkpoint folder deleted, and pipeline C replaying the topic from scratch over the
finished target, first only up to halfway (as a replay that stopped: the history stays unchanged), then to the
end, leave it unchanged. ``applier verify`` then compares only the current rows of the moded tables with an
upstream holding the final tables: equal, and a changed current row is reported.
"""

from __future__ import annotations

import datetime as dt
import random
import shutil
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from applier.config import parse_config
from applier.devtools.changefeed import produce, tso
from applier.devtools.encoders.open import encode_open
from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition
from applier.pipeline import run
from tests.e2e.helpers import target_url

pytestmark = pytest.mark.e2e

TABLES = ("hist", "soft")
PARTITIONS = 2
COLS = (Column("id", "int", nullable=False, key=True), Column("email", "varchar", nullable=False, unique=True),
        Column("v", "int"))
COLS_V2 = COLS + (Column("note", "varchar"),)
EPOCH = dt.datetime(1970, 1, 1)


def when(ts: int) -> dt.datetime:
    return EPOCH + dt.timedelta(milliseconds=ts >> 18)


class Upstream:
    """The upstream application: both tables live the same life; every change is encoded as Open Protocol on the
    table's partition (TiCDC's table dispatcher), DDL and resolved ts on every partition."""

    def __init__(self, schema: str, seed: int = 11) -> None:
        self.schema = schema
        self.rng = random.Random(seed)
        self.ms = int(dt.datetime.now().timestamp() * 1000) - 3_600_000
        self.changes: list[RowChange | DDL] = []  # every upstream change once, in commit order
        self.messages: list[tuple[int, bytes, bytes]] = []
        self.sent: list[tuple[int, Any]] = []  # (partition, event) for the replays
        self.state = {t: {} for t in TABLES}
        self.cols = COLS
        self.next_id = 100

    def ts(self) -> int:
        self.ms += self.rng.randint(1, 5)
        return tso(self.ms, self.rng.randint(0, 50))

    def emit(self, part: int, ev: Any) -> None:
        self.messages.append((part, *encode_open(ev)))
        self.sent.append((part, ev))

    def ddl(self, query_of) -> None:
        ts = self.ts()
        for table in TABLES:
            query = query_of(table)
            ev = DDL(self.schema, table, ts, query, SourcePosition("", 0, 0), ddl_type=3 if "CREATE" in query else 5)
            self.changes.append(ev)
            for p in range(PARTITIONS):
                self.emit(p, DDL(ev.schema, ev.table, ev.commit_ts, ev.query, ev.position, ddl_type=ev.ddl_type))

    def txn(self, ops) -> int:
        """``ops``: (op, before, after) triples, the same for both tables; state is kept per table."""
        ts = self.ts()
        for i, table in enumerate(TABLES):
            st = self.state[table]
            for op, before, after in ops:
                ev = RowChange(self.schema, table, ts, op, before and dict(before), after and dict(after), self.cols,
                               SourcePosition("", i % PARTITIONS, 0))
                self.changes.append(ev)
                self.emit(i % PARTITIONS, ev)
            for op, before, after in ops:  # the state after the transaction (removals first, as TiKV sees it)
                if before is not None and op is not Op.INSERT:
                    st.pop(before["id"], None)
            for op, before, after in ops:
                if after is not None:
                    st[after["id"]] = dict(after)
        return ts

    def resolved(self) -> int:
        ts = tso(self.ms, 0x3FFFF)
        for p in range(PARTITIONS):
            self.emit(p, Resolved(ts, SourcePosition("", p, 0)))
        return ts

    def replay(self, back: int) -> None:
        """A TiCDC restart: an older resolved ts, then the last ``back`` events re-sent."""
        older = [ev for _, ev in self.sent if isinstance(ev, Resolved)]
        old = older[-2].ts if len(older) > 1 else 0
        tail = [(p, ev) for p, ev in self.sent[-back:] if not isinstance(ev, Resolved)]
        for p in range(PARTITIONS):
            self.emit(p, Resolved(old, SourcePosition("", p, 0)))
        for p, ev in tail:
            self.emit(p, ev)

    def row(self, i: int, email: str | None = None, v: int | None = None, **extra) -> dict:
        r = {"id": i, "email": email or f"u{i}@x", "v": v if v is not None else self.rng.randint(0, 10**6)}
        if self.cols is COLS_V2:
            r["note"] = extra.get("note", self.rng.choice([None, "n", "☃"]))
        return r

    def live(self) -> dict[int, dict]:
        return self.state[TABLES[0]]


def changefeed(schema: str) -> tuple[Upstream, int]:
    """The stream (module docstring); returns it and the commit ts halfway, where pipeline A stops."""
    up = Upstream(schema)
    up.ddl(lambda t: f"CREATE TABLE `{t}` (`id` INT NOT NULL, `email` VARCHAR(32) NOT NULL, `v` INT NULL, "
                     f"PRIMARY KEY (`id`), UNIQUE KEY `uk_email` (`email`))")
    up.resolved()
    rows = {i: up.row(i) for i in range(1, 9)}
    up.txn([(Op.INSERT, None, r) for r in rows.values()])
    up.resolved()
    s = up.live
    up.txn([(Op.UPDATE, s()[1], dict(s()[1], v=1001)), (Op.UPDATE, s()[2], dict(s()[2], v=2002))])
    up.txn([(Op.UPDATE, s()[3], dict(s()[3], id=30))])  # a key-changing update: one UPDATE event
    a, b = s()[4], s()[5]  # two updates swapping their keys in one commit ts
    up.txn([(Op.UPDATE, a, dict(a, id=5, email="swap4")), (Op.UPDATE, b, dict(b, id=4, email="swap5"))])
    up.resolved()
    a, b = s()[1], s()[2]  # a unique-key swap
    up.txn([(Op.UPDATE, a, dict(a, email=b["email"])), (Op.UPDATE, b, dict(b, email=a["email"]))])
    up.txn([(Op.DELETE, s()[6], None)])
    up.txn([(Op.DELETE, s()[7], None), (Op.INSERT, None, dict(s()[7], id=70))])  # TiCDC's split key change
    up.resolved()
    up.replay(12)
    up.ddl(lambda t: f"ALTER TABLE `{t}` ADD COLUMN `note` VARCHAR(16) NULL")
    up.cols = COLS_V2
    for r in up.live().values():
        r.setdefault("note", None)
    for st in up.state.values():
        for r in st.values():
            r.setdefault("note", None)
    up.resolved()
    up.txn([(Op.INSERT, None, up.row(6, v=66, note="again"))])  # re-insert after delete
    # pipeline A stops at this commit ts, which is no resolved ts: the next transaction is released with it in one
    # window of pipeline B, so B finds key 1's newest version in its window and must close it by the next one
    halfway = up.txn([(Op.UPDATE, s()[1], dict(s()[1], v=1003, note="later"))])
    up.txn([(Op.UPDATE, s()[1], dict(s()[1], v=1004)), (Op.UPDATE, s()[6], dict(s()[6], v=67))])
    up.resolved()
    deleted: list[dict] = []
    for i in range(60):  # random transactions: each key at most once per transaction
        ops: list = []
        touched: set[int] = set()
        for _ in range(up.rng.randint(1, 4)):
            live = sorted(k for k in up.live() if k not in touched)
            kind = up.rng.random()
            if kind < 0.3 or len(live) < 3:
                if deleted and up.rng.random() < 0.4 and deleted[-1]["id"] not in up.live():
                    r = deleted.pop()
                    r = up.row(r["id"], email=f"re{i}-{r['id']}")
                else:
                    up.next_id += 1
                    r = up.row(up.next_id)
                if r["id"] in touched:
                    continue
                ops.append((Op.INSERT, None, r))
                touched.add(r["id"])
            elif kind < 0.65:
                k = up.rng.choice(live)
                old = up.live()[k]
                ops.append((Op.UPDATE, old, dict(old, v=old["v"] + 1, note=up.rng.choice([None, "u", "ü"]))))
                touched.add(k)
            elif kind < 0.8:
                k = up.rng.choice(live)
                up.next_id += 1
                old = up.live()[k]
                ops.append((Op.UPDATE, old, dict(old, id=up.next_id)))
                touched |= {k, up.next_id}
            else:
                k = up.rng.choice(live)
                old = up.live()[k]
                ops.append((Op.DELETE, old, None))
                deleted.append(old)
                touched.add(k)
        if ops:
            up.txn(ops)
        if up.rng.random() < 0.3:
            up.resolved()
        if i in (20, 45):
            up.replay(15)
    up.ms += 1
    up.resolved()
    return up, halfway


# ---- the reference, from the upstream change list alone ----------------------------------------------------------

def reference(up: Upstream, table: str, until: int | None = None) -> tuple[dict, dict]:
    """(history, soft delete) as the target must hold them after applying every change up to ``until``: per commit
    ts, the table's state before and after it; a key whose row differs is a version (history), and the final
    state keeps deleted rows with the time they went (soft delete)."""
    state: dict[int, dict] = {}
    versions: dict[int, list[tuple[int, str, dict]]] = {}
    soft: dict[int, tuple[dict, bool, dt.datetime | None]] = {}
    changes = [c for c in up.changes if isinstance(c, RowChange) and c.table == table
               and (until is None or c.commit_ts <= until)]
    i = 0
    while i < len(changes):
        ts = changes[i].commit_ts
        group = []
        while i < len(changes) and changes[i].commit_ts == ts:
            group.append(changes[i])
            i += 1
        before = dict(state)
        for c in group:
            if c.op is not Op.INSERT:
                state.pop(c.before["id"], None)
        for c in group:
            if c.op is not Op.DELETE:
                state[c.after["id"]] = c.after
        for k in sorted(set(before) | set(state)):
            b, a = before.get(k), state.get(k)
            if b == a:
                continue
            if a is None:
                versions.setdefault(k, []).append((ts, "delete", b))
                soft[k] = (b, True, when(ts))
            else:
                versions.setdefault(k, []).append((ts, "insert" if b is None else "update", a))
                soft[k] = (a, False, None)
    hist = {}
    for k, vs in versions.items():
        for j, (ts, op, img) in enumerate(vs):
            valid_to = when(vs[j + 1][0]) if j + 1 < len(vs) else None
            hist[(k, ts)] = (op, _values(img), when(ts), valid_to)
    return hist, {k: (_values(img), deleted, at) for k, (img, deleted, at) in soft.items()}


def _values(img: dict) -> tuple:
    return img["email"], img["v"], img.get("note")


def target_rows(engine, schema: str, table: str) -> tuple[dict, dict] | dict:
    with engine.connect() as c:
        has_note = "note" in [r[0] for r in c.execute(text(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = :s AND table_name = :t"),
            {"s": schema, "t": table})]
        note = ", note" if has_note else ""
        q = engine.dialect.identifier_preparer.quote
        if table == "hist":
            out = {}
            for r in c.execute(text(f"SELECT id, _commit_ts, _op, email, v{note}, _valid_from, _valid_to "
                                    f"FROM {q(schema)}.hist")):
                note_v = r[5] if has_note else None
                out[(r[0], int(r[1]))] = (r[2], (r[3], r[4], note_v), r[-2], r[-1])
            return out
        return {r[0]: ((r[1], r[2], r[3] if has_note else None), bool(r[-2]), r[-1]) for r in c.execute(text(
            f"SELECT id, email, v{note}, _deleted, _deleted_at FROM {q(schema)}.soft"))}


def check(engine, schema: str, up: Upstream, until: int | None = None, soft_table: bool = True) -> None:
    """The target against the reference up to ``until`` (without the soft-delete table: only the history)."""
    hist, soft = reference(up, "hist", until)
    _, soft_ref = reference(up, "soft", until)
    assert soft == soft_ref  # both tables lived the same life
    got_h, got_s = target_rows(engine, schema, "hist"), target_rows(engine, schema, "soft")
    assert {k: v for k, v in got_h.items() if k not in hist} == {}, "versions the upstream never had"
    assert {k: v for k, v in hist.items() if k not in got_h} == {}, "versions missing"
    assert got_h == hist
    if soft_table:
        assert got_s == soft


def config(urls, target: str, topic: str, upschema: str, schema: str, ckpt, name: str) -> dict:
    return {
        "pipeline": {"name": name, "checkpoint_dir": str(ckpt), "max_offsets_per_trigger": 40},
        "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": "open"},
        "target": {"url": target_url(urls, target)},
        "route": [{"match": "*.*", "ignore": True},  # verify lists every table of its upstream server
                  {"match": f"{upschema}.*", "schema": schema},
                  {"match": f"{upschema}.hist", "schema": schema, "mode": "history"},
                  {"match": f"{upschema}.soft", "schema": schema, "mode": "soft_delete"}],
    }


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_history_and_soft_delete_routes_match_the_change_list_and_survive_replays(
        urls, spark, unique, drop_schema, tmp_path, target) -> None:
    topic = f"e2e-modes-{target}-{unique}"
    upschema, schema = f"up_{unique}", f"modes_{unique}"
    drop_schema((target, schema))
    drop_schema(("mariadb", upschema))
    up, halfway = changefeed(upschema)
    produce(urls.kafka, topic, up.messages, partitions=PARTITIONS)
    engine = create_engine(target_url(urls, target))
    try:
        # A: stops at a TSO halfway; the target holds the history up to it
        a = parse_config(config(urls, target, topic, upschema, schema, tmp_path / "a", f"modes-a-{unique}"))
        res = run(a, until_ts=halfway, spark=spark, progress=False)
        assert res.stopped_at == halfway and res.batches > 1
        check(engine, schema, up, until=halfway)
        # B: a new pipeline over the same target replays the whole topic, straddling what A wrote
        b_cfg = config(urls, target, topic, upschema, schema, tmp_path / "b", f"modes-b-{unique}")
        b = parse_config(b_cfg)
        res = run(b, until_caught_up=True, spark=spark, progress=False)
        assert res.batches > 2
        check(engine, schema, up)
        # B again without its checkpoint folder, and C from scratch: the target stays as it is
        shutil.rmtree(tmp_path / "b")
        run(b, until_caught_up=True, spark=spark, progress=False)
        check(engine, schema, up)
        # C, a new pipeline, replays half the topic over the finished target and stops (as a run that died would):
        # the versions it meets are left as they are, none is reopened (the soft-delete table holds current rows:
        # like any replica replayed from the start, it is a mix of old and new rows until the replay ends); then
        # C replays the rest
        c = parse_config(config(urls, target, topic, upschema, schema, tmp_path / "c", f"modes-c-{unique}"))
        run(c, until_ts=halfway, spark=spark, progress=False)
        check(engine, schema, up, soft_table=False)
        run(c, until_caught_up=True, spark=spark, progress=False)
        check(engine, schema, up)
        verify_current_rows(urls, engine, b, up, upschema, schema)
    finally:
        engine.dispose()


def verify_current_rows(urls, engine, settings, up: Upstream, upschema: str, schema: str) -> None:
    """``applier verify`` against a MariaDB upstream holding the final tables: the moded tables compare equal
    (their current rows only, without the mode's columns); a changed current row is found."""
    from applier import verify as vr
    from applier.dialect import dialect_for
    from applier.pipeline import router_for

    upstream = create_engine(urls.mariadb_url)
    try:
        with upstream.begin() as c:
            c.exec_driver_sql(f"CREATE DATABASE `{upschema}`")
            for t in TABLES:
                c.exec_driver_sql(f"CREATE TABLE `{upschema}`.`{t}` (`id` INT NOT NULL PRIMARY KEY, "
                                  "`email` VARCHAR(32) NOT NULL UNIQUE, `v` INT NULL, `note` VARCHAR(16) NULL)")
                for r in up.state[t].values():
                    c.execute(text(f"INSERT INTO `{upschema}`.`{t}` VALUES (:id, :email, :v, :note)"), r)
        dialect = dialect_for(engine)

        def differences() -> dict[str, int]:
            res = vr.verify(engine, upstream, pipeline=settings.pipeline.name, router=router_for(settings),
                            writer=dialect.writer(), gated=True, upstream_shown="up", replica_shown="replica")
            assert {tr.upstream[1] for tr in res.tables} == set(TABLES)
            assert all(not tr.skipped and not tr.schema_problems for tr in res.tables), res.tables
            return {tr.upstream[1]: tr.differences for tr in res.tables}

        assert differences() == {"hist": 0, "soft": 0}
        k = sorted(up.state["hist"])[0]
        with engine.begin() as c:
            c.execute(text(f"UPDATE {engine.dialect.identifier_preparer.quote(schema)}.hist SET v = v + 1 "
                           "WHERE id = :k AND _valid_to IS NULL"), {"k": k})
        assert differences() == {"hist": 1, "soft": 0}
    finally:
        upstream.dispose()


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_a_table_not_ready_for_its_mode_stops_with_the_statements_that_make_it_ready(urls, unique, drop_schema,
                                                                                     target) -> None:
    """A target table made by hand as a replica (a unique key besides the primary key) under a history route: the
    run stops naming the table and the statements to run; run as given, the next run writes versions. A table
    without a key cannot use a mode at all. No Spark: the processor driven directly (tests/e2e/helpers.py)."""
    from applier.sinks import ApplyError
    from tests.e2e.helpers import TOPIC, Feed, processor

    schema = f"modes_ready_{unique}"
    drop_schema((target, schema))
    engine = create_engine(target_url(urls, target))
    q = engine.dialect.identifier_preparer.quote
    with engine.begin() as c:
        c.exec_driver_sql(f"CREATE SCHEMA {q(schema)}")
        c.exec_driver_sql(f"CREATE TABLE {q(schema)}.hist (id INT NOT NULL PRIMARY KEY, email VARCHAR(32) NOT NULL, "
                          "v INT NULL, CONSTRAINT uk_email UNIQUE (email))")
        c.exec_driver_sql(f"CREATE TABLE {q(schema)}.bare (id INT NULL, v INT NULL)")
    rules = [{"match": "up.*", "schema": schema, "mode": "history"}]
    from applier.routing import Router, Rule
    router = Router([Rule(**r) for r in rules])
    feed = Feed()
    ms = int(dt.datetime.now().timestamp() * 1000)

    def batch(table: str, n: int):
        if table == "bare":  # upstream has no key either: TiCDC marks no column
            row, cols = {"id": n, "v": n}, (Column("id", "int"), Column("v", "int"))
        else:
            row, cols = {"id": n, "email": f"e{n}", "v": n}, COLS
        ev = RowChange("up", table, tso(ms + n), Op.INSERT, None, row, cols, SourcePosition(TOPIC, 0, 0))
        return feed.msgs(ev, Resolved(tso(ms + n, 0x3FFFF), SourcePosition(TOPIC, 0, 0)))

    def proc():
        return processor(engine, f"ready-{unique}", router.route, write_mode=router.write_mode)

    try:
        with pytest.raises(ApplyError) as info:
            proc().process(batch("hist", 1))
        msg = str(info.value)
        assert f"target table {schema}.hist is routed with mode = \"history\"" in msg
        assert "column(s) _commit_ts, _op, _valid_from, _valid_to; primary key (id, _commit_ts)" in msg
        assert "no unique key besides the mode's key" in msg
        statements = msg.split("Run on the target: ", 1)[1].split(" (a table that already holds rows", 1)[0]
        with engine.begin() as c:
            for stmt in statements.split("; "):
                c.exec_driver_sql(stmt)
        proc().process(batch("hist", 1))
        with engine.connect() as c:
            assert c.execute(text(f"SELECT id, _op, _valid_to FROM {q(schema)}.hist")).all() == [(1, "insert", None)]
        with pytest.raises(ApplyError, match=f"target table {schema}.bare has no primary key .* route mode history"):
            proc().process(batch("bare", 2))
    finally:
        engine.dispose()


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_moded_tables_made_from_the_stream_get_their_mode(urls, spark, unique, drop_schema, tmp_path, target) -> None:
    """The changefeed without its CREATE TABLEs (a replica started mid-way): ``schema_evolution = "create"`` (the
    default) makes both tables from the rows, and the route mode then gives them its columns and key, so the
    target matches the same reference as when the CREATE TABLEs were replicated."""
    topic = f"e2e-modes-made-{target}-{unique}"
    upschema, schema = f"up_{unique}", f"made_{unique}"
    drop_schema((target, schema))
    up, _ = changefeed(upschema)

    def create_table(key: bytes | None, value: bytes | None) -> bool:  # an Open Protocol batch of one DDL
        return b'"t":2' in (key or b"") and b"CREATE TABLE" in (value or b"")

    messages = [m for m in up.messages if not create_table(m[1], m[2])]
    assert len(messages) < len(up.messages)
    produce(urls.kafka, topic, messages, partitions=PARTITIONS)
    engine = create_engine(target_url(urls, target))
    try:
        cfg = parse_config(config(urls, target, topic, upschema, schema, tmp_path / "m", f"modes-m-{unique}"))
        assert cfg.target.schema_evolution == "create"
        run(cfg, until_caught_up=True, spark=spark, progress=False)
        check(engine, schema, up)
    finally:
        engine.dispose()
