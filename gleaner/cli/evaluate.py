"""``gleaner eval``: the user's own LongMemEval run against their model (the work is
``gleaner.evaluation``'s; this reads the command line, shows progress and prints the report)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import IO, Any

from gleaner.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Interrupted,
    UsageError,
    current_settings,
    ensure_schema,
    open_store,
)


class _Told:
    """Progress on stderr: a line when a question starts and ends, and the harvest's
    progress at most every GLEANER_PROGRESS_SECONDS in between."""

    def __init__(self, every: float) -> None:
        self.every = every
        self._last = float("-inf")

    def item_started(self, number: int, total: int, item: Any) -> None:
        kind = item.question_type + (", abstention" if item.abstention else "")
        _say(f"[{number}/{total}] {item.question_id} ({kind}): {len(item.sessions)} session(s)")
        self._last = time.monotonic()

    def harvest(self, item: Any, done: int, total: int) -> None:
        if done < total and time.monotonic() - self._last < self.every:
            return
        _say(f"  {item.question_id}: harvested {done}/{total}")
        self._last = time.monotonic()

    def item_done(self, number: int, total: int, record: dict[str, Any]) -> None:
        marks = {True: "yes", False: "no"}
        _say(
            f"[{number}/{total}] {record['question_id']}: gleaner "
            f"{marks[record['gleaner']['correct']]}, bm25 {marks[record['bm25']['correct']]}"
        )


def _say(line: str) -> None:
    print(f"gleaner eval: {line}", file=sys.stderr, flush=True)


def _types(raw: str | None) -> list[str]:
    from gleaner.evaluation import ABSTENTION, QUESTION_TYPES

    if not raw:
        return []
    types = [t.strip() for t in raw.split(",") if t.strip()]
    unknown = [t for t in types if t not in (*QUESTION_TYPES, ABSTENTION)]
    if unknown:
        raise UsageError(
            f"--types: {', '.join(unknown)} is no question type; use "
            f"{', '.join((*QUESTION_TYPES, ABSTENTION))}"
        )
    return types


def _endpoints(args: argparse.Namespace, settings: Any) -> tuple[Any, Any, str | None]:
    """The answer and judge endpoints, and the harvest model (None: offline)."""
    from gleaner.evaluation import Endpoint

    model = args.answer_model or settings.harvest_model
    if not model:
        raise UsageError(
            "say which model answers: --answer-model MODEL (a litellm model string such as "
            "openai/local), or set GLEANER_HARVEST_MODEL"
        )
    key = settings.harvest_api_key
    answer = Endpoint(
        model=model,
        api_base=args.api_base or settings.harvest_api_base,
        api_key=args.api_key or (key.get_secret_value() if key is not None else None),
    )

    def judged(given: str | None, default: str | None) -> str | None:
        if given is None:
            return default
        return None if given.lower() == "none" else given

    judge = Endpoint(
        model=args.judge_model or answer.model,
        api_base=judged(args.judge_api_base, answer.api_base),
        api_key=judged(args.judge_api_key, answer.api_key),
    )
    return answer, judge, settings.harvest_model


def cmd_eval(args: argparse.Namespace) -> int:
    # litellm must never fetch its price table: nothing but the configured endpoints.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from gleaner import Gleaner
    from gleaner.evaluation import (
        JUDGE_PROMPTS,
        EvalFileError,
        ModelCaller,
        Models,
        Run,
        evaluate,
        format_report,
        summarize,
    )
    from gleaner.store.errors import format_error

    settings = current_settings()
    answer, judge, harvest_model = _endpoints(args, settings)
    try:
        items, prompts = _inputs(args)
    except EvalFileError as exc:
        print(f"gleaner: {format_error(exc)}", file=sys.stderr)
        return EXIT_USAGE

    store = open_store(create=True)
    ensure_schema(store)
    gleaner = Gleaner(store=store)
    run = Run(
        answerer=ModelCaller(answer, settings, max_tokens=args.answer_max_tokens),
        judge=ModelCaller(judge, settings, max_tokens=args.judge_max_tokens),
        top_k=args.top_k,
        judge_prompts=prompts or dict(JUDGE_PROMPTS),
        owner_prefix=args.owner_prefix,
        timeout_seconds=args.timeout,
    )
    out = _open_out(args.out)
    records: list[dict[str, Any]] = []

    def keep(record: dict[str, Any]) -> None:
        records.append(record)
        if out is not None:
            out.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            out.flush()

    try:
        evaluate(gleaner, items, run, listener=_Told(settings.progress_seconds), on_record=keep)
    except KeyboardInterrupt:
        kept = f"; {args.out} holds their records" if out is not None else ""
        raise Interrupted(
            f"interrupted after {len(records)} of {len(items)} question(s){kept}"
        ) from None
    finally:
        if out is not None:
            out.close()
    report = summarize(
        records,
        Models(answer=answer.model, judge=judge.model, harvest=harvest_model),
        file=str(args.file),
        top_k=args.top_k,
        queued=gleaner.queued,
        owner_prefix=args.owner_prefix,
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    harvest = report["harvest"]
    failed = harvest["failed"] + harvest["unfinished"] + harvest["refused"]
    errors = report["gleaner"]["errors"] + report["bm25"]["errors"]
    if failed or errors:
        print(
            f"gleaner: {failed} session(s) not harvested and {errors} model call(s) failed "
            "after retries; the records (--out) say which and why",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


def _inputs(args: argparse.Namespace) -> tuple[list[Any], dict[str, str] | None]:
    """The questions to run and the judge prompts from a file (None: the built-in ones),
    once the command line's numbers are checked; EvalFileError for a bad file."""
    from gleaner.evaluation import load_items, load_judge_prompts, select_items

    if not 1 <= args.top_k <= 100:
        raise UsageError(f"--top-k must be 1..100, got {args.top_k}")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout must be positive, got {args.timeout:g}")
    for flag, value in (
        ("--answer-max-tokens", args.answer_max_tokens),
        ("--judge-max-tokens", args.judge_max_tokens),
    ):
        if not 1 <= value <= 100_000:
            raise UsageError(f"{flag} must be 1..100000, got {value}")
    types = _types(args.types)
    try:
        import rank_bm25  # noqa: F401 - the baseline's; checked before anything runs
    except ImportError:
        raise UsageError(
            "the BM25 baseline needs the rank_bm25 package: pip install 'gleaner[eval]'"
        ) from None
    items = select_items(load_items(Path(args.file)), types=types, limit=args.limit)
    prompts = load_judge_prompts(Path(args.judge_prompt)) if args.judge_prompt else None
    if not items:
        which = " of those --types" if types else ""
        raise UsageError(f"{args.file}: no question to run{which}")
    return items, prompts


