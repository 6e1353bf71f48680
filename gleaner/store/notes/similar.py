"""Near-duplicate lookup: live notes whose title+topic words overlap a probe's by Jaccard.

A note sharing ``s`` of a probe's ``a`` terms and holding ``b`` of its own scores
``s / (a + b - s)``; one scoring ``t`` or more shares at least ``ceil(t * a)`` terms. Such a
note must hold one of the probe's rarest ``a - ceil(t * a) + 1`` terms (the "rare prefix"),
so only those terms' postings are walked to find candidates, and their exact scores are
counted from the term index. When the prefix would include a common term, the whole count
is done in SQL instead (``_SIMILAR``).

``similar_twins_many`` answers several probes of one scope in a fixed handful of
statements, whatever their number: harvest asks for every candidate of a transcript at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer, bindparam, func, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from gleaner.store.notes.fact_terms import similarity_terms
from gleaner.store.notes.judge import contradiction
from gleaner.store.notes.overlap import min_shared
from gleaner.store.notes.term_lookup import (
    CandidateNote,
    candidate_notes,
    term_frequencies,
    term_postings,
)
from gleaner.store.notes.terms import FactText
from gleaner.store.schema.models import Memory, MemoryTerm
from gleaner.store.schema.sql import FLOAT_SLACK, ID_CHUNK, one_of
from gleaner.store.schema.tables import LIVE
from gleaner.store.schemas import Scope, Similar

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor

SIMILAR_LIMIT = 5
# A term held by this many notes of the scope counts as common (its postings are not walked
# to find candidates); ``similar_twins_many`` takes another as ``common_term_notes``.
COMMON_TERM_NOTES = 500
# Above this many prefix terms (a low threshold, as for ``similar``) the extra lookups cost
# more than they save: count every shared term instead.
PREFIX_MAX_TERMS = 3


@dataclass(frozen=True)
class Twin:
    """A live note similar to a probe, with what harvest's dedup policy needs of it."""

    id: int
    slug: str
    title: str
    score: float
    pinned: bool
    provenance: str


def prefix_size(terms: frozenset[str], threshold: float) -> int:
    """How many rare terms a prefix lookup for the probe would walk; 0 when that many do not
    pay off (more than PREFIX_MAX_TERMS, or the whole probe)."""
    size = len(terms) - min_shared(threshold, len(terms)) + 1
    return 0 if size > PREFIX_MAX_TERMS or size >= len(terms) else size


def rare_prefix(
    terms: frozenset[str], size: int, frequency: dict[str, int], common: int = COMMON_TERM_NOTES
) -> list[str] | None:
    """The probe's rarest ``size`` terms (``prefix_size``), or None when one of them is
    common, held by ``common`` notes or more (then counting every shared term is no dearer).

    Exact, not a heuristic: a note sharing ``min_shared`` of the terms holds one of these.
    """
    prefix = sorted(terms, key=lambda t: (frequency.get(t, 0), t))[:size]
    if frequency.get(prefix[-1], 0) >= common:
        return None
    return prefix


def _similar_statement() -> Any:
    """The full similarity count in SQL, built once: only its parameters change.

    Shared terms are counted in the term index alone, then only the notes that qualify are
    fetched.
    """
    conditions: list[ColumnElement[bool]] = [
        one_of(MemoryTerm.term, "terms"),
        MemoryTerm.scope_kind == bindparam("kind"),
        MemoryTerm.scope_id == bindparam("sid"),
    ]
    groups = (
        select(MemoryTerm.memory_id, func.count().label("shared"))
        .where(*conditions)
        .group_by(MemoryTerm.memory_id)
        .having(func.count() >= bindparam("min_shared", type_=Integer))
        # Materialized: the planner must count in the term index first; flattened into the
        # join it may scan every note of the scope and probe the index once per note.
        .cte("shared_terms")
        .prefix_with("MATERIALIZED")
    )
    shared = groups.c.shared
    return (
        select(
            Memory.id,
            Memory.slug,
            Memory.title,
            shared,
            Memory.term_count,
            Memory.pinned,
            Memory.provenance,
        )
        .join(groups, groups.c.memory_id == Memory.id)
        .where(Memory.status == LIVE, Memory.id != bindparam("exclude", type_=Integer))
        .order_by(
            (shared * 1.0 / (bindparam("a", type_=Integer) + Memory.term_count - shared)).desc(),
            Memory.slug,
        )
        .limit(bindparam("limit", type_=Integer))
    )


_SIMILAR = _similar_statement()


def _counted_in_sql(
    session: Executor,
    scope: Scope,
    terms: frozenset[str],
    *,
    threshold: float,
    exclude_id: int | None,
    limit: int,
) -> list[Twin]:
    params = {
        "kind": scope.kind,
        "sid": scope.id,
        "terms": sorted(terms),
        "min_shared": min_shared(threshold, len(terms)),
        "a": len(terms),
        "exclude": exclude_id if exclude_id is not None else -1,
        "limit": limit,
    }
    found = []
    for note_id, slug, title, common, size, pinned, provenance in session.execute(_SIMILAR, params):
        score = common / (len(terms) + size - common)
        if score >= threshold - FLOAT_SLACK:
            found.append(Twin(int(note_id), slug, title, round(score, 4), bool(pinned), provenance))
    return found


