"""One message that kills the decoder process (a native fault) cannot stop the applier for good (issue 10), wherever
it is decoded:

- in Spark's Python workers: the worker dies, the micro-batch is decoded again in child processes;
- in the driver (``decode_on = "driver"``): the pipeline process dies, the ``applier run`` supervisor
  starts it again, and the new start finds the message from the decoding marker (applier.crashguard).

Either way the message is named (exit 3 with its position), or skipped with a record while everything else applies,
or quarantined: its table is never read, so it blocks its partition until the operator gives it up. The fault
is injected by a sitecustomize on the PYTHONPATH of the applier's processes (tests/crashing_decoder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.cli import main
from applier.devtools.verify import compare_tables
from applier.devtools.changefeed import generate, produce
from tests.e2e.helpers import REPO, config, write_toml

pytestmark = pytest.mark.e2e

CRASHING = Path(__file__).resolve().parents[1] / "crashing_decoder"


def _run(cfg: dict, path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(CRASHING), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "applier.cli", "run", "-c", str(write_toml(path, cfg)),
                           "--until-caught-up"], cwd=REPO, env=env, capture_output=True, text=True, timeout=420,
                          stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("protocol,decode_on", [("canal-json", "executors"), ("canal-json", "driver"),
                                               ("simple", "executors"), ("simple", "driver")])
def test_a_message_that_kills_the_decoder_is_named_or_quarantined(protocol, decode_on, urls, unique, drop_schema,
                                                                   tmp_path, capsys) -> None:
    topic = f"e2e-segv-{unique}"
    schema = f"shop_{unique}"
    drop_schema(("mariadb", schema))
    wl = generate(protocol, partitions=1, txns=30, seed=3, replays=0)
    msgs = list(wl.messages)
    msgs.insert(5, (0, None, b'{"database": "shop", "note": "APPLIER-TEST-SEGFAULT"}'))
    produce(urls.kafka, topic, msgs, partitions=1)
    extra = {"decode_on": decode_on} if decode_on else {}
    cfg = config(urls, "mariadb", protocol, topic, schema, tmp_path / "ckpt", **extra)
    in_driver = decode_on != "executors"
    marker = tmp_path / "ckpt" / "decoding.json"

    res = _run(cfg, tmp_path / "stop.toml")
    assert res.returncode == 3, res.stderr[-4000:]
    last = res.stderr.strip().splitlines()[-1]
    assert f"topic={topic}" in last and "offset=5" in last and "killed the decoder process" in last, last
    if in_driver:
        # the pipeline process itself died, printed where (faulthandler), and was started again to find it
        assert "Segmentation fault" in res.stderr and "died of SIGSEGV while decoding" in res.stderr
        assert marker.exists()  # stop keeps it: every rerun names the message again until the policy changes
        marker.unlink()  # so the quarantine run below meets the crash afresh

    if protocol == "canal-json" and not in_driver:
        # quarantine: the message's table is never read, so it blocks its partition (invariant 12): everything
        # after it waits (the workload's DDL only add, so they run) until the operator gives the message up and
        # retries what waited
        cfg["pipeline"]["on_decode_error"] = "quarantine"
        conf = write_toml(tmp_path / "quarantine.toml", cfg)
        res = _run(cfg, conf)
        assert res.returncode == 0, res.stderr[-4000:]
        engine = create_engine(urls.mariadb_url)
        try:
            assert compare_tables(engine, schema, wl.expected) != []
        finally:
            engine.dispose()
        assert main(["quarantine", "list", "-c", str(conf), "--json"]) == 0
        groups = json.loads(capsys.readouterr().out)["groups"]
        block = next(g for g in groups if g["key"] == "*")
        assert (block["table"], block["first_position"]["offset"]) == ("", 5) and len(groups) > 1
        assert main(["quarantine", "discard", "-c", str(conf), "--id", str(block["ids"][0]),
                     "--reason", "not a change: a test message"]) == 0
        assert main(["quarantine", "retry", "-c", str(conf), "--all"]) == 0
        capsys.readouterr()
        state = "discarded"
    else:
        # skip: recorded, and everything else applies
        cfg["pipeline"]["on_decode_error"] = "skip"
        state = "skipped"
    res = _run(cfg, tmp_path / "again.toml")
    assert res.returncode == 0, res.stderr[-4000:]
    assert not marker.exists()
    if in_driver:
        assert "died of SIGSEGV while decoding" in res.stderr
    engine = create_engine(urls.mariadb_url)
    try:
        assert compare_tables(engine, schema, wl.expected) == []
        with engine.connect() as c:
            name = cfg["pipeline"]["name"]
            q = c.execute(select(P.quarantine.c.kafka_offset, P.quarantine.c.reason)
                          .where(P.quarantine.c.pipeline == name)).all()
            rows = c.execute(select(P.quarantined_rows.c.kafka_offset, P.quarantined_rows.c.state).where(
                P.quarantined_rows.c.pipeline == name, P.quarantined_rows.c.row_key == "*")).all()
        assert [o for o, _ in q] == [5] and "SIGSEGV" in q[0][1]
        assert [tuple(r) for r in rows] == [(5, state)]
    finally:
        engine.dispose()
