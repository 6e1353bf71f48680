"""A database write that fails after the model answered retries the write, not the model:
the answer is kept until written (``harvest.kept``), in process on SQLite and PostgreSQL and
through a real Celery worker, so the calls per transcript stay within the README's bound.

PostgreSQL out of disk is a trigger on ``memories`` raising SQLSTATE 53100 (disk_full) for
the writes a sequence numbers (``nextval`` is not rolled back with the failed write, as a
counter in a table would be); on SQLite the trigger calls a function of the test's, which
raises for those writes, as the driver raises when the disk is full.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, func, select, text

from gleaner.harvest.batch import harvest_paths
from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.errors import UnrecordedHarvest
from gleaner.harvest.extraction import Extraction
from gleaner.harvest.kept import WRITE_ATTEMPTS, KeptAnswer
from gleaner.harvest.outcome import Counts
from gleaner.harvest.queue import record_jobs, run_job
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import Store
from gleaner.store.schema.models import Job, Memory
from tests.llm_server import LLMServer, ModelModes, llm_server
from tests.samples import native
from tests.workers_harness import Cluster, cluster_store, fresh_cluster, wait_for

TRANSCRIPTS = 20
# GLEANER_HARVEST_MAX_CALLS x 2 x GLEANER_HARVEST_MAX_ATTEMPTS of the settings used here
# would allow more; an answer kept until written costs exactly one call.
CALLS_PER_TRANSCRIPT = 1

PG_HEALED = """
DROP TRIGGER IF EXISTS gleaner_test_disk_full ON memories;
DROP FUNCTION IF EXISTS gleaner_test_disk_full();
DROP SEQUENCE IF EXISTS gleaner_test_writes;
"""
PG_DISK_FULL = """
CREATE SEQUENCE gleaner_test_writes;
CREATE FUNCTION gleaner_test_disk_full() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    n bigint := nextval('gleaner_test_writes');
BEGIN
    IF {failing} THEN
        RAISE EXCEPTION 'could not extend file "base/16384/16412": No space left on device'
            USING ERRCODE = '53100';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER gleaner_test_disk_full BEFORE INSERT OR UPDATE ON memories
    FOR EACH ROW EXECUTE FUNCTION gleaner_test_disk_full();
"""
SQLITE_DISK_FULL = """
CREATE TRIGGER gleaner_test_disk_full BEFORE INSERT ON memories
BEGIN SELECT gleaner_test_write(); END
"""


def write_marked(folder: Path, count: int) -> list[Path]:
    """``count`` one-fact transcripts, each with its marker (``ModelModes`` answers with a
    note of it and counts the calls per marker)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        path = folder / f"conv-{i}.json"
        path.write_text(json.dumps(native(i, facts=1, extra=f" My marker is M{i:03d}.")))
        paths.append(path)
    return paths


def memories(store: Store) -> int:
    with store.transaction() as session:
        return int(session.execute(select(func.count()).select_from(Memory)).scalar_one())


class SqliteDiskFull:
    """The SQLite trigger's function on every connection of ``store``: the writes for which
    ``failing(n)`` holds (n counts them from 1) raise."""

    def __init__(self, store: Store, failing: Callable[[int], bool]) -> None:
        self.failing, self.writes, self.lock = failing, 0, threading.Lock()
        event.listen(store.engine, "connect", self._register)
        store.engine.dispose()  # connections opened before lack the function

    def _register(self, connection: sqlite3.Connection, _record: Any) -> None:
        connection.create_function("gleaner_test_write", 0, self._write)

    def _write(self) -> int:
        with self.lock:
            self.writes += 1
            number = self.writes
        if self.failing(number):
            raise sqlite3.OperationalError("database or disk is full")
        return 0


FailWrites = Callable[[Store, str, str, Callable[[int], bool]], Callable[[], int]]


@pytest.fixture(autouse=True)
def short_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """The in-process retries wait a millisecond, not up to seconds (jittered): what is
    tested is that the kept answer is written, not how long a retry waits (a worker's test
    keeps the real backoff)."""
    from gleaner.harvest import kept

    monkeypatch.setattr(kept, "WRITE_BACKOFF_SECONDS", 0.001)
    monkeypatch.setattr(kept, "WRITE_BACKOFF_MAX_SECONDS", 0.001)