def similar_twins_many(
    session: Executor,
    scope: Scope,
    probes: Sequence[tuple[str, str]],
    *,
    threshold: float,
    exclude_id: int | None = None,
    limit: int = SIMILAR_LIMIT,
    common_term_notes: int = COMMON_TERM_NOTES,
) -> list[list[Twin]]:
    """For each ``(title, topic string)`` probe, the live notes of the scope scoring at least
    ``threshold`` against it, best first (then by slug), at most ``limit``. A term held by
    ``common_term_notes`` notes of the scope or more is common: never walked.

    Statements: one for the terms' frequencies, one for the rare prefixes' postings (none
    when no note holds them), one for the candidates' shared terms (none without
    candidates), and the full SQL count only for a probe whose prefix would be long (a low
    threshold) or hold a common term.
    """
    wanted = [similarity_terms(title, topics) for title, topics in probes]
    results: list[list[Twin]] = [[] for _ in probes]
    # Probes whose prefix would be too long (a low threshold, as for ``similar``) are counted
    # in SQL at once; only the others' terms need their frequencies.
    short = [n for n, terms in enumerate(wanted) if terms and prefix_size(terms, threshold)]
    by_prefix = set(short)
    for n, terms in enumerate(wanted):
        if terms and n not in by_prefix:
            results[n] = _counted_in_sql(
                session, scope, terms, threshold=threshold, exclude_id=exclude_id, limit=limit
            )
    vocabulary = sorted(set().union(*(wanted[n] for n in short)))
    if not vocabulary:
        return results
    frequency = term_frequencies(session, scope, vocabulary, common_term_notes)
    prefixes: dict[int, list[str]] = {}
    for n in short:
        terms = wanted[n]
        prefix = rare_prefix(terms, prefix_size(terms, threshold), frequency, common_term_notes)
        if prefix is None:
            results[n] = _counted_in_sql(
                session, scope, terms, threshold=threshold, exclude_id=exclude_id, limit=limit
            )
        else:
            prefixes[n] = prefix
    walked = sorted({t for prefix in prefixes.values() for t in prefix if frequency.get(t, 0)})
    postings = term_postings(session, scope, walked) if walked else {}
    holders = {
        n: {i for t in prefix for i in postings.get(t, ()) if i != exclude_id}
        for n, prefix in prefixes.items()
    }
    ids = sorted(set().union(*holders.values()))
    if not ids:
        return results
    candidates = candidate_notes(
        session, ids, sorted(set().union(*(wanted[n] for n in holders if holders[n])))
    )
    for n, held in holders.items():
        results[n] = _best_twins(wanted[n], held, candidates, threshold=threshold, limit=limit)
    return results


def _best_twins(
    terms: frozenset[str],
    held: set[int],
    candidates: dict[int, CandidateNote],
    *,
    threshold: float,
    limit: int,
) -> list[Twin]:
    """The live notes among ``held`` (ids holding a prefix term of ``terms``) scoring at
    least ``threshold``, best first, then by slug; at most ``limit``."""
    scored = []
    for note_id in held:
        note = candidates.get(note_id)
        if note is None:  # not live
            continue
        shared = len(terms & note.terms)
        score = shared / (len(terms) + note.term_count - shared)
        if score >= threshold - FLOAT_SLACK:
            scored.append((-score, note.slug, note))
    scored.sort(key=lambda item: (item[0], item[1]))
    return [
        Twin(note.id, note.slug, note.title, round(-neg, 4), note.pinned, note.provenance)
        for neg, _, note in scored[:limit]
    ]


def similar_notes(
    session: Session,
    scope: Scope,
    title: str,
    topic_string: str,
    *,
    threshold: float,
    exclude_id: int | None = None,
    limit: int = SIMILAR_LIMIT,
) -> list[Similar]:
    """Live notes of the scope whose title+topic Jaccard score reaches ``threshold``, best first."""
    return [
        Similar(slug=t.slug, title=t.title, score=t.score)
        for t in similar_twins_many(
            session,
            scope,
            [(title, topic_string)],
            threshold=threshold,
            exclude_id=exclude_id,
            limit=limit,
        )[0]
    ]


_FACT_TEXTS = select(Memory.id, Memory.title, Memory.body, Memory.topics).where(
    one_of(Memory.id, "ids")
)


def fact_texts(session: Executor, ids: Sequence[int]) -> dict[int, FactText]:
    """What the same-fact rule reads of each note in ``ids``."""
    found: dict[int, FactText] = {}
    ordered = sorted(set(ids))
    for start in range(0, len(ordered), ID_CHUNK):
        rows = session.execute(_FACT_TEXTS, {"ids": ordered[start : start + ID_CHUNK]})
        found.update(
            {int(i): FactText(title, body, topics or "") for i, title, body, topics in rows}
        )
    return found


def same_fact_twins(
    session: Executor, scope: Scope, probes: Sequence[FactText], *, threshold: float
) -> list[tuple[Twin, FactText] | None]:
    """For each probe, the live note of the scope holding the same fact (``store.notes.terms``):
    the best-scoring of its near-duplicates that nothing in title or body contradicts.

    A probe's near-duplicates are the ``SIMILAR_LIMIT`` best by the seed's Jaccard score at
    ``threshold``; their texts are read in one statement for all probes.
    """
    near = similar_twins_many(
        session, scope, [(p.title, p.topics) for p in probes], threshold=threshold
    )
    texts = fact_texts(session, [twin.id for twins in near for twin in twins])
    found: list[tuple[Twin, FactText] | None] = []
    for probe, twins in zip(probes, near, strict=True):
        match = next(
            (
                (twin, texts[twin.id])
                for twin in twins
                if twin.id in texts and contradiction(probe, texts[twin.id]) is None
            ),
            None,
        )
        found.append(match)
    return found
