"""Values no database can hold (a NUL, a lone surrogate) or no id can be, sent as the slug,
job id, conversation id, query or key id of a read, forget or job: refused by the public API
before any database sees them, as InvalidRequest naming the field (HTTP 422, an MCP tool
error), the same on both databases. On PostgreSQL such a value used to reach the driver and
come back 503 ``data_refused``, which reads as "the database is down"."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp.server.mcpserver.exceptions import ToolError
from sqlalchemy import text

from gleaner import Gleaner, InvalidRequest
from gleaner.service.http import create_app
from gleaner.service.mcp import build_server
from gleaner.store import Store
from tests.cli_harness import Cli, cli

__all__ = ["cli"]  # the fixture, used by name

OWNER = "alice"
BAD = {"NUL": "a\x00b", "lone surrogate": "a\udcffb"}


@pytest.fixture
def gleaner(store: Store) -> Gleaner:
    found = Gleaner(store=store)
    found.mem_save(OWNER, "Alice drinks oolong.", type="preference", title="Tea")
    return found


def stored(store: Store) -> str:
    with store.engine.connect() as conn:
        notes = conn.execute(text("SELECT slug, status, title FROM memories ORDER BY slug"))
        keys = conn.execute(text("SELECT id FROM api_keys ORDER BY id"))
        return json.dumps([[list(r) for r in notes], [list(r) for r in keys]])


CALLS: dict[str, tuple[str, str, Callable[[Gleaner, str], object]]] = {
    "slug": ("bad_slug", "slug", lambda g, v: g.note(OWNER, v)),
    "job id": ("bad_job_id", "job id", lambda g, v: g.job(v)),
    "job id of an owner": ("bad_job_id", "job id", lambda g, v: g.job(v, owner=OWNER)),
    "conversation id": (
        "bad_conversation_id",
        "conversation id",
        lambda g, v: g.forget_conversation(OWNER, v),
    ),
    "search query": ("bad_query", "query", lambda g, v: g.search(OWNER, f"tea {v}")),
    "index query": ("bad_query", "query", lambda g, v: g.index_text(OWNER, v)),
    "key id": ("bad_key_id", "key id", lambda g, v: g.revoke_api_key(v)),
}


@pytest.mark.parametrize("value", BAD.values(), ids=BAD.keys())
def test_the_python_api_refuses_them_naming_the_field(
    store: Store, gleaner: Gleaner, value: str
) -> None:
    gleaner.create_api_key(OWNER)
    before = stored(store)
    for name, (reason, field, call) in CALLS.items():
        with pytest.raises(InvalidRequest) as refused:
            call(gleaner, value)
        assert refused.value.reason == reason, name
        assert refused.value.message.startswith(field), refused.value.message
        assert value not in refused.value.message
    assert stored(store) == before
    # The same calls with values that are merely unknown still say so.
    assert gleaner.search(OWNER, "tea")[0].memory.slug == "tea"
    assert gleaner.index_text(OWNER, "tea")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("slug", "s" * 121, "bad_slug"),
        ("job id", "j" * 33, "bad_job_id"),
        ("conversation id", "c" * 256, "bad_conversation_id"),
    ],
)
def test_an_id_longer_than_any_stored_one_is_refused(
    gleaner: Gleaner, field: str, value: str, reason: str
) -> None:
    call = {
        "slug": lambda: gleaner.note(OWNER, value),
        "job id": lambda: gleaner.job(value),
        "conversation id": lambda: gleaner.forget_conversation(OWNER, value),
    }[field]
    with pytest.raises(InvalidRequest, match=f"^{field} is") as refused:
        call()
    assert refused.value.reason == reason


@pytest.fixture
def client(gleaner: Gleaner) -> Iterator[TestClient]:
    with TestClient(create_app(gleaner)) as found:
        yield found


def test_http_answers_422_naming_the_field(
    store: Store, gleaner: Gleaner, client: TestClient
) -> None:
    _, token = gleaner.create_api_key(OWNER)
    headers = {"Authorization": f"Bearer {token}"}
    base = f"/v1/owners/{OWNER}"
    requests: list[tuple[str, str, dict[str, Any], str]] = [
        ("GET", f"{base}/notes/a%00b", {}, "bad_slug"),
        ("GET", "/v1/jobs/a%00b", {}, "bad_job_id"),
        ("DELETE", f"{base}/conversations/a%00b", {}, "bad_conversation_id"),
        ("GET", f"{base}/search", {"q": "tea\x00"}, "bad_query"),
        ("GET", f"{base}/index", {"q": "tea\x00"}, "bad_query"),
    ]
    before = stored(store)
    for method, path, params, reason in requests:
        answer = client.request(method, path, params=params, headers=headers)
        assert answer.status_code == 422, (path, answer.text)
        error = answer.json()["error"]
        assert error["reason"] == reason, (path, error)
        assert "NUL" in error["message"]
    assert stored(store) == before
    # Unknown but well-formed: still 404, as before.
    assert client.get(f"{base}/notes/no-such-note", headers=headers).status_code == 404
    assert client.get("/v1/jobs/0123abcd", headers=headers).status_code == 404


def test_mcp_read_refuses_them_as_a_tool_error(gleaner: Gleaner) -> None:
    server = build_server(gleaner, OWNER)
    for value in BAD.values():
        with pytest.raises(ToolError, match=r"bad_slug: slug (holds|is not)"):
            anyio.run(server.call_tool, "mem_read", {"slug": value})
        with pytest.raises(ToolError, match="bad_query: query"):
            anyio.run(server.call_tool, "mem_search", {"query": value})


def test_the_cli_refuses_them_as_usage_errors(store: Store, gleaner: Gleaner, cli: Cli) -> None:
    # A command line cannot hold NUL; bytes that are no UTF-8 arrive as lone surrogates.
    cli.env(GLEANER_DATABASE_URL=store.database_url)
    before = stored(store)
    commands = [
        (["show", "a\udcffb", "--owner", OWNER], "argument slug: slug is not valid UTF-8"),
        (["notes", "pin", "a\udcffb", "--owner", OWNER], "argument SLUG: slug is not valid"),
        (["notes", "delete", "s" * 121, "--owner", OWNER], "slug is 121 characters, over"),
        (["retry", "\udcff"], "argument JOB_ID: job id is not valid UTF-8"),
        (["forget", "--owner", OWNER, "--conversation", "c\udcff", "--yes"], "conversation_id"),
    ]
    for argv, said in commands:
        ran = cli(*argv)
        assert (ran.code, said in ran.err) == (2, True), (argv, ran.err)
    assert stored(store) == before
    assert cli("show", "tea", "--owner", OWNER).code == 0
