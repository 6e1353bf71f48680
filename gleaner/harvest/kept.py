"""The model's answer kept until its notes are written: a database failure after the model
answered retries the write, never the model.

Within one run the record is retried at once (:func:`write_retries`); a run that still
cannot write raises ``UnrecordedHarvest`` carrying the answer as JSON (:class:`KeptAnswer`),
which a queue's retry hands back to the next run of the same job: that run checks the ledger
again and writes the kept notes with no model call. So a transcript costs the README's bound
of model calls whatever the database does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.extraction import Extraction
from gleaner.harvest.outcome import Counts
from gleaner.store import StorageFailure, strip_private
from gleaner.store.notes import keyed

log = logging.getLogger(__name__)

# Attempts of one run's write, after jittered waits from 0.5 s doubling up to 4 s (about 7 s
# in all): a database that fails longer is left to the queue's retry, which frees the worker
# and keeps the answer (``KeptAnswer``).
WRITE_ATTEMPTS = 5
WRITE_BACKOFF_SECONDS, WRITE_BACKOFF_MAX_SECONDS = 0.5, 4.0
# The usage counters, zeroed in a kept answer whose calls the job already counts.
USAGE = ("model_calls", "prompt_tokens", "completion_tokens")


def retried_failure(exc: BaseException) -> bool:
    """Whether a write that raised ``exc`` is worth trying again at once: the database
    failed (disk full, connection lost), not a value it refused (``data_refused``), a
    missing schema or races lost to other writers, which would end the same way."""
    return isinstance(exc, StorageFailure) and exc.reason == StorageFailure.reason


def write_retries(*, sleep: Callable[[float], None] = time.sleep) -> Retrying:
    """The retry of one run's write (``harvest.job``): up to WRITE_ATTEMPTS attempts while
    the database fails (``retried_failure``), the last error re-raised."""

    def log_retry(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "writing a harvest's notes failed (attempt %d: %s); the model's answer is kept "
            "and the write retried in %.2fs",
            state.attempt_number,
            error,
            state.upcoming_sleep,
        )

    return Retrying(
        retry=retry_if_exception(retried_failure),
        stop=stop_after_attempt(WRITE_ATTEMPTS),
        wait=wait_random_exponential(
            multiplier=WRITE_BACKOFF_SECONDS, max=WRITE_BACKOFF_MAX_SECONDS
        ),
        sleep=sleep,
        before_sleep=log_retry,
        reraise=True,
    )


@dataclass(frozen=True)
class KeptAnswer:
    """A model's answer for one transcript (its redacted text's ``digest`` under harvester
    ``version``) that is not written yet: the notes, the owner's notes shown with the
    transcript (the refs of the notes' marks name them), and whether the job already
    counts the calls it cost (``counted``: then a run writing it adds none)."""

    digest: str
    version: str
    found: Extraction
    shown: tuple[keyed.ShownNote, ...]
    counted: bool = False

    def fits(self, digest: str, version: str) -> bool:
        """Whether this is the answer for that transcript and harvester."""
        return (self.digest, self.version) == (digest, version)

    def extraction(self) -> Extraction:
        """The notes to write, with what they cost still to count (none when counted)."""
        if not self.counted:
            return self.found
        cost = self.found.cost.model_copy(update=dict.fromkeys(USAGE, 0))
        return dataclasses.replace(self.found, cost=cost)

    def keepable(self) -> bool:
        """Whether the answer may travel in a queue message: it cost model calls (the
        offline extractor's is found again for nothing) and holds no ``<private>`` tag (no
        queue message ever holds one; the write would strip it, a retry asks again)."""
        if self.found.model == "offline":
            return False
        texts = json.dumps(self.as_json(), ensure_ascii=False)
        return strip_private(texts) == texts

    def as_json(self) -> dict[str, Any]:
        """The answer as a queue message's JSON carries it (``from_json`` reads it back)."""
        return {
            "digest": self.digest,
            "version": self.version,
            "model": self.found.model,
            "notes": [note.model_dump(mode="json") for note in self.found.notes],
            "cost": self.found.cost.counts(),
            "shown": [dataclasses.asdict(note) for note in self.shown],
            "counted": self.counted,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KeptAnswer:
        """The answer ``as_json`` gave; ValueError (or a pydantic ValidationError, one) when
        ``data`` is not one."""
        try:
            found = Extraction(
                notes=[NoteCandidate.model_validate(note) for note in data["notes"]],
                model=str(data["model"]),
                cost=Counts.model_validate(data["cost"]),
            )
            shown = tuple(keyed.ShownNote(**note) for note in data["shown"])
            return cls(
                str(data["digest"]), str(data["version"]), found, shown, bool(data["counted"])
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a kept answer: {type(exc).__name__}: {exc}") from None
