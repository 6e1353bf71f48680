"""Writing one transcript's candidate notes into its owner's scope, without twins."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gleaner.harvest import grounding
from gleaner.harvest.candidate import NoteCandidate
from gleaner.harvest.outcome import Counts
from gleaner.harvest.transcript import Transcript
from gleaner.privacy import redact
from gleaner.store import Scope, Settings, normalize_topics, strip_private
from gleaner.store.notes import judge, keyed, notes, similar
from gleaner.store.notes.instructions import instruction_flag
from gleaner.store.notes.keyed import ShownNote
from gleaner.store.notes.similar import Twin
from gleaner.store.notes.terms import FactText, jaccard, similarity_terms

if TYPE_CHECKING:
    from gleaner.store import Executor


@dataclass(frozen=True)
class Written:
    """What ``write_candidates`` did: notes written, updated and skipped, items dropped
    (``counts``), and the slugs written or updated, in order."""

    counts: Counts
    slugs: tuple[str, ...]


def write_candidates(
    session: Executor,
    settings: Settings,
    scope: Scope,
    candidates: list[NoteCandidate],
    *,
    transcript: Transcript,
    provenance: str,
    shown: Sequence[ShownNote] = (),
) -> Written:
    """Write grounded candidates as unpinned notes; one holding a fact the scope already
    holds does not add a twin. "Same fact" is judged once per candidate, in this order:

    - **Evidence** first: a candidate whose quotes are not in the transcript (a profile or
      preference: not in the user's words) is dropped (``harvest.grounding``).
    - **The model's mark** against the notes it was shown (``shown``): ``same`` with a shown
      note's ref is skipped (a restatement); ``update`` rewrites that note (its text goes to
      history, reason ``harvest_update``; a fact said before the note's is kept in history
      instead, ``store.notes.writer``); a pinned or person-written note is never rewritten (the
      candidate is skipped). A mark naming no shown note is no mark.
    - **A topic key** is a hint, not an unchecked overwrite: a keyed candidate upserts the
      note holding its key when the two hold the same fact (``store.notes.terms.same_fact``) or the
      model marked it an update of that note; when the model was shown that note and
      marked the candidate new, or (with no mark) the two state different facts, the
      candidate is kept as its own note, without the key. A key a pinned or person-written
      note holds is never written through: the candidate is skipped.
    - **Without a key or a mark**: the live note holding the same fact (title+topic Jaccard
      at ``duplicate_threshold`` and nothing in title or body contradicts) is rewritten only
      when the candidate adds to it (``adds_to``; reason ``harvest_same_fact``); one that
      adds nothing, or whose twin is pinned or person-written, is skipped; a candidate the
      model marked new keeps a twin it was shown apart. Any other candidate is a new note
      under a fresh slug: when unsure, both are kept (a later merge is cheap, a lost fact
      is not).
    - Whatever a rewrite was decided on is checked again once the note's row is locked
      (``notes.Expect``): a note pinned, person-written or rewritten since raises
      ``NoteChanged`` and nothing is written; the caller decides again.

    Candidates go through ``notes.write_batch`` in segments that give the same outcome as
    writing them one by one.
    """
    writer = _SegmentWriter(session, settings, scope, transcript=transcript, provenance=provenance)
    writer.kept = writer.keep(candidates)
    marked = {c.ref for c, _ in writer.kept if c.mark in ("same", "update")}
    targets = [note for note in shown if note.ref in marked]
    # The notes a mark names, as they stand now: shown before the model call, one may have
    # been pinned or rewritten by a person since (this transaction's second try sees it).
    by_ref = {note.ref: note for note in shown if note.ref not in marked}
    if targets:
        by_ref.update((note.ref, note) for note in keyed.as_now(session, scope, targets))
    shown_ids = {note.id for note in shown}
    protected = writer.prepare(by_ref, shown_ids)
    for position, (candidate, text) in enumerate(writer.kept):
        target = by_ref.get(candidate.ref or "") if candidate.mark in ("same", "update") else None
        item = writer.decide(
            position, candidate, text, target=target, protected=protected, shown_ids=shown_ids
        )
        if item is None:
            writer.skipped += 1
            continue
        writer.items.append(item)
        if candidate.topic_key is not None or target is not None:
            writer.flush()  # its upsert may rewrite any note: later lookups must see the result
    if writer.items:
        writer.flush()
    return writer.written()


def _attrs(candidate: NoteCandidate, text: FactText) -> dict[str, object]:
    """The attrs a candidate is written with (its text stripped of private spans)."""
    return {
        "title": text.title,
        "body": text.body,
        "topics": candidate.topics,
        "keywords": candidate.keywords,
        "evidence": [q.model_dump() for q in candidate.evidence] or None,
        "confidence": candidate.confidence,
        "pinned": False,
    }


def _hinted(
    candidate: NoteCandidate,
    text: FactText,
    *,
    holders: Mapping[str, FactText_Id],
    shown_ids: set[int],
    by_ref: Mapping[str, ShownNote],
    threshold: float,
) -> NoteCandidate:
    """The candidate, without its topic key when the note holding that key states another
    fact: the model was shown that note and marked the candidate new, or (no mark naming a
    shown note) the lexical rule finds two different facts. A candidate the model marked
    ``same`` or ``update`` of a shown note goes by its mark, not its key."""
    key = candidate.topic_key
    if key is None or key not in holders:
        return candidate
    if candidate.mark in ("same", "update") and (candidate.ref or "") in by_ref:
        return candidate
    held_id, held = holders[key]
    if candidate.mark == "new" and held_id in shown_ids:
        keeps = False
    else:
        keeps = judge.same_fact(text, held, threshold)
    return candidate if keeps else candidate.model_copy(update={"topic_key": None})


FactText_Id = tuple[int, FactText]


@dataclass(frozen=True)
class _TwinDecision:
    """A candidate's note: a new one (``slug`` None), or its twin ``slug`` rewritten."""

    slug: str | None = None
    expect: notes.Expect | None = None


