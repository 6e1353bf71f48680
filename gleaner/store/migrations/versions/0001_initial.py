"""Notes, their term index, links and sessions, with each dialect's full-text index.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TS = sa.DateTime(timezone=True)

# PostgreSQL: title weighs most, then topics, then body; 'english' stems words.
PG_SEARCH_VECTOR = (
    "setweight(to_tsvector('english'::regconfig, coalesce(title, '')), 'A') || "
    "setweight(to_tsvector('english'::regconfig, coalesce(topics, '')), 'B') || "
    "setweight(to_tsvector('english'::regconfig, coalesce(body, '')), 'C')"
)

# SQLite: an external-content FTS5 table kept by triggers, so the index changes in the
# same transaction as the row.
SQLITE_FTS = [
    """CREATE VIRTUAL TABLE memories_fts USING fts5(
        title, topics, body, content='memories', content_rowid='id',
        tokenize='porter unicode61 remove_diacritics 2')""",
    """CREATE TRIGGER memories_fts_ai AFTER INSERT ON memories BEGIN
        INSERT INTO memories_fts(rowid, title, topics, body)
        VALUES (new.id, new.title, new.topics, new.body);
    END""",
    """CREATE TRIGGER memories_fts_ad AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts(memories_fts, rowid, title, topics, body)
        VALUES ('delete', old.id, old.title, old.topics, old.body);
    END""",
    """CREATE TRIGGER memories_fts_au AFTER UPDATE OF title, topics, body ON memories BEGIN
        INSERT INTO memories_fts(memories_fts, rowid, title, topics, body)
        VALUES ('delete', old.id, old.title, old.topics, old.body);
        INSERT INTO memories_fts(rowid, title, topics, body)
        VALUES (new.id, new.title, new.topics, new.body);
    END""",
]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "memories",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.String(255), nullable=False),
        sa.Column("slug", sa.String(120), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("type", sa.String(32), nullable=True),
        sa.Column("topics", sa.Text(), nullable=False, server_default=""),
        sa.Column("topic_key", sa.String(255), nullable=True),
        sa.Column("session_id", sa.String(64), nullable=True),
        sa.Column("provenance", sa.String(16), nullable=False),
        sa.Column("source", sa.JSON(), nullable=True),
        sa.Column("confidence", sa.Float(), nullable=True),
        sa.Column("pinned", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("status", sa.String(16), nullable=False, server_default="live"),
        sa.Column(
            "superseded_by_id",
            BigId,
            sa.ForeignKey("memories.id", ondelete="SET NULL"),
            nullable=True,
        ),
        sa.Column("conversation_id", sa.String(255), nullable=True),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("occurred_at", TS, nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("updated_seq", sa.BigInteger(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False, server_default=sa.text("1.0")),
        sa.UniqueConstraint("scope_kind", "scope_id", "slug", name="uq_memories_scope_slug"),
    )
    op.create_index(
        "uq_memories_scope_topic_key",
        "memories",
        ["scope_kind", "scope_id", "topic_key"],
        unique=True,
        sqlite_where=sa.text("topic_key IS NOT NULL"),
        postgresql_where=sa.text("topic_key IS NOT NULL"),
    )
    op.create_index(
        "uq_memories_session_hash",
        "memories",
        ["scope_kind", "scope_id", "session_id", "content_hash"],
        unique=True,
        sqlite_where=sa.text("session_id IS NOT NULL AND topic_key IS NULL"),
        postgresql_where=sa.text("session_id IS NOT NULL AND topic_key IS NULL"),
    )
    op.create_index("ix_memories_scope_seq", "memories", ["scope_kind", "scope_id", "updated_seq"])
    op.create_index("ix_memories_updated_seq", "memories", ["updated_seq"])

    op.create_table(
        "memory_terms",
        sa.Column(
            "memory_id",
            BigId,
            sa.ForeignKey("memories.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("term", sa.String(120), primary_key=True),
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.String(255), nullable=False),
    )
    op.create_index("ix_memory_terms_lookup", "memory_terms", ["scope_kind", "scope_id", "term"])

    op.create_table(
        "memory_links",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column(
            "from_id", BigId, sa.ForeignKey("memories.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("to_id", BigId, sa.ForeignKey("memories.id", ondelete="CASCADE"), nullable=False),
        sa.Column("rel", sa.String(32), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.UniqueConstraint("from_id", "to_id", "rel", name="uq_memory_links_edge"),
    )
    op.create_index("ix_memory_links_to", "memory_links", ["to_id"])

    op.create_table(
        "sessions",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.String(255), nullable=False),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("last_active_at", TS, nullable=False),
        sa.Column("ended_at", TS, nullable=True),
        sa.Column("saves", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column(
            "summary_id",
            BigId,
            sa.ForeignKey("memories.id", ondelete="SET NULL"),
            nullable=True,
        ),
    )
    op.create_index(
        "uq_sessions_active_user",
        "sessions",
        ["user_id"],
        unique=True,
        sqlite_where=sa.text("ended_at IS NULL"),
        postgresql_where=sa.text("ended_at IS NULL"),
    )

    if dialect == "postgresql":
        op.execute("CREATE SEQUENCE memories_updated_seq_seq")
        op.execute(
            f"ALTER TABLE memories ADD COLUMN search_vector tsvector "
            f"GENERATED ALWAYS AS ({PG_SEARCH_VECTOR}) STORED"
        )
        op.execute("CREATE INDEX ix_memories_search ON memories USING gin (search_vector)")
    elif dialect == "sqlite":
        for statement in SQLITE_FTS:
            op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        op.execute("DROP TABLE IF EXISTS memories_fts")
    op.drop_table("sessions")
    op.drop_table("memory_links")
    op.drop_table("memory_terms")
    op.drop_table("memories")
    if dialect == "postgresql":
        op.execute("DROP SEQUENCE IF EXISTS memories_updated_seq_seq")
