"""A deployed ``applier run`` loads only the product (issue 11): run the installed command on a real stream with
Python's import tracing on, and look at every module the supervisor and the pipeline process imported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from applier.devtools.changefeed import generate, produce
from applier.devtools.verify import compare_tables
from tests.e2e.helpers import config, target_url, write_toml

pytestmark = pytest.mark.e2e

IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)\s*$", re.M)


def test_applier_run_loads_no_tooling(urls, unique, drop_schema, tmp_path) -> None:
    topic = f"e2e-loads-{unique}"
    schema = f"shop_{unique}"
    drop_schema(("postgres", schema))
    wl = generate("canal-json", partitions=1, txns=20, seed=5, replays=0)
    produce(urls.kafka, topic, wl.messages, partitions=1)
    cfg = config(urls, "postgres", "canal-json", topic, schema, tmp_path / "ckpt")
    applier = Path(sys.executable).parent / "applier"  # the console script the package installs
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")  # inherited by the supervised pipeline process
    res = subprocess.run([str(applier), "run", "-c", str(write_toml(tmp_path / "c.toml", cfg)), "--until-caught-up"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr[-3000:]
    modules = set(IMPORTED.findall(res.stderr))
    # the probe sees the pipeline process, not just the supervisor
    assert {"applier.crashguard", "applier.pipeline", "applier.sinks.postgres", "applier.jars"} <= modules
    assert sorted(m for m in modules if m.startswith("applier.devtools")) == []
    engine = create_engine(target_url(urls, "postgres"))
    try:
        assert compare_tables(engine, schema, wl.expected) == []
    finally:
        engine.dispose()
