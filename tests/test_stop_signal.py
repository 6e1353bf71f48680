"""A soft time limit raised inside a model call stops the harvest at once, through either
client.

litellm wraps whatever its HTTP call raised in its own errors; Celery's
``SoftTimeLimitExceeded`` must not become a transient model error retried until the hard kill.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from types import FrameType

import pytest
from billiard.exceptions import SoftTimeLimitExceeded

from harvest.model import ModelOptions, _litellm, extract
from harvest.transcript import Message, Transcript
from tests.llm_server import LLMServer, llm_server, slow

CHAT = Transcript(
    conversation_id="c1", owner="alice", messages=[Message(role="user", content="I use tabs.")]
)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


@pytest.mark.parametrize("client", ["litellm", "openai"])
def test_soft_time_limit_inside_a_model_call_is_not_retried(server: LLMServer, client: str) -> None:
    server.default = slow(3)
    options = ModelOptions(
        llm=client,
        model="openai/test-model",
        api_base=server.api_base,
        api_key="test",
        timeout_seconds=10.0,
        max_attempts=4,
        backoff_seconds=0.02,
    )
    _litellm()  # imported before the clock starts: it takes seconds

    def fire(_signum: int, _frame: FrameType | None) -> None:
        raise SoftTimeLimitExceeded()  # as Celery's soft time limit does, in the main thread

    before = server.calls
    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    started = time.monotonic()
    try:
        with pytest.raises(SoftTimeLimitExceeded):
            extract(CHAT, options)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert server.calls - before == 1  # no retry
    assert time.monotonic() - started < 2.0
