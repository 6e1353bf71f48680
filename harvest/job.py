"""One transcript in, notes out: the one harvest path, in process or as a recorded job.

plan (limits, redaction, owner, hash) -> the (scope, transcript) lock -> the ledger check ->
extraction -> the record (notes, then the ledger row, one transaction). ``run_harvest`` runs these
steps for ``harvest_transcript`` (in process) and ``harvest.queue.run_job`` (a recorded job);
the two differ only in their ``HarvestSteps``: where the plan comes from and where the
immutable ``HarvestOutcome`` goes.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar

from sqlalchemy import Connection

from harvest.budget import budget_for
from harvest.errors import HarvestError, UnrecordedHarvest
from harvest.extraction import Extraction, run_extraction, uses_model
from harvest.kept import KeptAnswer, write_retries
from harvest.llm import HarvestLLM
from harvest.model import Usage
from harvest.outcome import Counts, HarvestOutcome, Status
from harvest.redact import redact_transcript, transcript_hash
from harvest.transcript import Limits, Transcript, check_size, check_storable
from harvest.write import write_candidates
from store import Scope, Settings, StorageFailure, Store, forget, keyed, ledger, search_terms
from store.errors import InvalidInput, NoteChanged, format_error
from store.terms import content_terms
from store.text import check_principal, quoted

# Bump when extraction changes enough that old transcripts deserve a new harvest.
HARVESTER_VERSION = "1"
PROVENANCES = ("compaction", "import")
# Transcript terms matched against the owner's keyed notes: the most frequent ones.
RECALL_TERMS = 200

if TYPE_CHECKING:
    from store import Executor, TranscriptLock

log = logging.getLogger(__name__)


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


# --- plan -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """One transcript made ready to harvest: its scope, redacted text and hash."""

    scope: Scope
    transcript: Transcript  # redacted
    digest: str
    version: str
    provenance: str
    import_id: str | None = None  # the queued import it came in with: its budget counts it

    def outcome(
        self, status: Status, counts: Counts | None = None, **rest: object
    ) -> HarvestOutcome:
        """This transcript's outcome, with ``counts`` (none: all zero) and the other fields;
        the secrets redacted from the transcript when it came in are added to its count."""
        counted = counts if counts is not None else Counts()
        redacted = counted.secrets_redacted + self.transcript.secrets_redacted
        return HarvestOutcome.model_validate(
            {
                **counted.counts(),
                "secrets_redacted": redacted,
                "status": status,
                "conversation_id": self.transcript.conversation_id,
                "owner": self.scope.id,
                **rest,
            }
        )


def plan_harvest(
    settings: Settings,
    transcript: Transcript,
    *,
    owner: str | None,
    provenance: str,
    reassign_owner: bool = False,
    import_id: str | None = None,
) -> Plan:
    """Check the provenance, the size and the values (``check_storable``), resolve the owner
    (``resolve_owner``) and redact (HarvestError when one is bad)."""
    if provenance not in PROVENANCES:
        raise HarvestError(
            f"provenance must be compaction or import, got {quoted(provenance)}",
            reason="bad_provenance",
        )
    # Bounded before anything reads it all (a transcript from Python, or for the offline
    # extractor, meets the limits here); then redacted, so the owner error and the outcome
    # (logged, stored as the job's result) see only the redacted conversation id.
    check_size(transcript.messages, Limits.from_settings(settings))
    check_storable(transcript)  # before any model call: the record would refuse it after
    redacted = redact_transcript(transcript)
    name = resolve_owner(redacted, owner, reassign_owner=reassign_owner)
    return Plan(
        scope=Scope.owner(name),
        transcript=redacted,
        digest=transcript_hash(redacted),
        version=harvester_version(settings),
        provenance=provenance,
        import_id=import_id,
    )


# --- the ledger check -------------------------------------------------------------------


@dataclass(frozen=True)
class Ready:
    """A transcript the ledger check left to harvest: the owner's ``(topic_key, title)``
    pairs the model is shown, and how many times the owner and this conversation were
    forgotten when it was checked (a forget of either since then means the harvest writes
    nothing)."""

    known_keys: tuple[tuple[str, str], ...]
    forget_generation: int
    # The owner's notes the transcript bears on, shown to the model under refs its marks
    # name (a model only; the keyed ones first, then the best of a search).
    shown: tuple[keyed.ShownNote, ...] = ()


def harvested_before(session: Executor, plan: Plan) -> bool:
    """True when there is nothing to do: the ledger says this scope already harvested this
    transcript, or the owner forgot it (a tombstone)."""
    return ledger.state(
        session,
        plan.scope,
        plan.digest,
        plan.version,
        conversation_id=plan.transcript.conversation_id,
    )[1]


def look_up(
    session: Executor,
    settings: Settings,
    plan: Plan,
    llm: HarvestLLM | None = None,
    *,
    lock: TranscriptLock | None = None,
) -> Ready | None:
    """The ledger check under the transcript's lock: None when it was harvested (or
    forgotten) before, else what extraction needs.

    With ``lock`` (the transcript's, not taken yet) the lock is taken first, then the check
    made (``store.ledger.check_locked``); when another worker holds it,
    nothing is checked: None, and ``lock.held`` stays False. Without, the caller holds the
    lock already.

    What extraction needs is at most ``harvest_known_keys`` of the owner's ``(topic_key,
    title)`` pairs, those whose notes share the transcript's words (``recall_terms``) first,
    then the most recently changed, read with the check (``store.ledger.check``). Shown to
    the model so a fact that changes (a move, a new editor) reuses its key and replaces the
    old note, whose text goes to history. None are read for the offline extractor, which
    keeps its own fixed keys.
    """
    keys = settings.harvest_known_keys if uses_model(settings, llm) else 0
    terms = recall_terms(plan) if keys else []
    conversation = plan.transcript.conversation_id
    if lock is None:
        checked = ledger.check(
            session,
            plan.scope,
            plan.digest,
            plan.version,
            terms,
            keys=keys,
            conversation_id=conversation,
        )
    else:
        found = ledger.check_locked(
            session,
            lock,
            plan.scope,
            plan.digest,
            plan.version,
            terms=terms,
            keys=keys,
            conversation_id=conversation,
        )
        if found is None:
            return None
        checked = found
    generation, done, notes = checked
    if done:
        return None
    shown: list[keyed.ShownNote] = []
    if keys:
        shown = keyed.shown_notes(
            _core(session),
            settings,
            plan.scope,
            keys=[note.topic_key for note in notes],
            terms=search_query_terms(plan),
            limit=keys,
        )
    return Ready(tuple((note.topic_key, note.title) for note in notes), generation, tuple(shown))


def _core(session: Executor) -> Connection:
    """The Core connection under ``session`` (an ORM session's, or the connection itself)."""
    return session if isinstance(session, Connection) else session.connection()


def search_query_terms(plan: Plan) -> list[str]:
    """The search terms (``store.search_terms``) of what the user said, most frequent first:
    the notes a conversation bears on are searched with them."""
    counts: Counter[str] = Counter()
    for message in plan.transcript.messages:
        if message.role == "user":
            counts.update(search_terms.terms(message.content))
    return [term for term, _ in counts.most_common(32)]


def recall_terms(plan: Plan) -> list[str]:
    """The transcript's words the owner's keyed notes are ranked by: the most frequent
    content terms of what the user said."""
    counts: Counter[str] = Counter()
    for message in plan.transcript.messages:
        if message.role == "user":
            counts.update(content_terms(message.content))
    return [term for term, _ in counts.most_common(RECALL_TERMS)]


# --- extraction and the record ----------------------------------------------------------


def extract_notes(
    plan: Plan,
    ready: Ready,
    settings: Settings,
    llm: HarvestLLM | None = None,
    usage: Usage | None = None,
) -> Extraction | HarvestOutcome:
    """The model's candidates, or the ``failed`` outcome when the model failed (with what
    the calls made before the failure cost). ``usage`` is filled in as the calls are made."""
    usage = Usage() if usage is None else usage
    try:
        return run_extraction(
            plan.transcript, settings, llm, ready.known_keys, usage, known_notes=ready.shown
        )
    except HarvestError as exc:
        # Named as a harvested transcript's is: by the server's answer, once there was one.
        model = model_named(usage, settings)
        return plan.outcome("failed", usage.counts, model=model, error=f"{exc.reason}: {exc}")


class RecordedElsewhere(Exception):
    """Raised inside the record's transaction to roll it back (notes and all): another
    harvest recorded this transcript first, or the owner was forgotten since the plan."""


def record_harvest(
    session: Executor,
    settings: Settings,
    plan: Plan,
    ready: Ready,
    found: Extraction,
) -> HarvestOutcome:
    """Write the notes, then the ledger row with the final counts, in the caller's
    transaction; raise RecordedElsewhere when the ledger row cannot be written (another
    worker recorded this transcript, or the owner was forgotten since the check), so the
    caller rolls the notes back.

    The transaction is ``forget.held_off(store, plan.scope)``'s: a forget
    of the owner (or of one of its conversations) cannot commit from its start to its end,
    and the ledger row is written only while the forget count of the owner and this
    conversation is the one the check read.
    """
    if not forget.is_held_off(session, plan.scope):
        raise RuntimeError("record_harvest runs in a forget.held_off transaction of its scope")
    written = write_candidates(
        session,
        settings,
        plan.scope,
        found.notes,
        transcript=plan.transcript,
        provenance=plan.provenance,
        shown=ready.shown,
    )
    counts = found.cost + written.counts
    entry = ledger.LedgerEntry(
        transcript_hash=plan.digest,
        harvester_version=plan.version,
        conversation_id=plan.transcript.conversation_id,
        provenance=plan.provenance,
        occurred_at=plan.transcript.happened_at,
        model=found.model,
        # The ledger keeps the cost and the notes; redactions are the outcome's to report.
        **{k: v for k, v in counts.counts().items() if k != "secrets_redacted"},
    )
    if not ledger.record(session, plan.scope, entry, generation=ready.forget_generation):
        raise RecordedElsewhere(plan.digest)
    return plan.outcome("harvested", counts, model=found.model, slugs=written.slugs)


# --- the one harvest path ---------------------------------------------------------------


# What a caller's ``begin`` returns when there is nothing to do (a job's: None).
Nothing_co = TypeVar("Nothing_co", covariant=True)


class HarvestSteps(Protocol[Nothing_co]):
    """What a caller of ``run_harvest`` does around the shared steps."""

    def begin(self, session: Executor) -> Plan | HarvestOutcome | Nothing_co:
        """In the first transaction: the plan, the outcome already settled, or nothing
        to do."""

    def begun(self) -> None:
        """The first transaction committed and the harvest goes on."""

    def end(self, session: Executor, outcome: HarvestOutcome) -> None:
        """In the transaction that settles the outcome (the one that writes the notes)."""

    def broke(self, plan: Plan, error: HarvestError | ValueError, paid: Usage) -> HarvestOutcome:
        """Extraction or the record raised: the outcome to return instead, or raise;
        ``paid`` is what the model calls made so far cost (they are paid for)."""

    def unrecorded(self, plan: Plan, paid: Counts) -> bool:
        """The run paid for model calls and then failed before its outcome was recorded (the
        database, an interrupt): keep what they cost where it can still be kept (on a
        database failure ``UnrecordedHarvest`` also carries it to the caller); True when
        the job counts them now (a retry writing the kept answer then adds none)."""


def run_harvest(
    store: Store,
    steps: HarvestSteps[Nothing_co],
    llm: HarvestLLM | None = None,
    kept: KeptAnswer | None = None,
) -> HarvestOutcome | Nothing_co:
    """Harvest one transcript at most once: plan, lock, ledger check, extract, record.

    Two steps in the usual case: the plan with the ledger check (a transcript harvested
    before is settled right there, with no model call), each statement committing on its own
    (``Store.statements``: every write there is one statement), then one transaction for the
    notes, the ledger row and ``steps.end`` together (a ledger row that cannot be written,
    recorded elsewhere or forgotten meanwhile, rolls the notes back; a third transaction
    settles ``skipped``).
    The (scope, transcript) lock (``Store.transcript_lock``) is taken between them on no
    pooled connection; only when another worker holds it does the check wait for it, in a
    transaction of its own, and then usually find that worker's ledger row instead of
    calling the model again. A ``StorageFailure`` always propagates, so a queue can
    redeliver.

    The model's answer is kept until its notes are written (``harvest.kept``): a write the
    database fails is retried with it (``write_retries``), and a failure that outlasts those
    carries it on the ``UnrecordedHarvest`` raised. ``kept`` is such an answer from an
    earlier run: written, once the ledger check passes, instead of calling the model (when
    it is this transcript's under this harvester).
    """
    locks: list[TranscriptLock] = []
    try:
        outcome = _harvest(store, steps, llm, locks, kept)
    except BaseException:
        for lock in locks:  # an error is on its way out: a failing unlock must not replace it
            try:
                lock.release()
            except StorageFailure as unlock:  # its session is gone, and the lock with it
                log.warning("transcript lock not released while failing: %s", unlock)
        raise
    for lock in locks:
        lock.release()
    return outcome


def _harvest(
    store: Store,
    steps: HarvestSteps[Nothing_co],
    llm: HarvestLLM | None,
    locks: list[TranscriptLock],
    kept: KeptAnswer | None = None,
) -> HarvestOutcome | Nothing_co:
    """``run_harvest``'s steps; the transcript lock it takes goes into ``locks``, for the
    caller to release."""
    settings = store.settings
    # Each write here (the claim, a job settled at once) is one statement: on PostgreSQL
    # they commit on their own, without a BEGIN and a COMMIT round trip.
    with store.statements() as session:
        begun = steps.begin(session)
        if not isinstance(begun, Plan):
            return begun
        plan = begun
        lock = store.transcript_lock(plan.scope, plan.digest)
        locks.append(lock)
        ready = look_up(session, settings, plan, llm, lock=lock)
        # None: not checked yet, the lock being held elsewhere
        checked = _settled(steps, session, plan, ready) if lock.held else None
        if isinstance(checked, HarvestOutcome):
            return checked
    steps.begun()
    if checked is None:  # another worker is harvesting the same transcript: wait, look again
        lock.acquire()
        with store.transaction() as session:
            checked = _settled(steps, session, plan, look_up(session, settings, plan, llm))
            if isinstance(checked, HarvestOutcome):
                return checked
    # What the model calls cost so far, filled in as they are made: a run that fails or is
    # interrupted after them still has them counted (``steps.unrecorded``).
    usage = Usage(guard=budget_for(store, plan.scope.id, plan.import_id))
    # The answer in hand, kept until its notes are written (harvest.kept).
    answer: KeptAnswer | None = None
    try:
        if kept is not None and kept.fits(plan.digest, plan.version):
            answer = kept
            found: Extraction | HarvestOutcome = kept.extraction()
            checked = replace(checked, shown=kept.shown)  # the notes its marks' refs name
        else:
            found = extract_notes(plan, checked, settings, llm, usage)
        if isinstance(found, HarvestOutcome):
            with store.transaction() as session:
                return _settle(steps, session, found)
        if answer is None:
            answer = KeptAnswer(plan.digest, plan.version, found, checked.shown)
        try:
            recorded = _record_retrying(store, steps, plan, checked, found)
        except RecordedElsewhere:  # rolled back: nothing was written
            with store.transaction() as session:
                skipped = plan.outcome("skipped", found.cost, model=found.model)
                return _settle(steps, session, skipped)
    except StorageFailure as exc:
        _raise_unrecorded(steps, plan, usage.counts, exc, answer)
    except (HarvestError, ValueError) as exc:
        try:
            return steps.broke(plan, exc, usage)
        except StorageFailure as failure:
            _raise_unrecorded(steps, plan, usage.counts, failure)
    except Exception:
        # Interrupted (a time limit, say) or a defect: not settled here, but the calls made
        # were paid for.
        if usage.counts.model_calls:
            steps.unrecorded(plan, usage.counts)
        raise
    store.freshness.wrote(recorded.notes_written + recorded.notes_updated)
    return recorded


def _raise_unrecorded(
    steps: HarvestSteps[object],
    plan: Plan,
    paid: Counts,
    failure: StorageFailure,
    answer: KeptAnswer | None = None,
) -> NoReturn:
    """Raise on a database failure before the outcome was recorded: the failure itself when
    no model call was made and no answer is in hand, else ``UnrecordedHarvest`` carrying
    what the calls cost, once ``steps.unrecorded`` kept it where it still could, and the
    answer, to be written by a retry instead of calling the model again."""
    if not paid.model_calls and answer is None:
        raise failure
    counted = steps.unrecorded(plan, paid) if paid.model_calls else False
    if answer is not None and counted:
        answer = replace(answer, counted=True)
    kept = answer.as_json() if answer is not None and answer.keepable() else None
    if kept is None and not paid.model_calls:
        raise failure
    raise UnrecordedHarvest(failure, paid, kept) from failure


def _record_retrying(
    store: Store, steps: HarvestSteps[object], plan: Plan, ready: Ready, found: Extraction
) -> HarvestOutcome:
    """``_record_racing``, retried while the database fails (``harvest.kept.write_retries``):
    the model's answer is written, not asked for again."""
    for attempt in write_retries():
        with attempt:
            return _record_racing(store, steps, plan, ready, found)
    raise AssertionError("unreachable: write_retries re-raises the last failure")


# How often in a row one harvest's write may lose a race with another writer (a note changed
# under a rewrite) before the job is left to a retry later.
WRITE_RACES = 3


def _record_racing(
    store: Store, steps: HarvestSteps[object], plan: Plan, ready: Ready, found: Extraction
) -> HarvestOutcome:
    """``_record``, again at once when another writer won a race (rolled back, nothing
    written): every rewrite is decided again on what is stored now."""
    for _ in range(WRITE_RACES):
        try:
            return _record(store, steps, plan, ready, found)
        except NoteChanged as exc:
            lost = exc
    raise StorageFailure(
        f"the harvest's notes lost {WRITE_RACES} races with other writers in a row ({lost})",
        reason="write_races",
    )


def _record(
    store: Store,
    steps: HarvestSteps[object],
    plan: Plan,
    ready: Ready,
    found: Extraction,
) -> HarvestOutcome:
    """``record_harvest`` and the outcome settled in one transaction that holds off a forget
    of the owner."""
    with forget.held_off(store, plan.scope) as session:
        outcome = record_harvest(session, store.settings, plan, ready, found)
        return _settle(steps, session, outcome)


def _settled(
    steps: HarvestSteps[object], session: Executor, plan: Plan, ready: Ready | None
) -> Ready | HarvestOutcome:
    """``look_up``'s answer under the lock; a transcript done before is settled
    (``skipped``)."""
    return ready if ready is not None else _settle(steps, session, plan.outcome("skipped"))


def _settle(
    steps: HarvestSteps[object], session: Executor, outcome: HarvestOutcome
) -> HarvestOutcome:
    steps.end(session, outcome)
    return outcome


@dataclass(frozen=True)
class _InProcess:
    """``harvest_transcript``'s steps: a transcript from the caller, the outcome to it."""

    settings: Settings
    transcript: Transcript
    owner: str | None
    provenance: str
    reassign_owner: bool

    def begin(self, session: Executor) -> Plan:
        return plan_harvest(
            self.settings,
            self.transcript,
            owner=self.owner,
            provenance=self.provenance,
            reassign_owner=self.reassign_owner,
        )

    def begun(self) -> None:
        pass

    def end(self, session: Executor, outcome: HarvestOutcome) -> None:
        pass

    def broke(self, plan: Plan, error: HarvestError | ValueError, paid: Usage) -> HarvestOutcome:
        return failed_after(plan, error, paid, self.settings)

    def unrecorded(self, plan: Plan, paid: Counts) -> bool:
        return False  # the caller gets the cost on the UnrecordedHarvest raised


def failed_after(
    plan: Plan, error: HarvestError | ValueError, paid: Usage, settings: Settings
) -> HarvestOutcome:
    """The ``failed`` outcome of a harvest that raised once planned: the reason, and what the
    model calls already made cost (an error while writing, or while settling a failed
    extraction, comes after them)."""
    model = model_named(paid, settings)
    return plan.outcome("failed", paid.counts, model=model, error=format_error(error))


def model_named(usage: Usage, settings: Settings) -> str:
    """The model an outcome names: the one the server said answered, else the setting's."""
    return usage.model or str(settings.harvest_model or "offline")


def harvest_transcript(
    store: Store,
    transcript: Transcript,
    *,
    owner: str | None = None,
    provenance: str = "compaction",
    llm: HarvestLLM | None = None,
    reassign_owner: bool = False,
) -> HarvestOutcome:
    """Harvest one transcript into its owner's scope, at most once (``run_harvest``).

    ``owner`` is the owner of a transcript that names none; ``reassign_owner`` puts this one
    in ``owner``'s scope whatever it names (``resolve_owner``). A database failure
    propagates as a StorageFailure; one that came after the model answered is an
    ``UnrecordedHarvest`` whose ``spent`` is what the calls cost (no outcome carries it).

    The transcript is redacted before anything else sees it. A transcript this scope already
    harvested (same redacted text, same harvester) makes no model call and writes nothing.
    Model failures come back as a ``failed`` outcome with the reason; nothing is written
    then. A bad transcript or owner raises HarvestError.
    """
    steps = _InProcess(store.settings, transcript, owner, provenance, reassign_owner)
    return run_harvest(store, steps, llm)
