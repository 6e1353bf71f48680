"""Superseding: ``keeper supersedes loser``, written in one place.

``store.notes.links.link`` (one pair a caller asks for) and ``store.housekeeping.dedupe`` (the
pairs it found)
both take the scopes' locks with ``lock_scopes`` and write with ``write``. Each checks its own
preconditions in between: ``link`` refuses a cycle and a second superseder; dedupe writes a
pair only when both notes are still live, unsuperseded and as it read them, which implies
the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import text, update
from sqlalchemy.orm import Session

from gleaner.store.schema.models import Link, Memory
from gleaner.store.schema.sql import dialect_insert, dialect_name, next_seqs, scope_key, xact_locks
from gleaner.store.schema.tables import SUPERSEDED, utcnow
from gleaner.store.schemas import Scope

LOCK_PURPOSE = "supersedes"

# PostgreSQL: every pair in one statement, each loser numbered from the sequence as it is set.
_SUPERSEDE_PG = text(
    "UPDATE memories SET status = :status, superseded_by_id = pair.keeper,"
    " updated_at = :now, updated_seq = nextval('memories_updated_seq_seq')"
    " FROM unnest(CAST(:losers AS bigint[]), CAST(:keepers AS bigint[])) AS pair(loser, keeper)"
    " WHERE memories.id = pair.loser"
)


def lock_scopes(session: Session, scopes: Iterable[Scope]) -> None:
    """Serialize supersede edits per scope (PostgreSQL), so two writers cannot close a cycle."""
    xact_locks(session, [scope_key(LOCK_PURPOSE, scope.kind, scope.id) for scope in scopes])


def write(
    session: Session, pairs: Sequence[tuple[int, int]], *, now: datetime | None = None
) -> None:
    """Mark each ``(keeper_id, loser_id)``'s loser superseded by its keeper and link the two.

    The loser gets status ``superseded``, its superseder, a new ``updated_at`` and
    ``updated_seq`` (its scope's fingerprint changes); the ``supersedes`` link is added once.
    The caller holds the scopes' locks and has checked the pairs.
    """
    if not pairs:
        return
    now = now or utcnow()
    if dialect_name(session) == "postgresql":
        session.execute(
            _SUPERSEDE_PG,
            {
                "losers": [loser for _, loser in pairs],
                "keepers": [keeper for keeper, _ in pairs],
                "status": SUPERSEDED,
                "now": now,
            },
        )
    else:
        session.execute(
            update(Memory).execution_options(synchronize_session=False),
            [
                {
                    "id": loser,
                    "status": SUPERSEDED,
                    "superseded_by_id": keeper,
                    "updated_at": now,
                    "updated_seq": seq,
                }
                for (keeper, loser), seq in zip(pairs, next_seqs(session, len(pairs)), strict=True)
            ],
        )
    session.execute(
        dialect_insert(session, Link).on_conflict_do_nothing(),
        [
            {"from_id": keeper, "to_id": loser, "rel": "supersedes", "created_at": now}
            for keeper, loser in pairs
        ],
    )
