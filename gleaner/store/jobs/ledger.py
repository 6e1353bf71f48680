"""The harvest ledger: which transcripts a scope has already harvested, and at what cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Executable, Table, bindparam, exists, select, true
from sqlalchemy.dialects import postgresql, sqlite

from gleaner.store.notes.keyed import KEYED, KeyedNote, keyed_notes, keyed_params
from gleaner.store.owners.forget import GENERATION, generation_params, transcript_key
from gleaner.store.schema.records import ForgottenTranscript, HarvestLedger
from gleaner.store.schema.sql import dialect_name
from gleaner.store.schema.tables import utcnow
from gleaner.store.schemas import Scope

if TYPE_CHECKING:
    from gleaner.store.jobs.locks import TranscriptLock
    from gleaner.store.schema.sql import Executor


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
    items_ungrounded: int = 0
    items_instructions: int = 0


_LEDGER = cast(Table, HarvestLedger.__table__)
_KEY = (
    _LEDGER.c.scope_kind == bindparam("kind"),
    _LEDGER.c.scope_id == bindparam("sid"),
    _LEDGER.c.transcript_hash == bindparam("digest"),
    _LEDGER.c.harvester_version == bindparam("version"),
)
# What a harvest checks under the transcript's lock, in one statement.
_STATE = select(
    GENERATION.label("generation"),
    exists().where(ForgottenTranscript.key == bindparam("tombstone")).label("tombstoned"),
    exists().where(*_KEY).label("harvested"),
)
# The same, with the keyed notes the model is shown (``KEYED``) joined on: one row per
# note, in their order (one row of nulls when there are none). PostgreSQL only (LATERAL).
_CHECKED = _STATE.subquery("checked")
_KEYS = KEYED.lateral("keys")
_CHECK = (
    select(_CHECKED, _KEYS.c.topic_key, _KEYS.c.title)
    .select_from(_CHECKED.outerjoin(_KEYS, true()))
    .order_by(_KEYS.c.shared.desc(), _KEYS.c.seq.desc())
)
# The row, written only while the owner's forget count is the one the harvest planned with:
# one statement, so a forget committed since (or a ledger row another harvest wrote) leaves
# nothing written. Built once per dialect: only the parameters change.
_COLUMNS = [column for column in _LEDGER.c if column.name != "id"]
_RECORD = {
    name: insert(_LEDGER)
    .from_select(
        _COLUMNS,
        select(*(bindparam(c.name, type_=c.type) for c in _COLUMNS)).where(
            bindparam("generation") == GENERATION
        ),
    )
    .on_conflict_do_nothing()
    .returning(_LEDGER.c.id)
    for name, insert in (("postgresql", postgresql.insert), ("sqlite", sqlite.insert))
}


def state(
    session: Executor,
    scope: Scope,
    digest: str,
    version: str,
    *,
    conversation_id: str | None = None,
) -> tuple[int, bool]:
    """``(generation, done)``: how many times the owner and its conversation
    ``conversation_id`` were forgotten (``GENERATION``), and whether there is nothing
    to do for this transcript (forgotten: a tombstone; or this scope's ledger holds it at
    this harvester version). What a harvest checks under the transcript's lock."""
    ((found, tombstoned, harvested),) = session.execute(
        _STATE, _state_params(scope, digest, version, conversation_id)
    ).all()
    return int(found), bool(tombstoned or harvested)


Checked = tuple[int, bool, list[KeyedNote]]


def check(
    session: Executor,
    scope: Scope,
    digest: str,
    version: str,
    terms: Sequence[str],
    *,
    keys: int,
    conversation_id: str | None = None,
) -> Checked:
    """``state``, and when there is something to do, at most ``keys`` of the scope's keyed
    notes ranked by ``terms`` (``keyed_notes``). On PostgreSQL one statement: the
    harvest asks this under the transcript's lock, each round trip paid on every job."""
    if dialect_name(session) != "postgresql":
        generation, done = state(session, scope, digest, version, conversation_id=conversation_id)
        found = [] if done else keyed_notes(session, scope, terms, limit=keys)
        return generation, done, found
    statement = _check_statement(
        scope, digest, version, terms, keys, conversation_id=conversation_id
    )
    return _checked(session.execute(*statement).all(), keys)


def check_locked(
    session: Executor,
    lock: TranscriptLock,
    scope: Scope,
    digest: str,
    version: str,
    *,
    terms: Sequence[str],
    keys: int,
    conversation_id: str | None = None,
) -> Checked | None:
    """``check`` once ``lock`` (the transcript's, not held yet) is taken here, or None when
    someone else holds it (nothing checked). The check runs after the lock was granted, so
    it sees any harvest of the transcript committed before."""
    if not lock.try_acquire():
        return None
    return check(session, scope, digest, version, terms, keys=keys, conversation_id=conversation_id)


def _check_statement(
    scope: Scope,
    digest: str,
    version: str,
    terms: Sequence[str],
    keys: int,
    *,
    conversation_id: str | None,
) -> tuple[Executable, Mapping[str, object]]:
    """PostgreSQL's one statement of ``check``: ``_STATE`` alone when no keys are wanted."""
    params = _state_params(scope, digest, version, conversation_id)
    if keys <= 0:
        return _STATE, params
    return _CHECK, {
        **params,
        **keyed_params(scope, terms, keys),
    }


def _checked(rows: Sequence[Any], keys: int) -> Checked:
    """``check``'s answer from the rows of ``_check_statement``'s statement."""
    generation, tombstoned, harvested = rows[0][:3]
    if tombstoned or harvested:
        return int(generation), True, []
    if keys <= 0:  # ``_STATE``'s one row
        return int(generation), False, []
    found = [KeyedNote(str(row.topic_key), row.title) for row in rows if row.topic_key]
    return int(generation), False, found


def _state_params(
    scope: Scope, digest: str, version: str, conversation_id: str | None
) -> dict[str, str]:
    return {
        **generation_params(scope, conversation_id),
        "tombstone": transcript_key(scope, digest),
        "kind": scope.kind,
        "sid": scope.id,
        "digest": digest,
        "version": version,
    }


def record(session: Executor, scope: Scope, entry: LedgerEntry, *, generation: int) -> bool:
    """Add the ledger row, with the final counts, as the last write of a harvest; False (and
    nothing written) when the owner or the entry's conversation was forgotten since
    ``generation`` (``state``'s first value, read for that conversation) or another harvest
    recorded this transcript first. The caller then rolls its transaction back, notes and
    all."""
    params = {
        "scope_kind": scope.kind,
        "scope_id": scope.id,
        "created_at": utcnow(),
        **vars(entry),  # its fields as they are (asdict would deep-copy each value)
        **generation_params(scope, entry.conversation_id),
        "generation": generation,
    }
    return bool(session.execute(_RECORD[dialect_name(session)], params).all())
