"""`gleaner eval` end to end: the sample LongMemEval file (tests/data) harvested through the
real pipeline, answered and judged by a scripted OpenAI-compatible server, and the report's
numbers checked against what that server's answers make them.

The server (:class:`Oracle`) harvests one note per user turn (never the assistant's) and
answers a question from the memory entries it is shown: right when they hold the answer's key
words, "Nothing in memory says." otherwise. The judge's verdicts are scripted per question
(:data:`JUDGED`): the first judge call of a question judges Gleaner's response, the second
the baseline's (evaluate_item's order), so the accuracy figures follow from that table alone,
whatever search ranks. The dogs question is built so that retrieval differs: Gleaner's search
stems "dogs" and "breeds" and finds the golden retrievers; BM25's plain words miss them.

"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gleaner.evaluation import (
    ABSTENTION,
    JUDGE_PROMPTS,
    QUESTION_TYPES,
    Item,
    Run,
    Session,
    Turn,
    fill,
    format_report,
    ingest,
    load_items,
    parse_date,
    percentile,
    verdict,
)
from tests.cli_harness import Cli, cli
from tests.llm_server import (
    Behaviour,
    LLMServer,
    answer,
    llm_server,
    note,
    server_error,
    unauthorized,
)
from tests.workers_harness import Cluster, fresh_cluster

__all__ = ["cli"]  # the fixture, used by name

SAMPLE = Path(__file__).parent / "data" / "longmemeval_sample.json"
UNKNOWN = "Nothing in memory says."
# Each question's key words (all must be in the memory entries shown) and the answer given.
ORACLE: dict[str, tuple[tuple[str, ...], str] | None] = {
    "What breed is my dog?": (("golden retriever",), "Your dogs are golden retrievers."),
    "What was the name of the pasta dish you recommended to me?": (
        ("cacio e pepe",),
        "It was cacio e pepe.",
    ),
    "How many cats do I have now?": (("three cats",), "You have three cats now."),
    "How many days before my marathon did I buy new running shoes?": (
        ("running shoes", "marathon"),
        "10 days before it.",
    ),
    "Can you suggest a weekend activity for me?": (
        ("birdwatching",),
        "Take your camera birdwatching at the lake.",
    ),
    "What breed is my cat?": None,
}
ABSTENTION_QUESTION = "What breed is my cat?"
HARVEST_TOKENS, ANSWER_TOKENS, JUDGE_TOKENS = (100, 20), (300, 7), (50, 1)
# The judge's answers per question: to Gleaner's response, then to the baseline's (written
# as judges write them: the verdict is the first yes or no after any thoughts).
JUDGED = {
    "What breed is my dog?": ("Yes.", "no"),
    "What was the name of the pasta dish you recommended to me?": ("No, it is not.", "yes"),
    "How many cats do I have now?": ("yes", "<think>three? no, fine</think>Yes"),
    "How many days before my marathon did I buy new running shoes?": ("yes", "No"),
    "Can you suggest a weekend activity for me?": ("no", "no"),
    "What breed is my cat?": ("yes", "yes"),
}
EXPECTED = {  # question_id: (gleaner correct, bm25 correct), as JUDGED says
    "sample_ssu_dogs": (True, False),
    "sample_ssa_pasta": (False, True),
    "sample_ku_cats": (True, True),
    "sample_tr_marathon": (True, False),
    "sample_pref_weekend": (False, False),
    "sample_ssu_cat_breed_abs": (True, True),
}
SESSIONS = 12  # in the sample, one harvest call each
# (questions, correct) by type; the abstention question is single-session-user too.
BY_TYPE = {
    "gleaner": {
        "single-session-user": (2, 2),
        "single-session-assistant": (1, 0),
        "single-session-preference": (1, 0),
        "temporal-reasoning": (1, 1),
        "knowledge-update": (1, 1),
    },
    "bm25": {
        "single-session-user": (2, 1),
        "single-session-assistant": (1, 1),
        "single-session-preference": (1, 0),
        "temporal-reasoning": (1, 0),
        "knowledge-update": (1, 1),
    },
}


class Oracle:
    """Harvest, answer and judge requests, told apart by what they hold."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.judge_prompts: list[str] = []
        self.judged: Counter[str] = Counter()

    def __call__(self, body: dict[str, Any]) -> Behaviour:
        prompt = str(body["messages"][-1]["content"])
        if "<transcript>" in prompt:
            self.kinds.append("harvest")
            return self.harvest(prompt)
        if "Memory entries:" in prompt:
            self.kinds.append("answer")
            return self.answer(prompt)
        self.kinds.append("judge")
        self.judge_prompts.append(prompt)
        return self.judge(prompt)

    def harvest(self, prompt: str) -> Behaviour:
        transcript = prompt.split("<transcript>", 1)[1].split("</transcript>", 1)[0]
        said = [
            line[len("User: ") :] for line in transcript.splitlines() if line.startswith("User: ")
        ]
        notes = [
            note(line[:60], type="profile", body=f"The user said: {line}", topics=("sample",))
            for line in said
        ]
        return answer(notes, prompt_tokens=HARVEST_TOKENS[0], completion_tokens=HARVEST_TOKENS[1])

    def answer(self, prompt: str) -> Behaviour:
        context = prompt.split("Memory entries:", 1)[1].rsplit("\nQuestion: ", 1)[0].lower()
        question = prompt.rsplit("\nQuestion: ", 1)[1].split("\n", 1)[0]
        known = ORACLE[question]
        reply = UNKNOWN
        if known is not None and all(key in context for key in known[0]):
            reply = known[1]
        return Behaviour(
            content=reply, prompt_tokens=ANSWER_TOKENS[0], completion_tokens=ANSWER_TOKENS[1]
        )

    def judge(self, prompt: str) -> Behaviour:
        question = next(q for q in JUDGED if q in prompt)
        verdicts = JUDGED[question]
        self.judged[question] += 1
        return Behaviour(
            content=verdicts[(self.judged[question] - 1) % 2],
            prompt_tokens=JUDGE_TOKENS[0],
            completion_tokens=JUDGE_TOKENS[1],
        )


