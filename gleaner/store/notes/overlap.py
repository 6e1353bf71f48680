"""How many terms two sets must share to reach a Jaccard threshold, and the prefix-filter
join that finds every pair of many sets at or above it.

Pure Python, no database: ``store.notes.similar`` uses the bounds to look one probe up in the term
index; ``store.housekeeping.dedupe`` joins a whole scope's term sets in memory."""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import chain

from gleaner.store.schema.sql import FLOAT_SLACK


def min_shared(threshold: float, size: int) -> int:
    """Terms a set must share with one of ``size`` terms for a Jaccard score of ``threshold``.

    ``J(A, B) >= t`` needs ``|A & B| >= ceil(t * |A|)``; FLOAT_SLACK keeps float rounding from
    raising the bound past a pair the exact score keeps.
    """
    return max(1, math.ceil(threshold * size - FLOAT_SLACK))


@dataclass(frozen=True)
class Candidates:
    """Input positions grouped by identical term set, and the groups' duplicate edges.

    ``edges[g]`` lists ``(h, score)`` for each group ``h`` whose Jaccard score with ``g``
    reaches the threshold, sorted by ``h``; ``(g, 1.0)`` is there when ``g`` itself holds a
    changed note beside others. Edges are symmetric.
    """

    groups: list[list[int]]
    edges: dict[int, list[tuple[int, float]]]
    checked: int


def prefix_length(size: int, threshold: float) -> int:
    """How many of a set's rarest terms must be indexed so no pair at ``threshold`` is missed.

    ``J(A, B) >= t`` needs ``|A & B| >= ceil(t * |A|)``, so two such sets share a term within
    the first ``|A| - ceil(t * |A|) + 1`` of each, in any one global term order.
    """
    return max(1, min(size, size - min_shared(threshold, size) + 1))


def _partners(size: int, threshold: float) -> list[tuple[int, int, int]]:
    """For a set of ``size`` terms: each set size that can reach ``threshold`` with it, the
    terms the two must share, and how many of the other's prefix positions can hold the
    first shared term (the positional filter)."""
    # J <= min(|A|, |B|) / max(|A|, |B|): sizes outside these bounds cannot reach it.
    low = min_shared(threshold, size)
    high = math.floor((size + FLOAT_SLACK) / threshold)
    # J(A, B) >= t  <=>  |A & B| >= t / (1 + t) * (|A| + |B|).
    share = threshold / (1 + threshold)
    found = []
    for other in range(low, high + 1):
        need = math.ceil(share * (size + other) - FLOAT_SLACK)
        positions = min(prefix_length(other, threshold), other - need + 1)
        if positions > 0:
            found.append((other, need, positions))
    return found


def _probe_plan(size: int, threshold: float) -> list[tuple[int, list[tuple[int, int]]]]:
    """What a set of ``size`` terms looks up: for each of its prefix positions ``i``, the
    index slots ``(other size, other position)`` a pair at the threshold can meet in.

    Positional filter (PPJoin): a pair meets first at its first shared term, and shares at
    most that one plus what follows it in each set: ``1 + min(size - i - 1, ...) >= need``.
    """
    partners = _partners(size, threshold)
    plan = []
    for i in range(prefix_length(size, threshold)):
        slots = [
            (other, j)
            for other, need, positions in partners
            if size - i >= need
            for j in range(positions)
        ]
        if slots:
            plan.append((i, slots))
    return plan


def _group(
    term_sets: Sequence[frozenset[str]], changed: Sequence[bool]
) -> tuple[list[frozenset[str]], list[list[int]], list[bool]]:
    """Distinct non-empty term sets, the input positions holding each, and whether any of
    those positions changed."""
    by_terms: defaultdict[frozenset[str], list[int]] = defaultdict(list)
    for position, terms in enumerate(term_sets):
        by_terms[terms].append(position)
    by_terms.pop(frozenset(), None)
    groups = list(by_terms.values())
    if all(changed):
        return list(by_terms), groups, [True] * len(groups)
    return list(by_terms), groups, [any(changed[p] for p in members) for members in groups]


def _rank(keys: Sequence[frozenset[str]]) -> tuple[list[list[int]], int]:
    """Each set's terms as ranks, rarest first (its first ``prefix_length`` are its prefix),
    and the rank from which terms belong to more than one set."""
    frequency = Counter(chain.from_iterable(keys))
    # Rarest first, ties in first-seen order (a stable sort): one order for the whole input.
    order = {term: n for n, term in enumerate(sorted(frequency, key=frequency.__getitem__))}
    rank = order.__getitem__
    # A term of one set only (they rank first) can pair nothing: never indexed nor probed.
    shared_from = sum(1 for count in frequency.values() if count == 1)
    return [sorted(map(rank, key)) for key in keys], shared_from


