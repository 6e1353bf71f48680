"""Reading and tending notes from the shell."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """No command yet."""
