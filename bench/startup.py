"""Scenario 9, start-up and memory: commands that never call the model stay light, and worker
children stay bounded by recycling."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.core import Context, Row
from bench.data import drop_pg

NAME = "startup"
EXAMPLES = Path(__file__).parent.parent / "examples"
PROBE = (
    "import sys; from workers.cli import main; code = main(sys.argv[1:]); "
    "print('LOADED', 'litellm' in sys.modules, 'celery' in sys.modules)"
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


def search_startup(ctx: Context) -> None:
    db = ctx.workdir / "startup.db"
    env = _env(GLEANER_DATABASE_URL=f"sqlite:///{db}")
    gleaner = [sys.executable, "-m", "workers.cli"]
    subprocess.run([*gleaner, "db", "upgrade"], env=env, check=True, capture_output=True)
    subprocess.run(
        [*gleaner, "harvest", str(EXAMPLES), "--owner", "alice"],
        env=env,
        check=True,
        capture_output=True,
    )
    runs = 3 if ctx.quick else 7
    bare = _wall([sys.executable, "-c", "pass"], env, runs)
    search = _wall([*gleaner, "search", "postgres", "--owner", "alice"], env, runs)
    ctx.add(
        Row(
            NAME,
            "`gleaner search` on SQLite, wall (median)",
            search,
            "s",
            ceiling=bare,
            target="<= 0.5 s",
            met=search <= 0.5,
            note=f"ceiling = bare `python -c pass` ({bare * 1000:.0f} ms)",
        )
    )
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, "search", "postgres", "--owner", "alice"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = probe.stdout.strip().splitlines()[-1].split()
    ctx.add(
        Row(
            NAME,
            "`gleaner search` imports litellm / celery",
            float(loaded[1] == "True"),
            "bool",
            target="0",
            met=loaded[1] == "False" and loaded[2] == "False",
            note=f"litellm imported: {loaded[1]}, celery imported: {loaded[2]}",
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
    from harvest.queue import record_jobs
    from harvest.queues import LIVE_QUEUE
    from harvest.transcript import Transcript
    from store import Store
    from tests.conftest import test_settings
    from tests.llm_server import LLMServer, answer, note
    from tests.samples import native
    from tests.workers_harness import Cluster, cluster_env, wait_for
    from workers.app import make_celery
    from workers.enqueue import send_jobs

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

                from store.models import Job

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
    search_startup(ctx)
    worker_memory(ctx)
