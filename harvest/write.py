"""Writing one transcript's candidate notes into its owner's scope, without twins."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from harvest.candidate import NoteCandidate
from harvest.outcome import Counts
from harvest.transcript import Transcript
from store import Scope, Settings, keyed, normalize_topics, notes, similar, strip_private
from store.similar import Twin
from store.terms import FactText, adds_to, jaccard, similarity_terms

if TYPE_CHECKING:
    from store import Executor


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
    at_commit: bool = False,
) -> Written:
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
    - Whatever a rewrite was decided on is checked again once the note's row is locked
      (``notes.Expect``): a note pinned, person-written or rewritten since raises
      ``NoteChanged`` and nothing is written; the caller decides again.

    Candidates go through ``notes.write_batch`` in segments that give the same outcome as
    writing them one by one. ``at_commit``: the caller reads nothing after this in its
    transaction, so the last segment's new notes may go with its COMMIT (``SlugTaken`` there
    when another writer took one of their slugs meanwhile).
    """
    writer = _SegmentWriter(session, settings, scope, transcript=transcript, provenance=provenance)
    writer.kept = writer.keep(candidates)
    # The first segment's slug lookup as it will most likely be (the kept candidates up to
    # the first topic key, none a twin's rewrite) goes with the transaction's first round trip.
    first: list[tuple[str, str | None]] = []
    for candidate, text in writer.kept:
        first.append((text.title, candidate.topic_key))
        if candidate.topic_key is not None:
            break
    notes.look_ahead(session, scope, first)
    key_names = [c.topic_key for c, _ in writer.kept if c.topic_key is not None]
    protected = keyed.protected_keys(session, scope, key_names) if key_names else set()
    for position, (candidate, text) in enumerate(writer.kept):
        attrs: dict[str, object] = {
            "title": text.title,
            "body": text.body,
            "topics": candidate.topics,
            "keywords": candidate.keywords,
            "confidence": candidate.confidence,
            "pinned": False,
        }
        reason = None
        # What the decision below reads is read without a lock; the writer checks it again
        # on the locked row (a person may pin or rewrite the note meanwhile).
        expect: notes.Expect | None = None
        if candidate.topic_key is not None:
            if candidate.topic_key in protected:
                writer.skipped += 1
                continue
            expect = notes.Expect()  # the key's note, if any, still neither pinned nor a person's
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
                    writer.skipped += 1
                    continue
                attrs["slug"], reason = note.slug, "harvest_same_fact"
                expect = notes.Expect(text=(held.title, held.body, held.topics))
                writer.targets.add(note.id)
            writer.seen.append(terms)
        writer.items.append(
            notes.BatchItem(
                attrs=attrs,
                note_type=candidate.type,
                topic_key=candidate.topic_key,
                reason=reason,
                expect=expect,
            )
        )
        if candidate.topic_key is not None:
            writer.flush()  # its upsert may rewrite any note: later lookups must see the result
    if writer.items:
        writer.flush(at_commit=at_commit)  # nothing looks at the store after this one
    return writer.written()


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
        self.created = self.updated = self.skipped = self.dropped = 0
        self.slugs: list[str] = []

    def keep(self, candidates: list[NoteCandidate]) -> list[tuple[NoteCandidate, FactText]]:
        """The candidates to write, up to the cap, of known types and at least
        ``harvest_min_confidence`` sure (the others dropped), with private text stripped:
        ``(candidate, its text)``. A topic or topic key that held a private span is dropped,
        not redacted: ``[REDACTED]`` is no topic, and two secrets' redacted keys would be one
        key; so is a search keyword that held one."""
        kept = []
        for candidate in candidates[: self.settings.harvest_max_facts]:
            if (
                candidate.type not in self.settings.observation_types
                # A note its own model gives no credence (a tiny model's 0) is junk, not a fact.
                or candidate.confidence < self.settings.harvest_min_confidence
            ):
                self.dropped += 1
                continue
            topics = [topic for topic in candidate.topics if strip_private(topic) == topic]
            keywords = [word for word in candidate.keywords if strip_private(word) == word]
            key = candidate.topic_key
            if key is not None and strip_private(key) != key:
                key = None
            text = FactText(
                strip_private(candidate.title),
                strip_private(candidate.body),
                normalize_topics(topics),
            )
            kept.append(
                (
                    candidate.model_copy(
                        update={"topics": topics, "keywords": keywords, "topic_key": key}
                    ),
                    text,
                )
            )
        return kept

    def flush(self, *, at_commit: bool = False) -> None:
        self.stale = True
        for result in notes.write_batch(
            self.session,
            self.settings,
            self.scope,
            self.items,
            provenance=self.provenance,
            conversation_id=self.transcript.conversation_id,
            occurred_at=self.transcript.happened_at,
            at_commit=at_commit,
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
        )
        return Written(counts, tuple(self.slugs))
