"""applier_quarantine: one row per (pipeline, topic, partition, offset), enforced."""
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.create_index("uq_applier_quarantine_position", "applier_quarantine",
                    ["pipeline", "topic", "kafka_partition", "kafka_offset"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_applier_quarantine_position", table_name="applier_quarantine")
