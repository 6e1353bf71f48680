"""`gleaner export` and `gleaner restore`: files and pipes, exit statuses, help, and progress
that stays quiet on a short run. In process (``cli.main``), on both databases."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gleaner.cli.progress import Progress
from gleaner.store import Store
from tests.cli_harness import Cli, cli
from tests.test_export_restore import export, fill, records

__all__ = ["cli"]  # the fixture, used by name


@pytest.fixture
def filled(make_store: Callable[..., Store], backend: str, cli: Cli) -> Store:
    """A clean store with alice's notes, which the command line uses."""
    store = make_store(backend)
    fill(store, "alice")
    cli.env(GLEANER_DATABASE_URL=store.database_url)
    return store


def test_export_to_a_file_and_to_standard_output(cli: Cli, filled: Store, tmp_path: Path) -> None:
    folder = tmp_path / "exports"
    folder.mkdir()
    path = folder / "alice.jsonl"
    ran = cli("export", "--owner", "alice", "-o", str(path))
    assert ran.code == 0, ran.err
    assert ran.out == ""
    assert "exported 11 note(s)" in ran.err and str(path) in ran.err
    assert records(path.read_bytes()) == records(export(filled, "alice"))
    assert [p.name for p in folder.iterdir()] == ["alice.jsonl"]  # no partial file left
    nowhere = cli("export", "--owner", "alice", "-o", str(tmp_path / "no" / "such.jsonl"))
    assert nowhere.code == 2 and "no such folder" in nowhere.err
    piped = cli("export", "--owner", "alice")
    assert piped.code == 0, piped.err
    assert records(piped.out.encode()) == records(path.read_bytes())
    nobody = cli("export", "--owner", "nobody")
    assert nobody.code == 0 and "has no notes" in nobody.err
    assert json.loads(nobody.out)["counts"] == {"notes": 0, "versions": 0, "links": 0}


def test_restore_and_its_exit_statuses(
    cli: Cli, filled: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "alice.jsonl"
    path.write_bytes(export(filled, "alice"))

    taken = cli("restore", str(path))
    assert taken.code == 2
    assert "scope_not_empty" in taken.err and "'alice'" in taken.err
    other = cli("restore", str(path), "--owner", "bob")
    assert other.code == 2 and "bad_owner" in other.err and "--reassign-owner" in other.err
    no_owner = cli("restore", str(path), "--reassign-owner")
    assert no_owner.code == 2 and "--owner NAME" in no_owner.err
    missing = cli("restore", str(tmp_path / "nope.jsonl"))
    assert missing.code == 2 and "no such file" in missing.err
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"provenance"', b'"provenanse"')
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"\n".join(lines))
    refused = cli("restore", str(bad), "--owner", "bob", "--reassign-owner")
    assert refused.code == 1
    assert "bad_export: line 3:" in refused.err and "nothing was restored" in refused.err
    for ran in (taken, other, no_owner, missing, refused):
        assert "Traceback" not in ran.err
    assert filled.fingerprint(("owner", "bob")) == (0, 0)

    done = cli("restore", str(path), "--owner", "bob", "--reassign-owner")
    assert done.code == 0, done.err
    assert "restored 11 note(s)" in done.out and "'bob'" in done.out
    assert records(export(filled, "bob")) == records(path.read_bytes())
    hits = cli("search", "helix", "--owner", "bob", "--json")
    assert [hit["slug"] for hit in hits.json()] == ["pref-editor"]

    stdin = io.TextIOWrapper(io.BytesIO(path.read_bytes()), encoding="utf-8")
    monkeypatch.setattr("sys.stdin", stdin)
    piped = cli("restore", "-", "--owner", "carol", "--reassign-owner", "--json")
    assert piped.code == 0, piped.err
    summary = piped.json()
    assert summary["owner"] == "carol" and summary["exported_owner"] == "alice"
    assert (summary["notes"], summary["versions"], summary["links"]) == (11, 7, 5)


def test_restore_says_vectors_are_pending_when_recall_is_semantic(
    cli: Cli, filled: Store, tmp_path: Path
) -> None:
    path = tmp_path / "alice.jsonl"
    path.write_bytes(export(filled, "alice"))
    cli.env(GLEANER_EMBED_MODEL="openai/text-embedding-3-small")
    done = cli("restore", str(path), "--owner", "bob", "--reassign-owner")
    assert done.code == 0, done.err
    assert "gleaner embed --backfill --owner 'bob'" in done.err


def test_a_new_sqlite_file_is_migrated_for_a_restore(
    cli: Cli, filled: Store, tmp_path: Path
) -> None:
    path = tmp_path / "alice.jsonl"
    path.write_bytes(export(filled, "alice"))
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/new.db")
    done = cli("restore", str(path))
    assert done.code == 0, done.err
    again = cli("export", "--owner", "alice")
    assert records(again.out.encode()) == records(path.read_bytes())


def test_help(cli: Cli) -> None:
    shown = cli("export", "--help")
    assert shown.code == 0
    assert "--owner NAME" in shown.out and "-o FILE, --output FILE" in shown.out
    shown = cli("restore", "--help")
    assert shown.code == 0
    for flag in ("FILE", "--owner NAME", "--reassign-owner", "--json", "--backfill"):
        assert flag in shown.out
    listed = cli("--help")
    assert "export" in listed.out and "restore" in listed.out
    usage = cli("export")
    assert usage.code == 2 and "--owner" in usage.err


def test_progress_is_quiet_on_a_short_run() -> None:
    stream = io.StringIO()
    with Progress("restore", every=0, stream=stream, quiet_for=3600) as shown:
        for done in range(0, 101, 10):
            shown.update(done, 100)
    assert stream.getvalue() == ""
    with Progress("restore", every=3600, stream=stream, quiet_for=0) as shown:
        shown.update(0, 100)
        shown.update(100, 100)
    assert stream.getvalue().splitlines()[0].startswith("restore: 0/100")
    assert stream.getvalue().splitlines()[-1].startswith("restore: 100/100 (100%)")


@pytest.mark.slow
def test_export_piped_into_restore_as_real_processes(
    make_store: Callable[..., Store], tmp_path: Path
) -> None:
    """`gleaner export | gleaner restore -` between two databases, as real processes in an
    ASCII locale: the bytes are UTF-8 whatever the locale, and the round trip is exact."""
    import os
    import subprocess
    import sys

    source = make_store("sqlite")
    fill(source, "alice")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GLEANER_", "LC_"))}
    base |= {"LANG": "C", "PYTHONIOENCODING": "ascii", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    command = [sys.executable, "-m", "gleaner.cli"]
    target = f"sqlite:///{tmp_path}/target.db"
    with subprocess.Popen(
        [*command, "export", "--owner", "alice"],
        env={**base, "GLEANER_DATABASE_URL": source.database_url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as exporting:
        restoring = subprocess.run(
            [*command, "restore", "-", "--owner", "bob", "--reassign-owner"],
            env={**base, "GLEANER_DATABASE_URL": target},
            stdin=exporting.stdout,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert exporting.wait(timeout=120) == 0, exporting.stderr.read()  # type: ignore[union-attr]
    assert restoring.returncode == 0, restoring.stderr
    assert b"restored 11 note(s)" in restoring.stdout
    restored = Store(target, settings=source.settings)
    try:
        assert records(export(restored, "bob")) == records(export(source, "alice"))
    finally:
        restored.dispose()
