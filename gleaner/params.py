"""The parameters of reads, forgets and jobs (a slug, a job id, a conversation id, a query),
checked before any database sees them.

PostgreSQL cannot hold or even compare a string with NUL, and no database takes a lone
surrogate: sent on, such a value failed as ``data_refused`` (503, "database down") on one
database and matched nothing on the other. Refused here instead, as InvalidRequest naming the
field (HTTP 422), the same on both databases and on every way in (Python, HTTP, MCP, CLI).
"""

from __future__ import annotations

from gleaner.errors import InvalidRequest

# The longest value each field can hold as stored (the columns' lengths); a longer one names
# nothing, and is refused rather than looked up.
SLUG_MAX_CHARS = 120
JOB_ID_MAX_CHARS = 32
CONVERSATION_ID_MAX_CHARS = 255


def checked(value: object, field: str, *, reason: str, max_chars: int | None = None) -> str:
    """``value`` when it is text a database can hold: a string, valid UTF-8 (no lone
    surrogate), no NUL, at most ``max_chars``; else InvalidRequest(``reason``) naming
    ``field`` (never quoting the value: it may be anything)."""
    if not isinstance(value, str):
        raise InvalidRequest(f"{field} must be a string, got {type(value).__name__}", reason=reason)
    if "\x00" in value:
        raise InvalidRequest(
            f"{field} holds a NUL character (U+0000), which nothing stored can hold",
            reason=reason,
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(
            f"{field} is not valid UTF-8 (it holds a lone surrogate)", reason=reason
        ) from None
    if max_chars is not None and len(value) > max_chars:
        raise InvalidRequest(
            f"{field} is {len(value):,} characters, over the {max_chars} it can be",
            reason=reason,
        )
    return value


def checked_slug(value: object) -> str:
    return checked(value, "slug", reason="bad_slug", max_chars=SLUG_MAX_CHARS)


def checked_job_id(value: object) -> str:
    return checked(value, "job id", reason="bad_job_id", max_chars=JOB_ID_MAX_CHARS)


def checked_conversation_id(value: object) -> str:
    return checked(
        value,
        "conversation id",
        reason="bad_conversation_id",
        max_chars=CONVERSATION_ID_MAX_CHARS,
    )


def checked_query(value: object, field: str = "query") -> str:
    return checked(value, field, reason="bad_query")
