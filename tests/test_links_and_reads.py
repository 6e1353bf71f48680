"""Links, reads, similarity (rules 6 and 7), fingerprint and index text, on both backends."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event, update

from gleaner.store import InvalidInput, LinkRefused, NotFound, Scope, Store, format_error
from gleaner.store.schema.models import ARCHIVED, Memory

ALICE = Scope.owner("alice")


def put(store: Store, title: str, topics: list[str] | None = None, **extra: object) -> str:
    attrs = {"title": title, "body": f"body of {title}", "topics": topics or [], **extra}
    return store.write(ALICE, attrs).memory.slug


@contextmanager
def sent_sql(store: Store) -> Iterator[list[str]]:
    """Every SQL statement the store's engine sends while the block runs."""
    sent: list[str] = []

    def record(_conn: object, _cursor: object, statement: str, *_rest: object) -> None:
        sent.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def full_counts(sent: list[str]) -> int:
    """How many of ``sent`` are ``store.notes.similar``'s full similarity count in SQL (the only
    statement naming the ``shared_terms`` CTE): one per probe that did not walk rare terms."""
    return sum("shared_terms" in statement for statement in sent)


# Rule 6 -----------------------------------------------------------------------------------


def test_similar_lists_live_notes_by_jaccard_of_title_and_topics(store: Store) -> None:
    put(store, "Use PostgreSQL for production", ["db"])
    put(store, "Frontend uses React", ["ui"])
    result = store.write(
        ALICE, {"title": "Uses PostgreSQL in the staging cluster", "body": "x", "topics": ["db"]}
    )
    # Content terms (stop words out, stems): {use, postgresql, stage, cluster, db} vs
    # {use, postgresql, product, db}: 3 shared of 6.
    assert [(s.slug, s.score) for s in result.similar] == [
        ("use-postgresql-for-production", round(3 / 6, 4))
    ]


def test_similar_ignores_superseded_notes_and_other_scopes(store: Store) -> None:
    old = put(store, "Deploy with Docker compose")
    new = put(store, "Deploy with Docker swarm")
    store.write(Scope.owner("bob"), {"title": "Deploy with Docker compose", "body": "b"})
    store.link(ALICE, new, old, "supersedes")
    probe = store.write(ALICE, {"title": "Deploy with Docker compose", "body": "again"})
    assert [s.slug for s in probe.similar] == [new]


def test_similar_does_not_depend_on_the_search_backend(make_store, backend: str) -> None:
    scores = []
    for search in ("fts", "like"):
        store = make_store(backend, search=search)
        scope = Scope.owner(f"user-{search}")
        store.write(scope, {"title": "Cache warmup job", "body": "b", "topics": ["ops"]})
        result = store.write(scope, {"title": "Cache warmup task", "body": "c", "topics": ["ops"]})
        scores.append([s.score for s in result.similar])
    assert scores[0] == scores[1] == [round(3 / 5, 4)]


# Rule 7 -----------------------------------------------------------------------------------


def test_supersedes_marks_the_target_and_read_shows_both_sides(store: Store) -> None:
    old, new = put(store, "Old plan"), put(store, "New plan")
    before = store.get(ALICE, old)
    result = store.link(ALICE, new, old, "supersedes")
    assert result.created and result.to.status == "superseded"
    target = store.read(ALICE, old)
    assert target.superseded_by == new
    assert target.memory.status == "superseded"
    assert target.memory.updated_seq > before.updated_seq  # type: ignore[union-attr]
    assert [(b.rel, b.note.slug) for b in target.backlinks] == [("supersedes", new)]
    assert [(lk.rel, lk.note.slug) for lk in store.read(ALICE, new).links] == [("supersedes", old)]
    assert [h.memory.slug for h in store.search(ALICE, "plan")] == [new]


