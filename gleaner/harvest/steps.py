"""What a caller of ``harvest.job.run_harvest`` does around the shared steps
(``HarvestSteps``: an in-process harvest, a recorded job), and the ``failed`` outcome both
give when a planned harvest raises (or, on a database failure after the model answered,
the ``UnrecordedHarvest`` it raises)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NoReturn, Protocol, TypeVar

from gleaner.harvest.errors import HarvestError, UnrecordedHarvest
from gleaner.harvest.kept import KeptAnswer
from gleaner.harvest.model import Usage
from gleaner.harvest.outcome import Counts, HarvestOutcome
from gleaner.harvest.plan import Plan
from gleaner.store import Settings, StorageFailure
from gleaner.store.errors import format_error

if TYPE_CHECKING:
    from gleaner.store import Executor

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


def raise_unrecorded(
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
