"""Handing conversations over: ``harvest`` (in process) and ``enqueue`` (to the workers)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from gleaner.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    RECORDING_INTERRUPTED,
    Interrupted,
    UsageError,
    add_owner_flags,
    broker_down,
    ensure_schema,
    existing_paths,
    open_store,
    owner_options,
    print_failures,
    print_summary,
    require_broker,
)
from gleaner.cli.interrupt import stop_between_conversations
from gleaner.cli.progress import Progress


def cmd_harvest(args: argparse.Namespace) -> int:
    paths = inputs(args.paths)
    owners = owner_options(args)
    store = open_store(create=True)
    ensure_schema(store)
    return harvest_here(
        store, paths, owners, provenance=args.provenance, as_json=args.json, command="harvest"
    )


# What an interrupted in-process harvest keeps: each conversation commits on its own.
RUN_AGAIN = (
    "interrupted: the conversations {done} so far are kept; run the same command again to go "
    "on (those already harvested are skipped at no cost)"
)


# What the progress line and the interrupt message call the work, by command.
WORDS = {"harvest": ("harvesting", "harvested"), "import": ("importing", "imported")}


def harvest_here(
    store: Any,
    paths: list[Any],
    owners: dict[str, Any],
    *,
    provenance: str,
    as_json: bool,
    command: str,
) -> int:
    """``gleaner harvest`` and ``gleaner import`` without a broker: every conversation of
    ``paths`` harvested in this process, with a progress line; Ctrl-C stops between two
    conversations (what was harvested is kept) and exits 130."""
    from gleaner.harvest.batch import harvest_paths

    doing, done = WORDS[command]
    try:
        every = store.settings.progress_seconds
        with (
            Progress(doing, every=every, from_zero=True) as progress,
            stop_between_conversations() as stop_if_asked,
        ):

            def update(count: int, total: int) -> None:
                progress.update(count, total)
                stop_if_asked()

            summary = harvest_paths(
                store, paths, provenance=provenance, on_progress=update, **owners
            )
    except KeyboardInterrupt:
        raise Interrupted(RUN_AGAIN.format(done=done)) from None
    print_summary(summary, as_json)
    return EXIT_FAILED if summary.failed else EXIT_OK


def inputs(raw: list[str]) -> list[Any]:
    """The files and folders given, in order; ``-`` is standard input (one transcript file
    of any supported format, read once)."""
    from pathlib import Path

    from gleaner.harvest.readers import STDIN

    if raw.count(STDIN) > 1:
        raise UsageError("standard input (-) can be read only once")
    return [Path(STDIN) if p == STDIN else existing_paths([p])[0] for p in raw]


def cmd_enqueue(args: argparse.Namespace) -> int:
    from gleaner.harvest.batch import Summary, judge_owners, read_all
    from gleaner.harvest.queue import record_settled
    from gleaner.harvest.queues import LIVE_QUEUE
    from gleaner.harvest.transcript import Limits
    from gleaner.workers.app import make_celery
    from gleaner.workers.enqueue import BrokerUnavailable, send_jobs

    settings = require_broker("enqueue")
    owners = owner_options(args)
    paths = inputs(args.paths)
    store = open_store(create=True)
    ensure_schema(store)
    summary = Summary()
    settled = judge_owners(
        read_all(paths, summary, limits=Limits.from_settings(settings)), summary=summary, **owners
    )
    make_celery(settings)
    try:
        job_ids = record_settled(store, settled, provenance="compaction", queue=LIVE_QUEUE)
        sent = send_jobs(LIVE_QUEUE, job_ids)
    except BrokerUnavailable as exc:
        print_failures(summary.failures)
        raise broker_down(exc, len(job_ids)) from None
    except KeyboardInterrupt:
        raise Interrupted(RECORDING_INTERRUPTED) from None
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
        print_failures(summary.failures)
    return EXIT_FAILED if summary.failed else EXIT_OK


PATHS_HELP = "transcript files or folders; - reads one transcript file from standard input"


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
    harvest.add_argument("paths", nargs="+", metavar="PATH", help=PATHS_HELP)
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
    enqueue.add_argument("paths", nargs="+", metavar="PATH", help=PATHS_HELP)
    add_owner_flags(enqueue)
    enqueue.add_argument("--json", action="store_true", help="print the job ids as JSON")
    enqueue.set_defaults(func=cmd_enqueue)
