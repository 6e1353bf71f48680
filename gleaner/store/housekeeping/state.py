"""Housekeeping's shared state: each task's advisory lock, watermark and last result.

Celery beat (``workers.housekeeping``) and ``gleaner housekeep`` run the tasks
(``store.housekeeping.decay``, ``store.housekeeping.dedupe``); both are safe while notes are
being written, and neither deletes anything."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from pydantic import BaseModel
from sqlalchemy import (
    select,
)
from sqlalchemy.orm import Session

from gleaner.store.schema.records import HousekeepingState
from gleaner.store.schema.sql import (
    advisory_key,
    dialect_insert,
)
from gleaner.store.schema.tables import utcnow

DECAY, DEDUPE = "decay", "dedupe"
# Results (and housekeeping_state.last_result) list at most this many pairs.
MAX_REPORTED_PAIRS = 100

Transactions = Callable[[], AbstractContextManager[Session]]


def lock_key(name: str) -> int:
    """The PostgreSQL advisory-lock key of the housekeeping task ``name``."""
    return advisory_key("housekeeping", name)


def watermark(session: Session, name: str) -> int:
    value = session.execute(
        select(HousekeepingState.watermark).where(HousekeepingState.name == name)
    ).scalar_one_or_none()
    return int(value or 0)


def record(session: Session, name: str, result: BaseModel, *, watermark: int | None = None) -> None:
    """Upsert the task's row in ``housekeeping_state``; the watermark only when given."""
    values: dict[str, Any] = {
        "last_run_at": utcnow(),
        # Counts only: reported pairs name scopes and slugs, which must not outlive a forget.
        "last_result": result.model_dump(mode="json", exclude={"pairs"}),
    }
    if watermark is not None:
        values["watermark"] = watermark
    stmt = dialect_insert(session, HousekeepingState).values(
        name=name, **{"watermark": 0, **values}
    )
    session.execute(stmt.on_conflict_do_update(index_elements=["name"], set_=values))


def elapsed(started: float) -> float:
    return round(time.perf_counter() - started, 3)
