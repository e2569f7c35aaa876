"""idempotency keys: one row per (tenant, Idempotency-Key) with the request's digest and,
once it finished, its stored response; the primary key holds a key to one request
across replicas and restarts

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 12:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'idempotency_keys',
        sa.Column('tenant', sa.String(length=64), nullable=False),
        sa.Column('key', sa.String(length=255), nullable=False),
        sa.Column('digest', sa.String(length=64), nullable=False),
        sa.Column('claim', sa.String(length=32), nullable=False),
        sa.Column('status', sa.Integer(), nullable=True),
        sa.Column('body', sa.LargeBinary(), nullable=True),
        sa.Column('claimed_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('tenant', 'key', name='pk_idempotency_keys'),
    )
    op.create_index('ix_idempotency_keys_expires_at', 'idempotency_keys', ['expires_at'])


def downgrade() -> None:
    op.drop_index('ix_idempotency_keys_expires_at', table_name='idempotency_keys')
    op.drop_table('idempotency_keys')
