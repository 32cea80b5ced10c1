"""TiCDC's row checksum verified on a real run (issue 12, point 4): a Simple changefeed with checksums goes
through Kafka and the pipeline into the target; one row whose value changed after TiCDC computed its checksum
stops the run naming its position, or under on_decode_error = "quarantine" is kept aside, blocking its table (the
table's changes read after it are held behind it).
(The algorithm's byte-level tests are tests/unit/test_checksum.py.)"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from sqlalchemy import create_engine, func, select, text

from applier import progress as P
from applier.config import parse_config
from applier.devtools.changefeed import produce
from applier.devtools.encoders import simple as SE
from applier.events import DDL, Column, DecodeError, Op, Resolved, RowChange, SourcePosition, TableSchema
from applier.pipeline import run
from applier.quarantine import RowQuarantine
from tests.e2e.helpers import config, target_url

pytestmark = pytest.mark.e2e

ORDERS = TableSchema("shop", "orders", 1, (
    Column("id", "int", nullable=False, key=True, unique=True), Column("name", "varchar"),
    Column("amount", "decimal"), Column("at", "timestamp")))
CREATE = ("CREATE TABLE `orders` (`id` INT PRIMARY KEY, `name` VARCHAR(32), `amount` DECIMAL(10,2), "
          "`at` TIMESTAMP(6) NULL)")
POS = SourcePosition("t", 0, 0)


def stream(corrupt_id: int | None) -> list[tuple[int, bytes | None, bytes]]:
    out = [SE.encode_simple(DDL("shop", "orders", 100, CREATE, POS, ddl_type="CREATE"), table_schema=ORDERS)]
    for i in range(1, 6):
        row = {"id": i, "name": f"name-{i}", "amount": Decimal(f"{i}.25"), "at": dt.datetime(2024, 1, i, 3, 4, 5)}
        key, value = SE.encode_simple(RowChange("shop", "orders", 100 + i, Op.INSERT, None, row, ORDERS.columns, POS),
                                      table_schema=ORDERS, checksum=True)
        if i == corrupt_id:  # one value changed after TiCDC computed the checksum, the framing intact
            assert value.count(b"name-3") == 1
            value = value.replace(b"name-3", b"nbme-3")
        out.append((key, value))
    out.append(SE.encode_simple(Resolved(200, POS)))
    return [(0, k, v) for k, v in out]


def _run(urls, spark, tmp_path, unique: str, schema: str, corrupt_id: int | None, **pipeline):
    topic = f"cks-{unique}-{corrupt_id}-{len(pipeline)}"
    produce(urls.kafka, topic, stream(corrupt_id), partitions=1)
    cfg = config(urls, "mariadb", "simple", topic, schema, tmp_path / f"ck-{topic}", **pipeline)
    settings = parse_config(cfg)
    return settings, lambda: run(settings, until_caught_up=True, spark=spark, progress=False)


def ids(engine, schema: str) -> list[int]:
    with engine.connect() as c:
        return [r[0] for r in c.execute(text(f"SELECT id FROM `{schema}`.`orders` ORDER BY id"))]


def test_checksummed_rows_apply_and_a_damaged_one_stops_or_is_quarantined(urls, spark, unique, drop_schema,
                                                                          tmp_path) -> None:
    engine = create_engine(target_url(urls, "mariadb"))
    try:
        schema = f"cks_{unique}"
        drop_schema(("mariadb", schema))
        _, go = _run(urls, spark, tmp_path, unique, schema, None)
        go()
        assert ids(engine, schema) == [1, 2, 3, 4, 5]

        schema2 = f"cks2_{unique}"
        drop_schema(("mariadb", schema2))
        _, go = _run(urls, spark, tmp_path, unique, schema2, 3)
        with pytest.raises(DecodeError, match=r"offset=3.*checksum"):
            go()

        schema3 = f"cks3_{unique}"
        drop_schema(("mariadb", schema3))
        settings, go = _run(urls, spark, tmp_path, unique, schema3, 3, on_decode_error="quarantine")
        go()
        # the damaged message is kept aside and blocks its table (invariant 12): every change of the table read
        # after it waits behind it, what was read before it in its partition (older) is applied
        assert ids(engine, schema3) == [1, 2]
        with engine.connect() as c:
            n, reason = c.execute(select(func.count(), func.max(P.quarantine.c.reason)).where(
                P.quarantine.c.pipeline == settings.pipeline.name)).one()
            held = RowQuarantine(settings.pipeline.name).find(c)
        assert n == 1 and "checksum" in reason, reason
        assert [(h.row_key, h.kind) for h in held] == [("*", "undecodable")] + [(f"[{i}]", "blocked") for i in (4, 5)]
    finally:
        engine.dispose()
