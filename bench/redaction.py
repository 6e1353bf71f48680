"""Redaction on hostile input: README says it reads the text once, so its time grows linearly
however hostile the input. Each hostile shape (floods of cut-off or unclosed tags) is timed
against benign prose of the same size, and against itself at a quarter of the size."""

from __future__ import annotations

import time

from bench.core import Context, Row
from gleaner.harvest.redact import redact_text

NAME = "redaction"
BENIGN = "I prefer tabs over spaces in every repo, and we ship on Fridays after the smoke run. "
# The shapes a hostile transcript may take. Index-tag shapes are as light to read as prose once
# redaction is linear (the first opener with no ">" ends the search). Floods of "<" and of
# <private> tags are read tag by tag (a regex attempt at each "<", a Python step at each tag),
# so they are held to linear growth, not to prose.
HOSTILE = {
    "index openers, no `>`": ("<gleaner-memory-index ", True),
    "index opener, `>`, never closed": ("<gleaner-memory-index>" + BENIGN, True),
    "`<` flood": ("<", False),
    "<private> openers with attributes, no `>`": ("<private ", False),
    "unclosed <private> openers": ("<private>", False),
    "stray </private> closers": ("</private ", False),
    # Secret detection (privacy.secrets) scans only near a credential word or a long token:
    # text made of nothing else is its worst case.
    "credential-word flood (`password: `)": ("password: ", False),
    "token-shaped words": ("Zq8Lr2Vx9Kp4Ws6Ty1N ", False),
}
TARGET_VS_BENIGN = 3.0
# Four times the text may take at most this times four the time: quadratic would be 4, and
# caches make the larger text a little slower per byte even when linear.
TARGET_GROWTH = 2.0
RUNS = 7


def fill(unit: str, size: int) -> str:
    """``unit`` repeated to exactly ``size`` characters."""
    return (unit * (size // len(unit) + 1))[:size]


def best_time(text: str) -> float:
    """The fastest of a few runs of redact_text on ``text``, in seconds."""
    best = float("inf")
    for _ in range(RUNS):
        start = time.perf_counter()
        redact_text(text)
        best = min(best, time.perf_counter() - start)
    return best


def run(ctx: Context) -> None:
    size = ctx.size(4_000_000, 1_000_000)
    mb = f"{size / 1e6:g} MB"
    benign = best_time(fill(BENIGN, size))
    ctx.add(Row(NAME, f"redact_text, benign prose, {mb}", benign * 1000, "ms"))
    for label, (unit, like_prose) in HOSTILE.items():
        hostile = best_time(fill(unit, size))
        quarter = best_time(fill(unit, size // 4))
        if like_prose:
            ctx.add(
                Row(
                    NAME,
                    f"{label}, {mb}",
                    hostile * 1000,
                    "ms",
                    ceiling=benign * 1000,
                    target=f"<= {TARGET_VS_BENIGN:g}x benign",
                    met=hostile <= TARGET_VS_BENIGN * benign,
                    note="ceiling: benign prose of the same size",
                )
            )
        else:
            ctx.add(Row(NAME, f"{label}, {mb}", hostile * 1000, "ms", note="vs benign: no target"))
        ctx.add(
            Row(
                NAME,
                f"  growth from {size // 4 / 1e6:g} MB to {mb}",
                hostile * 1000,
                "ms",
                ceiling=quarter * 4 * 1000,
                target=f"<= {TARGET_GROWTH:g}x linear",
                met=hostile <= TARGET_GROWTH * 4 * quarter,
                note="ceiling: 4 x the time on a quarter of the text (quadratic would be 4x)",
            )
        )
