"""Which table an undecodable message belongs to (applier.codecs.table_of): what lets the pipeline hold every
later change of that table behind a quarantined message (invariant 12). The names come from the parts of the
message that still parse; anything unreadable gives None, and nothing raises."""

from __future__ import annotations

import pytest

from applier.codecs import get_decoder, table_of
from applier.devtools.encoders.canal_json import encode_canal_json
from applier.devtools.encoders.debezium import encode_debezium
from applier.devtools.encoders.open import encode_open
from applier.devtools.encoders.simple import encode_bootstrap, encode_simple
from applier.events import DDL, Column, DecodeError, Op, RowChange, SourcePosition, TableSchema
from tests.unit.helpers import kafka_msg

COLS = (Column("id", "int", nullable=False, key=True, unique=True), Column("v", "varchar"))
POS = SourcePosition("t", 0, 0)
ROW = RowChange("shop", "orders", 100, Op.INSERT, None, {"id": 1, "v": "x"}, COLS, POS)


def damaged(value: bytes) -> bytes:
    """The value with a row value replaced by one no column type accepts (the JSON still parses)."""
    out = value.replace(b'"x"', b'{"no": "such"}', 1)
    assert out != value
    return out


@pytest.mark.parametrize("protocol, encode", [
    ("open", encode_open),
    ("canal-json", encode_canal_json),
    ("debezium", encode_debezium),
    ("simple", lambda ev: encode_simple(ev, table_schema=TableSchema("shop", "orders", 1, COLS))),
])
def test_a_damaged_row_message_still_names_its_table(protocol: str, encode) -> None:
    dec = get_decoder(protocol)
    if protocol == "simple":  # the Simple decoder holds rows until it has their table's schema
        dec.decode(kafka_msg(*encode_bootstrap(TableSchema("shop", "orders", 1, COLS))))
    key, value = encode(ROW)
    bad = kafka_msg(key, damaged(value))
    with pytest.raises(DecodeError):
        dec.decode(bad)
    assert table_of(dec, bad) == ("shop", "orders")


@pytest.mark.parametrize("protocol", ["open", "canal-json", "debezium", "simple", "avro"])
def test_unreadable_bytes_name_no_table_and_never_raise(protocol: str) -> None:
    dec = get_decoder(protocol)
    for key, value in [(None, None), (b"\x00" * 3, b"\xff\xfe"), (b"{}", b"[1, 2]"), (None, b'{"database": 7}')]:
        assert table_of(dec, kafka_msg(key, value)) is None


def test_a_ddl_names_no_table_to_block() -> None:
    ddl = DDL("shop", "orders", 100, "ALTER TABLE orders ADD COLUMN w INT", POS, ddl_type=5)
    for protocol, encode in (("canal-json", encode_canal_json), ("debezium", encode_debezium)):
        key, value = encode(ddl)
        assert table_of(get_decoder(protocol), kafka_msg(key, value)) is None, protocol
