"""Memory that stays right: the same-fact rule, history, facts that change, owners.

The labelled pairs in ``tests/data/same_fact_pairs.json`` were written by hand: paraphrases
(surface, added detail, synonyms) and distinct facts one word apart in title or body,
reversed, negated, with a changed value. No distinct fact may be taken for the same one.
"""

from __future__ import annotations

import json
import random
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text

from gleaner.cli import main
from gleaner.harvest.batch import harvest_paths
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.queue import record_jobs
from gleaner.harvest.readers.load import read_path
from gleaner.store import Scope, Store
from gleaner.store.notes.terms import (
    FactText,
    content_terms,
    disagreement,
    same_fact,
    score,
    similarity_terms,
)
from gleaner.store.schema.models import Job, Memory, MemoryVersion
from gleaner.store.text import normalize_topics
from tests.llm_server import LLMServer, answer, llm_server, note
from tests.test_harvest_job import model_settings, transcript

PAIRS = json.loads((Path(__file__).parent / "data" / "same_fact_pairs.json").read_text())["pairs"]
EXAMPLES = Path(__file__).parent.parent / "examples"
ALICE = Scope.owner("alice")
THRESHOLD = 0.8  # the default duplicate_threshold
# A lexical rule cannot see that "brief" means "short": these count against recall only.
SYNONYMS = "paraphrase_synonym"


def fact(side: dict[str, Any]) -> FactText:
    return FactText(side["title"], side["body"], normalize_topics(side["topics"]))


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


# The rule on its own --------------------------------------------------------------------------


def test_content_terms_drop_stop_words_and_meet_across_inflection_and_hyphens() -> None:
    assert content_terms("Likes the short answers") == content_terms("Likes short answer")
    assert content_terms("Works on the front-end team") == content_terms("works on frontend team")
    assert content_terms("Binding keys") == content_terms("bind the key")
    assert content_terms("Doesn't like emoji") == content_terms("Does not like emoji")
    assert "not" in content_terms("Never uses tabs")
    # Words that flip a fact are never dropped as stop words.
    assert {"off", "before", "over"} <= set(content_terms("Turned off before lunch over it"))


def test_content_terms_are_the_same_from_threads_sharing_the_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Dedupe reads ahead on a thread; the HTTP service runs requests on threads. A shared
    # stemmer gave wrong stems or IndexError there, and a cache cleared by one thread a
    # KeyError in another: a small cache and frequent switches make both show at once.
    from gleaner.store.notes import fact_terms

    monkeypatch.setattr(fact_terms, "TERM_CACHE_SIZE", 300)
    rng = random.Random(7)
    endings = ("ing", "ness", "ational", "ed", "ly", "izer", "fulness")
    texts = [
        " ".join(
            "".join(rng.choice("abcdefghij") for _ in range(rng.randint(4, 10)))
            + rng.choice(endings)
            for _ in range(8)
        )
        for _ in range(2_000)
    ]
    expected = [content_terms(text) for text in texts]
    found: list[object] = []

    def run() -> None:
        try:
            found.append([content_terms(text) for text in texts])
        except Exception as exc:  # the failure is what this test looks for
            found.append(exc)

    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(before)
    assert found == [expected] * 6


def test_labelled_pairs_no_distinct_fact_is_taken_for_the_same() -> None:
    assert len(PAIRS) >= 100
    kinds = {p["kind"] for p in PAIRS}
    assert {"one_word_title", "one_word_body", "reversed", "changed_value", "negation"} <= kinds
    assert "marker" in kinds  # tense, whose pronoun, how many: stop words that still differ
    wrong = [
        (p["id"], p["a"]["title"], p["b"]["title"])
        for p in PAIRS
        if not p["same"] and same_fact(fact(p["a"]), fact(p["b"]), THRESHOLD)
    ]
    assert wrong == []  # precision 1.0
    lexical = [p for p in PAIRS if p["same"] and p["kind"] != SYNONYMS]
    found = [p for p in lexical if same_fact(fact(p["a"]), fact(p["b"]), THRESHOLD)]
    # As high as a lexical rule allows: the misses are "bullet points" / "bullet-points"
    # style compounds and details that take the score under the threshold.
    assert len(found) / len(lexical) >= 0.85


