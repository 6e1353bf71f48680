"""Per-key limits of the HTTP service: requests in a moving minute and submits in progress.

Both are counted in this server process's memory (``limits``' memory storage): a server
started with ``--workers N`` allows each key N times as much, one share per process.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

# A key at its limit of submits in progress is asked to come back after this many seconds
# (a harvest takes seconds to minutes; there is no better guess of when one ends).
SUBMIT_RETRY_SECONDS = 5


class Throttled(Exception):
    """Raised when a request is over a limit: ``status`` 429 (the key's own limit) or 503
    (the server's harvest pool is full); rendered with ``Retry-After: retry_after``."""

    def __init__(self, status: int, reason: str, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message
        self.retry_after = retry_after


class KeyLimits:
    """How much each API key (by id) may ask of this process: ``per_minute`` requests in any
    moving minute (0: no limit) and ``submits`` submits in progress at once."""

    def __init__(self, per_minute: int, submits: int) -> None:
        self.per_minute, self.submits = per_minute, submits
        self._rate = RateLimitItemPerMinute(per_minute) if per_minute else None
        self._limiter: MovingWindowRateLimiter | None = None
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()

    def hit(self, key_id: str) -> None:
        """Count one request of the key; Throttled(429) past its rate."""
        if self._rate is None:
            return
        with self._lock:
            if self._limiter is None:  # its storage starts a timer thread: not before use
                self._limiter = MovingWindowRateLimiter(MemoryStorage())
            limiter = self._limiter
        if limiter.hit(self._rate, key_id):
            return
        reset = limiter.get_window_stats(self._rate, key_id).reset_time
        wait = max(1, math.ceil(reset - time.time()))
        raise Throttled(
            429,
            "rate_limited",
            f"this API key made more than {self.per_minute} requests in a minute "
            f"(GLEANER_HTTP_REQUESTS_PER_MINUTE); retry after {wait} s",
            wait,
        )

    @contextmanager
    def submitting(self, key_id: str) -> Iterator[None]:
        """Hold one of the key's submit slots while the block runs; Throttled(429) when it
        already has ``submits`` in progress."""
        with self._lock:
            if self._running[key_id] >= self.submits:
                raise Throttled(
                    429,
                    "too_many_submits",
                    f"this API key already has {self.submits} conversations being taken in "
                    "(GLEANER_HTTP_SUBMITS_PER_KEY); retry when one is done",
                    SUBMIT_RETRY_SECONDS,
                )
            self._running[key_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._running[key_id] -= 1
                if not self._running[key_id]:
                    del self._running[key_id]
