"""Engines and migrations: the only place that knows how each database is opened."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, exc
from sqlalchemy.engine import make_url

from gleaner.store.errors import StorageFailure

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).parent / "migrations"
# A pooled PostgreSQL connection that sat idle this long is pinged before it is handed out
# (one round trip); one back from use more recently is not: a job's two steps would
# pay two pings for nothing. A connection that died within that second (a restart) fails
# its first statement instead, the pool drops every connection opened before the failure,
# and the caller's retry (a StorageFailure) gets fresh ones.
PING_AFTER_IDLE_SECONDS = 1.0
# The execution option of a connection that only reads, from one snapshot (``Store.snapshot``):
# on SQLite its transaction begins deferred, not IMMEDIATE.
READ_SNAPSHOT = "gleaner_read_snapshot"

# A PostgreSQL peer that vanished without closing (host down, network cut) is noticed in
# about a minute, not the operating system's two hours: on the client, libpq's keepalives
# (a call waiting on a dead server fails, and a threads pool's harvest with it); on the
# server, the session's (the backend of a lost worker ends, with its transcript locks and
# open transaction, so a recovered job does not wait on them). A URL's own libpq values
# win; the server's are only ever shortened.
CLIENT_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",  # ms: data sent and never acknowledged
}
SERVER_KEEPALIVES = {
    "tcp_keepalives_idle": 30,
    "tcp_keepalives_interval": 10,
    "tcp_keepalives_count": 3,
    "tcp_user_timeout": 60_000,
}
# One round trip a new connection. pg_settings shows the value in effect (the operating
# system's for 0); on a Unix socket they all read 0 and setting them does nothing.
_SHORTEN_SERVER_KEEPALIVES = (
    "SELECT set_config(s.name, d.value::text, false) FROM pg_settings AS s "
    "JOIN unnest(%s::text[], %s::bigint[]) AS d(name, value) USING (name) "
    "WHERE s.setting::bigint = 0 OR s.setting::bigint > d.value"
)


# Runs of one statement on a connection before psycopg prepares it there (psycopg's default).
PREPARE_THRESHOLD = 5


def make_engine(url: str, *, pool_size: int = 5) -> Engine:
    """Create an engine for a ``sqlite:///`` or ``postgresql+psycopg://`` URL.

    SQLite gets WAL, a busy timeout, foreign keys and ``BEGIN IMMEDIATE`` transactions, so
    writers queue for the lock instead of failing mid-transaction and read-then-write steps
    (the next ``updated_seq``, the next free slug) cannot interleave; a connection with the
    ``READ_SNAPSHOT`` option begins deferred instead (it only reads).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        # In the URL, so every connection made from it has them (the lock connection too).
        parsed = parsed.update_query_dict(
            {key: value for key, value in CLIENT_KEEPALIVES.items() if key not in parsed.query}
        )
        # psycopg prepares a statement on a connection once it has run PREPARE_THRESHOLD
        # times there: a harvest's statements are the same every job (their parameters
        # change), so the server parses and plans each once per connection.
        engine = create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=pool_size,
            connect_args={"prepare_threshold": PREPARE_THRESHOLD},
            hide_parameters=True,
        )
        _ping_when_idle(engine)
        event.listen(engine, "commit", _refuse_aborted_commit)
        event.listen(
            engine.pool, "connect", lambda dbapi_connection, _: shorten_keepalives(dbapi_connection)
        )
        return engine
    memory = parsed.database in (None, "", ":memory:")
    if not memory and parsed.database is not None:
        # The default file's folder (the user's data directory) may not exist yet.
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(parsed, connect_args={"timeout": 30}, hide_parameters=True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy (pysqlite's own BEGIN is deferred).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA busy_timeout = 30000")
        # Deleted rows' bytes are overwritten, not left in free pages: a forgotten owner's
        # words leave the file (builds differ in their default).
        cursor.execute("PRAGMA secure_delete = ON")
        if not memory:
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        # A long read (an export) asks for a deferred BEGIN: in WAL mode its snapshot takes
        # no write lock, so writers are not held up while it runs.
        deferred = connection.get_execution_options().get(READ_SNAPSHOT)
        connection.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")

    return engine


def shorten_keepalives(connection: Any) -> None:
    """Bring the server's keepalives of the new psycopg ``connection`` down to
    ``SERVER_KEEPALIVES`` (a shorter one the server has stays)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _SHORTEN_SERVER_KEEPALIVES, (list(SERVER_KEEPALIVES), list(SERVER_KEEPALIVES.values()))
        )
    if not connection.autocommit:
        connection.commit()  # set_config of a rolled-back transaction would not hold


def _refuse_aborted_commit(connection: Any) -> None:
    """Raise instead of committing a transaction a failed statement aborted (its error
    caught and let go): PostgreSQL answers that COMMIT with ROLLBACK and psycopg raises
    nothing, so the caller would take what was rolled back for committed. The pool rolls
    the connection back when it is returned."""
    from psycopg.pq import TransactionStatus

    driver = connection.connection.driver_connection
    if driver is not None and driver.info.transaction_status == TransactionStatus.INERROR:
        raise StorageFailure(_NOT_COMMITTED)


_NOT_COMMITTED = "the transaction was rolled back, not committed: a statement in it failed"


def _ping_when_idle(engine: Engine) -> None:
    """``pool_pre_ping``, but only for connections idle ``PING_AFTER_IDLE_SECONDS`` or longer.

    A failed ping raises ``DisconnectionError``, on which the pool discards the connection
    and checks out a fresh one.
    """

    @event.listens_for(engine.pool, "connect")
    @event.listens_for(engine.pool, "checkin")
    def _mark(_dbapi_connection: Any, record: Any) -> None:
        record.info["used_at"] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _ping(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("used_at", 0.0) < PING_AFTER_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            raise exc.DisconnectionError(f"stale pooled connection: {error}") from error


def alembic_config(engine: Engine) -> Config:
    # Alembic is imported only here: commands that never migrate skip its import cost.
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` (Alembic upgrade), in one transaction."""
    from alembic import command

    config = alembic_config(engine)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()
