"""Operating the store: ``housekeep``, ``status``, ``retry``, ``forget``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from store.text import quoted
from workers.cli.common import (
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

    from workers.app import make_celery
    from workers.enqueue import BrokerUnavailable, requeue_stale

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


def cmd_status(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime, timedelta

    from store import job_reports

    if args.import_id:
        return _import_status(args)
    if args.watch:
        raise UsageError("--watch follows one import: add --import ID")
    settings = current_settings()
    if settings.broker_url:
        from workers.health import broker_problem

        problem = broker_problem(settings.broker_url)
        if problem:  # queue depths would be unknown: say so instead of printing None
            print(f"gleaner: {problem}: start Redis or fix GLEANER_BROKER_URL", file=sys.stderr)
            return EXIT_FAILED
    store = open_store()
    lease = timedelta(seconds=settings.job_lease_seconds)
    with store.connection() as conn:  # Core: status loads no ORM
        by_queue = job_reports.counts_by_queue(conn)
        totals = job_reports.counts(conn)
        oldest = job_reports.oldest_pending(conn)
        running = job_reports.running(conn, lease, limit=args.limit)
        failures = job_reports.failures(conn, limit=args.limit)
        harvested = job_reports.harvested(conn)
        cost = job_reports.cost_by_state(conn)
        embeddings = _embeddings(conn, settings.embed_model)
        imports = job_reports.recent_imports(conn, limit=args.limit)
        budgets = _budgets(conn, settings, args.limit)
    depths: dict[str, int | None] = {}
    if settings.broker_url:
        depths = _queue_depths(settings.broker_url)
    out = {
        "broker": bool(settings.broker_url),
        "queue_depths": depths,
        "jobs": totals,
        "jobs_by_queue": by_queue,
        "running": running,
        "oldest_pending_seconds": None
        if oldest is None
        else round((datetime.now(UTC) - oldest).total_seconds(), 1),
        "failures": failures,
        "harvested": harvested,
        "job_cost": cost,
        "embeddings": embeddings,
        "imports": imports,
        "budgets": budgets,
    }
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return EXIT_OK
    print("queues: " + (", ".join(f"{q} {n}" for q, n in depths.items()) or "no broker"))
    print("jobs: " + ", ".join(f"{state} {n}" for state, n in totals.items()))
    if out["oldest_pending_seconds"] is not None:
        print(f"oldest pending: {out['oldest_pending_seconds']} s")
    # With no broker no sweep runs: a lost job waits for `gleaner retry --all`.
    recovers = "the sweep recovers it" if settings.broker_url else "`gleaner retry --all` runs it"
    for job in running:
        beat = job["heartbeat_age_seconds"]
        print(
            f"  RUNNING {job['id']} on {job['queue']} for {job['running_seconds']} s, "
            + ("no heartbeat" if beat is None else f"last heartbeat {beat} s ago")
            + (f" (lease expired: {recovers})" if job["lease_expired"] else "")
        )
    print(
        f"harvested transcripts {harvested['transcripts']}, model calls "
        f"{harvested['model_calls']}, tokens {harvested['prompt_tokens']} prompt + "
        f"{harvested['completion_tokens']} completion"
    )
    for state, spent in cost.items():
        if spent["model_calls"]:
            print(
                f"{state} jobs cost model calls {spent['model_calls']}, tokens "
                f"{spent['prompt_tokens']} prompt + {spent['completion_tokens']} completion"
            )
    for failure in failures:
        print(
            f"  FAILED {failure['id']} {failure['owner']}/{failure['conversation_id']} "
            f"(attempts {failure['attempts']}, model calls {failure['model_calls']}, tokens "
            f"{failure['prompt_tokens']} + {failure['completion_tokens']}): {failure['error']}"
        )
    for line in _budget_lines(budgets):
        print(line)
    if embeddings["model"]:
        print(f"embeddings ({embeddings['model']}): {embeddings['pending']} note(s) pending")
    for row in embeddings["usage"][:7]:
        dollars = "unknown" if row["cost_usd"] is None else f"${row['cost_usd']:.4f}"
        print(
            f"  {row['day']} {row['model']}: {row['notes']} notes in {row['calls']} call(s), "
            f"{row['tokens']} tokens, cost {dollars}"
        )
    return EXIT_OK


def _budgets(conn: Any, settings: Any, limit: int) -> dict[str, Any]:
    """The daily budgets' limits and today's spend, most tokens first."""
    from store import spend

    limits = {
        "owner_tokens_per_day": settings.budget_owner_tokens_per_day,
        "owner_usd_per_day": settings.budget_owner_usd_per_day,
        "import_tokens_per_day": settings.budget_import_tokens_per_day,
        "import_usd_per_day": settings.budget_import_usd_per_day,
    }
    day = spend.today()
    return {"day": day, "limits": limits, "spent_today": spend.of_day(conn, day, limit)}


def _budget_lines(budgets: dict[str, Any]) -> list[str]:
    limits = budgets["limits"]
    lines = []
    for row in budgets["spent_today"]:
        tokens = limits[f"{row['kind']}_tokens_per_day"]
        usd = limits[f"{row['kind']}_usd_per_day"]
        spent = f"{row['tokens']:,}" + (" tokens" if tokens is None else f" of {tokens:,} tokens")
        if usd is not None:
            spent += f", ${row['cost_usd']:.4f} of ${usd:.4f}"
        lines.append(f"  {row['kind']} {row['key']!r}: {spent} in {row['calls']} call(s)")
    if lines:
        lines.insert(0, f"model spend today ({budgets['day']} UTC):")
    return lines


def cmd_imports(args: argparse.Namespace) -> int:
    from store import job_reports

    with open_store().connection() as conn:
        found = job_reports.recent_imports(conn, limit=args.limit)
    if args.json:
        print(json.dumps(found, indent=2))
        return EXIT_OK
    for batch in found:
        jobs = ", ".join(f"{state} {n}" for state, n in batch["jobs"].items() if n)
        print(
            f"{batch['import_id'][:8]}  {batch['created_at'][:16].replace('T', ' ')}  "
            f"{batch['owner']}  {batch['total']} conversation(s)"
            + (f", {batch['unreadable']} unreadable" if batch["unreadable"] else "")
            + f"  [{jobs or 'no jobs'}]  {batch['source']}"
        )
    if not found:
        print("no imports")
    return EXIT_OK


def _embeddings(conn: Any, model: str | None) -> dict[str, Any]:
    """Semantic recall's state: the configured model, its pending notes, usage by day."""
    from store import vectors

    return {
        "model": model,
        "pending": vectors.count_pending(conn, model) if model else None,
        "usage": vectors.usage(conn),
    }


