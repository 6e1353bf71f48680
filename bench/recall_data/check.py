"""Validate the labelled recall set in this directory and print a summary.

Run from the repository root: ``python bench/recall_data/check.py``. Standard library only.
Exits 1 when an error is found; warnings (word-count and word-overlap checks on the
question wording) are printed but do not fail the run.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter, defaultdict
from datetime import date, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOTE_TYPES = {"profile", "preference", "decision", "discovery", "pattern"}
CATEGORIES = ["paraphrase", "category", "one-word", "exact", "temporal", "multi-hop", "long"]
OWNERS = [f"o{i}" for i in range(1, 9)]
SPLIT = {o: ("dev" if i < 4 else "heldout") for i, o in enumerate(OWNERS)}
FIRST, LAST = datetime(2023, 1, 1), datetime(2026, 12, 1)
NOTE_FIELDS = {"owner", "slug", "type", "title", "body", "topics", "topic_key", "occurred_at"}
QUESTION_FIELDS = {
    "id",
    "owner",
    "question",
    "answers",
    "need_all",
    "category",
    "since",
    "until",
    "split",
}

# Words left out when counting the words a question shares with its note (the check on the
# "one-word" category). A plain list for this check only; it is no part of any ranker.
_STOP_WORDS = """
a about above after again all also am an and any anything are as at be been before being
both but by can could did do does doing done each ever every for from get gets go goes
going got had has have having he her here hers him his how i if in into is it its just kind
like lot me more most my no not now of on once one only or other our out over own same she
should so some something sort still such than that the their them then there these they
thing things this those through to too under until up use used user user's users uses very
was way we went were what when where which while who whom why will with would you your
yours
"""
STOP = frozenset(_STOP_WORDS.split())


def tokens(text: str) -> set[str]:
    words = re.findall(r"[a-z0-9\u00c0-\u024f]+(?:'[a-z]+)?", text.lower())
    out = set()
    for word in words:
        w = re.sub(r"'s$", "", word)
        if w in STOP or len(w) < 2:
            continue
        out.add(stem(w))
    return out


def stem(w: str) -> str:
    """A crude suffix strip, enough to match "volunteers" with "volunteering"."""
    if len(w) >= 5 and w.endswith("ies"):
        w = w[:-3] + "y"
    elif len(w) >= 5 and w.endswith(("ches", "shes", "sses", "xes")):
        w = w[:-2]
    elif len(w) >= 6 and w.endswith("ing"):
        w = w[:-3]
    elif len(w) >= 5 and w.endswith("ed"):
        w = w[:-2]
    elif len(w) >= 4 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if len(w) > 4 and w.endswith("e"):
        w = w[:-1]
    return w


def parse_time(value: str) -> datetime:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ")


def read_jsonl(path: Path, errors: list[str]) -> list[dict]:
    raw = path.read_bytes()
    if b"\x00" in raw:
        errors.append(f"{path.name}: contains a NUL byte")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        errors.append(f"{path.name}: not valid UTF-8 ({exc})")
        return []
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            errors.append(f"{path.name}:{number}: blank line")
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"{path.name}:{number}: bad JSON ({exc})")
            continue
        if not isinstance(row, dict):
            errors.append(f"{path.name}:{number}: not an object")
            continue
        row["_line"] = number
        rows.append(row)
    return rows


def check_notes(notes: list[dict], errors: list[str], warnings: list[str]) -> dict[str, dict]:
    by_slug: dict[str, dict] = {}
    for n in notes:
        where = f"notes.jsonl:{n['_line']}"
        missing = NOTE_FIELDS - n.keys()
        extra = n.keys() - NOTE_FIELDS - {"_line"}
        if missing or extra:
            errors.append(f"{where}: missing {sorted(missing)} extra {sorted(extra)}")
            continue
        slug = n["slug"]
        if slug in by_slug:
            errors.append(f"{where}: duplicate slug {slug}")
        by_slug[slug] = n
        if n["owner"] not in OWNERS:
            errors.append(f"{where}: unknown owner {n['owner']}")
        if not slug.startswith(n["owner"] + "-"):
            errors.append(f"{where}: slug {slug} does not start with its owner")
        if n["type"] not in NOTE_TYPES:
            errors.append(f"{where}: unknown type {n['type']}")
        for field in ("title", "body"):
            if not isinstance(n[field], str) or not n[field].strip():
                errors.append(f"{where}: empty {field}")
        title_words = len(n["title"].split())
        if not 3 <= title_words <= 9:
            warnings.append(f"{where}: title has {title_words} words: {n['title']!r}")
        topics = n["topics"]
        if (
            not isinstance(topics, list)
            or not 1 <= len(topics) <= 3
            or any(not isinstance(t, str) or t != t.lower() or not t for t in topics)
        ):
            errors.append(f"{where}: topics must be 1-3 lowercase strings: {topics!r}")
        if n["topic_key"] is not None and not (
            isinstance(n["topic_key"], str) and "/" in n["topic_key"]
        ):
            errors.append(f"{where}: bad topic_key {n['topic_key']!r}")
        try:
            when = parse_time(n["occurred_at"])
            if not FIRST <= when < LAST:
                errors.append(f"{where}: occurred_at {n['occurred_at']} outside 2023-01..2026-11")
        except (TypeError, ValueError):
            errors.append(f"{where}: occurred_at does not parse: {n['occurred_at']!r}")
    return by_slug


def check_questions(
    questions: list[dict], by_slug: dict[str, dict], errors: list[str], warnings: list[str]
) -> None:
    seen_ids: set[str] = set()
    seen_text: set[tuple[str, str]] = set()
    for q in questions:
        where = f"questions.jsonl:{q['_line']}"
        missing = QUESTION_FIELDS - q.keys()
        extra = q.keys() - QUESTION_FIELDS - {"_line"}
        if missing or extra:
            errors.append(f"{where}: missing {sorted(missing)} extra {sorted(extra)}")
            continue
        if q["id"] in seen_ids:
            errors.append(f"{where}: duplicate id {q['id']}")
        seen_ids.add(q["id"])
        key = (q["owner"], q["question"].strip().lower())
        if key in seen_text:
            errors.append(f"{where}: duplicate question text for {q['owner']}")
        seen_text.add(key)
        if q["owner"] not in OWNERS:
            errors.append(f"{where}: unknown owner {q['owner']}")
            continue
        if q["split"] != SPLIT[q["owner"]]:
            errors.append(f"{where}: split {q['split']} but {q['owner']} is {SPLIT[q['owner']]}")
        if q["category"] not in CATEGORIES:
            errors.append(f"{where}: unknown category {q['category']}")
        answers = q["answers"]
        if not isinstance(answers, list) or not answers:
            errors.append(f"{where}: answers must be a non-empty list")
            continue
        if len(set(answers)) != len(answers):
            errors.append(f"{where}: repeated answer slug")
        for slug in answers:
            note = by_slug.get(slug)
            if note is None:
                errors.append(f"{where}: answer {slug} is not a note")
            elif note["owner"] != q["owner"]:
                errors.append(
                    f"{where}: answer {slug} belongs to {note['owner']}, not {q['owner']}"
                )
        if not isinstance(q["need_all"], bool):
            errors.append(f"{where}: need_all must be true or false")
        elif q["need_all"] and len(answers) < 2:
            errors.append(f"{where}: need_all with fewer than two answers")
        if q["category"] == "multi-hop" and not q["need_all"]:
            errors.append(f"{where}: multi-hop question without need_all")
        window = []
        for field in ("since", "until"):
            value = q[field]
            if value is None:
                window.append(None)
                continue
            try:
                window.append(date.fromisoformat(value))
            except (TypeError, ValueError):
                errors.append(f"{where}: {field} is not an ISO date: {value!r}")
                window.append(None)
        since, until = window
        if since and until and since > until:
            errors.append(f"{where}: since after until")
        if (since or until) and q["category"] != "temporal":
            warnings.append(f"{where}: time window on a {q['category']} question")
        if since or until:
            inside = [
                s
                for s in answers
                if s in by_slug
                and (since is None or parse_time(by_slug[s]["occurred_at"]).date() >= since)
                and (until is None or parse_time(by_slug[s]["occurred_at"]).date() <= until)
            ]
            if not inside:
                errors.append(f"{where}: no answer falls inside the since/until window")
        words = len(q["question"].split())
        if q["category"] == "long" and not 15 <= words <= 30:
            warnings.append(f"{where}: long question has {words} words")
        if q["category"] == "one-word":
            # The best-matching answer should share exactly one content word.
            shared = [
                len(tokens(q["question"]) & note_tokens(by_slug[s]))
                for s in answers
                if s in by_slug
            ]
            if shared and (max(shared) != 1):
                warnings.append(
                    f"{where}: one-word question shares {shared} content words "
                    f"with its answers: {q['question']!r}"
                )


def note_tokens(note: dict) -> set[str]:
    return tokens(note["title"] + " " + note["body"])


def overlap_summary(
    questions: list[dict], by_slug: dict[str, dict]
) -> dict[str, tuple[float, float]]:
    """By category: the mean number of content words a question shares with its best answer
    note (title and body), and the mean share of the question's content words that is."""
    rows = defaultdict(list)
    for q in questions:
        words = tokens(q["question"])
        if not words:
            continue
        best = max(
            (len(words & note_tokens(by_slug[s])) for s in q["answers"] if s in by_slug), default=0
        )
        rows[q["category"]].append((best, best / len(words)))
    return {
        c: (sum(r[0] for r in v) / len(v), sum(r[1] for r in v) / len(v)) for c, v in rows.items()
    }


