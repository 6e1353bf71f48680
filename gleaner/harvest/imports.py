"""Bulk imports: fan an export out into recorded jobs, and estimate the cost beforehand."""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gleaner.harvest.batch import Summary, failure_label, no_owner, refusal, said_order
from gleaner.harvest.errors import HarvestError
from gleaner.harvest.intake import Settled, settle
from gleaner.harvest.queue import record_settled
from gleaner.harvest.queues import IMPORT_QUEUE
from gleaner.harvest.readers import STDIN, iter_path, iter_paths
from gleaner.harvest.redact import redact_text
from gleaner.harvest.transcript import Limits, Transcript
from gleaner.store import Settings, Store
from gleaner.store.jobs import queue as job_records

if TYPE_CHECKING:
    from gleaner.store import Executor

# Jobs recorded per transaction: a 100k-conversation export commits (and can be sent) in steps.
RECORD_BATCH = 500
# Expected answer size of one call, for estimates only.
ESTIMATED_COMPLETION_TOKENS = 250


@dataclass
class PlannedImport:
    """An import recorded in the database: its id and the job ids still to send."""

    import_id: str
    job_ids: list[str]
    queue: str = IMPORT_QUEUE
    unreadable: list[dict[str, str]] = field(default_factory=list)


def plan_import(
    store: Store,
    path: str | Path,
    *,
    owner: str | None,
    provenance: str = "import",
    reassign_owner: bool = False,
) -> PlannedImport:
    """Read an export and record one pending job per conversation, in batches.

    ``owner`` fills in conversations that name none; ``reassign_owner`` overrides every one.

    Conversations that cannot be read are counted on the import and listed; a missing owner
    (exports carry none) raises HarvestError(reason="no_owner") before anything is recorded.
    The export is read twice, a conversation at a time (``harvest.readers.iter_path``):
    first to judge every conversation, then to record the readable ones RECORD_BATCH at a
    time, so memory follows the largest conversation and a batch, not the export. The job
    ids come back oldest said first, the order ``judge_owners`` gives a harvest.
    """
    summary = Summary()
    limits = Limits.from_settings(store.settings)
    files = _judged_files(Path(path), owner, summary, limits, reassign_owner=reassign_owner)
    if not any(readable for _, readable in files) and summary.failures:
        raise HarvestError(summary.failures[0]["error"], reason="bad_transcript")
    with store.transaction() as session:
        import_id = job_records.create_import(
            session,
            source=redact_text(str(path)),
            owner=owner or "(transcript owners)",
            provenance=provenance,
            unreadable=len(summary.failures),
        )
    planned = PlannedImport(import_id=import_id, job_ids=[], unreadable=summary.failures)
    ordered: list[tuple[tuple[bool, float], int, str]] = []
    batch: list[Settled] = []

    def record(batch: list[Settled]) -> None:
        ids = record_settled(
            store, batch, provenance=provenance, queue=IMPORT_QUEUE, import_id=import_id
        )
        for item, job_id in zip(batch, ids, strict=True):
            ordered.append((said_order(item.transcript), len(ordered), job_id))

    for file, readable in files:
        if not readable:
            continue
        for transcript in _conversations(file, limits, readable):
            # Taken in once, as it is recorded (the first reading counted the refusals).
            with suppress(HarvestError):
                batch.append(settle(transcript, owner, reassign_owner=reassign_owner))
            if len(batch) == RECORD_BATCH:
                record(batch)
                batch = []
    if batch:
        record(batch)
    planned.job_ids = [job_id for _, _, job_id in sorted(ordered)]
    return planned


