"""The tables the read commands read, in SQLAlchemy Core, apart from the ORM.

``gleaner search``, ``index`` and ``notes list`` read ``memories``; ``gleaner status`` reads
``jobs`` and ``harvest_ledger`` (and ``status --import`` ``imports``). They read through Core
and never import ``sqlalchemy.orm`` or the declarative models, which cost more at start-up
than the rest of such a command. ``store.schema.models`` maps ``Memory``, ``Job``, ``ImportBatch``
and ``HarvestLedger`` onto these same tables (and every model onto ``METADATA``), and adds
the two partial indexes of ``memories``.
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
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from gleaner.store.text import MODEL_MAX_CHARS

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
    # Search keywords the harvest model gave (synonyms and categories a question may use),
    # normalized as topics are: searchable, never part of the same-fact rule.
    Column("keywords", Text, nullable=False, default="", server_default=""),
    Column("session_id", String(64)),
    Column("provenance", String(16), nullable=False),
    Column("source", JSON),
    # What the note rests on: short verbatim quotes of its conversation, each with its
    # speaker ([{"speaker": "user", "quote": "..."}]); None for a note written without.
    Column("evidence", JSON),
    Column("confidence", Float),
    # "instruction" when the note reads as an instruction to the assistant
    # (store.notes.instructions), else NULL: shown with the note wherever it is recalled.
    Column("flag", String(32)),
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
    # Weighted length of the note in search terms (store.recall.search_terms); NULL until the note
    # is in the search index (a note written before it existed, until `gleaner db reindex`).
    Column("search_length", Float),
    UniqueConstraint("scope_kind", "scope_id", "slug", name="uq_memories_scope_slug"),
    # The two partial unique indexes of mem_save are store.schema.models': their dialect options
    # load the PostgreSQL dialect, which a read on SQLite has no use for.
    Index("ix_memories_scope_seq", "scope_kind", "scope_id", "updated_seq"),
    Index("ix_memories_updated_seq", "updated_seq"),
)

# A note's vector for semantic recall (store.recall.vectors): float32 bytes of ``dimensions`` values
# made by ``model`` from the note's text as it was at ``content_hash``.
MEMORY_VECTORS = Table(
    "memory_vectors",
    METADATA,
    Column("memory_id", BigId, ForeignKey("memories.id", ondelete="CASCADE"), primary_key=True),
    Column("scope_kind", String(16), nullable=False),
    Column("scope_id", String(255), nullable=False),
    Column("model", String(255), nullable=False),
    Column("dimensions", Integer, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("vector", LargeBinary, nullable=False),
    Column("embedded_at", DateTime(timezone=True), nullable=False),
    Index("ix_memory_vectors_scope", "scope_kind", "scope_id", "model", "memory_id"),
    # The newest vector of a scope's model, in one probe: what a cached matrix is checked by.
    Index("ix_memory_vectors_embedded", "scope_kind", "scope_id", "model", "embedded_at"),
)

# What embedding cost, per model and UTC day (YYYY-MM-DD), as the jobs table keeps a
# harvest's: ``gleaner status`` shows it.
EMBEDDING_USAGE = Table(
    "embedding_usage",
    METADATA,
    Column("model", String(255), primary_key=True),
    Column("day", String(10), primary_key=True),
    Column("calls", Integer, nullable=False),
    Column("notes", Integer, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("cost_usd", Float),
)

# What harvest model calls spent per owner and per import and UTC day (YYYY-MM-DD): the
# daily budgets are checked against it before each call (``store.jobs.spend``). ``cost_usd`` sums
# the calls whose price was known.
MODEL_SPEND = Table(
    "model_spend",
    METADATA,
    Column("kind", String(8), primary_key=True),  # "owner" or "import"
    Column("key", String(255), primary_key=True),  # the owner's name, or the import's id
    Column("day", String(10), primary_key=True),
    Column("calls", Integer, nullable=False),
    Column("tokens", Integer, nullable=False),
    Column("cost_usd", Float, nullable=False),
)

# One harvested transcript per (scope, redacted-transcript hash, harvester version).
HARVEST_LEDGER = Table(
    "harvest_ledger",
    METADATA,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("scope_kind", String(16), nullable=False),
    Column("scope_id", String(255), nullable=False),
    Column("transcript_hash", String(64), nullable=False),
    Column("harvester_version", String(255), nullable=False),
    Column("conversation_id", String(255)),
    Column("provenance", String(16), nullable=False),
    Column("occurred_at", DateTime(timezone=True)),
    Column("notes_written", Integer, nullable=False, default=0),
    Column("notes_updated", Integer, nullable=False, default=0),
    Column("notes_skipped", Integer, nullable=False, default=0),
    Column("items_dropped", Integer, nullable=False, default=0),
    Column("items_ungrounded", Integer, nullable=False, default=0, server_default=text("0")),
    Column("items_instructions", Integer, nullable=False, default=0, server_default=text("0")),
    Column("model", String(MODEL_MAX_CHARS), nullable=False),
    Column("model_calls", Integer, nullable=False, default=0),
    Column("prompt_tokens", Integer, nullable=False, default=0),
    Column("completion_tokens", Integer, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
    UniqueConstraint(
        "scope_kind",
        "scope_id",
        "transcript_hash",
        "harvester_version",
        name="uq_harvest_ledger_transcript",
    ),
)

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
JOB_STATES = (PENDING, RUNNING, DONE, FAILED)

# One bulk import (an export file fanned out into one job per conversation).
IMPORTS = Table(
    "imports",
    METADATA,
    Column("id", String(32), primary_key=True),
    Column("source", Text, nullable=False),
    Column("owner", String(255), nullable=False),
    Column("provenance", String(16), nullable=False),
    Column("total", Integer, nullable=False, default=0),
    Column("unreadable", Integer, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
)

# One transcript to harvest (see store.schema.models.Job for what each column records).
JOBS = Table(
    "jobs",
    METADATA,
    Column("id", String(32), primary_key=True),
    Column("queue", String(32), nullable=False),
    Column("state", String(16), nullable=False, default=PENDING),
    Column("owner", String(255), nullable=False),
    Column("provenance", String(16), nullable=False),
    Column("conversation_id", String(255), nullable=False),
    Column("transcript", JSON, nullable=False),
    Column("import_id", String(32), ForeignKey("imports.id", ondelete="CASCADE")),
    Column("attempts", Integer, nullable=False, default=0),
    Column("crashes", Integer, nullable=False, default=0, server_default=text("0")),
    Column("last_error", Text),
    Column("result", JSON),
    Column("created_at", DateTime(timezone=True), nullable=False, default=utcnow),
    Column("enqueued_at", DateTime(timezone=True), nullable=False, default=utcnow),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    Column("heartbeat_at", DateTime(timezone=True)),
    Column("lease_token", String(64)),
    Column("claimed_by", String(255)),
    # sha256 of the redacted transcript (harvest's transcript hash): what a forget of the
    # owner tombstones even when the job never ran.
    Column("transcript_hash", String(64)),
    # What every run of the job cost the model, failed runs included (summed over runs).
    Column("model_calls", Integer, nullable=False, default=0, server_default=text("0")),
    Column("prompt_tokens", Integer, nullable=False, default=0, server_default=text("0")),
    Column("completion_tokens", Integer, nullable=False, default=0, server_default=text("0")),
    Index("ix_jobs_state_enqueued", "state", "enqueued_at"),
    Index("ix_jobs_import_state", "import_id", "state"),
)
