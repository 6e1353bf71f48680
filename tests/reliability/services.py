"""PostgreSQL and Redis servers the reliability suite owns, on spare ports, so it can stop,
kill and restart them under load without touching anything else on the machine.

PostgreSQL refuses to run as root: ``initdb``, ``pg_ctl`` and the server run as the
``postgres`` OS user (through ``runuser`` when the suite runs as root), with a data folder
and a socket folder in a temporary folder that user owns, trust authentication, and
``fsync=off`` (the suite tests restarts of the server process, not of the machine). Redis
runs with nothing persisted (``--save "" --appendonly no``): a restart loses every message.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

PG_USER = "postgres"
START_TIMEOUT = 60.0


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice of an ephemeral one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def pg_bin_dir() -> Path:
    """The newest installed PostgreSQL's bin folder (``/usr/lib/postgresql/N/bin``)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb is None:
        raise RuntimeError("no PostgreSQL server binaries (initdb) found")
    return Path(initdb).parent


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", PG_USER, "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class Postgres:
    """A private PostgreSQL cluster: ``start``, ``stop`` (``fast`` or ``immediate``),
    ``restart``; ``url(db)`` names a database on it."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gleaner-rel-pg-")))
    bin: Path = field(default_factory=pg_bin_dir)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def init(self) -> Postgres:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(PG_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "initdb"),
                    "-D",
                    str(self.data),
                    "-A",
                    "trust",
                    "-U",
                    PG_USER,
                    "-E",
                    "UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )
        return self

    def start(self) -> None:
        options = " ".join(
            [
                f"-p {self.port}",
                f"-k {self.root}",
                "-c listen_addresses=127.0.0.1",
                "-c fsync=off",
                "-c synchronous_commit=off",
                "-c full_page_writes=off",
                "-c max_connections=300",
                "-c shared_buffers=64MB",
            ]
        )
        subprocess.run(
            _as_postgres(
                [
                    str(self.bin / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    str(int(START_TIMEOUT)),
                    "start",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=START_TIMEOUT + 10,
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: connections cut, a clean shutdown; ``immediate``: as
        after a crash, recovered from the WAL at the next start)."""
        if not (self.data / "postmaster.pid").exists():
            return
        subprocess.run(
            _as_postgres(
                [str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]
            ),
            check=False,
            capture_output=True,
            timeout=60,
        )

    def restart(self, mode: str = "immediate") -> None:
        self.stop(mode)
        self.start()

    def running(self) -> bool:
        return port_open(self.port)

    def close(self) -> None:
        """Stop the server and remove its folder (whatever state it is in)."""
        try:
            self.stop("immediate")
        finally:
            pid_file = self.data / "postmaster.pid"
            if pid_file.exists():  # pg_ctl failed: the postmaster must not outlive the suite
                with contextlib.suppress(ValueError, OSError):
                    os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Redis:
    """A private Redis with nothing persisted and 64 databases: ``start``, ``kill``,
    ``restart`` (everything it held is lost)."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gleaner-rel-redis-")))
    proc: subprocess.Popen[bytes] | None = None

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--databases",
                "64",
                "--dir",
                str(self.root),
                "--logfile",
                str(self.root / "redis.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + START_TIMEOUT
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.1)
            raise TimeoutError("redis-server did not answer")
        finally:
            client.close()

    def kill(self) -> None:
        """kill -9: every message, waiting or unacknowledged, is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        try:
            self.kill()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