@pytest.fixture
def fail_writes() -> Iterator[FailWrites]:
    """``fail_writes(store, backend, pg_failing, failing)`` makes ``store``'s database fail
    the writes of notes that ``failing`` picks by their number ``n`` from 1 (on PostgreSQL,
    the SQL condition ``pg_failing`` on ``n``) and returns how many writes were tried so
    far; the PostgreSQL database (shared by the session's tests) is healed at the end."""
    healed: list[Store] = []

    def fail(
        store: Store, backend: str, pg_failing: str, failing: Callable[[int], bool]
    ) -> Callable[[], int]:
        if backend == "postgresql":
            healed.append(store)
            with store.transaction() as session:
                session.execute(text(PG_HEALED + PG_DISK_FULL.format(failing=pg_failing)))

            def tried() -> int:
                with store.transaction() as session:
                    sequence = text("SELECT last_value, is_called FROM gleaner_test_writes")
                    value, called = session.execute(sequence).one()
                    return int(value) if called else 0

            return tried
        disk = SqliteDiskFull(store, failing)
        with store.transaction() as session:
            session.execute(text(SQLITE_DISK_FULL))
        return lambda: disk.writes

    yield fail
    for store in healed:
        with store.transaction() as session:
            session.execute(text(PG_HEALED))


def test_a_failing_write_in_process_is_retried_with_the_answer_kept(
    make_store: Callable[..., Store], backend: str, tmp_path: Path, fail_writes: FailWrites
) -> None:
    # Every transcript's first write fails (odd-numbered writes, while the first 2 x 20):
    # each one is written at its second attempt, with the answer the model gave once.
    modes = ModelModes()
    with llm_server(modes) as server:
        store = make_store(
            backend,
            harvest_model="openai/test-model",
            harvest_api_base=server.api_base,
            harvest_response_format="json_object",
        )
        tried = fail_writes(
            store,
            backend,
            f"n % 2 = 1 AND n <= {2 * TRANSCRIPTS}",
            lambda n: n % 2 == 1 and n <= 2 * TRANSCRIPTS,
        )
        summary = harvest_paths(store, write_marked(tmp_path / "in", TRANSCRIPTS))
        assert summary.failures == []
        assert (summary.harvested, summary.model_calls) == (TRANSCRIPTS, TRANSCRIPTS)
        assert server.calls == TRANSCRIPTS
    assert tried() == 2 * TRANSCRIPTS  # each transcript's first write failed
    assert sorted(modes.calls.values()) == [CALLS_PER_TRANSCRIPT] * TRANSCRIPTS
    assert memories(store) == TRANSCRIPTS


def test_a_value_refused_is_not_retried(
    make_store: Callable[..., Store], backend: str, tmp_path: Path
) -> None:
    """Only a failing database is retried: a write refused for its data (or a race lost)
    would end the same way, and fails its transcript at once, as before."""
    from gleaner.harvest.kept import retried_failure
    from gleaner.store import DataRefused, StorageFailure

    assert retried_failure(StorageFailure("database error: could not extend file"))
    assert not retried_failure(DataRefused("the database refused a value: too long"))
    assert not retried_failure(StorageFailure("lost 3 races", reason="write_races"))
    assert not retried_failure(StorageFailure("run gleaner db upgrade", reason="not_migrated"))


def test_a_kept_answer_is_written_by_the_next_run_with_no_model_call(
    make_store: Callable[..., Store], backend: str, fail_writes: FailWrites
) -> None:
    # The first run's every write attempt fails: the answer leaves on the error, as JSON a
    # queue message carries, and the next run of the same delivery writes it.
    chat = Transcript(
        conversation_id="c1",
        owner="alice",
        messages=[Message(role="user", content="I use tabs. My marker is M001.")],
    )
    with llm_server(ModelModes()) as server:
        store = make_store(
            backend,
            harvest_model="openai/test-model",
            harvest_api_base=server.api_base,
            harvest_response_format="json_object",
        )
        tried = fail_writes(store, backend, f"n <= {WRITE_ATTEMPTS}", lambda n: n <= WRITE_ATTEMPTS)
        [job_id] = record_jobs(store, [chat], owner=None, provenance="compaction", queue="q")
        with pytest.raises(UnrecordedHarvest) as raised:
            run_job(store, job_id, token="delivery-1")
        assert tried() == WRITE_ATTEMPTS and server.calls == 1
        assert raised.value.answer is not None
        kept = KeptAnswer.from_json(json.loads(json.dumps(raised.value.answer)))
        assert kept.counted  # the job counts its call already: the write adds none
        result = run_job(store, job_id, token="delivery-1", kept=kept)
        assert result is not None and result["status"] == "harvested"
        assert (result["notes_written"], result["model_calls"]) == (1, 0)
        assert server.calls == 1
    with store.transaction() as session:
        job = session.execute(select(Job)).scalar_one()
    assert (job.state, job.model_calls) == ("done", 1)
    assert memories(store) == 1


