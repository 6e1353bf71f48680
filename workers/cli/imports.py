"""``gleaner import``: an export of old conversations, in process or as queued jobs."""

from __future__ import annotations

import argparse
import json
from typing import Any

from workers.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    add_owner_flags,
    current_settings,
    existing_paths,
    open_store,
    owner_options,
    print_summary,
    progress_bar,
)


def _dry_run_import(paths: list[Any], settings: Any, *, as_json: bool) -> int:
    from dataclasses import asdict

    from harvest.imports import estimate

    found = estimate(paths, settings)
    if as_json:
        print(json.dumps(asdict(found), indent=2))
    else:
        cost = "unknown" if found.cost_usd is None else f"${found.cost_usd:.4f}"
        print(
            f"{found.conversations} conversation(s), {found.messages} messages, "
            f"{found.unreadable} unreadable, {found.too_large} too large\n"
            f"model {found.model}: ~{found.model_calls} call(s), ~{found.prompt_tokens} "
            f"prompt + ~{found.completion_tokens} completion tokens, cost {cost}\n"
            "nothing was run (dry run)"
        )
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    import time

    settings = current_settings()
    owners = owner_options(args)
    paths = existing_paths([args.path])
    if args.dry_run:
        return _dry_run_import(paths, settings, as_json=args.json)
    if not settings.broker_url:
        from harvest.batch import harvest_paths

        store = open_store()
        progress, update = progress_bar("importing")
        with progress:
            summary = harvest_paths(store, paths, provenance="import", on_progress=update, **owners)
        print_summary(summary, args.json)
        return EXIT_FAILED if summary.failed else EXIT_OK

    from harvest.imports import plan_import
    from store import jobs as job_records
    from workers.app import make_celery
    from workers.enqueue import send_jobs

    make_celery(settings)
    store = open_store()
    planned = plan_import(store, paths[0], **owners)
    send_jobs(planned.queue, planned.job_ids)
    total = len(planned.job_ids)
    progress, update = progress_bar(f"import {planned.import_id[:8]}")
    state: dict[str, Any] = {}
    with progress:
        while not args.no_wait:
            with store.transaction() as session:
                state = job_records.import_progress(session, planned.import_id)
            update(int(state["finished"]), total)
            if state["finished"] >= total:
                break
            time.sleep(0.5)
    with store.transaction() as session:
        state = job_records.import_progress(session, planned.import_id)
        totals = job_records.import_totals(session, planned.import_id)
    out = {
        "transcripts": state["total"],
        **state,
        **totals,
        "unreadable_conversations": planned.unreadable,
    }
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        print(
            f"import {planned.import_id}: {state['finished']}/{state['total']} finished "
            f"({state['done']} done, {state['failed']} failed, {state['pending']} pending, "
            f"{state['running']} running)"
        )
        print(
            f"notes written {totals['notes_written']}, updated {totals['notes_updated']}; "
            f"model calls {totals['model_calls']}"
        )
        if args.no_wait:
            print("follow it with `gleaner status`")
    failed = state["failed"] + len(planned.unreadable)
    return EXIT_FAILED if failed else EXIT_OK


def register(sub: Any) -> None:
    imp = sub.add_parser(
        "import",
        help="import an export (ChatGPT, Claude, ...) of old conversations",
        description="With no broker the import runs in process; with GLEANER_BROKER_URL set "
        "each conversation becomes a job on the `import` queue and the command follows the "
        "progress. --dry-run counts conversations, tokens and cost without running anything.",
    )
    imp.add_argument("path", metavar="PATH", help="a file, an export .zip, or a folder")
    add_owner_flags(imp)
    imp.add_argument("--dry-run", action="store_true", help="estimate only, run nothing")
    imp.add_argument("--no-wait", action="store_true", help="enqueue and return at once")
    imp.add_argument("--json", action="store_true", help="print the summary as JSON")
    imp.set_defaults(func=cmd_import)
