"""Configuration: validation, error keys and messages, secrets masking, example configs."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from applier.config import (
    OWNED_KAFKA_KEYS,
    ConfigError,
    Settings,
    load_config,
    parse_config,
)
from applier.pipeline import router_for
from applier.routing import Router, Rule

REPO = Path(__file__).resolve().parents[2]
CONF_DIR = REPO / "conf"

PASSWORD = "Sup3r-s3cret/p@ss:word%"
ENV = {"REPLICA_PASSWORD": PASSWORD}


def base() -> dict:
    return {
        "pipeline": {"name": "shop-replica", "checkpoint_dir": "/var/lib/applier/shop-replica"},
        "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["tidb-shop"], "protocol": "canal-json"},
        "target": {
            "url": "postgresql+psycopg://replica@127.0.0.1:5432/replica",
            "password_env": "REPLICA_PASSWORD",
        },
    }


def with_(path: str, value, data: dict | None = None) -> dict:
    """A copy of ``data`` (default: base()) with ``path`` ("a.b.c") set; value ``DELETE`` removes it."""
    data = copy.deepcopy(base() if data is None else data)
    *parents, last = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return data


DELETE = object()


def parse(data: dict, env: dict | None = None, **kw) -> Settings:
    return parse_config(data, env=ENV if env is None else env, **kw)


def error_for(data: dict, env: dict | None = None, **kw) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(data, env, **kw)
    err = info.value
    assert PASSWORD not in str(err)
    assert PASSWORD not in err.message
    return err


# --------------------------------------------------------------------------------------------------
# Valid configurations
# --------------------------------------------------------------------------------------------------


def test_minimal_config_and_defaults(tmp_path):
    s = parse(base(), base_dir=tmp_path)
    assert s.pipeline.name == "shop-replica"
    assert s.pipeline.checkpoint_dir == "/var/lib/applier/shop-replica"
    assert s.pipeline.buffer_memory_mb == 512
    assert s.pipeline.buffer_memory_bytes == 512 * 1024 * 1024
    assert s.pipeline.spill_dir == Path("/var/lib/applier/shop-replica/spill")
    assert s.pipeline.on_decode_error == "stop"
    assert s.pipeline.trigger_interval == "500 milliseconds"  # round 4: halves the wait for the next trigger
    assert s.pipeline.trigger_interval_ms == 500
    assert s.pipeline.max_offsets_per_trigger is None
    assert s.source.topics == ("tidb-shop",)
    assert s.source.topic_pattern is None
    assert s.source.protocol == "canal-json"
    assert s.source.starting_offsets == "earliest"
    assert dict(s.source.kafka) == {}
    assert s.target.batch_rows == 5000
    assert s.target.on_unsupported_ddl == "stop"
    assert s.target.schema == ""
    assert s.target.dialect == "postgresql"
    assert s.target.drivername == "postgresql+psycopg"
    assert s.spark.master == "local[2]"
    assert dict(s.spark.conf) == {}
    assert s.routes == ()
    assert s.source_path is None


def test_full_config():
    data = base()
    data["pipeline"].update(
        buffer_memory_mb=64,
        spill_dir="/tmp/spill",
        on_decode_error="quarantine",
        trigger_interval="500 ms",
        max_offsets_per_trigger=1000,
    )
    data["source"].update(starting_offsets="latest", kafka={"security.protocol": "SSL", "fetch.min.bytes": 1, "check.crcs": True})
    data["target"].update(batch_rows=100, on_unsupported_ddl="skip", schema="replica")
    data["spark"] = {"master": "local[4]", "conf": {"spark.sql.shuffle.partitions": 4, "spark.memory.fraction": 0.5, "spark.ui.enabled": False}}
    data["route"] = [{"match": "shop.*", "schema": "shop_copy", "table": "{table}"}, {"match": "shop.tmp", "ignore": True}]
    s = parse(data)
    assert s.pipeline.spill_dir == Path("/tmp/spill")
    assert s.pipeline.on_decode_error == "quarantine"
    assert (s.pipeline.trigger_interval, s.pipeline.trigger_interval_ms) == ("500 milliseconds", 500)
    assert s.pipeline.max_offsets_per_trigger == 1000
    assert s.source.starting_offsets == "latest"
    assert dict(s.source.kafka) == {"security.protocol": "SSL", "fetch.min.bytes": "1", "check.crcs": "true"}
    assert s.target.schema == "replica"
    assert dict(s.spark.conf) == {
        "spark.sql.shuffle.partitions": "4",
        "spark.memory.fraction": "0.5",
        "spark.ui.enabled": "false",
    }
    assert s.routes == (
        Rule("shop.*", schema="shop_copy", table="{table}", name="route[0]"),
        Rule("shop.tmp", ignore=True, name="route[1]"),
    )
    router = router_for(s)
    assert isinstance(router, Router)
    assert router.route("shop", "a") == ("shop_copy", "a")
    assert router.route("shop", "tmp") is None
    assert router.route("crm", "a") == ("replica", "a")


def test_spark_options():
    data = with_("source.kafka", {"security.protocol": "SASL_SSL"})
    s = parse(data)
    assert s.source.subscription() == ("subscribe", "tidb-shop")
    assert s.source.spark_options() == {
        "kafka.bootstrap.servers": "127.0.0.1:9092",
        "subscribe": "tidb-shop",
        "kafka.security.protocol": "SASL_SSL",
        "kafka.max.poll.records": "5000",  # the consumer defaults (CONSUMER_DEFAULTS)
        "kafka.max.partition.fetch.bytes": str(4 << 20),
    }
    own = parse(with_("source.kafka", {"max.poll.records": "500", "max.partition.fetch.bytes": "1048576"}))
    assert own.source.spark_options()["kafka.max.poll.records"] == "500"  # [source.kafka] wins
    assert own.source.spark_options()["kafka.max.partition.fetch.bytes"] == "1048576"
    data = with_("source.topics", DELETE, data)
    data["source"]["topic_pattern"] = "tidb-.*"
    assert parse(data).source.subscription() == ("subscribePattern", "tidb-.*")


def test_settings_are_frozen():
    s = parse(base())
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.pipeline = None  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.target.batch_rows = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.source.kafka["x"] = "y"  # type: ignore[index]


@pytest.mark.parametrize(
    "text,canonical,ms",
    [
        ("1 second", "1 second", 1000),
        ("10 seconds", "10 seconds", 10_000),
        ("10seconds", "10 seconds", 10_000),
        ("2 s", "2 seconds", 2000),
        ("250 ms", "250 milliseconds", 250),
        ("1 millisecond", "1 millisecond", 1),
        ("3 minutes", "3 minutes", 180_000),
        ("1 min", "1 minute", 60_000),
        (" 5 SECONDS ", "5 seconds", 5000),
    ],
)
def test_trigger_interval_forms(text, canonical, ms):
    s = parse(with_("pipeline.trigger_interval", text))
    assert (s.pipeline.trigger_interval, s.pipeline.trigger_interval_ms) == (canonical, ms)


@pytest.mark.parametrize("servers", ["kafka:9092", "a:1,b:65535", "10.0.0.1:9092, 10.0.0.2:9092", "[::1]:9092", "my_host.local:19092"])
def test_valid_bootstrap_servers(servers):
    assert parse(with_("source.bootstrap_servers", servers)).source.bootstrap_servers == servers


@pytest.mark.parametrize("driver,dialect", [("mysql+pymysql", "mysql"), ("mariadb+pymysql", "mariadb"), ("postgresql+psycopg", "postgresql")])
def test_supported_drivers(driver, dialect):
    s = parse(with_("target.url", f"{driver}://replica@db:1234/replica"))
    assert s.target.dialect == dialect
    assert s.target_url().drivername == driver


def test_protocol_open():
    assert parse(with_("source.protocol", "open")).source.protocol == "open"


# --------------------------------------------------------------------------------------------------
# Missing, unknown and mistyped keys
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,key,fragment",
    [
        ("pipeline", "pipeline", "[pipeline]"),
        ("source", "source", "[source]"),
        ("target", "target", "[target]"),
        ("pipeline.name", "pipeline.name", 'name = "shop-replica"'),
        ("pipeline.checkpoint_dir", "pipeline.checkpoint_dir", "checkpoint_dir ="),
        ("source.bootstrap_servers", "source.bootstrap_servers", "bootstrap_servers ="),
        ("source.protocol", "source.protocol", 'protocol = "canal-json"'),
        ("source.topics", "source.topics", "topic_pattern"),
        ("target.url", "target.url", "postgresql+psycopg://"),
    ],
)
def test_missing_required(path, key, fragment):
    err = error_for(with_(path, DELETE))
    assert err.key == key
    assert "missing" in err.message
    assert fragment in err.message


@pytest.mark.parametrize(
    "path,key,suggestion",
    [
        ("pipelne", "pipelne", "'pipeline'"),
        ("routes", "routes", "'route'"),
        ("pipeline.nmae", "pipeline.nmae", "'name'"),
        ("pipeline.buffer_memory", "pipeline.buffer_memory", "'buffer_memory_mb'"),
        ("source.protocl", "source.protocl", "'protocol'"),
        ("source.topic", "source.topic", "'topics'"),
        ("target.passwd_env", "target.passwd_env", "'password_env'"),
        ("target.batch_size", "target.batch_size", "'batch_rows'"),
        ("spark.confs", "spark.confs", "'conf'"),
    ],
)
def test_unknown_keys_suggest_the_closest(path, key, suggestion):
    err = error_for(with_(path, "x"))
    assert err.key == key
    assert "unknown" in err.message
    assert f"did you mean {suggestion}" in err.message


def test_unknown_key_without_close_match_lists_valid_keys():
    err = error_for(with_("pipeline.zzzzzz", 1))
    assert err.key == "pipeline.zzzzzz"
    assert "did you mean" not in err.message
    assert "checkpoint_dir" in err.message


def test_unknown_route_key():
    err = error_for(with_("route", [{"match": "a.b"}, {"mach": "a.b"}]))
    assert err.key == "route[1].mach"
    assert "'match'" in err.message


@pytest.mark.parametrize(
    "path,value,key,expected",
    [
        ("pipeline", "x", "pipeline", "expected a table"),
        ("pipeline.name", 5, "pipeline.name", "expected a string"),
        ("pipeline.buffer_memory_mb", "512", "pipeline.buffer_memory_mb", "expected an integer, got a string"),
        ("pipeline.buffer_memory_mb", True, "pipeline.buffer_memory_mb", "expected an integer, got a boolean"),
        ("pipeline.buffer_memory_mb", 1.5, "pipeline.buffer_memory_mb", "expected an integer, got a float"),
        ("pipeline.max_offsets_per_trigger", "10", "pipeline.max_offsets_per_trigger", "expected an integer"),
        ("pipeline.trigger_interval", 1, "pipeline.trigger_interval", "expected a string"),
        ("source.topics", "tidb-shop", "source.topics", "expected an array"),
        ("source.topics", ["a", 1], "source.topics[1]", "expected a string"),
        ("source.kafka", "x", "source.kafka", "expected a table"),
        ("source.kafka", {"fetch.min.bytes": 1.5}, 'source.kafka."fetch.min.bytes"', "quote the value"),
        ("source.kafka", {"x": [1]}, "source.kafka.x", "expected a string, integer or boolean"),
        ("target.batch_rows", "5000", "target.batch_rows", "expected an integer"),
        ("target.password_env", 1, "target.password_env", "expected a string"),
        ("spark.master", 2, "spark.master", "expected a string"),
        ("spark.conf", {"a": {"b": 1}}, "spark.conf.a", "expected a string, integer or boolean or float"),
        ("route", {"match": "a.b"}, "route", "[[route]]"),
        ("route", "a.b", "route", "expected [[route]]"),
        ("route", ["a.b"], "route[0]", "expected a table"),
        ("route", [{"match": 1}], "route[0].match", "expected a string"),
        ("route", [{"match": "a.b", "ignore": "yes"}], "route[0].ignore", "expected a boolean"),
        ("route", [{"match": "a.b", "schema": 1}], "route[0].schema", "expected a string"),
        ("route", [{"match": "a.b", "table": True}], "route[0].table", "expected a string"),
    ],
)
def test_wrong_types(path, value, key, expected):
    err = error_for(with_(path, value))
    assert err.key == key
    assert expected in err.message


def test_root_must_be_a_table():
    err = error_for([])  # type: ignore[arg-type]
    assert err.key == "<root>"


# --------------------------------------------------------------------------------------------------
# Invalid values
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path,value,key,fragment",
    [
        ("pipeline.name", "shop replica", "pipeline.name", "A-Z a-z 0-9 _ . -"),
        ("pipeline.name", "", "pipeline.name", "1 to 64"),
        ("pipeline.name", "x" * 65, "pipeline.name", "1 to 64"),
        ("pipeline.name", "a/b", "pipeline.name", "invalid name"),
        ("pipeline.checkpoint_dir", " ", "pipeline.checkpoint_dir", "must not be empty"),
        ("pipeline.buffer_memory_mb", 0, "pipeline.buffer_memory_mb", ">= 1"),
        ("pipeline.buffer_memory_mb", -5, "pipeline.buffer_memory_mb", ">= 1"),
        ("pipeline.on_decode_error", "ignore", "pipeline.on_decode_error", "stop, quarantine, skip"),
        ("pipeline.on_decode_error", "quarantin", "pipeline.on_decode_error", "did you mean 'quarantine'"),
        ("pipeline.trigger_interval", "fast", "pipeline.trigger_interval", '"1 second"'),
        ("pipeline.trigger_interval", "1 hour", "pipeline.trigger_interval", "invalid duration"),
        ("pipeline.trigger_interval", "1.5 seconds", "pipeline.trigger_interval", "whole number"),
        ("pipeline.trigger_interval", "0 seconds", "pipeline.trigger_interval", "positive"),
        ("pipeline.trigger_interval", "-1 second", "pipeline.trigger_interval", "invalid duration"),
        ("pipeline.max_offsets_per_trigger", 0, "pipeline.max_offsets_per_trigger", ">= 1"),
        ("pipeline.spill_dir", "s3a://bucket/x", "pipeline.spill_dir", "local directory"),
        ("source.bootstrap_servers", "", "source.bootstrap_servers", "host:port"),
        ("source.bootstrap_servers", "kafka", "source.bootstrap_servers", "invalid server 'kafka'"),
        ("source.bootstrap_servers", "kafka:", "source.bootstrap_servers", "invalid port"),
        ("source.bootstrap_servers", "kafka:99999", "source.bootstrap_servers", "invalid port"),
        ("source.bootstrap_servers", "kafka:9092,", "source.bootstrap_servers", "invalid server"),
        ("source.bootstrap_servers", "kafka://x:9092", "source.bootstrap_servers", "invalid"),
        ("source.topics", [], "source.topics", "must not be empty"),
        ("source.topics", ["a b"], "source.topics[0]", "invalid Kafka topic name"),
        ("source.topics", [""], "source.topics[0]", "invalid Kafka topic name"),
        ("source.topics", ["a", "a"], "source.topics", "twice"),
        ("source.protocol", "canal", "source.protocol", "supported: avro, canal-json, debezium, open, simple"),
        ("source.protocol", "canal_json", "source.protocol", "did you mean 'canal-json'"),
        ("source.protocol", "Open", "source.protocol", "did you mean 'open'"),
        ("source.starting_offsets", "beginning", "source.starting_offsets", "earliest, latest"),
        ("target.batch_rows", 0, "target.batch_rows", ">= 1"),
        ("target.on_unsupported_ddl", "ignore", "target.on_unsupported_ddl", "stop, skip"),
        ("target.schema", "x" * 65, "target.schema", "64"),
        ("target.schema", " x", "target.schema", "spaces"),
        ("target.password_env", "1BAD", "target.password_env", "invalid environment variable name"),
        ("target.password_env", "", "target.password_env", "invalid environment variable name"),
        ("spark.master", "", "spark.master", "must not be empty"),
    ],
)
def test_invalid_values(path, value, key, fragment):
    err = error_for(with_(path, value))
    assert err.key == key
    assert fragment in err.message


def test_topics_and_pattern_are_exclusive():
    err = error_for(with_("source.topic_pattern", "tidb-.*"))
    assert err.key == "source.topics"
    assert "only one" in err.message


@pytest.mark.parametrize("pattern,fragment", [("(", "invalid regular expression"), ("", "must not be empty")])
def test_invalid_topic_pattern(pattern, fragment):
    data = with_("source.topics", DELETE)
    data["source"]["topic_pattern"] = pattern
    err = error_for(data)
    assert err.key == "source.topic_pattern"
    assert fragment in err.message


@pytest.mark.parametrize("protocol", ["open", "canal-json", "simple", "debezium", "avro"])
def test_every_tidb_protocol_is_accepted(protocol):
    codec = {"registry_url": "http://127.0.0.1:1"} if protocol == "avro" else {}
    data = with_("source.protocol", protocol)
    data["source"]["codec"] = codec
    assert parse_config(data, env=ENV).source.protocol == protocol


def test_codec_options_are_checked_against_the_decoder():
    data = with_("source.protocol", "canal-json")
    data["source"]["codec"] = {"require_tidb_extensoin": False}
    err = error_for(data)
    assert err.key == "source.codec" and "require_tidb_extension" in err.message


def test_registry_password_in_codec_options_is_masked():
    data = with_("source.protocol", "avro")
    data["source"]["codec"] = {"registry_url": "https://reg:Hunter2x9@127.0.0.1:1"}
    s = parse_config(data, env=ENV)
    assert "Hunter2x9" not in repr(s) and "Hunter2x9" not in str(s.redacted())


@pytest.mark.parametrize("key", sorted(OWNED_KAFKA_KEYS))
def test_owned_kafka_keys_are_rejected(key):
    err = error_for(with_("source.kafka", {key: "x"}))
    assert err.key == f'source.kafka."{key}"'
    assert "owned by the applier" in err.message


def test_kafka_prefix_is_rejected_with_hint():
    err = error_for(with_("source.kafka", {"kafka.security.protocol": "SSL"}))
    assert err.key == 'source.kafka."kafka.security.protocol"'
    assert '"security.protocol"' in err.message


@pytest.mark.parametrize("key", ["spark.master", "spark.sql.streaming.checkpointLocation"])
def test_owned_spark_keys_are_rejected(key):
    err = error_for(with_("spark.conf", {key: "x"}))
    assert err.key == f'spark.conf."{key}"'
    assert "owned by the applier" in err.message


@pytest.mark.parametrize(
    "url,fragment",
    [
        ("postgresql://replica@h:5432/replica", "did you mean 'postgresql+psycopg'"),
        ("postgres://replica@h:5432/replica", "did you mean 'postgresql+psycopg'"),
        ("postgresql+psycopg2://replica@h/replica", "did you mean 'postgresql+psycopg'"),
        ("mysql+mysqldb://replica@h/replica", "did you mean 'mysql+pymysql'"),
        ("mysql://replica@h/replica", "did you mean 'mysql+pymysql'"),
        ("sqlite:///x.db", "accepted: mysql+pymysql, mariadb+pymysql, postgresql+psycopg"),
        ("not a url", "not a valid SQLAlchemy URL"),
        ("mysql+pymysql://replica@h:port/replica", "not a valid SQLAlchemy URL"),
        ("mysql+pymysql://replica@/replica", "missing host"),
        ("mysql+pymysql://replica@h:3306", "missing database"),
        ("", "not a valid SQLAlchemy URL"),
    ],
)
def test_invalid_urls(url, fragment):
    err = error_for(with_("target.url", url))
    assert err.key == "target.url"
    assert fragment in err.message


def test_unsupported_driver_message_never_contains_the_password():
    data = with_("target.password_env", DELETE)
    data["target"]["url"] = f"postgres://replica:{PASSWORD}@h/db"
    err = error_for(data)
    assert err.key == "target.url"


def test_unparsable_url_with_literal_password_is_not_echoed():
    data = with_("target.password_env", DELETE)
    data["target"]["url"] = f"mysql+pymysql://replica:{PASSWORD}@h:badport/db"
    err = error_for(data)
    assert err.key == "target.url"


# --------------------------------------------------------------------------------------------------
# Environment and passwords
# --------------------------------------------------------------------------------------------------


def test_password_env_resolves_into_the_url():
    s = parse(base())
    url = s.target_url()
    assert isinstance(url, URL)
    assert url.password == PASSWORD
    assert url.username == "replica"
    assert url.host == "127.0.0.1" and url.port == 5432 and url.database == "replica"
    # the rendered URL round-trips the special characters
    from sqlalchemy.engine import make_url

    assert make_url(url.render_as_string(hide_password=False)).password == PASSWORD


def test_password_env_missing_variable():
    err = error_for(base(), env={})
    assert err.key == "target.password_env"
    assert "REPLICA_PASSWORD" in err.message and "not set" in err.message


def test_password_env_empty_variable():
    err = error_for(base(), env={"REPLICA_PASSWORD": ""})
    assert err.key == "target.password_env"
    assert "empty" in err.message


def test_password_env_conflicts_with_password_in_url():
    err = error_for(with_("target.url", "postgresql+psycopg://replica:${REPLICA_PASSWORD}@h/db"))
    assert err.key == "target.password_env"
    assert "one place" in err.message


def test_env_reference_in_url():
    data = with_("target.password_env", DELETE)
    data["target"]["url"] = "postgresql+psycopg://${DB_USER}:${REPLICA_PASSWORD}@${DB_HOST}:${DB_PORT}/replica"
    s = parse(data, env={**ENV, "DB_USER": "u", "DB_HOST": "db.internal", "DB_PORT": "6432"})
    url = s.target_url()
    assert (url.username, url.password, url.host, url.port) == ("u", PASSWORD, "db.internal", 6432)


def test_env_reference_missing_variable():
    data = with_("target.url", "postgresql+psycopg://replica:${NOPE}@h/db")
    data = with_("target.password_env", DELETE, data)
    err = error_for(data)
    assert err.key == "target.url"
    assert "NOPE" in err.message and "not set" in err.message


def test_env_reference_invalid_name():
    data = with_("target.url", "postgresql+psycopg://replica:${1-x}@h/db")
    err = error_for(data)
    assert err.key == "target.url"
    assert "invalid environment reference" in err.message


def test_env_reference_escape():
    s = parse(with_("source.kafka", {"client.id": "a$${X}b"}))
    assert s.source.kafka["client.id"] == "a${X}b"


def test_env_reference_in_kafka_options():
    jaas = 'ScramLoginModule required username="u" password="${KAFKA_PASSWORD}";'
    s = parse(with_("source.kafka", {"sasl.jaas.config": jaas, "client.id": "${CLIENT}"}), env={**ENV, "KAFKA_PASSWORD": "kafka-secret-pw", "CLIENT": "c1"})
    assert 'password="kafka-secret-pw"' in s.source.kafka["sasl.jaas.config"]
    assert s.source.spark_options()["kafka.client.id"] == "c1"
    red = s.redacted()["source"]["kafka"]
    assert red["sasl.jaas.config"] == "***"
    assert red["client.id"] == "${CLIENT}"  # resolved values from the environment are not shown
    assert "kafka-secret-pw" not in repr(s)
    err = error_for(with_("source.kafka", {"sasl.jaas.config": jaas}), env=ENV)
    assert err.key == 'source.kafka."sasl.jaas.config"'
    assert "KAFKA_PASSWORD" in err.message


def test_env_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("REPLICA_PASSWORD", "from-os-environ")
    assert parse_config(base()).target_url().password == "from-os-environ"


# --------------------------------------------------------------------------------------------------
# Secrets never leak
# --------------------------------------------------------------------------------------------------


def assert_no_password(s: Settings) -> None:
    for text in (repr(s), str(s), json.dumps(s.redacted()), repr(s.target), str(s.target), f"{s}", f"{s!r}"):
        assert PASSWORD not in text
        assert "Sup3r" not in text  # no partial leak either (e.g. URL-quoted forms)


def test_password_masked_everywhere_with_password_env():
    s = parse(base())
    assert_no_password(s)
    assert s.redacted()["target"]["url"] == "postgresql+psycopg://replica:***@127.0.0.1:5432/replica"
    assert s.target_url().password == PASSWORD
    assert PASSWORD not in str(s.target_url())
    assert PASSWORD not in repr(s.target_url())


def test_password_masked_everywhere_with_env_reference_in_url():
    data = with_("target.password_env", DELETE)
    data["target"]["url"] = "postgresql+psycopg://replica:${REPLICA_PASSWORD}@127.0.0.1:5432/replica"
    s = parse(data)
    assert s.target_url().password == PASSWORD
    assert_no_password(s)


def test_password_masked_everywhere_with_literal_password_in_url():
    from urllib.parse import quote

    data = with_("target.password_env", DELETE)
    data["target"]["url"] = f"postgresql+psycopg://replica:{quote(PASSWORD, safe='')}@127.0.0.1:5432/replica"
    s = parse(data, env={})
    assert s.target_url().password == PASSWORD
    assert_no_password(s)


@pytest.mark.parametrize(
    "path",
    ["pipeline.name", "pipeline.on_decode_error", "source.protocol", "source.starting_offsets", "target.on_unsupported_ddl", "pipeline.trigger_interval"],
)
def test_password_never_appears_in_error_messages(path):
    """Even when an operator pastes the password into another key, the message masks it."""
    err = error_for(with_(path, PASSWORD))
    assert err.key == path
    assert "***" in err.message


def test_password_never_appears_in_route_errors():
    err = error_for(with_("route", [{"match": f"{PASSWORD}.*"}]))
    assert err.key == "route[0].match"


def test_secret_looking_options_are_masked():
    s = parse(
        with_(
            "spark.conf",
            {"spark.ssl.keyPassword": "kp-123456", "spark.hadoop.fs.s3a.secret.key": "sk-123456", "spark.app.name": "x"},
            with_("source.kafka", {"ssl.truststore.password": "tp-123456", "ssl.key.password": "kp2-123456", "client.id": "c"}),
        )
    )
    red = s.redacted()
    assert red["spark"]["conf"] == {"spark.ssl.keyPassword": "***", "spark.hadoop.fs.s3a.secret.key": "***", "spark.app.name": "x"}
    assert red["source"]["kafka"] == {"ssl.truststore.password": "***", "ssl.key.password": "***", "client.id": "c"}
    for secret in ("kp-123456", "sk-123456", "tp-123456", "kp2-123456"):
        assert secret not in repr(s)
    # the consumer still gets the real values
    assert s.source.spark_options()["kafka.ssl.truststore.password"] == "tp-123456"
    assert s.spark.conf["spark.ssl.keyPassword"] == "kp-123456"


# --------------------------------------------------------------------------------------------------
# Routes
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "route,key,fragment",
    [
        ({}, "route[1].match", "missing required key"),
        ({"match": "shop"}, "route[1].match", "wrong table pattern"),
        ({"match": "a%b.c"}, "route[1].match", "unexpected special character"),
        ({"match": "/(/.*"}, "route[1].match", "invalid pattern"),
        ({"match": "`x.*"}, "route[1].match", "incomplete quoted identifier"),
        ({"match": ""}, "route[1].match", "empty pattern"),
        ({"match": "a.b", "schema": "{db}"}, "route[1].schema", "unknown placeholder"),
        ({"match": "a.b", "table": ""}, "route[1].table", "must not be empty"),
        ({"match": "a.b", "table": "t" * 65}, "route[1].table", "longer than 64"),
        ({"match": "a.b", "ignore": True, "schema": "x"}, "route[1].schema", "cannot rename"),
        ({"match": "!a.b", "table": "x"}, "route[1].table", "cannot rename"),
        ({"match": "!a.b", "ignore": False}, "route[1].ignore", "contradicts"),
    ],
)
def test_route_errors(route, key, fragment):
    err = error_for(with_("route", [{"match": "ok.*"}, route]))
    assert err.key == key
    assert fragment in err.message
    assert str(err).startswith(f"<config>: {key}: ")


def test_route_bang_and_ignore_true_agree():
    s = parse(with_("route", [{"match": "!a.b", "ignore": True}]))
    assert s.routes[0].ignore


# --------------------------------------------------------------------------------------------------
# Paths, files, errors
# --------------------------------------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


MINIMAL_TOML = """
[pipeline]
name = "p1"
checkpoint_dir = "state/p1"