@pytest.fixture
def oracle() -> Oracle:
    return Oracle()


@pytest.fixture
def server(oracle: Oracle) -> Iterator[LLMServer]:
    with llm_server(oracle) as running:
        yield running


def model_env(server: LLMServer, database_url: str, model: str = "openai/test-model") -> dict:
    return {
        "GLEANER_DATABASE_URL": database_url,
        "GLEANER_HARVEST_MODEL": model,
        "GLEANER_HARVEST_API_BASE": server.api_base,
        "GLEANER_HARVEST_API_KEY": "test-key",
        "GLEANER_HARVEST_TIMEOUT_SECONDS": "5",
        "GLEANER_HARVEST_MAX_ATTEMPTS": "2",
        "GLEANER_HARVEST_MAX_RETRY_SECONDS": "3",
    }


def check_report(report: dict[str, Any]) -> None:
    """The numbers the oracle's answers make (see the module docstring)."""
    assert report["questions"] == 6 and report["top_k"] == 2
    for system in ("gleaner", "bm25"):
        got = report[system]
        correct = sum(marks[system == "bm25"] for marks in EXPECTED.values())
        assert (got["n"], got["correct"]) == (6, correct), system
        assert got["accuracy"] == pytest.approx(correct / 6, abs=1e-4)
        by_type = {name: (row["n"], row["correct"]) for name, row in got["by_type"].items()}
        assert by_type == BY_TYPE[system], system
        assert (got["abstention"]["n"], got["abstention"]["correct"]) == (1, 1)
        assert got["errors"] == 0
        per_query = got["tokens_per_query"]
        assert (per_query["answer_prompt"], per_query["judge_prompt"]) == (300, 50)
        assert per_query["prompt"] == 350
        assert got["search_ms"]["p50"] is not None and got["answer_ms"]["p95"] is not None
    assert report["gleaner"]["task_averaged"] == pytest.approx(0.6)  # (1 + 0 + 0 + 1 + 1) / 5
    assert report["bm25"]["task_averaged"] == pytest.approx(0.5)  # (0.5 + 1 + 0 + 0 + 1) / 5
    harvest = report["harvest"]
    assert (harvest["sessions"], harvest["done"], harvest["failed"]) == (SESSIONS, SESSIONS, 0)
    assert harvest["model_calls"] == SESSIONS
    assert (harvest["prompt_tokens"], harvest["completion_tokens"]) == (
        SESSIONS * HARVEST_TOKENS[0],
        SESSIONS * HARVEST_TOKENS[1],
    )
    assert harvest["per_conversation"] == {
        "model_calls": 1.0,
        "prompt_tokens": 100.0,
        "completion_tokens": 20.0,
    }
    assert harvest["notes_written"] > 0


