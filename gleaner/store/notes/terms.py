"""What "the same fact" means: content words, their Jaccard score, and what contradicts it.

Similarity compares **content terms** (made by ``store.notes.fact_terms``): a text's words,
lowercased, with apostrophes dropped and hyphenated compounds joined (``don't`` -> ``dont``,
``front-end`` -> ``frontend``), English stop words left out (the classic list, frozen as
``CLASSIC_STOP_WORDS``) and each word
reduced by the Snowball English stemmer (``answers`` -> ``answer``, ``binding`` -> ``bind``);
a word of over ``MAX_TERM_CHARS`` characters (a token, a long identifier) becomes its first
``LONG_WORD_PREFIX`` and a digest of the whole; a language's sign and a number's groups stay
in its word (``c++``, ``c#``, ``3.10.10``, ``1,000,000``, ``10:30``, ``-18``).
Words that flip a fact are never stop words here: negations (all read as ``not``) and the
few words of direction, order and amount listed in ``POLAR_WORDS``.

The seed's score stays the Jaccard similarity of a note's title and topic terms
(``similarity_terms``). Two notes hold **the same fact** (``same_fact``) when that score
reaches the threshold and nothing in them disagrees (``disagreement``):

- titles: neither title has a term the other lacks on *both* sides (a word swapped for
  another is a different fact; a word added is a detail);
- the terms both titles share come in the same order (``Kafka over Polars`` is not
  ``Polars over Kafka``);
- in a title, words added ahead of all the shared ones (another subject or state:
  ``Sister lives in Berlin``, ``Plans to move to Berlin``);
- a negation or polar word (``POLAR_TERMS``: place and exception words too) in one title or
  body and not in the other;
- a stop word that still marks the fact (``MARKERS``: tense of *be*/*have*, whose gender a
  pronoun is, all or some, mood; in titles ``PERSONS`` too) where each side has one of its
  class the other lacks (``was vegetarian`` is not ``is vegetarian``; ``she`` added to a
  note is only a detail), a title with no tense or mood reading as present and plain;
- a verb both use in another tense, read from its ending (``STATE_VERBS``: ``lives`` /
  ``lived``; any verb's -ing against its past: ``learning`` / ``learned``);
- bodies: the same tests, so a fact held only in the body is kept apart too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gleaner.store.notes.fact_terms import (
    CLASSIC_STOP_WORDS,
    IMPLIED_MARKS,
    MARKERS,
    PERSONS,
    POLAR_TERMS,
    cached_terms,
    content_terms,
    jaccard,
    similarity_terms,
    split_words,
    stems_of,
)


@dataclass(frozen=True)
class FactText:
    """What the same-fact rule reads of a note: title, body, normalized topic string."""

    title: str
    body: str
    topics: str = ""


def _disagree(a: Sequence[str], b: Sequence[str], *, title: bool = False) -> str | None:
    """Why two ordered term lists state different things, or None when one only adds to the
    other. In a title, words added ahead of all the shared ones name another subject or a
    state the fact is in (``Sister lives in Berlin``, ``Plans to move to Berlin``,
    ``Former manager is Bob``), not a detail of it."""
    set_a, set_b = set(a), set(b)
    if (set_a ^ set_b) & POLAR_TERMS:
        return "polarity"
    if set_a - set_b and set_b - set_a:
        return "substitution"
    if [t for t in a if t in set_b] != [t for t in b if t in set_a]:
        return "order"
    if title and bool(_lead(a, set_b)) != bool(_lead(b, set_a)):
        return "subject"
    return None


# A title's own subject, named or not ("User prefers tabs" is "Prefers tabs").
_THE_USER = frozenset({"user"})


def _lead(terms: Sequence[str], shared: set[str]) -> list[str]:
    """The terms ahead of the first one in ``shared``, the user aside."""
    lead: list[str] = []
    for term in terms:
        if term in shared:
            break
        if term not in _THE_USER:
            lead.append(term)
    return lead


def _marks(words: Sequence[str], *, title: bool = False) -> set[tuple[str, str]]:
    """The ``MARKERS`` classes and marks a text's words carry (and, in a title, ``PERSONS``)."""
    marks = {MARKERS[word] for word in words if word in MARKERS}
    if title:
        marks.update(PERSONS[word] for word in words if word in PERSONS)
    return marks


# Verbs of a state that holds for a time, whose past says it no longer holds ("Lived in
# Berlin" is not "Lives in Berlin"). An event's verb is left out: "Decided to use Redis" and
# "Decides to use Redis" tell one decision.
STATE_VERBS = frozenset(
    {
        "attend",
        "belong",
        "commute",
        "date",
        "enjoy",
        "follow",
        "hate",
        "host",
        "like",
        "live",
        "love",
        "maintain",
        "manage",
        "mentor",
        "need",
        "own",
        "play",
        "practice",
        "prefer",
        "rent",
        "report",
        "reside",
        "stay",
        "study",
        "support",
        "use",
        "volunteer",
        "want",
        "work",
    }
)


