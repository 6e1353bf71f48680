"""The offline extractor's knowledge: the English cue phrases it looks for and the word lists
that tell a fact from small talk (what each cue means, how to title the note it finds)."""

from __future__ import annotations

import re
from dataclasses import dataclass


def word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


MIN_CONFIDENCE = 0.5
MAX_CONFIDENCE = 0.9
HEDGE_PENALTY = 0.15
REPEAT_BONUS = 0.05
DUPLICATE_SIMILARITY = 0.8
MAX_SENTENCE_CHARS = 500
MAX_TITLE_CHARS = 90
MAX_TOPICS = 5

# Groups that name a thing the note is about; the others (``verb``, ``when``, ``adv``, ``what``)
# are parts of the cue phrase itself.
OBJECT_GROUPS = ("obj", "old", "new", "act", "cond")

STOP_WORDS = word_set(
    """a about above after again against all also am an and any are as at be because been
    before being below between both but by can could did do does doing don't down during each
    few for from further had has have having he her here hers him his how i i'd i'll i'm i've
    if in into is it it's its just let's me more most my myself no nor not now of off on once
    only or other our ours out over own same she should so some such than that the their them
    then there these they this those through to too under until up very was we we'll we're
    were what when where which while who whom why will with would you your yours yourself
    always never usually often really actually basically maybe probably still already even
    much many lot lots bit little thing things stuff something anything everything nothing
    one ones way get got use using used like likes prefer prefers love hate want need think
    make made go going went decided decide chose choose switched switch found turns turned
    out work works based live lives every time whenever usually normally typically tend first
    second last next new old well good better best sure okay ok yes please thanks instead
    across via per onto"""
)
# An object that starts with one of these points at something else in the chat ("I like
# that", "I love it") or is small talk ("I'm a bit tired"): not a fact worth keeping.
VAGUE = word_set(
    """it this that these those them they you your yours how what when why where which who
    there here so too very really not sure ok okay fine good great bit little lot one
    something anything everything nothing idea way the-idea"""
)
# "The bug was fixed" or "the issue was weird" report a state, not what was found.
STATE_WORDS = VAGUE | word_set(
    """fixed solved resolved gone annoying weird strange hard tricky obvious mine"""
)
# Words that only point back at the chat itself: "I like the second approach".
CHAT_NOUNS = word_set(
    """idea approach answer answers response responses suggestion suggestions explanation
    option options solution version example examples"""
)
PROFILE_REJECT = VAGUE | word_set("huge big total complete fan quick new question")
HEDGES = re.compile(
    r"\b(?:maybe|probably|perhaps|might|i\s+think|i\s+guess|not\s+sure|kind\s+of|sort\s+of)\b",
    re.IGNORECASE,
)
# Sentences that only imagine, or ask without a question mark, state nothing.
HYPOTHETICAL = re.compile(
    r"^(?:if|what\s+if|suppose|supposing|imagine|assuming|(?:should|would|could|can|will|do|"
    r"does|did|is|are)\s+(?:i|we|you|it|they))\b",
    re.IGNORECASE,
)
NEGATION = re.compile(r"\b(?:not|never|no\s+longer)\b|n't\b", re.IGNORECASE)
CLAUSE_SPLIT = re.compile(r"[,;:]|\bbut\b", re.IGNORECASE)

CUT = re.compile(
    r"[,;:()\[\]\u2014\u2013\u2026]|\s-\s|\.\.\.|\b(?:because|since|so|as\s+(?:it|they|that)|but|"
    r"which|although|though|unless|otherwise|except|cause|cuz)\b",
    re.IGNORECASE,
)
# Names and places end sooner: "I live in Berlin with my partner" is about Berlin.
CUT_SHORT = re.compile(
    CUT.pattern + r"|\b(?:and|with|for|at|in|as|where|who|now|currently|these\s+days|"
    r"right\s+now)\b",
    re.IGNORECASE,
)
PRONOUNS = {
    "i'm": "they're",
    "i've": "they've",
    "i'd": "they'd",
    "i'll": "they'll",
    "i": "they",
    "me": "them",
    "my": "their",
    "mine": "theirs",
    "myself": "themselves",
}
PRONOUN = re.compile(r"\b(?:i'm|i've|i'd|i'll|i|me|my|mine|myself)\b(?!\.\w)", re.IGNORECASE)
ADVERBS = word_set(
    """always usually normally typically generally never often sometimes rarely also just
    still first really mostly actually only then"""
)
IRREGULAR = {"be": "is", "am": "is", "are": "is", "have": "has", "do": "does", "go": "goes",
              "don't": "doesn't", "do not": "does not"}  # fmt: skip
MODALS = word_set("can could will would shall should may might must was did had")
OCCUPATIONS = word_set(
    """engineer developer programmer scientist designer manager student teacher professor
    researcher analyst architect consultant founder doctor nurse lawyer writer editor
    accountant administrator admin lead director freelancer contractor intern maintainer
    sre cto ceo marketer"""
)
PROPER_NOUN_KEYS = frozenset({"profile/name", "profile/employer"})
FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
LIST_MARK = re.compile(r"^\s*(?:[-*+•]|\d+[.)]|#+)\s+")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
TOKEN = re.compile(r"[a-z0-9][a-z0-9+#._-]*")
FOLLOW_UP = re.compile(r"^(?:because|since|so|that|it|this|they|which|as|but)\b", re.I)


