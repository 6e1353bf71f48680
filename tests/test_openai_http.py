"""The lean OpenAI-compatible client: what ``auto`` picks, and the answers litellm never meets
(tests/test_model.py and tests/test_model_servers.py run every shared behaviour through both
clients)."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from gleaner.harvest.errors import PermanentModelError, TransientModelError
from gleaner.harvest.litellm_client import litellm_call
from gleaner.harvest.model import resolve_llm
from gleaner.harvest.openai_http import _connection, openai_call, served_model
from gleaner.harvest.options import ModelOptions
from tests.llm_server import Behaviour, LLMServer, answer, llm_server, note

MESSAGES = [{"role": "user", "content": "I use tabs."}]


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server() as running:
        yield running


def options(api_base: str, **overrides: object) -> ModelOptions:
    values: dict[str, object] = {
        "llm": "openai",
        "model": "openai/local-model",
        "api_base": api_base,
        "api_key": "secret-key",
        "timeout_seconds": 2.0,
        **overrides,
    }
    return ModelOptions(**values)  # type: ignore[arg-type]


def test_auto_picks_the_lean_client_for_a_compatible_server_and_litellm_otherwise() -> None:
    local = ModelOptions(model="openai/qwen", api_base="http://127.0.0.1:8080/v1")
    assert resolve_llm(local) is openai_call
    assert resolve_llm(ModelOptions(model="openai/gpt-4o-mini")) is litellm_call  # hosted
    assert resolve_llm(ModelOptions(model="anthropic/claude", api_base="http://x")) is litellm_call
    assert resolve_llm(local.model_copy(update={"llm": "litellm"})) is litellm_call
    assert served_model("openai/qwen2.5:7b") == "qwen2.5:7b"


def test_the_request_is_the_chat_completion_a_server_expects(server: LLMServer) -> None:
    server.default = answer([note("Uses tabs")], prompt_tokens=12, completion_tokens=7)
    got = openai_call(MESSAGES, options=options(server.api_base, response_format="json_object"))
    assert (got.prompt_tokens, got.completion_tokens, got.finish_reason) == (12, 7, "stop")
    sent = server.requests[-1]
    assert sent.body["model"] == "local-model" and sent.body["messages"] == MESSAGES
    assert sent.body["response_format"] == {"type": "json_object"}
    assert sent.headers.get("authorization") == "Bearer secret-key"


def test_a_body_that_is_no_chat_completion_is_transient(server: LLMServer) -> None:
    server.default = Behaviour(raw_body=b"<html>502 from a proxy</html>")
    with pytest.raises(TransientModelError, match="not a chat completion"):
        openai_call(MESSAGES, options=options(server.api_base))


def test_a_refused_connection_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(TransientModelError, match="connection error"):
        openai_call(MESSAGES, options=options(f"http://127.0.0.1:{port}/v1"))


def test_an_error_answer_keeps_the_servers_message_not_the_whole_body(server: LLMServer) -> None:
    server.default = Behaviour(status=403, raw_body=b"x" * 10_000)
    with pytest.raises(PermanentModelError) as caught:
        openai_call(MESSAGES, options=options(server.api_base))
    assert str(caught.value).startswith("HTTP 403") and len(str(caught.value)) < 600


def test_each_process_and_thread_has_its_own_connection() -> None:
    first = _connection("http", "127.0.0.1", 9, 1.0)
    assert _connection("http", "127.0.0.1", 9, 1.0) is first  # kept for the next call
    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(_connection("http", "127.0.0.1", 9, 1)))
    thread.start()
    thread.join()
    assert seen[0] is not first
    child = os.fork()
    if child == 0:  # a forked worker child opens its own: sockets are never shared
        os._exit(0 if _connection("http", "127.0.0.1", 9, 1.0) is not first else 1)
    _, status = os.waitpid(child, 0)
    assert os.WEXITSTATUS(status) == 0


ANSWER = json.dumps(
    {"choices": [{"message": {"content": '{"notes": []}'}, "finish_reason": "stop"}]}
).encode()


def one_answer_per_connection(
    listener: socket.socket, connections: int, closed: threading.Semaphore | None = None
) -> None:
    """Answer one request on each connection, keep-alive promised, then close it, as a server
    does to a connection it finds idle (``closed`` is released once it is)."""
    for _ in range(connections):
        conn, _ = listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head, _, rest = request.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            while len(rest) < length:
                rest += conn.recv(65536)
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(ANSWER)}\r\nConnection: keep-alive\r\n\r\n".encode()
                + ANSWER
            )
        if closed is not None:
            closed.release()


def test_a_kept_alive_connection_the_server_closed_is_opened_again() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        closed = threading.Semaphore(0)
        serving = threading.Thread(target=one_answer_per_connection, args=(listener, 2, closed))
        serving.start()
        opts = options(f"http://127.0.0.1:{port}/v1")
        assert openai_call(MESSAGES, options=opts).text == '{"notes": []}'
        assert closed.acquire(timeout=10)  # the server has closed the connection the client keeps
        assert openai_call(MESSAGES, options=opts).text == '{"notes": []}'  # reopened
        serving.join(5)
        assert not serving.is_alive()
