"""The compact memory index a system prompt gets, and how to recognise it again."""

from __future__ import annotations

import html
import re

from sqlalchemy import select
from sqlalchemy.orm import Session

from store.models import LIVE, Memory
from store.notes import fingerprint
from store.schemas import Scope

INDEX_OPEN = "<gleaner-memory-index"
INDEX_CLOSE = "</gleaner-memory-index>"
# What harvest strips from transcripts so recalled notes are not harvested again; an
# unclosed block (a cut-off prompt) is removed to the end.
INDEX_BLOCK = re.compile(
    r"<gleaner-memory-index\b[^>]*>.*?(?:</gleaner-memory-index>|\Z)", re.DOTALL | re.IGNORECASE
)
BYTES_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """A cheap token estimate (4 UTF-8 bytes a token), good enough for a prompt budget."""
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN)


def _cut_bytes(text: str, limit: int) -> str:
    encoded = text.encode("utf-8")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", "ignore").rstrip() + " …"


def index_text(
    session: Session, scope: Scope | tuple[str, str], *, token_budget: int, pinned_body_bytes: int
) -> str:
    """Pinned notes with their bodies (each cut to ``pinned_body_bytes``), then other titles.

    Newest first inside each part; stops before ``token_budget`` would be exceeded. Empty when
    the scope has no live note. The text is wrapped in a ``<gleaner-memory-index>`` block.
    """
    scope = Scope.of(scope)
    count, seq = fingerprint(session, scope)
    if count == 0:
        return ""
    head = f'{INDEX_OPEN} scope="{html.escape(str(scope))}" notes="{count}" seq="{seq}">\n'
    used = estimate_tokens(head) + estimate_tokens(INDEX_CLOSE)
    lines: list[str] = []
    rows = session.execute(
        select(Memory.pinned, Memory.slug, Memory.title, Memory.body)
        .where(Memory.scope_kind == scope.kind, Memory.scope_id == scope.id, Memory.status == LIVE)
        .order_by(Memory.pinned.desc(), Memory.updated_seq.desc())
    )
    for pinned, slug, title, body in rows:
        if pinned:
            entry = f"## {title} [{slug}]\n{_cut_bytes(body, pinned_body_bytes)}\n"
        else:
            entry = f"- {title} [{slug}]\n"
        cost = estimate_tokens(entry)
        if used + cost > token_budget:
            break
        lines.append(entry)
        used += cost
    return head + "".join(lines) + INDEX_CLOSE


def strip_index_text(text: str) -> str:
    """Remove every memory index block Gleaner injected into a prompt."""
    return INDEX_BLOCK.sub("", text)
