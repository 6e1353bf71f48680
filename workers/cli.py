"""The ``gleaner`` command line.

Imports are deferred into each command so ``gleaner search`` never pays for Celery or litellm.
Exit status: 0 success, 1 some input failed, 2 usage or configuration error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from store import Note, Scope, Store

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Raised for a command line that cannot run as given (exit 2)."""


def _store() -> Store:
    from store import Store

    return Store()


def _scope(args: argparse.Namespace) -> Scope:
    from store import Scope

    if args.global_scope:
        return Scope.global_()
    if not args.owner:
        raise UsageError("say whose notes: --owner NAME or --global")
    return Scope.owner(args.owner)


def note_json(note: Note) -> dict[str, Any]:
    data: dict[str, Any] = note.model_dump(mode="json")
    data["scope"] = {"kind": note.scope.kind, "id": note.scope.id}
    return data


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    from store.db import current_revision

    store = _store()
    store.migrate()
    print(f"database at revision {current_revision(store.engine)} ({store.dialect})")
    return EXIT_OK


def cmd_search(args: argparse.Namespace) -> int:
    store = _store()
    hits = store.search(_scope(args), args.query, limit=args.limit)
    if args.json:
        out = [
            {**note_json(h.memory), "score": h.score, "snippet": h.snippet, "backend": h.backend}
            for h in hits
        ]
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    if not hits:
        print("no notes match")
    for hit in hits:
        note = hit.memory
        pin = " [pinned]" if note.pinned else ""
        print(f"{hit.score:6.3f}  {note.slug}{pin}  {note.title}")
        print(f"        {hit.snippet}")
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    store = _store()
    scope = _scope(args)
    found = store.read(scope, args.slug)
    versions = store.history(scope, args.slug) if args.history else []
    if args.json:
        out = note_json(found.memory)
        out["links"] = [{"rel": ln.rel, "slug": ln.note.slug} for ln in found.links]
        out["backlinks"] = [{"rel": ln.rel, "slug": ln.note.slug} for ln in found.backlinks]
        out["superseded_by"] = found.superseded_by
        if args.history:
            out["history"] = [v.model_dump(mode="json") for v in versions]
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return EXIT_OK
    note = found.memory
    print(f"{note.title}  [{note.slug}]")
    print(
        f"type={note.type or '-'} provenance={note.provenance} pinned={note.pinned} "
        f"status={note.status} topics={' '.join(note.topics) or '-'}"
    )
    if found.superseded_by:
        print(f"superseded by: {found.superseded_by}")
    for ln in found.links:
        print(f"-> {ln.rel} {ln.note.slug}")
    for ln in found.backlinks:
        print(f"<- {ln.rel} {ln.note.slug}")
    print()
    print(note.body)
    if args.history:
        _print_history(versions)
    return EXIT_OK


def _print_history(versions: Sequence[Any]) -> None:
    """Earlier versions, newest first: when and why each was replaced, then its text."""
    print()
    if not versions:
        print("history: no earlier version (the text was never changed)")
        return
    print(f"history: {len(versions)} earlier version(s), newest first")
    for version in versions:
        by = version.changed_conversation_id or "-"
        print(
            f"\n-- replaced {version.changed_at:%Y-%m-%d %H:%M:%S} UTC by {version.reason} "
            f"({version.changed_provenance}, conversation {by}); written "
            f"{version.written_at:%Y-%m-%d %H:%M:%S} UTC ({version.written_provenance}, "
            f"conversation {version.written_conversation_id or '-'})"
        )
        print(f"{version.title}")
        print(version.body)