def _import_status(args: argparse.Namespace) -> int:
    """One import's jobs by state and what they wrote; with --watch, followed until every
    job is done or failed. Exit 1 when a job failed or a conversation was unreadable."""
    from store import job_reports
    from workers.cli.imports import print_import
    from workers.cli.progress import follow_import, import_state

    store = open_store()
    with store.transaction() as session:
        found = job_reports.find_import(session, args.import_id)
    if len(found) > 1:
        raise UsageError(
            f"import id {quoted(args.import_id)} names more than one import: give more of it"
        )
    if found:
        args.import_id = found[0]
    state, totals = import_state(store, args.import_id)
    if not state:
        raise CommandFailed(
            f"no import {quoted(args.import_id)}: `gleaner import` prints the id of each import "
            "it starts (`import <id>: ...`)"
        )
    if args.watch and state["finished"] < state["total"]:
        follow_import(store, args.import_id)
        state, totals = import_state(store, args.import_id)
    if args.json:
        print(json.dumps({**state, **totals}, indent=2, default=str))
    else:
        print_import(state, totals)
    return EXIT_FAILED if state["failed"] or state["unreadable"] else EXIT_OK


def _queue_depths(broker_url: str) -> dict[str, int | None]:
    """Messages waiting on each queue (Redis list lengths); None when Redis cannot be reached."""
    import redis

    from workers.routing import QUEUES

    client = redis.Redis.from_url(broker_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        return {queue: int(client.llen(queue)) for queue in QUEUES}
    except redis.RedisError:
        return dict.fromkeys(QUEUES)
    finally:
        client.close()


def cmd_retry(args: argparse.Namespace) -> int:
    from store import jobs as job_records

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
        from workers.app import make_celery
        from workers.enqueue import BrokerUnavailable, send_jobs

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
    from harvest.queue import run_job_here

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

    from store import job_leases

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
    from store.text import check_principal

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
