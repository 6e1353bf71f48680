"""Scenario 9, start-up and memory: the read commands start light (no ORM, migrations,
PostgreSQL dialect, harvester, model client or broker on SQLite), and worker children stay
bounded by recycling."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.core import Context, Row
from bench.data import drop_pg
from tests.test_startup_imports import NEVER_LOADED

NAME = "startup"
EXAMPLES = Path(__file__).parent.parent / "examples"
# The read commands issue 13 holds to <= 0.5 s, each on the notes of README's main job.
READ_COMMANDS = {
    "search": ["search", "postgres", "--owner", "alice"],
    "status": ["status"],
    "index": ["index", "--owner", "alice"],
    "notes list": ["notes", "list", "--owner", "alice"],
}
TARGET_SECONDS = 0.5
PROBE = (
    "import json, sys; from gleaner.cli import main; never = json.loads(sys.argv[1]); "
    "code = main(sys.argv[2:]); print(json.dumps(sorted(m for m in sys.modules "
    "if any(m == n or m.startswith(n + '.') for n in never))))"
)


def _wall(argv: list[str], env: dict[str, str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    return {**base, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **extra}


def read_startup(ctx: Context) -> None:
    """Each read command's wall time against a bare interpreter's, and what it imported of
    what it does not use (tests/test_startup_imports.py holds the same list to none)."""
    db = ctx.workdir / "startup.db"
    env = _env(GLEANER_DATABASE_URL=f"sqlite:///{db}")
    gleaner = [sys.executable, "-m", "gleaner.cli"]
    subprocess.run([*gleaner, "db", "upgrade"], env=env, check=True, capture_output=True)
    subprocess.run(
        [*gleaner, "harvest", str(EXAMPLES), "--owner", "alice"],
        env=env,
        check=True,
        capture_output=True,
    )
    runs = 3 if ctx.quick else 7
    bare = _wall([sys.executable, "-c", "pass"], env, runs)
    for command, argv in READ_COMMANDS.items():
        wall = _wall([*gleaner, *argv], env, runs)
        ctx.add(
            Row(
                NAME,
                f"`gleaner {command}` on SQLite, wall (median)",
                wall,
                "s",
                ceiling=bare,
                target=f"<= {TARGET_SECONDS} s",
                met=wall <= TARGET_SECONDS,
                note=f"ceiling = bare `python -c pass` ({bare * 1000:.0f} ms)",
            )
        )
    for command, argv in READ_COMMANDS.items():
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, json.dumps(NEVER_LOADED), *argv],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        loaded = json.loads(probe.stdout.strip().splitlines()[-1])
        ctx.add(
            Row(
                NAME,
                f"`gleaner {command}` imports unused modules",
                float(len(loaded)),
                "modules",
                target="0",
                met=not loaded,
                note=f"of {', '.join(NEVER_LOADED)}: "
                + (", ".join(loaded) if loaded else "none imported"),
            )
        )


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def worker_memory(ctx: Context) -> None:
    from gleaner.harvest.queue import record_jobs
    from gleaner.harvest.queues import LIVE_QUEUE
    from gleaner.harvest.transcript import Transcript
    from gleaner.store import Store
    from gleaner.workers.app import make_celery
    from gleaner.workers.enqueue import send_jobs
    from tests.conftest import test_settings
    from tests.llm_server import LLMServer, answer, note
    from tests.samples import native
    from tests.workers_harness import Cluster, cluster_env, wait_for

    count = ctx.size(1_000, 120)
    recycle = ctx.size(250, 40)
    url = ctx.fresh_pg("gleaner_bench_startup")  # dropped at the end
    store = Store(url, settings=test_settings())
    store.migrate()
    with LLMServer(answer([note("Prefers vim"), note("Uses PostgreSQL")])) as model:
        env = cluster_env(
            url,
            13,
            GLEANER_HARVEST_MODEL="openai/bench",
            GLEANER_HARVEST_API_BASE=model.api_base,
            GLEANER_HARVEST_API_KEY="k",
            GLEANER_WORKER_MAX_TASKS_PER_CHILD=str(recycle),
        )
        cluster = Cluster(env, ctx.workdir)
        cluster.redis().flushdb()
        make_celery(test_settings(broker_url=env["GLEANER_BROKER_URL"]))
        transcripts = [Transcript.model_validate(native(i, facts=2)) for i in range(count)]
        ids = record_jobs(
            store, transcripts, owner="alice", provenance="compaction", queue=LIVE_QUEUE
        )
        worker = cluster.start_worker(queues="harvest", concurrency=1)
        send_jobs(LIVE_QUEUE, ids)
        peaks: dict[int, int] = {}

        def finished() -> bool:
            for child in worker.children():
                peaks[child] = max(peaks.get(child, 0), _rss_kb(child))
            with store.transaction() as session:
                from sqlalchemy import func, select

                from gleaner.store.schema.models import Job

                done = session.execute(
                    select(func.count()).select_from(Job).where(Job.state == "done")
                ).scalar_one()
            return int(done) >= count

        try:
            wait_for(finished, 600, every=0.1)
        finally:
            cluster.stop()
            cluster.redis().flushdb()
    store.dispose()
    drop_pg("gleaner_bench_startup")
    peak = max(peaks.values()) / 1024
    ctx.add(
        Row(
            NAME,
            f"worker child peak RSS over {count} harvests (the model path)",
            peak,
            "MB",
            note=f"{len(peaks)} children seen: recycled every {recycle} tasks "
            f"(GLEANER_WORKER_MAX_TASKS_PER_CHILD); per-child peaks MB: "
            + ", ".join(f"{v / 1024:.0f}" for v in peaks.values()),
        )
    )
    ctx.add(
        Row(
            NAME,
            "worker children used (recycling bound)",
            len(peaks),
            "",
            target=f">= {count // recycle}",
            met=len(peaks) >= count // recycle,
        )
    )


def run(ctx: Context) -> None:
    read_startup(ctx)
    worker_memory(ctx)