def test_eval_runs_the_sample_end_to_end_on_sqlite(
    cli: Cli, server: LLMServer, oracle: Oracle, tmp_path: Path
) -> None:
    cli.env(**model_env(server, f"sqlite:///{tmp_path / 'eval.db'}"))
    out = tmp_path / "records.jsonl"
    ran = cli("eval", str(SAMPLE), "--top-k", "2", "--json", "--out", str(out))
    assert ran.code == 0, ran.err
    report = ran.json()
    check_report(report)
    assert report["models"] == {
        "answer": "openai/test-model",
        "judge": "openai/test-model",
        "harvest": "openai/test-model",
    }
    assert report["cost_usd"] is None  # litellm prices no "test-model"
    assert report["queued"] is False
    # Every call went to the server: one harvest per session, then answer and judge per
    # question and system.
    assert oracle.kinds.count("harvest") == SESSIONS
    assert oracle.kinds.count("answer") == oracle.kinds.count("judge") == 12
    # Progress on stderr: each question started and judged.
    assert "[1/6] sample_ssu_dogs: gleaner yes, bm25 no" in ran.err
    assert "[6/6] sample_ssu_cat_breed_abs: gleaner yes, bm25 yes" in ran.err

    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question_id"] for r in records] == list(EXPECTED)
    for record in records:
        marks = EXPECTED[record["question_id"]]
        assert (record["gleaner"]["correct"], record["bm25"]["correct"]) == marks
        assert len(record["bm25"]["retrieved"]) == 2
        assert record["owner"] == f"eval-{record['question_id']}"
    dogs = records[0]
    # Gleaner's search stems "dogs" and "breeds": it finds both notes on dogs, each said on
    # its session's date, and the answer model answers from them.
    assert {hit["said"] for hit in dogs["gleaner"]["retrieved"]} == {
        "2023/05/20 (Sat) 02:21",
        "2023/05/24 (Wed) 18:05",
    }
    assert dogs["gleaner"]["response"] == "Your dogs are golden retrievers."
    # BM25's plain words ("breed", "dog") are in the second session's turns only.
    assert [hit["ref"] for hit in dogs["bm25"]["retrieved"]] == ["dogs_b#0", "dogs_b#1"]
    assert dogs["bm25"]["response"] == UNKNOWN
    assert dogs["bm25"]["judge_text"] == "no"

    # The text report says the same.
    text = cli("eval", str(SAMPLE), "--top-k", "2")
    assert text.code == 0, text.err
    assert re.search(r"^overall\s+6\s+66\.7%\s+50\.0%$", text.out, re.MULTILINE)
    assert re.search(r"^task-averaged\s+60\.0%\s+50\.0%$", text.out, re.MULTILINE)
    assert re.search(r"^single-session-user\s+2\s+100\.0%\s+50\.0%$", text.out, re.MULTILINE)
    assert re.search(r"^abstention\s+1\s+100\.0%\s+100\.0%$", text.out, re.MULTILINE)
    assert "harvest model: 12 call(s), 1,200 prompt + 240 completion tokens" in text.out
    # A second run in the same database starts from empty scopes: the harvest is paid again.
    assert oracle.kinds.count("harvest") == 2 * SESSIONS


@pytest.mark.postgres
def test_eval_runs_in_process_on_postgresql(
    cli: Cli, server: LLMServer, make_store: Any, pg_url: str
) -> None:
    make_store("postgresql")  # emptied
    cli.env(**model_env(server, pg_url))
    ran = cli("eval", str(SAMPLE), "--top-k", "2", "--json")
    assert ran.code == 0, ran.err
    check_report(ran.json())


@pytest.fixture
def cluster(tmp_path: Path, worker_id: str) -> Iterator[Cluster]:
    yield from fresh_cluster("eval", worker_id, tmp_path)


