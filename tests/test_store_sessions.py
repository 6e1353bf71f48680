"""``Store.transaction``, ``Store.connection`` and ``Store.statements``: what a failure
part-way leaves behind."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import pytest
from sqlalchemy import bindparam, insert, select, text
from sqlalchemy.exc import DBAPIError

from store import Executor, StorageFailure, Store, StoreError, prepared
from store.models import HousekeepingState

# An opening statement for ``Store.connection``: one that does nothing.
OPEN = [(text("SELECT 1"), {})]


def names(store: Store) -> list[str]:
    """The housekeeping rows the test wrote (not the search index's own, which migrate
    records)."""
    with store.transaction() as session:
        found = session.execute(select(HousekeepingState.name)).scalars()
        return [name for name in found if name != "search_index"]


def write_then_fail(session_of: AbstractContextManager[Executor], name: str) -> None:
    def run() -> None:
        with session_of as session:
            session.execute(insert(HousekeepingState).values(name=name, watermark=1))
            raise RuntimeError("after the write")

    with pytest.raises(RuntimeError, match="after the write"):
        run()


def test_statements_commit_each_write_on_postgresql_only(store: Store, backend: str) -> None:
    write_then_fail(store.statements(), "kept")
    # PostgreSQL: autocommit, the write stood alone. SQLite: one transaction, rolled back.
    assert names(store) == (["kept"] if backend == "postgresql" else [])


def test_a_transaction_after_statements_is_still_one_transaction(
    store: Store, backend: str
) -> None:
    for _ in range(3):  # the pooled connection goes back to transactions after each use
        with store.statements() as session:
            session.execute(select(1))
        write_then_fail(store.transaction(), "rolled-back")
    assert names(store) == []


def test_a_transaction_with_an_opening_statement_is_one_transaction(
    store: Store, backend: str
) -> None:
    # On PostgreSQL the opening rides in the BEGIN's message on an autocommit connection:
    # the writes after it must still roll back together and commit together.
    for _ in range(3):  # and leave the pooled connection fit for the next transaction
        write_then_fail(store.connection(opening=OPEN), "rolled-back")
        write_then_fail(store.transaction(), "rolled-back-too")
    assert names(store) == []
    with store.connection(opening=OPEN) as session:
        session.execute(insert(HousekeepingState).values(name="first", watermark=1))
        session.execute(insert(HousekeepingState).values(name="second", watermark=1))
    assert sorted(names(store)) == ["first", "second"]


def test_a_failed_statement_inside_an_opened_transaction_keeps_nothing(store: Store) -> None:
    def run() -> None:
        with store.connection(opening=OPEN) as session:
            session.execute(insert(HousekeepingState).values(name="written", watermark=1))
            session.execute(insert(HousekeepingState).values(name="written", watermark=1))

    with pytest.raises(StoreError):  # the second row breaks the primary key
        run()
    assert names(store) == []


def test_an_opening_that_fails_is_a_storage_failure_and_opens_nothing(store: Store) -> None:
    def run() -> None:
        with store.connection(opening=[(text("SELECT * FROM no_such_table"), {})]) as session:
            session.execute(insert(HousekeepingState).values(name="never", watermark=1))

    with pytest.raises(StorageFailure, match="no_such_table"):
        run()
    write_then_fail(store.connection(opening=OPEN), "rolled-back")  # usable again
    with store.connection(opening=OPEN) as session:
        session.execute(insert(HousekeepingState).values(name="after", watermark=1))
    assert names(store) == ["after"]


def test_an_opened_transaction_whose_statement_failed_is_not_reported_committed(
    make_store,  # type: ignore[no-untyped-def]
) -> None:
    # On PostgreSQL a failed statement aborts the transaction: a COMMIT after an error the
    # caller swallowed is answered with ROLLBACK, and that must not pass for a commit.
    store = make_store("postgresql")

    def run() -> None:
        with store.connection(opening=OPEN) as connection:
            connection.execute(insert(HousekeepingState).values(name="lost", watermark=1))
            with contextlib.suppress(StorageFailure, DBAPIError):
                connection.execute(text("SELECT * FROM no_such_table"))

    with pytest.raises(StorageFailure, match="rolled back, not committed"):
        run()
    assert names(store) == []


def test_a_swallowed_failure_of_the_first_statement_is_not_reported_committed(
    make_store,  # type: ignore[no-untyped-def]
) -> None:
    # The BEGIN and the opening travel with the first statement: when that one fails, what
    # runs after it is still inside the (aborted) transaction, never committed on its own.
    store = make_store("postgresql")

    def run() -> None:
        with store.connection(opening=OPEN) as connection:
            with contextlib.suppress(StorageFailure, DBAPIError):
                prepared.execute(connection, text("SELECT * FROM no_such_table"), {})
            with contextlib.suppress(StorageFailure, DBAPIError):
                connection.execute(insert(HousekeepingState).values(name="lost", watermark=1))

    with pytest.raises(StorageFailure, match="rolled back, not committed"):
        run()
    assert names(store) == []


# A write deferred to the COMMIT (``prepared.later``), and the error a duplicate of it stands for.
DEFERRED = insert(HousekeepingState).values(name=bindparam("name"), watermark=1)


class Taken(StoreError):
    reason = "taken"


def test_deferred_writes_commit_with_the_transaction_or_not_at_all(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store("postgresql")
    with store.connection(opening=OPEN) as connection:
        assert prepared.deferring(connection)
        prepared.execute(connection, DEFERRED, {"name": "first"})
        prepared.later(connection, DEFERRED, {"name": "deferred"})
        assert names(store) == []  # not even sent yet
    assert sorted(names(store)) == ["deferred", "first"]

    def fail() -> None:
        with store.connection(opening=OPEN) as connection:
            prepared.later(connection, DEFERRED, {"name": "never"})
            raise RuntimeError("before the commit")

    with pytest.raises(RuntimeError):
        fail()
    with store.connection(opening=OPEN) as connection:  # nothing but deferred writes
        prepared.later(connection, DEFERRED, {"name": "alone"})
    with store.connection(opening=OPEN) as connection:
        assert not prepared.deferring(connection.engine.connect())
    assert sorted(names(store)) == ["alone", "deferred", "first"]


def test_a_deferred_write_that_fails_at_the_commit_keeps_nothing(make_store) -> None:  # type: ignore[no-untyped-def]
    store = make_store("postgresql")
    with store.connection(opening=OPEN) as connection:
        prepared.later(connection, DEFERRED, {"name": "kept"})

    def duplicate(conflict: type[StoreError] | None) -> None:
        with store.connection(opening=OPEN) as connection:
            prepared.execute(connection, DEFERRED, {"name": "lost"})
            prepared.later(connection, DEFERRED, {"name": "also-lost"})
            prepared.later(
                connection,
                DEFERRED,
                {"name": "kept"},  # the primary key is taken
                conflict=None if conflict is None else (lambda: conflict("taken")),
            )
            prepared.later(connection, DEFERRED, {"name": "after"})

    with pytest.raises(Taken, match="taken"):  # the caller's error for a duplicate
        duplicate(Taken)
    with pytest.raises(StorageFailure, match="duplicate key"):  # the driver's otherwise
        duplicate(None)
    assert names(store) == ["kept"]
    with store.connection(opening=OPEN) as connection:  # the connection is fit for use
        prepared.later(connection, DEFERRED, {"name": "next"})
    assert sorted(names(store)) == ["kept", "next"]


NAMES = select(HousekeepingState.name).where(HousekeepingState.name.like(bindparam("like")))


def count_trips(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Round trips the short path sends from now on (a pipeline or a single statement)."""
    trips: list[int] = []
    exchange, run = prepared._exchange, prepared._run
    monkeypatch.setattr(
        prepared, "_exchange", lambda *a, **k: trips.append(len(a[1])) or exchange(*a, **k)
    )
    monkeypatch.setattr(prepared, "_run", lambda *a, **k: trips.append(1) or run(*a, **k))
    return trips


