"""The worker process's store across Celery's fork: built and warmed in the main process
before the pool starts, inherited by each child with a connection pool of its own.

Each test runs in a fresh interpreter, as a worker does, against the real PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent

# Runs the worker's two signals as Celery sends them: worker_init in the main process, then
# worker_process_init in a forked child.
FORKED = """
import os, sys
from celery.signals import worker_init, worker_process_init
import workers.app  # noqa: F401  (as `gleaner worker` does before starting Celery)
from sqlalchemy import text
from workers import runtime

assert "harvest.queue" not in sys.modules and "psycopg" not in sys.modules
worker_init.send(sender=None)
# The task's import chain and the database driver are paid before forking.
assert {"harvest.queue", "store.models", "psycopg"} <= set(sys.modules), "not warmed"
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


@pytest.mark.parametrize("model", ["", "openai/gpt-4o-mini"])
def test_child_inherits_the_warm_store_with_its_own_connections(pg_url: str, model: str) -> None:
    env = {"GLEANER_HARVEST_MODEL": model, "GLEANER_HARVEST_LLM": "auto"} if model else {}
    done = _run(FORKED, pg_url, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ok", "parent", "ok"], done.stdout + done.stderr
