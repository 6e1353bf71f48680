"""Import progress wherever the command runs: plain lines without a terminal, `gleaner status
--import ID [--watch]`, `--no-wait`, unreadable files named, and a dry run that checks what a
run checks and leaves out what was harvested before. Real PostgreSQL, Redis and workers."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gleaner.cli import progress
from gleaner.harvest.outcome import HarvestOutcome, ImportTotals
from gleaner.store import Store
from tests.cli_harness import EXAMPLES, Cli, cli, redis_url_for
from tests.samples import write_chatgpt_export, write_natives
from tests.workers_harness import Cluster, cluster_on

__all__ = ["cli"]  # the fixture, used by name

LINE = re.compile(r"^(?P<label>.+): (?P<done>\d+)/(?P<total>\d+) \((?P<pct>\d+)%\)(?P<rest>.*)$")


def test_plain_progress_lines_carry_done_total_rate_and_eta() -> None:
    stream = io.StringIO()  # not a terminal
    with progress.Progress("import abc", every=0, stream=stream, from_zero=True) as shown:
        for done in range(1, 5):
            shown.update(done, 10)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4
    first = LINE.match(lines[0])
    assert first and (first["label"], first["done"], first["total"]) == ("import abc", "1", "10")
    assert re.search(r", \d+\.\d/s, ETA \d+s$", lines[-1]), lines[-1]


def test_plain_progress_waits_between_lines_and_always_shows_the_end() -> None:
    stream = io.StringIO()
    with progress.Progress("harvesting", every=3600, stream=stream) as shown:
        for done in range(1, 101):
            shown.update(done, 100)
    lines = stream.getvalue().splitlines()
    assert [LINE.match(line)["done"] for line in lines] == ["1", "100"]  # type: ignore[index]
    assert lines[-1].endswith("done")
    assert progress.duration(45) == "45s" and progress.duration(185) == "3m05s"
    assert progress.duration(7380) == "2h03m"


@pytest.mark.parametrize(("seconds", "shown"), [("0", [1, 2, 3, 4, 5]), ("3600", [1, 5])])
def test_in_process_harvest_shows_progress_on_stderr_without_a_terminal(
    cli: Cli, tmp_path: Path, seconds: str, shown: list[int]
) -> None:
    write_natives(tmp_path / "in", 5)
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/h.db", GLEANER_PROGRESS_SECONDS=seconds)
    ran = cli("harvest", str(tmp_path / "in"))
    assert ran.code == 0, ran.err
    found = [LINE.match(line) for line in ran.err.splitlines()]
    assert [(int(m["done"]), m["total"]) for m in found if m] == [(n, "5") for n in shown]


def test_import_totals_sum_the_done_outcomes_under_the_recorded_usage() -> None:
    outcomes = [
        HarvestOutcome(status="harvested", notes_written=2, items_dropped=1, model_calls=1),
        HarvestOutcome(status="harvested", notes_updated=1, notes_skipped=3, model_calls=1),
        HarvestOutcome(status="skipped"),
    ]
    results = [o.as_dict() for o in outcomes] + [{}]  # a result with no counts counts 0
    usage = {"model_calls": 5, "prompt_tokens": 50, "completion_tokens": 7}  # failed runs too
    assert ImportTotals.of(results, usage) == ImportTotals(
        notes_written=2, notes_updated=1, notes_skipped=3, items_dropped=1, skipped=1, **usage
    )


def test_the_text_summary_names_unreadable_files(cli: Cli, tmp_path: Path) -> None:
    folder = tmp_path / "export"
    write_natives(folder, 2)
    (folder / "broken.json").write_text("{not json", encoding="utf-8")
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/u.db")
    ran = cli("import", str(folder))
    assert ran.code == 1
    assert re.search(r"FAILED \S*broken\.json: \w+", ran.err), ran.err
    dry = cli("import", str(folder), "--dry-run")
    assert dry.code == 0
    assert re.search(r"UNREADABLE \S*broken\.json: \w+", dry.err), dry.err


def test_dry_run_checks_owners_and_leaves_out_what_was_harvested(
    cli: Cli, store: Store, tmp_path: Path
) -> None:
    export = write_chatgpt_export(tmp_path / "export" / "conversations.json", 4, facts=2)
    cli.env(GLEANER_DATABASE_URL=store.database_url)
    assert cli("import", str(export), "--dry-run").code == 2  # no owner: as a real run
    assert cli("import", str(export)).code == 2
    before = cli("import", str(export), "--dry-run", "--owner", "dana", "--json").json()
    assert (before["conversations"], before["already_harvested"]) == (4, 0)
    assert cli("import", str(export), "--owner", "dana").code == 0
    after = cli("import", str(export), "--dry-run", "--owner", "dana", "--json").json()
    assert (after["conversations"], after["already_harvested"]) == (0, 4)
    assert after["model_calls"] == 0 and after["messages"] == 0
    # Forgotten (tombstoned) conversations would write nothing either.
    assert cli("forget", "--owner", "dana", "--yes").code == 0
    forgotten = cli("import", str(export), "--dry-run", "--owner", "dana", "--json").json()
    assert (forgotten["conversations"], forgotten["already_harvested"]) == (0, 4)
    # Another owner's scope has harvested none of them.
    other = cli("import", str(export), "--dry-run", "--owner", "erin", "--json").json()
    assert other["conversations"] == 4


def test_dry_run_creates_no_database(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path}/none.db")
    ran = cli("import", str(EXAMPLES / "claude-export"), "--dry-run", "--owner", "ann")
    assert ran.code == 0, ran.err
    assert "1 conversation(s) to harvest" in ran.out
    assert not (tmp_path / "none.db").exists()


@pytest.fixture
def cluster(
    tmp_path: Path, worker_id: str, make_store: object, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Cluster]:
    store = make_store("postgresql")  # type: ignore[operator]
    redis_url = redis_url_for(worker_id)
    yield from cluster_on(store.database_url, int(redis_url.rsplit("/", 1)[1]), tmp_path)


@pytest.mark.slow
def test_no_wait_returns_queued_then_status_watch_follows_to_the_end(
    cli: Cli, cluster: Cluster
) -> None:
    export = write_chatgpt_export(cluster.tmp / "export" / "conversations.json", 30, facts=2)
    cli.env(**{k: v for k, v in cluster.env.items() if k.startswith("GLEANER_")})
    cli.env(GLEANER_PROGRESS_SECONDS="0")  # a line at every look

    queued = cli("import", str(export), "--owner", "dana", "--no-wait")
    assert queued.code == 0, queued.err
    import_id = re.search(r"import ([0-9a-f]{32}):", queued.out)[1]  # type: ignore[index]
    assert f"gleaner status --import {import_id} --watch" in queued.out
    # Recorded and on the queue before any worker exists.
    assert cluster.redis().llen("import") == 30
    waiting = cli("status", "--import", import_id, "--json").json()
    assert (waiting["pending"], waiting["finished"], waiting["total"]) == (30, 0, 30)

    # Not waited for: the watch must look before the worker can finish anything (30 jobs
    # took less than the wait for a ready worker, and a watch that finds the import done
    # prints its totals alone).
    cluster.start_worker(queues="import", concurrency=2, wait=False)
    watched = cli("status", "--import", import_id, "--watch")
    assert watched.code == 0, watched.err
    assert f"import {import_id}: 30/30 finished (30 done, 0 failed" in watched.out
    lines = [LINE.match(line) for line in watched.err.splitlines()]
    assert [m for m in lines if m][-1]["done"] == "30"  # type: ignore[index]
    totals = cli("status", "--import", import_id, "--json").json()
    assert totals["notes_written"] > 0 and totals["done"] == 30

    # Following from the start: a plain line per poll, the last one at the end.
    again = write_chatgpt_export(cluster.tmp / "again" / "conversations.json", 10, facts=1)
    followed = cli("import", str(again), "--owner", "erin")
    assert followed.code == 0, followed.err
    shown = [m for m in (LINE.match(line) for line in followed.err.splitlines()) if m]
    assert shown and (shown[-1]["done"], shown[-1]["total"]) == ("10", "10")
    assert json.loads(cli("status", "--json").out)["jobs"]["done"] == 40
    assert redis.Redis.from_url(cluster.env["GLEANER_BROKER_URL"]).llen("import") == 0

    # Through the queue too, the text names what could not be read (and exits 1).
    mixed = cluster.tmp / "mixed"
    write_natives(mixed, 1, start=100)
    (mixed / "broken.json").write_text("{not json", encoding="utf-8")
    partly = cli("import", str(mixed), "--no-wait")
    assert partly.code == 1
    assert re.search(r"UNREADABLE \S*broken\.json: \w+", partly.err), partly.err


def test_an_import_in_process_whose_harvests_failed_exits_1_and_lists_20(
    cli: Cli, tmp_path: Path
) -> None:
    # Scripts read the exit code: conversations that failed to harvest must not look done.
    from tests.llm_server import Behaviour, llm_server

    folder = tmp_path / "export"
    write_natives(folder, 22, owner="dana")
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path / 'g.db'}")
    assert cli("db", "upgrade").code == 0
    with llm_server() as server:
        server.default = Behaviour(status=400, error={"message": "bad request"})
        cli.env(
            GLEANER_HARVEST_MODEL="openai/test-model",
            GLEANER_HARVEST_API_BASE=server.api_base,
            GLEANER_HARVEST_API_KEY="test",
        )
        ran = cli("import", str(folder))
    assert ran.code == 1, ran.err
    failed = [line for line in ran.err.splitlines() if line.lstrip().startswith("FAILED")]
    assert len(failed) == 20 and "... and 2 more (--json lists them)" in ran.err
    assert "failed 22" in ran.out


def test_an_import_is_recorded_in_batches_each_conversation_once(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Batches bound a transaction on a big export; none may drop or repeat a conversation.
    from sqlalchemy import text

    import gleaner.harvest.imports

    monkeypatch.setattr(gleaner.harvest.imports, "RECORD_BATCH", 2)
    write_natives(tmp_path / "in", 5, owner="dana")
    planned = gleaner.harvest.imports.plan_import(store, tmp_path / "in", owner="dana")
    assert len(planned.job_ids) == len(set(planned.job_ids)) == 5
    with store.engine.connect() as conn:
        total = conn.execute(
            text("SELECT total FROM imports WHERE id = :i"), {"i": planned.import_id}
        ).scalar_one()
        jobs = conn.execute(
            text("SELECT count(DISTINCT transcript_hash) FROM jobs WHERE import_id = :i"),
            {"i": planned.import_id},
        ).scalar_one()
    assert (total, jobs) == (5, 5)
