"""episode failures: the failure taxonomy's verdict of each episode (``none``, ``agent``,
``environment``, ``infrastructure``, ``verifier``), kept up to date by its steps; rows
written before it are NULL and read as derived from their checks

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28 13:40:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('episodes') as batch_op:
        batch_op.add_column(sa.Column('failure', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('episodes') as batch_op:
        batch_op.drop_column('failure')
