"""The ``gleaner`` command line.

Imports are deferred into each command so ``gleaner search`` never pays for Celery or litellm.
Exit status: 0 success, 1 some input failed, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from store import Note, Scope, Store

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Raised for a command line that cannot run as given (exit 2)."""


def _store() -> Store:
    from store import Store

    return Store()


def _scope(args: argparse.Namespace) -> Scope:
    from store import Scope

    if args.global_scope:
        return Scope.global_()
    if not args.owner:
        raise UsageError("say whose notes: --owner NAME or --global")
    return Scope.owner(args.owner)


def note_json(note: Note) -> dict[str, Any]:
    data: dict[str, Any] = note.model_dump(mode="json")
    data["scope"] = {"kind": note.scope.kind, "id": note.scope.id}
    return data


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from store.db import current_revision

    store = _store()
    store.migrate()
    print(f"database at revision {current_revision(store.engine)} ({store.dialect})")
    return EXIT_OK


def cmd_search(args: argparse.Namespace) -> int:
    store = _store()
    hits = store.search(_scope(args), args.query, limit=args.limit)
    if args.json:
        out = [
            {**note_json(h.memory), "score": h.score, "snippet": h.snippet, "backend": h.backend}
            for h in hits
        ]
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    if not hits:
        print("no notes match")
    for hit in hits:
        note = hit.memory
        pin = " [pinned]" if note.pinned else ""
        print(f"{hit.score:6.3f}  {note.slug}{pin}  {note.title}")
        print(f"        {hit.snippet}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    store = _store()
    found = store.read(_scope(args), args.slug)
    if args.json:
        out = note_json(found.memory)
        out["links"] = [{"rel": ln.rel, "slug": ln.note.slug} for ln in found.links]
        out["backlinks"] = [{"rel": ln.rel, "slug": ln.note.slug} for ln in found.backlinks]
        out["superseded_by"] = found.superseded_by
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    note = found.memory
    print(f"{note.title}  [{note.slug}]")
    print(
        f"type={note.type or '-'} provenance={note.provenance} pinned={note.pinned} "
        f"status={note.status} topics={' '.join(note.topics) or '-'}"
    )
    if found.superseded_by:
        print(f"superseded by: {found.superseded_by}")
    for ln in found.links:
        print(f"-> {ln.rel} {ln.note.slug}")
    for ln in found.backlinks:
        print(f"<- {ln.rel} {ln.note.slug}")
    print()
    print(note.body)
    return EXIT_OK


def _progress_bar(total_hint: str) -> tuple[Any, Callable[[int, int], None]]:
    """A rich progress bar on stderr (shown only on a terminal), and its update callback."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    console = Console(stderr=True)
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )
    task = progress.add_task(total_hint, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


def print_summary(summary: Any, as_json: bool) -> None:
    data = {k: v for k, v in vars(summary).items() if k != "reports"}
    if as_json:
        data["conversations"] = summary.reports
        print(json.dumps(data, ensure_ascii=False, indent=2, default=str))
        return
    print(
        f"transcripts {summary.transcripts} (harvested {summary.harvested}, "
        f"already done {summary.skipped}, failed {summary.failed})"
    )
    print(
        f"notes written {summary.notes_written}, updated {summary.notes_updated}, "
        f"skipped {summary.notes_skipped}, invalid items dropped {summary.items_dropped}"
    )
    print(
        f"model calls {summary.model_calls}, tokens {summary.prompt_tokens} prompt + "
        f"{summary.completion_tokens} completion"
    )
    for report in summary.reports:
        if report["slugs"]:
            print(
                f"  {report['owner']} / {report['conversation_id']}: {', '.join(report['slugs'])}"
            )
    for failure in summary.failures:
        print(f"  FAILED {failure['conversation']}: {failure['error']}", file=sys.stderr)


def cmd_harvest(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harvest.batch import harvest_paths

    paths = [Path(p) for p in args.paths]
    for path in paths:
        if not path.exists():
            raise UsageError(f"no such file or folder: {path}")
    store = _store()
    progress, update = _progress_bar("harvesting")
    with progress:
        summary = harvest_paths(
            store, paths, owner=args.owner, provenance=args.provenance, on_progress=update
        )
    print_summary(summary, args.json)
    return EXIT_FAILED if summary.failed else EXIT_OK


def _add_scope_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--owner", metavar="NAME", help="the owner whose notes to use")
    group.add_argument(
        "--global", dest="global_scope", action="store_true", help="use the shared global scope"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gleaner",
        description=(
            "Gleaner turns finished conversations into durable notes. Configuration comes from "
            "GLEANER_* environment variables (GLEANER_DATABASE_URL defaults to "
            "sqlite:///gleaner.db in the working directory)."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    db = sub.add_parser("db", help="database schema commands")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_sub.add_parser("upgrade", help="migrate the database to the newest schema")
    upgrade.set_defaults(func=cmd_db_upgrade)

    search = sub.add_parser("search", help="search a scope's notes (lexical, recency-ranked)")
    search.add_argument("query", help="words to look for; any text is safe")
    _add_scope_flags(search)
    search.add_argument("--limit", type=int, default=10, help="most hits to show (1-100)")
    search.add_argument("--json", action="store_true", help="print one JSON list of hits")
    search.set_defaults(func=cmd_search)

    harvest = sub.add_parser(
        "harvest",
        help="harvest transcript files or folders in process (no broker needed)",
        description=(
            "Read every conversation in the given files and folders (native JSON, JSON Lines, "
            "OpenAI messages, ChatGPT or Claude exports and their .zip), extract at most "
            "GLEANER_HARVEST_MAX_FACTS notes from each and write them to the owner's scope. "
            "A conversation harvested before is skipped at no cost. With no "
            "GLEANER_HARVEST_MODEL set, the offline extractor runs (no key, no network)."
        ),
    )
    harvest.add_argument("paths", nargs="+", metavar="PATH", help="transcript files or folders")
    harvest.add_argument(
        "--owner",
        metavar="NAME",
        help="whose notes these are; defaults to each transcript's own owner, required for "
        "exports (ChatGPT, Claude) which carry none",
    )
    harvest.add_argument(
        "--provenance",
        choices=("compaction", "import"),
        default="compaction",
        help="compaction for just-ended conversations (default), import for old ones",
    )
    harvest.add_argument("--json", action="store_true", help="print the summary as JSON")
    harvest.set_defaults(func=cmd_harvest)

    show = sub.add_parser("show", help="show one note with its links")
    show.add_argument("slug")
    _add_scope_flags(show)
    show.add_argument("--json", action="store_true", help="print the note as JSON")
    show.set_defaults(func=cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from store.errors import ConfigError, InvalidInput, StoreError, format_error

    usage_reasons = {"no_owner", "bad_provenance", "bad_config"}

    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"gleaner: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (ConfigError, InvalidInput) as exc:
        print(f"gleaner: {format_error(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except StoreError as exc:
        print(f"gleaner: {format_error(exc)}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        # Harvest's errors carry a reason too; a missing owner is a usage error.
        if getattr(exc, "reason", None) is None:
            raise
        print(f"gleaner: {format_error(exc)}", file=sys.stderr)
        return EXIT_USAGE if exc.reason in usage_reasons else EXIT_FAILED  # type: ignore[attr-defined]


if __name__ == "__main__":
    sys.exit(main())
