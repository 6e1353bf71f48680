"""The job records: every queued transcript's state lives here, not in the broker.

States: ``pending`` (recorded, maybe on a queue) -> ``running`` -> ``done`` | ``failed``.
A running job is leased to the delivery that claimed it: its process renews ``heartbeat_at``
(``store.jobs.leases.Heartbeats``) and a job whose heartbeat is older than the lease has lost
its worker. Such a job is claimed again by the next message for it, or put back to
``pending`` by the sweep (``store.jobs.leases.recover_lost``); after ``job_max_crashes`` lost
workers it is failed instead. Reports over the records are in ``store.jobs.reports``.
``failed`` keeps the transcript and the reason; only ``reset`` (``gleaner retry``) puts it
back to ``pending``, never a stray message.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import (
    Boolean,
    Interval,
    Table,
    Update,
    and_,
    bindparam,
    case,
    func,
    not_,
    or_,
    select,
    update,
)
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from gleaner.store.jobs.intake import NewJob, add_jobs, create_import, new_id
from gleaner.store.schema.records import Job
from gleaner.store.schema.sql import dialect_name, lease_expired
from gleaner.store.schema.tables import DONE, FAILED, PENDING, RUNNING, utcnow
from gleaner.store.text import storable

if TYPE_CHECKING:
    from gleaner.store.schema.sql import Executor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedJob:
    """A job this delivery now holds; ``crashes`` counts the workers lost running it."""

    id: str
    owner: str
    provenance: str
    transcript: dict[str, Any]
    attempts: int
    crashes: int
    token: str
    import_id: str | None = None


JOBS = cast(Table, Job.__table__)
IS_RUNNING = JOBS.c.state == RUNNING


def lease_ran_out(expired: ColumnElement[datetime]) -> ColumnElement[bool]:
    """The one rule of a lost worker: a running job with no heartbeat, or none since
    ``expired`` (``store.schema.sql.lease_expired``); the claim, the lost-job sweep and ``holder``
    all ask it."""
    return or_(JOBS.c.heartbeat_at.is_(None), JOBS.c.heartbeat_at < expired)


# The longest error a failed job keeps.
MAX_ERROR_CHARS = 4000


def _claim(now: ColumnElement[datetime], expired: ColumnElement[datetime]) -> Update:
    """The claim, leases measured from ``now`` (and running out before ``expired``)."""
    return (
        update(JOBS)
        .where(
            JOBS.c.id == bindparam("job_id"),
            or_(
                JOBS.c.state == PENDING,
                and_(
                    IS_RUNNING,
                    or_(lease_ran_out(expired), JOBS.c.lease_token == bindparam("token")),
                ),
            ),
        )
        .values(
            state=RUNNING,
            started_at=now,
            heartbeat_at=now,
            lease_token=bindparam("token"),
            claimed_by=bindparam("worker"),
            attempts=JOBS.c.attempts + 1,
            # Taking a running job over means its worker was lost, unless this is the same
            # delivery retried after a database error (same token, not redelivered).
            crashes=JOBS.c.crashes
            + case(
                (
                    and_(
                        IS_RUNNING,
                        or_(
                            JOBS.c.lease_token.is_(None),
                            JOBS.c.lease_token != bindparam("token"),
                            bindparam("redelivered", type_=Boolean),
                        ),
                    ),
                    1,
                ),
                else_=0,
            ),
        )
        .returning(
            JOBS.c.id,
            JOBS.c.owner,
            JOBS.c.provenance,
            JOBS.c.transcript,
            JOBS.c.attempts,
            JOBS.c.crashes,
            JOBS.c.import_id,
        )
    )


# Built once: only the parameters change from job to job. A pending job is claimed; a
# running one only when its lease ran out (its worker is gone) or when this very delivery
# holds it (the same message again: redelivered because its worker was lost, or a retry of
# a run that ended on a database error). Done and failed jobs are never claimed. SQLite
# measures leases by this host's clock; PostgreSQL by its own (``store.schema.sql.lease_now``).
_CLAIM = _claim(bindparam("now"), bindparam("expired"))
# On PostgreSQL the claim commits without waiting for its WAL to reach the disk (its
# transaction alone: ``set_config(..., true)`` lasts until the statement's own commit). A
# claim is a lease, not anything a person or a model wrote: a database crash that forgets
# it leaves the job as it was before (pending, or held by the lease it took over), the
# worker's next statement fails on the dead connection and its retry or redelivery claims
# the job again; the flush of the harvest's write transaction, which waits as every
# write's does, makes the claim durable with it. Each job no longer waits on a flush of
# the disk (330 µs against 130 µs for such an UPDATE here: BENCHMARKS.md, session 12).
_CLAIM_PG = _claim(func.now(), func.now() - bindparam("lease", type_=Interval)).where(
    func.set_config("synchronous_commit", "off", True).is_not(None)
)
# The job's usage columns plus a run's, bound as ``_cost`` names them: for the statements
# built once (``_cost_added`` is the same for one built per call).
_USAGE_ADDED = {
    "model_calls": JOBS.c.model_calls + bindparam("calls"),
    "prompt_tokens": JOBS.c.prompt_tokens + bindparam("prompt"),
    "completion_tokens": JOBS.c.completion_tokens + bindparam("completion"),
}
_FINISH = (
    update(JOBS)
    .where(JOBS.c.id == bindparam("job_id"))
    .values(
        state=DONE,
        result=bindparam("outcome"),
        last_error=None,
        finished_at=bindparam("now"),
        **_USAGE_ADDED,
    )
)
# Only while this delivery holds the running job: a run presumed lost records nothing, and
# an outcome already recorded (done or failed) is never turned into another.
_FINISH_HELD = _FINISH.where(JOBS.c.lease_token == bindparam("token"), IS_RUNNING)
RELEASED = {"lease_token": None, "claimed_by": None, "heartbeat_at": None}


@dataclass(frozen=True)
class Holder:
    """Who holds a running job: its delivery's ``token``, the claiming process
    (``host:pid``) and whether its last heartbeat is younger than the lease (else its
    worker is lost), by the clock leases are measured by (``store.schema.sql.lease_now``)."""

    token: str | None
    claimed_by: str | None
    leased: bool


def holder(session: Executor, job_id: str, lease: timedelta) -> Holder | None:
    """The holder of ``job_id`` while it is running; None when it is not running."""
    alive = ~lease_ran_out(lease_expired(session, lease))
    found = session.execute(
        select(JOBS.c.lease_token, JOBS.c.claimed_by, func.coalesce(alive, False)).where(
            JOBS.c.id == job_id, IS_RUNNING
        )
    ).first()
    return None if found is None else Holder(found[0], found[1], bool(found[2]))


def claim(
    session: Executor,
    job_id: str,
    *,
    lease: timedelta,
    token: str | None = None,
    worker: str = "",
    redelivered: bool = False,
) -> ClaimedJob | None:
    """Lease a job to the delivery ``token`` and count the attempt; None when there is
    nothing to do: done, failed, gone, or running under a live lease elsewhere.

    ``token`` is the Celery task id of the message (a fresh id when None), ``worker`` the
    claiming process (``host:pid``), ``redelivered`` the broker's flag on the message. One
    statement: the row lock the UPDATE takes keeps a concurrent claim waiting until commit,
    after which its condition is evaluated again on the claimed row. On PostgreSQL its
    commit does not wait for the disk (``_CLAIM_PG``): run it on its own (``Store.statements``,
    as ``run_job`` does), never in a transaction that writes what must survive a crash.
    """
    token = token or new_id()
    params: dict[str, Any] = {
        "job_id": job_id,
        "token": token,
        "worker": worker[:255],
        "redelivered": redelivered,
    }
    if dialect_name(session) == "postgresql":
        found = session.execute(_CLAIM_PG, {**params, "lease": lease}).all()
    else:
        now = utcnow()
        found = session.execute(_CLAIM, {**params, "now": now, "expired": now - lease}).all()
    if not found:
        return None
    found_id, owner, provenance, transcript, attempts, crashes, import_id = found[0]
    return ClaimedJob(
        str(found_id),
        owner,
        provenance,
        dict(transcript),
        int(attempts),
        int(crashes),
        token,
        None if import_id is None else str(import_id),
    )


def _cost(result: dict[str, Any] | None) -> dict[str, int]:
    """A run's model usage, from its result (``model_calls``, ``prompt_tokens``, ...)."""
    found = result or {}
    return {
        "calls": int(found.get("model_calls", 0)),
        "prompt": int(found.get("prompt_tokens", 0)),
        "completion": int(found.get("completion_tokens", 0)),
    }


