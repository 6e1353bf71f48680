"""Issue 11's numbered items, each on the suite's own services through real workers:
(1) stuck running jobs, (2) duplicates and backlog, (3) private text, (4) pinned and
person-written notes, (5) size and cost bounds, (6) one bad item in a batch, (7) bad owners,
(8) the soft time limit inside a model call, (9) forget during harvest.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import time
import zipfile
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import text

from gleaner.store import Scope
from gleaner.store.notes import notes as store_notes
from gleaner.store.schema.models import utcnow
from tests.conftest import test_settings
from tests.llm_server import note
from tests.reliability.conftest import OpenScenario
from tests.reliability.scenario import SECRET, Scenario, now, transcript
from tests.workers_harness import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.reliability]

N = 200


def job_rows(sc: Scenario) -> dict[str, dict[str, Any]]:
    """Job rows by the marker of their transcript."""
    out = {}
    for job in sc.jobs():
        found = re.search(r"My marker is ([A-Za-z0-9]+)\.", json.dumps(job["transcript"]))
        if found:
            out[found.group(1)] = job
    return out


# --- 1 -------------------------------------------------------------------------------------


def test_1_jobs_stuck_running_are_recovered(open_scenario: OpenScenario) -> None:
    sc = open_scenario("item1_stuck_running", "Jobs left running by a lost worker", item="1")
    sc.record["what"] = (
        "200 jobs enqueued with no worker up, then every row set as a lost run leaves it "
        "(state running, claimed by a delivery that is gone, last heartbeat an hour ago) and "
        "the queue emptied (the message acknowledged, as after a PostgreSQL outage longer "
        "than the task's retries, or lost with Redis). Then a worker and beat start. (kill -9 "
        "of the whole worker and the 90 s outage are their own scenarios.)"
    )
    sc.transcripts(N)
    sc.enqueue()
    hour_ago = utcnow() - timedelta(hours=1)
    with sc.store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE jobs SET state = 'running', attempts = 1, lease_token = 'gone', "
                "claimed_by = 'dead-host:1', started_at = :t, heartbeat_at = :t"
            ),
            {"t": hour_ago},
        )
    sc.cluster.redis().delete("harvest")
    status = json.loads(sc.cluster.gleaner("status", "--json", "--limit", "500").stdout)
    running = status["running"]
    sc.check(
        "status shows each stuck job: run time, heartbeat age, lease expired",
        len(running) == N
        and all(r["lease_expired"] and r["running_seconds"] >= 3600 for r in running),
        f"{len(running)} listed; first {running[:1]}",
    )
    sc.step("200 rows left running with a heartbeat an hour old, no message on the queue")
    sc.fault()
    sc.start()
    sc.step("worker and beat started")
    sc.wait_all(120)
    sc.step("all settled")
    figures = sc.verify()
    rows = sc.jobs()
    sc.check(
        "every stuck job recovered once (one crash counted) and harvested with one call",
        all(int(r["crashes"]) == 1 for r in rows) and figures["model_calls"]["total"] == N,
        f"crashes {sorted({int(r['crashes']) for r in rows})}, calls "
        f"{figures['model_calls']['total']}",
    )
    sc.assert_checks()


# --- 2 -------------------------------------------------------------------------------------


def test_2_no_duplicate_messages_and_failed_jobs_stay_failed(open_scenario: OpenScenario) -> None:
    from gleaner.workers.app import make_celery
    from gleaner.workers.enqueue import send_jobs

    sc = open_scenario(
        "item2_duplicates_backlog", "A waiting backlog, duplicate messages, failed jobs", item="2"
    )
    garbage = {f"{sc.tag}{i:04d}" for i in range(5, N, 20)}
    sc.record["what"] = (
        "Model answers take 0.25 s, so the backlog of 200 waits on the queue for ~13 s while "
        "the sweep runs every 2 s with GLEANER_REQUEUE_AFTER_SECONDS=2; 10 transcripts get "
        "garbage answers and fail. The queue length is sampled every 0.2 s. Then 3 stray "
        "copies of the message of every job, done or failed, are sent."
    )
    sc.model.slow_seconds = 0.25
    sc.model.switch("slow")
    for marker in garbage:
        sc.model.overrides[marker] = "garbage"
    sc.transcripts(N)
    sc.start()
    sweeps = r"gleaner\.requeue_stale\[[^\]]+\] succeeded"
    sc.enqueue()
    swept_before = len(re.findall(sweeps, sc.logs()))
    sc.step("enqueued 200")
    client = sc.cluster.redis()
    peak = 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        peak = max(peak, int(client.llen("harvest")))
        found = sc.states()
        if found["pending"] + found["running"] == 0:
            break
        time.sleep(0.2)
    sc.record["queue_peak"] = peak
    sc.step(f"settled; the queue held at most {peak} messages")
    sc.check("the waiting backlog was never duplicated (queue <= 200)", peak <= N, f"{peak}")
    swept = len(re.findall(sweeps, sc.logs())) - swept_before
    sc.record["sweeps_during_backlog"] = swept
    sc.check(
        "the sweep ran while the backlog waited (the worker serves all queues)",
        swept >= 3,
        f"{swept} sweeps",
    )
    before = {j["id"]: (j["state"], int(j["attempts"]), j["last_error"]) for j in sc.jobs()}
    calls_before = sum(sc.model.calls.values())

    logs_received = r"Task gleaner\.harvest\[[^\]]+\] succeeded"
    baseline = len(re.findall(logs_received, sc.logs()))
    make_celery(test_settings(broker_url=sc.cluster.env["GLEANER_BROKER_URL"]))
    stray = send_jobs("harvest", [job_id for job_id in before for _ in range(3)])
    sc.step(f"{stray} stray duplicate messages sent")
    sc.wait_all(60)
    try:
        wait_for(lambda: len(re.findall(logs_received, sc.logs())) >= baseline + stray, 90)
    except TimeoutError:
        sc.check("every stray message consumed", False, "not within 90 s")
    sc.step("stray messages consumed")
    after = {j["id"]: (j["state"], int(j["attempts"]), j["last_error"]) for j in sc.jobs()}
    sc.check(
        "stray messages changed nothing: no state, attempt or error changed; no model call",
        after == before and sum(sc.model.calls.values()) == calls_before,
        f"changed {sum(1 for k in before if before[k] != after[k])}, calls "
        f"{sum(sc.model.calls.values()) - calls_before}",
    )
    sc.verify(expect_failed=dict.fromkeys(garbage, "unparseable_answer"))
    sc.assert_checks()


# --- 3 -------------------------------------------------------------------------------------


def private_transcript(i: int, tag: str) -> dict[str, Any]:
    """Each way a private span can hide: nested, across messages, in the conversation id,
    never closed; always with the secret inside."""
    marker = f"{tag}{i:04d}"
    secret = f"{SECRET}{marker}"
    kind = i % 4
    if kind == 0:
        extra = [{"role": "user", "content": f"<private><private>a</private>{secret}</private>"}]
        return transcript(i, tag, extra_messages=extra)
    if kind == 1:
        extra = [
            {"role": "user", "content": f"Begin <private>{secret} spans"},
            {"role": "assistant", "content": f"the next message {secret} too"},
            {"role": "user", "content": f"until here {secret}</private> and then no more."},
        ]
        return transcript(i, tag, extra_messages=extra)
    if kind == 2:
        return transcript(i, tag, conversation_id=f"chat-<private>{secret}</private>-{i}")
    extra = [{"role": "user", "content": f"Last words <private>{secret} never closed"}]
    return transcript(i, tag, extra_messages=extra)


def test_3_private_text_never_gets_past_redaction(open_scenario: OpenScenario) -> None:
    sc = open_scenario("item3_private_text", "Private text in every hiding place", item="3")
    sc.record["what"] = (
        "200 transcripts, each with the secret in a private span, plus (in turn) a nested "
        "span, a span opened in one message and closed two messages later, a span in the "
        "conversation id, a span never closed. The model answers every transcript with a "
        "second note whose body, topic and topic key hold a private span with the secret; one "
        "more file has the secret as a bad field value (a reader error). The secret is "
        "searched in every table, every model request, the worker and beat logs, and the "
        "enqueue output."
    )
    for i in range(N):
        marker = f"{sc.tag}{i:04d}"
        sc.model.extra[marker] = [
            note(
                f"Keeps a code {marker}",
                type="discovery",
                body=f"The code is <private>{SECRET}{marker}</private> somewhere.",
                topics=("codes", f"<private>{SECRET}{marker}</private>"),
                topic_key=f"codes/<private>{SECRET}{marker}</private>",
            )
        ]
    sc.transcripts(N, make=lambda i: private_transcript(i, sc.tag))
    bad = transcript(N, sc.tag)
    bad["messages"][0]["role"] = f"{SECRET}-as-role"
    sc.write([("bad-field.json", bad)])
    sc.start()
    sc.started_at, sc.enqueued = now(), True
    out = sc.cluster.gleaner("enqueue", "--json", str(sc.inbox))
    summary = json.loads(out.stdout)
    sc.record["input"] = {
        "transcripts": N + 1,
        "enqueued": summary["enqueued"],
        "refused": {"bad_transcript": len(summary["failures"])},
    }
    sc.check(
        "the reader error names the field, never its value",
        len(summary["failures"]) == 1 and SECRET.lower() not in (out.stdout + out.stderr).lower(),
        str(summary["failures"])[:200],
    )
    sc.step(f"enqueued {summary['enqueued']}, refused {len(summary['failures'])}")
    sc.wait_all(120)
    sc.step("all settled")
    sc.verify(refused=[f"{sc.tag}{N:04d}"])
    with sc.store.engine.connect() as conn:
        redacted_ids = conn.execute(
            text("SELECT count(*) FROM jobs WHERE conversation_id LIKE 'chat-[REDACTED]-%'")
        ).scalar_one()
        keyed = conn.execute(
            text("SELECT count(*) FROM memories WHERE title LIKE 'Keeps a code %'")
        ).scalar_one()
        with_key = conn.execute(
            text(
                "SELECT count(*) FROM memories WHERE title LIKE 'Keeps a code %' "
                "AND topic_key IS NOT NULL"
            )
        ).scalar_one()
    sc.check(
        "conversation ids redacted (chat-[REDACTED]-N)", redacted_ids == N // 4, f"{redacted_ids}"
    )
    sc.check(
        "the model's private topic key and topic dropped, its body redacted, the note kept",
        keyed == N and with_key == 0,
        f"{keyed} notes, {with_key} with a key",
    )
    sc.assert_checks()


# --- 4 -------------------------------------------------------------------------------------

PINNED_BODY = "Helix, chosen by the user; do not change."
CITY_BODY = "Lives in Tartu (written by the user)."


def test_4_pinned_and_person_written_notes_are_never_overwritten(
    open_scenario: OpenScenario,
) -> None:
    sc = open_scenario(
        "item4_pinned_notes", "Harvest aims at pinned and person-written notes", item="4"
    )
    sc.record["what"] = (
        "Each of the 8 owners has a pinned note written by the user under topic key "
        "preference/editor and an unpinned user note under profile/city. The model answers "
        "each of the 200 transcripts (as a prompt-injected transcript would make it) with, "
        "besides the marker note, a note naming preference/editor, one naming profile/city, "
        "and one holding the pinned note's fact (same title words, more body) with no key."
    )
    owners = [f"owner{n}" for n in range(8)]
    settings = test_settings()
    with sc.store.transaction() as session:
        for owner in owners:
            scope = Scope.owner(owner)
            store_notes.write(
                session,
                settings,
                scope,
                {"title": "Preferred editor", "body": PINNED_BODY, "pinned": True},
                provenance="user",
                topic_key="preference/editor",
            )
            store_notes.write(
                session,
                settings,
                scope,
                {"title": "Home city", "body": CITY_BODY},
                provenance="user",
                topic_key="profile/city",
            )
    for i in range(N):
        sc.model.extra[f"{sc.tag}{i:04d}"] = [
            note("Preferred editor", body="Injected: notepad.", topic_key="preference/editor"),
            note("Home city", body="Injected: Atlantis.", topic_key="profile/city"),
            # The pinned note's fact, adding to it: a same-fact rewrite, if it were not pinned.
            note("The preferred editor", body=f"{PINNED_BODY} Injected: notepad {i}.", topics=()),
        ]
    sc.transcripts(N)
    sc.start()
    sc.enqueue()
    sc.step("8 owners' user notes written; enqueued 200")
    sc.wait_all(120)
    sc.step("all settled")
    sc.verify()
    with sc.store.engine.connect() as conn:
        held = conn.execute(
            text(
                "SELECT topic_key, pinned, provenance, body, title FROM memories "
                "WHERE topic_key IN ('preference/editor', 'profile/city')"
            )
        ).all()
        versions = conn.execute(text("SELECT count(*) FROM memory_versions")).scalar_one()
        injected = conn.execute(
            text("SELECT count(*) FROM memories WHERE body LIKE '%Injected%'")
        ).scalar_one()
        skipped = conn.execute(
            text("SELECT coalesce(sum(notes_skipped), 0) FROM harvest_ledger")
        ).scalar_one()
    intact = [
        r
        for r in held
        if r.provenance == "user"
        and (
            (r.topic_key == "preference/editor" and r.pinned and r.body == PINNED_BODY)
            or (r.topic_key == "profile/city" and not r.pinned and r.body == CITY_BODY)
        )
    ]
    sc.record["notes_skipped"] = int(skipped)
    sc.check(
        "16 user notes intact: pinned, provenance user, text unchanged",
        len(held) == 16 and len(intact) == 16,
        f"{len(held)} keyed notes, {len(intact)} intact",
    )
    sc.check(
        "no injected text stored, no version history written",
        injected == 0 and versions == 0,
        f"injected {injected}, versions {versions}",
    )
    sc.check("3 candidates skipped per transcript", skipped == 3 * N, f"{skipped}")
    sc.assert_checks()


# --- 5 -------------------------------------------------------------------------------------

LIMITS = {
    "GLEANER_MAX_TRANSCRIPT_BYTES": "60000",
    "GLEANER_MAX_TRANSCRIPT_MESSAGES": "100",
    "GLEANER_HARVEST_MAX_CALLS": "3",
    "GLEANER_HARVEST_CONTEXT_TOKENS": "1000",
    "GLEANER_MAX_FILE_BYTES": "10000000",
}


def kill_each_run(sc: Scenario, marker: str, timeout: float = 90) -> int:
    """SIGKILL the worker child running ``marker``'s job each time one claims it, until the
    job is failed; returns how many children were killed."""
    kills, seen = 0, set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = job_rows(sc).get(marker)
        if job is not None and job["state"] == "failed":
            return kills
        if job is not None and job["state"] == "running" and sc.model.calls[marker] > kills:
            with sc.store.engine.connect() as conn:
                claimed_by = conn.execute(
                    text("SELECT claimed_by FROM jobs WHERE id = :i"), {"i": job["id"]}
                ).scalar_one()
            pid = int(str(claimed_by).rsplit(":", 1)[1])
            if (pid, job["attempts"]) not in seen:
                seen.add((pid, job["attempts"]))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                kills += 1
        time.sleep(0.1)
    raise TimeoutError(f"{marker}'s job was not failed within {timeout} s")


def test_5_oversized_input_is_refused_before_any_model_call(open_scenario: OpenScenario) -> None:
    sc = open_scenario(
        "item5_size_limits", "Oversized transcripts and a zip bomb", item="5", **LIMITS
    )
    tag = sc.tag
    huge_word = "x" * 5_000_000
    long_text = " ".join(f"word{n} detail{n}" for n in range(2_500))  # ~30 KB, ~10k tokens
    over_bytes = {f"{tag}{i:04d}" for i in (10, 50, 90)}
    over_messages = {f"{tag}{i:04d}" for i in (20, 60, 100)}
    over_calls = {f"{tag}{i:04d}" for i in (30, 70, 110, 150)}

    def make(i: int) -> dict[str, Any]:
        marker = f"{tag}{i:04d}"
        if marker in over_bytes:
            body = huge_word if i == 10 else "y " * 40_000
            return transcript(i, tag, extra_messages=[{"role": "user", "content": body}])
        if marker in over_messages:
            chatter = [{"role": "user", "content": f"line {n}"} for n in range(150)]
            return transcript(i, tag, extra_messages=chatter)
        if marker in over_calls:
            return transcript(i, tag, extra_messages=[{"role": "user", "content": long_text}])
        return transcript(i, tag)

    sc.record["what"] = (
        "Limits: 60,000 bytes and 100 messages per transcript, 3 model requests of 1,000 "
        "tokens, 10 MB per file. Of 200 transcripts, 3 are over the byte limit (one a 5 MB "
        "unbroken word), 3 over the message limit, 4 fit both but would need ~10 requests, "
        "and one kills the worker child that runs it, every time (as the 64 MB word did "
        "while tokenizing: the test SIGKILLs the child named by the job's claimed_by). "
        "Then `gleaner import --dry-run` of a ~100 KB zip whose conversations.json inflates to "
        "100 MB."
    )
    crasher = f"{tag}0199"
    sc.model.overrides[crasher] = "hang"
    sc.transcripts(N, make=make)
    sc.start(**LIMITS)
    started = time.monotonic()
    summary = sc.enqueue(expect_exit=1)
    sc.step(f"enqueue took {time.monotonic() - started:.1f} s")
    kills = kill_each_run(sc, crasher)
    sc.step(f"the worker child running {crasher} killed {kills} times")
    refused = {
        m.group(1)
        for f in summary["failures"]
        if (m := re.search(r"(M\d\dx\d{4})", str(f["conversation"])))
    }
    reasons = {str(f["error"]).split(":")[0] for f in summary["failures"]}
    sc.check(
        "over bytes and over messages refused at the door as too_large",
        refused == over_bytes | over_messages and reasons == {"too_large"},
        f"refused {sorted(refused)}, reasons {reasons}",
    )
    sc.check(
        "the refusal says size, limit and setting, never the text",
        all("GLEANER_MAX_TRANSCRIPT" in str(f["error"]) for f in summary["failures"])
        and "xxxxxxxxxx" not in json.dumps(summary),
        str(summary["failures"][:1])[:300],
    )
    sc.wait_all(120)
    sc.step("all settled")
    sc.verify(
        expect_failed={**dict.fromkeys(over_calls, "too_large"), crasher: "worker_lost"},
        refused=sorted(over_bytes | over_messages),
    )
    sc.check(
        "a transcript that kills its worker every run is failed (worker_lost) after "
        "GLEANER_JOB_MAX_CRASHES runs, not redelivered without end",
        sc.model.calls[crasher] == int(sc.settings["GLEANER_JOB_MAX_CRASHES"]),
        f"{sc.model.calls[crasher]} calls, {kills} kills",
    )
    sc.check(
        "no model call for any oversized transcript",
        all(sc.model.calls[m] == 0 for m in over_bytes | over_messages | over_calls),
        str({m: sc.model.calls[m] for m in sorted(over_calls)}),
    )

    bomb = sc.cluster.tmp / "bomb.zip"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("conversations.json", b"[" + b" " * 100_000_000 + b"]")
    bomb.write_bytes(buffer.getvalue())
    started = time.monotonic()
    out = sc.cluster.gleaner("import", str(bomb), "--owner", "owner0", "--dry-run", "--json")
    took = time.monotonic() - started
    sc.record["zip_bomb"] = {
        "zip_bytes": bomb.stat().st_size,
        "inflated_bytes": 100_000_002,
        "exit": out.returncode,
        "seconds": round(took, 1),
    }
    try:
        estimate = json.loads(out.stdout)
    except ValueError:
        estimate = {}
    sc.check(
        f"a {bomb.stat().st_size:,}-byte zip inflating to 100 MB is refused (too_large)",
        estimate.get("too_large") == 1 and estimate.get("conversations") == 0,
        (out.stdout + out.stderr)[-300:],
    )
    sc.step(f"zip bomb dry run: exit {out.returncode} after {took:.1f} s")
    sc.assert_checks()


# --- 6 -------------------------------------------------------------------------------------


def test_6_one_bad_item_does_not_stop_the_batch(open_scenario: OpenScenario) -> None:
    sc = open_scenario("item6_bad_item_in_batch", "One bad item in a batch", item="6")
    sc.record["what"] = (
        "One `gleaner enqueue` of a folder: 192 good files, a JSON Lines file of 5 "
        "conversations one of which has an owner holding NUL, a file of JSON nested 100,000 "
        "deep, a file whose owner is 300 characters, and a file that is not JSON."
    )
    tag = sc.tag
    sc.transcripts(192)
    lines = []
    for i in range(192, 197):
        item = transcript(i, tag, owner="bad\x00owner" if i == 196 else None)
        lines.append(json.dumps(item))
    sc.write(
        [
            ("batch.jsonl", "\n".join(lines) + "\n"),
            ("deep.json", "[" * 100_000 + "]" * 100_000),
            ("long-owner.json", transcript(197, tag, owner="o" * 300)),
            ("not-json.json", "this is not a transcript {"),
        ]
    )
    summary = sc.enqueue(expect_exit=1)
    sc.record["input"]["transcripts"] = N
    sc.step(f"enqueued {summary['enqueued']}, {len(summary['failures'])} failures")
    reasons = sorted(str(f["error"]).split(":")[0] for f in summary["failures"])
    sc.record["refusals"] = reasons
    sc.check(
        "196 good conversations enqueued, 4 bad items refused each with its reason",
        summary["enqueued"] == 196 and len(reasons) == 4,
        f"enqueued {summary['enqueued']}, refused {reasons}",
    )
    sc.start()
    sc.wait_all(120)
    sc.step("all settled")
    sc.verify(refused=[f"{tag}0196", f"{tag}0197"])
    sc.assert_checks()


# --- 7 -------------------------------------------------------------------------------------

BAD_OWNERS = {
    " ": "bad_owner",
    " alice": "bad_owner",
    "alice\n": "bad_owner",
    "ali\u200bce": "bad_owner",
    "\ufeffalice": "bad_owner",
    "alice\u202e": "bad_owner",
    "al\ud800ice": "bad_owner",
    "a" * 256: "bad_owner",
    "<private>alice</private>": "bad_owner",
}
NORMALIZED = {"\uff41\uff4c\uff49\uff43\uff45": "alice", "Jose\u0301": "Jos\u00e9"}


def test_7_bad_owners_are_refused_at_the_door(open_scenario: OpenScenario) -> None:
    sc = open_scenario("item7_bad_owners", "Bad owners at the door", item="7")
    sc.record["what"] = (
        "200 transcripts: 9 with a bad owner (blank, edge spaces, newline, zero-width space, "
        "BOM, bidi override, lone surrogate, 256 characters, a private tag), 2 with owners "
        "that normalize (full-width 'alice', decomposed 'Jose\\u0301'), the rest ordinary. "
        "Also `gleaner search --owner ' '`."
    )
    tag = sc.tag
    bad_at = {}
    special: dict[int, str] = {}
    for n, owner in enumerate(BAD_OWNERS):
        special[10 + n * 20] = owner
        bad_at[f"{tag}{10 + n * 20:04d}"] = owner
    for n, owner in enumerate(NORMALIZED):
        special[5 + n * 20] = owner

    def make(i: int) -> dict[str, Any]:
        return transcript(i, tag, owner=special.get(i))

    # json.dumps keeps a lone surrogate as the escape \ud800, as a producer's JSON would.
    sc.transcripts(N, make=make)
    summary = sc.enqueue(expect_exit=1)
    sc.step(f"enqueued {summary['enqueued']}, refused {len(summary['failures'])}")
    refused = {
        m.group(1): str(f["error"]).split(":")[0]
        for f in summary["failures"]
        if (m := re.search(r"(M\d\dx\d{4})", str(f["conversation"])))
    }
    sc.check(
        "each bad owner refused at enqueue (bad_owner), the rest recorded",
        refused == dict.fromkeys(bad_at, "bad_owner") and summary["enqueued"] == N - len(bad_at),
        f"refused {refused}",
    )
    blank = sc.cluster.gleaner("search", "--owner", " ", "x")
    sc.check("`gleaner search --owner ' '` is a usage error (exit 2)", blank.returncode == 2)
    sc.start()
    sc.wait_all(120)
    sc.step("all settled")
    sc.verify(refused=sorted(bad_at))
    with sc.store.engine.connect() as conn:
        owners = set(conn.execute(text("SELECT DISTINCT owner FROM jobs")).scalars())
        scopes = set(conn.execute(text("SELECT DISTINCT scope_id FROM memories")).scalars())
    expected = {f"owner{n}" for n in range(8)} | set(NORMALIZED.values())
    sc.check(
        "normalized owners stored as one name (alice, José); no look-alike scope",
        owners == expected and scopes == expected,
        f"owners {sorted(owners)}",
    )
    sc.check("no model call for a refused owner", all(sc.model.calls[m] == 0 for m in bad_at), "")
    sc.assert_checks()


# --- 8 -------------------------------------------------------------------------------------

# A model call with its retries must end before the soft limit (3 + 0.5 < 4, as start-up
# demands): the soft limit stops a harvest of several slow calls, inside one of them.
SOFT_LIMIT = {
    "GLEANER_TASK_SOFT_TIME_LIMIT": "4",
    "GLEANER_TASK_TIME_LIMIT": "6",
    "GLEANER_HARVEST_TIMEOUT_SECONDS": "3",
    "GLEANER_HARVEST_MAX_RETRY_SECONDS": "0.5",
    "GLEANER_HARVEST_CONTEXT_TOKENS": "200",
}


def three_chunks(i: int, tag: str) -> dict[str, Any]:
    """A transcript of three 200-token chunks, each holding the marker line."""
    filler = " ".join(f"note{k} detail{k}" for k in range(30))
    line = {"role": "user", "content": f"My marker is {tag}{i:04d}. {filler}"}
    return transcript(i, tag, extra_messages=[line, line, line])


@pytest.mark.parametrize("client", ["auto", "litellm"])
def test_8_soft_time_limit_inside_a_model_call_fails_the_job(
    open_scenario: OpenScenario, client: str
) -> None:
    settings = {**SOFT_LIMIT, "GLEANER_HARVEST_LLM": client}
    sc = open_scenario(
        f"item8_soft_time_limit_{client}",
        f"Soft time limit inside a model call ({client} client)",
        item="8",
        **settings,
    )
    slow = {f"{sc.tag}{i:04d}" for i in (3, 50, 100, 150, 199)}
    sc.record["what"] = (
        f"Model client GLEANER_HARVEST_LLM={client}. Soft time limit 4 s, hard 6 s; a model "
        "call may take 3 s plus 0.5 s of retries (start-up refuses a call that could outlast "
        "the soft limit). 5 of the 200 transcripts are three chunks long and the model takes "
        "2.5 s for each of their requests, so the soft limit fires inside their second call. "
        "Their jobs must fail with time_limit and no request be sent again (a client's "
        "wrapping of SoftTimeLimitExceeded, as litellm's InternalServerError, must not be "
        "taken for a transient error)."
    )
    sc.model.slow_seconds = 2.5
    for marker in slow:
        sc.model.overrides[marker] = "slow"
    sc.transcripts(
        N,
        make=lambda i: (
            three_chunks(i, sc.tag) if f"{sc.tag}{i:04d}" in slow else transcript(i, sc.tag)
        ),
    )
    sc.start(**settings)
    sc.enqueue()
    sc.wait_all(120)
    sc.step("all settled")
    sc.verify(expect_failed=dict.fromkeys(slow, "time_limit"), chunks=3)
    sent: dict[str, list[str]] = {m: [] for m in slow}
    for request in sc.server.requests[sc.requests_from :]:
        found = re.search(r"My marker is ([A-Za-z0-9]+)\.", request.user_text)
        if found and found.group(1) in sent:
            sent[found.group(1)].append(request.user_text)
    calls = {m: len(texts) for m, texts in sorted(sent.items())}
    sc.check(
        "no request of a stopped harvest sent again (calls <= 2 of its 3 chunks)",
        all(len(set(t)) == len(t) <= 2 for t in sent.values()),
        f"{calls}",
    )
    sc.assert_checks()


# --- 9 -------------------------------------------------------------------------------------

FORGOTTEN = "forgetmeqx"


def owner_markers(sc: Scenario) -> set[str]:
    with sc.store.engine.connect() as conn:
        titles = conn.execute(
            text("SELECT title FROM memories WHERE scope_id = :o"), {"o": FORGOTTEN}
        ).scalars()
        return {str(t).removeprefix("Marker ") for t in titles}


def forgotten_words(markers: set[str]) -> list[str]:
    """The forgotten owner's name, note titles and slugs."""
    titles = [f"Marker {m}" for m in sorted(markers)]
    return [FORGOTTEN, *titles, *(t.lower().replace(" ", "-") for t in titles)]


