"""Reading and tending notes from the shell: ``notes list|pin|unpin|delete``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gleaner.cli.common import EXIT_OK, SLUG, add_scope_flags, note_json, open_store, scope_of

STATUS_CHOICES = ("live", "archived", "superseded", "all")


def cmd_list(args: argparse.Namespace) -> int:
    scope = scope_of(args)
    status = None if args.status == "all" else args.status
    pinned = True if args.pinned else None
    found = open_store().list_notes(scope, status=status, pinned=pinned, limit=args.limit)
    if args.json:
        print(json.dumps([note_json(n) for n in found], ensure_ascii=False, indent=2))
        return EXIT_OK
    if not found:
        print(f"no {'' if status is None else status + ' '}notes in {scope}")
    for note in found:
        flags = (" [pinned]" if note.pinned else "") + (
            "" if note.status == "live" else f" [{note.status}]"
        )
        print(f"{note.updated_at:%Y-%m-%d}  {note.slug}{flags}  {note.title}")
    return EXIT_OK


def _change(args: argparse.Namespace, action: str) -> int:
    store = open_store()
    scope = scope_of(args)
    method = {"pin": store.pin, "unpin": store.unpin, "delete": store.archive}[action]
    result = method(scope, args.slug)
    done = {"pin": "pinned", "unpin": "unpinned", "delete": "archived"}[action]
    if args.json:
        print(json.dumps({**note_json(result.memory), "changed": result.changed}, indent=2))
    elif result.changed:
        print(f"{done} {result.memory.slug} in {scope}")
    elif action == "delete":
        print(f"{result.memory.slug} in {scope} is already {result.memory.status}: unchanged")
    else:
        print(f"{result.memory.slug} in {scope} is already {done}: unchanged")
    return EXIT_OK


def register(sub: Any) -> None:
    notes = sub.add_parser(
        "notes",
        help="list a scope's notes; pin, unpin or delete (archive) one",
        description="List and tend a scope's notes by hand. `delete` archives the note: it "
        "leaves search and the index, but its row, links and history are kept (`gleaner show "
        "SLUG --history` still reads it) and a later write to the same slug or topic key "
        "brings it back with the new text. `gleaner forget` is the only way to erase. Exit 1 "
        "when the note does not exist, 2 for bad usage (pinning an archived note included).",
    )
    actions = notes.add_subparsers(dest="notes_command", required=True, metavar="ACTION")

    listing = actions.add_parser("list", help="the scope's notes, most recently changed first")
    add_scope_flags(listing)
    listing.add_argument(
        "--status",
        choices=STATUS_CHOICES,
        default="live",
        help="which notes: live (default), archived, superseded or all",
    )
    listing.add_argument("--pinned", action="store_true", help="only pinned notes")
    listing.add_argument("--limit", type=int, default=100, help="most notes to list (1-1000)")
    listing.add_argument("--json", action="store_true", help="print one JSON list of notes")
    listing.set_defaults(func=cmd_list)

    helps = {
        "pin": "pin a live note: its body goes into the index text (your choice, so any "
        "provenance may be pinned)",
        "unpin": "unpin a note",
        "delete": "archive a note: out of search and the index, never erased",
    }
    for action, text in helps.items():
        parser = actions.add_parser(action, help=text, description=text)
        parser.add_argument("slug", metavar="SLUG", type=SLUG)
        add_scope_flags(parser)
        parser.add_argument("--json", action="store_true", help="print the note as JSON")
        parser.set_defaults(func=lambda args, action=action: _change(args, action))