def test_a_read_sent_ahead_is_answered_without_a_round_trip_until_a_write(
    make_store,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = make_store("postgresql")
    with store.connection(opening=OPEN) as connection:
        prepared.execute(connection, DEFERRED, {"name": "a-1"})
    trips = count_trips(monkeypatch)
    with store.connection(opening=OPEN) as connection:
        prepared.ahead(connection, NAMES, {"like": "a-%"})
        prepared.ahead(connection, NAMES, {"like": "b-%"})
        assert prepared.execute(connection, text("SELECT 2"), {}) == [(2,)]
        assert trips == [5]  # the BEGIN, the opening, both reads and the statement
        # Another transaction commits meanwhile: an answer sent ahead may miss it, as a
        # READ COMMITTED read sent a moment sooner would.
        with store.connection(opening=OPEN) as other:
            prepared.execute(other, DEFERRED, {"name": "a-2"})
        assert [row.name for row in prepared.execute(connection, NAMES, {"like": "a-%"})] == ["a-1"]
        assert trips == [5, 3, 1]  # the other's two; this one answered without a round trip
        assert prepared.execute(connection, NAMES, {"like": "a-%"}) != []  # an answer serves once
        assert trips == [5, 3, 1, 1]
        # A write sent on the connection drops what was read ahead: the read goes out again.
        prepared.execute(connection, DEFERRED, {"name": "b-1"})
        found = prepared.execute(connection, NAMES, {"like": "b-%"})
        assert [row.name for row in found] == ["b-1"] and trips == [5, 3, 1, 1, 1, 1]
    # SQLAlchemy's own writes on the connection drop answers too; other parameters miss.
    with store.connection(opening=OPEN) as connection:
        prepared.ahead(connection, NAMES, {"like": "c-%"})
        prepared.ahead(connection, NAMES, {"like": "a-%"})
        assert prepared.execute(connection, NAMES, {"like": "zz"}) == []
        connection.execute(insert(HousekeepingState).values(name="c-1", watermark=1))
        assert [row.name for row in prepared.execute(connection, NAMES, {"like": "c-%"})] == ["c-1"]
    # A write that is the transaction's first statement goes after the reads sent ahead,
    # in their round trip: it drops their answers too.
    with store.connection(opening=OPEN) as connection:
        prepared.ahead(connection, NAMES, {"like": "d-%"})
        prepared.execute(connection, DEFERRED, {"name": "d-1"})
        assert [row.name for row in prepared.execute(connection, NAMES, {"like": "d-%"})] == ["d-1"]
    # Once the transaction is under way, or outside one, nothing is sent ahead.
    with store.connection(opening=OPEN) as connection:
        prepared.execute(connection, text("SELECT 1"), {})
        prepared.ahead(connection, NAMES, {"like": "a-%"})
        assert len(prepared.execute(connection, NAMES, {"like": "a-%"})) == 2
    with store.statements() as connection:
        prepared.ahead(connection, NAMES, {"like": "a-%"})
        assert len(prepared.execute(connection, NAMES, {"like": "a-%"})) == 2


def test_a_pipeline_never_sends_a_statement_its_own_preparing_evicted(
    make_store,  # type: ignore[no-untyped-def]
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A connection keeps at most MAX_PREPARED statements prepared; the least recently used
    goes. A transaction's first round trip prepares every statement it sends before sending
    any: one in use there must not be the one that goes."""
    store = make_store("postgresql", db_pool_size=1)
    monkeypatch.setattr(prepared, "MAX_PREPARED", 2)
    first, second = text("SELECT 1 AS first"), text("SELECT 2 AS second")
    with store.connection(opening=[(first, {})]) as connection:  # prepares first, then second
        assert prepared.execute(connection, second, {}) == [(2,)]
    # first (the oldest prepared) and a third, new one, in one round trip: preparing the
    # third makes room by dropping second, not first.
    with store.connection(opening=[(first, {})]) as connection:
        assert prepared.execute(connection, text("SELECT 3 AS third"), {}) == [(3,)]
        assert prepared.opened(connection) == [(1,)]
