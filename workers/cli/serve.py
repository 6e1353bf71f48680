"""Serving Gleaner to other programs (HTTP, MCP) and the keys that guard it."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """No command yet."""
