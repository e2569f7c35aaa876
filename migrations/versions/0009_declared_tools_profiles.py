"""declared tools and episode rulebooks: an environment's declared tool schemas (what the
agent sees when given, e.g. EnvScaler's released ``tools``), and per scenario the episode
profile (``sandpit`` or ``envscaler``) and how its checks see objects of the
environment's classes (``standins`` or ``environment``)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('environments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('declared_tools', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('tool_differences', sa.JSON(), nullable=True))
    with op.batch_alter_table('scenarios', schema=None) as batch_op:
        batch_op.add_column(sa.Column('episode_profile', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('check_objects', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('scenarios', schema=None) as batch_op:
        batch_op.drop_column('check_objects')
        batch_op.drop_column('episode_profile')
    with op.batch_alter_table('environments', schema=None) as batch_op:
        batch_op.drop_column('tool_differences')
        batch_op.drop_column('declared_tools')
