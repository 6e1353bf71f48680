"""Export and restore (docs/EXPORT.md): an owner's notes, history, links and evidence as JSON
Lines, back into an empty scope byte for byte, on SQLite, on PostgreSQL and across them; every
bad line refused by number with nothing written; the search and term index rebuilt as a
write builds them."""

from __future__ import annotations

import io
import json
import re
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from gleaner import Gleaner
from gleaner.errors import InvalidRequest
from gleaner.store import InvalidInput, Scope, Store
from gleaner.store.errors import BadExport
from gleaner.store.notes import notes
from gleaner.store.recall import vectors
from tests.conftest import test_settings

ALICE, BOB = Scope.owner("alice"), Scope.owner("bob")
# Text the store keeps byte for byte (rule 1): anything valid UTF-8 without NUL.
ODD = (
    "emoji 😀🎉, a flag 🇵🇹, a family 👩\u200d👩\u200d👧",
    "combining marks: Cafe\u0301, n\u0303, a\u030a; precomposed: Café",
    "Windows line\r\nends, a lone\rCR, a\ttab and a trailing newline\n",
    'quotes " \' and a backslash \\ and a JSON look-alike {"kind": "note"}',
    "separators \u2028 and \u2029, a BOM \ufeff, RTL שלום, Arabic مرحبا",
    "controls \x01\x1f\x7f, a high plane \U0001d518\U0001d52b\U0001d526 \U0010fffd, CJK 漢字",
)


def fill(store: Store, owner: str) -> None:
    """An owner with something in every column an export carries: odd text, topics and
    keywords, source, evidence, confidence, pinned, each status, types and topic keys,
    sessions, conversations and times, history of each kind, every rel, a decayed weight."""
    scope = Scope.owner(owner)
    quote = {"speaker": "user", "quote": ODD[0]}
    for n, body in enumerate(ODD):
        store.write(
            scope,
            {
                "title": f"Odd text {ODD[n][:12]}",
                "body": body,
                "slug": "odd-text",
                "topics": ["ünïcode", "Text", "db"],
                "keywords": ["bytes", "encoding"],
                "source": {"url": "https://example.org/ü?q=1", "artifact": "a.txt", "note": "n"},
                "evidence": [quote, {"speaker": "assistant", "quote": ODD[n]}],
                "confidence": 0.1 + n / 10,
            },
        )
    with store.transaction() as session:
        for when, body in ((datetime(2023, 3, 1, 9, 30, tzinfo=UTC), "Uses vim."),):
            notes.write(
                session,
                store.settings,
                scope,
                {"title": "Editor", "body": body, "topics": ["tools"]},
                conversation_id="conv-1 ✓",
                provenance="import",
                note_type="preference",
                topic_key="pref/editor",
                occurred_at=when,
            )
    with store.transaction() as session:
        notes.write(
            session,
            store.settings,
            scope,
            {"title": "Editor", "body": "Uses helix now.", "topics": ["tools"]},
            conversation_id="conv-2",
            provenance="compaction",
            note_type="preference",
            topic_key="pref/editor",
            occurred_at=datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
        )
    store.mem_save(owner, "Use React.", type="decision", title="Frontend", topic_key="arch/fe")
    store.mem_save(owner, "Use Svelte.", type="decision", title="Frontend", topic_key="arch/fe")
    store.mem_save(owner, "Deploys on Fridays 🚀", type="pattern", title="Deploy day")
    store.write(
        scope,
        {"title": "Name is Zoë", "body": "Zoë, not Zoe.", "pinned": True},
        provenance="user",
    )
    store.write(
        scope,
        {"title": "Pinned harvest", "body": "Pinned by opt-in.", "pinned": True},
        provenance="compaction",
        allow_pin_untrusted=True,
    )
    for title in ("Old plan", "Older plan", "Related idea", "Source doc", "Archived fact"):
        store.write(scope, {"title": title, "body": f"{title} body", "topics": ["plans"]})
    store.link(scope, "old-plan", "older-plan", "supersedes")
    store.link(scope, "odd-text", "old-plan", "supersedes")
    store.link(scope, "odd-text", "related-idea", "related")
    store.link(scope, "related-idea", "odd-text", "related")
    store.link(scope, "pref-editor", "source-doc", "derived_from")
    store.archive(scope, "archived-fact")
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE memories SET weight = :w WHERE scope_id = :o AND slug = 'source-doc'"),
            {"w": 0.12345678901234568, "o": scope.id},
        )


