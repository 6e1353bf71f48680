"""Harvesting files and folders in process: read every conversation, harvest each, sum up."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field

from gleaner.harvest.embed_notes import embed_after_harvest
from gleaner.harvest.errors import HarvestError, UnrecordedHarvest
from gleaner.harvest.intake import Settled, resolve_owner, settle
from gleaner.harvest.job import harvest_settled
from gleaner.harvest.llm import HarvestLLM
from gleaner.harvest.outcome import Counts, HarvestOutcome
from gleaner.harvest.readers import iter_paths, read_path
from gleaner.harvest.redact import redact_text
from gleaner.harvest.transcript import Limits, Transcript, check_storable
from gleaner.store import Scope, Store, StoreError, format_error, load_settings
from gleaner.store.text import quoted, unstorable


class Summary(Counts):
    """Totals of one harvest run: the counts summed over its transcripts, how many were
    harvested, skipped (done before) and failed (conversations and files), and each
    transcript's outcome (``reports``). Kept flat and mutable: the CLI prints its fields."""

    model_config = ConfigDict(frozen=False)

    transcripts: int = 0
    harvested: int = 0
    skipped: int = 0
    failed: int = 0
    failures: list[dict[str, str]] = Field(default_factory=list)
    reports: list[dict[str, Any]] = Field(default_factory=list)

    def add(self, outcome: HarvestOutcome) -> None:
        self.transcripts += 1
        if outcome.status == "harvested":
            self.harvested += 1
        elif outcome.status == "skipped":
            self.skipped += 1
        else:
            self.fail(outcome.conversation_id or "?", outcome.error or "?")
        self.count_spent(outcome)
        self.reports.append(outcome.as_dict())

    def count_spent(self, cost: Counts) -> None:
        """Add ``cost``'s counts (an outcome's, or the calls of a transcript that failed
        after they were made) to the run's."""
        for name, value in (self + cost).counts().items():
            setattr(self, name, value)

    def fail(self, label: str, error: str) -> None:
        self.failed += 1
        self.failures.append({"conversation": label, "error": error})


def read_all(
    paths: Iterable[Path], summary: Summary, *, limits: Limits | None = None
) -> list[Transcript]:
    """Every conversation under ``paths``; unreadable files and conversations go to failures.

    Each file and each conversation is judged on its own: one that is unreadable, nested too
    deeply or over ``limits`` (``too_large``) is a failure, and the rest are still read.
    ``limits`` defaults to the ones the environment's settings name.
    """
    if limits is None:
        limits = Limits.from_settings(load_settings())
    found: list[Transcript] = []
    for path in iter_paths(paths):
        try:
            result = read_path(path, limits=limits)
        except HarvestError as exc:
            # The reason names the path too.
            summary.fail(redact_text(str(path)), redact_text(f"{exc.reason}: {exc}"))
            continue
        found.extend(result.transcripts)
        for label, reason in result.errors:
            summary.fail(label, reason)
    return found


def check_owners(transcripts: Iterable[Transcript], owner: str | None) -> None:
    """Raise HarvestError(reason="no_owner") before any work if a conversation has no owner."""
    if owner:
        return
    missing = [t for t in transcripts if not t.owner]
    if missing:
        raise no_owner(len(missing), missing[0])


def no_owner(count: int, first: Transcript) -> HarvestError:
    """The usage error for ``count`` conversations that carry no owner, ``first`` among them."""
    # Not yet redacted: the path is shown under the privacy rule (the id already is).
    where = redact_text(first.source_path or first.conversation_id)
    return HarvestError(
        f"{count} conversation(s) carry no owner (e.g. {where}): pass --owner NAME",
        reason="no_owner",
    )


def judge_owners(
    transcripts: Iterable[Transcript],
    owner: str | None,
    summary: Summary,
    *,
    reassign_owner: bool = False,
) -> list[Settled]:
    """The conversations taken in (``harvest.intake.settle``: values storable, redacted,
    owner settled), oldest first (by when each happened; one of unknown time last, the file
    order kept among equals), so each owner's facts are harvested in the order they were
    said; each one refused goes to the summary's failures on its own (the rest of the batch
    goes on). No owner at all, with no ``owner`` to fill it in, stays a usage error for the
    whole run (``check_owners``)."""
    listed = list(transcripts)
    check_owners(listed, owner)
    kept = []
    for transcript in listed:
        try:
            kept.append(settle(transcript, owner, reassign_owner=reassign_owner))
        except HarvestError as exc:
            summary.fail(failure_label(transcript.conversation_id), f"{exc.reason}: {exc}")
    return sorted(kept, key=lambda item: said_order(item.transcript))


def refusal(transcript: Transcript, owner: str | None, reassign_owner: bool) -> str | None:
    """Why this conversation is refused on its own (``reason: message``): a value nothing
    stored may hold (``check_storable``), or the owner rule; None when it may go on. Judges
    without taking in (no redaction): an import judges every conversation first, then reads
    them again to take in and record (``harvest.imports``)."""
    try:
        check_storable(transcript)
        resolve_owner(transcript, owner, reassign_owner=reassign_owner)
    except HarvestError as exc:
        return f"{exc.reason}: {exc}"
    return None


def failure_label(conversation_id: str) -> str:
    # A conversation id as a failure names it: as given, unless it holds what no stored
    # text may (then quoted, its NUL shown as an escape).
    return conversation_id if unstorable(conversation_id) is None else quoted(conversation_id)


def said_order(transcript: Transcript) -> tuple[bool, float]:
    """The sort key that puts conversations oldest said first, those of unknown time last."""
    when = transcript.happened_at
    return (when is None, when.timestamp() if when is not None else 0.0)


def harvest_paths(
    store: Store,
    paths: Iterable[Path],
    *,
    owner: str | None = None,
    provenance: str = "compaction",
    llm: HarvestLLM | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    reassign_owner: bool = False,
) -> Summary:
    """Harvest every conversation in ``paths`` in process; one bad conversation never stops
    the rest. ``on_progress(done, total)`` is called after each conversation. ``owner`` fills
    in conversations that name no owner; ``reassign_owner`` puts every one in its scope."""
    summary = Summary()
    wrote: list[Scope] = []
    limits = Limits.from_settings(store.settings)
    settled = judge_owners(
        read_all(paths, summary, limits=limits), owner, summary, reassign_owner=reassign_owner
    )
    for done, item in enumerate(settled, start=1):
        try:
            outcome = harvest_settled(store, item, provenance=provenance, llm=llm)
        except (HarvestError, StoreError) as exc:
            if isinstance(exc, UnrecordedHarvest):
                summary.count_spent(exc.spent)
            summary.transcripts += 1
            summary.fail(item.conversation_id, format_error(exc))
        else:
            summary.add(outcome)
            if outcome.owner and (outcome.notes_written or outcome.notes_updated):
                wrote.append(Scope.owner(outcome.owner))
        if on_progress is not None:
            on_progress(done, len(settled))
    # The notes are committed and searchable; their vectors follow (when a model is set).
    embed_after_harvest(store, wrote)
    return summary
