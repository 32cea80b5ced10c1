"""The README's first command, ``applier demo``, run as a user runs it: the console script of the virtualenv the
set-up built, as a separate process, from a folder outside the repository."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from applier.devtools.verify import compare_tables
from applier.devtools.changefeed import generate
from tests.e2e.helpers import made_topic

pytestmark = pytest.mark.e2e


def test_applier_demo_ends_with_the_replica_equal_to_upstream(urls, drop_schema, tmp_path) -> None:
    script = Path(sys.executable).parent / "applier"
    assert script.is_file(), f"{script} missing: the project is not installed into {sys.prefix}"
    env = dict(os.environ)
    env.pop("PYSPARK_PYTHON", None)  # the demo must find its own workers' Python
    res = subprocess.run([str(script), "demo"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600, stdin=subprocess.DEVNULL)
    out = res.stdout + res.stderr
    topic = re.search(r"messages \(\d+ events\) to (\S+) on", res.stdout)
    if topic:
        made_topic(topic.group(1))
    m = re.search(r"target (shop_demo_\d+) equals the upstream state", res.stdout)
    if m:
        drop_schema(("mariadb", m.group(1)))
    assert res.returncode == 0, out[-4000:]
    assert m, out[-4000:]
    assert "Traceback" not in out and "PACKAGE_NOT_INSTALLED" not in out and "pandas" not in out.lower()
    # independent of the demo's own verdict: its changefeed, regenerated, against what landed
    wl = generate("canal-json", partitions=3, txns=400, seed=42)
    engine = create_engine(urls.mariadb_url)
    try:
        assert compare_tables(engine, m.group(1), wl.expected) == []
    finally:
        engine.dispose()
