"""Per-transcript advisory locks that cost no pooled connection while they are held.

Two workers given the same transcript at once (a re-import racing the first, a redelivery)
must not both call the model: the second waits for the first and then finds its ledger row.
The lock is held across the model call, which may take a minute, so holding it on a pooled
connection would cost one idle PostgreSQL connection per task in flight (64 threads, 64
connections). Instead each process keeps ONE dedicated connection per engine that holds all
of its session-level advisory locks; it is busy only for the lock and unlock statements.

PostgreSQL advisory locks are re-entrant within a session, so threads of one process are
kept apart by an in-process set of held keys. A process that dies closes its connection and
PostgreSQL releases its locks. The lock only saves duplicate model calls: exactly-once
writes come from the ledger's unique row, so losing the lock connection (a database restart)
can at worst cost a second model call, never a second set of notes. On SQLite, which has one
writer anyway, every lock is granted at once.

Callers use ``Store.transcript_lock(scope, digest)``, a :class:`TranscriptLock`.
"""

from __future__ import annotations

import threading
import time
import weakref
from types import TracebackType
from typing import Any

from sqlalchemy import Engine

from gleaner.store.db import shorten_keepalives
from gleaner.store.errors import StorageFailure
from gleaner.store.schema.sql import scope_key
from gleaner.store.schemas import Scope

# Waiting for another process's lock polls (a blocking call would tie up the shared
# connection); contention is rare, so the poll starts short and backs off.
FIRST_POLL_SECONDS = 0.05
MAX_POLL_SECONDS = 1.0
# Sent on the driver's own connection (not a pooled one: see the module's docstring), in
# psycopg's parameter style; psycopg prepares them once they are used often.
_TRY_LOCK = "SELECT pg_try_advisory_lock(%s)"
_UNLOCK = "SELECT pg_advisory_unlock(%s)"


class ProcessLocks:
    """The session-level advisory locks one process holds, on one dedicated connection of
    ``engine``; keys are ``store.schema.sql`` advisory keys."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._connection: Any = None  # the driver's connection (psycopg), in autocommit
        self._held: set[int] = set()
        self._changed = threading.Condition()
        self.enabled = engine.dialect.name == "postgresql"

    def _run(self, statement: str, key: int) -> bool:
        """The lock statement's answer."""
        try:
            if self._connection is None or self._connection.closed:
                # Outside the store's pool: a caller may hold the last pooled connection
                # while it waits here, and the pool is sized for the transactions alone.
                dialect = self._engine.dialect
                cargs, cparams = dialect.create_connect_args(self._engine.url)
                self._connection = dialect.connect(*cargs, **cparams)
                self._connection.autocommit = True
                shorten_keepalives(self._connection)
            ((held,),) = self._connection.execute(statement, (key,)).fetchall()
            return bool(held)
        except self._engine.dialect.loaded_dbapi.Error as exc:
            # The session (and every lock on it) is gone; the next call reconnects.
            self._drop()
            raise StorageFailure(f"database error while locking a transcript: {exc}") from exc
        except BaseException:
            # Interrupted mid-round-trip (a soft time limit, say): whether the lock or the
            # unlock ran is unknown. Closing the session releases every lock it held, so no
            # lock stays held on the server with nobody here knowing to release it.
            self._drop()
            raise

    def _drop(self) -> None:
        broken, self._connection = self._connection, None
        if broken is not None:
            broken.close()
        self._held.clear()

    def try_acquire(self, key: int) -> bool:
        """Take ``key`` if nobody (no thread here, no other process) holds it."""
        if not self.enabled:
            return True
        with self._changed:
            if key in self._held or not self._run(_TRY_LOCK, key):
                return False
            self._held.add(key)
            return True

    def acquire(self, key: int) -> None:
        """Block until this process holds ``key`` (other threads and processes wait)."""
        pause = FIRST_POLL_SECONDS
        while not self.try_acquire(key):
            with self._changed:
                if key in self._held:  # a thread of this process has it: wait for its release
                    self._changed.wait(MAX_POLL_SECONDS)
                    continue
            time.sleep(pause)  # another process has it: poll, without holding the mutex
            pause = min(pause * 2, MAX_POLL_SECONDS)

    def release(self, key: int) -> None:
        if not self.enabled:
            return
        with self._changed:
            try:
                if key in self._held:
                    self._run(_UNLOCK, key)
            finally:
                self._held.discard(key)
                self._changed.notify_all()

    @property
    def connection(self) -> Any:
        """The dedicated driver connection (psycopg, autocommit): None before the first
        lock, or after a failure dropped it. For looking at its session, never to run a
        lock on it behind this holder's back."""
        return self._connection

    def closed(self) -> bool:
        """Whether no dedicated connection is open (none yet, or closed)."""
        return self._connection is None or self._connection.closed

    def close(self) -> None:
        """Close the dedicated connection: PostgreSQL releases every lock it held."""
        with self._changed:
            if self._connection is not None:
                self._connection.close()
            self._connection = None
            self._held.clear()


_by_engine: weakref.WeakKeyDictionary[Engine, ProcessLocks] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def locks_for(engine: Engine) -> ProcessLocks:
    """The process's lock holder for ``engine`` (one per engine, created on first use)."""
    with _registry_lock:
        found = _by_engine.get(engine)
        if found is None:
            found = _by_engine[engine] = ProcessLocks(engine)
        return found


def close_for(engine: Engine) -> None:
    """Close the process's lock connection for ``engine``, if it opened one (the server
    releases every lock it held); the next lock taken opens a new one."""
    with _registry_lock:
        found = _by_engine.pop(engine, None)
    if found is not None:
        found.close()


def transcript_key(scope: Scope, digest: str) -> int:
    """The advisory key of one transcript (its redacted hash) in one scope."""
    return scope_key(f"harvest:{digest}", scope.kind, scope.id)


class TranscriptLock:
    """One (scope, transcript) lock of this process, not taken yet.

    ``try_acquire`` takes it only if it is free, ``acquire`` waits for it, ``release`` gives
    it back (a no-op unless taken). As a context manager it is acquired for the block.
    Meant for one thread: other threads and processes take their own.
    """

    def __init__(self, locks: ProcessLocks, key: int) -> None:
        self._locks = locks
        self._key = key
        self.held = False

    def try_acquire(self) -> bool:
        self.held = self.held or self._locks.try_acquire(self._key)
        return self.held

    def acquire(self) -> None:
        if not self.held:
            self._locks.acquire(self._key)
            self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self._locks.release(self._key)

    def __enter__(self) -> TranscriptLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.release()


def transcript_lock(engine: Engine, scope: Scope, digest: str) -> TranscriptLock:
    """The (scope, transcript) lock on ``engine``'s database, held on the process's
    dedicated lock connection."""
    return TranscriptLock(locks_for(engine), transcript_key(scope, digest))
