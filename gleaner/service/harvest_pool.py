"""The HTTP service's harvest pool: a submitted body is read, and harvested in process (no
broker) or queued, on threads of their own, so a slow model holds these and never the
threads that answer requests, and the pool's size bounds how many bodies are parsed at once.

The pool takes ``threads`` submits at once and lets ``queue`` more wait; one more is refused
at once (503 with Retry-After) rather than left to wait without a bound.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gleaner.service.limits import Throttled

T = TypeVar("T")

# A full pool is asked to be retried after this many seconds (a harvest takes seconds to
# minutes: long enough for some to end, short enough for a client to keep its work).
FULL_RETRY_SECONDS = 10


class HarvestPool:
    """``threads`` harvesting threads and at most ``queue`` submits waiting for one."""

    def __init__(self, threads: int, queue: int) -> None:
        self.threads, self.queue = threads, queue
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._taken = 0  # running plus waiting

    @property
    def taken(self) -> int:
        """Submits running or waiting now."""
        with self._lock:
            return self._taken

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` on a pool thread, awaited; Throttled(503) when the pool is full."""
        with self._lock:
            if self._taken >= self.threads + self.queue:
                raise Throttled(
                    503,
                    "harvest_pool_full",
                    f"the server is harvesting {self.threads} conversations with {self.queue} "
                    "waiting (GLEANER_HTTP_HARVEST_THREADS, GLEANER_HTTP_HARVEST_QUEUE); "
                    "retry later",
                    FULL_RETRY_SECONDS,
                )
            if self._executor is None:  # threads start on the first submit, not at import
                self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="harvest")
            executor = self._executor
            self._taken += 1
        try:
            # A client that goes away does not stop the harvest: the job is recorded and
            # runs to its end (shield), and the slot is given back only then.
            future = asyncio.wrap_future(executor.submit(work))
            future.add_done_callback(self._done)
        except BaseException:
            self._release()
            raise
        return await asyncio.shield(future)

    def _done(self, future: asyncio.Future[T]) -> None:
        self._release()
        if not future.cancelled():
            # Retrieved here: when its client is gone nobody awaits it, and asyncio would
            # log the error as never retrieved.
            future.exception()

    def _release(self) -> None:
        with self._lock:
            self._taken -= 1
