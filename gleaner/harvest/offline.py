"""A deterministic offline extractor: notes from cue phrases in what the user said.

Used when no harvest model is configured, so the embedded default works with no key and no
network. It reads only user turns, one sentence at a time, and knows a fixed set of English
cue phrases; anything else yields no note rather than a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gleaner.harvest.candidate import MAX_QUOTE_CHARS, NoteCandidate
from gleaner.harvest.offline_cues import (
    ADVERBS,
    CHAT_NOUNS,
    CLAUSE_SPLIT,
    CUES,
    CUT,
    CUT_SHORT,
    DUPLICATE_SIMILARITY,
    FENCE,
    FOLLOW_UP,
    HEDGE_PENALTY,
    HEDGES,
    HYPOTHETICAL,
    IRREGULAR,
    LIST_MARK,
    MAX_CONFIDENCE,
    MAX_SENTENCE_CHARS,
    MAX_TITLE_CHARS,
    MAX_TOPICS,
    MIN_CONFIDENCE,
    MODALS,
    NEGATION,
    OBJECT_GROUPS,
    OCCUPATIONS,
    PRONOUN,
    PRONOUNS,
    PROPER_NOUN_KEYS,
    REPEAT_BONUS,
    SENTENCE_END,
    STOP_WORDS,
    TOKEN,
    Cue,
)
from gleaner.harvest.redact import redact_text
from gleaner.harvest.transcript import Message, Transcript
from gleaner.privacy import REDACTED
from gleaner.store.notes import judge
from gleaner.store.notes.terms import FactText
from gleaner.store.settings import DEFAULT_OBSERVATION_TYPES


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


def _sentences(text: str) -> list[str]:
    """The sentences of a message, without code blocks, quoted lines or markdown marks."""
    text = FENCE.sub("\n", text)
    out: list[str] = []
    for raw in text.splitlines():
        if raw.lstrip().startswith(">"):
            continue  # a quote is someone else's words
        line = LIST_MARK.sub("", raw).replace("`", "").replace("**", "")
        out.extend(s for piece in SENTENCE_END.split(line) if (s := " ".join(piece.split())))
    return out


def _third_person(phrase: str) -> str:
    """``phrase`` with its first verb in the third person: "usually write" -> "usually writes"."""
    tokens = phrase.split(" ")
    for i, token in enumerate(tokens):
        low = token.lower()
        if low in ADVERBS:
            continue
        if low in IRREGULAR:
            tokens[i] = IRREGULAR[low]
        elif low in MODALS or not low.isalpha():
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
    cut = (CUT_SHORT if short else CUT).search(raw)
    text = raw[: cut.start()] if cut else raw
    tokens = text.strip(" \"'*_").split()[: 6 if short else 12]
    return " ".join(tokens).rstrip(".!?\"'*_ ")


def _swap_pronouns(text: str) -> str:
    return PRONOUN.sub(lambda m: PRONOUNS[m.group(0).lower()], text)


def _head_word(value: str) -> str:
    tokens = [t for t in value.lower().split() if t not in ("a", "an", "the")]
    return tokens[0] if tokens else ""


def _says_something(value: str) -> bool:
    """True when the phrase has a word beyond stop words and words about the chat itself."""
    return any(w not in STOP_WORDS and w not in CHAT_NOUNS for w in TOKEN.findall(value.lower()))


def _topics(values: list[str], lead: list[str]) -> list[str]:
    topics = list(lead)
    for value in values:
        for raw in TOKEN.findall(value.lower()):
            token = raw.rstrip("._-")
            if len(token) < 2 or token.isdigit() or token in STOP_WORDS or token in topics:
                continue
            topics.append(token)
    return topics[:MAX_TOPICS]


def _shorten(title: str) -> str:
    if len(title) <= MAX_TITLE_CHARS:
        return title
    return title[: MAX_TITLE_CHARS + 1].rsplit(" ", 1)[0].rstrip(",;:")


def _match(cue: Cue, m: re.Match[str]) -> tuple[str, list[str], str | None, int] | None:
    """Title, topics, topic key and end of what the cue found, or None when it is too vague."""
    values: dict[str, str] = {}
    plain: list[str] = []  # the objects as said, for topics
    end = m.start()
    for name, raw in m.groupdict().items():
        if raw is None:
            continue
        if name not in OBJECT_GROUPS:
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
        if cue.topic_key in PROPER_NOUN_KEYS and value.islower():
            value = value.title()  # "my name is bob" -> "Bob"
        value = _swap_pronouns(value)
        values[name] = _third_person(value) if name in cue.verbs else value
    title = cue.title.format(**values)
    title = _shorten(title[:1].upper() + title[1:])
    topic_key = cue.topic_key
    if topic_key is None and cue.type == "profile":
        # "I'm a data engineer" is a role; "I'm a vegetarian" is a fact without a slot.
        last = (values.get("obj", "").lower().split() or [""])[-1]
        if last in OCCUPATIONS or last.removesuffix("s") in OCCUPATIONS:
            topic_key = "profile/role"
    lead = [topic_key.split("/", 1)[1]] if topic_key else []
    return title, _topics(plain, lead), topic_key, end


def _negated(sentence: str, start: int) -> bool:
    """True when the cue's own clause is negated before it ("I don't think we decided ...")."""
    clause = CLAUSE_SPLIT.split(sentence[:start])[-1]
    return NEGATION.search(clause) is not None


