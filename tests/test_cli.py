"""The `gleaner` command against an empty SQLite file and PostgreSQL: run in process through
``cli.main`` (fast), and once per command as a real subprocess (slow tier)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli_harness import EXAMPLES, Cli, cli, gleaner_process
from tests.conftest import head_revision, recreate_pg_database

__all__ = ["cli"]  # the fixture, used by name


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path, worker_id: str) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/empty.db"
    return recreate_pg_database(f"gleaner_cli_{worker_id}")


def test_upgrade_then_search_and_show(cli: Cli, fresh_url: str) -> None:
    cli.env(GLEANER_DATABASE_URL=fresh_url)
    upgraded = cli("db", "upgrade")
    assert upgraded.code == 0, upgraded.err
    assert f"revision {head_revision()}" in upgraded.out

    empty = cli("search", "--owner", "alice", "anything", "--json")
    assert empty.code == 0, empty.err
    assert empty.json() == []

    from gleaner.store import Store
    from tests.conftest import test_settings

    store = Store(fresh_url, settings=test_settings())
    store.write(
        ("owner", "alice"),
        {"title": "Prefers dark mode", "body": "Uses dark themes", "topics": ["ui"]},
    )
    store.write(("owner", "alice"), {"title": "Old theme", "body": "light theme"})
    store.link(("owner", "alice"), "prefers-dark-mode", "old-theme", "supersedes")
    store.dispose()

    hits = cli("search", "dark", "--owner", "alice", "--json").json()
    assert [h["slug"] for h in hits] == ["prefers-dark-mode"]
    for key in ("slug", "title", "body", "topics", "type", "provenance", "pinned", "score"):
        assert key in hits[0]
    assert "snippet" in hits[0]
    assert hits[0]["topics"] == ["ui"] and hits[0]["provenance"] == "agent"

    note = cli("show", "old-theme", "--owner", "alice", "--json").json()
    assert note["superseded_by"] == "prefers-dark-mode"
    assert note["backlinks"] == [{"rel": "supersedes", "slug": "prefers-dark-mode"}]
    assert note["links"] == []

    assert "prefers-dark-mode" in cli("search", "dark", "--owner", "alice").out


def test_exit_codes(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/cli.db")
    assert cli("db", "upgrade").code == 0
    no_scope = cli("search", "x")
    assert no_scope.code == 2 and "--owner NAME or --global" in no_scope.err
    missing = cli("show", "nope", "--global")
    assert missing.code == 1 and "not_found" in missing.err
    cli.env(GLEANER_HALF_LIFE_DAYS="-3")
    bad = cli("search", "x", "--global")
    assert bad.code == 2 and "GLEANER_HALF_LIFE_DAYS" in bad.err
    cli.env(GLEANER_HALF_LIFE_DAYS="30")
    bad_limit = cli("search", "x", "--global", "--limit", "0")
    assert bad_limit.code == 2 and "bad_limit" in bad_limit.err
    unknown = cli("frobnicate")
    assert unknown.code == 2 and "invalid choice" in unknown.err
    for ran in (no_scope, missing, bad, bad_limit):
        assert "Traceback" not in ran.err


def test_help_documents_the_exit_statuses(cli: Cli) -> None:
    shown = cli("--help")
    assert shown.code == 0
    for status in ("0 ", "1 ", "2 ", "130", "141"):
        assert f"  {status}" in shown.out.split("exit status:")[1]


def test_unmigrated_database_says_to_upgrade(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "never.db").touch()  # a file, never migrated (none at all: test_entry_points)
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/never.db")
    result = cli("search", "x", "--owner", "a")
    assert result.code == 1
    assert "gleaner db upgrade" in result.err and len(result.err.splitlines()) == 1


def test_operator_commands_without_a_broker(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/ops.db")
    assert cli("db", "upgrade").code == 0

    export = str(EXAMPLES / "chatgpt-export")
    ownerless = cli("import", export, "--dry-run", "--json")
    assert ownerless.code == 2 and "--owner" in ownerless.err  # as the real run
    estimate = cli("import", export, "--dry-run", "--json", "--owner", "ann")
    assert estimate.code == 0, estimate.err
    assert estimate.json()["conversations"] == 2

    no_owner = cli("import", str(EXAMPLES / "claude-export"))
    assert no_owner.code == 2 and "--owner" in no_owner.err

    imported = cli("import", str(EXAMPLES / "claude-export"), "--owner", "ann", "--json")
    summary = imported.json()
    assert imported.code == 0 and summary["notes_written"] >= 2
    for key in (
        "transcripts",
        "notes_written",
        "notes_updated",
        "skipped",
        "failed",
        "model_calls",
        "prompt_tokens",
        "completion_tokens",
    ):
        assert key in summary

    no_broker = cli("enqueue", str(EXAMPLES / "native.json"))
    assert no_broker.code == 2 and "GLEANER_BROKER_URL" in no_broker.err

    status = cli("status", "--json").json()
    assert status["broker"] is False and status["harvested"]["transcripts"] == summary["harvested"]

    decay = cli("housekeep", "decay", "--json").json()
    assert decay["dry_run"] is False and decay["updated"] >= 0
    assert cli("housekeep", "dedupe", "--dry-run", "--json").json()["dry_run"] is True

    assert "no failed or stranded job" in cli("retry", "--all").out

    refused = cli("forget", "--owner", "ann")
    assert refused.code == 2 and "--yes" in refused.err
    forgot = cli("forget", "--owner", "ann", "--yes")
    assert forgot.code == 0 and f"notes {summary['notes_written']}" in forgot.out
    assert cli("search", "pgbouncer", "--owner", "ann", "--json").json() == []


def test_housekeeping_dry_runs_say_what_they_would_do(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/hk.db")
    assert cli("harvest", str(EXAMPLES / "native.json")).code == 0
    dry = cli("housekeep", "decay", "--dry-run")
    assert dry.code == 0
    assert "would update" in dry.out and "nothing changed" in dry.out
    assert "updated" not in dry.out.replace("would update", "")
    real = cli("housekeep", "decay")
    assert "updated" in real.out and "would" not in real.out
    assert "would supersede" in cli("housekeep", "dedupe", "--dry-run").out
    refused = cli("housekeep", "requeue", "--dry-run")
    assert refused.code == 2 and "no --dry-run" in refused.err


@pytest.mark.slow
def test_each_command_as_a_real_process(tmp_path: Path) -> None:
    """One subprocess per command: the console entry point, imports and exit statuses."""
    env = {"GLEANER_DATABASE_URL": f"sqlite:///{tmp_path}/proc.db"}

    def run(*args: str) -> tuple[int, str, str]:
        done = gleaner_process(*args, env=env, cwd=tmp_path)
        return done.returncode, done.stdout, done.stderr

    assert run("db", "upgrade")[0] == 0
    code, out, err = run("harvest", str(EXAMPLES / "native.json"), "--json")
    assert code == 0, err
    assert run("search", "tabs", "--owner", "alice")[0] == 0
    code, out, _ = run("search", "tabs", "--owner", "alice", "--json")
    slug = json.loads(out)[0]["slug"]
    assert run("show", slug, "--owner", "alice")[0] == 0
    assert run("import", str(EXAMPLES / "claude-export"), "--dry-run", "--owner", "ann")[0] == 0
    assert run("import", str(EXAMPLES / "claude-export"), "--owner", "ann")[0] == 0
    assert run("enqueue", str(EXAMPLES / "native.json"))[0] == 2  # no broker
    assert run("status")[0] == 0
    assert run("housekeep", "decay", "--dry-run")[0] == 0
    assert run("retry", "--all")[0] == 0
    assert run("forget", "--owner", "ann", "--yes")[0] == 0
    code, _, err = run("search", "x")
    assert code == 2 and "Traceback" not in err


def test_keys_create_list_and_revoke(cli: Cli, fresh_url: str) -> None:
    from gleaner import Gleaner

    cli.env(GLEANER_DATABASE_URL=fresh_url)
    assert cli("db", "upgrade").code == 0
    # No owner named: a usage error, and no key made (an all-owners key takes --all-owners).
    refused = cli("keys", "create")
    assert refused.code == 2 and "--owner NAME or --all-owners" in refused.err
    assert cli("keys", "list", "--json").json() == []
    made = cli("keys", "create", "--owner", "alice", "--json")
    assert made.code == 0, made.err
    alice = made.json()
    everyone = cli("keys", "create", "--all-owners", "--json").json()
    gleaner = Gleaner(database_url=fresh_url)
    try:
        key = gleaner.verify_api_key(alice["token"])
        assert key is not None and key.allows("alice") and not key.allows("bob")
        wide = gleaner.verify_api_key(everyone["token"])
        assert wide is not None and wide.owner is None and wide.allows("bob")
        listed = cli("keys", "list")
        assert f"{alice['id']}  read-write" in listed.out and 'owner "alice"' in listed.out
        assert f"{everyone['id']}  read-write" in listed.out and "  all owners" in listed.out
        assert alice["token"] not in listed.out and everyone["token"] not in listed.out
        assert all("token" not in k for k in cli("keys", "list", "--json").json())
        revoked = cli("keys", "revoke", alice["id"])
        assert revoked.code == 0 and f'revoked key {alice["id"]} (owner "alice")' in revoked.out
        assert gleaner.verify_api_key(alice["token"]) is None
        assert [k["id"] for k in cli("keys", "list", "--json").json()] == [everyone["id"]]
    finally:
        gleaner.close()
