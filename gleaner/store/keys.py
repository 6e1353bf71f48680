"""API keys for the HTTP service: created by an operator, stored only as hashes.

A key is a random token shown once (``glk_`` and 43 URL-safe characters, 256 bits); the
table keeps its sha256, so a leaked table holds no usable key. Each key is allowed one owner,
or every owner (``owner`` NULL), and may be read-only (search, read, index, jobs; never
submit, pin, delete or forget). Revoking a key deletes its row: no owner's name stays
behind once the owner's keys are revoked.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from pydantic import computed_field, field_validator
from sqlalchemy import bindparam, delete, select
from sqlalchemy.orm import Session

from gleaner.store.errors import InvalidInput
from gleaner.store.schema.records import ApiKey as ApiKeyRow
from gleaner.store.schema.tables import utcnow
from gleaner.store.schemas import Frozen
from gleaner.store.text import check_principal, quoted

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor

TOKEN_PREFIX = "glk_"  # noqa: S105 (a marker that says what the string is, not a secret)
_KEY_ID = re.compile(r"[0-9a-f]{1,32}")
# A token far longer than any real one is refused before it is hashed.
MAX_TOKEN_CHARS = 200


class ApiKey(Frozen):
    """A key as listed (never its token): ``owner`` None means every owner, which
    ``all_owners`` says apart from any owner's name (an owner may be named "(all owners)")."""

    id: str
    owner: str | None
    created_at: datetime
    read_only: bool = False

    @computed_field  # type: ignore[prop-decorator]
    @property
    def all_owners(self) -> bool:
        return self.owner is None

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
        return cls(id=row.id, owner=row.owner, created_at=row.created_at, read_only=row.read_only)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def create_key(
    session: Session, owner: str | None, *, read_only: bool = False
) -> tuple[ApiKey, str]:
    """A new key for ``owner`` (None: all owners) and its token, which is not kept;
    ``read_only`` keys cannot submit, pin, delete or forget."""
    name = None if owner is None else check_principal(owner)
    if not isinstance(read_only, bool):
        raise InvalidInput(f"read_only must be true or false, got {quoted(read_only)}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiKeyRow(
        id=secrets.token_hex(6),
        token_hash=token_hash(token),
        owner=name,
        created_at=utcnow(),
        read_only=read_only,
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
    # Ids are hex (``create_key``): anything else (a NUL, which PostgreSQL cannot even
    # compare) names no key and never reaches the database.
    well_formed = isinstance(key_id, str) and _KEY_ID.fullmatch(key_id) is not None
    row = session.get(ApiKeyRow, key_id) if well_formed else None
    if row is None:
        raise InvalidInput(f"no API key with id {quoted(key_id)}", reason="unknown_key")
    key = ApiKey.from_row(row)
    session.execute(delete(ApiKeyRow).where(ApiKeyRow.id == key_id))
    return key


def verify_key(session: Executor, token: str) -> ApiKey | None:
    """The key this token is, or None (unknown, revoked, or not a token at all)."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_CHARS:
        return None
    # Built once: this runs on every request of the HTTP service.
    found = session.execute(_BY_HASH, {"hash": token_hash(token)}).all()
    if not found:
        return None
    row = found[0]
    return ApiKey(id=row.id, owner=row.owner, created_at=row.created_at, read_only=row.read_only)


_BY_HASH = select(ApiKeyRow.id, ApiKeyRow.owner, ApiKeyRow.created_at, ApiKeyRow.read_only).where(
    ApiKeyRow.token_hash == bindparam("hash")
)