def export(store: Store, owner: str) -> bytes:
    out = io.BytesIO()
    store.export_owner(owner, out)
    return out.getvalue()


def records(data: bytes) -> list[bytes]:
    """The lines after the header (which names the owner and the time of the export)."""
    return data.split(b"\n")[1:]


def header(data: bytes) -> dict[str, Any]:
    return dict(json.loads(data.split(b"\n", 1)[0]))


def other_sqlite(sqlite_template: Path, tmp_path: Path, name: str) -> Store:
    path = tmp_path / f"{name}.db"
    shutil.copy(sqlite_template, path)
    return Store(f"sqlite:///{path}", settings=test_settings())


def stored_rows(store: Store, scope: Scope) -> dict[str, Any]:
    """What a restore must rebuild as a write builds it, by slug: each note's derived
    columns, term index and search postings."""
    where = {"k": scope.kind, "s": scope.id}
    with store.engine.connect() as conn:
        columns = conn.execute(
            text(
                "SELECT slug, term_count, search_length, content_hash FROM memories"
                " WHERE scope_kind = :k AND scope_id = :s ORDER BY slug"
            ),
            where,
        ).all()
        terms = conn.execute(
            text(
                "SELECT m.slug, t.term FROM memory_terms t JOIN memories m ON m.id = t.memory_id"
                " WHERE t.scope_kind = :k AND t.scope_id = :s ORDER BY 1, 2"
            ),
            where,
        ).all()
        postings = conn.execute(
            text(
                "SELECT m.slug, p.term, p.weight, p.length FROM search_postings p"
                " JOIN memories m ON m.id = p.memory_id"
                " WHERE p.scope_kind = :k AND p.scope_id = :s ORDER BY 1, 2"
            ),
            where,
        ).all()
    return {
        "columns": [tuple(r) for r in columns],
        "terms": [tuple(r) for r in terms],
        "postings": [tuple(r) for r in postings],
    }


def held(store: Store, scope: Scope) -> tuple[int, int, int]:
    """The scope's notes, versions and links (by their source note)."""
    where = {"k": scope.kind, "s": scope.id}
    with store.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            int(conn.execute(text(sql), where).scalar_one())
            for sql in (
                "SELECT count(*) FROM memories WHERE scope_kind = :k AND scope_id = :s",
                "SELECT count(*) FROM memory_versions WHERE scope_kind = :k AND scope_id = :s",
                "SELECT count(*) FROM memory_links l JOIN memories m ON m.id = l.from_id"
                " WHERE m.scope_kind = :k AND m.scope_id = :s",
            )
        )


# --- round trips ---------------------------------------------------------------------


def test_the_file_is_the_documented_schema(store: Store) -> None:
    fill(store, "alice")
    data = export(store, "alice")
    assert data.endswith(b"\n") and b"\r" not in data  # a \r in text is a JSON escape
    lines = [json.loads(line) for line in data.splitlines()]
    first = lines[0]
    assert list(first) == ["kind", "version", "owner", "exported_at", "counts"]
    assert first["kind"] == "gleaner-export" and first["version"] == 1
    assert first["owner"] == "alice"
    kinds = [line["kind"] for line in lines[1:]]
    assert first["counts"] == {
        "notes": kinds.count("note"),
        "versions": kinds.count("version"),
        "links": kinds.count("link"),
    }
    assert kinds == sorted(kinds, key=["note", "version", "link"].index)
    odd = next(line for line in lines if line["kind"] == "note" and line["slug"] == "odd-text")
    assert odd["body"] == ODD[-1] and odd["topics"] == ["ünïcode", "text", "db"]
    assert odd["evidence"] == [
        {"speaker": "user", "quote": ODD[0]},
        {"speaker": "assistant", "quote": ODD[-1]},
    ]
    assert odd["source"] == {"url": "https://example.org/ü?q=1", "artifact": "a.txt", "note": "n"}
    assert "id" not in odd and "updated_seq" not in odd and "content_hash" not in odd
    editor = next(
        line for line in lines if line.get("slug") == "pref-editor" and line["kind"] == "note"
    )
    assert editor["occurred_at"] == "2024-01-02T03:04:05.678901+00:00"
    assert editor["topic_key"] == "pref/editor" and editor["type"] == "preference"
    assert {"kind": "link", "from": "odd-text", "to": "old-plan", "rel": "supersedes"}.items() <= (
        next(line for line in lines if line.get("to") == "old-plan").items()
    )


