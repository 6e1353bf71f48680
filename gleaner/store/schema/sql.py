"""SQL pieces the store's modules share: the one place each is written.

- ``ID_CHUNK``: keys per ``IN (...)`` list, well under SQLite's bound-parameter limit.
- ``FLOAT_SLACK``: slack for float rounding in ``threshold * size`` comparisons, so a filter
  never drops a pair the exact Jaccard score keeps.
- ``advisory_key``: a PostgreSQL advisory-lock key for a purpose and its parts.
- ``scope_key`` / ``xact_locks``: advisory-lock keys for a scope, and taking them.
- ``next_seq`` / ``next_seqs`` / ``seq_expression``: the store-wide ``updated_seq``.
- ``dialect_insert``: the dialect's INSERT (with ``on_conflict_*``) for a table.
- ``one_of``: ``column IN (a list parameter)``, one array on PostgreSQL.
- ``recency_sql`` / ``decayed_weight``: the recency factor ``0.5 ** (age_days /
  half_life_days)``, as SQL text (search) and as an expression (decay). Both count a future
  time as now and cap the age at MAX_HALF_LIVES half-lives.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeAlias

from sqlalchemy import (
    Boolean,
    Connection,
    DateTime,
    Float,
    Interval,
    any_,
    bindparam,
    cast,
    extract,
    func,
    literal,
    select,
    text,
)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

from gleaner.store.schema.tables import MEMORIES, utcnow

if TYPE_CHECKING:
    from sqlalchemy.orm import Session
    from sqlalchemy.sql._typing import _HasClauseElement
    from sqlalchemy.sql.compiler import SQLCompiler

# Core only (no ORM, no PostgreSQL dialect at import): `gleaner search` imports this module.

# What a store function runs its statements on: an ORM session (a write, which may use the
# ORM's bulk statements) or a Core connection (``Store.statements``: steps of single Core
# statements, without the session's bookkeeping). A string, so this module stays Core only.
Executor: TypeAlias = "Session | Connection"

ID_CHUNK = 500
FLOAT_SLACK = 1e-9
# Ages past this many half-lives count as this many: PostgreSQL's power() raises on underflow
# and the factor is 0 to any precision that matters long before.
MAX_HALF_LIVES = 1000
LN_HALF = math.log(0.5)


def advisory_key(purpose: str, *parts: str) -> int:
    """A signed 64-bit key for a PostgreSQL advisory lock on ``purpose`` and ``parts``."""
    digest = hashlib.sha256("\x00".join((purpose, *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def scope_key(purpose: str, kind: str, scope_id: str) -> int:
    """The advisory-lock key of ``purpose`` in one scope."""
    return advisory_key(purpose, kind, scope_id)


def xact_locks(session: Session, keys: Sequence[int]) -> None:
    """Take PostgreSQL transaction-level advisory locks on ``keys``, in one order (so two
    holders of overlapping sets cannot deadlock); a no-op on SQLite, whose ``BEGIN
    IMMEDIATE`` already serializes writers."""
    if keys and dialect_name(session) == "postgresql":
        session.execute(
            text("SELECT pg_advisory_xact_lock(key) FROM unnest(CAST(:keys AS bigint[])) key"),
            {"keys": sorted(set(keys))},
        )


def dialect_name(session: Executor | str) -> str:
    """The dialect of ``session``'s database (a name passes through)."""
    if isinstance(session, str):
        return session
    if isinstance(session, Connection):
        return session.dialect.name
    return session.get_bind().dialect.name


def dialect_insert(session: Executor | str, table: Any) -> Any:
    """The dialect's INSERT for ``table`` (PostgreSQL or SQLite: both have ON CONFLICT), for a
    session or a dialect name."""
    from sqlalchemy.dialects import postgresql, sqlite

    return (postgresql.insert if dialect_name(session) == "postgresql" else sqlite.insert)(table)


class one_of(ColumnElement[bool]):  # noqa: N801 - reads as an SQL operator, like in_
    """``column IN (:name)``, the list bound at execution as ``{name: [...]}``.

    On PostgreSQL it is ``column = ANY(:name)``, one array parameter: the statement's text is
    the same whatever the list's length, so psycopg prepares it once and the server plans it
    once, where an expanding ``IN`` list is new SQL for every length. Elsewhere (SQLite) it is
    the expanding ``IN`` list. An empty list matches nothing on both.
    """

    inherit_cache = True
    type = Boolean()
    # A comparison, as the IN it renders is: without this SQLite's WHERE would get
    # "IN (...) = 1", which no index serves (a scan of the table for a lookup by key).
    _is_implicitly_boolean = True
    _traverse_internals = [  # noqa: RUF012 - SQLAlchemy reads this class attribute
        ("column", InternalTraversal.dp_clauseelement),
        ("name", InternalTraversal.dp_string),
    ]

    def __init__(self, column: _HasClauseElement[Any] | ColumnElement[Any], name: str) -> None:
        # A mapped attribute (Memory.slug) hands over its column through the SQL protocol.
        self.column: ColumnElement[Any] = (
            column if isinstance(column, ColumnElement) else column.__clause_element__()  # type: ignore[assignment]
        )
        self.name = name


