"""The real schema registry (Apicurio Registry from Maven Central, Confluent-compatible API) started by
``applier.devtools.services``: register schemas, fetch them by id through applier.codecs.registry, and run the Avro
codec through it.

Only the registry is started here (not Kafka or the databases). If this session started it, it stops it at
the end; a registry that was already running is left running.
"""

from __future__ import annotations

import datetime as dt
import json
import struct
from decimal import Decimal

import pytest

from applier.devtools import services
from applier.codecs import get_decoder
from applier.codecs.avro import AvroDecoder
from applier.codecs.registry import RegistryClient, RegistryError, SchemaNotFound
from applier.devtools.encoders.avro import AvroEncoder, ColumnSpec
from applier.events import Column, DecodeError, KafkaMessage, Op, RowChange, SourcePosition

pytestmark = pytest.mark.e2e

POS = SourcePosition("e2e_avro", 0, 0)


@pytest.fixture(scope="module")
def registry_url():
    before = services.status({"registry"})[0]
    u = services.start({"registry"})
    assert services.status({"registry"})[0].up
    yield u.registry_url
    if not before.up:
        services.stop({"registry"})
        assert not services.status({"registry"})[0].up


def test_registry_is_optional_and_reported(registry_url):
    assert "registry" not in services.normalize_only(None)
    assert "registry" not in [s.name for s in services.status()]
    st = services.status({"registry"})[0]
    assert st.url == registry_url == services.urls().registry_url
    assert registry_url.endswith("/apis/ccompat/v7")


def test_register_and_fetch_by_id(registry_url, unique):
    c = RegistryClient(registry_url, timeout=5, retries=1)
    schema = {"type": "record", "name": f"t{unique}", "namespace": "default.e2e",
              "fields": [{"name": "id", "type": {"type": "int", "connect.parameters": {"tidb_type": "INT"}}}]}
    sid = c.register(f"e2e_{unique}-value", schema)
    assert isinstance(sid, int) and sid >= 0
    fetched = c.schema_by_id(sid)
    assert json.loads(fetched.schema) == schema and fetched.schema_type == "AVRO"
    # Confluent semantics: the same schema under another subject has the same id
    assert c.register(f"e2e_{unique}-other", schema) == sid
    latest = c.latest_version(f"e2e_{unique}-value")
    assert (latest.id, latest.version) == (sid, 1) and json.loads(latest.schema) == schema
    schema2 = dict(schema, fields=schema["fields"] + [
        {"name": "v", "type": ["null", {"type": "string", "connect.parameters": {"tidb_type": "TEXT"}}],
         "default": None}])
    sid2 = c.register(f"e2e_{unique}-value", schema2)
    assert sid2 != sid and c.latest_version(f"e2e_{unique}-value").version == 2
    assert f"e2e_{unique}-value" in c.subjects()
    # a fresh client fetches by id from the server (nothing cached)
    assert json.loads(RegistryClient(registry_url).schema_by_id(sid2).schema) == schema2
    with pytest.raises(SchemaNotFound, match="schema id 987654"):
        c.schema_by_id(987654)
    with pytest.raises(SchemaNotFound, match="subject"):
        c.latest_version(f"nope_{unique}")


def test_wrong_base_path_is_explained(registry_url):
    root = registry_url.rsplit("/apis/", 1)[0]
    with pytest.raises(RegistryError, match="ccompat/v7") as ei:
        RegistryClient(root, retries=0).schema_by_id(1)
    assert not isinstance(ei.value, SchemaNotFound)


def test_avro_codec_through_the_real_registry(registry_url, unique):
    table = f"orders_{unique}"
    cols = (
        Column("id", "bigint", nullable=False, key=True, unsigned=True),
        Column("amount", "decimal", nullable=False),
        Column("note", "text"),
        Column("flags", "set"),
        Column("payload", "varbinary", binary=True),
        Column("created", "datetime", nullable=False),
        Column("ratio", "float"),
    )
    after = {"id": 2**64 - 1, "amount": Decimal("-12345.67"), "note": "größe ✓", "flags": "a,c",
             "payload": b"\x00\xff", "created": dt.datetime(2024, 2, 29, 12, 0, 0, 500), "ratio": 0.1}
    specs = {f"shop.{table}": {"amount": ColumnSpec(precision=12, scale=2),
                               "flags": ColumnSpec(allowed=("a", "b", "c"))}}
    enc = AvroEncoder(RegistryClient(registry_url), column_specs=specs)
    topic = f"shop.{table}"
    msgs = (enc.encode(RowChange("shop", table, 1000, Op.INSERT, None, after, cols, POS), topic)
            + enc.encode(RowChange("shop", table, 1001, Op.UPDATE, after, dict(after, note=None), cols, POS), topic)
            + enc.encode(RowChange("shop", table, 1002, Op.DELETE, after, None, cols, POS), topic))
    dec = get_decoder("avro", registry_url=registry_url)
    evs = []
    for i, (k, v) in enumerate(msgs):
        evs += dec.decode(KafkaMessage(topic, 0, i, k, v))
    ins, upd, dele = evs
    assert (ins.schema, ins.table, ins.op, ins.commit_ts) == ("shop", table, Op.INSERT, 1000)
    assert ins.after == dict(after, ratio=0.1)
    assert (upd.op, upd.after["note"], upd.commit_ts) == (Op.UPDATE, None, 1001)
    assert (dele.op, dele.before, dele.commit_ts) == (Op.DELETE, {"id": 2**64 - 1}, 0)
    # subjects follow TiCDC: <topic with dots as _>-key / -value
    c = RegistryClient(registry_url)
    vid = struct.unpack(">I", msgs[0][1][1:5])[0]
    assert c.latest_version(f"shop_{table}-value").id == vid
    assert c.latest_version(f"shop_{table}-key").id == struct.unpack(">I", msgs[0][0][1:5])[0]
    # an id the registry does not have: a DecodeError naming it and the position
    unknown = b"\x00" + struct.pack(">I", 999999) + b"\x02"
    with pytest.raises(DecodeError, match="schema id 999999") as ei:
        AvroDecoder(registry_url).decode(KafkaMessage(topic, 3, 9, None, unknown))
    assert "partition=3 offset=9" in str(ei.value)
