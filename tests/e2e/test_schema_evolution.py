"""Schema from the stream (``[target] schema_evolution``, applier/evolve.py) through real Kafka and Spark into
real MariaDB and PostgreSQL.

* Every protocol, on both targets: the stream starts mid-way (no CREATE TABLE in it, and no ALTER TABLE either:
  the rows simply start carrying the new column), nothing is created by hand; with ``evolve`` the applier creates
  both tables from the rows' column metadata and adds the column, each once, in commit order with the rows, and
  the replica ends equal to upstream.
* ``create`` (the default) creates the tables but does not add columns: the run stops naming the column, and a
  rerun with ``evolve`` converges.
* Canal-JSON with full types (``content-compatible``): the created table has the declared types, and a declared
  type the target column cannot hold stops ``evolve`` naming the column and both types, with nothing applied.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from sqlalchemy import create_engine, inspect, select, text

from applier import progress as P
from applier.config import parse_config
from applier.devtools.changefeed import PROTOCOLS, generate, produce, tso
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.devtools.verify import compare_tables
from applier.events import Column, Op, Resolved, RowChange, SourcePosition
from applier.pipeline import run
from applier.sinks import ApplyError
from tests.e2e.helpers import config, target_url

pytestmark = pytest.mark.e2e

TARGETS = ["mariadb", "postgres"]
TXNS = 120
SEED = 7


def _settings(urls, target, wl, topic, schema, ckpt, evolution: str):
    cfg = config(urls, target, wl.source_protocol, topic, schema, ckpt, max_offsets_per_trigger=150)
    cfg["target"]["schema_evolution"] = evolution
    if wl.topics:
        cfg["source"]["topics"] = list(wl.topics)
    if wl.codec:
        cfg["source"]["codec"] = dict(wl.codec)
    return parse_config(cfg)


def _history(engine, pipeline: str) -> list[tuple[str, str, str]]:
    with engine.connect() as c:
        return sorted((t, q.split()[0], s) for s, t, q in c.execute(
            select(P.ddl_history.c.state, P.ddl_history.c.source_table, P.ddl_history.c.query)
            .where(P.ddl_history.c.pipeline == pipeline)))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_stream_without_ddl_builds_its_tables(urls, spark, unique, drop_schema, tmp_path, request, protocol,
                                                target) -> None:
    topic = f"e2e-evolve-{protocol}-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    extra = {}
    if protocol == "avro":
        extra = {"registry": request.getfixturevalue("registry"), "topic_prefix": topic}
    wl = generate(protocol, partitions=3, txns=TXNS, seed=SEED, replays=2, omit_ddl=("CREATE", "ALTER"), **extra)
    assert sorted(d.query.split()[0] for _, d in wl.target_ddl) == ["ALTER", "CREATE", "CREATE", "CREATE"]
    produce(urls.kafka, None if wl.topics else topic, wl.messages, partitions=3)
    settings = _settings(urls, target, wl, topic, schema, tmp_path / "ckpt", "evolve")
    engine = create_engine(target_url(urls, target))
    try:
        run(settings, until_caught_up=True, spark=spark, progress=False)
        expected = wl.expected
        if protocol == "debezium":  # without the TiDB extension DECIMAL comes as a Connect double: DOUBLE columns
            expected = {t: {k: {c: float(v) if isinstance(v, Decimal) else v for c, v in r.items()}
                            for k, r in rows.items()} for t, rows in expected.items()}
        assert compare_tables(engine, schema, expected) == []
        # each table made once, the column added once (despite replays and three partitions); the routed-away
        # audit_log is never created
        assert _history(engine, settings.pipeline.name) == [
            ("customers", "CREATE", "done"), ("orders", "ALTER", "done"), ("orders", "CREATE", "done")]
        assert set(inspect(engine).get_table_names(schema=schema)) == {"customers", "orders"}
        pk = inspect(engine).get_pk_constraint("orders", schema=schema)["constrained_columns"]
        assert pk == ["id"]
    finally:
        engine.dispose()


@pytest.mark.parametrize("target", TARGETS)
def test_create_does_not_add_columns_and_evolve_then_does(urls, spark, unique, drop_schema, tmp_path,
                                                          target) -> None:
    topic = f"e2e-create-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    wl = generate("open", partitions=3, txns=TXNS, seed=SEED, replays=1, omit_ddl=("CREATE", "ALTER"))
    produce(urls.kafka, topic, wl.messages, partitions=3)
    engine = create_engine(target_url(urls, target))
    try:
        with pytest.raises(ApplyError) as err:
            run(_settings(urls, target, wl, topic, schema, tmp_path / "ckpt", "create"), until_caught_up=True,
                spark=spark, progress=False)
        assert "'status'" in str(err.value) and "orders" in str(err.value)
        assert set(inspect(engine).get_table_names(schema=schema)) == {"customers", "orders"}
        run(_settings(urls, target, wl, topic, schema, tmp_path / "ckpt", "evolve"), until_caught_up=True,
            spark=spark, progress=False)
        assert compare_tables(engine, schema, wl.expected) == []
    finally:
        engine.dispose()


TYPED = (Column("id", "int", nullable=False, key=True, declared="int(11)"),
         Column("name", "varchar", declared="varchar(40)"),
         Column("amount", "decimal", declared="decimal(12,4)"),
         Column("kind", "enum", declared="enum('small','it''s big')"))


def _typed_messages(rows: list[dict], start_ms: int) -> list[tuple[int, None, bytes]]:
    out = []
    for i, after in enumerate(rows):
        ts = tso(start_ms + i)
        ev = RowChange("shop", "typed", ts, Op.INSERT, None, after, TYPED, SourcePosition("", 0, 0))
        out.append((0, None, encode_canal_json(ev, content_compatible=True)[1]))
    out.append((0, None, encode_canal_json(Resolved(tso(start_ms + len(rows)), SourcePosition("", 0, 0)))[1]))
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_declared_types_are_created_and_a_lossy_one_stops(urls, spark, unique, drop_schema, tmp_path,
                                                          target) -> None:
    topic = f"e2e-typed-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    rows = [{"id": 1, "name": "a", "amount": Decimal("12345678.1234"), "kind": 2},  # canal: ENUM ordinals,
            {"id": 2, "name": None, "amount": Decimal("-0.0001"), "kind": 1}]
    produce(urls.kafka, topic, _typed_messages(rows, 1_700_000_000_000), partitions=1)
    cfg = config(urls, target, "canal-json", topic, schema, tmp_path / "ckpt")
    cfg["target"]["schema_evolution"] = "evolve"
    engine = create_engine(target_url(urls, target))
    try:
        run(parse_config(cfg), until_caught_up=True, spark=spark, progress=False)
        cols = {c["name"]: str(c["type"]).lower() for c in inspect(engine).get_columns("typed", schema=schema)}
        assert cols["name"] in ("varchar(40)",) and cols["amount"] in ("decimal(12, 4)", "numeric(12, 4)"), cols
        with engine.connect() as c:
            got = c.execute(text(f"SELECT id, name, amount, kind FROM {_q(target, schema)}.typed ORDER BY id")).all()
        assert [tuple(r) for r in got] == [(1, "a", Decimal("12345678.1234"), "it's big"),
                                          (2, None, Decimal("-0.0001"), "small")]

        # a second table exists with a narrower column than the stream declares
        with engine.begin() as c:
            c.execute(text(f"CREATE TABLE {_q(target, schema)}.narrow (id INT PRIMARY KEY, amount DECIMAL(10,2))"))
        narrow = [RowChange("shop", "narrow", tso(1_700_000_100_000), Op.INSERT, None,
                            {"id": 1, "amount": Decimal("1.0001")}, TYPED[:1] + TYPED[2:3], SourcePosition("", 0, 0))]
        msgs = [(0, None, encode_canal_json(ev, content_compatible=True)[1]) for ev in narrow]
        msgs.append((0, None, encode_canal_json(Resolved(tso(1_700_000_100_001), SourcePosition("", 0, 0)))[1]))
        produce(urls.kafka, topic, msgs, partitions=1)
        with pytest.raises(ApplyError) as err:
            run(parse_config(cfg), until_caught_up=True, spark=spark, progress=False)
        msg = str(err.value)
        assert "'amount'" in msg and "decimal(12,4)" in msg and ("decimal(10,2)" in msg or "numeric(10,2)" in msg), msg
        assert f"topic={topic} partition=0 offset=3" in msg, msg
        with engine.connect() as c:
            assert c.execute(text(f"SELECT count(*) FROM {_q(target, schema)}.narrow")).scalar() == 0
    finally:
        engine.dispose()


def _q(target: str, schema: str) -> str:
    return f"`{schema}`" if target == "mariadb" else f'"{schema}"'


BAG = (Column("v", "int", declared="int(11)"), Column("note", "varchar", declared="varchar(8)"))


@pytest.mark.parametrize("target", TARGETS)
def test_rows_without_a_key_make_a_keyless_table(urls, spark, unique, drop_schema, tmp_path, target) -> None:
    """Rows that carry no key (a table without primary or NOT NULL unique key upstream) create a table without
    one, which is then applied by whole-row match: two identical rows stay two, a delete takes one."""
    topic = f"e2e-bag-{target}-{unique}"
    schema = f"shop_{unique}"
    drop_schema((target, schema))
    pos = SourcePosition("", 0, 0)
    same = {"v": 1, "note": "x"}
    evs = [RowChange("shop", "bag", tso(1_700_000_000_000), Op.INSERT, None, same, BAG, pos),
           RowChange("shop", "bag", tso(1_700_000_000_000), Op.INSERT, None, dict(same), BAG, pos),
           RowChange("shop", "bag", tso(1_700_000_000_001), Op.INSERT, None, {"v": 2, "note": None}, BAG, pos),
           RowChange("shop", "bag", tso(1_700_000_000_002), Op.DELETE, dict(same), None, BAG, pos)]
    msgs = [(0, None, encode_canal_json(ev, content_compatible=True)[1]) for ev in evs]
    msgs.append((0, None, encode_canal_json(Resolved(tso(1_700_000_000_003), pos))[1]))
    produce(urls.kafka, topic, msgs, partitions=1)
    cfg = config(urls, target, "canal-json", topic, schema, tmp_path / "ckpt")  # schema_evolution: the default
    engine = create_engine(target_url(urls, target))
    try:
        run(parse_config(cfg), until_caught_up=True, spark=spark, progress=False)
        assert inspect(engine).get_pk_constraint("bag", schema=schema)["constrained_columns"] == []
        with engine.connect() as c:
            got = sorted(tuple(r) for r in c.execute(text(f"SELECT v, note FROM {_q(target, schema)}.bag")))
        assert got == [(1, "x"), (2, None)]
    finally:
        engine.dispose()
