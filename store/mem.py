"""``mem_save``: typed observations with topic keys, the privacy strip, dedup and sessions."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from store.drafts import Draft
from store.errors import InvalidInput
from store.models import MemSession, utcnow
from store.notes import save_draft
from store.schemas import SaveResult, Scope
from store.settings import Settings
from store.sql import dialect_insert
from store.text import check_principal, check_text, strip_private

SUMMARY_TYPE = "summary"
MAX_TOPIC_KEY_CHARS = 255


def touch_session(session: Session, user_id: str) -> str:
    """The user's active session id, opened if there is none; marks it active now."""
    now = utcnow()
    for _ in range(3):
        active = session.execute(
            select(MemSession)
            .where(MemSession.user_id == user_id, MemSession.ended_at.is_(None))
            .with_for_update()
            .execution_options(populate_existing=True)
        ).scalar_one_or_none()
        if active is not None:
            active.last_active_at = now
            active.saves += 1
            session.flush()
            return active.id
        # The partial unique index allows one open session per user; a racing opener wins.
        session.execute(
            dialect_insert(session, MemSession)
            .values(id=uuid.uuid4().hex, user_id=user_id, started_at=now, last_active_at=now)
            .on_conflict_do_nothing()
        )
    raise RuntimeError(f"could not open a session for {user_id!r}")


@dataclass(frozen=True)
class Observation:
    """A checked mem_save call; title and content are not yet privacy-stripped."""

    user: str
    content: str
    title: str
    type: str
    topic_key: str | None


def check_observation(
    settings: Settings,
    *,
    user_id: object,
    content: object,
    title: object,
    note_type: object,
    topic_key: object,
    allow_summary: bool = False,
) -> Observation:
    """Check a mem_save call's arguments; InvalidInput (a ValueError) names the bad one."""
    user = check_text(user_id, "user_id", max_bytes=255)
    if not user.strip():
        raise InvalidInput("user_id is empty", reason="empty_user_id")
    user = check_principal(user, "user_id")
    body = check_text(content, "content", max_bytes=settings.max_body_bytes)
    if not body.strip():
        raise InvalidInput("content is empty", reason="empty_content")
    name = check_text(title, "title", max_bytes=1_000)
    if not name.strip():
        raise InvalidInput("title is empty", reason="empty_title")
    if not isinstance(note_type, str):
        raise InvalidInput(f"type must be a string, got {note_type!r}", reason="bad_type")
    if note_type == SUMMARY_TYPE and not allow_summary:
        raise InvalidInput(
            "type 'summary' is reserved: use mem_session_summary", reason="reserved_type"
        )
    if note_type != SUMMARY_TYPE and note_type not in settings.observation_types:
        raise InvalidInput(
            f"type {note_type!r} is not one of {', '.join(settings.observation_types)}",
            reason="bad_type",
        )
    key = None
    if topic_key is not None:
        key = check_text(topic_key, "topic_key", max_bytes=MAX_TOPIC_KEY_CHARS)
        if not key.strip():
            raise InvalidInput("topic_key is empty (pass None for none)", reason="bad_topic_key")
    return Observation(user=user, content=body, title=name, type=note_type, topic_key=key)


def mem_save(
    session: Session,
    settings: Settings,
    user_id: str,
    content: str,
    *,
    type: str,
    title: str,
    topic_key: str | None = None,
) -> SaveResult:
    """Save an observation for ``user_id`` in their active session (see ``Store.mem_save``)."""
    observation = check_observation(
        settings,
        user_id=user_id,
        content=content,
        title=title,
        note_type=type,
        topic_key=topic_key,
    )
    return _save(session, settings, observation)


def _save(session: Session, settings: Settings, obs: Observation) -> SaveResult:
    # Stripped before hashing and before anything is written.
    body, title = strip_private(obs.content), strip_private(obs.title)
    check_text(body, "content", max_bytes=settings.max_body_bytes)
    session_id = touch_session(session, obs.user)
    draft = Draft(
        title=title, body=body, slug=None, topics="", pinned=False, confidence=None, source=None
    )
    written = save_draft(
        session,
        Scope.owner(obs.user),
        draft,
        provenance="agent",
        note_type=obs.type,
        topic_key=obs.topic_key,
        session_id=session_id,
        reason="mem_save_upsert",
    )
    return SaveResult(
        id=written.id, outcome=written.outcome, session_id=session_id, topic_key=obs.topic_key
    )


def mem_session_summary(
    session: Session,
    settings: Settings,
    user_id: str,
    content: str,
    *,
    title: str = "Session summary",
) -> SaveResult:
    """Save the ``summary`` of the user's active session and end it; the next save opens anew."""
    observation = check_observation(
        settings,
        user_id=user_id,
        content=content,
        title=title,
        note_type=SUMMARY_TYPE,
        topic_key=None,
        allow_summary=True,
    )
    result = _save(session, settings, observation)
    session.execute(
        update(MemSession)
        .where(MemSession.id == result.session_id)
        .values(ended_at=utcnow(), summary_id=result.id)
    )
    return result
