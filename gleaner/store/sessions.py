"""How a ``Store`` opens its units of work on its engine: an ORM session, a Core connection
(its opening pipelined on PostgreSQL), autocommit statements, a read-only snapshot; and the
one translation of a driver's error into a ``StorageFailure`` that says what to do.
``store.api.Store`` derives from ``Sessions``."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Connection, Engine, Executable
from sqlalchemy.exc import DataError, DBAPIError, SQLAlchemyError, StatementError

from gleaner.config import Settings
from gleaner.store.db import make_engine
from gleaner.store.errors import DataRefused, StorageFailure, StoreError
from gleaner.store.recall.freshness import Freshness
from gleaner.store.settings import load_settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from gleaner.store.jobs.locks import TranscriptLock
    from gleaner.store.schemas import Scope


T = TypeVar("T")


_SCHEMA_MISSING = ("no such table", "no such column", "does not exist")


# PostgreSQL refuses the connection itself when the URL names a database or role it does not
# have; no SQLSTATE reaches the client then, only this text.
_NO_DATABASE = re.compile(r'FATAL:\s+(database|role) "([^"]*)" does not exist')


def _storage_failure(exc: SQLAlchemyError) -> StorageFailure:
    """Say what went wrong in one line, and what to do when the database, the role or the
    schema is missing."""
    detail = str(exc.orig if isinstance(exc, DBAPIError) else exc).strip().splitlines()[0]
    missing = _NO_DATABASE.search(detail)
    if missing:
        kind, name = missing.groups()
        fix = f"createdb {name}" if kind == "database" else f"createuser {name}"
        return StorageFailure(
            f'the server has no {kind} "{name}" (GLEANER_DATABASE_URL): create it ({fix}) '
            "or fix the URL, then run `gleaner db upgrade`",
            reason="no_database",
        )
    if any(marker in detail for marker in _SCHEMA_MISSING):
        return StorageFailure(
            f"the database schema is missing or older than this Gleaner ({detail}): "
            "run `gleaner db upgrade`",
            reason="not_migrated",
        )
    if isinstance(exc, DataError):
        return DataRefused(f"the database refused a value: {detail}")
    if "connection failed" in detail or "could not connect" in detail:
        return StorageFailure(
            f"database error: {detail}: is PostgreSQL running and reachable there? Start it, "
            "or fix the host and port in GLEANER_DATABASE_URL"
        )
    return StorageFailure(f"database error: {detail}")


class Sessions:
    """A database's engine and the transactions opened on it (see the module doc)."""

    def __init__(self, database_url: str | None = None, settings: Settings | None = None) -> None:
        self.settings = settings or load_settings()
        self.database_url = database_url or self.settings.database_url
        self.engine: Engine = make_engine(self.database_url, pool_size=self.settings.db_pool_size)
        self._sessionmaker: sessionmaker[Session] | None = None
        self._autocommit_engine: Engine | None = None
        # Every committed write counts here: it keeps the planner's statistics fresh.
        self.freshness = Freshness(self.engine)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def dispose(self) -> None:
        """Close the pooled connections and the transcript locks' own connection, which
        releases any lock still held (the store opens new ones if used again)."""
        locks = sys.modules.get(
            "gleaner.store.jobs.locks"
        )  # not imported: no lock connection was opened
        if locks is not None:
            locks.close_for(self.engine)
        self.engine.dispose()

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """A session inside one transaction: committed on success, rolled back on any error."""
        if self._sessionmaker is None:
            from sqlalchemy.orm import sessionmaker  # the ORM: only for what needs it

            self._sessionmaker = sessionmaker(self.engine, expire_on_commit=False)
        with self._failures(), self._sessionmaker() as session, session.begin():
            yield session

    @contextmanager
    def statements(self) -> Iterator[Connection]:
        """A Core connection whose statements each commit on their own (PostgreSQL
        autocommit), for steps whose every write is one Core statement atomic by itself: it
        spares a BEGIN and a COMMIT round trip, and an ORM session's bookkeeping (about half
        a million instructions a use, measured: a harvest job takes two steps). On SQLite,
        which takes its write lock at BEGIN, the connection is inside one transaction."""
        if self.engine.dialect.name != "postgresql":
            with self._failures(), self.engine.begin() as connection:
                yield connection
            return
        if self._autocommit_engine is None:
            # Setting psycopg's autocommit flag is client-side: no round trip either way.
            self._autocommit_engine = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        with self._failures(), self._autocommit_engine.connect() as connection:
            yield connection

    @contextmanager
    def connection(
        self, *, opening: Sequence[tuple[Executable, Mapping[str, Any]]] | None = None
    ) -> Iterator[Connection]:
        """A Core connection inside one transaction (as ``transaction``, without the ORM):
        committed on success, rolled back on any error.

        ``opening`` are statements to run first (a lock, say), each with its parameters.
        """
        with self._failures(), self.engine.begin() as connection:
            for statement, params in opening or ():
                connection.execute(statement, params)
            yield connection

    @contextmanager
    def snapshot(self) -> Iterator[Connection]:
        """A Core connection that only reads, inside one transaction seeing one consistent
        snapshot, for a long read (an export) that must not hold writers up: on PostgreSQL
        REPEATABLE READ, READ ONLY; on SQLite a deferred transaction (in WAL mode a
        reader's snapshot, which takes no write lock)."""
        from gleaner.store.db import READ_SNAPSHOT

        with self._failures(), self.engine.connect() as connection:
            if self.dialect == "postgresql":
                connection.execution_options(
                    isolation_level="REPEATABLE READ", postgresql_readonly=True
                )
            else:
                connection.execution_options(**{READ_SNAPSHOT: True})
            with connection.begin():
                yield connection

    @contextmanager
    def _failures(self) -> Iterator[None]:
        try:
            yield
        except StoreError:
            raise
        except (DBAPIError, SQLAlchemyError) as exc:
            if isinstance(exc, StatementError):
                # The engine hides them from the message, but the error still holds the
                # statement's parameters: a transcript's or a note's words.
                exc.params = None
            raise _storage_failure(exc) from exc

    def _run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        with self.transaction() as session:
            return fn(session, *args, **kwargs)

    def _read(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        with self.connection() as connection:
            return fn(connection, *args, **kwargs)

    def transcript_lock(self, scope: Scope, digest: str) -> TranscriptLock:
        """This process's advisory lock on one transcript (its redacted hash) in ``scope``,
        not taken yet (see ``store.jobs.locks``): held on a dedicated connection, never a pooled
        one, so it may be held across a model call."""
        from gleaner.store.jobs.locks import transcript_lock

        return transcript_lock(self.engine, scope, digest)

    def _scrub_deleted(self, tables: Sequence[str]) -> None:
        """After a forget's commit: rid the files of the deleted rows' bytes (PostgreSQL:
        vacuum ``tables``; SQLite: empty the write-ahead log)."""
        if self.dialect == "postgresql":
            # Deleted rows stay in the table files until vacuumed: do it now, not some day.
            with self._failures(), self.engine.connect() as conn:
                autocommit = conn.execution_options(isolation_level="AUTOCOMMIT")
                autocommit.exec_driver_sql(f"VACUUM {', '.join(tables)}")
        elif self.dialect == "sqlite":
            # The write-ahead log still holds the pages as they were before the delete. A
            # checkpoint cannot run inside a transaction, so not through a Connection (whose
            # first statement begins one here: ``store.db``).
            with self._failures():
                raw = self.engine.raw_connection()
                try:
                    raw.cursor().execute("PRAGMA wal_checkpoint(TRUNCATE)")
                finally:
                    raw.close()
