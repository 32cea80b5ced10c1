"""Whole changefeeds made by TiCDC's real encoders (``../shared/vectors/ticdc-real``, see its SOURCES.md) and
their expected final tables, as the e2e tests read them: the messages per variant, the decoder options that
match the changefeed's sink URI, and the expected rows in the canonical form of :mod:`tests.e2e.canonical`.

The expected values are TiDB's own text (``expected.json``: binary as upper-case hex, BIT as its unsigned
value); each is parsed by its column type into the Python value a replica read back is compared with, after the
documented losses of the protocol (docs/value-rules.md) are applied to it."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any, Callable

from applier.codecs.registry import RegisteredSchema
from applier.events import KafkaMessage
from tests.e2e.canonical import canonical_expected, debezium_decimal

ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "vectors" / "ticdc-real"

#: variant folder -> (protocol, decoder options matching the sink URI in manifest.json)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "open": ("open", {}),
    "canal-json": ("canal-json", {}),
    "canal-json-index-value": ("canal-json", {}),
    "simple": ("simple", {}),
    "avro": ("avro", {"enable_watermark": True, "decimal_mode": "string", "bigint_unsigned_mode": "string"}),
    "debezium": ("debezium", {"gated": True, "require_tidb_extension": True}),
    "debezium-no-bit": ("debezium", {"gated": True, "require_tidb_extension": True}),
}


@dataclass(frozen=True)
class Line:
    partition: int
    key: bytes | None
    value: bytes | None
    kind: str


def manifest() -> dict[str, Any]:
    return json.loads((ROOT / "manifest.json").read_text())


def lines(variant: str) -> list[Line]:
    out = []
    with open(ROOT / variant / "messages.jsonl") as fh:
        for raw in fh:
            d = json.loads(raw)
            out.append(Line(d["partition"], None if d["key"] is None else base64.b64decode(d["key"]),
                            None if d["value"] is None else base64.b64decode(d["value"]), d["kind"]))
    return out


def messages(variant: str, topic: str) -> list[KafkaMessage]:
    """The stream as Kafka would hand it out: per partition, offsets from 0 in production order."""
    offsets: dict[int, int] = {}
    out = []
    for ln in lines(variant):
        off = offsets.get(ln.partition, 0)
        offsets[ln.partition] = off + 1
        out.append(KafkaMessage(topic, ln.partition, off, ln.key, ln.value))
    return out


class FileRegistry:
    """The schemas TiCDC registered while encoding the Avro variant, by their ids (``avro/registry.json``)."""

    def __init__(self) -> None:
        doc = json.loads((ROOT / "avro" / "registry.json").read_text())
        self.schemas = {s["id"]: s["schema"] for s in doc["schemas"]}
        self.subjects: dict[str, list[int]] = doc["subjects"]

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        return RegisteredSchema(schema_id, self.schemas[schema_id])


# ---- expected rows --------------------------------------------------------------------------------------------

def expected() -> dict[str, Any]:
    return json.loads((ROOT / "expected.json").read_text())


_TIME = re.compile(r"(-?)(\d+):(\d\d):(\d\d)(?:\.(\d+))?$")


def parse_tidb(column_type: str, encoding: str, text: str | None) -> Any:
    """TiDB's text for a value (expected.json) -> the event model's Python value."""
    if text is None:
        return None
    base = column_type.split("(")[0].split(" ")[0]
    if encoding == "hex":
        return bytes.fromhex(text)
    if encoding == "uint" or base in ("tinyint", "smallint", "mediumint", "int", "bigint", "year"):
        return int(text)
    if base in ("float", "double"):
        return float(text)
    if base == "decimal":
        return Decimal(text)
    if base == "date":
        return dt.date.fromisoformat(text)
    if base in ("datetime", "timestamp"):
        return dt.datetime.fromisoformat(text)
    if base == "time":
        m = _TIME.match(text)
        assert m, text
        sign, h, mi, s, frac = m.groups()
        v = dt.timedelta(hours=int(h), minutes=int(mi), seconds=int(s), microseconds=int((frac or "0").ljust(6, "0")))
        return -v if sign else v
    return text  # strings, enum and set names, JSON text


#: (protocol, column type base) -> (documented loss, what the protocol delivers for an upstream value)
LOSSES: dict[tuple[str, str], tuple[str, Callable[[Any], Any]]] = {
    ("debezium", "decimal"): ("DECIMAL travels as float64 (about 15 significant digits)", debezium_decimal),
}
#: (protocol, table, column) -> (documented loss, what arrives), for losses that depend on the column's definition
COLUMN_LOSSES: dict[tuple[str, str, str], tuple[str, Callable[[Any], Any]]] = {
    ("debezium", "t_types", "c_added"): ("a NULL in a column with a DEFAULT arrives as the default ('dflt')",
                                         lambda v: "dflt" if v is None else v),
}


def expected_rows(kind: str, protocol: str, table: str) -> tuple[list[str], dict[tuple, dict[str, Any]]]:
    """(key columns, key -> row) of the expected final table, canonical for target ``kind``."""
    t = expected()["tables"][table]
    cols = t["columns"]
    key = [c.strip() for c in t["order_by"].split(",")]
    rows = {}
    for raw in t["rows"]:
        row = {}
        for c, text in zip(cols, raw):
            v = parse_tidb(c["column_type"], c["encoding"], text)
            loss = LOSSES.get((protocol, c["column_type"].split("(")[0]))
            if loss is not None and v is not None:
                v = loss[1](v)
            column_loss = COLUMN_LOSSES.get((protocol, table, c["name"]))
            if column_loss is not None:
                v = column_loss[1](v)
            full = "bit(10)" if c["encoding"] == "uint" else c["column_type"]
            row[c["name"]] = canonical_expected(kind, c["name"], full, v)
        rows[tuple(row[k] for k in key)] = row
    return key, rows


def column_types(table: str) -> dict[str, str]:
    return {c["name"]: c["column_type"] for c in expected()["tables"][table]["columns"]}

