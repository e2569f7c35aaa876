"""scale-out: API replicas (heartbeats), the replica that claimed an evaluation episode,
env -> sandbox host affinity (Ray backend)

Revision ID: 0006
Revises: 0005_init_configs
Create Date: 2026-11-25 12:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005_init_configs'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('replicas',
    sa.Column('id', sa.String(length=40), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('replicas', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_replicas_heartbeat_at'), ['heartbeat_at'], unique=False)
    op.create_table('env_hosts',
    sa.Column('env_id', sa.String(length=40), nullable=False),
    sa.Column('host', sa.String(length=128), nullable=False),
    sa.Column('placed_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('env_id')
    )
    with op.batch_alter_table('env_hosts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_env_hosts_host'), ['host'], unique=False)
    with op.batch_alter_table('evaluation_episodes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('claimed_by', sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluation_episodes', schema=None) as batch_op:
        batch_op.drop_column('claimed_by')
    with op.batch_alter_table('env_hosts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_env_hosts_host'))
    op.drop_table('env_hosts')
    with op.batch_alter_table('replicas', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_replicas_heartbeat_at'))
    op.drop_table('replicas')
