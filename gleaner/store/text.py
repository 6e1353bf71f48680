"""Pure text rules of the store: slugs, topics, hashes, snippets, refusals' quoting (the
privacy strip is ``privacy.private``; its names are re-exported here for the store's modules).

Similarity (content terms, Jaccard, the same-fact rule) lives in ``store.notes.terms``.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Sequence

from gleaner.privacy import strip_private
from gleaner.store.errors import InvalidInput

SLUG_MAX_CHARS = 64
MAX_TOPICS = 8
MAX_TOPIC_CHARS = 40
MAX_TOPIC_KEY_BYTES = 255
# The longest model name the ledger keeps (a server names its model; longer ones are cut).
MODEL_MAX_CHARS = 255
# The setting of the note body limit (``Settings.max_body_bytes``), named where it is refused.
MAX_BODY_BYTES_SETTING = "GLEANER_MAX_BODY_BYTES"

_SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_ASCII_WORD = re.compile(r"[a-z0-9]+")
_WORD = re.compile(r"\w+", re.UNICODE)


def slugify(title: str) -> str:
    """Derive a slug: the title's ASCII words joined by ``-``, or a short hash without any.

    Accents are folded first (``Café`` -> ``cafe``); the slug is cut to 64 characters at a
    word boundary.
    """
    folded = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    words: list[str] = _ASCII_WORD.findall(folded.lower())
    if not words:
        digest = hashlib.sha256(title.encode("utf-8", "surrogatepass")).hexdigest()
        return f"note-{digest[:10]}"
    slug = words[0][:SLUG_MAX_CHARS]
    for word in words[1:]:
        if len(slug) + 1 + len(word) > SLUG_MAX_CHARS:
            break
        slug = f"{slug}-{word}"
    return slug


def is_slug(value: str) -> bool:
    """True when ``value`` has the shape slugify produces (lowercase ASCII words and ``-``)."""
    return len(value) <= 100 and _SLUG_RE.match(value) is not None


def _normalize_topic(raw: str) -> str:
    topic = re.sub(r"[^\w.\-]", "-", raw.strip().lower())[:MAX_TOPIC_CHARS]
    # A topic of only punctuation says nothing: drop it.
    return topic if any(ch.isalnum() for ch in topic) else ""


def normalize_topics(raw: str | Sequence[str] | None) -> str:
    """Normalize topics to a space-separated string of lowercase words.

    Characters outside letters, digits, ``.``, ``_`` and ``-`` become ``-``; at most 8
    distinct topics of at most 40 characters; a topic with no letter or digit is dropped.
    A string is split on whitespace and commas; a list gives one topic per item.
    """
    if raw is None:
        return ""
    items: Iterable[str] = re.split(r"[\s,]+", raw) if isinstance(raw, str) else raw
    seen: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise InvalidInput(f"topics must be strings, got {quoted(item)}", reason="bad_topics")
        topic = _normalize_topic(item)
        if topic and topic not in seen:
            seen.append(topic)
        if len(seen) == MAX_TOPICS:
            break
    return " ".join(seen)


def topics(normalized: str) -> list[str]:
    """The topics of a note (its normalized topic string) as a list."""
    return normalized.split()


# How much of a refused value an error message quotes.
QUOTED_CHARS = 80


def quoted(value: object) -> str:
    """``value`` as a refusal quotes it: ``repr``, with its ``<private>`` spans redacted and cut
    to ``QUOTED_CHARS``. Refusals reach logs, HTTP and MCP answers and the CLI, and a private
    span in a caller's bad input is no less private for being refused."""
    if isinstance(value, str):
        return repr(strip_private(value)[:QUOTED_CHARS])
    shown = strip_private(repr(value))
    return shown if len(shown) <= QUOTED_CHARS else shown[:QUOTED_CHARS] + "..."


def content_hash(text: str) -> str:
    """sha256 hex of the text lowercased with whitespace collapsed (used for dedup)."""
    canonical = " ".join(text.lower().split())
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def words(text: str) -> list[str]:
    """Lowercase word tokens (letters, digits, ``_``) of a text."""
    return _WORD.findall(text.lower())


