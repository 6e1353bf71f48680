"""The Celery pipeline with real parts: Redis, PostgreSQL and `gleaner worker` processes."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from gleaner.harvest.queues import IMPORT_QUEUE, LIVE_QUEUE
from gleaner.store import Store
from gleaner.store.schema.models import HarvestLedger, Job, Memory
from tests.conftest import test_settings
from tests.llm_server import Behaviour, LLMServer, answer, llm_server, note, unauthorized
from tests.samples import native, write_chatgpt_export, write_natives
from tests.workers_harness import Cluster, cluster_store, fresh_cluster, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture
def cluster(tmp_path: Path, worker_id: str) -> Iterator[Cluster]:
    yield from fresh_cluster("workers", worker_id, tmp_path)


@pytest.fixture
def store(cluster: Cluster) -> Iterator[Store]:
    yield from cluster_store(cluster)


def job_states(store: Store) -> dict[str, int]:
    with store.transaction() as session:
        return dict(session.execute(select(Job.state, func.count()).group_by(Job.state)).all())


def count(store: Store, model: type) -> int:
    with store.transaction() as session:
        return int(session.execute(select(func.count()).select_from(model)).scalar_one())


def test_n_transcripts_n_workers_every_note_written_once(cluster: Cluster, store: Store) -> None:
    files = write_natives(cluster.tmp / "in", 40, facts=2)
    for _ in range(3):
        cluster.start_worker(concurrency=2)
    out = cluster.gleaner("enqueue", *map(str, files), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["enqueued"] == 40
    # The same transcripts again (a redelivery, a retrying producer): no new notes.
    assert cluster.gleaner("enqueue", *map(str, files[:10])).returncode == 0
    wait_for(lambda: job_states(store).get("done", 0) == 50, 90)
    assert count(store, HarvestLedger) == 40
    with store.transaction() as session:
        slugs = list(session.execute(select(Memory.slug)).scalars())
    assert len(slugs) == 80 == len(set(slugs))
    logs = "".join(w.text() for w in cluster.workers)
    assert logs.count("succeeded") >= 50
    assert sum("succeeded" in w.text() for w in cluster.workers) >= 2  # the work was shared


def test_import_of_a_500_conversation_export_reaches_100_percent(
    cluster: Cluster, store: Store
) -> None:
    export = write_chatgpt_export(cluster.tmp / "export" / "conversations.json", 500, facts=2)
    cluster.start_worker(queues="import", concurrency=2)
    cluster.start_worker(queues="harvest,import", concurrency=2)
    no_owner = cluster.gleaner("import", str(export))
    assert no_owner.returncode == 2 and "--owner" in no_owner.stderr
    out = cluster.gleaner("import", str(export), "--owner", "dana", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert (summary["percent"], summary["done"], summary["failed"]) == (100.0, 500, 0)
    assert summary["transcripts"] == 500 and summary["notes_written"] == 1000
    with store.transaction() as session:
        provenances = set(session.execute(select(Memory.provenance)).scalars())
        abandoned = session.execute(
            select(func.count()).select_from(Memory).where(Memory.body.contains("ABANDONED"))
        ).scalar_one()
    assert provenances == {"import"} and abandoned == 0


def test_live_harvests_are_not_starved_by_a_bulk_import(cluster: Cluster, store: Store) -> None:
    from gleaner.harvest.queue import record_jobs
    from gleaner.harvest.transcript import Transcript
    from gleaner.workers.app import make_celery
    from gleaner.workers.enqueue import send_jobs

    make_celery(test_settings(broker_url=cluster.env["GLEANER_BROKER_URL"]))
    bulk = [Transcript.model_validate(native(i, facts=1)) for i in range(1_000)]
    send_jobs(
        IMPORT_QUEUE,
        record_jobs(store, bulk, owner="bulk", provenance="import", queue=IMPORT_QUEUE),
    )
    live = [Transcript.model_validate(native(i, facts=1)) for i in range(5)]
    live_ids = record_jobs(store, live, owner="live", provenance="compaction", queue=LIVE_QUEUE)
    send_jobs(LIVE_QUEUE, live_ids)
    assert cluster.redis().llen(IMPORT_QUEUE) == 1_000

    cluster.start_worker(queues="harvest,housekeeping,import", concurrency=1)
    wait_for(lambda: _done(store, live_ids) == 5, 60)
    cluster.stop()
    with store.transaction() as session:
        live_last = session.execute(
            select(func.max(Job.finished_at)).where(Job.id.in_(live_ids))
        ).scalar_one()
        imports_before = session.execute(
            select(func.count())
            .select_from(Job)
            .where(Job.queue == IMPORT_QUEUE, Job.finished_at <= live_last)
        ).scalar_one()
    # Behind 1,000 import messages the 5 live ones ran first: at most the one import the
    # worker had already reserved when the live messages were first seen can precede them.
    assert imports_before <= 2, imports_before


def _done(store: Store, ids: list[str]) -> int:
    with store.transaction() as session:
        return int(
            session.execute(
                select(func.count()).select_from(Job).where(Job.id.in_(ids), Job.state == "done")
            ).scalar_one()
        )


def test_no_private_text_rests_in_redis_or_the_jobs_table(cluster: Cluster, store: Store) -> None:
    files = write_natives(cluster.tmp / "in", 3, extra=" <private>SECRET-TOKEN-42</private>")
    assert cluster.gleaner("enqueue", *map(str, files)).returncode == 0
    client = cluster.redis()
    stored = b"".join(
        b"".join(client.lrange(key, 0, -1)) if client.type(key) == b"list" else b""
        for key in client.keys("*")
    )
    assert client.llen(LIVE_QUEUE) == 3
    assert b"SECRET" not in stored and b"private" not in stored.lower()
    with store.transaction() as session:
        transcripts = json.dumps(list(session.execute(select(Job.transcript)).scalars()))
    assert "SECRET" not in transcripts and "[REDACTED]" in transcripts


@pytest.fixture
def model() -> Iterator[LLMServer]:
    with llm_server() as server:
        yield server


def use_model(cluster: Cluster, model: LLMServer) -> None:
    """The cluster's workers harvest through ``model`` (started after this)."""
    cluster.env.update(
        {
            "GLEANER_HARVEST_MODEL": "openai/test-model",
            "GLEANER_HARVEST_API_BASE": model.api_base,
            "GLEANER_HARVEST_API_KEY": "k",
        }
    )


