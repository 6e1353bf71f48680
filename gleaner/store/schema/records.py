"""Typed models of the pipeline's records: imports and jobs, the harvest ledger, housekeeping
watermarks, forget tombstones and API keys. ``store.schema.models`` re-exports them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Index, Integer, String, false
from sqlalchemy.orm import Mapped, mapped_column
from sqlalchemy.sql import FromClause

from gleaner.store.schema.orm_base import Base
from gleaner.store.schema.tables import HARVEST_LEDGER, IMPORTS, JOBS, utcnow


class HarvestLedger(Base):
    """One harvested transcript per (scope, redacted-transcript hash, harvester version).

    Written in the same transaction as the notes it produced, so a transcript that arrives
    again (redelivered, retried, re-imported) is recognised and costs no model call. The
    table is ``store.schema.tables.HARVEST_LEDGER``.
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
    is ``store.schema.tables.IMPORTS``."""

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
    is when a message for it was last sent. The table is ``store.schema.tables.JOBS``.
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
    scope and the conversation id, ``store.owners.forget.conversation_key``): a harvest of it
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
