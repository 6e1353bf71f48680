"""A deterministic offline extractor: notes from cue phrases in what the user said.

Used when no harvest model is configured, so the embedded default works with no key and no
network. It reads only user turns, one sentence at a time, and knows a fixed set of English
cue phrases; anything else yields no note rather than a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from harvest.candidate import NOTE_TYPES, NoteCandidate
from harvest.redact import redact_text
from harvest.transcript import Message, Transcript
from store.terms import jaccard
from store.text import REDACTED, words


def _word_set(text: str) -> frozenset[str]:
    return frozenset(text.split())


MIN_CONFIDENCE = 0.5
MAX_CONFIDENCE = 0.9
_HEDGE_PENALTY = 0.15
_REPEAT_BONUS = 0.05
_DUPLICATE_SIMILARITY = 0.8
_MAX_SENTENCE_CHARS = 500
_MAX_TITLE_CHARS = 90
_MAX_TOPICS = 5

# Groups that name a thing the note is about; the others (``verb``, ``when``, ``adv``, ``what``)
# are parts of the cue phrase itself.
_OBJECT_GROUPS = ("obj", "old", "new", "act", "cond")

_STOP_WORDS = _word_set(
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
_VAGUE = _word_set(
    """it this that these those them they you your yours how what when why where which who
    there here so too very really not sure ok okay fine good great bit little lot one
    something anything everything nothing idea way the-idea"""
)
# "The bug was fixed" or "the issue was weird" report a state, not what was found.
_STATE_WORDS = _VAGUE | _word_set(
    """fixed solved resolved gone annoying weird strange hard tricky obvious mine"""
)
# Words that only point back at the chat itself: "I like the second approach".
_CHAT_NOUNS = _word_set(
    """idea approach answer answers response responses suggestion suggestions explanation
    option options solution version example examples"""
)
_PROFILE_REJECT = _VAGUE | _word_set("huge big total complete fan quick new question")
_HEDGES = re.compile(
    r"\b(?:maybe|probably|perhaps|might|i\s+think|i\s+guess|not\s+sure|kind\s+of|sort\s+of)\b",
    re.IGNORECASE,
)
# Sentences that only imagine, or ask without a question mark, state nothing.
_HYPOTHETICAL = re.compile(
    r"^(?:if|what\s+if|suppose|supposing|imagine|assuming|(?:should|would|could|can|will|do|"
    r"does|did|is|are)\s+(?:i|we|you|it|they))\b",
    re.IGNORECASE,
)
_NEGATION = re.compile(r"\b(?:not|never|no\s+longer)\b|n't\b", re.IGNORECASE)
_CLAUSE_SPLIT = re.compile(r"[,;:]|\bbut\b", re.IGNORECASE)

_CUT = re.compile(
    r"[,;:()\[\]\u2014\u2013\u2026]|\s-\s|\.\.\.|\b(?:because|since|so|as\s+(?:it|they|that)|but|"
    r"which|although|though|unless|otherwise|except|cause|cuz)\b",
    re.IGNORECASE,
)
# Names and places end sooner: "I live in Berlin with my partner" is about Berlin.
_CUT_SHORT = re.compile(
    _CUT.pattern + r"|\b(?:and|with|for|at|in|as|where|who|now|currently|these\s+days|"
    r"right\s+now)\b",
    re.IGNORECASE,
)
_PRONOUNS = {
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
_PRONOUN = re.compile(r"\b(?:i'm|i've|i'd|i'll|i|me|my|mine|myself)\b(?!\.\w)", re.IGNORECASE)
_ADVERBS = _word_set(
    """always usually normally typically generally never often sometimes rarely also just
    still first really mostly actually only then"""
)
_IRREGULAR = {"be": "is", "am": "is", "are": "is", "have": "has", "do": "does", "go": "goes",
              "don't": "doesn't", "do not": "does not"}  # fmt: skip
_MODALS = _word_set("can could will would shall should may might must was did had")
_OCCUPATIONS = _word_set(
    """engineer developer programmer scientist designer manager student teacher professor
    researcher analyst architect consultant founder doctor nurse lawyer writer editor
    accountant administrator admin lead director freelancer contractor intern maintainer
    sre cto ceo marketer"""
)
_PROPER_NOUN_KEYS = frozenset({"profile/name", "profile/employer"})
_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_LIST_MARK = re.compile(r"^\s*(?:[-*+•]|\d+[.)]|#+)\s+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_TOKEN = re.compile(r"[a-z0-9][a-z0-9+#._-]*")
_FOLLOW_UP = re.compile(r"^(?:because|since|so|that|it|this|they|which|as|but)\b", re.I)


@dataclass(frozen=True)
class _Cue:
    """One cue phrase: what it means, and how to title the note it finds."""

    type: str
    pattern: re.Pattern[str]
    title: str  # a format string over the pattern's named groups
    confidence: float
    topic_key: str | None = None
    verbs: tuple[str, ...] = ()  # groups whose first verb becomes third person
    short: bool = False  # a name or a place: cut at "and", "with", ... and keep few words
    min_words: int = 1
    reject: frozenset[str] = _VAGUE


def _cue(
    type_: str,
    pattern: str,
    title: str,
    confidence: float,
    *,
    topic_key: str | None = None,
    verbs: tuple[str, ...] = (),
    short: bool = False,
    min_words: int = 1,
    reject: frozenset[str] = _VAGUE,
) -> _Cue:
    return _Cue(
        type_, re.compile(pattern, re.IGNORECASE), title, confidence,
        topic_key, verbs, short, min_words, reject,
    )  # fmt: skip


_I = r"\bI"
_CUES: tuple[_Cue, ...] = (
    # profile: stable topic keys, so a repeated or corrected fact updates one note
    _cue("profile", r"\bmy\s+name(?:\s+is|'s)\s+(?P<obj>.+)", "Name is {obj}", 0.9,
         topic_key="profile/name", short=True),
    _cue("profile", r"\b(?:please\s+)?call\s+me\s+(?P<obj>(?-i:[A-Z])\w+)", "Name is {obj}", 0.8,
         topic_key="profile/name", short=True),
    _cue("profile", _I + r"\s+(?:currently\s+)?live\s+in\s+(?P<obj>.+)", "Lives in {obj}", 0.85,
         topic_key="profile/location", short=True),
    _cue("profile", _I + r"(?:'m|\s+am)\s+(?:currently\s+)?(?:based|located)\s+in\s+(?P<obj>.+)",
         "Based in {obj}", 0.85, topic_key="profile/location", short=True),
    _cue("profile", _I + r"(?:\s+currently)?\s+work(?:ing)?\s+(?:at|for)\s+(?P<obj>.+)",
         "Works at {obj}", 0.85, topic_key="profile/employer", short=True),
    _cue("profile", _I + r"(?:'m|\s+am)\s+working\s+(?:at|for)\s+(?P<obj>.+)",
         "Works at {obj}", 0.8, topic_key="profile/employer", short=True),
    _cue("profile", _I + r"(?:\s+currently)?\s+work\s+as\s+(?P<obj>.+)", "Works as {obj}", 0.85,
         topic_key="profile/role", short=True),
    _cue("profile", r"\bmy\s+time\s*zone\s+is\s+(?P<obj>.+)", "Time zone is {obj}", 0.85,
         topic_key="profile/timezone", short=True),
    _cue("profile", r"\bmy\s+pronouns\s+are\s+(?P<obj>.+)", "Pronouns are {obj}", 0.85,
         topic_key="profile/pronouns", short=True),
    _cue("profile", _I + r"(?:'m|\s+am)\s+(?P<obj>an?\s+.+)", "Is {obj}", 0.7, short=True,
         reject=_PROFILE_REJECT),
    # decision
    _cue("decision", r"\b(?:we|i)(?:'ve|\s+have|'re|\s+are|\s+just|\s+finally)?\s+(?:switched|"
         r"switching|moved|moving|migrated|migrating)\s+(?:\w+\s+){0,3}?from\s+(?P<old>.+?)\s+"
         r"to\s+(?P<new>.+)", "Switched from {old} to {new}", 0.85),
    _cue("decision", r"\b(?:we|i|the\s+team)(?:'ve|\s+have)?\s+(?:finally\s+|just\s+)?decided\s+"
         r"(?P<obj>(?:to|on|against)\s+.+)", "Decided {obj}", 0.85, min_words=2),
    _cue("decision", r"\b(?:we|i)(?:'ve|\s+have)?\s+(?:finally\s+)?(?:chose|chosen|picked|"
         r"went\s+with|settled\s+on|opted\s+for)\s+(?P<obj>.+)", "Chose {obj}", 0.75),
    _cue("decision", r"\b(?:we'll|we\s+will|we're\s+going\s+to|we\s+are\s+going\s+to|i'll|"
         r"i\s+will)\s+(?P<verb>go\s+with|use|stick\s+with|adopt)\s+(?P<obj>.+)",
         "Decided to {verb} {obj}", 0.75),
    _cue("decision", r"\b(?:let's|let\s+us)\s+(?P<verb>go\s+with|use|stick\s+with|adopt)\s+"
         r"(?P<obj>.+)", "Decided to {verb} {obj}", 0.7),
    # preference
    _cue("preference", _I + r"(?:'d|\s+would)?\s+(?:really\s+|much\s+|strongly\s+|generally\s+|"
         r"always\s+)?prefer\s+(?P<obj>.+)", "Prefers {obj}", 0.85),
    _cue("preference", r"\bmy\s+preference\s+is\s+(?:for\s+)?(?P<obj>.+)", "Prefers {obj}", 0.8),
    _cue("preference", _I + r"(?:'d|\s+would)\s+(?:much\s+)?rather\s+(?P<obj>.+)",
         "Would rather {obj}", 0.8, min_words=2),
    _cue("preference", r"\bplease\s+(?P<adv>always|never)\s+(?P<obj>.+)", "{adv} {obj}", 0.85),
    _cue("preference", r"^(?P<adv>always|never)\s+(?P<obj>.+?),?\s+please\W*$", "{adv} {obj}",
         0.8),
    _cue("preference", r"\bplease\s+(?:don't|do\s+not)\s+(?:ever\s+)?(?P<obj>.+)", "Never {obj}",
         0.75),
    _cue("preference", r"^(?:don't|do\s+not)\s+(?:ever\s+)?(?P<obj>.+?),?\s+please\W*$",
         "Never {obj}", 0.75),
    _cue("preference", _I + r"\s+(?:really\s+|absolutely\s+|just\s+)?love\s+(?P<obj>.+)",
         "Loves {obj}", 0.75),
    _cue("preference", _I + r"\s+(?:really\s+|absolutely\s+)?(?:hate|dislike|detest|can't\s+stand|"
         r"cannot\s+stand)\s+(?P<obj>.+)", "Dislikes {obj}", 0.75),
    _cue("preference", _I + r"\s+(?:really\s+)?(?:don't|do\s+not)\s+(?:really\s+)?like\s+"
         r"(?P<obj>.+)", "Dislikes {obj}", 0.7),
    _cue("preference", _I + r"\s+(?:really\s+)?like\s+(?P<obj>.+)", "Likes {obj}", 0.7),
    # discovery
    _cue("discovery", r"\bthe\s+(?P<what>bug|fix|problem|issue|root\s+cause|cause|culprit|"
         r"solution|trick)\s+(?:was|turned\s+out\s+to\s+be)\s+(?P<obj>.+)", "{what} was {obj}",
         0.8, min_words=2, reject=_STATE_WORDS),
    _cue("discovery", r"(?:^|\s)(?:(?-i:TIL)|today\s+I\s+learned)\b[:,]?\s+(?:that\s+)?"
         r"(?P<obj>.+)", "Learned {obj}", 0.8, min_words=3),
    _cue("discovery", r"\b(?:it\s+)?turn(?:s|ed)\s+out\s+(?!to\b)(?:that\s+)?(?P<obj>.+)",
         "Found that {obj}", 0.7, min_words=3),
    _cue("discovery", _I + r"\s+(?:just\s+|finally\s+)?found\s+(?:out\s+)?that\s+(?P<obj>.+)",
         "Found that {obj}", 0.75, min_words=3),
    _cue("discovery", _I + r"\s+(?:just\s+|finally\s+)?(?P<verb>discovered|realized|realised|"
         r"learned|learnt|noticed)\s+(?:that\s+)?(?P<obj>.+)", "{verb} {obj}", 0.7, min_words=3),
    # pattern
    _cue("pattern", r"\b(?P<when>whenever|every\s+time|each\s+time)\s+(?P<cond>[^,]+),\s*I\s+"
         r"(?P<act>.+)", "{act} {when} {cond}", 0.75, verbs=("act",)),
    _cue("pattern", _I + r"\s+(?P<act>.+?)\s+(?P<when>whenever|every\s+time|each\s+time)\s+"
         r"(?P<cond>.+)", "{act} {when} {cond}", 0.75, verbs=("act",)),
    _cue("pattern", r"\b(?P<when>whenever|every\s+time|each\s+time)\s+(?P<cond>[^,]+),\s*"
         r"(?P<act>.+)", "{act} {when} {cond}", 0.65),
    _cue("pattern", _I + r"\s+(?P<obj>always\s+.+?\s+before\s+.+)", "{obj}", 0.75,
         verbs=("obj",), min_words=4),
    _cue("pattern", _I + r"\s+(?P<obj>(?:usually|normally|typically|generally|always|never|"
         r"tend\s+to)\s+.+)", "{obj}", 0.65, verbs=("obj",), min_words=3),
)  # fmt: skip


@dataclass
class _Found:
    """A statement found in one sentence, before dedup."""

    type: str
    title: str
    sentence: str
    follow: str
    topics: list[str]
    confidence: float
    topic_key: str | None
    message: Message
    order: int
    # Word sets for near-duplicate checks, computed once per statement.
    title_words: frozenset[str] = field(init=False)
    sentence_words: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.title_words = frozenset(words(self.title))
        self.sentence_words = frozenset(words(self.sentence))


def _sentences(text: str) -> list[str]:
    """The sentences of a message, without code blocks, quoted lines or markdown marks."""
    text = _FENCE.sub("\n", text)
    out: list[str] = []
    for raw in text.splitlines():
        if raw.lstrip().startswith(">"):
            continue  # a quote is someone else's words
        line = _LIST_MARK.sub("", raw).replace("`", "").replace("**", "")
        out.extend(s for piece in _SENTENCE_END.split(line) if (s := " ".join(piece.split())))
    return out


def _third_person(phrase: str) -> str:
    """``phrase`` with its first verb in the third person: "usually write" -> "usually writes"."""
    tokens = phrase.split(" ")
    for i, token in enumerate(tokens):
        low = token.lower()
        if low in _ADVERBS:
            continue
        if low in _IRREGULAR:
            tokens[i] = _IRREGULAR[low]
        elif low in _MODALS or not low.isalpha():
            pass
        elif low.endswith(("s", "sh", "ch", "x", "z", "o")):
            tokens[i] = token + "es"
        elif low.endswith("y") and len(low) > 1 and low[-2] not in "aeiou":
            tokens[i] = token[:-1] + "ies"
        else:
            tokens[i] = token + "s"
        break
    return " ".join(tokens)


def _clean(raw: str, *, short: bool) -> str:
    """A captured phrase cut to its first clause, trimmed of quotes and end punctuation."""
    cut = (_CUT_SHORT if short else _CUT).search(raw)
    text = raw[: cut.start()] if cut else raw
    tokens = text.strip(" \"'*_").split()[: 6 if short else 12]
    return " ".join(tokens).rstrip(".!?\"'*_ ")


def _swap_pronouns(text: str) -> str:
    return _PRONOUN.sub(lambda m: _PRONOUNS[m.group(0).lower()], text)


def _head_word(value: str) -> str:
    tokens = [t for t in value.lower().split() if t not in ("a", "an", "the")]
    return tokens[0] if tokens else ""


def _says_something(value: str) -> bool:
    """True when the phrase has a word beyond stop words and words about the chat itself."""
    return any(w not in _STOP_WORDS and w not in _CHAT_NOUNS for w in _TOKEN.findall(value.lower()))


def _topics(values: list[str], lead: list[str]) -> list[str]:
    topics = list(lead)
    for value in values:
        for raw in _TOKEN.findall(value.lower()):
            token = raw.rstrip("._-")
            if len(token) < 2 or token.isdigit() or token in _STOP_WORDS or token in topics:
                continue
            topics.append(token)
    return topics[:_MAX_TOPICS]


def _shorten(title: str) -> str:
    if len(title) <= _MAX_TITLE_CHARS:
        return title
    return title[: _MAX_TITLE_CHARS + 1].rsplit(" ", 1)[0].rstrip(",;:")


def _match(cue: _Cue, m: re.Match[str]) -> tuple[str, list[str], str | None, int] | None:
    """Title, topics, topic key and end of what the cue found, or None when it is too vague."""
    values: dict[str, str] = {}
    plain: list[str] = []  # the objects as said, for topics
    end = m.start()
    for name, raw in m.groupdict().items():
        if raw is None:
            continue
        if name not in _OBJECT_GROUPS:
            values[name] = " ".join(raw.split()).lower()
            end = max(end, m.end(name))
            continue
        value = _clean(raw, short=cue.short)
        if name != "cond" and (
            len(value.split()) < cue.min_words
            or _head_word(value) in cue.reject
            or not _says_something(value)
        ):
            return None
        end = max(end, m.start(name) + len(value))
        plain.append(value)
        if cue.topic_key in _PROPER_NOUN_KEYS and value.islower():
            value = value.title()  # "my name is bob" -> "Bob"
        value = _swap_pronouns(value)
        values[name] = _third_person(value) if name in cue.verbs else value
    title = cue.title.format(**values)
    title = _shorten(title[:1].upper() + title[1:])
    topic_key = cue.topic_key
    if topic_key is None and cue.type == "profile":
        # "I'm a data engineer" is a role; "I'm a vegetarian" is a fact without a slot.
        last = (values.get("obj", "").lower().split() or [""])[-1]
        if last in _OCCUPATIONS or last.removesuffix("s") in _OCCUPATIONS:
            topic_key = "profile/role"
    lead = [topic_key.split("/", 1)[1]] if topic_key else []
    return title, _topics(plain, lead), topic_key, end


def _negated(sentence: str, start: int) -> bool:
    """True when the cue's own clause is negated before it ("I don't think we decided ...")."""
    clause = _CLAUSE_SPLIT.split(sentence[:start])[-1]
    return _NEGATION.search(clause) is not None