def test_round_trip_into_another_owner_is_byte_exact(store: Store) -> None:
    fill(store, "alice")
    first = export(store, "alice")
    result = store.restore(io.BytesIO(first), "bob", reassign_owner=True)
    assert (result.owner, result.exported_owner) == ("bob", "alice")
    said = header(first)["counts"]
    assert (result.notes, result.versions, result.links) == (
        said["notes"],
        said["versions"],
        said["links"],
    )
    second = export(store, "bob")
    assert records(second) == records(first)
    assert header(second)["owner"] == "bob" and header(second)["counts"] == said
    assert stored_rows(store, BOB) == stored_rows(store, ALICE)


def test_round_trip_across_databases_is_byte_exact(
    make_store: Callable[..., Store], sqlite_template: Path, tmp_path: Path
) -> None:
    """SQLite -> PostgreSQL -> another SQLite, and PostgreSQL -> SQLite: the same lines."""
    pg = make_store("postgresql")  # first: the factory cleans PostgreSQL on its first store
    lite = make_store("sqlite")
    again = other_sqlite(sqlite_template, tmp_path, "again")
    try:
        fill(lite, "alice")
        first = export(lite, "alice")
        pg.restore(io.BytesIO(first))
        second = export(pg, "alice")
        assert records(second) == records(first)
        assert stored_rows(pg, ALICE) == stored_rows(lite, ALICE)
        again.restore(io.BytesIO(second))
        assert records(export(again, "alice")) == records(first)

        fill(pg, "carol")
        from_pg = export(pg, "carol")
        lite.restore(io.BytesIO(from_pg))
        assert records(export(lite, "carol")) == records(from_pg)
        assert stored_rows(lite, Scope.owner("carol")) == stored_rows(pg, Scope.owner("carol"))
    finally:
        again.dispose()


def test_restored_notes_are_searchable_with_history_links_and_evidence(store: Store) -> None:
    fill(store, "alice")
    store.restore(io.BytesIO(export(store, "alice")), "bob", reassign_owner=True)
    for query in ("helix editor", "Zoë", "svelte frontend", "encoding bytes"):
        found = [hit.memory.slug for hit in store.search(BOB, query)]
        assert found and found == [hit.memory.slug for hit in store.search(ALICE, query)]
    for slug in ("odd-text", "pref-editor", "arch-fe"):
        assert store.history(BOB, slug) == store.history(ALICE, slug)
        assert store.history(BOB, slug)
    for slug in ("odd-text", "old-plan", "older-plan", "pref-editor", "source-doc", "related-idea"):
        mine, theirs = store.read(ALICE, slug), store.read(BOB, slug)
        assert mine.superseded_by == theirs.superseded_by
        assert [(n.rel, n.note.slug) for n in mine.links] == [
            (n.rel, n.note.slug) for n in theirs.links
        ]
        assert [(n.rel, n.note.slug) for n in mine.backlinks] == [
            (n.rel, n.note.slug) for n in theirs.backlinks
        ]
    odd = store.read(BOB, "odd-text").memory
    assert odd.body == ODD[-1] and odd.evidence[1].quote == ODD[-1]
    assert store.read(BOB, "old-plan").superseded_by == "odd-text"
    assert store.get(BOB, "archived-fact").status == "archived"  # type: ignore[union-attr]
    # Same order of changes: the fingerprint's count matches, its seq is new.
    assert store.fingerprint(BOB)[0] == store.fingerprint(ALICE)[0]
    # No vectors were exported: every live note waits for `gleaner embed --backfill`.
    with store.connection() as conn:
        pending = vectors.count_pending(conn, "any/model", scope=BOB)
    assert pending == store.fingerprint(BOB)[0]
    # Writes after a restore behave as writes: a derived slug takes the next free -N.
    again = store.write(BOB, {"title": "Old plan", "body": "a third plan"})
    assert again.memory.slug == "old-plan-2"


