"""PostgreSQL: a harvest's hot statements sent straight to the driver, prepared.

Each statement is still built once with SQLAlchemy Core and compiled by the session's own
PostgreSQL dialect; what is skipped is SQLAlchemy's per-execution work (the compiled-cache
lookup, the execution context, the result object: 50 to 70 µs of CPU a statement, twice that
for an ORM one, on top of the driver's own 60 to 90 µs, measured here). A job runs eight of
them: that work was about a fifth of a job's CPU (``run_job`` 5.5 / 6.1 / 4.4 ms before,
4.1 / 5.2 / 3.4 ms after, alternating).

What reaches the driver is what SQLAlchemy would send: the parameters go through the same
bind processors, and the rows come back as the driver hands them to SQLAlchemy (named
tuples here). A driver error is raised as SQLAlchemy would raise it (``DBAPIError`` and its
kinds, the connection invalidated on a disconnect), so ``Store``'s failure handling is
unchanged. On SQLite the statement runs through ``session.execute``.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import CursorResult, Dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler

# Compiled once per statement object: callers pass statements built at import.
_compiled: weakref.WeakKeyDictionary[Executable, SQLCompiler] = weakref.WeakKeyDictionary()


def execute(session: Session, statement: Executable, params: Mapping[str, Any]) -> Sequence[Any]:
    """Run ``statement`` with ``params`` in ``session``'s transaction; its rows (empty for a
    statement that returns none), each a tuple whose fields are also named by column."""
    bind = session.get_bind()
    if bind.dialect.name != "postgresql":
        result = session.execute(statement, params)
        if isinstance(result, CursorResult) and not result.returns_rows:
            return []  # an UPDATE or a lock, say (an ORM statement's result always has rows)
        return result.all()
    compiled = _compile(statement, bind.dialect)
    values = dict(compiled.construct_params(dict(params)) or {})
    for name, process in compiled._bind_processors.items():
        if name in values:
            # A sequence of processors is for tuple-typed parameters, which no statement
            # sent here has.
            assert callable(process), f"tuple-typed parameter {name!r}"
            values[name] = process(values[name])
    connection = session.connection()
    driver = connection.connection.driver_connection
    assert driver is not None
    # Imported here, not at the top: SQLite read commands import this module and must not
    # pay for psycopg (tests/test_startup_imports.py); after the first call it is a lookup.
    from psycopg.rows import namedtuple_row

    try:
        with driver.cursor(row_factory=namedtuple_row) as cursor:
            cursor.execute(compiled.string, values, prepare=True)
            return cursor.fetchall() if cursor.description is not None else []
    except bind.dialect.loaded_dbapi.Error as exc:
        gone = bind.dialect.is_disconnect(exc, driver, None)
        if gone:
            # As SQLAlchemy does on a disconnect: the pool drops this connection and every
            # one opened before it (a restart killed them all), so a retry gets fresh ones.
            connection.engine.pool._invalidate(connection.connection, exc)
            connection.invalidate(exc)
        raise DBAPIError.instance(
            compiled.string,
            values,
            exc,
            bind.dialect.loaded_dbapi.Error,
            connection_invalidated=gone,
        ) from exc


def _compile(statement: Executable, dialect: Dialect) -> SQLCompiler:
    found = _compiled.get(statement)
    if found is None:
        compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        found = _compiled[statement] = cast(SQLCompiler, compiled)
    return found
