"""A PostgreSQL server cut off without a word (its network gone, nothing closed) is noticed by
both sides in about a minute, not TCP's two hours: the store's call waiting on it fails with
a StorageFailure, and the server ends the session that held a transcript lock, so the lock is
free for the worker that picks the job up again.

The server runs in a network namespace of its own, reached over a veth pair; taking its end
of the pair down drops every packet in silence, as a powered-off host or a cut cable would.
Needs root and ``ip netns`` (skipped without them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from gleaner.store import Scope, StorageFailure, Store
from tests.conftest import test_settings
from tests.reliability.services import PG_USER, pg_bin_dir

pytestmark = pytest.mark.slow

# Gleaner's keepalives give up after 30 s idle + 3 probes 10 s apart; the checks allow a
# loaded machine half a minute more, and TCP's own default (2 hours) fails them by far.
NOTICED_WITHIN = 90.0


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@dataclass
class CutOffServer:
    """A private PostgreSQL listening on ``host`` inside the network namespace ``namespace``;
    ``admin`` reaches it through its Unix socket, which no cut touches."""

    namespace: str
    inner: str  # the namespace's end of the veth pair
    host: str
    root: Path

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@{self.host}:5432/postgres"

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(f"host={self.root} user=postgres dbname=postgres", autocommit=True)

    def cut(self) -> None:
        run("ip", "netns", "exec", self.namespace, "ip", "link", "set", self.inner, "down")


@pytest.fixture
def server() -> Iterator[CutOffServer]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("runuser") is None:
        pytest.skip("needs root, ip (iproute2) and runuser to build a network namespace")
    tag = os.getpid() % 100_000
    namespace, outer, inner = f"gleaner-cut-{tag}", f"glc{tag}h", f"glc{tag}n"
    subnet = f"10.{200 + tag % 50}.{tag % 250}"
    root = Path(tempfile.mkdtemp(prefix="gleaner-cut-pg-"))
    shutil.chown(root, PG_USER, PG_USER)
    pg = pg_bin_dir()
    as_pg = ["runuser", "-u", PG_USER, "--"]
    in_ns = ["ip", "netns", "exec", namespace]
    try:
        run("ip", "netns", "add", namespace)
        run("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        run("ip", "link", "set", inner, "netns", namespace)
        run("ip", "addr", "add", f"{subnet}.1/30", "dev", outer)
        run("ip", "link", "set", outer, "up")
        run(*in_ns, "ip", "addr", "add", f"{subnet}.2/30", "dev", inner)
        run(*in_ns, "ip", "link", "set", inner, "up")
        run(*as_pg, str(pg / "initdb"), "-D", str(root / "data"), "-A", "trust", "-U", PG_USER)
        with (root / "data" / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {subnet}.0/30 trust\n")
        options = f"-c listen_addresses={subnet}.2 -c unix_socket_directories={root} -c fsync=off"
        log = str(root / "log")
        pg_ctl = [str(pg / "pg_ctl"), "-D", str(root / "data"), "-o", options, "-l", log]
        run(*in_ns, *as_pg, *pg_ctl, "-w", "start")
        yield CutOffServer(namespace, inner, f"{subnet}.2", root)
    finally:
        subprocess.run(
            [*as_pg, str(pg / "pg_ctl"), "-D", str(root / "data"), "-m", "immediate", "stop"],
            capture_output=True,
            check=False,
        )
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", outer], capture_output=True, check=False)
        shutil.rmtree(root, ignore_errors=True)


def test_a_server_cut_off_is_noticed_by_the_waiting_call_and_frees_the_lock(
    server: CutOffServer,
) -> None:
    store = Store(server.url, settings=test_settings())
    lock = store.transcript_lock(Scope(kind="owner", id="ada"), "f" * 64)
    assert lock.try_acquire()
    failed_after: list[float] = []

    def wait_on_the_server() -> None:
        started = time.monotonic()
        with pytest.raises(StorageFailure, match="timed out"), store.transaction() as session:
            session.execute(text("SELECT pg_sleep(600)"))
        failed_after.append(time.monotonic() - started)

    waiting = threading.Thread(target=wait_on_the_server, daemon=True)
    waiting.start()
    with server.admin() as admin:
        advisory = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'"
        while admin.execute(sleeping).fetchone() != (1,):
            time.sleep(0.05)
        assert admin.execute(advisory).fetchone() == (1,)
        server.cut()
        cut = time.monotonic()
        while admin.execute(advisory).fetchone() != (0,):
            assert time.monotonic() - cut < NOTICED_WITHIN, "the server still holds the lock"
            time.sleep(0.5)
        freed_after = time.monotonic() - cut
    waiting.join(NOTICED_WITHIN - (time.monotonic() - cut))
    assert not waiting.is_alive(), "the call still waits on the server"
    assert failed_after and failed_after[0] < NOTICED_WITHIN + 1
    assert freed_after < NOTICED_WITHIN
    store.dispose()