def test_the_python_api_exports_line_by_line(store: Store) -> None:
    fill(store, "alice")
    api = Gleaner(store=store)
    lines = api.export("alice")
    first = next(lines)
    assert json.loads(first)["owner"] == "alice"
    data = first + b"".join(lines)
    assert records(data) == records(export(store, "alice"))
    with pytest.raises(InvalidRequest) as bad:
        api.export(" alice")
    assert bad.value.reason == "bad_owner"
    result = api.restore(io.BytesIO(data), owner="dora", reassign_owner=True)
    assert result.owner == "dora" and result.notes == header(data)["counts"]["notes"]
    with pytest.raises(InvalidRequest) as refused:
        api.restore(io.BytesIO(data), owner="dora", reassign_owner=True)
    assert refused.value.reason == "scope_not_empty"


class _Pipe(io.RawIOBase):
    """Standard input as a pipe gives it: read once, no seeking."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        chunk = self._data.read(len(buffer))
        buffer[: len(chunk)] = chunk
        return len(chunk)


class _LinesOnly:
    """A file that can only be read a line at a time: a whole-file read would fail."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)
        self.longest = 0

    def readline(self, size: int = -1) -> bytes:
        assert size > 0, "restore reads bounded lines"
        line = self._data.readline(size)
        self.longest = max(self.longest, len(line))
        return line

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._data.tell()

    def seek(self, offset: int) -> int:
        return self._data.seek(offset)


def test_restore_streams_from_a_pipe_a_text_file_or_lines(store: Store) -> None:
    fill(store, "alice")
    data = export(store, "alice")
    pipe = io.BufferedReader(_Pipe(data))
    assert not pipe.seekable()
    store.restore(pipe, "bob", reassign_owner=True)
    assert records(export(store, "bob")) == records(data)
    store.restore(io.StringIO(data.decode("utf-8"), newline=""), "carol", reassign_owner=True)
    assert records(export(store, "carol")) == records(data)
    lines = _LinesOnly(data)
    steps: list[tuple[int, int]] = []
    store.restore(lines, "dora", reassign_owner=True, progress=lambda *s: steps.append(s))  # type: ignore[arg-type]
    assert records(export(store, "dora")) == records(data)
    assert lines.longest < len(data) / 4
    total = 2 * sum(header(data)["counts"].values())
    assert steps[-1] == (total, total)


def test_export_progress_counts_records(store: Store) -> None:
    fill(store, "alice")
    steps: list[tuple[int, int]] = []
    counts = store.export_owner("alice", io.BytesIO(), progress=lambda *s: steps.append(s))
    assert steps[-1] == (counts.records, counts.records)


def test_an_owner_with_no_notes_exports_a_header_and_restores_nothing(store: Store) -> None:
    data = export(store, "nobody")
    assert header(data)["counts"] == {"notes": 0, "versions": 0, "links": 0}
    assert records(data) == [b""]
    assert store.restore(io.BytesIO(data)).notes == 0


# --- refusals ------------------------------------------------------------------------


def test_an_owner_with_notes_is_refused_and_left_as_it_was(store: Store) -> None:
    fill(store, "alice")
    data = export(store, "alice")
    before = held(store, ALICE)
    with pytest.raises(InvalidInput) as refused:
        store.restore(io.BytesIO(data))
    assert refused.value.reason == "scope_not_empty"
    assert "'alice'" in str(refused.value)
    assert held(store, ALICE) == before
    assert records(export(store, "alice")) == records(data)
    # Even an archived note counts: the scope is not empty.
    store.write(BOB, {"title": "Only one", "body": "then archived"})
    store.archive(BOB, "only-one")
    with pytest.raises(InvalidInput, match="'bob'"):
        store.restore(io.BytesIO(data), "bob", reassign_owner=True)


