"""Forgetting an owner: the one place the store deletes notes, on explicit request.

After ``forget_owner`` no table holds the owner's name, titles, slugs or words: notes (with
their links, terms and history), sessions, ledger rows, jobs, imports, and the search index
(PostgreSQL's dead rows are vacuumed by ``Store.forget_owner`` after the commit; SQLite
overwrites deleted rows and its write-ahead log is emptied). What stays are hashes: a
tombstone per harvested transcript (so the same transcript harvested again writes nothing,
unless the caller asks otherwise) and the owner's forget generation (so a harvest planned
before the forget writes nothing when it finishes after it).

Forgetting one conversation of an owner (``store.owners.forget_conversation``) shares the lock, the
tombstones and the generation: a harvest checks the sum of its owner's and its
conversation's forget counts (``GENERATION``), so a forget of either since its plan leaves
it writing nothing, and a forget of another conversation of the owner does not stop it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, cast

from sqlalchemy import (
    Connection,
    CursorResult,
    Executable,
    bindparam,
    delete,
    func,
    select,
    text,
    update,
)
from sqlalchemy.orm import Session

from gleaner.store.errors import InvalidInput
from gleaner.store.jobs.spend import forget_owner as forget_spending
from gleaner.store.schema.models import Memory, MemoryVersion, MemSession
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
from gleaner.store.schema.sql import Executor, advisory_key, dialect_insert, dialect_name
from gleaner.store.schema.tables import utcnow
from gleaner.store.schemas import Scope
from gleaner.store.text import check_text


class Connecting(Protocol):
    """What ``held_off`` uses of a ``Store``: typed by shape, so this module need not import
    the facade (which imports it)."""

    @property
    def dialect(self) -> str: ...

    def connection(
        self, *, opening: Sequence[tuple[Executable, Mapping[str, Any]]] | None = None
    ) -> AbstractContextManager[Connection]: ...


# Tables whose dead rows a PostgreSQL forget vacuums right after its commit.
VACUUMED = (
    "memories",
    "memory_versions",
    "memory_terms",
    "search_postings",
    "memory_vectors",
    "memory_links",
    "sessions",
    "harvest_ledger",
    "jobs",
    "imports",
    "api_keys",  # a key for the owner names them
    "model_spend",  # the budget's ledger names them too
)


def owner_key(scope: Scope) -> str:
    """sha256 of the scope: names an owner in tombstones without keeping the name."""
    return hashlib.sha256(f"{scope.kind}\x00{scope.id}".encode()).hexdigest()


def transcript_key(scope: Scope, digest: str) -> str:
    """sha256 of (scope, transcript hash): a tombstone's key."""
    return hashlib.sha256(f"{scope.kind}\x00{scope.id}\x00{digest}".encode()).hexdigest()


def check_conversation_id(value: object) -> str:
    """A conversation id as stored (UTF-8, no NUL, 1 to 255 bytes), or InvalidInput."""
    conversation_id = check_text(value, "conversation_id", max_bytes=255)
    if not conversation_id.strip():
        raise InvalidInput("conversation_id is empty", reason="bad_conversation_id")
    return conversation_id


def conversation_key(scope: Scope, conversation_id: str | None) -> str:
    """sha256 of (scope, conversation id): names one conversation of an owner in
    ``forgotten_conversations`` without keeping either. Its text starts with a word no
    scope kind is, so it is never an owner's or a transcript's key."""
    text = f"conversation\x00{scope.kind}\x00{scope.id}\x00{conversation_id or ''}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def generation_params(scope: Scope, conversation_id: str | None) -> dict[str, str]:
    """The parameters ``GENERATION`` reads: the owner's key and the conversation's."""
    return {
        "owner_key": owner_key(scope),
        "conversation_key": conversation_key(scope, conversation_id),
    }


def lock_key(scope: Scope) -> int:
    """Advisory lock key (PostgreSQL) that forget holds exclusively and a harvest's write
    shared, so a harvest never writes between a forget's check and its commit."""
    return advisory_key("forget", scope.kind, scope.id)


def count(session: Session, statement: Executable) -> int:
    """Run a DELETE (or UPDATE) and return how many rows it changed."""
    return int(cast("CursorResult[Any]", session.execute(statement)).rowcount)


_SHARED_LOCK = text("SELECT pg_advisory_xact_lock_shared(:k)")  # a job takes it
_EXCLUSIVE_LOCK = text("SELECT pg_advisory_xact_lock(:k)")  # a forget takes it
# How many times the owner of ``:owner_key`` was forgotten, plus how many times its
# conversation of ``:conversation_key`` was (0: never). Both only grow, so the sum is the
# same exactly when neither changed.
GENERATION = func.coalesce(
    select(ForgottenOwner.generation)
    .where(ForgottenOwner.owner_key == bindparam("owner_key"))
    .scalar_subquery(),
    0,
) + func.coalesce(
    select(ForgottenConversation.generation)
    .where(ForgottenConversation.key == bindparam("conversation_key"))
    .scalar_subquery(),
    0,
)


# Where ``held_off`` marks its connection (``Connection.info``) while the transaction lasts:
# a harvest checks it is in one.
HELD_OFF = "gleaner.forget_held_off"


