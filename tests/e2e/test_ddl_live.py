"""The DDL translation of every TiCDC workload file runs on the real servers (MariaDB and PostgreSQL).

Each upstream schema is routed to ddlut_<unique>_<schema>; everything created is dropped (MariaDB) or rolled
back (PostgreSQL: one transaction per workload with a savepoint per statement).
"""

from __future__ import annotations

import psycopg
import pymysql
import pytest
from sqlalchemy.engine import make_url

from applier.ddl import UnsupportedDDL, translate
from tests.unit.helpers import workload_ddl

pytestmark = pytest.mark.e2e


def test_workload_ddl_runs_on_mariadb(urls, vectors, unique) -> None:
    u = make_url(urls.mariadb_url)
    conn = pymysql.connect(host=u.host, port=u.port, user=u.username, password=u.password, autocommit=True,
                           charset="utf8mb4", connect_timeout=5)
    prefix = f"ddlut_{unique}_"

    def prefixed(s, t):
        return f"{prefix}{s}", t

    created: set[str] = set()
    failures = []
    try:
        with conn.cursor() as cur:
            for workload in sorted({w for w, _, _ in workload_ddl(vectors)}):
                for db in list(created):
                    cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
                created.clear()
                for w, schema, stmt in workload_ddl(vectors):
                    if w != workload:
                        continue
                    db = f"{prefix}{schema}"
                    if db not in created:
                        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4")
                        created.add(db)
                    try:
                        out = translate("mariadb", stmt, schema=schema, table="", route=prefixed)
                    except UnsupportedDDL:
                        continue
                    for s in out.statements:
                        created.update(t[0] for t in out.targets if t[0])
                        try:
                            cur.execute(s)
                        except pymysql.err.MySQLError as exc:
                            failures.append((workload, s[:200], exc.args))
    finally:
        with conn.cursor() as cur:
            for db in created:
                cur.execute(f"DROP DATABASE IF EXISTS `{db}`")
        conn.close()
    # the workloads reference tables created in other files (1146) or re-create names (1050)
    assert [f for f in failures if f[2][0] not in (1146, 1050)] == []


def test_workload_ddl_runs_on_postgresql(urls, vectors, unique) -> None:
    u = make_url(urls.pg_url)
    conn = psycopg.connect(host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database,
                           connect_timeout=5)
    prefix = f"ddlut_{unique}_"

    def prefixed(s, t):
        return f"{prefix}{s}", t

    failures = []
    try:
        for workload in sorted({w for w, _, _ in workload_ddl(vectors)}):
            with conn.transaction(force_rollback=True):
                for w, schema, stmt in workload_ddl(vectors):
                    if w != workload:
                        continue
                    conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{prefix}{schema}"')
                    try:
                        out = translate("postgresql", stmt, schema=schema, table="", route=prefixed)
                    except UnsupportedDDL:
                        continue
                    for s in out.statements:
                        try:
                            with conn.transaction():
                                conn.execute(s)
                        except psycopg.Error as exc:
                            failures.append((workload, s[:200], exc.sqlstate, str(exc)[:200]))
    finally:
        conn.close()
    # the workloads reference tables created in other files (42P01) or re-create names (42P07)
    assert [f for f in failures if f[2] not in ("42P01", "42P07")] == []
