"""The store keeps PostgreSQL's planner statistics fresh as notes pour in (store.recall.freshness):
without them a write's slug lookup may walk its whole scope (autovacuum is off on the
machines these tests run on, and waits for 10% of a table to change where it is on)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.transcript import Transcript
from gleaner.store import Scope, Store
from gleaner.store.notes import notes
from gleaner.store.recall import freshness
from tests.conftest import migrated_pg_database, test_settings

pytestmark = pytest.mark.postgres

ALICE = Scope.owner("alice")
# The slug lookup a write sends (store.notes.write_lookup._TAKEN_SLUGS), as the planner sees it.
LOOKUP = (
    "EXPLAIN SELECT slug FROM memories WHERE scope_kind = 'owner' AND scope_id = 'alice'"
    " AND slug = ANY('{note-17,note-18}'::varchar[])"
)


@pytest.fixture
def fresh_pg(worker_id: str) -> Iterator[Store]:
    """A new database: no table analyzed yet (the shared test database keeps its history)."""
    store = Store(migrated_pg_database(f"gleaner_fresh_{worker_id}"), settings=test_settings())
    yield store
    store.dispose()


def _statistics(store: Store) -> dict[str, tuple[Any, int]]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT relname, last_analyze, n_mod_since_analyze FROM pg_stat_user_tables"
                " WHERE relname IN ('memories', 'memory_terms')"
            )
        )
        return {name: (when, int(changed)) for name, when, changed in rows}


def _write_notes(store: Store, count: int) -> None:
    items = [notes.BatchItem({"title": f"Note {n}", "body": f"Fact {n}."}) for n in range(count)]
    with store.transaction() as session:
        notes.write_batch(session, store.settings, ALICE, items, provenance="import")
        # A backend reports its changes to the statistics at most once a second; this one
        # reports them before its COMMIT returns.
        session.execute(text("SELECT pg_stat_force_next_flush()"))


def test_a_large_scope_is_analyzed_once_enough_notes_were_written(fresh_pg: Store) -> None:
    _write_notes(fresh_pg, 3_000)
    assert {when for when, _ in _statistics(fresh_pg).values()} == {None}
    fresh_pg.freshness.wrote(freshness.CHECK_EVERY - 1)
    assert {when for when, _ in _statistics(fresh_pg).values()} == {None}  # not yet looked
    fresh_pg.freshness.wrote(1)
    after = _statistics(fresh_pg)
    assert after["memories"][0] is not None and after["memories"][1] == 0, after
    # The terms are looked up by scope and term, through the one index that serves that.
    assert after["memory_terms"][0] is None
    with fresh_pg.engine.connect() as conn:
        plan = "\n".join(conn.execute(text(LOOKUP)).scalars())
    # One descent of the unique index a slug, not a walk through the scope's notes.
    assert "uq_memories_scope_slug" in plan and "Filter" not in plan, plan


def test_tables_that_changed_little_since_their_last_analyze_are_left_alone(
    fresh_pg: Store,
) -> None:
    _write_notes(fresh_pg, 1_200)
    assert freshness.refresh(fresh_pg.engine) == ["memories"]
    _write_notes(fresh_pg, 50)  # under FLOOR + SCALE of the table
    assert freshness.refresh(fresh_pg.engine) == []


def test_one_process_analyzes_at_a_time_and_the_others_go_on(fresh_pg: Store) -> None:
    _write_notes(fresh_pg, 1_200)
    other = create_engine(fresh_pg.database_url, isolation_level="AUTOCOMMIT")
    try:
        with other.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": freshness._ANALYZING})
            assert freshness.refresh(fresh_pg.engine) == []  # does not wait for the holder
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": freshness._ANALYZING})
    finally:
        other.dispose()
    assert freshness.refresh(fresh_pg.engine) == ["memories"]


def test_harvests_and_single_writes_count_their_notes(
    fresh_pg: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(freshness, "CHECK_EVERY", 3)
    # Every table counts as stale: what is tested is when the notes are counted, not how
    # soon the writing backends report their changes.
    monkeypatch.setattr(freshness, "FLOOR", -1)
    chat = Transcript.model_validate(
        {
            "conversation_id": "c1",
            "owner": "alice",
            "messages": [{"role": "user", "content": "I prefer tea. I live in Lisbon."}],
        }
    )
    outcome = harvest_transcript(fresh_pg, chat)
    assert outcome.notes_written == 2
    assert _statistics(fresh_pg)["memories"][0] is None  # 2 of 3
    fresh_pg.write(ALICE, {"title": "Uses vim", "body": "Vim."})
    assert _statistics(fresh_pg)["memories"][0] is not None


def test_a_failed_refresh_is_logged_and_the_write_stands(
    fresh_pg: Store, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(freshness, "CHECK_EVERY", 1)

    def refused(engine: Any) -> list[str]:  # the database refuses the refresh's query
        with engine.connect() as conn:
            conn.execute(text("SELECT no_such_column FROM pg_class"))
        return []

    fresh_pg.freshness = freshness.Freshness(fresh_pg.engine, refresh=refused)
    with caplog.at_level(logging.WARNING, logger="gleaner.store.recall.freshness"):
        result = fresh_pg.write(ALICE, {"title": "Uses vim", "body": "Vim."})
    assert result.created and fresh_pg.get(ALICE, result.memory.slug) is not None
    assert "could not refresh the planner statistics" in caplog.text


def test_sqlite_has_nothing_to_refresh(make_store) -> None:  # type: ignore[no-untyped-def]
    store: Store = make_store("sqlite")
    assert not store.freshness.enabled
    store.freshness.wrote(10 * freshness.CHECK_EVERY)  # no statement, no error


def test_a_table_being_vacuumed_is_left_to_a_later_look_without_waiting(fresh_pg: Store) -> None:
    """A VACUUM (autovacuum's too) holds the lock ANALYZE needs: the refresh skips that table
    at once instead of queueing (which would get autovacuum cancelled), and its connection goes
    back to the pool with the default lock timeout."""
    _write_notes(fresh_pg, 1_200)
    other = create_engine(fresh_pg.database_url)
    try:
        with other.begin() as conn:
            conn.execute(text("LOCK TABLE memories IN SHARE UPDATE EXCLUSIVE MODE"))
            started = time.monotonic()
            assert freshness.refresh(fresh_pg.engine) == []
            assert time.monotonic() - started < 5  # a bound is the promise: no queueing
    finally:
        other.dispose()
    one = Store(fresh_pg.database_url, settings=test_settings(db_pool_size=1))
    try:  # a pool of one connection: the refresh's is the one handed out next
        assert freshness.refresh(one.engine) == ["memories"]
        with one.engine.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "0"
    finally:
        one.dispose()