@dataclass(frozen=True)
class Cue:
    """One cue phrase: what it means, and how to title the note it finds."""

    type: str
    pattern: re.Pattern[str]
    title: str  # a format string over the pattern's named groups
    confidence: float
    topic_key: str | None = None
    verbs: tuple[str, ...] = ()  # groups whose first verb becomes third person
    short: bool = False  # a name or a place: cut at "and", "with", ... and keep few words
    min_words: int = 1
    reject: frozenset[str] = VAGUE


def cue(
    type_: str,
    pattern: str,
    title: str,
    confidence: float,
    *,
    topic_key: str | None = None,
    verbs: tuple[str, ...] = (),
    short: bool = False,
    min_words: int = 1,
    reject: frozenset[str] = VAGUE,
) -> Cue:
    return Cue(
        type_, re.compile(pattern, re.IGNORECASE), title, confidence,
        topic_key, verbs, short, min_words, reject,
    )  # fmt: skip


I_ = r"\bI"
# What follows "live in" or "work at/for" when it names no place or employer: "I live in the
# terminal most days", "I work for hours" (a determiner before a lowercase word, or a span
# of time). "The Netherlands" and "the NHS" still count.
NOT_NAMED = (
    r"(?!(?:the|a|an|my|our|his|her|their|your|this|that|some|any)\s+(?-i:[a-z])"
    r"|(?:hours|minutes|days|weeks|months|years|ages|free|fun|nothing|myself)\b)"
)
CUES: tuple[Cue, ...] = (
    # profile: stable topic keys, so a repeated or corrected fact updates one note
    cue("profile", r"\bmy\s+name(?:\s+is|'s)\s+(?P<obj>.+)", "Name is {obj}", 0.9,
         topic_key="profile/name", short=True),
    cue("profile", r"\b(?:please\s+)?call\s+me\s+(?P<obj>(?-i:[A-Z])\w+)", "Name is {obj}", 0.8,
         topic_key="profile/name", short=True),
    cue("profile", I_ + r"\s+(?:currently\s+)?live\s+in\s+" + NOT_NAMED + r"(?P<obj>.+)",
         "Lives in {obj}", 0.85,
         topic_key="profile/location", short=True),
    cue("profile", I_ + r"(?:'m|\s+am)\s+(?:currently\s+)?(?:based|located)\s+in\s+"
         + NOT_NAMED + r"(?P<obj>.+)",
         "Based in {obj}", 0.85, topic_key="profile/location", short=True),
    cue("profile", I_ + r"(?:\s+currently)?\s+work(?:ing)?\s+(?:at|for)\s+" + NOT_NAMED
         + r"(?P<obj>.+)",
         "Works at {obj}", 0.85, topic_key="profile/employer", short=True),
    cue("profile", I_ + r"(?:'m|\s+am)\s+working\s+(?:at|for)\s+" + NOT_NAMED + r"(?P<obj>.+)",
         "Works at {obj}", 0.8, topic_key="profile/employer", short=True),
    cue("profile", I_ + r"(?:\s+currently)?\s+work\s+as\s+(?P<obj>.+)", "Works as {obj}", 0.85,
         topic_key="profile/role", short=True),
    cue("profile", r"\bmy\s+time\s*zone\s+is\s+(?P<obj>.+)", "Time zone is {obj}", 0.85,
         topic_key="profile/timezone", short=True),
    cue("profile", r"\bmy\s+pronouns\s+are\s+(?P<obj>.+)", "Pronouns are {obj}", 0.85,
         topic_key="profile/pronouns", short=True),
    cue("profile", I_ + r"(?:'m|\s+am)\s+(?P<obj>an?\s+.+)", "Is {obj}", 0.7, short=True,
         reject=PROFILE_REJECT),
    # decision
    cue("decision", r"\b(?:we|i)(?:'ve|\s+have|'re|\s+are|\s+just|\s+finally)?\s+(?:switched|"
         r"switching|moved|moving|migrated|migrating)\s+(?:\w+\s+){0,3}?from\s+(?P<old>.+?)\s+"
         r"to\s+(?P<new>.+)", "Switched from {old} to {new}", 0.85),
    cue("decision", r"\b(?:we|i|the\s+team)(?:'ve|\s+have)?\s+(?:finally\s+|just\s+)?decided\s+"
         r"(?P<obj>(?:to|on|against)\s+.+)", "Decided {obj}", 0.85, min_words=2),
    cue("decision", r"\b(?:we|i)(?:'ve|\s+have)?\s+(?:finally\s+)?(?:chose|chosen|picked|"
         r"went\s+with|settled\s+on|opted\s+for)\s+(?P<obj>.+)", "Chose {obj}", 0.75),
    cue("decision", r"\b(?:we'll|we\s+will|we're\s+going\s+to|we\s+are\s+going\s+to|i'll|"
         r"i\s+will)\s+(?P<verb>go\s+with|use|stick\s+with|adopt)\s+(?P<obj>.+)",
         "Decided to {verb} {obj}", 0.75),
    cue("decision", r"\b(?:let's|let\s+us)\s+(?P<verb>go\s+with|use|stick\s+with|adopt)\s+"
         r"(?P<obj>.+)", "Decided to {verb} {obj}", 0.7),
    # preference
    cue("preference", I_ + r"(?:'d|\s+would)?\s+(?:really\s+|much\s+|strongly\s+|generally\s+|"
         r"always\s+)?prefer\s+(?P<obj>.+)", "Prefers {obj}", 0.85),
    cue("preference", r"\bmy\s+preference\s+is\s+(?:for\s+)?(?P<obj>.+)", "Prefers {obj}", 0.8),
    cue("preference", I_ + r"(?:'d|\s+would)\s+(?:much\s+)?rather\s+(?P<obj>.+)",
         "Would rather {obj}", 0.8, min_words=2),
    cue("preference", r"\bplease\s+(?P<adv>always|never)\s+(?P<obj>.+)", "{adv} {obj}", 0.85),
    cue("preference", r"^(?P<adv>always|never)\s+(?P<obj>.+?),?\s+please\W*$", "{adv} {obj}",
         0.8),
    cue("preference", r"\bplease\s+(?:don't|do\s+not)\s+(?:ever\s+)?(?P<obj>.+)", "Never {obj}",
         0.75),
    cue("preference", r"^(?:don't|do\s+not)\s+(?:ever\s+)?(?P<obj>.+?),?\s+please\W*$",
         "Never {obj}", 0.75),
    cue("preference", I_ + r"\s+(?:really\s+|absolutely\s+|just\s+)?love\s+(?P<obj>.+)",
         "Loves {obj}", 0.75),
    cue("preference", I_ + r"\s+(?:really\s+|absolutely\s+)?(?:hate|dislike|detest|can't\s+stand|"
         r"cannot\s+stand)\s+(?P<obj>.+)", "Dislikes {obj}", 0.75),
    cue("preference", I_ + r"\s+(?:really\s+)?(?:don't|do\s+not)\s+(?:really\s+)?like\s+"
         r"(?P<obj>.+)", "Dislikes {obj}", 0.7),
    cue("preference", I_ + r"\s+(?:really\s+)?like\s+(?P<obj>.+)", "Likes {obj}", 0.7),
    # discovery
    cue("discovery", r"\bthe\s+(?P<what>bug|fix|problem|issue|root\s+cause|cause|culprit|"
         r"solution|trick)\s+(?:was|turned\s+out\s+to\s+be)\s+(?P<obj>.+)", "{what} was {obj}",
         0.8, min_words=2, reject=STATE_WORDS),
    cue("discovery", r"(?:^|\s)(?:(?-i:TIL)|today\s+I\s+learned)\b[:,]?\s+(?:that\s+)?"
         r"(?P<obj>.+)", "Learned {obj}", 0.8, min_words=3),
    cue("discovery", r"\b(?:it\s+)?turn(?:s|ed)\s+out\s+(?!to\b)(?:that\s+)?(?P<obj>.+)",
         "Found that {obj}", 0.7, min_words=3),
    cue("discovery", I_ + r"\s+(?:just\s+|finally\s+)?found\s+(?:out\s+)?that\s+(?P<obj>.+)",
         "Found that {obj}", 0.75, min_words=3),
    cue("discovery", I_ + r"\s+(?:just\s+|finally\s+)?(?P<verb>discovered|realized|realised|"
         r"learned|learnt|noticed)\s+(?:that\s+)?(?P<obj>.+)", "{verb} {obj}", 0.7, min_words=3),
    # pattern
    cue("pattern", r"\b(?P<when>whenever|every\s+time|each\s+time)\s+(?P<cond>[^,]+),\s*I\s+"
         r"(?P<act>.+)", "{act} {when} {cond}", 0.75, verbs=("act",)),
    cue("pattern", I_ + r"\s+(?P<act>.+?)\s+(?P<when>whenever|every\s+time|each\s+time)\s+"
         r"(?P<cond>.+)", "{act} {when} {cond}", 0.75, verbs=("act",)),
    cue("pattern", r"\b(?P<when>whenever|every\s+time|each\s+time)\s+(?P<cond>[^,]+),\s*"
         r"(?P<act>.+)", "{act} {when} {cond}", 0.65),
    cue("pattern", I_ + r"\s+(?P<obj>always\s+.+?\s+before\s+.+)", "{obj}", 0.75,
         verbs=("obj",), min_words=4),
    cue("pattern", I_ + r"\s+(?P<obj>(?:usually|normally|typically|generally|always|never|"
         r"tend\s+to)\s+.+)", "{obj}", 0.65, verbs=("obj",), min_words=3),
)  # fmt: skip
