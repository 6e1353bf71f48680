"""Every entry point on a fresh database: writers migrate a new SQLite file as ``harvest``
does, readers create no file, a bad broker URL is a bad setting, and no exception chain
carries a transcript's words (SQLAlchemy's statement parameters are hidden)."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pytest
import redis

from gleaner import Gleaner, GleanerError
from gleaner.store import Store
from tests.cli_harness import EXAMPLES, Cli, redis_url_for
from tests.conftest import recreate_pg_database, test_settings

WORD = "Zanzibarquokka"  # in the transcript only: an exception naming it leaked the text
CONVERSATION = {
    "owner": "ann",
    "conversation_id": "c1",
    "messages": [
        {"role": "user", "content": f"Remember: I prefer tea. My cat is called {WORD}."},
        {"role": "assistant", "content": "Noted."},
    ],
}


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Cli:
    monkeypatch.chdir(tmp_path)
    return Cli(monkeypatch, capsys)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def test_the_python_api_on_a_new_sqlite_file_migrates_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/new.db"
    with Gleaner(url, test_settings(database_url=url)) as gleaner:
        job = gleaner.job(gleaner.submit(CONVERSATION))
        assert job.state == "done", job
        assert gleaner.search("ann", "tea")
    with Gleaner(url, test_settings(database_url=url)) as again:  # current: nothing to do
        assert again.search("ann", "tea")


def test_keys_create_on_a_new_sqlite_file_migrates_it(run: Cli, tmp_path: Path) -> None:
    run.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/keys.db")
    ran = run("keys", "create", "--owner", "ann")
    assert ran.code == 0, ran.err
    assert "glk_" in ran.out
    assert (tmp_path / "keys.db").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ("search", "--owner", "ann", "tea"),
        ("index", "--owner", "ann"),
        ("show", "--owner", "ann", "some-note"),
        ("status",),
        ("notes", "list", "--owner", "ann"),
        ("export", "--owner", "ann", "out.jsonl"),
        ("forget", "ann", "--yes"),
        ("keys", "list"),
        ("keys", "revoke", "abc123"),
    ],
)
def test_a_read_command_on_a_missing_sqlite_file_creates_none(
    run: Cli, tmp_path: Path, argv: tuple[str, ...]
) -> None:
    run.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/absent.db")
    ran = run(*argv)
    assert ran.code in (1, 2), ran
    assert not (tmp_path / "absent.db").exists()
    if ran.code == 1:
        assert "no database at" in ran.err and "absent.db" in ran.err


def test_a_broker_url_that_is_not_redis_is_a_bad_setting(run: Cli, tmp_path: Path) -> None:
    run.env(GLEANER_BROKER_URL="http://x", GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/b.db")
    ran = run("enqueue", "--owner", "ann", str(EXAMPLES / "native.json"))
    assert ran.code == 2
    assert "GLEANER_BROKER_URL" in ran.err and "Redis URL" in ran.err


def test_no_exception_chain_holds_the_transcript_on_postgresql(worker_id: str) -> None:
    # An unmigrated database: the first statement that carries the transcript fails.
    url = recreate_pg_database(f"gleaner_entry_{worker_id}")
    store = Store(url, settings=test_settings(database_url=url))
    try:
        with pytest.raises(GleanerError) as raised:
            Gleaner(store=store).submit(CONVERSATION)
        assert raised.value.reason == "not_migrated"
        for exc in _chain(raised.value):
            assert WORD not in str(exc), type(exc)
            assert WORD not in repr(getattr(exc, "params", None))
    finally:
        store.dispose()


def test_no_exception_chain_holds_the_transcript_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/broken.db"
    store = Store(url, settings=test_settings(database_url=url))
    store.migrate()
    with store.engine.begin() as connection:
        connection.exec_driver_sql("DROP TABLE jobs")  # the first write now fails
    try:
        with pytest.raises(GleanerError) as raised:
            Gleaner(store=store).submit(CONVERSATION)
        for exc in _chain(raised.value):
            assert WORD not in str(exc), type(exc)
    finally:
        store.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_imports_lists_each_import_with_its_jobs(
    run: Cli, tmp_path: Path, backend: str, worker_id: str
) -> None:
    url = (
        recreate_pg_database(f"gleaner_imports_{worker_id}")
        if backend == "postgresql"
        else f"sqlite:///{tmp_path}/imports.db"
    )
    broker = redis_url_for(worker_id)  # queued imports are recorded; no worker takes them
    redis.Redis.from_url(broker).flushdb()
    run.env(GLEANER_DATABASE_URL=url, GLEANER_BROKER_URL=broker)
    try:
        assert run("db", "upgrade").code == 0
        assert run("imports").out.strip() == "no imports"
        claude = str(EXAMPLES / "claude-export")
        first = run("import", claude, "--owner", "ann", "--no-wait")
        second = run("import", str(EXAMPLES / "chatgpt-export"), "--owner", "bob", "--no-wait")
        assert first.code == 0 and second.code == 0, (first.err, second.err)

        listed = run("imports", "--json")
        assert listed.code == 0, listed.err
        found = listed.json()
        assert [batch["owner"] for batch in found] == ["bob", "ann"]  # newest first
        assert found[0]["total"] == 2 and found[0]["jobs"]["pending"] == 2
        assert found[0]["source"].endswith("chatgpt-export")
        assert run("imports", "--limit", "1", "--json").json() == found[:1]
        text = run("imports").out.splitlines()
        assert len(text) == 2 and text[0].startswith(found[0]["import_id"][:8])
        assert run("status", "--json").json()["imports"] == found
    finally:
        redis.Redis.from_url(broker).flushdb()


def test_the_hook_the_cli_and_mcp_share_one_default_file(
    run: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import sys

    from tests.test_claude_code import SESSION, hook_json

    data = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))  # no GLEANER_DATABASE_URL (run unset it)
    project = tmp_path / "some-project"
    project.mkdir()
    monkeypatch.chdir(project)  # the hook runs in whatever folder the agent is in
    monkeypatch.setattr(sys, "stdin", io.StringIO(hook_json(SESSION)))
    hooked = run("hook", "claude-code", "--owner", "alice")
    assert hooked.code == 0, hooked.err
    assert (data / "gleaner" / "gleaner.db").exists()
    assert not list(project.iterdir())  # no database left in the project

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    found = run("search", "--owner", "alice", "psycopg", "--json")
    assert found.code == 0 and found.json(), found.err
    with Gleaner() as gleaner:  # what `gleaner mcp` and the Python API open
        assert gleaner.store.database_url == f"sqlite:///{data / 'gleaner' / 'gleaner.db'}"
        assert gleaner.search("alice", "psycopg")


@pytest.mark.slow
def test_ctrl_c_stops_an_import_in_process_on_sqlite_at_once(tmp_path: Path) -> None:
    """Ctrl-C lands anywhere, a database call included (on SQLite under load that once left
    the write lock held and the import running on for minutes): each time the import exits
    130 within 2 s, and a rerun does the rest."""
    import signal
    import subprocess
    import sys
    import time

    from tests.samples import write_chatgpt_export

    # Enough that an import outlasts the longest delay below on a fast machine (~800/s).
    export = write_chatgpt_export(tmp_path / "export", 2000, facts=4)
    url = f"sqlite:///{tmp_path}/ctrl-c.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    env |= {"GLEANER_DATABASE_URL": url, "GLEANER_PROGRESS_SECONDS": "0.1"}
    command = [sys.executable, "-m", "gleaner.cli", "import", str(export), "--owner", "ann"]
    for delay in (0.0, 0.15, 0.3, 0.6):
        importing = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert importing.stderr is not None
        while not re.search(r"importing: [1-9]", importing.stderr.readline()):  # under way
            assert importing.poll() is None
        time.sleep(delay)  # not a wait: where in the import the interrupt lands is the variable
        asked = time.monotonic()
        importing.send_signal(signal.SIGINT)
        _, err = importing.communicate(timeout=60)
        assert importing.returncode == 130, err[-2000:]
        assert time.monotonic() - asked < 2.0  # the promise is a bound: "at once"
        assert "FAILED" not in err
    rest = subprocess.run(
        [*command, "--json"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert rest.returncode == 0, rest.stderr[-2000:]
    summary = json.loads(rest.stdout)
    assert summary["transcripts"] == 2000 and summary["skipped"] > 0


def test_import_no_wait_without_a_broker_says_it_runs_in_process(run: Cli, tmp_path: Path) -> None:
    run.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/nw.db")
    ran = run("import", str(EXAMPLES / "claude-export"), "--owner", "ann", "--no-wait")
    assert ran.code == 0, ran.err
    assert "no broker" in ran.err and "in process" in ran.err
    assert "notes written" in ran.out  # done here, before the command returned


def test_a_worker_on_an_unmigrated_database_refuses_to_start(
    tmp_path: Path, worker_id: str
) -> None:
    import subprocess
    import sys

    url = recreate_pg_database(f"gleaner_worker_unmigrated_{worker_id}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    env |= {"GLEANER_DATABASE_URL": url, "GLEANER_BROKER_URL": redis_url_for(worker_id)}
    ran = subprocess.run(
        [sys.executable, "-m", "gleaner.cli", "worker", "--queues", "harvest"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 1, ran.stderr[-2000:]
    assert "not_migrated" in ran.stderr and "gleaner db upgrade" in ran.stderr
    assert "ready" not in ran.stderr


def test_a_refused_postgresql_connection_says_what_to_do(run: Cli) -> None:
    with socket.socket() as probe:  # a port where nothing listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    run.env(GLEANER_DATABASE_URL=f"postgresql+psycopg://postgres@127.0.0.1:{port}/gleaner")
    ran = run("status")
    assert ran.code == 1
    assert "Connection refused" in ran.err and "GLEANER_DATABASE_URL" in ran.err
    assert len(ran.err.strip().splitlines()) == 1


def test_enqueue_to_a_broker_that_refuses_fails_within_a_second(run: Cli, tmp_path: Path) -> None:
    import time

    from tests.cli_harness import dead_broker_url

    run.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/down.db")
    assert run("db", "upgrade").code == 0
    run.env(GLEANER_BROKER_URL=dead_broker_url())
    started = time.monotonic()
    ran = run("enqueue", "--owner", "ann", str(EXAMPLES / "native.json"))
    took = time.monotonic() - started
    assert ran.code == 1 and "broker_unavailable" in ran.err and "1 job(s) recorded" in ran.err
    # A bound is the promise. README: within a second (kombu's default retries took 6 s).
    assert took < 2.0, took
