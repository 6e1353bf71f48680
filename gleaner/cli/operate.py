"""Operating the store: ``housekeep``, ``retry``, ``forget``; and the parsers of ``status``
and ``imports`` (``cli.status``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gleaner.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    JOB_ID,
    CommandFailed,
    UsageError,
    broker_down,
    current_settings,
    open_store,
    require_broker,
)
from gleaner.cli.status import cmd_imports, cmd_status
from gleaner.store.text import quoted


def cmd_housekeep(args: argparse.Namespace) -> int:
    store = open_store()
    if args.task == "requeue":
        return _requeue(store, args)
    if args.task == "decay":
        data = store.decay(dry_run=args.dry_run).model_dump(mode="json")
    else:
        data = store.dedupe(dry_run=args.dry_run).model_dump(mode="json")
    if args.json:
        print(json.dumps(data, indent=2))
        return EXIT_OK
    print(_housekeeping_line(args.task, data))
    for pair in data.get("pairs", [])[:20]:
        print(f"  {pair}")
    return EXIT_OK


def _housekeeping_line(task: str, data: dict[str, Any]) -> str:
    """What a decay or dedupe run did, or with --dry-run would do (it changed nothing)."""
    dry = data["dry_run"]
    took = f"{data['seconds']:.2f} s"
    if task == "decay":
        verbs = ("would update", "would archive") if dry else ("updated", "archived")
        done = f"{verbs[0]} {data['updated']} note weight(s), {verbs[1]} {data['archived']}"
        return f"decay{' (dry run, nothing changed)' if dry else ''}: {done} ({took})"
    if data["locked"]:
        return "dedupe: another dedupe run holds the lock; nothing done"
    verb = "would supersede" if dry else "superseded"
    return (
        f"dedupe{' (dry run, nothing changed)' if dry else ''}: {verb} {data['superseded']} "
        f"note(s); {data['notes_changed']} changed of {data['notes_scanned']} scanned in "
        f"{data['scopes_scanned']} scope(s), {data['candidates_checked']} pair(s) compared, "
        f"{data['skipped']} left for the next run"
        + (
            f", {data['in_flight']} writer(s) still running: looked at again next run"
            if data.get("in_flight")
            else ""
        )
        + f" ({took})"
    )


def _requeue(store: Any, args: argparse.Namespace) -> int:
    from datetime import timedelta

    from gleaner.workers.app import make_celery
    from gleaner.workers.enqueue import BrokerUnavailable, requeue_stale

    if args.dry_run:
        raise UsageError("requeue has no --dry-run: it only sends what is lost")
    settings = require_broker("housekeep requeue")
    make_celery(settings)
    try:
        sent = requeue_stale(store, older_than=timedelta(seconds=args.older_than))
    except BrokerUnavailable as exc:
        raise CommandFailed(
            f"{exc.reason}: {exc}; the jobs stay pending: run this again once the broker is up"
        ) from None
    print(json.dumps({"requeued": sent}) if args.json else f"re-enqueued {sent} job(s)")
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    from gleaner.store.jobs import queue as job_records

    if not args.all and not args.job_id:
        raise UsageError("say which failed job to re-run: JOB_ID or --all")
    settings = current_settings()
    store = open_store()
    ids = None if args.all else [args.job_id]
    with store.transaction() as session:
        stranded = [] if settings.broker_url else _stranded(session, settings, ids)
        reset = stranded + job_records.reset(session, ids)
    if not reset:
        what = "failed job" if settings.broker_url else "failed or stranded job"
        print(f"no {what} to retry" if args.all else f"no {what} {args.job_id}")
        return EXIT_OK if args.all else EXIT_FAILED
    if settings.broker_url:
        from gleaner.workers.app import make_celery
        from gleaner.workers.enqueue import BrokerUnavailable, send_jobs

        make_celery(settings)
        by_queue: dict[str, list[str]] = {}
        for job_id, queue in reset:
            by_queue.setdefault(queue, []).append(job_id)
        try:
            for queue, ids in by_queue.items():
                send_jobs(queue, ids)
        except BrokerUnavailable as exc:
            raise broker_down(exc, len(reset), "reset to pending") from None
        print(f"re-enqueued {len(reset)} job(s)")
        return EXIT_OK
    from gleaner.harvest.queue import run_job_here

    failed = 0
    for job_id, _ in reset:
        result = run_job_here(store, job_id)
        status = (result or {}).get("status", "done")
        failed += status == "failed"
        print(f"{job_id}: {status}")
    return EXIT_FAILED if failed else EXIT_OK


def _stranded(session: Any, settings: Any, ids: list[str] | None) -> list[tuple[str, str]]:
    """With no broker no sweep runs, and a job whose process died is only ever run again by
    ``retry``: running with its lease run out (killed mid-run: back to pending, a crash
    counted, or failed ``worker_lost`` at GLEANER_JOB_MAX_CRASHES, which ``reset`` then takes),
    or pending since longer than GLEANER_REQUEUE_AFTER_SECONDS (killed before it ran it).
    A job another live process runs keeps its lease fresh and is left to it."""
    from datetime import timedelta

    from gleaner.store.jobs import leases as job_leases

    lease = timedelta(seconds=settings.job_lease_seconds)
    lost = job_leases.recover_lost(session, lease, settings.job_max_crashes, job_ids=ids)
    waiting = timedelta(seconds=settings.requeue_after_seconds)
    return lost.requeued + job_leases.unsent(session, waiting, ids)


def cmd_forget(args: argparse.Namespace) -> int:
    if args.owner is None:
        if args.conversation is not None:
            raise UsageError("--conversation ID needs --owner NAME: whose conversation it is")
        raise UsageError("say whose data: --owner NAME")
    if args.conversation is not None:
        return _forget_conversation(args)
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("forget deletes data: pass --yes to confirm")
        answer = input(f"Delete every note, session and job of {args.owner!r}? [y/N] ")
        if answer.strip().lower() not in {"y", "yes"}:
            print("nothing deleted")
            return EXIT_OK
    counts = open_store().forget_owner(args.owner, tombstones=not args.allow_reharvest)
    if args.json:
        print(json.dumps({"owner": _stored_owner(args.owner), "deleted": counts}, indent=2))
        return EXIT_OK
    print(", ".join(f"{k} {v}" for k, v in counts.items()) + " deleted")
    return EXIT_OK


def _forget_conversation(args: argparse.Namespace) -> int:
    """``forget --owner NAME --conversation ID``: one conversation, and a receipt of what
    was done. No confirmation: it touches that conversation alone, and says what it did."""
    if args.allow_reharvest:
        raise UsageError(
            "--allow-reharvest is for forgetting an owner; a forgotten conversation's "
            "transcripts always leave tombstones"
        )
    owner = _stored_owner(args.owner)
    counts = open_store().forget_conversation(owner, args.conversation)
    if args.json:
        receipt = {"owner": owner, "conversation_id": args.conversation, "counts": counts}
        print(json.dumps(receipt, indent=2))
        return EXIT_OK
    print(f"conversation {quoted(args.conversation)} of {quoted(owner)} forgotten:")
    width = max(len(name) for name in counts)
    for name, n in counts.items():
        print(f"  {name:<{width}}  {n}")
    return EXIT_OK


def _stored_owner(owner: str) -> str:
    """The owner as stored (the owner rule); a bad one is a usage error (exit 2)."""
    from gleaner.store.text import check_principal

    return check_principal(owner)


def register(sub: Any) -> None:
    housekeep = sub.add_parser(
        "housekeep",
        help="run decay, dedupe or the lost-job sweep now, in process",
        description="decay: recompute decayed weights (archive below "
        "GLEANER_ARCHIVE_BELOW_WEIGHT); dedupe: supersede near-duplicates; requeue: the "
        "lost-job sweep, now: recover jobs whose worker was lost and send every pending job "
        "whose message does not wait on its queue (beat's sweep waits "
        "GLEANER_REQUEUE_AFTER_SECONDS after a job was sent; this does not, unless told "
        "--older-than).",
    )
    housekeep.add_argument("task", choices=("decay", "dedupe", "requeue"))
    housekeep.add_argument("--dry-run", action="store_true", help="report, change nothing")
    housekeep.add_argument(
        "--older-than",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="requeue: only pending jobs last sent at least this long ago (default 0)",
    )
    housekeep.add_argument("--json", action="store_true")
    housekeep.set_defaults(func=cmd_housekeep)

    status = sub.add_parser(
        "status", help="queue depths, jobs by state, oldest pending job, recent failures"
    )
    status.add_argument("--limit", type=int, default=20, help="failures to list")
    status.add_argument(
        "--import",
        dest="import_id",
        metavar="ID",
        help="only this import: its jobs by state, notes written, model calls and tokens",
    )
    status.add_argument(
        "--watch",
        action="store_true",
        help="with --import: follow it until every job is done or failed (a bar on a "
        "terminal, else a line every few seconds on stderr)",
    )
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    imports = sub.add_parser(
        "imports",
        help="list the imports, newest first, with their jobs by state",
        description="The newest imports first: id (its first 8 characters; `gleaner status "
        "--import ID` follows one), when, owner, conversations, jobs by state and the source.",
    )
    imports.add_argument("--limit", type=int, default=20, help="imports to list")
    imports.add_argument("--json", action="store_true")
    imports.set_defaults(func=cmd_imports)

    retry = sub.add_parser(
        "retry",
        help="re-run failed jobs (on the queue, or in process)",
        description="Put failed jobs back to pending and send them to their queue, or, with no "
        "broker, run them in process. With no broker it also runs the jobs a dead process left "
        "stranded (no sweep runs there): running with their lease run out "
        "(GLEANER_JOB_LEASE_SECONDS), or pending for longer than "
        "GLEANER_REQUEUE_AFTER_SECONDS.",
    )
    retry.add_argument("job_id", nargs="?", metavar="JOB_ID", type=JOB_ID)
    retry.add_argument(
        "--all", action="store_true", help="every failed job (and, with no broker, stranded one)"
    )
    retry.set_defaults(func=cmd_retry)

    forget = sub.add_parser(
        "forget",
        help="delete everything stored for one owner, or one conversation of theirs",
        description="Delete the owner's notes (with their history), sessions, ledger, jobs and "
        "imports, and the words they left in the search index. Each harvested conversation "
        "leaves a tombstone (a hash, not its text): harvesting it again writes nothing, and a "
        "harvest still running for the owner writes nothing when it ends. With --conversation "
        "ID, only that conversation of the owner: the notes only it supports are deleted, a "
        "note it changed gets back the text before it, its history entries, jobs and ledger "
        "rows go, its transcripts leave tombstones, and the counts of what was done are "
        "printed (no confirmation asked); exit 1 when nothing of the owner names it.",
    )
    forget.add_argument("--owner", metavar="NAME", help="whose data (required)")
    forget.add_argument(
        "--conversation",
        metavar="ID",
        help="forget only this conversation of the owner (its id as stored)",
    )
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    forget.add_argument(
        "--allow-reharvest",
        action="store_true",
        help="leave no tombstones (and remove earlier ones): the same conversations, "
        "harvested again, come back (an owner's forget only)",
    )
    forget.add_argument("--json", action="store_true", help="print the counts as JSON")
    forget.set_defaults(func=cmd_forget)
