"""One reliability scenario: its database, Redis database, workers, model, transcripts, and
the figures it reports (what went in, what came out, model calls, recovery time).

Every transcript carries a marker (``My marker is M03x0007.``) that the model server turns
into one note, "Marker M03x0007", and a private span holding a secret (``<private>my door
code is Kq7zSecret...</private>``) that must never get past redaction. So after a run:

- every job is ``done`` or ``failed`` with a reason (``reason: message``);
- every marker of a ``done`` job is stored exactly once, none of a failed or refused one;
- the model was called at most ``runs x chunks x 2 x GLEANER_HARVEST_MAX_ATTEMPTS`` times
  per transcript, ``runs`` being the job's claims (``jobs.attempts``), which README bounds
  by ``1 + GLEANER_JOB_MAX_CRASHES`` (per ``gleaner retry``); so within README's bound of
  ``GLEANER_HARVEST_MAX_CALLS x 2 x GLEANER_HARVEST_MAX_ATTEMPTS`` per run;
- no secret is in any table, model request or worker log.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import inspect, text

from gleaner.store import Store
from tests.llm_server import MARKER, LLMServer, ModelModes
from tests.workers_harness import Cluster, Worker, wait_for, wait_ready

# The secret every transcript hides in a private span; lowercased in every check.
SECRET = "Kq7zSecret"
OWNERS = 8

# Short settings: every fault is noticed in seconds, not minutes (see docs/RELIABILITY.md).
SUITE_SETTINGS = {
    "GLEANER_JOB_LEASE_SECONDS": "5",
    "GLEANER_JOB_HEARTBEAT_SECONDS": "1",
    "GLEANER_REQUEUE_AFTER_SECONDS": "2",
    "GLEANER_JOB_MAX_CRASHES": "3",
    "GLEANER_HARVEST_TIMEOUT_SECONDS": "4",
    "GLEANER_HARVEST_MAX_ATTEMPTS": "4",
    "GLEANER_HARVEST_MAX_RETRY_SECONDS": "8",
    "GLEANER_HARVEST_MAX_CALLS": "4",
    "GLEANER_TASK_SOFT_TIME_LIMIT": "30",
    "GLEANER_TASK_TIME_LIMIT": "35",
    "GLEANER_BROKER_VISIBILITY_TIMEOUT": "60",
    "GLEANER_DB_POOL_SIZE": "2",
    "GLEANER_WORKER_STALL_SECONDS": "10",
    "GLEANER_HARVEST_MODEL": "openai/test-model",
    "GLEANER_HARVEST_API_KEY": "reliability",
}
CONCURRENCY = 4


def now() -> datetime:
    return datetime.now(UTC)


def marker_of(index: int, tag: str) -> str:
    return f"{tag}{index:04d}"


def transcript(
    index: int,
    tag: str,
    *,
    owner: str | None = None,
    conversation_id: str | None = None,
    extra_messages: Sequence[dict[str, str]] = (),
) -> dict[str, Any]:
    """The native transcript ``index`` of a scenario: a marker line, a private span."""
    marker = marker_of(index, tag)
    return {
        "conversation_id": conversation_id or f"conv-{marker}",
        "owner": owner if owner is not None else f"owner{index % OWNERS}",
        "ended_at": "2025-01-15T10:00:00Z",
        "messages": [
            {"role": "user", "content": f"My marker is {marker}. Please remember it."},
            {"role": "assistant", "content": "Noted."},
            {
                "role": "user",
                "content": f"Also <private>my door code is {SECRET}{marker}</private>, "
                "keep that between us.",
            },
            {"role": "assistant", "content": "Understood."},
            *extra_messages,
        ],
    }


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Scenario:
    """The running scenario: services, workers, model, and what it records."""

    name: str
    number: int
    title: str
    item: str | None
    cluster: Cluster
    store: Store
    server: LLMServer
    model: ModelModes
    record: dict[str, Any]
    requests_from: int
    settings: dict[str, str]
    started: float = field(default_factory=time.monotonic)
    started_at: datetime = field(default_factory=now)  # reset by the first enqueue
    enqueued: bool = False
    fault_end: datetime | None = None
    fault_seconds: float | None = None
    operator_retries: int = 0
    checks: list[Check] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)

    # --- input ---------------------------------------------------------------------------

    @property
    def tag(self) -> str:
        return f"M{self.number:02d}x"

    @property
    def inbox(self) -> Path:
        return self.cluster.tmp / "in"

    def write(self, items: Iterable[tuple[str, Any]]) -> list[Path]:
        """Write ``(file name, JSON value or raw text)`` files into the inbox."""
        self.inbox.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, value in items:
            path = self.inbox / name
            path.write_text(value if isinstance(value, str) else json.dumps(value))
            paths.append(path)
        return paths

    def transcripts(
        self, count: int, start: int = 0, make: Callable[[int], dict[str, Any]] | None = None
    ) -> list[Path]:
        """Write ``count`` transcripts (``make(i)``, default :func:`transcript`)."""
        maker = make or (lambda i: transcript(i, self.tag))
        # Named by marker: a refusal that names the file names the marker.
        return self.write(
            (f"{marker_of(i, self.tag)}.json", maker(i)) for i in range(start, start + count)
        )

    def enqueue(self, *paths: Path, expect_exit: int | None = 0) -> dict[str, Any]:
        """`gleaner enqueue --json` (the producer's door); records what went in."""
        if not self.enqueued:
            self.started_at, self.enqueued = now(), True
        out = self.cluster.gleaner("enqueue", "--json", *map(str, paths or (self.inbox,)))
        if expect_exit is not None:
            assert out.returncode == expect_exit, out.stdout + out.stderr
        summary: dict[str, Any] = json.loads(out.stdout)
        went_in = self.record.setdefault("input", {"transcripts": 0, "enqueued": 0, "refused": {}})
        went_in["enqueued"] += int(summary["enqueued"])
        for failure in summary["failures"]:
            reason = str(failure["error"]).split(":", 1)[0]
            went_in["refused"][reason] = went_in["refused"].get(reason, 0) + 1
        went_in["transcripts"] += int(summary["enqueued"]) + len(summary["failures"])
        return summary

    # --- processes -----------------------------------------------------------------------

    def start(
        self, workers: int = 1, concurrency: int = CONCURRENCY, beat: bool = True, **env: str
    ) -> list[Worker]:
        """Start workers (and beat) at once and wait until all are ready."""
        started = [
            self.cluster.start_worker(concurrency=concurrency, wait=False, **env)
            for _ in range(workers)
        ]
        if beat:
            started.append(self.cluster.start_beat(wait=False, **env))
        for process in started:
            wait_ready(process)
        return started

    def kill_all(self) -> None:
        for process in self.cluster.workers:
            process.kill()

    def logs(self) -> str:
        return "".join(process.text() for process in self.cluster.workers)

    def step(self, what: str) -> None:
        """Note what was done, with the time since the scenario started."""
        self.steps.append(f"{time.monotonic() - self.started:5.1f}s {what}")

    # --- the database --------------------------------------------------------------------

    def states(self) -> Counter[str]:
        with self.store.engine.connect() as conn:
            rows = conn.execute(text("SELECT state, count(*) FROM jobs GROUP BY state")).all()
        return Counter({str(state): int(n) for state, n in rows})

    def finished(self) -> int:
        found = self.states()
        return found["done"] + found["failed"]

    def wait_finished(self, count: int, timeout: float) -> None:
        """Wait until ``count`` jobs are done or failed (the database may be down meanwhile)."""

        def enough() -> bool:
            try:
                return self.finished() >= count
            except Exception:  # the database is being restarted: look again
                return False

        wait_for(enough, timeout, every=0.3)

    def wait_all(self, timeout: float) -> None:
        """Wait until every recorded job is done or failed."""

        def settled() -> bool:
            replaced = self.cluster.replace_stalled()  # the supervisor's part
            if replaced:
                self.step(f"{replaced} stalled worker(s) exited (code 70) and were restarted")
            try:
                found = self.states()
            except Exception:
                return False
            return found["pending"] + found["running"] == 0

        try:
            wait_for(settled, timeout, every=0.3)
        except TimeoutError:
            states = dict(self.states())
            raise TimeoutError(f"jobs not settled within {timeout} s: {states}") from None

    def fault(self, seconds: float | None = None) -> None:
        """Mark the end of the fault (now); recovery is measured from here."""
        self.fault_end = now()
        self.fault_seconds = seconds

    def retry_failed(self) -> int:
        """`gleaner retry --all`, as an operator would after a fault; returns jobs re-sent."""
        out = self.cluster.gleaner("retry", "--all")
        assert out.returncode == 0, out.stdout + out.stderr
        found = re.search(r"re-enqueued (\d+)", out.stdout)
        self.operator_retries += 1
        return int(found.group(1)) if found else 0

    def jobs(self) -> list[dict[str, Any]]:
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, state, last_error, attempts, crashes, transcript, finished_at, "
                    "created_at FROM jobs"
                )
            ).mappings()
            return [dict(r) for r in rows]

    def marker_notes(self) -> Counter[str]:
        """How many notes hold each marker (all notes, live or not)."""
        with self.store.engine.connect() as conn:
            titles = conn.execute(
                text("SELECT title FROM memories WHERE title LIKE 'Marker %'")
            ).scalars()
            return Counter(str(t).removeprefix("Marker ") for t in titles)

    def dump(self) -> str:
        """Every value of every table, as lowercased text."""
        out: list[str] = []
        with self.store.engine.connect() as conn:
            for table in inspect(conn).get_table_names():
                for row in conn.execute(text(f'SELECT * FROM "{table}"')):
                    out.extend(str(v) for v in row)
        return " ".join(out).lower()

    def requests_text(self) -> str:
        found = self.server.requests[self.requests_from :]
        return " ".join(json.dumps(r.body) for r in found).lower()

    # --- the verdict ---------------------------------------------------------------------

    def check(self, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, bool(ok), detail))
        return bool(ok)

    def verify(
        self,
        *,
        expect_failed: dict[str, str] | None = None,
        allowed_failures: Iterable[str] = (),
        refused: Iterable[str] = (),
        chunks: int = 1,
        words: Iterable[str] = (),
        forgotten: Sequence[str] = (),
        skipped: Iterable[str] = (),
        gone_ok: bool = False,
    ) -> dict[str, Any]:
        """Compute the figures, run the common checks, and return the figures.

        ``expect_failed``: marker -> the reason its job must fail with. ``allowed_failures``:
        reasons any job may fail with (e.g. ``model_transient`` during a model outage).
        ``refused``: markers refused at the door (never a job, never a note). ``words``:
        text that must be in no table, model request or log (the secret always is);
        ``forgotten``: text that must be in no table or log. ``skipped``: markers whose jobs
        end done without a note (a forgotten transcript sent again). ``gone_ok``: jobs may be
        missing (deleted by forget).
        """
        expect_failed = expect_failed or {}
        allowed = set(allowed_failures)
        skipped = set(skipped)
        jobs = self.jobs()
        settings = self.settings
        attempts_per_call = int(settings["GLEANER_HARVEST_MAX_ATTEMPTS"])
        max_crashes = int(settings["GLEANER_JOB_MAX_CRASHES"])
        max_calls = int(settings["GLEANER_HARVEST_MAX_CALLS"])
        per_run = chunks * 2 * attempts_per_call
        # README: a job runs at most 1 + GLEANER_JOB_MAX_CRASHES times (each `gleaner retry`
        # starts the count anew), each run at most HARVEST_MAX_CALLS x 2 x MAX_ATTEMPTS calls.
        max_runs = (1 + max_crashes) * (1 + self.operator_retries)
        documented = max_calls * 2 * attempts_per_call * max_runs

        states = Counter(str(j["state"]) for j in jobs)
        reasons: Counter[str] = Counter()
        by_marker: dict[str, dict[str, Any]] = {}
        for job in jobs:
            transcript_json = json.dumps(job["transcript"])
            found = MARKER.search(transcript_json)
            marker = found.group(1) if found else f"job-{job['id']}"
            by_marker[marker] = job
            if job["state"] == "failed":
                reasons[str(job["last_error"] or "").split(":", 1)[0] or "(none)"] += 1
        stored = self.marker_notes()
        calls = self.model.calls

        self.check(
            "every job ends done or failed",
            states["pending"] + states["running"] == 0,
            f"{dict(states)}",
        )
        unexplained = [
            j["id"]
            for j in jobs
            if j["state"] == "failed" and not re.match(r"^[a-z_]+: \S", j["last_error"] or "")
        ]
        self.check(
            "every failed job says why (reason: message)",
            not unexplained,
            f"{len(unexplained)} without a reason",
        )

        def as_planned(marker: str, job: dict[str, Any]) -> bool:
            failed, error = job["state"] == "failed", str(job["last_error"] or "")
            if failed and error.split(":", 1)[0] in allowed:
                return True
            if marker in expect_failed:
                return failed and error.startswith(expect_failed[marker])
            return not failed

        wrong = {
            m: (str(j["state"]), str(j["last_error"] or "")[:80])
            for m, j in by_marker.items()
            if not as_planned(m, j)
        }
        self.check(
            "jobs fail exactly where planned"
            + (f" (or with {', '.join(sorted(allowed))})" if allowed else ""),
            not wrong,
            "; ".join(f"{m}: {s}" for m, s in list(wrong.items())[:5]),
        )
        done_markers = {
            m for m, j in by_marker.items() if j["state"] == "done" and m not in skipped
        }
        not_done = (set(by_marker) - done_markers) | set(refused) | set(skipped)
        missing = sorted(m for m in done_markers if stored[m] == 0)
        duplicated = sorted(m for m in stored if stored[m] > 1)
        stray = sorted(m for m in not_done if stored[m] > 0)
        self.check(
            "every marker of a done job stored exactly once",
            not missing and not duplicated,
            f"missing {missing[:5]}, duplicated {duplicated[:5]}",
        )
        self.check("no note from a failed or refused transcript", not stray, f"{stray[:5]}")
        over = {
            m: (calls[m], int(j["attempts"]))
            for m, j in by_marker.items()
            if calls[m] > max(1, int(j["attempts"])) * per_run
        }
        self.check(
            f"model calls <= runs x {per_run} per transcript",
            not over,
            f"over: {list(over.items())[:5]}",
        )
        runs_over = {
            m: int(j["attempts"]) for m, j in by_marker.items() if int(j["attempts"]) > max_runs
        }
        self.check(
            f"runs (claims) per job <= 1 + JOB_MAX_CRASHES = {max_runs}",
            not runs_over,
            f"{list(runs_over.items())[:5]}",
        )
        self.check(
            f"model calls per transcript <= documented bound {documented}",
            max(calls.values(), default=0) <= documented,
            f"max {max(calls.values(), default=0)}",
        )
        unknown_calls = sum(n for m, n in calls.items() if m not in by_marker)
        if not gone_ok:
            self.check(
                "no model call for a transcript that is not a job",
                all(m in by_marker for m in calls if calls[m]),
                f"{unknown_calls} call(s)",
            )
        leaks = {}
        logs, dump, sent = self.logs().lower(), self.dump(), self.requests_text()
        for word in [SECRET, *words, *forgotten]:
            needle = word.lower()
            leaks[word] = {"tables": dump.count(needle), "logs": logs.count(needle)}
            if word not in forgotten:  # the model saw a forgotten owner's text before forget
                leaks[word]["model_requests"] = sent.count(needle)
        named = sorted(set(re.findall(r"marker[ -]m\d\dx\d{4}|owner\d", logs)))
        self.check(
            "worker and beat logs carry ids and counts: no owner, note title or slug",
            not named,
            f"{named[:5]}",
        )
        self.check(
            "no private or forgotten text in tables, model requests or logs",
            all(sum(v.values()) == 0 for v in leaks.values()),
            json.dumps(leaks),
        )

        finishes = [j["finished_at"] for j in jobs if j["finished_at"] is not None]
        last = max(finishes) if finishes else None
        recovery = first_after = backlog = None
        if self.fault_end is not None and last is not None:
            recovery = max(0.0, (last - self.fault_end).total_seconds())
            after = [f for f in finishes if f > self.fault_end]
            backlog = len(after)
            if after:
                first_after = (min(after) - self.fault_end).total_seconds()
        wall = None if last is None else (last - self.started_at).total_seconds()
        per_transcript = [calls[m] for m in by_marker]
        received = len(re.findall(r"task gleaner\.harvest\[[^\]]+\] received", logs))
        resent = sum(int(n) for n in re.findall(r"re-enqueued (\d+) lost job", logs))
        figures = {
            "jobs": {
                "total": len(jobs),
                "done": states["done"],
                "failed": states["failed"],
                "pending_or_running": states["pending"] + states["running"],
                "failed_reasons": dict(reasons),
            },
            "markers": {
                "expected_once": len(done_markers),
                "stored_once": sum(1 for m in done_markers if stored[m] == 1),
                "missing": len(missing),
                "duplicated": len(duplicated),
                "from_failed_or_refused": len(stray),
            },
            "model_calls": {
                "total": sum(calls.values()),
                "max_per_transcript": max(per_transcript, default=0),
                "bound_per_run": per_run,
                "documented_bound": documented,
                "max_runs": max((int(j["attempts"]) for j in jobs), default=0),
                "runs_bound": max_runs,
                "crashes": sum(int(j["crashes"]) for j in jobs),
                "by_mode": dict(self.model.by_mode),
            },
            "messages": {"harvest_received": received, "sweep_resent": resent},
            "leaks": leaks,
            "recovery_seconds": None if recovery is None else round(recovery, 1),
            # Jobs that finished after the fault ended, and how long until the first of them.
            "finished_after_fault": backlog,
            "first_finish_after_fault_seconds": None
            if first_after is None
            else round(first_after, 1),
            "fault_seconds": self.fault_seconds,
            "wall_seconds": None if wall is None else round(wall, 1),
        }
        self.record.update(figures)
        return figures

    def assert_checks(self) -> None:
        failed = [c for c in self.checks if not c.ok]
        assert not failed, "\n".join(f"{c.name}: {c.detail}" for c in failed)
