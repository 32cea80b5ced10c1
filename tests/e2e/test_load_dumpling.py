"""Seeding a replica from a Dumpling export at TSO S (`applier load`), then replicating from Kafka (issue 13.4).

The upstream history is a change list built here: CREATE TABLEs, transactions before S (inserts of rows with
tricky values, updates, deletes, one transaction committed exactly at S), then after S an ALTER TABLE ADD COLUMN,
updates (values swapped for other tricky ones), primary-key changes, deletes and inserts. The state at S is
written as a Dumpling export (applier/devtools/dumpling.py: one table as .sql in two files, one as gzipped .csv,
one table the routes ignore); the whole history goes to Kafka as a TiCDC Canal-JSON changefeed over two
partitions. ``applier load`` then ``run(until_caught_up)`` must leave the target equal to the upstream's final
state (computed from the change list, compared under docs/value-rules.md), having dropped exactly the changes
committed at or before S. Loading again is refused (exit 2); ``--replace`` empties and reloads the snapshot and
restarts the pipeline at S, and a second run ends at the same final state. A row the target refuses stops the
load with exit 4, naming the file, line and key, with nothing loaded and the password never shown.
"""

from __future__ import annotations

import copy
import datetime as dt
import random
import time
from typing import Any

import orjson
import pytest
from sqlalchemy import create_engine, select, text

from applier import mysql_values as T
from applier import progress as P
from applier.cli import main
from applier.config import parse_config
from applier.devtools.changefeed import produce
from applier.devtools.dumpling import DumpTable, write_export
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.events import DDL, Column, Op, Resolved, RowChange, SourcePosition
from applier.pipeline import run
from tests.e2e.canonical import canonical_expected, read_back
from tests.e2e.helpers import target_url, write_toml
from tests.e2e.tricky_values import ENUM, SET, TRICKY, TYPES

pytestmark = pytest.mark.e2e

UP = "up"
PARTITIONS = 2
EXTRA = {"extra": "varchar(16)"}  # added to t_sql after S


def create_sql(table: str) -> str:
    cols = ",\n".join(f"  `{c}` {t}{' NOT NULL' if c == 'id' else ' NULL'}" for c, t in TYPES.items())
    return f"CREATE TABLE `{table}` (\n{cols},\n  PRIMARY KEY (`id`)\n) DEFAULT CHARSET = utf8mb4"


def column(name: str, full: str) -> Column:
    base, unsigned = T.split_mysql_type(full)
    return Column(name, base, nullable=name != "id", key=name == "id", unique=name == "id", unsigned=unsigned,
                  binary=base in T.BINARY_TYPES)


def random_row(rng: random.Random, rid: int, cols) -> dict[str, Any]:
    row = {"id": rid}
    for c in cols:
        if c != "id":
            row[c] = None if rng.random() < 0.15 else rng.choice(TRICKY[c])
    return row


def wire(table_cols: dict[str, str], row: dict[str, Any] | None) -> dict[str, Any] | None:
    """ENUM/SET as the ordinals/bitmasks TiCDC's Canal-JSON encoder is handed (test_values does the same)."""
    if row is None:
        return None
    out = dict(row)
    for c, full in table_cols.items():
        v = out.get(c)
        if v is None:
            continue
        if full.startswith("enum"):
            out[c] = ENUM.index(v) + 1
        elif full.startswith("set"):
            out[c] = sum(1 << SET.index(m) for m in v.split(",")) if v else 0
    return out


class Upstream:
    """The upstream: tables' states and the changefeed messages of every change, with commit ts."""

    def __init__(self, tables: list[str]) -> None:
        self.ts_ms = int(time.time() * 1000) - 3_600_000
        self.types: dict[str, dict[str, str]] = {t: dict(TYPES) for t in tables}
        self.state: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in tables}
        self.messages: list[tuple[int, bytes | None, bytes]] = []
        self.events_before: dict[int, int] = {}  # commit ts -> events the changefeed carries at it

    def tso(self) -> int:
        self.ts_ms += 7
        return (self.ts_ms << 18) + 11

    def _send(self, part: int, ev) -> None:
        self.messages.append((part, *encode_canal_json(ev, build_ts_ms=0)))

    def resolved(self) -> None:
        ts = (self.ts_ms << 18) + 0x3FFFF
        for p in range(PARTITIONS):
            self._send(p, Resolved(ts, SourcePosition("", p, 0)))

    def ddl(self, table: str, query: str) -> int:
        ts = self.tso()
        for p in range(PARTITIONS):  # TiCDC broadcasts DDL
            self._send(p, DDL(UP, table, ts, query, SourcePosition("", p, 0), ddl_type=3 if "CREATE" in query else 5))
        self.events_before[ts] = PARTITIONS
        self.resolved()
        return ts

    def txn(self, changes: list[tuple[str, Op, dict | None, dict | None]]) -> int:
        ts = self.tso()
        for table, op, before, after in changes:
            types = self.types[table]
            cols = tuple(column(c, f) for c, f in types.items())
            part = (after or before)["id"] % PARTITIONS
            self._send(part, RowChange(UP, table, ts, op, wire(types, before), wire(types, after), cols,
                                       SourcePosition("", part, 0)))
            st = self.state[table]
            if op is Op.DELETE:
                del st[before["id"]]
            else:
                st[after["id"]] = dict(after)
        self.events_before[ts] = self.events_before.get(ts, 0) + len(changes)
        self.resolved()
        return ts

    def add_column(self, table: str, name: str, full: str) -> int:
        ts = self.ddl(table, f"ALTER TABLE `{table}` ADD COLUMN `{name}` {full} NULL")
        self.types[table][name] = full
        for row in self.state[table].values():
            row[name] = None
        return ts


