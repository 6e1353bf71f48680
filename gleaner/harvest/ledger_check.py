"""The ledger check of a planned harvest (``harvest.plan``): whether the transcript was
harvested (or forgotten) before, and if not, the owner's notes the model is shown
(``Ready``). Run under the transcript's lock by ``harvest.job``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import Connection

from gleaner.harvest.extraction import uses_model
from gleaner.harvest.llm import HarvestLLM
from gleaner.harvest.plan import Plan
from gleaner.store import Settings
from gleaner.store.jobs import ledger
from gleaner.store.notes import keyed
from gleaner.store.notes.terms import content_terms
from gleaner.store.recall import search_terms

if TYPE_CHECKING:
    from gleaner.store import Executor, TranscriptLock

# Transcript terms matched against the owner's keyed notes: the most frequent ones.
RECALL_TERMS = 200


@dataclass(frozen=True)
class Ready:
    """A transcript the ledger check left to harvest: the owner's ``(topic_key, title)``
    pairs the model is shown, and how many times the owner and this conversation were
    forgotten when it was checked (a forget of either since then means the harvest writes
    nothing)."""

    known_keys: tuple[tuple[str, str], ...]
    forget_generation: int
    # The owner's notes the transcript bears on, shown to the model under refs its marks
    # name (a model only; the keyed ones first, then the best of a search).
    shown: tuple[keyed.ShownNote, ...] = ()


def harvested_before(session: Executor, plan: Plan) -> bool:
    """True when there is nothing to do: the ledger says this scope already harvested this
    transcript, or the owner forgot it (a tombstone)."""
    return ledger.state(
        session,
        plan.scope,
        plan.digest,
        plan.version,
        conversation_id=plan.transcript.conversation_id,
    )[1]


def look_up(
    session: Executor,
    settings: Settings,
    plan: Plan,
    llm: HarvestLLM | None = None,
    *,
    lock: TranscriptLock | None = None,
) -> Ready | None:
    """The ledger check under the transcript's lock: None when it was harvested (or
    forgotten) before, else what extraction needs.

    With ``lock`` (the transcript's, not taken yet) the lock is taken first, then the check
    made (``store.jobs.ledger.check_locked``); when another worker holds it,
    nothing is checked: None, and ``lock.held`` stays False. Without, the caller holds the
    lock already.

    What extraction needs is at most ``harvest_known_keys`` of the owner's ``(topic_key,
    title)`` pairs, those whose notes share the transcript's words (``recall_terms``) first,
    then the most recently changed, read with the check (``store.jobs.ledger.check``). Shown to
    the model so a fact that changes (a move, a new editor) reuses its key and replaces the
    old note, whose text goes to history. None are read for the offline extractor, which
    keeps its own fixed keys.
    """
    keys = settings.harvest_known_keys if uses_model(settings, llm) else 0
    terms = recall_terms(plan) if keys else []
    conversation = plan.transcript.conversation_id
    if lock is None:
        checked = ledger.check(
            session,
            plan.scope,
            plan.digest,
            plan.version,
            terms,
            keys=keys,
            conversation_id=conversation,
        )
    else:
        found = ledger.check_locked(
            session,
            lock,
            plan.scope,
            plan.digest,
            plan.version,
            terms=terms,
            keys=keys,
            conversation_id=conversation,
        )
        if found is None:
            return None
        checked = found
    generation, done, notes = checked
    if done:
        return None
    shown: list[keyed.ShownNote] = []
    if keys:
        shown = keyed.shown_notes(
            _core(session),
            settings,
            plan.scope,
            keys=[note.topic_key for note in notes],
            terms=search_query_terms(plan),
            limit=keys,
        )
    return Ready(tuple((note.topic_key, note.title) for note in notes), generation, tuple(shown))


def _core(session: Executor) -> Connection:
    """The Core connection under ``session`` (an ORM session's, or the connection itself)."""
    return session if isinstance(session, Connection) else session.connection()


def search_query_terms(plan: Plan) -> list[str]:
    """The search terms (``store.recall.search_terms``) of what the user said, most frequent first:
    the notes a conversation bears on are searched with them."""
    counts: Counter[str] = Counter()
    for message in plan.transcript.messages:
        if message.role == "user":
            counts.update(search_terms.terms(message.content))
    return [term for term, _ in counts.most_common(32)]


def recall_terms(plan: Plan) -> list[str]:
    """The transcript's words the owner's keyed notes are ranked by: the most frequent
    content terms of what the user said."""
    counts: Counter[str] = Counter()
    for message in plan.transcript.messages:
        if message.role == "user":
            counts.update(content_terms(message.content))
    return [term for term, _ in counts.most_common(RECALL_TERMS)]
