"""The per-process transcript locks (``Store.transcript_lock``): exclusive across processes
and threads, no pooled connection held; run_job's merged transactions keep exactly-once
outcomes, and a job whose transcript another worker holds waits and finds its ledger row."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, select, text

from gleaner.harvest.job import extract_notes, look_up, record_harvest
from gleaner.harvest.outcome import HarvestOutcome
from gleaner.harvest.plan import plan_harvest
from gleaner.harvest.queue import record_jobs, run_job
from gleaner.harvest.transcript import Transcript
from gleaner.store import Scope, StorageFailure, Store, TranscriptLock
from gleaner.store.jobs import ledger
from gleaner.store.jobs.locks import locks_for, transcript_key
from gleaner.store.owners import forget
from gleaner.store.schema.models import HarvestLedger, Job
from tests.conftest import test_settings
from tests.llm_server import answer, llm_server, note
from tests.samples import native
from tests.test_harvest_job import model_settings, transcript
from tests.test_same_fact import ledger_entry

DIGEST = "ab" * 32
ALICE = Scope.owner("alice")


@pytest.fixture
def stores(pg_url: str) -> Iterator[tuple[Store, Store]]:
    # Two stores stand for two worker processes: two engines, two PostgreSQL sessions.
    first = Store(pg_url, settings=test_settings(db_pool_size=1))
    second = Store(pg_url, settings=test_settings(db_pool_size=1))
    yield first, second
    for store in (first, second):
        store.dispose()  # its lock connection too


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
def test_dispose_closes_the_lock_connection_and_releases_its_locks(
    stores: tuple[Store, Store],
) -> None:
    first, second = stores
    held = locks_for(first.engine)
    assert first.transcript_lock(ALICE, DIGEST).try_acquire()
    first.dispose()  # without releasing the lock, as a caller that is done would
    assert held.closed()
    assert second.transcript_lock(ALICE, DIGEST).try_acquire()  # the server released it
    assert locks_for(first.engine) is not held  # used again: a new connection on demand
    assert not first.transcript_lock(ALICE, DIGEST).try_acquire()


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


class Interrupted(BaseException):
    """Stands for Celery's soft time limit, raised in the middle of a round trip."""


