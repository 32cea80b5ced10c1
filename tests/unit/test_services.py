"""Fast tests of applier.devtools.services' pure helpers (no Maven, no server is started here)."""

from __future__ import annotations

import shlex
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from applier.devtools import services
from applier.devtools.services import ServicesError, Urls, build_urls, env_lines, normalize_only, urls
from applier.devtools.services.databases import MARIADB_BOOTSTRAP_SQL, mariadb_cnf, pg_server_args
from applier.jars import (
    MAVEN_DEPENDENCY_PLUGIN,
    mvn_command,
    parse_repository_layout,
    render_pom,
    shipped_by,
)
from applier.devtools.services.kafka import server_properties

NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def test_render_pom_lists_dependencies_and_managed_versions():
    xml = render_pom(
        "spark-kafka-4.2.0",
        [("org.apache.spark", "spark-sql-kafka-0-10_2.13", "4.2.0")],
        [("org.apache.spark", "spark-token-provider-kafka-0-10_2.13", "4.0.0")],
    )
    root = ET.fromstring(xml)
    assert root.find("m:packaging", NS).text == "pom"
    assert root.find("m:artifactId", NS).text == "spark-kafka-4.2.0"
    deps = root.findall("m:dependencies/m:dependency", NS)
    assert [(d.find("m:artifactId", NS).text, d.find("m:version", NS).text) for d in deps] == [
        ("spark-sql-kafka-0-10_2.13", "4.2.0")
    ]
    managed = root.findall("m:dependencyManagement/m:dependencies/m:dependency", NS)
    assert [m.find("m:version", NS).text for m in managed] == ["4.0.0"]


def test_render_pom_without_managed_has_no_dependency_management():
    xml = render_pom("kafka-4.3.0", [("org.apache.kafka", "kafka_2.13", "4.3.0")])
    assert "dependencyManagement" not in xml
    ET.fromstring(xml)  # well-formed
    with pytest.raises(ValueError):
        render_pom("bad name<", [])


def test_mvn_command_pins_a_3x_dependency_plugin(tmp_path):
    cmd = mvn_command(tmp_path / "out")
    assert cmd[:3] == ["mvn", "-q", "-B"]
    assert f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies" in cmd
    assert MAVEN_DEPENDENCY_PLUGIN.rsplit(":", 1)[1].startswith("3.")
    assert f"-DoutputDirectory={tmp_path / 'out'}" in cmd
    assert "-DincludeScope=runtime" in cmd
    assert "-Dmdep.useRepositoryLayout=true" in cmd


def test_parse_repository_layout():
    root = Path("/x/repo")
    jar = root / "org/apache/kafka/kafka-clients/3.9.2/kafka-clients-3.9.2.jar"
    assert parse_repository_layout(root, jar) == ("org.apache.kafka", "kafka-clients", "3.9.2")
    with pytest.raises(ValueError):
        parse_repository_layout(root, root / "a.jar")


@pytest.mark.parametrize(
    "artifact, expected",
    [
        ("lz4-java", "lz4-java-1.11.0.jar"),
        ("zstd-jni", "zstd-jni-1.5.7-7.jar"),
        ("commons-pool2", None),  # pyspark has commons-pool 1.x, a different artifact
        ("spark-sql-kafka-0-10_2.13", None),  # not spark-sql_2.13
        ("spark-sql_2.13", "spark-sql_2.13-4.2.0.jar"),
        ("kafka-clients", None),
    ],
)
def test_shipped_by_compares_artifact_ids(artifact, expected):
    pyspark_jars = {
        "lz4-java-1.11.0.jar",
        "zstd-jni-1.5.7-7.jar",
        "commons-pool-1.5.4.jar",
        "spark-sql_2.13-4.2.0.jar",
        "spark-sql-api_2.13-4.2.0.jar",
    }
    assert shipped_by(pyspark_jars, artifact) == expected


