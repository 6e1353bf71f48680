"""`gleaner mcp` through the official SDK's own client, against the server process: seed
003's tools over stdio (both databases) and streamable HTTP, all acting for the one owner
the server was started for."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gleaner import Gleaner
from gleaner.store import Store
from tests.conftest import test_settings
from tests.service_harness import free_port, service_env, start

TOOLS = {"mem_save", "mem_session_summary", "mem_search", "mem_read", "mem_index"}
Session = Callable[[ClientSession], Awaitable[None]]


def stdio(database_url: str, session_test: Session, *args: str, **env: str) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gleaner.cli", "mcp", *args],
        env=service_env(database_url, **env),
    )

    async def main() -> None:
        async with (
            stdio_client(params) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            await session_test(session)

    anyio.run(main)


async def call(session: ClientSession, tool: str, **arguments: Any) -> Any:
    """The tool's structured result; a tool error fails the test with its text."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def refused(session: ClientSession, tool: str, **arguments: Any) -> str:
    """The text of the tool error the call must end in."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    return " ".join(getattr(block, "text", "") for block in result.content)


def test_the_tools_take_no_owner() -> None:
    # The fast tier's check, on the server object itself: no tool lets an agent name a user.
    from gleaner.service.mcp import build_server

    gleaner = Gleaner("sqlite://", settings=test_settings())
    tools = anyio.run(build_server(gleaner, "alice").list_tools)
    assert {tool.name for tool in tools} == TOOLS
    for tool in tools:
        properties = set(tool.input_schema.get("properties", {}))
        assert not properties & {"owner", "user_id", "scope"}, tool.name


def test_refusals_never_quote_a_private_span_the_agent_sent(make_store: Any) -> None:
    """A refused call's text goes to the agent's model and to client logs: what the caller
    sent inside <private> stays out of it, whether the SDK's argument check or Gleaner's
    own rules refused it."""
    from mcp.server.mcpserver.exceptions import ToolError

    from gleaner.service.mcp import build_server

    server = build_server(Gleaner(store=make_store("sqlite")), "alice")
    secret = "<private>s3cret-77</private>"
    calls = [
        ("mem_search", {"query": "tea", "limit": secret}, "bad_arguments: limit: "),
        ("mem_search", {"query": ["tea", secret]}, "bad_arguments: query: "),
        ("mem_save", {"content": "x", "type": secret, "title": "t"}, "bad_type: "),
        ("mem_read", {"slug": f"note-{secret}"}, "not_found: "),
    ]
    for tool, arguments, begins in calls:
        with pytest.raises(ToolError) as refused_call:
            anyio.run(server.call_tool, tool, arguments)
        text = str(refused_call.value)
        assert text.startswith(f"Error executing tool {tool}: {begins}"), text
        assert "s3cret" not in text, text


@pytest.mark.slow
def test_seed_003_tools_over_stdio_for_one_owner(store: Store) -> None:
    gleaner = Gleaner(store=store)
    gleaner.mem_save("bob", "Bob drinks oolong daily.", type="preference", title="Tea")
    secret = "hunter2-0f9e"

    async def session_test(session: ClientSession) -> None:
        listed = await session.list_tools()
        assert {tool.name for tool in listed.tools} == TOOLS
        saved = await call(
            session,
            "mem_save",
            content=f"Chose SQLite for v0.1; password <private>{secret}</private>.",
            type="decision",
            title="DB choice for v0.1",
            topic_key="architecture/db",
        )
        assert saved["outcome"] == "created" and saved["topic_key"] == "architecture/db"
        again = await call(
            session,
            "mem_save",
            content="Chose SQLite, then PostgreSQL.",
            type="decision",
            title="DB choice",
            topic_key="architecture/db",
        )
        assert again["outcome"] == "updated" and again["slug"] == saved["slug"]
        assert "id" not in saved  # the row id counts every owner's notes: never shown
        hits = (await call(session, "mem_search", query="postgresql"))["hits"]
        assert [h["slug"] for h in hits] == ["architecture-db"]
        note = await call(session, "mem_read", slug="architecture-db")
        assert note["memory"]["body"] == "Chose SQLite, then PostgreSQL."
        assert "[REDACTED]" in note["history"][0]["body"]
        assert secret not in json.dumps(note)
        index = await session.call_tool("mem_index", {})
        assert "DB choice" in index.content[0].text  # type: ignore[union-attr]
        summary = await call(session, "mem_session_summary", content="Picked the database.")
        assert summary["session_id"] == saved["session_id"]
        # Refusals reach the model as tool errors naming the reason.
        assert "summary" in await refused(
            session, "mem_save", content="x", type="summary", title="t"
        )
        assert "not_found" in await refused(session, "mem_read", slug="no-such-note")
        hidden = await refused(session, "mem_search", query="x", limit=f"<private>{secret}</p")
        assert "bad_arguments: limit: " in hidden and secret not in hidden
        # Bob's notes are out of reach, whatever the agent sends.
        assert (await call(session, "mem_search", query="oolong"))["hits"] == []
        assert "not_found" in await refused(session, "mem_read", slug="tea")
        sneaky = await session.call_tool(
            "mem_save",
            {"content": "Bob hates tea.", "type": "preference", "title": "Tea", "user_id": "bob"},
        )
        # Refused, or saved as alice's: bob's note is untouched (checked below).
        assert sneaky.is_error or sneaky.structured_content["outcome"] == "created"

    stdio(store.database_url, session_test, "--owner", "alice")
    assert gleaner.note("bob", "tea").memory.body == "Bob drinks oolong daily."
    assert [h.memory.slug for h in gleaner.search("alice", "postgresql")] == ["architecture-db"]
    assert secret not in json.dumps(
        [n.model_dump(mode="json") for n in gleaner.note("alice", "architecture-db").history]
    )


@pytest.mark.slow
def test_the_owner_comes_from_the_environment_or_is_required(
    make_store: Any, tmp_path: Path
) -> None:
    store = make_store("sqlite")
    Gleaner(store=store).mem_save("carol", "Carol likes rye.", type="preference", title="Bread")

    async def session_test(session: ClientSession) -> None:
        hits = (await call(session, "mem_search", query="rye"))["hits"]
        assert [h["slug"] for h in hits] == ["bread"]

    stdio(store.database_url, session_test, GLEANER_MCP_OWNER="carol")
    missing = subprocess.run(
        [sys.executable, "-m", "gleaner.cli", "mcp"],
        env=service_env(store.database_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and "GLEANER_MCP_OWNER" in missing.stderr


@pytest.mark.slow
def test_streamable_http(make_store: Any, tmp_path: Path) -> None:
    store = make_store("sqlite")
    Gleaner(store=store).mem_save("dan", "Dan rides a fixie.", type="profile", title="Bike")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start(
        [
            "mcp",
            "--owner",
            "dan",
            "--transport",
            "streamable-http",
            "--port",
            str(port),
            "--no-key",
        ],
        service_env(store.database_url),
        tmp_path / "mcp.log",
        url,
        "/mcp",
    )

    async def main() -> None:
        async with (
            streamable_http_client(f"{url}/mcp") as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            hits = (await call(session, "mem_search", query="fixie"))["hits"]
            assert [h["slug"] for h in hits] == ["bike"]
            index = await session.call_tool("mem_index", {})
            assert "Bike" in index.content[0].text  # type: ignore[union-attr]

    try:
        anyio.run(main)
    finally:
        server.stop()


@pytest.mark.slow
def test_streamable_http_behind_api_keys(make_store: Any, tmp_path: Path) -> None:
    store = make_store("sqlite")
    gleaner = Gleaner(store=store)
    gleaner.mem_save("dan", "Dan rides a fixie.", type="profile", title="Bike")
    dans, dan_token = gleaner.create_api_key("dan")
    _, erin_token = gleaner.create_api_key("erin")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["mcp", "--owner", "dan", "--transport", "streamable-http", "--require-key"]
    server = start(
        [*args, "--port", str(port)],
        service_env(store.database_url),
        tmp_path / "mcp.log",
        url,
        "/mcp",
    )
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}

    def refused(token: str | None) -> tuple[int, str, str]:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answer = httpx.post(f"{url}/mcp", json=initialize, headers=headers, timeout=10)
        reason = answer.json()["error"]["reason"]
        return answer.status_code, reason, answer.headers.get("www-authenticate", "")

    async def search() -> list[str]:
        client = create_mcp_http_client(headers={"Authorization": f"Bearer {dan_token}"})
        async with (
            client,
            streamable_http_client(f"{url}/mcp", http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            hits = (await call(session, "mem_search", query="fixie"))["hits"]
            return [h["slug"] for h in hits]

    try:
        assert refused(None) == (401, "no_api_key", "Bearer")
        assert refused("glk_not_a_key") == (401, "unknown_api_key", "Bearer")
        assert refused(erin_token)[:2] == (403, "forbidden_owner")  # another owner's key
        assert anyio.run(search) == ["bike"]
        gleaner.revoke_api_key(dans.id)
        assert refused(dan_token)[:2] == (401, "unknown_api_key")  # revoked: refused at once
    finally:
        server.stop()


@pytest.mark.slow
def test_gleaner_mcp_on_a_new_sqlite_file_migrates_it(tmp_path: Path) -> None:
    """An agent's first `gleaner mcp` on a machine: no database yet (~2 s)."""
    database = tmp_path / "first.db"

    async def session_test(session: ClientSession) -> None:
        saved = await call(
            session, "mem_save", title="Bike", content="Alice rides a bike.", type="profile"
        )
        assert saved["slug"]
        found = await call(session, "mem_search", query="bike")
        assert found["hits"]

    stdio(f"sqlite:///{database}", session_test, "--owner", "alice")
    assert database.exists()