def _judged_files(
    path: Path, owner: str | None, summary: Summary, limits: Limits, *, reassign_owner: bool
) -> list[tuple[Path, list[Transcript] | bool]]:
    """Each file under ``path`` and whether it is read again to record its conversations:
    True (it is read again), False (the whole file failed) or, for standard input, which
    cannot be read twice, its conversations. Unreadable conversations and refused owners go
    to ``summary``; HarvestError(reason="no_owner") when some conversation has no owner and
    ``owner`` is None."""
    judged: list[tuple[Path, list[Transcript] | bool]] = []
    missing, first_missing = 0, None
    for file in iter_paths([path]):
        kept: list[Transcript] = []
        failures: list[tuple[str, str]] = []
        try:
            for read in iter_path(file, limits=limits):
                if read.transcript is None:
                    failures.append((read.label, read.error))
                    continue
                if not owner and not read.transcript.owner:
                    missing += 1
                    first_missing = first_missing or read.transcript
                    continue
                refused = refusal(read.transcript, owner, reassign_owner)
                if refused is not None:
                    failures.append((failure_label(read.transcript.conversation_id), refused))
                elif str(file) == STDIN:
                    kept.append(read.transcript)
        except HarvestError as exc:  # the whole file failed, as read_all counts it
            summary.fail(redact_text(str(file)), redact_text(f"{exc.reason}: {exc}"))
            judged.append((file, False))
            continue
        for label, reason in failures:
            summary.fail(label, reason)
        judged.append((file, kept if str(file) == STDIN else True))
    if first_missing is not None:
        raise no_owner(missing, first_missing)
    return judged


def _conversations(
    file: Path, limits: Limits, readable: list[Transcript] | bool
) -> Iterable[Transcript]:
    if isinstance(readable, list):
        return readable
    return (read.transcript for read in iter_path(file, limits=limits) if read.transcript)


@dataclass
class Estimate:
    """What an import would cost before anything runs.

    ``conversations`` are those a run would harvest: ``already_harvested`` counts the ones
    the ledger (or a forget's tombstone) says are done, which cost nothing. ``unreadable``
    counts files and conversations that cannot be read or whose owner is refused.
    ``too_large`` counts the conversations harvest would refuse for their size: over a
    transcript or file limit when read (those are not among ``unreadable``), or needing more
    than ``harvest_max_calls`` model requests; the calls and tokens count only the rest.
    """

    conversations: int
    unreadable: int
    messages: int
    transcript_tokens: int
    model_calls: int
    prompt_tokens: int
    completion_tokens: int
    model: str
    cost_usd: float | None
    too_large: int = 0
    already_harvested: int = 0
    unreadable_conversations: list[dict[str, str]] = field(default_factory=list)


def estimate(
    paths: Iterable[Path],
    settings: Settings,
    *,
    owner: str | None = None,
    reassign_owner: bool = False,
    store: Store | None = None,
) -> Estimate:
    """Count conversations, tokens and calls (and the cost, when litellm knows the model).

    Reads, judges owners and chunks exactly as a harvest would (the same limits, the same
    bounded tokenizing, the same owner rule: HarvestError(reason="no_owner") when a
    conversation names no owner and ``owner`` is None), so an input a harvest refuses is
    counted, never expanded. With ``store``, conversations its ledger or tombstones say are
    done are left out (``already_harvested``).
    """
    from gleaner.harvest.chunks import count_tokens
    from gleaner.harvest.prompt import system_prompt, user_prompt

    summary = Summary()
    limits = Limits.from_settings(settings)
    # The fixed part of a request: the system rules and the user turn around the transcript.
    fixed = count_tokens(system_prompt(max_facts=settings.harvest_max_facts)) + count_tokens(
        user_prompt(
            "",
            max_facts=settings.harvest_max_facts,
            types=tuple(settings.observation_types),
        )
    )
    total = _Tally()
    missing, first_missing = 0, None
    with store.transaction() if store is not None else nullcontext() as session:
        # A file at a time, a conversation at a time: a file that fails part-way counts as a
        # failed file only, as when it was read whole.
        for file in iter_paths(paths):
            try:
                part = _estimate_file(
                    file,
                    settings,
                    session,
                    limits=limits,
                    fixed=fixed,
                    owner=owner,
                    reassign_owner=reassign_owner,
                    count=first_missing is None,
                )
            except HarvestError as exc:
                summary.fail(redact_text(str(file)), redact_text(f"{exc.reason}: {exc}"))
                continue
            total.add(part)
            missing += part.missing
            first_missing = first_missing or part.first_missing
            for label, reason in part.failures:
                summary.fail(label, reason)
    if first_missing is not None:
        raise no_owner(missing, first_missing)
    # Refused when read: their reason comes first (harvest.readers.ReadResult).
    refused_read = sum(1 for f in summary.failures if f["error"].startswith("too_large:"))
    model = settings.harvest_model or "offline"
    calls, prompt = total.calls, total.prompt
    completion = calls * ESTIMATED_COMPLETION_TOKENS
    cost: float | None = 0.0
    if settings.harvest_model:
        cost = _cost(settings.harvest_model, prompt, completion)
    else:
        calls = prompt = completion = 0
    return Estimate(
        conversations=total.conversations,
        unreadable=len(summary.failures) - refused_read,
        messages=total.messages,
        transcript_tokens=total.tokens,
        model_calls=calls,
        prompt_tokens=prompt,
        completion_tokens=completion,
        model=model,
        cost_usd=cost,
        too_large=refused_read + total.refused_calls,
        already_harvested=total.harvested,
        unreadable_conversations=[
            f for f in summary.failures if not f["error"].startswith("too_large:")
        ],
    )


