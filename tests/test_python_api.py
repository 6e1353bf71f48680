"""The public Python API (``from gleaner import Gleaner``) on PostgreSQL and SQLite: submit
in process and queued, follow the job, read the notes back, forget, keys; the same formats,
limits and owner rule as the CLI; the transcript redacted before it is recorded; and one
owner never reaching another's notes."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from typing import Any

import pytest
import redis
from sqlalchemy import text

from gleaner import Conversation, Gleaner, InvalidRequest, NotFound, TooLarge, Unavailable
from gleaner.store import Store
from tests.cli_harness import Cli
from tests.samples import native
from tests.workers_harness import REDIS_URL, redis_db_for, wait_for

SECRET = "sk-live-0f9e8d7c6b5a"


@pytest.fixture
def gleaner(store: Store) -> Gleaner:
    return Gleaner(store=store)


def _jobs(store: Store) -> list[dict[str, Any]]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT owner, state, transcript FROM jobs")).mappings()
        return [dict(row) for row in rows]


def test_submit_in_process_harvests_and_the_job_reports_it(gleaner: Gleaner) -> None:
    job_id = gleaner.submit(native(1, owner="alice"))
    job = gleaner.job(job_id)
    assert job.state == "done" and job.owner == "alice" and job.harvest_status == "harvested"
    assert job.notes_written == 3 and len(job.slugs) == 3
    assert (job.model_calls, job.prompt_tokens, job.completion_tokens) == (0, 0, 0)  # offline
    hits = gleaner.search("alice", "keymap1")
    assert [h.memory.slug for h in hits][:1] and hits[0].memory.slug in job.slugs
    detail = gleaner.note("alice", hits[0].memory.slug)
    assert detail.memory.title == hits[0].memory.title and detail.history == []
    assert detail.links == [] and detail.superseded_by is None
    assert hits[0].memory.title in gleaner.index_text("alice")
    # The same conversation again: a job of its own, which writes nothing (the ledger).
    again = gleaner.job(gleaner.submit(native(1, owner="alice")))
    assert again.state == "done" and again.harvest_status == "skipped"
    assert again.notes_written == 0


@pytest.mark.parametrize(
    ("raised", "recorded"),
    [
        (KeyError("speaker"), "internal_error: KeyError: 'speaker'"),
        (KeyboardInterrupt(), "interrupted: the run was stopped (KeyboardInterrupt)"),
    ],
)
def test_a_run_in_process_that_raises_leaves_its_job_failed_for_retry_not_running(
    gleaner: Gleaner,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: BaseException,
    recorded: str,
) -> None:
    """No queue retries an in-process run and no sweep runs there: a run that raises (a
    defect, Ctrl-C; a database failure alike) marks its job failed with the reason, so
    `gleaner retry` runs it again."""
    from gleaner.harvest import queue as harvest_queue

    def defect(*_args: object, **_kwargs: object) -> None:
        raise raised

    with monkeypatch.context() as patch:
        patch.setattr(harvest_queue, "plan_harvest", defect)
        with pytest.raises(type(raised)):
            gleaner.submit(native(1, owner="alice"))
    with store.engine.connect() as conn:
        job_id, state, error = conn.execute(text("SELECT id, state, last_error FROM jobs")).one()
    assert state == "failed" and error.startswith(recorded)

    cli = Cli(monkeypatch, capsys)  # `gleaner retry`, in process: no broker set
    cli.env(GLEANER_DATABASE_URL=store.engine.url.render_as_string(hide_password=False))
    retried = cli("retry", job_id)
    assert retried.code == 0 and f"{job_id}: harvested" in retried.out
    assert gleaner.job(job_id).state == "done"


def test_formats_as_the_cli_reads_them(gleaner: Gleaner) -> None:
    openai = {"messages": [{"role": "user", "content": "I prefer helix with the kit9 keymap9."}]}
    assert gleaner.job(gleaner.submit(openai, owner="alice")).notes_written == 1
    as_text = json.dumps(native(2, owner="alice"))
    assert gleaner.job(gleaner.submit(as_text)).notes_written == 3
    export = io.BytesIO()
    with zipfile.ZipFile(export, "w") as archive:
        claude = [
            {
                "uuid": "c-7",
                "chat_messages": [
                    {"sender": "human", "text": "We decided to use DuckDB for the svc7 ledger7."}
                ],
            }
        ]
        archive.writestr("conversations.json", json.dumps(claude))
    job = gleaner.job(gleaner.submit(export.getvalue(), owner="alice"))
    assert job.conversation_id == "c-7" and job.notes_written == 1


def test_bad_input_is_refused_and_records_nothing(make_store: Any, backend: str) -> None:
    store = make_store(backend, max_transcript_bytes=2_000, max_file_bytes=50_000)
    gleaner = Gleaner(store=store)
    cases: list[tuple[object, dict[str, Any], type[Exception], str]] = [
        (native(1, extra=" pad" * 400), {}, TooLarge, "too_large"),
        (b"x" * 60_000, {}, TooLarge, "too_large"),
        (b"not json at all", {}, InvalidRequest, "bad_transcript"),
        ({"hello": "world"}, {}, InvalidRequest, "bad_transcript"),
        ([native(1), native(2)], {}, InvalidRequest, "not_one_conversation"),
        ({"messages": [{"role": "user", "content": "hi"}]}, {}, InvalidRequest, "no_owner"),
        (native(1, owner=" alice"), {}, InvalidRequest, "bad_owner"),
        (native(1, owner="alice"), {"owner": "bob\u200b"}, InvalidRequest, "bad_owner"),
        (object(), {}, InvalidRequest, "bad_transcript"),
    ]
    for document, options, error, reason in cases:
        with pytest.raises(error) as caught:
            gleaner.submit(document, **options)  # type: ignore[arg-type]
        assert caught.value.reason == reason, (reason, caught.value)
    assert _jobs(store) == []


def test_the_owner_rule(gleaner: Gleaner) -> None:
    # A conversation naming its owner keeps it; ``owner`` fills in only the ones naming none.
    assert gleaner.job(gleaner.submit(native(1, owner="bob"), owner="alice")).owner == "bob"
    moved = gleaner.submit(native(2, owner="bob"), owner="alice", reassign_owner=True)
    assert gleaner.job(moved).owner == "alice"
    read = gleaner.read(native(3, owner="\uff43\uff41\uff52\uff4f\uff4c"))  # full-width: NFKC
    assert read.owner == "carol"
    assert gleaner.job(gleaner.submit(read)).owner == "carol"
    reassigned = gleaner.read(native(8, owner="bob"), owner="alice", reassign_owner=True)
    assert gleaner.job(gleaner.submit(reassigned)).owner == "alice"


def test_a_conversation_built_with_another_owner_than_its_transcript_is_refused(
    gleaner: Gleaner, store: Store
) -> None:
    bobs = gleaner.read(native(9, owner="bob"))
    mixed_up = Conversation(
        owner="alice", conversation_id=bobs.conversation_id, transcript=bobs.transcript
    )
    with pytest.raises(InvalidRequest) as caught:
        gleaner.submit(mixed_up)
    assert caught.value.reason == "bad_owner" and "reassign_owner=True" in str(caught.value)
    assert _jobs(store) == []
    # Named the same way, or named by nobody: the Conversation's owner stands.
    same = Conversation(
        owner="bob", conversation_id=bobs.conversation_id, transcript=bobs.transcript
    )
    assert gleaner.job(gleaner.submit(same)).owner == "bob"
    nameless = bobs.transcript.model_copy(update={"owner": None, "conversation_id": "n1"})
    assert gleaner.job(gleaner.submit(Conversation("carol", "n1", nameless))).owner == "carol"


def test_the_transcript_is_redacted_before_it_is_recorded(
    gleaner: Gleaner, store: Store, worker_id: str
) -> None:
    leaky = native(4, owner="alice", extra=f" <private>{SECRET}</private>")
    leaky["conversation_id"] = f"conv-<private>{SECRET}</private>"
    job_id = gleaner.submit(leaky)
    (row,) = _jobs(store)
    assert SECRET not in json.dumps(row["transcript"]) and "[REDACTED]" in json.dumps(row)
    assert SECRET not in gleaner.job(job_id).conversation_id
    for hit in gleaner.search("alice", "keymap4"):
        assert SECRET not in hit.memory.body


@pytest.mark.parametrize("backend", ["postgresql"])
def test_submit_with_a_broker_queues_the_job_id_only(
    make_store: Any, backend: str, worker_id: str
) -> None:
    redis_db = redis_db_for(worker_id)
    broker_url = f"{REDIS_URL}/{redis_db}"
    store = make_store(backend, broker_url=broker_url)
    gleaner = Gleaner(store=store)
    leaky = native(5, owner="alice", extra=f" <private>{SECRET}</private>")
    job_id = gleaner.submit(leaky)
    job = gleaner.job(job_id)
    assert job.state == "pending" and job.queue == "harvest" and job.notes_written == 0
    client = redis.Redis.from_url(broker_url)
    try:
        mine = [m for m in client.lrange("harvest", 0, -1) if job_id.encode() in m]
        assert len(mine) == 1 and SECRET.encode() not in mine[0]
        # The store's settings set time limits; the message carries none (the worker's own).
        assert store.settings.task_soft_time_limit
        assert json.loads(mine[0])["headers"]["timelimit"] == [None, None]
    finally:
        for message in mine:
            client.lrem("harvest", 0, message)
        client.close()
    assert SECRET not in json.dumps(_jobs(store))


def test_an_owner_never_reaches_another_owners_notes(gleaner: Gleaner) -> None:
    alice_job = gleaner.submit(native(1, owner="alice"))
    gleaner.submit(native(2, owner="bob"))
    alice_slugs = gleaner.job(alice_job).slugs
    assert gleaner.search("bob", "keymap1") == []
    assert all(gleaner.search("alice", "keymap1"))
    with pytest.raises(NotFound):
        gleaner.note("bob", alice_slugs[0])
    assert "keymap1" not in gleaner.index_text("bob")
    with pytest.raises(NotFound):
        gleaner.job(alice_job, owner="bob")
    assert gleaner.job(alice_job, owner="alice").owner == "alice"
    counts = gleaner.forget("bob")
    assert counts and gleaner.search("bob", "keymap2") == []
    assert [h.memory.slug for h in gleaner.search("alice", "keymap1")]
    gleaner.note("alice", alice_slugs[0])  # still there


def test_forget_leaves_a_tombstone_unless_reharvest_is_allowed(gleaner: Gleaner) -> None:
    gleaner.submit(native(1, owner="alice"))
    gleaner.forget("alice")
    assert gleaner.job(gleaner.submit(native(1, owner="alice"))).notes_written == 0
    gleaner.forget("alice", allow_reharvest=True)
    assert gleaner.job(gleaner.submit(native(1, owner="alice"))).notes_written == 3


def test_mem_save_and_session_summary_pass_through(gleaner: Gleaner) -> None:
    saved = gleaner.mem_save(
        "alice", "Use <private>x</private> React.", type="decision", title="Frontend"
    )
    assert saved.outcome == "created"
    assert gleaner.note("alice", "frontend").memory.body == "Use [REDACTED] React."
    summary = gleaner.mem_session_summary("alice", "Chose the frontend.")
    assert summary.session_id == saved.session_id
    with pytest.raises(InvalidRequest) as caught:
        gleaner.mem_save("alice", "x", type="summary", title="t")
    assert caught.value.reason
    assert gleaner.search("bob", "react") == []


def test_keys_are_stored_hashed_and_revoked(gleaner: Gleaner, store: Store) -> None:
    key, token = gleaner.create_api_key("alice")
    every, every_token = gleaner.create_api_key(None)
    assert token.startswith("glk_") and len(token) > 40 and token != every_token
    assert [k.id for k in gleaner.api_keys()] == [key.id, every.id]
    with store.engine.connect() as conn:
        stored = json.dumps(
            [list(r) for r in conn.execute(text("SELECT * FROM api_keys"))], default=str
        )
    assert token not in stored and hashlib.sha256(token.encode()).hexdigest() in stored
    found = gleaner.verify_api_key(token)
    assert found is not None and found.owner == "alice"
    assert found.allows("alice") and not found.allows("bob")
    assert every.allows("bob") and every.owner is None
    assert gleaner.verify_api_key(token + "x") is None and gleaner.verify_api_key("") is None
    gleaner.revoke_api_key(key.id)
    assert gleaner.verify_api_key(token) is None and [k.id for k in gleaner.api_keys()] == [
        every.id
    ]
    with pytest.raises(NotFound):
        gleaner.revoke_api_key(key.id)
    with pytest.raises(InvalidRequest):
        gleaner.create_api_key(" bad")


@pytest.mark.parametrize("backend", ["sqlite"])
def test_a_broker_down_leaves_the_job_recorded_and_says_so(make_store: Any, backend: str) -> None:
    store = make_store(backend, broker_url="redis://127.0.0.1:9/0")  # nothing listens there
    gleaner = Gleaner(store=store)
    with pytest.raises(Unavailable) as caught:
        gleaner.submit(native(6, owner="alice"))
    assert caught.value.reason == "broker_unavailable"
    (row,) = _jobs(store)
    assert row["state"] == "pending"  # beat's sweep sends it once the broker is back


# A process that records and runs a job in process (no broker), killed in the model call.
SUBMIT_AND_DIE = """
import sys
from gleaner import Gleaner
from tests.samples import native
Gleaner(sys.argv[1]).submit(native(21, owner="alice"))
"""


@pytest.mark.slow
def test_jobs_a_dead_process_left_are_run_again_by_retry_without_a_broker(
    store: Store, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No sweep runs without a broker: a job whose process was killed mid-run stayed
    `running`, and one recorded by a process killed before running it stayed `pending`,
    for ever; `gleaner retry --all` now runs both, and `status` says it will."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from gleaner.harvest.queue import record_jobs
    from gleaner.harvest.transcript import Transcript
    from tests.llm_server import answer, llm_server, note

    url = store.engine.url.render_as_string(hide_password=False)
    with llm_server(answer([note("Uses helix")])) as model:
        env = {
            "GLEANER_DATABASE_URL": url,
            "GLEANER_HARVEST_MODEL": "openai/test-model",
            "GLEANER_HARVEST_API_BASE": model.api_base,
            "GLEANER_HARVEST_API_KEY": "k",
            "GLEANER_JOB_HEARTBEAT_SECONDS": "1",
            "GLEANER_JOB_LEASE_SECONDS": "3",
            "GLEANER_REQUEUE_AFTER_SECONDS": "1",
        }
        model.script(answer([note("Uses helix")], delay=10.0))
        clean = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
        dying = subprocess.Popen([sys.executable, "-c", SUBMIT_AND_DIE, url], env={**clean, **env})
        deadline = time.monotonic() + 30
        while model.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert model.calls == 1  # the dying process is inside its model call
        dying.send_signal(signal.SIGKILL)
        dying.wait(10)
        [never_run] = record_jobs(  # as a process killed between recording and running
            store,
            [Transcript.model_validate(native(22, owner="alice"))],
            owner=None,
            provenance="compaction",
            queue="harvest",
        )
        assert sorted(j["state"] for j in _jobs(store)) == ["pending", "running"]

        cli = Cli(monkeypatch, capsys)
        cli.env(**env)
        # The killed run's lease (3 s) runs out; by then the pending one waited its 1 s.
        wait_for(lambda: "`gleaner retry --all` runs it" in cli("status").out, 30)
        retried = cli("retry", "--all")
        assert retried.code == 0, retried.err
        assert retried.out.count(": harvested") == 2 and never_run in retried.out
    assert [j["state"] for j in _jobs(store)] == ["done", "done"]
    with store.engine.connect() as conn:
        crashes = conn.execute(text("SELECT crashes FROM jobs ORDER BY crashes")).scalars()
        assert list(crashes) == [0, 1]  # the killed run counts as one lost worker