def test_an_answer_is_kept_only_when_it_cost_calls_and_holds_no_private_tag() -> None:
    found = Extraction(
        notes=[NoteCandidate(type="profile", title="Uses tabs", body="The user uses tabs.")],
        model="test-model",
        cost=Counts(model_calls=2, prompt_tokens=40, completion_tokens=9, items_dropped=1),
    )
    kept = KeptAnswer("digest", "1:m", found, ())
    again = KeptAnswer.from_json(json.loads(json.dumps(kept.as_json())))
    assert again == kept and again.keepable() and again.fits("digest", "1:m")
    assert not again.fits("digest", "2:m")
    counted = dataclasses.replace(kept, counted=True).extraction().cost
    assert (counted.model_calls, counted.prompt_tokens, counted.items_dropped) == (0, 0, 1)
    assert not dataclasses.replace(
        kept, found=dataclasses.replace(found, model="offline")
    ).keepable()
    private = NoteCandidate(type="profile", title="Key", body="It is <private>x</private>.")
    assert not dataclasses.replace(
        kept, found=dataclasses.replace(found, notes=[private])
    ).keepable()
    with pytest.raises(ValueError, match="not a kept answer"):
        KeptAnswer.from_json({"digest": "d"})


@pytest.fixture
def cluster(tmp_path: Path, worker_id: str) -> Iterator[Cluster]:
    yield from fresh_cluster("write_faults", worker_id, tmp_path)


@pytest.fixture
def cluster_db(cluster: Cluster) -> Iterator[Store]:
    yield from cluster_store(cluster)


@pytest.fixture
def model() -> Iterator[tuple[LLMServer, ModelModes]]:
    modes = ModelModes()
    with llm_server(modes) as server:
        yield server, modes


@pytest.mark.postgres
@pytest.mark.slow
def test_a_worker_keeps_the_answer_across_its_retries_while_the_disk_is_full(
    cluster: Cluster, cluster_db: Store, model: tuple[LLMServer, ModelModes], tmp_path: Path
) -> None:
    # The first 40 writes fail: more than one run's write attempts (harvest.kept), so some
    # jobs go back to the queue (Celery's retry) with their answer, and are written from it.
    server, modes = model
    faults = 40
    cluster.env.update(
        {
            "GLEANER_HARVEST_MODEL": "openai/test-model",
            "GLEANER_HARVEST_API_BASE": server.api_base,
            "GLEANER_HARVEST_API_KEY": "k",
            "GLEANER_HARVEST_RESPONSE_FORMAT": "json_object",
        }
    )
    with cluster_db.transaction() as session:
        session.execute(text(PG_DISK_FULL.format(failing=f"n <= {faults}")))
    cluster.start_worker(concurrency=2)
    files = write_marked(tmp_path / "in", TRANSCRIPTS)
    assert cluster.gleaner("enqueue", *map(str, files)).returncode == 0

    def done() -> int:
        with cluster_db.transaction() as session:
            return int(
                session.execute(
                    select(func.count()).select_from(Job).where(Job.state == "done")
                ).scalar_one()
            )

    wait_for(lambda: done() == TRANSCRIPTS, 240)
    with cluster_db.transaction() as session:
        writes = session.execute(text("SELECT last_value FROM gleaner_test_writes"))
        assert int(writes.scalar_one()) == faults + TRANSCRIPTS  # 40 failed, then 20 written
        calls = session.execute(select(func.sum(Job.model_calls))).scalar_one()
    assert memories(cluster_db) == TRANSCRIPTS
    assert server.calls == TRANSCRIPTS and calls == TRANSCRIPTS
    assert sorted(modes.calls.values()) == [CALLS_PER_TRANSCRIPT] * TRANSCRIPTS
    # Some runs outlasted their write attempts: their retries wrote the kept answer.
    log = "\n".join(worker.text() for worker in cluster.workers)
    assert "Retry in" in log, log[-3000:]
