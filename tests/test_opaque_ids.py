"""No identifier an API shows counts other owners' writes, on both databases: an owner's
notes as the HTTP service, the MCP tools, the CLI and the Python API's JSON show them carry
no row id or store-wide ``updated_seq``, and the index header's ``version`` is a hash of the
block's own text. A row id or sequence number shown to alice would tell her how much every
other owner wrote between two of her own writes."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from fastapi.testclient import TestClient

from gleaner import Gleaner
from gleaner.service.http import create_app
from gleaner.service.mcp import build_server
from gleaner.store import Store
from tests.cli_harness import Cli, cli

__all__ = ["cli"]  # the fixture, used by name

OWNER = "alice"
# Other owners' writes between two of alice's: any number this large in alice's output
# could only have come from counting them.
OTHERS = 40
HEADER = re.compile(r"<gleaner-memory-index ([^>]*)>\n")


@pytest.fixture
def gleaner(store: Store) -> Gleaner:
    found = Gleaner(store=store)
    found.mem_save(OWNER, "Alice drinks oolong.", type="preference", title="Tea")
    for i in range(OTHERS):
        found.mem_save(f"other-{i % 4}", f"Fact number {i}.", type="profile", title=f"Fact {i}")
    return found


@pytest.fixture
def client(gleaner: Gleaner) -> Iterator[TestClient]:
    with TestClient(create_app(gleaner)) as found:
        yield found


def integers(value: Any) -> Iterator[int]:
    """Every JSON integer in ``value`` (not a bool, not a digit inside a string)."""
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from integers(item)
    elif isinstance(value, list):
        for item in value:
            yield from integers(item)


def keys_of(value: Any) -> Iterator[str]:
    """Every key in ``value``, but those of a ``scope`` (whose ``id`` is the owner's name)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            if key != "scope":
                yield from keys_of(item)
    elif isinstance(value, list):
        for item in value:
            yield from keys_of(item)


def assert_counts_nobody(output: Any) -> None:
    assert max(integers(output), default=0) < OTHERS, json.dumps(output)[:2000]
    assert not {"id", "updated_seq"} & set(keys_of(output)), output


def test_http_results_show_no_store_wide_number(gleaner: Gleaner, client: TestClient) -> None:
    saved = gleaner.mem_save(OWNER, "Alice rides a bike.", type="profile", title="Bike")
    assert saved.id > OTHERS  # the row id does count everyone: what must not be shown
    assert saved.model_dump(mode="json") == {
        "slug": "bike",
        "outcome": "created",
        "session_id": saved.session_id,
        "topic_key": None,
    }
    _, token = gleaner.create_api_key(OWNER)
    headers = {"Authorization": f"Bearer {token}"}
    hits = client.get(f"/v1/owners/{OWNER}/search", params={"q": "bike tea"}, headers=headers)
    assert {h["memory"]["slug"] for h in hits.json()["hits"]} == {"bike", "tea"}
    note = client.get(f"/v1/owners/{OWNER}/notes/bike", headers=headers).json()
    assert note["memory"]["title"] == "Bike"
    for output in (hits.json(), note):
        assert_counts_nobody(output)
        # The scope's own id is the owner's name, not a number.
        assert all(scope == {"kind": "owner", "id": OWNER} for scope in scopes(output))
    detail = gleaner.note(OWNER, "bike")
    assert_counts_nobody(detail.model_dump(mode="json"))
    assert_counts_nobody([h.model_dump(mode="json") for h in gleaner.search(OWNER, "bike")])


def scopes(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "scope":
                yield item
            else:
                yield from scopes(item)
    elif isinstance(value, list):
        for item in value:
            yield from scopes(item)


def test_the_index_header_is_a_hash_of_its_own_text(gleaner: Gleaner, client: TestClient) -> None:
    gleaner.mem_save(OWNER, "Alice rides a bike.", type="profile", title="Bike")
    text = gleaner.index_text(OWNER)
    header = HEADER.match(text)
    assert header is not None, text
    attributes = dict(re.findall(r'(\w+)="([^"]*)"', header.group(1)))
    assert set(attributes) == {"scope", "notes", "version"}
    assert attributes["notes"] == "2" and re.fullmatch(r"[0-9a-f]{16}", attributes["version"])
    body = text[header.end() : -len("</gleaner-memory-index>")]
    expected = hashlib.sha256(f"owner:{OWNER}\n2\n{body}".encode()).hexdigest()[:16]
    assert attributes["version"] == expected
    # Others writing changes nothing alice sees; her own write changes the version.
    gleaner.mem_save("other-0", "Another fact.", type="profile", title="Another")
    assert gleaner.index_text(OWNER) == text
    _, token = gleaner.create_api_key(OWNER)
    served = client.get(f"/v1/owners/{OWNER}/index", headers={"Authorization": f"Bearer {token}"})
    assert served.json()["text"] == text
    gleaner.mem_save(OWNER, "Alice reads novels.", type="profile", title="Books")
    again = HEADER.match(gleaner.index_text(OWNER))
    assert again is not None and 'notes="3"' in again.group(1)
    assert attributes["version"] not in again.group(1)


def test_mcp_tools_show_no_store_wide_number(gleaner: Gleaner) -> None:
    server = build_server(gleaner, OWNER)

    def called(tool: str, **arguments: Any) -> Any:
        result = anyio.run(server.call_tool, tool, arguments)
        return json.loads(json.dumps(result, default=_plain))

    saved = called("mem_save", content="Alice rides a bike.", type="profile", title="Bike")
    again = called("mem_save", content="Alice rides a red bike.", type="profile", title="Bike")
    for output in (saved, again):
        assert "bike" in json.dumps(output) and '"id"' not in json.dumps(output)
    for output in (
        saved,
        called("mem_read", slug="bike"),
        called("mem_search", query="bike"),
        called("mem_session_summary", content="Talked bikes."),
    ):
        assert_counts_nobody(output)


def _plain(value: Any) -> Any:
    """What the SDK's tool results hold, as JSON (content blocks and structured output)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return str(value)


def test_cli_json_shows_no_store_wide_number(gleaner: Gleaner, cli: Cli, store: Store) -> None:
    gleaner.mem_save(OWNER, "Alice rides a bike.", type="profile", title="Bike")
    cli.env(GLEANER_DATABASE_URL=store.database_url)
    shown = cli("show", "bike", "--owner", OWNER, "--json")
    assert shown.code == 0, shown.err
    found = cli("search", "bike", "--owner", OWNER, "--json")
    assert found.code == 0, found.err
    assert found.json()[0]["slug"] == "bike"
    for output in (shown.json(), found.json()):
        assert_counts_nobody(output)