def _estimate_file(
    file: Path,
    settings: Settings,
    session: Executor | None,
    *,
    limits: Limits,
    fixed: int,
    owner: str | None,
    reassign_owner: bool,
    count: bool,
) -> _Tally:
    """One file's part of an estimate, read a conversation at a time (``count`` False: the
    run is refused for a missing owner already, only owners are looked at)."""
    part = _Tally()
    for read in iter_path(file, limits=limits):
        transcript = read.transcript
        if transcript is None:
            part.failures.append((read.label, read.error))
        elif not owner and not transcript.owner:
            part.missing += 1
            part.first_missing = part.first_missing or transcript
        elif refused := refusal(transcript, owner, reassign_owner):
            part.failures.append((failure_label(transcript.conversation_id), refused))
        elif count and part.first_missing is None:
            redacted = _to_harvest(
                transcript, settings, session, owner=owner, reassign_owner=reassign_owner
            )
            part.count(redacted, settings, fixed)
    return part


@dataclass
class _Tally:
    """What an estimate counts, for one file or all of them; a file's refusals and the
    conversations it holds without an owner stay with its part until it was read whole."""

    failures: list[tuple[str, str]] = field(default_factory=list)
    missing: int = 0
    first_missing: Transcript | None = None
    conversations: int = 0
    harvested: int = 0
    messages: int = 0
    tokens: int = 0
    calls: int = 0
    prompt: int = 0
    refused_calls: int = 0

    def count(self, redacted: Transcript | None, settings: Settings, fixed: int) -> None:
        """Count one conversation (None: its ledger or a tombstone says it is done)."""
        from gleaner.harvest.chunks import chunk_sizes
        from gleaner.harvest.prompt import render_message

        if redacted is None:
            self.harvested += 1
            return
        self.conversations += 1
        self.messages += len(redacted.messages)
        blocks = [render_message(m) for m in redacted.messages if m.content.strip()]
        sizes = chunk_sizes(blocks, settings.harvest_context_tokens)
        self.tokens += sum(sizes)
        if settings.harvest_model and len(sizes) > settings.harvest_max_calls:
            self.refused_calls += 1  # refused before its first call: it costs nothing
            return
        self.calls += len(sizes)
        self.prompt += sum(sizes) + len(sizes) * fixed

    def add(self, other: _Tally) -> None:
        """Add ``other``'s counts (its failures and owners are the caller's to take)."""
        for name in _COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_COUNTS = ("conversations", "harvested", "messages", "tokens", "calls", "prompt", "refused_calls")


def _to_harvest(
    transcript: Transcript,
    settings: Settings,
    session: Executor | None,
    *,
    owner: str | None,
    reassign_owner: bool,
) -> Transcript | None:
    """The redacted transcript a harvest would run, or None when the ledger or a tombstone
    says it is done (only asked with a ``session``)."""
    from gleaner.harvest.ledger_check import harvested_before
    from gleaner.harvest.plan import plan_harvest
    from gleaner.harvest.redact import redact_transcript

    if session is None:
        return redact_transcript(transcript)
    plan = plan_harvest(
        settings, transcript, owner=owner, provenance="import", reassign_owner=reassign_owner
    )
    return None if harvested_before(session, plan) else plan.transcript


def _cost(model: str, prompt_tokens: int, completion_tokens: int) -> float | None:
    """USD from litellm's bundled price table, to the hundredth of a cent; None when the
    model is not in it."""
    from gleaner.harvest.litellm_client import price_usd

    price = price_usd(model, prompt_tokens, completion_tokens)
    return None if price is None else round(price, 4)