def test_the_seed_score_is_still_jaccard_of_title_and_topic_words() -> None:
    a = FactText("Prefers dark roast coffee", "x", "coffee")
    b = FactText("Prefers light roast coffee", "y", "coffee")
    # {prefer, dark, roast, coffe} vs {prefer, light, roast, coffe}: 3 shared of 5
    assert score(a, b) == pytest.approx(3 / 5)
    assert disagreement(a, b) == "title-substitution"


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        ("Prefers Kafka over Pulsar", "Prefers Pulsar over Kafka", "title-order"),
        ("Likes emoji in replies", "Does not like emoji in replies", "title-polarity"),
        ("Turned on two-factor auth", "Turned off two-factor auth", "title-polarity"),
    ],
)
def test_reversed_and_negated_titles_disagree(a: str, b: str, why: str) -> None:
    assert disagreement(FactText(a, "same body"), FactText(b, "same body")) == why


def test_words_too_long_to_index_still_tell_two_notes_apart() -> None:
    token_a, token_b = "a" * 50 + "1" * 30, "a" * 50 + "2" * 30  # the same first 40 and more
    a = FactText(f"Deploy token is {token_a}", f"The deploy token is {token_a}.")
    b = FactText(f"Deploy token is {token_b}", f"The deploy token is {token_b}.")
    assert disagreement(a, b) == "title-substitution" and not same_fact(a, b, THRESHOLD)
    assert same_fact(a, FactText(a.title, a.body), THRESHOLD)
    assert all(len(term) <= 64 for term in content_terms(a.title))


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        ("Is vegetarian", "Was vegetarian", "title-tense"),
        ("Has a dog", "Had a dog", "title-tense"),
        ("Manager is his sister", "Manager is her sister", "title-gender"),
        ("Likes all of the release notes", "Likes some of the release notes", "title-amount"),
        ("Has a dog", "She has a dog", None),  # added, not swapped: a detail
        ("Is vegetarian", "Is vegetarian, as are her kids", None),
        ("They are vegetarian", "She is vegetarian", None),  # no gender on one side
    ],
)
def test_stop_words_that_mark_a_fact_disagree_only_when_swapped(
    a: str, b: str, why: str | None
) -> None:
    # Not terms (the score is the seed's), but "was" for "is" is another fact.
    assert score(FactText(a, "b"), FactText(b, "b")) >= THRESHOLD or why is None
    assert disagreement(FactText(a, "same body"), FactText(b, "same body")) == why


# Through the store: dedupe and harvest on both databases --------------------------------------


def test_dedupe_on_the_labelled_pairs_supersedes_only_the_same_fact(store: Store) -> None:
    for n, pair in enumerate(PAIRS):
        scope = Scope.owner(f"pair-{n}")
        for side in ("a", "b"):
            store.write(scope, {k: pair[side][k] for k in ("title", "body", "topics")})
    result = store.dedupe()
    merged = {int(p.scope.id.removeprefix("pair-")) for p in result.pairs}
    assert result.superseded == len(merged)
    assert [PAIRS[n]["id"] for n in merged if not PAIRS[n]["same"]] == []
    expected = {n for n, p in enumerate(PAIRS) if same_fact(fact(p["a"]), fact(p["b"]), THRESHOLD)}
    assert merged == expected  # the stored term index agrees with the rule


@pytest.mark.slow
def test_harvest_on_the_labelled_pairs_never_overwrites_a_different_fact(
    make_store, backend, server
) -> None:
    store = make_store(backend, **model_settings(server))
    distinct = [p for p in PAIRS if not p["same"]][:40]
    for n, pair in enumerate(distinct):
        owner = f"h{n}"
        server.script(answer([note(**pair["a"])]), answer([note(**pair["b"])]))
        harvest_transcript(store, transcript("first", cid=f"{owner}-a", owner=owner))
        report = harvest_transcript(store, transcript("second", cid=f"{owner}-b", owner=owner))
        assert (report.notes_written, report.notes_updated) == (1, 0), pair["id"]
    with store.transaction() as session:
        assert session.execute(select(MemoryVersion)).first() is None


