"""scenario statistics: episodes and evaluation episodes indexed by scenario, so the
aggregates of ``GET /v1/scenarios/{id}/stats`` and ``GET /v1/environments/{id}/stats``
read one scenario's rows without scanning either table

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 11:00:00.000000
"""
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index('ix_episodes_scenario_started', 'episodes', ['scenario_id', 'started_at'])
    op.create_index('ix_evaluation_episodes_scenario', 'evaluation_episodes', ['scenario_id'])


def downgrade() -> None:
    op.drop_index('ix_evaluation_episodes_scenario', table_name='evaluation_episodes')
    op.drop_index('ix_episodes_scenario_started', table_name='episodes')
