"""The ``memories`` table in SQLAlchemy Core, apart from the ORM.

The read commands (``gleaner search``, ``index``, ``notes list``) read this table only, so
they read it through Core and never import ``sqlalchemy.orm`` or the declarative models,
which cost more at start-up than the rest of such a command. ``store.models`` maps ``Memory``
onto this same table (and every model onto ``METADATA``) and adds its two partial indexes.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid FTS5 keys on).
BigId = BigInteger().with_variant(Integer(), "sqlite")

LIVE = "live"
SUPERSEDED = "superseded"
ARCHIVED = "archived"


def utcnow() -> datetime:
    return datetime.now(UTC)


# Every table of the store (the models add theirs); migrations compare against it.
METADATA = MetaData()

# One durable note. NOT NULL where the model's attribute is not Optional.
MEMORIES = Table(
    "memories",
    METADATA,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("scope_kind", String(16), nullable=False),
    Column("scope_id", String(255), nullable=False),
    Column("slug", String(120), nullable=False),
    Column("title", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("type", String(32)),
    Column("topics", Text, nullable=False, default="", server_default=""),
    Column("topic_key", String(255)),
    Column("session_id", String(64)),
    Column("provenance", String(16), nullable=False),
    Column("source", JSON),
    Column("confidence", Float),
    Column("pinned", Boolean, nullable=False, default=False, server_default=text("false")),
    Column("status", String(16), nullable=False, default=LIVE, server_default=LIVE),
    Column("superseded_by_id", BigId, ForeignKey("memories.id", ondelete="SET NULL")),
    Column("conversation_id", String(255)),
    Column("content_hash", String(64), nullable=False),
    # When the conversation of origin happened, apart from when the note was written.
    Column("occurred_at", DateTime(timezone=True)),
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
    Column("updated_at", DateTime(timezone=True), nullable=False, default=utcnow),
    Column("updated_seq", BigInteger, nullable=False),
    # Recency-decayed weight kept current by housekeeping (1.0 when fresh).
    Column("weight", Float, nullable=False, default=1.0, server_default=text("1.0")),
    # Size of the note's similarity term set (rows in memory_terms): Jaccard in SQL.
    Column("term_count", Integer, nullable=False, default=0, server_default=text("0")),
    UniqueConstraint("scope_kind", "scope_id", "slug", name="uq_memories_scope_slug"),
    # The two partial unique indexes of mem_save are store.models': their dialect options
    # load the PostgreSQL dialect, which a read on SQLite has no use for.
    Index("ix_memories_scope_seq", "scope_kind", "scope_id", "updated_seq"),
    Index("ix_memories_updated_seq", "updated_seq"),
)
