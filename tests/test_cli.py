"""The `gleaner` command, run as a subprocess against an empty SQLite file and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import head_revision, recreate_pg_database


def gleaner(*args: str, url: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        env={**clean, "GLEANER_DATABASE_URL": url, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path, worker_id: str) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/empty.db"
    return recreate_pg_database(f"gleaner_cli_{worker_id}")


def test_upgrade_then_search_and_show(fresh_url: str, tmp_path: Path) -> None:
    upgraded = gleaner("db", "upgrade", url=fresh_url, cwd=tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"revision {head_revision()}" in upgraded.stdout

    empty = gleaner("search", "--owner", "alice", "anything", "--json", url=fresh_url, cwd=tmp_path)
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == []

    from store import Store
    from tests.conftest import test_settings

    store = Store(fresh_url, settings=test_settings())
    store.write(
        ("owner", "alice"),
        {"title": "Prefers dark mode", "body": "Uses dark themes", "topics": ["ui"]},
    )
    store.write(("owner", "alice"), {"title": "Old theme", "body": "light theme"})
    store.link(("owner", "alice"), "prefers-dark-mode", "old-theme", "supersedes")
    store.dispose()

    found = gleaner("search", "dark", "--owner", "alice", "--json", url=fresh_url, cwd=tmp_path)
    hits = json.loads(found.stdout)
    assert [h["slug"] for h in hits] == ["prefers-dark-mode"]
    for key in (
        "slug",
        "title",
        "body",
        "topics",
        "type",
        "provenance",
        "pinned",
        "score",
        "snippet",
    ):
        assert key in hits[0]
    assert hits[0]["topics"] == ["ui"] and hits[0]["provenance"] == "agent"

    shown = gleaner("show", "old-theme", "--owner", "alice", "--json", url=fresh_url, cwd=tmp_path)
    note = json.loads(shown.stdout)
    assert note["superseded_by"] == "prefers-dark-mode"
    assert note["backlinks"] == [{"rel": "supersedes", "slug": "prefers-dark-mode"}]
    assert note["links"] == []

    text_out = gleaner("search", "dark", "--owner", "alice", url=fresh_url, cwd=tmp_path)
    assert "prefers-dark-mode" in text_out.stdout


def test_exit_codes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/cli.db"
    assert gleaner("db", "upgrade", url=url, cwd=tmp_path).returncode == 0
    no_scope = gleaner("search", "x", url=url, cwd=tmp_path)
    assert no_scope.returncode == 2 and "--owner NAME or --global" in no_scope.stderr
    missing = gleaner("show", "nope", "--global", url=url, cwd=tmp_path)
    assert missing.returncode == 1 and "not_found" in missing.stderr
    bad = gleaner("search", "x", "--global", url=url, cwd=tmp_path, GLEANER_HALF_LIFE_DAYS="-3")
    assert bad.returncode == 2 and "GLEANER_HALF_LIFE_DAYS" in bad.stderr
    bad_limit = gleaner("search", "x", "--global", "--limit", "0", url=url, cwd=tmp_path)
    assert bad_limit.returncode == 2 and "bad_limit" in bad_limit.stderr


def test_unmigrated_database_says_to_upgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/never.db"
    result = gleaner("search", "x", "--owner", "a", url=url, cwd=tmp_path)
    assert result.returncode == 1
    assert "gleaner db upgrade" in result.stderr


EXAMPLES = Path(__file__).parent.parent / "examples"


def test_operator_commands_without_a_broker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ops.db"
    assert gleaner("db", "upgrade", url=url, cwd=tmp_path).returncode == 0

    estimate = gleaner(
        "import", str(EXAMPLES / "chatgpt-export"), "--dry-run", "--json", url=url, cwd=tmp_path
    )
    assert estimate.returncode == 0, estimate.stderr
    assert json.loads(estimate.stdout)["conversations"] == 2

    no_owner = gleaner("import", str(EXAMPLES / "claude-export"), url=url, cwd=tmp_path)
    assert no_owner.returncode == 2 and "--owner" in no_owner.stderr

    imported = gleaner(
        "import", str(EXAMPLES / "claude-export"), "--owner", "ann", "--json", url=url, cwd=tmp_path
    )
    summary = json.loads(imported.stdout)
    assert imported.returncode == 0 and summary["notes_written"] >= 2
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

    no_broker = gleaner("enqueue", str(EXAMPLES / "native.json"), url=url, cwd=tmp_path)
    assert no_broker.returncode == 2 and "GLEANER_BROKER_URL" in no_broker.stderr

    status = json.loads(gleaner("status", "--json", url=url, cwd=tmp_path).stdout)
    assert status["broker"] is False and status["harvested"]["transcripts"] == summary["harvested"]

    decay = json.loads(gleaner("housekeep", "decay", "--json", url=url, cwd=tmp_path).stdout)
    assert decay["dry_run"] is False and decay["updated"] >= 0
    dedupe = gleaner("housekeep", "dedupe", "--dry-run", "--json", url=url, cwd=tmp_path)
    assert json.loads(dedupe.stdout)["dry_run"] is True

    assert "no failed job" in gleaner("retry", "--all", url=url, cwd=tmp_path).stdout

    refused = gleaner("forget", "--owner", "ann", url=url, cwd=tmp_path)
    assert refused.returncode == 2 and "--yes" in refused.stderr
    forgot = gleaner("forget", "--owner", "ann", "--yes", url=url, cwd=tmp_path)
    assert forgot.returncode == 0 and f"notes {summary['notes_written']}" in forgot.stdout
    after = gleaner("search", "the", "--owner", "ann", "--json", url=url, cwd=tmp_path)
    assert json.loads(after.stdout) == []
