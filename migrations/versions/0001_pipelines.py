"""applier_pipelines: one row per pipeline, the applied resolved ts.

MySQL DDL is not transactional, so each revision holds one operation.
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "applier_pipelines",
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("protocol", sa.String(32), nullable=False),
        sa.Column("applied_ts", sa.BigInteger, nullable=False),
        sa.Column("batches", sa.BigInteger, nullable=False),
        sa.Column("rows_applied", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("applier_pipelines")
