"""Scenario 2: the live pipeline with a slow model (every answer after 1.0 s).

The work is waiting on the network, so one 2-core host runs `gleaner worker --pool threads`
with many threads; the row reports the sustained rate and what the threads cost in memory
(RSS of the worker processes).
"""

from __future__ import annotations

import time

from bench.core import Context, Row
from bench.pipeline_support import MODEL, cluster, enqueue, model_server, wait_jobs

NAME = "pipe-slow"
DELAY = 1.0
PROCESSES = 2  # one per core: a single process is capped by its GIL at about 1 core
THREADS = 48  # per process; ~96 calls in flight keep >= 50 transcripts/s at 1 s per call
POOL_SIZE = 4  # connections per process (plus as many overflow): DB phases are short


def run(ctx: Context) -> None:
    count = ctx.size(1_500, 400)
    with (
        model_server(ctx, DELAY) as api_base,
        cluster(
            ctx,
            "gleaner_bench_pipe_slow",
            13,
            GLEANER_HARVEST_MODEL=MODEL,
            GLEANER_HARVEST_API_BASE=api_base,
            GLEANER_HARVEST_API_KEY="bench",
            GLEANER_DB_POOL_SIZE=str(POOL_SIZE),
        ) as running,
    ):
        workers = [
            running.start_worker("harvest", THREADS, pool="threads") for _ in range(PROCESSES)
        ]
        idle_rss = sum(w.rss_mb() for w in workers)
        start = time.perf_counter()
        enqueue(running, count)
        peak = [0.0]

        def sample() -> None:
            peak[0] = max(peak[0], sum(w.rss_mb() for w in workers))

        states = wait_jobs(running, count, 600, on_poll=sample)
        seconds = time.perf_counter() - start
        running.stop_workers()
    rate = count / seconds
    ctx.add(
        Row(
            NAME,
            f"transcripts per second (model answers after {DELAY:.1f} s)",
            rate,
            "/s",
            ceiling=PROCESSES * THREADS / DELAY,
            target=">= 50/s",
            met=rate >= 50,
            note=(
                f"{count} transcripts in {seconds:.1f} s, failed {states.get('failed', 0)}; "
                f"{PROCESSES} x `--pool threads --concurrency {THREADS}`, "
                f"GLEANER_DB_POOL_SIZE={POOL_SIZE}; ceiling = calls in flight / delay"
            ),
        )
    )
    ctx.add(
        Row(
            NAME,
            f"worker RSS, {PROCESSES} processes x {THREADS} threads (peak under load)",
            peak[0],
            "MB",
            note=f"idle after start: {idle_rss:.0f} MB",
        )
    )