def test_default_urls(monkeypatch):
    for var in services.PORT_ENV.values():
        monkeypatch.delenv(var, raising=False)
    assert urls() == Urls(
        kafka="127.0.0.1:19092",
        mariadb_url="mysql+pymysql://applier:applier@127.0.0.1:13306/applier",
        pg_url="postgresql+psycopg://applier:applier@127.0.0.1:15432/applier",
    )


def test_ports_from_env(monkeypatch):
    monkeypatch.setenv("APPLIER_KAFKA_PORT", "29092")
    monkeypatch.setenv("APPLIER_MARIADB_PORT", "23306")
    monkeypatch.setenv("APPLIER_PG_PORT", "25432")
    monkeypatch.delenv("APPLIER_KAFKA_CONTROLLER_PORT", raising=False)
    u = urls()
    assert u.kafka == "127.0.0.1:29092"
    assert u.mariadb_url.endswith("@127.0.0.1:23306/applier")
    assert u.pg_url.endswith("@127.0.0.1:25432/applier")
    assert services.kafka_controller_port() == 29093
    monkeypatch.setenv("APPLIER_PG_PORT", "nope")
    with pytest.raises(ServicesError):
        urls()


def test_env_lines_are_shell_exports():
    u = build_urls(1, 2, 3)
    lines = env_lines(u, ["/a b/x.jar", "/c/y.jar"])
    assert lines[0] == "export APPLIER_KAFKA=127.0.0.1:1"
    parsed = dict(shlex.split(line)[1].split("=", 1) for line in lines)
    assert parsed["APPLIER_MARIADB_URL"] == "mysql+pymysql://applier:applier@127.0.0.1:2/applier"
    assert parsed["APPLIER_PG_URL"] == "postgresql+psycopg://applier:applier@127.0.0.1:3/applier"
    assert parsed["APPLIER_SPARK_JARS"] == "/a b/x.jar,/c/y.jar"
    assert len(env_lines(u)) == 3


def test_normalize_only():
    assert normalize_only(None) == ["kafka", "mariadb", "postgres"]
    assert normalize_only("postgres,kafka") == ["kafka", "postgres"]
    assert normalize_only({"pg", "mysql"}) == ["mariadb", "postgres"]
    with pytest.raises(ServicesError):
        normalize_only("kafka,redis")
    with pytest.raises(ServicesError):
        normalize_only("")


def test_applier_home(monkeypatch, tmp_path):
    monkeypatch.setenv("APPLIER_HOME", str(tmp_path / "h"))
    assert services.applier_home() == tmp_path / "h"
    monkeypatch.delenv("APPLIER_HOME")
    assert services.applier_home() == Path("~/.cache/applier").expanduser()


def test_server_properties_single_node_kraft(tmp_path):
    text = server_properties(19092, 19093, tmp_path / "data")
    props = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["auto.create.topics.enable"] == "false"
    assert props["num.partitions"] == "3"
    assert props["log.dirs"] == str(tmp_path / "data")
    for key in (
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "1", key


def test_mariadb_cnf(tmp_path):
    text = mariadb_cnf(
        datadir=tmp_path / "d", socket=tmp_path / "d/s.sock", port_=13306,
        error_log=tmp_path / "e.log", as_root=True,
    )
    assert text.splitlines()[1] == "[mysqld]"
    assert "user = root" in text
    assert "port = 13306" in text and "bind-address = 127.0.0.1" in text
    assert "local-infile = 1" in text
    assert "user = root" not in mariadb_cnf(
        datadir=tmp_path, socket=tmp_path / "s", port_=1, error_log=tmp_path / "e", as_root=False
    )
    for host in ("%", "127.0.0.1", "localhost"):
        assert f"TO 'applier'@'{host}' WITH GRANT OPTION" in MARIADB_BOOTSTRAP_SQL


def test_pg_server_args(tmp_path):
    args = pg_server_args(datadir=tmp_path / "data", socket_dir=tmp_path / "data", port_=15432)
    assert args[:4] == ["-D", str(tmp_path / "data"), "-p", "15432"]
    assert "listen_addresses=127.0.0.1" in args
    assert f"unix_socket_directories={tmp_path / 'data'}" in args
