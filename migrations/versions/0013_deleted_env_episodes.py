"""deleted_env_episodes: the episodes of deleted envs that scenario statistics count, so
an env's deletion (an MCP or OpenEnv scenario session's end) does not take its episodes
out of a scenario's pass rate; an index on evaluation_episodes.env_id

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28 14:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'deleted_env_episodes',
        sa.Column('env_id', sa.String(length=40), nullable=False),
        sa.Column('episode', sa.Integer(), nullable=False),
        sa.Column('tenant', sa.String(length=40), nullable=False),
        sa.Column('scenario_id', sa.String(length=40), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('reward', sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint('env_id', 'episode'),
    )
    op.create_index('ix_deleted_env_episodes_scenario_started', 'deleted_env_episodes',
                    ['scenario_id', 'started_at'])
    # an env's deletion asks whether an evaluation made it
    op.create_index('ix_evaluation_episodes_env', 'evaluation_episodes', ['env_id'])


def downgrade() -> None:
    op.drop_index('ix_evaluation_episodes_env', table_name='evaluation_episodes')
    op.drop_index('ix_deleted_env_episodes_scenario_started', table_name='deleted_env_episodes')
    op.drop_table('deleted_env_episodes')
