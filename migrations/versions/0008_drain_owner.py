"""drain owner: the API replica running a host's drain (``host_drains.owner``), so a live
replica takes over a drain whose replica stopped heart-beating

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 21:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('host_drains', schema=None) as batch_op:
        batch_op.add_column(sa.Column('owner', sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('host_drains', schema=None) as batch_op:
        batch_op.drop_column('owner')
