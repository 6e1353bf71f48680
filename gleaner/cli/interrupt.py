"""Ctrl-C during an in-process harvest or import: the run stops between two conversations.

Python raises KeyboardInterrupt wherever the main thread happens to be. Inside a database
call SQLAlchemy then invalidates the connection, and the rollback on the way out can fail
and replace the interrupt with a database error: the loop counted it as one failed
conversation and went on, on SQLite behind a write lock nobody released ("database is
locked" for every conversation after it, for minutes). So the first Ctrl-C only asks the
run to stop, and the run stops as soon as the conversation in hand is committed (at once
with the offline harvester; after its model call with a model); a second Ctrl-C stops at
once, as before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


@contextmanager
def stop_between_conversations() -> Iterator[Callable[[], None]]:
    """A check to call after each conversation: it raises KeyboardInterrupt once Ctrl-C was
    pressed. Outside the main thread (no signal handler there) the check never raises."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    asked = threading.Event()

    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        if asked.is_set():
            raise KeyboardInterrupt
        asked.set()

    def check() -> None:
        if asked.is_set():
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, previous)
