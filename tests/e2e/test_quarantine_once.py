"""A quarantined message is kept once per Kafka position, however often reruns read it again (issue 10), and the
upgrade removes the copies older versions stored."""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import func, insert, select
from sqlalchemy.exc import IntegrityError

from applier import migrate
from applier import progress as P
from applier.events import KafkaMessage

pytestmark = pytest.mark.e2e


def _row(pipeline: str, offset: int) -> dict:
    return dict(pipeline=pipeline, topic="t", kafka_partition=0, kafka_offset=offset, reason="bad",
                msg_key=None, msg_value=b"\x01", created_at=P.now())


def _count(engine, pipeline: str) -> dict[int, int]:
    with engine.connect() as c:
        rows = c.execute(select(P.quarantine.c.kafka_offset, func.count()).where(P.quarantine.c.pipeline == pipeline)
                         .group_by(P.quarantine.c.kafka_offset)).all()
    return {int(o): int(n) for o, n in rows}


def test_upgrade_keeps_one_copy_and_reruns_add_none(fresh_engine) -> None:
    cfg = migrate._config()
    with fresh_engine.begin() as c:  # a target as the previous version left it, with copies from reruns
        cfg.attributes["connection"] = c
        command.upgrade(cfg, "0006")
    with fresh_engine.begin() as c:
        c.execute(insert(P.quarantine), [_row("p", 5), _row("p", 5), _row("p", 5), _row("p", 9), _row("q", 5)])
    migrate.upgrade(fresh_engine)
    assert _count(fresh_engine, "p") == {5: 1, 9: 1} and _count(fresh_engine, "q") == {5: 1}

    store = P.ProgressStore("p", "open")
    for _ in range(3):  # three reruns reading offsets 5 and 7 again
        with fresh_engine.begin() as c:
            store.quarantine(c, KafkaMessage("t", 0, 5, None, b"\x01"), "bad")
            store.quarantine(c, KafkaMessage("t", 0, 7, None, b"\x02"), "bad")
    assert _count(fresh_engine, "p") == {5: 1, 7: 1, 9: 1}

    with pytest.raises(IntegrityError):  # the position is unique in the table itself
        with fresh_engine.begin() as c:
            c.execute(insert(P.quarantine).values(_row("p", 9)))
