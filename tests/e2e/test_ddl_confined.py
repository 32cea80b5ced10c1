"""Invariant 11 on both targets: a replicated DDL acts only on objects its routes give it, and never on the
applier's own schema or tables, whatever its SQL text says (issue 10's hostile messages)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect, select, text

from applier import progress as P
from applier.events import DDL, Column, Op, Resolved, RowChange
from applier.routing import Router, Rule
from applier.sinks import ApplyError
from tests.e2e.helpers import Feed, POS, processor, target_url

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["mariadb", "postgres"])
def target(request, urls, unique, drop_schema):
    schema = f"cf_{unique}"
    drop_schema((request.param, schema))
    engine = create_engine(target_url(urls, request.param))
    with engine.connect() as c:
        own = c.execute(text("SELECT DATABASE()" if request.param == "mariadb" else "SELECT current_schema()")).scalar()
    yield request.param, engine, schema, own
    engine.dispose()


def _applier_tables(engine, own: str) -> set[str]:
    return {t for t in inspect(engine).get_table_names(schema=own) if t.startswith("applier_")}


def _router(schema: str) -> Router:
    return Router([Rule(match="shop.*", schema=schema)])


def _q(kind: str, name: str) -> str:
    return f"`{name}`" if kind == "mariadb" else f'"{name}"'


HOSTILE = [
    # (header schema, header table, query) -- the header says shop, the text reaches elsewhere
    ("shop", "", "DROP DATABASE {own}"),
    ("shop", "orders", "RENAME TABLE shop.orders TO elsewhere.orders"),
    ("shop", "x", "DROP TABLE elsewhere.x"),
    # the header names the applier's own schema: in scope by header, refused as the applier's own
    ("{own}", "", "DROP DATABASE {own}"),
    ("{own}", "applier_pipelines", "TRUNCATE TABLE applier_pipelines"),
    ("{own}", "applier_writers", "DROP TABLE applier_writers"),
    ("{own}", "applier_tables", "ALTER TABLE applier_tables ADD COLUMN x INT"),
]


@pytest.mark.parametrize("header_schema,header_table,query", HOSTILE)
def test_hostile_ddl_is_refused_and_the_applier_tables_stay(target, unique, header_schema, header_table,
                                                            query) -> None:
    kind, engine, schema, own = target
    router = _router(schema)
    proc = processor(engine, f"cf-{unique}", router.route, ddl_scope=router.routed_by_rule)
    before = _applier_tables(engine, own)
    ev = DDL(header_schema.format(own=own), header_table, 100, query.format(own=own), POS)
    with pytest.raises(ApplyError, match="cannot translate DDL") as err:
        proc.process(Feed().msgs(ev, Resolved(200, POS)))
    # PostgreSQL's own schema here is "public", which the translator refuses to drop before the scope check
    assert any(r in str(err.value) for r in ("applier's own", "not routed by any [[route]] rule", "is refused"))
    assert _applier_tables(engine, own) == before and len(before) >= 7


def test_skip_records_the_refusal_and_routed_ddl_still_applies(target, unique) -> None:
    kind, engine, schema, own = target
    router = _router(schema)
    name = f"cf-skip-{unique}"
    proc = processor(engine, name, router.route, ddl_scope=router.routed_by_rule, on_unsupported_ddl="skip")
    cols = (Column("id", "int", nullable=False, key=True), Column("v", "varchar"))
    f = Feed()
    proc.process(f.msgs(
        DDL("shop", "x", 100, "DROP TABLE elsewhere.x", POS),
        DDL("shop", "t", 110, "CREATE TABLE `t` (`id` INT PRIMARY KEY, `v` VARCHAR(8))", POS),
        RowChange("shop", "t", 120, Op.INSERT, None, {"id": 1, "v": "a"}, cols, POS),
        Resolved(200, POS)))
    with engine.connect() as c:
        hist = c.execute(select(P.ddl_history.c.query, P.ddl_history.c.state, P.ddl_history.c.detail)
                         .where(P.ddl_history.c.pipeline == name).order_by(P.ddl_history.c.commit_ts)).all()
        rows = c.execute(text(f"SELECT id, v FROM {_q(kind, schema)}.{_q(kind, 't')}")).all()
    assert [(q.split()[0], s) for q, s, _ in hist] == [("DROP", "skipped"), ("CREATE", "done")]
    assert "not routed by any [[route]] rule" in hist[0][2]
    assert [tuple(r) for r in rows] == [(1, "a")]
    assert len(_applier_tables(engine, own)) >= 7


def test_a_row_for_a_missing_table_names_its_position_and_escapes_the_name(target, unique) -> None:
    """Apply errors carry the Kafka position, and a hostile name (a NUL) is shown escaped, never raw."""
    kind, engine, schema, own = target
    router = _router(schema)
    proc = processor(engine, f"cf-missing-{unique}", router.route, ddl_scope=router.routed_by_rule)
    cols = (Column("id", "int", nullable=False, key=True),)
    f = Feed()
    f.offset = 41
    with pytest.raises(ApplyError) as err:
        proc.process(f.msgs(RowChange("shop", "ta\x00ble", 120, Op.INSERT, None, {"id": 1}, cols, POS),
                            Resolved(200, POS)))
    msg = str(err.value)
    assert "topic=t partition=0 offset=41" in msg and "ta\\x00ble" in msg and "\x00" not in msg, msg


def test_postgres_drops_with_cascade_only_schemas_the_applier_created(urls, unique, drop_schema) -> None:
    """DROP DATABASE reaches PostgreSQL as DROP SCHEMA ... CASCADE: refused for a schema someone else made (its
    objects would go with it), applied for one the applier created from the stream."""
    engine = create_engine(urls.pg_url)
    theirs, ours = f"theirs_{unique}", f"ours_{unique}"
    drop_schema(("postgres", theirs))
    drop_schema(("postgres", ours))
    try:
        with engine.begin() as c:
            c.execute(text(f'CREATE SCHEMA "{theirs}"'))
            c.execute(text(f'CREATE TABLE "{theirs}".keep (id int primary key)'))
        router = Router([Rule(match="*.*")])
        name = f"cf-cascade-{unique}"
        proc = processor(engine, name, router.route, ddl_scope=router.routed_by_rule, on_unsupported_ddl="skip")
        f = Feed()
        proc.process(f.msgs(
            DDL(theirs, "", 100, f"DROP DATABASE {theirs}", POS),
            DDL(ours, "", 110, f"CREATE DATABASE {ours}", POS),
            DDL(ours, "t", 120, "CREATE TABLE `t` (`id` INT PRIMARY KEY)", POS),
            DDL(ours, "", 130, f"DROP DATABASE {ours}", POS),
            Resolved(200, POS)))
        names = set(inspect(engine).get_schema_names())
        assert theirs in names and "keep" in inspect(engine).get_table_names(schema=theirs)
        assert ours not in names
        with engine.connect() as c:
            hist = dict(c.execute(select(P.ddl_history.c.query, P.ddl_history.c.state)
                                  .where(P.ddl_history.c.pipeline == name)).all())
            assert c.execute(select(P.schemas.c.schema_name).where(P.schemas.c.schema_name == ours)).first() is None
        assert hist[f"DROP DATABASE {theirs}"] == "skipped" and hist[f"DROP DATABASE {ours}"] == "done"
    finally:
        engine.dispose()
