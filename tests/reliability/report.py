"""Render one run of the reliability suite (its JSON) as docs/RELIABILITY.md.

    python -m tests.reliability.report [--json PATH] [--out docs/RELIABILITY.md]

The JSON is the one the suite writes as it runs (GLEANER_RELIABILITY_JSON, default
``<tmp>/gleaner-reliability.json``); nothing here runs a test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def results_path() -> Path:
    """Where the suite writes its figures (and this reads them): one file per checkout."""
    checkout = hashlib.sha256(str(REPO).encode()).hexdigest()[:6]
    default = Path(tempfile.gettempdir()) / f"gleaner-reliability-{checkout}.json"
    return Path(os.environ.get("GLEANER_RELIABILITY_JSON", str(default)))


METHOD = """\
## Method

`python -m pytest tests/reliability` (part of `python -m pytest`, so `.ci/run` runs it;
marked `slow` and `reliability`) starts its own services on spare ports, so it can stop, kill
and restart them without touching anything else on the machine: a PostgreSQL {postgresql}
cluster in a temporary folder (run as the `postgres` user, trust auth, `fsync=off`), a Redis
{redis} with nothing persisted (`--save "" --appendonly no`), and an OpenAI-compatible model
server in the test process (`tests/llm_server.py`, `ModelModes`) that can be switched at any
moment between `normal`, `slow`, `429` (with Retry-After), `500`, `hang` (the request is held
and never answered) and `garbage` (not JSON), for every request or for chosen transcripts.

