"""Daily budgets: checked before each model call, per owner and per queued import, on both
databases; the call that would go over is never made and the conversation fails whole as
``budget_exceeded``; ``gleaner status`` shows the day's spend against the limits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gleaner.harvest.imports import plan_import
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.queue import run_job
from gleaner.store import Store
from gleaner.store.jobs import spend
from tests.cli_harness import Cli
from tests.llm_server import LLMServer, answer, llm_server, note
from tests.samples import native, write_natives
from tests.test_harvest_job import model_settings, transcript
from tests.workers_harness import Cluster, fresh_cluster, wait_for

# Each call the test server answers costs 100 prompt + 20 completion tokens.
PER_CALL = 120


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server(answer([note("Likes green tea", body="The user likes green tea.")])) as running:
        yield running


def test_an_owner_budget_stops_calls_at_its_edge(
    make_store: Any, backend: str, server: LLMServer
) -> None:
    # 300 tokens a day: calls are made while under it (0, 120, 240 spent), the fourth is not.
    store: Store = make_store(backend, **model_settings(server, budget_owner_tokens_per_day=300))
    outcomes = [
        harvest_transcript(store, transcript(f"I like green tea, day {i}.", cid=f"c{i}"))
        for i in range(5)
    ]
    assert [o.status for o in outcomes] == ["harvested"] * 3 + ["failed"] * 2
    assert server.calls == 3
    assert outcomes[3].error is not None and outcomes[3].error.startswith("budget_exceeded")
    assert "GLEANER_BUDGET_OWNER_TOKENS_PER_DAY" in outcomes[3].error
    assert outcomes[3].model_calls == 0 and outcomes[3].notes_written == 0  # nothing half-done
    with store.connection() as conn:
        today = spend.spent(conn, "owner", "alice", spend.today())
    assert (today.calls, today.tokens) == (3, 3 * PER_CALL)
    # Another owner has a budget of its own.
    bob = harvest_transcript(store, transcript("I like tea.", cid="b1", owner="bob"))
    assert bob.status == "harvested" and server.calls == 4


def test_an_import_budget_stops_its_jobs_not_other_work(
    make_store: Any, backend: str, server: LLMServer, tmp_path: Path
) -> None:
    store: Store = make_store(
        backend, **model_settings(server, budget_import_tokens_per_day=2 * PER_CALL)
    )
    write_natives(tmp_path / "export", 4, owner="ann")
    planned = plan_import(store, tmp_path / "export", owner="ann")
    results = [run_job(store, job_id) for job_id in planned.job_ids]
    states = [(r or {}).get("status") for r in results]
    assert states == ["harvested", "harvested", "failed", "failed"], results
    assert server.calls == 2
    assert "GLEANER_BUDGET_IMPORT_TOKENS_PER_DAY" in str((results[2] or {}).get("error"))
    # The owner's conversations from elsewhere are not the import's: they go on.
    other = harvest_transcript(store, transcript("I like tea.", cid="live-1", owner="ann"))
    assert other.status == "harvested" and server.calls == 3


def test_status_shows_the_days_spend_against_the_limits(
    make_store: Any, server: LLMServer, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    budget = {"budget_owner_tokens_per_day": 1000}  # spend is counted while a budget is set
    store: Store = make_store("sqlite", **model_settings(server, **budget))
    harvest_transcript(store, transcript("I like green tea.", cid="s1"))
    cli = Cli(monkeypatch, capsys)
    cli.env(
        GLEANER_DATABASE_URL=str(store.engine.url),
        GLEANER_BUDGET_OWNER_TOKENS_PER_DAY="1000",
    )
    ran = cli("status", "--json")
    assert ran.code == 0, ran.err
    budgets = ran.json()["budgets"]
    assert budgets["limits"]["owner_tokens_per_day"] == 1000
    assert budgets["spent_today"] == [
        {"kind": "owner", "key": "alice", "calls": 1, "tokens": PER_CALL, "cost_usd": 0.0}
    ]
    text = cli("status").out
    assert f"owner 'alice': {PER_CALL:,} of 1,000 tokens" in text


def test_without_a_budget_nothing_is_counted(make_store: Any, server: LLMServer) -> None:
    # No budget set: no row, no round trip (tests/test_harvest_round_trips.py counts them).
    store: Store = make_store("sqlite", **model_settings(server))
    assert harvest_transcript(store, transcript("I like tea.", cid="n1")).status == "harvested"
    with store.connection() as conn:
        assert spend.of_day(conn, spend.today()) == []


def test_forgetting_an_owner_forgets_its_spend(make_store: Any, server: LLMServer) -> None:
    store: Store = make_store("sqlite", **model_settings(server, budget_owner_tokens_per_day=1000))
    harvest_transcript(store, transcript("I like green tea.", cid="f1"))
    assert store.forget_owner("alice")["spend"] == 1
    with store.connection() as conn:
        assert spend.spent(conn, "owner", "alice", spend.today()).calls == 0


@pytest.fixture
def cluster(tmp_path: Path, worker_id: str) -> Iterator[Cluster]:
    yield from fresh_cluster("budgets", worker_id, tmp_path)


@pytest.mark.slow
def test_an_owner_budget_stops_a_real_workers_calls_at_its_edge(
    cluster: Cluster, server: LLMServer
) -> None:
    import json

    settings = model_settings(server, budget_owner_tokens_per_day=300)
    for name, setting in settings.items():
        cluster.env[f"GLEANER_{name.upper()}"] = str(setting)
    cluster.start_worker(queues="harvest", concurrency=1)  # one at a time: the edge is exact
    files = []
    for i in range(5):
        path = cluster.tmp / f"c{i}.json"
        path.write_text(json.dumps(native(i, owner="ann")))
        files.append(str(path))
    sent = cluster.gleaner("enqueue", *files)
    assert sent.returncode == 0, sent.stderr
    status: dict[str, Any] = {}

    def finished() -> bool:
        status.update(json.loads(cluster.gleaner("status", "--json").stdout))
        return status["jobs"]["done"] + status["jobs"]["failed"] == 5

    wait_for(finished, timeout=90)
    assert (status["jobs"]["done"], status["jobs"]["failed"]) == (3, 2)
    assert server.calls == 3
    assert all(f["error"].startswith("budget_exceeded") for f in status["failures"])
    assert status["budgets"]["spent_today"][0]["tokens"] == 3 * PER_CALL
