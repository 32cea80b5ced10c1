"""Which target faults pass (invariant 14): retried by replaying the whole transaction, never the others."""

from __future__ import annotations

from sqlalchemy.exc import IntegrityError, OperationalError

from applier.sinks import ApplyError, is_transient


class PgError(Exception):
    def __init__(self, sqlstate):
        super().__init__("pg")
        self.sqlstate = sqlstate


def wrap(orig, invalidated: bool = False) -> OperationalError:
    return OperationalError("stmt", {}, orig, connection_invalidated=invalidated)


def test_mysql_codes():
    assert is_transient(wrap(Exception(2003, "Can't connect")))
    assert is_transient(wrap(Exception(1213, "Deadlock found")))
    assert is_transient(wrap(Exception(1205, "Lock wait timeout")))
    assert not is_transient(wrap(Exception(1146, "Table doesn't exist")))
    assert not is_transient(IntegrityError("stmt", {}, Exception(1062, "Duplicate entry")))


def test_postgres_sqlstates():
    assert is_transient(wrap(PgError("40P01")))  # deadlock
    assert is_transient(wrap(PgError("57P01")))  # admin shutdown
    assert is_transient(wrap(PgError("08006")))  # connection failure
    assert not is_transient(wrap(PgError("23505")))  # unique violation
    assert not is_transient(wrap(PgError("42P01")))  # undefined table


def test_wrapped_and_invalidated():
    try:
        try:
            raise wrap(Exception(2013, "Lost connection"))
        except OperationalError as exc:
            raise ApplyError("writing 3 change(s) failed") from exc
    except ApplyError as outer:
        assert is_transient(outer)
    assert is_transient(wrap(Exception(0, ""), invalidated=True))
    assert not is_transient(ValueError("not a database error"))
    assert not is_transient(ApplyError("refused"))


def test_db_reason_is_the_drivers_message_without_sql_or_parameters():
    from applier.sinks import db_reason

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