def test_a_failed_job_is_kept_listed_and_retried(
    cluster: Cluster, store: Store, model: LLMServer
) -> None:
    use_model(cluster, model)
    files = write_natives(cluster.tmp / "in", 1)
    model.script(unauthorized())
    cluster.start_worker(concurrency=1)
    assert cluster.gleaner("enqueue", str(files[0])).returncode == 0
    wait_for(lambda: job_states(store).get("failed", 0) == 1, 60)
    assert model.calls == 1  # a permanent error is not retried

    status = json.loads(cluster.gleaner("status", "--json").stdout)
    assert status["jobs"]["failed"] == 1
    [failure] = status["failures"]
    assert "model_permanent" in failure["error"] and failure["attempts"] == 1
    with store.transaction() as session:
        kept = session.execute(select(Job.transcript)).scalar_one()
    assert kept["conversation_id"] == "conv-0"

    model.script(answer([note("Prefers vim", type="preference")]))
    retried = cluster.gleaner("retry", "--all")
    assert retried.returncode == 0 and "re-enqueued 1" in retried.stdout
    wait_for(lambda: job_states(store).get("done", 0) == 1, 60)
    assert count(store, Memory) == 1


# The database refusing every ledger row, as it refuses a value too long for its column: a
# fault of the data, not of the database, which a retry would meet again.
REFUSE_LEDGER_ROWS = """
CREATE FUNCTION gleaner_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'value too long for type character varying(255)' USING ERRCODE = '22001';
END $$;
CREATE TRIGGER gleaner_test_refuse BEFORE INSERT ON harvest_ledger
    FOR EACH ROW EXECUTE FUNCTION gleaner_test_refuse();
"""


def test_a_value_the_database_refuses_fails_the_job_at_once_its_call_counted(
    cluster: Cluster, store: Store, model: LLMServer
) -> None:
    use_model(cluster, model)
    model.default = answer([note("Prefers vim", type="preference")])
    with store.transaction() as session:
        session.execute(text(REFUSE_LEDGER_ROWS))
    try:
        cluster.start_worker(concurrency=1)
        files = write_natives(cluster.tmp / "in", 1)
        assert cluster.gleaner("enqueue", str(files[0])).returncode == 0
        # A retry would come 5 s or more later and call the model again; none comes.
        wait_for(lambda: job_states(store).get("failed", 0) == 1, 30)
        with store.transaction() as session:
            job = session.execute(select(Job)).scalar_one()
        assert job.last_error.startswith("data_refused: the database refused a value: ")
        assert (job.attempts, job.crashes, job.model_calls) == (1, 0, 1)
        assert model.calls == 1 and count(store, Memory) == 0
    finally:
        with store.transaction() as session:
            session.execute(text("DROP FUNCTION gleaner_test_refuse() CASCADE"))


def test_a_child_over_the_memory_limit_is_replaced_after_its_task(
    cluster: Cluster, store: Store
) -> None:
    # Every child is over 1 MB: each is replaced once its task ends, and nothing is lost.
    cluster.start_worker(concurrency=1, GLEANER_WORKER_MAX_MEMORY_PER_CHILD="1")
    files = write_natives(cluster.tmp / "in", 3, facts=1)
    assert cluster.gleaner("enqueue", *map(str, files)).returncode == 0
    wait_for(lambda: job_states(store).get("done", 0) == 3, 90)
    with store.transaction() as session:
        holders = set(session.execute(select(Job.claimed_by)).scalars())
    assert len(holders) == 3  # host:pid of three children
    assert count(store, Memory) == 3


