"""Helpers the end-to-end tests share (plain functions and classes; the fixtures stay in conftest.py).

Why a module of its own: tests import these by name, and a conftest is pytest's to load, not a module to import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from sqlalchemy.engine import make_url

from applier import migrate
from applier.codecs import get_decoder
from applier.devtools.encoders.open import encode_open, encode_open_batch
from applier.devtools.changefeed import Workload
from applier.events import DDL, KafkaMessage, RowChange, SourcePosition
from applier.processor import BatchProcessor
from applier.progress import ProgressStore
from applier.timing import StageTimer

REPO = Path(__file__).resolve().parents[2]


# Name parts of the topics this session made: every test topic carries its `unique` token (or is registered by
# name). Only those are deleted at the end: another pytest session on the same broker keeps its topics.
_MADE: set[str] = set()


def made_topic(name_or_token: str) -> None:
    """Register a topic (or a token in its name) this session created, for deletion at the end."""
    _MADE.add(name_or_token)


class CountingTimer(StageTimer):
    """A StageTimer that keeps the counts only (which path wrote how many rows)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, stage: str, seconds: float) -> None:
        pass

    def count(self, what: str, n: int) -> None:
        self.counts[what] = self.counts.get(what, 0) + n


def target_url(urls, target: str) -> str:
    return urls.mariadb_url if target == "mariadb" else urls.pg_url


def config(urls, target: str, protocol: str, topic: str, schema: str, ckpt: Path, **pipeline) -> dict:
    return {
        "pipeline": {"name": f"p-{topic}", "checkpoint_dir": str(ckpt), **pipeline},
        "source": {"bootstrap_servers": urls.kafka, "topics": [topic], "protocol": protocol},
        "target": {"url": target_url(urls, target)},
        "route": [{"match": "shop.*", "schema": schema}, {"match": "shop.audit_*", "ignore": True}],
    }


def apply_sql_file(urls, target: str, path: Path) -> None:
    """Run the fix-up file with the database's own command-line client, as an operator would."""
    u = make_url(target_url(urls, target))
    env = dict(os.environ)
    if target == "mariadb":
        client = shutil.which("mariadb") or shutil.which("mysql")
        assert client, "the MariaDB client (mariadb or mysql) is needed to apply the fix-up file"
        env["MYSQL_PWD"] = u.password or ""
        cmd = [client, "-h", u.host, "-P", str(u.port), "-u", u.username, u.database]
    else:
        client = shutil.which("psql")
        assert client, "psql is needed to apply the fix-up file"
        env["PGPASSWORD"] = u.password or ""
        cmd = [client, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", u.host, "-p", str(u.port), "-U", u.username,
               "-d", u.database]
    with path.open("rb") as fh:
        res = subprocess.run(cmd, stdin=fh, env=env, capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode(errors="replace")


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic-string escapes
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {v!r}")


def write_toml(path: Path, cfg: dict) -> Path:
    """A config dict (as :func:`config` builds it) as a TOML file, for tests that run the ``applier`` CLI."""
    out: list[str] = []

    def table(name: str, data: dict) -> None:
        out.append(f"[{name}]")
        subs = []
        for k, v in data.items():
            if isinstance(v, dict):
                subs.append((k, v))
            else:
                out.append(f"{json.dumps(k)} = {_toml_value(v)}")
        for k, v in subs:
            table(f"{name}.{k}", v)

    for section, data in cfg.items():
        if isinstance(data, list):
            for item in data:
                out.append(f"[[{section}]]")
                out.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in item.items())
        else:
            table(section, data)
    path.write_text("\n".join(out) + "\n")
    return path


# ---- the apply stage without Spark: Open Protocol messages on one partition ----------------------------------

TOPIC = "t"
POS = SourcePosition(TOPIC, 0, 0)


class Feed:
    """Encodes events as TiCDC Open Protocol messages on one partition, with increasing offsets."""

    def __init__(self) -> None:
        self.offset = 0

    def msgs(self, *events, batch: int = 1) -> list[KafkaMessage]:
        out = []
        evs = list(events)
        i = 0
        while i < len(evs):
            group = [evs[i]]
            if isinstance(evs[i], RowChange):
                while len(group) < batch and i + len(group) < len(evs) and isinstance(evs[i + len(group)], RowChange):
                    group.append(evs[i + len(group)])
            k, v = encode_open_batch(group) if len(group) > 1 else encode_open(group[0])
            out.append(KafkaMessage(TOPIC, 0, self.offset, k, v))
            self.offset += 1
            i += len(group)
        return out


def processor(engine, name: str, route, **kw) -> BatchProcessor:
    migrate.upgrade(engine)
    store = ProgressStore(name, "open")
    store.claim(engine)
    with engine.connect() as c:
        state = store.load(c)
    return BatchProcessor(engine=engine, decoder=get_decoder("open"), route=route, store=store, state=state,
                          partitions=[(TOPIC, 0)], **kw)


# ---- a generated changefeed's tables as of a TSO --------------------------------------------------------------

def state_as_of(wl: Workload, ts: int) -> dict[str, dict[tuple, dict]]:
    """Upstream's routed tables after every change committed at or before ``ts`` (key -> row, as
    ``Workload.expected`` has them)."""
    tables: dict[str, dict[tuple, dict]] = {t: {} for t in wl.expected}
    for ch in wl.changes:
        if not isinstance(ch, RowChange) or ch.commit_ts > ts or ch.table not in tables:
            continue
        rows = tables[ch.table]
        if ch.before is not None:
            rows.pop((ch.before["id"],), None)
        if ch.after is not None:
            rows[(ch.after["id"],)] = dict(ch.after)
    altered = any(isinstance(ch, DDL) and "ADD COLUMN" in ch.query and ch.commit_ts <= ts for ch in wl.changes)
    for row in tables["orders"].values():
        if altered:
            row.setdefault("status", None)  # rows from before the ALTER hold NULL there
        else:
            row.pop("status", None)  # the column does not exist yet (the generator's final rows share these)
    return tables
