"""One object per target database (applier.dialect): which writer and DDL translator it picks, how it converts
values, and which server errors it calls transient (invariant 14: retried by replaying the whole transaction,
never the others) or "already done" on a DDL replay."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

from applier.dialect import MARIADB, MYSQL, POSTGRES, dialect_for, dialect_named
from applier.sinks import ApplyError, db_reason
from applier.sinks.mysql import MySQLSink
from applier.sinks.postgres import PostgresSink


class PgError(Exception):
    def __init__(self, sqlstate):
        super().__init__("pg")
        self.sqlstate = sqlstate


def wrap(orig, invalidated: bool = False) -> OperationalError:
    return OperationalError("stmt", {}, orig, connection_invalidated=invalidated)


def route(schema: str, table: str) -> tuple[str, str]:
    return "r", table


@pytest.mark.parametrize("mysql", [MYSQL, MARIADB])
def test_mysql_codes(mysql):
    assert mysql.is_transient(wrap(Exception(2003, "Can't connect")))
    assert mysql.is_transient(wrap(Exception(1213, "Deadlock found")))
    assert mysql.is_transient(wrap(Exception(1205, "Lock wait timeout")))
    assert not mysql.is_transient(wrap(Exception(1146, "Table doesn't exist")))
    assert not mysql.is_transient(IntegrityError("stmt", {}, Exception(1062, "Duplicate entry")))
    assert not mysql.is_transient(wrap(PgError("40P01")))  # another server's vocabulary means nothing here


def test_postgres_sqlstates():
    assert POSTGRES.is_transient(wrap(PgError("40P01")))  # deadlock
    assert POSTGRES.is_transient(wrap(PgError("57P01")))  # admin shutdown
    assert POSTGRES.is_transient(wrap(PgError("08006")))  # connection failure
    assert not POSTGRES.is_transient(wrap(PgError("23505")))  # unique violation
    assert not POSTGRES.is_transient(wrap(PgError("42P01")))  # undefined table
    assert not POSTGRES.is_transient(wrap(Exception(1213, "Deadlock found")))


@pytest.mark.parametrize("dialect", [MYSQL, MARIADB, POSTGRES])
def test_wrapped_and_invalidated(dialect):
    try:
        try:
            raise wrap(Exception(2013, "Lost connection") if dialect is not POSTGRES else PgError("57P01"))
        except OperationalError as exc:
            raise ApplyError("writing 3 change(s) failed") from exc
    except ApplyError as outer:
        assert dialect.is_transient(outer)
    assert dialect.is_transient(wrap(Exception(0, ""), invalidated=True))
    assert not dialect.is_transient(ValueError("not a database error"))
    assert not dialect.is_transient(ApplyError("refused"))
    assert not dialect.is_transient(None)


def test_a_replayed_mysql_ddl_that_already_ran_is_recognised_and_nothing_else():
    done = ProgrammingError("ALTER TABLE", {}, Exception(1060, "Duplicate column name 'c'"))
    other = ProgrammingError("ALTER TABLE", {}, Exception(1064, "You have an error in your SQL syntax"))
    assert MYSQL.is_replay_noop(done) and MARIADB.is_replay_noop(done)
    assert not MYSQL.is_replay_noop(other)
    assert not MYSQL.is_replay_noop(ValueError("x"))
    assert not POSTGRES.is_replay_noop(done)  # PostgreSQL DDL commits with its history row: never half done


def test_each_dialect_picks_its_writer_and_hands_it_its_converters():
    assert isinstance(MYSQL.writer(), MySQLSink) and isinstance(MARIADB.writer(), MySQLSink)
    pg = POSTGRES.writer(batch_rows=10)
    assert isinstance(pg, PostgresSink) and pg.batch_rows == 40  # COPY batches are larger
    assert MYSQL.value_converter("time(3)")(dt.timedelta(seconds=-1)) == "-00:00:01"
    assert MYSQL.value_converter("enum('a','b')") is None  # MySQL takes ordinals as they are
    assert POSTGRES.value_converter("enum('a','b')")(2) == "b"
    assert POSTGRES.ddl_is_transactional and POSTGRES.drop_schema_cascades
    assert not MYSQL.ddl_is_transactional and not MYSQL.drop_schema_cascades


def test_each_dialect_translates_ddl_in_its_own_spelling():
    q = "ALTER TABLE t ADD COLUMN c INT"
    my = MYSQL.translate_ddl(q, schema="s", table="t", route=route).statements
    maria = MARIADB.translate_ddl(q, schema="s", table="t", route=route).statements
    pg = POSTGRES.translate_ddl(q, schema="s", table="t", route=route).statements
    assert my == ["ALTER TABLE `r`.`t` ADD COLUMN c INT"]
    assert maria == ["ALTER TABLE `r`.`t` ADD COLUMN IF NOT EXISTS c INT"]  # MariaDB's idempotent form
    assert pg and all('"r"."t"' in s for s in pg)


def test_the_dialect_is_chosen_once_from_the_engine():
    assert dialect_for(create_engine("postgresql+psycopg://u@127.0.0.1:1/x")) is POSTGRES
    assert dialect_for(create_engine("mariadb+pymysql://u@127.0.0.1:1/x")) is MARIADB  # no connection needed
    assert dialect_named("mysql") is MYSQL
    with pytest.raises(ValueError, match="unsupported target dialect 'sqlite'"):
        dialect_for(create_engine("sqlite://"))


def test_db_reason_is_the_drivers_message_without_sql_or_parameters():
    err = OperationalError("INSERT INTO t VALUES (%s)", {"secret": "row data"}, Exception(2013, "Lost connection"))
    assert db_reason(err) == "Exception: (2013, 'Lost connection')"
    try:
        try:
            raise err
        except OperationalError as exc:
            raise ApplyError("writing failed") from exc
    except ApplyError as outer:
        assert db_reason(outer) == "Exception: (2013, 'Lost connection')" and "row data" not in db_reason(outer)
    assert db_reason(ApplyError("refused\nsecond line")) == "ApplyError: refused"