[source]
bootstrap_servers = "127.0.0.1:9092"
topics = ["t"]
protocol = "open"

[target]
url = "mysql+pymysql://root@127.0.0.1:3306/replica"
password_env = "REPLICA_PASSWORD"
"""


def test_relative_paths_resolve_against_the_config_folder(tmp_path, monkeypatch):
    conf = tmp_path / "etc"
    conf.mkdir()
    path = write(conf / "a.toml", MINIMAL_TOML + '\n')
    monkeypatch.chdir(tmp_path.parent)
    s = load_config(path, env=ENV)
    assert s.pipeline.checkpoint_dir == str(conf / "state" / "p1")
    assert s.pipeline.spill_dir == conf / "state" / "p1" / "spill"
    assert s.source_path == path.resolve()
    text = MINIMAL_TOML.replace('checkpoint_dir = "state/p1"', 'checkpoint_dir = "state/p1"\nspill_dir = "../spill"')
    s = load_config(write(conf / "b.toml", text), env=ENV)
    assert s.pipeline.spill_dir == tmp_path / "spill"


def test_parse_config_relative_paths_use_base_dir(tmp_path):
    data = with_("pipeline.checkpoint_dir", "ck")
    assert parse(data, base_dir=tmp_path).pipeline.checkpoint_dir == str(tmp_path / "ck")


def test_checkpoint_uri_reaches_spark_unchanged_and_local_state_stays_local(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    for uri in ("hdfs://nn:8020/applier/ck", "s3a://bucket/ck", "hdfs://nn:8020/x/"):
        s = parse(with_("pipeline.checkpoint_dir", uri))
        assert s.pipeline.checkpoint_dir == uri  # never squashed to hdfs:/nn:8020/...
        assert s.pipeline.checkpoint_uri == uri
        assert s.pipeline.local_dir == tmp_path / "state" / "applier" / "shop-replica"
        assert s.pipeline.spill_dir == s.pipeline.local_dir / "spill"
    s = parse(with_("pipeline.spill_dir", "/var/tmp/spill", with_("pipeline.checkpoint_dir", "s3a://bucket/ck")))
    assert s.pipeline.spill_dir == Path("/var/tmp/spill")
    s = parse(with_("pipeline.local_dir", "/var/lib/applier/local", with_("pipeline.checkpoint_dir", "s3a://b/ck")))
    assert s.pipeline.local_dir == Path("/var/lib/applier/local")
    assert s.pipeline.spill_dir == Path("/var/lib/applier/local/spill")


def test_file_uri_and_path_checkpoints_are_driver_local():
    s = parse(with_("pipeline.checkpoint_dir", "file:///var/lib/applier/ck"))
    assert s.pipeline.checkpoint_uri == "file:///var/lib/applier/ck"
    assert s.pipeline.local_dir == Path("/var/lib/applier/ck")
    s = parse(with_("pipeline.checkpoint_dir", "/var/lib/applier/ck"))
    assert s.pipeline.checkpoint_uri == "file:///var/lib/applier/ck"  # not the cluster's default file system
    assert s.pipeline.local_dir == Path("/var/lib/applier/ck")
    err = error_for(with_("pipeline.checkpoint_dir", "file://relative/ck"))
    assert err.key == "pipeline.checkpoint_dir" and "file:///" in err.message
    err = error_for(with_("pipeline.local_dir", "hdfs://nn/x"))
    assert err.key == "pipeline.local_dir" and "local directory" in err.message


def test_spark_master_kinds_and_startup_timeout():
    assert parse(with_("spark.master", "local[2]")).spark.is_local
    assert parse(with_("spark.master", "local")).spark.is_local
    s = parse(with_("spark.master", "spark://10.0.0.1:7077"))
    assert not s.spark.is_local and s.spark.startup_timeout_seconds == 120
    assert parse(with_("spark.startup_timeout_seconds", 30)).spark.startup_timeout_seconds == 30
    assert error_for(with_("spark.startup_timeout_seconds", 0)).key == "spark.startup_timeout_seconds"


def test_load_config_missing_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml")
    assert info.value.key == "<file>"
    assert str(info.value) == f"{tmp_path / 'nope.toml'}: <file>: no such file"


def test_load_config_directory(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert "directory" in info.value.message


def test_load_config_syntax_error(tmp_path):
    path = write(tmp_path / "bad.toml", "[pipeline]\nname = \n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.key == "<file>"
    assert "TOML syntax error" in info.value.message
    assert "line 2" in info.value.message


def test_load_config_errors_name_the_file(tmp_path):
    path = write(tmp_path / "c.toml", MINIMAL_TOML.replace('protocol = "open"', 'protocol = "debezum"'))
    with pytest.raises(ConfigError) as info:
        load_config(path, env=ENV)
    assert str(info.value).startswith(f"{path}: source.protocol: ")


def test_config_error_shape():
    err = ConfigError("source.protocol", "bad", source="x.toml")
    assert isinstance(err, Exception)
    assert (err.key, err.message, err.source) == ("source.protocol", "bad", "x.toml")
    assert str(err) == "x.toml: source.protocol: bad"
    assert str(ConfigError("a", "b")) == "<config>: a: b"


def test_parse_config_source_label():
    with pytest.raises(ConfigError) as info:
        parse_config(with_("pipeline.name", DELETE), source="mine.toml", env=ENV)
    assert str(info.value).startswith("mine.toml: pipeline.name: ")


# --------------------------------------------------------------------------------------------------
# Example configurations never rot
# --------------------------------------------------------------------------------------------------

EXAMPLE_ENV = {
    "MARIADB_PASSWORD": "example-mariadb-pw",
    "PG_PASSWORD": "example/pg@pw",
    "KAFKA_PASSWORD": "example-kafka-pw",
    "MYSQL_PASSWORD": "example-mysql-pw",
}


@pytest.mark.parametrize("path", sorted(CONF_DIR.glob("*.toml")), ids=lambda p: p.name)
def test_example_configs_load(path):
    s = load_config(path, env=EXAMPLE_ENV)
    assert s.source_path == path.resolve()
    assert s.target_url().password in EXAMPLE_ENV.values()
    text = repr(s) + json.dumps(s.redacted())
    for secret in EXAMPLE_ENV.values():
        assert secret not in text
    router_for(s).route("shop", "orders")  # the rules compile and route


def test_example_configs_exist():
    names = {p.name for p in CONF_DIR.glob("*.toml")}
    assert {"open-mariadb.toml", "canal-postgres.toml", "compose.toml"} <= names


def test_compose_example_targets_compose_services():
    s = load_config(CONF_DIR / "compose.toml", env={"MYSQL_PASSWORD": "pw"})
    assert s.source.bootstrap_servers == "kafka:9092"
    url = s.target_url()
    assert (url.host, url.port, url.password) == ("mysql", 3306, "pw")
    assert s.target.password_env == "MYSQL_PASSWORD"
    with pytest.raises(ConfigError) as info:
        load_config(CONF_DIR / "compose.toml", env={})
    assert "MYSQL_PASSWORD" in info.value.message


def test_canal_postgres_example_routes():
    r = router_for(load_config(CONF_DIR / "canal-postgres.toml", env=EXAMPLE_ENV))
    assert r.route("orders", "order_item_12") == ("orders", "order_item")
    assert r.route("orders", "customers") == ("orders", "customers")
    assert r.route("orders", "_customers_gho") is None
    assert r.route("audit", "log") is None
    assert r.route("legacy.v1", "t") == ("legacy_v1", "t")
    assert r.route("crm", "users") == ("tidb", "users")
    assert r.route("mysql", "user") is None


def test_open_mariadb_example_routes():
    r = router_for(load_config(CONF_DIR / "open-mariadb.toml", env=EXAMPLE_ENV))
    assert r.route("shop", "orders") == ("shop_replica", "orders")
    assert r.route("shop", "tmp_orders") is None
    assert r.route("shop", "") == ("shop_replica", "")
    assert r.route("crm", "users") == ("crm", "users")


# --------------------------------------------------------------------------------------------------
# Robustness
# --------------------------------------------------------------------------------------------------


def test_settings_pickle_round_trip():
    import pickle

    data = with_("source.kafka", {"security.protocol": "SSL"})
    data["route"] = [{"match": "shop.*", "schema": "copy"}]
    s = parse(data)
    s2 = pickle.loads(pickle.dumps(s))
    assert s2 == s
    assert s2.target_url().password == PASSWORD
    assert router_for(s2).route("shop", "a") == ("copy", "a")
    assert dict(s2.source.kafka) == {"security.protocol": "SSL"}


def test_frozen_map_repr_masks_secret_keys():
    s = parse(with_("source.kafka", {"ssl.key.password": "kp-987654", "client.id": "c"}))
    assert "kp-987654" not in repr(s.source.kafka)
    assert "'client.id': 'c'" in repr(s.source.kafka)


@pytest.mark.parametrize("password", ["it's\\tricky\"x", "ünïcode-pw", "pa ss"])
def test_password_with_special_characters_never_leaks(password):
    env = {"REPLICA_PASSWORD": password}
    s = parse(base(), env=env)
    assert s.target_url().password == password
    for text in (repr(s), str(s), json.dumps(s.redacted())):
        assert password not in text
    with pytest.raises(ConfigError) as info:
        parse(with_("pipeline.name", password), env=env)
    for form in (password, repr(password)[1:-1]):
        assert form not in str(info.value)


def test_on_decode_error_globally_and_per_route() -> None:
    s = parse(with_("route", [{"match": "shop.*", "on_decode_error": "quarantine"}]))
    assert s.pipeline.on_decode_error == "stop" and router_for(s).decode_error_policy("shop", "t") == "quarantine"
    assert router_for(s).decode_error_policy("other", "t") is None
    assert not s.stops_at_decode_error()  # errors are collected so the rule can decide per table
    assert parse(with_("route", [{"match": "shop.*", "on_decode_error": "stop"}])).stops_at_decode_error()
    assert s.redacted()["route"] == [{"match": "shop.*", "on_decode_error": "quarantine"}]
    assert not parse(with_("pipeline.on_decode_error", "skip")).stops_at_decode_error()
    with pytest.raises(ConfigError, match=r"route\[0\]\.on_decode_error.*stop, quarantine, skip"):
        parse(with_("route", [{"match": "shop.*", "on_decode_error": "drop"}]))
    with pytest.raises(ConfigError, match=r"route\[0\]\.on_decode_error.*ignores what it matches"):
        parse(with_("route", [{"match": "!shop.*", "on_decode_error": "skip"}]))


def test_on_apply_error_globally_and_per_route() -> None:
    s = parse(with_("route", [{"match": "shop.*", "on_apply_error": "quarantine"}]))
    assert s.target.on_apply_error == "stop" and router_for(s).apply_error_policy("shop", "t") == "quarantine"
    assert s.redacted()["route"] == [{"match": "shop.*", "on_apply_error": "quarantine"}]
    assert parse(with_("target.on_apply_error", "skip")).target.on_apply_error == "skip"
    with pytest.raises(ConfigError, match="target.on_apply_error"):
        parse(with_("target.on_apply_error", "ignore"))
    with pytest.raises(ConfigError, match=r"route\[0\].on_apply_error: must be one of stop, quarantine, skip"):
        parse(with_("route", [{"match": "shop.*", "on_apply_error": "later"}]))


def test_apply_streams_default_bounds_and_gating() -> None:
    assert parse(base()).target.apply_streams == 1
    assert parse(with_("target.apply_streams", 4)).target.apply_streams == 4
    for bad, fragment in ((0, "must be >= 1"), (17, "at most 16"), ("4", "integer")):
        err = error_for(with_("target.apply_streams", bad))
        assert err.key == "target.apply_streams" and fragment in err.message, err.message
    # canal-json without the TiDB extension has no resolved ts: streams could not stay consistent, nor resume
    ungated = with_("source.codec", {"require_tidb_extension": False}, with_("target.apply_streams", 2))
    err = error_for(ungated)
    assert err.key == "target.apply_streams" and "gated changefeed" in err.message and "apply_streams = 1" in err.message
    assert parse(with_("target.apply_streams", 1, ungated)).target.apply_streams == 1
