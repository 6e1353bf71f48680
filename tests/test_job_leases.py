"""Job leases and the lost-work sweep on real services: PostgreSQL, Redis, `gleaner worker`
and `gleaner beat` processes, and a scripted local model server.

A dead worker's job comes back (whatever became of its message), a job that keeps killing its
worker is failed with the reason, a failed job stays failed whatever message arrives, and the
sweep re-sends only the jobs whose message is gone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, text, update
from sqlalchemy.engine import make_url

from gleaner.harvest.queue import record_jobs
from gleaner.harvest.queues import IMPORT_QUEUE, LIVE_QUEUE
from gleaner.harvest.transcript import Transcript
from gleaner.store import Store
from gleaner.store.jobs import leases as job_leases
from gleaner.store.jobs import queue as job_records
from gleaner.store.schema.models import HarvestLedger, Job, Memory, utcnow
from gleaner.workers.enqueue import requeue_stale
from gleaner.workers.waiting import job_id_of
from tests.cli_harness import Cli
from tests.conftest import test_settings
from tests.llm_server import LLMServer, answer, hang, llm_server, note
from tests.samples import native
from tests.workers_harness import Cluster, fresh_cluster, wait_for

pytestmark = [pytest.mark.postgres]

# A lease of 3 s renewed every second: a lost worker is noticed in seconds, not minutes.
SHORT_LEASE = {"GLEANER_JOB_LEASE_SECONDS": "3", "GLEANER_JOB_HEARTBEAT_SECONDS": "1"}
LONG_AGO = timedelta(hours=1)


# --- fixtures and helpers ----------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path, worker_id: str) -> Iterator[Cluster]:
    # Redis databases 4..9: the other worker tests take 10..15.
    yield from fresh_cluster("leases", worker_id, tmp_path)


def open_store(cluster: Cluster, **overrides: Any) -> Store:
    """A store (and the Celery app the sweep sends with) on the cluster's services."""
    from gleaner.workers.app import make_celery

    settings = test_settings(broker_url=cluster.env["GLEANER_BROKER_URL"], **overrides)
    make_celery(settings)
    return Store(cluster.env["GLEANER_DATABASE_URL"], settings=settings)


@pytest.fixture
def jobs_store(cluster: Cluster) -> Iterator[Store]:
    opened = open_store(cluster)
    yield opened
    opened.dispose()


@pytest.fixture
def model() -> Iterator[LLMServer]:
    with llm_server() as server:
        yield server


def use_model(cluster: Cluster, model: LLMServer) -> None:
    cluster.env.update(
        {
            "GLEANER_HARVEST_MODEL": "openai/test-model",
            "GLEANER_HARVEST_API_BASE": model.api_base,
            "GLEANER_HARVEST_API_KEY": "k",
        }
    )


def record(store: Store, count: int, *, queue: str = LIVE_QUEUE, start: int = 0) -> list[str]:
    transcripts = [
        Transcript.model_validate(native(i, facts=1)) for i in range(start, start + count)
    ]
    provenance = "import" if queue == IMPORT_QUEUE else "compaction"
    return record_jobs(store, transcripts, owner=None, provenance=provenance, queue=queue)


def row(store: Store, job_id: str) -> dict[str, Any]:
    with store.transaction() as session:
        found = session.get(Job, job_id)
        assert found is not None
        return {c.name: getattr(found, c.name) for c in Job.__table__.columns}


def set_columns(store: Store, job_ids: list[str], **values: Any) -> None:
    with store.transaction() as session:
        session.execute(update(Job).where(Job.id.in_(job_ids)).values(**values))


def count(store: Store, model: type) -> int:
    with store.transaction() as session:
        return len(session.execute(select(model)).all())


def hold(store: Store, job_id: str, token: str, *, heartbeat_age: float = 0.0) -> None:
    """Claim a job as some other worker would, its last heartbeat ``heartbeat_age`` ago."""
    with store.transaction() as session:
        assert job_records.claim(session, job_id, lease=timedelta(seconds=120), token=token)
    stamp = utcnow() - timedelta(seconds=heartbeat_age)
    set_columns(store, [job_id], heartbeat_at=stamp, started_at=stamp)


