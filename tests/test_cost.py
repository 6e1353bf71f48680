"""Every model call and token is counted where it happened: summaries, job rows (every run,
failed ones included), status; a failed transcript's cost is never lost."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gleaner.cli import main
from gleaner.harvest.batch import harvest_paths
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.queue import record_jobs, run_job
from gleaner.store import InvalidInput
from gleaner.store.jobs import queue as job_records
from gleaner.store.jobs import reports as job_reports
from gleaner.store.schema.models import Job
from tests.llm_server import LLMServer, answer, llm_server, note, server_error, truncated
from tests.test_harvest_job import model_settings, transcript


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


def test_a_failed_transcripts_calls_are_in_its_report_and_the_summary(
    make_store, server: LLMServer, tmp_path: Path
) -> None:
    store = make_store("sqlite", **model_settings(server))  # 2 attempts a call
    server.script(truncated(), truncated())  # unparseable twice: fails after 2 calls
    failed = harvest_transcript(store, transcript("I use vim.", cid="bad"))
    assert failed.status == "failed" and failed.model_calls == 2

    (tmp_path / "a.jsonl").write_text(
        "\n".join(
            json.dumps(
                {
                    "conversation_id": cid,
                    "owner": "alice",
                    "messages": [{"role": "user", "content": f"I use {cid}."}],
                }
            )
            for cid in ("one", "two")
        )
    )
    server.script(server_error(), server_error(), answer([note("Uses two")]))
    summary = harvest_paths(store, [tmp_path])
    assert (summary.failed, summary.harvested) == (1, 1)
    assert summary.model_calls == 3  # the failed transcript's 2 calls are counted


def test_a_jobs_row_sums_the_cost_of_every_run_failed_ones_too(
    make_store, backend: str, server: LLMServer, capsys: pytest.CaptureFixture[str]
) -> None:
    store = make_store(backend, **model_settings(server))
    [job_id] = record_jobs(
        store, [transcript("I use vim.")], owner=None, provenance="compaction", queue="harvest"
    )
    server.script(server_error(), server_error())
    assert run_job(store, job_id)["status"] == "failed"  # type: ignore[index]
    with store.transaction() as session:
        [failure] = job_reports.failures(session)
        assert (failure["model_calls"], failure["id"]) == (2, job_id)
        job_records.reset(session, [job_id])

    server.script(answer([note("Uses vim")], prompt_tokens=40, completion_tokens=9))
    assert run_job(store, job_id)["status"] == "harvested"  # type: ignore[index]
    with store.transaction() as session:
        row = session.execute(select(Job).where(Job.id == job_id)).scalar_one()
        assert (row.state, row.model_calls) == ("done", 3)
        assert (row.prompt_tokens, row.completion_tokens) == (40, 9)
        assert job_reports.cost_by_state(session)["done"]["model_calls"] == 3


def test_a_failed_run_whose_settling_raised_still_counts_its_calls(
    make_store, backend: str, server: LLMServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(backend, **model_settings(server))
    [job_id] = record_jobs(
        store, [transcript("I use vim.")], owner=None, provenance="compaction", queue="harvest"
    )
    server.script(server_error(), server_error())  # the model fails after 2 calls
    real_fail, refused = job_records.fail, []

    def refuse_once(*args: Any, **kwargs: Any) -> bool:  # the fault: settling it raises once
        if not refused:
            refused.append(args)
            raise InvalidInput("refused once while settling", reason="test_fault")
        return real_fail(*args, **kwargs)

    monkeypatch.setattr(job_records, "fail", refuse_once)
    result = run_job(store, job_id)
    assert result is not None and refused
    assert (result["status"], result["model_calls"]) == ("failed", 2)
    assert result["error"] == "test_fault: refused once while settling"
    with store.transaction() as session:
        row = session.execute(select(Job).where(Job.id == job_id)).scalar_one()
        assert (row.state, row.model_calls) == ("failed", 2)


def test_status_shows_what_jobs_cost(
    make_store, server: LLMServer, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    store = make_store("sqlite", **model_settings(server))
    monkeypatch.setenv("GLEANER_DATABASE_URL", store.database_url)
    [job_id] = record_jobs(
        store, [transcript("I use vim.")], owner=None, provenance="compaction", queue="harvest"
    )
    server.script(server_error(), server_error())
    run_job(store, job_id)
    assert main(["status", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["job_cost"]["failed"]["model_calls"] == 2
    assert shown["failures"][0]["model_calls"] == 2
    assert main(["status"]) == 0
    assert "failed jobs cost model calls 2" in capsys.readouterr().out
