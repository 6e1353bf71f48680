"""The worker process's store across Celery's fork: built and warmed in the main process
before the pool starts, inherited by each child with a connection pool of its own.

Each test runs in a fresh interpreter, as a worker does, against the real PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from gleaner.store import Store
from tests.llm_server import answer, llm_server, note

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent

# Runs the worker's two signals as Celery sends them: worker_init in the main process, then
# worker_process_init in a forked child.
FORKED = """
import os, sys
from celery.signals import worker_init, worker_process_init
import gleaner.workers.app  # noqa: F401  (as `gleaner worker` does before starting Celery)
from sqlalchemy import text
from gleaner.workers import runtime

assert "gleaner.harvest.queue" not in sys.modules and "psycopg" not in sys.modules
worker_init.send(sender=None)
# The task's import chain and the database driver are paid before forking.
warmed = {"gleaner.harvest.queue", "gleaner.store.schema.models", "psycopg"}
assert warmed <= set(sys.modules), "not warmed"
parent = runtime.store()
with parent.engine.connect() as conn:  # the main process holds a pooled connection
    parent_backend = conn.execute(text("select pg_backend_pid()")).scalar()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    worker_process_init.send(sender=None)
    child = runtime.store()
    ok = child is parent and child.engine.pool.checkedin() == 0
    with child.engine.connect() as conn:
        ok = ok and conn.execute(text("select pg_backend_pid()")).scalar() != parent_backend
    os.write(write, b"ok" if ok else b"shared")
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(read, 16).decode())
# The child dropped the inherited connection without closing it: the parent's still works.
with parent.engine.connect() as conn:
    assert conn.execute(text("select pg_backend_pid()")).scalar() == parent_backend
print("parent ok")
"""


def _run(code: str, database_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env={
            **environment,
            "GLEANER_DATABASE_URL": database_url,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONPATH": str(ROOT),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# With a model the warm-up imports litellm too (seconds in a fresh interpreter): slow; the
# fast tier keeps the fork's promise (the child's own connections) on the offline harvester.
@pytest.mark.parametrize("model", ["", pytest.param("openai/gpt-4o-mini", marks=pytest.mark.slow)])
def test_child_inherits_the_warm_store_with_its_own_connections(pg_url: str, model: str) -> None:
    env = {"GLEANER_HARVEST_MODEL": model, "GLEANER_HARVEST_LLM": "auto"} if model else {}
    done = _run(FORKED, pg_url, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "parent", "ok"], done.stdout + done.stderr


# The worker's warm-up, then one harvest job through the model path in the same process (a
# forked child inherits exactly this state): what of the store the job still has to import.
WARMED_JOB = """
import sys
from celery.signals import worker_init
import gleaner.workers.app  # noqa: F401  (as `gleaner worker` does before starting Celery)
from gleaner.harvest.queue import record_jobs, run_job
from gleaner.harvest.transcript import Transcript
from gleaner.store.schema.models import Base
from gleaner.workers import runtime

worker_init.send(sender=None)
# SQLAlchemy's own flag: mappers added since the last configuration (none left).
assert not Base.registry._new_mappers, "mappers not configured before the fork"
store = runtime.store()
transcript = Transcript.model_validate({
    "conversation_id": "warm-1", "owner": "alice", "ended_at": "2024-05-01T10:00:00Z",
    "messages": [{"role": "user", "content": "I always use vim with the dvorak keymap."}],
})
(job_id,) = record_jobs(store, [transcript], owner=None, provenance="compaction", queue="x")
imported = set(sys.modules)  # the producer's modules are not the worker's
print(run_job(store, job_id)["status"])
write_path = (
    "gleaner.store.jobs.queue",
    "gleaner.store.jobs.locks",
    "gleaner.store.jobs.ledger",
    "gleaner.store.owners.forget",
    "gleaner.store.notes.write",
)
for name in sorted(set(sys.modules) - imported):
    if name.startswith(write_path):
        print("imported by the job:", name)
"""


def test_a_warm_worker_child_imports_nothing_of_the_write_path_for_its_first_job(
    make_store: Callable[..., Store],
) -> None:
    """The modules a harvest job runs (the claim, the locks, the ledger, the lookups, the
    writer) are imported, and the ORM's mappers configured, in the main process before the
    pool forks: no child pays for them on its first job."""
    store = make_store("postgresql")
    with llm_server(answer([note("Uses vim with the dvorak keymap")])) as server:
        done = _run(
            WARMED_JOB,
            store.database_url,
            GLEANER_HARVEST_MODEL="openai/test-model",
            GLEANER_HARVEST_API_BASE=server.api_base,
            GLEANER_HARVEST_API_KEY="test-key",
        )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "harvested", done.stdout + done.stderr
    assert lines[1:] == [], lines
