"""The one judge of "the same fact", for every place that asks.

Harvest's twin lookup (``store.notes.similar``) and its topic-key hint (``harvest.write``), dedupe's
keepers (``store.housekeeping.dedupe``), the merge of one answer's notes
(``harvest.model.merge_notes``)
and the offline extractor's merge of statements all ask here, so two notes are one fact or
two by one rule wherever they meet. When a harvest model is configured it judges first, in
the harvest call (its ``same``/``update`` marks against the notes it was shown:
``harvest.write``); this rule decides what no mark decides, conservatively: when unsure, two
notes.

The rule itself is ``store.notes.terms``' (the words compared, what disagrees); this module is its
interface.
"""

from __future__ import annotations

from gleaner.store.notes.terms import FactText, adds_to, covers, disagreement, score

__all__ = ["FactText", "adds_to", "contradiction", "covers", "same_fact", "score"]


def contradiction(a: FactText, b: FactText) -> str | None:
    """Why two notes state different facts (``title-substitution``, ``body-tense``...), or
    None when neither contradicts the other (one may only add detail)."""
    return disagreement(a, b)


def same_fact(a: FactText, b: FactText, threshold: float) -> bool:
    """Whether ``a`` and ``b`` hold the same fact: their title + topic words' Jaccard score
    reaches ``threshold`` and nothing in them contradicts the other."""
    return score(a, b) >= threshold - 1e-9 and contradiction(a, b) is None
