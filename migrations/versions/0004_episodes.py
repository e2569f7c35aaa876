"""episodes: scenario-bound episodes with server-side rewards; environment introduction,
rules and argument checking; per-step reward, end and extras

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25 09:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('episodes',
    sa.Column('env_id', sa.String(length=40), nullable=False),
    sa.Column('episode', sa.Integer(), nullable=False),
    sa.Column('environment_id', sa.String(length=40), nullable=False),
    sa.Column('scenario_id', sa.String(length=40), nullable=True),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('user_key_enc', sa.LargeBinary(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('observation', sa.Text(), nullable=False),
    sa.Column('task', sa.Text(), nullable=True),
    sa.Column('reward', sa.Float(), nullable=True),
    sa.Column('checks', sa.JSON(), nullable=True),
    sa.Column('user_messages', sa.JSON(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['env_id'], ['envs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('env_id', 'episode')
    )
    with op.batch_alter_table('environments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('introduction', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('rules', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('argument_checking', sa.String(length=8), nullable=False,
                                      server_default='off'))
    with op.batch_alter_table('envs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('argument_checking', sa.String(length=8), nullable=True))
    with op.batch_alter_table('steps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reward', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('done', sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column('info', sa.JSON(), nullable=True))
    # every episode already recorded becomes a running episode with default options
    op.execute(
        "INSERT INTO episodes (env_id, episode, environment_id, scenario_id, config, status, observation, "
        "started_at) SELECT s.env_id, s.episode, e.environment_id, e.scenario_id, '{}', 'running', '', "
        "MIN(s.created_at) FROM steps s JOIN envs e ON e.id = s.env_id "
        "GROUP BY s.env_id, s.episode, e.environment_id, e.scenario_id")


def downgrade() -> None:
    with op.batch_alter_table('steps', schema=None) as batch_op:
        batch_op.drop_column('info')
        batch_op.drop_column('done')
        batch_op.drop_column('reward')
    with op.batch_alter_table('envs', schema=None) as batch_op:
        batch_op.drop_column('argument_checking')
    with op.batch_alter_table('environments', schema=None) as batch_op:
        batch_op.drop_column('argument_checking')
        batch_op.drop_column('rules')
        batch_op.drop_column('introduction')
    op.drop_table('episodes')
