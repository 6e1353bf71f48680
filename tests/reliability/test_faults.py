"""Faults of the processes and services under a load of 200 transcripts: the whole worker
killed, the worker stopped, Redis restarted with nothing persisted, PostgreSQL restarted,
PostgreSQL down for 90 s; and the model server switched to slow, 429, 500, hang, garbage.

Each fault comes once about a third of the jobs are finished. Recovery time runs from the end
of the fault (the replacement worker ready, the server back, the model normal again) to the
last job finishing.
"""

from __future__ import annotations

import time

import pytest

from tests.reliability.conftest import OpenScenario, Services
from tests.reliability.scenario import Scenario

pytestmark = [pytest.mark.slow, pytest.mark.reliability]

N = 200
MID_RUN = 60  # jobs finished when the fault comes


def running_jobs(sc: Scenario) -> int:
    return sc.states()["running"]


def start_loaded(sc: Scenario, *, slow: float | None = None) -> None:
    """Workers and beat up, 200 transcripts enqueued, wait until a third are finished; with
    ``slow`` every model answer takes that long, so calls are in flight when the fault comes."""
    if slow is not None:
        sc.model.slow_seconds = slow
        sc.model.switch("slow")
    sc.transcripts(N)
    sc.start()
    sc.enqueue()
    sc.step(f"enqueued {N}" + (f"; every model answer takes {slow} s" if slow else ""))
    sc.wait_finished(MID_RUN, 120)


def test_baseline(open_scenario: OpenScenario) -> None:
    sc = open_scenario("baseline", "Baseline: no fault")
    sc.record["what"] = "200 transcripts through one worker (4 children) and beat; no fault."
    start_loaded(sc)
    sc.wait_all(120)
    sc.step("all settled")
    figures = sc.verify()
    sc.check("one model call per transcript", figures["model_calls"]["total"] == N)
    sc.assert_checks()


def test_kill_9_of_the_whole_worker(open_scenario: OpenScenario) -> None:
    sc = open_scenario("kill9_worker", "kill -9 of the whole worker mid-run")
    sc.record["what"] = (
        "Model answers take 0.2 s. Once 60 jobs were finished, SIGKILL to the worker's whole "
        "process group (main process and its 4 children: nothing acknowledged, nothing "
        "cleaned up); a new worker started at once. The killed jobs' messages stay "
        "unacknowledged in Redis until the visibility timeout (60 s); the lease (5 s) and the "
        "sweep bring them back."
    )
    start_loaded(sc, slow=0.2)
    doomed = sc.cluster.workers[0]
    in_flight = running_jobs(sc)
    doomed.kill()
    sc.step(f"kill -9 of the worker's process group ({in_flight} jobs running)")
    sc.record["in_flight_at_fault"] = in_flight
    sc.start(beat=False)
    sc.fault()
    sc.step("replacement worker ready")
    sc.wait_all(120)
    sc.step("all settled")
    figures = sc.verify()
    sc.check(
        "the killed runs were recovered (crashes counted)",
        figures["model_calls"]["crashes"] >= 1,
        f"crashes {figures['model_calls']['crashes']}, running at kill {in_flight}",
    )
    sc.assert_checks()


def test_sigterm_of_the_worker(open_scenario: OpenScenario) -> None:
    sc = open_scenario("sigterm_worker", "SIGTERM of the worker mid-run")
    sc.record["what"] = (
        "Model answers take 0.2 s. Once 60 jobs were finished, SIGTERM to the worker's main "
        "process (Celery's warm shutdown: running tasks finish, no new ones start); once it "
        "exited, a new worker started."
    )
    start_loaded(sc, slow=0.2)
    worker = sc.cluster.workers[0]
    in_flight = running_jobs(sc)
    exited = worker.terminate(60)
    sc.step(f"SIGTERM ({in_flight} jobs running); the worker exited after {exited:.1f} s")
    sc.record["in_flight_at_fault"] = in_flight
    left_running = running_jobs(sc)
    sc.start(beat=False)
    sc.fault(round(exited, 1))
    sc.step("replacement worker ready")
    sc.wait_all(120)
    sc.step("all settled")
    figures = sc.verify()
    sc.check("no job left running by the stopped worker", left_running == 0, f"{left_running}")
    sc.check(
        "no run lost, none repeated: one model call per transcript, no crash",
        figures["model_calls"]["total"] == N and figures["model_calls"]["crashes"] == 0,
        f"calls {figures['model_calls']['total']}, crashes {figures['model_calls']['crashes']}",
    )
    sc.assert_checks()


