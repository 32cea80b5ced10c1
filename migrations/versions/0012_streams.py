"""applier_streams: each apply stream's progress (issue 26, ``[target] apply_streams``).

One row per pipeline and stream: the resolved ts the stream has committed its rows up to and how many row changes
it applied. A stream writes its row in the same transaction as its rows (invariant 6); the pipeline's applied ts
in applier_pipelines is the minimum over the streams, moved by a marker transaction once every stream committed
a window (invariant 16).
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.create_table(
        "applier_streams",
        sa.Column("pipeline", sa.String(64), primary_key=True),
        sa.Column("stream", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("applied_ts", sa.BigInteger, nullable=False),
        sa.Column("rows_applied", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("applier_streams")
