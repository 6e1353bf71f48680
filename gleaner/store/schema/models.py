"""Typed SQLAlchemy models of the store's tables.

``Memory``, ``Job``, ``ImportBatch`` and ``HarvestLedger`` are mapped onto the Core tables of
``store.schema.tables``, which the read commands use without the ORM; every other table is declared
here, in the same ``METADATA``.

The search index is ``SEARCH_POSTINGS``, a Core table written by ``store.recall.search_index``
(search
reads it through text SQL, without the ORM).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.sql import FromClause

from gleaner.store.schema.orm_base import Base
from gleaner.store.schema.records import (
    ApiKey,
    ForgottenConversation,
    ForgottenOwner,
    ForgottenTranscript,
    HarvestLedger,
    HousekeepingState,
    ImportBatch,
    Job,
)
from gleaner.store.schema.tables import (
    ARCHIVED,
    DONE,
    FAILED,
    JOB_STATES,
    LIVE,
    MEMORIES,
    METADATA,
    PENDING,
    RUNNING,
    SUPERSEDED,
    BigId,
    utcnow,
)


class Memory(Base):
    """One durable note (the ``memories`` table of the first seed): its columns, defaults and
    plain indexes are ``store.schema.tables.MEMORIES`` (its partial ones follow the class); these
    annotations type the mapped attributes."""

    # Typed as DeclarativeBase types it, as every other model's is.
    __table__: ClassVar[FromClause] = MEMORIES

    id: Mapped[int]
    scope_kind: Mapped[str]
    scope_id: Mapped[str]
    slug: Mapped[str]
    title: Mapped[str]
    body: Mapped[str]
    type: Mapped[str | None]
    topics: Mapped[str]
    topic_key: Mapped[str | None]
    keywords: Mapped[str]
    session_id: Mapped[str | None]
    provenance: Mapped[str]
    source: Mapped[dict[str, Any] | None]
    evidence: Mapped[list[dict[str, str]] | None]
    confidence: Mapped[float | None]
    flag: Mapped[str | None]
    pinned: Mapped[bool]
    status: Mapped[str]
    superseded_by_id: Mapped[int | None]
    conversation_id: Mapped[str | None]
    content_hash: Mapped[str]
    occurred_at: Mapped[datetime | None]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    updated_seq: Mapped[int]
    weight: Mapped[float]
    term_count: Mapped[int]
    search_length: Mapped[float | None]


# mem_save: same topic_key + same user upserts in place.
Index(
    "uq_memories_scope_topic_key",
    MEMORIES.c.scope_kind,
    MEMORIES.c.scope_id,
    MEMORIES.c.topic_key,
    unique=True,
    sqlite_where=text("topic_key IS NOT NULL"),
    postgresql_where=text("topic_key IS NOT NULL"),
)
# mem_save: identical content in one session is saved once.
Index(
    "uq_memories_session_hash",
    MEMORIES.c.scope_kind,
    MEMORIES.c.scope_id,
    MEMORIES.c.session_id,
    MEMORIES.c.content_hash,
    unique=True,
    sqlite_where=text("session_id IS NOT NULL AND topic_key IS NULL"),
    postgresql_where=text("session_id IS NOT NULL AND topic_key IS NULL"),
)


# The search index: one row per (note, search term), keyed by scope and term first, so a
# query reads only its scope's postings of its own words. ``weight`` is the term's weighted
# frequency in the note and ``length`` the note's weighted length (store.recall.search_terms), so
# BM25 is computed from this table alone. Rows are written and deleted with their note's
# text, in the same transaction. Declared here, not in store.schema.tables: its PostgreSQL INCLUDE
# loads that dialect, which a read command on SQLite has no use for (search reads the table
# through text SQL).
SEARCH_POSTINGS = Table(
    "search_postings",
    METADATA,
    Column("scope_kind", String(16), nullable=False),
    Column("scope_id", String(255), nullable=False),
    Column("term", String(64), nullable=False),
    Column("memory_id", BigId, ForeignKey("memories.id", ondelete="CASCADE"), nullable=False),
    Column("weight", Float, nullable=False),
    Column("length", Float, nullable=False),
    # PostgreSQL: the scores' two columns in the key's index too (an index-only read);
    # SQLite: the table is its key's b-tree.
    PrimaryKeyConstraint(
        "scope_kind",
        "scope_id",
        "term",
        "memory_id",
        name="pk_search_postings",
        postgresql_include=["weight", "length"],
    ),
    sqlite_with_rowid=False,
)
Index("ix_search_postings_memory", SEARCH_POSTINGS.c.memory_id)


class MemoryTerm(Base):
    """Inverted index of a note's title and topic words: candidates for Jaccard similarity."""

    __tablename__ = "memory_terms"
    __table_args__ = (Index("ix_memory_terms_lookup", "scope_kind", "scope_id", "term"),)

    memory_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("memories.id", ondelete="CASCADE"), primary_key=True
    )
    term: Mapped[str] = mapped_column(String(120), primary_key=True)
    scope_kind: Mapped[str] = mapped_column(String(16))
    scope_id: Mapped[str] = mapped_column(String(255))


