"""Whether a database's schema is this Gleaner's newest, and bringing a SQLite file there.

Every entry point (the CLI's writing commands, the Python API, ``gleaner keys``, ``gleaner
mcp``, ``gleaner serve``) checks before its first write: the embedded SQLite default is
migrated at once, so a first call just works; PostgreSQL is left to ``gleaner db upgrade``
(run once, before the workers), so one clear error ends the command instead of one per
transcript.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine, inspect, text

from gleaner.store.db import MIGRATIONS
from gleaner.store.errors import StorageFailure


def ensure_schema(engine: Engine, migrate: Callable[[], None]) -> str | None:
    """The revision a SQLite file was just migrated to by ``migrate`` (``Store.migrate``),
    None when the schema was already the newest; StorageFailure ``not_migrated``
    (PostgreSQL behind) or ``schema_too_new``."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(MIGRATIONS))
    head = script.get_current_head()
    with engine.connect() as connection:
        # The version table is absent from a database never migrated.
        if inspect(connection).has_table("alembic_version"):
            current = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
        else:
            current = None
    if current == head:
        return None
    if current is not None and current not in {r.revision for r in script.walk_revisions()}:
        raise StorageFailure(
            f"the database schema is at revision {current}, which this Gleaner does not know "
            f"(its newest is {head}): a newer Gleaner migrated it; run that version",
            reason="schema_too_new",
        )
    if engine.dialect.name != "sqlite":
        found = "no schema" if current is None else f"schema revision {current}"
        raise StorageFailure(
            f"the database holds {found}, this Gleaner needs revision {head}: "
            "run `gleaner db upgrade` once, then this command again",
            reason="not_migrated",
        )
    migrate()
    return head