class _SegmentWriter:
    """``write_candidates``' state: the open segment, the same-fact twins looked up for the
    candidates as the store stood after the last segment was written, and the tallies."""

    def __init__(
        self,
        session: Executor,
        settings: Settings,
        scope: Scope,
        *,
        transcript: Transcript,
        provenance: str,
    ) -> None:
        self.session, self.settings, self.scope = session, settings, scope
        self.transcript, self.provenance = transcript, provenance
        self.threshold = settings.duplicate_threshold
        self.kept: list[tuple[NoteCandidate, FactText]] = []
        self.items: list[notes.BatchItem] = []
        self.seen: list[frozenset[str]] = []  # term sets of this segment's candidates
        self.targets: set[int] = set()  # notes this segment already rewrites
        self.twins: dict[int, tuple[Twin, FactText] | None] = {}  # by position in ``kept``
        self.stale = True  # a segment was written since ``twins`` was looked up
        self.created = self.updated = self.skipped = self.dropped = self.ungrounded = 0
        self.instructions = 0  # candidates that read as instructions (store.notes.instructions)
        self.secrets = 0
        self.slugs: list[str] = []

    def keep(self, candidates: list[NoteCandidate]) -> list[tuple[NoteCandidate, FactText]]:
        """The candidates to write, up to the cap, of known types and at least
        ``harvest_min_confidence`` sure (the others dropped), with private text stripped:
        ``(candidate, its text)``. A topic or topic key that held a private span is dropped,
        not redacted: ``[REDACTED]`` is no topic, and two secrets' redacted keys would be one
        key; so is a search keyword that held one. A candidate whose evidence is not in the
        transcript is dropped too, and counted as ungrounded (``harvest.grounding``). One that
        reads as an instruction to the assistant is counted (``items_instructions``) and, under
        ``GLEANER_INSTRUCTION_NOTES=drop``, dropped."""
        kept = []
        said = grounding.Transcript.of(self.transcript.messages)
        for candidate in candidates[: self.settings.harvest_max_facts]:
            if (
                candidate.type not in self.settings.observation_types
                # A note its own model gives no credence (a tiny model's 0) is junk, not a fact.
                or candidate.confidence < self.settings.harvest_min_confidence
            ):
                self.dropped += 1
                continue
            found = grounding.grounded(candidate, said)
            if found is None:
                self.dropped += 1
                self.ungrounded += 1
                continue
            topics = [topic for topic in found.topics if strip_private(topic) == topic]
            keywords = [word for word in found.keywords if strip_private(word) == word]
            key = found.topic_key
            if key is not None and strip_private(key) != key:
                key = None
            # A model can echo a secret (or invent one): its text is redacted and counted.
            title, in_title = redact(found.title)
            body, in_body = redact(found.body)
            self.secrets += in_title + in_body
            text = FactText(title, body, normalize_topics(topics))
            if instruction_flag(text.title, text.body) is not None:
                # Stored marked (the writer sets the flag), or not at all under drop.
                self.instructions += 1
                if self.settings.instruction_notes == "drop":
                    self.dropped += 1
                    continue
            kept.append(
                (
                    found.model_copy(
                        update={"topics": topics, "keywords": keywords, "topic_key": key}
                    ),
                    text,
                )
            )
        return kept

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
                self.dropped += 1  # e.g. a body over max_body_bytes: drop it
                continue
            if result.outcome == "created":
                self.created += 1
            else:
                self.updated += 1
            self.slugs.append(str(result.slug))
        self.items.clear()
        self.seen.clear()
        self.targets.clear()

    def prepare(self, by_ref: Mapping[str, ShownNote], shown_ids: set[int]) -> set[str]:
        """Before the first write: decide each keyed candidate's key (``_hinted``: a hint,
        decided for all first, so the twin lookups see which go on without theirs); returns
        the keys no harvest may write through (held by a pinned or person-written note)."""
        names = [c.topic_key for c, _ in self.kept if c.topic_key is not None]
        if not names:
            return set()
        protected = keyed.protected_keys(self.session, self.scope, names)
        # A key a pinned or person-written note holds stays on its candidate, which is then
        # skipped: what a harvest writes under a person's key is never a note of its own.
        holders = {
            key: held
            for key, held in keyed.key_holders(self.session, self.scope, names).items()
            if key not in protected
        }
        self.kept = [
            (
                _hinted(
                    candidate,
                    text,
                    holders=holders,
                    shown_ids=shown_ids,
                    by_ref=by_ref,
                    threshold=self.threshold,
                ),
                text,
            )
            for candidate, text in self.kept
        ]
        return protected

    def decide(
        self,
        position: int,
        candidate: NoteCandidate,
        text: FactText,
        *,
        target: ShownNote | None,
        protected: set[str],
        shown_ids: set[int],
    ) -> notes.BatchItem | None:
        """The batch item ``candidate`` is written as, or None when it is skipped. ``target``:
        the shown note the model marked it the same as, or an update of."""
        attrs = _attrs(candidate, text)
        reason = None
        # What the decision below reads is read without a lock; the writer checks it again
        # on the locked row (a person may pin or rewrite the note meanwhile).
        expect: notes.Expect | None = None
        if target is not None:
            if candidate.mark == "same" or target.untouchable:
                return None
            self.flush()  # the rewrite must see what this segment wrote
            attrs["slug"], reason = target.slug, "harvest_update"
            expect = notes.Expect(text=(target.title, target.body, target.topics))
        elif candidate.topic_key is not None:
            if candidate.topic_key in protected:
                return None
            expect = notes.Expect()  # the key's note, if any, still neither pinned nor a person's
        else:
            decided = self.untwinned(position, candidate, text, shown_ids)
            if decided is None:
                return None
            if decided.slug is not None:
                attrs["slug"], reason, expect = decided.slug, "harvest_same_fact", decided.expect
        return notes.BatchItem(
            attrs=attrs,
            note_type=candidate.type,
            topic_key=None if target is not None else candidate.topic_key,
            reason=reason,
            expect=expect,
        )

    def untwinned(
        self, position: int, candidate: NoteCandidate, text: FactText, shown_ids: set[int]
    ) -> _TwinDecision | None:
        """How an unkeyed candidate without a mark goes in: as a new note (``slug`` None),
        as a rewrite of its same-fact twin when it adds to it, or not at all (None: its twin
        holds it all, or is pinned or person-written)."""
        terms = similarity_terms(text.title, text.topics)
        # A near-duplicate of an earlier candidate must see that one written, as one-by-one
        # writes would: close the segment first.
        if any(jaccard(terms, other) >= self.threshold for other in self.seen):
            self.flush()
        twin = self.twin_of(position)
        if twin is not None and twin[0].id in self.targets:
            self.flush()  # that note is being rewritten: look again at what it becomes
            twin = self.twin_of(position)
        if twin is not None and candidate.mark == "new" and twin[0].id in shown_ids:
            twin = None  # the model was shown that note and judged this another fact
        decided = _TwinDecision()
        if twin is not None:
            note, held = twin
            if note.pinned or note.provenance == "user" or not judge.adds_to(text, held):
                return None
            decided = _TwinDecision(
                note.slug, notes.Expect(text=(held.title, held.body, held.topics))
            )
            self.targets.add(note.id)
        self.seen.append(terms)
        return decided

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

    def written(self) -> Written:
        counts = Counts(
            notes_written=self.created,
            notes_updated=self.updated,
            notes_skipped=self.skipped,
            items_dropped=self.dropped,
            items_ungrounded=self.ungrounded,
            items_instructions=self.instructions,
            secrets_redacted=self.secrets,
        )
        return Written(counts, tuple(self.slugs))
