"""The per-process transcript locks: exclusive across processes and threads, no pooled
connection held, and run_job's merged transactions keep exactly-once outcomes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import create_engine, select, text

from harvest.queue import record_jobs, run_job
from harvest.transcript import Transcript
from store import Scope, StorageFailure, Store
from store.locks import locks_for, transcript_key
from store.models import HarvestLedger, Job
from tests.conftest import test_settings
from tests.samples import native

DIGEST = "ab" * 32
ALICE = Scope.owner("alice")


@pytest.fixture
def stores(pg_url: str) -> Iterator[tuple[Store, Store]]:
    # Two stores stand for two worker processes: two engines, two PostgreSQL sessions.
    first = Store(pg_url, settings=test_settings(db_pool_size=1))
    second = Store(pg_url, settings=test_settings(db_pool_size=1))
    yield first, second
    for store in (first, second):
        locks_for(store.engine).close()
        store.dispose()


@pytest.mark.postgres
def test_a_lock_is_exclusive_across_processes_and_costs_no_pooled_connection(
    stores: tuple[Store, Store],
) -> None:
    mine = stores[0].transcript_lock(ALICE, DIGEST)
    theirs = stores[1].transcript_lock(ALICE, DIGEST)
    elsewhere = stores[1].transcript_lock(Scope.owner("bob"), DIGEST)  # another scope
    assert mine.try_acquire()
    assert stores[0].engine.pool.checkedout() == 0  # held on the dedicated connection
    assert not theirs.try_acquire()
    assert elsewhere.try_acquire()
    mine.release()
    assert theirs.try_acquire()
    theirs.release()
    elsewhere.release()
    mine.release()  # released twice: nothing happens
    with stores[1].transcript_lock(ALICE, DIGEST):
        assert not mine.try_acquire()
    assert mine.try_acquire()
    mine.release()


@pytest.mark.postgres
def test_threads_of_one_process_wait_for_each_other(stores: tuple[Store, Store]) -> None:
    store = stores[0]
    holder = store.transcript_lock(ALICE, DIGEST)
    holder.acquire()
    # PostgreSQL would grant a second try on the same session: the process must not.
    seen: list[bool] = []
    probe = threading.Thread(
        target=lambda: seen.append(store.transcript_lock(ALICE, DIGEST).try_acquire())
    )
    probe.start()
    probe.join()
    assert seen == [False]
    order: list[str] = []

    def wait_then_take() -> None:
        with store.transcript_lock(ALICE, DIGEST):
            order.append("waiter")

    waiter = threading.Thread(target=wait_then_take)
    waiter.start()
    order.append("holder")
    holder.release()
    waiter.join()
    assert order == ["holder", "waiter"]
    assert holder.try_acquire()  # the waiter released it at the end of its block
    holder.release()


@pytest.mark.postgres
def test_a_lost_lock_connection_is_a_storage_failure_and_reconnects(
    stores: tuple[Store, Store], pg_url: str
) -> None:
    store = stores[0]
    lock = store.transcript_lock(ALICE, DIGEST)
    assert lock.try_acquire()
    key = transcript_key(ALICE, DIGEST) & 0xFFFF_FFFF_FFFF_FFFF  # as pg_locks splits it
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:  # a database restart, as far as the lock's session can tell
        ended = conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND classid = :high AND objid = :low AND objsubid = 1"
            ),
            {"high": key >> 32, "low": key & 0xFFFF_FFFF},
        ).all()
    admin.dispose()
    assert ended == [(True,)]
    other = store.transcript_lock(Scope.owner("bob"), DIGEST)
    with pytest.raises(StorageFailure):
        other.try_acquire()
    assert other.try_acquire()  # a fresh connection; the lost session's locks are gone
    other.release()
    assert stores[1].transcript_lock(ALICE, DIGEST).try_acquire()


def test_sqlite_grants_every_lock(make_store: Callable[[str], Store]) -> None:
    store = make_store("sqlite")
    first = store.transcript_lock(ALICE, DIGEST)
    assert first.try_acquire() and store.transcript_lock(ALICE, DIGEST).try_acquire()
    first.release()


@pytest.mark.postgres
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
