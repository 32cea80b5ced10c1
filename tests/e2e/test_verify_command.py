"""``applier verify`` against real servers: the local MariaDB plays the upstream (a MySQL-family server that is not
TiDB, so the comparison is live), and the replica is a copy in another MariaDB schema or in PostgreSQL, written
the way the applier writes it (PostgreSQL: the applier's own DDL translation and writer, so ENUM/SET are text,
BIT is bit varying, JSON is jsonb, TIME is interval, zero dates are -infinity).

Each case checks that an exact replica verifies equal (exit 0), that a missing row, an extra row, a changed value
and a value changed to NULL are each reported with their keys (exit 1), that the --fix-sql file applied with the
database's own client (twice: it is idempotent) makes verify exit 0 again, and that an unreachable upstream exits
5 naming the host but not the password. Without --upstream, verify checks the applier's tables.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import create_engine, delete, insert, text
from sqlalchemy.engine import make_url

from applier import migrate
from applier import progress as P
from applier.cli import main
from applier.dialect import POSTGRES
from applier.mysql_values import format_time
from tests.e2e.helpers import apply_sql_file, target_url, write_toml

pytestmark = pytest.mark.e2e

ITEMS = """CREATE TABLE items (
  id INT NOT NULL PRIMARY KEY,
  name VARCHAR(40) NULL,
  price DECIMAL(12,3) NULL,
  ratio FLOAT NULL,
  score DOUBLE NULL,
  born DATE NULL,
  seen DATETIME(6) NULL,
  stamp TIMESTAMP(3) NULL DEFAULT NULL,
  dur TIME(2) NULL,
  flags BIT(5) NULL,
  kind ENUM('a','b','c') NULL,
  tags SET('x','y','z') NULL,
  doc JSON NULL,
  raw VARBINARY(8) NULL,
  big BIGINT UNSIGNED NULL
)"""
PAIRS = """CREATE TABLE pairs (
  a INT NOT NULL,
  b VARCHAR(10) NOT NULL,
  v TEXT NULL,
  PRIMARY KEY (a, b)
)"""
CODES = """CREATE TABLE codes (
  code CHAR(3) NOT NULL,
  n INT NULL,
  UNIQUE KEY uq_code (code)
)"""
ITEM_COLS = ("id", "name", "price", "ratio", "score", "born", "seen", "stamp", "dur", "flags", "kind", "tags", "doc",
             "raw", "big")


def item(i: int) -> dict:
    return {
        "id": i, "name": f"item {i} 'quoted' \\ % 🎉" if i % 3 == 0 else f"item {i}",
        "price": Decimal(i) * Decimal("1.125") if i % 4 else None, "ratio": 3.14159 * i, "score": 0.1 + 0.2 * i,
        "born": dt.date(1990 + i % 30, 1 + i % 12, 1 + i % 28),
        "seen": dt.datetime(2020, 2, 20, 2, 20, 20, 123456 if i % 2 else 0) + dt.timedelta(days=i),
        "stamp": dt.datetime(2021, 6, 1, 12, 0, 0, 500000) + dt.timedelta(hours=i),  # UTC
        "dur": dt.timedelta(hours=-(i * 7), minutes=5, seconds=1, microseconds=250000),
        "flags": i % 32, "kind": "abc"[i % 3], "tags": ["x", "y,z", "", "x,z"][i % 4],
        "doc": f'{{"n": {i}, "list": [1, 2.50, "s"], "nested": {{"b": true, "a": null}}}}',
        "raw": bytes([0, 255, i % 256]), "big": 18446744073709551615 - i,
    }


# zero dates (PostgreSQL: -infinity, as the writer stores them); the e2e target's MariaDB allows them by default
ZERO_DATES = {"id": 101, "born": "0000-00-00", "seen": "0000-00-00 00:00:00", "stamp": "0000-00-00 00:00:00"}
# b: distinct under the upstream's _ci collation, which orders them differently from code point order
PAIR_ROWS = [{"a": a, "b": b, "v": f"{a}{b}"} for a in (1, 2, 3) for b in ("a", "B", "c", "D", "é")]
CODE_ROWS = [{"code": f"c{i:02d}", "n": i} for i in range(12)]


def _mysql_session(conn) -> None:
    conn.exec_driver_sql("SET SESSION time_zone = '+00:00'")


def _upstream(urls, up: str) -> None:
    """The upstream schema on the local MariaDB, with the rows."""
    eng = create_engine(urls.mariadb_url)
    with eng.begin() as c:
        _mysql_session(c)
        c.exec_driver_sql(f"CREATE DATABASE `{up}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
        for ddl in (ITEMS, PAIRS, CODES):
            c.exec_driver_sql(ddl.replace("CREATE TABLE ", f"CREATE TABLE `{up}`.", 1))
        c.execute(text(f"INSERT INTO `{up}`.items ({', '.join(ITEM_COLS)}) VALUES "
                       f"({', '.join(':' + n for n in ITEM_COLS)})"),
                  # TIME as MySQL text: PyMySQL writes a negative timedelta wrong
                  [{**item(i), "dur": format_time(item(i)["dur"])} for i in range(1, 16)])
        c.execute(text(f"INSERT INTO `{up}`.items (id) VALUES (100)"))  # every other column NULL
        c.execute(text(f"INSERT INTO `{up}`.items (id, born, seen, stamp) VALUES (:id, :born, :seen, :stamp)"),
                  ZERO_DATES)
        c.execute(text(f"INSERT INTO `{up}`.pairs (a, b, v) VALUES (:a, :b, :v)"), PAIR_ROWS)
        c.execute(text(f"INSERT INTO `{up}`.codes (code, n) VALUES (:code, :n)"), CODE_ROWS)
    eng.dispose()


def _replica_mariadb(urls, up: str, rep: str) -> None:
    """An exact copy in another schema of the same server (the MySQL writer keeps the upstream's own types)."""
    eng = create_engine(urls.mariadb_url)
    with eng.begin() as c:
        c.exec_driver_sql(f"CREATE DATABASE `{rep}`")
        for t in ("items", "pairs", "codes"):
            c.exec_driver_sql(f"CREATE TABLE `{rep}`.`{t}` LIKE `{up}`.`{t}`")
            c.exec_driver_sql(f"INSERT INTO `{rep}`.`{t}` SELECT * FROM `{up}`.`{t}`")
    eng.dispose()


def _replica_postgres(urls, up: str, rep: str) -> None:
    """The tables as the applier's DDL translation creates them, filled through its PostgreSQL writer with the
    event model's values (what a decoder hands over: BIT as int, ENUM/SET names, JSON text, TIME timedelta)."""
    eng = create_engine(urls.pg_url)
    route = lambda s, t: (rep, t)  # noqa: E731
    sink = POSTGRES.writer()
    with eng.begin() as c:
        c.exec_driver_sql(f'CREATE SCHEMA "{rep}"')
        for ddl, table in ((ITEMS, "items"), (PAIRS, "pairs"), (CODES, "codes")):
            for stmt in POSTGRES.translate_ddl(ddl, schema=up, table=table, route=route).statements:
                c.exec_driver_sql(stmt)
    with eng.begin() as c:
        sink.begin(c)
        nulls = dict.fromkeys(ITEM_COLS)
        items = [item(i) for i in range(1, 16)] + [{**nulls, "id": 100}, {**nulls, **ZERO_DATES}]
        for table, rows in (("items", items),
                            ("pairs", PAIR_ROWS), ("codes", CODE_ROWS)):
            meta = sink.table(c, rep, table)
            cols = tuple(rows[0])
            sink.upsert_rows(c, meta, cols, sink.adapt_rows(meta, cols, [dict(r) for r in rows]))
    eng.dispose()


def _damage(urls, target: str, rep: str) -> None:
    """Missing rows (one of zero dates), an extra row, a changed value, a value changed to NULL, a changed row of a
    composite key, a missing row of a table keyed by a unique key."""
    eng = create_engine(target_url(urls, target))
    q = (lambda n: f"`{n}`") if target == "mariadb" else (lambda n: f'"{n}"')
    t = f"{q(rep)}.{q('items')}"
    with eng.begin() as c:
        c.exec_driver_sql(f"DELETE FROM {t} WHERE id IN (3, 101)")
        c.exec_driver_sql(f"INSERT INTO {t} (id, name) VALUES (999, 'stray')")
        c.exec_driver_sql(f"UPDATE {t} SET name = 'CHANGED' WHERE id = 2")
        c.exec_driver_sql(f"UPDATE {t} SET price = NULL WHERE id = 5")
        c.exec_driver_sql(f"UPDATE {q(rep)}.{q('pairs')} SET v = 'other' WHERE a = 2 AND b = 'D'")
        c.exec_driver_sql(f"DELETE FROM {q(rep)}.{q('codes')} WHERE code = 'c07'")
    eng.dispose()


def _config(urls, target: str, up: str, rep: str, tmp_path: Path, unique: str) -> str:
    cfg = {
        "pipeline": {"name": f"verify-{unique}", "checkpoint_dir": str(tmp_path / "ckpt")},
        "source": {"bootstrap_servers": urls.kafka, "topics": [f"verify-{unique}"], "protocol": "canal-json"},
        "target": {"url": target_url(urls, target)},
        "route": [{"match": "*.*", "ignore": True}, {"match": f"{up}.*", "schema": rep}],
    }
    return str(write_toml(tmp_path / "verify.toml", cfg))


def _verify(capsys, cfg: str, upstream: str, *extra: str) -> tuple[int, str, str]:
    code = main(["verify", "-c", cfg, "--upstream", upstream, "--chunk-rows", "4", *extra])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_verify_reports_differences_and_its_fix_sql_repairs_them(urls, unique, drop_schema, tmp_path, capsys,
                                                                    target) -> None:
    up, rep = f"vu_{unique}", f"vr_{unique}"
    drop_schema(("mariadb", up))
    drop_schema((target, rep))
    _upstream(urls, up)
    (_replica_mariadb if target == "mariadb" else _replica_postgres)(urls, up, rep)
    cfg = _config(urls, target, up, rep, tmp_path, unique)
    upstream = urls.mariadb_url
    password = make_url(upstream).password

    code, out, err = _verify(capsys, cfg, upstream)
    print(out)
    assert code == 0, out + err
    assert f"{up}.items -> {rep}.items: 5 chunks, 17 rows upstream, 17 in replica: equal" in out
    assert f"{up}.pairs -> {rep}.pairs: 4 chunks, 15 rows upstream, 15 in replica: equal" in out
    assert f"{up}.codes -> {rep}.codes: 4 chunks, 12 rows upstream, 12 in replica: equal" in out
    assert "NOT a consistent snapshot" in out and "not TiDB" in out
    assert password and f":{password}@" not in out + err and "applier:***@" in out

    _damage(urls, target, rep)
    fix = tmp_path / "fix.sql"
    code, out, err = _verify(capsys, cfg, upstream, "--fix-sql", str(fix))
    print(out)
    assert code == 1, out + err
    assert "    missing in replica (2):\n      id=3\n      id=101\n" in out
    assert "    extra in replica (1):\n      id=999\n" in out
    assert "    different (2):\n      id=2  columns: name\n      id=5  columns: price\n" in out
    assert "    different (1):\n      a=2, b='D'  columns: v\n" in out
    assert "    missing in replica (1):\n      code='c07'\n" in out
    assert "7 differences (3 missing, 1 extra, 3 different) in 3 tables" in out
    assert "fix-up SQL: 7 statement(s) written to" in out
    sql = fix.read_text()
    assert f":{password}@" not in sql and "DELETE FROM" in sql and sql.rstrip().endswith("COMMIT;")

    apply_sql_file(urls, target, fix)
    apply_sql_file(urls, target, fix)  # idempotent: a second run changes nothing
    code, out, err = _verify(capsys, cfg, upstream)
    print(out)
    assert code == 0, out + err
    assert "in replica: equal" in out.splitlines()[-1]


def test_unreachable_upstream_exits_5_naming_the_host_without_the_password(urls, unique, drop_schema, tmp_path,
                                                                             capsys) -> None:
    cfg = _config(urls, "mariadb", f"vu_{unique}", f"vr_{unique}", tmp_path, unique)
    code, out, err = _verify(capsys, cfg, "mysql+pymysql://verifier:S3cretPw0rd@127.0.0.1:1/")
    assert code == 5
    assert "127.0.0.1:1" in err and "--upstream" in err
    assert "S3cretPw0rd" not in out + err
    code, out, err = _verify(capsys, cfg, "mysql+pymysql://verifier:S3cretPw0rd@127.0.0.1:notaport/")
    assert code == 2 and "--upstream" in err and "S3cretPw0rd" not in out + err


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_verify_without_upstream_checks_the_applier_tables(urls, unique, tmp_path, capsys, target) -> None:
    cfg = _config(urls, target, f"vu_{unique}", f"vr_{unique}", tmp_path, unique)
    name = f"verify-{unique}"
    topic = f"verify-{unique}"
    eng = create_engine(target_url(urls, target))
    migrate.upgrade(eng)
    now = P.now()
    ts = int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000) << 18
    try:
        assert main(["verify", "-c", cfg]) == 0
        assert "has no progress yet" in capsys.readouterr().out
        with eng.begin() as c:
            c.execute(insert(P.pipelines).values(pipeline=name, protocol="canal-json", applied_ts=ts, batches=1,
                                                 rows_applied=1, updated_at=now))
            c.execute(insert(P.partitions).values(pipeline=name, topic=topic, kafka_partition=0, restart_offset=9,
                                                  next_offset=4, resolved_ts=ts, updated_at=now))
            c.execute(insert(P.tables).values(pipeline=name, source_schema="s", source_table="gone",
                                              target_schema=f"vr_{unique}", target_table="gone", applied_ts=ts,
                                              rows_applied=1, updated_at=now))
        assert main(["verify", "-c", cfg]) == 1
        out = capsys.readouterr().out
        print(out)
        assert f"PROBLEM: applier_partitions {topic}[0]: restart offset 9 > next offset 4" in out
        assert f"PROBLEM: applier_tables s.gone: its target vr_{unique}.gone does not exist" in out
        assert "result: 2 problem(s)" in out
        with eng.begin() as c:
            c.execute(P.partitions.update().where(P.partitions.c.pipeline == name).values(restart_offset=4))
            c.execute(delete(P.tables).where(P.tables.c.pipeline == name))
        assert main(["verify", "-c", cfg]) == 0
        assert "result: the applier's tables are consistent" in capsys.readouterr().out
    finally:
        with eng.begin() as c:
            for t in (P.partitions, P.tables, P.pipelines):
                c.execute(delete(t).where(t.c.pipeline == name))
        eng.dispose()
