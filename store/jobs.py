"""The job records: every queued transcript's state lives here, not in the broker.

States: ``pending`` (recorded, maybe on a queue) -> ``running`` -> ``done`` | ``failed``.
A running job is leased to the delivery that claimed it: its process renews ``heartbeat_at``
(:class:`Heartbeats`) and a job whose heartbeat is older than the lease has lost its worker.
Such a job is claimed again by the next message for it, or put back to ``pending`` by the
sweep (:func:`recover_lost`); after ``job_max_crashes`` lost workers it is failed instead.
``failed`` keeps the transcript and the reason; only ``reset`` (``gleaner retry``) puts it
back to ``pending``, never a stray message.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    Boolean,
    Engine,
    Table,
    and_,
    bindparam,
    case,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from store.models import DONE, FAILED, JOB_STATES, PENDING, RUNNING, ImportBatch, Job, utcnow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewJob:
    """A transcript to record as a job; ``transcript`` is its redacted JSON form."""

    owner: str
    provenance: str
    conversation_id: str
    transcript: dict[str, Any]
    transcript_hash: str | None = None


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


def new_id() -> str:
    return uuid.uuid4().hex


def create_import(
    session: Session, *, source: str, owner: str, provenance: str, unreadable: int = 0
) -> str:
    """Record a bulk import; its jobs are added with ``add_jobs(import_id=...)``."""
    import_id = new_id()
    session.add(
        ImportBatch(
            id=import_id,
            source=source,
            owner=owner,
            provenance=provenance,
            total=0,
            unreadable=unreadable,
            created_at=utcnow(),
        )
    )
    session.flush()
    return import_id


def add_jobs(
    session: Session, queue: str, jobs: Sequence[NewJob], *, import_id: str | None = None
) -> list[str]:
    """Record pending jobs in one statement; returns their ids (to enqueue after commit)."""
    now = utcnow()
    rows = [
        {
            "id": new_id(),
            "queue": queue,
            "state": PENDING,
            "owner": job.owner,
            "provenance": job.provenance,
            "conversation_id": job.conversation_id[:255],
            "transcript": job.transcript,
            "transcript_hash": job.transcript_hash,
            "import_id": import_id,
            "attempts": 0,
            "created_at": now,
            "enqueued_at": now,
        }
        for job in jobs
    ]
    if rows:
        session.execute(insert(Job), rows)
    if import_id is not None:
        session.execute(
            update(ImportBatch)
            .where(ImportBatch.id == import_id)
            .values(total=ImportBatch.total + len(rows))
        )
    return [str(row["id"]) for row in rows]


_JOBS = cast(Table, Job.__table__)
_RUNNING = _JOBS.c.state == RUNNING
# Built once: only the parameters change from job to job. A pending job is claimed; a
# running one only when its lease ran out (its worker is gone) or when this very delivery
# holds it (the same message again: redelivered because its worker was lost, or a retry of
# a run that ended on a database error). Done and failed jobs are never claimed.
_CLAIM = (
    update(_JOBS)
    .where(
        _JOBS.c.id == bindparam("job_id"),
        or_(
            _JOBS.c.state == PENDING,
            and_(
                _RUNNING,
                or_(
                    _JOBS.c.heartbeat_at.is_(None),
                    _JOBS.c.heartbeat_at < bindparam("expired"),
                    _JOBS.c.lease_token == bindparam("token"),
                ),
            ),
        ),
    )
    .values(
        state=RUNNING,
        started_at=bindparam("now"),
        heartbeat_at=bindparam("now"),
        lease_token=bindparam("token"),
        claimed_by=bindparam("worker"),
        attempts=_JOBS.c.attempts + 1,
        # Taking a running job over means its worker was lost, unless this is the same
        # delivery retried after a database error (same token, not redelivered).
        crashes=_JOBS.c.crashes
        + case(
            (
                and_(
                    _RUNNING,
                    or_(
                        _JOBS.c.lease_token.is_(None),
                        _JOBS.c.lease_token != bindparam("token"),
                        bindparam("redelivered", type_=Boolean),
                    ),
                ),
                1,
            ),
            else_=0,
        ),
    )
    .returning(
        _JOBS.c.id,
        _JOBS.c.owner,
        _JOBS.c.provenance,
        _JOBS.c.transcript,
        _JOBS.c.attempts,
        _JOBS.c.crashes,
    )
)
_FINISH = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"))
    .values(
        state=DONE,
        result=bindparam("outcome"),
        last_error=None,
        finished_at=bindparam("now"),
        model_calls=_JOBS.c.model_calls + bindparam("calls"),
        prompt_tokens=_JOBS.c.prompt_tokens + bindparam("prompt"),
        completion_tokens=_JOBS.c.completion_tokens + bindparam("completion"),
    )
)
_RELEASED = {"lease_token": None, "claimed_by": None, "heartbeat_at": None}


def claim(
    session: Session,
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
    after which its condition is evaluated again on the claimed row.
    """
    now = utcnow()
    token = token or new_id()
    row = session.execute(
        _CLAIM,
        {
            "job_id": job_id,
            "now": now,
            "expired": now - lease,
            "token": token,
            "worker": worker[:255],
            "redelivered": redelivered,
        },
    ).first()
    if row is None:
        return None
    found_id, owner, provenance, transcript, attempts, crashes = row
    return ClaimedJob(
        str(found_id), owner, provenance, dict(transcript), int(attempts), int(crashes), token
    )


