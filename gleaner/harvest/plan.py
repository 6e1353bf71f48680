"""The first step of a harvest: one transcript checked, redacted and given its owner, scope
and hash (``Plan``), before any lock, ledger or model sees it (``harvest.job``)."""

from __future__ import annotations

from dataclasses import dataclass

from gleaner.config.harvest import HarvestSettings
from gleaner.harvest.errors import HarvestError
from gleaner.harvest.intake import Settled, settle
from gleaner.harvest.outcome import Counts, HarvestOutcome, Status
from gleaner.harvest.transcript import Limits, Transcript, check_size
from gleaner.store import Scope, Settings
from gleaner.store.text import quoted

# Bump when extraction changes enough that old transcripts deserve a new harvest.
HARVESTER_VERSION = "1"
PROVENANCES = ("compaction", "import")


def harvester_version(settings: HarvestSettings) -> str:
    """The ledger's version key: the extractor's version and which model ran it."""
    return f"{HARVESTER_VERSION}:{settings.harvest_model or 'offline'}"


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
    """Check the provenance and the size, then take the transcript in (``harvest.intake``:
    values, redaction, owner) and plan it; HarvestError when one is bad. A recorded job's
    run plans its stored transcript so."""
    check_provenance(provenance)
    settled = settle_bounded(settings, transcript, owner, reassign_owner=reassign_owner)
    return plan_settled(settings, settled, provenance=provenance, import_id=import_id)


def settle_bounded(
    settings: HarvestSettings,
    transcript: Transcript,
    owner: str | None,
    *,
    reassign_owner: bool = False,
) -> Settled:
    """A transcript from Python (or a job's stored one) bounded by the read limits before
    anything reads it all, then taken in (``harvest.intake.settle``), so the owner error
    and the outcome (logged, stored as the job's result) see only the redacted conversation
    id. HarvestError when one is bad."""
    check_size(transcript.messages, Limits.from_settings(settings))
    return settle(transcript, owner, reassign_owner=reassign_owner)


def plan_settled(
    settings: Settings, settled: Settled, *, provenance: str, import_id: str | None = None
) -> Plan:
    """The plan of a transcript already taken in (read within the limits, redacted, its
    owner settled), under a provenance the caller checked (``check_provenance``)."""
    return Plan(
        scope=Scope.owner(settled.owner),
        transcript=settled.transcript,
        digest=settled.digest,
        version=harvester_version(settings),
        provenance=provenance,
        import_id=import_id,
    )


def check_provenance(provenance: str) -> None:
    """HarvestError(``bad_provenance``) for a provenance other than compaction or import."""
    if provenance not in PROVENANCES:
        raise HarvestError(
            f"provenance must be compaction or import, got {quoted(provenance)}",
            reason="bad_provenance",
        )
