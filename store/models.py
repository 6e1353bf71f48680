"""Typed SQLAlchemy models of the store's tables.

``Memory``, ``Job``, ``ImportBatch`` and ``HarvestLedger`` are mapped onto the Core tables of
``store.tables``, which the read commands use without the ORM; every other table is declared
here, in the same ``METADATA``.

The search index is ``SEARCH_POSTINGS``, a Core table written by ``store.search_index`` (search
reads it through text SQL, without the ORM).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

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
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql import FromClause

from store.tables import (
    ARCHIVED,
    DONE,
    FAILED,
    HARVEST_LEDGER,
    IMPORTS,
    JOB_STATES,
    JOBS,
    LIVE,
    MEMORIES,
    METADATA,
    PENDING,
    RUNNING,
    SUPERSEDED,
    BigId,
    utcnow,
)


class Base(DeclarativeBase):
    metadata = METADATA
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        datetime: DateTime(timezone=True),
    }


class Memory(Base):
    """One durable note (the ``memories`` table of the first seed): its columns, defaults and
    plain indexes are ``store.tables.MEMORIES`` (its partial ones follow the class); these
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
# frequency in the note and ``length`` the note's weighted length (store.search_terms), so
# BM25 is computed from this table alone. Rows are written and deleted with their note's
# text, in the same transaction. Declared here, not in store.tables: its PostgreSQL INCLUDE
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


class HarvestLedger(Base):
    """One harvested transcript per (scope, redacted-transcript hash, harvester version).

    Written in the same transaction as the notes it produced, so a transcript that arrives
    again (redelivered, retried, re-imported) is recognised and costs no model call. The
    table is ``store.tables.HARVEST_LEDGER``.
    """

    __table__: ClassVar[FromClause] = HARVEST_LEDGER

    id: Mapped[int]
    scope_kind: Mapped[str]
    scope_id: Mapped[str]
    transcript_hash: Mapped[str]
    harvester_version: Mapped[str]
    conversation_id: Mapped[str | None]
    provenance: Mapped[str]
    occurred_at: Mapped[datetime | None]
    notes_written: Mapped[int]
    notes_updated: Mapped[int]
    notes_skipped: Mapped[int]
    items_dropped: Mapped[int]
    items_ungrounded: Mapped[int]
    items_instructions: Mapped[int]
    model: Mapped[str]
    model_calls: Mapped[int]
    prompt_tokens: Mapped[int]
    completion_tokens: Mapped[int]
    created_at: Mapped[datetime]


class ImportBatch(Base):
    """One bulk import (an export file fanned out into one job per conversation); the table
    is ``store.tables.IMPORTS``."""

    __table__: ClassVar[FromClause] = IMPORTS

    id: Mapped[str]
    source: Mapped[str]
    owner: Mapped[str]
    provenance: Mapped[str]
    total: Mapped[int]
    unreadable: Mapped[int]
    created_at: Mapped[datetime]


class Job(Base):
    """One transcript to harvest: the database, not the queue, is the record of every job.

    The transcript is stored already redacted; the queue message carries only the job id.
    A ``running`` job is leased: ``lease_token`` names the delivery (Celery task id) that
    claimed it, ``claimed_by`` the process (``host:pid``), and ``heartbeat_at`` is renewed
    while it runs. ``crashes`` counts the times its worker was lost mid-run; ``enqueued_at``
    is when a message for it was last sent. The table is ``store.tables.JOBS``.
    """

    __table__: ClassVar[FromClause] = JOBS

    id: Mapped[str]
    queue: Mapped[str]
    state: Mapped[str]
    owner: Mapped[str]
    provenance: Mapped[str]
    conversation_id: Mapped[str]
    transcript: Mapped[dict[str, Any]]
    import_id: Mapped[str | None]
    attempts: Mapped[int]
    crashes: Mapped[int]
    last_error: Mapped[str | None]
    result: Mapped[dict[str, Any] | None]
    created_at: Mapped[datetime]
    enqueued_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    lease_token: Mapped[str | None]
    claimed_by: Mapped[str | None]
    transcript_hash: Mapped[str | None]
    model_calls: Mapped[int]
    prompt_tokens: Mapped[int]
    completion_tokens: Mapped[int]


class HousekeepingState(Base):
    """Where each housekeeping task got to (its ``updated_seq`` watermark) and when."""

    __tablename__ = "housekeeping_state"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    watermark: Mapped[int] = mapped_column(BigInteger, default=0)
    last_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_result: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class ForgottenTranscript(Base):
    """A tombstone: a transcript of a forgotten owner, so harvesting it again writes nothing.

    ``key`` is sha256 of (scope, transcript hash) and ``owner_key`` sha256 of the owner: the
    owner's name and words are not kept, only what recognises the same transcript again.
    """

    __tablename__ = "forgotten_transcripts"
    __table_args__ = (Index("ix_forgotten_transcripts_owner", "owner_key"),)

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner_key: Mapped[str] = mapped_column(String(64))
    forgotten_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ForgottenOwner(Base):
    """How many times an owner was forgotten (``owner_key``: sha256 of the owner): a harvest
    planned before the latest forget writes nothing, whatever it was doing meanwhile."""

    __tablename__ = "forgotten_owners"

    owner_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    forgotten_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ForgottenConversation(Base):
    """How many times one conversation of an owner was forgotten (``key``: sha256 of the
    scope and the conversation id, ``store.forget.conversation_key``): a harvest of it
    planned before the latest forget writes nothing, as for a forgotten owner."""

    __tablename__ = "forgotten_conversations"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, default=1)
    forgotten_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKey(Base):
    """An API key of the HTTP service (see ``store.keys``): the sha256 of its token, the
    one owner it is allowed (NULL: every owner) and whether it may only read. Revoking
    deletes the row."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    owner: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # A read-only key searches and reads; it cannot submit, pin, delete or forget.
    read_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


# What other modules import from here (the statuses, job states, utcnow and BigId live in
# store.tables).
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