class MemoryVersion(Base):
    """A note's text as it was before a change: no rewrite destroys what it replaces.

    ``written_*`` describe the replaced version (when and by which conversation and
    provenance it was written); ``changed_*`` and ``reason`` describe the change that replaced
    it. Deleted only with its note (``forget``).
    """

    __tablename__ = "memory_versions"
    __table_args__ = (Index("ix_memory_versions_memory", "memory_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    memory_id: Mapped[int] = mapped_column(BigId, ForeignKey("memories.id", ondelete="CASCADE"))
    scope_kind: Mapped[str] = mapped_column(String(16))
    scope_id: Mapped[str] = mapped_column(String(255))
    slug: Mapped[str] = mapped_column(String(120))
    title: Mapped[str] = mapped_column(Text)
    body: Mapped[str] = mapped_column(Text)
    topics: Mapped[str] = mapped_column(Text, default="")
    keywords: Mapped[str] = mapped_column(Text, default="", server_default="")
    type: Mapped[str | None] = mapped_column(String(32))
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    confidence: Mapped[float | None] = mapped_column(Float)
    evidence: Mapped[list[dict[str, str]] | None] = mapped_column(JSON)
    # When this version's fact was said (its conversation's time), if known.
    occurred_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    written_provenance: Mapped[str] = mapped_column(String(16))
    written_conversation_id: Mapped[str | None] = mapped_column(String(255))
    written_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str] = mapped_column(String(32))
    changed_provenance: Mapped[str] = mapped_column(String(16))
    changed_conversation_id: Mapped[str | None] = mapped_column(String(255))
    changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Link(Base):
    """A ``related``, ``derived_from`` or ``supersedes`` edge between two notes."""

    __tablename__ = "memory_links"
    __table_args__ = (
        UniqueConstraint("from_id", "to_id", "rel", name="uq_memory_links_edge"),
        Index("ix_memory_links_to", "to_id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    from_id: Mapped[int] = mapped_column(BigId, ForeignKey("memories.id", ondelete="CASCADE"))
    to_id: Mapped[int] = mapped_column(BigId, ForeignKey("memories.id", ondelete="CASCADE"))
    rel: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class MemSession(Base):
    """A mem_save session: at most one active (not ended) per user."""

    __tablename__ = "sessions"
    __table_args__ = (
        Index(
            "uq_sessions_active_user",
            "user_id",
            unique=True,
            sqlite_where=text("ended_at IS NULL"),
            postgresql_where=text("ended_at IS NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_active_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    saves: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    summary_id: Mapped[int | None] = mapped_column(
        BigId, ForeignKey("memories.id", ondelete="SET NULL")
    )


# What other modules import from here: the statuses, job states, utcnow and BigId live in
# store.schema.tables, the pipeline's records in store.schema.records.
__all__ = [
    "ARCHIVED",
    "DONE",
    "FAILED",
    "JOB_STATES",
    "LIVE",
    "PENDING",
    "RUNNING",
    "SUPERSEDED",
    "ApiKey",
    "Base",
    "BigId",
    "ForgottenConversation",
    "ForgottenOwner",
    "ForgottenTranscript",
    "HarvestLedger",
    "HousekeepingState",
    "ImportBatch",
    "Job",
    "Link",
    "MemSession",
    "Memory",
    "MemoryTerm",
    "MemoryVersion",
    "utcnow",
]
