"""The harvest ledger: which transcripts a scope has already harvested, and at what cost."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from store.models import ForgottenOwner, HarvestLedger, utcnow
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
# The row, written only while the owner's forget count is the one the harvest planned with:
# one statement, so a forget committed since (or a ledger row another harvest wrote) leaves
# nothing written. Built once per dialect: only the parameters change.
_COLUMNS = [column for column in _LEDGER.c if column.name != "id"]
_UNFORGOTTEN = func.coalesce(
    select(ForgottenOwner.generation)
    .where(ForgottenOwner.owner_key == bindparam("owner_key"))
    .scalar_subquery(),
    0,
) == bindparam("generation")
_RECORD = {
    name: insert(_LEDGER)
    .from_select(
        _COLUMNS,
        select(*(bindparam(c.name, type_=c.type) for c in _COLUMNS)).where(_UNFORGOTTEN),
    )
    .on_conflict_do_nothing()
    .returning(_LEDGER.c.id)
    for name, insert in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
}


def _key(scope: Scope, digest: str, version: str) -> dict[str, str]:
    return {"kind": scope.kind, "sid": scope.id, "digest": digest, "version": version}


def record(
    session: Session, scope: Scope, entry: LedgerEntry, *, owner_key: str, generation: int
) -> bool:
    """Add the ledger row, with the final counts, as the last write of a harvest; False (and
    nothing written) when another harvest recorded this transcript first or the owner was
    forgotten since ``generation`` (``owner_key``: ``store.forget.owner_key``). The caller
    then rolls its transaction back, notes and all."""
    stmt = _RECORD[session.get_bind().dialect.name]
    row = {
        "scope_kind": scope.kind,
        "scope_id": scope.id,
        "created_at": utcnow(),
        **asdict(entry),
        "owner_key": owner_key,
        "generation": generation,
    }
    return session.execute(stmt, row).scalar_one_or_none() is not None


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
