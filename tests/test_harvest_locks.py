"""The per-process transcript locks: exclusive across processes and threads, no pooled
connection held, and run_job's merged transactions keep exactly-once outcomes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, create_engine, select

from harvest.locks import TranscriptLocks
from harvest.queue import record_jobs, run_job
from harvest.transcript import Transcript
from store import Store
from store.models import HarvestLedger, Job
from tests.samples import native

pytestmark = pytest.mark.postgres


@pytest.fixture
def engines(pg_url: str) -> Iterator[tuple[Engine, Engine]]:
    first, second = create_engine(pg_url, pool_size=1), create_engine(pg_url, pool_size=1)
    yield first, second
    first.dispose()
    second.dispose()


def test_a_lock_is_exclusive_across_processes_and_costs_no_pooled_connection(
    engines: tuple[Engine, Engine],
) -> None:
    # Two engines stand for two worker processes (two PostgreSQL sessions).
    mine, theirs = TranscriptLocks(engines[0]), TranscriptLocks(engines[1])
    try:
        assert mine.try_acquire(42)
        assert engines[0].pool.checkedout() == 0  # held on the dedicated connection
        assert not theirs.try_acquire(42)
        assert theirs.try_acquire(43)
        mine.release(42)
        assert theirs.try_acquire(42)
    finally:
        mine.close()
        theirs.close()


def test_threads_of_one_process_wait_for_each_other(engines: tuple[Engine, Engine]) -> None:
    locks = TranscriptLocks(engines[0])
    try:
        locks.acquire(7)
        # PostgreSQL would grant a second try on the same session: the process must not.
        seen: list[bool] = []
        probe = threading.Thread(target=lambda: seen.append(locks.try_acquire(7)))
        probe.start()
        probe.join()
        assert seen == [False]
        order: list[str] = []
        waiter = threading.Thread(target=lambda: (locks.acquire(7), order.append("waiter")))
        waiter.start()
        order.append("holder")
        locks.release(7)
        waiter.join()
        assert order == ["holder", "waiter"]
        locks.release(7)
    finally:
        locks.close()


def test_run_job_finishes_a_duplicate_in_its_claim_and_runs_a_job_once(
    make_store: Callable[[str], Store],
) -> None:
    store = make_store("postgresql")  # a clean database
    chat = Transcript.model_validate(native(1, facts=2))
    first, second = record_jobs(
        store, [chat, chat], owner=None, provenance="compaction", queue="harvest"
    )
    done = run_job(store, first)
    assert done is not None and done["status"] == "harvested"
    assert done["notes_written"] == 2
    again = run_job(store, second)  # same transcript: skipped, finished, no new notes
    assert again is not None and again["status"] == "skipped"
    assert run_job(store, first) is None  # a redelivered message of a done job
    with store.transaction() as session:
        states = dict(session.execute(select(Job.id, Job.state)).all())
        ledger_rows = session.execute(select(HarvestLedger.id)).all()
    assert states == {first: "done", second: "done"} and len(ledger_rows) == 1
