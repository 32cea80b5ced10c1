"""applier_loads: what ``applier load`` put into the target from a Dumpling export, per upstream table.

One row per pipeline and upstream table: its target, how many rows from how many data files, and the export's
snapshot TSO, which the same load made the pipeline's starting point (issue 13, point 4).
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    op.create_table(
        "applier_loads",
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("source_schema", sa.String(64), primary_key=True),
        sa.Column("source_table", sa.String(64), primary_key=True),
        sa.Column("target_schema", sa.String(64), nullable=False),
        sa.Column("target_table", sa.String(64), nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("snapshot_ts", sa.BigInteger, nullable=False),
        sa.Column("files", sa.Integer, nullable=False),
        sa.Column("loaded_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("applier_loads")