def test_another_owner_takes_the_explicit_flag(store: Store) -> None:
    fill(store, "alice")
    data = export(store, "alice")
    with pytest.raises(InvalidInput) as refused:
        store.restore(io.BytesIO(data), "bob")
    assert refused.value.reason == "bad_owner" and "reassign" in str(refused.value)
    assert held(store, BOB) == (0, 0, 0)
    result = store.restore(io.BytesIO(data), "bob", reassign_owner=True)
    assert result.owner == "bob" and held(store, BOB) == held(store, ALICE)
    assert [h.memory.slug for h in store.search(BOB, "helix")] == ["pref-editor"]


def test_the_files_own_owner_named_needs_no_flag(
    make_store: Callable[..., Store], sqlite_template: Path, tmp_path: Path
) -> None:
    lite = make_store("sqlite")
    fill(lite, "Zoë")
    data = export(lite, "Zoë")
    other = other_sqlite(sqlite_template, tmp_path, "zoe")
    try:
        # "Zoe\u0308" is "Zoë" decomposed: the same owner under the owner rule (NFKC).
        assert other.restore(io.BytesIO(data), "Zoe\u0308").owner == "Zoë"
    finally:
        other.dispose()


def _note_index(lines: list[bytes], slug: str) -> int:
    return next(
        n
        for n, line in enumerate(lines)
        if b'"kind": "note"' in line and f'"{slug}"'.encode() in line
    )


def _edit(lines: list[bytes], n: int, **changes: Any) -> None:
    record = json.loads(lines[n])
    for key, value in changes.items():
        if value is _DROP:
            del record[key]
        else:
            record[key] = value
    lines[n] = json.dumps(record).encode()  # a lone surrogate as its \u escape


_DROP = object()


def _set_body(value: str) -> Callable[[list[bytes]], int]:
    def corrupt(lines: list[bytes]) -> int:
        n = _note_index(lines, "old-plan")
        _edit(lines, n, body=value)
        return n + 1

    return corrupt


def _not_json(lines: list[bytes]) -> int:
    lines[3] = b'{"kind": "note", "slug": '
    return 4


def _not_utf8(lines: list[bytes]) -> int:
    n = _note_index(lines, "old-plan")
    lines[n] = lines[n].replace(b"Old plan body", b"Old \xff body")
    return n + 1


def _unknown_key(lines: list[bytes]) -> int:
    n = _note_index(lines, "pref-editor")
    _edit(lines, n, colour="blue")
    return n + 1


def _missing_key(lines: list[bytes]) -> int:
    n = _note_index(lines, "pref-editor")
    _edit(lines, n, provenance=_DROP)
    return n + 1


def _bad_provenance(lines: list[bytes]) -> int:
    n = _note_index(lines, "pref-editor")
    _edit(lines, n, provenance="admin")
    return n + 1


def _naive_time(lines: list[bytes]) -> int:
    n = _note_index(lines, "pref-editor")
    _edit(lines, n, updated_at="2024-01-02T03:04:05")
    return n + 1


def _bad_topic_key(lines: list[bytes]) -> int:
    n = _note_index(lines, "pref-editor")
    _edit(lines, n, topic_key="  ")
    return n + 1


def _duplicate_slug(lines: list[bytes]) -> int:
    first, second = sorted((_note_index(lines, "older-plan"), _note_index(lines, "old-plan")))
    _edit(lines, first, slug="older-plan-x")
    _edit(lines, second, slug="older-plan-x")
    return second + 1


def _duplicate_topic_key(lines: list[bytes]) -> int:
    first, second = sorted((_note_index(lines, "older-plan"), _note_index(lines, "old-plan")))
    _edit(lines, first, topic_key="plans/x")
    _edit(lines, second, topic_key="plans/x")
    return second + 1


def _dangling_link(lines: list[bytes]) -> int:
    n = next(n for n, line in enumerate(lines) if b'"rel": "related"' in line)
    _edit(lines, n, to="no-such-note")
    return n + 1


def _version_of_nothing(lines: list[bytes]) -> int:
    n = next(n for n, line in enumerate(lines) if b'"kind": "version"' in line)
    _edit(lines, n, slug="no-such-note")
    return n + 1