def test_a_worker_child_killed_mid_task_loses_nothing(
    cluster: Cluster, store: Store, model: LLMServer
) -> None:
    import os
    import signal

    use_model(cluster, model)
    model.script(answer([note("Slow fact")], delay=8.0), answer([note("Slow fact")]))
    worker = cluster.start_worker(concurrency=1)
    files = write_natives(cluster.tmp / "in", 1)
    assert cluster.gleaner("enqueue", str(files[0])).returncode == 0
    wait_for(lambda: model.calls == 1, 30)  # the child is inside the model call
    for child in worker.children():
        os.kill(child, signal.SIGKILL)
    wait_for(lambda: job_states(store).get("done", 0) == 1, 90)
    with store.transaction() as session:
        attempts, crashes = session.execute(select(Job.attempts, Job.crashes)).one()
    # The redelivered message takes its own lease back at once (no wait for it to run out),
    # and the lost child counts as one crash.
    assert (attempts, crashes) == (2, 1)
    assert count(store, Memory) == 1 and model.calls == 2


def test_pending_jobs_whose_message_was_lost_are_sent_again(cluster: Cluster, store: Store) -> None:
    from gleaner.harvest.queue import record_jobs
    from gleaner.harvest.transcript import Transcript

    lost = record_jobs(
        store,
        [Transcript.model_validate(native(7))],
        owner="alice",
        provenance="compaction",
        queue=LIVE_QUEUE,
    )
    cluster.env["GLEANER_REQUEUE_AFTER_SECONDS"] = "1"
    worker = cluster.start_worker(concurrency=1)
    wait_for(lambda: _done(store, lost) == 0 and job_states(store).get("pending") == 1, 5)
    import time

    time.sleep(1.5)  # the pending job ages past GLEANER_REQUEUE_AFTER_SECONDS (1 s, made short)
    swept = cluster.gleaner("housekeep", "requeue", "--json")
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["requeued"] == 1
    wait_for(lambda: _done(store, lost) == 1, 60)
    assert "succeeded" in worker.text()


def test_a_worker_started_without_concurrency_runs_two_children_per_core(
    cluster: Cluster, store: Store
) -> None:
    worker = cluster.start_worker(queues="harvest", concurrency=None)
    wait_for(lambda: len(worker.children()) == 2 * len(os.sched_getaffinity(0)), 30)
    files = write_natives(cluster.tmp / "in", 4, facts=1)
    assert cluster.gleaner("enqueue", *map(str, files)).returncode == 0
    wait_for(lambda: job_states(store).get("done", 0) == 4, 60)


def test_an_import_whose_jobs_failed_exits_1_followed_and_in_status(
    cluster: Cluster, store: Store, model: LLMServer
) -> None:
    # Scripts read the exit code: an import whose conversations failed to harvest is not done.
    use_model(cluster, model)
    model.default = Behaviour(status=400, error={"message": "bad request"})
    write_natives(cluster.tmp / "in", 2)
    cluster.start_worker(concurrency=1)
    followed = cluster.gleaner("import", str(cluster.tmp / "in"), "--owner", "dana")
    assert followed.returncode == 1, followed.stdout + followed.stderr
    found = re.search(r"import ([0-9a-f]{8,})", followed.stdout + followed.stderr)
    assert found is not None, followed.stdout + followed.stderr
    status = cluster.gleaner("status", "--import", found[1])
    assert status.returncode == 1 and "2 failed" in status.stdout, status.stdout


def test_notes_harvested_by_a_worker_get_their_vectors_on_the_embed_queue(
    cluster: Cluster, store: Store
) -> None:
    """After a harvest commits, its owner's notes are embedded by an embed task on their own
    queue (here a separate worker): searchable lexically at once, by meaning once done."""
    from gleaner.store.recall import vectors as note_vectors
    from tests.embed_server import embed_server

    with embed_server() as server:
        embedding = {
            "GLEANER_EMBED_MODEL": "openai/test-embed",
            "GLEANER_EMBED_API_BASE": server.api_base,
        }
        cluster.env.update(embedding)
        cluster.start_worker(queues="harvest", concurrency=1)
        embedder = cluster.start_worker(queues="embed", concurrency=1)
        files = write_natives(cluster.tmp / "in", 3, facts=2)
        assert cluster.gleaner("enqueue", *map(str, files)).returncode == 0
        wait_for(lambda: job_states(store).get("done", 0) == 3, 60)

        def embedded() -> int:
            with store.connection() as conn:
                found = conn.execute(text("SELECT count(*) FROM memory_vectors")).scalar_one()
            return int(found)

        wait_for(lambda: embedded() == count(store, Memory), 60)
        with store.connection() as conn:
            assert note_vectors.count_pending(conn, "openai/test-embed") == 0
        assert server.calls >= 1 and "gleaner.embed" in embedder.text()
