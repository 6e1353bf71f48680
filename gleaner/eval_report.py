"""``gleaner eval``'s report: records summed into accuracy, cost and latency per system
(:func:`summarize`), and that summary as text (:func:`format_report`)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gleaner.eval_items import QUESTION_TYPES

SYSTEMS = ("gleaner", "bm25")


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def _accuracy(flags: Sequence[bool]) -> dict[str, Any]:
    correct = sum(flags)
    return {
        "n": len(flags),
        "correct": correct,
        "accuracy": round(correct / len(flags), 4) if flags else None,
    }


def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def _ms(seconds: Sequence[float]) -> dict[str, float | None]:
    return {
        name: None if (value := percentile(seconds, p)) is None else round(value * 1000, 2)
        for name, p in (("p50", 50), ("p95", 95))
    }


def _price(model: str | None, prompt: int, completion: int) -> float | None:
    from gleaner.harvest.litellm_client import price_usd

    if model is None:
        return 0.0  # the offline harvester: no model, no cost
    return price_usd(model, prompt, completion)


def _system(records: Sequence[dict[str, Any]], name: str, models: Models) -> dict[str, Any]:
    results = [r[name] for r in records]
    by_type: dict[str, Any] = {}
    for question_type in QUESTION_TYPES:
        flags = [r[name]["correct"] for r in records if r["question_type"] == question_type]
        if flags:
            by_type[question_type] = _accuracy(flags)
    typed = [t["accuracy"] for t in by_type.values()]
    answer_in = sum(r["answer_prompt_tokens"] for r in results)
    answer_out = sum(r["answer_completion_tokens"] for r in results)
    judge_in = sum(r["judge_prompt_tokens"] for r in results)
    judge_out = sum(r["judge_completion_tokens"] for r in results)
    answer_cost = _price(models.answer, answer_in, answer_out)
    judge_cost = _price(models.judge, judge_in, judge_out)
    return {
        **_accuracy([r["correct"] for r in results]),
        "task_averaged": round(sum(typed) / len(typed), 4) if typed else None,
        "by_type": by_type,
        "abstention": _accuracy([r[name]["correct"] for r in records if r["abstention"]]),
        "errors": sum(r["error"] is not None for r in results),
        "tokens_per_query": {
            "answer_prompt": _mean([r["answer_prompt_tokens"] for r in results]),
            "answer_completion": _mean([r["answer_completion_tokens"] for r in results]),
            "judge_prompt": _mean([r["judge_prompt_tokens"] for r in results]),
            "judge_completion": _mean([r["judge_completion_tokens"] for r in results]),
            "prompt": _mean(
                [r["answer_prompt_tokens"] + r["judge_prompt_tokens"] for r in results]
            ),
        },
        "tokens": {
            "answer_prompt": answer_in,
            "answer_completion": answer_out,
            "judge_prompt": judge_in,
            "judge_completion": judge_out,
        },
        "search_ms": _ms([r["search_seconds"] for r in results]),
        "answer_ms": _ms([r["answer_seconds"] for r in results if r["answer_seconds"] is not None]),
        "cost_usd": {
            "answer": answer_cost,
            "judge": judge_cost,
            "total": None
            if answer_cost is None or judge_cost is None
            else answer_cost + judge_cost,
        },
    }


@dataclass(frozen=True)
class Models:
    """The models of a run, for the report and its prices (``harvest`` None: offline)."""

    answer: str
    judge: str
    harvest: str | None


def summarize(records: Sequence[dict[str, Any]], models: Models, **about: Any) -> dict[str, Any]:
    """The report of a run's records: for Gleaner and the BM25 baseline, accuracy overall,
    task-averaged, by question type (abstention questions counted in their type too, as the
    benchmark counts them) and for abstention alone; tokens per query; search and answer
    latency (p50, p95, ms); cost (USD by litellm's price table, None for a model it does not
    price). ``harvest``: sessions, jobs, model calls and tokens, in total and per
    conversation harvested. ``about`` goes in as given (the file, top_k, ...)."""
    harvests = [r["harvest"] for r in records]
    totals = Counter[str]()
    for harvest in harvests:
        for key in (
            "sessions",
            "submitted",
            "done",
            "failed",
            "unfinished",
            "notes_written",
            "notes_updated",
            "model_calls",
            "prompt_tokens",
            "completion_tokens",
        ):
            totals[key] += int(harvest[key])
        totals["refused"] += len(harvest["refused"])
    conversations = totals["done"] + totals["failed"]
    harvest_cost = _price(models.harvest, totals["prompt_tokens"], totals["completion_tokens"])
    systems = {name: _system(records, name, models) for name in SYSTEMS}
    parts = [harvest_cost] + [systems[name]["cost_usd"]["total"] for name in SYSTEMS]
    return {
        **about,
        "questions": len(records),
        "models": asdict(models),
        "harvest": {
            **dict(totals),
            "per_conversation": {
                key: round(totals[key] / conversations, 1) if conversations else None
                for key in ("model_calls", "prompt_tokens", "completion_tokens")
            },
            "cost_usd": harvest_cost,
        },
        **systems,
        "cost_usd": None if any(p is None for p in parts) else sum(p for p in parts if p),
    }


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _usd(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def format_report(report: Mapping[str, Any]) -> str:
    """The report as a text table."""
    gleaner, bm25 = report["gleaner"], report["bm25"]
    models = report["models"]
    lines = [
        f"LongMemEval: {report['questions']} question(s), top {report.get('top_k', '?')}; "
        f"answer {models['answer']}, judge {models['judge']}, "
        f"harvest {models['harvest'] or 'offline'}",
        "",
        f"{'accuracy':<28}{'n':>5}{'gleaner':>10}{'bm25':>10}",
        f"{'overall':<28}{gleaner['n']:>5}{_percent(gleaner['accuracy']):>10}"
        f"{_percent(bm25['accuracy']):>10}",
        f"{'task-averaged':<28}{'':>5}{_percent(gleaner['task_averaged']):>10}"
        f"{_percent(bm25['task_averaged']):>10}",
    ]
    for question_type, row in gleaner["by_type"].items():
        other = bm25["by_type"][question_type]
        lines.append(
            f"{question_type:<28}{row['n']:>5}{_percent(row['accuracy']):>10}"
            f"{_percent(other['accuracy']):>10}"
        )
    lines.append(
        f"{'abstention':<28}{gleaner['abstention']['n']:>5}"
        f"{_percent(gleaner['abstention']['accuracy']):>10}"
        f"{_percent(bm25['abstention']['accuracy']):>10}"
    )
    per_query = [
        ("answer tokens (prompt)", "tokens_per_query", "answer_prompt"),
        ("answer tokens (completion)", "tokens_per_query", "answer_completion"),
        ("judge tokens (prompt)", "tokens_per_query", "judge_prompt"),
        ("search ms p50", "search_ms", "p50"),
        ("search ms p95", "search_ms", "p95"),
        ("answer ms p50", "answer_ms", "p50"),
        ("answer ms p95", "answer_ms", "p95"),
    ]
    lines += ["", f"{'per query':<33}{'gleaner':>10}{'bm25':>10}"]
    for label, group, key in per_query:
        digits = 2 if group != "tokens_per_query" else 1
        lines.append(
            f"{label:<33}{_number(gleaner[group][key], digits):>10}"
            f"{_number(bm25[group][key], digits):>10}"
        )
    lines.append(
        f"{'cost (answers and judging)':<33}{_usd(gleaner['cost_usd']['total']):>10}"
        f"{_usd(bm25['cost_usd']['total']):>10}"
    )
    harvest = report["harvest"]
    per = harvest["per_conversation"]
    lines += [
        "",
        f"harvest: {harvest['sessions']} session(s), {harvest['done']} harvested, "
        f"{harvest['failed']} failed, {harvest['unfinished']} unfinished, "
        f"{harvest['refused']} refused; {harvest['notes_written']} notes written",
        f"harvest model: {harvest['model_calls']} call(s), {harvest['prompt_tokens']:,} prompt "
        f"+ {harvest['completion_tokens']:,} completion tokens; per conversation "
        f"{_number(per['model_calls'])} call(s), {_number(per['prompt_tokens'])} + "
        f"{_number(per['completion_tokens'])} tokens; cost {_usd(harvest['cost_usd'])}",
        f"total cost: {_usd(report['cost_usd'])}",
    ]
    errors = gleaner["errors"] + bm25["errors"]
    if errors:
        lines.append(f"model calls that failed after retries: {errors} (judged wrong)")
    return "\n".join(lines)
