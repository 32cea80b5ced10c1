"""Whole changefeeds made by TiCDC's real encoders, replayed through Kafka and the real pipeline into MariaDB and
PostgreSQL, end equal to the upstream tables (issue 12, point 7).

``../shared/vectors/ticdc-real`` holds, for every protocol, the messages TiCDC's own encoders produced for 300
transactions on three tables (every MySQL column type; a NONCLUSTERED VARCHAR key with a unique key; a composite
key with a nullable unique key; unique-key-changing updates split as TiCDC splits them; an ADD COLUMN halfway),
partitioned by TiCDC's dispatchers, and the tables as TiDB holds them at the end. Each variant goes into a topic
with its three partitions, the pipeline runs until caught up, and every table is compared value by value under
docs/value-rules.md, with a protocol's documented losses (tests/e2e/ticdc_real.py) and nothing else.

Debezium carries DECIMAL as float64: the DECIMAL(38,10) value -9999999999999999999999999999.9999999999 arrives as
-1e28, which the column cannot hold. Under the default policy the run stops naming that row (its key and the
event that set it); quarantining it under its key while the rest applies is issue 12's blocking quarantine."""

from __future__ import annotations

import json
import struct
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.config import parse_config
from applier.devtools.changefeed import produce
from applier.events import KafkaMessage
from applier.pipeline import run
from applier.quarantine import RowQuarantine
from applier.sinks import ApplyError
from tests.e2e.canonical import read_back
from tests.e2e.helpers import target_url
from tests.e2e.ticdc_real import VARIANTS, FileRegistry, column_types, expected, expected_rows, messages

pytestmark = pytest.mark.e2e

TARGETS = ["mariadb", "postgres"]
TABLES = ("t_types", "t_str", "t_comp")
EXACT = [v for v in VARIANTS if not v.startswith("debezium")]


def _settings(urls, target: str, variant: str, topic: str, schema: str, ckpt, codec: dict, **target_opts):
    protocol, _ = VARIANTS[variant]
    return parse_config({
        "pipeline": {"name": f"real-{topic}", "checkpoint_dir": str(ckpt), "max_offsets_per_trigger": 400},
        "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": protocol, "codec": codec},
        "target": {"url": target_url(urls, target), **target_opts},
        "route": [{"match": "hold.*", "schema": schema}],
    })


def _codec(variant: str) -> dict:
    _, opts = VARIANTS[variant]
    return {k: v for k, v in opts.items()}


def _reregister(msgs: list[KafkaMessage], topic: str, registry) -> list[KafkaMessage]:
    """The Avro messages name the schema ids TiCDC's registry gave; register those schemas in the local registry
    and point each row message at the id it got here (the Confluent header: magic byte 0, 4-byte id)."""
    source = FileRegistry()
    ids = {}
    for subject, versions in source.subjects.items():
        role = subject.rsplit("-", 1)[1]
        for old in versions:
            ids[old] = registry.register(f"{topic}-{role}", source.schemas[old])

    def rewrite(b: bytes | None) -> bytes | None:
        if b is None or b[:1] != b"\x00":  # TiCDC's DDL and watermark messages (magic byte 1) name no schema
            return b
        return b[:1] + struct.pack(">I", ids[struct.unpack(">I", b[1:5])[0]]) + b[5:]

    return [KafkaMessage(m.topic, m.partition, m.offset, rewrite(m.key), rewrite(m.value)) for m in msgs]


def _replay(urls, spark, request, tmp_path, variant: str, target: str, topic: str, schema: str, **target_opts):
    msgs = messages(variant, topic)
    codec = _codec(variant)
    if VARIANTS[variant][0] == "avro":
        registry = request.getfixturevalue("registry")
        msgs = _reregister(msgs, topic, registry)
        codec["registry_url"] = registry.url
    produce(urls.kafka, topic, [(m.partition, m.key, m.value) for m in msgs], partitions=3)
    return _settings(urls, target, variant, topic, schema, tmp_path / "ckpt", codec, **target_opts)


@pytest.fixture
def replay(urls, spark, unique, drop_schema, tmp_path, request):
    """replay(variant, target, **target options) -> (settings, engine, schema, topic): the variant produced into
    a fresh topic, a fresh target schema dropped afterwards, the settings of a pipeline that applies it."""
    engines = []

    def make(variant: str, target: str, tag: str = "", **target_opts):
        topic = f"real{tag}-{variant}-{target}-{unique}"
        schema = f"real_{unique}"
        drop_schema((target, schema))
        settings = _replay(urls, spark, request, tmp_path, variant, target, topic, schema, **target_opts)
        engines.append(create_engine(target_url(urls, target)))
        return settings, engines[-1], schema, topic

    yield make
    for e in engines:
        e.dispose()


