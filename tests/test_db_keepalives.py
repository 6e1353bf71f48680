"""A PostgreSQL peer that vanished is noticed in about a minute on both sides of every
connection the store opens: its pool's and its transcript locks' own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from gleaner.store import Scope, Store, db
from gleaner.store.jobs.locks import locks_for
from tests.conftest import test_settings

SERVER = "SELECT name, setting::bigint FROM pg_settings WHERE name = ANY(:names) ORDER BY name"
NAMES = sorted(db.SERVER_KEEPALIVES)


@pytest.fixture
def open_store(pg_url: str) -> Iterator[object]:
    """Factory: a store on the test database through ``pg_url`` plus ``query``."""
    host = make_url(pg_url).host or ""
    if not host or host.startswith("/"):
        pytest.skip("keepalives apply to TCP connections: GLEANER_TEST_PG_URL is a socket")
    opened: list[Store] = []

    def factory(**query: str) -> Store:
        url = make_url(pg_url).update_query_dict(query).render_as_string(hide_password=False)
        store = Store(url, settings=test_settings())
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.dispose()


def server_side(store: Store) -> dict[str, int]:
    with store.transaction() as session:
        rows = session.execute(text(SERVER), {"names": NAMES}).all()
    return dict(rows)


def client_side(store: Store) -> dict[str, str]:
    with store.engine.connect() as connection:
        driver = connection.connection.dbapi_connection
        assert driver is not None
        found = driver.info.get_parameters()
    return {key: found[key] for key in db.CLIENT_KEEPALIVES if key in found}


def test_a_pooled_connection_has_short_keepalives_on_both_sides(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store()
    assert server_side(store) == {
        "tcp_keepalives_count": 3,
        "tcp_keepalives_idle": 30,
        "tcp_keepalives_interval": 10,
        "tcp_user_timeout": 60_000,
    }
    assert client_side(store) == {
        "keepalives": "1",
        "keepalives_idle": "30",
        "keepalives_interval": "10",
        "keepalives_count": "3",
        "tcp_user_timeout": "60000",
    }


def test_the_transcript_lock_connection_has_them_too(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store()
    lock = store.transcript_lock(Scope(kind="owner", id="ada"), "f" * 64)
    assert lock.try_acquire()  # opens the lock's own connection
    try:
        on_it = locks_for(store.engine).connection
        rows = on_it.execute(SERVER.replace(":names", "%s"), (NAMES,)).fetchall()
        assert dict(tuple(row) for row in rows) == {
            "tcp_keepalives_count": 3,
            "tcp_keepalives_idle": 30,
            "tcp_keepalives_interval": 10,
            "tcp_user_timeout": 60_000,
        }
    finally:
        lock.release()


def test_the_urls_own_values_win_and_a_shorter_server_value_stays(open_store) -> None:  # type: ignore[no-untyped-def]
    store = open_store(keepalives_idle="120", options="-c tcp_keepalives_idle=5")
    # The client keeps the URL's idle time and gets the rest; the server's 5 s, shorter
    # than Gleaner's 30 s, is not lengthened.
    assert client_side(store)["keepalives_idle"] == "120"
    assert client_side(store)["keepalives_count"] == "3"
    assert server_side(store)["tcp_keepalives_idle"] == 5
    assert server_side(store)["tcp_keepalives_interval"] == 10