def _cost(result: dict[str, Any] | None) -> dict[str, int]:
    """A run's model usage, from its result (``model_calls``, ``prompt_tokens``, ...)."""
    found = result or {}
    return {
        "calls": int(found.get("model_calls", 0)),
        "prompt": int(found.get("prompt_tokens", 0)),
        "completion": int(found.get("completion_tokens", 0)),
    }


def finish(session: Session, job_id: str, result: dict[str, Any], token: str | None = None) -> None:
    """Mark a job done, adding the run's model usage to the job's; with ``token``, only
    while that delivery still holds it."""
    stmt = _FINISH if token is None else _FINISH.where(_JOBS.c.lease_token == token)
    session.execute(stmt, {"job_id": job_id, "outcome": result, "now": utcnow(), **_cost(result)})


def fail(
    session: Session,
    job_id: str,
    error: str,
    token: str | None = None,
    result: dict[str, Any] | None = None,
) -> None:
    """Mark a job failed for good, keeping its transcript and the reason; with ``token``,
    only while that delivery still holds it (a run presumed lost records nothing). With
    ``result`` (the failed run's report) its model usage is added to the job's."""
    stmt = update(Job).where(Job.id == job_id)
    if token is not None:
        stmt = stmt.where(Job.lease_token == token)
    cost = _cost(result)
    values: dict[str, Any] = {
        "state": FAILED,
        "last_error": error[:4000],
        "finished_at": utcnow(),
        "model_calls": Job.model_calls + cost["calls"],
        "prompt_tokens": Job.prompt_tokens + cost["prompt"],
        "completion_tokens": Job.completion_tokens + cost["completion"],
    }
    if result is not None:
        values["result"] = result
    session.execute(stmt.values(**values))


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
            .values(state=PENDING, enqueued_at=utcnow(), finished_at=None, crashes=0, **_RELEASED)
        )
    return found


def renew(session: Session, leases: Mapping[str, str]) -> set[str]:
    """Renew the heartbeat of running jobs held by these ``{job id: token}`` leases; returns
    the ids renewed (a job missing from it was taken over or finished meanwhile)."""
    if not leases:
        return set()
    rows = session.execute(
        update(_JOBS)
        .where(
            _JOBS.c.id.in_(list(leases)),
            _JOBS.c.lease_token.in_(list(leases.values())),  # tokens are unique per delivery
            _RUNNING,
        )
        .values(heartbeat_at=utcnow())
        .returning(_JOBS.c.id)
    ).all()
    return {str(r[0]) for r in rows}