def _cycle(lines: list[bytes]) -> int:
    record = {"kind": "link", "from": "older-plan", "to": "odd-text", "rel": "supersedes"}
    lines.insert(len(lines) - 1, json.dumps(record).encode())
    return len(lines) - 1


def _second_superseder(lines: list[bytes]) -> int:
    record = {"kind": "link", "from": "source-doc", "to": "older-plan", "rel": "supersedes"}
    lines.insert(len(lines) - 1, json.dumps(record).encode())
    return len(lines) - 1


def _bad_rel(lines: list[bytes]) -> int:
    n = next(n for n, line in enumerate(lines) if b'"rel": "related"' in line)
    _edit(lines, n, rel="likes")
    return n + 1


def _cut_short(lines: list[bytes]) -> int:
    del lines[-2]  # the last record (the list ends with the empty piece after the last \n)
    return len(lines)


def _blank_line(lines: list[bytes]) -> int:
    lines.insert(2, b"")
    return 3


def _newer_version(lines: list[bytes]) -> int:
    _edit(lines, 0, version=2)
    return 1


def _not_an_export(lines: list[bytes]) -> int:
    lines[0] = b'{"conversation_id": "c1", "messages": []}'
    return 1


def _nan_weight(lines: list[bytes]) -> int:
    n = _note_index(lines, "source-doc")
    lines[n] = lines[n].replace(b'"weight": 0.12345678901234568', b'"weight": NaN')
    return n + 1


CORRUPTIONS: dict[str, tuple[Callable[[list[bytes]], int], str]] = {
    "not json": (_not_json, "not JSON"),
    "not utf-8": (_not_utf8, "not UTF-8"),
    "NUL in the body": (_set_body("a \x00 b"), "nul_character"),
    "lone surrogate": (_set_body("a \ud800 b"), "invalid_utf8"),
    "empty title": (lambda lines: _edit_title(lines, " "), "empty_title"),
    "body over the limit": (_set_body("x" * 32_001), "body_too_large"),
    "unknown key": (_unknown_key, "colour"),
    "missing key": (_missing_key, "provenance"),
    "bad provenance": (_bad_provenance, "admin"),
    "time without offset": (_naive_time, "UTC offset"),
    "blank topic key": (_bad_topic_key, "bad_topic_key"),
    "slug twice": (_duplicate_slug, "already"),
    "topic key twice": (_duplicate_topic_key, "already"),
    "link to no note": (_dangling_link, "no-such-note"),
    "version of no note": (_version_of_nothing, "no-such-note"),
    "supersedes cycle": (_cycle, "cycle"),
    "second superseder": (_second_superseder, "already superseded"),
    "unknown rel": (_bad_rel, "likes"),
    "cut short": (_cut_short, "incomplete"),
    "blank line": (_blank_line, "empty"),
    "newer version": (_newer_version, "newer Gleaner"),
    "not an export": (_not_an_export, "not a Gleaner export"),
    "NaN weight": (_nan_weight, "NaN"),
}


def _edit_title(lines: list[bytes], title: str) -> int:
    n = _note_index(lines, "old-plan")
    _edit(lines, n, title=title)
    return n + 1


