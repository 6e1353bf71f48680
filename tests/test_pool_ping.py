"""Pooled PostgreSQL connections: pinged after sitting idle, trusted right after use."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from gleaner.store import Store, db
from gleaner.store.errors import StorageFailure
from tests.conftest import PG_BASE_URL


def backend_pid(store: Store) -> int:
    with store.transaction() as session:
        return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate(pid: int) -> None:
    admin = create_engine(PG_BASE_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
        gone = text("SELECT 1 FROM pg_stat_activity WHERE pid = :p")
        deadline = time.monotonic() + 30
        while conn.execute(gone, {"p": pid}).first():
            assert time.monotonic() < deadline, f"backend {pid} still there"
            time.sleep(0.01)
    admin.dispose()


@pytest.fixture
def pg_store(make_store, monkeypatch: pytest.MonkeyPatch) -> Store:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(db, "PING_AFTER_IDLE_SECONDS", 0.3)
    return make_store("postgresql")


def test_a_connection_dead_while_idle_is_replaced_unseen(pg_store: Store) -> None:
    first = backend_pid(pg_store)
    terminate(first)  # a database restart while the pool sat idle
    # Idle past PING_AFTER_IDLE_SECONDS (0.3 s, made short): the idle time is the condition.
    time.sleep(0.4)
    second = backend_pid(pg_store)  # the ping found it dead: a fresh connection, no error
    assert second != first
    assert backend_pid(pg_store) == second  # and that one is kept


def test_a_connection_dead_right_after_use_fails_once_then_the_pool_recovers(
    pg_store: Store,
) -> None:
    first = backend_pid(pg_store)
    terminate(first)
    # Back from use a moment ago: not pinged, so the first statement meets the dead
    # connection and the caller gets a StorageFailure it can retry (a Celery task does).
    with pytest.raises(StorageFailure):
        backend_pid(pg_store)
    assert backend_pid(pg_store) != first