def queued_ids(cluster: Cluster, queue: str) -> list[str | None]:
    return [job_id_of(raw) for raw in cluster.redis().lrange(queue, 0, -1)]


def wait_calls(model: LLMServer, calls: int, timeout: float = 60) -> None:
    wait_for(lambda: model.calls == calls, timeout)


def kill_children(cluster: Cluster) -> None:
    for worker in cluster.workers:
        for child in worker.children():
            os.kill(child, signal.SIGKILL)


# --- settings ------------------------------------------------------------------------------


def test_a_lease_must_outlast_two_heartbeats_and_the_sweep_runs_once_a_lease() -> None:
    from gleaner import beat_schedule
    from gleaner.store import ConfigError, load_settings

    with pytest.raises(ConfigError) as refused:
        load_settings(job_lease_seconds=60, job_heartbeat_seconds=30)
    assert "GLEANER_JOB_LEASE_SECONDS" in str(refused.value)
    assert "GLEANER_JOB_HEARTBEAT_SECONDS" in str(refused.value)
    with pytest.raises(ConfigError, match="GLEANER_JOB_MAX_CRASHES"):
        load_settings(job_max_crashes=0)
    sweep = beat_schedule.schedule(test_settings(job_lease_seconds=3, job_heartbeat_seconds=1))
    assert sweep["requeue-stale-jobs"]["schedule"] == timedelta(seconds=3)
    assert beat_schedule.schedule(test_settings())["requeue-stale-jobs"]["schedule"] == timedelta(
        seconds=60
    )


# --- the claim -----------------------------------------------------------------------------


def test_a_claim_takes_pending_or_lost_jobs_never_failed_done_or_live_ones(store: Store) -> None:
    [job_id] = record(store, 1)
    lease = timedelta(seconds=60)

    def claim(token: str, redelivered: bool = False) -> job_records.ClaimedJob | None:
        with store.transaction() as session:
            return job_records.claim(
                session, job_id, lease=lease, token=token, worker="w:1", redelivered=redelivered
            )

    first = claim("t1")
    assert first is not None and (first.attempts, first.crashes, first.token) == (1, 0, "t1")
    assert claim("t2") is None  # running under a live lease: a duplicate message is a no-op
    retried = claim("t1")  # the same delivery retried after a database error: no crash
    assert retried is not None and (retried.attempts, retried.crashes) == (2, 0)
    redelivered = claim("t1", redelivered=True)  # its worker was lost: a crash
    assert redelivered is not None and (redelivered.attempts, redelivered.crashes) == (3, 1)

    set_columns(store, [job_id], heartbeat_at=utcnow() - timedelta(seconds=61))
    taken = claim("t3")  # the lease ran out: another message takes the job over
    assert taken is not None and (taken.attempts, taken.crashes) == (4, 2)
    with store.transaction() as session:
        assert job_leases.renew(session, {job_id: "t1"}) == set()  # no longer its lease
        assert job_leases.renew(session, {job_id: "t3"}) == {job_id}
        job_records.fail(session, job_id, "late: from the lost run", token="t1")
    assert row(store, job_id)["state"] == "running"  # a lost run's outcome is not recorded

    with store.transaction() as session:
        job_records.fail(session, job_id, "model_permanent: no", token="t3")
    assert claim("t4") is None and claim("t3", redelivered=True) is None  # failed stays failed
    assert row(store, job_id)["state"] == "failed"

    with store.transaction() as session:
        assert job_records.reset(session, [job_id]) == [(job_id, LIVE_QUEUE)]
    after_retry = claim("t5")
    assert after_retry is not None and after_retry.crashes == 0  # retry starts the count anew
    with store.transaction() as session:  # a run that lost the job records no outcome
        job_records.finish(session, job_id, {"status": "harvested"}, token="t3")
    assert row(store, job_id)["state"] == "running"
    with store.transaction() as session:
        job_records.finish(session, job_id, {"status": "harvested"}, token="t5")
    assert claim("t5", redelivered=True) is None and row(store, job_id)["state"] == "done"


