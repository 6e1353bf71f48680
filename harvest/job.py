"""One transcript in, notes out: redact, extract, and write notes + ledger in one transaction."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from sqlalchemy.orm import Session

from harvest.candidate import NoteCandidate
from harvest.errors import HarvestError
from harvest.locks import transcript_lock
from harvest.model import HarvestLLM, ModelOptions, Usage, extract
from harvest.offline import offline_extract
from harvest.redact import redact_transcript, transcript_hash
from harvest.transcript import Limits, Transcript, check_size
from store import (
    Scope,
    Settings,
    Store,
    forget,
    ledger,
    normalize_topics,
    notes,
    similar,
    strip_private,
)
from store.errors import InvalidInput
from store.similar import Twin
from store.terms import FactText, adds_to, content_terms, jaccard, similarity_terms
from store.text import check_principal

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


def resolve_owner(
    transcript: Transcript, owner: str | None, *, reassign_owner: bool = False
) -> str:
    """Whose scope the transcript's notes go to; HarvestError when nobody's.

    A transcript that names its owner keeps it: ``owner`` only fills in one that names none
    (exports), unless ``reassign_owner`` says to put every transcript in ``owner``'s scope.
    """
    if reassign_owner and not owner:
        raise HarvestError("reassigning needs the owner to reassign to", reason="no_owner")
    chosen = owner if reassign_owner else (transcript.owner or owner)
    if not chosen:
        raise HarvestError(
            f"conversation {transcript.conversation_id!r} has no owner: pass --owner NAME",
            reason="no_owner",
        )
    try:
        return check_principal(chosen)  # the one owner rule (store.text)
    except InvalidInput as exc:
        raise HarvestError(str(exc), reason="bad_owner") from None


def uses_model(settings: Settings, llm: HarvestLLM | None = None) -> bool:
    """Whether extraction calls a model (else the offline extractor runs)."""
    return bool(settings.harvest_model) or llm is not None


def run_extraction(
    transcript: Transcript,
    settings: Settings,
    llm: HarvestLLM | None = None,
    known_keys: Sequence[tuple[str, str]] = (),
    usage: Usage | None = None,
) -> Extraction:
    """Ask the configured model (or, with none, the offline extractor) for candidate notes;
    ``known_keys`` are the owner's ``(topic_key, title)`` pairs the model is shown, ``usage``
    counts the calls as they are made (a failed extraction's cost included)."""
    if not uses_model(settings, llm):
        found = offline_extract(
            transcript, settings.harvest_max_facts, tuple(settings.observation_types)
        )
        return Extraction(found, 0, "offline", 0, 0, 0)
    result = extract(transcript, ModelOptions.from_settings(settings), llm, known_keys, usage)
    return Extraction(
        result.notes,
        result.dropped,
        result.model or str(settings.harvest_model),
        result.calls,
        result.prompt_tokens,
        result.completion_tokens,
    )


@dataclass
class Plan:
    """One transcript made ready to harvest: scope, redacted text, hash, and its report."""

    scope: Scope
    transcript: Transcript  # redacted
    digest: str
    version: str
    provenance: str
    report: TranscriptReport
    # The owner's topic keys shown to the model (``recall_keys``): (key, title).
    known_keys: list[tuple[str, str]] = field(default_factory=list)
    # How many times the owner was forgotten when the harvest was planned (``harvested_before``
    # reads it): a forget since then means the harvest writes nothing.
    forget_generation: int = 0


def plan_harvest(
    settings: Settings,
    transcript: Transcript,
    *,
    owner: str | None,
    provenance: str,
    reassign_owner: bool = False,
) -> Plan:
    """Check the provenance, resolve the owner (``resolve_owner``) and redact (HarvestError
    when one is bad)."""
    if provenance not in PROVENANCES:
        raise HarvestError(
            f"provenance must be compaction or import, got {provenance!r}",
            reason="bad_provenance",
        )
    # Bounded before anything reads it all (a transcript from Python, or for the offline
    # extractor, meets the limits here); then redacted, so the owner error and the report
    # (logged, stored as the job's result) see only the redacted conversation id.
    check_size(transcript.messages, Limits.from_settings(settings))
    redacted = redact_transcript(transcript)
    name = resolve_owner(redacted, owner, reassign_owner=reassign_owner)
    return Plan(
        scope=Scope.owner(name),
        transcript=redacted,
        digest=transcript_hash(redacted),
        version=harvester_version(settings),
        provenance=provenance,
        report=TranscriptReport(
            conversation_id=redacted.conversation_id, owner=name, status="skipped"
        ),
    )


def harvested_before(session: Session, plan: Plan) -> bool:
    """True when there is nothing to do: the ledger says this scope already harvested this
    transcript, or the owner forgot it (a tombstone). Also notes the owner's forget
    generation, which the write checks again."""
    plan.forget_generation = forget.generation(session, plan.scope)
    if forget.is_tombstoned(session, plan.scope, plan.digest):
        return True
    return ledger.already_harvested(session, plan.scope, plan.digest, plan.version)


# Transcript terms matched against the owner's keyed notes: the most frequent ones.
RECALL_TERMS = 200


def recall_keys(
    session: Session, settings: Settings, plan: Plan, llm: HarvestLLM | None = None
) -> None:
    """Fill ``plan.known_keys``: at most ``harvest_known_keys`` of the owner's topic keys,
    those whose notes share the transcript's words first, then the most recently changed.

    Shown to the model so a fact that changes (a move, a new editor) reuses its key and
    replaces the old note, whose text goes to history. Nothing is read for the offline
    extractor, which keeps its own fixed keys.
    """
    if not uses_model(settings, llm) or settings.harvest_known_keys == 0:
        return
    counts: Counter[str] = Counter()
    for message in plan.transcript.messages:
        if message.role == "user":
            counts.update(content_terms(message.content))
    terms = [term for term, _ in counts.most_common(RECALL_TERMS)]
    found = similar.keyed_notes(session, plan.scope, terms, limit=settings.harvest_known_keys)
    plan.known_keys = [(note.topic_key, note.title) for note in found]


def extract_notes(
    plan: Plan, settings: Settings, llm: HarvestLLM | None = None
) -> Extraction | None:
    """The model's candidates; None (and a ``failed`` report) when the model failed. A failed
    report still carries what the calls made before the failure cost."""
    usage = Usage()
    try:
        return run_extraction(plan.transcript, settings, llm, plan.known_keys, usage)
    except HarvestError as exc:
        report = plan.report
        report.status, report.error = "failed", f"{exc.reason}: {exc}"
        report.model = str(settings.harvest_model or report.model)
        report.model_calls = usage.calls
        report.prompt_tokens, report.completion_tokens = (
            usage.prompt_tokens,
            usage.completion_tokens,
        )
        return None


def record_harvest(session: Session, settings: Settings, plan: Plan, found: Extraction) -> None:
    """Write the ledger row, then the notes, in the caller's transaction.

    The ledger row goes first: when another worker recorded this transcript already, nothing
    is written and the report stays ``skipped``.
    """
    transcript, report = plan.transcript, plan.report
    if not forget.still_remembered(session, plan.scope, plan.forget_generation):
        return  # the owner was forgotten while this harvest ran: it writes nothing
    entry = ledger.LedgerEntry(
        transcript_hash=plan.digest,
        harvester_version=plan.version,
        conversation_id=transcript.conversation_id,
        provenance=plan.provenance,
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
    if not ledger.record(session, plan.scope, entry):
        return  # another worker finished it first
    report.status = "harvested"
    report.items_dropped = found.dropped
    report.model, report.model_calls = found.model, found.calls
    report.prompt_tokens = found.prompt_tokens
    report.completion_tokens = found.completion_tokens
    write_candidates(
        session,
        settings,
        plan.scope,
        found.notes,
        transcript=transcript,
        provenance=plan.provenance,
        report=report,
    )
    ledger.update_counts(
        session,
        plan.scope,
        plan.digest,
        plan.version,
        written=report.notes_written,
        updated=report.notes_updated,
        skipped=report.notes_skipped,
    )


def harvest_transcript(
    store: Store,
    transcript: Transcript,
    *,
    owner: str | None = None,
    provenance: str = "compaction",
    llm: HarvestLLM | None = None,
    reassign_owner: bool = False,
) -> TranscriptReport:
    """Harvest one transcript into its owner's scope, at most once.

    ``owner`` is the owner of a transcript that names none; ``reassign_owner`` puts this one
    in ``owner``'s scope whatever it names (``resolve_owner``).

    The transcript is redacted before anything else sees it. A transcript this scope already
    harvested (same redacted text, same harvester) makes no model call and writes nothing.
    Model failures come back as a ``failed`` report with the reason; nothing is written then.
    The (scope, transcript) lock makes a concurrent duplicate wait and then find the ledger
    row instead of calling the model again.
    """
    plan = plan_harvest(
        store.settings,
        transcript,
        owner=owner,
        provenance=provenance,
        reassign_owner=reassign_owner,
    )
    with transcript_lock(store.engine, plan.scope, plan.digest):
        with store.transaction() as session:
            if harvested_before(session, plan):
                return plan.report
            recall_keys(session, store.settings, plan, llm)
        found = extract_notes(plan, store.settings, llm)
        if found is not None:
            with store.transaction() as session:
                record_harvest(session, store.settings, plan, found)
    return plan.report


def _kept(
    candidates: list[NoteCandidate], settings: Settings, report: TranscriptReport
) -> list[tuple[NoteCandidate, FactText]]:
    """The candidates to write, up to the cap and of known types, with private text stripped:
    ``(candidate, its text)``. A topic or topic key that held a private span is dropped, not
    redacted: ``[REDACTED]`` is no topic, and two secrets' redacted keys would be one key."""
    kept = []
    for candidate in candidates[: settings.harvest_max_facts]:
        if candidate.type not in settings.observation_types:
            report.items_dropped += 1
            continue
        topics = [topic for topic in candidate.topics if strip_private(topic) == topic]
        key = candidate.topic_key
        if key is not None and strip_private(key) != key:
            key = None
        text = FactText(
            strip_private(candidate.title), strip_private(candidate.body), normalize_topics(topics)
        )
        kept.append((candidate.model_copy(update={"topics": topics, "topic_key": key}), text))
    return kept


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
    """Write candidates as unpinned notes; one holding a fact the scope already holds does not
    add a twin.

    - With a topic key: upserts the note holding that key (its text goes to history), unless
      that note is pinned or person-written (``user``): then the candidate is skipped.
    - Without: the live note holding **the same fact** (``store.terms.same_fact``: title+topic
      Jaccard at ``duplicate_threshold`` and nothing in title or body contradicts) is
      rewritten only when the candidate adds to it (``adds_to``; the old text goes to
      history, reason ``harvest_same_fact``); a candidate that adds nothing, or whose twin is
      pinned or person-written, is skipped. Any other candidate is a new note under a fresh
      slug, so no note is ever overwritten by a different fact.

    Candidates go through ``notes.write_batch`` in segments that give the same outcome as
    writing them one by one.
    """
    writer = _SegmentWriter(
        session, settings, scope, transcript=transcript, provenance=provenance, report=report
    )
    writer.kept = _kept(candidates, settings, report)
    keyed = [c.topic_key for c, _ in writer.kept if c.topic_key is not None]
    protected = similar.protected_keys(session, scope, keyed) if keyed else set()
    for position, (candidate, text) in enumerate(writer.kept):
        attrs: dict[str, object] = {
            "title": text.title,
            "body": text.body,
            "topics": candidate.topics,
            "confidence": candidate.confidence,
            "pinned": False,
        }
        reason = None
        if candidate.topic_key is not None:
            if candidate.topic_key in protected:
                report.notes_skipped += 1
                continue
        else:
            terms = similarity_terms(text.title, text.topics)
            # A near-duplicate of an earlier candidate must see that one written, as
            # one-by-one writes would: close the segment first.
            if any(jaccard(terms, other) >= writer.threshold for other in writer.seen):
                writer.flush()
            twin = writer.twin_of(position)
            if twin is not None and twin[0].id in writer.targets:
                writer.flush()  # that note is being rewritten: look again at what it becomes
                twin = writer.twin_of(position)
            if twin is not None:
                note, held = twin
                if note.pinned or note.provenance == "user" or not adds_to(text, held):
                    report.notes_skipped += 1
                    continue
                attrs["slug"], reason = note.slug, "harvest_same_fact"
                writer.targets.add(note.id)
            writer.seen.append(terms)
        writer.items.append(
            notes.BatchItem(
                attrs=attrs,
                note_type=candidate.type,
                topic_key=candidate.topic_key,
                reason=reason,
            )
        )
        if candidate.topic_key is not None:
            writer.flush()  # its upsert may rewrite any note: later lookups must see the result
    if writer.items:
        writer.flush()


class _SegmentWriter:
    """``write_candidates``' state: the open segment, and the same-fact twins looked up for
    the candidates as the store stood after the last segment was written."""

    def __init__(
        self,
        session: Session,
        settings: Settings,
        scope: Scope,
        *,
        transcript: Transcript,
        provenance: str,
        report: TranscriptReport,
    ) -> None:
        self.session, self.settings, self.scope = session, settings, scope
        self.transcript, self.provenance, self.report = transcript, provenance, report
        self.threshold = settings.duplicate_threshold
        self.kept: list[tuple[NoteCandidate, FactText]] = []
        self.items: list[notes.BatchItem] = []
        self.seen: list[frozenset[str]] = []  # term sets of this segment's candidates
        self.targets: set[int] = set()  # notes this segment already rewrites
        self.twins: dict[int, tuple[Twin, FactText] | None] = {}  # by position in ``kept``
        self.stale = True  # a segment was written since ``twins`` was looked up

    def flush(self) -> None:
        self.stale = True
        for result in notes.write_batch(
            self.session,
            self.settings,
            self.scope,
            self.items,
            provenance=self.provenance,
            conversation_id=self.transcript.conversation_id,
            occurred_at=self.transcript.happened_at,
        ):
            if result.outcome == "invalid":
                self.report.items_dropped += 1  # e.g. a body over max_body_bytes: drop it
                continue
            if result.outcome == "created":
                self.report.notes_written += 1
            else:
                self.report.notes_updated += 1
            self.report.slugs.append(str(result.slug))
        self.items.clear()
        self.seen.clear()
        self.targets.clear()

    def twin_of(self, position: int) -> tuple[Twin, FactText] | None:
        """The candidate's same-fact twin and its text. After a write, the twins of this and
        every later candidate are looked up again, all in one go (a handful of statements,
        not a few per note)."""
        if self.stale:
            later = [
                n for n in range(position, len(self.kept)) if self.kept[n][0].topic_key is None
            ]
            found = similar.same_fact_twins(
                self.session,
                self.scope,
                [self.kept[n][1] for n in later],
                threshold=self.threshold,
            )
            self.twins = dict(zip(later, found, strict=True))
            self.stale = False
        return self.twins[position]
