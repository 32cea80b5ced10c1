"""applier_ddl_history: every upstream DDL seen, with its translated statements and state."""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.create_table(
        "applier_ddl_history",
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("ddl_key", sa.String(64), primary_key=True),
        sa.Column("commit_ts", sa.BigInteger, nullable=False),
        sa.Column("source_schema", sa.String(64), nullable=False),
        sa.Column("source_table", sa.String(64), nullable=False),
        sa.Column("query", sa.Text, nullable=False),
        sa.Column("statements", sa.Text, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("detail", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("finished_at", sa.DateTime, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("applier_ddl_history")
