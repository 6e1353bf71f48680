"""Scenario: the HTTP service (`gleaner serve`) against a raw ASGI handler on the same work.

Two uvicorn processes on the same PostgreSQL database and Redis broker, one at a time:
`gleaner serve` (FastAPI over the public Python API) and a bare Starlette app (``raw_app``)
that does the same database work by hand with raw SQL: look up the API key's hash, then for
a conversation INSERT one pending job row with the posted JSON and LPUSH one message to the
``harvest`` queue; for a search, one query summing the owner's postings of the query's
terms (the search index Store.search reads, without its BM25 and bounds; LIMIT 10).
Measured: conversations accepted (202) per second, 8 clients posting at once, and the p99
latency of a search request, one client, in a scope of n/10 notes. Each is reported as a
ratio to the raw handler's figure.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench import data
from bench.core import Context, Row, percentile
from bench.pipeline_support import transcript

NAME = "http-intake"
CLIENTS = 8
REDIS_DB = 13
WARM_UP = 30
RAW_SEARCH = """
    SELECT m.id, m.slug, m.title, m.body, m.topics, s.rank
    FROM (
        SELECT memory_id, sum(weight) AS rank FROM search_postings
        WHERE scope_kind = 'owner' AND scope_id = :owner AND term = ANY(:terms)
        GROUP BY memory_id ORDER BY rank DESC LIMIT :limit
    ) s JOIN memories m ON m.id = s.memory_id
    WHERE m.status = 'live'
    ORDER BY s.rank DESC
"""
RAW_JOB = """
    INSERT INTO jobs (id, queue, state, owner, provenance, conversation_id, transcript,
                      transcript_hash, attempts, created_at, enqueued_at)
    VALUES (:id, 'harvest', 'pending', :owner, 'compaction', :conversation_id,
            CAST(:transcript AS json), :digest, 0, now(), now())
