"""Extraction: the candidate notes of one transcript, from the model or, with none
configured, the offline extractor, and what finding them cost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.llm import HarvestLLM
from gleaner.harvest.model import Usage, extract
from gleaner.harvest.offline import offline_extract
from gleaner.harvest.options import ModelOptions
from gleaner.harvest.outcome import Counts
from gleaner.harvest.prompt import KnownNote
from gleaner.harvest.transcript import Transcript
from gleaner.store import Settings


def uses_model(settings: Settings, llm: HarvestLLM | None = None) -> bool:
    """Whether extraction calls a model (else the offline extractor runs)."""
    return bool(settings.harvest_model) or llm is not None


@dataclass(frozen=True)
class Extraction:
    """The candidate notes and what finding them cost (items dropped, calls, tokens)."""

    notes: list[NoteCandidate]
    model: str
    cost: Counts


def run_extraction(
    transcript: Transcript,
    settings: Settings,
    llm: HarvestLLM | None = None,
    known_keys: Sequence[tuple[str, str]] = (),
    usage: Usage | None = None,
    *,
    known_notes: Sequence[KnownNote] = (),
) -> Extraction:
    """Ask the configured model (or, with none, the offline extractor) for candidate notes;
    ``known_keys`` are the owner's ``(topic_key, title)`` pairs the model is shown, ``usage``
    counts the calls as they are made (a failed extraction's cost included); ``known_notes``
    are the owner's notes the transcript bears on, shown under refs the model's marks name."""
    if not uses_model(settings, llm):
        found = offline_extract(
            transcript, settings.harvest_max_facts, tuple(settings.observation_types)
        )
        return Extraction(found, "offline", Counts())
    result = extract(
        transcript,
        ModelOptions.from_settings(settings),
        llm,
        known_keys,
        usage,
        known_notes=known_notes,
    )
    return Extraction(result.notes, result.model or str(settings.harvest_model), result.cost)
