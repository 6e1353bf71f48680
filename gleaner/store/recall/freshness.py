"""Planner statistics kept fresh by the store itself while notes pour in (PostgreSQL).

A write looks up its scope's slugs and keys with ``scope_kind = .. AND scope_id = .. AND
slug = ANY(..)``. Two indexes lead with the scope: the unique (scope, slug) one finds each
slug in one descent; (scope, updated_seq) walks every note of the scope. When the statistics
say the scope holds about one row (a new database, or a scope that grew since the last
ANALYZE, as one owner's import does) the two cost the same and the planner may take the
second; each lookup then reads the whole scope, and a harvest's database time grows with it
(measured: 2.4 ms of PostgreSQL CPU a job at the start of a one-owner import, 12.8 ms at
24,000 notes). Autovacuum would analyze, but it may be off (as on the machines these tests
run on), it waits for 10% of a table to change, and it looks once a minute.

So every ``CHECK_EVERY`` notes a process writes, it reads ``pg_stat_user_tables`` and
analyzes ``memories`` if it changed by more than ``FLOOR`` rows plus ``SCALE`` of its size
since its last ANALYZE (PostgreSQL samples 30,000 rows whatever the table's size). One
process analyzes at a time (an advisory lock; the others go on); a failure is logged, never
raised: the writes it follows are committed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

log = logging.getLogger(__name__)

# The table whose statistics a write's lookups depend on, and how stale they may get. (The
# terms are looked up by scope and term, which one index alone serves: no plan to go wrong.)
WATCHED = ("memories",)
CHECK_EVERY = 1_000  # notes this process writes between two looks at the statistics
FLOOR, SCALE = 1_000, 0.01
# Advisory key (pg_try_advisory_lock): one process analyzes at a time.
_ANALYZING = 0x676C_6561_6E65_7201  # "gleaner" + 1
# How long an ANALYZE may wait for its table's lock, and the error of one that waited longer.
LOCK_WAIT_MS = 100
_LOCK_NOT_AVAILABLE = "55P03"

_STALE = text(
    "SELECT s.relname FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid"
    " WHERE s.schemaname = current_schema() AND s.relname = ANY(:tables)"
    " AND s.n_mod_since_analyze > :floor + :scale * greatest(c.reltuples, 0)"
    " ORDER BY s.relname"
)


class Freshness:
    """Counts the notes this process writes on one engine; every ``CHECK_EVERY`` of them,
    analyzes what went stale (``refresh``). Thread-safe; does nothing off PostgreSQL."""

    def __init__(
        self, engine: Engine, *, refresh: Callable[[Engine], list[str]] | None = None
    ) -> None:
        self._engine = engine
        # What analyzes the stale tables (``refresh``; a test passes one that fails).
        self._refresh = refresh
        self._written = 0
        self._lock = threading.Lock()
        self.enabled = engine.dialect.name == "postgresql"

    def wrote(self, notes: int) -> None:
        """``notes`` were written (inserted or updated) and committed."""
        if not self.enabled or notes <= 0:
            return
        with self._lock:
            self._written += notes
            if self._written < CHECK_EVERY:
                return
            self._written = 0
        try:
            (self._refresh or refresh)(self._engine)
        except Exception:  # the writes are committed; stale statistics only slow them
            log.warning("could not refresh the planner statistics", exc_info=True)


def stale_tables(conn: Connection) -> list[str]:
    """The watched tables changed by more than ``FLOOR`` + ``SCALE`` of their rows since
    their last ANALYZE (never analyzed: every change counts)."""
    rows = conn.execute(_STALE, {"tables": list(WATCHED), "floor": FLOOR, "scale": SCALE})
    return [str(name) for (name,) in rows]


def refresh(engine: Engine) -> list[str]:
    """ANALYZE the watched tables that went stale, unless another process is at it; the
    tables analyzed."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": _ANALYZING}).scalar():
            return []
        analyzed: list[str] = []
        try:
            # Never queue behind a VACUUM (autovacuum's or an operator's): a lock not granted
            # at once leaves the table to the next look, and a waiting ANALYZE would make
            # PostgreSQL cancel autovacuum's run after deadlock_timeout.
            conn.execute(text(f"SET lock_timeout = '{LOCK_WAIT_MS}ms'"))
            for table in stale_tables(conn):  # names from WATCHED, never from input
                try:
                    conn.execute(text(f"ANALYZE {table}"))
                except OperationalError as exc:
                    if getattr(exc.orig, "sqlstate", None) != _LOCK_NOT_AVAILABLE:
                        raise
                    log.info("%s is being vacuumed: analyzed on a later look", table)
                else:
                    analyzed.append(table)
        finally:
            conn.execute(text("RESET lock_timeout"))  # the connection goes back to the pool
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _ANALYZING})
    if analyzed:
        log.info("analyzed %s: their statistics were stale", ", ".join(analyzed))
    return analyzed
