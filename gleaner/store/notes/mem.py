"""``mem_save``: typed observations with topic keys, the privacy strip, dedup and sessions."""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, ValidationInfo
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from gleaner.config.store import StoreSettings
from gleaner.privacy import strip_private
from gleaner.store.errors import InvalidInput
from gleaner.store.notes.drafts import MAX_TITLE_BYTES, Draft, check_instruction, text_field
from gleaner.store.notes.notes import save_draft
from gleaner.store.schema.models import Memory, MemSession
from gleaner.store.schema.sql import dialect_insert, seq_expression
from gleaner.store.schema.tables import ARCHIVED, LIVE, utcnow
from gleaner.store.schemas import SaveResult, Scope
from gleaner.store.text import (
    MAX_BODY_BYTES_SETTING,
    MAX_TOPIC_KEY_BYTES,
    check_principal,
    check_text,
    check_topic_key,
    quoted,
)

SUMMARY_TYPE = "summary"
MAX_USER_ID_BYTES = 255


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


def _not_blank(field: str, reason: str, hint: str = "") -> AfterValidator:
    """An after-validator: the text holds more than white space (None passes)."""

    def check(value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise InvalidInput(f"{field} is empty{hint}", reason=reason)
        return value

    return AfterValidator(check)


def _principal(value: str) -> str:
    return check_principal(value, "user_id")


def _topic_key(value: str | None) -> str | None:
    return None if value is None else check_topic_key(value)


def _allowed_type(value: str, info: ValidationInfo) -> str:
    """One of the configured observation types; ``summary`` only for the session summary."""
    context = info.context or {}
    if value == SUMMARY_TYPE:
        if not context.get("allow_summary"):
            raise InvalidInput(
                "type 'summary' is reserved: use mem_session_summary", reason="reserved_type"
            )
        return value
    allowed = context.get("observation_types", ())
    if value not in allowed:
        raise InvalidInput(
            f"type {quoted(value)} is not one of {', '.join(allowed)}", reason="bad_type"
        )
    return value


class Observation(BaseModel):
    """A checked mem_save call; title and content are not yet privacy-stripped.

    Strict (no unknown key, no coercion); validated with a context naming the body limit
    (``max_body_bytes``), the ``observation_types`` and whether ``summary`` is allowed.
    """

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    user_id: Annotated[
        str,
        text_field("user_id", MAX_USER_ID_BYTES),
        _not_blank("user_id", "empty_user_id"),
        AfterValidator(_principal),
    ]
    content: Annotated[str, text_field("content"), _not_blank("content", "empty_content")]
    title: Annotated[str, text_field("title", MAX_TITLE_BYTES), _not_blank("title", "empty_title")]
    type: Annotated[str, AfterValidator(_allowed_type)]
    topic_key: Annotated[
        str | None,
        text_field("topic_key", MAX_TOPIC_KEY_BYTES, optional=True),
        AfterValidator(_topic_key),
    ] = None


def check_observation(
    settings: StoreSettings,
    *,
    user_id: object,
    content: object,
    title: object,
    note_type: object,
    topic_key: object,
    allow_summary: bool = False,
) -> Observation:
    """Check a mem_save call's arguments; InvalidInput (a ValueError) names the first bad one."""
    call = {
        "user_id": user_id,
        "content": content,
        "title": title,
        "type": note_type,
        "topic_key": topic_key,
    }
    context = {
        "max_body_bytes": settings.max_body_bytes,
        "observation_types": settings.observation_types,
        "allow_summary": allow_summary,
    }
    try:
        return Observation.model_validate(call, context=context)
    except ValidationError as exc:
        # Arguments are checked in order: the first one's refusal is the one reported.
        order = list(Observation.model_fields)
        first = min(exc.errors(include_url=False), key=lambda e: order.index(str(e["loc"][0])))
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, InvalidInput):
            raise cause from None
        # Only a type pydantic itself refuses is left: a non-string ``type``.
        field = str(first["loc"][0])
        raise InvalidInput(
            f"{field} must be a string, got {quoted(call[field])}", reason="bad_type"
        ) from None


def mem_save(
    session: Session,
    settings: StoreSettings,
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


def _save(session: Session, settings: StoreSettings, obs: Observation) -> SaveResult:
    # Stripped before hashing and before anything is written.
    body, title = strip_private(obs.content), strip_private(obs.title)
    check_text(body, "content", max_bytes=settings.max_body_bytes, setting=MAX_BODY_BYTES_SETTING)
    check_instruction(title, body, settings)
    session_id = touch_session(session, obs.user_id)
    draft = Draft(
        title=title, body=body, slug=None, topics="", pinned=False, confidence=None, source=None
    )
    written = save_draft(
        session,
        Scope.owner(obs.user_id),
        draft,
        provenance="agent",
        note_type=obs.type,
        topic_key=obs.topic_key,
        session_id=session_id,
        reason="mem_save_upsert",
    )
    if written.outcome == "deduped":
        _bring_back(session, written.id)
    return SaveResult(
        id=written.id,
        slug=written.slug,
        outcome=written.outcome,
        session_id=session_id,
        topic_key=obs.topic_key,
    )


def _bring_back(session: Session, note_id: int) -> None:
    """Saved again, the session's note holding this content is live again if decay archived
    it (deduped into it as it was, the fact would stay out of search), and fresh: its age,
    which decay's weight follows, starts anew. A superseded twin stays so: a note replaced it.
    """
    session.execute(
        update(Memory)
        .where(Memory.id == note_id, Memory.status == ARCHIVED)
        .values(status=LIVE, updated_at=utcnow(), weight=1.0, updated_seq=seq_expression(session))
    )


def mem_session_summary(
    session: Session,
    settings: StoreSettings,
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
