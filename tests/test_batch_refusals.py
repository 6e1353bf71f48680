"""A value no stored text may hold (a NUL, a lone surrogate) in one conversation of a batch
refuses that conversation alone, before anything is recorded or sent to a model, naming the
field: through `gleaner enqueue`, `gleaner import` and an in-process harvest, on SQLite and
PostgreSQL (whose insert of a whole batch used to fail on the one value, ``data_refused``,
nothing recorded)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import func, select

from gleaner.harvest.batch import harvest_paths
from gleaner.harvest.errors import HarvestError
from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.queue import record_jobs
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import Store
from gleaner.store.schema.models import ImportBatch, Job, Memory
from tests.cli_harness import Cli, cli, redis_url_for
from tests.llm_server import Behaviour, answer, first_user_line, llm_server, note
from tests.samples import native, write_natives

__all__ = ["cli"]  # the fixture, used by name


def batch_with_one_bad(folder: Path) -> list[Path]:
    """Two good transcripts (conv-0, conv-1) and one whose id holds a NUL (the readers take
    NULs out of message text and titles, and refuse lone surrogates there on their own)."""
    paths = write_natives(folder, 2, facts=1)
    transcript = native(9, facts=1)
    transcript["conversation_id"] = "conv-\x00bad"
    path = folder / "conv-bad.json"
    path.write_text(json.dumps(transcript))  # the NUL as a JSON escape
    return [*paths, path]


def said_note(body: dict[str, Any]) -> Behaviour:
    """A note of what the user said (each transcript its own note)."""
    return answer([note(first_user_line(body) or "nothing")])


def count(store: Store, model: type) -> int:
    with store.transaction() as session:
        return int(session.execute(select(func.count()).select_from(model)).scalar_one())


@pytest.fixture
def live_redis(worker_id: str) -> Any:
    url = redis_url_for(worker_id)
    redis.Redis.from_url(url).flushdb()
    yield url
    redis.Redis.from_url(url).flushdb()


def test_enqueue_refuses_the_bad_conversation_alone(
    cli: Cli, store: Store, tmp_path: Path, live_redis: str
) -> None:
    batch_with_one_bad(tmp_path / "in")
    cli.env(GLEANER_DATABASE_URL=store.database_url, GLEANER_BROKER_URL=live_redis)
    ran = cli("enqueue", str(tmp_path / "in"), "--json")
    assert ran.code == 1, ran.err
    out = ran.json()
    assert out["enqueued"] == 2 and out["failed"] == 1
    [failure] = out["failures"]
    assert failure["conversation"] == "'conv-\\x00bad'"
    assert failure["error"].startswith(
        "refused_value: conversation refused: conversation id 'conv-\\x00bad' holds a NUL "
        "character, which no stored text may hold"
    )
    assert count(store, Job) == 2
    assert redis.Redis.from_url(live_redis).llen("harvest") == 2


def test_import_counts_the_bad_conversation_as_unreadable_and_records_the_rest(
    cli: Cli, store: Store, tmp_path: Path, live_redis: str
) -> None:
    batch_with_one_bad(tmp_path / "in")
    cli.env(GLEANER_DATABASE_URL=store.database_url, GLEANER_BROKER_URL=live_redis)
    ran = cli("import", str(tmp_path / "in"), "--no-wait", "--json")
    assert ran.code == 1, ran.err
    out = ran.json()
    assert out["total"] == 2 and out["unreadable"] == 1
    [unreadable] = out["unreadable_conversations"]
    assert "refused_value" in unreadable["error"] and "conversation id" in unreadable["error"]
    assert count(store, Job) == 2
    with store.transaction() as session:
        assert session.execute(select(ImportBatch.unreadable)).scalar_one() == 1


def test_an_in_process_harvest_refuses_it_before_any_model_call(
    make_store: Callable[..., Store], backend: str, tmp_path: Path
) -> None:
    batch_with_one_bad(tmp_path / "in")
    with llm_server(said_note) as server:
        store = make_store(
            backend,
            harvest_model="openai/test-model",
            harvest_api_base=server.api_base,
            harvest_response_format="json_object",
        )
        summary = harvest_paths(store, [tmp_path / "in"])
        assert server.calls == 2  # the good two only: the bad one cost no call
    assert (summary.harvested, summary.failed) == (2, 1)
    [failure] = summary.failures
    assert failure["error"].startswith(
        "refused_value: conversation refused: conversation id 'conv-\\x00bad' holds a NUL"
    )
    assert count(store, Memory) == 2


# A transcript from Python, the bad value in each field, and the field the refusal names.
BAD_FIELDS = {
    "id": ({"conversation_id": "c\x00"}, "conversation id 'c\\x00' holds a NUL"),
    "title": ({"title": "Plans \ud800"}, "title 'Plans \\ud800' holds a lone surrogate"),
    "source": ({"source_path": "/in/\udcff.json"}, "source path '/in/\\udcff.json' holds"),
    "text": (
        {"messages": [Message(role="user", content="my id is \x00 here")]},
        "the text of message 1 (user) holds a NUL",
    ),
}


@pytest.mark.parametrize("field", sorted(BAD_FIELDS))
def test_a_bad_transcript_from_python_is_refused_with_no_call(
    make_store: Callable[..., Store], backend: str, field: str
) -> None:
    values, named = BAD_FIELDS[field]
    good = Transcript(
        conversation_id="c1", owner="alice", messages=[Message(role="user", content="hi")]
    )
    chat = good.model_copy(update=values)
    with llm_server(answer([note("Uses tabs")])) as server:
        store = make_store(
            backend, harvest_model="openai/test-model", harvest_api_base=server.api_base
        )
        for attempt in (
            lambda: harvest_transcript(store, chat),
            lambda: record_jobs(store, [chat], owner=None, provenance="compaction", queue="q"),
        ):
            with pytest.raises(HarvestError, match=re.escape(named)) as refused:
                attempt()
            assert refused.value.reason == "refused_value"
            assert "here" not in str(refused.value)  # a message's text is never quoted
        assert server.calls == 0
    assert count(store, Job) == 0
