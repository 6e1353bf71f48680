"""Reading notes: ``db upgrade``/``reindex``, ``search``, ``show``, ``index``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gleaner.cli.common import (
    EXIT_OK,
    EXIT_USAGE,
    SLUG,
    add_scope_flags,
    note_json,
    open_store,
    scope_of,
)

if TYPE_CHECKING:
    from gleaner.store import SearchHit


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from gleaner.store.db import current_revision

    store = open_store(create=True)
    store.migrate(progress=_reindex_progress)
    print(f"database at revision {current_revision(store.engine)} ({store.dialect})")
    return EXIT_OK


def cmd_db_reindex(args: argparse.Namespace) -> int:
    store = open_store()
    result = store.reindex(progress=_reindex_progress)
    how = "rebuilt (the tokenizer version had changed)" if result.rebuilt else "up to date"
    print(f"search index {how}: {result.indexed} note(s) indexed, version {result.version}")
    return EXIT_OK


def _reindex_progress(done: int) -> None:
    print(f"gleaner: search index: {done} note(s) indexed", file=sys.stderr, flush=True)


def said_time(text: str) -> datetime:
    """An ISO date or date and time (``2024-05-01``, ``2024-05-01T18:00:00Z``); naive is UTC."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO date or time (e.g. 2024-05-01 or 2024-05-01T18:00:00Z)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def cmd_search(args: argparse.Namespace) -> int:
    from gleaner.store.recall.search import content_words

    query = " ".join(args.query)
    scope = scope_of(args)
    if not content_words(query):
        # Not an error of the store (it returns no hit); said here so nobody reads it as
        # "no note matches".
        print(
            f"gleaner: nothing to search for: the query {query.strip()[:80]!r} has no content "
            "word (only stop words such as 'the' or punctuation); give a word to look for",
            file=sys.stderr,
        )
        if args.json:
            print("[]")
        return EXIT_USAGE
    store = open_store()
    vector, model = None, None
    if store.settings.embed_model:  # semantic recall configured: the query's vector too
        from gleaner.harvest.embed_notes import query_vector

        found = query_vector(store.settings, query)
        if found is not None:
            vector, model = found
    hits = store.search(
        scope,
        query,
        limit=args.limit,
        since=args.since,
        until=args.until,
        vector=vector,
        vector_model=model,
    )
    if args.json:
        out = [_hit_json(hit, explain=args.explain) for hit in hits]
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    if not hits:
        print("no notes match")
    for hit in hits:
        _print_hit(hit, explain=args.explain)
    return EXIT_OK


def _hit_json(hit: SearchHit, *, explain: bool) -> dict[str, Any]:
    """A hit as ``search --json`` prints it; with --explain, its score's parts too."""
    parts = {
        "parts": hit.parts.model_dump() if hit.parts else None,
        "bm25": hit.bm25,
        "lexical": hit.lexical,
        "recency": hit.recency,
    }
    return {
        **note_json(hit.memory),
        "score": hit.score,
        "snippet": hit.snippet,
        "backend": hit.backend,
        **(parts if explain else {}),
    }


def _print_hit(hit: SearchHit, *, explain: bool) -> None:
    """A hit for a reader: score, slug, marks and title, then (--explain) how it scored and
    why, then its snippet."""
    note = hit.memory
    pin = " [pinned]" if note.pinned else ""
    flag = f" [flag: {note.flag}]" if note.flag else ""  # reads as an instruction
    said = f"  (said {note.said_at:%Y-%m-%d})" if note.said_at else ""
    print(f"{hit.score:6.3f}  {note.slug}{pin}{flag}  {note.title}{said}")
    if explain and hit.parts is not None:
        parts = hit.parts
        print(
            f"        = lexical {parts.lexical:.3f} (match {hit.lexical:.3f}, bm25 "
            f"{hit.bm25:.3f}) + recency {parts.recency:.3f} (factor {hit.recency:.3f}) "
            f"+ pinned {parts.pinned:.3f}   [{hit.backend}]"
        )
        if note.keywords:
            print(f"        keywords: {' '.join(note.keywords)}")
        for quote in note.evidence:
            print(f'        evidence ({quote.speaker}): "{quote.quote}"')
    print(f"        {hit.snippet}")