def similar_groups(
    term_sets: Sequence[frozenset[str]], changed: Sequence[bool], threshold: float
) -> Candidates:
    """Pairs of term sets with Jaccard >= ``threshold`` where one holds a changed note.

    Identical sets are grouped first (one group of many same-titled notes costs nothing).
    Terms are ordered rarest first within the input; each group indexes its prefix
    (``prefix_length``), and each changed group probes the index with its own, so only sets
    sharing a rare term, of a size that can reach the threshold and with enough terms after
    the first shared one (the positional filter), are scored. Empty sets match nothing.
    """
    keys, groups, touched = _group(term_sets, changed)
    prefixes, shared_from = _rank(keys)
    sizes = list(map(len, keys))
    lengths = {size: prefix_length(size, threshold) for size in set(sizes)}
    plans = {size: _probe_plan(size, threshold) for size in lengths}
    index = _PrefixIndex(prefixes, sizes, lengths, shared_from)
    # Probe, then insert: unchanged groups are indexed up front and each changed group joins
    # after probing, so every pair is met once and two unchanged groups never meet.
    for group, was_touched in enumerate(touched):
        if not was_touched:
            index.insert(group)
    edges: defaultdict[int, list[tuple[int, float]]] = defaultdict(list)
    checked = 0
    for a, was_touched in enumerate(touched):
        if not was_touched:
            continue
        if len(groups[a]) > 1:
            edges[a].append((a, 1.0))
        size = sizes[a]
        if prefixes[a][lengths[size] - 1] < shared_from:
            continue  # no term of its prefix is in another set: it pairs with nothing
        candidates = index.candidates(a, plans[size])
        checked += len(candidates)
        for b, score in _reaching(a, candidates, keys, sizes, threshold):
            edges[a].append((b, score))
            edges[b].append((a, score))
        index.insert(a)
    return Candidates(
        groups=groups, edges={g: sorted(found) for g, found in edges.items()}, checked=checked
    )


class _PrefixIndex:
    """The groups' prefixes, indexed: ``index[term][(set size, position in its prefix)]``
    lists the groups. A probe looks up only the sizes that can reach the threshold and the
    positions the positional filter allows, and one miss on a term skips all of them."""

    def __init__(
        self,
        prefixes: list[list[int]],
        sizes: list[int],
        lengths: dict[int, int],
        shared_from: int,
    ) -> None:
        self.prefixes = prefixes
        self.sizes = sizes
        self.shared_from = shared_from
        self.slots = {size: [(size, p) for p in range(n)] for size, n in lengths.items()}
        self.index: dict[int, dict[tuple[int, int], list[int]]] = {}

    def insert(self, group: int) -> None:
        index = self.index
        for slot, token in zip(self.slots[self.sizes[group]], self.prefixes[group], strict=False):
            if token < self.shared_from:
                continue
            entries = index.get(token)
            if entries is None:
                index[token] = {slot: [group]}
            elif (members := entries.get(slot)) is None:
                entries[slot] = [group]
            else:
                members.append(group)

    def candidates(self, group: int, plan: list[tuple[int, list[tuple[int, int]]]]) -> set[int]:
        """The indexed groups ``group`` may reach the threshold with, looked up by its
        ``_probe_plan``."""
        prefix = self.prefixes[group]
        shared_from = self.shared_from
        lookup = self.index.get
        found: set[int] = set()
        for i, wanted in plan:
            if prefix[i] < shared_from or (entries := lookup(prefix[i])) is None:
                continue
            for slot in wanted:
                if (members := entries.get(slot)) is not None:
                    found.update(members)
        return found


def _reaching(
    a: int,
    candidates: set[int],
    keys: Sequence[frozenset[str]],
    sizes: Sequence[int],
    threshold: float,
) -> Iterator[tuple[int, float]]:
    """Each candidate ``b`` whose Jaccard score with ``a`` reaches ``threshold``, with it."""
    key, size = keys[a], sizes[a]
    for b in candidates:
        # Exactly store.text.jaccard (|A | B| = |A| + |B| - |A & B|), without building
        # the union set: this is the hot loop.
        shared = len(key & keys[b])
        score = shared / (size + sizes[b] - shared)
        if score >= threshold:
            yield b, score
