"""One intake step: every entry point takes a transcript in once (``harvest.intake.settle``:
values checked, redacted, owner settled) and records or harvests what it took in, never
redacting or settling the owner again. Counted by wrapping the intake module's own
redaction and owner rule (public names), on real stores and a real broker."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis

from gleaner import Conversation, Gleaner, InvalidRequest
from gleaner.harvest import intake
from gleaner.harvest.batch import Summary, harvest_paths, judge_owners, read_all
from gleaner.harvest.imports import plan_import
from gleaner.harvest.queue import record_settled
from gleaner.store import Store
from tests.samples import native
from tests.test_harvest_job import transcript
from tests.workers_harness import REDIS_URL, redis_db_for

SECRET = "hunter2-intake"


class Counted:
    """How often the intake redacted a transcript and settled an owner."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.redacted = self.owners = 0
        monkeypatch.setattr(
            intake, "redact_transcript", self._count("redacted", intake.redact_transcript)
        )
        monkeypatch.setattr(intake, "resolve_owner", self._count("owners", intake.resolve_owner))

    def _count(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            setattr(self, name, getattr(self, name) + 1)
            return function(*args, **kwargs)

        return counted

    @property
    def both(self) -> tuple[int, int]:
        return self.redacted, self.owners


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counted:
    return Counted(monkeypatch)


def _jobs(store: Store) -> list[dict[str, Any]]:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT owner, conversation_id, transcript FROM jobs"))
        return [dict(row._mapping) for row in rows]


def leaky(i: int, owner: str | None = "alice") -> dict[str, Any]:
    """A native conversation with a private span in each user line; ``owner`` None: it
    names none (as exports do)."""
    found = native(i, owner=owner or "", extra=f" <private>{SECRET}</private>")
    if owner is None:
        del found["owner"]
    return found


def _files(folder: Path, count: int, owner: str = "alice") -> list[Path]:
    folder.mkdir()
    paths = [folder / f"chat-{i}.json" for i in range(count)]
    for i, path in enumerate(paths):
        path.write_text(json.dumps(leaky(i, owner)))
    return paths


@pytest.mark.parametrize("backend", ["postgresql"])
def test_a_submit_takes_the_conversation_in_once(
    make_store: Any, backend: str, worker_id: str, counted: Counted
) -> None:
    """Python, HTTP and MCP submit through ``Gleaner.read`` and ``submit``: with a broker
    (no run here) the whole submit redacts once and settles the owner once."""
    broker_url = f"{REDIS_URL}/{redis_db_for(worker_id)}"
    store = make_store(backend, broker_url=broker_url)
    gleaner = Gleaner(store=store)
    job_id = gleaner.submit(leaky(1))
    read = gleaner.read(leaky(2))
    assert counted.both == (2, 2)  # the submit's one, and read()'s
    second = gleaner.submit(read)
    assert counted.both == (2, 2), "a read conversation is recorded as it was taken in"
    client = redis.Redis.from_url(broker_url)
    try:
        for message in client.lrange("harvest", 0, -1):
            if job_id.encode() in message or second.encode() in message:
                client.lrem("harvest", 0, message)
    finally:
        client.close()
    jobs = _jobs(store)
    assert len(jobs) == 2 and {job["owner"] for job in jobs} == {"alice"}
    assert SECRET not in json.dumps(jobs)


def test_a_conversation_built_by_hand_is_taken_in_by_submit(store: Store, counted: Counted) -> None:
    """A Conversation not made by ``read`` (or changed since) carries nothing taken in:
    ``submit`` takes it in, redacting it, and the owner check still holds."""
    gleaner = Gleaner(store=store)
    raw = transcript(f"I prefer tabs <private>{SECRET}</private>", cid="by-hand")
    by_hand = Conversation(owner="alice", conversation_id="by-hand", transcript=raw)
    assert by_hand.taken_in() is None
    gleaner.submit(by_hand)
    assert counted.redacted >= 1  # taken in by submit (the run here redacts once more)
    assert SECRET not in json.dumps(_jobs(store))
    read = gleaner.read(leaky(3))
    moved = replace(read, owner="bob")  # changed after read(): its intake no longer holds
    assert moved.taken_in() is None
    with pytest.raises(InvalidRequest) as info:
        gleaner.submit(moved)
    assert info.value.reason == "bad_owner"


def test_enqueue_and_harvest_take_each_conversation_in_once(
    store: Store, counted: Counted, tmp_path: Path
) -> None:
    """``gleaner enqueue`` and the hook judge then record; ``gleaner harvest`` judges then
    harvests in process: one redaction and one owner settled per conversation, and a bad
    one refused alone."""
    paths = _files(tmp_path / "chats", 3)
    summary = Summary()
    settled = judge_owners(read_all(paths, summary), None, summary)
    assert counted.both == (3, 3)
    record_settled(store, settled, provenance="compaction", queue="harvest")
    assert counted.both == (3, 3)
    assert SECRET not in json.dumps(_jobs(store))

    harvested = harvest_paths(store, _files(tmp_path / "more", 2, owner="bob"))
    assert harvested.failed == 0 and harvested.harvested == 2
    assert counted.both == (5, 5), "an in-process harvest plans what was taken in"


def test_an_import_takes_each_conversation_in_once(
    store: Store, counted: Counted, tmp_path: Path
) -> None:
    """An import reads its export twice (to judge, then to record, so memory follows one
    batch): it redacts each conversation once, as it records it."""
    export = tmp_path / "export.jsonl"
    export.write_text("\n".join(json.dumps(leaky(i, owner=None)) for i in range(4)))
    planned = plan_import(store, export, owner="carol")
    assert len(planned.job_ids) == 4
    assert counted.redacted == 4
    jobs = _jobs(store)
    assert {job["owner"] for job in jobs} == {"carol"} and SECRET not in json.dumps(jobs)
