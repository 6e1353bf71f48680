"""Housekeeping: recency decay and near-duplicate superseding, on both backends."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from itertools import combinations
from typing import Any

import pytest
from sqlalchemy import create_engine, event, func, insert, select, text

from gleaner.store import Scope, Store
from gleaner.store.housekeeping import dedupe, dedupe_settle
from gleaner.store.housekeeping.dedupe import DedupeResult
from gleaner.store.notes.overlap import Candidates, similar_groups
from gleaner.store.notes.terms import FactText, covers, disagreement, same_fact, similarity_terms
from gleaner.store.schema.models import HousekeepingState, Memory, MemoryTerm
from gleaner.store.text import content_hash
from tests.conftest import PG_BASE_URL

ALICE = Scope.owner("alice")
BOB = Scope.owner("bob")
# Seven content terms (team deploy bill api docker compos friday); one more keeps J = 7/8 (over
# the 0.8 default), swapping two of them gives 5/9 (under it).
BASE = "team deploys the billing api with docker compose on friday"
NEAR = BASE + " evening"
FAR = "team deploys the invoice api with docker swarm on friday"


def put(store: Store, title: str, scope: Scope = ALICE, **extra: object) -> str:
    return store.write(scope, {"title": title, "body": f"body of {title}", **extra}).memory.slug


def stamp(store: Store, slug: str, when: datetime, scope: Scope = ALICE) -> None:
    """Test set-up: pretend the note was last updated at ``when``."""
    if store.dialect == "sqlite":
        when = when.astimezone(UTC).replace(tzinfo=None)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE memories SET updated_at = :t"
                " WHERE slug = :s AND scope_kind = :k AND scope_id = :i"
            ),
            {"t": when, "s": slug, "k": scope.kind, "i": scope.id},
        )


def age(store: Store, slug: str, days: float, scope: Scope = ALICE) -> None:
    stamp(store, slug, datetime.now(UTC) - timedelta(days=days), scope)


def notes(store: Store, scope: Scope = ALICE) -> dict[str, tuple[str, float, int]]:
    """slug -> (status, weight, updated_seq) of every note in the scope, whatever its status."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(Memory.slug, Memory.status, Memory.weight, Memory.updated_seq).where(
                Memory.scope_kind == scope.kind, Memory.scope_id == scope.id
            )
        )
        return {slug: (status, weight, seq) for slug, status, weight, seq in rows}


