"""Search by BM25 over the store's own postings, on both databases; search keywords.

Search used each database's full-text index (PostgreSQL's ``search_vector`` and its GIN
index, SQLite's ``memories_fts`` and its triggers), which demanded every word of a query and
could not weigh a word by how rare it is in the owner's notes. It now reads
``search_postings``: one row per (scope, search term, note) with the term's weighted
frequency and the note's weighted length, from which BM25 is computed the same way on both
databases. The full-text structures are dropped (the writes no longer pay for them).

``memories.search_length`` is NULL until a note is in the new index; this migration adds
the empty table only, and ``gleaner db upgrade`` then indexes the existing notes
(``store.recall.search_index.reindex``, in batches): a migration never runs the live tokenizer.
``memories.keywords`` (and ``memory_versions.keywords``) hold the harvest model's search
keywords.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

# As revision 0001 built them (frozen copies: a migration holds its own text).
PG_SEARCH_VECTOR = (
    "setweight(to_tsvector('english'::regconfig, coalesce(title, '')), 'A') || "
    "setweight(to_tsvector('english'::regconfig, coalesce(topics, '')), 'B') || "
    "setweight(to_tsvector('english'::regconfig, coalesce(body, '')), 'C')"
)
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
    "INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')",
]


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.add_column("memories", sa.Column("keywords", sa.Text(), nullable=False, server_default=""))
    op.add_column("memories", sa.Column("search_length", sa.Float(), nullable=True))
    op.add_column(
        "memory_versions", sa.Column("keywords", sa.Text(), nullable=False, server_default="")
    )
    op.create_table(
        "search_postings",
        sa.Column("scope_kind", sa.String(16), nullable=False),
        sa.Column("scope_id", sa.String(255), nullable=False),
        sa.Column("term", sa.String(64), nullable=False),
        sa.Column(
            "memory_id", BigId, sa.ForeignKey("memories.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("length", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint(
            "scope_kind",
            "scope_id",
            "term",
            "memory_id",
            name="pk_search_postings",
            postgresql_include=["weight", "length"],
        ),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_search_postings_memory", "search_postings", ["memory_id"])
    if dialect == "postgresql":
        op.execute("DROP INDEX IF EXISTS ix_memories_scope_search")
        op.execute("DROP INDEX IF EXISTS ix_memories_search")
        op.execute("ALTER TABLE memories DROP COLUMN IF EXISTS search_vector")
    elif dialect == "sqlite":
        for trigger in ("memories_fts_ai", "memories_fts_ad", "memories_fts_au"):
            op.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        op.execute("DROP TABLE IF EXISTS memories_fts")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.drop_index("ix_search_postings_memory", table_name="search_postings")
    op.drop_table("search_postings")
    op.drop_column("memory_versions", "keywords")
    op.drop_column("memories", "search_length")
    op.drop_column("memories", "keywords")
    op.execute("DELETE FROM housekeeping_state WHERE name = 'search_index'")
    if dialect == "postgresql":
        op.execute(
            f"ALTER TABLE memories ADD COLUMN search_vector tsvector "
            f"GENERATED ALWAYS AS ({PG_SEARCH_VECTOR}) STORED"
        )
        op.execute(
            "CREATE INDEX ix_memories_scope_search ON memories USING gin (scope_id, search_vector)"
        )
    elif dialect == "sqlite":
        for statement in SQLITE_FTS:
            op.execute(statement)
