"""Alembic: the migrations build exactly the models' schema, and go down and up cleanly."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from gleaner.store import Store
from gleaner.store.db import alembic_config, current_revision
from gleaner.store.schema.models import Base
from tests.conftest import head_revision, recreate_pg_database, test_settings

# Dialect-specific search structures live only in the migrations.
MIGRATION_ONLY = {
    "memories_updated_seq_seq",
    "memories_fts",
    "search_vector",
    "ix_memories_search",
    "ix_memories_scope_search",
    "alembic_version",
}


def _include(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    return not (name in MIGRATION_ONLY or (name or "").startswith("memories_fts"))


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_store(request: pytest.FixtureRequest, tmp_path: Path, worker_id: str) -> Store:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/m.db"
    else:
        url = recreate_pg_database(f"gleaner_migrations_{worker_id}")
    return Store(url, settings=test_settings())


def test_head_matches_the_models(fresh_store: Store) -> None:
    fresh_store.migrate()
    assert current_revision(fresh_store.engine) == head_revision()
    with fresh_store.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_object": _include})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []
    fresh_store.dispose()


def test_downgrade_to_base_and_up_again(fresh_store: Store) -> None:
    fresh_store.migrate()
    fresh_store.write(("owner", "a"), {"title": "kept?", "body": "b"})
    config = alembic_config(fresh_store.engine)
    with fresh_store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
    tables = set(inspect(fresh_store.engine).get_table_names())
    assert tables <= {"alembic_version"}
    fresh_store.migrate()  # idempotent at head, too
    fresh_store.migrate()
    assert fresh_store.search(("owner", "a"), "kept") == []
    assert fresh_store.write(("owner", "a"), {"title": "again", "body": "b"}).created
    fresh_store.dispose()


def test_0012_gives_notes_with_a_long_word_its_term_and_takes_it_back(fresh_store: Store) -> None:
    from sqlalchemy import text

    from gleaner.store.notes.terms import similarity_terms

    fresh_store.migrate()
    title = "Deploy key is " + "k" * 70
    plain = fresh_store.write(("owner", "a"), {"title": "Short words only", "body": "b"})
    long = fresh_store.write(("owner", "a"), {"title": title, "body": "b"})
    config = alembic_config(fresh_store.engine)

    def terms() -> dict[int, tuple[int, set[str]]]:
        with fresh_store.engine.connect() as conn:
            rows = conn.execute(text("SELECT id, term_count FROM memories")).all()
            found = conn.execute(text("SELECT memory_id, term FROM memory_terms")).all()
        return {i: (n, {t for m, t in found if m == i}) for i, n in rows}

    def migrate(revision: str) -> None:
        with fresh_store.engine.begin() as conn:
            config.attributes["connection"] = conn
            if revision == "0011":
                command.downgrade(config, revision)
            else:
                command.upgrade(config, revision)

    now = terms()
    assert now[long.memory.id] == (3, set(similarity_terms(title, "")))
    migrate("0011")  # as the earlier rule left it: no term for the long word
    assert terms() == {
        plain.memory.id: now[plain.memory.id],
        long.memory.id: (2, {"deploy", "key"}),
    }
    migrate("head")
    assert terms() == now
    fresh_store.dispose()


def test_0013_rebuilds_the_terms_of_notes_with_a_sign_or_a_grouped_number(
    fresh_store: Store,
) -> None:
    from sqlalchemy import text

    fresh_store.migrate()
    scope = ("owner", "a")
    plain = fresh_store.write(scope, {"title": "Short words only", "body": "b"}).memory.id
    sharp = fresh_store.write(scope, {"title": "Uses C# at work", "body": "b"}).memory.id
    grouped = fresh_store.write(scope, {"title": "Pinned to 3.10.10", "body": "b"}).memory.id
    timed = fresh_store.write(scope, {"title": "Standup at 9:30", "body": "b"}).memory.id
    # As the earlier rule indexed them: C# was the term c, 3.10.10 the terms 3 and 10.
    earlier = {
        plain: {"short", "word"},
        sharp: {"use", "c", "work"},
        grouped: {"pin", "3", "10"},
        timed: {"standup", "9", "30"},
    }
    config = alembic_config(fresh_store.engine)
    with fresh_store.engine.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0012")
        conn.execute(text("DELETE FROM memory_terms"))
        for note_id, terms in earlier.items():
            for term in terms:
                conn.execute(
                    text(
                        "INSERT INTO memory_terms (memory_id, term, scope_kind, scope_id)"
                        " VALUES (:id, :term, 'owner', 'a')"
                    ),
                    {"id": note_id, "term": term},
                )
            conn.execute(
                text("UPDATE memories SET term_count = :n WHERE id = :id"),
                {"id": note_id, "n": len(terms)},
            )
    fresh_store.migrate()
    with fresh_store.engine.connect() as conn:
        counts = dict(conn.execute(text("SELECT id, term_count FROM memories")).all())
        found = conn.execute(text("SELECT memory_id, term FROM memory_terms")).all()
    terms = {i: {t for m, t in found if m == i} for i in counts}
    # 0013 rebuilt the notes with a sign or a grouped number; migrate's reindex then found the
    # index's version unrecorded (below 0014 there is none) and rebuilt every note's terms
    # with this code's rule (which keeps "only", a polar word).
    assert terms == {
        plain: {"short", "word", "only"},
        sharp: {"use", "c#", "work"},
        grouped: {"pin", "3.10.10"},
        timed: {"standup", "9:30"},
    }
    assert counts == {plain: 3, sharp: 3, grouped: 2, timed: 2}
    # A C note shares two of the C# note's four terms now (it scored 1.0: the same fact).
    similar = fresh_store.write(scope, {"title": "Uses C at work", "body": "b"}).similar
    assert [(s.slug, s.score) for s in similar] == [("uses-c-at-work", 0.5)]
    fresh_store.dispose()