def _scan(sentence: str, cues: tuple[Cue, ...]) -> list[tuple[Cue, str, list[str], str | None]]:
    """Every statement in one sentence; cues earlier in the table win overlapping text."""
    taken: list[tuple[int, int]] = []
    found: list[tuple[Cue, str, list[str], str | None]] = []
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


def _statements(t: Transcript, cues: tuple[Cue, ...]) -> list[_Found]:
    found: list[_Found] = []
    for message in t.messages:
        if message.role != "user":
            continue
        sentences = _sentences(redact_text(message.content))
        for i, sentence in enumerate(sentences):
            if (
                len(sentence) > MAX_SENTENCE_CHARS  # pasted text, logs: not a statement
                or sentence.endswith("?")
                or REDACTED in sentence
                or HYPOTHETICAL.match(sentence)
            ):
                continue
            follow = sentences[i + 1] if i + 1 < len(sentences) else ""
            if not FOLLOW_UP.match(follow) or follow.endswith("?") or len(follow) > 300:
                follow = ""
            hedged = HEDGES.search(sentence) is not None
            for cue, title, topics, topic_key in _scan(sentence, cues):
                confidence = cue.confidence - (HEDGE_PENALTY if hedged else 0.0)
                found.append(
                    _Found(cue.type, title, sentence, follow, topics,
                           max(MIN_CONFIDENCE, confidence), topic_key, message, len(found))
                )  # fmt: skip
    return found


def _same(a: _Found, b: _Found) -> bool:
    """Two statements of one transcript that hold one fact (``store.notes.judge``, the rule every
    same-fact decision uses; one topic key is one fact within a conversation)."""
    if a.type != b.type:
        return False
    if a.topic_key or b.topic_key:
        return a.topic_key == b.topic_key
    return judge.same_fact(
        FactText(a.title, a.sentence), FactText(b.title, b.sentence), DUPLICATE_SIMILARITY
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
            twin.confidence = min(MAX_CONFIDENCE, best + REPEAT_BONUS)
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
    t: Transcript, max_facts: int, types: tuple[str, ...] = DEFAULT_OBSERVATION_TYPES
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
    cues = tuple(cue for cue in CUES if cue.type in types)
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
            # The sentence the note rests on, as the user wrote it (harvest.grounding).
            evidence=[{"speaker": "user", "quote": f.sentence[:MAX_QUOTE_CHARS]}],
        )
        for f in found[:max_facts]
    ]
