"""Which of a scope's near-duplicate notes are kept and which each one supersedes: the keeper
order (pinned, person-written, keyed, newer, surer) and the same-fact checks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gleaner.store.notes.judge import contradiction
from gleaner.store.notes.overlap import Candidates
from gleaner.store.notes.terms import FactText, covers


@dataclass(slots=True)
class KeeperRow:
    """What choosing keepers needs of a note with a near-duplicate (``seq`` as scanned)."""

    id: int
    slug: str
    pinned: bool
    updated_at: datetime
    confidence: float | None
    text: FactText
    keyed: bool  # holds a topic key: saves and harvests upsert through it, so it stays live
    by_person: bool  # ``user`` provenance: what a person wrote is never hidden by a copy
    seq: int

    @property
    def rank(self) -> tuple[bool, bool, bool, datetime, float, int]:
        """Keeper order, best highest: pinned, then person-written, then keyed, then newer,
        then more confident, then higher id."""
        confidence = -1.0 if self.confidence is None else self.confidence
        return (self.pinned, self.by_person, self.keyed, self.updated_at, confidence, self.id)

    @property
    def kept(self) -> bool:
        """Never superseded: pinned, person-written or holding a topic key."""
        return self.pinned or self.by_person or self.keyed


def choose_keepers(
    rows: Mapping[int, KeeperRow], found: Candidates
) -> list[tuple[int, int, float]]:
    """``(keeper, loser, score)`` positions: each duplicate paired with its best keeper.

    ``rows`` holds the positions that have an edge (one missing, deleted mid-run, is left
    out). Notes are visited best first (``KeeperRow.rank``); one nobody has claimed is a keeper and
    claims every unclaimed, lower-ranked note it is similar to that holds the same fact and
    says nothing the keeper does not (``covers``: superseded, its extra words would drop out
    of search). So a loser's keeper is the best surviving note similar to it (never one it
    only reaches through a third note), pinned, person-written and topic-keyed notes are
    never claimed (``KeeperRow.kept``: a person's text is not hidden by a copy, and a later
    harvest under a key upserts that note), and keepers outrank losers (no cycles).
    """
    group_of = {p: g for g in found.edges for p in found.groups[g] if p in rows}
    involved = sorted(group_of, key=lambda p: rows[p].rank, reverse=True)
    place = {p: n for n, p in enumerate(involved)}
    claimed: set[int] = set()
    # A group a keeper has claimed from holds nothing a later (lower) keeper could claim.
    drained: set[int] = set()
    plan: list[tuple[int, int, float]] = []
    for keeper in involved:
        if keeper in claimed:
            continue
        for group, score in found.edges[group_of[keeper]]:
            if group in drained:
                continue
            contradicted = False
            for loser in found.groups[group]:
                if (
                    loser in place
                    and place[loser] > place[keeper]
                    and not rows[loser].kept
                    and loser not in claimed
                ):
                    # The score says near-duplicate; only the same fact, all of it in the
                    # keeper, is superseded.
                    if contradiction(rows[keeper].text, rows[loser].text) is not None or not (
                        covers(rows[keeper].text, rows[loser].text)
                    ):
                        contradicted = True
                        continue
                    claimed.add(loser)
                    plan.append((keeper, loser, score))
            if not contradicted:
                drained.add(group)
    return plan
