"""The compact memory index a system prompt gets, its fingerprint, and how to recognise it
again. Core reads of the memories table (no ORM): `gleaner index` imports this module."""

from __future__ import annotations

import html
import re

from sqlalchemy import Connection, func, select

from store.schemas import Scope
from store.tables import LIVE, MEMORIES
from store.text import redact_private

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


def fingerprint(conn: Connection, scope: Scope | tuple[str, str]) -> tuple[int, int]:
    """``(live note count, max updated_seq)`` of the scope: cheap proof index_text is current."""
    scope = Scope.of(scope)
    m = MEMORIES.c
    in_scope = (m.scope_kind == scope.kind, m.scope_id == scope.id)
    count = conn.execute(
        select(func.count()).select_from(MEMORIES).where(*in_scope, m.status == LIVE)
    ).scalar_one()
    top = conn.execute(select(func.max(m.updated_seq)).where(*in_scope)).scalar_one()
    return int(count), int(top or 0)


def index_text(
    conn: Connection, scope: Scope | tuple[str, str], *, token_budget: int, pinned_body_bytes: int
) -> str:
    """Pinned notes with their bodies (each cut to ``pinned_body_bytes``), then other titles.

    Newest first inside each part; stops before ``token_budget`` would be exceeded. Empty when
    the scope has no live note. The text is wrapped in a ``<gleaner-memory-index>`` block.
    """
    scope = Scope.of(scope)
    count, seq = fingerprint(conn, scope)
    if count == 0:
        return ""
    head = f'{INDEX_OPEN} scope="{html.escape(str(scope))}" notes="{count}" seq="{seq}">\n'
    used = estimate_tokens(head) + estimate_tokens(INDEX_CLOSE)
    lines: list[str] = []
    m = MEMORIES.c
    rows = conn.execute(
        select(m.pinned, m.slug, m.title, m.body)
        .where(m.scope_kind == scope.kind, m.scope_id == scope.id, m.status == LIVE)
        .order_by(m.pinned.desc(), m.updated_seq.desc())
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
    """Remove every memory index block Gleaner injected into a prompt.

    A ``<private>`` a block leaves open stays open (fail closed): the text after it is
    private, as it would be had the block been read. A balanced span inside a block leaves
    no trace, and a closing tag there closes nothing outside it.
    """
    return INDEX_BLOCK.sub(_kept_open, text)


def _kept_open(block: re.Match[str]) -> str:
    return "<private>" if redact_private(block.group(0))[1] else ""
