"""One deadline over a whole model call: connecting, waiting and reading the whole answer.

A socket timeout bounds each wait, not the call: a server that trickles its answer a byte a
second never lets one wait run out (one call lasted 474 s under a 300 s timeout). Two
means, one per kind of client:

- :class:`SocketDeadline` for a client that owns its socket (the lean client's
  ``http.client`` connection): at the deadline the socket is shut down from a timer thread,
  so whatever read is blocked on it returns at once, and the call raises ``TimeoutError``;
- :func:`call_within` for a client that does not (litellm): the call runs on a thread of
  its own and the caller stops waiting at the deadline. The abandoned call goes on until its
  server stops (litellm's per-read timeout, or the server's end), its answer discarded.

Both work in every pool: in process, a Celery prefork child (a soft time limit interrupts
the caller's wait) and ``--pool threads`` (where no time limit applies at all).
"""

from __future__ import annotations

import contextlib
import contextvars
import socket
import threading
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
        self.fired = False
        self._timer = threading.Timer(max(seconds, 0.0), self._fire)
        self._timer.daemon = True

    def __enter__(self) -> SocketDeadline:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        self.fired = True
        sock = getattr(self.connection, "sock", None)
        if sock is not None:
            # Wakes a read blocked on it, in any thread (an OSError: already closed).
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


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
