"""applier_writers: which run may write a pipeline (invariant 13, one writer per pipeline).

Each ``applier run`` claims the pipeline by raising its epoch; every data transaction checks, before it
commits, that the epoch it holds is still the row's, so an older run on another host stops instead of
interleaving its writes. ``holder`` is the claiming process's host name and pid, nothing secret.
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.create_table(
        "applier_writers",
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("claimed_at", sa.DateTime, nullable=True),
        sa.Column("heartbeat_at", sa.DateTime, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("applier_writers")
