"""Shared fixtures: a migrated store on real PostgreSQL and on SQLite, clean for every test.

PostgreSQL comes from GLEANER_TEST_PG_URL (default: the local trust-auth server); the suite
creates its own database there (one per xdist worker) and migrates it with Alembic once.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
# The default database lives in the user's data directory: the suite (and every process it
# starts) gets a folder of its own there, never the developer's memory.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="gleaner-test-data-")

from gleaner.store import Settings, Store

TEST_DATA_HOME = Path(os.environ["XDG_DATA_HOME"])


def _own_redis() -> subprocess.Popen[bytes] | None:
    """A Redis server of this test process's own, on a free loopback port (the harnesses
    read GLEANER_TEST_REDIS_URL, set here, when imported): the suite flushes the databases
    it uses, so it never runs on a Redis that may hold someone's data. None when
    GLEANER_TEST_REDIS_URL names one already (that Redis is the caller's choice) or no
    redis-server is installed (then 127.0.0.1:6379, as before)."""
    if "GLEANER_TEST_REDIS_URL" in os.environ or shutil.which("redis-server") is None:
        return None
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    options = {"port": str(port), "bind": "127.0.0.1", "save": "", "appendonly": "no"}
    server = subprocess.Popen(
        ["redis-server", *(part for k, v in options.items() for part in (f"--{k}", v))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}"
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()
    os.environ["GLEANER_TEST_REDIS_URL"] = url
    atexit.register(server.terminate)
    return server


OWN_REDIS = _own_redis()
# The PostgreSQL databases this process made (``recreate_pg_database``): dropped at its end.
CREATED_DATABASES: set[str] = set()
PG_BASE_URL = os.environ.get(
    "GLEANER_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
TABLES = (
    "memory_terms",
    "search_postings",
    "memory_vectors",
    "embedding_usage",
    "model_spend",
    "memory_links",
    "memory_versions",
    "forgotten_transcripts",
    "forgotten_owners",
    "forgotten_conversations",
    "sessions",
    "harvest_ledger",
    "jobs",
    "imports",
    "housekeeping_state",
    "memories",
    "api_keys",
)


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    from gleaner.store.db import MIGRATIONS

    head = ScriptDirectory(str(MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def pg_url_for(name: str) -> str:
    return make_url(PG_BASE_URL).set(database=name).render_as_string(hide_password=False)


def recreate_pg_database(name: str, template: str | None = None) -> str:
    """An empty database ``name`` (a copy of ``template`` when given); its URL."""
    admin = create_engine(PG_BASE_URL, isolation_level="AUTOCOMMIT")
    copy = f' TEMPLATE "{template}" STRATEGY WAL_LOG' if template else ""
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"{copy}'))
        # A commit waits for no disk flush (4 ms each on these machines, thousands a run):
        # a test never outlives a server crash, which is all that this setting gives up.
        conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    admin.dispose()
    CREATED_DATABASES.add(name)
    return pg_url_for(name)


# The database this process migrates once (``migrated_pg_database``), copied for each
# migrated database a test asks for.
_MIGRATED_TEMPLATE: list[str] = []


def migrated_pg_database(name: str) -> str:
    """A fresh PostgreSQL database ``name`` at the newest revision; its URL. A copy of one
    this process migrated once: a copy takes a twentieth of a second, a migration seconds.
    Nothing in it was ever analyzed or counted (statistics belong to the new database)."""
    if not _MIGRATED_TEMPLATE:
        template = f"gleaner_template_{run_id()}"
        store = Store(recreate_pg_database(template), settings=test_settings())
        store.migrate()
        store.dispose()
        _MIGRATED_TEMPLATE.append(template)
    return recreate_pg_database(name, template=_MIGRATED_TEMPLATE[0])


def run_id() -> str:
    """Names this run's databases: the xdist worker plus the checkout, so two checkouts (or
    workers) testing against one server never share a database."""
    checkout = hashlib.sha256(str(Path(__file__).resolve()).encode()).hexdigest()[:6]
    suffix = os.environ.get("GLEANER_TEST_DB_SUFFIX", "")  # a second run in the same checkout
    return f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{checkout}{suffix}"


def test_settings(**overrides: object) -> Settings:
    """Settings for tests: defaults, never the caller's GLEANER_* environment."""
    return Settings(_env_prefix="GLEANER_TEST_UNUSED_", **overrides)  # type: ignore[call-arg]


test_settings.__test__ = False  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def pg_url(worker_id: str) -> str:
    return migrated_pg_database(f"gleaner_test_{worker_id}")


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.db"
    store = Store(f"sqlite:///{path}", settings=test_settings())
    store.migrate()
    store.dispose()
    return path


@pytest.fixture(scope="session")
def worker_id() -> str:
    """``run_id()``: this run's part of every database name."""
    return run_id()


# One engine per database the suite cleans, kept for the run: a test's clean is then one
# round trip on a pooled connection.
_CLEANERS: dict[str, tuple[Engine, str]] = {}


def _clean_pg(url: str) -> None:
    """Empty every table the schema has and restart its sequences. DELETE, not TRUNCATE: a
    TRUNCATE makes a new file for each table and its indexes, about ten times the time on
    the few rows a test leaves (the run's dead rows are dropped with its database)."""
    if url not in _CLEANERS:
        engine = create_engine(url)
        with engine.connect() as conn:
            sequences = conn.execute(
                text("SELECT sequence_name FROM information_schema.sequences")
            ).scalars()
            restarts = [f"ALTER SEQUENCE {name} RESTART" for name in sequences]
        _CLEANERS[url] = engine, "; ".join([*(f"DELETE FROM {t}" for t in TABLES), *restarts])
    engine, statements = _CLEANERS[url]
    with engine.begin() as conn:
        conn.exec_driver_sql(statements)


@pytest.fixture
def make_store(
    request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path
) -> Iterator[object]:
    """Factory: ``make_store(backend, **settings)`` -> a clean, migrated Store."""
    opened: list[Store] = []

    def factory(backend: str, **overrides: object) -> Store:
        if backend == "postgresql":
            url = request.getfixturevalue("pg_url")
            if not opened:
                _clean_pg(url)
        else:
            path = tmp_path / "gleaner.store.db"
            if not path.exists():
                shutil.copy(sqlite_template, path)
            url = f"sqlite:///{path}"
        store = Store(url, settings=test_settings(**overrides))
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store(make_store, backend: str) -> Store:  # type: ignore[no-untyped-def]
    """A clean, migrated store on each backend."""
    return make_store(backend)  # type: ignore[no-any-return]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Leave nothing behind: the data directory, the databases made, the own Redis."""
    shutil.rmtree(TEST_DATA_HOME, ignore_errors=True)
    for engine, _ in _CLEANERS.values():
        engine.dispose()
    if CREATED_DATABASES:
        admin = create_engine(PG_BASE_URL, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                for name in sorted(CREATED_DATABASES):
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        finally:
            admin.dispose()
        CREATED_DATABASES.clear()
    if OWN_REDIS is not None:
        OWN_REDIS.terminate()
