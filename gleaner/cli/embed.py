"""Semantic recall from the shell: ``embed --backfill`` (vectors for the notes lacking one)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gleaner.cli.common import EXIT_OK, CommandFailed, UsageError, open_store


def cmd_embed(args: argparse.Namespace) -> int:
    from gleaner.harvest.embed_notes import embed_pending
    from gleaner.harvest.embedding import embedder_for
    from gleaner.store import Scope
    from gleaner.store.recall import vectors as note_vectors

    if not args.backfill:
        raise UsageError("say what to do: `gleaner embed --backfill [--owner NAME]`")
    store = open_store()
    embedder = embedder_for(store.settings)
    if embedder is None:
        raise UsageError(
            "no embedding model: set GLEANER_EMBED_MODEL (e.g. local/all-minilm-l6-v2 with the "
            "local-embed extra, or openai/<name> with GLEANER_EMBED_API_BASE) first"
        )
    scope = Scope.owner(args.owner) if args.owner else None

    def progress(done: int, total: int) -> None:
        if not args.json:
            print(f"gleaner: embedded {done}/{total} note(s)", file=sys.stderr, flush=True)

    try:
        report = embed_pending(store, embedder, scope=scope, progress=progress)
    except Exception as exc:
        # What was embedded before the failure is kept; a rerun takes the rest.
        raise CommandFailed(
            f"embedding failed ({type(exc).__name__}: {exc}); what was embedded is kept: run "
            "`gleaner embed --backfill` again for the rest"
        ) from exc
    with store.connection() as conn:
        left = note_vectors.count_pending(conn, embedder.model, scope=scope)
    data: dict[str, Any] = {
        "model": embedder.model,
        "notes": report.notes,
        "skipped": report.skipped,
        "calls": report.calls,
        "tokens": report.tokens,
        "cost_usd": report.cost_usd,
        "pending": left,
    }
    if args.json:
        print(json.dumps(data))
    else:
        cost = "unknown" if report.cost_usd is None else f"${report.cost_usd:.4f}"
        print(
            f"embedded {report.notes} note(s) with {embedder.model} in {report.calls} call(s), "
            f"{report.tokens} tokens, cost {cost}; {left} still pending"
        )
    return EXIT_OK


def register(sub: Any) -> None:
    embed = sub.add_parser(
        "embed",
        help="give notes their vectors for semantic recall (GLEANER_EMBED_MODEL)",
        description="With --backfill, embed every live note (of --owner, else every owner) "
        "that has no vector of GLEANER_EMBED_MODEL for its current text: notes written "
        "before semantic recall was configured, or before the model changed (a changed model "
        "re-embeds every note). Batches of GLEANER_EMBED_BATCH_SIZE, progress on stderr; "
        "what is embedded is kept if the run stops, and a rerun does the rest. Workers do "
        "this on their own for new notes.",
    )
    embed.add_argument("--backfill", action="store_true", help="embed the notes lacking a vector")
    embed.add_argument("--owner", metavar="NAME", help="only this owner's notes")
    embed.add_argument("--json", action="store_true", help="print one JSON summary")
    embed.set_defaults(func=cmd_embed)