def test_9_forget_during_harvest_writes_nothing_back(open_scenario: OpenScenario) -> None:
    sc = open_scenario("item9_forget_during_harvest", "Forget an owner mid-harvest", item="9")
    mine = {f"{sc.tag}{i:04d}" for i in range(0, N, 10)}
    sc.record["what"] = (
        f"20 of the 200 transcripts belong to owner {FORGOTTEN!r}, whose model answers take "
        "2 s. Once some of them are harvested and others are inside their model call, "
        f"`gleaner forget --owner {FORGOTTEN} --yes` runs. Then the transcripts harvested "
        "before the forget are enqueued again (their tombstones: no model call, no note). "
        "(The owner's transcripts not harvested yet when forget ran: item9b_forget_pending.)"
    )
    for marker in mine:
        sc.model.overrides[marker] = "slow"

    def make(i: int) -> dict[str, Any]:
        marker = f"{sc.tag}{i:04d}"
        return transcript(i, sc.tag, owner=FORGOTTEN if marker in mine else None)

    sc.transcripts(N, make=make)
    sc.start()
    sc.enqueue()

    def mid_harvest() -> bool:
        done = len(owner_markers(sc))
        return done >= 2 and sum(sc.model.calls[m] for m in mine) >= done + 2

    wait_for(mid_harvest, 120, every=0.1)
    harvested = owner_markers(sc)
    in_call = sum(sc.model.calls[m] for m in mine) - len(harvested)
    out = sc.cluster.gleaner("forget", "--owner", FORGOTTEN, "--yes")
    sc.fault()
    assert out.returncode == 0, out.stderr
    sc.step(
        f"forget with {len(harvested)} of the owner's transcripts harvested and about "
        f"{in_call} inside their model call: {out.stdout.strip()}"
    )
    sc.record["forget_output"] = out.stdout.strip()
    sc.wait_all(120)
    # A model call of the owner's (2 s) ends after the forget, then writes: what is checked
    # is that no write comes, and a write that must not come is no event to wait for.
    time.sleep(3)
    sc.wait_all(60)
    after = owner_markers(sc)
    sc.check(
        "a harvest inside its model call when forget ran wrote nothing",
        not after,
        f"{len(after)} notes came back",
    )
    sc.step(f"settled: {len(after)} notes of the owner")
    calls_before = sum(sc.model.calls.values())
    again = sc.enqueue(*(sc.inbox / f"{m}.json" for m in sorted(harvested)))
    sc.wait_all(60)
    sc.step(f"the {again['enqueued']} transcripts harvested before forget enqueued again")
    sc.check(
        "transcripts harvested before forget, enqueued again: no model call, no note",
        not owner_markers(sc) and sum(sc.model.calls.values()) == calls_before,
        f"{sum(sc.model.calls.values()) - calls_before} calls",
    )
    # The jobs just recorded hold the owner's name, as any new job must: forget them too
    # before looking for the owner's text everywhere.
    sc.cluster.gleaner("forget", "--owner", FORGOTTEN, "--yes")
    sc.verify(forgotten=forgotten_words(mine), gone_ok=True)
    sc.assert_checks()


