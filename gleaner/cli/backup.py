"""``gleaner export`` and ``gleaner restore``: one owner's notes, history and links as JSON
Lines (docs/EXPORT.md), and that file back into an owner with no notes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gleaner.cli.common import (
    EXIT_OK,
    CommandFailed,
    Interrupted,
    UsageError,
    ensure_schema,
    existing_paths,
    open_store,
)
from gleaner.cli.progress import Progress
from gleaner.store.text import quoted

if TYPE_CHECKING:
    from gleaner.store import Store
    from gleaner.store.owners.export import ExportCounts


def _progress(label: str, store: Store) -> Progress:
    """Progress on stderr for a run that lasts: nothing before GLEANER_PROGRESS_SECONDS."""
    every = store.settings.progress_seconds
    return Progress(label, every=every, from_zero=True, quiet_for=every)


def cmd_export(args: argparse.Namespace) -> int:
    from gleaner.store.text import check_principal

    owner = quoted(check_principal(args.owner))  # as stored: the owner rule normalizes it
    store = open_store()
    to_stdout = args.output in (None, "-")
    with _progress("export", store) as progress:
        if to_stdout:
            counts = store.export_owner(args.owner, sys.stdout.buffer, progress=progress.update)
            sys.stdout.buffer.flush()
        else:
            counts = _export_to_file(store, args.owner, Path(args.output), progress.update)
    where = "standard output" if to_stdout else args.output
    if not counts.notes:
        print(
            f"gleaner: owner {owner} has no notes: the export holds only its header",
            file=sys.stderr,
        )
    else:
        print(
            f"gleaner: exported {counts.notes} note(s), {counts.versions} version(s) and "
            f"{counts.links} link(s) of owner {owner} to {where}",
            file=sys.stderr,
        )
    return EXIT_OK


def _export_to_file(store: Store, owner: str, path: Path, progress: Any) -> ExportCounts:
    """Write the export beside ``path`` and move it there once whole: a run that fails or is
    stopped leaves no file that looks like an export."""
    import tempfile

    if not path.parent.is_dir():
        raise UsageError(f"no such folder for the export: {path.parent}")
    partial = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below, kept on success
        dir=path.parent, prefix=f".{path.name}.", suffix=".partial", delete=False
    )
    try:
        with partial:
            counts = store.export_owner(owner, partial, progress=progress)
        os.replace(partial.name, path)
    except BaseException:
        Path(partial.name).unlink(missing_ok=True)
        raise
    return counts


def cmd_restore(args: argparse.Namespace) -> int:
    from gleaner.store.errors import BadExport, format_error

    if args.reassign_owner and not args.owner:
        raise UsageError("--reassign-owner needs --owner NAME: the owner to restore into")
    if args.file != "-":
        existing_paths([args.file])
    store = open_store(create=True)
    ensure_schema(store)
    try:
        with _open(args.file) as fp, _progress("restore", store) as progress:
            result = store.restore(
                fp, args.owner, reassign_owner=args.reassign_owner, progress=progress.update
            )
    except BadExport as exc:
        raise CommandFailed(f"{format_error(exc)}; nothing was restored") from None
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted: nothing was restored (a restore is one transaction)"
        ) from None
    data: dict[str, Any] = {
        "owner": result.owner,
        "notes": result.notes,
        "versions": result.versions,
        "links": result.links,
        "exported_owner": result.exported_owner,
        "exported_at": result.exported_at.isoformat(),
    }
    embed = store.settings.embed_model
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return EXIT_OK
    moved = (
        ""
        if result.owner == result.exported_owner
        else f" (exported from {quoted(result.exported_owner)})"
    )
    print(
        f"restored {result.notes} note(s), {result.versions} version(s) and {result.links} "
        f"link(s) into owner {quoted(result.owner)}{moved}"
    )
    if embed and result.notes:
        print(
            f"their vectors for {embed} are pending: run `gleaner embed --backfill --owner "
            f"{quoted(result.owner)}`",
            file=sys.stderr,
        )
    return EXIT_OK


def _open(name: str) -> AbstractContextManager[IO[bytes]]:
    """The export file, or standard input for ``-`` (left open: it is not ours)."""
    if name == "-":
        return nullcontext(sys.stdin.buffer)
    try:
        return open(name, "rb")  # the caller's with closes it
    except IsADirectoryError:
        raise UsageError(f"{name} is a folder: restore reads one export file") from None


def register(sub: Any) -> None:
    export = sub.add_parser(
        "export",
        help="write one owner's notes, history and links as JSON Lines",
        description="Write the owner's notes (every status), their earlier versions and "
        "their links as JSON Lines (docs/EXPORT.md): a header line, then one record a "
        "line. Read from one snapshot of the database while writers go on. Vectors are not "
        "exported. Progress goes to stderr on a long run.",
    )
    export.add_argument("--owner", metavar="NAME", required=True, help="whose notes")
    export.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write to FILE (moved into place once whole) instead of standard output",
    )
    export.set_defaults(func=cmd_export)

    restore = sub.add_parser(
        "restore",
        help="load an export into an owner that has no notes",
        description="Load a `gleaner export` file into its owner, who must have no notes. "
        "Every line is checked before anything is written (a bad line: exit 1, naming its "
        "number, nothing written); then everything is written in one transaction, with the "
        "search index rebuilt. Restored notes have no vectors: `gleaner embed --backfill` "
        "makes them. An owner that has notes is refused (exit 2).",
    )
    restore.add_argument("file", metavar="FILE", help="the export file; - reads standard input")
    restore.add_argument(
        "--owner",
        metavar="NAME",
        help="the owner to restore into (default: the file's); another owner than the "
        "file's needs --reassign-owner",
    )
    restore.add_argument(
        "--reassign-owner",
        action="store_true",
        help="put the file's notes in --owner's scope, though the file names another owner",
    )
    restore.add_argument("--json", action="store_true", help="print one JSON summary")
    restore.set_defaults(func=cmd_restore)