def test_paraphrases_that_differ_by_stop_words_plurals_or_hyphens_are_one_note(
    make_store, backend, server
) -> None:
    store = make_store(backend, **model_settings(server))
    server.script(
        answer([note("Likes short answers", body="Wants short answers.")]),
        answer([note("Likes the short answers", body="Wants the short answers, in plain prose.")]),
        answer([note("Works on the front-end team", body="Is on the front-end team.")]),
        answer([note("Works on the frontend team", body="Is on the frontend team.")]),
    )
    reports = [harvest_transcript(store, transcript(f"turn {n}", cid=f"c{n}")) for n in range(4)]
    assert [(r.notes_written, r.notes_updated, r.notes_skipped) for r in reports] == [
        (1, 0, 0),
        (0, 1, 0),  # says more: rewrites the note, the old text kept
        (1, 0, 0),
        (0, 0, 1),  # says nothing new: the note stays as it is
    ]
    assert store.fingerprint(ALICE)[0] == 2
    kept = store.get(ALICE, "likes-short-answers")
    assert kept is not None and kept.body == "Wants the short answers, in plain prose."
    [old] = store.history(ALICE, "likes-short-answers")
    assert (old.body, old.reason) == ("Wants short answers.", "harvest_same_fact")


def test_a_fact_held_only_in_the_body_is_not_overwritten(make_store, backend, server) -> None:
    store = make_store(backend, **model_settings(server))
    server.script(
        answer([note("Editor preference", body="Uses Vim for all editing.")]),
        answer([note("Editor preference", body="Uses Emacs for all editing.")]),
    )
    harvest_transcript(store, transcript("vim", cid="c1"))
    harvest_transcript(store, transcript("emacs", cid="c2"))
    bodies = {
        n.slug: n.body
        for n in (store.get(ALICE, s) for s in ("editor-preference", "editor-preference-2"))
        if n
    }
    assert bodies == {
        "editor-preference": "Uses Vim for all editing.",
        "editor-preference-2": "Uses Emacs for all editing.",
    }
    assert store.dedupe().superseded == 0  # nor does housekeeping merge them


# History ---------------------------------------------------------------------------------------


def test_every_change_of_title_or_body_keeps_the_text_it_replaces(store: Store) -> None:
    store.write(ALICE, {"title": "Deploy day", "body": "Fridays.", "slug": "deploy"})
    store.write(ALICE, {"title": "Deploy day", "body": "Fridays.", "slug": "deploy"})  # no change
    store.write(
        ALICE, {"title": "Deploy day", "body": "Tuesdays.", "slug": "deploy"}, provenance="user"
    )
    store.mem_save("alice", "Use React.", type="decision", title="Frontend", topic_key="arch/fe")
    store.mem_save("alice", "Use Vue.", type="decision", title="Frontend v2", topic_key="arch/fe")

    [deploy] = store.history(ALICE, "deploy")
    assert (deploy.body, deploy.reason, deploy.written_provenance) == (
        "Fridays.",
        "slug_upsert",
        "agent",
    )
    assert deploy.changed_provenance == "user" and deploy.changed_at >= deploy.written_at
    # A topic-keyed note's slug names its key: it stays true as the fact changes.
    [frontend] = store.history(ALICE, "arch-fe")
    assert (frontend.title, frontend.body, frontend.reason) == (
        "Frontend",
        "Use React.",
        "mem_save_upsert",
    )
    assert store.get(ALICE, "arch-fe").title == "Frontend v2"  # type: ignore[union-attr]
    assert store.history(ALICE, "arch-fe") == [frontend]  # reading changes nothing


