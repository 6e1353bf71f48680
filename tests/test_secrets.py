"""Secrets are never stored: found (privacy.secrets, on detect-secrets' plugins) and redacted
like ``<private>`` spans before hashing, the model, the queue, the database and the logs.

The corpus under tests/data/secrets/ has a dev part (what the rules were tuned on) and a
held-out part (what they are reported on: docs/HOSTILE_TENANTS.md, "Secrets"); each line is a text
and the secrets it holds (none: ordinary prose or code, which must come out unchanged).
End to end, a transcript holding secrets goes through the offline harvester, the test model
server (which echoes a secret back), ``mem_save`` and a real worker fed by ``gleaner
enqueue``, on SQLite and PostgreSQL; then every place a scan can look is searched.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
import redis
from sqlalchemy import select
from sqlalchemy.engine import make_url

from gleaner import Gleaner
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.redact import redact_transcript, transcript_hash
from gleaner.harvest.transcript import Message, Transcript
from gleaner.privacy import REDACTED, redact, strip_private
from gleaner.store import Scope, Store
from gleaner.store.schema.models import Job
from tests.conftest import test_settings
from tests.llm_server import LLMServer, answer, llm_server, note
from tests.service_harness import service_env, start_http
from tests.workers_harness import cluster_on, migrated_pg_database, redis_db_for, wait_for

CORPUS = Path(__file__).parent / "data" / "secrets"
ALICE = Scope.owner("alice")
WHEN = datetime(2024, 3, 1, 9, 30, tzinfo=UTC)

# Fake secrets, built from parts so no scanner mistakes this file for a leak.
PASSWORD = "hunter2" + "Qx7"
TOKEN = "ghp_" + "Zq8Lr2Vx9Kp4Ws6Ty1Nm3Bc5Hd7Jf0Ga2Ue4X"
KEY_LINE = "MIIEpAIBAAKCAQEA7" + "x3KeyBodyLineNotForAnyone9Qw"
KEY_BLOCK = f"-----BEGIN RSA PRIVATE KEY-----\n{KEY_LINE}\n-----END RSA PRIVATE KEY-----"
URL_PASSWORD = "Pg" + "s3cret42"
SECRETS = (PASSWORD, TOKEN, KEY_LINE, URL_PASSWORD)


def corpus(name: str) -> list[dict[str, Any]]:
    lines = (CORPUS / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def scores(name: str) -> tuple[int, int, int, int]:
    """``(found, with secrets, changed, without)``: the texts whose every secret is gone,
    and the texts without any that redaction changed."""
    found = positives = changed = negatives = 0
    for item in corpus(name):
        out, _ = redact(item["text"])
        if item["secrets"]:
            positives += 1
            found += all(secret not in out for secret in item["secrets"])
        else:
            negatives += 1
            changed += out != item["text"]
    return found, positives, changed, negatives


def test_the_dev_corpus_is_redacted_whole_and_its_prose_untouched() -> None:
    assert scores("dev") == (36, 36, 0, 41)


def test_the_held_out_corpus_keeps_its_reported_recall_and_no_false_positive() -> None:
    # The figures docs/HOSTILE_TENANTS.md reports (27 of 30 found; 0 of 40 changed): a rule that
    # loses recall or starts redacting ordinary prose or code fails here.
    found, positives, changed, negatives = scores("heldout")
    assert (positives, negatives) == (30, 40)
    assert found >= 27 and changed == 0


def test_redaction_uses_the_private_marker_counts_and_is_idempotent() -> None:
    text = f"my password is {PASSWORD}, and the token {TOKEN}\n{KEY_BLOCK}\nthat is all"
    once, count = redact(text)
    assert count == 3 and once.count(REDACTED) == 3
    assert not any(secret in once for secret in SECRETS)
    assert once.endswith("that is all") and "always" not in once
    assert redact(once) == (once, 0)  # "password is [REDACTED]" is not a new secret
    assert strip_private(f"<private>x</private> key {TOKEN}") == f"{REDACTED} key {REDACTED}"


def test_every_assignment_on_a_line_is_found_not_only_the_first() -> None:
    line = f'{{"password": "{PASSWORD}", "client_secret": "Zk39sk20slq0wkd", "user": "ann"}}'
    assert redact(line) == (
        f'{{"password": "{REDACTED}", "client_secret": "{REDACTED}", "user": "ann"}}',
        2,
    )


def test_a_private_key_block_never_closed_is_redacted_to_the_end() -> None:
    out, count = redact(f"here:\n-----BEGIN OPENSSH PRIVATE KEY-----\n{KEY_LINE}\nmore")
    assert (out, count) == (f"here:\n{REDACTED}", 1)


def test_a_secret_on_a_long_line_is_found_wherever_it_falls() -> None:
    # Long lines are scanned in overlapping windows: a secret across a window's edge too.
    for at in range(3900, 4200, 37):
        text = "a" * at + f" password={PASSWORD} " + "b " * 3000
        out, count = redact(text)
        assert PASSWORD not in out and count == 1, at


def transcript(*lines: str, cid: str = "conv-secret") -> Transcript:
    messages = []
    for line in lines:
        messages.append(Message(role="user", content=line))
        messages.append(Message(role="assistant", content="Noted."))
    return Transcript(conversation_id=cid, owner="alice", messages=messages, ended_at=WHEN)


SAID = (
    f"my password is {PASSWORD}, always paste it into chats",
    f"I prefer vim. The deploy token is {TOKEN}",
    f"Here is the key:\n{KEY_BLOCK}",
    f"The database is postgresql://app:{URL_PASSWORD}@db.internal/prod and I like tea.",
    f"Reminder: {PASSWORD} is also the wifi one.",  # said bare: redacted as found before
)


def test_a_transcript_is_hashed_counted_and_queued_without_its_secrets() -> None:
    redacted = redact_transcript(transcript(*SAID))
    dumped = json.dumps(redacted.model_dump(mode="json"))
    assert not any(secret in dumped for secret in SECRETS)
    assert redacted.secrets_redacted == 5
    assert redact_transcript(redacted).secrets_redacted == 5  # idempotent, counted once
    # The hash is of the redacted text: another secret in the same words is the same
    # transcript (a repeat costs nothing), and nothing of the secret is in what is hashed.
    other = [line.replace(PASSWORD, "Other" + "Pass99") for line in SAID]
    assert transcript_hash(transcript(*SAID)) == transcript_hash(transcript(*other))
    # The id and the title are stored and logged too.
    named = transcript(*SAID, cid=f"deploy-{TOKEN}").model_copy(
        update={"title": f"password: {PASSWORD}"}
    )
    shown = redact_transcript(named)
    assert shown.conversation_id == f"deploy-{REDACTED}" and shown.title == f"password: {REDACTED}"


def model_settings(server: LLMServer) -> dict[str, object]:
    return {
        "harvest_model": "openai/test-model",
        "harvest_api_base": server.api_base,
        "harvest_api_key": "test-key",
        "harvest_timeout_seconds": 5,
        "harvest_max_attempts": 2,
        "harvest_max_retry_seconds": 3,
    }


# The model echoes secrets it was never shown (a model can invent or repeat one).
ECHO = note(
    "Password is " + PASSWORD,
    body=f"The user's password is {PASSWORD}; their GitHub token {TOKEN} deploys.",
    topics=("security",),
)


def database_dump(store: Store | str) -> str:
    """Every row of every table, as the database's own dump tool writes it."""
    url = make_url(store if isinstance(store, str) else store.engine.url)
    if url.get_backend_name() == "sqlite":
        with sqlite3.connect(str(url.database)) as conn:
            return "\n".join(conn.iterdump())
    plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
    done = subprocess.run(
        ["pg_dump", "--data-only", "--dbname", plain],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


def test_secrets_are_nowhere_after_harvests_and_mem_save(
    make_store, backend, server, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    modelled = make_store(backend, **model_settings(server))
    server.script(answer([ECHO]))
    outcome = harvest_transcript(modelled, transcript(*SAID))
    assert outcome.status == "harvested" and outcome.notes_written == 1
    # Five in the transcript, three in the answer (the title's password, the body's two).
    assert outcome.secrets_redacted == 8
    again = harvest_transcript(modelled, transcript(*SAID), provenance="import")
    assert again.status == "skipped" and server.calls == 1  # a repeat costs nothing

    offline = make_store(backend)  # the same database, the offline extractor
    found = harvest_transcript(offline, transcript(*SAID, cid="conv-offline"))
    assert found.status == "harvested" and found.secrets_redacted == 5
    saved = offline.mem_save(
        "alice", f"Deploys with token {TOKEN}", type="discovery", title="Deploy token"
    )
    assert saved.outcome == "created"

    sent = json.dumps([request.body for request in server.requests])
    assert "I prefer vim" in sent and REDACTED in sent
    dump = database_dump(modelled)
    assert "I prefer vim" in dump and REDACTED in dump
    for secret in SECRETS:
        assert secret not in sent, secret
        assert secret not in dump, secret
        assert secret not in caplog.text, secret


@pytest.fixture
def worker_database(backend: str, tmp_path: Path, worker_id: str, sqlite_template: Path) -> str:
    if backend == "postgresql":
        return migrated_pg_database(f"gleaner_secrets_{worker_id}")
    path = tmp_path / "worker.db"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"


def redis_contents(client: redis.Redis) -> str:
    """Every key and value of the Redis database (lists, hashes, sets and strings)."""
    out = []
    for key in client.scan_iter():
        kind = client.type(key)
        if kind == b"list":
            value: object = client.lrange(key, 0, -1)
        elif kind == b"hash":
            value = client.hgetall(key)
        elif kind == b"set":
            value = client.smembers(key)
        elif kind == b"zset":
            value = client.zrange(key, 0, -1)
        else:
            value = client.get(key)
        out.append(f"{key!r} {value!r}")
    return "\n".join(out)


def native_document() -> dict[str, Any]:
    """The transcript holding secrets, as a native document (a file, an HTTP body)."""
    return transcript(*SAID).model_dump(
        mode="json", include={"conversation_id", "owner", "ended_at", "messages"}
    )


def model_env(server: LLMServer) -> dict[str, str]:
    return {
        "GLEANER_HARVEST_MODEL": "openai/test-model",
        "GLEANER_HARVEST_API_BASE": server.api_base,
        "GLEANER_HARVEST_API_KEY": "test-key",
    }


@pytest.mark.slow
def test_secrets_are_nowhere_after_an_http_submit(
    worker_database: str, tmp_path: Path, server: LLMServer
) -> None:
    server.script(answer([ECHO]))
    service = start_http(worker_database, tmp_path, **model_env(server))
    gleaner = Gleaner(worker_database, settings=test_settings())
    try:
        _, token = gleaner.create_api_key("alice")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=service.url, timeout=30, headers=headers) as client:
            accepted = client.post("/v1/conversations", json=native_document())
            assert accepted.status_code == 202, accepted.text
            job = client.get(f"/v1/jobs/{accepted.json()['job_id']}").json()
        assert job["state"] == "done" and job["notes_written"] == 1
        assert job["secrets_redacted"] == 8
        seen = "\n".join(
            (
                accepted.text,
                json.dumps(job),
                database_dump(worker_database),
                service.text(),
                json.dumps([request.body for request in server.requests]),
            )
        )
        assert "I prefer vim" in seen
        for secret in SECRETS:
            assert secret not in seen, secret
    finally:
        service.stop()
        gleaner.close()


@pytest.mark.slow
def test_secrets_are_nowhere_on_the_queue_the_job_or_the_worker(
    worker_database: str, worker_id: str, tmp_path: Path, server: LLMServer
) -> None:
    server.script(answer([ECHO]))
    source = tmp_path / "in" / "chat.json"
    source.parent.mkdir()
    source.write_text(json.dumps(native_document()), encoding="utf-8")
    store = Store(worker_database, settings=test_settings())
    try:
        with contextmanager(cluster_on)(
            worker_database, redis_db_for(worker_id), tmp_path
        ) as cluster:
            cluster.env.update(model_env(server))
            queued = cluster.gleaner("enqueue", str(source), "--json")
            assert queued.returncode == 0, queued.stderr
            on_the_queue = redis_contents(cluster.redis())
            assert on_the_queue  # the message is there, waiting for a worker
            worker = cluster.start_worker(queues="harvest", concurrency=1)

            def done() -> bool:
                with store.transaction() as session:
                    return session.execute(select(Job.state)).scalar_one() == "done"

            wait_for(done, 60)
            with store.transaction() as session:
                job = session.execute(select(Job)).scalar_one()
                result, stored = job.result, json.dumps(job.transcript)
            assert result is not None and result["secrets_redacted"] == 8
            assert result["notes_written"] == 1
            seen = "\n".join(
                (
                    queued.stdout + queued.stderr,
                    on_the_queue,
                    redis_contents(cluster.redis()),
                    stored,
                    database_dump(store),
                    worker.text(),
                    json.dumps([request.body for request in server.requests]),
                )
            )
            assert "I prefer vim" in seen
            for secret in SECRETS:
                assert secret not in seen, secret
    finally:
        store.dispose()


@pytest.mark.slow
def test_a_secret_saved_over_mcp_is_nowhere(worker_database: str, tmp_path: Path) -> None:
    from mcp import ClientSession, StdioServerParameters, stdio_client

    log = tmp_path / "mcp-stderr.log"
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gleaner.cli", "mcp", "--owner", "alice"],
        env=service_env(worker_database),
    )
    saved: list[Any] = []

    async def main() -> None:
        with log.open("w") as errors:
            async with (
                stdio_client(params, errlog=errors) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                result = await session.call_tool(
                    "mem_save",
                    {
                        "content": f"Deploys with {TOKEN}; my password is {PASSWORD}.",
                        "type": "discovery",
                        "title": f"Deploy token {TOKEN}",
                    },
                )
                saved.append(result)
                found = await session.call_tool("mem_search", {"query": "deploys"})
                saved.append(found)

    anyio.run(main)
    assert not saved[0].is_error, saved[0].content
    assert saved[0].structured_content["outcome"] == "created"
    shown = json.dumps([result.model_dump(mode="json") for result in saved])
    assert REDACTED in shown
    seen = "\n".join((shown, database_dump(worker_database), log.read_text()))
    for secret in (TOKEN, PASSWORD):
        assert secret not in seen, secret