def snippet(body: str, query_words: Sequence[str], width: int = 160) -> str:
    """A window of about ``width`` characters of body around the first query word found.

    Query words are tried in order; when none occurs the window is the start of the body.
    Whitespace is collapsed; ``…`` marks a cut on either side.
    """
    if width < 1:
        raise InvalidInput("snippet width must be positive", reason="bad_width")
    text = " ".join(body.split())
    if len(text) <= width:
        return text
    lowered = text.lower()
    position = -1
    for word in query_words:
        if word and (position := lowered.find(word.lower())) >= 0:
            break
    start = 0 if position < 0 else max(0, min(position - width // 4, len(text) - width))
    end = start + width
    return ("…" if start > 0 else "") + text[start:end] + ("…" if end < len(text) else "")


def check_no_private(value: str, field: str, reason: str) -> str:
    """``value`` unchanged, or InvalidInput when it holds a ``<private>`` span or tag or a
    secret: for text that is stored and shown as given (keys, names), which redaction would
    change."""
    if strip_private(value) != value:
        raise InvalidInput(
            f"{field} holds a <private> tag or a secret: it is stored and shown as given, so "
            "it may hold no private text",
            reason=reason,
        )
    return value


def check_topic_key(key: str) -> str:
    """``key`` unchanged, or InvalidInput: a topic key is stored, derived into a slug and
    shown to the harvest model as given, so it is text of at most ``MAX_TOPIC_KEY_BYTES``,
    not blank (a blank key would be one key for every such note) and holds no private span."""
    check_text(key, "topic_key", max_bytes=MAX_TOPIC_KEY_BYTES)
    if not key.strip():
        raise InvalidInput("topic_key is empty (pass None for none)", reason="bad_topic_key")
    return check_no_private(key, "topic_key", "bad_topic_key")


def check_text(
    value: object, field: str, *, max_bytes: int | None = None, setting: str | None = None
) -> str:
    """Return ``value`` as str if it is valid UTF-8 without NUL (and within ``max_bytes``).

    Bytes are accepted when they decode as UTF-8; a str holding lone surrogates (undecodable
    bytes smuggled in) is rejected. Nothing is trimmed or normalized: text is kept byte for byte.
    Text over ``max_bytes`` is refused (``body_too_large``) naming ``field`` and the limit, and
    ``setting``, the setting that sets the limit, when one does (a fixed limit names none).
    """
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(
                f"{field} is not valid UTF-8 (byte {exc.start})", reason="invalid_utf8"
            ) from None
    if not isinstance(value, str):
        raise InvalidInput(
            f"{field} must be a string, got {type(value).__name__}", reason="bad_type"
        )
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            f"{field} is not valid UTF-8 (lone surrogate at character {exc.start})",
            reason="invalid_utf8",
        ) from None
    if "\x00" in value:
        raise InvalidInput(f"{field} contains a NUL character", reason="nul_character")
    if max_bytes is not None and len(encoded) > max_bytes:
        governed = f" ({setting}; raise it to accept this input)" if setting else ""
        raise InvalidInput(
            f"{field} is {len(encoded):,} bytes, over the limit of {max_bytes:,} bytes{governed}",
            reason="body_too_large",
        )
    return value


# What no stored text may hold: NUL (PostgreSQL refuses it in text) and lone surrogates
# (not UTF-8 at all).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def storable(text: str, max_chars: int) -> str:
    """``text`` from outside Gleaner's control that Gleaner keeps as its own record, not as a
    note (a model server's error message or model name, on a job or in the ledger): NUL and
    lone surrogates made U+FFFD and the text cut at ``max_chars``, so the record is always
    written. A note's own text is refused instead (``check_text``), never changed."""
    return _UNSTORABLE.sub("\ufffd", text[:max_chars])


def unstorable(text: str) -> str | None:
    """What keeps ``text`` from being stored as it is (a NUL, a lone surrogate), or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    return "a NUL character" if found.group() == "\x00" else "a lone surrogate"


OWNER_MAX_CHARS = 255
# Unicode categories no owner name may hold: controls, format characters (zero-width spaces
# and joiners, bidi marks, the BOM: they make "ali\u200bce" look exactly like "alice"),
# surrogates, private-use and unassigned code points, line and paragraph separators.
_OWNER_REFUSED = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def check_principal(value: object, field: str = "owner") -> str:
    """An owner (principal) as stored, or InvalidInput(reason="bad_owner") naming the rule.

    The rule, applied once wherever an owner comes in (CLI, transcript, Python, mem_save):
    NFKC-normalized first (so composed and decomposed accents, full-width letters and other
    look-alike forms name one owner); then refused when blank, with leading or trailing
    whitespace, over 255 characters, holding a control, invisible (format), surrogate,
    private-use or unassigned character, or a ``<private>`` tag.
    """
    if not isinstance(value, str):
        raise InvalidInput(f"{field} must be a string", reason="bad_owner")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"{field} is not valid UTF-8 (a lone surrogate)", reason="bad_owner"
        ) from None
    name = unicodedata.normalize("NFKC", value)
    # Quoted in the refusals below, which reach logs, HTTP answers and the CLI: never a
    # private span (a refused name is not checked for tags until the end).
    shown = ascii(strip_private(name)[:40])
    if not name.strip():
        raise InvalidInput(f"{field} is empty", reason="bad_owner")
    if name != name.strip():
        raise InvalidInput(f"{field} {shown} has leading or trailing space", reason="bad_owner")
    if len(name) > OWNER_MAX_CHARS:
        raise InvalidInput(
            f"{field} is {len(name)} characters, over {OWNER_MAX_CHARS}", reason="bad_owner"
        )
    bad = next((ch for ch in name if unicodedata.category(ch) in _OWNER_REFUSED), None)
    if bad is not None:
        raise InvalidInput(
            f"{field} {shown} holds an invisible or control character (U+{ord(bad):04X})",
            reason="bad_owner",
        )
    return check_no_private(name, field, "bad_owner")