def finish(
    session: Executor, job_id: str, result: dict[str, Any], token: str | None = None
) -> bool:
    """Mark a job done, adding the run's model usage to the job's; with ``token``, only
    while that delivery still holds it. Returns whether the job was marked."""
    values = {"job_id": job_id, "outcome": result, "now": utcnow(), **_cost(result)}
    if token is None:
        done = session.execute(_FINISH, values)
    else:  # built once, like the claim: a statement made per call costs its construction
        done = session.execute(_FINISH_HELD, {**values, "token": token})
    return bool(cast("CursorResult[Any]", done).rowcount)


def _cost_added(result: dict[str, Any] | None) -> dict[str, Any]:
    """The job's usage columns, set to themselves plus a run's (``_cost`` of its result)."""
    cost = _cost(result)
    return {
        "model_calls": Job.model_calls + cost["calls"],
        "prompt_tokens": Job.prompt_tokens + cost["prompt"],
        "completion_tokens": Job.completion_tokens + cost["completion"],
    }


def add_cost(session: Executor, job_id: str, result: dict[str, Any], token: str) -> None:
    """Add a run's model usage (from its ``result``) to the job's, changing nothing else: a
    run that paid for model calls and then failed before its outcome was recorded (its
    database lost, an interrupt) keeps them on the job. Not when delivery ``token``'s
    outcome was recorded after all (a COMMIT whose answer was lost), which counted them."""
    recorded = and_(Job.state.in_((DONE, FAILED)), Job.lease_token == token)
    session.execute(update(Job).where(Job.id == job_id, not_(recorded)).values(_cost_added(result)))


