"""`gleaner mcp --transport streamable-http` is safe by default (issue 38, point 6): keys are
required unless ``--no-key``, which only a loopback address accepts; the SDK's DNS-rebinding
protection guards every address it binds, however loopback is spelled; it says its URL on
start and a line on stop. Through the MCP SDK's own client against the server process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from gleaner import Gleaner
from gleaner.service.mcp import NoKeyRefused, allowed_hosts, is_loopback, needs_key, url_of
from tests.service_harness import Service, free_port, service_env, start

LOOPBACK_SPELLINGS = ("127.0.0.1", "127.0.0.2", "::1", "0:0:0:0:0:0:0:1", "localhost")
MCP_HTTP = ("mcp", "--owner", "dan", "--transport", "streamable-http")
REBINDING = {"Host": "evil.example", "Origin": "http://evil.example"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "probe", "version": "1"},
    },
}
SAVE = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {
        "name": "mem_save",
        "arguments": {"content": "Planted.", "type": "profile", "title": "Planted"},
    },
}
ACCEPT = {"Accept": "application/json, text/event-stream"}


def test_no_key_is_accepted_on_loopback_only() -> None:
    assert all(is_loopback(host) for host in (*LOOPBACK_SPELLINGS, "[::1]", "LOCALHOST"))
    for host in ("0.0.0.0", "::", "192.168.1.5", "mcp.example", "localhost.evil.example"):
        assert not is_loopback(host)
        assert needs_key(host, no_key=False)
        with pytest.raises(NoKeyRefused, match=f"not on '{host}'"):
            needs_key(host, no_key=True)
    assert not needs_key("127.0.0.2", no_key=True)
    assert needs_key("127.0.0.1", no_key=False)  # keys are the default on loopback too


def test_allowed_hosts_name_the_bound_address_in_every_spelling() -> None:
    assert set(allowed_hosts("0:0:0:0:0:0:0:1", 8001)) >= {
        "[0:0:0:0:0:0:0:1]:8001",
        "[::1]:8001",
        "127.0.0.1:8001",
        "localhost:8001",
    }
    assert set(allowed_hosts("127.0.0.2", 80)) >= {"127.0.0.2:80", "127.0.0.2"}
    public = allowed_hosts("192.0.2.7", 8001, ["mcp.example"])
    assert sorted(public) == ["192.0.2.7:8001", "mcp.example:8001"]  # no loopback names
    assert url_of("::1", 8001) == "http://[::1]:8001/mcp"


def _serve(database_url: str, tmp_path: Path, host: str, *extra: str) -> Service:
    port = free_port()
    url = url_of(host, port).removesuffix("/mcp")
    return start(
        [*MCP_HTTP, "--host", host, "--port", str(port), *extra],
        service_env(database_url),
        tmp_path / f"mcp-{port}.log",
        url,
        "/mcp",
    )


async def _session_slugs(endpoint: str, headers: dict[str, str] | None = None) -> list[str]:
    """Through the SDK's client: initialize, then the slugs mem_search finds for "fixie"."""
    client = create_mcp_http_client(headers=headers)
    async with (
        client,
        streamable_http_client(endpoint, http_client=client) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        result = await session.call_tool("mem_search", {"query": "fixie"})
        assert not result.is_error, result.content
        return [hit["slug"] for hit in (result.structured_content or {})["hits"]]


def _refused_by_sdk_client(endpoint: str, headers: dict[str, str]) -> None:
    """The SDK's client, sent with ``headers``, cannot initialize: the server's HTTP error
    is the SDK's MCPError (inside the groups of its task groups), not a timeout."""

    async def attempt() -> None:
        with anyio.fail_after(20):
            await _session_slugs(endpoint, headers)

    with pytest.raises(BaseExceptionGroup) as raised:
        anyio.run(attempt)
    leaves: list[BaseException] = []
    pending: list[BaseException] = [raised.value]
    while pending:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    assert leaves and all(isinstance(exc, MCPError) for exc in leaves), leaves


@pytest.mark.slow
@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_a_rebinding_request_is_refused_on_each_loopback_spelling(
    make_store: Any, tmp_path: Path, host: str
) -> None:
    store = make_store("sqlite")
    Gleaner(store=store).mem_save("dan", "Dan rides a fixie.", type="profile", title="Bike")
    server = _serve(store.database_url, tmp_path, host, "--no-key")
    endpoint = server.url + "/mcp"
    try:
        assert anyio.run(_session_slugs, endpoint) == ["bike"]  # no key, as asked
        _refused_by_sdk_client(endpoint, REBINDING)
        for headers, status in (
            (REBINDING, 421),
            ({"Host": "evil.example"}, 421),
            ({"Origin": "http://evil.example"}, 403),  # the right Host, a foreign page
        ):
            for message in (INITIALIZE, SAVE):
                answer = httpx.post(endpoint, json=message, headers={**ACCEPT, **headers})
                assert answer.status_code == status, (headers, answer.text)
    finally:
        server.stop()
    assert Gleaner(store=store).search("dan", "planted") == []  # nothing written
    log = server.text()
    assert f"dan's memory at {endpoint} (no key: loopback only)" in log
    assert log.rstrip().endswith("gleaner mcp: stopped")


@pytest.mark.slow
def test_keys_are_required_by_default_and_checked_before_rebinding(
    make_store: Any, tmp_path: Path
) -> None:
    store = make_store("sqlite")
    gleaner = Gleaner(store=store)
    gleaner.mem_save("dan", "Dan rides a fixie.", type="profile", title="Bike")
    _, token = gleaner.create_api_key("dan")
    server = _serve(store.database_url, tmp_path, "127.0.0.2")
    endpoint = server.url + "/mcp"
    try:
        keyless = httpx.post(endpoint, json=INITIALIZE, headers=ACCEPT)
        assert keyless.status_code == 401
        assert keyless.json()["error"]["reason"] == "no_api_key"
        _refused_by_sdk_client(endpoint, {})
        bearer = {"Authorization": f"Bearer {token}"}
        assert anyio.run(_session_slugs, endpoint, bearer) == ["bike"]
        # A key does not let a rebinding page in either.
        rebound = httpx.post(endpoint, json=INITIALIZE, headers={**ACCEPT, **bearer, **REBINDING})
        assert rebound.status_code == 421
    finally:
        server.stop()
    assert "(API key required)" in server.text()


# One CLI process in the fast tier: each host's refusal is checked in process above
# (``test_no_key_is_accepted_on_loopback_only``); the others' processes run in the slow tier.
@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",
        *(pytest.param(h, marks=pytest.mark.slow) for h in ("::", "192.0.2.7", "mcp.example")),
    ],
)
def test_no_key_off_loopback_is_refused_with_a_clear_error(host: str) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "gleaner.cli", *MCP_HTTP, "--host", host, "--no-key"],
        env=service_env("sqlite://"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    assert "--no-key is allowed only on a loopback address" in refused.stderr
    assert f"not on '{host}'" in refused.stderr
    assert "memory at" not in refused.stdout  # it never listened
