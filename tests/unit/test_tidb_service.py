"""The TiDB build and server's pure parts (applier/devtools/services/tidb.py); the real build and server run in the
e2e tests (tests/e2e/test_tidb_*.py, and .ci/run builds it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from applier.devtools import services
from applier.devtools.services import tidb as T
from applier.devtools.services.common import ServicesError

MOD = Path(__file__).resolve().parents[2] / "tools" / "tidb"


def test_the_go_module_requires_tidb_and_repeats_its_replaces() -> None:
    """TiDB's go.mod has replace directives (which is why `go install pkg@version` refuses it): ours repeats each,
    the parser's pointing at the module version of the same commit instead of TiDB's ./pkg/parser."""
    text = (MOD / "go.mod").read_text()
    version = T.tidb_version(MOD)
    assert re.fullmatch(r"v\d+\.\d+\.\d+-\S*\d{14}-[0-9a-f]{12}", version)  # a pseudo-version: a commit
    commit = version.rsplit("-", 1)[1]
    replaces = dict(re.findall(r"^\s*(\S+) => (\S+ \S+)$", text, re.M))
    assert set(replaces) == {"github.com/apache/arrow-go/v18", "github.com/go-ldap/ldap/v3",
                             "github.com/pingcap/tidb/pkg/parser", "sourcegraph.com/sourcegraph/appdash",
                             "sourcegraph.com/sourcegraph/appdash-data"}
    parser = replaces["github.com/pingcap/tidb/pkg/parser"]
    assert parser.startswith("github.com/pingcap/tidb/pkg/parser v0.0.0-") and parser.endswith(commit)
    assert not any(v.startswith(".") for v in replaces.values())  # nothing of TiDB's tree is ours
    assert f"github.com/pingcap/tidb {version}" in (MOD / "go.sum").read_text()
    tools = (MOD / "tools.go").read_text()
    assert all(f'_ "{pkg}"' in tools for pkg in T.PROGRAMS.values())


def test_binaries_are_cached_per_version_under_the_state_home(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("APPLIER_HOME", str(tmp_path))
    bins = T.binaries("v1.2.3")
    assert bins == {"tidb-server": tmp_path / "tidb" / "v1.2.3" / "bin" / "tidb-server",
                    "dumpling": tmp_path / "tidb" / "v1.2.3" / "bin" / "dumpling"}
    assert T._built("v1.2.3") is None  # missing: built by resolve()


def test_build_command_builds_both_programs_niced(tmp_path) -> None:
    go = T.Go("/usr/local/go/bin/go", (1, 26, 8), "local")
    argv = T.build_command(go, tmp_path)
    assert argv[:3] == [argv[0], "-n", "19"] and argv[0].endswith("nice")
    assert argv[3:] == ["/usr/local/go/bin/go", "build", "-tags", "codes", "-ldflags", "-s -w", "-o", f"{tmp_path}/",
                        "github.com/pingcap/tidb/cmd/tidb-server", "github.com/pingcap/tidb/dumpling/cmd/dumpling"]
    env = T.build_env(T.Go("go", (1, 22, 0), "go1.23.12"))
    assert env["GOTOOLCHAIN"] == "go1.23.12" and "-mod=readonly" in env["GOFLAGS"] and env["GOWORK"] == "off"


def test_find_go_prefers_a_go_that_builds_tidb_itself(monkeypatch) -> None:
    versions = {"/old/go": (1, 22, 1), "/new/go": (1, 26, 8), "/ancient/go": (1, 19, 0)}
    monkeypatch.setattr(T, "go_version", lambda c: versions.get(c))
    monkeypatch.setattr(T, "_candidates", lambda: ["/old/go", "/new/go"])
    assert T.find_go() == T.Go("/new/go", (1, 26, 8), "local")
    monkeypatch.setattr(T, "_candidates", lambda: ["/ancient/go", "/old/go"])
    assert T.find_go() == T.Go("/old/go", (1, 22, 1), T.GO_TOOLCHAIN)  # the go command fetches 1.23.12
    monkeypatch.setattr(T, "_candidates", lambda: [])
    monkeypatch.setattr(T, "is_root", lambda: False)
    with pytest.raises(ServicesError, match="no Go is installed"):
        T.find_go()


def test_server_command_runs_the_embedded_store_on_loopback(tmp_path) -> None:
    argv = T.server_command(tmp_path / "tidb-server", tmp_path / "data", tmp_path / "tmp", 14000, 14080)
    assert argv[0] == str(tmp_path / "tidb-server")
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert flags["-store"] == "unistore" and flags["-path"] == str(tmp_path / "data")
    assert flags["-host"] == flags["-status-host"] == "127.0.0.1"
    assert flags["-P"] == "14000" and flags["-status"] == "14080" and flags["-temp-dir"] == str(tmp_path / "tmp")


def test_tidb_is_an_optional_service_with_its_own_ports(monkeypatch) -> None:
    assert "tidb" in services.OPTIONAL_SERVICES and "tidb" not in services.SERVICES
    assert services.normalize_only("tidb") == ["tidb"]
    monkeypatch.delenv("APPLIER_TIDB_PORT", raising=False)
    monkeypatch.delenv("APPLIER_TIDB_STATUS_PORT", raising=False)
    assert T.tidb_url() == "mysql+pymysql://applier:applier@127.0.0.1:14000/" and T.status_port() == 14080
    monkeypatch.setenv("APPLIER_TIDB_PORT", "24000")
    monkeypatch.setenv("APPLIER_TIDB_STATUS_PORT", "nope")
    assert T.tidb_url().endswith("@127.0.0.1:24000/")
    with pytest.raises(ServicesError, match="APPLIER_TIDB_STATUS_PORT"):
        T.status_port()


def test_the_gc_safe_point_is_written_in_tidbs_layout() -> None:
    import datetime as dt

    when = dt.datetime(2026, 3, 4, 5, 6, 7, 89000, tzinfo=dt.timezone.utc)
    assert T.gc_time(when) == "20260304-05:06:07.089 +0000"  # the milliseconds count: a TSO is finer still
    assert re.fullmatch(r"\d{8}-\d\d:\d\d:\d\d\.000 \+0000", T.INITIAL_SAFE_POINT)
