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

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Integer, bindparam, func, select, text
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement, TextClause

from store import judge
from store.models import LIVE, Memory, MemoryTerm
from store.overlap import min_shared
from store.schemas import Scope, Similar
from store.sql import FLOAT_SLACK, ID_CHUNK, dialect_name, one_of
from store.terms import FactText, similarity_terms

if TYPE_CHECKING:
    from store.sql import Executor

SIMILAR_LIMIT = 5
# A term held by this many notes of the scope counts as common (its postings are not walked
# to find candidates); ``similar_twins_many`` takes another as ``common_term_notes``.
COMMON_TERM_NOTES = 500
# Above this many prefix terms (a low threshold, as for ``similar``) the extra lookups cost
# more than they save: count every shared term instead.
PREFIX_MAX_TERMS = 3
# Terms per statement in the frequency and postings lookups: well under SQLite's
# bound-parameter limit.
TERM_CHUNK = 200


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


@functools.lru_cache(maxsize=256)
def _frequency_statement(count: int, cap: int) -> TextClause:
    """One row: for each of ``count`` terms, how many notes of the scope hold it, capped at
    ``cap``. Each term is its own equality lookup, so every column of the (scope,
    term) index is an index condition whatever the table's statistics say."""
    columns = ", ".join(
        # Only integers are formatted in; every value is a bound parameter.
        f"(SELECT count(*) FROM (SELECT 1 FROM memory_terms WHERE scope_kind = :kind"  # noqa: S608
        f" AND scope_id = :sid AND term = :t{n} LIMIT {int(cap)}) AS c{n})"
        for n in range(count)
    )
    return text(f"SELECT {columns}")


@functools.lru_cache(maxsize=256)
def _postings_statement(count: int) -> TextClause:
    """``(term, memory_id)`` for every note of the scope holding one of ``count`` terms."""
    return text(
        " UNION ALL ".join(
            f"SELECT term, memory_id FROM memory_terms WHERE scope_kind = :kind"  # noqa: S608
            f" AND scope_id = :sid AND term = :t{n}"
            for n in range(count)
        )
    )


# The candidates' shared terms, read through the (memory_id, term) primary key.
_CANDIDATE_TERMS = (
    select(
        Memory.id,
        Memory.slug,
        Memory.title,
        Memory.term_count,
        Memory.pinned,
        Memory.provenance,
        MemoryTerm.term,
    )
    .join(MemoryTerm, MemoryTerm.memory_id == Memory.id)
    .where(
        one_of(Memory.id, "ids"),
        Memory.status == LIVE,
        one_of(MemoryTerm.term, "terms"),
    )
)


def _term_chunks(scope: Scope, terms: Sequence[str]) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """``terms`` in chunks of TERM_CHUNK, each with the parameters of a per-term statement."""
    for start in range(0, len(terms), TERM_CHUNK):
        chunk = list(terms[start : start + TERM_CHUNK])
        params: dict[str, Any] = {"kind": scope.kind, "sid": scope.id}
        params.update({f"t{n}": term for n, term in enumerate(chunk)})
        yield chunk, params


# PostgreSQL takes the terms as one array: one statement text whatever their number, so it
# is prepared once (the per-term forms above are new SQL for every count of terms). The
# correlated subquery keeps each term its own index lookup.
_FREQUENCIES_PG = text(
    "SELECT t.term, (SELECT count(*) FROM (SELECT 1 FROM memory_terms WHERE scope_kind = :kind"
    " AND scope_id = :sid AND term = t.term LIMIT :cap) AS c)"
    " FROM unnest(CAST(:terms AS varchar[])) AS t(term)"
)
_POSTINGS_PG = text(
    "SELECT m.term, m.memory_id FROM unnest(CAST(:terms AS varchar[])) AS t(term)"
    " CROSS JOIN LATERAL (SELECT term, memory_id FROM memory_terms WHERE scope_kind = :kind"
    " AND scope_id = :sid AND term = t.term) AS m"
)


def _frequencies(session: Executor, scope: Scope, terms: Sequence[str], cap: int) -> dict[str, int]:
    found: dict[str, int] = {}
    if dialect_name(session) == "postgresql":
        params = {"kind": scope.kind, "sid": scope.id, "cap": cap, "terms": list(terms)}
        rows = session.execute(_FREQUENCIES_PG, params)
        found.update((str(t), int(n)) for t, n in rows)
        return found
    for chunk, params in _term_chunks(scope, terms):
        row = session.execute(_frequency_statement(len(chunk), cap), params).one()
        found.update({term: int(n) for term, n in zip(chunk, row, strict=True)})
    return found


def _postings(session: Executor, scope: Scope, terms: Sequence[str]) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {term: set() for term in terms}
    if dialect_name(session) == "postgresql":
        params = {"kind": scope.kind, "sid": scope.id, "terms": list(terms)}
        for term, memory_id in session.execute(_POSTINGS_PG, params):
            found[str(term)].add(int(memory_id))
        return found
    for chunk, params in _term_chunks(scope, terms):
        for term, memory_id in session.execute(_postings_statement(len(chunk)), params):
            found[str(term)].add(int(memory_id))
    return found


@dataclass
class _Candidate:
    id: int
    slug: str
    title: str
    term_count: int
    pinned: bool
    provenance: str
    terms: set[str]


def _candidates(
    session: Executor, ids: Sequence[int], terms: Sequence[str]
) -> dict[int, _Candidate]:
    """The live notes among ``ids``, each with which of ``terms`` it holds."""
    found: dict[int, _Candidate] = {}
    for start in range(0, len(ids), ID_CHUNK):
        rows = session.execute(
            _CANDIDATE_TERMS, {"ids": list(ids[start : start + ID_CHUNK]), "terms": list(terms)}
        )
        for note_id, slug, title, term_count, pinned, provenance, term in rows:
            note = found.get(int(note_id))
            if note is None:
                note = found[int(note_id)] = _Candidate(
                    int(note_id), slug, title, int(term_count), bool(pinned), provenance, set()
                )
            note.terms.add(str(term))
    return found


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
    frequency = _frequencies(session, scope, vocabulary, common_term_notes)
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
    postings = _postings(session, scope, walked) if walked else {}
    holders = {
        n: {i for t in prefix for i in postings.get(t, ()) if i != exclude_id}
        for n, prefix in prefixes.items()
    }
    ids = sorted(set().union(*holders.values()))
    if not ids:
        return results
    candidates = _candidates(
        session, ids, sorted(set().union(*(wanted[n] for n in holders if holders[n])))
    )
    for n, held in holders.items():
        terms, scored = wanted[n], []
        for note_id in held:
            note = candidates.get(note_id)
            if note is None:  # not live
                continue
            shared = len(terms & note.terms)
            score = shared / (len(terms) + note.term_count - shared)
            if score >= threshold - FLOAT_SLACK:
                scored.append((-score, note.slug, note))
        scored.sort(key=lambda item: (item[0], item[1]))
        results[n] = [
            Twin(note.id, note.slug, note.title, round(-neg, 4), note.pinned, note.provenance)
            for neg, _, note in scored[:limit]
        ]
    return results


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
    """For each probe, the live note of the scope holding the same fact (``store.terms``):
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
                if twin.id in texts and judge.contradiction(probe, texts[twin.id]) is None
            ),
            None,
        )
        found.append(match)
    return found
