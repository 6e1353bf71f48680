"""Read-only API keys and key listings, on both databases: a read-only key searches, reads,
gets the index and follows jobs through the HTTP service, and is refused (403
``read_only_key``, nothing changed) when it submits or forgets; over MCP's streamable HTTP
it may call every tool but the two that save. ``gleaner keys list`` tells a key for every
owner from one for an owner named "(all owners)"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from sqlalchemy import text

from gleaner import Gleaner
from gleaner.service.http import create_app
from gleaner.store import Store
from tests.cli_harness import Cli, cli
from tests.samples import native
from tests.service_harness import free_port, service_env, start

__all__ = ["cli"]  # the fixture, used by name

OWNER = "alice"
MCP_ARGS = ["mcp", "--owner", "dan", "--transport", "streamable-http", "--require-key"]


@pytest.fixture
def gleaner(store: Store) -> Gleaner:
    return Gleaner(store=store)


@pytest.fixture
def client(gleaner: Gleaner) -> Iterator[TestClient]:
    with TestClient(create_app(gleaner)) as found:
        yield found


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def stored(store: Store) -> str:
    """Every job and note row, as text: what a refused write must leave as it was."""
    with store.engine.connect() as conn:
        jobs = conn.execute(text("SELECT id, owner, state FROM jobs ORDER BY id")).all()
        notes = conn.execute(text("SELECT id, slug, status FROM memories ORDER BY id")).all()
    return json.dumps([[list(r) for r in jobs], [list(r) for r in notes]], default=str)


def reason(response: Any, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"]["reason"])


def test_a_read_only_key_reads_everything_and_writes_nothing(
    store: Store, gleaner: Gleaner, client: TestClient
) -> None:
    job_id = gleaner.submit(native(1, owner=OWNER))  # harvested here: no broker
    slug = gleaner.search(OWNER, "keymap1")[0].memory.slug
    key, token = gleaner.create_api_key(OWNER, read_only=True)
    assert key.read_only and gleaner.verify_api_key(token) == key
    _, everyone = gleaner.create_api_key(None, read_only=True)
    for headers in (bearer(token), bearer(everyone)):
        base = f"/v1/owners/{OWNER}"
        hits = client.get(f"{base}/search", params={"q": "keymap1"}, headers=headers)
        assert hits.status_code == 200 and hits.json()["hits"][0]["memory"]["slug"] == slug
        assert client.get(f"{base}/notes/{slug}", headers=headers).status_code == 200
        assert slug in client.get(f"{base}/index", headers=headers).json()["text"]
        assert client.get(f"/v1/jobs/{job_id}", headers=headers).json()["state"] == "done"

        before = stored(store)
        posted = client.post("/v1/conversations", json=native(2, owner=OWNER), headers=headers)
        assert reason(posted, 403) == "read_only_key"
        assert reason(client.delete(base, headers=headers), 403) == "read_only_key"
        one = client.delete(f"{base}/conversations/{native(1)['conversation_id']}", headers=headers)
        assert reason(one, 403) == "read_only_key"
        assert "read-only" in one.json()["error"]["message"]
        assert stored(store) == before

    # The same requests with a key that may write do what they say.
    _, writer = gleaner.create_api_key(OWNER)
    posted = client.post("/v1/conversations", json=native(2, owner=OWNER), headers=bearer(writer))
    assert posted.status_code == 202, posted.text
    forgotten = client.delete(f"/v1/owners/{OWNER}", headers=bearer(writer))
    assert forgotten.status_code == 200 and gleaner.search(OWNER, "keymap1") == []


def test_a_read_only_key_for_another_owner_is_still_refused_that_owner(
    gleaner: Gleaner, client: TestClient
) -> None:
    gleaner.mem_save("bob", "Bob drinks oolong.", type="preference", title="Tea")
    _, token = gleaner.create_api_key(OWNER, read_only=True)
    found = client.get("/v1/owners/bob/search", params={"q": "oolong"}, headers=bearer(token))
    assert reason(found, 403) == "forbidden_owner"


def test_read_only_is_stored_on_the_key_and_listed(gleaner: Gleaner) -> None:
    reader, _ = gleaner.create_api_key(OWNER, read_only=True)
    writer, _ = gleaner.create_api_key(OWNER)
    listed = {key.id: key for key in gleaner.api_keys()}
    assert listed[reader.id].read_only and not listed[writer.id].read_only
    assert reader.model_dump(mode="json")["read_only"] is True
    with pytest.raises(ValueError, match="read_only"):
        gleaner.create_api_key(OWNER, read_only="yes")  # type: ignore[arg-type]


def test_key_listings_tell_every_owner_from_an_owner_so_named(cli: Cli, store: Store) -> None:
    cli.env(GLEANER_DATABASE_URL=store.database_url)
    named = cli("keys", "create", "--owner", "(all owners)", "--json").json()
    every = cli("keys", "create", "--all-owners", "--read-only", "--json").json()
    assert named["owner"] == "(all owners)" and named["all_owners"] is False
    assert every["owner"] is None and every["all_owners"] is True and every["read_only"] is True
    assert not named["read_only"]
    listed = cli("keys", "list")
    assert listed.code == 0, listed.err
    lines = {line.split()[0]: line for line in listed.out.splitlines()}
    assert lines[named["id"]].endswith('owner "(all owners)"')
    assert " read-write " in lines[named["id"]]
    assert lines[every["id"]].endswith("  all owners") and " read-only " in lines[every["id"]]
    as_json = {k["id"]: k for k in cli("keys", "list", "--json").json()}
    assert as_json[named["id"]]["all_owners"] is False
    assert as_json[every["id"]]["all_owners"] is True
    revoked = cli("keys", "revoke", named["id"])
    assert revoked.code == 0 and 'owner "(all owners)"' in revoked.out
    made = cli("keys", "create", "--owner", "bob", "--read-only")
    assert made.code == 0 and 'for owner "bob", read-only' in made.out


@pytest.mark.slow
def test_mcp_over_http_a_read_only_key_cannot_save(store: Store, tmp_path: Path) -> None:
    gleaner = Gleaner(store=store)
    gleaner.mem_save("dan", "Dan rides a fixie.", type="profile", title="Bike")
    _, reader = gleaner.create_api_key("dan", read_only=True)
    _, writer = gleaner.create_api_key("dan")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start(
        [*MCP_ARGS, "--port", str(port)],
        service_env(store.database_url),
        tmp_path / "mcp.log",
        url,
        "/mcp",
    )

    async def session_with(token: str, body: Any) -> Any:
        client = create_mcp_http_client(headers=bearer(token))
        async with (
            client,
            streamable_http_client(f"{url}/mcp", http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await body(session)

    async def reads_and_saves(session: ClientSession) -> dict[str, Any]:
        found = await session.call_tool("mem_search", {"query": "fixie"})
        index = await session.call_tool("mem_index", {})
        note = await session.call_tool("mem_read", {"slug": "bike"})
        saved = await session.call_tool(
            "mem_save", {"content": "Dan sold the fixie.", "type": "profile", "title": "Bike 2"}
        )
        summary = await session.call_tool("mem_session_summary", {"content": "Talked bikes."})
        return {
            "reads": [not r.is_error for r in (found, index, note)],
            "writes": [
                (r.is_error, " ".join(getattr(b, "text", "") for b in r.content))
                for r in (saved, summary)
            ],
        }

    try:
        before = stored(store)
        read_only = anyio.run(session_with, reader, reads_and_saves)
        assert read_only["reads"] == [True, True, True]
        for is_error, message in read_only["writes"]:
            assert is_error and "read_only_key: " in message, message
        assert stored(store) == before
        allowed = anyio.run(session_with, writer, reads_and_saves)
        assert [is_error for is_error, _ in allowed["writes"]] == [False, False]
        assert [h.memory.slug for h in gleaner.search("dan", "sold")] == ["bike-2"]
    finally:
        server.stop()
