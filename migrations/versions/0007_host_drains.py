"""host drains: sandbox hosts an operator drains (no new placements; envs moved; pool
shut down), read by every replica's executor

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 15:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('host_drains',
    sa.Column('host', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('envs_moved', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('host')
    )


def downgrade() -> None:
    op.drop_table('host_drains')
