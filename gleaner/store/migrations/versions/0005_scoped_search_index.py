"""PostgreSQL: the full-text GIN index keyed by scope too, so a search reads only its scope.

Every search is scoped. With ``scope_id`` in the GIN index (``btree_gin``), the index itself
intersects a scope's notes with a query's matches, and no other scope's rows are fetched;
the unscoped index it replaces served nothing else. SQLite's FTS5 is unchanged.

``btree_gin`` ships with PostgreSQL (contrib) and is a trusted extension: the database owner
may create it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("CREATE EXTENSION IF NOT EXISTS btree_gin")
    op.execute(
        "CREATE INDEX ix_memories_scope_search ON memories USING gin (scope_id, search_vector)"
    )
    op.execute("DROP INDEX IF EXISTS ix_memories_search")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("CREATE INDEX ix_memories_search ON memories USING gin (search_vector)")
    op.execute("DROP INDEX IF EXISTS ix_memories_scope_search")
