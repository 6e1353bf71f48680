"""Concurrent writers on PostgreSQL: upserts end in one row, derived slugs stay unique, no errors.

Eight separate processes (each its own engine and connection) start each write together at a
barrier.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
from typing import Any

import pytest
from sqlalchemy import text

from gleaner.store import Scope, Store

WRITERS = 8
ALICE = Scope.owner("alice")


def _writer(url: str, barrier: Any, results: Any, n: int) -> None:
    from tests.conftest import test_settings

    store = Store(url, settings=test_settings())
    try:
        out: dict[str, object] = {}
        barrier.wait(timeout=30)
        out["slug"] = store.write(
            ALICE, {"title": f"Explicit {n}", "body": f"writer {n}", "slug": "shared-slug"}
        ).memory.id
        barrier.wait(timeout=30)
        out["topic"] = store.mem_save(
            "alice", f"content {n}", type="decision", title=f"Topic {n}", topic_key="arch/db"
        ).id
        barrier.wait(timeout=30)
        out["derived"] = store.write(
            ALICE, {"title": "Same derived title", "body": f"writer {n}"}
        ).memory.slug
        barrier.wait(timeout=30)
        out["dedup"] = store.mem_save(
            "bob", "identical content", type="pattern", title=f"t{n}"
        ).outcome
        results.put(("ok", out))
    except Exception:
        results.put(("error", traceback.format_exc()))
    finally:
        store.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_eight_processes_write_the_same_keys_at_once(pg_url: str, make_store) -> None:
    store = make_store("postgresql")  # cleans the database
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(WRITERS)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(pg_url, barrier, results, n)) for n in range(WRITERS)
    ]
    for proc in procs:
        proc.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    errors = [detail for status, detail in outcomes if status != "ok"]
    assert errors == []
    done = [detail for _, detail in outcomes]

    assert len({d["slug"] for d in done}) == 1  # one row for the explicit slug
    assert len({d["topic"] for d in done}) == 1  # one row for the topic key
    derived = sorted(d["derived"] for d in done)
    assert derived == sorted(
        ["same-derived-title"] + [f"same-derived-title-{i}" for i in range(2, WRITERS + 1)]
    )
    assert sorted(d["dedup"] for d in done) == ["created"] + ["deduped"] * (WRITERS - 1)

    with store.engine.connect() as conn:
        counts = conn.execute(
            text(
                "SELECT count(*) FILTER (WHERE slug = 'shared-slug'), "
                "count(*) FILTER (WHERE topic_key = 'arch/db'), "
                "count(*) FILTER (WHERE scope_id = 'bob'), "
                "count(DISTINCT updated_seq) = count(*) FROM memories"
            )
        ).one()
        sessions = conn.execute(
            text("SELECT user_id, saves FROM sessions WHERE ended_at IS NULL ORDER BY user_id")
        ).all()
    assert tuple(counts) == (1, 1, 1, True)
    assert [tuple(s) for s in sessions] == [("alice", WRITERS), ("bob", WRITERS)]