def cmd_index(args: argparse.Namespace) -> int:
    scope = scope_of(args)
    text = open_store().index_text(scope, args.query)
    if not text:
        print(f"gleaner: no live notes in {scope}: the index is empty", file=sys.stderr)
        return EXIT_OK
    print(text)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    store = open_store()
    scope = scope_of(args)
    found = store.read(scope, args.slug)
    versions = store.history(scope, args.slug) if args.history else []
    if args.json:
        out = note_json(found.memory)
        out["links"] = [{"rel": ln.rel, "slug": ln.note.slug} for ln in found.links]
        out["backlinks"] = [{"rel": ln.rel, "slug": ln.note.slug} for ln in found.backlinks]
        out["superseded_by"] = found.superseded_by
        if args.history:
            out["history"] = [v.model_dump(mode="json") for v in versions]
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    note = found.memory
    print(f"{note.title}  [{note.slug}]")
    print(
        f"type={note.type or '-'} provenance={note.provenance} pinned={note.pinned} "
        f"status={note.status} topics={' '.join(note.topics) or '-'}"
    )
    said = f"{note.said_at:%Y-%m-%d %H:%M} UTC" if note.said_at else "-"
    print(f"said={said} keywords={' '.join(note.keywords) or '-'}")
    for quote in note.evidence:
        print(f'evidence ({quote.speaker}): "{quote.quote}"')
    if found.superseded_by:
        print(f"superseded by: {found.superseded_by}")
    for ln in found.links:
        print(f"-> {ln.rel} {ln.note.slug}")
    for ln in found.backlinks:
        print(f"<- {ln.rel} {ln.note.slug}")
    print()
    print(note.body)
    if args.history:
        _print_history(versions)
    return EXIT_OK


def _print_history(versions: Sequence[Any]) -> None:
    """Earlier versions, newest first: when and why each was replaced, then its text."""
    print()
    if not versions:
        print("history: no earlier version (the text was never changed)")
        return
    print(f"history: {len(versions)} earlier version(s), newest first")
    for version in versions:
        by = version.changed_conversation_id or "-"
        print(
            f"\n-- replaced {version.changed_at:%Y-%m-%d %H:%M:%S} UTC by {version.reason} "
            f"({version.changed_provenance}, conversation {by}); written "
            f"{version.written_at:%Y-%m-%d %H:%M:%S} UTC ({version.written_provenance}, "
            f"conversation {version.written_conversation_id or '-'})"
        )
        print(f"{version.title}")
        print(version.body)


def register(sub: Any) -> None:
    db = sub.add_parser("db", help="database schema commands")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_sub.add_parser(
        "upgrade",
        help="migrate the database to the newest schema",
        description="Migrate the database to the newest schema, then put every note the "
        "search index lacks into it (progress on stderr): a store from before the index, or "
        "one built by another tokenizer version, is indexed here.",
    )
    upgrade.set_defaults(func=cmd_db_upgrade)
    reindex = db_sub.add_parser(
        "reindex",
        help="index the notes the search index lacks (db upgrade does it too)",
        description="Index every note not in the search index yet, in batches (progress on "
        "stderr); when the index was built by another tokenizer version, rebuild it whole. "
        "Safe to run while workers write; a stopped run resumes where it was.",
    )
    reindex.set_defaults(func=cmd_db_reindex)

    search = sub.add_parser(
        "search",
        help="search a scope's notes (any word, BM25 and recency ranked)",
        description="Search the scope's live notes for the words given (one or more "
        "arguments; any text is safe, a question in plain words too). A note matching any "
        "of the words is a hit; hits rank by BM25 (rarer words and title words weigh more), "
        "recency of when the fact was said, and pinning. Exit 0 with hits or none, 2 when "
        "the query has no content word (only stop words or punctuation: nothing is "
        "searched).",
    )
    search.add_argument("query", nargs="+", metavar="WORD", help="words to look for")
    add_scope_flags(search)
    search.add_argument("--limit", type=int, default=10, help="most hits to show (1-100)")
    search.add_argument("--json", action="store_true", help="print one JSON list of hits")
    search.add_argument(
        "--explain",
        action="store_true",
        help="show each hit's score as its lexical, recency and pinned parts (and its BM25 "
        "and search keywords)",
    )
    search.add_argument(
        "--since",
        type=said_time,
        metavar="WHEN",
        help="only facts said at or after this ISO date or time (naive: UTC)",
    )
    search.add_argument(
        "--until",
        type=said_time,
        metavar="WHEN",
        help="only facts said before this ISO date or time (naive: UTC)",
    )
    search.set_defaults(func=cmd_search)

    index = sub.add_parser(
        "index",
        help="print the memory index text that goes into a system prompt",
        description="Print the scope's index text (Store.index_text): pinned notes with their "
        "bodies, then (with --for) the notes most relevant to that text with the start of "
        "their bodies, then other titles, newest first, within GLEANER_INDEX_TOKEN_BUDGET; "
        "each entry says when its fact was said. Prints nothing (and says so on stderr) "
        "when the scope has no live note.",
    )
    add_scope_flags(index)
    index.add_argument(
        "--for",
        dest="query",
        metavar="TEXT",
        help="the conversation so far (or its gist): notes relevant to it come first",
    )
    index.set_defaults(func=cmd_index)

    show = sub.add_parser("show", help="show one note with its links")
    show.add_argument("slug", type=SLUG)
    add_scope_flags(show)
    show.add_argument("--json", action="store_true", help="print the note as JSON")
    show.add_argument(
        "--history",
        action="store_true",
        help="also print the note's earlier versions: each text a change replaced, with when, "
        "why (slug_upsert, topic_key_upsert, mem_save_upsert, harvest_same_fact) and which "
        "conversation changed it",
    )
    show.set_defaults(func=cmd_show)