def history(seed: int = 5) -> tuple[Upstream, int, dict[str, dict[int, dict[str, Any]]]]:
    """The change list: (upstream after everything, S, the tables' state at S)."""
    rng = random.Random(seed)
    up = Upstream(["t_sql", "t_csv", "skip_me"])
    for t in up.types:
        up.ddl(t, create_sql(t))
    for t in up.types:
        ids = list(range(1, 61))
        for lo in range(0, len(ids), 12):  # inserts, 12 rows a transaction
            up.txn([(t, Op.INSERT, None, random_row(rng, i, TYPES)) for i in ids[lo:lo + 12]])
        # every tricky value at least once, in order, so each reaches the export and the target
        for c in TYPES:
            if c == "id":
                continue
            for k, v in enumerate(TRICKY[c]):
                old = up.state[t][k + 1]
                up.txn([(t, Op.UPDATE, old, dict(old, **{c: v}))])
        up.txn([(t, Op.DELETE, up.state[t][i], None) for i in (50, 51, 52)])  # deleted before S
    old = up.state["t_sql"][40]
    snapshot = up.txn([("t_sql", Op.UPDATE, old, dict(old, c="committed exactly at S"))])
    at_s = copy.deepcopy(up.state)

    up.add_column("t_sql", "extra", EXTRA["extra"])
    for t in ("t_sql", "t_csv", "skip_me"):
        cols = up.types[t]
        for _ in range(25):
            k = rng.choice(sorted(up.state[t]))
            old = up.state[t][k]
            new = dict(old)
            for c in rng.sample([c for c in cols if c != "id"], 3):
                new[c] = rng.choice(TRICKY[c] + [None])
            up.txn([(t, Op.UPDATE, old, new)])
        for k in rng.sample(sorted(up.state[t]), 4):  # primary-key changes: delete + insert, as TiCDC sends them
            old = up.state[t][k]
            up.txn([(t, Op.DELETE, old, None), (t, Op.INSERT, None, dict(old, id=k + 1000))])
        up.txn([(t, Op.DELETE, up.state[t][k], None) for k in rng.sample(sorted(up.state[t]), 3)])
        up.txn([(t, Op.INSERT, None, random_row(rng, 2000 + i, cols)) for i in range(5)])
    up.ts_ms += 1
    up.resolved()
    return up, snapshot, at_s