def _differences(target: str, engine, schema: str, protocol: str, *, leave_out=frozenset()) -> list[str]:
    """Every difference between the replica and TiDB's final tables, but for the keys in ``leave_out``
    ((table, key tuple) pairs)."""
    out = []
    for table in TABLES:
        key, want = expected_rows(target, protocol, table)
        got = read_back(target, engine, schema, table, column_types(table), tuple(key))
        for t, k in leave_out:
            if t == table:
                want.pop(k, None)
                got.pop(k, None)
        if set(got) != set(want):
            out.append(f"{table}: missing keys {sorted(set(want) - set(got))[:5]}, "
                       f"extra keys {sorted(set(got) - set(want))[:5]}")
        for k in sorted(set(got) & set(want)):
            cols = [c for c in want[k] if got[k][c] != want[k][c]]
            if cols:
                out.append(f"{table} {k}: " + ", ".join(f"{c} {got[k][c]!r} != {want[k][c]!r}" for c in cols))
    return out


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("variant", EXACT)
def test_a_real_ticdc_changefeed_replicates_exactly(spark, replay, variant, target) -> None:
    settings, engine, schema, _ = replay(variant, target)
    res = run(settings, until_caught_up=True, spark=spark, progress=False)
    assert res.batches > 1 and res.report.applied.rows > 0
    assert _differences(target, engine, schema, VARIANTS[variant][0]) == []
    with engine.connect() as c:
        applied = c.execute(select(P.pipelines.c.applied_ts)
                            .where(P.pipelines.c.pipeline == settings.pipeline.name)).scalar()
        ddl = c.execute(select(P.ddl_history.c.state, P.ddl_history.c.query)
                        .where(P.ddl_history.c.pipeline == settings.pipeline.name)).all()
    assert applied >= expected()["final_ts"]  # every transaction is applied, as of the last watermark
    assert sorted(q.split()[0] for s, q in ddl if s == "done") == ["ALTER", "CREATE", "CREATE", "CREATE", "CREATE"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("variant", ["debezium", "debezium-no-bit"])
def test_a_real_debezium_changefeed_stops_naming_the_decimal_row_the_target_cannot_hold(spark, replay, variant,
                                                                                       target) -> None:
    settings, engine, schema, topic = replay(variant, target)
    with pytest.raises(ApplyError) as err:
        run(settings, until_caught_up=True, spark=spark, progress=False)
    msg = str(err.value)
    assert f"upstream table hold.t_types into {schema}.t_types" in msg, msg
    assert "Out of range value for column 'c_decimal'" in msg or "numeric field overflow" in msg, msg
    assert "The refused row: id=" in msg and f"(set by the event at topic={topic} partition=" in msg, msg
    # the row is the one whose DECIMAL(38,10) float64 cannot hold: upstream -9999999999999999999999999999.9999999999
    refused = int(msg.split("The refused row: id=")[1].split(" ")[0])
    _, want = expected_rows(target, "open", "t_types")
    assert abs(want[(refused,)]["c_decimal"]) > 10**27


@pytest.mark.parametrize("target", TARGETS)
def test_under_quarantine_the_decimal_row_is_held_under_its_key_and_everything_else_applies(spark, replay,
                                                                                           target) -> None:
    """Issue 12's blocking quarantine on a real stream: the refused row and every later change of its key are
    held in applier_quarantined_rows; every other row of every table ends equal to upstream."""
    settings, engine, schema, _ = replay("debezium", target, tag="-q", on_apply_error="quarantine")
    res = run(settings, until_caught_up=True, spark=spark, progress=False)
    assert res.report.applied.quarantined_rows > 0
    with engine.connect() as c:
        held = RowQuarantine(settings.pipeline.name).find(c)
    assert held and {h.table for h in held} == {"t_types"}
    refused = [h for h in held if h.kind == "refused"]
    assert all("c_decimal" in h.reason or "numeric field overflow" in h.reason for h in refused), refused
    # every held key met a DECIMAL(38,10) that travelled as a float64 of 1e28 or more (the refused row is
    # the key's last version in its batch; the key's changes of that batch and all later ones are held)
    by_key: dict[str, list] = {}
    for h in held:
        by_key.setdefault(h.row_key, []).append(h)
    for k, hs in by_key.items():
        assert any(h.change().after and abs(h.change().after["c_decimal"] or 0) >= Decimal("1e28")
                   for h in hs), k
        assert hs[0].kind == "refused" and all(h.kind == "blocked" for h in hs[1:]), k
        assert [h.commit_ts for h in hs] == sorted(h.commit_ts for h in hs), k
    held_keys = {("t_types", tuple(json.loads(k))) for k in by_key}
    assert _differences(target, engine, schema, "debezium", leave_out=held_keys) == []
