"""API keys for the HTTP service: created by an operator, stored only as hashes.

A key is a random token shown once (``glk_`` and 43 URL-safe characters, 256 bits); the
table keeps its sha256, so a leaked table holds no usable key. Each key is allowed one owner,
or every owner (``owner`` NULL). Revoking a key deletes its row: no owner's name stays
behind once the owner's keys are revoked.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import field_validator
from sqlalchemy import bindparam, delete, select
from sqlalchemy.orm import Session

from store import prepared
from store.errors import InvalidInput
from store.models import ApiKey as ApiKeyRow
from store.models import utcnow
from store.schemas import Frozen
from store.text import check_principal, quoted

if TYPE_CHECKING:
    from store.sql import Executor

TOKEN_PREFIX = "glk_"  # noqa: S105 (a marker that says what the string is, not a secret)
# A token far longer than any real one is refused before it is hashed.
MAX_TOKEN_CHARS = 200


class ApiKey(Frozen):
    """A key as listed (never its token): ``owner`` None means every owner."""

    id: str
    owner: str | None
    created_at: datetime

    @field_validator("created_at")
    @classmethod
    def _utc(cls, value: datetime) -> datetime:
        # SQLite hands back naive datetimes; everything stored is UTC.
        return value if value.tzinfo else value.replace(tzinfo=UTC)

    def allows(self, owner: str) -> bool:
        """Whether this key may act for ``owner`` (already normalized by the owner rule)."""
        return self.owner is None or self.owner == owner

    @classmethod
    def from_row(cls, row: ApiKeyRow) -> ApiKey:
        return cls(id=row.id, owner=row.owner, created_at=row.created_at)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create_key(session: Session, owner: str | None) -> tuple[ApiKey, str]:
    """A new key for ``owner`` (None: all owners) and its token, which is not kept."""
    name = None if owner is None else check_principal(owner)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiKeyRow(
        id=secrets.token_hex(6), token_hash=token_hash(token), owner=name, created_at=utcnow()
    )
    session.add(row)
    session.flush()
    return ApiKey.from_row(row), token


def list_keys(session: Session) -> list[ApiKey]:
    """Every key, oldest first."""
    rows = session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at, ApiKeyRow.id))
    return [ApiKey.from_row(row) for row in rows]


def revoke_key(session: Session, key_id: str) -> ApiKey:
    """Delete the key; InvalidInput (``unknown_key``) when there is none with that id."""
    row = session.get(ApiKeyRow, key_id) if isinstance(key_id, str) else None
    if row is None:
        raise InvalidInput(f"no API key with id {quoted(key_id)}", reason="unknown_key")
    key = ApiKey.from_row(row)
    session.execute(delete(ApiKeyRow).where(ApiKeyRow.id == key_id))
    return key


def verify_key(session: Executor, token: str) -> ApiKey | None:
    """The key this token is, or None (unknown, revoked, or not a token at all)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_CHARS:
        return None
    # Built once and prepared: this runs on every request of the HTTP service.
    found = prepared.execute(session, _BY_HASH, {"hash": token_hash(token)})
    if not found:
        return None
    return ApiKey(id=found[0].id, owner=found[0].owner, created_at=found[0].created_at)


_BY_HASH = select(ApiKeyRow.id, ApiKeyRow.owner, ApiKeyRow.created_at).where(
    ApiKeyRow.token_hash == bindparam("hash")
)
