"""Alembic environment: runs on the connection Store.migrate() hands over, else the settings URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from gleaner.store.schema.models import Base

target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from gleaner.store.db import make_engine
    from gleaner.store.settings import load_settings

    url = context.config.get_main_option("sqlalchemy.url") or load_settings().database_url
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("Gleaner migrations run online only: use `gleaner db upgrade`.")
run_migrations_online()