@pytest.mark.slow
@pytest.mark.postgres
def test_eval_with_a_broker_waits_for_the_workers_harvest(
    cluster: Cluster, server: LLMServer, oracle: Oracle, tmp_path: Path
) -> None:
    """With GLEANER_BROKER_URL set, submit queues each session and a real worker harvests
    it; the run waits for the jobs and counts their calls and tokens."""
    models = model_env(server, cluster.env["GLEANER_DATABASE_URL"])
    cluster.start_worker(queues="harvest", concurrency=2, **models)
    ran = subprocess.run(
        [sys.executable, "-m", "gleaner.cli", "eval", str(SAMPLE), "--top-k", "2", "--json"],
        env={**cluster.env, **models, "GLEANER_PROGRESS_SECONDS": "0"},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert report["queued"] is True
    check_report(report)
    assert "sample_ssu_dogs: harvested 3/3" in ran.stderr
    assert oracle.kinds.count("harvest") == SESSIONS


def test_eval_prices_models_litellm_knows(cli: Cli, server: LLMServer, tmp_path: Path) -> None:
    """gpt-4o-mini (served by the test server under that name) is in litellm's bundled
    price table: every part of the run has a cost."""
    cli.env(**model_env(server, f"sqlite:///{tmp_path / 'eval.db'}", "openai/gpt-4o-mini"))
    ran = cli("eval", str(SAMPLE), "--limit", "2", "--json")
    assert ran.code == 0, ran.err
    report = ran.json()
    assert report["questions"] == 2
    assert report["harvest"]["cost_usd"] > 0
    assert report["gleaner"]["cost_usd"]["answer"] > 0
    assert report["gleaner"]["cost_usd"]["judge"] > 0
    parts = [report["harvest"]["cost_usd"]] + [
        report[s]["cost_usd"]["total"] for s in ("gleaner", "bm25")
    ]
    assert report["cost_usd"] == pytest.approx(sum(parts))


def test_without_a_harvest_model_the_offline_harvester_runs(
    cli: Cli, server: LLMServer, oracle: Oracle, tmp_path: Path
) -> None:
    """GLEANER_HARVEST_MODEL unset: the offline extractor harvests (no call, no cost) and
    --answer-model with --api-base answers and judges."""
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path / 'eval.db'}")
    ran = cli(
        "eval", str(SAMPLE), "--limit", "1", "--json",
        "--answer-model", "openai/test-model", "--api-base", server.api_base, "--api-key", "k",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    report = ran.json()
    assert report["models"]["harvest"] is None
    assert (report["harvest"]["done"], report["harvest"]["model_calls"]) == (3, 0)
    assert report["harvest"]["cost_usd"] == 0.0
    assert oracle.kinds == ["answer", "judge", "answer", "judge"]
    assert "harvest offline" in format_report(report)


def test_a_model_call_that_keeps_failing_is_recorded_and_the_run_exits_1(
    cli: Cli, server: LLMServer, tmp_path: Path
) -> None:
    """The answer model fails twice (every attempt allowed) for Gleaner's first answer: the
    question is judged wrong for Gleaner with the error kept, the baseline still runs, and
    the run exits 1 after printing the report. A refused key ends the run at once."""
    cli.env(
        GLEANER_DATABASE_URL=f"sqlite:///{tmp_path / 'eval.db'}",
        GLEANER_HARVEST_MAX_ATTEMPTS="2",
        GLEANER_HARVEST_MAX_RETRY_SECONDS="3",
    )
    flags = ("--answer-model", "openai/test-model", "--api-base", server.api_base)
    server.script(server_error(), server_error())  # offline harvest: these are the answer's
    out = tmp_path / "records.jsonl"
    ran = cli("eval", str(SAMPLE), "--limit", "1", "--json", "--out", str(out), *flags)
    assert ran.code == 1
    report = ran.json()
    assert (report["gleaner"]["errors"], report["gleaner"]["correct"]) == (1, 0)
    assert (report["bm25"]["errors"], report["bm25"]["n"]) == (0, 1)
    [record] = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["gleaner"]["error"].startswith("model_transient: HTTP 500")
    assert record["gleaner"]["response"] is None
    assert "1 model call(s) failed after retries" in ran.err

    server.script(unauthorized())
    ran = cli("eval", str(SAMPLE), "--limit", "1", *flags)
    assert ran.code == 1 and "Incorrect API key" in ran.err


def test_types_and_limit_choose_the_questions(
    cli: Cli, server: LLMServer, oracle: Oracle, tmp_path: Path
) -> None:
    cli.env(**model_env(server, f"sqlite:///{tmp_path / 'eval.db'}"))
    ran = cli("eval", str(SAMPLE), "--types", "knowledge-update,abstention", "--json")
    assert ran.code == 0, ran.err
    report = ran.json()
    assert report["questions"] == 2
    assert set(report["gleaner"]["by_type"]) == {"knowledge-update", "single-session-user"}
    assert report["gleaner"]["abstention"]["n"] == 1
    assert oracle.kinds.count("harvest") == 3  # the cats' 2 sessions, the cat breed's 1

    limited = cli("eval", str(SAMPLE), "--types", "single-session-user", "--limit", "1", "--json")
    assert limited.code == 0 and limited.json()["questions"] == 1

    bad = cli("eval", str(SAMPLE), "--types", "single-hop")
    assert bad.code == 2 and "single-hop is no question type" in bad.err


def test_a_judge_prompt_file_replaces_the_built_in_prompts(
    cli: Cli, server: LLMServer, oracle: Oracle, tmp_path: Path
) -> None:
    cli.env(**model_env(server, f"sqlite:///{tmp_path / 'eval.db'}"))
    plain = tmp_path / "judge.txt"
    plain.write_text("Q: {question}\nGold: {answer}\nSaid: {response}\n{not a placeholder}")
    ran = cli("eval", str(SAMPLE), "--limit", "1", "--judge-prompt", str(plain), "--json")
    assert ran.code == 0, ran.err
    assert oracle.judge_prompts[0] == (
        "Q: What breed is my dog?\nGold: Golden retriever\n"
        "Said: Your dogs are golden retrievers.\n{not a placeholder}"
    )

    per_type = tmp_path / "judge.json"
    per_type.write_text(json.dumps({"abstention": "ABS {question} {answer} {response}"}))
    oracle.judge_prompts.clear()
    ran = cli(
        "eval", str(SAMPLE), "--types", "single-session-user", "--judge-prompt", str(per_type)
    )
    assert ran.code == 0, ran.err
    # The abstention question gets the file's prompt; the other keeps the built-in one.
    assert oracle.judge_prompts[0].startswith(JUDGE_PROMPTS["single-session-user"][:40])
    assert oracle.judge_prompts[-1].startswith("ABS What breed is my cat? ")

    missing = tmp_path / "bad.txt"
    missing.write_text("Q: {question} A: {answer}")
    ran = cli("eval", str(SAMPLE), "--judge-prompt", str(missing))
    assert ran.code == 2
    assert str(missing) in ran.err and "lacks {response}" in ran.err


def _bad(item_changes: dict[str, Any]) -> Any:
    data = json.loads(SAMPLE.read_text())
    data[1].update(item_changes)
    return data


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "not JSON"),
        ({"question_id": "x"}, "a JSON list of questions, got an object"),
        (_bad({"question": None}), "item 2 (question_id 'sample_ssa_pasta'): question is null"),
        (_bad({"haystack_dates": ["2023/07/02 (Sun) 19:30"]}), "haystack_dates has 1 entries"),
        (_bad({"haystack_dates": ["yesterday", "today"]}), "haystack_dates[0] 'yesterday'"),
        (_bad({"question_type": "single-hop"}), "question_type 'single-hop' is none of"),
        (
            _bad({"haystack_sessions": [[{"role": "bot", "content": "hi"}], []]}),
            "haystack_sessions[0][0]: role must be 'user' or 'assistant'",
        ),
        (_bad({"question_id": "sample_ssu_dogs"}), "question_id is used twice"),
    ],
)
def test_a_malformed_file_is_a_clear_error_naming_it(
    cli: Cli, tmp_path: Path, content: Any, says: str
) -> None:
    path = tmp_path / "broken.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path / 'eval.db'}")
    ran = cli("eval", str(path), "--answer-model", "openai/unused")
    assert ran.code == 2, ran.err
    assert ran.err.startswith(f"gleaner: bad_eval_file: {path}: "), ran.err
    assert says in ran.err
    assert not (tmp_path / "eval.db").exists()  # nothing ran


