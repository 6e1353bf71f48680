"""Secrets in text: where they are, so they can be redacted like ``<private>`` spans.

Found: the API keys and tokens of common providers, JSON web tokens and other high-entropy
quoted strings, credentials in URLs and keyword assignments (by Yelp's detect-secrets
plugins, called through their ``analyze_string``: no filter, no verification, so nothing
reaches the network), bearer tokens and passwords stated in prose ("my password is
hunter2"), and private key blocks (whole, up to their ``END`` line; one never closed runs to
the end of the text: fail closed, as an unclosed ``<private>`` does).

Linear in the text: lines (and windows of a long line) are scanned only when a cheap gate
says they may hold a secret, and every pattern looks at most one window ahead.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from detect_secrets.plugins.base import BasePlugin
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

# A long line is scanned in windows that overlap by more than any one secret is long (the
# longest provider token, an 88-character Azure key, with its keyword), so none is cut.
WINDOW_CHARS = 4096
OVERLAP_CHARS = 512
# What a secret is replaced with (a ``<private>`` span too; ``store.text`` re-exports it).
REDACTED = "[REDACTED]"
REDACTED_WORD = REDACTED.strip("[]")
# How far from a gate's match a secret (with its keyword) may reach: more than the longest
# provider token with its prefix (an 88-character Azure key after ``AccountKey=``).
GATE_REACH = 256
# Shorter values are not secrets worth a redaction (and would redact every copy of a word).
MIN_SECRET_CHARS = 4
# Base64-ish quoted strings at or above this Shannon entropy (bits a character) are secrets:
# detect-secrets' own default, quiet on prose and code (hex strings are left: hashes, ids).
BASE64_ENTROPY = 4.5
# How many values found in a conversation's earlier messages are looked for in each later one
# (a secret stated once and then used bare): bounded, so the work stays linear.
MAX_KNOWN = 32

# A run of token characters as long as the shortest provider token: every provider plugin's
# match holds one (AKIA + 16, ghp_ + 36, xoxb-..., sk_live_..., eyJ..., SG. ...), or is a URL.
_TOKEN_GATE = re.compile(r"[A-Za-z0-9]{16}|://")
# Words of a credential stated by name, in code, config or prose; matched in the text with
# its ASCII letters lowered (``_ASCII_LOWER``, which keeps every offset), as a case-blind
# pattern would be 8x slower on prose.
_WORD_GATE = re.compile(r"pass|pwd|secret|key|token|bearer|auth|cred|contrase|\bpin\b")
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
# A password, key or token stated in prose or config: "my password is hunter2", "the
# password for the vpn is 'x'", "changed my password to x", "API key: sk-...", "PIN = 4711".
# The named group says which kind: a token or key needs a longer value than a password
# (``_fits``).
_STATED = re.compile(
    r"\b(?:(?P<pin>pin)|(?P<password>pass(?:word|phrase|code)?|passwd|pwd)|"
    r"(?P<token>api[ _-]?key|secret(?:[ _-]?key)?|access[ _-]?(?:key|token)|"
    r"auth(?:entication)?[ _-]?token|token))s?\b"
    r"(?:\s+(?:for|to|of|on|at)(?:\s+[^\s:=]{1,40}){1,4}?)?"
    r"\s*(?:\bis\b|\bwas\b|\bto\b|:|=|->)\s*(?:set\s+to\s+|now\s+)?"
    r"(?P<quote>[\"'`]?)(?P<value>[^\s\"'`]{1,200})(?P=quote)",
    re.IGNORECASE,
)
# Provider keys detect-secrets 1.5 has no plugin for, by their documented prefixes: OpenAI's
# project and service keys, Anthropic's, Google's, Hugging Face's, GitHub's fine-grained ones.
_PREFIXED = re.compile(
    r"\b(?:sk-(?:proj|ant|svcacct|admin)-[A-Za-z0-9_\-]{20,}|AIza[0-9A-Za-z_\-]{35}|"
    r"hf_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})"
)
# The password of a URL's credentials, the user name possibly empty (``redis://:pw@host``).
_URL_PASSWORD = re.compile(r"://[^\s:/?#@]*:([^\s:/?#@]+)@")
_BEARER = re.compile(r"\bbearer\s+([A-Za-z0-9\-._~+/]{12,}=*)", re.IGNORECASE)
# The start of a private key block (the detect-secrets PrivateKeyDetector's markers) and the
# end of one.
_KEY_BLOCK = re.compile(
    r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-\d"
)
_KEY_BLOCK_END = re.compile(r"-----END[A-Z0-9 ]{0,40} PRIVATE KEY(?: BLOCK)?-----")
_PUTTY_END = re.compile(r"Private-MAC: *[0-9a-fA-F]+")
# What is trimmed from a found value's edges: quotes, brackets, sentence punctuation.
_EDGES = "\"'`()[]{}<>,.;:!?"
_PASSWORD_CHAR = re.compile(r"[0-9!@#$%^&*+=?~]")
_SPACE = re.compile(r"\s")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
# Where a config value's first word ends: a space, or the next field (``Password=x;Server=``).
_VALUE_END = re.compile(r"[\s;&,]")
_LINE = re.compile(r"[^\n]+")
# A provider plugin may match a token's start only (detect-secrets' JWT rule stops before the
# signature): the value found is grown over the token characters that follow it.
_TOKEN_TAIL = r"[A-Za-z0-9_\-.+/=]*"  # noqa: S105 - a pattern, not a password


@dataclass(frozen=True)
class Found:
    """Where secrets are in a text: spans to redact (sorted, disjoint) and the values found,
    so the same values are found in the texts that follow (a transcript's later messages)."""

    spans: tuple[tuple[int, int], ...]
    values: frozenset[str]


@cache
def _plugins() -> tuple[BasePlugin, ...]:
    """The detect-secrets plugins that find provider tokens (loaded on first use)."""
    from detect_secrets.plugins.artifactory import ArtifactoryDetector
    from detect_secrets.plugins.aws import AWSKeyDetector
    from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
    from detect_secrets.plugins.basic_auth import BasicAuthDetector
    from detect_secrets.plugins.cloudant import CloudantDetector
    from detect_secrets.plugins.discord import DiscordBotTokenDetector
    from detect_secrets.plugins.github_token import GitHubTokenDetector
    from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
    from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
    from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
    from detect_secrets.plugins.jwt import JwtTokenDetector
    from detect_secrets.plugins.mailchimp import MailchimpDetector
    from detect_secrets.plugins.npm import NpmDetector
    from detect_secrets.plugins.openai import OpenAIDetector
    from detect_secrets.plugins.pypi_token import PypiTokenDetector
    from detect_secrets.plugins.sendgrid import SendGridDetector
    from detect_secrets.plugins.slack import SlackDetector
    from detect_secrets.plugins.softlayer import SoftlayerDetector
    from detect_secrets.plugins.square_oauth import SquareOAuthDetector
    from detect_secrets.plugins.stripe import StripeDetector
    from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
    from detect_secrets.plugins.twilio import TwilioKeyDetector

    return (
        ArtifactoryDetector(),
        AWSKeyDetector(),
        AzureStorageKeyDetector(),
        BasicAuthDetector(),
        CloudantDetector(),
        DiscordBotTokenDetector(),
        GitHubTokenDetector(),
        GitLabTokenDetector(),
        IbmCloudIamDetector(),
        IbmCosHmacDetector(),
        JwtTokenDetector(),
        MailchimpDetector(),
        NpmDetector(),
        OpenAIDetector(),
        PypiTokenDetector(),
        SendGridDetector(),
        SlackDetector(),
        SoftlayerDetector(),
        SquareOAuthDetector(),
        StripeDetector(),
        TelegramBotTokenDetector(),
        TwilioKeyDetector(),
    )


def _provider_values(piece: str) -> Iterator[str]:
    for plugin in _plugins():
        yield from plugin.analyze_string(piece)
    yield from _high_entropy(piece)
    yield from _PREFIXED.findall(piece)
    yield from _URL_PASSWORD.findall(piece)


def _high_entropy(piece: str) -> Iterator[str]:
    plugin = _base64()
    for value in plugin.analyze_string(piece):
        if plugin.calculate_shannon_entropy(value) >= BASE64_ENTROPY:
            yield value


@cache
def _base64() -> Base64HighEntropyString:
    from detect_secrets.plugins.high_entropy_strings import Base64HighEntropyString

    return Base64HighEntropyString(limit=BASE64_ENTROPY)


def _keyword_values(piece: str) -> Iterator[tuple[str, bool]]:
    """Values assigned to credential names (``(value, quoted)``): detect-secrets' keyword
    rules for code (quotes required) and for config files, then the prose forms."""
    from detect_secrets.plugins import keyword

    # The rule tables of its KeywordDetector, each rule run over the whole piece: the
    # detector's own analyze_string stops at a rule's first match, so a second assignment
    # on the same line (a JSON object's second secret) would be missed.
    for rule, group in keyword.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP.items():
        for match in rule.finditer(piece):
            value = match.group(group)
            if _SPACE.search(value) is None:  # a quoted phrase is a message, not a secret
                yield value, True
    for rule, group in keyword.CONFIG_DENYLIST_REGEX_TO_GROUP.items():
        for match in rule.finditer(piece):
            # A config value runs to the end of the line: only its first word is the secret.
            first = _VALUE_END.split(match.group(group).strip(), maxsplit=1)[0]
            if first:
                yield first, False
    for match in _STATED.finditer(piece):
        if _fits(match):
            yield match["value"], bool(match["quote"])
    for match in _BEARER.finditer(piece):
        yield match.group(1), True


def _fits(match: re.Match[str]) -> bool:
    """Whether a stated value fits its kind: a PIN is 4 to 8 digits; a key or token at least
    12 characters with a letter and a digit ("tokens: 4096" is a count)."""
    value = match["value"].strip(_EDGES)
    if match["pin"]:
        return value.isdigit() and 4 <= len(value) <= 8
    if match["token"]:
        has_letter = any(ch.isalpha() for ch in value)
        return len(value) >= 12 and has_letter and any(ch.isdigit() for ch in value)
    return True


def _is_secret_value(value: str, quoted: bool) -> bool:
    """Whether a value assigned to a credential name is one: one word, not a placeholder, a
    reference (detect-secrets' heuristics) or an email address; unless quoted, holding a
    digit or a symbol, so an identifier, a path or a plain word ("the password is
    required", ``key: SecretStr``, ``secret: True``) is not taken for one."""
    from detect_secrets.filters import heuristic

    if len(value) < MIN_SECRET_CHARS or _SPACE.search(value):
        return False
    if (
        heuristic.is_templated_secret(value)
        or heuristic.is_prefixed_with_dollar_sign(value)
        or heuristic.is_sequential_string(value)
        or not any(ch.isalnum() for ch in value)
        or set(value) <= {"*", "x", "X", "."}
        or _EMAIL.fullmatch(value) is not None  # "I sent the password to bob@example.com"
    ):
        return False
    return quoted or _PASSWORD_CHAR.search(value) is not None


def _pieces(text: str) -> Iterator[tuple[int, str]]:
    """The lines of ``text`` with their offsets; a long line as overlapping windows."""
    for line in _LINE.finditer(text):
        start, end = line.span()
        if end - start <= WINDOW_CHARS:
            yield start, line.group(0)
            continue
        step = WINDOW_CHARS - OVERLAP_CHARS
        for at in range(start, end - OVERLAP_CHARS, step):
            yield at, text[at : min(at + WINDOW_CHARS, end)]


def _near(gate: re.Pattern[str], searched: str, reach: int) -> Iterator[tuple[int, int]]:
    """The spans of ``searched`` within ``reach`` characters of a ``gate`` match, overlapping
    spans joined: each character is scanned once at most, and most of a line not at all."""
    start = end = -1
    for match in gate.finditer(searched):
        if start >= 0 and match.start() - reach <= end:
            end = match.end() + reach
            continue
        if start >= 0:
            yield start, end
        start, end = max(0, match.start() - reach), match.end() + reach
    if start >= 0:
        yield start, end


def _found_in(piece: str) -> set[str]:
    """The secret values one piece holds."""
    found: set[str] = set()
    for start, end in _near(_TOKEN_GATE, piece, GATE_REACH):
        part = piece[start:end]
        for raw in _provider_values(part):
            value = raw.strip(_EDGES + " ")
            whole = re.search(re.escape(value) + _TOKEN_TAIL, part) if value else None
            found.add(whole.group(0).rstrip(_EDGES) if whole else value)
    for start, end in _near(_WORD_GATE, piece.translate(_ASCII_LOWER), GATE_REACH):
        for raw, quoted in _keyword_values(piece[start:end]):
            value = raw.strip(_EDGES)
            if _is_secret_value(value, quoted):
                found.add(value)
    # The marker is no secret: text redacted before is left as it is (idempotent).
    return {
        value for value in found if len(value) >= MIN_SECRET_CHARS and REDACTED_WORD not in value
    }


def _key_blocks(text: str) -> Iterator[tuple[int, int]]:
    position = 0
    while (start := _KEY_BLOCK.search(text, position)) is not None:
        closer = _PUTTY_END if start.group(0).startswith("PuTTY") else _KEY_BLOCK_END
        end = closer.search(text, start.end())
        position = len(text) if end is None else end.end()
        yield start.start(), position


def find_secrets(text: str, known: Iterable[str] = ()) -> Found:
    """Where ``text`` holds secrets: every private key block, and each value found in a line
    wherever that line holds it; then every copy of the first ``MAX_KNOWN`` of ``known``
    (values found before, in earlier texts of the same conversation) anywhere in ``text``."""
    spans = list(_key_blocks(text))
    values: set[str] = set()
    for offset, piece in _pieces(text):
        for value in _found_in(piece):
            values.add(value)
            at = piece.find(value)
            while at >= 0:
                spans.append((offset + at, offset + at + len(value)))
                at = piece.find(value, at + len(value))
    for value in list(dict.fromkeys(known))[:MAX_KNOWN]:
        at = text.find(value)
        while at >= 0:
            spans.append((at, at + len(value)))
            at = text.find(value, at + len(value))
    return Found(spans=_merged(spans), values=frozenset(values))


def _merged(spans: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return tuple(out)
