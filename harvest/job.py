"""One transcript in, notes out: redact, extract, and write notes + ledger in one transaction."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy.orm import Session

from harvest.candidate import NoteCandidate
from harvest.errors import HarvestError
from harvest.model import HarvestLLM, ModelOptions, extract
from harvest.offline import offline_extract
from harvest.redact import redact_transcript, transcript_hash
from harvest.transcript import Transcript
from store import (
    InvalidInput,
    Scope,
    Settings,
    Store,
    ledger,
    normalize_topics,
    notes,
    strip_private,
)

# Bump when extraction changes enough that old transcripts deserve a new harvest.
HARVESTER_VERSION = "1"
PROVENANCES = ("compaction", "import")

Status = Literal["harvested", "skipped", "failed"]


@dataclass
class TranscriptReport:
    """What harvesting one transcript did (``skipped``: harvested before, nothing done)."""

    conversation_id: str
    owner: str
    status: Status
    notes_written: int = 0
    notes_updated: int = 0
    notes_skipped: int = 0
    items_dropped: int = 0
    model: str = "offline"
    model_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    slugs: list[str] = field(default_factory=list)
    error: str | None = None


@dataclass(frozen=True)
class Extraction:
    notes: list[NoteCandidate]
    dropped: int
    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int


def harvester_version(settings: Settings) -> str:
    """The ledger's version key: the extractor's version and which model ran it."""
    return f"{HARVESTER_VERSION}:{settings.harvest_model or 'offline'}"


def resolve_owner(transcript: Transcript, owner: str | None) -> str:
    """The owner given by the caller, else the transcript's own; HarvestError when neither."""
    chosen = owner or transcript.owner
    if not chosen:
        raise HarvestError(
            f"conversation {transcript.conversation_id!r} has no owner: pass --owner NAME",
            reason="no_owner",
        )
    return chosen


def run_extraction(
    transcript: Transcript, settings: Settings, llm: HarvestLLM | None = None
) -> Extraction:
    """Ask the configured model (or, with none, the offline extractor) for candidate notes."""
    if not settings.harvest_model and llm is None:
        found = offline_extract(
            transcript, settings.harvest_max_facts, tuple(settings.observation_types)
        )
        return Extraction(found, 0, "offline", 0, 0, 0)
    result = extract(transcript, ModelOptions.from_settings(settings), llm)
    return Extraction(
        result.notes,
        result.dropped,
        result.model or str(settings.harvest_model),
        result.calls,
        result.prompt_tokens,
        result.completion_tokens,
    )


def harvest_transcript(
    store: Store,
    transcript: Transcript,
    *,
    owner: str | None = None,
    provenance: str = "compaction",
    llm: HarvestLLM | None = None,
) -> TranscriptReport:
    """Harvest one transcript into its owner's scope, at most once.

    The transcript is redacted before anything else sees it. A transcript this scope already
    harvested (same redacted text, same harvester) makes no model call and writes nothing.
    Model failures come back as a ``failed`` report with the reason; nothing is written then.
    """
    if provenance not in PROVENANCES:
        raise HarvestError(
            f"provenance must be compaction or import, got {provenance!r}",
            reason="bad_provenance",
        )
    name = resolve_owner(transcript, owner)
    scope = Scope.owner(name)
    redacted = redact_transcript(transcript)
    digest = transcript_hash(redacted)
    version = harvester_version(store.settings)
    report = TranscriptReport(
        conversation_id=transcript.conversation_id, owner=name, status="skipped"
    )

    with store.engine.connect() as lock:
        ledger.lock_transcript(lock, scope, digest)
        try:
            with store.transaction() as session:
                if ledger.already_harvested(session, scope, digest, version):
                    return report
            try:
                found = run_extraction(redacted, store.settings, llm)
            except HarvestError as exc:
                report.status, report.error = "failed", f"{exc.reason}: {exc}"
                return report
            with store.transaction() as session:
                entry = ledger.LedgerEntry(
                    transcript_hash=digest,
                    harvester_version=version,
                    conversation_id=transcript.conversation_id,
                    provenance=provenance,
                    occurred_at=transcript.happened_at,
                    notes_written=0,
                    notes_updated=0,
                    notes_skipped=0,
                    items_dropped=found.dropped,
                    model=found.model,
                    model_calls=found.calls,
                    prompt_tokens=found.prompt_tokens,
                    completion_tokens=found.completion_tokens,
                )
                if not ledger.record(session, scope, entry):
                    return report  # another worker finished it first
                report.status = "harvested"
                report.items_dropped = found.dropped
                report.model, report.model_calls = found.model, found.calls
                report.prompt_tokens = found.prompt_tokens
                report.completion_tokens = found.completion_tokens
                write_candidates(
                    session,
                    store.settings,
                    scope,
                    found.notes,
                    transcript=redacted,
                    provenance=provenance,
                    report=report,
                )
                ledger.update_counts(
                    session,
                    scope,
                    digest,
                    version,
                    written=report.notes_written,
                    updated=report.notes_updated,
                    skipped=report.notes_skipped,
                )
        finally:
            ledger.unlock_transcript(lock, scope, digest)
    return report


def write_candidates(
    session: Session,
    settings: Settings,
    scope: Scope,
    candidates: list[NoteCandidate],
    *,
    transcript: Transcript,
    provenance: str,
    report: TranscriptReport,
) -> None:
    """Write candidates as unpinned notes; a near-duplicate of a live note updates it instead.

    A candidate whose title+topic Jaccard score with a live note reaches
    ``duplicate_threshold`` rewrites that note in place (``notes_updated``), unless the note
    is pinned or was written by a person (``user`` provenance): then the candidate is
    skipped, since harvested text never overrides them. A candidate with a topic key
    upserts the note holding that key.
    """
    for candidate in candidates[: settings.harvest_max_facts]:
        if candidate.type not in settings.observation_types:
            report.items_dropped += 1
            continue
        title, body = strip_private(candidate.title), strip_private(candidate.body)
        attrs: dict[str, object] = {
            "title": title,
            "body": body,
            "topics": candidate.topics,
            "confidence": candidate.confidence,
            "pinned": False,
        }
        if candidate.topic_key is None:
            twins = notes.similar_notes(
                session,
                scope,
                title,
                normalize_topics(candidate.topics),
                threshold=settings.duplicate_threshold,
                limit=1,
            )
            if twins:
                twin = notes.get(session, scope, twins[0].slug)
                if twin is None or twin.pinned or twin.provenance == "user":
                    report.notes_skipped += 1
                    continue
                attrs["slug"] = twin.slug
        try:
            result = notes.write(
                session,
                settings,
                scope,
                attrs,
                conversation_id=transcript.conversation_id,
                provenance=provenance,
                note_type=candidate.type,
                topic_key=candidate.topic_key,
                occurred_at=transcript.happened_at,
                with_similar=False,
            )
        except InvalidInput:
            report.items_dropped += 1  # e.g. a body over max_body_bytes: drop, keep the rest
            continue
        if result.created:
            report.notes_written += 1
        else:
            report.notes_updated += 1
        report.slugs.append(result.memory.slug)
