"""Long-running processes and their probe: ``worker``, ``beat`` and ``health``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gleaner.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    ensure_schema,
    open_store,
    require_broker,
)

# Celery's own spellings of the node-name option: when given, the default name stays out.
NODE_NAME_OPTIONS = ("-n", "--hostname")


# A harvest waits on its model call and on PostgreSQL's round trips and commits even when the
# model answers at once: with one child per core a fifth of the CPU stayed idle in `bench`
# (pipe-live), with two per core under a tenth, and the pipeline ran about 15% faster.
CHILDREN_PER_CORE = 2


def default_concurrency() -> int:
    """``gleaner worker``'s default ``--concurrency``: two children (or threads) per core
    this process may run on (a worker pinned by taskset or a cpuset counts its own cores)."""
    if hasattr(os, "sched_getaffinity"):  # Linux; elsewhere every core counts
        return CHILDREN_PER_CORE * len(os.sched_getaffinity(0))
    return CHILDREN_PER_CORE * (os.cpu_count() or 1)


def celery_options(args: argparse.Namespace) -> list[str]:
    """The options gleaner does not know, for Celery unchanged (gleaner's ``--`` dropped)."""
    extra = list(getattr(args, "celery_args", None) or [])
    if "--" in extra:
        extra.remove("--")
    return extra


def names_node(options: list[str]) -> bool:
    """Whether Celery options already name the node (``-n X``, ``-nX``, ``--hostname=X``)."""
    for option in options:
        if option in NODE_NAME_OPTIONS or option.startswith(("--hostname=", "-n")):
            return True
    return False


def default_node_name(queues: list[str]) -> str:
    """``gleaner-<queues>-<pid>@%h``: unique per process on a host, readable in Flower."""
    return f"gleaner-{'-'.join(queues)}-{os.getpid()}@%h"


def cmd_worker(args: argparse.Namespace) -> int:
    from gleaner.workers.app import make_celery
    from gleaner.workers.routing import QUEUES

    settings = require_broker("worker")
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    unknown = sorted(set(queues) - set(QUEUES))
    if unknown:
        raise UsageError(f"unknown queue(s) {', '.join(unknown)}; known: {', '.join(QUEUES)}")
    # Poll in the fixed priority order whatever order was typed.
    ordered = [q for q in QUEUES if q in queues]
    passthrough = celery_options(args)
    store = open_store(create=True)
    ensure_schema(store)  # a worker on an unmigrated PostgreSQL would fail every job: refuse
    if args.metrics_port is not None:
        _serve_metrics(store, settings.broker_url, args.metrics_port, args.metrics_host)
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
    ]
    if not names_node(passthrough):
        argv += ["-n", default_node_name(ordered)]
    # Celery's options come last, so one given twice (-c, -P) takes Celery's value.
    app.worker_main([*argv, *passthrough])
    # Celery's worker_main drops the worker's exit code: the watchdog's is kept for it.
    from gleaner.workers import watchdog

    return watchdog.exit_code or EXIT_OK


