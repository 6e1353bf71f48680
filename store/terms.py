"""What "the same fact" means: content words, their Jaccard score, and what contradicts it.

Similarity compares **content terms**: a text's words, lowercased, with apostrophes dropped
and hyphenated compounds joined (``don't`` -> ``dont``, ``front-end`` -> ``frontend``),
English stop words left out (the classic list, frozen here as ``CLASSIC_STOP_WORDS``) and each word
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

import hashlib
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import snowballstemmer

from store.search_terms import snowball_release

# The classic English stop list (as the ``stopwords`` package ships it), frozen here so a
# library upgrade cannot change the stored terms. ``TERMS_VERSION`` names this rule's terms
# with the stemmer's release: the index records the version it was built with, and
# ``gleaner db reindex`` (run by ``db upgrade``) rebuilds it when they differ.
CLASSIC_STOP_WORDS = (  # noqa: SIM905 - a word list reads better as words
    "a about above after again against all am an and any are aren't as at be because been "
    "before being below between both but by can't cannot could couldn't did didn't do does "
    "doesn't doing don't down during each few for from further had hadn't has hasn't have "
    "haven't having he he'd he'll he's her here here's hers herself him himself his how "
    "how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more most "
    "mustn't my myself no nor not of off on once only or other ought our ours ourselves out "
    "over own same shan't she she'd she'll she's should shouldn't so some such than that "
    "that's the their theirs them themselves then there there's these they they'd they'll "
    "they're they've this those through to too under until up very was wasn't we we'd we'll "
    "we're we've were weren't what what's when when's where where's which while who who's "
    "whom why why's with won't would wouldn't you you'd you'll you're you've your yours "
    "yourself yourselves"
).split()
TERMS_VERSION = f"1/snowball-{snowball_release()}"

MAX_TERM_CHARS = 64
# A longer word (a token, a long identifier) is kept as its first LONG_WORD_PREFIX characters
# and a digest of the whole: two such words stay apart, and the term fits the index.
LONG_WORD_PREFIX = 40
# Negations, whatever their spelling, become this one term.
NOT = "not"
_NEGATIONS = frozenset(
    {
        "no",
        "not",
        "nor",
        "never",
        "none",
        "neither",
        "nobody",
        "nothing",
        "cannot",
        "cant",
        "without",
    }
)
# Words that reverse or move a fact ("turned on/off", "before/after lunch", "more/less
# logging"): kept as terms even where the stop-word list has them, and a difference in any
# of them is a disagreement. Matched after stemming.
POLAR_WORDS = frozenset(
    {
        "above",
        "after",
        "against",
        "before",
        "below",
        "down",
        "few",
        "fewer",
        "least",
        "less",
        "more",
        "most",
        "off",
        "only",
        "out",
        "over",
        "under",
        "up",
    }
)

# Stop words (so no content term and no part of the score) that still tell two facts apart
# when two notes use different ones: word -> its class and mark. Contractions are read with
# their apostrophe dropped ("she's" -> "shes").
MARKERS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(("is", "are", "am", "isnt", "arent"), ("tense", "present")),
    **dict.fromkeys(("was", "were", "wasnt", "werent"), ("tense", "past")),
    **dict.fromkeys(("has", "have", "hasnt", "havent"), ("tense", "present")),
    **dict.fromkeys(("had", "hadnt"), ("tense", "past")),
    **dict.fromkeys(("he", "him", "his", "himself", "hes"), ("gender", "he")),
    **dict.fromkeys(("she", "her", "hers", "herself", "shes"), ("gender", "she")),
    **dict.fromkeys(("all", "every", "each", "both"), ("amount", "all")),
    **dict.fromkeys(("some", "any", "several"), ("amount", "some")),
    **dict.fromkeys(("would", "should", "could"), ("mood", "modal")),
}

# Whose fact a title tells, by its pronouns' person (titles only: a body's "we discussed" or
# "they said" tells who spoke, not whose fact it is). He, she and a singular they are one
# person here; the gender MARKERS tell he from she.
PERSONS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(
        ("i", "me", "my", "mine", "myself", "we", "us", "our", "ours", "ourselves"),
        ("person", "first"),
    ),
    **dict.fromkeys(("you", "your", "yours", "yourself", "yourselves"), ("person", "second")),
    **dict.fromkeys(
        (
            *("he", "him", "his", "himself", "she", "her", "hers", "herself"),
            *("they", "them", "their", "theirs", "themselves"),
        ),
        ("person", "third"),
    ),
}

_APOSTROPHES = re.compile(r"(?<=\w)['\u2019](?=\w)")
_HYPHENS = re.compile(r"(?<=\w)[-\u2010\u2011](?=\w)")
# A word, with what its punctuation says kept: a language named by its sign (``c++``, ``c#``,
# ``f#``), a number of several groups (``3.10.10``, ``v2.0.2``, ``1,000,000``, ``10:30``), a
# minus (``-18``). Split on it, these were one word (``c``) or several (``3``, ``10``) and
# so other facts.
_WORD = re.compile(
    r"\w+(?:\+\+|#)(?![\w#+])"
    r"|(?<![\w.,:-])[-v]?\d+(?:[.,:]\d+)+(?![.,:]?\d)"
    r"|(?<![\w-])-\d+"
    r"|\w+"
)
# Whether a text may hold any of those (else ASCII text is split without the regex).
_SIGNED = re.compile(r"[+#]|[.,:-]\d")
# A Snowball stemmer keeps the word it works on in itself: threads sharing one corrupt each
# other's stems (dedupe reads ahead on a thread; the HTTP service and a threads pool run
# harvests side by side). Each thread gets its own.
_STEMMERS = threading.local()


def _unquoted(word: str) -> str:
    return word.replace("'", "").replace("\u2019", "")


def _negative(word: str) -> bool:
    return word in _NEGATIONS or (word.endswith("nt") and word[:-2] + "n't" in _CONTRACTIONS)


_CONTRACTIONS = frozenset(w for w in CLASSIC_STOP_WORDS if w.endswith("n't"))
STOP_WORDS = (
    frozenset(_unquoted(w) for w in CLASSIC_STOP_WORDS if w and not w.endswith("n't"))
    - _NEGATIONS
    - POLAR_WORDS
)
# Words of place and exception that are content terms anyway (stemmed as any other, so the
# term index keeps them as it did): one in one title or body and not the other is a
# disagreement too ("Lives near Berlin", "Works remotely except on Mondays").
_POLAR_CONTENT = ("near", "outside", "inside", "except", "unless", "instead")


def _stems(words: Iterable[str]) -> frozenset[str]:
    """The stems of a fixed list of words (at import, on this thread's own stemmer)."""
    stemmer = snowballstemmer.stemmer("english")
    return frozenset(str(stemmer.stemWord(word)) for word in words)


POLAR_TERMS = frozenset({NOT}) | POLAR_WORDS | _stems(_POLAR_CONTENT)
# In a title, a class of marker it does not use at all reads as this mark: a title says
# what is so now ("Vegetarian" against "Was vegetarian", "Uses tabs" against "Should use
# tabs"). A body is left as it is: it has room to tell its time and mood in other words.
_IMPLIED = (("tense", "present"), ("mood", "plain"))


# Term of each word seen (None: a stop word); words repeat across notes, so this saves the
# stemmer nearly every call. Replaced by an empty one when it grows past TERM_CACHE_SIZE.
_TERMS: dict[str, str | None] = {}
TERM_CACHE_SIZE = 200_000
# For ASCII text, \w is exactly [A-Za-z0-9_]: everything else becomes a space.
_ASCII_NON_WORD = str.maketrans(
    {c: " " for c in map(chr, range(128)) if not (c.isalnum() or c == "_")}
)


def _term(word: str) -> str | None:
    """The content term of one lowercased, unquoted word; None for a stop word."""
    if _negative(word):
        return NOT
    if word in STOP_WORDS:
        return None
    if len(word) > MAX_TERM_CHARS:
        digest = hashlib.blake2b(word.encode(), digest_size=8).hexdigest()
        return f"{word[:LONG_WORD_PREFIX]}#{digest}"
    if word in POLAR_WORDS or not word.isalpha():
        return word  # numbers, versions and identifiers are compared as written
    stemmer = getattr(_STEMMERS, "english", None)
    if stemmer is None:
        stemmer = _STEMMERS.english = snowballstemmer.stemmer("english")
    return str(stemmer.stemWord(word))


def _signed(text: str) -> bool:
    # Plain membership first: most text holds none of these characters.
    maybe = "+" in text or "#" in text or "." in text or "," in text or "-" in text or ":" in text
    return maybe and _SIGNED.search(text) is not None


def _words(text: str) -> list[str]:
    """The lowercased words of a text, apostrophes dropped and hyphenated compounds joined."""
    text = text.lower()
    if "'" in text or "\u2019" in text:
        text = _APOSTROPHES.sub("", text)
    if "-" in text or "\u2010" in text or "\u2011" in text:
        text = _HYPHENS.sub("", text)
    # ASCII text (most of it) is split without the regex, to the same words.
    if text.isascii() and not _signed(text):
        return text.translate(_ASCII_NON_WORD).split()
    return _WORD.findall(text)


def _cached(words: list[str]) -> dict[str, str | None]:
    """The term cache, holding every one of ``words``."""
    global _TERMS  # noqa: PLW0603 - replaced, never cleared: see below
    cache = _TERMS
    if len(cache) > TERM_CACHE_SIZE:
        # A fresh dict, not clear(): another thread still reading the full one keeps it whole.
        cache = _TERMS = {}
    for word in words:
        if word not in cache:
            cache[word] = _term(word)
    return cache


def content_terms(text: str) -> list[str]:
    """A text's content terms in order of first appearance, each once."""
    words = _words(text)
    cache = _cached(words)
    seen = dict.fromkeys(cache[word] for word in words)
    seen.pop(None, None)
    return list(seen)  # type: ignore[arg-type]


def similarity_terms(title: str, topic_string: str) -> frozenset[str]:
    """The term set Jaccard similarity compares: title plus topic content terms.

    This is exactly the set stored in the term index (``memory_terms``). Dedupe calls it for
    every note it scans: a set straight from the cache, no order kept.
    """
    words = _words(f"{title} {topic_string}")
    cache = _cached(words)
    terms = {cache[word] for word in words}
    terms.discard(None)
    return frozenset(terms)  # type: ignore[arg-type]


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Size of the intersection over size of the union; 0.0 for two empty sets."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


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
    cache = _cached(words)
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


_STATE_TERMS = _stems(STATE_VERBS)


def _marked_apart(a: str, b: str, *, title: bool = False) -> str | None:
    """The first class in which each text carries a mark the other lacks, or None: the
    ``MARKERS`` stop words (and, in titles, ``PERSONS``), and the tense of a verb both texts
    use (``lives``/``lived``)."""
    words_a, words_b = _words(a), _words(b)
    tenses_a, tenses_b = _verb_tenses(words_a), _verb_tenses(words_b)
    for term in sorted(tenses_a.keys() & tenses_b.keys()):
        only_a, only_b = tenses_a[term] - tenses_b[term], tenses_b[term] - tenses_a[term]
        if only_a and only_b:
            return min(kind for kind, _ in only_a | only_b)
    marks_a, marks_b = _marks(words_a, title=title), _marks(words_b, title=title)
    if title:
        for marks, tenses in ((marks_a, tenses_a), (marks_b, tenses_b)):
            marks.update(m for found in tenses.values() for m in found if m[0] == "tense")
            marks.update(m for m in _IMPLIED if all(kind != m[0] for kind, _ in marks))
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
