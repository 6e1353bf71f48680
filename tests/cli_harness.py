"""The `gleaner` command run in process (``cli.main(argv)``) for tests: the
environment is the test's own (no GLEANER_* of the caller's), stdout and stderr captured.

A subprocess costs about a second of interpreter and import start-up; in process a command
costs what it does. Each command still gets its own settings, store and Celery app, as a
process would.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gleaner.cli import main

REDIS_URL = os.environ.get("GLEANER_TEST_REDIS_URL", "redis://127.0.0.1:6379")
EXAMPLES = Path(__file__).parent.parent / "examples"


@dataclass
class Ran:
    """One command's exit status and output."""

    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Cli:
    """``cli("search", "x", "--owner", "a")`` runs one command with ``env`` set."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
        self._monkeypatch = monkeypatch
        self._capsys = capsys
        for name in list(os.environ):
            if name.startswith("GLEANER_") and not name.startswith("GLEANER_TEST_"):
                monkeypatch.delenv(name)
        monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")

    def env(self, **values: str) -> None:
        for name, value in values.items():
            self._monkeypatch.setenv(name, value)

    def __call__(self, *argv: str) -> Ran:
        self._capsys.readouterr()
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse: usage errors and --help
            code = int(exc.code or 0)
        out, err = self._capsys.readouterr()
        return Ran(code, out, err)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Cli:
    monkeypatch.chdir(tmp_path)
    return Cli(monkeypatch, capsys)


def gleaner_process(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 60, **options: Any
) -> subprocess.CompletedProcess[str]:
    """The real `gleaner` command, as a subprocess with exactly ``env``'s GLEANER_* set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    if "stdout" not in options:
        options["capture_output"] = True
    return subprocess.run(
        [sys.executable, "-m", "gleaner.cli", *args],
        env={**clean, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **env},
        cwd=cwd,
        text=True,
        timeout=timeout,
        check=False,
        **options,
    )


def redis_url_for(worker_id: str) -> str:
    """The pytest-xdist worker's Redis database (``workers_harness.redis_db_for``)."""
    from tests.workers_harness import redis_db_for

    return f"{REDIS_URL}/{redis_db_for(worker_id)}"


def dead_broker_url() -> str:
    """A Redis URL on a local port where nothing listens (connections are refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"
