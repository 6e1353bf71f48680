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

A harvest's write transaction runs on an autocommit connection (``begin`` ... ``end``) and
spends as few round trips as its statements allow, in libpq's pipeline mode: its BEGIN and
opening statements (the forget lock, the forget count) go to the server with its first
statement, and the statements ``later`` defers (the ledger row, the job's outcome: writes
whose rows nobody reads) go with its COMMIT. A deferred statement that fails aborts the
transaction there, so the COMMIT behind it is never run: nothing of it is written. Any
other statement run on the connection meanwhile (SQLAlchemy's own, an executemany) first
sends the BEGIN and the opening, so it runs inside the transaction. A read the transaction
will make later can be sent ahead with the BEGIN (``ahead``): its ``execute`` is then
answered without a round trip of its own, unless a write went to the server in between.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import select
import weakref
from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sqlalchemy import Connection, CursorResult, Dialect, Engine, event
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler

from store.errors import StorageFailure

if TYPE_CHECKING:
    import psycopg
    from psycopg.abc import Transformer
    from psycopg.adapt import PyFormat
    from psycopg.pq.abc import PGresult
    from sqlalchemy.engine.interfaces import DBAPIModule
    from sqlalchemy.sql.elements import BindParameter

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
    # Where each ``$n`` parameter comes from: its key and name in the caller's parameters,
    # else its bind's own value (``_arguments``); None: ask ``construct_params`` each time.
    sources: tuple[tuple[str, str, BindParameter[Any]], ...] | None = None
    row: Callable[[Sequence[Any]], tuple[Any, ...]] | None = None  # built from the first result


@dataclass
class _Driver:
    """What one psycopg connection keeps for the short path: its adapters, and the names
    of the statements prepared on it by SQL and parameter types, oldest first."""

    transformer: Transformer
    auto: PyFormat  # the format every parameter is dumped in (psycopg's choice per type)
    prepared: dict[tuple[bytes, tuple[int, ...]], bytes] = field(default_factory=dict)


# What ``_send`` sends: a prepared statement with its parameters, or SQL without any; and
# how it goes to libpq: the statement's name (None: SQL sent as it is), its SQL, the
# parameters dumped and their formats.
_Item = tuple["_Plan", list[Any]] | bytes
_Bound = tuple[bytes | None, bytes, list[Any] | None, Sequence[Any] | None]


@dataclass
class _Deferred:
    """A transaction ``begin`` opened on an autocommit connection and not ended yet."""

    opening: list[tuple[_Plan, list[Any]]]
    # The rows of the opening's last statement once the BEGIN and the opening were sent
    # (None: nothing was sent yet, the server knows of no transaction; empty when the
    # opening, or the statement sent with it, failed).
    opened: Sequence[Any] | None = None
    # Deferred to the COMMIT: a statement, its parameters, and the error that a unique
    # violation of it stands for (None: it is raised as the driver's).
    later: list[tuple[_Plan, list[Any], Callable[[], BaseException] | None]] = field(
        default_factory=list
    )
    # Reads sent with the BEGIN (``ahead``), and their rows once sent, each kept until the
    # ``execute`` of the same statement with the same arguments takes it or a write drops it.
    ahead: list[tuple[_Plan, list[Any]]] = field(default_factory=list)
    answers: list[tuple[_Plan, list[Any], Sequence[Any]]] = field(default_factory=list)
    # The BEGIN, the opening or the statement sent with them failed: as the server does
    # for an aborted transaction, every later statement is refused and the COMMIT rolls back
    # (the failure may have come before anything was sent, when there is no transaction on
    # the server to abort).
    failed: bool = False

    def check(self) -> None:
        if self.failed:
            raise StorageFailure(
                "current transaction is aborted (a statement in it failed): statements "
                "are refused until it ends"
            )


# Compiled once per statement object: callers pass statements built at import.
_plans: weakref.WeakKeyDictionary[Executable, _Plan] = weakref.WeakKeyDictionary()
# The statements every harvest job sends (``hot``), compiled by ``compile_hot``.
_hot: list[Executable] = []

_Statement = TypeVar("_Statement", bound=Executable)


def hot(statement: _Statement) -> _Statement:
    """Mark ``statement`` as one every harvest job sends; returns it. ``compile_hot``
    compiles the marked statements in a worker's main process before its pool forks, so no
    child pays for it on its first job: about 35 ms of CPU per child in ``bench`` pipe-live,
    the ORM's mapper configuration included, paid again by each child that replaces one."""
    _hot.append(statement)
    return statement


def compile_hot(dialect: Dialect) -> None:
    """Compile every statement marked ``hot`` for ``dialect``'s PostgreSQL database (a
    no-op on any other)."""
    if dialect.name == "postgresql":
        for statement in _hot:
            _plan(statement, dialect)  # a lookup for one compiled already


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
    deferred: _Deferred | None = connection.info.get(_DEFERRED)
    if deferred is not None and deferred.opened is None:
        deferred.check()
        plan = _plan(statement, dialect)
        results = _sent(connection, deferred, [(plan, _arguments(plan, params))])
        deferred.opened = _opened(connection, deferred, results)
        return _rows(connection, plan, results[-1])
    if deferred is not None and deferred.answers:
        plan = _plan(statement, dialect)
        found = _answer(deferred, plan, _arguments(plan, params))
        if found is not None:
            return found
    driver = connection.connection.driver_connection
    assert driver is not None
    try:
        return on_driver(driver, dialect, statement, params)
    except dialect.loaded_dbapi.Error as exc:
        sql = _plan(statement, dialect).compiled.string
        raise _failure(connection, exc, sql, dict(params)) from exc


def simple(session: Executor, sql: str) -> None:
    """Send ``sql``, statements without parameters separated by semicolons, in one message
    (the simple query protocol) in ``session``'s transaction; PostgreSQL only. What rolls
    back a transaction ``begin`` opened."""
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


def begin(connection: Connection, opening: Sequence[tuple[Executable, Mapping[str, Any]]]) -> None:
    """Open a transaction on ``connection``, an autocommit PostgreSQL connection, that
    starts with the ``opening`` statements (a lock, say); it is ended by ``end``. Nothing is
    sent yet: the BEGIN and the opening go with the transaction's first statement."""
    plans = [(_plan(statement, connection.dialect), params) for statement, params in opening]
    _sends_opening_first(connection.engine)
    connection.info[_DEFERRED] = _Deferred([(plan, _arguments(plan, p)) for plan, p in plans])


def ahead(session: Executor, statement: Executable, params: Mapping[str, Any]) -> None:
    """Send ``statement``, a read, with the BEGIN of ``session``'s transaction (one ``begin``
    opened, nothing sent yet), in its round trip. The ``execute`` of the same statement
    with the same parameters later in the transaction is answered with its rows, without a
    round trip, unless a write went to the server in between (a read sent earlier in the
    transaction sees what a read sent later would, but for what other transactions commit
    meanwhile, which READ COMMITTED lets any statement miss). Anywhere else (SQLite, no
    ``begin``, a transaction under way) nothing is sent: that ``execute`` runs as usual."""
    if not isinstance(session, Connection):
        return
    deferred: _Deferred | None = session.info.get(_DEFERRED)
    if deferred is None or deferred.opened is not None or deferred.failed:
        return
    plan = _plan(statement, session.dialect)
    deferred.ahead.append((plan, _arguments(plan, params)))


def _answer(deferred: _Deferred, plan: _Plan, args: list[Any]) -> Sequence[Any] | None:
    """The rows sent ahead for ``plan`` with ``args`` (taken: an answer serves once), or
    None; a statement that may write drops every answer."""
    for index, (sent, sent_args, rows) in enumerate(deferred.answers):
        if sent is plan and sent_args == args:
            del deferred.answers[index]
            return rows
    if not _reads(plan.sql):
        deferred.answers.clear()
    return None


def _reads(sql: bytes | str) -> bool:
    """True for a statement that changes no row: a SELECT (one with FOR UPDATE only locks).
    Anything else counts as a write, a CTE too: the safe side."""
    start = sql.lstrip()[:6]
    return (start.upper() if isinstance(start, str) else start.upper().decode()) == "SELECT"


def opened(session: Executor) -> Sequence[Any]:
    """The rows of the last opening statement of ``session``'s transaction (``begin``),
    sending the BEGIN and the opening now if no statement has yet."""
    connection = _connection(session)
    deferred: _Deferred = connection.info[_DEFERRED]
    deferred.check()
    if deferred.opened is None:
        deferred.opened = _opened(connection, deferred, _sent(connection, deferred, []))
    return deferred.opened


def _sent(connection: Connection, deferred: _Deferred, items: list[_Item]) -> list[PGresult]:
    """Send the BEGIN and the opening, then ``items``, in one round trip. Should one fail,
    the transaction is left aborted as a failed statement leaves it (what runs after fails
    too; its COMMIT rolls back) and the error raised."""
    ahead = deferred.ahead
    try:
        results = _send(connection, [*_opening(deferred), *ahead, *items])
    except _Failed as failed:
        deferred.opened, deferred.failed = (), True
        raise failed.error from failed.error.orig
    first = 1 + len(deferred.opening)  # after the BEGIN and the opening
    deferred.answers = [
        (plan, args, _rows(connection, plan, result))
        for (plan, args), result in zip(ahead, results[first : first + len(ahead)], strict=True)
    ]
    if not all(_reads(item if isinstance(item, bytes) else item[0].sql) for item in items):
        deferred.answers = []  # a write sent after those reads may have changed their rows
    deferred.ahead = []
    return [*results[:first], *results[first + len(ahead) :]]


def _opened(connection: Connection, deferred: _Deferred, results: list[PGresult]) -> Sequence[Any]:
    """The rows of the opening's last statement among ``results`` (BEGIN's first)."""
    if not deferred.opening:
        return ()
    return _rows(connection, deferred.opening[-1][0], results[len(deferred.opening)])


def deferring(session: Executor) -> bool:
    """True when ``session`` is a transaction ``begin`` opened: ``later`` may defer to it."""
    return isinstance(session, Connection) and _DEFERRED in session.info


def later(
    session: Executor,
    statement: Executable,
    params: Mapping[str, Any],
    *,
    conflict: Callable[[], BaseException] | None = None,
) -> None:
    """Run ``statement`` with ``params`` with the COMMIT of ``session``'s transaction (one
    ``begin`` opened, see ``deferring``), in its round trip; its rows are not read. Should it
    break a unique constraint, the transaction rolls back and ``end`` raises ``conflict()``
    (when given) instead of the driver's error."""
    connection = _connection(session)
    deferred: _Deferred = connection.info[_DEFERRED]
    plan = _plan(statement, connection.dialect)
    deferred.later.append((plan, _arguments(plan, params), conflict))


def end(connection: Connection, *, commit: bool) -> None:
    """COMMIT (or ROLLBACK) the transaction ``begin`` opened, sending what is deferred to
    the COMMIT with it.

    A COMMIT the server answers with ROLLBACK (a statement of the transaction failed and its
    error was not let through) raises StorageFailure: nothing was written. A rollback that
    fails (the connection is gone) is left to the pool, which drops the connection: the
    error being raised already is the one that matters."""
    deferred: _Deferred | None = connection.info.pop(_DEFERRED, None)
    if deferred is None:
        return
    if not commit:
        if deferred.opened is not None:
            _roll_back(connection)
        return
    if deferred.failed:
        _roll_back(connection)
        raise StorageFailure(_NOT_COMMITTED)
    if deferred.opened is None and not deferred.later:
        return  # not one statement ran: the server never saw the transaction
    deferred_items: list[_Item] = [(plan, args) for plan, args, _ in deferred.later]
    opening = _opening(deferred) if deferred.opened is None else []
    try:
        results = _send(connection, [*opening, *deferred_items, b"COMMIT"])
    except _Failed as failed:
        _roll_back(connection)
        index = failed.index - len(opening)
        conflict = deferred.later[index][2] if 0 <= index < len(deferred.later) else None
        if conflict is not None and getattr(failed.error.orig, "sqlstate", None) == "23505":
            raise conflict() from failed.error
        raise failed.error from failed.error.orig
    if results[-1].command_status == b"ROLLBACK":
        raise StorageFailure(_NOT_COMMITTED)


def _roll_back(connection: Connection) -> None:
    if connection.invalidated:
        return  # closed with the server's session: nothing is left to roll back
    with contextlib.suppress(DBAPIError):
        simple(connection, "ROLLBACK")


# Where ``begin`` keeps its transaction (``Connection.info``, which goes back to the pool
# with the connection: ``end`` takes it out).
_DEFERRED = "gleaner.prepared_deferred"
_BEGIN = b"BEGIN ISOLATION LEVEL READ COMMITTED"
_NOT_COMMITTED = "the transaction was rolled back, not committed: a statement in it failed"


def _opening(deferred: _Deferred) -> list[_Item]:
    return [_BEGIN, *deferred.opening]


class _Failed(Exception):
    """A statement ``_send`` sent failed (``index`` into its items; -1: the connection broke
    and which is unknown); ``error`` is the driver's error as SQLAlchemy raises it."""

    def __init__(self, index: int, error: StatementError) -> None:
        super().__init__(str(error))
        self.index, self.error = index, error


def _send(connection: Connection, items: list[_Item]) -> list[PGresult]:
    """Send ``items`` in one libpq pipeline (one round trip); each one's result.

    A statement that fails aborts the transaction (the server skips every statement after
    it) and raises ``_Failed``: the caller ends the transaction. An interruption between two
    libpq calls (a signal, a time limit) leaves the connection in an unknown state, so it is
    invalidated: the pool never hands it out again.
    """
    from psycopg import errors, pq

    driver = connection.connection.driver_connection
    assert driver is not None
    pgconn = driver.pgconn
    dbapi_error = connection.dialect.loaded_dbapi.Error
    sends = []
    for index, item in enumerate(items):  # prepared first: libpq prepares outside a pipeline
        try:
            sends.append(_bound(driver, item))
        except dbapi_error as exc:
            raise _Failed(index, _failure(connection, exc, _sql(item), {})) from exc
    try:
        results = _exchange(pgconn, sends)
    except dbapi_error as exc:  # the connection broke
        error = _failure(connection, exc, _sql(items[0]), {})
        if not connection.invalidated:
            connection.invalidate(exc)
        raise _Failed(-1, error) from exc
    except BaseException:
        if not connection.invalidated:
            connection.invalidate()
        raise
    for index, result in enumerate(results):
        if result.status == pq.ExecStatus.FATAL_ERROR:
            failure = errors.error_from_result(result, encoding=driver.info.encoding)
            if failure.sqlstate == _NO_SUCH_STATEMENT:
                _state(driver).prepared.clear()  # deallocated: the caller's retry prepares again
            error = _failure(connection, cast("DBAPIModule.Error", failure), _sql(items[index]), {})
            raise _Failed(index, error) from failure
    return results


def _exchange(pgconn: Any, sends: list[_Bound]) -> list[PGresult]:
    """One round trip: ``sends`` in one libpq pipeline, and each one's result. A connection
    lost meanwhile, or answers out of step, raise the driver's OperationalError."""
    from psycopg import OperationalError, pq

    pgconn.enter_pipeline_mode()
    for name, sql, values, formats in sends:
        if name is None:
            pgconn.send_query_params(sql, None)
        else:
            pgconn.send_query_prepared(name, cast(Any, values), formats)
    pgconn.pipeline_sync()
    poller = select.poll()
    fd = pgconn.socket
    results = []
    for _ in sends:  # a query's one result here, which libpq ends with None
        result = _next_result(pgconn, poller, fd)
        if result is None or _next_result(pgconn, poller, fd) is not None:
            break
        results.append(result)
    else:
        sync = _next_result(pgconn, poller, fd)
        if sync is not None and sync.status == pq.ExecStatus.PIPELINE_SYNC:
            pgconn.exit_pipeline_mode()
            return results
    lost = pgconn.status == pq.ConnStatus.BAD
    raise OperationalError(
        ("the connection to the server was lost: " if lost else "libpq pipeline out of step: ")
        + pgconn.get_error_message()
    )


def _next_result(pgconn: Any, poller: select.poll, fd: int) -> PGresult | None:
    """libpq's next result on the pipelined connection ``pgconn`` (its socket ``fd``),
    waited for in ``poll`` with the GIL released: psycopg's ``get_result`` holds it, so
    waiting there on the server stopped every other thread of the process (the other
    harvests of a threads pool, the lease heartbeat) for the round trip."""
    while True:
        unsent = pgconn.flush()  # psycopg's connections are non-blocking: 1 while data waits
        if not unsent and not pgconn.is_busy():
            return cast("PGresult | None", pgconn.get_result())
        poller.register(fd, select.POLLIN | (select.POLLOUT if unsent else 0))
        if any(events & ~select.POLLOUT for _, events in poller.poll()):
            pgconn.consume_input()  # raises OperationalError if the connection broke


def _sql(item: _Item) -> str:
    return item.decode() if isinstance(item, bytes) else item[0].compiled.string


def _bound(driver: psycopg.Connection[Any], item: _Item) -> _Bound:
    """What ``_send`` sends for ``item``: a prepared statement's name (prepared now if it
    is not yet), or None and the SQL; the dumped parameters and their formats."""
    if isinstance(item, bytes):
        return None, item, None, None
    plan, args = item
    name, dumped, formats = _prepare(driver, plan, args)
    return name, plan.sql, dumped, formats


def _rows(connection: Connection, plan: _Plan, result: PGresult) -> Sequence[Any]:
    """``result``'s rows as ``_run`` returns them (none for a statement without any)."""
    from psycopg import pq

    if result.status != pq.ExecStatus.TUPLES_OK:
        return []
    driver = connection.connection.driver_connection
    assert driver is not None
    return _loaded(driver, plan, result)


_listening: weakref.WeakSet[Engine] = weakref.WeakSet()


def _sends_opening_first(engine: Engine) -> None:
    """Make any statement SQLAlchemy runs on a connection of ``engine`` (an executemany, a
    caller's own) send the pending BEGIN and opening before it."""
    if engine in _listening:
        return

    def before(connection: Connection, _cursor: Any, statement: str, *_: Any) -> None:
        deferred: _Deferred | None = connection.info.get(_DEFERRED)
        if deferred is not None and deferred.opened is None:
            opened(connection)
        elif deferred is not None:
            deferred.check()
        if deferred is not None and deferred.answers and not _reads(statement):
            deferred.answers.clear()  # what was read ahead may have changed

    event.listen(engine, "before_cursor_execute", before)
    _listening.add(engine)


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
        sql,
        params,
        exc,
        dialect.loaded_dbapi.Error,
        hide_parameters=True,
        connection_invalidated=gone,
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
    return _run(driver, plan, _arguments(plan, params))


def on_driver_each(
    driver: psycopg.Connection[Any],
    dialect: Dialect,
    statements: Sequence[tuple[Executable, Mapping[str, Any]]],
) -> list[Sequence[Any]]:
    """``on_driver`` for several statements in one round trip (libpq's pipeline mode), on an
    autocommit psycopg connection; each one's rows. Up to the pipeline's one Sync they run in
    one implicit transaction: a statement that fails undoes the ones before it (but for a
    session-level advisory lock, which outlives a rollback) and raises the driver's error."""
    from psycopg import errors, pq

    if not driver.autocommit:
        raise RuntimeError("on_driver_each runs on an autocommit connection")
    plans = [_plan(statement, dialect) for statement, _ in statements]
    sends: list[_Bound] = []
    for plan, (_, params) in zip(plans, statements, strict=True):
        name, dumped, formats = _prepare(driver, plan, _arguments(plan, params))
        sends.append((name, plan.sql, dumped, formats))
    found: list[Sequence[Any]] = []
    for plan, result in zip(plans, _exchange(driver.pgconn, sends), strict=True):
        if result.status == pq.ExecStatus.FATAL_ERROR:
            failure = errors.error_from_result(result, encoding=driver.info.encoding)
            if failure.sqlstate == _NO_SUCH_STATEMENT:
                _state(driver).prepared.clear()  # deallocated: the caller's retry prepares again
            raise failure
        found.append(
            _loaded(driver, plan, result) if result.status == pq.ExecStatus.TUPLES_OK else []
        )
    return found


def _arguments(plan: _Plan, params: Mapping[str, Any]) -> list[Any]:
    """``params`` in ``$n`` order, through the statement's bind processors.

    Each value is found as SQLAlchemy's ``construct_params`` finds it (the bind's key in
    ``params``, then its compiled name, then the bind's own value), without building the
    dict of every bind: about half the time (2.4 against 4.3 µs for the claim), on each of
    a job's dozen statements. A
    required value missing goes to ``construct_params``, which raises its error."""
    if plan.sources is None:
        return _constructed(plan, params)
    values = []
    for (key, name, bind), process in zip(plan.sources, plan.processors, strict=True):
        if key in params:
            value = params[key]
        elif name in params:
            value = params[name]
        elif bind.required:
            return _constructed(plan, params)
        else:
            value = bind.effective_value
        values.append(value if process is None else process(value))
    return values


def _constructed(plan: _Plan, params: Mapping[str, Any]) -> list[Any]:
    values = plan.compiled.construct_params(dict(params)) or {}
    return [
        value if process is None else process(value)
        for value, process in zip((values[n] for n in plan.names), plan.processors, strict=True)
    ]


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

    pgconn = driver.pgconn
    if not driver.autocommit and pgconn.transaction_status == pq.TransactionStatus.IDLE:
        return _through_cursor(driver, plan, args)  # it sends the BEGIN
    name, dumped, formats = _prepare(driver, plan, args)
    result = pgconn.exec_prepared(name, cast(Any, dumped), formats)
    status = result.status
    if status == pq.ExecStatus.COMMAND_OK:
        return []
    if status != pq.ExecStatus.TUPLES_OK:
        failure = errors.error_from_result(result, encoding=driver.info.encoding)
        if failure.sqlstate != _NO_SUCH_STATEMENT:
            raise failure
        _state(driver).prepared.clear()  # someone deallocated them: prepare again
        if not again or pgconn.transaction_status != pq.TransactionStatus.IDLE:
            raise failure  # the failure aborted the transaction: its caller retries it
        return _run(driver, plan, args, again=False)
    return _loaded(driver, plan, result)


def _loaded(driver: psycopg.Connection[Any], plan: _Plan, result: PGresult) -> Sequence[Any]:
    """The rows of ``result``, a statement's that returned rows, as psycopg loads them."""
    if plan.row is None:
        fields = [(result.fname(n) or b"").decode() for n in range(result.nfields)]
        plan.row = _row_type(fields)
    transformer = _state(driver).transformer
    transformer.set_pgresult(result)
    return transformer.load_rows(0, result.ntuples, plan.row)


def _state(driver: psycopg.Connection[Any]) -> _Driver:
    state = _drivers.get(driver)
    if state is None:
        from psycopg.adapt import PyFormat, Transformer

        state = _drivers[driver] = _Driver(Transformer(driver), PyFormat.AUTO)
    return state


def _prepare(
    driver: psycopg.Connection[Any], plan: _Plan, args: list[Any]
) -> tuple[bytes, list[Any], Sequence[Any]]:
    """The name ``plan`` is prepared under on ``driver`` for ``args``' types (prepared now
    if it is not yet), and ``args`` dumped with their formats."""
    state = _state(driver)
    transformer = state.transformer
    dumped = transformer.dump_sequence(args, [state.auto] * len(args))
    types = transformer.types or ()
    key = (plan.sql, tuple(types))
    name = state.prepared.pop(key, None)
    if name is not None:
        # Used now: the newest, so preparing the next statement of the same pipeline can
        # never evict it before the pipeline is sent.
        state.prepared[key] = name
    else:
        from psycopg import errors, pq

        pgconn = driver.pgconn
        if len(state.prepared) >= MAX_PREPARED:  # the least recently used goes
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
    return name, cast(list[Any], dumped), list(transformer.formats or ())


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
        binds = {name: bind for bind, name in compiled.bind_names.items()}
        simple = not compiled.escaped_bind_names and all(n in binds for n in names)
        found = _plans[statement] = _Plan(
            compiled,
            compiled.string.encode(),
            names,
            tuple(cast(Callable[[Any], Any] | None, processors.get(n)) for n in names),
            tuple((binds[n].key, n, binds[n]) for n in names) if simple else None,
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