def test_a_missing_file_or_model_is_a_usage_error(cli: Cli, tmp_path: Path) -> None:
    cli.env(GLEANER_DATABASE_URL=f"sqlite:///{tmp_path / 'eval.db'}")
    ran = cli("eval", str(tmp_path / "nowhere.json"), "--answer-model", "openai/unused")
    assert ran.code == 2 and "nowhere.json: cannot read it" in ran.err
    ran = cli("eval", str(SAMPLE))
    assert ran.code == 2 and "--answer-model" in ran.err


def test_eval_help_explains_the_run(cli: Cli) -> None:
    ran = cli("eval", "--help")
    assert ran.code == 0
    for words in ("LongMemEval", "BM25", "--judge-prompt", "{response}", "GLEANER_BROKER_URL"):
        assert words in ran.out


# --- pieces ------------------------------------------------------------------------------


def test_the_sample_reads_as_items() -> None:
    items = load_items(SAMPLE)
    assert len(items) == 6
    assert {i.question_type for i in items} >= {
        "single-session-user",
        "single-session-assistant",
        "single-session-preference",
        "temporal-reasoning",
        "knowledge-update",
    }
    assert [i.question_id for i in items if i.abstention] == ["sample_ssu_cat_breed_abs"]
    assert items[0].sessions[0].when.isoformat() == "2023-05-20T02:21:00+00:00"