def expected(kind: str, up: Upstream, table: str, state: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    types = up.types[table]
    return {k: {c: canonical_expected(kind, c, full, row.get(c)) for c, full in types.items()}
            for k, row in state.items()}


def differences(got: dict[int, dict[str, Any]], want: dict[int, dict[str, Any]]) -> list[str]:
    out = [f"row {k}: {'missing' if k not in got else 'unexpected'}" for k in sorted(set(got) ^ set(want))]
    for k in sorted(set(got) & set(want)):
        out += [f"row {k} column {c}: expected {v!r:.120}, got {got[k].get(c)!r:.120}"
                for c, v in want[k].items() if got[k].get(c) != v]
    return out


def dropped_before(up: Upstream, snapshot: int, routed: set[str]) -> int:
    """Row changes and DDL copies of routed tables the changefeed carries at commit ts <= S."""
    n = 0
    for _part, _key, value in up.messages:
        m = orjson.loads(value)
        if m["table"] in routed and m.get("_tidb", {}).get("commitTs", 0) and m["_tidb"]["commitTs"] <= snapshot:
            n += 1
    return n


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_load_at_snapshot_then_replicate_converges(urls, spark, unique, drop_schema, tmp_path, capsys, target) -> None:
    schema = f"seed_{unique}"
    topic = f"e2e-load-{target}-{unique}"
    drop_schema((target, schema))
    up, snapshot, at_s = history()
    produce(urls.kafka, topic, up.messages, partitions=PARTITIONS)
    export = tmp_path / "export"
    write_export(export, [
        DumpTable(UP, "t_sql", TYPES, list(at_s["t_sql"].values()), filetype="sql", rows_per_file=35,
                  create=create_sql("t_sql")),
        DumpTable(UP, "t_csv", TYPES, list(at_s["t_csv"].values()), filetype="csv", compress=True,
                  create=create_sql("t_csv")),
        DumpTable(UP, "skip_me", TYPES, list(at_s["skip_me"].values()), create=create_sql("skip_me")),
    ], snapshot_ts=snapshot)
    cfg = {
        "pipeline": {"name": f"p-{topic}", "checkpoint_dir": str(tmp_path / "ckpt")},
        "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": "canal-json"},
        "target": {"url": target_url(urls, target)},
        "route": [{"match": f"{UP}.*", "schema": schema}, {"match": f"{UP}.skip_*", "ignore": True}],
    }
    conf = str(write_toml(tmp_path / "c.toml", cfg))
    settings = parse_config(cfg)
    name = settings.pipeline.name
    engine = create_engine(target_url(urls, target))
    try:
        assert main(["load", "-c", conf, "--dumpling", str(export), "--threads", "2"]) == 0
        out = capsys.readouterr().out
        assert f"starts after snapshot ts {snapshot}" in out and "ignored by the routes: up.skip_me" in out, out
        with engine.connect() as c:
            loads = {r.source_table: r for r in c.execute(select(P.loads).where(P.loads.c.pipeline == name))}
            assert {t: (r.rows, r.files, r.snapshot_ts) for t, r in loads.items()} == {
                "t_sql": (len(at_s["t_sql"]), 2, snapshot), "t_csv": (len(at_s["t_csv"]), 1, snapshot)}
            assert c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == name)).scalar() \
                == snapshot
        for t in ("t_sql", "t_csv"):  # the load alone is the state at S
            assert differences(read_back(target, engine, schema, t, TYPES, "id"), expected(
                target, up, t, {k: {c: v for c, v in r.items() if c in TYPES} for k, r in at_s[t].items()})) == []

        res = run(settings, until_caught_up=True, spark=spark, progress=False)
        # exactly the changes committed at or before S were dropped: none re-applied, none missing
        assert res.gate["duplicates_dropped"] == dropped_before(up, snapshot, {"t_sql", "t_csv"})
        for t in ("t_sql", "t_csv"):
            assert differences(read_back(target, engine, schema, t, up.types[t], "id"),
                               expected(target, up, t, up.state[t])) == [], t
        with engine.connect() as c:
            assert not c.execute(text("SELECT 1 FROM information_schema.tables WHERE table_schema = :s AND "
                                      "table_name = 'skip_me'"), {"s": schema}).first()
            hist = c.execute(select(P.ddl_history.c.commit_ts).where(P.ddl_history.c.pipeline == name)).all()
            assert [ts for ts, in hist] and all(ts > snapshot for ts, in hist)  # only the ALTER after S ran

        # a second load is refused: the pipeline has progress and a recorded load
        assert main(["load", "-c", conf, "--dumpling", str(export)]) == 2
        err = capsys.readouterr().err
        assert "already has progress" in err and "applier_loads" in err and "--replace" in err, err

        # --replace: the routed tables hold the snapshot again and the pipeline starts at S once more. t_csv is
        # emptied and reloaded; t_sql was dropped by the operator, so the load creates it again at the snapshot's
        # shape, and the ALTER after S (already in the DDL history) is replayed by the next run
        q = "`" if target == "mariadb" else '"'
        with engine.begin() as c:
            c.exec_driver_sql(f"DROP TABLE {q}{schema}{q}.{q}t_sql{q}")
        assert main(["load", "-c", conf, "--dumpling", str(export), "--replace"]) == 0
        capsys.readouterr()
        with engine.connect() as c:
            assert c.execute(select(P.pipelines.c.applied_ts).where(P.pipelines.c.pipeline == name)).scalar() \
                == snapshot
            assert c.execute(select(P.partitions).where(P.partitions.c.pipeline == name)).first() is None
            assert {s for s, in c.execute(select(P.ddl_history.c.state).where(P.ddl_history.c.pipeline == name))} \
                == {"started"}
        for t in ("t_sql", "t_csv"):
            assert differences(read_back(target, engine, schema, t, TYPES, "id"), expected(
                target, up, t, {k: {c: v for c, v in r.items() if c in TYPES} for k, r in at_s[t].items()})) == []
        run(settings, until_caught_up=True, spark=spark, progress=False)
        for t in ("t_sql", "t_csv"):
            assert differences(read_back(target, engine, schema, t, up.types[t], "id"),
                               expected(target, up, t, up.state[t])) == [], t
        with engine.connect() as c:
            assert {s for s, in c.execute(select(P.ddl_history.c.state).where(P.ddl_history.c.pipeline == name))} \
                == {"done"}
    finally:
        engine.dispose()


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_a_row_the_target_refuses_stops_the_load_naming_file_line_and_key(urls, unique, drop_schema, tmp_path,
                                                                            capsys, target) -> None:
    schema = f"seedbad_{unique}"
    drop_schema((target, schema))
    url = target_url(urls, target)
    engine = create_engine(url)
    q = '`' if target == "mariadb" else '"'
    with engine.begin() as c:  # the target exists already, with a column narrower than upstream's
        c.exec_driver_sql(f"CREATE {'DATABASE' if target == 'mariadb' else 'SCHEMA'} {q}{schema}{q}")
        c.exec_driver_sql(f"CREATE TABLE {q}{schema}{q}.{q}t{q} (id int PRIMARY KEY, c varchar(3))")
    rows = [{"id": i, "c": "ok"} for i in range(1, 301)]
    rows[211]["c"] = "too long"
    types = {"id": "int", "c": "varchar(64)"}
    write_export(tmp_path / "export", [DumpTable(UP, "t", types, rows)], snapshot_ts=1 << 60, statement_rows=50)
    cfg = {
        "pipeline": {"name": f"p-bad-{unique}", "checkpoint_dir": str(tmp_path / "ckpt")},
        "source": {"bootstrap_servers": urls.kafka, "topics": ["none"], "protocol": "canal-json"},
        "target": {"url": url},
        "route": [{"match": f"{UP}.*", "schema": schema}],
    }
    conf = str(write_toml(tmp_path / "c.toml", cfg))
    try:
        assert main(["load", "-c", conf, "--dumpling", str(tmp_path / "export")]) == 4
        err = capsys.readouterr().err
        # the row with id 212 is on line 3 (SET NAMES, FOREIGN_KEY_CHECKS) + 4 INSERT lines + its row: 3 + 4 + 212
        assert "up.t.000000000.sql, line 219" in err and "id=212" in err and "Nothing of" in err, err
        assert f":{engine.url.password}@" not in err  # (the local services' user and password are both 'applier')
        with engine.connect() as c:
            assert c.exec_driver_sql(f"SELECT count(*) FROM {q}{schema}{q}.{q}t{q}").scalar() == 0
            assert c.execute(select(P.pipelines).where(P.pipelines.c.pipeline == cfg["pipeline"]["name"])).first() \
                is None
    finally:
        engine.dispose()


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_an_export_that_is_not_dumplings_syntax_or_values_stops_with_exit_2(urls, unique, drop_schema, tmp_path,
                                                                             capsys, target) -> None:
    schema = f"seedsyn_{unique}"
    drop_schema((target, schema))
    types = {"id": "int", "d": "date"}
    files = write_export(tmp_path / "export", [DumpTable(UP, "t", types, [{"id": i, "d": dt.date(2024, 1, i)}
                                                                          for i in range(1, 21)])],
                         snapshot_ts=1 << 60, statement_rows=10)
    cfg = {
        "pipeline": {"name": f"p-syn-{unique}", "checkpoint_dir": str(tmp_path / "ckpt")},
        "source": {"bootstrap_servers": urls.kafka, "topics": ["none"], "protocol": "canal-json"},
        "target": {"url": target_url(urls, target)},
        "route": [{"match": f"{UP}.*", "schema": schema}],
    }
    conf = str(write_toml(tmp_path / "c.toml", cfg))
    data = files[0].read_bytes()
    files[0].write_bytes(data.replace(b"'2024-01-15'", b"'2024-02-30'"))  # line 19: 2 comment lines, an INSERT line, 10 rows, the 2nd INSERT line, then rows 11..
    assert main(["load", "-c", conf, "--dumpling", str(tmp_path / "export")]) == 2
    err = capsys.readouterr().err
    assert "up.t.000000000.sql, line 19: column 'd' (date)" in err and "'2024-02-30'" in err, err
    files[0].write_bytes(data.replace(b"(15,", b"(15 "))  # a missing comma
    assert main(["load", "-c", conf, "--dumpling", str(tmp_path / "export"), "--replace"]) == 2
    err = capsys.readouterr().err
    assert "up.t.000000000.sql, line 19: expected a row of values" in err and "Nothing of" in err, err
    engine = create_engine(target_url(urls, target))
    try:
        with engine.connect() as c:  # the table was created (from the export's CREATE TABLE), and nothing loaded
            q = '`' if target == "mariadb" else '"'
            assert c.exec_driver_sql(f"SELECT count(*) FROM {q}{schema}{q}.{q}t{q}").scalar() == 0
            assert c.execute(select(P.loads).where(P.loads.c.pipeline == cfg["pipeline"]["name"])).first() is None
    finally:
        engine.dispose()
