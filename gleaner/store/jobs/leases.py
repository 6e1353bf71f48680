"""Job leases: heartbeats that keep a running job's lease, and the sweep that finds jobs
whose worker was lost (put back to pending, or failed after ``job_max_crashes``) and pending
jobs whose message was lost (sent again)."""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import (
    Engine,
    func,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from gleaner.store.jobs.queue import IS_RUNNING, JOBS, RELEASED, lease_ran_out, worker_lost_error
from gleaner.store.schema.records import Job
from gleaner.store.schema.sql import lease_expired, lease_now
from gleaner.store.schema.tables import FAILED, PENDING, utcnow

log = logging.getLogger(__name__)


def renew(session: Session, leases: Mapping[str, str]) -> set[str]:
    """Renew the heartbeat of running jobs held by these ``{job id: token}`` leases; returns
    the ids renewed (a job missing from it was taken over or finished meanwhile)."""
    if not leases:
        return set()
    rows = session.execute(
        update(JOBS)
        .where(
            JOBS.c.id.in_(list(leases)),
            JOBS.c.lease_token.in_(list(leases.values())),  # tokens are unique per delivery
            IS_RUNNING,
        )
        .values(heartbeat_at=lease_now(session))
        .returning(JOBS.c.id)
    ).all()
    return {str(r[0]) for r in rows}


@dataclass
class Recovered:
    """What :func:`recover_lost` did: jobs back to pending (to send), jobs failed."""

    requeued: list[tuple[str, str]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def recover_lost(
    session: Session,
    lease: timedelta,
    max_crashes: int,
    limit: int = 1_000,
    job_ids: Collection[str] | None = None,
) -> Recovered:
    """Running jobs (all, or ``job_ids``) whose heartbeat is older than ``lease`` lost their
    worker (killed, past the hard time limit, or cut off from the database past its retries,
    whatever became of its message): each counts a crash and goes back to pending, or is
    failed with :func:`worker_lost_error` once it reached ``max_crashes``. Returns what to
    send.

    Rows another transaction holds (a claim taking the job over) are skipped, not waited for.
    """
    now = utcnow()
    expired = lease_expired(session, lease)
    stmt = select(Job.id, Job.queue, Job.crashes).where(IS_RUNNING, lease_ran_out(expired))
    if job_ids is not None:
        stmt = stmt.where(Job.id.in_(list(job_ids)))
    rows = session.execute(
        stmt.order_by(Job.heartbeat_at).limit(limit).with_for_update(skip_locked=True)
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
                **RELEASED,
            )
        )
        out.failed.extend(ids)
    if out.requeued:
        session.execute(
            update(Job)
            .where(Job.id.in_([i for i, _ in out.requeued]))
            .values(state=PENDING, crashes=Job.crashes + 1, enqueued_at=now, **RELEASED)
        )
    return out


def unsent(
    session: Session, older_than: timedelta, job_ids: Collection[str] | None = None
) -> list[tuple[str, str]]:
    """Pending jobs (all, or ``job_ids``) last sent, or recorded, longer than ``older_than``
    ago, as ``(id, queue)``: where no broker carries them, jobs whose process died before
    it ran them."""
    stmt = select(Job.id, Job.queue).where(
        Job.state == PENDING, Job.enqueued_at < utcnow() - older_than
    )
    if job_ids is not None:
        stmt = stmt.where(Job.id.in_(list(job_ids)))
    return [(str(i), str(q)) for i, q in session.execute(stmt.order_by(Job.enqueued_at)).all()]


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
        update(JOBS)
        .where(
            JOBS.c.id.in_(chosen),
            JOBS.c.state == PENDING,
            JOBS.c.enqueued_at < cutoff,
        )
        .values(enqueued_at=utcnow())
        .returning(JOBS.c.id)
    ).all()
    sent = {str(r[0]) for r in rows}
    return [job_id for job_id in chosen if job_id in sent]


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