# A run's usage added to a job its delivery no longer holds (``add_cost_if_not_held``).
_ADD_COST_NOT_HELD = (
    update(JOBS)
    .where(
        JOBS.c.id == bindparam("job_id"),
        not_(and_(func.coalesce(JOBS.c.lease_token, "") == bindparam("token"), IS_RUNNING)),
    )
    .values(**_USAGE_ADDED)
)


def add_cost_if_not_held(
    session: Executor, job_id: str, result: dict[str, Any], token: str
) -> None:
    """Add a run's usage to the job unless delivery ``token`` still holds it running. Sent
    when that delivery's ``finish`` or ``fail`` (which add it while held) marked nothing: a
    run presumed lost that comes back and commits then still has its calls counted, once."""
    values = {"job_id": job_id, "token": token, **_cost(result)}
    if not values["calls"] and not values["prompt"] and not values["completion"]:
        return
    session.execute(_ADD_COST_NOT_HELD, values)


def fail(
    session: Executor,
    job_id: str,
    error: str,
    token: str | None = None,
    result: dict[str, Any] | None = None,
    *,
    unclaimed_too: bool = False,
) -> bool:
    """Mark a job failed for good, keeping its transcript and the reason; with ``token``,
    only while that delivery still holds the running job (a run presumed lost records
    nothing; a soft time limit that fires after the harvest committed leaves it done). With
    ``result`` (the failed run's report) its model usage is added to the job's;
    ``unclaimed_too`` fails a pending job too (a run in this process that raised before its
    claim held). Returns whether the job was marked."""
    stmt = update(Job).where(Job.id == job_id)
    if token is not None:
        held = and_(Job.lease_token == token, Job.state == RUNNING)
        # A run in this process whose claim was rolled back with the error (SQLite: the
        # claim shares the first step's transaction) left the job pending.
        stmt = stmt.where(or_(held, Job.state == PENDING) if unclaimed_too else held)
    # The error may quote a model server's message: kept whatever it holds (``storable``).
    values: dict[str, Any] = {
        "state": FAILED,
        "last_error": storable(error, MAX_ERROR_CHARS),
        "finished_at": utcnow(),
        **_cost_added(result),
    }
    if result is not None:
        values["result"] = {
            key: storable(value, MAX_ERROR_CHARS) if isinstance(value, str) else value
            for key, value in result.items()
        }
    return bool(cast("CursorResult[Any]", session.execute(stmt.values(**values))).rowcount)


def worker_lost_error(crashes: int) -> str:
    """The reason a job is failed with once its workers were lost ``crashes`` times."""
    return (
        f"worker_lost: the worker running this job was lost {crashes} time(s) (killed, out of "
        "memory, over the hard time limit, or cut off from the database); it is not run "
        "again until `gleaner retry`"
    )


def reset(session: Session, job_ids: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """Put failed jobs (these, or all) back to pending with no crash counted; returns
    ``(id, queue)`` to enqueue. The only way a failed job runs again."""
    stmt = select(Job.id, Job.queue).where(Job.state == FAILED)
    if job_ids is not None:
        stmt = stmt.where(Job.id.in_(list(job_ids)))
    found = [(str(i), str(q)) for i, q in session.execute(stmt).all()]
    if found:
        session.execute(
            update(Job)
            .where(Job.id.in_([i for i, _ in found]), Job.state == FAILED)
            .values(state=PENDING, enqueued_at=utcnow(), finished_at=None, crashes=0, **RELEASED)
        )
    return found


# The public names; callers import those of store.jobs.intake from here too.
__all__ = [
    "IS_RUNNING",
    "JOBS",
    "MAX_ERROR_CHARS",
    "RELEASED",
    "ClaimedJob",
    "Holder",
    "NewJob",
    "add_cost",
    "add_cost_if_not_held",
    "add_jobs",
    "claim",
    "create_import",
    "fail",
    "finish",
    "holder",
    "lease_ran_out",
    "new_id",
    "reset",
    "worker_lost_error",
]