def supersedes(store: Store) -> set[tuple[str, str]]:
    """(keeper slug, loser slug) of every supersedes link."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT k.slug, l.slug FROM memory_links e"
                " JOIN memories k ON k.id = e.from_id JOIN memories l ON l.id = e.to_id"
                " WHERE e.rel = 'supersedes'"
            )
        )
        return {(keeper, loser) for keeper, loser in rows}


def state(store: Store, name: str) -> HousekeepingState | None:
    with store.transaction() as session:
        return session.get(HousekeepingState, name)


def max_seq(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(select(func.max(Memory.updated_seq))).scalar_one() or 0)


# Decay ------------------------------------------------------------------------------------


def test_decay_weight_halves_every_half_life_and_leaves_seq_alone(store: Store) -> None:
    ages = {"fresh": 0.0, "month": 30.0, "two-months": 60.0, "ancient": 100_000.0}
    for slug, days in ages.items():
        put(store, slug.replace("-", " ").title(), slug=slug)
        age(store, slug, days)
    future = put(store, "From the future")
    stamp(store, future, datetime.now(UTC) + timedelta(days=3))
    before = notes(store)
    fingerprint = store.fingerprint(ALICE)

    result = store.decay()

    after = notes(store)
    assert after["fresh"][1] == pytest.approx(1.0, abs=1e-4)
    assert after["month"][1] == pytest.approx(0.5, abs=1e-4)
    assert after["two-months"][1] == pytest.approx(0.25, abs=1e-4)
    assert after["ancient"][1] == pytest.approx(0.0, abs=1e-12)  # no underflow error
    assert after[future][1] == pytest.approx(1.0, abs=1e-12)  # the future counts as now
    assert {slug: seq for slug, (_, _, seq) in after.items()} == {
        slug: seq for slug, (_, _, seq) in before.items()
    }
    assert store.fingerprint(ALICE) == fingerprint
    # The month-old, two-month-old and ancient notes moved; a fresh note moves by less than
    # WEIGHT_EPSILON in the seconds a test takes.
    assert result.updated == 3
    assert (result.archived, result.batches, result.dry_run) == (0, 1, False)


def test_decay_works_in_batches_of_the_configured_size(make_store, backend: str) -> None:
    store = make_store(backend, housekeeping_batch_size=3, half_life_days=10)
    slugs = [put(store, f"Note {i}") for i in range(13)]
    with store.engine.begin() as conn:  # gaps in the ids: batches count rows, not ids
        conn.execute(text("DELETE FROM memories WHERE slug IN ('note-1', 'note-5', 'note-6')"))
    kept = [s for s in slugs if s not in {"note-1", "note-5", "note-6"}]
    for n, slug in enumerate(kept):
        age(store, slug, n + 1)

    result = store.decay()

    assert (result.batches, result.updated) == (4, 10)
    weights = notes(store)
    for n, slug in enumerate(kept):
        assert weights[slug][1] == pytest.approx(0.5 ** ((n + 1) / 10), abs=1e-4)


def test_decay_archives_unpinned_live_notes_below_the_floor(make_store, backend: str) -> None:
    store = make_store(backend, archive_below_weight=0.2)
    old = put(store, "Old unpinned")
    pinned = put(store, "Old pinned", pinned=True)
    fresh = put(store, "Fresh note")
    gone = put(store, "Old superseded")
    store.link(ALICE, fresh, gone, "supersedes")
    for slug in (old, pinned, gone):
        age(store, slug, 90)  # weight 0.125
    before = notes(store)
    count, top = store.fingerprint(ALICE)

    result = store.decay()

    after = notes(store)
    assert result.archived == 1
    assert after[old][0] == "archived"
    assert after[old][2] > top  # a new updated_seq: the fingerprint changes
    assert after[pinned][:2] == ("live", pytest.approx(0.125, abs=1e-4))
    assert after[pinned][2] == before[pinned][2]
    assert after[fresh][0] == "live"
    assert after[gone][0] == "superseded"
    assert set(after) == set(before)  # nothing deleted
    assert store.fingerprint(ALICE) == (count - 1, after[old][2])
    assert store.search(ALICE, "unpinned") == []
    assert store.decay().archived == 0  # already archived


def test_decay_dry_run_writes_nothing(make_store, backend: str) -> None:
    store = make_store(backend, archive_below_weight=0.2)
    put(store, "Fresh note")
    for title, days in (("Month old", 30), ("Quarter old", 90)):
        age(store, put(store, title), days)
    before = notes(store)

    dry = store.decay(dry_run=True)

    assert (dry.dry_run, dry.updated, dry.archived, dry.batches) == (True, 2, 1, 1)
    assert notes(store) == before
    assert state(store, "decay") is None
    real = store.decay()
    assert (real.updated, real.archived) == (dry.updated, dry.archived)
    recorded = state(store, "decay")
    assert recorded is not None and recorded.last_run_at is not None
    assert recorded.last_result is not None and recorded.last_result["archived"] == 1


# Dedupe -----------------------------------------------------------------------------------


def pairs(result: DedupeResult) -> list[tuple[str, str]]:
    return [(p.keeper, p.loser) for p in result.pairs]


def test_newer_note_supersedes_older_duplicate(store: Store) -> None:
    old = put(store, BASE)
    age(store, old, 5)
    new = put(store, NEAR)

    result = store.dedupe()

    assert pairs(result) == [(new, old)]
    assert result.pairs[0].score == pytest.approx(7 / 8, abs=1e-4)
    assert result.superseded == 1
    read = store.read(ALICE, old)
    assert (read.memory.status, read.superseded_by) == ("superseded", new)
    assert [(link.rel, link.note.slug) for link in store.read(ALICE, new).links] == [
        ("supersedes", old)
    ]
    assert set(notes(store)) == {old, new}  # nothing deleted


def test_ties_go_to_higher_confidence_then_higher_id(store: Store) -> None:
    when = datetime.now(UTC) - timedelta(days=1)
    sure = put(store, NEAR, confidence=0.9)
    unsure = put(store, BASE, confidence=0.4)
    first = put(store, "weekly sync notes for the payments squad meeting in room four")
    second = put(store, "weekly sync notes for the payments squad meeting in room four today")
    for slug in (sure, unsure, first, second):
        stamp(store, slug, when)

    result = store.dedupe()

    assert sorted(pairs(result)) == sorted([(sure, unsure), (second, first)])


def test_pinned_keeper_wins_and_pinned_duplicates_both_stay(store: Store) -> None:
    pinned = put(store, NEAR, pinned=True)
    age(store, pinned, 30)
    newer = put(store, BASE)
    a = put(store, "always run the migrations before restarting the web workers", pinned=True)
    age(store, a, 2)
    b = put(store, "always run the migrations before restarting the web workers now", pinned=True)
    c = put(store, "always run the migrations before restarting all the web workers")

    result = store.dedupe()

    # The newer pinned note of the two keeps the unpinned third; neither pinned one goes.
    assert sorted(pairs(result)) == sorted([(pinned, newer), (b, c)])
    status = {slug: s for slug, (s, _, _) in notes(store).items()}
    assert status == {
        pinned: "live",
        newer: "superseded",
        a: "live",
        b: "live",
        c: "superseded",
    }


def put_keyed(store: Store, title: str, key: str) -> str:
    """A note saved under a topic key (``mem_save``); its slug."""
    saved = store.mem_save("alice", f"body of {title}", type="decision", title=title, topic_key=key)
    with store.engine.connect() as conn:
        return str(conn.execute(select(Memory.slug).where(Memory.id == saved.id)).scalar_one())


def test_a_note_holding_a_topic_key_is_kept_never_superseded(store: Store) -> None:
    """Later saves and harvests under a key upsert the note holding it: superseded, what
    they write would be hidden. So a keyed note outranks its newer unkeyed twin, and two
    keyed twins both stay."""
    keyed = put_keyed(store, NEAR, "ops/deploy")
    age(store, keyed, 30)
    newer = put(store, BASE)
    first = put_keyed(store, "always run the migrations before restarting the workers", "ops/a")
    age(store, first, 2)
    second = put_keyed(store, "always run the migrations before restarting the workers now", "b")

    result = store.dedupe()

    assert pairs(result) == [(keyed, newer)]
    status = {slug: s for slug, (s, _, _) in notes(store).items()}
    assert status == {keyed: "live", newer: "superseded", first: "live", second: "live"}


def test_a_person_s_note_and_a_note_saying_more_are_never_hidden_by_a_copy(store: Store) -> None:
    """A newer, keyed copy of a person-written note does not hide it (person-written notes
    are never superseded; one outranks a plain copy), and a newer note saying less does not
    hide one that says more (a keeper says all that its loser said)."""
    title = "Allergic to peanuts and shellfish"
    person = store.write(
        ALICE, {"title": title, "body": f"body of {title}"}, provenance="user"
    ).memory.slug
    age(store, person, 30)
    keyed = put_keyed(store, title, "health/allergies")
    copy = put(store, title)
    detailed = put(store, NEAR)
    age(store, detailed, 30)
    shorter = put(store, BASE)

    result = store.dedupe()

    status = {slug: s for slug, (s, _, _) in notes(store).items()}
    assert status[person] == status[keyed] == status[detailed] == status[shorter] == "live"
    # The person's note, ranked above the keyed one, keeps the plain copy.
    assert pairs(result) == [(person, copy)] and status[copy] == "superseded"
    assert [hit.memory.slug for hit in store.search(ALICE, "evening")] == [detailed]


def test_below_threshold_and_other_scopes_are_untouched(store: Store) -> None:
    put(store, BASE)
    put(store, FAR)
    put(store, BASE, scope=BOB)
    put(store, "something else entirely", scope=BOB)

    result = store.dedupe()

    assert (result.superseded, result.scopes_scanned, result.notes_scanned) == (0, 2, 4)
    statuses = [s for scope in (ALICE, BOB) for s, _, _ in notes(store, scope).values()]
    assert statuses == ["live"] * 4
    assert supersedes(store) == set()


def test_every_scope_is_read_and_deduplicated_on_its_own(store: Store) -> None:
    # Several scopes: on PostgreSQL each next scope is read ahead on a second connection.
    owners = [Scope.owner(f"user{n}") for n in range(7)]
    for n, scope in enumerate(owners):
        put(store, BASE, scope=scope, slug=f"base-{n}")
        put(store, NEAR if n % 2 else FAR, scope=scope, slug=f"other-{n}")

    result = store.dedupe()

    assert (result.scopes_scanned, result.notes_scanned) == (7, 14)
    # Only the odd scopes hold a near-duplicate; the newer note (written second) keeps.
    assert supersedes(store) == {(f"other-{n}", f"base-{n}") for n in (1, 3, 5)}
    assert result.superseded == 3


def tuned_dedupe(store: Store, **options: Any) -> DedupeResult:
    """``store.dedupe()`` with dedupe's keyword options set (``supersede_batch``,
    ``id_chunk``, ``on_step``)."""
    with store.transaction() as session:
        return dedupe.dedupe(session, store.settings, **options)


def fail_on_call(
    monkeypatch: pytest.MonkeyPatch, module: Any, name: str, nth: int, message: str
) -> list[int]:
    """Make ``module.<name>`` raise RuntimeError(message) on its ``nth`` call; the returned
    list grows by one per call."""
    real = getattr(module, name)
    calls: list[int] = []

    def failing(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == nth:
            raise RuntimeError(message)
        return real(*args)

    monkeypatch.setattr(module, name, failing)
    return calls


def test_a_failure_in_a_later_scope_leaves_every_scope_as_it_was(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    owners = [Scope.owner(f"user{n}") for n in range(4)]
    for scope in owners:
        put(store, BASE, scope=scope)
        put(store, NEAR, scope=scope)
    fail_on_call(monkeypatch, dedupe, "similar_groups", 3, "boom")
    with pytest.raises(RuntimeError, match="boom") as raised:
        tuned_dedupe(store, supersede_batch=1)  # the first scopes are written
    monkeypatch.undo()

    # Given back at once, though the traceback (held by ``raised``) keeps the run's frame.
    assert raised.traceback and store.engine.pool.checkedout() == 0  # type: ignore[attr-defined]
    assert supersedes(store) == set()  # one transaction: nothing of the run is left
    assert store.dedupe().superseded == 4  # and the store works on


def test_a_failed_write_fails_the_run_and_leaves_every_scope_as_it_was(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On PostgreSQL the pairs are written on a thread of their own while scopes are scanned:
    # its failure must still reach the caller and roll the whole run back.
    for n in range(5):
        put(store, BASE, scope=Scope.owner(f"user{n}"))
        put(store, NEAR, scope=Scope.owner(f"user{n}"))
    writes = fail_on_call(monkeypatch, dedupe_settle, "write_supersedes", 2, "disk full")
    with pytest.raises(RuntimeError, match="disk full"):
        tuned_dedupe(store, supersede_batch=1, id_chunk=1)  # a write after every scope
    monkeypatch.undo()

    assert len(writes) == 2  # it stopped at the failed write
    assert supersedes(store) == set()
    assert store.dedupe().superseded == 5


def test_superseded_and_archived_notes_are_ignored(store: Store) -> None:
    replaced = put(store, BASE)
    replacement = put(store, "a completely different way to ship the billing service")
    store.link(ALICE, replacement, replaced, "supersedes")
    shelved = put(store, "rotate the database credentials on the first of each month")
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE memories SET status = 'archived' WHERE slug = :s"), {"s": shelved}
        )
    put(store, NEAR)
    put(store, "rotate the database credentials on the first of each month please")

    result = store.dedupe()

    assert result.superseded == 0
    assert result.notes_scanned == 3  # live ones only
    assert supersedes(store) == {(replacement, replaced)}


def test_dedupe_is_incremental_from_its_watermark(store: Store) -> None:
    distinct = [
        "prefer tabs over spaces in the go services repository",
        "the staging cluster runs in the frankfurt region of the cloud",
        "oncall handoff happens every monday at nine in the morning",
    ]
    for title in distinct:
        put(store, title)
    old = put(store, BASE)
    age(store, old, 3)
    kept = put(store, NEAR)

    first = store.dedupe()
    assert (first.notes_scanned, first.notes_changed, first.superseded) == (5, 5, 1)
    assert first.watermark == max_seq(store) - 1  # the supersede itself came after the start
    assert state(store, "dedupe").watermark == first.watermark  # type: ignore[union-attr]

    second = store.dedupe()
    assert (second.scopes_scanned, second.notes_scanned, second.candidates_checked) == (0, 0, 0)
    assert second.superseded == 0 and second.since_seq == first.watermark

    latest = put(store, NEAR + " sharp")
    put(store, "an unrelated note about lunch", scope=BOB)

    third = store.dedupe()
    assert third.scopes_scanned == 2
    assert third.notes_changed == 2  # the new duplicate and bob's note
    assert third.notes_scanned == 6  # alice's four live notes plus the new one, bob's one
    assert third.candidates_checked == 1  # only the new note against its twin
    assert pairs(third) == [(latest, kept)]
    assert store.dedupe().superseded == 0


def test_dedupe_dry_run_reports_without_writing(store: Store) -> None:
    old = put(store, BASE)
    age(store, old, 3)
    new = put(store, NEAR)
    before = notes(store)

    dry = store.dedupe(dry_run=True)

    assert (dry.dry_run, dry.superseded, pairs(dry)) == (True, 1, [(new, old)])
    assert (dry.since_seq, dry.watermark) == (0, 0)
    assert notes(store) == before
    assert supersedes(store) == set()
    assert state(store, "dedupe") is None
    real = store.dedupe()
    assert real.pairs == dry.pairs  # same input, same output
    assert real.watermark > 0
    assert store.dedupe(dry_run=True).pairs == []


# Recall: prefix filtering against an exact all-pairs computation ---------------------------

THRESHOLD = 0.8


def random_notes(rng: random.Random, count: int) -> list[tuple[str, str]]:
    """(title, topics) of ``count`` notes over a skewed vocabulary, with planted duplicates."""
    words = [f"w{n}" for n in range(4_000)]
    weights = [1 / (n + 1) for n in range(len(words))]
    topic_words = [f"t{n}" for n in range(40)]
    made: list[tuple[str, str]] = []
    while len(made) < count:
        title = list(dict.fromkeys(rng.choices(words, weights, k=rng.randint(3, 12))))
        topics = rng.sample(topic_words, rng.randint(0, 2))
        made.append((" ".join(title), " ".join(topics)))
        if rng.random() < 0.3:  # a near (or not quite near) duplicate
            variant = list(title)
            for _ in range(rng.randint(1, 2)):
                edit = rng.random()
                if edit < 0.4:
                    variant.append(rng.choice(words))
                elif edit < 0.7 and len(variant) > 1:
                    variant.pop(rng.randrange(len(variant)))
                else:
                    variant[rng.randrange(len(variant))] = rng.choice(words)
            made.append((" ".join(dict.fromkeys(variant)), " ".join(topics)))
        if rng.random() < 0.05:  # an exact copy
            made.append(made[-1])
    return made[:count]


def all_pairs(sets: Sequence[frozenset[str]], threshold: float) -> set[tuple[int, int]]:
    """Every pair at or over the threshold, by brute force (bitmasks keep it quick)."""
    bit: dict[str, int] = {}
    masks = []
    for terms in sets:
        mask = 0
        for term in terms:
            mask |= 1 << bit.setdefault(term, len(bit))
        masks.append(mask)
    found = set()
    for i, j in combinations(range(len(sets)), 2):
        union = (masks[i] | masks[j]).bit_count()
        if union and (masks[i] & masks[j]).bit_count() / union >= threshold:
            found.add((i, j))
    return found


def expand(found: Candidates) -> set[tuple[int, int]]:
    """The note pairs the grouped edges stand for."""
    pairs = set()
    for g, neighbours in found.edges.items():
        for h, _ in neighbours:
            members = [(i, j) for i in found.groups[g] for j in found.groups[h] if i != j]
            pairs.update((min(i, j), max(i, j)) for i, j in members)
    return pairs


def test_prefix_filter_has_full_recall_against_all_pairs() -> None:
    rng = random.Random(20260101)
    sets = [similarity_terms(title, topics) for title, topics in random_notes(rng, 2_000)]
    exact = all_pairs(sets, THRESHOLD)
    assert len(exact) > 150  # the planted duplicates are there

    found = similar_groups(sets, [True] * len(sets), THRESHOLD)

    assert expand(found) == exact  # recall 1.0, and nothing extra
    assert found.checked < len(sets) * (len(sets) - 1) / 2 / 50  # far from all pairs

    changed = [rng.random() < 0.1 for _ in sets]
    partial = expand(similar_groups(sets, changed, THRESHOLD))
    touching = {(i, j) for i, j in exact if changed[i] or changed[j]}
    assert touching <= partial <= exact


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.9, 1.0])
def test_prefix_filter_recall_at_other_thresholds(threshold: float) -> None:
    rng = random.Random(threshold)
    sets = [similarity_terms(title, topics) for title, topics in random_notes(rng, 600)]
    found = similar_groups(sets, [True] * len(sets), threshold)
    assert expand(found) == all_pairs(sets, threshold)


def bulk_insert(store: Store, scope: Scope, rows: Iterable[dict[str, Any]]) -> None:
    """Test set-up: insert notes and their term rows directly (store.write is slow for 2,000)."""
    rows = list(rows)
    with store.transaction() as session:
        if store.dialect == "postgresql":
            seqs = list(
                session.execute(
                    text("SELECT nextval('memories_updated_seq_seq') FROM generate_series(1, :n)"),
                    {"n": len(rows)},
                ).scalars()
            )
        else:
            top = session.execute(select(func.max(Memory.updated_seq))).scalar_one() or 0
            seqs = list(range(top + 1, top + 1 + len(rows)))
        values = [
            {
                "scope_kind": scope.kind,
                "scope_id": scope.id,
                "body": row["title"],
                "provenance": "agent",
                "status": "live",
                "content_hash": content_hash(row["title"]),
                "created_at": row["updated_at"],
                "updated_seq": seq,
                **row,
            }
            for row, seq in zip(rows, seqs, strict=True)
        ]
        ids = session.execute(
            insert(Memory).returning(Memory.id, sort_by_parameter_order=True), values
        ).scalars()
        terms = [
            {"memory_id": note_id, "term": term, "scope_kind": scope.kind, "scope_id": scope.id}
            for note_id, row in zip(ids, rows, strict=True)
            for term in similarity_terms(row["title"], row["topics"])
        ]
        session.execute(insert(MemoryTerm), terms)


def test_dedupe_on_a_random_store_leaves_no_duplicate_pair(make_store) -> None:
    store = make_store("sqlite")
    rng = random.Random(7)
    now = datetime.now(UTC)
    made = random_notes(rng, 2_000)
    given = [
        {
            "slug": f"n{n}",
            "title": title,
            "topics": topics,
            "pinned": rng.random() < 0.05,
            "confidence": rng.choice([None, 0.5, 0.9]),
            # Whole days: many ties, so confidence and id decide too.
            "updated_at": now - timedelta(days=rng.randint(0, 20)),
        }
        for n, (title, topics) in enumerate(made)
    ]
    bulk_insert(store, ALICE, iter(given))
    # Keeper order (pinned, newer, more confident, later id: ids follow the rows' order).
    rank = {
        g["slug"]: (
            g["pinned"],
            g["updated_at"],
            -1.0 if g["confidence"] is None else g["confidence"],
            n,
        )
        for n, g in enumerate(given)
    }
    sets = {f"n{n}": similarity_terms(title, topics) for n, (title, topics) in enumerate(made)}
    # bulk_insert's body is the title.
    texts = {f"n{n}": FactText(title, title, topics) for n, (title, topics) in enumerate(made)}

    result = store.dedupe()

    assert result.superseded > 100
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(Memory.id, Memory.slug, Memory.status, Memory.pinned, Memory.superseded_by_id)
        ).all()
    assert len(rows) == 2_000  # nothing deleted
    slug_of = {note_id: slug for note_id, slug, *_ in rows}
    live = [slug for _, slug, status, _, _ in rows if status == "live"]
    pinned = {slug for _, slug, _, is_pinned, _ in rows if is_pinned}
    for _, slug, status, is_pinned, by in rows:
        if status == "superseded":
            assert not is_pinned
            assert same_fact(texts[slug], texts[slug_of[by]], THRESHOLD)
            assert covers(texts[slug_of[by]], texts[slug])  # its keeper says all it said
    # No pair holding the same fact is left among live notes where one says all the other
    # does, unless the other is pinned; pairs that score high but disagree (a swapped word)
    # are both kept, and so is a pair where the note that says more is the one ranked lower.
    left = all_pairs([sets[s] for s in live], THRESHOLD)
    kept_apart = [(i, j) for i, j in left if disagreement(texts[live[i]], texts[live[j]])]
    assert kept_apart  # the random store has such pairs: the check below is not vacuous
    for i, j in left:
        a, b = live[i], live[j]
        if not same_fact(texts[a], texts[b], THRESHOLD):
            continue
        for keeper, other in ((a, b), (b, a)):
            if covers(texts[keeper], texts[other]):
                # Left live only when pinned, or when it outranks the note saying more.
                assert other in pinned or rank[other] > rank[keeper], (keeper, other)
    again = store.dedupe()
    assert (again.superseded, again.candidates_checked) == (0, 0)


# Overlapping runs -------------------------------------------------------------------------


def seed_duplicates(store: Store, count: int) -> None:
    now = datetime.now(UTC)
    rows = []
    for n in range(count):
        title = f"fact {n} alpha{n} beta{n} gamma{n} delta{n} epsilon{n} zeta{n} eta{n} theta{n}"
        rows.append({"slug": f"a{n}", "title": title, "updated_at": now - timedelta(days=1)})
        rows.append({"slug": f"b{n}", "title": title + " again", "updated_at": now})
    bulk_insert(
        store, ALICE, ({"topics": "", "pinned": False, "confidence": None, **r} for r in rows)
    )


def run_paused(
    store: Store, step: str, reached: threading.Event, go: threading.Event
) -> tuple[threading.Thread, dict[str, DedupeResult]]:
    """A dedupe run of ``store`` on a thread of its own, stopped the first time it reaches
    the named ``step`` (``dedupe.STEPS``) until ``go``; its result lands in the dict."""
    assert step in dedupe.STEPS

    def on_step(at: str) -> None:
        if at == step and not reached.is_set():
            reached.set()
            go.wait(timeout=30)

    outcome: dict[str, DedupeResult] = {}
    worker = threading.Thread(
        target=lambda: outcome.setdefault("run", tuned_dedupe(store, on_step=on_step))
    )
    worker.start()
    return worker, outcome


@pytest.mark.postgres
def test_overlapping_runs_on_postgresql_one_works_one_is_locked(make_store, pg_url: str) -> None:
    store = make_store("postgresql")
    seed_duplicates(store, 40)
    plan = {(p.keeper, p.loser) for p in store.dedupe(dry_run=True).pairs}
    assert len(plan) == 40
    first, second = make_store("postgresql"), make_store("postgresql")
    holding, release = threading.Event(), threading.Event()
    worker, outcome = run_paused(first, dedupe.LOCKED, holding, release)
    try:
        assert holding.wait(timeout=30)
        outcome["second"] = second.dedupe()  # while the first holds the lock
    finally:
        release.set()
        worker.join(timeout=60)

    assert outcome["second"].locked is True
    assert (outcome["second"].superseded, outcome["second"].notes_scanned) == (0, 0)
    assert outcome["run"].locked is False
    assert outcome["run"].superseded == 40
    assert supersedes(store) == plan  # the same end state as a single run
    assert state(store, "dedupe").watermark == outcome["run"].watermark  # type: ignore[union-attr]
    after = store.dedupe()
    assert (after.locked, after.superseded) == (False, 0)


def test_overlapping_runs_on_sqlite_wait_and_find_nothing(make_store) -> None:
    store = make_store("sqlite")
    seed_duplicates(store, 10)
    plan = {(p.keeper, p.loser) for p in store.dedupe(dry_run=True).pairs}
    first, second = make_store("sqlite"), make_store("sqlite")
    inside, go = threading.Event(), threading.Event()
    worker, outcome = run_paused(first, dedupe.LOCKED, inside, go)
    assert inside.wait(timeout=30)
    waiter = threading.Thread(target=lambda: outcome.setdefault("second", second.dedupe()))
    waiter.start()  # blocks on BEGIN IMMEDIATE while the first run holds the write lock
    waiter.join(timeout=0.3)
    assert waiter.is_alive()
    go.set()
    worker.join(timeout=30)
    waiter.join(timeout=30)

    assert outcome["run"].superseded == 10
    assert outcome["second"].superseded == 0
    assert outcome["second"].since_seq == outcome["run"].watermark
    assert supersedes(store) == plan


@pytest.mark.postgres
@pytest.mark.parametrize("interference", ["superseded", "rewritten"])
def test_a_note_changed_mid_run_is_skipped_and_looked_at_again(
    make_store, pg_url: str, interference: str
) -> None:
    store = make_store("postgresql")
    old = put(store, BASE)
    age(store, old, 3)
    new = put(store, NEAR)
    other = put(store, "a completely different way to ship the billing service")
    runner = make_store("postgresql")
    loaded, go = threading.Event(), threading.Event()
    worker, outcome = run_paused(runner, dedupe.DETAILS_READ, loaded, go)
    try:
        assert loaded.wait(timeout=30)
        if interference == "superseded":  # someone else supersedes the planned loser
            store.link(ALICE, other, old, "supersedes")
        else:  # the planned keeper is rewritten into something else
            store.write(ALICE, {"title": "lunch is at noon", "body": "b", "slug": new})
    finally:
        go.set()
        worker.join(timeout=30)

    run = outcome["run"]
    assert (run.superseded, run.skipped) == (0, 1)
    assert run.watermark == run.since_seq == 0  # not moved: the next run looks again
    again = store.dedupe()
    assert (again.superseded, again.skipped) == (0, 0)
    assert again.watermark == max_seq(store)
    expected = {(other, old)} if interference == "superseded" else set()
    assert supersedes(store) == expected
    assert store.get(ALICE, new).status == "live"  # type: ignore[union-attr]


@pytest.mark.postgres
def test_a_note_deleted_between_the_scan_and_its_details_is_left_out(
    make_store, pg_url: str
) -> None:
    store = make_store("postgresql")
    old = put(store, BASE)
    age(store, old, 3)
    put(store, NEAR)
    runner = make_store("postgresql")
    loaded, go = threading.Event(), threading.Event()
    worker, outcome = run_paused(runner, dedupe.SCOPE_READ, loaded, go)
    try:
        assert loaded.wait(timeout=30)
        with store.transaction() as session:  # as forget_owner would, mid-run
            session.execute(text("DELETE FROM memories WHERE slug = :slug"), {"slug": old})
    finally:
        go.set()
        worker.join(timeout=30)

    run = outcome["run"]
    assert (run.superseded, run.skipped) == (0, 0)  # nothing left to pair the other with
    assert supersedes(store) == set()


def test_session_summaries_are_never_deduplicated(store: Store) -> None:
    first = store.mem_session_summary("alice", "We set up CI.")
    second = store.mem_session_summary("alice", "We fixed the flaky test.")
    assert first.session_id != second.session_id
    result = store.dedupe()
    assert result.superseded == 0
    assert {
        n.status
        for n in (store.get(ALICE, s) for s in ("session-summary", "session-summary-2"))
        if n
    } == {"live"}


def test_rewriting_an_archived_note_makes_it_live_again(make_store, backend: str) -> None:
    store = make_store(backend, archive_below_weight=0.2, half_life_days=1)
    put(store, "Old habit", slug="old-habit")
    age(store, "old-habit", 10)
    assert store.decay().archived == 1
    assert store.search(ALICE, "habit") == []
    store.write(ALICE, {"title": "Old habit", "body": "still true", "slug": "old-habit"})
    rewritten = store.get(ALICE, "old-habit")
    assert rewritten is not None and rewritten.status == "live"
    assert [h.memory.slug for h in store.search(ALICE, "habit")] == ["old-habit"]


def held_before_commit(store: Store, title: str) -> tuple[threading.Thread, threading.Event]:
    """A write of ``title`` on a thread of its own, stopped just before its COMMIT until the
    returned event is set: its note has taken an ``updated_seq`` no one else sees yet."""
    at_commit, release = threading.Event(), threading.Event()

    def hold(_conn: Any) -> None:
        if threading.current_thread() is writer and not at_commit.is_set():
            at_commit.set()
            release.wait(timeout=30)

    event.listen(store.engine, "commit", hold)
    writer = threading.Thread(target=lambda: put(store, title))
    writer.start()
    assert at_commit.wait(timeout=30)
    return writer, release


@pytest.mark.postgres
@pytest.mark.parametrize("commits", ["during_the_run", "after_the_run"])
def test_a_note_committed_after_later_ones_is_still_compared(make_store, commits: str) -> None:
    """PostgreSQL numbers a note when it is written but shows it at commit: a writer still
    running when a run starts may commit a note below the run's watermark. The run waits for
    it; when it runs past the wait, the watermark stays, so the note is compared next run."""
    store = make_store("postgresql")
    old = put(store, BASE)
    age(store, old, 3)
    assert store.dedupe().superseded == 0
    writer, release = held_before_commit(make_store("postgresql"), NEAR)
    try:
        put(store, "lunch is at noon on fridays")  # a later number, committed first
        if commits == "during_the_run":
            threading.Timer(0.3, release.set).start()
            run = tuned_dedupe(store)
        else:
            run = tuned_dedupe(store, in_flight_wait=0.1)
    finally:
        release.set()
        writer.join(timeout=30)

    if commits == "during_the_run":
        assert (run.in_flight, run.superseded) == (0, 1)
        assert run.watermark == max_seq(store) - 1
    else:
        assert (run.in_flight, run.superseded) == (1, 0)
        assert run.watermark == run.since_seq  # not moved past the note still to come
        again = store.dedupe()
        assert (again.in_flight, again.superseded) == (0, 1)
    [(keeper, loser)] = supersedes(store)
    assert loser == old and store.get(ALICE, keeper).title == NEAR  # type: ignore[union-attr]


@pytest.mark.postgres
def test_a_long_transaction_of_another_database_does_not_hold_the_watermark(make_store) -> None:
    store = make_store("postgresql")
    put(store, BASE)
    elsewhere = create_engine(PG_BASE_URL)  # the server's maintenance database, not the store's
    try:
        with elsewhere.begin() as other:
            other.execute(text("SELECT pg_current_xact_id()"))  # a writer's transaction id
            run = tuned_dedupe(store, in_flight_wait=0.1)
    finally:
        elsewhere.dispose()
    assert (run.in_flight, run.watermark) == (0, max_seq(store))


@pytest.mark.postgres
def test_a_number_taken_a_statement_before_its_write_is_waited_for(make_store) -> None:
    """A transaction may take its note's number in one statement (no transaction id yet) and
    write the note in the next: it is open, so the run counts it in flight."""
    store = make_store("postgresql")
    old = put(store, BASE)
    age(store, old, 3)
    other = put(store, "lunch is at noon on fridays")
    assert store.dedupe().superseded == 0
    with store.engine.connect() as writer:
        seq = writer.execute(text("SELECT nextval('memories_updated_seq_seq')")).scalar_one()
        put(store, "the office closes at six")  # a later number, committed first
        run = tuned_dedupe(store, in_flight_wait=0.1)
        writer.execute(
            text("UPDATE memories SET title = :t, body = :b, updated_seq = :s WHERE slug = :slug"),
            {"t": NEAR, "b": f"body of {NEAR}", "s": seq, "slug": other},
        )
        writer.commit()
    assert (run.in_flight, run.superseded) == (1, 0)
    assert run.watermark == run.since_seq
    again = store.dedupe()
    assert (again.in_flight, again.superseded) == (0, 1)
    assert supersedes(store) == {(other, old)}