@dataclass
class Recovered:
    """What :func:`recover_lost` did: jobs back to pending (to send), jobs failed."""

    requeued: list[tuple[str, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def recover_lost(
    session: Session, lease: timedelta, max_crashes: int, limit: int = 1_000
) -> Recovered:
    """Running jobs whose heartbeat is older than ``lease`` lost their worker (killed, past
    the hard time limit, or cut off from the database past its retries, whatever became of
    its message): each counts a crash and goes back to pending, or is failed with
    :func:`worker_lost_error` once it reached ``max_crashes``. Returns what to send.

    Rows another transaction holds (a claim taking the job over) are skipped, not waited for.
    """
    now = utcnow()
    rows = session.execute(
        select(Job.id, Job.queue, Job.crashes)
        .where(
            Job.state == RUNNING, or_(Job.heartbeat_at.is_(None), Job.heartbeat_at < now - lease)
        )
        .order_by(Job.heartbeat_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    out = Recovered()
    by_crashes: dict[int, list[str]] = {}
    for job_id, queue, crashes in rows:
        if int(crashes) + 1 >= max_crashes:
            by_crashes.setdefault(int(crashes) + 1, []).append(str(job_id))
        else:
            out.requeued.append((str(job_id), str(queue)))
    for crashes, ids in by_crashes.items():
        session.execute(
            update(Job)
            .where(Job.id.in_(ids))
            .values(
                state=FAILED,
                crashes=crashes,
                last_error=worker_lost_error(crashes),
                finished_at=now,
                **_RELEASED,
            )
        )
        out.failed.extend(ids)
    if out.requeued:
        session.execute(
            update(Job)
            .where(Job.id.in_([i for i, _ in out.requeued]))
            .values(state=PENDING, crashes=Job.crashes + 1, enqueued_at=now, **_RELEASED)
        )
    return out


def pending_counts(session: Session, older_than: timedelta | None = None) -> dict[str, int]:
    """Pending jobs by queue: all of them, or those last sent longer ago than ``older_than``."""
    stmt = select(Job.queue, func.count()).where(Job.state == PENDING).group_by(Job.queue)
    if older_than is not None:
        stmt = stmt.where(Job.enqueued_at < utcnow() - older_than)
    return {str(queue): int(n) for queue, n in session.execute(stmt).all()}


def stale_pending(
    session: Session,
    queue: str,
    older_than: timedelta,
    *,
    skip: Collection[str] = frozenset(),
    most: int = 1_000,
) -> list[str]:
    """The pending jobs of ``queue`` last sent longer ago than ``older_than`` and not in
    ``skip`` (jobs whose message is known to wait on the queue), oldest-sent first, at most
    ``most``; they are marked sent now, so the caller must send them after the commit.

    The mark is a conditional UPDATE: of two overlapping sweeps, only one gets each job.
    """
    if most <= 0:
        return []
    cutoff = utcnow() - older_than
    chosen: list[str] = []
    candidates = session.execute(
        select(Job.id)
        .where(Job.state == PENDING, Job.queue == queue, Job.enqueued_at < cutoff)
        .order_by(Job.enqueued_at)
        .execution_options(yield_per=1_000)
    ).scalars()
    for job_id in candidates:
        if job_id not in skip:
            chosen.append(str(job_id))
            if len(chosen) >= most:
                break
    candidates.close()
    if not chosen:
        return []
    rows = session.execute(
        update(_JOBS)
        .where(
            _JOBS.c.id.in_(chosen),
            _JOBS.c.state == PENDING,
            _JOBS.c.enqueued_at < cutoff,
        )
        .values(enqueued_at=utcnow())
        .returning(_JOBS.c.id)
    ).all()
    sent = {str(r[0]) for r in rows}
    return [job_id for job_id in chosen if job_id in sent]


def counts(session: Session, import_id: str | None = None) -> dict[str, int]:
    """Jobs by state (every state present, zero when none)."""
    stmt = select(Job.state, func.count()).group_by(Job.state)
    if import_id is not None:
        stmt = stmt.where(Job.import_id == import_id)
    found = {str(state): int(n) for state, n in session.execute(stmt).all()}
    return {state: found.get(state, 0) for state in JOB_STATES}


def counts_by_queue(session: Session) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for queue, state, n in session.execute(
        select(Job.queue, Job.state, func.count()).group_by(Job.queue, Job.state)
    ).all():
        out.setdefault(str(queue), dict.fromkeys(JOB_STATES, 0))[str(state)] = int(n)
    return out


def _aware(value: datetime) -> datetime:
    # SQLite hands timestamps back without their zone; they were written in UTC.
    return value if value.tzinfo else value.replace(tzinfo=utcnow().tzinfo)


def oldest_pending(session: Session) -> datetime | None:
    value = session.execute(select(func.min(Job.enqueued_at)).where(Job.state == PENDING)).scalar()
    return None if value is None else _aware(value)


def running(session: Session, lease: timedelta, limit: int = 20) -> list[dict[str, Any]]:
    """The longest-running jobs: id, queue, seconds since the claim, seconds since the last
    heartbeat, and whether the lease ran out (the sweep will recover it). No owner, no text."""
    now = utcnow()
    rows = session.execute(
        select(Job.id, Job.queue, Job.started_at, Job.heartbeat_at)
        .where(Job.state == RUNNING)
        .order_by(Job.started_at)
        .limit(limit)
    ).all()
    out = []
    for job_id, queue, started_at, heartbeat_at in rows:
        age = None if heartbeat_at is None else (now - _aware(heartbeat_at)).total_seconds()
        out.append(
            {
                "id": str(job_id),
                "queue": str(queue),
                "running_seconds": None
                if started_at is None
                else round((now - _aware(started_at)).total_seconds(), 1),
                "heartbeat_age_seconds": None if age is None else round(age, 1),
                "lease_expired": age is None or age > lease.total_seconds(),
            }
        )
    return out


def failures(session: Session, limit: int = 20) -> list[dict[str, Any]]:
    """The most recent failed jobs: id, queue, owner, conversation, attempts, error, and what
    their runs cost the model."""
    rows = session.execute(
        select(
            Job.id,
            Job.queue,
            Job.owner,
            Job.conversation_id,
            Job.attempts,
            Job.last_error,
            Job.finished_at,
            Job.model_calls,
            Job.prompt_tokens,
            Job.completion_tokens,
        )
        .where(Job.state == FAILED)
        .order_by(Job.finished_at.desc())
        .limit(limit)
    ).all()
    return [
        {
            "id": r[0],
            "queue": r[1],
            "owner": r[2],
            "conversation_id": r[3],
            "attempts": r[4],
            "error": r[5],
            "finished_at": r[6].isoformat() if r[6] else None,
            "model_calls": int(r[7]),
            "prompt_tokens": int(r[8]),
            "completion_tokens": int(r[9]),
        }
        for r in rows
    ]


def import_progress(session: Session, import_id: str) -> dict[str, Any]:
    batch = session.get(ImportBatch, import_id)
    if batch is None:
        return {}
    by_state = counts(session, import_id)
    finished = by_state[DONE] + by_state[FAILED]
    return {
        "import_id": import_id,
        "source": batch.source,
        "total": batch.total,
        "unreadable": batch.unreadable,
        **by_state,
        "finished": finished,
        "percent": 100.0 if batch.total == 0 else round(100.0 * finished / batch.total, 1),
    }


def cost_by_state(session: Session) -> dict[str, dict[str, int]]:
    """Model calls and tokens every run of the jobs cost, by job state (failed runs too)."""
    rows = session.execute(
        select(
            Job.state,
            func.sum(Job.model_calls),
            func.sum(Job.prompt_tokens),
            func.sum(Job.completion_tokens),
        ).group_by(Job.state)
    )
    return {
        str(state): {
            "model_calls": int(calls or 0),
            "prompt_tokens": int(prompt or 0),
            "completion_tokens": int(completion or 0),
        }
        for state, calls, prompt, completion in rows
    }


def import_totals(session: Session, import_id: str) -> dict[str, int]:
    """Sums over the finished jobs of an import: notes and transcripts skipped (done jobs),
    model usage (every run of done and failed jobs)."""
    keys = ("notes_written", "notes_updated", "notes_skipped")
    totals = dict.fromkeys((*keys, "skipped"), 0)
    results = session.execute(
        select(Job.result).where(Job.import_id == import_id, Job.state == DONE)
    ).scalars()
    for result in results:
        found = result or {}
        for key in keys:
            totals[key] += int(found.get(key, 0))
        totals["skipped"] += found.get("status") == "skipped"
    calls, prompt, completion = session.execute(
        select(
            func.coalesce(func.sum(Job.model_calls), 0),
            func.coalesce(func.sum(Job.prompt_tokens), 0),
            func.coalesce(func.sum(Job.completion_tokens), 0),
        ).where(Job.import_id == import_id, Job.state.in_((DONE, FAILED)))
    ).one()
    totals.update(model_calls=calls, prompt_tokens=prompt, completion_tokens=completion)
    return {key: int(value) for key, value in totals.items()}


class Heartbeats:
    """Renews the leases of one process's running jobs: one thread, one UPDATE a beat.

    ``hold`` once the claim is committed, ``release`` when the run is over. The thread lives
    only while the process holds a lease, so an idle process or a CLI keeps none; a forked
    child starts its own. A failed beat is logged and tried again at the next one: a database
    outage longer than the lease makes the job look lost, which the ledger makes harmless.
    """

    def __init__(self, engine: Engine, every: float) -> None:
        self._engine = engine
        self._every = every
        self._leases: dict[str, str] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def hold(self, job_id: str, token: str) -> None:
        with self._changed:
            if self._pid != os.getpid():  # inherited through fork: the thread stayed behind
                self._pid, self._thread, self._leases = os.getpid(), None, {}
            self._leases[job_id] = token
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="gleaner-heartbeat", daemon=True
                )
                self._thread.start()

    def release(self, job_id: str) -> None:
        # No wake-up: the thread notices at its next beat that nothing is left to renew.
        with self._changed:
            self._leases.pop(job_id, None)

    def held(self) -> dict[str, str]:
        with self._changed:
            return dict(self._leases)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait(self._every)
                if not self._leases:
                    self._thread = None
                    return
                leases = dict(self._leases)
            try:
                with Session(self._engine) as session, session.begin():
                    renewed = renew(session, leases)
            except SQLAlchemyError as exc:
                log.warning("job heartbeat failed (%d job(s)): %s", len(leases), type(exc).__name__)
                continue
            except Exception:
                # The thread must outlive any one beat, or every lease of the process lapses.
                log.exception("job heartbeat failed (%d job(s))", len(leases))
                continue
            for job_id in set(leases) - renewed:
                # Finished meanwhile, or taken over after this process was presumed lost.
                with self._changed:
                    if self._leases.get(job_id) == leases[job_id]:
                        log.warning("job %s: lease no longer held by this process", job_id)
                        del self._leases[job_id]


_by_engine: weakref.WeakKeyDictionary[Engine, Heartbeats] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def heartbeats_for(engine: Engine, every: float) -> Heartbeats:
    """The process's lease keeper for ``engine`` (one per engine, created on first use)."""
    with _registry_lock:
        found = _by_engine.get(engine)
        if found is None:
            found = _by_engine[engine] = Heartbeats(engine, every)
        return found
