"""Reading and tending memory from the shell: ``index``, ``notes``, ``search --explain``, the
store calls behind them, and queries with no content word. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gleaner.cli import main
from gleaner.store import InvalidInput, NotFound, Scope, Store
from gleaner.store.recall.search import content_words

ALICE = Scope.owner("alice")
BOB = Scope.owner("bob")


def put(store: Store, title: str, body: str, scope: Scope = ALICE, **extra: object) -> str:
    return store.write(scope, {"title": title, "body": body, **extra}).memory.slug


# --- the store ---------------------------------------------------------------------------


def test_content_words() -> None:
    assert content_words("The pgbouncer sidecar!") == ["pgbouncer", "sidecar"]
    for query in ("-", "the", "  ", "?!", "it's theirs", "to be or not to be"):
        assert content_words(query) == [], query
    # Words that only look like contractions' stop words stay: "shell", "well", "id".
    assert content_words("shell well id") == ["shell", "well", "id"]


def test_score_parts_add_up_to_the_score(make_store, backend: str) -> None:  # type: ignore[no-untyped-def]
    store = make_store(backend, recency_weight=0.4, pinned_bonus=0.3)
    put(store, "Pgbouncer sidecar", "runs beside postgres", pinned=True)
    put(store, "Sidecar pattern", "a helper container")
    hits = store.search(ALICE, "sidecar")
    assert len(hits) == 2
    for hit in hits:
        assert hit.parts is not None
        assert hit.parts.lexical == pytest.approx(0.6 * hit.lexical, abs=1e-6)
        assert hit.parts.recency == pytest.approx(0.4 * hit.recency, abs=1e-6)
        assert hit.parts.pinned == (0.3 if hit.memory.pinned else 0.0)
        total = hit.parts.lexical + hit.parts.recency + hit.parts.pinned
        assert total == pytest.approx(hit.score, abs=1e-5)


def test_pin_unpin_archive_and_list(store: Store) -> None:
    first = put(store, "Uses pgbouncer", "in transaction mode")
    second = put(store, "Prefers tabs", "four wide")
    put(store, "Bob's note", "bob only", scope=BOB)
    before = store.fingerprint(ALICE)

    pinned = store.pin(ALICE, first)
    assert pinned.changed and pinned.memory.pinned
    assert store.fingerprint(ALICE)[1] > before[1]  # the index text is rebuilt
    assert "in transaction mode" in store.index_text(ALICE)  # a pinned body is in the index
    assert not store.pin(ALICE, first).changed  # already pinned: nothing changes
    assert [n.slug for n in store.list_notes(ALICE, pinned=True)] == [first]
    assert {n.slug for n in store.list_notes(ALICE)} == {first, second}

    unpinned = store.unpin(ALICE, first)
    assert unpinned.changed and not unpinned.memory.pinned
    assert "in transaction mode" not in store.index_text(ALICE)

    archived = store.archive(ALICE, second)
    assert archived.changed and archived.memory.status == "archived"
    assert not store.archive(ALICE, second).changed
    # Archived: out of search, the index and the live list; the note itself is kept.
    assert store.search(ALICE, "tabs") == []
    assert "Prefers tabs" not in store.index_text(ALICE)
    assert [n.slug for n in store.list_notes(ALICE)] == [first]
    assert [n.slug for n in store.list_notes(ALICE, status="archived")] == [second]
    assert {n.slug for n in store.list_notes(ALICE, status=None)} == {first, second}
    assert store.read(ALICE, second).memory.body == "four wide"
    assert store.history(ALICE, second) == []

    with pytest.raises(InvalidInput) as refused:
        store.pin(ALICE, second)
    assert refused.value.reason == "not_live"
    # Another owner's note is not found through alice's scope.
    with pytest.raises(NotFound):
        store.archive(ALICE, "bob-s-note")
    assert store.list_notes(BOB)[0].status == "live"
    with pytest.raises(InvalidInput):
        store.list_notes(ALICE, status="gone")
    with pytest.raises(InvalidInput):
        store.list_notes(ALICE, limit=0)


def test_an_archived_note_rewritten_is_live_again_with_its_history(store: Store) -> None:
    slug = store.write(ALICE, {"title": "Editor", "body": "vim", "slug": "editor"}).memory.slug
    store.archive(ALICE, slug)
    store.write(ALICE, {"title": "Editor", "body": "helix", "slug": "editor"})
    note = store.read(ALICE, slug).memory
    assert (note.status, note.body) == ("live", "helix")
    assert [v.body for v in store.history(ALICE, slug)] == ["vim"]


# --- the commands, in process ----------------------------------------------------------------


@pytest.fixture
def cli_store(store: Store, monkeypatch: pytest.MonkeyPatch) -> Store:
    """The test store, and the CLI pointed at its database through the environment (no
    other GLEANER_ variable, so the CLI's settings are the defaults the store has too)."""
    for name in [k for k in os.environ if k.startswith("GLEANER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GLEANER_DATABASE_URL", store.database_url)
    return store


def test_search_takes_words_as_arguments_and_explains(
    cli_store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    put(cli_store, "Runs pgbouncer as a sidecar", "transaction mode", pinned=True)
    put(cli_store, "Sidecar for logs", "vector ships them")
    assert main(["search", "--owner", "alice", "pgbouncer", "sidecar"]) == 0
    out = capsys.readouterr().out
    # Any word matches; the note holding both (and pinned) comes first.
    assert out.index("runs-pgbouncer-as-a-sidecar [pinned]") < out.index("sidecar-for-logs")
    assert "lexical" not in out and "(said 20" in out

    assert main(["search", "--owner", "alice", "sidecar", "--explain", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)
    assert [h["slug"] for h in hits] == ["runs-pgbouncer-as-a-sidecar", "sidecar-for-logs"]
    for hit in hits:
        parts = hit["parts"]
        assert set(parts) == {"lexical", "recency", "pinned"}
        assert sum(parts.values()) == pytest.approx(hit["score"], abs=1e-5)
    assert hits[0]["parts"]["pinned"] == cli_store.settings.pinned_bonus
    assert hits[1]["parts"]["pinned"] == 0

    assert main(["search", "--owner", "alice", "sidecar", "--explain"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].strip().startswith("= lexical ") and "+ pinned 0.200" in lines[1]


@pytest.mark.parametrize("query", [["-"], ["the"], ["to", "be"], ["?!"]])
def test_search_without_content_words_says_why(
    cli_store: Store, capsys: pytest.CaptureFixture[str], query: list[str]
) -> None:
    put(cli_store, "The note", "the - ?! to be")
    assert main(["search", "--owner", "alice", *query]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "nothing to search for" in captured.err and "no content word" in captured.err
    assert main(["search", "--owner", "alice", "--json", *query]) == 2
    assert json.loads(capsys.readouterr().out) == []


def test_index_prints_the_index_text(cli_store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", "--owner", "alice"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "" and "no live notes in owner:alice" in captured.err
    put(cli_store, "Uses pgbouncer", "in transaction mode", pinned=True)
    put(cli_store, "Prefers tabs", "four wide")
    put(cli_store, "Bob's secret", "not for alice", scope=BOB)
    assert main(["index", "--owner", "alice"]) == 0
    out = capsys.readouterr().out
    assert out == cli_store.index_text(ALICE) + "\n"
    assert "in transaction mode" in out and "Prefers tabs" in out and "Bob" not in out
    assert main(["index"]) == 2  # whose index: --owner or --global
    assert "--owner NAME or --global" in capsys.readouterr().err


def test_notes_list_pin_unpin_delete(cli_store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    slug = put(cli_store, "Prefers tabs", "four wide")
    put(cli_store, "Uses pgbouncer", "in transaction mode")
    put(cli_store, "Bob's note", "bob only", scope=BOB)

    assert main(["notes", "pin", slug, "--owner", "alice"]) == 0
    assert capsys.readouterr().out == f"pinned {slug} in owner:alice\n"
    assert main(["notes", "pin", slug, "--owner", "alice"]) == 0
    assert "already pinned: unchanged" in capsys.readouterr().out
    assert main(["notes", "list", "--owner", "alice", "--pinned", "--json"]) == 0
    assert [n["slug"] for n in json.loads(capsys.readouterr().out)] == [slug]
    assert main(["notes", "unpin", slug, "--owner", "alice"]) == 0
    assert not cli_store.read(ALICE, slug).memory.pinned
    capsys.readouterr()

    assert main(["notes", "delete", slug, "--owner", "alice"]) == 0
    assert capsys.readouterr().out == f"archived {slug} in owner:alice\n"
    assert cli_store.read(ALICE, slug).memory.status == "archived"  # kept, not erased
    assert main(["notes", "list", "--owner", "alice"]) == 0
    listed = capsys.readouterr().out
    assert "uses-pgbouncer" in listed and slug not in listed and "bob-s-note" not in listed
    assert main(["notes", "list", "--owner", "alice", "--status", "all"]) == 0
    assert f"{slug} [archived]" in capsys.readouterr().out

    # Failures: one line each, with the documented exit status; nothing changes.
    assert main(["notes", "pin", slug, "--owner", "alice"]) == 2
    assert "not_live" in capsys.readouterr().err
    assert main(["notes", "delete", "bob-s-note", "--owner", "alice"]) == 1
    assert "not_found" in capsys.readouterr().err
    assert cli_store.read(BOB, "bob-s-note").memory.status == "live"
    assert main(["notes", "list"]) == 2


def run_gleaner(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    return subprocess.run(
        [sys.executable, "-m", "gleaner.cli", *args],
        env={**clean, "GLEANER_DATABASE_URL": url},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.slow
def test_shell_commands_as_a_subprocess(tmp_path: Path, sqlite_template: Path) -> None:
    """One real process per new command, against a SQLite file (about 1.5 s each)."""
    import shutil

    db = tmp_path / "g.db"
    shutil.copy(sqlite_template, db)
    url = f"sqlite:///{db}"
    store = Store(url)
    slug = put(store, "Runs pgbouncer as a sidecar", "transaction mode", pinned=True)
    store.dispose()
    explained = run_gleaner(
        url, tmp_path, "search", "--owner", "alice", "pgbouncer", "sidecar", "--explain"
    )
    assert explained.returncode == 0, explained.stderr
    assert slug in explained.stdout and "+ pinned 0.200" in explained.stdout
    index = run_gleaner(url, tmp_path, "index", "--owner", "alice")
    assert index.returncode == 0 and "transaction mode" in index.stdout, index.stderr
    deleted = run_gleaner(url, tmp_path, "notes", "delete", slug, "--owner", "alice")
    assert deleted.returncode == 0 and f"archived {slug}" in deleted.stdout, deleted.stderr
