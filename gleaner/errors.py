"""The errors of the public API, one tree whatever layer failed underneath::

    GleanerError
    ├── InvalidRequest      the input broke a rule (format, owner, type...); nothing changed
    │   └── TooLarge            over a size limit (``too_large``): the setting is named
    ├── NotFound            no such note, job or key (for this owner)
    └── Unavailable         the database or the broker failed; nothing was recorded

Each carries the ``reason`` of the error it stands for (``bad_owner``, ``bad_transcript``,
``too_large``, ``not_found``, ``storage_failure``, ...) and its message, so callers branch
on ``reason`` and show the message; ``str(error)`` is the message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from gleaner.store.errors import ReasonedError


class GleanerError(ReasonedError):
    """Raised for every failure the API reports on purpose; ``reason`` is machine-readable."""

    reason = "gleaner_error"


class InvalidRequest(GleanerError, ValueError):
    """Raised when the caller's input breaks a rule; nothing was recorded or changed."""

    reason = "invalid_request"


class TooLarge(InvalidRequest):
    """Raised when a conversation or document is over a size limit (``GLEANER_MAX_*``)."""

    reason = "too_large"


class NotFound(GleanerError, LookupError):
    """Raised when the owner holds no such note, or there is no such job or key."""

    reason = "not_found"


class Unavailable(GleanerError, RuntimeError):
    """Raised when the database or the broker failed; the unit of work was rolled back."""

    reason = "unavailable"


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise the store's and harvest's errors as this tree, keeping reason and message."""
    from gleaner.harvest.errors import HarvestError
    from gleaner.store.errors import InvalidInput, StorageFailure, StoreError
    from gleaner.store.errors import NotFound as StoreNotFound

    try:
        yield
    except GleanerError:
        raise
    except StoreNotFound as exc:
        raise NotFound(exc.message, reason=exc.reason) from exc
    except StorageFailure as exc:
        raise Unavailable(exc.message, reason=exc.reason) from exc
    except (InvalidInput, HarvestError) as exc:
        kind = TooLarge if exc.reason == "too_large" else InvalidRequest
        raise kind(exc.message, reason=exc.reason) from exc
    except StoreError as exc:  # ConfigError: a setting is bad
        raise InvalidRequest(exc.message, reason=exc.reason) from exc
