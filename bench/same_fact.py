"""Same fact: precision and recall of ``store.notes.terms.same_fact`` on the hand-labelled pairs,
what the model is shown of the owner's topic keys, and what the rule costs per note.

Precision must be 1.0 (no distinct fact taken for the same one); recall is reported as
measured, apart for synonyms, which a lexical rule cannot see.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.core import Context, Row
from gleaner.harvest.chunks import count_tokens
from gleaner.harvest.prompt import KNOWN_KEYS_MAX_CHARS, known_keys_block
from gleaner.harvest.transcript import Message, Transcript
from gleaner.store import Settings
from gleaner.store.notes.terms import FactText, same_fact, similarity_terms
from gleaner.store.text import normalize_topics

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
    heldout(ctx)


HELDOUT = Path(__file__).parent / "same_fact_data" / "heldout.jsonl"


def _said(text_: str) -> datetime:
    return datetime.fromisoformat(text_.replace("Z", "+00:00"))


def _chat(cid: str, side: dict[str, Any]) -> Transcript:
    """The conversation a side's fact came from: the user states it."""
    line = f"{side['title']}. {side['body']}"
    return Transcript(
        conversation_id=cid,
        owner="bench",
        ended_at=_said(str(side["said_at"])),
        messages=[
            Message(role="user", content=line),
            Message(role="assistant", content="Noted."),
        ],
    )


def _item(side: dict[str, Any], mark: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": side["type"],
        "title": side["title"],
        "body": side["body"],
        "topics": side["topics"],
        "topic_key": side["topic_key"],
        "confidence": 0.9,
        "evidence": [{"speaker": "user", "quote": f"{side['title']}. {side['body']}"}],
        **mark,
    }


def heldout(ctx: Context) -> None:
    """The held-out pairs through the real harvest (a scripted model): the existing note
    harvested first, then the candidate's conversation; ``marked``, the model marks the
    candidate as its label says *when it was shown the existing note* (else "new"), as a
    model that judges right but sees only what it is shown; unmarked, no marks (an older
    model): the lexical rule decides. Per expected label, how the store ends:
    one note (``same``), the newer text live with the older in history (``update``), two
    live notes (``distinct``)."""
    from gleaner.harvest.job import harvest_transcript
    from gleaner.store import Store
    from tests.llm_server import Behaviour, llm_server

    pairs = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines()]
    for marked in (True, False):
        label = "scripted marks" if marked else "no marks"
        tally: Counter[tuple[str, str]] = Counter()
        with llm_server() as server:
            url = f"sqlite:///{ctx.workdir / f'heldout-{marked}.db'}"
            store = Store(
                url,
                settings=Settings(  # type: ignore[call-arg]
                    _env_prefix="GLEANER_BENCH_UNUSED_",
                    harvest_model="openai/bench-model",
                    harvest_api_base=server.api_base,
                    harvest_api_key="k",
                    harvest_max_attempts=1,
                ),
            )
            store.migrate()
            for pair in pairs:
                owner = f"p-{pair['id']}"
                first = _chat(f"{owner}-a", pair["existing"]).model_copy(update={"owner": owner})
                second = _chat(f"{owner}-b", pair["candidate"]).model_copy(update={"owner": owner})

                def reply(
                    request: dict[str, Any], pair: dict[str, Any] = pair, marked: bool = marked
                ) -> Behaviour:
                    text_ = json.dumps(request)
                    mark: dict[str, Any] = {}
                    if marked:
                        shown = "- n1" in text_ and pair["existing"]["title"][:40] in text_
                        wanted = {"same": "same", "update": "update"}.get(pair["expected"])
                        mark = (
                            {"mark": wanted, "ref": "n1"}
                            if shown and wanted
                            else {"mark": "new", "ref": None}
                        )
                    return Behaviour(
                        content=json.dumps({"notes": [_item(pair["candidate"], mark)]})
                    )

                server.script(
                    Behaviour(content=json.dumps({"notes": [_item(pair["existing"], {})]}))
                )
                harvest_transcript(store, first)
                server.script(reply)
                harvest_transcript(store, second)
                tally[(pair["expected"], _ended(store, owner, pair))] += 1
            store.dispose()
        for expected, target in (("same", 0.8), ("update", 0.9), ("distinct", 1.0)):
            total = sum(n for (e, _), n in tally.items() if e == expected)
            right = tally[(expected, expected)]
            share = right / total if total else 1.0
            floor = target if marked or expected == "distinct" else None
            ctx.add(
                Row(
                    NAME,
                    f"held-out {expected} pairs ended right ({label})",
                    round(share, 3),
                    "",
                    target="" if floor is None else f">= {floor}",
                    met=None if floor is None else share >= floor - 1e-9,
                    note=f"{right} of {total}; "
                    + ", ".join(f"{o} {n}" for (e, o), n in sorted(tally.items()) if e == expected),
                )
            )
        merged = sum(n for (e, o), n in tally.items() if o != "distinct")
        wrong = sum(n for (e, o), n in tally.items() if o != "distinct" and e == "distinct")
        ctx.add(
            Row(
                NAME,
                f"held-out precision of one note ({label})",
                round(1 - wrong / merged, 3) if merged else 1.0,
                "",
                note=f"{merged - wrong} of {merged} pairs ended as one note rightly",
            )
        )


def _ended(store: Any, owner: str, pair: dict[str, Any]) -> str:
    """How a pair ended in the store: ``same``, ``update`` or ``distinct`` (see heldout)."""
    from gleaner.store import Scope

    scope = Scope.owner(owner)
    live = store.list_notes(scope)
    if len(live) != 1:
        return "distinct" if len(live) == 2 else f"{len(live)} notes"
    (note,) = live
    newer = pair.get("newer", "candidate")
    if pair["expected"] == "update":
        newest = pair[newer]
        older = pair["existing" if newer == "candidate" else "candidate"]
        history = store.history(scope, note.slug)
        if note.title == newest["title"] and any(v.title == older["title"] for v in history):
            return "update"
        return "same"
    return "same"
