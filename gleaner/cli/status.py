"""Reading the queue's state: ``status`` (jobs, queues, costs, budgets, one import) and
``imports``; registered by ``cli.operate``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from gleaner.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    CommandFailed,
    UsageError,
    current_settings,
    open_store,
)
from gleaner.store.text import quoted

if TYPE_CHECKING:
    from gleaner.store import Settings


def cmd_status(args: argparse.Namespace) -> int:
    if args.import_id:
        return _import_status(args)
    if args.watch:
        raise UsageError("--watch follows one import: add --import ID")
    settings = current_settings()
    if settings.broker_url:
        from gleaner.workers.health import broker_problem

        problem = broker_problem(settings.broker_url)
        if problem:  # queue depths would be unknown: say so instead of printing None
            print(f"gleaner: {problem}: start Redis or fix GLEANER_BROKER_URL", file=sys.stderr)
            return EXIT_FAILED
    out = _status_report(settings, args.limit)
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return EXIT_OK
    _print_status(out, settings)
    return EXIT_OK


def _status_report(settings: Settings, limit: int) -> dict[str, Any]:
    """What ``gleaner status`` shows, as its --json prints it."""
    from datetime import UTC, datetime, timedelta

    from gleaner.store.jobs import reports as job_reports

    store = open_store()
    lease = timedelta(seconds=settings.job_lease_seconds)
    with store.connection() as conn:  # Core: status loads no ORM
        by_queue = job_reports.counts_by_queue(conn)
        totals = job_reports.counts(conn)
        oldest = job_reports.oldest_pending(conn)
        running = job_reports.running(conn, lease, limit=limit)
        failures = job_reports.failures(conn, limit=limit)
        harvested = job_reports.harvested(conn)
        cost = job_reports.cost_by_state(conn)
        embeddings = _embeddings(conn, settings.embed_model)
        imports = job_reports.recent_imports(conn, limit=limit)
        budgets = _budgets(conn, settings, limit)
    depths: dict[str, int | None] = {}
    if settings.broker_url:
        depths = _queue_depths(settings.broker_url)
    return {
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


def _print_status(out: dict[str, Any], settings: Settings) -> None:
    """``gleaner status`` for a reader: the queues and jobs, then what they cost."""
    depths = out["queue_depths"]
    print("queues: " + (", ".join(f"{q} {n}" for q, n in depths.items()) or "no broker"))
    print("jobs: " + ", ".join(f"{state} {n}" for state, n in out["jobs"].items()))
    if out["oldest_pending_seconds"] is not None:
        print(f"oldest pending: {out['oldest_pending_seconds']} s")
    # With no broker no sweep runs: a lost job waits for `gleaner retry --all`.
    recovers = "the sweep recovers it" if settings.broker_url else "`gleaner retry --all` runs it"
    for job in out["running"]:
        beat = job["heartbeat_age_seconds"]
        print(
            f"  RUNNING {job['id']} on {job['queue']} for {job['running_seconds']} s, "
            + ("no heartbeat" if beat is None else f"last heartbeat {beat} s ago")
            + (f" (lease expired: {recovers})" if job["lease_expired"] else "")
        )
    _print_costs(out)
    for line in _budget_lines(out["budgets"]):
        print(line)
    _print_embeddings(out["embeddings"])


def _print_costs(out: dict[str, Any]) -> None:
    """What the harvests cost, by job state, and the failed jobs with their errors."""
    harvested = out["harvested"]
    print(
        f"harvested transcripts {harvested['transcripts']}, model calls "
        f"{harvested['model_calls']}, tokens {harvested['prompt_tokens']} prompt + "
        f"{harvested['completion_tokens']} completion"
    )
    for state, spent in out["job_cost"].items():
        if spent["model_calls"]:
            print(
                f"{state} jobs cost model calls {spent['model_calls']}, tokens "
                f"{spent['prompt_tokens']} prompt + {spent['completion_tokens']} completion"
            )
    for failure in out["failures"]:
        print(
            f"  FAILED {failure['id']} {failure['owner']}/{failure['conversation_id']} "
            f"(attempts {failure['attempts']}, model calls {failure['model_calls']}, tokens "
            f"{failure['prompt_tokens']} + {failure['completion_tokens']}): {failure['error']}"
        )


def _print_embeddings(embeddings: dict[str, Any]) -> None:
    """Semantic recall's pending notes and the last week's embedding usage."""
    if embeddings["model"]:
        print(f"embeddings ({embeddings['model']}): {embeddings['pending']} note(s) pending")
    for row in embeddings["usage"][:7]:
        dollars = "unknown" if row["cost_usd"] is None else f"${row['cost_usd']:.4f}"
        print(
            f"  {row['day']} {row['model']}: {row['notes']} notes in {row['calls']} call(s), "
            f"{row['tokens']} tokens, cost {dollars}"
        )


def _budgets(conn: Any, settings: Any, limit: int) -> dict[str, Any]:
    """The daily budgets' limits and today's spend, most tokens first."""
    from gleaner.store.jobs import spend

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
    from gleaner.store.jobs import reports as job_reports

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
    from gleaner.store.recall import vectors

    return {
        "model": model,
        "pending": vectors.count_pending(conn, model) if model else None,
        "usage": vectors.usage(conn),
    }


def _import_status(args: argparse.Namespace) -> int:
    """One import's jobs by state and what they wrote; with --watch, followed until every
    job is done or failed. Exit 1 when a job failed or a conversation was unreadable."""
    from gleaner.cli.imports import print_import
    from gleaner.cli.progress import follow_import, import_state
    from gleaner.store.jobs import reports as job_reports

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

    from gleaner.workers.routing import QUEUES

    client = redis.Redis.from_url(broker_url, socket_timeout=2, socket_connect_timeout=2)
    try:
        return {queue: int(client.llen(queue)) for queue in QUEUES}
    except redis.RedisError:
        return dict.fromkeys(QUEUES)
    finally:
        client.close()
