"""Embedding notes after they are written: the notes without a vector of the configured
model (``store.recall.vectors.pending``) are embedded in batches and their vectors stored.

Never inside a note's write: a note is searchable lexically the moment it is committed, and
its vector follows (a worker's ``embed`` task after each harvest, an in-process harvest
right after it, beat's sweep for whatever is left, ``gleaner embed --backfill``). A failed
embedding call loses nothing: the notes stay pending and the next run takes them. Calls,
tokens and dollars go to ``embedding_usage``, per model and day.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gleaner.harvest.embedding import Embedder, embedder_for
from gleaner.store import Scope, Settings, Store
from gleaner.store.recall import vectors as note_vectors

log = logging.getLogger(__name__)


@dataclass
class EmbedReport:
    """What one run embedded and what it cost."""

    notes: int = 0
    calls: int = 0
    tokens: int = 0
    cost_usd: float | None = 0.0
    skipped: int = 0  # rewritten or deleted while being embedded: pending again, or gone
    errors: list[str] = field(default_factory=list)


def embed_pending(
    store: Store,
    embedder: Embedder,
    *,
    scope: Scope | None = None,
    most: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> EmbedReport:
    """Embed the notes (of ``scope``, else every scope) that lack a vector of the
    embedder's model, at most ``most`` of them, in batches of GLEANER_EMBED_BATCH_SIZE.
    ``progress(done, total)`` after each batch. An embedding error is raised after what was
    stored before it stays stored."""
    report = EmbedReport()
    batch = max(1, int(store.settings.embed_batch_size))
    with store.connection() as conn:
        total = note_vectors.count_pending(conn, embedder.model, scope=scope)
    if most is not None:
        total = min(total, most)
    after = 0
    while report.notes + report.skipped < total:
        wanted = min(batch, total - report.notes - report.skipped)
        with store.connection() as conn:
            notes = note_vectors.pending(
                conn, embedder.model, scope=scope, after=after, limit=wanted
            )
        if not notes:
            break
        after = notes[-1].id
        embedded = embedder.embed([note.text for note in notes])  # no transaction open
        with store.connection() as conn:
            saved = note_vectors.save(conn, embedder.model, notes, embedded.vectors)
            note_vectors.record_usage(
                conn,
                embedder.model,
                calls=1,
                notes=saved,
                tokens=embedded.prompt_tokens,
                cost_usd=embedded.cost_usd,
            )
        report.notes += saved
        report.skipped += len(notes) - saved
        report.calls += 1
        report.tokens += embedded.prompt_tokens
        report.cost_usd = (
            None
            if report.cost_usd is None or embedded.cost_usd is None
            else report.cost_usd + embedded.cost_usd
        )
        if progress is not None:
            progress(report.notes + report.skipped, total)
    return report


def embed_after_harvest(store: Store, scopes: Iterable[Scope]) -> EmbedReport | None:
    """Embed what a harvest in this process just wrote (its owners' pending notes), when an
    embedding model is configured; an error is logged, never raised: the notes are
    searchable already, and beat's sweep or ``gleaner embed --backfill`` embeds them later."""
    embedder = embedder_for(store.settings)
    if embedder is None:
        return None
    report = EmbedReport()
    for scope in dict.fromkeys(scopes):
        try:
            done = embed_pending(store, embedder, scope=scope)
        except Exception as exc:  # noqa: BLE001 - logged and left for the sweep, by design
            log.warning("embedding %s's new notes failed (the sweep retries): %s", scope, exc)
            report.errors.append(f"{scope}: {type(exc).__name__}")
            continue
        report.notes += done.notes
        report.calls += done.calls
        report.tokens += done.tokens
    return report


_QUERY_EMBEDDERS: dict[tuple[str, str | None], Embedder] = {}


def query_vector(settings: Settings, query: str) -> tuple[list[float], str] | None:
    """The vector of a search query and its model, or None: no embedding model is
    configured, or the embedder failed or took too long (logged: the search answers
    lexically, as it does before any note has a vector)."""
    if not settings.embed_model:
        return None
    key = (settings.embed_model, settings.embed_api_base)
    embedder = _QUERY_EMBEDDERS.get(key)
    if embedder is None:
        embedder = embedder_for(settings, queries=True)
        if embedder is None:
            return None
        _QUERY_EMBEDDERS[key] = embedder  # the local model loads once per process
    try:
        embedded = embedder.embed([query])
    except Exception as exc:  # noqa: BLE001 - a search never fails for its semantic half
        log.warning("the query's embedding failed, searching lexically: %s", exc)
        return None
    return embedded.vectors[0], embedder.model
