"""Scenario 8, cost: model calls and tokens per transcript, and what a repeat import costs."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.core import Context, Row
from gleaner.harvest.batch import harvest_paths
from gleaner.harvest.chunks import count_tokens
from gleaner.harvest.prompt import (
    KNOWN_NOTES_MAX_CHARS,
    essentials,
    known_notes_block,
    system_prompt,
    user_prompt,
)
from gleaner.store import Settings, Store
from gleaner.store.notes.keyed import ShownNote
from tests.samples import TOOLS

NAME = "cost"
EXAMPLES = Path(__file__).parent.parent / "examples"
FIXED_PROMPT_TARGET = 1_000


def transcript(i: int, rng: random.Random) -> dict[str, object]:
    """8-12 messages with 2-4 statements of fact, the size of a typical finished chat."""
    facts = rng.randint(2, 4)
    statements = [
        f"I prefer {TOOLS[i % len(TOOLS)]} with the kit{i} keymap{i} for every repo.",
        f"We decided to move the svc{i} ledger{i} to PostgreSQL next quarter.",
        f"Turns out the bug{i} was a missing index on table{i} in the reporting job.",
        f"Every time I ship release{i} I run the smoke{i} suite and check the dashboards.",
    ][:facts]
    chatter = ["Can you help me plan the week?", "Thanks, that helps a lot."]
    messages: list[dict[str, str]] = []
    for line in statements + chatter[: rng.randint(2, 2)]:
        messages.append({"role": "user", "content": line})
        messages.append({"role": "assistant", "content": "Got it. " * rng.randint(3, 12)})
    return {"conversation_id": f"cost-{i}", "owner": "alice", "messages": messages}


def measure(ctx: Context, label: str, paths: list[Path], count_hint: int) -> None:
    settings = Settings(
        _env_prefix="GLEANER_BENCH_UNUSED_",  # type: ignore[call-arg]
        harvest_model="bench/echo",
        harvest_llm="bench.echo_llm:answer",
    )
    db = ctx.workdir / f"cost-{abs(hash(label))}.db"
    store = Store(f"sqlite:///{db}", settings=settings)
    store.migrate()
    first = harvest_paths(store, paths, owner="alice", provenance="import")
    again = harvest_paths(store, paths, owner="alice", provenance="import")
    store.dispose()
    n = max(1, first.transcripts)
    ctx.add(Row(NAME, f"{label}: transcripts", first.transcripts, "", note=f"{count_hint} given"))
    ctx.add(Row(NAME, f"{label}: model calls per transcript", first.model_calls / n, "calls"))
    ctx.add(Row(NAME, f"{label}: prompt tokens per transcript", first.prompt_tokens / n, "tok"))
    ctx.add(
        Row(NAME, f"{label}: completion tokens per transcript", first.completion_tokens / n, "tok")
    )
    ctx.add(
        Row(
            NAME,
            f"{label}: model calls on a repeat import",
            again.model_calls,
            "calls",
            target="0",
            met=again.model_calls == 0 and again.skipped == first.transcripts,
        )
    )


def run(ctx: Context) -> None:
    fixed = count_tokens(system_prompt(max_facts=5)) + count_tokens(user_prompt(""))
    ctx.add(
        Row(
            NAME,
            "fixed prompt (all but the transcript)",
            fixed,
            "tok",
            ceiling=FIXED_PROMPT_TARGET,
            target=f"<= {FIXED_PROMPT_TARGET}",
            met=fixed <= FIXED_PROMPT_TARGET,
        )
    )
    # The owner's notes shown with each transcript, at their bound (30 long notes offered).
    shown = [
        ShownNote(
            ref=f"n{n}",
            id=n,
            slug=f"note-{n}",
            title=f"Prefers option {n} for the recurring decision area number {n} at work",
            body="The user said so at length, with reasons and caveats, " * 4,
            topics="",
            topic_key=f"preference/area-{n:02d}",
            pinned=False,
            provenance="compaction",
        )
        for n in range(1, 31)
    ]
    block = known_notes_block(shown)
    ctx.add(
        Row(
            NAME,
            "shown notes block at its bound (30 offered)",
            count_tokens(block),
            "tok",
            target="<= 500",
            met=count_tokens(block) <= 500,
            note=f"{block.count(chr(10) + '- ')} notes fit in {KNOWN_NOTES_MAX_CHARS} characters",
        )
    )
    # Part of the fixed prompt: the rules repeated after the transcript, for servers whose
    # chat template drops the system message.
    ctx.add(
        Row(
            NAME,
            "of which rules repeated in the user turn",
            count_tokens(essentials(max_facts=5)),
            "tok",
        )
    )
    measure(ctx, "examples/", [EXAMPLES], 0)
    count = ctx.size(2_000, 200)
    rng = random.Random(8)
    folder = ctx.workdir / "cost-set"
    folder.mkdir()
    path = folder / "transcripts.jsonl"
    path.write_text("\n".join(json.dumps(transcript(i, rng)) for i in range(count)))
    measure(ctx, f"{count}-transcript set", [path], count)
