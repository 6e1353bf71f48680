"""What every ``gleaner`` command shares: exit codes, the store, scopes, flags, progress."""

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


def open_store() -> Store:
    from store import Store

    return Store()


def scope_of(args: argparse.Namespace) -> Scope:
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

    store = open_store()
    store.migrate()
    print(f"database at revision {current_revision(store.engine)} ({store.dialect})")
    return EXIT_OK


def progress_bar(total_hint: str) -> tuple[Any, Callable[[int, int], None]]:
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


def current_settings() -> Any:
    from store import load_settings

    return load_settings()


def require_broker(command: str) -> Any:
    settings = current_settings()
    if not settings.broker_url:
        raise UsageError(
            f"`gleaner {command}` needs a broker: set GLEANER_BROKER_URL "
            "(e.g. redis://127.0.0.1:6379/0), or use `gleaner harvest` to run in process"
        )
    return settings


def existing_paths(paths: Sequence[str]) -> list[Any]:
    from pathlib import Path

    found = [Path(p) for p in paths]
    for path in found:
        if not path.exists():
            raise UsageError(f"no such file or folder: {path}")
    return found


def add_scope_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--owner", metavar="NAME", help="the owner whose notes to use")
    group.add_argument(
        "--global", dest="global_scope", action="store_true", help="use the shared global scope"
    )


def add_owner_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--owner",
        metavar="NAME",
        help="owner of the conversations that name none (ChatGPT and Claude exports carry "
        "none: then it is required); a conversation that names its owner keeps it",
    )
    parser.add_argument(
        "--reassign-owner",
        action="store_true",
        help="put EVERY conversation in --owner's scope, even one that names another owner",
    )


def owner_options(args: argparse.Namespace) -> dict[str, Any]:
    """``owner`` and ``reassign_owner`` as the harvest and import functions take them."""
    if args.reassign_owner and not args.owner:
        raise UsageError("--reassign-owner needs --owner NAME: the owner to reassign to")
    return {"owner": args.owner, "reassign_owner": args.reassign_owner}