def _progress_bar(total_hint: str) -> tuple[Any, Callable[[int, int], None]]:
    """A rich progress bar on stderr (shown only on a terminal), and its update callback."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    console = Console(stderr=True)
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=console,
        disable=not console.is_terminal,
    )
    task = progress.add_task(total_hint, total=None)

    def update(done: int, total: int) -> None:
        progress.update(task, completed=done, total=total)

    return progress, update


def print_summary(summary: Any, as_json: bool) -> None:
    data = {k: v for k, v in vars(summary).items() if k != "reports"}
    if as_json:
        data["conversations"] = summary.reports
        print(json.dumps(data, ensure_ascii=False, indent=2, default=str))
        return
    print(
        f"transcripts {summary.transcripts} (harvested {summary.harvested}, "
        f"already done {summary.skipped}, failed {summary.failed})"
    )
    print(
        f"notes written {summary.notes_written}, updated {summary.notes_updated}, "
        f"skipped {summary.notes_skipped}, invalid items dropped {summary.items_dropped}"
    )
    print(
        f"model calls {summary.model_calls}, tokens {summary.prompt_tokens} prompt + "
        f"{summary.completion_tokens} completion"
    )
    for report in summary.reports:
        if report["slugs"]:
            print(
                f"  {report['owner']} / {report['conversation_id']}: {', '.join(report['slugs'])}"
            )
    for failure in summary.failures:
        print(f"  FAILED {failure['conversation']}: {failure['error']}", file=sys.stderr)


def cmd_harvest(args: argparse.Namespace) -> int:
    from pathlib import Path

    from harvest.batch import harvest_paths

    paths = [Path(p) for p in args.paths]
    for path in paths:
        if not path.exists():
            raise UsageError(f"no such file or folder: {path}")
    owners = _owner_options(args)
    store = _store()
    progress, update = _progress_bar("harvesting")
    with progress:
        summary = harvest_paths(
            store, paths, provenance=args.provenance, on_progress=update, **owners
        )
    print_summary(summary, args.json)
    return EXIT_FAILED if summary.failed else EXIT_OK


def _settings() -> Any:
    from store import load_settings

    return load_settings()


def _require_broker(command: str) -> Any:
    settings = _settings()
    if not settings.broker_url:
        raise UsageError(
            f"`gleaner {command}` needs a broker: set GLEANER_BROKER_URL "
            "(e.g. redis://127.0.0.1:6379/0), or use `gleaner harvest` to run in process"
        )
    return settings


def _existing(paths: Sequence[str]) -> list[Any]:
    from pathlib import Path

    found = [Path(p) for p in paths]
    for path in found:
        if not path.exists():
            raise UsageError(f"no such file or folder: {path}")
    return found


def cmd_enqueue(args: argparse.Namespace) -> int:
    from harvest.batch import Summary, judge_owners, read_all
    from harvest.queue import LIVE_QUEUE, record_jobs
    from harvest.transcript import Limits
    from workers.app import make_celery
    from workers.enqueue import send_jobs

    settings = _require_broker("enqueue")
    owners = _owner_options(args)
    paths = _existing(args.paths)
    summary = Summary()
    transcripts = judge_owners(
        read_all(paths, summary, limits=Limits.from_settings(settings)),
        args.owner,
        summary,
        reassign_owner=args.reassign_owner,
    )
    make_celery(settings)
    store = _store()
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

    settings = _settings()
    owners = _owner_options(args)
    paths = _existing([args.path])
    if args.dry_run:
        return _dry_run_import(paths, settings, as_json=args.json)
    if not settings.broker_url:
        from harvest.batch import harvest_paths

        store = _store()
        progress, update = _progress_bar("importing")
        with progress:
            summary = harvest_paths(store, paths, provenance="import", on_progress=update, **owners)
        print_summary(summary, args.json)
        return EXIT_FAILED if summary.failed else EXIT_OK

    from harvest.imports import plan_import
    from store import jobs as job_records
    from workers.app import make_celery
    from workers.enqueue import send_jobs

    make_celery(settings)
    store = _store()
    planned = plan_import(store, paths[0], **owners)
    send_jobs(planned.queue, planned.job_ids)
    total = len(planned.job_ids)
    progress, update = _progress_bar(f"import {planned.import_id[:8]}")
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


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.app import QUEUES, make_celery

    settings = _require_broker("worker")
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown:
        raise UsageError(f"unknown queue(s) {', '.join(unknown)}; known: {', '.join(QUEUES)}")
    # Poll in the fixed priority order whatever order was typed.
    ordered = [q for q in QUEUES if q in queues]
    app = make_celery(settings)
    argv = [
        "worker",
        "-Q",
        ",".join(ordered),
        "-c",
        str(args.concurrency),
        "-P",
        args.pool,
        "--loglevel",
        args.loglevel,
        "-n",
        f"gleaner-{'-'.join(ordered)}@%h",
    ]
    app.worker_main(argv)
    return EXIT_OK


def cmd_beat(args: argparse.Namespace) -> int:
    from workers.app import make_celery

    settings = _require_broker("beat")
    app = make_celery(settings)
    app.start(["beat", "--loglevel", args.loglevel, "-s", args.schedule_file])
    return EXIT_OK


def cmd_housekeep(args: argparse.Namespace) -> int:
    store = _store()
    if args.task == "requeue":
        from workers.app import make_celery
        from workers.enqueue import requeue_stale

        settings = _require_broker("housekeep requeue")
        make_celery(settings)
        sent = requeue_stale(store)
        print(json.dumps({"requeued": sent}) if args.json else f"re-enqueued {sent} job(s)")
        return EXIT_OK
    if args.task == "decay":
        data = store.decay(dry_run=args.dry_run).model_dump(mode="json")
    else:
        data = store.dedupe(dry_run=args.dry_run).model_dump(mode="json")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(", ".join(f"{k} {v}" for k, v in data.items() if not isinstance(v, list | dict)))
        for pair in data.get("pairs", [])[:20]:
            print(f"  {pair}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from store import jobs as job_records
    from store import ledger
    from store.models import utcnow

    settings = _settings()
    store = _store()
    lease = timedelta(seconds=settings.job_lease_seconds)
    with store.transaction() as session:
        by_queue = job_records.counts_by_queue(session)
        totals = job_records.counts(session)
        oldest = job_records.oldest_pending(session)
        running = job_records.running(session, lease, limit=args.limit)
        failures = job_records.failures(session, limit=args.limit)
        harvested = ledger.totals(session)
        cost = job_records.cost_by_state(session)
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
        else round((utcnow() - oldest).total_seconds(), 1),
        "failures": failures,
        "harvested": harvested,
        "job_cost": cost,
    }
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return EXIT_OK
    print("queues: " + (", ".join(f"{q} {n}" for q, n in depths.items()) or "no broker"))
    print("jobs: " + ", ".join(f"{state} {n}" for state, n in totals.items()))
    if out["oldest_pending_seconds"] is not None:
        print(f"oldest pending: {out['oldest_pending_seconds']} s")
    for job in running:
        beat = job["heartbeat_age_seconds"]
        print(
            f"  RUNNING {job['id']} on {job['queue']} for {job['running_seconds']} s, "
            + ("no heartbeat" if beat is None else f"last heartbeat {beat} s ago")
            + (" (lease expired: the sweep recovers it)" if job["lease_expired"] else "")
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
    return EXIT_OK


def _queue_depths(broker_url: str) -> dict[str, int | None]:
    """Messages waiting on each queue (Redis list lengths); None when Redis cannot be reached."""
    import redis

    from workers.app import QUEUES

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
    settings = _settings()
    store = _store()
    with store.transaction() as session:
        reset = job_records.reset(session, None if args.all else [args.job_id])
    if not reset:
        print("no failed job to retry" if args.all else f"no failed job {args.job_id}")
        return EXIT_OK if args.all else EXIT_FAILED
    if settings.broker_url:
        from workers.app import make_celery
        from workers.enqueue import send_jobs

        make_celery(settings)
        for job_id, queue in reset:
            send_jobs(queue, [job_id])
        print(f"re-enqueued {len(reset)} job(s)")
        return EXIT_OK
    from harvest.queue import run_job

    failed = 0
    for job_id, _ in reset:
        result = run_job(store, job_id)
        status = (result or {}).get("status", "done")
        failed += status == "failed"
        print(f"{job_id}: {status}")
    return EXIT_FAILED if failed else EXIT_OK


def cmd_forget(args: argparse.Namespace) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            raise UsageError("forget deletes data: pass --yes to confirm")
        answer = input(f"Delete every note, session and job of {args.owner!r}? [y/N] ")
        if answer.strip().lower() not in {"y", "yes"}:
            print("nothing deleted")
            return EXIT_OK
    counts = _store().forget_owner(args.owner, tombstones=not args.allow_reharvest)
    print(", ".join(f"{k} {v}" for k, v in counts.items()) + " deleted")
    return EXIT_OK


def _add_scope_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--owner", metavar="NAME", help="the owner whose notes to use")
    group.add_argument(
        "--global", dest="global_scope", action="store_true", help="use the shared global scope"
    )


def _add_owner_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--owner",
        metavar="NAME",
        help="owner of the conversations that name none (ChatGPT and Claude exports carry "
        "none: then it is required); a conversation that names its owner keeps it",
    )
    parser.add_argument(
        "--reassign-owner",
        action="store_true",
        help="put EVERY conversation in --owner's scope, even one that names another owner",
    )


def _owner_options(args: argparse.Namespace) -> dict[str, Any]:
    """``owner`` and ``reassign_owner`` as the harvest and import functions take them."""
    if args.reassign_owner and not args.owner:
        raise UsageError("--reassign-owner needs --owner NAME: the owner to reassign to")
    return {"owner": args.owner, "reassign_owner": args.reassign_owner}


def _add_harvest_commands(sub: Any) -> None:
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
    _add_owner_flags(harvest)
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
    _add_owner_flags(enqueue)
    enqueue.add_argument("--json", action="store_true", help="print the job ids as JSON")
    enqueue.set_defaults(func=cmd_enqueue)

    imp = sub.add_parser(
        "import",
        help="import an export (ChatGPT, Claude, ...) of old conversations",
        description="With no broker the import runs in process; with GLEANER_BROKER_URL set "
        "each conversation becomes a job on the `import` queue and the command follows the "
        "progress. --dry-run counts conversations, tokens and cost without running anything.",
    )
    imp.add_argument("path", metavar="PATH", help="a file, an export .zip, or a folder")
    _add_owner_flags(imp)
    imp.add_argument("--dry-run", action="store_true", help="estimate only, run nothing")
    imp.add_argument("--no-wait", action="store_true", help="enqueue and return at once")
    imp.add_argument("--json", action="store_true", help="print the summary as JSON")
    imp.set_defaults(func=cmd_import)


def _add_operator_commands(sub: Any) -> None:
    worker = sub.add_parser("worker", help="run a Celery worker (needs a broker)")
    worker.add_argument(
        "--queues",
        default="harvest,housekeeping,import",
        help="comma-separated queues to serve; harvest is always polled first "
        "(default: harvest,housekeeping,import)",
    )
    worker.add_argument("--concurrency", type=int, default=2, help="worker processes/threads")
    worker.add_argument(
        "--pool",
        choices=("prefork", "threads", "solo"),
        default="prefork",
        help="prefork (default) for CPU-bound offline harvests; threads for slow remote models",
    )
    worker.add_argument("--loglevel", default="INFO")
    worker.set_defaults(func=cmd_worker)

    beat = sub.add_parser("beat", help="run Celery beat: decay, dedupe, lost-job sweep")
    beat.add_argument("--loglevel", default="INFO")
    beat.add_argument(
        "--schedule-file", default="celerybeat-schedule", help="where beat keeps its state"
    )
    beat.set_defaults(func=cmd_beat)

    housekeep = sub.add_parser(
        "housekeep",
        help="run decay, dedupe or the lost-job sweep now, in process",
        description="decay: recompute decayed weights (archive below "
        "GLEANER_ARCHIVE_BELOW_WEIGHT); dedupe: supersede near-duplicates; requeue: send "
        "jobs pending longer than GLEANER_REQUEUE_AFTER_SECONDS to their queue again.",
    )
    housekeep.add_argument("task", choices=("decay", "dedupe", "requeue"))
    housekeep.add_argument("--dry-run", action="store_true", help="report, change nothing")
    housekeep.add_argument("--json", action="store_true")
    housekeep.set_defaults(func=cmd_housekeep)

    status = sub.add_parser(
        "status", help="queue depths, jobs by state, oldest pending job, recent failures"
    )
    status.add_argument("--limit", type=int, default=20, help="failures to list")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status)

    retry = sub.add_parser("retry", help="re-run failed jobs (on the queue, or in process)")
    retry.add_argument("job_id", nargs="?", metavar="JOB_ID")
    retry.add_argument("--all", action="store_true", help="every failed job")
    retry.set_defaults(func=cmd_retry)

    forget = sub.add_parser(
        "forget",
        help="delete everything stored for one owner",
        description="Delete the owner's notes (with their history), sessions, ledger, jobs and "
        "imports, and the words they left in the search index. Each harvested conversation "
        "leaves a tombstone (a hash, not its text): harvesting it again writes nothing, and a "
        "harvest still running for the owner writes nothing when it ends.",
    )
    forget.add_argument("--owner", metavar="NAME", required=True)
    forget.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    forget.add_argument(
        "--allow-reharvest",
        action="store_true",
        help="leave no tombstones (and remove earlier ones): the same conversations, "
        "harvested again, come back",
    )
    forget.set_defaults(func=cmd_forget)


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

    db = sub.add_parser("db", help="database schema commands")
    db_sub = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = db_sub.add_parser("upgrade", help="migrate the database to the newest schema")
    upgrade.set_defaults(func=cmd_db_upgrade)

    search = sub.add_parser("search", help="search a scope's notes (lexical, recency-ranked)")
    search.add_argument("query", help="words to look for; any text is safe")
    _add_scope_flags(search)
    search.add_argument("--limit", type=int, default=10, help="most hits to show (1-100)")
    search.add_argument("--json", action="store_true", help="print one JSON list of hits")
    search.set_defaults(func=cmd_search)

    show = sub.add_parser("show", help="show one note with its links")
    show.add_argument("slug")
    _add_scope_flags(show)
    show.add_argument("--json", action="store_true", help="print the note as JSON")
    show.add_argument(
        "--history",
        action="store_true",
        help="also print the note's earlier versions: each text a change replaced, with when, "
        "why (slug_upsert, topic_key_upsert, mem_save_upsert, harvest_same_fact) and which "
        "conversation changed it",
    )
    show.set_defaults(func=cmd_show)
    _add_harvest_commands(sub)
    _add_operator_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