def test_supersedes_refuses_cycles(store: Store) -> None:
    a, b, c = put(store, "Alpha"), put(store, "Beta"), put(store, "Gamma")
    store.link(ALICE, b, a, "supersedes")
    store.link(ALICE, c, b, "supersedes")
    fingerprint = store.fingerprint(ALICE)
    for source, target in ((a, b), (a, c), (b, c)):
        with pytest.raises(LinkRefused) as caught:
            store.link(ALICE, source, target, "supersedes")
        assert caught.value.reason in {"cycle", "already_superseded"}
    with pytest.raises(LinkRefused) as caught:
        store.link(ALICE, a, c, "supersedes")
    assert caught.value.reason == "cycle"
    with pytest.raises(LinkRefused) as caught:
        store.link(ALICE, a, a, "supersedes")
    assert caught.value.reason == "self_link"
    assert store.fingerprint(ALICE) == fingerprint


def test_supersedes_refuses_a_second_superseder(store: Store) -> None:
    old, one, two = put(store, "Old"), put(store, "One"), put(store, "Two")
    store.link(ALICE, one, old, "supersedes")
    with pytest.raises(LinkRefused) as caught:
        store.link(ALICE, two, old, "supersedes")
    assert caught.value.reason == "already_superseded"
    assert "'one'" in format_error(caught.value)
    assert store.read(ALICE, old).superseded_by == one


def test_adding_an_existing_edge_changes_nothing(store: Store) -> None:
    a, b = put(store, "First"), put(store, "Second")
    assert store.link(ALICE, a, b, "related").created
    store.link(ALICE, b, a, "supersedes")
    fingerprint = store.fingerprint(ALICE)
    assert not store.link(ALICE, a, b, "related").created
    assert not store.link(ALICE, b, a, "supersedes").created
    assert store.fingerprint(ALICE) == fingerprint
    assert len(store.read(ALICE, a).links) == 1


def test_link_rejects_bad_rel_and_missing_slugs(store: Store) -> None:
    a = put(store, "Present")
    with pytest.raises(InvalidInput) as caught:
        store.link(ALICE, a, a, "replaces")
    assert caught.value.reason == "bad_rel"
    with pytest.raises(NotFound) as missing:
        store.link(ALICE, a, "absent", "related")
    assert "absent" in str(missing.value)
    with pytest.raises(NotFound):
        store.link(Scope.owner("bob"), a, a + "-x", "derived_from")
    assert store.read(ALICE, a).links == []


def test_read_of_a_missing_slug_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound) as caught:
        store.read(ALICE, "nothing-here")
    assert caught.value.reason == "not_found"
    assert isinstance(caught.value, LookupError)
    assert store.get(ALICE, "nothing-here") is None


# Fingerprint and index text ----------------------------------------------------------------


def test_fingerprint_changes_on_every_write_and_link(store: Store) -> None:
    assert store.fingerprint(ALICE) == (0, 0)
    a = put(store, "One")
    first = store.fingerprint(ALICE)
    b = put(store, "Two")
    second = store.fingerprint(ALICE)
    store.link(ALICE, b, a, "supersedes")
    third = store.fingerprint(ALICE)
    assert first[0] == 1 and second[0] == 2 and third[0] == 1
    assert first[1] < second[1] < third[1]
    assert store.fingerprint(Scope.owner("bob")) == (0, 0)


def test_index_text_puts_pinned_bodies_first_within_budgets(make_store, backend: str) -> None:
    store = make_store(backend, index_token_budget=120, pinned_body_bytes=40)
    assert store.index_text(ALICE) == ""
    store.write(
        ALICE,
        {"title": "Always answer in British English", "body": "B" * 200, "pinned": True},
        provenance="user",
    )
    for i in range(30):
        put(store, f"Ordinary note number {i}")
    text = store.index_text(ALICE)
    assert text.startswith("<gleaner-memory-index") and text.endswith("</gleaner-memory-index>")
    assert "Always answer in British English" in text.splitlines()[1]
    assert "B" * 40 in text and "B" * 41 not in text
    assert "Ordinary note number 29" in text  # newest titles first
    assert "Ordinary note number 0 " not in text  # the budget cut the oldest
    assert len(text.encode()) <= 120 * 4