def _serve_metrics(store: Any, broker_url: str, port: int, host: str) -> None:
    """Metrics of every pool process: each counts into files of a folder of this run's
    (prometheus_client's multiprocess mode, set before any counter exists), summed here."""
    import atexit
    import shutil
    import tempfile

    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        folder = tempfile.mkdtemp(prefix="gleaner-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = folder
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    from gleaner.workers import metrics

    try:
        metrics.serve(store, broker_url, port, host)
    except OSError as exc:
        raise UsageError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    print(f"gleaner: metrics at http://{host}:{port}/metrics", file=sys.stderr)


def cmd_beat(args: argparse.Namespace) -> int:
    from gleaner.workers.app import make_celery

    settings = require_broker("beat")
    app = make_celery(settings)
    app.start(["beat", "--loglevel", args.loglevel, "-s", args.schedule_file])
    return EXIT_OK


def cmd_health(args: argparse.Namespace) -> int:
    """One line per check, exit 0 when all pass, else 1 (never 2: Docker reserves it)."""
    from gleaner.store import ConfigError, load_settings
    from gleaner.workers.health import (
        Check,
        check_broker,
        check_broker_memory,
        check_database,
        check_workers,
    )

    try:
        settings = load_settings()
    except ConfigError as exc:
        print(Check("settings", False, str(exc)).line())
        return EXIT_FAILED
    checks = [check_database(settings, args.timeout)]
    broker = check_broker(settings, args.timeout)
    checks.append(broker)
    if broker.ok and settings.broker_url:
        checks.append(check_broker_memory(settings, args.timeout))
    if args.worker or args.local_worker:
        if broker.ok:
            checks.append(check_workers(settings, args.worker, args.timeout))
        else:
            checks.append(Check("worker", False, "not pinged: the broker cannot be reached"))
    for check in checks:
        print(check.line(), flush=True)
    return EXIT_OK if all(check.ok for check in checks) else EXIT_FAILED


def register(sub: Any) -> None:
    worker = sub.add_parser(
        "worker",
        help="run a Celery worker (needs a broker)",
        description="Run a Celery worker on the given queues. Any option gleaner does not "
        "know goes to `celery worker` unchanged, after gleaner's own (e.g. -E for task "
        "events, -n NAME, --max-memory-per-child KB); a `--` ends gleaner's options. The "
        "node is named gleaner-<queues>-<pid>@<host> unless -n/--hostname says otherwise.",
        allow_abbrev=False,  # a Celery option must never be read as a prefix of gleaner's
    )
    worker.add_argument(
        "--queues",
        default="harvest,housekeeping,embed,import",
        help="comma-separated queues to serve; housekeeping is polled first, then harvest, "
        "then embed (new notes' vectors, with GLEANER_EMBED_MODEL), then import (default: "
        "harvest,housekeeping,embed,import)",
    )
    concurrency = default_concurrency()
    worker.add_argument(
        "--concurrency",
        type=int,
        default=concurrency,
        help="worker processes (prefork) or threads; default: two per core "
        f"({concurrency} here), since a harvest also waits on its model and database",
    )
    worker.add_argument(
        "--pool",
        choices=("prefork", "threads", "solo"),
        default="prefork",
        help="prefork (default) for CPU-bound offline harvests; threads for slow remote models",
    )
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (jobs by state, queue "
        "depths, model calls, tokens and cost, job durations, lease recoveries, watchdog "
        "exits), summed over the pool's processes",
    )
    worker.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics listen on (default 127.0.0.1: they are every owner's)",
    )
    worker.set_defaults(func=cmd_worker, celery_passthrough=True)

    beat = sub.add_parser("beat", help="run Celery beat: decay, dedupe, lost-job sweep")
    beat.add_argument("--loglevel", default="INFO")
    beat.add_argument(
        "--schedule-file", default="celerybeat-schedule", help="where beat keeps its state"
    )
    beat.set_defaults(func=cmd_beat)

    health = sub.add_parser(
        "health",
        help="check the database, the broker and (optionally) a worker; exit 0 or 1",
        description="For container healthchecks and operators: one line per check. The "
        "database must answer and be migrated; the broker (if GLEANER_BROKER_URL is set) must "
        "answer a PING; with --worker NODE or --local-worker a worker must answer a Celery "
        "ping. Exit 0 when every check passes, 1 otherwise.",
    )
    target = health.add_mutually_exclusive_group()
    target.add_argument(
        "--worker",
        metavar="NODE",
        help="this node must answer a ping (e.g. gleaner-harvest-7@%%h; %%h is this host)",
    )
    target.add_argument(
        "--local-worker",
        action="store_true",
        help="some worker on this host (node name ending in @<hostname>) must answer a ping",
    )
    health.add_argument(
        "--timeout", type=float, default=3.0, help="seconds each check may take (default 3)"
    )
    health.set_defaults(func=cmd_health)