Scenarios run one after the other. Each gets a fresh database (a copy of a migrated
template), its own Redis database, its own `gleaner worker` (prefork, 4 children, all queues)
and `gleaner beat` (the lost-job sweep every 2 s), and puts its transcripts in through
`gleaner enqueue` (the producer's door). Every transcript says `My marker is M03x0007.` and
hides a secret in a `<private>` span; the model answers each request with a note
"Marker M03x0007" whose body carries the answer's sequence number, so a transcript harvested
twice would leave two notes (the same-fact rule would not merge them). After each scenario:

- every job must be `done` or `failed` with a reason (`reason: message`), and fail only
  where the scenario plans it;
- every marker of a `done` job is stored exactly once; none of a failed or refused one;
- model calls per transcript (counted by the model server, by marker) must stay within
  `runs x chunks x 2 x GLEANER_HARVEST_MAX_ATTEMPTS`, `runs` being the job's claims
  (`jobs.attempts`); runs must stay within `1 + GLEANER_JOB_MAX_CRASHES` (per `gleaner retry`),
  so calls within the [documented](harvest.md#bounds) bound
  `GLEANER_HARVEST_MAX_CALLS x 2 x GLEANER_HARVEST_MAX_ATTEMPTS x (1 + GLEANER_JOB_MAX_CRASHES)`;
- the secret (and, after a forget, the owner's name, titles and slugs) is in no table, no
  model request and no worker or beat log.

**Recovery time** runs from the end of the fault (replacement worker ready, server back up,
model back to normal, forget returned) to the last job finishing; it includes working off
the jobs still waiting at that moment, so "first finish after the fault" is given too.
Timeouts are shortened so faults are noticed in seconds (the defaults are minutes):

{settings}
"""


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _reasons(found: dict[str, int]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in sorted(found.items())) or "none"


def _result(entry: dict[str, Any]) -> str:
    outcome = entry.get("outcome", "?")
    return {
        "passed": "pass",
        "failed": "**FAIL**",
        "xfail": "**known bug** (xfail)",
        "xpass": "**XPASS**",
        "error": "**ERROR**",
    }.get(outcome, outcome)


def summary_table(scenarios: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| # | scenario | item | result | in (enqueued) | done / failed | markers once "
        "(missing, dup.) | model calls (max per transcript) | recovery s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for n, entry in enumerate(scenarios, 1):
        went_in = entry.get("input", {})
        jobs = entry.get("jobs", {})
        markers = entry.get("markers", {})
        calls = entry.get("model_calls", {})
        lines.append(
            f"| {n} | [{entry['title']}](#{n}-{_anchor(entry['title'])}) | "
            f"{entry.get('item') or '-'} | {_result(entry)} | "
            f"{_fmt(went_in.get('transcripts'))} ({_fmt(went_in.get('enqueued'))}) | "
            f"{_fmt(jobs.get('done'))} / {_fmt(jobs.get('failed'))} | "
            f"{_fmt(markers.get('stored_once'))}/{_fmt(markers.get('expected_once'))} "
            f"({_fmt(markers.get('missing'))}, {_fmt(markers.get('duplicated'))}) | "
            f"{_fmt(calls.get('total'))} ({_fmt(calls.get('max_per_transcript'))}) | "
            f"{_fmt(entry.get('recovery_seconds'))} |"
        )
    return lines


def known_bugs(scenarios: list[dict[str, Any]]) -> list[str]:
    """The bugs the run found: scenarios kept as strict xfail, with their reason."""
    found = [(n, e) for n, e in enumerate(scenarios, 1) if e.get("outcome") in ("xfail", "failed")]
    if not found:
        return []
    lines = ["**Found by this run** (kept as strict xfail until fixed):", ""]
    for n, entry in found:
        reason = entry.get("xfail_reason") or "the scenario failed: see its checks"
        lines.append(f"- [{entry['title']}](#{n}-{_anchor(entry['title'])}): {reason}.")
    return [*lines, ""]


def _anchor(title: str) -> str:
    kept = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return kept.replace(" ", "-")


EXTRA = {
    "in_flight_at_fault": "jobs running when the fault came",
    "failed_before_retry": "jobs failed by the fault, before `gleaner retry --all`",
    "queue_peak": "most messages waiting on the harvest queue at once",
    "notes_skipped": "harvested candidates skipped (aimed at user notes)",
    "forget_output": "`gleaner forget` said",
    "came_back": "after forget, enqueued again",
    "zip_bomb": "zip bomb (`gleaner import --dry-run`)",
    "refusals": "refused at the door",
    "xfail_reason": "known bug",
}


def scenario_section(n: int, entry: dict[str, Any]) -> list[str]:
    went_in = entry.get("input", {})
    jobs = entry.get("jobs", {})
    markers = entry.get("markers", {})
    calls = entry.get("model_calls", {})
    messages = entry.get("messages", {})
    leaks = entry.get("leaks", {})
    lines = [
        f"### {n}. {entry['title']}",
        "",
        f"`{entry['name']}`"
        + (f", issue item {entry['item']}" if entry.get("item") else "")
        + f": {_result(entry)} in {_fmt(entry.get('seconds'))} s.",
        "",
        f"**What was done.** {entry.get('what', '')}",
        "",
    ]
    if entry.get("settings"):
        shown = ", ".join(f"`{k}={v}`" for k, v in entry["settings"].items())
        lines += [f"Settings besides the suite's: {shown}.", ""]
    if entry.get("steps"):
        lines += ["Timeline: " + "; ".join(s.strip() for s in entry["steps"]) + ".", ""]
    refused = went_in.get("refused") or {}
    found_leaks = {
        word: sum(places.values()) for word, places in leaks.items() if sum(places.values())
    }
    rows = [
        (
            "went in",
            f"{_fmt(went_in.get('transcripts'))} transcripts; {_fmt(went_in.get('enqueued'))} "
            f"enqueued, refused at the door: {_reasons(refused)}",
        ),
        (
            "jobs",
            f"{_fmt(jobs.get('done'))} done, {_fmt(jobs.get('failed'))} failed "
            f"({_reasons(jobs.get('failed_reasons') or {})}), "
            f"{_fmt(jobs.get('pending_or_running'))} pending or running",
        ),
        (
            "markers",
            f"{_fmt(markers.get('stored_once'))} of {_fmt(markers.get('expected_once'))} stored "
            f"exactly once; {_fmt(markers.get('missing'))} missing, "
            f"{_fmt(markers.get('duplicated'))} duplicated, "
            f"{_fmt(markers.get('from_failed_or_refused'))} from failed or refused transcripts",
        ),
        (
            "model calls",
            f"{_fmt(calls.get('total'))} in all, at most {_fmt(calls.get('max_per_transcript'))} "
            f"per transcript (bound {_fmt(calls.get('bound_per_run'))} per run; documented "
            f"bound {_fmt(calls.get('documented_bound'))}); by mode: "
            + (", ".join(f"{k} {v}" for k, v in sorted((calls.get("by_mode") or {}).items()))),
        ),
        (
            "runs",
            f"at most {_fmt(calls.get('max_runs'))} claims of one job (bound "
            f"{_fmt(calls.get('runs_bound'))}); {_fmt(calls.get('crashes'))} lost runs counted",
        ),
        (
            "messages",
            f"{_fmt(messages.get('harvest_received'))} harvest messages received by workers, "
            f"{_fmt(messages.get('sweep_resent'))} re-sent by the sweep",
        ),
        ("first enqueue to last job", f"{_fmt(entry.get('wall_seconds'))} s"),
        (
            "private or forgotten text found",
            "none (tables, model requests, logs)"
            if not found_leaks
            else ", ".join(f"{w}: {c}" for w, c in found_leaks.items()),
        ),
    ]
    if entry.get("recovery_seconds") is not None:
        if entry.get("fault_seconds") is not None:
            rows.append(("fault lasted", f"{_fmt(entry['fault_seconds'])} s"))
        rows.append(
            (
                "recovery",
                f"{_fmt(entry['recovery_seconds'])} s from the fault's end to the last job "
                f"({_fmt(entry.get('finished_after_fault'))} jobs finished after it, the first "
                f"{_fmt(entry.get('first_finish_after_fault_seconds'))} s after it)",
            )
        )
    for key, label in EXTRA.items():
        if key in entry:
            value = entry[key]
            shown = json.dumps(value) if isinstance(value, dict | list) else str(value)
            rows.append((label, shown))
    lines += ["| | |", "|---|---|"]
    lines += [f"| {label} | {value.replace('|', '/')} |" for label, value in rows]
    checks = entry.get("checks") or []
    if checks:
        lines += ["", "Checks:", ""]
        for check in checks:
            mark = "ok" if check["ok"] else "**NOT MET**"
            detail = f" ({check['detail']})" if not check["ok"] and check.get("detail") else ""
            lines.append(f"- {mark}: {check['name']}{detail}")
    return [*lines, ""]


def render(data: dict[str, Any]) -> str:
    run = data["run"]
    scenarios = data["scenarios"]
    machine = run.get("machine", {})
    settings = "\n".join(
        ["| setting | value |", "|---|---|"]
        + [f"| `{k}` | `{v}` |" for k, v in run.get("settings", {}).items()]
    )
    outcomes = [e.get("outcome") for e in scenarios]
    lines = [
        "# Reliability",
        "",
        "Generated by `python -m tests.reliability.report` from one run of the suite in "
        "`tests/reliability/`; do not edit by hand. What issue 11 asked: under faults and "
        "hostile input nothing is lost, nothing leaks, pinned memory stays safe, cost stays "
        "bounded. Hostile tenants and hostile servers (issue 38) are measured by their own "
        "tests: [Hostile tenants](HOSTILE_TENANTS.md).",
        "",
        f"Run of {run.get('started_at')}, commit {run.get('commit')}"
        + (" (with uncommitted changes)" if run.get("uncommitted_changes") else "")
        + f", {machine.get('cpus')} CPUs, Python {machine.get('python')}, PostgreSQL "
        f"{machine.get('postgresql')}, Redis {machine.get('redis')}, model client "
        f"`GLEANER_HARVEST_LLM={run.get('harvest_llm', '?')}`: {len(scenarios)} "
        f"scenarios in {_fmt(run.get('seconds'))} s; {outcomes.count('passed')} passed, "
        f"{outcomes.count('xfail')} known bugs (strict xfail), "
        f"{len(outcomes) - outcomes.count('passed') - outcomes.count('xfail')} failed.",
        "",
        *summary_table(scenarios),
        "",
        *known_bugs(scenarios),
        METHOD.format(
            postgresql=machine.get("postgresql", "?"),
            redis=machine.get("redis", "?"),
            settings=settings,
        ),
        "## Scenarios",
        "",
    ]
    for n, entry in enumerate(scenarios, 1):
        lines += scenario_section(n, entry)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=results_path(), help="the run's figures")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "RELIABILITY.md")
    args = parser.parse_args(argv)
    data = json.loads(args.json.read_text())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(data))
    print(f"wrote {args.out} from {args.json} ({len(data['scenarios'])} scenarios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
