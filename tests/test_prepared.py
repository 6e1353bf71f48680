"""store.prepared: hot statements sent straight to the driver give what SQLAlchemy gives,
and fail as SQLAlchemy fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import literal, select, text
from sqlalchemy.exc import DataError, DBAPIError
from sqlalchemy.orm import Session

from store import Store, prepared
from store import jobs as job_records
from store.errors import StorageFailure
from store.keyed import KEYED
from store.models import Job
from tests.test_pool_ping import backend_pid, terminate

# An opening statement for ``Store.connection``: one that does nothing.
OPEN = [(text("SELECT 1"), {})]


def add_job(store: Store) -> str:
    record = job_records.NewJob(
        owner="ann",
        provenance="compaction",
        conversation_id="c1",
        transcript={"messages": [{"role": "user", "content": "I use vim"}], "n": 1.5},
        transcript_hash="h1",
    )
    with store.transaction() as session:
        (job_id,) = job_records.add_jobs(session, "harvest", [record])
    return job_id


def test_claim_and_finish_store_what_the_session_path_stores(store: Store) -> None:
    job_id = add_job(store)
    with store.transaction() as session:
        claimed = job_records.claim(session, job_id, lease=timedelta(seconds=60), token="t1")
    assert claimed is not None
    assert claimed.transcript == {"messages": [{"role": "user", "content": "I use vim"}], "n": 1.5}
    assert (claimed.owner, claimed.attempts, claimed.crashes) == ("ann", 1, 0)
    result = {"status": "harvested", "slugs": ["a", "b"], "model_calls": 2, "note": None}
    with store.transaction() as session:
        job_records.finish(session, job_id, result, "t1")
    with store.transaction() as session:
        row = session.execute(select(Job.state, Job.result, Job.model_calls)).one()
    assert tuple(row) == ("done", result, 2)  # the JSON column holds the dict, null and all


def test_one_added_job_is_stored_as_a_batch_stores_it(store: Store) -> None:
    one = add_job(store)  # one job: the prepared INSERT
    record = job_records.NewJob("ann", "compaction", "c1", {"n": 1.5}, "h1")
    with store.transaction() as session:  # two: the session's bulk INSERT
        batch = job_records.add_jobs(session, "harvest", [record, record])
    skipped = {"id", "transcript", "created_at", "enqueued_at"}
    with store.transaction() as session:
        rows = {
            job.id: {c.name: getattr(job, c.name) for c in Job.__table__.columns}
            for job in session.query(Job).filter(Job.id.in_([one, *batch]))
        }
    assert {k: v for k, v in rows[one].items() if k not in skipped} == {
        k: v for k, v in rows[batch[0]].items() if k not in skipped
    }
    assert rows[one]["transcript"] == {
        "messages": [{"role": "user", "content": "I use vim"}],
        "n": 1.5,
    }
    assert (rows[one]["state"], rows[one]["crashes"], rows[one]["model_calls"]) == (
        "pending",
        0,
        0,
    )


def test_rows_are_tuples_named_by_column_on_each_backend(store: Store) -> None:
    params = {"kind": "owner", "sid": "ann", "limit": 5, "terms": ["vim"]}
    with store.transaction() as session:
        assert list(prepared.execute(session, KEYED, params)) == []
        (row,) = prepared.execute(session, select(literal(7).label("seven")), {})
    assert row[0] == 7 == row.seven


def test_a_driver_error_is_raised_as_sqlalchemy_raises_it(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store("postgresql")
    with store.transaction() as session, pytest.raises(DataError):
        prepared.execute(session, text("SELECT 1 / :zero"), {"zero": 0})
    with pytest.raises(StorageFailure), store.transaction() as session:
        prepared.execute(session, text("SELECT 1 / :zero"), {"zero": 0})
    with store.transaction() as session:  # the connection went back to the pool usable
        assert list(prepared.execute(session, text("SELECT 1"), {})) == [(1,)]


def test_a_dropped_connection_is_replaced_after_one_failure(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store("postgresql")
    first = backend_pid(store)
    terminate(first)
    with pytest.raises(StorageFailure) as failed, store.transaction() as session:
        prepared.execute(session, text("SELECT 1"), {})
    cause = failed.value.__cause__
    assert isinstance(cause, DBAPIError) and cause.connection_invalidated
    assert backend_pid(store) != first


@pytest.mark.parametrize("when", ["first statement", "commit"])
def test_a_connection_dropped_in_a_pipelined_transaction_fails_it_and_is_replaced(
    make_store,  # type: ignore[no-untyped-def]
    when: str,
) -> None:
    # A harvest's write transaction sends its BEGIN with its first statement and its
    # deferred writes with its COMMIT, each in one libpq pipeline: a connection lost before
    # either is a StorageFailure that keeps nothing, and the pool hands out a fresh one.
    store = make_store("postgresql", db_pool_size=1)
    first = backend_pid(store)
    write = text("INSERT INTO housekeeping_state (name, watermark) VALUES (:name, 1)")

    def run() -> None:
        with store.connection(opening=OPEN) as connection:
            if when == "commit":
                prepared.execute(connection, write, {"name": "sent"})
            terminate(first)
            if when == "first statement":
                prepared.execute(connection, write, {"name": "never"})
            prepared.later(connection, write, {"name": "deferred"})

    with pytest.raises(StorageFailure) as failed:
        run()
    cause = failed.value.__cause__
    assert isinstance(cause, DBAPIError) and cause.connection_invalidated
    assert backend_pid(store) != first
    with store.transaction() as session:
        count = text("SELECT count(*) FROM housekeeping_state")
        assert session.execute(count).scalar_one() == 0


# --- the libpq path (PostgreSQL) ------------------------------------------------------

SEVEN = select(literal(7).label("seven"))


class Undo(Exception):
    """Raised to roll a test's transaction back."""


