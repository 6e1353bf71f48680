"""Shared parts of the live-pipeline benches: model server, worker processes, ceilings.

Everything heavy runs in its own process (model server, `gleaner worker`), started here and
stopped by pid; the bench process only enqueues, polls and times.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from bench.core import PG_ADMIN_URL, Context
from bench.model_server import notes_answer

ROOT = Path(__file__).resolve().parent.parent
MODEL = "openai/bench-model"


# --- processes ---------------------------------------------------------------------------


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self) -> list[int]:
        """This process and its children (prefork pool)."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        )
        return [self.proc.pid, *(int(p) for p in out.stdout.split())]

    def rss_mb(self) -> float:
        total = 0
        for pid in self.pids():
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            except OSError:
                continue
        return total / 1024

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


def wait_until(condition: Callable[[], bool], timeout: float, every: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(every)
    raise TimeoutError(f"condition not met within {timeout} s")


@contextmanager
def model_server(ctx: Context, delay: float = 0.0) -> Iterator[str]:
    """Start bench.model_server in its own process; yields its api_base."""
    log = ctx.workdir / f"model-{time.monotonic_ns()}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.model_server", "--port", "0", "--delay", str(delay)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        start_new_session=True,
    )
    running = Proc(proc, log)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if not line.startswith("listening"):
            raise RuntimeError(f"model server did not start: {line!r} {running.text()}")
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        running.stop()


@dataclass
class Cluster:
    """One bench's environment: PostgreSQL database, Redis database, worker processes."""

    ctx: Context
    database_url: str
    broker_url: str
    env: dict[str, str]
    workers: list[Proc] = field(default_factory=list)

    def start_worker(
        self, queues: str, concurrency: int, pool: str = "prefork", **env: str
    ) -> Proc:
        log = self.ctx.workdir / f"worker-{len(self.workers)}-{time.monotonic_ns()}.log"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gleaner.cli",
                "worker",
                "--queues",
                queues,
                "--concurrency",
                str(concurrency),
                "--pool",
                pool,
                "--loglevel",
                "INFO",  # the production default (one line per task)
            ],
            cwd=ROOT,
            env={**self.env, **env},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        worker = Proc(proc, log)
        self.workers.append(worker)
        wait_until(lambda: proc.poll() is not None or "ready." in worker.text(), 90, 0.2)
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited: {worker.text()[-2000:]}")
        time.sleep(0.5)  # children forked and polling
        return worker

    def stop_workers(self) -> None:
        for worker in self.workers:
            worker.stop()
        self.workers = []

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.broker_url)

    def drained(self, queue: str) -> bool:
        client = self.redis()
        return client.llen(queue) == 0 and client.hlen("unacked") == 0

    def job_counts(self) -> dict[str, int]:
        with psycopg.connect(_libpq(self.database_url), autocommit=True) as conn:
            rows = conn.execute("SELECT state, count(*) FROM jobs GROUP BY state").fetchall()
        return {str(s): int(n) for s, n in rows}


