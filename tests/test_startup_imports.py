"""The read commands load only what they use: each runs in a fresh interpreter on SQLite,
and what it imported is checked against what only writes, migrations, PostgreSQL, the
model or the broker need. Start-up is most of such a command's time (README, "Benchmarks":
``python -m bench --only startup``), so an import that creeps back fails here first."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from importlib import import_module

import pytest

from gleaner.cli import COMMAND_GROUPS, build_parser
from gleaner.store import Scope, Store
from tests.conftest import test_settings

# Loaded by a read command on SQLite, none of these would be used: the ORM and the models
# (reads go through Core, store.schema.tables), the write path, migrations, the PostgreSQL dialect
# and driver, the harvester, the model client, the broker, the terminal UI.
NEVER_LOADED = (
    "sqlalchemy.orm",
    "gleaner.store.schema.models",
    "gleaner.store.notes.writer",
    "alembic",
    "sqlalchemy.dialects.postgresql",
    "psycopg",
    "harvest",
    "litellm",
    "celery",
    "kombu",
    "rich",
)
# Runs one command as `gleaner` would, then says what it loaded of NEVER_LOADED.
PROBE = """
import json, sys
prelude, never = sys.argv[1], json.loads(sys.argv[2])
exec(prelude)
from gleaner.cli import main
code = main(sys.argv[3:])
loaded = sorted(
    name for name in sys.modules
    if any(name == n or name.startswith(n + ".") for n in never)
)
print("\\nPROBE " + json.dumps({"code": code, "loaded": loaded}))
"""
READ_COMMANDS = {
    "search": (["search", "pgbouncer", "--owner", "alice"], "uses-pgbouncer"),
    "search --json --explain": (
        ["search", "pgbouncer", "--owner", "alice", "--json", "--explain"],
        '"backend": "bm25"',
    ),
    "index": (["index", "--owner", "alice"], "<gleaner-memory-index"),
    "notes list": (["notes", "list", "--owner", "alice", "--status", "all"], "prefers-tabs"),
    "status": (["status"], "harvested transcripts 0"),
    "status --json": (["status", "--json"], '"harvested"'),
}


@pytest.fixture(scope="module")
def database(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('startup') / 'gleaner.db'}"
    store = Store(url, settings=test_settings())
    store.migrate()
    alice = Scope.owner("alice")
    store.write(alice, {"title": "Uses pgbouncer", "body": "In transaction mode.", "pinned": True})
    store.write(alice, {"title": "Prefers tabs", "body": "Four wide."})
    store.dispose()
    return url


def probe(database: str, argv: list[str], prelude: str = "") -> tuple[int, list[str], str]:
    """Run ``gleaner ARGV`` in a fresh interpreter on ``database``: its exit status, the
    NEVER_LOADED modules it imported, and its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    env.update(GLEANER_DATABASE_URL=database, LITELLM_LOCAL_MODEL_COST_MAP="True")
    ran = subprocess.run(
        [sys.executable, "-c", PROBE, prelude, json.dumps(NEVER_LOADED), *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out, _, last = ran.stdout.rpartition("\nPROBE ")
    assert last, f"the probe did not finish: {ran.stderr}"
    found = json.loads(last)
    return found["code"], found["loaded"], out


@pytest.mark.parametrize("command", sorted(READ_COMMANDS))
def test_a_read_command_loads_only_what_it_uses(database: str, command: str) -> None:
    argv, shown = READ_COMMANDS[command]
    code, loaded, out = probe(database, argv)
    assert code == 0 and shown in out  # it did its work: the imports below were all it took
    assert loaded == []


def test_the_probe_sees_an_import_come_back(database: str) -> None:
    """The check can fail: the ORM imported along the way is reported."""
    code, loaded, _ = probe(database, READ_COMMANDS["search"][0], prelude="import sqlalchemy.orm")
    assert code == 0
    assert "sqlalchemy.orm" in loaded


def loads(code: str, *modules: str) -> list[str]:
    """Which of ``modules`` running ``code`` in a fresh interpreter imports."""
    check = f"{code}\nimport sys\nprint([m for m in {list(modules)!r} if m in sys.modules])"
    ran = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    found: list[str] = json.loads(ran.stdout.strip().replace("'", '"'))
    return found


def test_importing_the_store_loads_only_what_is_asked_for() -> None:
    assert loads("from gleaner import store", "pydantic", "sqlalchemy") == []
    searching = loads(
        "import gleaner.store.recall.search", "sqlalchemy.orm", "gleaner.store.schema.models"
    )
    assert searching == []
    assert loads("import gleaner.store.recall.search", "gleaner.store.api") == []
    assert loads("from gleaner.store import Store", "sqlalchemy.orm") == []  # a session: the ORM
    assert (
        loads("from gleaner.store import Scope", "gleaner.store.schema.models", "gleaner.store.api")
        == []
    )


def test_every_public_name_of_the_store_is_there() -> None:
    """Names imported on first use (PEP 562) are still the package's, each from its home."""
    from gleaner import store

    for name in store.__all__:
        value = getattr(store, name)
        assert value is not None, name
    from gleaner.store import Note, Settings, Store, load_settings
    from gleaner.store.api import Store as Home
    from gleaner.store.schemas import Note as NoteHome
    from gleaner.store.settings import Settings as SettingsHome
    from gleaner.store.settings import load_settings as load_home

    assert (Store, Note, Settings, load_settings) == (Home, NoteHome, SettingsHome, load_home)
    with pytest.raises(AttributeError):
        store.no_such_name  # noqa: B018


def test_a_command_builds_only_its_groups_parser() -> None:
    """COMMAND_GROUPS names what each group registers, so a command line naming a command
    builds that group's parser alone, which parses it as the full parser does."""
    listed = []
    for group, names in COMMAND_GROUPS.items():
        sub = argparse.ArgumentParser().add_subparsers()
        import_module(f"gleaner.cli.{group}").register(sub)
        assert tuple(sub.choices) == names, group
        listed.extend(names)
    assert len(listed) == len(set(listed))
    commands = (["search", "x", "--owner", "a"], ["status", "--json"], ["db", "upgrade"])
    for argv in commands:
        alone, full = build_parser(argv[0]).parse_args(argv), build_parser().parse_args(argv)
        assert vars(alone) == vars(full)
    code = (
        "import sys\nfrom gleaner.cli import main\n"
        "try:\n    main(sys.argv[1:])\nfinally:\n    print(sorted(sys.modules))"
    )
    argv = [sys.executable, "-c", code, "search", "--help"]
    ran = subprocess.run(argv, check=False, capture_output=True, text=True)
    assert ran.returncode == 0 and "usage: gleaner search" in ran.stdout
    assert "gleaner.cli.read" in ran.stdout and "gleaner.cli.operate" not in ran.stdout
