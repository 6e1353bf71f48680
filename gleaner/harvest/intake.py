"""Taking a transcript in: the one step every entry point (``gleaner harvest``,
``enqueue`` and ``import``, the Claude Code hook, the Python API, HTTP and MCP) runs on a
transcript it read, once, before anything records or harvests it: its values checked
storable, its text redacted, its owner settled by the one owner rule.

A ``Settled`` transcript is what the rest of the pipeline takes (``harvest.queue`` records
it as a job, ``harvest.job`` harvests it in process), so nothing after it redacts or
settles the owner again. A recorded job's run redacts its stored transcript once more
(``harvest.plan.plan_harvest``): a job recorded before a new secret detector was added
is held to it too.
"""

from __future__ import annotations

from dataclasses import dataclass

from gleaner.harvest.errors import HarvestError
from gleaner.harvest.redact import redact_transcript, transcript_hash
from gleaner.harvest.transcript import Transcript, check_storable
from gleaner.store.errors import InvalidInput
from gleaner.store.text import check_principal


@dataclass(frozen=True)
class Settled:
    """One transcript taken in: ``transcript`` redacted, ``owner`` settled, ``digest`` the
    redacted text's hash (the ledger's key)."""

    owner: str
    transcript: Transcript
    digest: str

    @property
    def conversation_id(self) -> str:
        return self.transcript.conversation_id  # redacted with the rest


def settle(transcript: Transcript, owner: str | None, *, reassign_owner: bool = False) -> Settled:
    """Check the values (``check_storable``: one the database refuses would fail a whole
    batch), redact, then settle the owner on the redacted transcript, so an owner error
    names only the redacted conversation id. HarvestError when one is bad."""
    check_storable(transcript)
    redacted = redact_transcript(transcript)
    name = resolve_owner(redacted, owner, reassign_owner=reassign_owner)
    return Settled(owner=name, transcript=redacted, digest=transcript_hash(redacted))


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
