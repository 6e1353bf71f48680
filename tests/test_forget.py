"""Forget forgets: no table, index, job, import, housekeeping record or worker log holds the
owner's text, titles or slugs afterwards; forgotten transcripts stay forgotten; a harvest
running during the forget writes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect, text

from gleaner.harvest.job import harvest_transcript
from gleaner.harvest.llm import LLMAnswer
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.queue import record_jobs
from gleaner.store import Scope, Store
from gleaner.store.jobs import queue as job_records
from tests.test_harvest_job import transcript
from tests.workers_harness import Cluster, cluster_env, redis_db_for, wait_for

OWNER = "ownerqx"
MARKER = "zanzibarquux"  # a word only the owner's conversations hold
# What of the marker survives FTS5's prefix compression of terms inside its binary segments.
MARKER_TAIL = MARKER[-7:]
ALICE_LINE = f"I prefer {MARKER} tabs over spaces in every repo."


def every_value(store: Store) -> str:
    """Every value of every table, lowercased, as text; on SQLite the FTS5 shadow tables'
    binary segments too, byte for byte (a deleted note's words stay there until merged)."""
    out: list[str] = []
    with store.engine.connect() as conn:
        for table in inspect(conn).get_table_names():
            for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                out.extend(v.decode("latin-1") if isinstance(v, bytes) else str(v) for v in row)
    return " ".join(out).lower()


def fill(store: Store) -> None:
    """The owner's data in every place it can be: notes, history, sessions, ledger, jobs,
    an import, a housekeeping run that saw a duplicate pair, an API key for the owner."""
    report = harvest_transcript(store, transcript(ALICE_LINE, cid=f"{MARKER}-c1", owner=OWNER))
    assert report.notes_written >= 1
    owner = Scope.owner(OWNER)
    store.mem_save(OWNER, f"{MARKER} one", type="decision", title=f"{MARKER} db", topic_key="k")
    store.mem_save(OWNER, f"{MARKER} two", type="decision", title=f"{MARKER} db", topic_key="k")
    store.write(owner, {"title": f"Uses {MARKER} daily", "body": MARKER})
    store.write(owner, {"title": f"Uses {MARKER} daily", "body": MARKER})
    record_jobs(
        store,
        [transcript(ALICE_LINE, cid=f"{MARKER}-c2", owner=OWNER)],
        owner=None,
        provenance="compaction",
        queue="harvest",
    )
    with store.transaction() as session:
        job_records.create_import(
            session, source=f"/exports/{MARKER}.zip", owner=OWNER, provenance="import"
        )
    assert store.dedupe().superseded >= 1
    store.create_api_key(owner=OWNER)
    assert MARKER in every_value(store) and OWNER in every_value(store)


def test_after_forget_no_table_or_index_holds_the_owners_words(store: Store) -> None:
    bob = Scope.owner("bob")
    store.write(bob, {"title": "Bob keeps this", "body": "kept"})
    _, everyone = store.create_api_key(owner=None)  # names nobody: it stays
    _, bobs = store.create_api_key(owner="bob")
    fill(store)
    counts = store.forget_owner(OWNER)
    assert counts["notes"] >= 3 and counts["versions"] >= 1 and counts["jobs"] == 1
    assert counts["imports"] == 1 and counts["tombstones"] == 1 and counts["api_keys"] == 1
    dump = every_value(store)
    assert MARKER_TAIL not in dump and OWNER not in dump
    assert store.get(bob, "bob-keeps-this") is not None  # others' notes stay
    assert store.verify_api_key(everyone) is not None and store.verify_api_key(bobs) is not None


def test_a_postgresql_forget_vacuums_every_table_that_held_the_owner(make_store: Any) -> None:
    # A deleted row's bytes stay in PostgreSQL's table file until a vacuum: api_keys, which
    # holds the owner's name, was left out of the forget's VACUUM.
    import time

    store = make_store("postgresql")
    fill(store)
    held = []
    with store.engine.connect() as conn:
        for table in inspect(conn).get_table_names():
            values = " ".join(
                str(v) for row in conn.execute(text(f'SELECT * FROM "{table}"')) for v in row
            )
            if OWNER in values or MARKER in values.lower():
                held.append(table)
        started = conn.execute(text("SELECT now()")).scalar_one()
    assert "api_keys" in held and "memories" in held
    store.forget_owner(OWNER)
    deadline = time.monotonic() + 10  # the statistics show a vacuum a moment after it ran
    while True:
        with store.engine.connect() as conn:
            vacuumed = dict(
                conn.execute(text("SELECT relname, last_vacuum FROM pg_stat_user_tables")).all()
            )
        missing = [t for t in held if vacuumed.get(t) is None or vacuumed[t] < started]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert missing == []


def test_after_forget_no_sqlite_file_holds_the_owners_words(make_store: Any) -> None:
    """On SQLite the files themselves: deleted rows' bytes are overwritten (secure_delete)
    and the write-ahead log is emptied, so no page of the database or its log keeps them."""
    store: Store = make_store("sqlite")
    fill(store)
    store.forget_owner(OWNER)
    url = store.engine.url.database
    assert url is not None
    files = [Path(url), Path(f"{url}-wal")]
    held = b"".join(f.read_bytes() for f in files if f.exists()).lower()
    assert MARKER_TAIL.encode() not in held and OWNER.encode() not in held


def test_a_forgotten_transcript_harvested_again_writes_nothing_unless_asked(
    store: Store,
) -> None:
    chat = transcript(ALICE_LINE, cid="c1", owner=OWNER)
    assert harvest_transcript(store, chat).notes_written >= 1
    store.forget_owner(OWNER)
    again = harvest_transcript(store, chat)
    assert again.status == "skipped" and again.notes_written == 0
    assert store.fingerprint(Scope.owner(OWNER))[0] == 0
    # A new conversation of the same owner is harvested as usual.
    assert harvest_transcript(store, transcript("I use vim.", cid="c2", owner=OWNER)).status == (
        "harvested"
    )

    store.forget_owner(OWNER, tombstones=False)
    assert harvest_transcript(store, chat).notes_written >= 1  # asked: it comes back


def test_a_harvest_running_during_forget_writes_nothing(make_store, backend: str) -> None:
    store: Store = make_store(backend, harvest_model="test/model")

    def llm(messages: Any, *, options: ModelOptions) -> LLMAnswer:
        store.forget_owner(OWNER)  # the operator forgets while the model is thinking
        note = {"type": "preference", "title": "Prefers tabs", "body": "Tabs.", "topics": []}
        return LLMAnswer(text=json.dumps({"notes": [{**note, "confidence": 0.9}]}))

    report = harvest_transcript(store, transcript(ALICE_LINE, owner=OWNER), llm=llm)
    assert report.notes_written == 0 and report.status == "skipped"
    assert report.model_calls == 1  # the call it made is still counted
    assert MARKER_TAIL not in every_value(store) and store.fingerprint(Scope.owner(OWNER))[0] == 0


def test_a_harvest_task_returns_its_status_and_counts_and_nothing_that_names_anyone() -> None:
    from gleaner.workers.tasks import logged_result

    outcome = {
        "status": "harvested",
        "notes_written": 2,
        "model_calls": 1,
        "owner": OWNER,
        "conversation_id": f"{MARKER}-conv",
        "slugs": [f"{MARKER}-slug"],
        "error": MARKER,
    }
    assert logged_result(outcome) == "harvested notes_written=2 model_calls=1"


@pytest.mark.slow
def test_worker_logs_carry_ids_and_counts_not_slugs_or_owners(
    tmp_path: Path, worker_id: str
) -> None:
    from tests.conftest import recreate_pg_database, test_settings

    url = recreate_pg_database(f"gleaner_forget_{worker_id}")
    store = Store(url, settings=test_settings())
    store.migrate()
    cluster = Cluster(cluster_env(url, redis_db_for(worker_id)), tmp_path)
    cluster.redis().flushdb()
    try:
        worker = cluster.start_worker(concurrency=1)
        chat = tmp_path / "chat.json"
        chat.write_text(
            json.dumps(
                {
                    "conversation_id": f"{MARKER}-conv",
                    "owner": OWNER,
                    "messages": [{"role": "user", "content": ALICE_LINE}],
                }
            )
        )
        assert cluster.gleaner("enqueue", str(chat)).returncode == 0
        wait_for(lambda: "succeeded" in worker.text(), 60)
        assert store.fingerprint(Scope.owner(OWNER))[0] >= 1
        log = worker.text().lower()
        assert "notes_written" in log  # the counts are there
        assert MARKER not in log and OWNER not in log
    finally:
        cluster.stop()
        cluster.redis().flushdb()
        store.dispose()


def test_forget_tombstones_the_owners_transcripts_not_harvested_yet(store: Store) -> None:
    waiting = transcript(ALICE_LINE, cid="waiting", owner=OWNER)
    record_jobs(store, [waiting], owner=None, provenance="compaction", queue="harvest")
    counts = store.forget_owner(OWNER)
    assert (counts["jobs"], counts["tombstones"]) == (1, 1)
    again = harvest_transcript(store, waiting)  # enqueued or imported once more
    assert again.status == "skipped" and store.fingerprint(Scope.owner(OWNER))[0] == 0
