"""Validate the held-out same-fact pairs in this directory and print their counts.

Run from the repository root: ``python bench/same_fact_data/check.py``. Standard library
only. Exits 1 when an error is found.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "heldout.jsonl"
EXPECTED = ("same", "update", "distinct")
NEWER = {"existing", "candidate"}
NOTE_TYPES = {"profile", "preference", "decision", "discovery", "pattern"}
PAIR_FIELDS = {"id", "kind", "expected", "existing", "candidate", "why"}
NOTE_FIELDS = {"type", "title", "body", "topics", "topic_key", "said_at"}
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def parse_time(value: object) -> datetime:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return datetime.strptime(value, TIME_FORMAT)


def check_note(note: object, where: str, errors: list[str]) -> datetime | None:
    if not isinstance(note, dict):
        errors.append(f"{where}: not an object")
        return None
    missing, extra = NOTE_FIELDS - note.keys(), note.keys() - NOTE_FIELDS
    if missing or extra:
        errors.append(f"{where}: missing {sorted(missing)} extra {sorted(extra)}")
        return None
    if note["type"] not in NOTE_TYPES:
        errors.append(f"{where}: unknown type {note['type']!r}")
    for field in ("title", "body"):
        if not isinstance(note[field], str) or not note[field].strip():
            errors.append(f"{where}: empty {field}")
        elif note[field] != note[field].strip():
            errors.append(f"{where}: {field} has leading or trailing space")
    if isinstance(note["title"], str) and len(note["title"]) > 80:
        errors.append(f"{where}: title longer than 80 characters")
    topics = note["topics"]
    if (
        not isinstance(topics, list)
        or not 1 <= len(topics) <= 5
        or any(not isinstance(t, str) or not t or t != t.lower() for t in topics)
        or len(set(topics)) != len(topics)
    ):
        errors.append(f"{where}: topics must be 1-5 distinct lowercase strings: {topics!r}")
    key = note["topic_key"]
    if key is not None and not (isinstance(key, str) and "/" in key and key == key.strip()):
        errors.append(f"{where}: topic_key must be null or a 'group/name' string: {key!r}")
    try:
        return parse_time(note["said_at"])
    except (TypeError, ValueError):
        errors.append(f"{where}: said_at does not parse as {TIME_FORMAT}: {note['said_at']!r}")
        return None


def check_pair(row: dict[str, Any], where: str, errors: list[str]) -> None:
    allowed = PAIR_FIELDS | ({"newer"} if row.get("expected") == "update" else set())
    missing, extra = PAIR_FIELDS - row.keys(), row.keys() - allowed
    if missing or extra:
        errors.append(f"{where}: missing {sorted(missing)} extra {sorted(extra)}")
        return
    if row["expected"] not in EXPECTED:
        errors.append(f"{where}: expected must be one of {EXPECTED}: {row['expected']!r}")
    for field in ("kind", "why"):
        if not isinstance(row[field], str) or not row[field].strip():
            errors.append(f"{where}: empty {field}")
    ex_at = check_note(row["existing"], f"{where} existing", errors)
    ca_at = check_note(row["candidate"], f"{where} candidate", errors)
    if ex_at and ca_at and ex_at == ca_at:
        errors.append(f"{where}: existing and candidate have the same said_at")
    if row["expected"] == "update":
        newer = row.get("newer")
        if newer not in NEWER:
            errors.append(f"{where}: update pair needs newer in {sorted(NEWER)}: {newer!r}")
        elif ex_at and ca_at and newer != ("candidate" if ca_at > ex_at else "existing"):
            errors.append(f"{where}: newer={newer} disagrees with the said_at times")
    both = (row["existing"], row["candidate"])
    if all(isinstance(n, dict) for n in both) and all(
        both[0].get(f) == both[1].get(f) for f in ("title", "body")
    ):
        errors.append(f"{where}: existing and candidate have the same title and body")


def keying(row: dict[str, Any]) -> str:
    a, b = row["existing"]["topic_key"], row["candidate"]["topic_key"]
    if a and b:
        return "shared key" if a == b else "two keys"
    return "one side keyed" if a or b else "no key"


def main() -> int:
    errors: list[str] = []
    raw = DATA.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        print(f"{DATA.name}: not valid UTF-8 ({exc})")
        return 1
    rows: list[dict[str, Any]] = []
    seen_ids: set[object] = set()
    seen_texts: set[tuple[str, ...]] = set()
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{DATA.name}:{number}"
        if not line.strip():
            errors.append(f"{where}: blank line")
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            errors.append(f"{where}: bad JSON ({exc})")
            continue
        if not isinstance(row, dict):
            errors.append(f"{where}: not an object")
            continue
        if row.get("id") in seen_ids:
            errors.append(f"{where}: duplicate id {row.get('id')!r}")
        seen_ids.add(row.get("id"))
        if not isinstance(row.get("id"), str) or not row["id"]:
            errors.append(f"{where}: empty id")
        before = len(errors)
        check_pair(row, f"{where} ({row.get('id')})", errors)
        if len(errors) > before:
            continue
        texts = tuple(row[s][f] for s in ("existing", "candidate") for f in ("title", "body"))
        if texts in seen_texts:
            errors.append(f"{where}: the same pair appears twice")
        seen_texts.add(texts)
        rows.append(row)

    by_expected: Counter[str] = Counter(r["expected"] for r in rows)
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    keyed: dict[str, Counter[str]] = defaultdict(Counter)
    earlier: Counter[str] = Counter()
    newer: Counter[str] = Counter()
    for r in rows:
        by_kind[r["expected"]][r["kind"]] += 1
        keyed[r["expected"]][keying(r)] += 1
        if parse_time(r["candidate"]["said_at"]) < parse_time(r["existing"]["said_at"]):
            earlier[r["expected"]] += 1
        if r["expected"] == "update":
            newer[r["newer"]] += 1

    print(f"{len(rows)} pairs in {DATA.name}")
    for expected in EXPECTED:
        n = by_expected[expected]
        print(f"\n{expected}: {n}")
        for kind, count in sorted(by_kind[expected].items(), key=lambda kv: (-kv[1], kv[0])):
            print(f"  {kind:28} {count}")
        print("  keys: " + ", ".join(f"{k} {c}" for k, c in sorted(keyed[expected].items())))
        print(f"  candidate said earlier than existing: {earlier[expected]}")
    newer_text = ", ".join(f"{k} {c}" for k, c in sorted(newer.items()))
    print(f"\nupdate pairs by newer side: {newer_text}")
    total_earlier = sum(earlier.values())
    if rows:
        share = 100 * total_earlier / len(rows)
        print(f"candidate earlier overall: {total_earlier} ({share:.0f}%)")
    type_count = Counter(r[s]["type"] for r in rows for s in ("existing", "candidate"))
    print("note types: " + ", ".join(f"{t} {c}" for t, c in sorted(type_count.items())))

    for message in errors:
        print("ERROR", message)
    if errors:
        print(f"{len(errors)} error(s)")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