def _verb_tenses(words: list[str]) -> dict[str, set[tuple[str, str]]]:
    """The tense each verb carries in a text, by its ending (the stemmer makes the forms one
    term). A ``STATE_VERBS`` verb: ``past`` for its regular past form (``lived``, ``used``),
    ``present`` for any other (``lives``, ``living``, ``live``). Any other verb: ``done``
    for its past form, ``ongoing`` for its -ing form (``learning`` / ``learned Rust``,
    ``migrating`` / ``migrated CI``); its -s or bare form says neither (``decides`` and
    ``decided`` tell one decision). A verb after ``to`` carries no tense (``used to use Vim``
    is past by its ``used``)."""
    cache = cached_terms(words)
    tenses: dict[str, set[tuple[str, str]]] = {}
    for i, word in enumerate(words):
        term = cache[word]
        if term is None or (i and words[i - 1] == "to"):
            continue
        past = word.endswith("ed") and term != word
        if term in _STATE_TERMS:
            mark = ("tense", "past" if past else "present")
        elif past or (word.endswith("ing") and term != word):
            mark = ("aspect", "done" if past else "ongoing")
        else:
            continue
        tenses.setdefault(term, set()).add(mark)
    return tenses


_STATE_TERMS = stems_of(STATE_VERBS)


def _marked_apart(a: str, b: str, *, title: bool = False) -> str | None:
    """The first class in which each text carries a mark the other lacks, or None: the
    ``MARKERS`` stop words (and, in titles, ``PERSONS``), and the tense of a verb both texts
    use (``lives``/``lived``)."""
    words_a, words_b = split_words(a), split_words(b)
    tenses_a, tenses_b = _verb_tenses(words_a), _verb_tenses(words_b)
    for term in sorted(tenses_a.keys() & tenses_b.keys()):
        only_a, only_b = tenses_a[term] - tenses_b[term], tenses_b[term] - tenses_a[term]
        if only_a and only_b:
            return min(kind for kind, _ in only_a | only_b)
    marks_a, marks_b = _marks(words_a, title=title), _marks(words_b, title=title)
    if title:
        for marks, tenses in ((marks_a, tenses_a), (marks_b, tenses_b)):
            marks.update(m for found in tenses.values() for m in found if m[0] == "tense")
            marks.update(m for m in IMPLIED_MARKS if all(kind != m[0] for kind, _ in marks))
    only_a, only_b = marks_a - marks_b, marks_b - marks_a
    apart = {kind for kind, _ in only_a} & {kind for kind, _ in only_b}
    return min(apart) if apart else None


def disagreement(a: FactText, b: FactText) -> str | None:
    """Why two notes hold different facts (``title-substitution``, ``body-tense``, ...), or
    None when neither title nor body contradicts the other."""
    for part, x, y in (("title", a.title, b.title), ("body", a.body, b.body)):
        title = part == "title"
        why = _disagree(content_terms(x), content_terms(y), title=title) or _marked_apart(
            x, y, title=title
        )
        if why is not None:
            return f"{part}-{why}"
    return None


def covers(keeper: FactText, other: FactText) -> bool:
    """Whether ``keeper`` says all that ``other`` says: other's title and body terms are all
    in keeper's (superseded, ``other`` loses no word from search)."""
    return set(content_terms(other.title)) <= set(content_terms(keeper.title)) and set(
        content_terms(other.body)
    ) <= set(content_terms(keeper.body))


def adds_to(new: FactText, old: FactText) -> bool:
    """Whether ``new`` says all that ``old`` says and more: old's title and body terms are all
    in new's, and new has some more. (Of two notes holding the same fact, one that adds
    nothing leaves the other as it is: a rewording alone is not worth a new version.)"""
    old_title, new_title = set(content_terms(old.title)), set(content_terms(new.title))
    old_body, new_body = set(content_terms(old.body)), set(content_terms(new.body))
    covers = old_title <= new_title and old_body <= new_body
    return covers and (old_title < new_title or old_body < new_body)


def score(a: FactText, b: FactText) -> float:
    """The seed's similarity: Jaccard of title + topic content terms."""
    return jaccard(similarity_terms(a.title, a.topics), similarity_terms(b.title, b.topics))


def same_fact(a: FactText, b: FactText, threshold: float) -> bool:
    """True when ``a`` and ``b`` score at least ``threshold`` and nothing disagrees."""
    return score(a, b) >= threshold - 1e-9 and disagreement(a, b) is None


# The public names; callers import those of store.notes.fact_terms (the words compared) from here
# too.
__all__ = [
    "CLASSIC_STOP_WORDS",
    "STATE_VERBS",
    "FactText",
    "adds_to",
    "content_terms",
    "covers",
    "disagreement",
    "jaccard",
    "same_fact",
    "score",
    "similarity_terms",
]