def test_redis_restart_with_nothing_persisted(
    open_scenario: OpenScenario, services: Services
) -> None:
    sc = open_scenario("redis_restart", "Redis restarted mid-run, nothing persisted")
    sc.record["what"] = (
        "Model answers take 0.2 s. Once 60 jobs were finished, kill -9 of redis-server "
        "(started with --save '' --appendonly no) and a new one on the same port: every "
        "waiting and unacknowledged message is gone. Workers and beat reconnect; the sweep "
        "re-sends the pending jobs whose message is gone."
    )
    start_loaded(sc, slow=0.2)
    in_flight = running_jobs(sc)
    started = time.monotonic()
    services.redis.restart()
    sc.fault(round(time.monotonic() - started, 1))
    sc.step(f"Redis killed and started empty ({in_flight} jobs running)")
    sc.record["in_flight_at_fault"] = in_flight
    sc.wait_all(120)
    sc.step("all settled")
    sc.verify()
    sc.assert_checks()


def test_postgresql_restart(open_scenario: OpenScenario, services: Services) -> None:
    sc = open_scenario("postgres_restart", "PostgreSQL restarted mid-run")
    sc.record["what"] = (
        "Model answers take 0.2 s. Once 60 jobs were finished, `pg_ctl restart -m immediate` "
        "(every connection cut, crash recovery at start). Tasks that hit the outage retry on "
        "StorageFailure; heartbeats resume."
    )
    start_loaded(sc, slow=0.2)
    in_flight = running_jobs(sc)
    started = time.monotonic()
    services.pg.restart("immediate")
    sc.fault(round(time.monotonic() - started, 1))
    sc.step(f"PostgreSQL restarted ({in_flight} jobs running)")
    sc.record["in_flight_at_fault"] = in_flight
    sc.wait_all(180)
    sc.step("all settled")
    sc.verify()
    sc.assert_checks()


OUTAGE = 90.0


def test_postgresql_down_for_90_seconds(open_scenario: OpenScenario, services: Services) -> None:
    sc = open_scenario("postgres_outage_90s", "PostgreSQL down for 90 s mid-run")
    sc.record["what"] = (
        "Model answers take 0.2 s. Once 60 jobs were finished, `pg_ctl stop -m fast`, 90 s "
        "down, then started again. The harvest task's own database retries (5, jittered "
        "backoff from 5 s) run out during the outage for some jobs: their message is "
        "acknowledged and the row stays running or pending, which the lease and the sweep "
        "recover once the database is back."
    )
    start_loaded(sc, slow=0.2)
    in_flight = running_jobs(sc)
    services.pg.stop("fast")
    down = time.monotonic()
    sc.step(f"PostgreSQL stopped ({in_flight} jobs running)")
    sc.record["in_flight_at_fault"] = in_flight
    time.sleep(max(0.0, OUTAGE - (time.monotonic() - down)))  # the outage's length is the fault
    services.pg.start()
    sc.fault(round(time.monotonic() - down, 1))
    sc.step("PostgreSQL started again")
    sc.wait_all(240)
    sc.step("all settled")
    sc.verify()
    sc.assert_checks()


# --- the model server -----------------------------------------------------------------------


def model_window(sc: Scenario, mode: str, seconds: float) -> None:
    """Switch the model to ``mode`` for ``seconds``, then back to normal."""
    sc.model.switch(mode)
    sc.step(f"model switched to {mode}")
    time.sleep(seconds)  # the window's length is the fault
    sc.model.switch("normal")
    sc.fault(seconds)
    sc.step("model back to normal")


