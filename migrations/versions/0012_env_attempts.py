"""env attempts: the count and the current token of an env's attempts
(``POST /v1/envs/{id}/attempts``), so a stale attempt's calls are refused on every replica

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 12:10:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('envs') as batch_op:
        batch_op.add_column(sa.Column('attempt', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('attempt_token', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('envs') as batch_op:
        batch_op.drop_column('attempt_token')
        batch_op.drop_column('attempt')
