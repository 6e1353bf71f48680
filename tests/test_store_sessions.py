"""``Store.transaction``, ``Store.connection`` and ``Store.statements``: what a failure
part-way leaves behind."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import pytest
from sqlalchemy import insert, select, text
from sqlalchemy.exc import DBAPIError

from gleaner.store import Executor, StorageFailure, Store, StoreError
from gleaner.store.schema.models import HousekeepingState

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
    # When the first statement fails, what runs after it is still inside the (aborted)
    # transaction, never committed on its own; an ORM session's transaction alike.
    store = make_store("postgresql")

    def run(session_of: AbstractContextManager[Executor]) -> None:
        with session_of as session:
            with contextlib.suppress(StorageFailure, DBAPIError):
                session.execute(text("SELECT * FROM no_such_table"))
            with contextlib.suppress(StorageFailure, DBAPIError):
                session.execute(insert(HousekeepingState).values(name="lost", watermark=1))

    for session_of in (store.connection(opening=OPEN), store.connection(), store.transaction()):
        with pytest.raises(StorageFailure, match="rolled back, not committed"):
            run(session_of)
    assert names(store) == []
    with store.connection(opening=OPEN) as connection:  # the pooled connection is fit for use
        connection.execute(insert(HousekeepingState).values(name="next", watermark=1))
    assert names(store) == ["next"]
