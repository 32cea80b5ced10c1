"""applier_tables: per source table, where it lands and the resolved ts applied to it."""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "applier_tables",
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("source_schema", sa.String(64), primary_key=True),
        sa.Column("source_table", sa.String(64), primary_key=True),
        sa.Column("target_schema", sa.String(64), nullable=False),
        sa.Column("target_table", sa.String(64), nullable=False),
        sa.Column("applied_ts", sa.BigInteger, nullable=False),
        sa.Column("rows_applied", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("applier_tables")
