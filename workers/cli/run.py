"""Long-running processes: ``worker`` and ``beat``."""

from __future__ import annotations

import argparse
from typing import Any

from workers.cli.common import EXIT_OK, UsageError, require_broker


def cmd_worker(args: argparse.Namespace) -> int:
    from workers.app import QUEUES, make_celery

    settings = require_broker("worker")
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

    settings = require_broker("beat")
    app = make_celery(settings)
    app.start(["beat", "--loglevel", args.loglevel, "-s", args.schedule_file])
    return EXIT_OK


def register(sub: Any) -> None:
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
