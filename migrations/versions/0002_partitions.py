"""applier_partitions: per topic/partition restart offset, next offset and resolved ts."""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "applier_partitions",
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("topic", sa.String(249), primary_key=True),
        sa.Column("kafka_partition", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("restart_offset", sa.BigInteger, nullable=False),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
        sa.Column("resolved_ts", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("applier_partitions")