"""


def raw_app() -> Any:
    """The ceiling: a bare Starlette app doing the service's database work in raw SQL
    (``uvicorn --factory bench.http_intake:raw_app``; GLEANER_DATABASE_URL, GLEANER_BROKER_URL)."""
    import redis
    from sqlalchemy import create_engine, text
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from gleaner.store.recall.search_terms import query_terms

    engine = create_engine(os.environ["GLEANER_DATABASE_URL"], pool_size=5, max_overflow=5)
    broker = redis.Redis.from_url(os.environ["GLEANER_BROKER_URL"])
    key_sql, job_sql, search_sql = (
        text("SELECT owner FROM api_keys WHERE token_hash = :h"),
        text(RAW_JOB),
        text(RAW_SEARCH),
    )

    def key_ok(conn: Any, request: Request) -> bool:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        digest = hashlib.sha256(token.encode()).hexdigest()
        return conn.execute(key_sql, {"h": digest}).first() is not None

    def accept(request: Request, body: bytes) -> JSONResponse:
        doc = json.loads(body)
        job_id = uuid.uuid4().hex
        with engine.begin() as conn:
            if not key_ok(conn, request):
                return JSONResponse({"error": "unknown key"}, status_code=401)
            conn.execute(
                job_sql,
                {
                    "id": job_id,
                    "owner": doc["owner"],
                    "conversation_id": doc["conversation_id"],
                    "transcript": body.decode(),
                    "digest": hashlib.sha256(body).hexdigest(),
                },
            )
        broker.lpush("harvest", json.dumps({"task": "gleaner.harvest", "args": [job_id]}))
        return JSONResponse({"job_id": job_id}, status_code=202)

    def search(request: Request, owner: str) -> JSONResponse:
        with engine.begin() as conn:
            if not key_ok(conn, request):
                return JSONResponse({"error": "unknown key"}, status_code=401)
            terms = query_terms(request.query_params["q"])
            rows = conn.execute(
                search_sql, {"terms": terms, "owner": owner, "limit": 10}
            ).mappings()
            return JSONResponse({"hits": [dict(row) for row in rows]})

    async def post_conversation(request: Request) -> JSONResponse:
        body = await request.body()
        return await run_in_threadpool(accept, request, body)

    async def get_search(request: Request) -> JSONResponse:
        return await run_in_threadpool(search, request, request.path_params["owner"])

    return Starlette(
        routes=[
            Route("/v1/conversations", post_conversation, methods=["POST"]),
            Route("/v1/owners/{owner}/search", get_search),
        ]
    )


def _start(args: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    from tests.service_harness import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", *args, "--port", str(port)],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parent.parent,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{args} exited: {log.read_text(errors='replace')}")
        try:
            httpx.get(url + "/openapi.json", timeout=1)
        except httpx.TransportError:
            time.sleep(0.1)
        else:
            return proc, url
    proc.kill()
    raise TimeoutError(f"{args} did not answer")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _post_rate(url: str, headers: dict[str, str], bodies: list[bytes]) -> float:
    """Conversations accepted per second, CLIENTS posting at once on kept-alive connections."""
    share = [bodies[i::CLIENTS] for i in range(CLIENTS)]

    def client(mine: list[bytes]) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            for body in mine:
                response = http.post("/v1/conversations", content=body)
                if response.status_code != 202:
                    raise RuntimeError(f"{response.status_code}: {response.text[:200]}")

    started = time.perf_counter()
    with ThreadPoolExecutor(CLIENTS) as pool:
        list(pool.map(client, share))
    return len(bodies) / (time.perf_counter() - started)


def _search_p99(url: str, headers: dict[str, str], owner: str, queries: list[str]) -> float:
    """p99 of one client's search requests, in milliseconds (after a warm-up)."""
    seconds = []
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        for n, query in enumerate([*queries[:WARM_UP], *queries]):
            start = time.perf_counter()
            response = http.get(f"/v1/owners/{owner}/search", params={"q": query, "limit": 10})
            elapsed = time.perf_counter() - start
            if response.status_code != 200:
                raise RuntimeError(f"{response.status_code}: {response.text[:200]}")
            if n >= WARM_UP:
                seconds.append(elapsed)
    return 1000 * percentile(seconds, 99)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds the process has used (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(
    args: list[str], env: dict[str, str], log: Path, headers: dict[str, str], work: dict[str, Any]
) -> tuple[float, float, float]:
    """(accepted per second, search p99 ms, server CPU ms per accepted conversation)."""
    proc, url = _start(args, env, log)
    try:
        _post_rate(url, headers, work["warm"])
        before = _cpu_seconds(proc.pid)
        rate = _post_rate(url, headers, work["bodies"])
        cpu = 1000 * (_cpu_seconds(proc.pid) - before) / len(work["bodies"])
        p99 = _search_p99(url, work["search_headers"], data.BIG_SCOPE, work["queries"])
    finally:
        _stop(proc)
    return rate, p99, cpu


def run(ctx: Context) -> None:
    import redis

    from gleaner import Gleaner

    count = ctx.size(3_000, 400)
    notes = ctx.size(100_000, 10_000)
    searches = ctx.size(1_000, 200)
    name = "gleaner_bench_http_intake"
    url = ctx.fresh_pg(name)
    broker = ctx.redis_url(REDIS_DB)
    try:
        dataset = data.generate(notes)
        data.migrate(url)
        data.load_pg(url, dataset)
        gleaner = Gleaner(url, settings=data.bench_settings())
        _, every = gleaner.create_api_key(None)
        _, reader = gleaner.create_api_key(data.BIG_SCOPE)
        gleaner.close()
        bodies = [json.dumps(transcript(i)).encode() for i in range(count + 2 * WARM_UP)]
        work = {
            "warm": bodies[:WARM_UP],
            "bodies": bodies[WARM_UP : WARM_UP + count],
            "queries": data.queries(dataset.words, searches),
            "search_headers": {"Authorization": f"Bearer {reader}"},
        }
        headers = {"Authorization": f"Bearer {every}"}
        base = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
        env = {
            **base,
            "GLEANER_DATABASE_URL": url,
            "GLEANER_BROKER_URL": broker,
            "GLEANER_DB_POOL_SIZE": "5",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            # Throughput, not the per-key limits (tests/test_http_bounds.py holds those): one
            # key posts from CLIENTS connections, as fast as the server takes them.
            "GLEANER_HTTP_SUBMITS_PER_KEY": str(4 * CLIENTS),
            "GLEANER_HTTP_REQUESTS_PER_MINUTE": "0",
        }
        redis.Redis.from_url(broker).flushdb()
        raw_rate, raw_p99, raw_cpu = _measure(
            [
                "uvicorn",
                "--factory",
                "bench.http_intake:raw_app",
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            env,
            ctx.workdir / "raw.log",
            headers,
            work,
        )
        # The same conversations again: new jobs (a job per POST), as the raw handler's were.
        rate, p99, cpu = _measure(
            ["gleaner.cli", "serve", "--log-level", "warning"],
            env,
            ctx.workdir / "serve.log",
            headers,
            work,
        )
    finally:
        redis.Redis.from_url(broker).flushdb()
        data.drop_pg(name)
    detail = (
        f"{count} conversations from {CLIENTS} clients; server CPU {cpu:.1f} ms a conversation "
        f"(raw {raw_cpu:.1f} ms); ceiling: a bare Starlette app on uvicorn doing the same key "
        "lookup, job INSERT and Redis LPUSH in raw SQL"
    )
    ctx.add(
        Row(
            NAME,
            "conversations accepted per second (HTTP 202)",
            rate,
            "/s",
            ceiling=raw_rate,
            target=">= 0.5x raw",
            met=rate >= 0.5 * raw_rate,
            note=detail,
        )
    )
    ctx.add(
        Row(
            NAME,
            f"search request p99 ({notes // 10:,} notes in the scope)",
            p99,
            "ms",
            ceiling=raw_p99,
            target="<= 2x raw",
            met=p99 <= 2 * raw_p99,
            note=f"{searches} searches, one client; ceiling: the raw full-text SQL behind "
            "the same key lookup",
        )
    )
