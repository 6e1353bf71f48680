"""PostgreSQL: a harvest's hot statements sent straight to libpq, prepared.

Each statement is still built once with SQLAlchemy Core and compiled by the session's own
PostgreSQL dialect (with ``$1`` placeholders); its parameters go through the same bind
processors and psycopg's own adapters (the connection's ``Transformer``), and its rows come
back as psycopg loads them, as tuples whose fields are also named by column. What is skipped
is SQLAlchemy's per-execution work (the compiled-cache lookup, the execution context, the
result object) and psycopg's cursor (its query conversion, its generator-driven wait loop,
its row factory): a small UPDATE costs about 140 µs of CPU through a psycopg cursor and 55 to
70 µs through libpq, and ``run_job`` 9.2 M instructions before, 8.3 M after (callgrind).

A statement is prepared once per connection under a name of Gleaner's own (psycopg's are
``_pg3_*``), for each set of parameter types it is sent with. A driver error is raised as
SQLAlchemy would raise it (``DBAPIError`` and its kinds, the connection invalidated on a
disconnect), so ``Store``'s failure handling is unchanged.

A statement that would open a transaction (a connection out of autocommit with none open)
goes through psycopg's cursor, which sends the BEGIN its settings ask for; the following
statements of that transaction take the short path. On SQLite a statement runs through
``session.execute``.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import weakref
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Connection, CursorResult, Dialect
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler

from store.errors import StorageFailure

if TYPE_CHECKING:
    import psycopg
    from psycopg.abc import Transformer
    from sqlalchemy.engine.interfaces import DBAPIModule

    from store.sql import Executor

# Most statements kept prepared on one connection (psycopg's own default bound).
MAX_PREPARED = 100
# SQLSTATE 26000: the server has no prepared statement of that name (something ran
# DEALLOCATE or DISCARD ALL on the connection).
_NO_SUCH_STATEMENT = "26000"


@dataclass
class _Plan:
    """One statement compiled for libpq: ``$n`` SQL and the parameter names in ``$n`` order."""

    compiled: SQLCompiler
    sql: bytes
    names: tuple[str, ...]
    processors: tuple[Callable[[Any], Any] | None, ...]
    row: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None  # built from the first result


@dataclass
class _Driver:
    """What one psycopg connection keeps for the short path: its adapters, and the names
    of the statements prepared on it by SQL and parameter types, oldest first."""

    transformer: Transformer
    prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = field(default_factory=dict)


# Compiled once per statement object: callers pass statements built at import.
_plans: weakref.WeakKeyDictionary[Executable, _Plan] = weakref.WeakKeyDictionary()
_drivers: weakref.WeakKeyDictionary[psycopg.Connection[Any], _Driver] = weakref.WeakKeyDictionary()
# Numbers of the statements' names (a generator would not be safe across threads).
_numbers = itertools.count(1)


def execute(session: Executor, statement: Executable, params: Mapping[str, Any]) -> Sequence[Any]:
    """Run ``statement`` with ``params`` in ``session``'s transaction (a session's or a Core
    connection's); its rows (empty for a statement that returns none), each a tuple whose
    fields are also named by column."""
    connection = _connection(session)
    dialect = connection.dialect
    if dialect.name != "postgresql":
        result = session.execute(statement, params)
        if isinstance(result, CursorResult) and not result.returns_rows:
            return []  # an UPDATE or a lock, say (an ORM statement's result always has rows)
        return result.all()
    driver = connection.connection.driver_connection
    assert driver is not None
    try:
        return on_driver(driver, dialect, statement, params)
    except dialect.loaded_dbapi.Error as exc:
        sql = _plan(statement, dialect).compiled.string
        raise _failure(connection, exc, sql, dict(params)) from exc


def simple(session: Executor, sql: str) -> bytes | None:
    """Send ``sql``, statements without parameters separated by semicolons, in one message
    (the simple query protocol) in ``session``'s transaction; PostgreSQL only. Returns the
    last statement's command tag. What a harvest opens its write transaction with: the
    BEGIN and the forget lock (``Store.connection``)."""
    from psycopg import errors, pq

    connection = _connection(session)
    driver = connection.connection.driver_connection
    assert driver is not None
    try:
        result = driver.pgconn.exec_(sql.encode())
        if result.status not in (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK):
            raise errors.error_from_result(result, encoding=driver.info.encoding)
    except connection.dialect.loaded_dbapi.Error as exc:
        raise _failure(connection, exc, sql, {}) from exc
    tag: bytes | None = result.command_status
    return tag


def end(connection: Connection, *, commit: bool) -> None:
    """COMMIT (or ROLLBACK) the transaction ``simple`` opened on an autocommit connection.

    A COMMIT the server answers with ROLLBACK (a statement of the transaction failed and its
    error was not let through) raises StorageFailure: nothing was written. A rollback that
    fails (the connection is gone) is left to the pool, which drops the connection: the
    error being raised already is the one that matters."""
    if commit:
        if simple(connection, "COMMIT") == b"ROLLBACK":
            raise StorageFailure(
                "the transaction was rolled back, not committed: a statement in it failed"
            )
        return
    with contextlib.suppress(DBAPIError):
        simple(connection, "ROLLBACK")


def _failure(
    connection: Connection, exc: DBAPIModule.Error, sql: str, params: Mapping[str, Any]
) -> StatementError:
    """The driver's error as SQLAlchemy raises it (``DBAPIError`` and its kinds); on a
    disconnect the connection is invalidated first, as SQLAlchemy does, and the pool drops
    every one opened before it (a restart killed them all), so a retry gets fresh ones."""
    dialect = connection.dialect
    driver = connection.connection.driver_connection
    gone = dialect.is_disconnect(exc, driver, None)
    if gone:
        connection.engine.pool._invalidate(connection.connection, exc)
        connection.invalidate(exc)
    return DBAPIError.instance(
        sql, params, exc, dialect.loaded_dbapi.Error, connection_invalidated=gone
    )


def on_driver(
    driver: psycopg.Connection[Any],
    dialect: Dialect,
    statement: Executable,
    params: Mapping[str, Any],
) -> Sequence[Any]:
    """``execute`` on a psycopg connection of ``dialect``'s database outside any session
    (``store.locks``' own connection); raises the driver's own errors."""
    plan = _plan(statement, dialect)
    values = plan.compiled.construct_params(dict(params)) or {}
    args = [
        value if process is None else process(value)
        for value, process in zip((values[n] for n in plan.names), plan.processors, strict=True)
    ]
    return _run(driver, plan, args)


def _connection(session: Executor) -> Connection:
    """The session's connection, asked of the session once per transaction (each ask walks
    its state machine: a few per cent of a harvest job's CPU); a connection is its own."""
    if isinstance(session, Connection):
        return session
    known = session.info.get(_CONNECTION)
    if known is not None and known[0] is session.get_transaction():
        return cast(Connection, known[1])
    connection = session.connection()
    session.info[_CONNECTION] = (session.get_transaction(), connection)
    return connection


# Where ``_connection`` keeps the session's transaction and its connection.
_CONNECTION = "gleaner.prepared_connection"


def _run(
    driver: psycopg.Connection[Any], plan: _Plan, args: list[Any], *, again: bool = True
) -> Sequence[Any]:
    # Imported here, not at the top: SQLite read commands import this module and must not
    # pay for psycopg (tests/test_startup_imports.py); after the first call it is a lookup.
    from psycopg import errors, pq
    from psycopg.adapt import PyFormat

    pgconn = driver.pgconn
    if not driver.autocommit and pgconn.transaction_status == pq.TransactionStatus.IDLE:
        return _through_cursor(driver, plan, args)  # it sends the BEGIN
    state = _drivers.get(driver)
    if state is None:
        from psycopg.adapt import Transformer

        state = _drivers[driver] = _Driver(Transformer(driver))
    transformer = state.transformer
    dumped = transformer.dump_sequence(args, [PyFormat.AUTO] * len(args))
    types = transformer.types or ()
    key = (plan.sql, tuple(types))
    name = state.prepared.get(key)
    if name is None:
        if len(state.prepared) >= MAX_PREPARED:  # as psycopg does: the oldest goes
            oldest = state.prepared.pop(next(iter(state.prepared)))
            if pq.version() >= 170000:  # protocol-level Close: PgBouncer 1.21+ passes it on
                pgconn.close_prepared(oldest)
            else:
                pgconn.exec_(b"DEALLOCATE " + oldest)
        name = f"gleaner_{next(_numbers)}".encode()
        made = pgconn.prepare(name, plan.sql, types)
        if made.status != pq.ExecStatus.COMMAND_OK:
            raise errors.error_from_result(made, encoding=driver.info.encoding)
        state.prepared[key] = name
    # NULL parameters are None: libpq's own convention, which psycopg's stubs leave out.
    result = pgconn.exec_prepared(name, cast(Any, dumped), transformer.formats)
    status = result.status
    if status == pq.ExecStatus.COMMAND_OK:
        return []
    if status != pq.ExecStatus.TUPLES_OK:
        failure = errors.error_from_result(result, encoding=driver.info.encoding)
        if failure.sqlstate != _NO_SUCH_STATEMENT:
            raise failure
        state.prepared.clear()  # someone deallocated them: prepare again
        if not again or pgconn.transaction_status != pq.TransactionStatus.IDLE:
            raise failure  # the failure aborted the transaction: its caller retries it
        return _run(driver, plan, args, again=False)
    if plan.row is None:
        fields = [(result.fname(n) or b"").decode() for n in range(result.nfields)]
        plan.row = _row_type(fields)
    transformer.set_pgresult(result)
    return transformer.load_rows(0, result.ntuples, plan.row)


def _through_cursor(driver: psycopg.Connection[Any], plan: _Plan, args: list[Any]) -> Sequence[Any]:
    from psycopg import RawCursor

    with RawCursor(driver) as cursor:
        cursor.execute(plan.sql, args, prepare=True)
        if cursor.description is None:
            return []
        if plan.row is None:
            fields = [column.name for column in cursor.description]
            plan.row = _row_type(fields)
        return [plan.row(row) for row in cursor.fetchall()]


def _row_type(fields: list[str]) -> Callable[[Sequence[Any]], tuple[Any, ...]]:
    """Rows as tuples named by column (psycopg's ``namedtuple_row`` does the same)."""
    row: Callable[[Sequence[Any]], tuple[Any, ...]] = cast(
        Any, namedtuple("Row", fields, rename=True)
    )._make
    return row


def _plan(statement: Executable, dialect: Dialect) -> _Plan:
    found = _plans.get(statement)
    if found is None:
        compiled = cast(SQLCompiler, statement.compile(dialect=_dollar(dialect)))  # type: ignore[attr-defined]
        names = tuple(compiled.positiontup or ())
        processors = compiled._bind_processors
        for name in names:
            # A sequence of processors is for tuple-typed parameters, which no statement
            # sent here has.
            assert callable(processors.get(name, len)), f"tuple-typed parameter {name!r}"
        found = _plans[statement] = _Plan(
            compiled,
            compiled.string.encode(),
            names,
            tuple(cast(Callable[[Any], Any] | None, processors.get(n)) for n in names),
        )
    return found


def _dollar(dialect: Dialect) -> Dialect:
    """The session's dialect, compiling ``$1``-style placeholders (libpq's own)."""
    found = _dollar_dialects.get(dialect)
    if found is None:
        found = copy.copy(dialect)
        found.paramstyle, found.positional = "numeric_dollar", True
        _dollar_dialects[dialect] = found
    return found


_dollar_dialects: weakref.WeakKeyDictionary[Dialect, Dialect] = weakref.WeakKeyDictionary()
