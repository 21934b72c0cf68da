"""merge serving control (0002) and pricing books (0003)

Revision ID: 0004
Revises: 0002, 0003
"""

revision = "0004"
down_revision = ("0002", "0003")
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
