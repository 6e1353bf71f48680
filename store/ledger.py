"""The harvest ledger: which transcripts a scope has already harvested, and at what cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, func, select, update
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


_LEDGER = cast(Table, HarvestLedger.__table__)
_KEY = (
    _LEDGER.c.scope_kind == bindparam("kind"),
    _LEDGER.c.scope_id == bindparam("sid"),
    _LEDGER.c.transcript_hash == bindparam("digest"),
    _LEDGER.c.harvester_version == bindparam("version"),
)
# Built once: only the parameters change from transcript to transcript.
_RECORD = {
    name: insert(_LEDGER).on_conflict_do_nothing().returning(_LEDGER.c.id)
    for name, insert in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
}
_SET_COUNTS = (
    update(_LEDGER)
    .where(*_KEY)
    .values(
        notes_written=bindparam("written"),
        notes_updated=bindparam("updated"),
        notes_skipped=bindparam("skipped"),
    )
)


def _key(scope: Scope, digest: str, version: str) -> dict[str, str]:
    return {"kind": scope.kind, "sid": scope.id, "digest": digest, "version": version}


def record(session: Session, scope: Scope, entry: LedgerEntry) -> bool:
    """Add the ledger row; False (and nothing written) when another harvest recorded it first.

    Call it before writing the notes, in the same transaction: the loser of a race then
    rolls back instead of writing a second set.
    """
    stmt = _RECORD[session.get_bind().dialect.name]
    row = {"scope_kind": scope.kind, "scope_id": scope.id, "created_at": utcnow(), **asdict(entry)}
    return session.execute(stmt, row).scalar_one_or_none() is not None


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
    session.execute(
        _SET_COUNTS,
        {
            **_key(scope, digest, version),
            "written": written,
            "updated": updated,
            "skipped": skipped,
        },
    )


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
