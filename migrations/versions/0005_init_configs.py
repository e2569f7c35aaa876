"""init_configs: each env's init_config stored once, content-addressed (envs point at it)

Revision ID: 0005_init_configs
Revises: 0004
Create Date: 2026-11-25 12:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0005_init_configs'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('init_configs',
    sa.Column('hash', sa.String(length=64), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.Column('size', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('hash')
    )
    with op.batch_alter_table('envs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('init_config_hash', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('envs', schema=None) as batch_op:
        batch_op.drop_column('init_config_hash')
    op.drop_table('init_configs')
