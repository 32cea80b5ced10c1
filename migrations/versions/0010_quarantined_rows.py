"""applier_quarantined_rows: row changes the target refused, and every later change of their keys.

Blocking quarantine (issue 12): a row change the target cannot apply is kept here with its key, and every later
change of that key is kept behind it (state "held"), so nothing newer overtakes it; ``applier quarantine
retry`` applies them in commit order, ``discard`` records who gave them up and why.
"""
import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    op.create_table(
        "applier_quarantined_rows",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("pipeline", sa.String(64), nullable=False),
        sa.Column("source_schema", sa.String(64), nullable=False),
        sa.Column("source_table", sa.String(64), nullable=False),
        sa.Column("row_key", sa.String(1024), nullable=False),  # the key values as JSON (applier.quarantine)
        sa.Column("commit_ts", sa.BigInteger, nullable=False),
        sa.Column("topic", sa.String(249), nullable=False),
        sa.Column("kafka_partition", sa.Integer, nullable=False),
        sa.Column("kafka_offset", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),  # refused | blocked
        sa.Column("state", sa.String(16), nullable=False),  # held | retried | discarded | skipped
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("event", sa.Text, nullable=False),  # the row change as JSON (applier.quarantine)
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("resolved_at", sa.DateTime, nullable=True),
        sa.Column("resolved_by", sa.String(255), nullable=True),
        sa.Column("note", sa.Text, nullable=True),
    )
    op.create_index("ix_applier_quarantined_rows_held", "applier_quarantined_rows",
                    ["pipeline", "state", "source_schema", "source_table"])


def downgrade() -> None:
    op.drop_index("ix_applier_quarantined_rows_held", "applier_quarantined_rows")
    op.drop_table("applier_quarantined_rows")
