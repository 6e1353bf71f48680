"""Semantic recall end to end, on both databases: notes get vectors after they are written
(in process, by ``gleaner embed --backfill``), hybrid search finds what no word matches, and
an embedding server that fails, hangs or answers wrongly loses nothing and delays nothing.
The embedding server is tests/embed_server.py; the local CPU embedder (the local-embed
extra, which the test extra installs) is the one that knows what words mean."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gleaner import Gleaner
from gleaner.cli import main
from gleaner.store import Scope, Store
from gleaner.store.recall import vectors as note_vectors
from tests.embed_server import EmbedServer, Reply, embed_server, hang, server_error

ALICE = Scope.owner("alice")
LOCAL = "local/all-minilm-l6-v2"
NOTES = [
    ("Adopted Biscuit", "A beagle puppy from the shelter in Leeds."),
    ("Works at Globex", "Data engineer on the billing team since May."),
    ("Allergic to peanuts", "Carries an EpiPen everywhere."),
    ("Sister lives in Porto", "Ana moved there for a nursing job."),
]


def conversation(owner: str = "alice", cid: str = "c1") -> dict[str, Any]:
    return {
        "conversation_id": cid,
        "owner": owner,
        "messages": [
            {"role": "user", "content": "I prefer tabs over spaces in every repo."},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "We decided to use PostgreSQL for billing."},
        ],
    }


def pending(store: Store, model: str) -> int:
    with store.connection() as conn:
        return note_vectors.count_pending(conn, model)


@pytest.fixture
def server() -> Iterator[EmbedServer]:
    with embed_server() as running:
        yield running


def served(server: EmbedServer, **extra: Any) -> dict[str, Any]:
    return {
        "embed_model": "openai/test-embed",
        "embed_api_base": server.api_base,
        "embed_timeout_seconds": 1.0,
        "embed_max_attempts": 2,
        **extra,
    }


def test_local_embedder_finds_what_no_word_matches(make_store, backend: str) -> None:
    store = make_store(backend, embed_model=LOCAL)
    for title, body in NOTES:
        store.write(ALICE, {"title": title, "body": body})
    gleaner = Gleaner(store=store)
    question = "Does she have any pets?"
    assert gleaner.search("alice", question) == []  # lexical: no note says "pet"
    from gleaner.harvest.embed_notes import embed_pending
    from gleaner.harvest.embedding import embedder_for

    embedder = embedder_for(store.settings)
    assert embedder is not None
    report = embed_pending(store, embedder)
    assert (report.notes, pending(store, LOCAL)) == (4, 0)
    hits = gleaner.search("alice", question, limit=2)
    assert hits[0].memory.slug == "adopted-biscuit" and hits[0].backend == "hybrid"
    allergy = gleaner.search("alice", "what food could make her ill?", limit=1)
    assert [h.memory.slug for h in allergy] == ["allergic-to-peanuts"]
    assert "adopted-biscuit" in gleaner.index_text("alice", "any animals at home?")


def test_submit_in_process_embeds_its_notes_and_a_failing_server_loses_nothing(
    make_store, backend: str, server: EmbedServer
) -> None:
    store = make_store(backend, **served(server))
    gleaner = Gleaner(store=store)
    gleaner.submit(conversation(cid="c1"))
    assert server.calls == 1 and pending(store, "openai/test-embed") == 0
    with store.connection() as conn:
        (usage,) = note_vectors.usage(conn)
    assert (usage["calls"], usage["notes"]) == (1, 2) and usage["tokens"] > 0
    # The server fails: the harvest still succeeds, its notes are searchable at once, and
    # the search answers lexically (one attempt at the query, never an error).
    server.script(*[server_error()] * 3)  # the harvest's two attempts, the query's one
    job = gleaner.job(
        gleaner.submit(
            conversation(cid="c2")
            | {
                "messages": [
                    {"role": "user", "content": "I always run the linter before I commit."}
                ]
            }
        )
    )
    assert job.state == "done" and job.notes_written == 1
    assert pending(store, "openai/test-embed") == 1
    hits = gleaner.search("alice", "linter")
    assert [h.backend for h in hits] == ["bm25"]
    # Back up: the backfill gives the note its vector.
    from gleaner.harvest.embed_notes import embed_pending
    from gleaner.harvest.embedding import embedder_for

    embedder = embedder_for(store.settings)
    assert embedder is not None
    assert embed_pending(store, embedder).notes == 1
    hits = gleaner.search("alice", "linter")
    assert hits[0].memory.slug == job.slugs[0] and {h.backend for h in hits} == {"hybrid"}


@pytest.mark.parametrize(
    ("reply", "problem"),
    [
        (Reply(dimensions=5), "dimensions"),
        (Reply(count=3), "vectors for"),
        (Reply(nan=True), "NaN"),
    ],
)
def test_a_wrong_answer_stores_no_vector(
    make_store, backend: str, server: EmbedServer, reply: Reply, problem: str
) -> None:
    store = make_store(backend, **served(server))
    store.write(ALICE, {"title": "Adopted Biscuit", "body": "A beagle."})
    store.write(ALICE, {"title": "Works at Globex", "body": "Data engineer."})
    from gleaner.harvest.embed_notes import embed_pending
    from gleaner.harvest.embedding import embedder_for

    embedder = embedder_for(store.settings)
    assert embedder is not None
    embedder.embed(["warm up: the model's size is 8"])
    server.script(reply)
    with pytest.raises(Exception, match=problem):
        embed_pending(store, embedder)
    assert pending(store, "openai/test-embed") == 2  # nothing half-stored


def test_a_hanging_server_costs_a_search_its_semantic_half_only(
    make_store, backend: str, server: EmbedServer
) -> None:
    store = make_store(backend, **served(server))
    store.write(ALICE, {"title": "Adopted Biscuit", "body": "A beagle."})
    server.script(hang(30))
    started = time.monotonic()
    hits = Gleaner(store=store).search("alice", "beagle")
    assert [h.backend for h in hits] == ["bm25"]
    assert time.monotonic() - started < 10  # a bound is the promise: one attempt, the timeout (1 s)


def test_vectors_never_cross_owners(make_store, backend: str) -> None:
    store = make_store(backend, embed_model=LOCAL)
    store.write(ALICE, {"title": "Adopted Biscuit", "body": "A beagle puppy."})
    store.write(Scope.owner("bob"), {"title": "Adopted Rex", "body": "A terrier puppy."})
    from gleaner.harvest.embed_notes import embed_pending
    from gleaner.harvest.embedding import embedder_for

    embedder = embedder_for(store.settings)
    assert embedder is not None
    embed_pending(store, embedder)
    gleaner = Gleaner(store=store)
    for owner, slug in (("alice", "adopted-biscuit"), ("bob", "adopted-rex")):
        hits = gleaner.search(owner, "which dog do I own?")
        assert [h.memory.slug for h in hits] == [slug]


def test_embed_backfill_from_the_shell_and_a_changed_model(
    make_store,
    backend: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    server: EmbedServer,
) -> None:
    store = make_store(backend)
    for title, body in NOTES:
        store.write(ALICE, {"title": title, "body": body})
    store.write(Scope.owner("bob"), {"title": "Bob's note", "body": "Tea."})
    for name in [k for k in os.environ if k.startswith("GLEANER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GLEANER_DATABASE_URL", store.database_url)
    assert main(["embed", "--backfill"]) == 2
    assert "GLEANER_EMBED_MODEL" in capsys.readouterr().err
    monkeypatch.setenv("GLEANER_EMBED_MODEL", "openai/test-embed")
    monkeypatch.setenv("GLEANER_EMBED_API_BASE", server.api_base)
    monkeypatch.setenv("GLEANER_EMBED_BATCH_SIZE", "3")
    assert main(["embed", "--backfill", "--owner", "alice", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["notes"], done["calls"], done["pending"]) == (4, 2, 0)
    assert main(["embed", "--backfill"]) == 0
    captured = capsys.readouterr()
    assert "embedded 1 note(s)" in captured.out and "1/1" in captured.err
    assert main(["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)["embeddings"]
    assert (status["model"], status["pending"]) == ("openai/test-embed", 0)
    assert [(u["notes"], u["calls"]) for u in status["usage"]] == [(5, 3)]
    # Another model: every note is pending again, and is embedded anew.
    monkeypatch.setenv("GLEANER_EMBED_MODEL", "openai/test-embed-2")
    assert main(["embed", "--backfill", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["notes"] == 5
