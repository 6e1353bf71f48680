"""``gleaner import``: an export of old conversations, in process or as queued jobs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gleaner.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    RECORDING_INTERRUPTED,
    Interrupted,
    add_owner_flags,
    broker_down,
    current_settings,
    ensure_schema,
    existing_paths,
    open_store,
    owner_options,
    print_failures,
)
from gleaner.cli.intake import harvest_here
from gleaner.cli.progress import follow_import, import_state


def _dry_run_import(paths: list[Any], settings: Any, owners: dict[str, Any], as_json: bool) -> int:
    """Estimate with the real run's checks: the owner rule (exit 2 without --owner when the
    export names none) and the ledger, whose conversations are left out as done."""
    from dataclasses import asdict

    from gleaner.harvest.imports import estimate

    found = estimate(paths, settings, store=_existing_store(settings), **owners)
    if as_json:
        print(json.dumps(asdict(found), indent=2))
        return EXIT_OK
    cost = "unknown" if found.cost_usd is None else f"${found.cost_usd:.4f}"
    print(
        f"{found.conversations} conversation(s) to harvest, {found.messages} messages "
        f"({found.already_harvested} harvested before, {found.unreadable} unreadable, "
        f"{found.too_large} too large)\n"
        f"model {found.model}: ~{found.model_calls} call(s), ~{found.prompt_tokens} "
        f"prompt + ~{found.completion_tokens} completion tokens, cost {cost}\n"
        "nothing was run (dry run)"
    )
    print_failures(found.unreadable_conversations, word="UNREADABLE")
    return EXIT_OK


def _existing_store(settings: Any) -> Any:
    """The store whose ledger a dry run reads; None when there is none yet (a SQLite file
    not created, a schema not migrated: a real run would start from nothing). A dry run
    creates and migrates nothing. On PostgreSQL a missing schema fails as a real run would."""
    from sqlalchemy.engine import make_url

    url = make_url(settings.database_url)
    if url.get_backend_name() == "sqlite":
        from pathlib import Path

        if not url.database or not Path(url.database).exists():
            return None
        store = open_store()
        with store.transaction() as session:
            bind = session.get_bind()
            if not bind.dialect.has_table(session.connection(), "alembic_version"):
                return None
        return store
    store = open_store(create=True)
    ensure_schema(store)
    return store


def cmd_import(args: argparse.Namespace) -> int:
    settings = current_settings()
    owners = owner_options(args)
    paths = existing_paths([args.path])
    if args.dry_run:
        return _dry_run_import(paths, settings, owners, args.json)
    store = open_store(create=True)
    ensure_schema(store)
    if not settings.broker_url:
        if args.no_wait:  # nothing could go on without this process: say so, then do it
            print(
                "gleaner: no broker (GLEANER_BROKER_URL unset): --no-wait has nothing to hand "
                "the import to, so it runs here, in process, until it is done",
                file=sys.stderr,
            )
        return harvest_here(
            store, paths, owners, provenance="import", as_json=args.json, command="import"
        )

    from gleaner.harvest.imports import plan_import
    from gleaner.workers.app import make_celery
    from gleaner.workers.enqueue import BrokerUnavailable, send_jobs

    make_celery(settings)
    try:
        planned = plan_import(store, paths[0], **owners)
        send_jobs(planned.queue, planned.job_ids)
    except BrokerUnavailable as exc:
        print_failures(planned.unreadable, word="UNREADABLE")
        raise broker_down(exc, len(planned.job_ids)) from None
    except KeyboardInterrupt:
        raise Interrupted(RECORDING_INTERRUPTED) from None
    if args.no_wait:
        return _print_import(store, planned.import_id, planned.unreadable, args.json, wait=False)
    follow_import(store, planned.import_id)
    return _print_import(store, planned.import_id, planned.unreadable, args.json, wait=True)


def _print_import(
    store: Any, import_id: str, unreadable: list[dict[str, str]], as_json: bool, *, wait: bool
) -> int:
    """The import's counts and totals; exit 1 when a conversation was unreadable or a job
    failed (a failed job shows only once the jobs finish: not yet with --no-wait)."""
    state, totals = import_state(store, import_id)
    if as_json:
        out = {"transcripts": state["total"], **state, **totals}
        out["unreadable_conversations"] = unreadable
        print(json.dumps(out, indent=2, default=str))
    else:
        print_import(state, totals)
        print_failures(unreadable, word="UNREADABLE")
        if not wait:
            print(
                f"{state['total']} job(s) recorded and queued; follow them with "
                f"`gleaner status --import {import_id} --watch`"
            )
    failed = int(state["failed"]) + len(unreadable)
    return EXIT_FAILED if failed else EXIT_OK


def print_import(state: dict[str, Any], totals: dict[str, int]) -> None:
    """Two lines on an import: its jobs by state, then what the finished ones wrote."""
    print(
        f"import {state['import_id']}: {state['finished']}/{state['total']} finished "
        f"({state['done']} done, {state['failed']} failed, {state['pending']} pending, "
        f"{state['running']} running; {state['unreadable']} conversation(s) unreadable)"
    )
    print(
        f"notes written {totals['notes_written']}, updated {totals['notes_updated']}; "
        f"model calls {totals['model_calls']}, tokens {totals['prompt_tokens']} prompt + "
        f"{totals['completion_tokens']} completion"
    )
    if state["failed"]:
        print("failed jobs: `gleaner status` lists them, `gleaner retry --all` runs them again")


def register(sub: Any) -> None:
    imp = sub.add_parser(
        "import",
        help="import an export (ChatGPT, Claude, ...) of old conversations",
        description="With no broker the import runs in process; with GLEANER_BROKER_URL set "
        "each conversation becomes a job on the `import` queue and the command follows the "
        "progress (a bar on a terminal, else a line every few seconds on stderr; Ctrl-C "
        "stops following, not the import). --dry-run counts conversations, tokens and cost "
        "with the same checks as a run, leaving out conversations harvested before.",
    )
    imp.add_argument("path", metavar="PATH", help="a file, an export .zip, or a folder")
    add_owner_flags(imp)
    imp.add_argument("--dry-run", action="store_true", help="estimate only, run nothing")
    imp.add_argument(
        "--no-wait",
        action="store_true",
        help="return once the jobs are recorded and queued (follow them with `gleaner status "
        "--import ID --watch`); with no broker it says so and imports in process",
    )
    imp.add_argument("--json", action="store_true", help="print the summary as JSON")
    imp.set_defaults(func=cmd_import)
