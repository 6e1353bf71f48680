"""One deadline over a whole model call: connecting, waiting and reading the whole answer.

A socket timeout bounds each wait, not the call: a server that trickles its answer a byte a
second never lets one wait run out (one call lasted 474 s under a 300 s timeout). Two
means, one per kind of client:

- :class:`SocketDeadline` for a client that owns its socket (the lean client's
  ``http.client`` connection): at the deadline the socket is shut down from the process's
  watchdog thread, so whatever read is blocked on it returns at once, and the call raises
  ``TimeoutError``;
- :func:`call_within` for a client that does not (litellm): the call runs on a thread of
  its own and the caller stops waiting at the deadline. The abandoned call goes on until its
  server stops (litellm's per-read timeout, or the server's end), its answer discarded.

Both work in every pool: in process, a Celery prefork child (a soft time limit interrupts
the caller's wait) and ``--pool threads`` (where no time limit applies at all).
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class DeadlinePassed(TimeoutError):
    """Raised when a call did not end within its deadline (``seconds``)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the call did not end within {seconds:g} s")
        self.seconds = seconds


class SocketDeadline:
    """Shuts down ``connection``'s socket (any object with a ``sock`` attribute, read when
    the deadline comes) ``seconds`` from now, unless cancelled first; ``fired`` tells
    whether it did. Use as a context manager around the call."""

    def __init__(self, connection: Any, seconds: float) -> None:
        self.connection = connection
        self.seconds = max(seconds, 0.0)
        self.fired = False
        self.cancelled = False

    def __enter__(self) -> SocketDeadline:
        _WATCHDOG.watch(self, time.monotonic() + self.seconds)
        return self

    def __exit__(self, *exc: object) -> None:
        _WATCHDOG.forget(self)  # once this returns, ``fired`` is final

    def fire(self) -> None:
        """Shut the socket down now (the watchdog calls this at the deadline)."""
        self.fired = True
        sock = getattr(self.connection, "sock", None)
        if sock is not None:
            # Wakes a read blocked on it, in any thread (an OSError: already closed).
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Watchdog:
    """One thread per process that fires the deadlines it watches in time order (a timer
    thread started per call cost about 0.5 ms of it). Started on first use, and again in
    a forked child, which has none of its parent's threads."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._ready = threading.Condition()
        self._due: list[tuple[float, int, SocketDeadline]] = []
        self._order = itertools.count()
        self._started = False

    def watch(self, deadline: SocketDeadline, at: float) -> None:
        with self._ready:
            if not self._started:
                threading.Thread(target=self._run, name="gleaner-deadlines", daemon=True).start()
                self._started = True
            heapq.heappush(self._due, (at, next(self._order), deadline))
            if self._due[0][2] is deadline:  # due before all the others: wait less
                self._ready.notify()

    def forget(self, deadline: SocketDeadline) -> None:
        with self._ready:
            deadline.cancelled = True  # under the lock: never fired after this
            # Taken out now when it is the next due (the usual case: calls end in order);
            # else skipped when its time comes.
            while self._due and self._due[0][2].cancelled:
                heapq.heappop(self._due)

    def _run(self) -> None:
        ready = self._ready
        with ready:
            while True:
                now = time.monotonic()
                while self._due and (self._due[0][0] <= now or self._due[0][2].cancelled):
                    _, _, deadline = heapq.heappop(self._due)
                    if not deadline.cancelled:
                        deadline.fire()
                ready.wait(self._due[0][0] - now if self._due else None)


_WATCHDOG = _Watchdog()


def timeout_message(seconds: float) -> str:
    """What a model call cut off at its deadline fails with, on either client."""
    return (
        f"Timeout: the model server did not finish its answer within {seconds:g} s "
        "(GLEANER_HARVEST_TIMEOUT_SECONDS bounds the whole call)"
    )


def call_within(call: Callable[[], T], seconds: float, *, name: str = "gleaner-model-call") -> T:
    """``call()``'s result, or its exception, if it ends within ``seconds``; else
    :class:`DeadlinePassed`, the call left running on its (daemon) thread.

    The call runs in a copy of the caller's context. A signal's exception raised in the
    waiting thread (a soft time limit) goes through at once.
    """
    outcome: list[tuple[bool, Any]] = []
    done = threading.Event()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            outcome.append((True, context.run(call)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, raised there
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not done.wait(seconds):
        raise DeadlinePassed(seconds)
    ok, value = outcome[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value