def _scan(sentence: str, cues: tuple[_Cue, ...]) -> list[tuple[_Cue, str, list[str], str | None]]:
    """Every statement in one sentence; cues earlier in the table win overlapping text."""
    taken: list[tuple[int, int]] = []
    found: list[tuple[_Cue, str, list[str], str | None]] = []
    for cue in cues:
        for m in cue.pattern.finditer(sentence):
            if _negated(sentence, m.start()):
                continue
            hit = _match(cue, m)
            if hit is None:
                continue
            title, topics, topic_key, end = hit
            if any(m.start() < t_end and t_start < end for t_start, t_end in taken):
                continue
            taken.append((m.start(), end))
            found.append((cue, title, topics, topic_key))
    return found


def _statements(t: Transcript, cues: tuple[_Cue, ...]) -> list[_Found]:
    found: list[_Found] = []
    for message in t.messages:
        if message.role != "user":
            continue
        sentences = _sentences(redact_text(message.content))
        for i, sentence in enumerate(sentences):
            if (
                len(sentence) > _MAX_SENTENCE_CHARS  # pasted text, logs: not a statement
                or sentence.endswith("?")
                or REDACTED in sentence
                or _HYPOTHETICAL.match(sentence)
            ):
                continue
            follow = sentences[i + 1] if i + 1 < len(sentences) else ""
            if not _FOLLOW_UP.match(follow) or follow.endswith("?") or len(follow) > 300:
                follow = ""
            hedged = _HEDGES.search(sentence) is not None
            for cue, title, topics, topic_key in _scan(sentence, cues):
                confidence = cue.confidence - (_HEDGE_PENALTY if hedged else 0.0)
                found.append(
                    _Found(cue.type, title, sentence, follow, topics,
                           max(MIN_CONFIDENCE, confidence), topic_key, message, len(found))
                )  # fmt: skip
    return found


