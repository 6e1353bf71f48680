"""``gleaner eval``'s prompts: the answer model's, and the judge's criteria per question
type (:data:`JUDGE_PROMPTS`, or the user's own: :func:`load_judge_prompts`), and reading the
judge's yes or no."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from gleaner.eval_items import ABSTENTION, QUESTION_TYPES, EvalFileError, Item

ANSWER_PROMPT = """\
You answer a user's question about their past conversations with an AI assistant. Below are \
memory entries from those conversations, oldest first, each with the date it was said. Use \
only these entries and the current date. When entries disagree, the later one holds. For \
questions about time, count from the entries' dates and the current date. If the entries do \
not hold the answer, say that you do not know; do not guess. Answer briefly.

Current date: {question_date}

Memory entries:
{context}

Question: {question}
Answer:"""
NO_ENTRIES = "(none)"

# The judge's criteria per question type, in our own words, after the benchmark's judge
# (LongMemEval, src/evaluation/evaluate_qa.py): one yes/no question to the judge model.


def _judge_prompt(
    rule: str, label: str = "Correct answer", ask: str = "Is the response correct?"
) -> str:
    return (
        "You grade a response from an assistant that answers questions from its memory of "
        f"earlier conversations. {rule}\n\nQuestion: {{question}}\n\n{label}: {{answer}}\n\n"
        f"Response: {{response}}\n\n{ask} Answer yes or no only."
    )


_GIVES_THE_ANSWER = (
    "Say yes if the response gives the correct answer: the same answer in other words, or "
    "every step that leads to it, counts. Say no if it gives another answer, or only part of "
    "what the correct answer needs."
)
JUDGE_PROMPTS: dict[str, str] = {
    "single-session-user": _judge_prompt(_GIVES_THE_ANSWER),
    "single-session-assistant": _judge_prompt(_GIVES_THE_ANSWER),
    "multi-session": _judge_prompt(_GIVES_THE_ANSWER),
    "temporal-reasoning": _judge_prompt(
        _GIVES_THE_ANSWER + " A count of days, weeks or months that is off by one (9 days "
        "where the correct answer says 8) still counts as correct."
    ),
    "knowledge-update": _judge_prompt(
        _GIVES_THE_ANSWER + " The response may also mention what was true before; it is "
        "correct as long as the answer it gives as current is the correct answer."
    ),
    "single-session-preference": _judge_prompt(
        "Instead of one correct answer you get a rubric of what a response personalised for "
        "this user would do. Say yes if the response recalls what it knows about the user "
        "and uses it correctly, as the rubric describes; it need not cover every point of "
        "the rubric. Otherwise say no.",
        label="Rubric",
        ask="Does the response satisfy it?",
    ),
    ABSTENTION: _judge_prompt(
        "This question cannot be answered from the conversation history; the explanation "
        "says why. Say yes if the response recognises that: it says it does not know, that "
        "the information is missing or incomplete, or that only other, related information "
        "is known. Say no if it answers as if it knew.",
        label="Explanation",
        ask="Does the response recognise that the question cannot be answered?",
    ),
}
PLACEHOLDERS = ("{question}", "{answer}", "{response}")
# A reasoning model's thoughts ahead of its answer (Qwen3 and DeepSeek-R1 through llama.cpp
# or Ollama write them into the content); an unclosed block is all thought.
_THOUGHTS = re.compile(
    r"\A\s*<(think|thinking|reasoning)>.*?(?:</\1>|\Z)", re.IGNORECASE | re.DOTALL
)
_VERDICT = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def judge_key(item: Item) -> str:
    """The judge prompt an item takes: ``abstention`` or its question type."""
    return ABSTENTION if item.abstention else item.question_type


def load_judge_prompts(path: Path) -> dict[str, str]:
    """Judge prompts from a file: plain text (one template for every question), or a JSON
    object from question type (or ``abstention``, or ``default`` for the types it leaves
    out) to template. A template holds ``{question}``, ``{answer}`` (the correct answer,
    rubric or explanation) and ``{response}``; any other text is sent as written. Types the
    file leaves out keep :data:`JUDGE_PROMPTS`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalFileError(f"{path}: cannot read the judge prompt ({exc})") from None
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        known = (*QUESTION_TYPES, ABSTENTION, "default")
        unknown = sorted(set(parsed) - set(known))
        if unknown:
            raise EvalFileError(
                f"{path}: judge prompt keys {unknown} are none of {', '.join(known)}"
            )
        templates = dict(parsed)
    else:
        templates = {"default": text}
    for key, template in templates.items():
        if not isinstance(template, str):
            raise EvalFileError(f"{path}: the judge prompt for {key!r} is not a string")
        missing = [p for p in PLACEHOLDERS if p not in template]
        if missing:
            raise EvalFileError(
                f"{path}: the judge prompt for {key!r} lacks {', '.join(missing)} "
                f"(a template holds {', '.join(PLACEHOLDERS)})"
            )
    default = templates.pop("default", None)
    return {key: templates.get(key, default or built_in) for key, built_in in JUDGE_PROMPTS.items()}


def fill(template: str, values: Mapping[str, str]) -> str:
    """The template with each ``{name}`` of ``values`` replaced, in one pass: a value that
    holds a placeholder (a response quoting ``{answer}``) is left as it is, and so is any
    other text in braces."""
    names = "|".join(re.escape(name) for name in values)
    return re.sub(r"\{(" + names + r")\}", lambda found: values[found.group(1)], template)


def without_thoughts(text: str) -> str:
    """The answer without a reasoning model's leading thoughts."""
    return _THOUGHTS.sub("", text, count=1).strip()


def verdict(text: str) -> bool:
    """The judge's answer as yes (True) or no: the first ``yes`` or ``no`` word after any
    thoughts; neither is no."""
    found = _VERDICT.search(without_thoughts(text))
    return found is not None and found.group(1).lower() == "yes"
