"""Figures for docs/RELIABILITY.md, "Identifiers and keys": `python -m bench.identifiers`.

Not a scenario of `python -m bench`: a one-minute run on both databases (SQLite in a
temporary folder, PostgreSQL at the tests' server), through the HTTP service's app
(FastAPI's TestClient). Alice saves a note, 4 other owners save 40, alice saves 301 more;
then what alice is shown (a note's JSON, the index header), what a NUL in a slug gets, and
the median time (of 50) of a refusal, a search with a read-only key and with a read-write
one, and of building the index text and hashing it for the header's version.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from fastapi.testclient import TestClient

from gleaner import Gleaner
from gleaner.service.http import create_app
from tests.conftest import recreate_pg_database, test_settings

OTHERS = 40
MORE = 300


def median_ms(call: Callable[[], object], times: int = 50) -> float:
    spent = []
    for _ in range(times):
        start = time.perf_counter()
        call()
        spent.append((time.perf_counter() - start) * 1000)
    return statistics.median(spent)


def run(backend: str, url: str) -> str:
    g = Gleaner(url, settings=test_settings())
    g.migrate()
    g.mem_save("alice", "Alice drinks oolong.", type="preference", title="Tea")
    for i in range(OTHERS):
        g.mem_save(f"other-{i % 4}", f"Fact {i}.", type="profile", title=f"Fact {i}")
    saved = g.mem_save("alice", "Alice rides a bike.", type="profile", title="Bike")
    for i in range(MORE):
        g.mem_save("alice", f"Alice fact {i} about things.", type="profile", title=f"Fact {i}")
    _, writer = g.create_api_key("alice")
    _, reader = g.create_api_key("alice", read_only=True)
    rw, ro = ({"Authorization": f"Bearer {token}"} for token in (writer, reader))
    with TestClient(create_app(g)) as client:
        nul = client.get("/v1/owners/alice/notes/a%00b", headers=rw)
        refused = median_ms(lambda: client.get("/v1/owners/alice/notes/a%00b", headers=rw))
        unknown = median_ms(lambda: client.get("/v1/owners/alice/notes/nope", headers=rw))
        search = "/v1/owners/alice/search"
        by_reader = median_ms(lambda: client.get(search, params={"q": "bike"}, headers=ro))
        by_writer = median_ms(lambda: client.get(search, params={"q": "bike"}, headers=rw))
        read_only = median_ms(lambda: client.delete("/v1/owners/alice", headers=ro))
        note = client.get("/v1/owners/alice/notes/bike", headers=rw).text
    text = g.index_text("alice")
    index = median_ms(lambda: g.index_text("alice"), 20)
    digest = median_ms(lambda: hashlib.sha256(text.encode()).hexdigest(), 200) * 1000
    shown = f'"id":{saved.id}' in note or "updated_seq" in note
    g.close()
    return (
        f"{backend}: a NUL slug -> {nul.status_code} {nul.json()['error']['reason']} in "
        f"{refused:.2f} ms (an unknown slug's 404: {unknown:.2f} ms); search with a read-only "
        f"key {by_reader:.2f} ms, read-write {by_writer:.2f} ms; a read-only DELETE refused in "
        f"{read_only:.2f} ms; alice's second note is row {saved.id}, shown in its JSON: "
        f"{shown}; index text of {2 + MORE} notes ({len(text.encode()):,} bytes) "
        f"{index:.2f} ms, its version hash {digest:.1f} us; header {text.splitlines()[0]}"
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print(run("sqlite", f"sqlite:///{Path(tmp) / 'identifiers.db'}"))
    print(run("postgresql", recreate_pg_database("gleaner_bench_identifiers")))


if __name__ == "__main__":
    main()
