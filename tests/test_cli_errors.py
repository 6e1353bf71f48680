"""How `gleaner` commands fail: one line naming the problem and the next step, the documented
exit status, and nothing lost. Real PostgreSQL, real Redis (a port where nothing listens
for a broker that is down), real processes where a signal or a pipe is the point."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from gleaner.store import Store
from gleaner.store.schema.models import ImportBatch, Job, Memory
from tests.cli_harness import (
    EXAMPLES,
    Cli,
    cli,
    dead_broker_url,
    gleaner_process,
    redis_url_for,
)
from tests.conftest import pg_url_for, recreate_pg_database
from tests.samples import write_natives

__all__ = ["cli"]  # the fixture, used by name


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def pending_jobs(store: Store) -> int:
    with store.transaction() as session:
        return int(
            session.execute(
                select(func.count()).select_from(Job).where(Job.state == "pending")
            ).scalar_one()
        )


@pytest.fixture
def pg_store(make_store) -> Store:  # type: ignore[no-untyped-def]
    return make_store("postgresql")  # type: ignore[no-any-return]


@pytest.fixture
def live_redis(worker_id: str) -> str:
    url = redis_url_for(worker_id)
    redis.Redis.from_url(url).flushdb()
    yield url  # type: ignore[misc]
    redis.Redis.from_url(url).flushdb()


def test_enqueue_with_the_broker_down_records_the_jobs_and_says_how_they_get_sent(
    cli: Cli, pg_store: Store, tmp_path: Path, live_redis: str
) -> None:
    files = write_natives(tmp_path / "in", 3)
    cli.env(GLEANER_DATABASE_URL=pg_store.database_url, GLEANER_BROKER_URL=dead_broker_url())
    started = time.monotonic()
    down = cli("enqueue", *map(str, files))
    assert time.monotonic() - started < 20  # the promise is a bound: no retrying for minutes
    assert down.code == 1
    line = one_line(down.err)
    assert line.startswith("gleaner: broker_unavailable: 3 job(s) recorded, 3 not sent")
    assert "Connection refused" in line and "gleaner housekeep requeue" in line
    assert pending_jobs(pg_store) == 3  # nothing lost

    # What the line promises: with the broker back, `housekeep requeue` sends them now.
    cli.env(GLEANER_BROKER_URL=live_redis)
    sent = cli("housekeep", "requeue", "--json")
    assert sent.code == 0, sent.err
    assert sent.json() == {"requeued": 3}
    assert redis.Redis.from_url(live_redis).llen("harvest") == 3
    assert cli("housekeep", "requeue", "--json").json() == {"requeued": 0}  # never twice


def test_import_with_the_broker_down_is_one_line_and_the_jobs_stay(
    cli: Cli, pg_store: Store
) -> None:
    cli.env(GLEANER_DATABASE_URL=pg_store.database_url, GLEANER_BROKER_URL=dead_broker_url())
    down = cli("import", str(EXAMPLES / "chatgpt-export"), "--owner", "ann")
    assert down.code == 1
    line = one_line(down.err)
    assert "broker_unavailable: 2 job(s) recorded" in line and "housekeep requeue" in line
    assert pending_jobs(pg_store) == 2


def test_retry_with_the_broker_down_leaves_the_jobs_pending(
    cli: Cli, pg_store: Store, tmp_path: Path
) -> None:
    from gleaner.harvest.queue import record_jobs
    from gleaner.harvest.queues import LIVE_QUEUE
    from gleaner.harvest.transcript import Transcript
    from gleaner.store.jobs import queue as jobs
    from tests.samples import native

    [job_id] = record_jobs(
        pg_store,
        [Transcript.model_validate(native(1))],
        owner=None,
        provenance="compaction",
        queue=LIVE_QUEUE,
    )
    with pg_store.transaction() as session:
        jobs.fail(session, job_id, "model_permanent: test", None)
    cli.env(GLEANER_DATABASE_URL=pg_store.database_url, GLEANER_BROKER_URL=dead_broker_url())
    down = cli("retry", "--all")
    assert down.code == 1
    assert "1 job(s) reset to pending, 1 not sent" in one_line(down.err)
    assert pending_jobs(pg_store) == 1


def test_db_upgrade_of_a_database_that_does_not_exist_says_so(cli: Cli) -> None:
    cli.env(GLEANER_DATABASE_URL=pg_url_for("gleaner_no_such_database_here"))
    ran = cli("db", "upgrade")
    assert ran.code == 1
    line = one_line(ran.err)
    assert line.startswith("gleaner: no_database:")
    assert '"gleaner_no_such_database_here"' in line and "createdb" in line


def test_harvest_on_an_unmigrated_postgresql_fails_once(
    cli: Cli, tmp_path: Path, worker_id: str
) -> None:
    url = recreate_pg_database(f"gleaner_unmigrated_{worker_id}")
    cli.env(GLEANER_DATABASE_URL=url)
    files = write_natives(tmp_path / "in", 8)
    ran = cli("harvest", str(tmp_path / "in"))
    assert ran.code == 1
    line = one_line(ran.err)  # once, not once per transcript
    assert "not_migrated" in line and "gleaner db upgrade" in line
    assert len(files) == 8


def test_harvest_on_a_new_sqlite_file_migrates_it(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/new.db")
    ran = cli("harvest", str(EXAMPLES / "native.json"))
    assert ran.code == 0, ran.err
    assert "migrated the SQLite database" in ran.err
    assert "notes written" in ran.out and "items dropped 0" in ran.out
    again = cli("harvest", str(EXAMPLES / "native.json"))
    assert "migrated" not in again.err  # only the first time
    store = Store(f"sqlite:///{tmp_path}/new.db")
    with store.transaction() as session:
        assert session.execute(select(func.count()).select_from(Memory)).scalar_one() > 0
    store.dispose()


def test_status_of_an_unknown_import_and_watch_without_one(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/s.db")
    assert cli("db", "upgrade").code == 0
    unknown = cli("status", "--import", "0" * 32)
    assert unknown.code == 1 and "gleaner import" in one_line(unknown.err)
    lonely = cli("status", "--watch")
    assert lonely.code == 2 and "--import ID" in lonely.err


def test_status_takes_the_import_id_the_progress_line_shows(cli: Cli, tmp_path: Path) -> None:
    """The progress line names an import by its first 8 characters: status takes them, and
    any unique prefix of 4 or more; an ambiguous one is refused (exit 2)."""
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/s.db")
    assert cli("db", "upgrade").code == 0
    store = Store(f"sqlite:///{tmp_path}/s.db")
    with store.transaction() as session:
        session.add_all(
            [
                ImportBatch(
                    id="3ef6ebb8" + "0" * 24, source="a.zip", owner="x", provenance="import"
                ),
                ImportBatch(
                    id="3ef6ebb9" + "0" * 24, source="b.zip", owner="x", provenance="import"
                ),
            ]
        )
    store.dispose()
    shown = cli("status", "--import", "3ef6ebb8", "--json")
    assert shown.code == 0, shown.err
    assert shown.json()["import_id"] == "3ef6ebb8" + "0" * 24
    ambiguous = cli("status", "--import", "3ef6eb")
    assert ambiguous.code == 2 and "more than one import" in ambiguous.err
    assert cli("status", "--import", "3EF6EBB9").code == 0  # case aside
    # Under 4 characters (or not hex) no prefix is taken: "3ef" would name nearly anything.
    for short in ("3ef", "3ef6ebbz"):
        refused = cli("status", "--import", short)
        assert refused.code == 1 and "no import" in refused.err, refused.err


@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    env = {"GLEANER_DATABASE_URL": f"sqlite:///{tmp_path}/p.db"}
    assert (
        gleaner_process("harvest", str(EXAMPLES), "--owner", "al", env=env, cwd=tmp_path).returncode
        == 0
    )
    for args in (("search", "postgres", "--owner", "alice"), ("status",)):
        # The reader is gone before the first write (as `| head -1` once it has its line).
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = gleaner_process(
                *args, env=env, cwd=tmp_path, stdout=write_end, stderr=subprocess.PIPE
            )
        finally:
            os.close(write_end)
        assert done.returncode == 141, done.stderr
        assert done.stderr == ""


@pytest.mark.slow
def test_ctrl_c_while_following_an_import_says_it_goes_on(
    pg_store: Store, live_redis: str, tmp_path: Path
) -> None:
    env = {"GLEANER_DATABASE_URL": pg_store.database_url, "GLEANER_BROKER_URL": live_redis}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    # No worker runs: the import waits, and the command follows it until interrupted.
    following = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gleaner.cli",
            "import",
            str(EXAMPLES / "chatgpt-export"),
            "--owner",
            "ann",
        ],
        env={**clean, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **env},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert following.stderr is not None
    first = following.stderr.readline()  # the first progress line: it is following
    assert "0/2" in first, first
    following.send_signal(signal.SIGINT)
    _, err = following.communicate(timeout=30)
    assert following.returncode == 130, err
    assert "Traceback" not in err
    # Progress lines may come first (one every few seconds); then the one line that says why.
    said = [line for line in err.splitlines() if line.startswith("gleaner:")]
    assert len(said) == 1 and err.splitlines()[-1] == said[0], err
    line = said[0]
    assert "goes on in the workers" in line
    import_id = line.split("stopped following import ")[1].split(";")[0]
    assert f"gleaner status --import {import_id} --watch" in line
    assert pending_jobs(pg_store) == 2
    assert redis.Redis.from_url(live_redis).llen("import") == 2  # still queued


def test_a_schema_newer_than_this_gleaner_is_left_alone(cli: Cli, tmp_path: Path) -> None:
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path}/newer.db"
    cli.env(GLEANER_DATABASE_URL=url)
    assert cli("db", "upgrade").code == 0
    store = Store(url)
    with store.transaction() as session:
        session.execute(text("UPDATE alembic_version SET version_num = 'from-the-future'"))
    store.dispose()
    ran = cli("harvest", str(EXAMPLES / "native.json"))
    assert ran.code == 1
    assert "schema_too_new" in one_line(ran.err) and "from-the-future" in ran.err


def test_an_interrupted_harvest_in_process_exits_130_and_a_rerun_skips_what_it_kept(
    cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C in the middle of a folder: what was harvested is committed, the exit says
    # interrupted (130, as a shell reports it), and the same command again does the rest.
    import gleaner.harvest.batch
    from tests.samples import write_natives

    folder = tmp_path / "in"
    write_natives(folder, 3, owner="dana")
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/i.db")
    real = gleaner.harvest.batch.harvest_settled
    calls: list[object] = []

    def interrupted_second(*args: object, **kwargs: object) -> object:
        calls.append(args)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patch:
        patch.setattr(gleaner.harvest.batch, "harvest_settled", interrupted_second)
        stopped = cli("harvest", str(folder))
    assert stopped.code == 130, stopped.err
    assert "run the same command again" in stopped.err and "Traceback" not in stopped.err
    again = cli("harvest", str(folder), "--json")
    assert again.code == 0, again.err
    done = again.json()
    assert (done["harvested"], done["skipped"]) == (2, 1)
