"""applier_schemas: the target schemas the applier itself created.

A replicated DROP DATABASE reaches PostgreSQL as DROP SCHEMA ... CASCADE, which drops every object in the
schema; the applier only does that to schemas it created (issue 10). MySQL/MariaDB keep the record too.
"""
import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "applier_schemas",
        sa.Column("schema_name", sa.String(64), primary_key=True),
        sa.Column("pipeline", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("applier_schemas")