def test_leases_are_measured_by_postgresql_s_clock_not_the_workers(
    make_store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Workers whose clocks disagree still agree on whose lease ran out: a worker an hour
    slow claims and renews, and neither a worker with a true clock nor a sweep an hour fast
    takes its job over (by the workers' clocks, its heartbeat would be an hour old)."""
    import gleaner.store.jobs.leases
    import gleaner.store.schema.sql

    store_: Store = make_store("postgresql")
    [job_id] = record(store_, 1)
    lease = timedelta(seconds=60)

    def clock(offset: timedelta) -> None:
        for module in (job_records, gleaner.store.jobs.leases, gleaner.store.schema.sql):
            monkeypatch.setattr(module, "utcnow", lambda: datetime.now(UTC) + offset)

    clock(-LONG_AGO)  # the holder's host
    with store_.transaction() as session:
        assert job_records.claim(session, job_id, lease=lease, token="t1", worker="slow:1")
        assert job_leases.renew(session, {job_id: "t1"}) == {job_id}
    clock(timedelta(0))  # another worker's host
    with store_.transaction() as session:
        assert job_records.claim(session, job_id, lease=lease, token="t2", worker="w:2") is None
        held = job_records.holder(session, job_id, lease)
        assert held is not None and held.leased and held.token == "t1"
        age = session.execute(
            text("SELECT extract(epoch FROM now() - heartbeat_at) FROM jobs WHERE id = :id"),
            {"id": job_id},
        ).scalar_one()
        assert 0 <= float(age) < 30  # the heartbeat is PostgreSQL's time
    clock(LONG_AGO)  # the sweep's host
    with store_.transaction() as session:
        recovered = job_leases.recover_lost(session, lease, max_crashes=3)
    assert (recovered.requeued, recovered.failed) == ([], [])
    job = row(store_, job_id)
    assert (job["state"], job["lease_token"], job["crashes"]) == ("running", "t1", 0)
    # Once its heartbeat is older than the lease by PostgreSQL's clock, it is lost.
    with store_.engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET heartbeat_at = now() - interval '61 seconds' WHERE id = :id"),
            {"id": job_id},
        )
    clock(-LONG_AGO)
    with store_.transaction() as session:
        taken = job_records.claim(session, job_id, lease=lease, token="t3", worker="slow:3")
    assert taken is not None and taken.crashes == 1


def test_an_outcome_once_recorded_is_never_turned_into_another(store: Store) -> None:
    """A soft time limit that fires after the harvest committed (or a late retry of the same
    delivery) finds the job done or failed: its outcome stands."""
    done, failed = record(store, 2)
    lease = timedelta(seconds=60)
    with store.transaction() as session:
        assert job_records.claim(session, done, lease=lease, token="t1")
        assert job_records.claim(session, failed, lease=lease, token="t2")
    with store.transaction() as session:
        job_records.finish(session, done, {"status": "harvested", "model_calls": 1}, token="t1")
        assert job_records.fail(session, failed, "model_permanent: no", token="t2")
    with store.transaction() as session:
        assert not job_records.fail(session, done, "time_limit: too late", token="t1")
        job_records.finish(session, failed, {"status": "harvested", "model_calls": 1}, token="t2")
    kept = row(store, done)
    assert (kept["state"], kept["last_error"], kept["model_calls"]) == ("done", None, 1)
    assert kept["result"]["status"] == "harvested"
    stays = row(store, failed)
    assert (stays["state"], stays["last_error"]) == ("failed", "model_permanent: no")
    assert stays["model_calls"] == 0


def test_a_message_given_back_while_its_run_goes_on_here_leaves_the_run_alone(
    make_store: Any,
) -> None:
    """Redis gives a message back when the connection that took it broke, though its run
    goes on: the same delivery must not run twice. A holder that died (its child killed,
    say) or one on another host is taken over at once, as before."""
    import socket
    import subprocess

    from gleaner.harvest.queue import run_job

    store: Store = make_store("postgresql")
    lease = timedelta(seconds=60)
    here = socket.gethostname()
    gone = subprocess.Popen(["true"])  # a process that ran and is gone
    gone.wait()
    holders = {
        f"{here}:{os.getpid()}": None,  # alive: left to it
        f"{here}:{gone.pid}": "harvested",  # dead: taken over
        "another-host:1": "harvested",  # not seen from here: taken over
    }
    for n, (worker, outcome) in enumerate(holders.items()):
        [job_id] = record(store, 1, start=n)
        with store.transaction() as session:
            assert job_records.claim(session, job_id, lease=lease, token="t1", worker=worker)
        result = run_job(store, job_id, token="t1", redelivered=True)
        job = row(store, job_id)
        if outcome is None:
            assert result is None
            assert (job["state"], job["attempts"], job["crashes"]) == ("running", 1, 0)
        else:
            assert result is not None and result["status"] == outcome, worker
            assert (job["state"], job["attempts"], job["crashes"]) == ("done", 2, 1)
    # Its lease ran out: the live holder is lost to the job whatever it still does.
    mine = f"{here}:{os.getpid()}"
    [late] = record(store, 1, start=99)
    with store.transaction() as session:
        assert job_records.claim(session, late, lease=lease, token="t1", worker=mine)
    expired = utcnow() - timedelta(seconds=store.settings.job_lease_seconds + 1)
    set_columns(store, [late], heartbeat_at=expired)
    assert run_job(store, late, token="t1", redelivered=True) is not None
    # A retry of the same delivery (not given back by the broker) takes its claim back.
    [retried] = record(store, 1, start=120)
    with store.transaction() as session:
        assert job_records.claim(session, retried, lease=lease, token="t2", worker=mine)
    assert run_job(store, retried, token="t2") is not None


def test_a_harvest_that_raises_a_defect_is_failed_with_it_and_not_run_again(
    make_store: Any, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """Not left running for its lease to call it a lost worker and run it (and its model
    calls) again up to GLEANER_JOB_MAX_CRASHES times."""
    import gleaner.harvest.queue
    from gleaner.workers import runtime
    from gleaner.workers.tasks import harvest as harvest_task

    store: Store = make_store("postgresql")
    [job_id] = record(store, 1)
    previous = runtime.use(store)
    request.addfinalizer(lambda: runtime.use(previous))

    def defect(*_args: object, **_kwargs: object) -> None:
        raise KeyError("speaker")

    monkeypatch.setattr(gleaner.harvest.queue, "plan_harvest", defect)
    result = harvest_task.apply(args=[job_id], task_id="delivery-1")
    assert result.failed() and isinstance(result.result, KeyError)
    failed = row(store, job_id)
    assert (failed["state"], failed["crashes"], failed["attempts"]) == ("failed", 0, 1)
    assert failed["last_error"].startswith("internal_error: KeyError: 'speaker'")
    again = harvest_task.apply(args=[job_id], task_id="delivery-2")  # a stray message
    assert again.successful() and row(store, job_id)["attempts"] == 1


def test_a_claim_on_postgresql_does_not_wait_for_the_disk_and_what_follows_does(
    make_store: Any,
) -> None:
    made: Store = make_store("postgresql")
    # The test databases do not wait for the disk at all (conftest): this store's sessions do.
    waits = make_url(made.database_url).update_query_dict({"options": "-csynchronous_commit=on"})
    store = Store(waits.render_as_string(hide_password=False), settings=made.settings)
    [job_id] = record(store, 1)
    lease = timedelta(seconds=60)
    with store.transaction() as session:  # seen inside a transaction: it is that one's alone
        assert job_records.claim(session, job_id, lease=lease, token="t1")
        assert session.execute(text("SHOW synchronous_commit")).scalar() == "off"
    with store.statements() as connection:  # as run_job claims: the claim's own commit
        assert job_records.claim(connection, job_id, lease=lease, token="t1")
        assert connection.execute(text("SHOW synchronous_commit")).scalar() == "on"
    with store.transaction() as session:  # the same pooled connection: back to waiting
        assert session.execute(text("SHOW synchronous_commit")).scalar() == "on"
    assert row(store, job_id)["attempts"] == 2
    store.dispose()


# --- status --------------------------------------------------------------------------------


def test_status_shows_how_long_each_running_job_has_run_and_its_heartbeat(
    cluster: Cluster,
    jobs_store: Store,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    live, lost = record(jobs_store, 2)
    hold(jobs_store, live, "a", heartbeat_age=0.0)
    set_columns(jobs_store, [live], started_at=utcnow() - timedelta(seconds=42))
    hold(jobs_store, lost, "b", heartbeat_age=600.0)  # default lease: 120 s

    # The command in this process (what is tested is what it prints, not its start-up).
    cli = Cli(monkeypatch, capsys)
    cli.env(**{k: v for k, v in cluster.env.items() if k.startswith("GLEANER_")})
    out = cli("status", "--json")
    assert out.code == 0, out.err
    running = out.json()["running"]
    assert [r["id"] for r in running] == [lost, live]  # longest-running first
    assert {tuple(sorted(r)) for r in running} == {
        ("heartbeat_age_seconds", "id", "lease_expired", "queue", "running_seconds")
    }
    by_id = {r["id"]: r for r in running}
    assert 42 <= by_id[live]["running_seconds"] < 60 and by_id[live]["heartbeat_age_seconds"] < 5
    assert not by_id[live]["lease_expired"] and by_id[lost]["lease_expired"]
    assert by_id[lost]["heartbeat_age_seconds"] >= 600 and by_id[lost]["queue"] == LIVE_QUEUE

    text = cli("status").out
    assert f"RUNNING {live} on harvest for " in text and "last heartbeat" in text
    assert f"RUNNING {lost}" in text and "lease expired" in text
    assert "alice" not in text and "conv-" not in text  # no owner, no conversation


# --- the sweep, without workers -------------------------------------------------------------


def test_a_sent_message_is_the_harvest_of_its_job_on_its_queue_with_its_args_shown(
    cluster: Cluster, jobs_store: Store
) -> None:
    """send_jobs declares the queue once and gives each message its own ``argsrepr``
    (what Flower and task events show): the message is still Celery's, for its job."""
    from gleaner.workers.enqueue import send_jobs

    first, second = record(jobs_store, 2)
    assert send_jobs(IMPORT_QUEUE, [first, second]) == 2
    raw = cluster.redis().lrange(IMPORT_QUEUE, 0, -1)
    messages = [json.loads(item) for item in reversed(raw)]  # LPUSH: the newest first
    assert [m["headers"]["task"] for m in messages] == ["gleaner.harvest"] * 2
    assert [m["headers"]["argsrepr"] for m in messages] == [repr([first]), repr([second])]
    assert [m["headers"]["kwargsrepr"] for m in messages] == ["{}", "{}"]
    # No time limit travels: the worker applies its own, whatever the sender's settings.
    assert (
        all(harvest_app_limits())
        and [m["headers"]["timelimit"] for m in messages] == [[None, None]] * 2
    )
    assert [m["properties"]["delivery_info"]["routing_key"] for m in messages] == [IMPORT_QUEUE] * 2
    assert [job_id_of(item) for item in reversed(raw)] == [first, second]


def harvest_app_limits() -> tuple[int, int]:
    """The sending app's own limits (set: they would travel without WORKER_LIMITS)."""
    from gleaner.workers.tasks import harvest

    return harvest.app.conf.task_soft_time_limit, harvest.app.conf.task_time_limit


def test_a_waiting_backlog_is_not_sent_again_but_a_lost_message_is(
    cluster: Cluster, jobs_store: Store
) -> None:
    from gleaner.workers.enqueue import send_jobs

    backlog = record(jobs_store, 200)
    send_jobs(LIVE_QUEUE, backlog)
    set_columns(jobs_store, backlog, enqueued_at=utcnow() - LONG_AGO)
    client = cluster.redis()

    # Every message still waits: sweeps (one a minute, for hours) add nothing.
    assert requeue_stale(jobs_store) == 0 and requeue_stale(jobs_store) == 0
    assert client.llen(LIVE_QUEUE) == 200

    # One message is lost (the oldest; Redis hands out the tail first): exactly it is re-sent.
    lost = job_id_of(client.rpop(LIVE_QUEUE))  # type: ignore[arg-type]
    assert lost in backlog
    assert requeue_stale(jobs_store) == 1
    assert client.llen(LIVE_QUEUE) == 200 and queued_ids(cluster, LIVE_QUEUE)[0] == lost
    assert requeue_stale(jobs_store) == 0

    # Past the scan limit the sweep compares counts: the shortfall, oldest-sent first.
    second = job_id_of(client.rpop(LIVE_QUEUE))  # type: ignore[arg-type]
    assert second is not None
    set_columns(jobs_store, [second], enqueued_at=utcnow() - 2 * LONG_AGO)
    assert requeue_stale(jobs_store, scan_limit=10) == 1
    assert second in queued_ids(cluster, LIVE_QUEUE) and client.llen(LIVE_QUEUE) == 200
    assert requeue_stale(jobs_store, scan_limit=10) == 0

    # A job sent recently is left alone even without a message: it may be on its way.
    [recent] = record(jobs_store, 1, start=200)
    assert requeue_stale(jobs_store) == 0

    # Redis restarted with nothing persisted: every pending job sent long enough ago is sent
    # once; the three sent just now follow when they are as old.
    client.flushdb()
    assert requeue_stale(jobs_store) == 198
    assert requeue_stale(jobs_store) == 0 and client.llen(LIVE_QUEUE) == 198
    set_columns(jobs_store, [lost, second, recent], enqueued_at=utcnow() - LONG_AGO)
    assert requeue_stale(jobs_store) == 3
    assert sorted(map(str, queued_ids(cluster, LIVE_QUEUE))) == sorted([*backlog, recent])


def test_a_sweep_sends_at_most_send_limit_jobs_a_queue_and_the_next_sweep_the_rest(
    cluster: Cluster, jobs_store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    # After Redis lost everything, one sweep must not flood the queue and the broker in one
    # go: a bounded batch each minute until every lost job is sent again, each once.
    import gleaner.workers.enqueue

    monkeypatch.setattr(gleaner.workers.enqueue, "SEND_LIMIT", 50)
    lost = record(jobs_store, 120)
    set_columns(jobs_store, lost, enqueued_at=utcnow() - LONG_AGO)
    cluster.redis().flushdb()
    assert [requeue_stale(jobs_store) for _ in range(4)] == [50, 50, 20, 0]
    assert sorted(map(str, queued_ids(cluster, LIVE_QUEUE))) == sorted(lost)


def test_housekeep_requeue_older_than_leaves_a_job_sent_lately(
    cluster: Cluster, jobs_store: Store, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from tests.cli_harness import Cli

    [recent] = record(jobs_store, 1)
    cluster.redis().flushdb()  # its message lost at once
    cli = Cli(monkeypatch, capsys)
    cli.env(**{k: v for k, v in cluster.env.items() if k.startswith("GLEANER_")})
    waited = cli("housekeep", "requeue", "--older-than", "3600", "--json")
    assert waited.code == 0 and waited.json() == {"requeued": 0}
    assert queued_ids(cluster, LIVE_QUEUE) == []
    now = cli("housekeep", "requeue", "--json")  # an operator's default: zero, send now
    assert now.code == 0 and now.json() == {"requeued": 1}
    assert queued_ids(cluster, LIVE_QUEUE) == [recent]


def test_the_sweep_recovers_lost_running_jobs_and_fails_them_at_the_crash_limit(
    cluster: Cluster,
) -> None:
    store = open_store(cluster, job_max_crashes=3)
    lost, doomed, alive = record(store, 3)
    hold(store, lost, "gone-1", heartbeat_age=3_600)
    hold(store, doomed, "gone-2", heartbeat_age=3_600)
    set_columns(store, [doomed], crashes=2)  # its worker was lost twice already
    hold(store, alive, "busy", heartbeat_age=10)  # within the 120 s lease
    from prometheus_client import REGISTRY

    counted = REGISTRY.get_sample_value("gleaner_lease_recoveries_total") or 0.0

    assert requeue_stale(store) == 1
    # Both lost runs count as recoveries (one sent again, one failed): the metric an alert reads.
    assert REGISTRY.get_sample_value("gleaner_lease_recoveries_total") == counted + 2
    assert queued_ids(cluster, LIVE_QUEUE) == [lost]
    recovered = row(store, lost)
    assert (recovered["state"], recovered["crashes"], recovered["lease_token"]) == (
        "pending",
        1,
        None,
    )
    failed = row(store, doomed)
    assert failed["state"] == "failed" and failed["crashes"] == 3
    assert (
        failed["last_error"].startswith("worker_lost: ")
        and "lost 3 time(s)" in failed["last_error"]
    )
    assert row(store, alive)["state"] == "running"
    assert requeue_stale(store) == 0  # nothing twice
    store.dispose()


# --- with real workers ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_whole_worker_killed_mid_model_call_is_recovered_and_harvested_once(
    cluster: Cluster, model: LLMServer
) -> None:
    use_model(cluster, model)
    cluster.env.update(SHORT_LEASE)
    store = open_store(cluster, job_lease_seconds=3, job_heartbeat_seconds=1)
    model.script(
        # The call the killed worker never finishes: held unanswered, so the kill below always
        # lands inside it (an answer after a fixed delay raced the checks on a loaded host).
        hang(60.0),
        answer([note("Prefers vim")]),
    )
    doomed = cluster.start_worker(concurrency=1)
    cluster.start_beat()  # the sweep every 3 s (the lease)
    [job_id] = record(store, 1)
    from gleaner.workers.enqueue import send_jobs

    send_jobs(LIVE_QUEUE, [job_id])
    wait_calls(model, 1, 30)

    # The model call outlasts the lease: the heartbeat keeps the job its worker's.
    wait_for(lambda: "requeue_stale" in cluster.workers[1].text(), 10)
    # Past the lease (3 s, the setting made short): only its heartbeat keeps the job its
    # worker's, and that the lease has not expired is what is tested; no event marks it.
    time.sleep(4.5)
    status = json.loads(cluster.gleaner("status", "--json").stdout)
    [running] = status["running"]
    assert running["id"] == job_id and running["running_seconds"] > 4
    assert running["heartbeat_age_seconds"] < 2.5 and not running["lease_expired"]
    assert (row(store, job_id)["attempts"], row(store, job_id)["crashes"]) == (1, 0)

    # kill -9 of the main process and its child: the message stays unacknowledged in Redis
    # (its visibility timeout is an hour); the lease runs out and the sweep sends the job.
    doomed.kill()
    cluster.start_worker(concurrency=1)
    wait_for(lambda: row(store, job_id)["state"] == "done", 60)
    final = row(store, job_id)
    assert (final["attempts"], final["crashes"]) == (2, 1)
    assert model.calls == 2
    assert count(store, Memory) == 1 and count(store, HarvestLedger) == 1
    store.dispose()


@pytest.mark.slow
def test_a_running_job_with_no_heartbeat_and_no_message_is_recovered(
    cluster: Cluster, jobs_store: Store
) -> None:
    # As a PostgreSQL outage past the task's retries leaves it: the message acknowledged, the
    # row running, nobody renewing it.
    [job_id] = record(jobs_store, 1)
    hold(jobs_store, job_id, "acked-long-ago", heartbeat_age=3_600)
    assert cluster.redis().llen(LIVE_QUEUE) == 0
    cluster.start_worker(concurrency=1)
    swept = cluster.gleaner("housekeep", "requeue", "--json")
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["requeued"] == 1
    wait_for(lambda: row(jobs_store, job_id)["state"] == "done", 60)
    final = row(jobs_store, job_id)
    assert (final["attempts"], final["crashes"]) == (2, 1)
    assert count(jobs_store, Memory) == 1 and count(jobs_store, HarvestLedger) == 1


@pytest.mark.slow
def test_a_message_for_a_failed_or_live_job_changes_nothing(
    cluster: Cluster, jobs_store: Store, model: LLMServer
) -> None:
    from gleaner.workers.enqueue import send_jobs

    use_model(cluster, model)
    failed, elsewhere = record(jobs_store, 2)
    with jobs_store.transaction() as session:
        job_records.fail(session, failed, "model_permanent: the key was refused")
    hold(jobs_store, elsewhere, "other-worker", heartbeat_age=0.0)
    send_jobs(LIVE_QUEUE, [failed, elsewhere, failed])  # stray duplicates
    worker = cluster.start_worker(concurrency=1)
    wait_for(lambda: worker.text().count("succeeded") >= 3, 30)
    assert cluster.redis().llen(LIVE_QUEUE) == 0
    assert model.calls == 0
    kept = row(jobs_store, failed)
    assert (kept["state"], kept["attempts"]) == ("failed", 0)
    assert kept["last_error"] == "model_permanent: the key was refused"
    busy = row(jobs_store, elsewhere)
    assert (busy["state"], busy["attempts"], busy["lease_token"]) == ("running", 1, "other-worker")
    assert count(jobs_store, Memory) == 0


@pytest.mark.slow
def test_a_job_that_keeps_killing_its_worker_is_failed_with_the_reason(
    cluster: Cluster, jobs_store: Store, model: LLMServer
) -> None:
    from gleaner.workers.enqueue import send_jobs

    use_model(cluster, model)
    cluster.env["GLEANER_JOB_MAX_CRASHES"] = "2"
    model.script(answer([note("Crashy")], delay=9.0), answer([note("Crashy")], delay=9.0))
    cluster.start_worker(concurrency=1)
    [job_id] = record(jobs_store, 1)
    send_jobs(LIVE_QUEUE, [job_id])
    for calls in (1, 2):  # each run dies inside the model call; the broker redelivers it
        wait_calls(model, calls)
        kill_children(cluster)
    wait_for(lambda: row(jobs_store, job_id)["state"] == "failed", 60)
    failed = row(jobs_store, job_id)
    assert failed["crashes"] == 2 and model.calls == 2  # the third delivery ran nothing
    assert failed["last_error"].startswith("worker_lost: ")
    status = json.loads(cluster.gleaner("status", "--json").stdout)
    assert [f["error"].split(":")[0] for f in status["failures"]] == ["worker_lost"]

    # Only `gleaner retry` runs it again, with its crash count reset.
    model.script(answer([note("Crashy")]))
    retried = cluster.gleaner("retry", job_id)
    assert retried.returncode == 0 and "re-enqueued 1" in retried.stdout
    wait_for(lambda: row(jobs_store, job_id)["state"] == "done", 60)
    assert row(jobs_store, job_id)["crashes"] == 0 and model.calls == 3
    assert count(jobs_store, Memory) == 1


@pytest.mark.slow
def test_the_sweep_does_not_wait_behind_a_harvest_backlog(
    cluster: Cluster, jobs_store: Store
) -> None:
    from gleaner.workers.enqueue import send_jobs
    from gleaner.workers.housekeeping import requeue_stale as sweep_task

    send_jobs(LIVE_QUEUE, record(jobs_store, 40))
    sweep_task.apply_async()  # routed to housekeeping, sent after the whole backlog
    worker = cluster.start_worker(queues="harvest,housekeeping,import", concurrency=1)
    swept = re.compile(r"gleaner\.requeue_stale\[[^\]]+\] succeeded")
    wait_for(lambda: swept.search(worker.text()) is not None, 60)
    log = worker.text()
    swept_at = swept.search(log)
    assert swept_at is not None
    before = log[: swept_at.start()]
    harvested_before = len(re.findall(r"gleaner\.harvest\[[^\]]+\] succeeded", before))
    # With housekeeping polled first the sweep is the first task taken; at most the one
    # harvest already reserved can show up before it in the log.
    assert harvested_before <= 1, before


def test_a_database_retry_comes_back_before_the_lease_runs_out() -> None:
    from gleaner.workers.tasks import DB_RETRIES, db_retry_delay

    for lease in (5.0, 120.0, 600.0):
        waits = [db_retry_delay(n, lease) for n in range(DB_RETRIES) for _ in range(50)]
        assert all(0 < wait <= lease / 2 for wait in waits)  # the claim is still this one's
    assert db_retry_delay(0, 600) <= 5 < db_retry_delay(4, 600)  # it backs off
