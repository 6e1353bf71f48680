"""One transcript in, notes out: the one harvest path, in process or as a recorded job.

plan (limits, redaction, owner, hash) -> the (scope, transcript) lock -> the ledger check ->
extraction -> the record (notes, then the ledger row, one transaction). ``run_harvest`` runs these
steps for ``harvest_transcript`` (in process) and ``harvest.queue.run_job`` (a recorded job);
the two differ only in their ``HarvestSteps``: where the plan comes from and where the
immutable ``HarvestOutcome`` goes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gleaner.harvest.budget import budget_for
from gleaner.harvest.errors import HarvestError
from gleaner.harvest.extraction import Extraction, run_extraction
from gleaner.harvest.intake import Settled
from gleaner.harvest.kept import KeptAnswer, write_retries
from gleaner.harvest.ledger_check import Ready, look_up
from gleaner.harvest.llm import HarvestLLM
from gleaner.harvest.model import Usage
from gleaner.harvest.outcome import Counts, HarvestOutcome
from gleaner.harvest.plan import Plan, check_provenance, plan_settled, settle_bounded
from gleaner.harvest.steps import (
    HarvestSteps,
    Nothing_co,
    failed_after,
    model_named,
    raise_unrecorded,
)
from gleaner.harvest.transcript import Transcript
from gleaner.harvest.write import write_candidates
from gleaner.store import Settings, StorageFailure, Store
from gleaner.store.errors import NoteChanged
from gleaner.store.jobs import ledger
from gleaner.store.owners import forget

if TYPE_CHECKING:
    from gleaner.store import Executor, TranscriptLock

log = logging.getLogger(__name__)


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
    started = _lock_and_check(store, steps, llm, locks)
    if not isinstance(started, _Checked):
        return started
    plan, checked = started.plan, started.ready
    # What the model calls cost so far, filled in as they are made: a run that fails or is
    # interrupted after them still has them counted (``steps.unrecorded``).
    usage = Usage(guard=budget_for(store, plan.scope.id, plan.import_id))
    # The answer in hand, kept until its notes are written (harvest.kept).
    answer: KeptAnswer | None = None
    try:
        checked, found, answer = _answer(
            plan, checked, store.settings, llm=llm, usage=usage, kept=kept
        )
        if isinstance(found, HarvestOutcome):
            with store.transaction() as session:
                return _settle(steps, session, found)
        try:
            recorded = _record_retrying(store, steps, plan, checked, found)
        except RecordedElsewhere:  # rolled back: nothing was written
            with store.transaction() as session:
                skipped = plan.outcome("skipped", found.cost, model=found.model)
                return _settle(steps, session, skipped)
    except StorageFailure as exc:
        raise_unrecorded(steps, plan, usage.counts, exc, answer)
    except (HarvestError, ValueError) as exc:
        try:
            return steps.broke(plan, exc, usage)
        except StorageFailure as failure:
            raise_unrecorded(steps, plan, usage.counts, failure)
    except Exception:
        # Interrupted (a time limit, say) or a defect: not settled here, but the calls made
        # were paid for.
        if usage.counts.model_calls:
            steps.unrecorded(plan, usage.counts)
        raise
    store.freshness.wrote(recorded.notes_written + recorded.notes_updated)
    return recorded


@dataclass(frozen=True)
class _Checked:
    """A planned transcript the ledger check, under its lock, left to harvest."""

    plan: Plan
    ready: Ready


def _lock_and_check(
    store: Store,
    steps: HarvestSteps[Nothing_co],
    llm: HarvestLLM | None,
    locks: list[TranscriptLock],
) -> _Checked | HarvestOutcome | Nothing_co:
    """Plan, take the transcript's lock (waiting for another worker harvesting the same
    transcript) and check the ledger; what ``begin`` or the check settled, else the plan."""
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
    return _Checked(plan, checked)


def _answer(
    plan: Plan,
    checked: Ready,
    settings: Settings,
    *,
    llm: HarvestLLM | None,
    usage: Usage,
    kept: KeptAnswer | None,
) -> tuple[Ready, Extraction | HarvestOutcome, KeptAnswer | None]:
    """The model's answer: the one a failed write kept, when it is this transcript's (with
    the notes its marks' refs name), else a fresh extraction (or its ``failed`` outcome);
    and the answer to keep until its notes are written."""
    if kept is not None and kept.fits(plan.digest, plan.version):
        return replace(checked, shown=kept.shown), kept.extraction(), kept
    found = extract_notes(plan, checked, settings, llm, usage)
    if isinstance(found, HarvestOutcome):
        return checked, found, None
    return checked, found, KeptAnswer(plan.digest, plan.version, found, checked.shown)


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
    """``harvest_settled``'s steps: a transcript from the caller, the outcome to it."""

    settings: Settings
    settled: Settled
    provenance: str

    def begin(self, session: Executor) -> Plan:
        return plan_settled(self.settings, self.settled, provenance=self.provenance)

    def begun(self) -> None:
        pass

    def end(self, session: Executor, outcome: HarvestOutcome) -> None:
        pass

    def broke(self, plan: Plan, error: HarvestError | ValueError, paid: Usage) -> HarvestOutcome:
        return failed_after(plan, error, paid, self.settings)

    def unrecorded(self, plan: Plan, paid: Counts) -> bool:
        return False  # the caller gets the cost on the UnrecordedHarvest raised


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
    check_provenance(provenance)
    settled = settle_bounded(store.settings, transcript, owner, reassign_owner=reassign_owner)
    return run_harvest(store, _InProcess(store.settings, settled, provenance), llm)


def harvest_settled(
    store: Store,
    settled: Settled,
    *,
    provenance: str = "compaction",
    llm: HarvestLLM | None = None,
) -> HarvestOutcome:
    """``harvest_transcript`` for a transcript already taken in (``harvest.intake``): read
    within the limits, redacted, its owner settled; nothing is redacted again."""
    check_provenance(provenance)
    return run_harvest(store, _InProcess(store.settings, settled, provenance), llm)
