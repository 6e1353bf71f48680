"""A text's content terms: its words lowercased, stop words left out, each reduced by the
Snowball English stemmer; the title and topic terms similarity compares, their Jaccard
score, and the word lists the same-fact rule (``store.notes.terms``) reads. ``store.notes.terms``
re-exports the public names."""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterable

import snowballstemmer

from gleaner.store.recall.search_terms import snowball_release

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


def stems_of(words: Iterable[str]) -> frozenset[str]:
    """The stems of a fixed list of words (at import, on this thread's own stemmer)."""
    stemmer = snowballstemmer.stemmer("english")
    return frozenset(str(stemmer.stemWord(word)) for word in words)


POLAR_TERMS = frozenset({NOT}) | POLAR_WORDS | stems_of(_POLAR_CONTENT)


# In a title, a class of marker it does not use at all reads as this mark: a title says
# what is so now ("Vegetarian" against "Was vegetarian", "Uses tabs" against "Should use
# tabs"). A body is left as it is: it has room to tell its time and mood in other words.
IMPLIED_MARKS = (("tense", "present"), ("mood", "plain"))


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


def split_words(text: str) -> list[str]:
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


def cached_terms(words: list[str]) -> dict[str, str | None]:
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
    words = split_words(text)
    cache = cached_terms(words)
    seen = dict.fromkeys(cache[word] for word in words)
    seen.pop(None, None)
    return list(seen)  # type: ignore[arg-type]


def similarity_terms(title: str, topic_string: str) -> frozenset[str]:
    """The term set Jaccard similarity compares: title plus topic content terms.

    This is exactly the set stored in the term index (``memory_terms``). Dedupe calls it for
    every note it scans: a set straight from the cache, no order kept.
    """
    words = split_words(f"{title} {topic_string}")
    cache = cached_terms(words)
    terms = {cache[word] for word in words}
    terms.discard(None)
    return frozenset(terms)  # type: ignore[arg-type]


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Size of the intersection over size of the union; 0.0 for two empty sets."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0
