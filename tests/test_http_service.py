"""`gleaner serve` over a socket: a real uvicorn process, driven with httpx, on PostgreSQL and
SQLite. Keys decide which owners a request reaches; every refusal is a JSON error with the
right status, and changes nothing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import create_engine, text

from gleaner import Gleaner
from tests.conftest import test_settings
from tests.samples import native
from tests.service_harness import Service, start_http
from tests.workers_harness import REDIS_URL, redis_db_for

LIMITS = {"GLEANER_MAX_FILE_BYTES": "60000", "GLEANER_MAX_TRANSCRIPT_BYTES": "4000"}
SECRET = "sk-live-9a8b7c6d5e4f"


class Api:
    """One running service, a Gleaner on its database, and a way to count its rows."""

    def __init__(self, service: Service, database_url: str) -> None:
        self.service, self.database_url = service, database_url
        self.gleaner = Gleaner(database_url, settings=test_settings())
        self.client = httpx.Client(base_url=service.url, timeout=30)

    def key(self, owner: str | None) -> dict[str, str]:
        _, token = self.gleaner.create_api_key(owner)
        return {"Authorization": f"Bearer {token}"}

    def rows(self) -> str:
        """Every jobs and memories row, as text: what a refused request must not change."""
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                jobs = conn.execute(text("SELECT id, owner, state FROM jobs ORDER BY id"))
                notes = conn.execute(text("SELECT id, slug, status FROM memories ORDER BY id"))
                return json.dumps([[list(r) for r in jobs], [list(r) for r in notes]])
        finally:
            engine.dispose()


# A uvicorn process per backend (2 to 8 s to start and migrate): every test using it is slow.
@pytest.fixture(
    scope="module",
    params=[
        pytest.param("sqlite", marks=pytest.mark.slow),
        pytest.param("postgresql", marks=pytest.mark.slow),
    ],
)
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    tmp = tmp_path_factory.mktemp("http")
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'http.db'}"
    else:
        url = request.getfixturevalue("pg_url")
    Gleaner(url, settings=test_settings()).migrate()
    service = start_http(url, tmp, **LIMITS)
    found = Api(service, url)
    try:
        yield found
    finally:
        found.client.close()
        found.gleaner.close()
        service.stop()


def owner_name() -> str:
    """A fresh owner per test: the service's database is shared by the module's tests."""
    return f"owner-{uuid.uuid4().hex[:8]}"


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()["error"]
    assert body["message"]
    return str(body["reason"])


def submit(api: Api, headers: dict[str, str], document: Any, **params: Any) -> httpx.Response:
    return api.client.post("/v1/conversations", json=document, headers=headers, params=params)


def test_the_app_declares_every_route_and_error(tmp_path: Path) -> None:
    # The fast tier's check: the app as built, without a server.
    from gleaner.service.http import create_app

    app = create_app(Gleaner(f"sqlite:///{tmp_path / 'none.db'}", settings=test_settings()))
    spec = app.openapi()
    submit = spec["paths"]["/v1/conversations"]["post"]
    assert {"202", "400", "401", "403", "413", "422", "503"} <= set(submit["responses"])
    assert "application/zip" in submit["requestBody"]["content"]


def test_openapi_is_served(api: Api) -> None:
    spec = api.client.get("/openapi.json").json()
    assert {
        "/v1/conversations",
        "/v1/jobs/{job_id}",
        "/v1/owners/{owner}/search",
        "/v1/owners/{owner}/notes/{slug}",
        "/v1/owners/{owner}/index",
        "/v1/owners/{owner}",
    } <= set(spec["paths"])
    assert "HTTPBearer" in spec["components"]["securitySchemes"]
    assert api.client.get("/docs").status_code == 200


@pytest.mark.parametrize("name", ["team/{}", "ünï {} %2F"])
def test_an_owner_whose_name_holds_a_slash_is_reached_through_every_route(
    api: Api, name: str
) -> None:
    owner = name.format(owner_name())  # a "/" and a "%2F" of its own, and non-ASCII letters
    segment = quote(owner, safe="")
    headers = api.key(owner)
    accepted = submit(api, headers, native(13, owner=owner))
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["owner"] == owner
    hits = api.client.get(f"/v1/owners/{segment}/search", params={"q": "keymap13"}, headers=headers)
    assert hits.status_code == 200, hits.text
    slug = hits.json()["hits"][0]["memory"]["slug"]
    note = api.client.get(f"/v1/owners/{segment}/notes/{slug}", headers=headers)
    assert note.status_code == 200 and note.json()["memory"]["scope"]["id"] == owner
    index = api.client.get(f"/v1/owners/{segment}/index", headers=headers).json()
    assert index["owner"] == owner
    # The key is allowed this owner only: the owner before the "/" is another one.
    prefix = owner.split("/")[0] if "/" in owner else owner.split(" ")[0]
    assert error_of(api.client.get(f"/v1/owners/{prefix}/index", headers=headers), 403)
    forgotten = api.client.delete(f"/v1/owners/{segment}", headers=headers)
    assert forgotten.status_code == 200 and forgotten.json()["owner"] == owner
    assert forgotten.json()["deleted"]["notes"] >= 1
    # Bytes that are no UTF-8 name no owner (decoded, each would be U+FFFD).
    anyone = api.key(None)
    for bad in ("%FF", "%FE", "team%2F%C3"):
        assert error_of(api.client.get(f"/v1/owners/{bad}/index", headers=anyone), 422) == (
            "bad_owner"
        )


def test_a_conversation_in_and_its_notes_out(api: Api) -> None:
    alice = owner_name()
    headers = api.key(alice)
    leaky = native(11, owner=alice, extra=f" <private>{SECRET}</private>")
    accepted = submit(api, headers, leaky)
    assert accepted.status_code == 202, accepted.text
    body = accepted.json()
    assert body["owner"] == alice and body["queued"] is False
    job = api.client.get(f"/v1/jobs/{body['job_id']}", headers=headers).json()
    assert job["state"] == "done" and job["notes_written"] == 3
    assert {"model_calls", "prompt_tokens", "completion_tokens"} <= set(job)
    hits = api.client.get(
        f"/v1/owners/{alice}/search", params={"q": "keymap11"}, headers=headers
    ).json()["hits"]
    assert hits and hits[0]["memory"]["slug"] in job["slugs"] and hits[0]["snippet"]
    slug = hits[0]["memory"]["slug"]
    note = api.client.get(f"/v1/owners/{alice}/notes/{slug}", headers=headers).json()
    assert note["memory"]["title"] == hits[0]["memory"]["title"]
    assert {"links", "backlinks", "superseded_by", "history"} <= set(note)
    index = api.client.get(f"/v1/owners/{alice}/index", headers=headers).json()
    assert note["memory"]["title"] in index["text"]
    assert SECRET not in api.rows() and SECRET not in json.dumps(job)
    engine = create_engine(api.database_url)
    with engine.connect() as conn:
        stored = conn.execute(text("SELECT transcript FROM jobs WHERE id = :id"), {"id": job["id"]})
        assert SECRET not in json.dumps(stored.scalar_one())
    engine.dispose()


def test_search_in_plain_words_with_a_window_and_the_index_for_a_query(api: Api) -> None:
    """Any word finds its note, each hit says when its fact was said, since/until bound it,
    and the index follows ``q``; a bad time is a 422 naming the field."""
    alice = owner_name()
    headers = api.key(alice)
    store = api.gleaner.store
    for title, body in (
        ("Melanie's animals", "Melanie has a dog named Luna and a cat named Oliver."),
        ("Moved to Porto", "The user moved from Berlin to Porto."),
    ):
        store.write(("owner", alice), {"title": title, "body": body})
    for i in range(150):  # more titles than the index's token budget holds
        store.write(("owner", alice), {"title": f"Filler note {i}", "body": "gardening"})
    search = f"/v1/owners/{alice}/search"
    hits = api.client.get(search, params={"q": "What are Melanie's pets' names?"}, headers=headers)
    found = hits.json()["hits"]
    assert [h["memory"]["slug"] for h in found] == ["melanie-s-animals"]
    assert found[0]["memory"]["said_at"] and found[0]["bm25"] > 0
    future = {"q": "melanie porto", "since": "2999-01-01T00:00:00Z"}
    assert api.client.get(search, params=future, headers=headers).json()["hits"] == []
    past = {"q": "melanie", "until": "2000-01-01"}
    assert api.client.get(search, params=past, headers=headers).json()["hits"] == []
    bad = api.client.get(search, params={"q": "x", "since": "last week"}, headers=headers)
    assert error_of(bad, 422) == "invalid_request" and "since" in bad.json()["error"]["message"]
    index = f"/v1/owners/{alice}/index"
    plain = api.client.get(index, headers=headers).json()["text"]
    focused = api.client.get(index, params={"q": "pets of Melanie"}, headers=headers).json()
    assert "melanie-s-animals" not in plain
    assert "- Melanie's animals [melanie-s-animals, " in focused["text"]


def test_keys_unknown_missing_or_revoked_get_401(api: Api) -> None:
    alice = owner_name()
    before = api.rows()
    path = f"/v1/owners/{alice}/index"
    assert error_of(api.client.get(path), 401) == "no_api_key"
    bogus = {"Authorization": "Bearer glk_" + "x" * 43}
    assert error_of(api.client.get(path, headers=bogus), 401) == "unknown_api_key"
    response = submit(api, bogus, native(12, owner=alice))
    assert error_of(response, 401) == "unknown_api_key"
    assert response.headers["www-authenticate"] == "Bearer"
    key, token = api.gleaner.create_api_key(alice)
    headers = {"Authorization": f"Bearer {token}"}
    assert api.client.get(path, headers=headers).status_code == 200
    api.gleaner.revoke_api_key(key.id)
    assert error_of(api.client.get(path, headers=headers), 401) == "unknown_api_key"
    assert api.rows() == before


def test_a_key_never_reaches_another_owner(api: Api) -> None:
    alice, bob = owner_name(), owner_name()
    as_alice, as_bob = api.key(alice), api.key(bob)
    bob_job = submit(api, as_bob, native(13, owner=bob)).json()["job_id"]
    (slug, *_) = api.client.get(f"/v1/jobs/{bob_job}", headers=as_bob).json()["slugs"]
    before = api.rows()
    # Writing: a conversation naming bob, or alice's key asking for bob's scope.
    assert error_of(submit(api, as_alice, native(14, owner=bob)), 403) == "forbidden_owner"
    response = submit(api, as_alice, native(14, owner=alice), owner=bob, reassign_owner=True)
    assert error_of(response, 403) == "forbidden_owner"
    # Reading and forgetting.
    for method, path in [
        ("GET", f"/v1/owners/{bob}/search?q=keymap13"),
        ("GET", f"/v1/owners/{bob}/notes/{slug}"),
        ("GET", f"/v1/owners/{bob}/index"),
        ("DELETE", f"/v1/owners/{bob}"),
    ]:
        response = api.client.request(method, path, headers=as_alice)
        assert error_of(response, 403) == "forbidden_owner", path
    assert error_of(api.client.get(f"/v1/jobs/{bob_job}", headers=as_alice), 404) == "not_found"
    assert api.rows() == before
    # A key for every owner reaches both; one owner's forget leaves the other's notes.
    every = api.key(None)
    assert api.client.get(f"/v1/jobs/{bob_job}", headers=every).json()["owner"] == bob
    assert submit(api, every, native(15, owner=alice)).status_code == 202
    forgotten = api.client.delete(f"/v1/owners/{alice}", headers=as_alice)
    assert forgotten.status_code == 200 and forgotten.json()["deleted"]["notes"] == 3
    bob_hits = api.client.get(f"/v1/owners/{bob}/search?q=keymap13", headers=as_bob).json()
    assert bob_hits["hits"]


def test_forgetting_one_conversation_of_an_owner(api: Api) -> None:
    alice, bob = owner_name(), owner_name()
    as_alice, as_bob = api.key(alice), api.key(bob)
    slashed = {**native(22, owner=alice), "conversation_id": "chats/22"}
    for headers, document in (
        (as_alice, native(21, owner=alice)),
        (as_alice, slashed),
        (as_bob, native(21, owner=bob)),  # the same conversation id, another owner
    ):
        assert submit(api, headers, document).status_code == 202
    spec = api.client.get("/openapi.json").json()
    assert "delete" in spec["paths"]["/v1/owners/{owner}/conversations/{conversation_id}"]
    path = f"/v1/owners/{alice}/conversations/conv-21"
    before = api.rows()
    assert error_of(api.client.delete(path, headers=as_bob), 403) == "forbidden_owner"
    missing = f"/v1/owners/{alice}/conversations/conv-404"
    assert error_of(api.client.delete(missing, headers=as_alice), 404) == "not_found"
    assert api.rows() == before
    done = api.client.delete(path, headers=as_alice)
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["owner"] == alice and body["conversation_id"] == "conv-21"
    assert body["counts"]["notes_deleted"] == 3 and body["counts"]["jobs"] == 1
    assert body["counts"]["ledger"] == 1 and body["counts"]["tombstones"] == 1
    search = f"/v1/owners/{alice}/search"
    assert api.client.get(search, params={"q": "keymap21"}, headers=as_alice).json()["hits"] == []
    assert api.client.get(search, params={"q": "keymap22"}, headers=as_alice).json()["hits"]
    bobs = api.client.get(f"/v1/owners/{bob}/search", params={"q": "keymap21"}, headers=as_bob)
    assert bobs.json()["hits"]
    # Submitted again, the forgotten transcript writes nothing.
    again = submit(api, as_alice, native(21, owner=alice)).json()["job_id"]
    assert api.client.get(f"/v1/jobs/{again}", headers=as_alice).json()["notes_written"] == 0
    # A conversation id holding "/" is one percent-encoded segment.
    slashed_path = f"/v1/owners/{alice}/conversations/chats%2F22"
    slash = api.client.delete(slashed_path, headers=as_alice)
    assert slash.status_code == 200 and slash.json()["conversation_id"] == "chats/22"
    assert error_of(api.client.delete(slashed_path, headers=as_alice), 404) == "not_found"


def test_a_one_owner_key_fills_in_the_owner(api: Api) -> None:
    alice = owner_name()
    export = {"messages": [{"role": "user", "content": "I prefer zed with the kit16 keymap16."}]}
    accepted = submit(api, api.key(alice), export)
    assert accepted.status_code == 202 and accepted.json()["owner"] == alice
    assert error_of(submit(api, api.key(None), export), 422) == "no_owner"


def test_oversized_and_malformed_bodies_change_nothing(api: Api) -> None:
    alice = owner_name()
    headers = api.key(alice)
    before = api.rows()
    post = "/v1/conversations"
    huge = b'{"messages": "' + b"x" * 70_000 + b'"}'
    assert error_of(api.client.post(post, content=huge, headers=headers), 413) == "too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: refused while it streams in
        for _ in range(80):
            yield b" " * 1000

    assert error_of(api.client.post(post, content=chunks(), headers=headers), 413) == "too_large"
    long_talk = native(17, owner=alice, extra=" pad" * 2000)
    assert error_of(submit(api, headers, long_talk), 413) == "too_large"
    for body in [b"not json", b"{}", b"[]", json.dumps({"hello": "world"}).encode()]:
        reason = error_of(api.client.post(post, content=body, headers=headers), 400)
        assert reason == "bad_transcript", body
    two = [native(18, owner=alice), native(19, owner=alice)]
    assert error_of(submit(api, headers, two), 400) == "not_one_conversation"
    assert error_of(submit(api, headers, native(20, owner=alice + "\u200b")), 422) == "bad_owner"
    bad_owner = f"/v1/owners/{alice}%E2%80%8B/index"  # a zero-width space: the owner rule
    assert error_of(api.client.get(bad_owner, headers=headers), 422) == "bad_owner"
    search = f"/v1/owners/{alice}/search"
    assert error_of(api.client.get(search, params={"q": "x", "limit": 0}, headers=headers), 422)
    assert error_of(api.client.get(search, headers=headers), 422) == "invalid_request"
    missing = api.client.get(f"/v1/owners/{alice}/notes/no-such-note", headers=headers)
    assert error_of(missing, 404) == "not_found"
    assert error_of(api.client.get("/v1/jobs/nope", headers=headers), 404) == "not_found"
    assert api.rows() == before


def test_with_a_broker_the_job_is_queued(
    api: Api, tmp_path: Path, worker_id: str, request: pytest.FixtureRequest
) -> None:
    if "sqlite" in api.database_url:
        pytest.skip("the queued path is the same on both databases: run once")
    redis_db = redis_db_for(worker_id)
    broker = f"{REDIS_URL}/{redis_db}"
    service = start_http(api.database_url, tmp_path, GLEANER_BROKER_URL=broker)
    try:
        alice = owner_name()
        with httpx.Client(base_url=service.url, timeout=30) as client:
            accepted = client.post(
                "/v1/conversations", json=native(21, owner=alice), headers=api.key(alice)
            )
            assert accepted.status_code == 202 and accepted.json()["queued"] is True
            job = api.gleaner.job(accepted.json()["job_id"])
            assert job.state == "pending" and job.queue == "harvest"
    finally:
        service.stop()
    import redis

    client = redis.Redis.from_url(broker)
    mine = [m for m in client.lrange("harvest", 0, -1) if job.id.encode() in m]
    for message in mine:
        client.lrem("harvest", 0, message)
    client.close()
    assert len(mine) == 1


@pytest.mark.slow
def test_a_database_gone_is_503_never_a_refused_key_and_no_request_is_logged(
    tmp_path: Path, worker_id: str
) -> None:
    # With the database unreachable, even a good key cannot be checked: the answer must say
    # "try again" (503), not "your key is unknown" (401), which a platform takes as final.
    # And with no --access-log, no request line names the owner or what was searched.
    from tests.conftest import PG_BASE_URL, migrated_pg_database
    from tests.service_harness import free_port, service_env, start

    name = f"gleaner_http_down_{worker_id}"
    url = migrated_pg_database(name)
    gleaner = Gleaner(url, settings=test_settings())
    _, token = gleaner.create_api_key("alice")
    gleaner.close()
    port = free_port()
    service = start(
        ["serve", "--port", str(port), "--log-level", "info"],
        service_env(url),
        tmp_path / "serve.log",
        f"http://127.0.0.1:{port}",
        "/healthz",
    )
    admin = create_engine(PG_BASE_URL, isolation_level="AUTOCOMMIT")
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=service.url, timeout=30) as client:
            search = "/v1/owners/alice/search?q=zanzibarquux"
            assert client.get(search, headers=headers).status_code == 200
            with admin.connect() as conn:
                conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"
                    ),
                    {"n": name},
                )
            assert error_of(client.get(search, headers=headers), 503) == "storage_failure"
            posted = client.post(
                "/v1/conversations", json=native(1, owner="alice"), headers=headers
            )
            assert error_of(posted, 503) == "storage_failure"
            with admin.connect() as conn:
                conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
            assert client.get(search, headers=headers).status_code == 200
    finally:
        service.stop()
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()
    log = service.text()
    assert "Uvicorn running" in log or "Application startup complete" in log  # info is on
    assert "alice" not in log and "zanzibarquux" not in log