def test_a_batch_that_rewrites_a_note_twice_keeps_both_earlier_texts(store: Store) -> None:
    from gleaner.store.notes import notes

    store.mem_save("alice", "nano", type="preference", title="Editor", topic_key="ed")
    with store.transaction() as session:
        notes.write_batch(
            session,
            store.settings,
            ALICE,
            [
                notes.BatchItem({"title": "Editor", "body": "vim"}, "preference", "ed"),
                notes.BatchItem({"title": "Editor", "body": "emacs"}, "preference", "ed"),
            ],
            provenance="compaction",
            conversation_id="c9",
        )
    history = store.history(ALICE, "ed")
    assert [(v.body, v.reason, v.changed_conversation_id) for v in history] == [
        ("vim", "topic_key_upsert", "c9"),
        ("nano", "topic_key_upsert", "c9"),
    ]
    assert store.get(ALICE, "ed").body == "emacs"  # type: ignore[union-attr]


def test_forget_deletes_the_history_too(store: Store) -> None:
    store.write(ALICE, {"title": "T", "body": "one", "slug": "t"})
    store.write(ALICE, {"title": "T", "body": "two", "slug": "t"})
    assert store.forget_owner("alice")["notes"] == 1
    with store.transaction() as session:
        assert session.execute(select(MemoryVersion)).first() is None


def test_history_of_a_missing_note_is_not_found(store: Store) -> None:
    from gleaner.store import NotFound

    with pytest.raises(NotFound):
        store.history(ALICE, "nothing-here")


