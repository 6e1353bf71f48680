"""The ``gleaner`` command line: one module per group of commands, each with a ``register``.

Imports are deferred into each command so ``gleaner search`` never pays for Celery or litellm.
Exit status: 0 success, 1 some input failed, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from workers.cli import imports, intake, notes, operate, read, run, serve
from workers.cli.common import EXIT_FAILED, EXIT_USAGE, UsageError

__all__ = ["build_parser", "main"]

# Order here is the order of `gleaner --help`.
COMMAND_GROUPS = (read, notes, intake, imports, run, operate, serve)


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
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "celery_passthrough", False):  # only `worker` passes on
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.celery_args = extra
    from store.errors import ConfigError, InvalidInput, StoreError, format_error

    usage_reasons = {"no_owner", "bad_owner", "bad_provenance", "bad_config"}

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
