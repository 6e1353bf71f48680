"""What every ``gleaner`` command shares: exit codes, the store and its schema, scopes,
flags, summaries."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gleaner.store import Note, Scope, Store
    from gleaner.workers.enqueue import BrokerUnavailable

# The exit statuses README ("The command line") documents.
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_PIPE = 141  # 128 + SIGPIPE, as `seq 1000000 | head -1` reports for seq
EXIT_STATUS_HELP = """exit status:
  0    success
  1    the command ran and something failed: an input (the rest was done), the
       database or the broker; the line on stderr says what, and what to do next
  2    the command could not run as given: arguments, a GLEANER_* setting, a
       conversation with no owner and no --owner; nothing was done
  130  interrupted (Ctrl-C); an import being followed goes on in the workers
  141  stdout was closed early (`gleaner search ... | head -1`): output stops quietly
"""
# Lines of a text summary that list one conversation each, before "... and N more".
LISTED = 20


class UsageError(Exception):
    """Raised for a command line that cannot run as given (exit 2)."""


class CommandFailed(Exception):
    """Raised when a command ran and failed as a whole (exit 1); the message says what to
    do next."""


class Interrupted(Exception):
    """Raised when Ctrl-C stopped a command (exit 130); the message says what is kept."""


def open_store(*, create: bool = False) -> Store:
    """The store of GLEANER_DATABASE_URL. Only a command that writes (``create``) may make a
    SQLite file that is not there: a read command fails instead and leaves no file behind."""
    from gleaner.store import Store

    if not create:
        require_database()
    return Store()


def require_database() -> None:
    """CommandFailed when the database is a SQLite file that does not exist yet."""
    from pathlib import Path

    from sqlalchemy.engine import make_url

    url = make_url(current_settings().database_url)
    if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
        return
    if not Path(url.database).exists():
        raise CommandFailed(
            f"no database at {url.database} (GLEANER_DATABASE_URL): nothing is stored there "
            "yet; harvest a conversation first, or point GLEANER_DATABASE_URL at your database"
        )


def ensure_schema(store: Store) -> None:
    """Make sure the schema is this Gleaner's newest before a command writes: the embedded
    SQLite default is migrated here (and says so on stderr), PostgreSQL is left to ``gleaner
    db upgrade`` (``store.schema.schema_version``)."""
    migrated = store.ensure_schema()
    if migrated is not None:
        print(
            f"gleaner: migrated the SQLite database {store.engine.url.database} "
            f"to revision {migrated}",
            file=sys.stderr,
        )


def scope_of(args: argparse.Namespace) -> Scope:
    from gleaner.store import Scope

    if args.global_scope:
        return Scope.global_()
    if not args.owner:
        raise UsageError("say whose notes: --owner NAME or --global")
    return Scope.owner(args.owner)


def note_json(note: Note) -> dict[str, Any]:
    data: dict[str, Any] = note.model_dump(mode="json")
    data["scope"] = {"kind": note.scope.kind, "id": note.scope.id}
    return data


def broker_down(error: BrokerUnavailable, jobs: int, done: str = "recorded") -> CommandFailed:
    """The one line for jobs ``done`` (recorded, reset) whose messages the broker did not
    take: they are pending in the database, and the lost-job sweep (or an operator) sends
    them."""
    if error.full:  # Redis's refusals mark its losses: the sweep does not wait the usual time
        why, when = "refused them", "at its first run once Redis has room"
    else:
        why, when = "did not answer", "once the broker is back and GLEANER_REQUEUE_AFTER_SECONDS "
        when += "have passed"
    return CommandFailed(
        f"broker_unavailable: {jobs} job(s) {done}, {error.unsent} not sent: the broker "
        f"{why} ({error.detail}). They wait in the database as pending: beat's "
        f"lost-job sweep sends them {when}, or run `gleaner housekeep requeue` to send them "
        "at once"
    )


# What Ctrl-C leaves while jobs are recorded and sent: committed batches, maybe unsent.
RECORDING_INTERRUPTED = (
    "interrupted while recording jobs: any job recorded so far waits as pending; beat's "
    "lost-job sweep sends it once GLEANER_REQUEUE_AFTER_SECONDS have passed, or run "
    "`gleaner housekeep requeue` to send it at once"
)


def print_summary(summary: Any, as_json: bool) -> None:
    """A harvest's totals; in text at most LISTED conversations with their notes and LISTED
    failures (each named with its reason), then how many more ``--json`` lists."""
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
        f"skipped {summary.notes_skipped}, items dropped {summary.items_dropped}"
    )
    print(
        f"model calls {summary.model_calls}, tokens {summary.prompt_tokens} prompt + "
        f"{summary.completion_tokens} completion"
    )
    with_notes = [r for r in summary.reports if r["slugs"]]
    for report in with_notes[:LISTED]:
        print(f"  {report['owner']} / {report['conversation_id']}: {', '.join(report['slugs'])}")
    if len(with_notes) > LISTED:
        print(f"  ... and {len(with_notes) - LISTED} more conversation(s) with notes (--json)")
    print_failures(summary.failures)


def print_failures(failures: Sequence[dict[str, str]], *, word: str = "FAILED") -> None:
    """Name each failed file or conversation and why, on stderr (at most LISTED)."""
    for failure in failures[:LISTED]:
        print(f"  {word} {failure['conversation']}: {failure['error']}", file=sys.stderr)
    if len(failures) > LISTED:
        print(f"  ... and {len(failures) - LISTED} more (--json lists them)", file=sys.stderr)


def current_settings() -> Any:
    from gleaner.store import load_settings

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
            # Shown as every path is shown: with its <private> spans redacted (loaded only
            # here, so commands that find their paths start without the harvester).
            from gleaner.harvest.redact import redact_text

            raise UsageError(f"no such file or folder: {redact_text(str(path))}")
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


def stored_text(field: str, max_chars: int) -> Any:
    """An argparse type for an argument that names a stored value (a slug, a job id): an
    argument no stored value can be (undecodable bytes, which arrive as lone surrogates, or
    longer than the column) is a usage error naming ``field``, before any database sees it."""

    def check(value: str) -> str:
        from gleaner.store.errors import InvalidInput
        from gleaner.store.text import check_text

        try:
            check_text(value, field)
        except InvalidInput as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        if len(value) > max_chars:
            raise argparse.ArgumentTypeError(
                f"{field} is {len(value):,} characters, over the {max_chars} it can be"
            )
        return value

    check.__name__ = field  # argparse names the type in some of its own messages
    return check


SLUG = stored_text("slug", 120)
JOB_ID = stored_text("job id", 32)
