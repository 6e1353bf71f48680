"""What harvest model calls spent, per owner and per import and UTC day: the daily budgets'
ledger (``harvest.budget`` checks it before each call and adds each call to it).

Each call's spend is added in a statement of its own (an upsert that adds), so workers on
other hosts see it at once; a check reads the day's row and compares it with the limit.
Core only (``gleaner status`` reads it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import delete, select

from gleaner.store.schema.sql import dialect_insert
from gleaner.store.schema.tables import MODEL_SPEND, utcnow

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor

Kind = Literal["owner", "import"]


@dataclass(frozen=True)
class Spent:
    """One day's spend of an owner or an import."""

    calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0


def today(now: datetime | None = None) -> str:
    """The UTC day a budget counts in, as the table keys it."""
    return (now or utcnow()).strftime("%Y-%m-%d")


def spent(conn: Executor, kind: Kind, key: str, day: str) -> Spent:
    table = MODEL_SPEND
    row = conn.execute(
        select(table.c.calls, table.c.tokens, table.c.cost_usd).where(
            table.c.kind == kind, table.c.key == key, table.c.day == day
        )
    ).first()
    return Spent() if row is None else Spent(int(row[0]), int(row[1]), float(row[2]))


def add(
    conn: Executor, kind: Kind, key: str, day: str, *, calls: int, tokens: int, cost_usd: float
) -> None:
    """Add one call's spend to the day's row (made when it is the day's first)."""
    table = MODEL_SPEND
    statement = dialect_insert(conn, table).values(
        kind=kind, key=key, day=day, calls=calls, tokens=tokens, cost_usd=cost_usd
    )
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=["kind", "key", "day"],
            set_={
                "calls": table.c.calls + calls,
                "tokens": table.c.tokens + tokens,
                "cost_usd": table.c.cost_usd + cost_usd,
            },
        )
    )


def of_day(conn: Executor, day: str, limit: int = 20) -> list[dict[str, Any]]:
    """The day's spend, most tokens first: owners and imports (``gleaner status``)."""
    table = MODEL_SPEND
    rows = conn.execute(
        select(table.c.kind, table.c.key, table.c.calls, table.c.tokens, table.c.cost_usd)
        .where(table.c.day == day)
        .order_by(table.c.tokens.desc(), table.c.kind, table.c.key)
        .limit(limit)
    ).mappings()
    return [dict(row) for row in rows]


def forget_owner(conn: Executor, owner: str) -> int:
    """Delete an owner's spend rows (a forget of the owner); how many."""
    table = MODEL_SPEND
    done: Any = conn.execute(delete(table).where(table.c.kind == "owner", table.c.key == owner))
    return int(done.rowcount or 0)
