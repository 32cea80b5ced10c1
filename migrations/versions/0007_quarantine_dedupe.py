"""applier_quarantine: keep one row per Kafka position.

Before this revision a rerun that re-read a quarantined message stored it again (1, 2, 3 copies after three
reruns). The first copy of each (pipeline, topic, partition, offset) stays; 0008 then makes the position unique.
"""
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    # the derived table lets MySQL/MariaDB delete from the table the subquery reads
    op.execute(
        "DELETE FROM applier_quarantine WHERE id NOT IN ("
        "SELECT keep_id FROM (SELECT MIN(id) AS keep_id FROM applier_quarantine "
        "GROUP BY pipeline, topic, kafka_partition, kafka_offset) AS keep)"
    )


def downgrade() -> None:
    pass  # the removed rows were copies
