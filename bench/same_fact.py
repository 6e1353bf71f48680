"""Same fact: precision and recall of ``store.terms.same_fact`` on the hand-labelled pairs,
what the model is shown of the owner's topic keys, and what the rule costs per note.

Precision must be 1.0 (no distinct fact taken for the same one); recall is reported as
measured, apart for synonyms, which a lexical rule cannot see.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

from bench.core import Context, Row
from harvest.chunks import count_tokens
from harvest.prompt import KNOWN_KEYS_MAX_CHARS, known_keys_block
from store import Settings
from store.terms import FactText, same_fact, similarity_terms
from store.text import normalize_topics

NAME = "same_fact"
PAIRS = Path(__file__).parent.parent / "tests" / "data" / "same_fact_pairs.json"
SYNONYMS = "paraphrase_synonym"


def fact(side: dict[str, object]) -> FactText:
    return FactText(str(side["title"]), str(side["body"]), normalize_topics(side["topics"]))  # type: ignore[arg-type]


def labelled(ctx: Context, threshold: float) -> None:
    pairs = json.loads(PAIRS.read_text())["pairs"]
    outcome: Counter[tuple[str, bool, bool]] = Counter()
    for pair in pairs:
        said = same_fact(fact(pair["a"]), fact(pair["b"]), threshold)
        outcome[(pair["kind"], pair["same"], said)] += 1
    merged = sum(n for (_, _, said), n in outcome.items() if said)
    right = sum(n for (_, same, said), n in outcome.items() if said and same)
    precision = right / merged if merged else 1.0
    ctx.add(
        Row(
            NAME,
            f"precision on {len(pairs)} labelled pairs",
            round(precision, 3),
            "",
            target="1.0",
            met=precision == 1.0,
            note=f"{merged - right} distinct fact(s) taken for the same",
        )
    )
    for label, kinds in (
        ("recall, lexical paraphrases", lambda k: k != SYNONYMS),
        ("recall, all paraphrases (synonyms too)", lambda k: True),
    ):
        same = sum(n for (k, s, _), n in outcome.items() if s and kinds(k))
        found = sum(n for (k, s, said), n in outcome.items() if s and said and kinds(k))
        ctx.add(Row(NAME, label, round(found / same, 3), "", note=f"{found} of {same}"))
    for kind in sorted({k for k, _, _ in outcome}):
        total = sum(n for (k, _, _), n in outcome.items() if k == kind)
        right_kind = sum(n for (k, s, said), n in outcome.items() if k == kind and s == said)
        ctx.add(Row(NAME, f"  {kind}: judged right", right_kind, "pairs", note=f"of {total}"))


def known_keys(ctx: Context, limit: int) -> None:
    keys = [
        (f"preference/topic-{n:02d}", f"Prefers option {n} for the {n}th recurring decision area")
        for n in range(limit)
    ]
    block = known_keys_block(keys)
    shown = block.count("\n- ")
    ctx.add(
        Row(
            NAME,
            f"known topic keys block ({limit} keys offered)",
            count_tokens(block),
            "tok",
            target=f"<= {KNOWN_KEYS_MAX_CHARS // 3} (bounded by {KNOWN_KEYS_MAX_CHARS} chars)",
            met=count_tokens(block) <= KNOWN_KEYS_MAX_CHARS // 3,
            note=f"{shown} keys shown",
        )
    )


def term_cost(ctx: Context) -> None:
    """CPU per note of the rule's terms, against lowercasing and splitting the same text."""
    pairs = json.loads(PAIRS.read_text())["pairs"]
    texts = [(p[s]["title"], normalize_topics(p[s]["topics"])) for p in pairs for s in "ab"]
    rounds = ctx.size(200, 20)
    # Fresh words each round would miss the stem cache as a new store does; the titles repeat,
    # as they do in a store. Warm once so both sides measure steady state.
    for title, topics in texts:
        similarity_terms(title, topics)
    started = time.perf_counter()
    for _ in range(rounds):
        for title, topics in texts:
            frozenset(f"{title} {topics}".lower().split())
    raw = (time.perf_counter() - started) / (rounds * len(texts))
    started = time.perf_counter()
    for _ in range(rounds):
        for title, topics in texts:
            similarity_terms(title, topics)
    ours = (time.perf_counter() - started) / (rounds * len(texts))
    ctx.add(
        Row(
            NAME,
            "content terms of one note (title + topics)",
            round(ours * 1e6, 2),
            "µs",
            ceiling=round(raw * 1e6, 2),
            note="ceiling: lowercase + split of the same text",
        )
    )


def run(ctx: Context) -> None:
    settings = Settings(_env_prefix="GLEANER_BENCH_UNUSED_")  # type: ignore[call-arg]
    labelled(ctx, settings.duplicate_threshold)
    known_keys(ctx, settings.harvest_known_keys)
    term_cost(ctx)
