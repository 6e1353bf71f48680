"""Token counting and chunking: a transcript's rendered messages packed into chunks of at most
a budget of cl100k tokens (one model request each), counted without ever tokenizing more than
a bounded piece of text at once.

The tokenizer is tiktoken's cl100k_base from the file litellm bundles (:func:`cl100k`), never
downloaded; without it, counts fall back to an estimate from UTF-8 bytes. Every public
function takes another ``encoding`` (any :class:`Encoding`): the seam tests use.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import math
import os
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Protocol

_CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


class Encoding(Protocol):
    """What chunking asks of a tokenizer (tiktoken's ``Encoding`` is one)."""

    def encode(self, text: str, *, disallowed_special: Collection[str]) -> list[int]: ...

    def decode_with_offsets(self, tokens: list[int]) -> tuple[str, list[int]]: ...


@functools.cache
def cl100k() -> Encoding | None:
    """cl100k_base if its file is on disk, else None (and counts fall back to an estimate).

    tiktoken downloads a missing file with no timeout, which could hang an offline worker,
    so it is only asked when the cached copy exists: the one litellm bundles, unless
    TIKTOKEN_CACHE_DIR points elsewhere.
    """
    try:
        import tiktoken
    except ImportError:
        return None
    key = hashlib.sha1(_CL100K_URL.encode(), usedforsecurity=False).hexdigest()
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR")
    if cache_dir is None:
        bundled = _litellm_tokenizer_dir()
        if bundled is not None and (bundled / key).exists():
            # The same default litellm sets when it is imported.
            os.environ["TIKTOKEN_CACHE_DIR"] = cache_dir = str(bundled)
    if not cache_dir or not (Path(cache_dir) / key).exists():
        return None
    try:
        return tiktoken.get_encoding("cl100k_base")
    except (OSError, ValueError):
        return None


def _litellm_tokenizer_dir() -> Path | None:
    spec = importlib.util.find_spec("litellm")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent / "litellm_core_utils" / "tokenizers"


# The tokenizer never sees more than this many characters at once: BPE over one unbroken run
# costs ~50 bytes of memory per character and more than linear time (a 64 MB "word" killed a
# worker), so text is cut into pieces first (see ``_pieces``).
PIECE_CHARS = 4_096


def _pieces(text: str) -> Iterator[str]:
    """``text`` in pieces of at most PIECE_CHARS characters, cut where it changes no token.

    A cut goes just before a space that follows a non-space character: every cl100k
    pre-token ends there (none crosses it), so the pieces' tokens are exactly the text's.
    Only a window with no such space (an unbroken run of PIECE_CHARS / 2 characters or more)
    is cut hard, which may shift a token or two at the cut.
    """
    start = 0
    while len(text) - start > PIECE_CHARS:
        window_end = start + PIECE_CHARS
        floor = start + PIECE_CHARS // 2
        cut = text.rfind(" ", floor, window_end)
        while cut > floor and text[cut - 1].isspace():
            cut = text.rfind(" ", floor, cut)
        if cut < floor or text[cut - 1].isspace():
            cut = window_end
        yield text[start:cut]
        start = cut
    yield text[start:]


def _tokenizer(encoding: Encoding | None) -> Encoding | None:
    """The encoding a caller passed, else cl100k (None when its file is missing: estimate)."""
    return cl100k() if encoding is None else encoding


def count_tokens(text: str, encoding: Encoding | None = None) -> int:
    """cl100k_base (or ``encoding``) tokens in ``text``, counted a bounded piece at a time
    (``_pieces``), so memory stays flat whatever the text; without the tokenizer, UTF-8
    bytes / 3 (an overcount for English, about right for CJK — erring toward smaller
    chunks)."""
    return _count(text, _tokenizer(encoding))


def _count(text: str, encoding: Encoding | None) -> int:
    if encoding is None:
        return math.ceil(len(text.encode("utf-8", "surrogatepass")) / 3)
    return sum(len(encoding.encode(piece, disallowed_special=())) for piece in _pieces(text))


def _token_starts(encoding: Encoding, piece: str) -> list[int]:
    """Where in ``piece`` each of its tokens starts; a piece that does not round-trip (lone
    surrogates) counts each character as its UTF-8 bytes, an overcount that never overflows."""
    tokens = encoding.encode(piece, disallowed_special=())
    try:
        decoded, offsets = encoding.decode_with_offsets(tokens)
    except UnicodeDecodeError:
        decoded, offsets = "", []
    if decoded == piece:
        return list(offsets)
    starts: list[int] = []
    for index, char in enumerate(piece):
        starts += [index] * len(char.encode("utf-8", "surrogatepass"))
    return starts


def _slice_text(text: str, budget: int, encoding: Encoding | None) -> list[tuple[str, int]]:
    """Cut one over-long block into pieces of at most ``budget`` tokens, at token bounds;
    each piece with its tokens (``encoding`` None: estimated).

    Tokenized a bounded piece at a time (``_pieces``), so a block of any length, an unbroken
    word included, is cut without holding more than one piece's tokens.
    """
    cuts, sizes = [0], []
    used = 0
    if encoding is not None:
        base = 0
        for piece in _pieces(text):
            for start in _token_starts(encoding, piece):
                if used == budget:
                    cuts.append(base + start)
                    sizes.append(used)
                    used = 0
                used += 1
            base += len(piece)
    else:
        for index, char in enumerate(text):
            size = len(char.encode("utf-8", "surrogatepass"))
            if used + size > budget * 3 and index > cuts[-1]:
                cuts.append(index)
                sizes.append(math.ceil(used / 3))
                used = 0
            used += size
        used = math.ceil(used / 3)
    cuts.append(len(text))
    sizes.append(used)
    return [
        (text[a:b], size)
        for (a, b), size in zip(itertools.pairwise(cuts), sizes, strict=True)
        if a < b
    ]


def _packed(blocks: list[str], budget: int, encoding: Encoding | None) -> Iterator[tuple[str, int]]:
    """The chunks of :func:`pack_chunks`, each with its tokens as packing counted them (each
    block once, plus one per joining newline); ``encoding`` None: estimated."""
    if _fits(blocks, budget):
        if blocks:
            text = "\n".join(blocks)
            yield text, _count(text, encoding)
        return
    current: list[str] = []
    used = 0
    for block in blocks:
        cost = _count(block, encoding) + 1  # +1 for the joining newline
        if cost > budget:
            if current:
                yield "\n".join(current), used
                current, used = [], 0
            yield from _slice_text(block, budget, encoding)
            continue
        if current and used + cost > budget:
            yield "\n".join(current), used
            current, used = [], 0
        current.append(block)
        used += cost
    if current:
        yield "\n".join(current), used


def _fits(blocks: list[str], budget: int) -> bool:
    """True when the blocks joined fit in ``budget`` tokens without counting them: a token
    is at least one UTF-8 byte, so text of at most ``budget`` bytes fits."""
    return sum(len(b.encode("utf-8", "surrogatepass")) + 1 for b in blocks) <= budget


def pack_chunks(blocks: Iterable[str], budget: int, encoding: Encoding | None = None) -> list[str]:
    """Join blocks with newlines into chunks of at most ``budget`` tokens (cl100k, or
    ``encoding``), in order.

    A block over the budget on its own (a long line, an unbroken word) is cut at token
    boundaries; nothing tokenizes more than PIECE_CHARS characters at once.
    """
    listed = list(blocks)
    if _fits(listed, budget):  # the usual short transcript: one chunk, never tokenized
        return ["\n".join(listed)] if listed else []
    return [text for text, _ in _packed(listed, budget, _tokenizer(encoding))]


def chunk_sizes(blocks: Iterable[str], budget: int, encoding: Encoding | None = None) -> list[int]:
    """The tokens of each chunk :func:`pack_chunks` makes of ``blocks`` (one model request
    each), tokenizing every block once: what estimates count."""
    return [tokens for _, tokens in _packed(list(blocks), budget, _tokenizer(encoding))]