def rolled_back(store: Store, work: Callable[[Session], None]) -> None:
    """Run ``work`` in a transaction, then roll it back."""
    try:
        with store.transaction() as session:
            work(session)
            raise Undo
    except Undo:
        pass


def test_statements_stay_prepared_through_a_rollback_on_their_connection(make_store) -> None:  # type: ignore[no-untyped-def]
    # psycopg, once it has prepared a statement of its own, answers a rollback with
    # DEALLOCATE ALL; the store turns its automatic preparation off so that never happens.
    store = make_store("postgresql", db_pool_size=1)
    pid = backend_pid(store)
    with store.statements() as session:
        assert list(prepared.execute(session, SEVEN, {})) == [(7,)]

    def count_often(session: Session) -> None:
        for _ in range(10):  # often enough for psycopg to have prepared it, were it on
            session.execute(text("SELECT count(*) FROM jobs")).scalar_one()

    rolled_back(store, count_often)
    with store.connection(opening=OPEN) as session:  # in a transaction: no retry
        assert list(prepared.execute(session, SEVEN, {})) == [(7,)]
    assert backend_pid(store) == pid  # one connection all along


def test_a_deallocated_statement_is_prepared_again(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store("postgresql", db_pool_size=1)
    with store.statements() as connection:
        prepared.execute(connection, SEVEN, {})
        connection.exec_driver_sql("DEALLOCATE ALL")
        # Outside a transaction the statement is prepared again and sent once more.
        assert list(prepared.execute(connection, SEVEN, {})) == [(7,)]
        connection.exec_driver_sql("DEALLOCATE ALL")
    # Inside one the failure has aborted it: the caller's retry finds it prepared again.
    with pytest.raises(StorageFailure), store.connection(opening=OPEN) as session:
        prepared.execute(session, SEVEN, {})
    with store.connection(opening=OPEN) as session:
        assert list(prepared.execute(session, SEVEN, {})) == [(7,)]


def test_a_parameter_sent_with_other_types_gets_a_statement_of_its_own(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store("postgresql")
    doubled = text("SELECT :n * 2 AS twice")
    with store.statements() as session:
        # psycopg sends a small int as int2 and a large one as int8, a float as float8.
        for value in (3, 2**40, 1.5, 3):
            (row,) = prepared.execute(session, doubled, {"n": value})
            assert row.twice == value * 2


def test_the_first_statement_of_a_transaction_opens_it(make_store) -> None:  # type: ignore[no-untyped-def]
    # Out of autocommit, the first statement goes through psycopg's cursor, which sends the
    # BEGIN: a claim in a transaction that then fails is rolled back with it.
    store = make_store("postgresql")
    job_id = add_job(store)

    def claim(session: Session) -> None:
        claimed = job_records.claim(session, job_id, lease=timedelta(seconds=60), token="t1")
        assert claimed is not None
        (again,) = prepared.execute(session, select(Job.state).where(Job.id == job_id), {})
        assert again.state == "running"  # the second statement, on the libpq path

    rolled_back(store, claim)
    with store.transaction() as session:
        assert session.execute(select(Job.state, Job.attempts)).one() == ("pending", 0)


def test_at_most_max_prepared_statements_stay_prepared_on_a_connection(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store("postgresql", db_pool_size=1)
    shapes = [select(literal(n).label(f"n{n}")) for n in range(prepared.MAX_PREPARED + 5)]
    with store.statements() as connection:
        for n, statement in enumerate(shapes):
            assert list(prepared.execute(connection, statement, {})) == [(n,)]
        kept = connection.exec_driver_sql(
            "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'gleaner_%%'"
        ).scalar_one()
        assert kept == prepared.MAX_PREPARED  # the oldest were closed as new ones came
        assert list(prepared.execute(connection, shapes[0], {})) == [(0,)]  # prepared again


def test_other_threads_run_while_a_pipelined_transaction_waits_for_the_server(make_store) -> None:  # type: ignore[no-untyped-def]
    # Under `--pool threads` one process runs dozens of harvests: a write transaction waiting
    # on PostgreSQL's answer must not stop the others (nor the lease heartbeat) meanwhile.
    store = make_store("postgresql")
    ticks: list[float] = []
    stop, ticking = threading.Event(), threading.Event()

    def tick() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            ticking.set()
            time.sleep(0.001)  # a tick a millisecond: the other thread's steady work

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        assert ticking.wait(10)
        slow = [(text("SELECT pg_sleep(0.6)"), {})]
        with store.connection(opening=slow) as connection:
            started = time.monotonic()
            (row,) = prepared.execute(connection, SEVEN, {})  # sent with the BEGIN and the sleep
            waited = time.monotonic() - started
    finally:
        stop.set()
        ticker.join()
    assert row.seven == 7 and waited >= 0.6
    during = [t for t in ticks if started <= t <= started + waited]
    gaps = [b - a for a, b in zip([started, *during], [*during, started + waited], strict=True)]
    # A duration is the promise (the lease heartbeat must not stand still for the length of
    # a server's answer): no event marks "not stalled", so the gaps are measured.
    assert max(gaps) < 0.3, f"the other thread stood still for {max(gaps):.2f} s"


def test_statements_sent_together_on_a_driver_connection_stand_or_fall_together(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store("postgresql")
    job_id = add_job(store)
    dialect = store.engine.dialect
    bump = text("UPDATE jobs SET attempts = attempts + 1 WHERE id = :id RETURNING attempts")
    lock = text("SELECT pg_try_advisory_lock(:key)")
    with store.engine.connect() as connection:
        driver = connection.connection.driver_connection
        driver.autocommit = True
        first, second = prepared.on_driver_each(
            driver, dialect, [(bump, {"id": job_id}), (bump, {"id": job_id})]
        )
        assert [tuple(first[0]), tuple(second[0])] == [(1,), (2,)]  # in order, each its rows
        with pytest.raises(psycopg.errors.DivisionByZero):  # the second fails: the first
            prepared.on_driver_each(  # is undone with it, and the driver's error raised
                driver, dialect, [(bump, {"id": job_id}), (select(literal(1) / 0), {})]
            )
        [[(held,)], [(attempts,)]] = prepared.on_driver_each(  # the connection works on
            driver, dialect, [(lock, {"key": 7}), (bump, {"id": job_id})]
        )
        assert held and attempts == 3
        driver.execute("SELECT pg_advisory_unlock_all()")
        driver.autocommit = False
    with store.transaction() as session:
        assert session.get(Job, job_id).attempts == 3  # type: ignore[union-attr]


def test_parameters_are_found_as_sqlalchemy_finds_them() -> None:
    from datetime import timedelta

    from sqlalchemy import bindparam
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.exc import InvalidRequestError

    from store import ledger

    dialect = postgresql.psycopg.dialect()  # type: ignore[no-untyped-call]
    lease = timedelta(seconds=120)
    claim = {"job_id": "j1", "lease": lease, "token": "t1", "worker": "w:1"}
    cases = [
        (job_records._CLAIM_PG, {**claim, "redelivered": True}),  # literals: state, 1, off
        (
            ledger._STATE,
            {"owner_key": "o", "conversation_key": "c", "tombstone": "t", "kind": "owner"}
            | {"sid": "a", "digest": "d", "version": "v"},
        ),
        (select(literal(5) + bindparam("x", value=3)), {}),  # a bind's own value
        (select(literal(5) + bindparam("x", value=3)), {"x": 4}),  # the caller's wins
        (select(literal(5) + bindparam("x", callable_=lambda: 7)), {}),
    ]
    for statement, params in cases:
        plan = prepared._plan(statement, dialect)
        assert plan.sources is not None
        assert prepared._arguments(plan, params) == prepared._constructed(plan, params)
    missing = prepared._plan(select(literal(5) + bindparam("x")), dialect)
    with pytest.raises(InvalidRequestError, match="required for bind parameter 'x'"):
        prepared._arguments(missing, {})