def _open_out(path: str | None) -> IO[str] | None:
    if path is None:
        return None
    try:
        return open(path, "w", encoding="utf-8")  # closed after the run
    except OSError as exc:
        raise UsageError(f"--out: cannot write {path}: {exc.strerror or exc}") from None


DESCRIPTION = """\
Measure Gleaner end to end on a LongMemEval file (its published JSON format: a list of
questions, each with its haystack of dated sessions; you supply the file) against your own
model. For each question, in an owner scope of its own (--owner-prefix plus the question id,
emptied first, in the GLEANER_DATABASE_URL database):

  1. every haystack session is submitted as a conversation that ended at the session's
     date, through the real pipeline: harvested in process, or with GLEANER_BROKER_URL set
     queued for the workers and waited for (--timeout); the harvest model is
     GLEANER_HARVEST_MODEL (the offline extractor when unset);
  2. Gleaner's search retrieves the --top-k notes for the question;
  3. the answer model answers from them and the question's date;
  4. the judge model says yes or no, with the benchmark's criteria for the question's
     type (abstention questions, ids ending _abs: whether the response says it cannot
     know);
  5. the baseline, in the same run: BM25 over the haystack's turns, the top --top-k turns
     answered and judged the same way.

The report gives accuracy overall, task-averaged, by question type and for abstention, for
Gleaner and the baseline; the harvest's model calls and tokens per conversation; tokens per
query (answer and judge); search and answer latency (p50, p95); cost by litellm's bundled
price table ('unknown' for a model it does not price). Progress goes to stderr.

--judge-prompt FILE replaces the built-in judge prompts: plain text (one template for every
question) or a JSON object from question type (or 'abstention', or 'default') to template.
A template holds the placeholders {question}, {answer} (the correct answer, rubric or
explanation) and {response}; other text, braces included, is sent as written.

Exit status 0 when every question ran, 1 when a session was not harvested or a model call
failed after retries (the report is still printed), 2 for a bad command line or file."""


def register(sub: Any) -> None:
    evaluate = sub.add_parser(
        "eval",
        help="measure Gleaner on a LongMemEval file against your own model",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    evaluate.add_argument("file", metavar="LONGMEMEVAL_FILE", help="the benchmark's JSON file")
    models = evaluate.add_argument_group("models")
    models.add_argument(
        "--answer-model",
        metavar="MODEL",
        help="litellm model string of the model that answers (default: GLEANER_HARVEST_MODEL)",
    )
    models.add_argument(
        "--api-base",
        metavar="URL",
        help="its OpenAI-compatible server (default: GLEANER_HARVEST_API_BASE)",
    )
    models.add_argument(
        "--api-key",
        metavar="KEY",
        help="its API key (default: GLEANER_HARVEST_API_KEY, which keeps the key out of the "
        "process list)",
    )
    models.add_argument(
        "--judge-model", metavar="MODEL", help="the model that judges (default: the answer model)"
    )
    models.add_argument(
        "--judge-api-base",
        metavar="URL",
        help="the judge's server (default: the answer model's; 'none': the provider's own)",
    )
    models.add_argument(
        "--judge-api-key", metavar="KEY", help="the judge's API key (default: the answer's)"
    )
    models.add_argument(
        "--judge-prompt", metavar="FILE", help="the judge's prompt text (see above)"
    )
    models.add_argument(
        "--answer-max-tokens",
        type=int,
        default=512,
        metavar="N",
        help="max_tokens of an answer (default 512)",
    )
    models.add_argument(
        "--judge-max-tokens",
        type=int,
        default=10,
        metavar="N",
        help="max_tokens of a verdict (default 10, as the benchmark's judge; raise it for a "
        "model that thinks aloud first)",
    )
    evaluate.add_argument(
        "--top-k", type=int, default=10, metavar="K", help="notes or turns retrieved (1-100)"
    )
    evaluate.add_argument("--limit", type=int, metavar="N", help="run only the first N questions")
    evaluate.add_argument(
        "--types",
        metavar="T,T",
        help="run only these question types, comma-separated ('abstention' for the _abs questions)",
    )
    evaluate.add_argument(
        "--owner-prefix",
        default="eval-",
        metavar="TEXT",
        help="owner scopes are this plus the question id (default 'eval-'); each is emptied "
        "before its question runs",
    )
    evaluate.add_argument(
        "--timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="with a broker, how long to wait for one question's harvest jobs (default 3600)",
    )
    evaluate.add_argument(
        "--out", metavar="FILE", help="write each question's record as a JSON line to FILE"
    )
    evaluate.add_argument("--json", action="store_true", help="print the report as JSON")
    evaluate.set_defaults(func=cmd_eval)
