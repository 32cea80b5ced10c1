"""``applier demo``: the main job on a local default, from nothing.

Starts local Kafka and the chosen database (``python -m applier.devtools.services``), writes a sample TiCDC changefeed
(several tables, DDL, PK-changing updates, replays) into a topic, applies it with ``--until-caught-up``, then
checks the target against the stream's expected final state and prints the status. The same changefeed goes into a
topic of one's own with ``python -m applier.devtools.changefeed`` (applier.devtools.changefeed.main).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from applier.devtools import services
from applier.config import parse_config
from applier.pipeline import make_engine, run
from applier.report import format_status, status
from applier.devtools.verify import compare_tables
from applier.devtools.changefeed import generate, produce


def demo(target: str = "mariadb", protocol: str = "canal-json") -> int:
    try:
        urls = services.start({"kafka", target})  # installs Java, Maven and the database from Debian if missing
    except services.ServicesError as exc:
        print(f"demo: cannot start the local services: {exc}", file=sys.stderr)
        return 2
    topic = f"demo-{protocol}-{int(time.time())}"
    wl = generate(protocol, partitions=3, txns=400, seed=42)
    produce(urls.kafka, topic, wl.messages, partitions=3)
    print(f"wrote {len(wl.messages)} TiCDC {protocol} messages ({wl.events} events) to {topic} on {urls.kafka}")
    url = urls.mariadb_url if target == "mariadb" else urls.pg_url
    schema = f"shop_demo_{int(time.time())}"
    cfg = {
        "pipeline": {"name": topic, "checkpoint_dir": str(Path(tempfile.gettempdir()) / "applier-demo" / topic)},
        "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": protocol},
        "target": {"url": url},
        "route": [{"match": "shop.*", "schema": schema}, {"match": "shop.audit_*", "ignore": True}],
    }
    settings = parse_config(cfg, source="<demo>")
    res = run(settings, until_caught_up=True, progress=True)
    if res.signal is not None:  # Ctrl-C: the run stopped after its micro-batch; nothing to compare yet
        print(f"demo stopped on signal {res.signal}: run it again to start over", file=sys.stderr)
        return 128 + res.signal
    print(f"applied {res.report.applied.rows} row changes and {res.report.applied.ddls} DDL in {res.batches} batch(es)")
    engine = make_engine(settings)
    try:
        diffs = compare_tables(engine, schema, wl.expected)
        print(format_status(status(engine, settings.pipeline.name, consistency="transactional (resolved-ts gated)")))
    finally:
        engine.dispose()
    if diffs:
        print("target differs from the upstream state:\n  " + "\n  ".join(diffs[:20]))
        return 1
    print(f"target {schema} equals the upstream state row for row "
          f"({sum(len(v) for v in wl.expected.values())} rows in {len(wl.expected)} tables). "
          "Stop the local services with: python -m applier.devtools.services stop")
    print(f"To try a configuration of your own on such a changefeed: python -m applier.devtools.changefeed "
          f"--bootstrap {urls.kafka} --topic TOPIC --protocol {protocol} (it prints the [source] to read it with)")
    return 0