@pytest.fixture(scope="module")
def alice_export(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """``fill``'s owner exported once for the module's corruptions (an export is the same
    bytes from either database: ``test_round_trip_across_databases_is_byte_exact``)."""
    path = tmp_path_factory.mktemp("alice") / "alice.db"
    shutil.copy(sqlite_template, path)
    source = Store(f"sqlite:///{path}", settings=test_settings())
    try:
        fill(source, "alice")
        return export(source, "alice")
    finally:
        source.dispose()


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_bad_line_is_refused_by_number_and_nothing_is_written(
    store: Store, alice_export: bytes, case: str
) -> None:
    lines = alice_export.split(b"\n")
    corrupt, said = CORRUPTIONS[case]
    number = corrupt(lines)
    with pytest.raises(BadExport) as refused:
        store.restore(io.BytesIO(b"\n".join(lines)), "bob", reassign_owner=True)
    assert refused.value.line == number
    assert str(refused.value).startswith(f"line {number}: ")
    assert said in str(refused.value) or said == refused.value.rule
    assert refused.value.reason == "bad_export"
    assert held(store, BOB) == (0, 0, 0)
    assert store.fingerprint(BOB) == (0, 0)


def test_an_overlong_line_is_refused_without_reading_it_whole(store: Store) -> None:
    data = export(store, "nobody").replace(b'"notes": 0', b'"notes": 1')
    data += b'{"kind": "note", "body": "' + b"x" * (2 << 20) + b'"}\n'
    with pytest.raises(BadExport) as refused:
        store.restore(io.BytesIO(data), "bob", reassign_owner=True)
    assert refused.value.line == 2 and "bytes" in str(refused.value)


def test_an_empty_file_is_refused(store: Store) -> None:
    with pytest.raises(BadExport) as refused:
        store.restore(io.BytesIO(b""))
    assert refused.value.line == 1


class FailsOnSecondReading(io.BytesIO):
    """An export whose disk fails while the restore reads it the second time (to write it),
    at its last line: the notes and versions before it are written by then."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.last_line = data.rstrip(b"\n").rfind(b"\n") + 1
        self.rewound = False

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.rewound = True
        return super().seek(offset, whence)

    def readline(self, size: int | None = -1) -> bytes:
        if self.rewound and self.tell() >= self.last_line:
            raise OSError("the disk failed")
        return super().readline(size)


def test_restore_is_one_transaction(store: Store) -> None:
    """A failure while writing (after every line was checked) leaves nothing behind."""
    fill(store, "alice")
    data = export(store, "alice")
    assert json.loads(data.splitlines()[-1])["kind"] == "link"  # written after the notes
    with pytest.raises(OSError, match="the disk failed"):
        store.restore(FailsOnSecondReading(data), "bob", reassign_owner=True)
    assert held(store, BOB) == (0, 0, 0)


def test_the_schema_document_lists_every_key_the_code_writes_and_requires() -> None:
    from gleaner.store.owners import export, restore

    doc = (Path(__file__).parent.parent / "docs" / "EXPORT.md").read_text(encoding="utf-8")

    def part(title: str) -> str:
        return doc.split(f"### {title}", 1)[1].split("\n#", 1)[0]

    rows = re.findall(r"^\| ((?:`\w+`(?:, )?)+) \|.*\| ([^|]+) \|$", part("Note"), re.MULTILINE)
    listed = [key for cell, _ in rows for key in re.findall(r"`(\w+)`", cell)]
    assert listed == list(export.NOTE_KEYS[1:])
    required = [key for cell, need in rows if need == "yes" for key in re.findall(r"`(\w+)`", cell)]
    assert required == list(restore.REQUIRED["note"])
    version = part("Version")
    assert all(f"`{key}`" in version for key in export.VERSION_KEYS[1:])
    assert all(f"`{key}`" in version for key in restore.REQUIRED["version"])
    assert all(f"`{key}`" in part("Link") for key in export.LINK_KEYS[1:])
    assert all(f"| `{key}` |" in part("Header") for key in export.HEADER_KEYS)


def test_an_export_reads_one_snapshot_and_holds_no_writer_up(store: Store) -> None:
    """A write during an export goes through at once (SQLite: no write lock taken) and the
    export does not see it (PostgreSQL: REPEATABLE READ; SQLite: a WAL read snapshot)."""
    fill(store, "alice")
    before = export(store, "alice")
    lines = store.export_lines("alice")
    first = next(lines)  # the snapshot is open from here
    assert json.loads(first)["counts"] == header(before)["counts"]
    started = datetime.now(UTC)
    store.write(ALICE, {"title": "Written meanwhile", "body": "not in this export"})
    assert (datetime.now(UTC) - started).total_seconds() < 5
    assert records(first + b"".join(lines)) == records(before)
    assert b"Written meanwhile" in export(store, "alice")


def test_export_writes_to_a_text_file_too(store: Store) -> None:
    fill(store, "alice")
    out = io.StringIO()
    store.export_owner("alice", out)
    assert records(out.getvalue().encode("utf-8")) == records(export(store, "alice"))
