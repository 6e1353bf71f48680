"""The words search indexes and looks for: one frozen tokenizer for notes and queries.

A text's **search terms** are its words, case- and accent-folded, with a possessive ``'s``
and other apostrophes dropped (``Melanie's`` -> ``melanie``, ``don't`` -> ``dont``), a
hyphenated or underscored compound giving its parts and the joined word (``front-end`` ->
``front``, ``end``, ``frontend``), the English stop words below left out, and every
alphabetic word reduced by the Snowball English stemmer (``painted`` and ``painting`` ->
``paint``; ``pets`` -> ``pet``). Numbers and words with digits are kept as written.

The stop list is a frozen copy of the classic English list (the one the ``stopwords``
package ships), so a library upgrade cannot change what the index holds. ``VERSION`` names
this tokenizer together with the stemmer's release; the index records the version it was
built with, and a store built with another one is rebuilt by ``gleaner db reindex``, never
by a migration calling this code.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections.abc import Iterable
from importlib import metadata

import snowballstemmer

# Longest term kept; a longer word (a token, a hash) is cut to this many characters.
MAX_TERM_CHARS = 64

# Field weights: a word in the title counts twice a body word, one in the topics, the topic
# key or the harvest's search keywords one and a half times.
TITLE_WEIGHT = 2.0
KEYS_WEIGHT = 1.5
BODY_WEIGHT = 1.0

# The classic English stop list, apostrophes dropped, plus the pieces contractions leave; a
# contraction that drops to a word of its own (he'll -> hell, she'll -> shell, I'd -> id,
# I'll -> ill, we'll -> well) stays a word.
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are arent as at be because been
    before being below between both but by cant cannot could couldnt did didnt do does doesnt
    doing dont down during each few for from further had hadnt has hasnt have havent having
    he hed hes her here heres hers herself him himself his how hows i im ive if in into is
    isnt it its itself lets me more most mustnt my myself no nor not of off on once only or
    other ought our ours ourselves out over own same shant she shes should shouldnt so some
    such than that thats the their theirs them themselves then there theres these they theyd
    theyll theyre theyve this those through to too under until up very was wasnt we weve were
    werent what whats when whens where wheres which while who whos whom why whys with wont
    would wouldnt you youd youll youre youve your yours yourself yourselves s t d ll re ve m
    """.split()  # noqa: SIM905 - a word list reads better as words
)

_APOSTROPHE = re.compile(r"['\u2019\u02bc]")
_POSSESSIVE = re.compile(r"(?<=\w)['\u2019\u02bc]s\b")
_WORD = re.compile(r"\w+(?:[-_]\w+)*")
_STEMMERS = threading.local()  # a Snowball stemmer is not thread-safe: one per thread
_TERMS: dict[str, str | None] = {}  # word -> term (None: stop word), bounded below
_CACHE_SIZE = 200_000


def snowball_release() -> str:
    """The installed Snowball stemmers' releases (snowballstemmer, and PyStemmer, the C
    implementation it runs when installed): part of every tokenizer version here."""
    releases = []
    for package in ("snowballstemmer", "PyStemmer"):
        try:
            releases.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            releases.append("none")
    return "+".join(releases)


VERSION = f"1/snowball-{snowball_release()}"


def _fold(text: str) -> str:
    """Lowercase, compatibility forms unified, accents dropped from letters (``Café`` ->
    ``cafe``); other scripts are left as they are."""
    text = unicodedata.normalize("NFKC", text).casefold()
    if text.isascii():
        return text
    decomposed = unicodedata.normalize("NFKD", text)
    return unicodedata.normalize(
        "NFC", "".join(c for c in decomposed if not unicodedata.combining(c))
    )


def _term(word: str) -> str | None:
    if word in STOP_WORDS:
        return None
    if not word.isalpha():
        return word[:MAX_TERM_CHARS]
    stemmer = getattr(_STEMMERS, "english", None)
    if stemmer is None:
        stemmer = _STEMMERS.english = snowballstemmer.stemmer("english")
    return str(stemmer.stemWord(word))[:MAX_TERM_CHARS]


def _words(text: str) -> list[str]:
    text = _APOSTROPHE.sub("", _POSSESSIVE.sub("", _fold(text)))
    words: list[str] = []
    for match in _WORD.finditer(text):
        word = match.group()
        if "-" in word or "_" in word:
            parts = [part for part in re.split(r"[-_]", word) if part]
            words.extend(parts)
            word = "".join(parts)
        words.append(word)
    return words


def terms(text: str) -> list[str]:
    """Every search term of ``text``, in order, repeats kept."""
    global _TERMS  # noqa: PLW0603 - replaced, never cleared, so a reader keeps a whole one
    cache = _TERMS
    if len(cache) > _CACHE_SIZE:
        cache = _TERMS = {}
    out: list[str] = []
    for word in _words(text):
        if word not in cache:
            cache[word] = _term(word)
        term = cache[word]
        if term is not None:
            out.append(term)
    return out


def query_terms(query: str, most: int = 32) -> list[str]:
    """The distinct search terms of a query, in order, at most ``most``."""
    return list(dict.fromkeys(terms(query)))[:most]


def note_terms(title: str, body: str, keys: Iterable[str] = ()) -> tuple[dict[str, float], float]:
    """A note's weighted term frequencies and its weighted length (the field weights above).

    ``keys`` are its topics, topic key and search keywords, each a short text.
    """
    weights: dict[str, float] = {}
    length = 0.0
    for text, weight in ((title, TITLE_WEIGHT), (body, BODY_WEIGHT)):
        for term in terms(text):
            weights[term] = weights.get(term, 0.0) + weight
            length += weight
    for key in keys:
        for term in terms(key):
            weights[term] = weights.get(term, 0.0) + KEYS_WEIGHT
            length += KEYS_WEIGHT
    return weights, length
