"""The peer bench's pure parts (applier.devtools.bench_peer, applier.devtools.peers.debezium_jdbc) and the bench's
Debezium stream (applier.devtools.bench_stream, protocol "debezium") against the applier's own decoder. The sink
itself runs in tests/e2e/test_bench_peer.py."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import orjson
import pytest

from applier.codecs.debezium import DebeziumDecoder
from applier.devtools import bench_peer
from applier.devtools.bench_stream import (BENCH_COLUMN_NAMES, DEBEZIUM_BENCH_COLUMN_NAMES, TableChecksum,
                                           bench_row_digest, bench_table_ddl, generate_bench)
from applier.devtools.encoders.debezium import encode_debezium
from applier.devtools.peers import debezium_jdbc as dj
from applier.events import DDL, KafkaMessage, Op, Resolved, RowChange, SourcePosition

POS = SourcePosition("t", 0, 0)


# ---- the jars ------------------------------------------------------------------------------------------------

def test_the_pom_lists_connect_the_connector_and_the_drivers_at_their_pinned_versions() -> None:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    root = ET.fromstring(dj.sink_pom())
    assert root.findtext("m:packaging", namespaces=ns) == "pom"
    deps = {(d.findtext("m:groupId", namespaces=ns), d.findtext("m:artifactId", namespaces=ns)):
            d.findtext("m:version", namespaces=ns) for d in root.iterfind("m:dependencies/m:dependency", ns)}
    assert deps[("org.apache.kafka", "connect-runtime")] == "4.1.1"
    assert deps[("org.apache.kafka", "connect-json")] == "4.1.1"
    assert deps[("io.debezium", "debezium-connector-jdbc")] == "3.5.0.Final"
    assert deps[("org.mariadb.jdbc", "mariadb-java-client")] == "3.5.7"
    assert deps[("org.postgresql", "postgresql")] == "42.7.8"
    assert deps[("org.apache.groovy", "groovy-jsr223")] == dj.GROOVY_VERSION
    assert ("org.apache.logging.log4j", "log4j-slf4j-impl") in deps  # Kafka's slf4j 1.7 needs a binding
    # debezium-scripting's parent POM is missing from the registry: it is fetched apart (scripting_jar)
    assert ("io.debezium", "debezium-scripting") not in deps


def test_the_cache_folder_names_every_pinned_version(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("APPLIER_HOME", str(tmp_path))
    folder = dj.jars_folder()
    assert folder.parent == tmp_path / "jars"
    for v in (dj.DEBEZIUM_VERSION, dj.CONNECT_VERSION, dj.MARIADB_DRIVER_VERSION, dj.POSTGRES_DRIVER_VERSION):
        assert v in folder.name
    assert dj.resolution_facts() == {}  # nothing resolved there yet


# ---- worker and connector properties ------------------------------------------------------------------------------

def _props(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            k, _, v = line.partition("=")
            out[k] = v
    return out


def test_worker_properties(tmp_path) -> None:
    p = _props(dj.worker_properties(bootstrap="127.0.0.1:19092", offsets_file=tmp_path / "o", rest_port=18123))
    assert p["bootstrap.servers"] == "127.0.0.1:19092"
    for side in ("key", "value"):
        assert p[f"{side}.converter"] == "org.apache.kafka.connect.json.JsonConverter"
        assert p[f"{side}.converter.schemas.enable"] == "true"
    assert p["offset.storage.file.filename"] == str(tmp_path / "o")
    assert p["offset.flush.interval.ms"] == "1000"
    assert p["connector.client.config.override.policy"] == "All"
    assert p["listeners"] == "http://127.0.0.1:18123"
    assert p["config.providers.env.class"].endswith("EnvVarConfigProvider")


def test_connector_config_has_the_measured_settings_and_no_password() -> None:
    doc = dj.connector_config(name="applier-peer-x", topic="bench-x", partitions=6, jdbc="jdbc:mariadb://h:1/s",
                              user="u", schema="s")
    cfg = doc["config"]
    assert doc["name"] == "applier-peer-x"
    assert cfg["connector.class"] == "io.debezium.connector.jdbc.JdbcSinkConnector"
    assert cfg["tasks.max"] == "6" and cfg["topics"] == "bench-x"
    assert (cfg["insert.mode"], cfg["delete.enabled"], cfg["primary.key.mode"], cfg["schema.evolution"]) == (
        "upsert", "true", "record_key", "basic")
    assert cfg["collection.name.format"] == "s.${source.table}"
    assert cfg["database.time_zone"] == "UTC"
    assert cfg["batch.size"] == cfg["consumer.override.max.poll.records"] == "2000"
    assert cfg["transforms"] == "dropSchemaChanges"
    assert cfg["transforms.dropSchemaChanges.type"] == "io.debezium.transforms.SchemaChangeEventFilter"
    assert set(cfg["transforms.dropSchemaChanges.schema.change.event.exclude.list"].split(",")) == {
        "DATABASE", "CREATE", "ALTER", "DROP", "TRUNCATE"}
    assert cfg["connection.password"] == "${env:" + dj.PASSWORD_ENV + "}"
    assert "field.exclude.list" not in cfg


def test_connector_config_with_the_tidb_extension_drops_the_watermarks() -> None:
    cfg = dj.connector_config(name="n", topic="t", partitions=1, jdbc="j", user=None, schema="s",
                              tidb_extension=True, exclude=["t:at"], extra={"batch.size": "500"})["config"]
    assert cfg["transforms"] == "dropSchemaChanges,dropWatermarks"
    assert cfg["transforms.dropWatermarks.type"] == "io.debezium.transforms.Filter"
    assert cfg["transforms.dropWatermarks.language"] == "jsr223.groovy"
    assert cfg["transforms.dropWatermarks.condition"] == "value.op != 'm'"
    assert cfg["field.exclude.list"] == "t:at"
    assert cfg["batch.size"] == "500"
    assert "connection.username" not in cfg
    with pytest.raises(ValueError):
        dj.connector_config(name="n", topic="t", partitions=0, jdbc="j", user=None, schema="s")


def test_time_and_bit_columns_are_excluded_by_topic_and_name() -> None:
    types = {"id": "bigint", "at": "time(3)", "flags": "bit(8)", "b1": "BIT", "t": "timestamp", "d": "datetime(6)"}
    assert dj.excluded_fields("tp", types) == ["tp:at", "tp:b1", "tp:flags"]
    assert dj.excluded_fields("tp", {"id": "bigint"}) == []


def test_jdbc_url_from_the_applier_url() -> None:
    assert dj.jdbc_url("mysql+pymysql://u:p@127.0.0.1:13306/applier", "s1") == (
        "jdbc:mariadb://127.0.0.1:13306/s1", "u", "p")
    assert dj.jdbc_url("postgresql+psycopg://u:p@127.0.0.1:15432/applier", "s1") == (
        "jdbc:postgresql://127.0.0.1:15432/applier", "u", "p")
    with pytest.raises(ValueError):
        dj.jdbc_url("sqlite:///x.db", "s")


def test_every_run_has_a_group_of_its_own() -> None:
    a, b = dj.connector_name("run 1/x"), dj.connector_name("run 2/x")
    assert a != b and dj.consumer_group(a) == "connect-" + a
    assert " " not in a and "/" not in a


# ---- caught up ------------------------------------------------------------------------------------------------

def test_lag_and_caught_up_from_committed_offsets() -> None:
    ends = {0: (0, 100), 1: (0, 50), 2: (10, 10)}  # partition 2 holds nothing (retention moved its start)
    assert dj.lag({}, ends) == 150
    assert dj.lag({0: None, 1: -1001}, ends) == 150  # nothing committed yet
    assert dj.lag({0: 60, 1: 50}, ends) == 40
    assert not dj.caught_up({0: 99, 1: 50}, ends)
    assert dj.caught_up({0: 100, 1: 50}, ends)  # the empty partition never needs a commit
    assert dj.caught_up({0: 100, 1: 50, 2: None}, ends)
    assert dj.lag({0: 5}, {0: (20, 30)}) == 10  # a commit below the first offset counts from the first offset


def _row(op=Op.INSERT, ts=1 << 18):
    from applier.devtools.bench_stream import BENCH_COLUMNS, bench_row
    row = {c: v for c, v in bench_row(0, 1, 1).items() if c in DEBEZIUM_BENCH_COLUMN_NAMES}
    cols = tuple(c for c in BENCH_COLUMNS if c.name in DEBEZIUM_BENCH_COLUMN_NAMES)
    return RowChange("bench", "t00", ts, op, row if op is Op.DELETE else None,
                     None if op is Op.DELETE else row, cols, POS)


def test_only_row_changes_reach_the_sink() -> None:
    _, row = encode_debezium(_row(), ts_ms=1)
    _, delete = encode_debezium(_row(Op.DELETE), ts_ms=1)
    _, ddl = encode_debezium(DDL("bench", "t00", 1 << 18, bench_table_ddl("t00"), POS, ddl_type=3),
                             table_columns=_row().columns, ts_ms=1)
    _, mark = encode_debezium(Resolved(5 << 18, POS), enable_tidb_extension=True, ts_ms=1)
    assert dj.reaches_sink(row) and dj.reaches_sink(delete)
    assert not dj.reaches_sink(ddl) and not dj.reaches_sink(mark)
    assert dj.reaches_sink(None) and dj.reaches_sink(b"not json")


def test_sink_ends_stop_after_the_last_row_change() -> None:
    _, row = encode_debezium(_row(), ts_ms=1)
    _, mark = encode_debezium(Resolved(5 << 18, POS), enable_tidb_extension=True, ts_ms=1)
    _, ddl = encode_debezium(DDL("bench", "t00", 1 << 18, bench_table_ddl("t00"), POS, ddl_type=3),
                             table_columns=_row().columns, ts_ms=1)
    logs = {0: [ddl] + [row] * 10 + [mark] * 3,  # ends with watermarks
            1: [ddl] + [row] * 5,  # ends with a row
            2: [ddl, ddl],  # no row at all
            3: [row] + [mark] * 300}  # the row is far back: the window grows
    reads = []

    def read(p, start, stop):
        reads.append((p, start, stop))
        return list(enumerate(logs[p]))[start:stop]

    ends = {p: (0, len(v)) for p, v in logs.items()}
    assert dj.sink_ends(ends, read, window=4) == {0: (0, 11), 1: (0, 6), 2: (0, 0), 3: (0, 1)}
    assert [r for r in reads if r[0] == 3] == [(3, 297, 301), (3, 281, 297), (3, 217, 281), (3, 0, 217)]


def test_failures_name_each_failed_task_with_its_causes() -> None:
    trace = ("org.apache.kafka.connect.errors.ConnectException: Exiting WorkerSinkTask\n\tat a.b(C.java:1)\n"
             "Caused by: org.apache.kafka.connect.errors.DataException: after is not a valid field name\n\tat x.y\n")
    status = {"connector": {"state": "RUNNING"},
              "tasks": [{"id": 0, "state": "RUNNING"}, {"id": 1, "state": "FAILED", "trace": trace}]}
    out = dj.failures(status)
    assert len(out) == 1 and out[0].startswith("task 1 FAILED: org.apache.kafka.connect.errors.ConnectException")
    assert "after is not a valid field name" in out[0] and "at x.y" not in out[0]
    assert dj.failures({"connector": {"state": "FAILED", "trace": "boom"}, "tasks": []}) == ["connector FAILED: boom"]
    assert dj.failures(None) == [] and dj.failures({"connector": {"state": "RUNNING"}, "tasks": []}) == []


# ---- the Debezium bench stream ------------------------------------------------------------------------------------

def _apply(wl, messages, decoder) -> dict[str, dict[int, dict]]:
    """What a consumer applying each partition in offset order ends with (each key stays in one partition)."""
    state: dict[str, dict[int, dict]] = {t: {} for t in wl.table_names}
    offsets: dict[int, int] = {}
    for part, key, value in messages:
        off = offsets[part] = offsets.get(part, -1) + 1
        for ev in decoder.decode(KafkaMessage("topic", part, off, key, value)):
            if isinstance(ev, RowChange):
                if ev.op is Op.DELETE:
                    state[ev.table].pop(ev.before["id"], None)
                else:
                    state[ev.table][ev.after["id"]] = ev.after
    return state


@pytest.mark.parametrize("ext", [False, True])
def test_the_debezium_stream_decodes_to_the_expected_tables(ext) -> None:
    wl = generate_bench("debezium", tables=3, partitions=3, events=1500, big_txn_rows=200, seed=5, hot_keys=4,
                        dup_fraction=0.05, tidb_extension=ext)
    messages = list(wl.messages())
    assert wl.stats.duplicate_row_events > 0 and wl.stats.key_changes > 0
    kinds = [orjson.loads(v)["payload"].get("op", "ddl") for _, _, v in messages]
    assert kinds.count("ddl") == 3 * 3  # every CREATE TABLE on every partition
    assert ("m" in kinds) == ext and wl.stats.resolved_messages == kinds.count("m")
    state = _apply(wl, messages, DebeziumDecoder(gated=ext))
    for t in wl.table_names:
        got = TableChecksum(columns=wl.columns)
        for row in state[t].values():
            assert set(row) == set(DEBEZIUM_BENCH_COLUMN_NAMES)
            got.add(row)
        assert (got.rows, got.digest_sum) == (wl.expected[t].rows, wl.expected[t].digest_sum)
        # the final rows the row-by-row verification uses are the same rows
        want = {r["id"]: bench_row_digest(r, wl.columns) for r in wl.final_rows(t)}
        assert want == {k: bench_row_digest(r, wl.columns) for k, r in state[t].items()}


def test_the_simple_stream_decodes_to_the_expected_tables(monkeypatch) -> None:
    """The bench's Simple stream (TiCDC's Simple protocol, JSON) with the whole shape, watermarks and BOOTSTRAPs."""
    from applier.codecs import get_decoder
    from applier.devtools import bench_stream

    monkeypatch.setattr(bench_stream, "SIMPLE_BOOTSTRAP_MESSAGES", 200)
    wl = generate_bench("simple", tables=3, partitions=3, events=1500, big_txn_rows=200, seed=5, hot_keys=4,
                        dup_fraction=0.05)
    messages = list(wl.messages())
    types = [orjson.loads(v)["type"] for _, _, v in messages]
    assert types.count("CREATE") == 3 * 3 and types.count("WATERMARK") == wl.stats.resolved_messages > 0
    assert types.count("BOOTSTRAP") >= 3 * 3  # every table passed 200 rows at least once, to every partition
    assert all(k is None for _, k, _ in messages)  # TiCDC sends Simple messages without a key
    state = _apply(wl, messages, get_decoder("simple"))
    for t in wl.table_names:
        assert {k: bench_row_digest(r) for k, r in state[t].items()} == {
            r["id"]: bench_row_digest(r) for r in wl.final_rows(t)}


def test_the_debezium_shape_avoids_binary_columns() -> None:
    wl = generate_bench("debezium", tables=1, partitions=1, events=10)
    assert "payload" not in wl.columns and "payload" in BENCH_COLUMN_NAMES
    assert wl.column_types["grp"] == "int unsigned" and wl.column_types["amount"] == "decimal(14,2)"
    assert "payload" not in bench_table_ddl("t00", wl.columns)
    first = next(iter(wl.messages()))
    assert "payload" not in orjson.loads(first[2])["payload"]["ddl"]
    with pytest.raises(ValueError):
        generate_bench("canal-json", tidb_extension=True)


def test_other_protocols_keep_the_whole_shape() -> None:
    wl = generate_bench("canal-json", tables=1, partitions=1, events=50, big_txn_rows=0)
    list(wl.messages())
    assert wl.columns == BENCH_COLUMN_NAMES and wl.stats.resolved_messages > 0
    rows = list(wl.final_rows("t00"))
    assert len(rows) == wl.expected["t00"].rows
    assert wl.final_row("t00", rows[0]["id"]) == rows[0] and wl.final_row("t00", 10**9) is None


# ---- the comparison ---------------------------------------------------------------------------------------------

def test_compare_digests_counts_each_kind() -> None:
    out = bench_peer.compare_digests({1: 10, 2: 20, 3: 30}, [(1, 10), (2, 21), (4, 40), (5, None)])
    assert (out["equal"], out["different"], out["unexpected"], out["missing"]) == (1, 1, 2, 1)
    assert ("missing", 3) in out["examples"] and ("different", 2) in out["examples"]


def test_summary_is_the_ratio_of_the_medians() -> None:
    ok = {"ok": True, "differences": 0}
    runs = [{"consumer": "applier", "seconds": 20.0, "verify": ok}, {"consumer": "debezium-jdbc", "seconds": 30.0,
                                                                      "verify": {"ok": False, "differences": 3}},
            {"consumer": "applier", "seconds": 24.0, "verify": ok}, {"consumer": "debezium-jdbc", "seconds": 36.0,
                                                                      "verify": ok}]
    s = bench_peer.summary(runs, "debezium-jdbc")
    assert s["applier_median_seconds"] == 22.0 and s["peer_median_seconds"] == 33.0
    assert s["ratio_peer_to_applier"] == pytest.approx(1.5)
    assert s["applier_verified"] and s["peer_differences"] == [3, 0]


def test_the_report_has_each_time_both_verifications_and_the_ratio() -> None:
    ok = {"ok": True, "differences": 0, "rows_equal": 10, "missing": 0, "unexpected": 0, "different": 0,
          "examples": [], "columns": ["id", "ver"]}
    bad = {**ok, "ok": False, "differences": 2, "rows_equal": 8, "different": 2,
           "examples": ["t00 id 3: different (amount: 1 != 2)"]}
    runs = [{"round": 1, "consumer": "applier", "seconds": 20.0, "loadavg_1m_before": 0.5, "verify": ok},
            {"round": 1, "consumer": "debezium-jdbc", "seconds": 30.0, "loadavg_1m_before": 1.5, "verify": bad,
             "config": dj.connector_config(name="n", topic="t", partitions=6, jdbc="j", user="u", schema="s")["config"]}]
    a = bench_peer.parse_args([])
    report = bench_peer.format_report({
        "params": vars(a), "versions": {"applier": "abc"}, "avoids": ["binary columns (why)"],
        "workload": {"row_events": 100, "duplicate_row_events": 1, "inserts": 60, "updates": 30, "deletes": 10,
                     "messages": 110, "bytes": 2048, "columns": ["id", "ver"]},
        "peer": {"versions": {"debezium-connector-jdbc": dj.DEBEZIUM_VERSION}, "jar_cache": {"jars": 91}},
        "runs": runs, "summary": bench_peer.summary(runs, "debezium-jdbc")})
    assert "binary columns (why)" in report and "tasks.max 6 (= partitions), batch.size 2000" in report
    assert "OK, 10 rows equal (2 columns)" in report and "2 rows differ" in report and "amount: 1 != 2" in report
    assert "ratio debezium-jdbc / applier = 1.50" in report and "1.50" in report


def test_arguments() -> None:
    a = bench_peer.parse_args(["--events", "50k", "--rounds", "3", "--target", "postgres"])
    assert (a.events, a.rounds, a.target, a.peer, a.protocol, a.partitions) == (
        50_000, 3, "postgres", "debezium-jdbc", "debezium", 6)
    assert bench_peer.applier_codec(a) == {}
    assert bench_peer.applier_codec(bench_peer.parse_args(["--tidb-extension"])) == {"gated": True}
    with pytest.raises(SystemExit):
        bench_peer.parse_args(["--rounds", "0"])