def test_similar_is_the_same_whether_candidates_come_from_rare_terms_or_all_terms(
    store: Store,
) -> None:
    from gleaner.store.notes import similar

    for i in range(12):
        put(store, f"Deploy the billing service {i % 3} on Fridays", ["ops"])
    put(store, "Deploy the billing worker on Fridays", ["ops"])
    probe = ("Deploy the billing service 1 on Fridays", "ops")

    def twins(common: int = similar.COMMON_TERM_NOTES) -> tuple[list[tuple[str, float]], int]:
        """The probe's twins, and how many full SQL counts the lookup ran."""
        with sent_sql(store) as sent, store.transaction() as session:
            [found] = similar.similar_twins_many(
                session, ALICE, [probe], threshold=0.7, limit=50, common_term_notes=common
            )
        return sorted((t.slug, t.score) for t in found), full_counts(sent)

    # 8 terms at 0.7: 6 must be shared, so the 3 rarest terms find every candidate.
    via_rare_terms, counted = twins()
    assert counted == 0  # candidates came from the rare terms' postings
    # Every term held by a note is "common": the same answer, counted in SQL instead.
    assert twins(common=1) == (via_rare_terms, 1)
    assert len(via_rare_terms) == 12 and max(s for _, s in via_rare_terms) == 1.0


def test_many_probes_in_one_lookup_answer_as_each_probe_alone(store: Store) -> None:
    from gleaner.store.notes import similar

    for i in range(8):
        put(store, f"Deploy the billing service {i % 3} on Fridays", ["ops"])
    put(store, "Rotate the staging database password monthly", ["security"])
    archived = put(store, "Rotate the staging database password weekly", ["security"])
    with store.transaction() as session:  # archived by decay: no longer a twin
        session.execute(update(Memory).where(Memory.slug == archived).values(status=ARCHIVED))
    probes = [
        ("Deploy the billing service 1 on Fridays", "ops"),  # rare prefix, many holders
        ("Rotate the staging database password monthly", "security"),
        ("Something nobody wrote before", ""),  # no holder: no candidate lookup
        ("", ""),  # no terms at all
        ("Deploy billing", "ops"),  # 3 terms at 0.7: all must be shared, none holds them
        ("Fridays", ""),  # 1 term: its prefix is the whole probe, counted in SQL
    ]

    def answer(
        batched: bool, exclude: int | None = None, common: int = similar.COMMON_TERM_NOTES
    ) -> list[list[tuple[str, float, bool, str]]]:
        tuning = {"exclude_id": exclude, "limit": 4, "common_term_notes": common}
        with store.transaction() as session:
            if batched:
                found = similar.similar_twins_many(session, ALICE, probes, threshold=0.7, **tuning)
            else:
                found = [
                    similar.similar_twins_many(session, ALICE, [probe], threshold=0.7, **tuning)[0]
                    for probe in probes
                ]
        return [[(t.slug, t.score, t.pinned, t.provenance) for t in twins] for twins in found]

    with sent_sql(store) as sent:
        batched = answer(True)
    assert full_counts(sent) == 1  # only "Fridays", whose prefix would be the whole probe
    assert batched == answer(False)
    assert [len(twins) for twins in batched] == [4, 1, 0, 0, 0, 0]
    assert batched[1][0][1] == 1.0 and archived not in {t[0] for t in batched[1]}
    best = [t[1] for t in batched[0]]
    assert best == sorted(best, reverse=True) and best[0] == 1.0
    with store.transaction() as session:
        first = similar.similar_twins_many(session, ALICE, [probes[1]], threshold=0.7)[0][0].id
    assert answer(True, exclude=first)[1] == []  # the probe's own note left out
    # Every term held by a note is common: each probe with a holder is counted in SQL (the
    # two billing probes, the password one and "Fridays"), and the answers do not change.
    with sent_sql(store) as sent:
        assert answer(True, common=1) == batched
    assert full_counts(sent) == 4
