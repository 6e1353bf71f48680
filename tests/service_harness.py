"""Real service processes for tests: `gleaner serve` (uvicorn) and `gleaner mcp` on a free
port, started with the test's own database, stopped by pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

READY_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def service_env(database_url: str, **extra: str) -> dict[str, str]:
    """The process environment: the caller's minus every GLEANER_* variable, plus these."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    return {
        **base,
        "GLEANER_DATABASE_URL": database_url,
        "GLEANER_DB_POOL_SIZE": "2",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **extra,
    }


@dataclass
class Service:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start(args: list[str], env: dict[str, str], log: Path, url: str, ready_path: str) -> Service:
    """Start ``gleaner ARGS`` and wait until ``url + ready_path`` answers over HTTP."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "gleaner.cli", *args],
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    service = Service(proc, log, url)
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gleaner {args[0]} exited: {service.text()}")
        try:
            httpx.get(url + ready_path, timeout=1.0)
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        return service
    service.stop()
    raise TimeoutError(f"gleaner {args[0]} did not answer within {READY_TIMEOUT} s")


def start_http(database_url: str, tmp: Path, **env: str) -> Service:
    port = free_port()
    return start(
        ["serve", "--port", str(port), "--log-level", "warning"],
        service_env(database_url, **env),
        tmp / f"serve-{port}.log",
        f"http://127.0.0.1:{port}",
        "/healthz",
    )