@pytest.mark.postgres
def test_a_lock_interrupted_mid_release_is_not_left_held_by_nobody(
    stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = stores[0].transcript_lock(ALICE, DIGEST)
    assert mine.try_acquire()

    def interrupted(*_args: object, **_kwargs: object) -> None:
        raise Interrupted()

    with monkeypatch.context() as patch:
        # The unlock's statement, on the lock's own (psycopg) connection.
        patch.setattr(locks_for(stores[0].engine).connection, "execute", interrupted)
        with pytest.raises(Interrupted):
            mine.release()
    # The unlock never ran, but its session was closed: the other process takes the lock.
    theirs = stores[1].transcript_lock(ALICE, DIGEST)
    assert theirs.try_acquire()
    theirs.release()
    assert mine.try_acquire()  # and this one reconnects
    mine.release()


@pytest.mark.postgres
def test_a_harvest_transaction_holds_off_a_forget_from_its_first_statement(
    stores: tuple[Store, Store],
) -> None:
    harvest, operator = stores
    key = forget.lock_key(ALICE)

    def forget_could_lock() -> bool:  # what forget_owner takes first, tried from elsewhere
        with operator.transaction() as session:
            taken = session.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": key})
            return bool(taken.scalar_one())

    with forget.held_off(harvest, ALICE) as session:
        assert forget.is_held_off(session, ALICE)
        assert not forget.is_held_off(session, Scope.owner("bob"))
        # Taken as the transaction opens, before any statement of its own, and held on.
        assert not forget_could_lock()
        session.execute(text("SELECT 1"))
        assert not forget_could_lock()
    assert forget_could_lock()  # the commit let go


@pytest.mark.postgres
def test_a_forget_committed_before_the_harvest_transaction_is_seen(
    stores: tuple[Store, Store],
) -> None:
    # The ledger row is written only while the forget count is the planned one, read as the
    # row is written (under the lock): a forget that committed after the harvest planned is
    # counted, so the row (planned with the old count) is refused and its notes roll back.
    harvest, operator = stores
    carol = Scope.owner("carol")  # forgotten here: no other test's owner
    operator.forget_owner(carol.id)  # after the plan (generation 0), before the write
    with forget.held_off(harvest, carol) as session:
        entry = ledger_entry("d1", "v1")
        assert not ledger.record(session, carol, entry, generation=0)
        assert ledger.record(session, carol, entry, generation=1)
    with operator.transaction() as check:
        recorded = select(HarvestLedger.transcript_hash).where(HarvestLedger.scope_id == carol.id)
        assert check.execute(recorded).scalars().all() == ["d1"]


def test_record_harvest_refuses_a_transaction_that_does_not_hold_off_a_forget(
    store: Store,
) -> None:
    chat = transcript("We decided to adopt Kotlin.")
    plan = plan_harvest(store.settings, chat, owner=None, provenance="compaction")
    with store.transaction() as session:
        ready = look_up(session, store.settings, plan)
        assert ready is not None
        found = extract_notes(plan, ready, store.settings)
        assert not isinstance(found, HarvestOutcome)
        with pytest.raises(RuntimeError, match="held_off"):
            record_harvest(session, store.settings, plan, ready, found)
    assert store.fingerprint(plan.scope)[0] == 0


def test_the_mark_of_a_held_off_transaction_ends_with_it(make_store) -> None:  # type: ignore[no-untyped-def]
    # held_off marks its pooled connection, whose info outlives the transaction: the next
    # transaction on the same connection must not pass for one that holds off a forget.
    for backend in ("sqlite", "postgresql"):
        store = make_store(backend, db_pool_size=1)
        with forget.held_off(store, ALICE) as held:
            assert forget.is_held_off(held, ALICE)
            pooled = held.connection.dbapi_connection
        with store.connection() as again:
            assert again.connection.dbapi_connection is pooled
            assert not forget.is_held_off(again, ALICE)
        with pytest.raises(RuntimeError), forget.held_off(store, ALICE):
            raise RuntimeError("a failed harvest")
        with store.connection() as again:
            assert not forget.is_held_off(again, ALICE)


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


@pytest.mark.postgres
def test_a_job_whose_transcript_is_held_elsewhere_waits_then_finds_its_ledger_row(
    make_store: Callable[..., Store], pg_url: str
) -> None:
    with llm_server() as server:
        settings = model_settings(server)
        store = SaysWhenItWaits(make_store("postgresql", **settings))
        other = Store(pg_url, settings=test_settings(**settings))  # another worker process
        chat = transcript("We decided to adopt Kotlin.")
        [job_id] = record_jobs(store, [chat], owner=None, provenance="compaction", queue="harvest")
        plan = plan_harvest(store.settings, chat, owner=None, provenance="compaction")
        held = other.transcript_lock(plan.scope, plan.digest)
        assert held.try_acquire()
        results: list[dict[str, object] | None] = []
        runner = threading.Thread(target=lambda: results.append(run_job(store, job_id)))
        try:
            runner.start()
            # The claim is committed (the first transaction) while the job waits for the lock.
            assert store.waiting.wait(20)
            assert job_state(store, job_id) == "running" and runner.is_alive()
            # The other worker harvests it and commits its ledger row before it lets go.
            server.script(answer([note("Adopted Kotlin", type="decision")]))
            with forget.held_off(other, plan.scope) as session:
                ready = look_up(session, other.settings, plan)
                assert ready is not None
                found = extract_notes(plan, ready, other.settings)
                assert not isinstance(found, HarvestOutcome)
                record_harvest(session, other.settings, plan, ready, found)
            held.release()
            runner.join(timeout=30)
        finally:
            held.release()
            runner.join(timeout=30)
            locks_for(other.engine).close()
            other.dispose()
        [result] = results
        assert result is not None and result["status"] == "skipped"
        assert server.calls == 1  # the waiting job made no model call of its own
        assert job_state(store, job_id) == "done"
        store.dispose()


class SaysWhenItWaits(Store):
    """A store whose transcript locks set ``waiting`` when a run starts waiting for one
    (``TranscriptLock.acquire``: the lock was found held elsewhere)."""

    def __init__(self, store: Store) -> None:
        super().__init__(store.database_url, settings=store.settings)
        self.waiting = threading.Event()

    def transcript_lock(self, scope: Any, digest: str) -> TranscriptLock:
        lock = super().transcript_lock(scope, digest)
        acquire = lock.acquire

        def announced() -> None:
            self.waiting.set()
            acquire()

        lock.acquire = announced  # type: ignore[method-assign]
        return lock


def job_state(store: Store, job_id: str) -> str:
    with store.transaction() as session:
        return str(session.execute(select(Job.state).where(Job.id == job_id)).scalar_one())


@pytest.mark.postgres
def test_the_ledger_check_follows_the_lock(stores: tuple[Store, Store]) -> None:
    mine, theirs = stores
    scope = Scope.owner("dora")  # no other test's owner
    with mine.transaction() as session:
        ledger.record(session, scope, ledger_entry("d0", "v1"), generation=0)

    def check(store: Store, digest: str) -> ledger.Checked | None:
        lock = store.transcript_lock(scope, digest)
        with store.statements() as session:
            found = ledger.check_locked(session, lock, scope, digest, "v1", terms=[], keys=5)
        assert lock.held == (found is not None)
        return found

    held = theirs.transcript_lock(scope, "d1")
    assert held.try_acquire()
    assert check(mine, "d1") is None  # held elsewhere: nothing checked, nothing held
    # The other worker records the transcript before it lets go: the check, run after the
    # lock was granted, sees the row.
    with theirs.transaction() as session:
        ledger.record(session, scope, ledger_entry("d1", "v1"), generation=0)
    held.release()
    assert check(mine, "d1") == (0, True, [])
    assert check(mine, "d2") == (0, False, [])  # never harvested: to do, under the lock
    assert check(mine, "d0") == (0, True, [])
    assert not theirs.transcript_lock(scope, "d2").try_acquire()  # mine holds it now