def _same(a: _Found, b: _Found) -> bool:
    if a.type != b.type:
        return False
    if a.topic_key or b.topic_key:
        return a.topic_key == b.topic_key
    return (
        max(
            jaccard(a.title_words, b.title_words),
            jaccard(a.sentence_words, b.sentence_words),
        )
        >= _DUPLICATE_SIMILARITY
    )


def _dedupe(found: list[_Found]) -> list[_Found]:
    """One note per near-identical statement; a statement said again is surer.

    For a topic key a different value replaces the earlier one: "I live in Munich now"
    corrects "I live in Berlin".
    """
    kept: list[_Found] = []
    for item in found:
        twin = next((k for k in kept if _same(k, item)), None)
        if twin is None:
            kept.append(item)
        elif twin.topic_key and twin.title.lower() != item.title.lower():
            kept[kept.index(twin)] = item
        else:
            best = max(twin.confidence, item.confidence)
            twin.confidence = min(MAX_CONFIDENCE, best + _REPEAT_BONUS)
    return kept


def _body(item: _Found, t: Transcript) -> str:
    statement = f"{item.sentence} {item.follow}".strip()
    if t.title:
        context = f'Said by the user in "{redact_text(t.title)}"'
    else:
        context = f"Said by the user in conversation {t.conversation_id}"
    when = item.message.at or t.happened_at
    if when is not None:
        context += f" on {when.date().isoformat()}"
    return f"{statement}\n\n{context}."


def offline_extract(
    t: Transcript, max_facts: int, types: tuple[str, ...] = NOTE_TYPES
) -> list[NoteCandidate]:
    """Notes for the preferences, decisions, profile facts, discoveries and patterns the user
    stated, surest first, at most ``max_facts``, only of ``types``.

    Deterministic: the same transcript always gives the same notes. Private spans and injected
    memory indexes are stripped first; questions, hypotheticals, negated cues and vague
    objects ("I like that") give nothing. Titles are third person ("Prefers tabs over
    spaces"); profile facts carry stable topic keys such as ``profile/name``.
    """
    if max_facts <= 0:
        return []
    cues = tuple(cue for cue in _CUES if cue.type in types)
    found = _dedupe(_statements(t, cues))
    found.sort(key=lambda f: (-round(f.confidence, 6), f.order))
    return [
        NoteCandidate(
            type=f.type,
            title=f.title,
            body=_body(f, t)[:4000],
            topics=f.topics,
            confidence=round(f.confidence, 2),
            topic_key=f.topic_key,
        )
        for f in found[:max_facts]
    ]