def _libpq(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def cluster(ctx: Context, name: str, redis_db: int, **env: str) -> Iterator[Cluster]:
    """A migrated bench database and a flushed Redis database; both cleaned up after."""
    from gleaner.store import Store
    from gleaner.store.settings import Settings

    url = ctx.fresh_pg(name)
    broker = ctx.redis_url(redis_db)
    store = Store(url, settings=Settings(database_url=url))
    store.migrate()
    store.dispose()
    base = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    running = Cluster(
        ctx,
        url,
        broker,
        {
            **base,
            "GLEANER_DATABASE_URL": url,
            "GLEANER_BROKER_URL": broker,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONPATH": str(ROOT),
            **env,
        },
    )
    running.redis().flushdb()
    try:
        yield running
    finally:
        running.stop_workers()
        running.redis().flushdb()
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# --- workload ----------------------------------------------------------------------------

SMALL_TALK = ("Thanks!", "Could you say more?", "Sure, here is more detail.", "Got it.")


def transcript(i: int, owners: int = 100) -> dict[str, Any]:
    """A native transcript of 8-12 messages holding 2-4 facts unique to ``i``."""
    from tests.samples import user_lines

    facts = 2 + i % 3
    messages = [{"role": "system", "content": "You are helpful."}]
    for line in user_lines(i, facts):
        messages.append({"role": "user", "content": line})
        messages.append({"role": "assistant", "content": "Understood, noted."})
    while len(messages) < 8 + i % 5:
        messages.append(
            {"role": "user" if len(messages) % 2 else "assistant", "content": SMALL_TALK[i % 4]}
        )
    return {
        "conversation_id": f"bench-{i}",
        "owner": f"user{i % owners}",
        "ended_at": "2024-05-01T10:00:00Z",
        "messages": messages,
    }


def enqueue(cluster: Cluster, count: int, queue: str = "harvest") -> float:
    """Record ``count`` jobs and send them (as `gleaner enqueue` does); returns seconds."""
    from gleaner.harvest.queue import record_jobs
    from gleaner.harvest.transcript import Transcript
    from gleaner.store import Store
    from gleaner.store.settings import Settings
    from gleaner.workers.app import make_celery
    from gleaner.workers.enqueue import send_jobs

    settings = Settings(database_url=cluster.database_url, broker_url=cluster.broker_url)
    make_celery(settings)
    store = Store(cluster.database_url, settings=settings)
    items = [Transcript.model_validate(transcript(i)) for i in range(count)]
    start = time.perf_counter()
    for lo in range(0, count, 500):
        ids = record_jobs(
            store, items[lo : lo + 500], owner=None, provenance="compaction", queue=queue
        )
        send_jobs(queue, ids)
    store.dispose()
    return time.perf_counter() - start


# How often wait_jobs reads the jobs table: see there.
MIN_POLL, MAX_POLL = 0.02, 0.5


def wait_jobs(
    cluster: Cluster,
    total: int,
    timeout: float,
    on_poll: Callable[[], None] | None = None,
) -> dict[str, int]:
    """Poll the jobs table until ``total`` jobs are done or failed.

    Each poll scans the jobs table, work the pipeline then shares the CPU with, so polls are
    spaced by half the time the jobs left should take at the rate seen so far (at most 0.5 s,
    at least 20 ms): the last job is seen done within about 20 ms, where a fixed 0.5 s poll
    saw it up to 0.5 s late (a few percent of a pipeline's time, all against it), for a few
    more polls a run.
    """
    start = time.monotonic()
    while True:
        found = cluster.job_counts()
        if on_poll is not None:
            on_poll()
        finished = found.get("done", 0) + found.get("failed", 0)
        if finished >= total:
            return found
        elapsed = time.monotonic() - start
        if elapsed >= timeout:
            raise TimeoutError(f"{total - finished} of {total} jobs not done within {timeout} s")
        left = (total - finished) * elapsed / finished if finished else MAX_POLL
        time.sleep(min(MAX_POLL, max(MIN_POLL, left / 2), timeout - elapsed))


def note_count(cluster: Cluster) -> int:
    with psycopg.connect(_libpq(cluster.database_url), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM memories").fetchone()
    return int(row[0]) if row else 0


# --- profile ------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_by_role() -> dict[str, float]:
    """CPU seconds so far of the processes a pipeline bench runs on, by role.

    Each process counts its reaped children too (``cutime``), so recycled pool children and
    closed PostgreSQL backends are not lost between two readings (a replaced pool child is
    counted with the worker's main process, which reaped it). A worker's main process (the
    Celery consumer: broker, acks, handing tasks to the pool) is told apart from its pool
    children (the tasks): a process of `gleaner worker` whose parent is one too is a child.
    """
    found: dict[str, float] = {}
    workers: dict[int, tuple[int, float]] = {}  # pid -> (parent pid, CPU seconds)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        name, fields = stat.split("(", 1)[1].rsplit(")", 1)[0], stat.rsplit(")", 1)[1].split()
        if name == "postgres" or "postgres" in command.split(" ", 1)[0]:
            role = "PostgreSQL"
        elif name == "redis-server":
            role = "Redis"
        elif "cli" in command:
            workers[int(entry.name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / _TICK)
            continue
        elif "bench.model_server" in command:
            role = "model server"
        elif int(entry.name) == os.getpid():
            role = "bench (enqueue, polling)"
        else:
            continue
        used = sum(int(value) for value in fields[11:15]) / _TICK
        found[role] = found.get(role, 0.0) + used
    for parent, used in workers.values():
        role = "pool children" if parent in workers else "worker main process"
        found[role] = found.get(role, 0.0) + used
    return found


def cpu_note(before: dict[str, float], after: dict[str, float], transcripts: int) -> str:
    """``role X ms`` per transcript, largest first."""
    spent = {role: after.get(role, 0.0) - before.get(role, 0.0) for role in after}
    return ", ".join(
        f"{role} {1000 * seconds / transcripts:.1f} ms"
        for role, seconds in sorted(spent.items(), key=lambda item: -item[1])
        if seconds > 0
    )


CLIENT_PROBE = """
import json, sys, time
from gleaner.harvest.model import resolve_llm, warm_up
from gleaner.harvest.options import ModelOptions
from gleaner.store.settings import Settings

options = ModelOptions.from_settings(Settings(
    harvest_model=sys.argv[1], harvest_api_base=sys.argv[2], harvest_api_key="bench",
    harvest_llm=sys.argv[4]))
warm_up(options.model)
call = resolve_llm(options)
messages = [{"role": "system", "content": "Extract notes. " * 40},
            {"role": "user", "content": "I prefer vim with the kit1 keymap1. " * 12}]
for _ in range(20):
    call(messages, options=options)
calls = int(sys.argv[3])
started = time.process_time()
for _ in range(calls):
    call(messages, options=options)
print(json.dumps({"cpu_ms": 1000 * (time.process_time() - started) / calls}))
"""


def client_cpu_ms(api_base: str, calls: int = 200, client: str = "litellm") -> float:
    """CPU milliseconds per model call through ``client`` (a GLEANER_HARVEST_LLM value) to the
    model server, measured in a fresh process (import and warm-up excluded)."""
    out = subprocess.run(
        [sys.executable, "-c", CLIENT_PROBE, MODEL, api_base, str(calls), client],
        cwd=ROOT,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout.strip().splitlines()[-1])["cpu_ms"])


JOB_PROBE = """
import json, sys, time
from bench.pipeline_support import cpu_by_role, transcript
from gleaner.harvest.queue import record_jobs, run_job
from gleaner.harvest.transcript import Transcript
from gleaner.store import Store
from gleaner.store.settings import Settings

url, api_base, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
settings = Settings(database_url=url, harvest_model=sys.argv[4], harvest_api_base=api_base,
                    harvest_api_key="bench")
store = Store(url, settings=settings)
items = [Transcript.model_validate(transcript(10**6 + i)) for i in range(count + 20)]
ids = record_jobs(store, items, owner=None, provenance="compaction", queue="probe")
for job_id in ids[:20]:  # warm: connections, prepared statements, compiled SQL
    run_job(store, job_id)
before, started = cpu_by_role(), time.process_time()
for job_id in ids[20:]:
    run_job(store, job_id)
spent = time.process_time() - started
database = cpu_by_role().get("PostgreSQL", 0.0) - before.get("PostgreSQL", 0.0)
print(json.dumps({"worker_ms": 1000 * spent / count, "database_ms": 1000 * database / count}))
"""


def job_cpu_ms(database_url: str, api_base: str, count: int) -> tuple[float, float]:
    """CPU milliseconds per job of ``harvest.queue.run_job`` run in one fresh process (the
    work of a pool child, without the broker), and of PostgreSQL serving it."""
    out = subprocess.run(
        [sys.executable, "-c", JOB_PROBE, database_url, api_base, str(count), MODEL],
        cwd=ROOT,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    return float(found["worker_ms"]), float(found["database_ms"])


def raw_http_cpu_ms(api_base: str, calls: int = 200) -> float:
    """CPU milliseconds per raw keep-alive POST of the same request (``http_seconds``' body),
    in this process."""
    started = time.process_time()
    http_seconds(api_base, calls, 1)
    return 1000 * (time.process_time() - started) / calls


# --- ceilings ----------------------------------------------------------------------------


def noop_seconds(cluster: Cluster, count: int, queue: str = "harvest") -> float:
    """Send ``count`` no-op tasks to the running workers; seconds until all were acked."""
    from gleaner.store.settings import Settings
    from gleaner.workers.app import make_celery

    app = make_celery(Settings(database_url=cluster.database_url, broker_url=cluster.broker_url))
    task = app.tasks["gleaner.noop"]
    start = time.perf_counter()
    for _ in range(count):
        task.apply_async(queue=queue)
    wait_until(lambda: cluster.drained(queue), 300, 0.05)
    return time.perf_counter() - start


def http_seconds(api_base: str, count: int, concurrency: int) -> float:
    """``count`` raw chat-completion POSTs over ``concurrency`` keep-alive connections."""
    body = json.dumps(
        {
            "model": "bench-model",
            "messages": [
                {"role": "system", "content": "Extract notes. " * 40},
                {"role": "user", "content": "I prefer vim with the kit1 keymap1. " * 12},
            ],
            "temperature": 0,
            "max_tokens": 2048,
        }
    ).encode()
    host, port = api_base.split("//", 1)[1].split("/", 1)[0].split(":")
    counter = iter(range(count))
    lock = threading.Lock()

    def client() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=30)
        while True:
            with lock:
                if next(counter, None) is None:
                    break
            conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            json.loads(conn.getresponse().read())
        conn.close()

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def insert_seconds(database_url: str, transcripts: int, batch: int = 1_000) -> tuple[float, int]:
    """Raw batched INSERTs of the notes the model server gives ``transcripts`` transcripts,
    into a table shaped like ``memories`` (same text, a full-text index); returns seconds and
    rows."""
    rows = []
    for i in range(transcripts):
        answer = json.loads(notes_answer(json.dumps(transcript(i)).encode()))
        for n, item in enumerate(json.loads(answer["choices"][0]["message"]["content"])["notes"]):
            rows.append(
                (
                    "owner",
                    f"user{i % 100}",
                    f"fact-{i}-{n}",
                    item["title"],
                    item["body"],
                    item["type"],
                    " ".join(item["topics"]),
                    "compaction",
                    item["confidence"],
                )
            )
    with psycopg.connect(_libpq(database_url), autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_notes (id bigserial PRIMARY KEY, scope_kind text,"
            " scope_id text, slug text, title text, body text, type text, topics text,"
            " provenance text, confidence float, created_at timestamptz DEFAULT now(),"
            " UNIQUE (scope_kind, scope_id, slug))"
        )
        conn.execute(
            "CREATE INDEX IF NOT EXISTS bench_notes_fts ON bench_notes USING gin"
            " (to_tsvector('english', title || ' ' || body))"
        )
        start = time.perf_counter()
        with conn.cursor() as cur:
            for lo in range(0, len(rows), batch):
                with conn.transaction():
                    cur.executemany(
                        "INSERT INTO bench_notes (scope_kind, scope_id, slug, title, body, type,"
                        " topics, provenance, confidence) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)",
                        rows[lo : lo + batch],
                    )
        seconds = time.perf_counter() - start
        conn.execute("DROP TABLE bench_notes")
    return seconds, len(rows)