def test_9b_transcripts_forgotten_before_their_harvest_stay_forgotten(
    open_scenario: OpenScenario,
) -> None:
    sc = open_scenario(
        "item9b_forget_pending", "Forget an owner whose jobs are still pending", item="9"
    )
    mine = {f"{sc.tag}{i:04d}" for i in range(0, 40, 2)}
    sc.record["what"] = (
        f"40 transcripts, 20 of owner {FORGOTTEN!r}, enqueued while no worker runs (a bulk "
        f"import still waiting). `gleaner forget --owner {FORGOTTEN} --yes`, then a worker "
        "starts, then the same 40 files are enqueued again (a producer retrying, the export "
        "imported again). This scenario found the gap: until d4b5d83 forget tombstoned only "
        "harvested transcripts, and all 20 came back at full model cost."
    )

    def make(i: int) -> dict[str, Any]:
        marker = f"{sc.tag}{i:04d}"
        return transcript(i, sc.tag, owner=FORGOTTEN if marker in mine else None)

    sc.transcripts(40, make=make)
    sc.enqueue()
    out = sc.cluster.gleaner("forget", "--owner", FORGOTTEN, "--yes")
    assert out.returncode == 0, out.stderr
    sc.step(f"forget before any harvest: {out.stdout.strip()}")
    sc.record["forget_output"] = out.stdout.strip()
    sc.start()
    sc.wait_all(60)
    sc.enqueue()
    sc.step("the same 40 files enqueued again")
    sc.wait_all(60)
    sc.step("all settled")
    came_back = owner_markers(sc)
    calls = sum(sc.model.calls[m] for m in mine)
    sc.record["came_back"] = {"notes": len(came_back), "model_calls": calls}
    sc.check(
        "forgotten transcripts enqueued again: no model call, no note",
        not came_back and calls == 0,
        f"{len(came_back)} notes back, {calls} model calls",
    )
    sc.verify(skipped=mine, gone_ok=True)
    sc.assert_checks()
