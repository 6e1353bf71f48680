"""The privacy strip, the one place it is written: ``<private>...</private>`` spans and secrets
become ``[REDACTED]`` before any text is stored, hashed, sent to a model or quoted in an error.

It sits below every other package (the store, the harvest, the services), so each redacts with
the same rules; the secret detector itself is ``privacy.secrets``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gleaner.privacy.secrets import REDACTED, find_secrets

__all__ = ["REDACTED", "redact", "redact_private", "redact_secrets", "strip_private"]

# The start of a privacy tag, opening or closing, any case. What may follow is checked by hand
# (see redact_private), so no pattern ever scans ahead more than once: linear on any input.
_PRIVATE_TAG = re.compile(r"<(/?)private", re.IGNORECASE)
_SPACE = re.compile(r"\s")
_CLOSE_END = re.compile(r"\s*>")
_OPEN_END = re.compile(r"[<>]")


def strip_private(text: str) -> str:
    """Replace every ``<private>...</private>`` span, and then every secret, with
    ``[REDACTED]`` (``redact``, on a text that stands alone)."""
    return redact(text)[0]


def redact(text: str) -> tuple[str, int]:
    """``text`` with its ``<private>`` spans (redact_private) and then its secrets
    (redact_secrets) redacted, and how many secrets were."""
    kept, _ = redact_private(text)
    redacted, count, _ = redact_secrets(kept)
    return redacted, count


def redact_secrets(text: str, known: Iterable[str] = ()) -> tuple[str, int, frozenset[str]]:
    """Replace each secret in ``text`` (``privacy.secrets.find_secrets``: provider keys and
    tokens, credentials, stated passwords, private key blocks, and every copy of ``known``
    values found before) with ``[REDACTED]``: the text, how many were, and the values found,
    for the texts that follow. Linear in ``len(text)``."""
    found = find_secrets(text, known)
    if not found.spans:
        return text, 0, found.values
    out: list[str] = []
    last = 0
    for start, end in found.spans:
        out.extend((text[last:start], REDACTED))
        last = end
    out.append(text[last:])
    return "".join(out), len(found.spans), found.values


def redact_private(text: str, depth: int = 0) -> tuple[str, int]:
    """Redact the ``<private>`` spans of one piece of a stream: the text, and the depth left open.

    ``depth`` is how many spans are open where ``text`` starts (0 for a text that stands
    alone; the depth an earlier message of the same transcript left). Tags are matched in any
    case and across lines: an opening tag is ``<private>``, or ``<private`` + whitespace +
    attributes up to ``>`` (or up to a ``<``, where another tag may start); a closing tag is
    ``</private>`` with optional whitespace before ``>``. Spans nest: an opening tag adds one
    to the depth, a closing tag takes one off, and text is private while the depth is above 0,
    so the outermost span is redacted whole. Each outermost span opened in ``text`` becomes
    one ``[REDACTED]``; text that is private from the start (``depth > 0``) up to the closing
    tag leaves nothing. Fails closed: an opening tag that is never closed, or is cut off before
    its ``>``, makes the rest private, and the returned depth says so. A closing tag with no
    span open is left as text (it hides nothing). Linear in ``len(text)``.
    """
    out: list[str] = []
    kept_from = 0 if depth == 0 else None  # where the current run of visible text started
    position = 0
    while (tag := _PRIVATE_TAG.search(text, position)) is not None:
        if tag.group(1):  # </private
            after = _closing_tag_end(text, tag.end())
            if after is None:
                position = tag.end()  # "</privateer", "</private x>": not a tag
                continue
            position = after
            if depth > 0:
                depth -= 1
                if depth == 0:
                    kept_from = position
            continue
        after = _opening_tag_end(text, tag.end())
        if after is None:
            position = tag.end()  # "<privateer>", "<private/>": not a tag
            continue
        position = after
        if depth == 0 and kept_from is not None:
            out.append(text[kept_from : tag.start()])
            out.append(REDACTED)
            kept_from = None
        depth += 1
    if depth == 0 and kept_from is not None:
        out.append(text[kept_from:])
    return "".join(out), depth


def _closing_tag_end(text: str, end: int) -> int | None:
    """Where a closing tag whose ``</private`` ends at ``end`` ends (after its ``>``); None
    when it is no tag."""
    close = _CLOSE_END.match(text, end)
    return None if close is None else close.end()


def _opening_tag_end(text: str, end: int) -> int | None:
    """Where an opening tag whose ``<private`` ends at ``end`` ends; None when it is no tag.
    A tag cut off before its ``>`` runs to the end of ``text`` or the next ``<``: it opens a
    span all the same (fail closed)."""
    if end == len(text):
        return end  # "<private" cut off at the very end
    if text[end] == ">":
        return end + 1
    if not _SPACE.match(text, end):
        return None
    # Attributes run to ">"; a "<" ends them too, so a tag inside them still counts.
    stop = _OPEN_END.search(text, end)
    if stop is None:
        return len(text)
    return stop.end() if stop[0] == ">" else stop.start()