def test_dates_fill_and_verdicts() -> None:
    assert parse_date("2023/05/20 (Sat) 02:21").hour == 2
    assert parse_date("2023-05-20T02:21:00").tzinfo is not None
    with pytest.raises(ValueError, match="May 20"):
        parse_date("May 20")
    # One pass: a response quoting a placeholder stays as it is.
    assert fill("{answer}|{response}", {"answer": "{response}", "response": "x"}) == (
        "{response}|x"
    )
    assert verdict("Yes.") and verdict("<think>no, wait</think> yes") and not verdict("No")
    assert not verdict("I cannot tell") and not verdict("eyes")
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert percentile([1.0, 2.0], 95) == 2.0 and percentile([], 50) is None
    assert set(JUDGE_PROMPTS) == {*QUESTION_TYPES, ABSTENTION}
    for prompt in JUDGE_PROMPTS.values():
        assert all(p in prompt for p in ("{question}", "{answer}", "{response}"))


class Queued:
    """A Gleaner with a broker, faked: submit queues, each job finishes after two looks,
    and one job never does."""

    queued = True

    def __init__(self) -> None:
        self.looks: dict[str, int] = {}

    def submit(self, conversation: dict[str, Any]) -> str:
        job_id = conversation["conversation_id"]
        self.looks[job_id] = 0
        return str(job_id)

    def job(self, job_id: str) -> Any:
        from types import SimpleNamespace

        self.looks[job_id] += 1
        stuck = job_id == "stuck"
        state = "running" if stuck or self.looks[job_id] < 2 else "done"
        return SimpleNamespace(
            state=state,
            conversation_id=job_id,
            error=None,
            model_calls=1,
            prompt_tokens=10,
            completion_tokens=2,
            notes_written=1,
            notes_updated=0,
        )


class Progress:
    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def item_started(self, number: int, total: int, item: Item) -> None:
        pass

    def harvest(self, item: Item, done: int, total: int) -> None:
        self.seen.append((done, total))

    def item_done(self, number: int, total: int, record: dict[str, Any]) -> None:
        pass


def test_queued_jobs_are_waited_for_until_the_timeout() -> None:
    when = parse_date("2023/05/20 (Sat) 02:21")
    turns = (Turn("user", "hello"),)
    item = Item(
        "q",
        "single-session-user",
        "?",
        "!",
        "2023/05/21",
        (Session("one", "d", when, turns), Session("stuck", "d", when, turns)),
    )
    run = Run(answerer=None, judge=None, timeout_seconds=0.3, poll_seconds=0.05)  # type: ignore[arg-type]
    progress = Progress()
    harvested = ingest(Queued(), item, "eval-q", run, progress)  # type: ignore[arg-type]
    assert (harvested.submitted, harvested.done, harvested.unfinished) == (2, 1, 1)
    assert (harvested.model_calls, harvested.prompt_tokens) == (2, 20)
    assert progress.seen[0] == (0, 2) and progress.seen[-1] == (1, 2)
