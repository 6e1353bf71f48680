"""Forgetting an owner: the one place the store deletes notes, on explicit request."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, Executable, delete, update
from sqlalchemy.orm import Session

from store.models import HarvestLedger, Job, Memory, MemSession
from store.schemas import Scope


def _count(session: Session, statement: Executable) -> int:
    """Run a DELETE and return how many rows it removed."""
    return int(cast("CursorResult[Any]", session.execute(statement)).rowcount)


def forget_owner(session: Session, principal: str) -> dict[str, int]:
    """Delete every note, session, ledger row and job of ``principal``; returns the counts.

    Links and term rows go with their notes (ON DELETE CASCADE). Global notes are kept.
    """
    scope = Scope.owner(principal)
    principal = scope.id  # as stored: normalized by the owner rule
    in_scope = (Memory.scope_kind == scope.kind, Memory.scope_id == scope.id)
    # Clear self-references first so no row points at one already deleted.
    session.execute(update(Memory).where(*in_scope).values(superseded_by_id=None))
    in_ledger = (HarvestLedger.scope_kind == scope.kind, HarvestLedger.scope_id == scope.id)
    return {
        "notes": _count(session, delete(Memory).where(*in_scope)),
        "sessions": _count(session, delete(MemSession).where(MemSession.user_id == principal)),
        "ledger": _count(session, delete(HarvestLedger).where(*in_ledger)),
        "jobs": _count(session, delete(Job).where(Job.owner == principal)),
    }
