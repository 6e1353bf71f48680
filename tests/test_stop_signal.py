"""A soft time limit raised inside a model call stops the harvest at once, through either
client.

litellm wraps whatever its HTTP call raised in its own errors; Celery's
``SoftTimeLimitExceeded`` must not become a transient model error retried until the hard kill.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from billiard.exceptions import SoftTimeLimitExceeded

from gleaner.harvest.model import extract
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.transcript import Message, Transcript
from tests.llm_server import Behaviour, LLMServer, llm_server, slow

CHAT = Transcript(
    conversation_id="c1", owner="alice", messages=[Message(role="user", content="I use tabs.")]
)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


def limit_while_answering(body: dict[str, Any]) -> Behaviour:
    """The soft time limit fires while the request is in flight (the signal reaches the main
    thread, waiting for the answer); the answer itself would be a success, 3 s later."""
    os.kill(os.getpid(), signal.SIGALRM)
    return slow(3)


@pytest.mark.parametrize("client", ["litellm", "openai"])
def test_soft_time_limit_inside_a_model_call_is_not_retried(
    server: LLMServer, client: str, caplog: pytest.LogCaptureFixture
) -> None:
    server.default = limit_while_answering
    options = ModelOptions(
        llm=client,
        model="openai/test-model",
        api_base=server.api_base,
        api_key="test",
        timeout_seconds=10.0,
        max_attempts=4,
        backoff_seconds=0.02,
    )
    caplog.set_level(logging.WARNING, logger="gleaner.harvest.retry")

    def fire(_signum: int, _frame: FrameType | None) -> None:
        raise SoftTimeLimitExceeded()  # as Celery's soft time limit does, in the main thread

    previous = signal.signal(signal.SIGALRM, fire)
    try:
        with pytest.raises(SoftTimeLimitExceeded):
            extract(CHAT, options)
    finally:
        signal.signal(signal.SIGALRM, previous)
    # Raised out of the first attempt: no retry was planned, none made.
    assert server.calls == 1
    assert [r for r in caplog.records if r.name == "gleaner.harvest.retry"] == []