def test_show_history_prints_the_earlier_versions(
    make_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    monkeypatch.setenv("GLEANER_DATABASE_URL", url)
    store = Store(url)
    store.migrate()
    store.write(ALICE, {"title": "Shell", "body": "bash", "slug": "shell"})
    store.write(ALICE, {"title": "Shell", "body": "zsh", "slug": "shell"})
    store.dispose()
    assert main(["show", "shell", "--owner", "alice", "--history"]) == 0
    out = capsys.readouterr().out
    assert "zsh" in out and "1 earlier version" in out and "bash" in out and "slug_upsert" in out
    assert main(["show", "shell", "--owner", "alice", "--history", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [(v["body"], v["reason"]) for v in shown["history"]] == [("bash", "slug_upsert")]


# Facts that change over time -------------------------------------------------------------------


def test_the_model_sees_the_owners_notes_and_its_update_mark_replaces_one(
    make_store, backend, server
) -> None:
    store = make_store(backend, **model_settings(server))
    server.script(answer([note("Lives in Lisbon", type="profile", topic_key="profile/city")]))
    harvest_transcript(store, transcript("I live in Lisbon.", cid="c1"))
    store.mem_save("bob", "Lives in Oslo", type="profile", title="Oslo", topic_key="bob/city")
    moved = note(
        "Moved to Porto", type="profile", topic_key="profile/city", mark="update", ref="n1"
    )
    server.script(answer([moved]))
    report = harvest_transcript(store, transcript("I just moved to Porto.", cid="c2"))

    shown = server.requests[-1].user_text
    assert "- n1 [profile/city] Lives in Lisbon: The user said: Lives in Lisbon." in shown
    assert "bob/city" not in shown and "Oslo" not in shown  # another owner's never
    assert report.notes_updated == 1
    assert store.get(ALICE, "profile-city").title == "Moved to Porto"  # type: ignore[union-attr]
    [old] = store.history(ALICE, "profile-city")
    assert (old.title, old.reason, old.changed_conversation_id) == (
        "Lives in Lisbon",
        "harvest_update",
        "c2",
    )


def test_a_known_key_sent_back_in_other_case_or_spacing_updates_its_note(
    make_store, backend, server
) -> None:
    store = make_store(backend, **model_settings(server))
    store.mem_save("alice", "Lisbon", type="profile", title="City", topic_key="profile/city")
    server.script(
        answer(
            [
                note(
                    "City",
                    body="Lisbon, Portugal.",
                    type="profile",
                    topics=(),
                    topic_key=" Profile/City ",
                )
            ]
        )
    )
    report = harvest_transcript(store, transcript("I live in Lisbon.", cid="c1"))
    assert (report.notes_written, report.notes_updated) == (0, 1)
    keyed = [n for n in store.list_notes(ALICE, status=None) if n.topic_key]
    assert [n.topic_key for n in keyed] == ["profile/city"]
    # The conversation (2024) is older than the note (saved now): its text is kept in history
    # at its time, under the one key.
    [older] = store.history(ALICE, keyed[0].slug)
    assert (older.body, older.reason) == ("Lisbon, Portugal.", "older_fact")


def test_known_keys_are_bounded(make_store, backend, server) -> None:
    store = make_store(backend, **model_settings(server, harvest_known_keys=5))
    for n in range(12):
        store.mem_save("alice", f"fact {n}", type="profile", title=f"Fact {n}", topic_key=f"k/{n}")
    server.script(answer([]))
    harvest_transcript(store, transcript("Fact 3 changed.", cid="c1"))
    shown = re.findall(r"\n- n\d+ \[(k/\d+)\]", server.requests[-1].user_text)
    # The one sharing the transcript's words first, then the most recently changed.
    assert shown == ["k/3", "k/11", "k/10", "k/9", "k/8"]


def test_known_keys_zero_shows_the_model_none(make_store, backend, server) -> None:
    store = make_store(backend, **model_settings(server, harvest_known_keys=0))
    store.mem_save("alice", "Lisbon", type="profile", title="City", topic_key="profile/city")
    server.script(answer([]))
    harvest_transcript(store, transcript("I live in Lisbon.", cid="c1"))
    assert "profile/city" not in json.dumps(server.requests[-1].body)


def test_write_lists_as_similar_only_notes_from_the_similar_threshold(make_store) -> None:
    # {alpha, beta, gamma, delta} and {alpha, beta, gamma, epsilon}: 3 of 5, listed; a note
    # sharing one word of nine (0.11) is not, until the threshold is below it.
    for threshold, listed in ((0.3, ["alpha-beta-gamma-delta"]), (0.1, None)):
        store = make_store("sqlite", similar_threshold=threshold)
        owner = Scope.owner(f"owner-{threshold}")
        store.write(owner, {"title": "Alpha beta gamma delta", "body": "b"})
        store.write(owner, {"title": "Alpha zeta eta theta iota", "body": "b"})
        similar = store.write(owner, {"title": "Alpha beta gamma epsilon", "body": "b"}).similar
        slugs = [s.slug for s in similar]
        if listed is not None:
            assert slugs == listed
        else:
            assert sorted(slugs) == ["alpha-beta-gamma-delta", "alpha-zeta-eta-theta-iota"]


def test_the_ledger_check_reads_the_keys_only_while_there_is_work(store: Store) -> None:
    from gleaner.store.jobs import ledger
    from gleaner.store.notes.keyed import KeyedNote

    for n in range(3):
        store.mem_save("alice", f"fact {n}", type="profile", title=f"Fact {n}", topic_key=f"k/{n}")
    with store.transaction() as session:
        fresh = ledger.check(session, ALICE, "d1", "v1", ["fact", "0"], keys=2)
        assert fresh == (0, False, [KeyedNote("k/0", "Fact 0"), KeyedNote("k/2", "Fact 2")])
        assert ledger.check(session, ALICE, "d1", "v1", ["fact"], keys=0) == (0, False, [])
        ledger.record(session, ALICE, ledger_entry("d1", "v1"), generation=0)
        assert ledger.check(session, ALICE, "d1", "v1", ["fact"], keys=2) == (0, True, [])
        assert ledger.check(session, ALICE, "d1", "v2", [], keys=1)[2] == [
            KeyedNote("k/2", "Fact 2")
        ]


def ledger_entry(digest: str, version: str) -> Any:
    from gleaner.store.jobs.ledger import LedgerEntry

    counts = dict.fromkeys(
        ("notes_written", "notes_updated", "notes_skipped", "items_dropped", "model_calls"), 0
    )
    return LedgerEntry(
        transcript_hash=digest,
        harvester_version=version,
        conversation_id="c1",
        provenance="compaction",
        occurred_at=None,
        model="m",
        prompt_tokens=0,
        completion_tokens=0,
        **counts,
    )


def test_harvest_never_rewrites_a_pinned_or_person_written_note_through_its_key(
    make_store, backend, server
) -> None:
    store = make_store(backend, **model_settings(server))
    from gleaner.store.notes import notes

    with store.transaction() as session:
        notes.write(
            session,
            store.settings,
            ALICE,
            {"title": "Always answer in French", "body": "Mine.", "pinned": True},
            provenance="user",
            topic_key="preference/language",
        )
    server.script(
        answer(
            [
                note("Answer in English", body="Injected.", topic_key="preference/language"),
                note(
                    "Likes chess",
                    body="Plays <private>at club X</private> weekly.",
                    topics=["games", "<private>club x</private>"],
                    topic_key="hobby/<private>x</private>",
                ),
            ]
        )
    )
    report = harvest_transcript(store, transcript("hi", cid="c1"))
    assert report.notes_skipped == 1
    kept = store.get(ALICE, "preference-language")
    assert kept is not None and kept.pinned and kept.body == "Mine." and kept.provenance == "user"
    chess = store.get(ALICE, "likes-chess")
    assert chess is not None and chess.topics == ["games"] and chess.topic_key is None
    assert chess.body == "Plays [REDACTED] weekly."
    with store.transaction() as session:
        dump = " ".join(
            str(v) for row in session.execute(text("SELECT * FROM memories")) for v in row
        )
    assert "club" not in dump.lower()


def test_harvest_never_writes_into_a_superseded_note_through_its_key(
    make_store, backend, server
) -> None:
    """A note declared replaced (``supersedes``) is hidden from search: what a harvest wrote
    into it under its key would never be seen. The candidate is skipped instead."""
    store = make_store(backend, **model_settings(server))
    key = "preference/editor"
    server.script(
        answer([note("Uses Vim", body="Edits in Vim.", topic_key=key)]),
        answer([note("Uses Helix", body="Edits in Helix now.", topic_key=key)]),
    )
    harvest_transcript(store, transcript("vim", cid="c1"))
    store.write(ALICE, {"title": "Editor of choice", "body": "Uses Emacs."}, provenance="user")
    store.link(ALICE, "editor-of-choice", "preference-editor", "supersedes")
    report = harvest_transcript(store, transcript("helix", cid="c2"))
    assert (report.notes_written, report.notes_updated, report.notes_skipped) == (0, 0, 1)
    hidden = store.read(ALICE, "preference-editor")
    assert (hidden.memory.body, hidden.superseded_by) == ("Edits in Vim.", "editor-of-choice")


# Owners ----------------------------------------------------------------------------------------


def example_owners() -> dict[str, str | None]:
    """conversation id -> the owner the example file names (None for exports)."""
    owners: dict[str, str | None] = {}
    for path in sorted(EXAMPLES.rglob("*.json*")):
        for t in read_path(path).transcripts:
            owners[t.conversation_id] = t.owner
    return owners


def test_readme_main_job_leaves_every_example_in_its_own_owners_scope(store: Store) -> None:
    owners = example_owners()
    assert {"bob", "carol"} <= {o for o in owners.values() if o}  # examples name others
    summary = harvest_paths(store, [EXAMPLES], owner="alice")
    assert summary.failed == 0
    with store.transaction() as session:
        placed = session.execute(select(Memory.conversation_id, Memory.scope_id)).all()
    assert placed
    for conversation, scope in placed:
        assert scope == (owners[conversation] or "alice"), conversation
    assert "Carol" not in store.index_text(ALICE)


def test_reassigning_owners_takes_the_flag_that_says_so(store: Store) -> None:
    summary = harvest_paths(store, [EXAMPLES], owner="alice", reassign_owner=True)
    assert summary.failed == 0
    with store.transaction() as session:
        scopes = set(session.execute(select(Memory.scope_id)).scalars())
    assert scopes == {"alice"}


def test_recorded_jobs_follow_the_same_owner_rule(store: Store) -> None:
    transcripts = [
        transcript("x", cid="named", owner="bob"),
        transcript("y", cid="unnamed", owner=None),
    ]
    kw: dict[str, Any] = {"provenance": "compaction", "queue": "harvest"}
    record_jobs(store, transcripts, owner="alice", **kw)
    record_jobs(store, transcripts, owner="erin", reassign_owner=True, **kw)
    with store.transaction() as session:
        jobs = session.execute(select(Job.conversation_id, Job.owner).order_by(Job.created_at))
        assert sorted(jobs) == sorted(
            [("named", "bob"), ("unnamed", "alice"), ("named", "erin"), ("unnamed", "erin")]
        )


def test_cli_reassign_owner_needs_an_owner(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["harvest", str(EXAMPLES), "--reassign-owner"]) == 2
    assert "--reassign-owner needs --owner" in capsys.readouterr().err


def test_a_queued_job_shows_the_model_the_owners_topic_keys(make_store, server) -> None:
    from gleaner.harvest.queue import run_job

    store = make_store("sqlite", **model_settings(server))
    store.mem_save("alice", "Lisbon", type="profile", title="Lives in Lisbon", topic_key="p/city")
    [job_id] = record_jobs(
        store, [transcript("I moved.", cid="j1")], owner=None, provenance="compaction", queue="q"
    )
    moved = note("Moved to Porto", type="profile", topic_key="p/city", mark="update", ref="n1")
    server.script(answer([moved]))
    assert run_job(store, job_id)["notes_updated"] == 1  # type: ignore[index]
    assert "- n1 [p/city] Lives in Lisbon: Lisbon" in server.requests[-1].user_text


def test_the_known_keys_shown_to_the_model_hold_no_private_text(
    make_store, backend, server
) -> None:
    store = make_store(backend, **model_settings(server))
    store.mem_save("alice", "Postgres", type="decision", title="Database", topic_key="arch/db")
    # Store.write keeps a title as written, private span and all.
    title = "Database <private>PWSECRET-db-password</private> choice"
    store.write(ALICE, {"slug": "arch-db", "title": title, "body": "Postgres."})
    assert store.get(ALICE, "arch-db").title == title  # type: ignore[union-attr]
    store.mem_save("alice", "Redis", type="decision", title="Cache", topic_key="arch/cache")
    with store.engine.begin() as conn:  # a key stored before keys with private text were refused
        conn.execute(
            text("UPDATE memories SET topic_key = :k WHERE slug = :s"),
            {"k": "arch/<private>KEYSECRET</private>", "s": "arch-cache"},
        )
    store.mem_save("alice", "Uses Kafka", type="decision", title="Queue", topic_key="arch/queue")
    server.script(answer([]))
    harvest_transcript(store, transcript("Database, cache and queue choices.", cid="c1"))
    shown = server.requests[-1].user_text
    assert "[arch/queue] Queue: Uses Kafka" in shown
    assert "[arch/db] Database [REDACTED] choice: Postgres." in shown
    # A key that holds a private span is not shown (its note is, without it).
    assert "SECRET" not in shown and "arch/<private>" not in shown and "[arch/cache]" not in shown


def test_a_blank_topic_key_from_the_model_is_no_key(make_store, backend, server) -> None:
    store = make_store(backend, **model_settings(server))
    server.script(answer([note("Adopted a cat", topic_key="")]))
    first = harvest_transcript(store, transcript("I adopted a cat.", cid="c1"))
    server.script(answer([note("Bought a bike", topic_key="  "), note("Runs on Sundays")]))
    second = harvest_transcript(store, transcript("I bought a bike; I run on Sundays.", cid="c2"))
    assert (first.notes_written, second.notes_written) == (1, 2)
    assert [n.topic_key for n in store.list_notes(ALICE)] == [None, None, None]


@pytest.mark.parametrize("key", ["", "   "])
def test_a_blank_topic_key_is_refused_by_the_store(store: Store, key: str) -> None:
    from gleaner.store import InvalidInput
    from gleaner.store.notes import notes

    with pytest.raises(InvalidInput) as refused, store.transaction() as session:
        notes.write(session, store.settings, ALICE, {"title": "t", "body": "b"}, topic_key=key)
    assert refused.value.reason == "bad_topic_key"
    item = notes.BatchItem({"title": "t", "body": "b"}, topic_key=key)
    with store.transaction() as session:
        [result] = notes.write_batch(session, store.settings, ALICE, [item])
    assert result.outcome == "invalid" and result.error is not None
    assert result.error.reason == "bad_topic_key"
    assert store.list_notes(ALICE) == []


@pytest.mark.parametrize(
    ("a", "b", "why"),
    [
        ("Lives in Berlin", "Lived in Berlin", "title-tense"),
        ("Works at Acme", "Worked at Acme", "title-tense"),
        ("Lives in Berlin", "Sister lives in Berlin", "title-subject"),
        ("Allergic to peanuts", "Son allergic to peanuts", "title-subject"),
        ("Plans to move to Berlin", "Moved to Berlin", "title-subject"),
        ("Former manager is Bob", "Manager is Bob", "title-subject"),
        ("Used to drink coffee", "Drinks coffee", "title-subject"),
        ("Used to use Vim", "Uses Vim", "title-tense"),  # the verb after "to" has no tense
        ("Learning Rust", "Learned Rust", "title-aspect"),  # under way, or done
        ("Migrating CI to Buildkite", "Migrated CI to Buildkite", "title-aspect"),
        ("Prefers detailed answers", "Prefers details in answers", None),
        ("Reports to Bob", "Reported to Bob", "title-tense"),
        # A title that names no tense or mood says what is so now.
        ("Vegetarian", "Was vegetarian", "title-tense"),
        ("Allergic to peanuts", "Was allergic to peanuts", "title-tense"),
        ("Uses tabs", "Should use tabs", "title-mood"),
        ("Deploys on Fridays", "Would deploy on Fridays", "title-mood"),
        ("Vegetarian", "Is vegetarian", None),
        # Place and exception words are polar too.
        ("Lives in Berlin", "Lives near Berlin", "title-polarity"),
        ("Works remotely on Mondays", "Works remotely except on Mondays", "title-polarity"),
        ("Prefers tabs", "User prefers tabs", None),  # the user is every title's subject
        ("Decided to use Redis", "Decides to use Redis", None),  # one decision, told twice
        ("Prefers tabs", "Prefers tabs in Go", None),  # a detail after the fact
        ("Our team uses Jira", "Their team uses Jira", "title-person"),
        ("My manager is Bob", "Your manager is Bob", "title-person"),
        ("They are vegetarian", "She is vegetarian", None),  # a singular they
    ],
)
def test_a_verbs_tense_a_title_s_new_subject_or_person_disagree(
    a: str, b: str, why: str | None
) -> None:
    # The stemmer made lives/lived one word, and words added ahead of the fact read as a
    # detail: the second note was skipped as adding nothing, or rewrote the first.
    assert disagreement(FactText(a, ""), FactText(b, "")) == why
    assert disagreement(FactText(b, ""), FactText(a, "")) == why


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Uses C++ at work", "Uses C# at work"),
        ("Prefers C for embedded code", "Prefers C++ for embedded code"),
        ("Pinned to Python 3.10", "Pinned to Python 3.10.10"),
        ("Latest release is 1.0", "Latest release is 1.0.1"),
        ("Budget is $1,000", "Budget is $1,000,000"),
        ("Freezer set to -18 C", "Freezer set to 18 C"),
        ("Released v2.0", "Released v2.0.2"),
        ("Meets the team at 10", "Meets the team at 10:30"),
    ],
)
def test_a_sign_or_a_numbers_groups_make_another_fact(a: str, b: str) -> None:
    # Split on punctuation, C++ and C# were the term c, and 3.10.10 the terms 3 and 10.
    assert not same_fact(FactText(a, "x"), FactText(b, "x"), THRESHOLD)
    assert similarity_terms(a, "") != similarity_terms(b, "")
