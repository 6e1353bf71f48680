"""Bulk imports: fan an export out into recorded jobs, and estimate the cost beforehand."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from harvest.batch import Summary, judge_owners, read_all
from harvest.errors import HarvestError
from harvest.queue import IMPORT_QUEUE, record_jobs
from harvest.transcript import Transcript
from store import Settings, Store
from store import jobs as job_records

# Jobs recorded per transaction: a 100k-conversation export commits (and can be sent) in steps.
RECORD_BATCH = 500
# Expected answer size of one call, for estimates only.
ESTIMATED_COMPLETION_TOKENS = 250


@dataclass
class PlannedImport:
    """An import recorded in the database: its id and the job ids still to send."""

    import_id: str
    job_ids: list[str]
    queue: str = IMPORT_QUEUE
    unreadable: list[dict[str, str]] = field(default_factory=list)


def plan_import(
    store: Store,
    path: str | Path,
    *,
    owner: str | None,
    provenance: str = "import",
    reassign_owner: bool = False,
) -> PlannedImport:
    """Read an export and record one pending job per conversation, in batches.

    ``owner`` fills in conversations that name none; ``reassign_owner`` overrides every one.

    Conversations that cannot be read are counted on the import and listed; a missing owner
    (exports carry none) raises HarvestError(reason="no_owner") before anything is recorded.
    """
    summary = Summary()
    transcripts = judge_owners(
        read_all([Path(path)], summary), owner, summary, reassign_owner=reassign_owner
    )
    if not transcripts and summary.failures:
        raise HarvestError(summary.failures[0]["error"], reason="bad_transcript")
    with store.transaction() as session:
        import_id = job_records.create_import(
            session,
            source=str(path),
            owner=owner or "(transcript owners)",
            provenance=provenance,
            unreadable=len(summary.failures),
        )
    planned = PlannedImport(import_id=import_id, job_ids=[], unreadable=summary.failures)
    for start in range(0, len(transcripts), RECORD_BATCH):
        planned.job_ids += record_jobs(
            store,
            transcripts[start : start + RECORD_BATCH],
            owner=owner,
            provenance=provenance,
            queue=IMPORT_QUEUE,
            import_id=import_id,
            reassign_owner=reassign_owner,
        )
    return planned


@dataclass
class Estimate:
    """What an import would cost before anything runs."""

    conversations: int
    unreadable: int
    messages: int
    transcript_tokens: int
    model_calls: int
    prompt_tokens: int
    completion_tokens: int
    model: str
    cost_usd: float | None


def estimate(paths: Iterable[Path], settings: Settings) -> Estimate:
    """Count conversations, tokens and calls (and the cost, when litellm knows the model)."""
    from harvest.model import count_tokens
    from harvest.prompt import render_transcript, system_prompt
    from harvest.redact import redact_transcript

    summary = Summary()
    transcripts: list[Transcript] = read_all(paths, summary)
    fixed = count_tokens(system_prompt(max_facts=settings.harvest_max_facts)) + 50
    calls = prompt = tokens = messages = 0
    for transcript in transcripts:
        redacted = redact_transcript(transcript)
        messages += len(redacted.messages)
        size = count_tokens(render_transcript(redacted.messages))
        chunks = max(1, math.ceil(size / settings.harvest_context_tokens))
        tokens += size
        calls += chunks
        prompt += size + chunks * fixed
    model = settings.harvest_model or "offline"
    completion = calls * ESTIMATED_COMPLETION_TOKENS
    cost: float | None = 0.0
    if settings.harvest_model:
        cost = _cost(settings.harvest_model, prompt, completion)
    else:
        calls = prompt = completion = 0
    return Estimate(
        conversations=len(transcripts),
        unreadable=len(summary.failures),
        messages=messages,
        transcript_tokens=tokens,
        model_calls=calls,
        prompt_tokens=prompt,
        completion_tokens=completion,
        model=model,
        cost_usd=cost,
    )


def _cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """USD from litellm's bundled price table; None when the model is not in it."""
    import os

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    try:
        prompt_cost, completion_cost = litellm.cost_per_token(
            model=model, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens
        )
    except Exception:  # noqa: BLE001 - unknown models raise assorted errors: no price known
        return None
    return round(float(prompt_cost) + float(completion_cost), 4)