@contextmanager
def held_off(store: Connecting, scope: Scope) -> Iterator[Connection]:
    """A transaction on a Core connection that opens holding off a forget of ``scope`` (or
    of one of its conversations), as ``hold_off`` does: a harvest records its notes in one,
    its ledger row written only while the forget count it planned with still holds
    (``store.jobs.ledger.record``), which no forget can change before the transaction ends."""
    opening: list[tuple[Executable, Mapping[str, Any]]] | None = None
    if store.dialect == "postgresql":
        opening = [(_SHARED_LOCK, {"k": lock_key(scope)})]
    with store.connection(opening=opening) as held:
        # The connection's info outlives the transaction (it goes back to the pool with it).
        held.info[HELD_OFF] = scope
        try:
            yield held
        finally:
            held.info.pop(HELD_OFF, None)


def is_held_off(session: Executor, scope: Scope) -> bool:
    """True inside a ``held_off`` transaction for ``scope``."""
    return bool(session.info.get(HELD_OFF) == scope)


def lock_out(session: Session, scope: Scope) -> None:
    """Wait for every harvest recording notes in ``scope`` and every other forget of it to
    end, and keep them out until this transaction ends (PostgreSQL: the forget lock,
    exclusive; SQLite has one writer anyway). A forget takes it first."""
    if dialect_name(session) == "postgresql":
        session.execute(_EXCLUSIVE_LOCK, {"k": lock_key(scope)})


def hold_off(session: Executor, scope: Scope) -> None:
    """Keep a forget of the owner from committing until this transaction ends (PostgreSQL:
    the forget lock, shared). A harvest takes it before it writes, then writes its ledger row
    only if the owner's forget count is still the planned one (``store.jobs.ledger.record``)."""
    if dialect_name(session) == "postgresql":
        session.execute(_SHARED_LOCK, {"k": lock_key(scope)})


def forget_owner(session: Session, principal: str, *, tombstones: bool = True) -> dict[str, int]:
    """Delete everything stored for ``principal``; returns the counts.

    With ``tombstones`` (the default) each harvested transcript leaves a hash, so harvesting
    it again writes nothing; without, the owner's tombstones (of earlier forgets too) are
    removed, so every conversation may come back. Links, term rows and search postings go
    with their notes (ON DELETE CASCADE). Global notes are kept.
    """
    scope = Scope.owner(principal)
    principal = scope.id  # as stored: normalized by the owner rule
    lock_out(session, scope)
    in_scope = (Memory.scope_kind == scope.kind, Memory.scope_id == scope.id)
    in_ledger = (HarvestLedger.scope_kind == scope.kind, HarvestLedger.scope_id == scope.id)
    now = utcnow()
    owner = owner_key(scope)
    buried = 0
    if tombstones:
        # Harvested transcripts (the ledger) and those still waiting or running (jobs).
        harvested = session.execute(select(HarvestLedger.transcript_hash).where(*in_ledger))
        waiting = session.execute(
            select(Job.transcript_hash).where(
                Job.owner == principal, Job.transcript_hash.is_not(None)
            )
        )
        digests = sorted({str(d) for d in (*harvested.scalars(), *waiting.scalars())})
        rows = [
            {"key": transcript_key(scope, d), "owner_key": owner, "forgotten_at": now}
            for d in digests
        ]
        if rows:
            session.execute(
                dialect_insert(session, ForgottenTranscript).on_conflict_do_nothing(), rows
            )
        buried = len(rows)
    else:
        clear_tombstones(session, principal)
    session.execute(
        dialect_insert(session, ForgottenOwner)
        .values(owner_key=owner, generation=1, forgotten_at=now)
        .on_conflict_do_update(
            index_elements=["owner_key"],
            set_={"generation": ForgottenOwner.generation + 1, "forgotten_at": now},
        )
    )
    # Clear self-references first so no row points at one already deleted.
    session.execute(update(Memory).where(*in_scope).values(superseded_by_id=None))
    versions = count(
        session,
        delete(MemoryVersion).where(
            MemoryVersion.scope_kind == scope.kind, MemoryVersion.scope_id == scope.id
        ),
    )
    counts = {
        "notes": count(session, delete(Memory).where(*in_scope)),
        "versions": versions,
        "sessions": count(session, delete(MemSession).where(MemSession.user_id == principal)),
        "ledger": count(session, delete(HarvestLedger).where(*in_ledger)),
        "jobs": count(session, delete(Job).where(Job.owner == principal)),
        "imports": count(session, delete(ImportBatch).where(ImportBatch.owner == principal)),
        # A key allowed only this owner is no use once the owner is gone, and holds the name.
        "api_keys": count(session, delete(ApiKey).where(ApiKey.owner == principal)),
        # The daily budget's ledger is keyed by the owner's name.
        "spend": forget_spending(session, principal),
        "tombstones": buried,
    }
    scrub_housekeeping(session)
    return counts


def scrub_housekeeping(session: Session) -> None:
    """Drop reported pairs (scopes and slugs) from housekeeping results kept before they
    stopped keeping them."""
    rows = session.execute(
        select(HousekeepingState.name, HousekeepingState.last_result).where(
            HousekeepingState.last_result.is_not(None)
        )
    ).all()
    for name, result in rows:
        if isinstance(result, dict) and "pairs" in result:
            kept = {k: v for k, v in result.items() if k != "pairs"}
            session.execute(
                update(HousekeepingState)
                .where(HousekeepingState.name == name)
                .values(last_result=kept)
            )


def clear_tombstones(session: Session, principal: str) -> int:
    """Remove an owner's tombstones, so its forgotten transcripts may be harvested again."""
    scope = Scope.owner(principal)
    return count(
        session,
        delete(ForgottenTranscript).where(ForgottenTranscript.owner_key == owner_key(scope)),
    )
