"""The harvest ledger: which transcripts a scope has already harvested, and at what cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from store.models import HarvestLedger, utcnow
from store.schemas import Scope


@dataclass(frozen=True)
class LedgerEntry:
    """What one harvest of one transcript produced and cost."""

    transcript_hash: str
    harvester_version: str
    conversation_id: str | None
    provenance: str
    occurred_at: datetime | None
    notes_written: int
    notes_updated: int
    notes_skipped: int
    items_dropped: int
    model: str
    model_calls: int
    prompt_tokens: int
    completion_tokens: int


def already_harvested(session: Session, scope: Scope, digest: str, version: str) -> bool:
    """True when this scope has a ledger row for the transcript hash and harvester version."""
    return (
        session.execute(
            select(HarvestLedger.id).where(
                HarvestLedger.scope_kind == scope.kind,
                HarvestLedger.scope_id == scope.id,
                HarvestLedger.transcript_hash == digest,
                HarvestLedger.harvester_version == version,
            )
        ).first()
        is not None
    )


def record(session: Session, scope: Scope, entry: LedgerEntry) -> bool:
    """Add the ledger row; False (and nothing written) when another harvest recorded it first.

    Call it before writing the notes, in the same transaction: the loser of a race then
    rolls back instead of writing a second set.
    """
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = (
        insert(HarvestLedger)
        .values(scope_kind=scope.kind, scope_id=scope.id, created_at=utcnow(), **asdict(entry))
        .on_conflict_do_nothing()
        .returning(HarvestLedger.id)
    )
    return session.execute(stmt).scalar_one_or_none() is not None


def update_counts(
    session: Session,
    scope: Scope,
    digest: str,
    version: str,
    *,
    written: int,
    updated: int,
    skipped: int,
) -> None:
    """Set the note counts once the notes are written (same transaction as ``record``)."""
    row = session.execute(
        select(HarvestLedger).where(
            HarvestLedger.scope_kind == scope.kind,
            HarvestLedger.scope_id == scope.id,
            HarvestLedger.transcript_hash == digest,
            HarvestLedger.harvester_version == version,
        )
    ).scalar_one()
    row.notes_written, row.notes_updated, row.notes_skipped = written, updated, skipped


def totals(session: Session) -> dict[str, int]:
    """Harvest totals over the whole ledger (for status displays)."""
    row = session.execute(
        select(
            func.count(),
            func.coalesce(func.sum(HarvestLedger.model_calls), 0),
            func.coalesce(func.sum(HarvestLedger.prompt_tokens), 0),
            func.coalesce(func.sum(HarvestLedger.completion_tokens), 0),
        )
    ).one()
    return {
        "transcripts": int(row[0]),
        "model_calls": int(row[1]),
        "prompt_tokens": int(row[2]),
        "completion_tokens": int(row[3]),
    }