def main() -> int:
    errors: list[str] = []
    warnings: list[str] = []
    notes = read_jsonl(HERE / "notes.jsonl", errors)
    questions = read_jsonl(HERE / "questions.jsonl", errors)
    by_slug = check_notes(notes, errors, warnings)
    check_questions(questions, by_slug, errors, warnings)

    notes_per_owner = Counter(n["owner"] for n in notes)
    types = Counter(n["type"] for n in notes)
    keyed = sum(1 for n in notes if n.get("topic_key"))
    dates = sorted(n["occurred_at"] for n in notes)
    q_owner = Counter(q["owner"] for q in questions)
    q_cat = Counter(q["category"] for q in questions)
    q_split = Counter(q["split"] for q in questions)
    q_cat_split = Counter((q["split"], q["category"]) for q in questions)

    print(
        f"notes: {len(notes)}  ({keyed} with a topic_key, "
        f"{dates[0][:10] if dates else '-'} .. {dates[-1][:10] if dates else '-'})"
    )
    print("  per owner: " + ", ".join(f"{o} {notes_per_owner[o]}" for o in OWNERS))
    print("  per type:  " + ", ".join(f"{t} {types[t]}" for t in sorted(types)))
    print(f"questions: {len(questions)}")
    print("  per owner: " + ", ".join(f"{o} {q_owner[o]}" for o in OWNERS))
    print("  per split: " + ", ".join(f"{s} {q_split[s]}" for s in ("dev", "heldout")))
    print(f"  {'category':<11} {'dev':>4} {'heldout':>8} {'total':>6}")
    for c in CATEGORIES:
        print(f"  {c:<11} {q_cat_split['dev', c]:>4} {q_cat_split['heldout', c]:>8} {q_cat[c]:>6}")
    print("  content words shared with the best answer note (mean count, mean share):")
    for c, (count, share) in sorted(
        overlap_summary(questions, by_slug).items(), key=lambda kv: CATEGORIES.index(kv[0])
    ):
        print(f"    {c:<11} {count:4.1f}  {share:.2f}")

    for o in OWNERS:
        if not 90 <= notes_per_owner[o] <= 110:
            warnings.append(f"{o} has {notes_per_owner[o]} notes (aim 90-110)")
        if q_owner[o] < 45:
            errors.append(f"{o} has {q_owner[o]} questions (need at least 45)")
    for w in warnings:
        print("warning:", w)
    for e in errors:
        print("ERROR:", e)
    print("OK" if not errors else f"{len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
