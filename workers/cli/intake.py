"""Handing conversations over: ``harvest`` (in process) and ``enqueue`` (to the workers)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from workers.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    add_owner_flags,
    existing_paths,
    open_store,
    owner_options,
    print_summary,
    progress_bar,
    require_broker,
)


def cmd_harvest(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harvest.batch import harvest_paths

    paths = [Path(p) for p in args.paths]
    for path in paths:
        if not path.exists():
            raise UsageError(f"no such file or folder: {path}")
    owners = owner_options(args)
    store = open_store()
    progress, update = progress_bar("harvesting")
    with progress:
        summary = harvest_paths(
            store, paths, provenance=args.provenance, on_progress=update, **owners
        )
    print_summary(summary, args.json)
    return EXIT_FAILED if summary.failed else EXIT_OK


def cmd_enqueue(args: argparse.Namespace) -> int:
    from harvest.batch import Summary, judge_owners, read_all
    from harvest.queue import LIVE_QUEUE, record_jobs
    from harvest.transcript import Limits
    from workers.app import make_celery
    from workers.enqueue import send_jobs

    settings = require_broker("enqueue")
    owners = owner_options(args)
    paths = existing_paths(args.paths)
    summary = Summary()
    transcripts = judge_owners(
        read_all(paths, summary, limits=Limits.from_settings(settings)),
        args.owner,
        summary,
        reassign_owner=args.reassign_owner,
    )
    make_celery(settings)
    store = open_store()
    job_ids = record_jobs(store, transcripts, provenance="compaction", queue=LIVE_QUEUE, **owners)
    sent = send_jobs(LIVE_QUEUE, job_ids)
    out = {
        "enqueued": sent,
        "queue": LIVE_QUEUE,
        "job_ids": job_ids,
        "failed": summary.failed,
        "failures": summary.failures,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"enqueued {sent} transcript(s) on queue {LIVE_QUEUE!r}")
        for failure in summary.failures:
            print(f"  FAILED {failure['conversation']}: {failure['error']}", file=sys.stderr)
    return EXIT_FAILED if summary.failed else EXIT_OK


def register(sub: Any) -> None:
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
    add_owner_flags(harvest)
    harvest.add_argument(
        "--provenance",
        choices=("compaction", "import"),
        default="compaction",
        help="compaction for just-ended conversations (default), import for old ones",
    )
    harvest.add_argument("--json", action="store_true", help="print the summary as JSON")
    harvest.set_defaults(func=cmd_harvest)

    enqueue = sub.add_parser(
        "enqueue",
        help="record transcripts as jobs and put them on the harvest queue (needs a broker)",
        description="Read the files, redact them, record one job per conversation in the "
        "database and send its id to the `harvest` queue. Workers do the rest.",
    )
    enqueue.add_argument("paths", nargs="+", metavar="PATH")
    add_owner_flags(enqueue)
    enqueue.add_argument("--json", action="store_true", help="print the job ids as JSON")
    enqueue.set_defaults(func=cmd_enqueue)