def settle_with_retry(sc: Scenario, timeout: float = 120) -> None:
    """Wait until every job settled; jobs failed by the model outage (retries exhausted) are
    re-run with `gleaner retry --all`, as an operator would, and waited for again."""
    sc.wait_all(timeout)
    failed = sc.states()["failed"]
    sc.record["failed_before_retry"] = failed
    if failed:
        sent = sc.retry_failed()
        sc.step(f"{failed} failed (model retries exhausted): `gleaner retry --all` re-sent {sent}")
        sc.wait_all(timeout)
    sc.step("all settled")


def test_model_rate_limited_burst(open_scenario: OpenScenario) -> None:
    sc = open_scenario("model_429", "Model answers 429 (Retry-After: 1) for 3 s")
    sc.record["what"] = (
        "Once 60 jobs were finished, every model request got 429 with Retry-After: 1 for 3 s. "
        "Calls retry (at most 4 attempts within 8 s, never sooner than Retry-After)."
    )
    start_loaded(sc)
    model_window(sc, "429", 3.0)
    settle_with_retry(sc)
    sc.verify()
    sc.assert_checks()


def test_model_server_errors(open_scenario: OpenScenario) -> None:
    sc = open_scenario("model_500", "Model answers 500 for 3 s")
    sc.record["what"] = (
        "Once 60 jobs were finished, every model request got 500 for 3 s. Calls retry with "
        "jittered backoff (at most 4 attempts within 8 s); a call whose attempts all fell in "
        "the window fails its job (model_transient), re-run by `gleaner retry --all`."
    )
    start_loaded(sc)
    model_window(sc, "500", 3.0)
    settle_with_retry(sc)
    sc.verify()
    sc.assert_checks()


def test_model_hangs(open_scenario: OpenScenario) -> None:
    sc = open_scenario("model_hang", "Model never answers for 6 s")
    sc.record["what"] = (
        "Once 60 jobs were finished, the model held every request without answering for 6 s "
        "(the client's timeout is 4 s). Timed-out calls retry within the 8 s window; a job "
        "whose window ran out fails (model_transient) and is re-run by `gleaner retry --all`."
    )
    start_loaded(sc)
    model_window(sc, "hang", 6.0)
    settle_with_retry(sc)
    sc.verify()
    sc.assert_checks()


def test_model_garbage_for_some_transcripts(open_scenario: OpenScenario) -> None:
    sc = open_scenario("model_garbage", "Model answers garbage for 10 transcripts")
    garbage = {f"{sc.tag}{i:04d}" for i in range(0, N, 20)}
    sc.record["what"] = (
        "The model answers text that is not JSON for every request of 10 of the 200 "
        "transcripts (every 20th). Each is asked once more, then its job fails visibly "
        "(unparseable_answer) and no note is written; the other 190 are harvested."
    )
    for marker in garbage:
        sc.model.overrides[marker] = "garbage"
    sc.transcripts(N)
    sc.start()
    sc.enqueue()
    sc.wait_all(120)
    sc.step("all settled")
    sc.verify(expect_failed=dict.fromkeys(garbage, "unparseable_answer"))
    calls = [sc.model.calls[m] for m in sorted(garbage)]
    sc.check("each garbage transcript asked exactly twice", set(calls) == {2}, f"{calls}")
    sc.assert_checks()


def test_model_slow(open_scenario: OpenScenario) -> None:
    sc = open_scenario("model_slow", "Model answers in 2.5 s for 10 s")
    sc.record["what"] = (
        "Once 60 jobs were finished, every answer took 2.5 s (timeout 4 s) for 10 s. Slow but "
        "in time: no retry, no failure, one call per transcript."
    )
    sc.model.slow_seconds = 2.5
    start_loaded(sc)
    model_window(sc, "slow", 10.0)
    sc.wait_all(120)
    sc.step("all settled")
    figures = sc.verify()
    sc.check("one model call per transcript", figures["model_calls"]["total"] == N)
    sc.assert_checks()
