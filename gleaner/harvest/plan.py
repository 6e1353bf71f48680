"""The first step of a harvest: one transcript checked, redacted and given its owner, scope
and hash (``Plan``), before any lock, ledger or model sees it (``harvest.job``)."""

from __future__ import annotations

from dataclasses import dataclass

from gleaner.harvest.errors import HarvestError
from gleaner.harvest.outcome import Counts, HarvestOutcome, Status
from gleaner.harvest.redact import redact_transcript, transcript_hash
from gleaner.harvest.transcript import Limits, Transcript, check_size, check_storable
from gleaner.store import Scope, Settings
from gleaner.store.errors import InvalidInput
from gleaner.store.text import check_principal, quoted

# Bump when extraction changes enough that old transcripts deserve a new harvest.
HARVESTER_VERSION = "1"
PROVENANCES = ("compaction", "import")


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
