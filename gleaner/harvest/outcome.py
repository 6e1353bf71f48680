"""What harvesting did: the counts (notes and model usage) and one transcript's outcome.

``Counts`` is the one structure the counters live in: a model call's and an extraction's
cost, the notes a write produced, a transcript's outcome (``HarvestOutcome`` extends it), the
ledger row's numbers, a run's totals (``harvest.batch.Summary``) and an import's
(``ImportTotals``) all reuse it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Status = Literal["harvested", "skipped", "failed"]


class Counts(BaseModel):
    """Notes written, updated and skipped, items dropped, and the model calls and tokens
    spent (failed calls included); ``a + b`` sums two."""

    model_config = ConfigDict(frozen=True)

    notes_written: int = 0
    notes_updated: int = 0
    notes_skipped: int = 0
    items_dropped: int = 0
    # Of the items dropped: notes whose evidence is not in the transcript (or, for a profile
    # or preference, not in the user's own words).
    items_ungrounded: int = 0
    # Notes that read as instructions to the assistant (store.notes.instructions): stored flagged,
    # or under GLEANER_INSTRUCTION_NOTES=drop dropped (and in items_dropped too).
    items_instructions: int = 0
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Secrets replaced with [REDACTED]: in the transcript when it came in, and in the model's
    # answer (privacy.secrets). Reported with the outcome; not a ledger column.
    secrets_redacted: int = 0

    def counts(self) -> dict[str, int]:
        """The counters alone (a subclass's other fields left out)."""
        return {name: getattr(self, name) for name in COUNTERS}

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{name: getattr(self, name) + getattr(other, name) for name in COUNTERS})


COUNTERS = tuple(Counts.model_fields)


class HarvestOutcome(Counts):
    """What harvesting one transcript did (``skipped``: harvested or forgotten before,
    nothing done). ``conversation_id`` is None only for a job that failed before its
    transcript was read."""

    status: Status
    conversation_id: str | None = None
    owner: str | None = None
    model: str = "offline"
    slugs: tuple[str, ...] = ()
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The outcome as JSON-ready data: a job's stored result, a summary's report."""
        return self.model_dump(mode="json")


class ImportTotals(Counts):
    """What a queued import's finished jobs did: the notes and dropped items of its done
    jobs' outcomes, how many of those were ``skipped`` (harvested before), and the model
    calls and tokens of every run of its done and failed jobs (failed runs cost too)."""

    skipped: int = 0

    @classmethod
    def of(cls, results: Iterable[Mapping[str, Any]], usage: Mapping[str, int]) -> ImportTotals:
        """Sum the done jobs' stored outcomes (``HarvestOutcome.as_dict``; a key one lacks
        counts 0) under the jobs' recorded ``usage`` (``model_calls`` and tokens)."""
        summed, skipped = Counts(), 0
        for result in results:
            summed += Counts.model_validate(result)
            skipped += result.get("status") == "skipped"
        return cls(**{**summed.counts(), **usage}, skipped=skipped)
