"""ui sessions: the web viewer's signed-in sessions (a token's hash, the tenant and key that
signed in, the form token, the expiry), so every replica serves the same session

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 13:45:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'ui_sessions',
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('tenant', sa.String(length=64), nullable=True),
        sa.Column('actor', sa.String(length=40), nullable=False),
        sa.Column('csrf', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('token_hash'),
    )
    op.create_index('ix_ui_sessions_tenant', 'ui_sessions', ['tenant'])
    op.create_index('ix_ui_sessions_expires_at', 'ui_sessions', ['expires_at'])


def downgrade() -> None:
    op.drop_index('ix_ui_sessions_expires_at', table_name='ui_sessions')
    op.drop_index('ix_ui_sessions_tenant', table_name='ui_sessions')
    op.drop_table('ui_sessions')
