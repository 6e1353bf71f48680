"""The ``gleaner`` command line: one module per group of commands, each with a ``register``.

Imports are deferred into each command so ``gleaner search`` never pays for Celery or litellm,
and a command line that names a command builds (and imports) only its group's parser.
Every failure ends as one line on stderr (the problem, then the next step) and an exit status
chosen by the error's type or ``reason``: see ``EXIT_STATUS_HELP`` (``gleaner --help``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib import import_module
from typing import NoReturn

from gleaner.cli.common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_PIPE,
    EXIT_STATUS_HELP,
    EXIT_USAGE,
    CommandFailed,
    Interrupted,
    UsageError,
)

__all__ = ["build_parser", "main"]

# Each group of commands (a module of cli with a ``register``) and the commands it
# adds, in the order of `gleaner --help` (tests/test_startup_imports.py holds this to what each
# adds).
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "read": ("db", "search", "index", "show"),
    "embed": ("embed",),
    "notes": ("notes",),
    "intake": ("harvest", "enqueue"),
    "hook": ("hook",),
    "imports": ("import",),
    "run": ("worker", "beat", "health"),
    "operate": ("housekeep", "status", "imports", "retry", "forget"),
    "backup": ("export", "restore"),
    "serve": ("serve", "mcp", "keys"),
    "evaluate": ("eval",),
}
# Harvest reasons that mean the command line lacks something (exit 2), not a failed input.
USAGE_REASONS = frozenset({"no_owner", "bad_owner", "bad_provenance", "bad_config"})


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors (they quote the arguments) show no private span."""

    def error(self, message: str) -> NoReturn:
        from gleaner.privacy import strip_private

        super().error(strip_private(message))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; of ``command``'s group only when it names a command (its
    help, usage and errors are the same: only the other groups are left out)."""
    groups = [group for group, names in COMMAND_GROUPS.items() if command in names]
    parser = _Parser(
        prog="gleaner",
        description=(
            "Gleaner turns finished conversations into durable notes. Configuration comes\n"
            "from GLEANER_* environment variables (GLEANER_DATABASE_URL defaults to one\n"
            "SQLite file in the user's data directory, e.g. ~/.local/share/gleaner/gleaner.db)."
        ),
        epilog=EXIT_STATUS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in groups or COMMAND_GROUPS:
        import_module(f"gleaner.cli.{group}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``gleaner`` command; returns its exit status (argparse itself exits 2 on a
    command line it cannot parse, 0 after ``--help``)."""
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except BrokenPipeError:
        _drop_stdout()
        return EXIT_PIPE
    except KeyboardInterrupt:
        print("gleaner: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


def _dispatch(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv else None)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "celery_passthrough", False):  # only `worker` passes on
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.celery_args = extra
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"gleaner: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Interrupted as exc:
        print(f"gleaner: {exc}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CommandFailed as exc:
        print(f"gleaner: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except Exception as exc:
        # Store, harvest and broker errors carry a machine-readable reason; anything
        # without one is a bug and keeps its traceback.
        reason = getattr(exc, "reason", None)
        if not isinstance(reason, str):
            raise
        from gleaner.store.errors import ConfigError, InvalidInput, format_error

        print(f"gleaner: {format_error(exc)}", file=sys.stderr)
        usage = isinstance(exc, ConfigError | InvalidInput) or reason in USAGE_REASONS
        return EXIT_USAGE if usage else EXIT_FAILED


def _drop_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what is left in its
    buffer does not fail on the closed pipe again (and print a second error)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is no file (captured in tests)
        pass