@compiles(one_of)
def _one_of_list(element: one_of, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column.in_(bindparam(element.name, expanding=True)), **kw)


@compiles(one_of, "postgresql")
def _one_of_array(element: one_of, compiler: SQLCompiler, **kw: Any) -> str:
    from sqlalchemy.dialects.postgresql import ARRAY

    # The element type without its length: a cast to varchar(n) would cut longer values.
    array = bindparam(element.name, type_=ARRAY(type(element.column.type)()))
    return compiler.process(element.column == any_(array), **kw)


def recency_sql(dialect: str, column: str = "updated_at", now: str | None = None) -> str:
    """SQL for ``0.5 ** (age_days / :half)``, the age taken from ``column`` to ``now`` (an SQL
    expression; the database's current time when None), a future time counting as now and
    the age capped at MAX_HALF_LIVES half-lives. ``:half`` is the half-life in days.
    """
    if dialect == "postgresql":
        since = now or "now()"
        # In double precision: extract() gives numeric, whose power() costs about a
        # millisecond a row.
        seconds = f"CAST(extract(epoch FROM ({since} - {column})) AS float8)"
        days = f"greatest({seconds}, 0) / 86400.0"
        return f"exp({LN_HALF!r} * least({days} / :half, {MAX_HALF_LIVES}))"
    since = now or "'now'"
    days = f"max(julianday({since}) - julianday({column}), 0.0)"
    return f"exp({LN_HALF!r} * min({days} / :half, {MAX_HALF_LIVES}))"


def decayed_weight(dialect: str, now: datetime, half_life_days: float) -> ColumnElement[Any]:
    """``recency_sql`` as an expression over ``memories.updated_at``, as of ``now``."""
    if dialect == "postgresql":
        seconds = extract("epoch", literal(now, DateTime(timezone=True)) - MEMORIES.c.updated_at)
        days = func.greatest(cast(seconds, Float), 0.0) / 86400.0
        return func.power(literal(0.5, Float), func.least(days / half_life_days, MAX_HALF_LIVES))
    # The text form SQLAlchemy stores SQLite datetimes in (naive UTC), for julianday().
    stamp = now.replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    days = func.max(func.julianday(stamp) - func.julianday(MEMORIES.c.updated_at), 0.0)
    return func.exp(LN_HALF * func.min(days / half_life_days, MAX_HALF_LIVES))


# The store-wide ``updated_seq``: a sequence on PostgreSQL, max + 1 under SQLite's
# single writer.


def lease_now(session: Executor | str) -> ColumnElement[datetime]:
    """The time job leases are measured by: PostgreSQL's clock (``now()``, the statement's
    transaction start), so workers on hosts whose clocks disagree still agree on whose lease
    ran out; on SQLite, one host's (every process of an embedded store shares it)."""
    if dialect_name(session) == "postgresql":
        return func.now()
    return bindparam("lease_now", utcnow(), type_=DateTime(timezone=True), unique=True)


def lease_expired(session: Executor | str, lease: timedelta) -> ColumnElement[datetime]:
    """``lease_now`` less ``lease``: a heartbeat older than this lost its worker."""
    if dialect_name(session) == "postgresql":
        return func.now() - bindparam("lease", lease, type_=Interval, unique=True)
    # SQLite has no interval type: the subtraction is done here, on the same clock.
    return bindparam("expired", utcnow() - lease, type_=DateTime(timezone=True), unique=True)


def next_seq(session: Executor) -> int:
    """The next value of the store-wide, monotonic ``updated_seq``."""
    if dialect_name(session) == "postgresql":
        return int(session.execute(select(func.nextval("memories_updated_seq_seq"))).scalar_one())
    # SQLite transactions are BEGIN IMMEDIATE: no other writer runs between read and write.
    current = session.execute(select(func.max(MEMORIES.c.updated_seq))).scalar_one()
    return int(current or 0) + 1


def seq_expression(session: Session | str) -> Any:
    """SQL for the next ``updated_seq``, inlined into an INSERT: no round trip of its own."""
    if dialect_name(session) == "postgresql":
        return func.nextval("memories_updated_seq_seq")
    # SQLite transactions are BEGIN IMMEDIATE: no other writer runs between read and write.
    return select(func.coalesce(func.max(MEMORIES.c.updated_seq), 0) + 1).scalar_subquery()


def next_seqs(session: Executor, count: int) -> list[int]:
    """``count`` new ``updated_seq`` values, ascending, in one statement."""
    if count <= 0:
        return []
    if dialect_name(session) == "postgresql":
        values = session.execute(
            text("SELECT nextval('memories_updated_seq_seq') FROM generate_series(1, :n)"),
            {"n": count},
        ).scalars()
        return sorted(int(v) for v in values)
    first = next_seq(session)
    return list(range(first, first + count))
