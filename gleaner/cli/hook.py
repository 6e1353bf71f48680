"""Coding agents' hooks: ``gleaner hook claude-code`` hands an ended session to Gleaner.

Claude Code runs a hook command with a JSON object on standard input (``session_id``,
``transcript_path``, ``cwd``, ``hook_event_name``, and for ``SessionEnd`` a ``reason``). This
command reads it and hands the session file over: queued with ``enqueue`` when
GLEANER_BROKER_URL is set (the hook returns at once), else harvested in process.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gleaner.cli.common import UsageError, add_owner_flags, current_settings

# Bounds what is read from the hook's standard input: its JSON is a few hundred bytes.
MAX_HOOK_INPUT = 1_000_000


def hook_input(raw: str) -> dict[str, Any]:
    """The hook's JSON object, with a ``transcript_path`` string; UsageError naming what is
    wrong (never quoting the input)."""
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UsageError(
            f"the hook input on standard input is not JSON ({exc.msg}); run this command "
            "as a Claude Code hook, which passes the session's details as JSON"
        ) from None
    if not isinstance(value, dict):
        raise UsageError("the hook input must be a JSON object")
    path = value.get("transcript_path")
    if not isinstance(path, str) or not path:
        raise UsageError("the hook input has no transcript_path: nothing to hand over")
    return value


def cmd_claude_code(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gleaner.cli import intake

    raw = sys.stdin.read(MAX_HOOK_INPUT) if sys.stdin is not None else ""
    details = hook_input(raw)
    transcript = str(Path(details["transcript_path"]).expanduser())
    queued = bool(current_settings().broker_url)
    forward = argparse.Namespace(
        paths=[transcript],
        owner=args.owner,
        reassign_owner=args.reassign_owner,
        json=args.json,
        provenance="compaction",
    )
    return intake.cmd_enqueue(forward) if queued else intake.cmd_harvest(forward)


def register(sub: Any) -> None:
    hook = sub.add_parser(
        "hook",
        help="run as a coding agent's hook: hand its ended session to Gleaner",
        description="Commands for agents' hooks; they read the hook's JSON on standard input.",
    )
    agents = hook.add_subparsers(dest="agent", required=True, metavar="AGENT")
    claude = agents.add_parser(
        "claude-code",
        help="a Claude Code SessionEnd hook: enqueue (or harvest) the session's transcript",
        description="Read Claude Code's hook input (JSON with transcript_path) on standard "
        "input and hand that session file over: `gleaner enqueue` when GLEANER_BROKER_URL "
        "is set, else `gleaner harvest` in process. Exit codes are theirs; 2 for hook input "
        "that is not JSON or names no transcript_path.",
    )
    add_owner_flags(claude)
    claude.add_argument("--json", action="store_true", help="print the outcome as JSON")
    claude.set_defaults(func=cmd_claude_code)
