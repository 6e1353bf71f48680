"""The store's errors.

Every error the store raises on purpose derives from :class:`StoreError` and carries a
stable, machine-readable ``reason`` beside a human message::

    ReasonedError       the root every Gleaner error shares (harvest's and the API's too)
    └── StoreError
        ├── ConfigError     a setting is invalid (also ValueError)
        ├── InvalidInput    the caller's input broke a rule; nothing was changed (also ValueError)
        │   ├── LinkRefused a link would break the supersedes rules (cycle, second superseder)
        │   └── BadExport   a line of an export file to restore is not valid; nothing restored
        ├── NotFound        the scope holds no note with that slug (also LookupError)
        ├── NoteChanged     a note a harvest would rewrite changed since it was read; none written
        └── StorageFailure  the database failed; the transaction was rolled back (RuntimeError)
            └── DataRefused the database refused a value sent (too long, NUL): again fails too
"""

from __future__ import annotations

from typing import Any


class ReasonedError(Exception):
    """The root of every error Gleaner raises on purpose: a human ``message`` (``str()``)
    and a stable, machine-readable ``reason``. Harvest's and the public API's trees derive
    from it too, so a caller catches one class and branches on ``reason``."""

    reason: str = "error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled by state, not by calling __init__ again (the default), which fails for a
        # subclass whose __init__ takes more than the message: a Celery pool child hands its
        # errors to the main process pickled.
        return (_rebuilt, (type(self), self.args, self.__dict__))


def _rebuilt(cls: type[ReasonedError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class StoreError(ReasonedError):
    """Raised for any failure the store reports on purpose."""

    reason = "store_error"


class ConfigError(StoreError, ValueError):
    """Raised when a setting (a ``GLEANER_*`` variable) holds a bad value."""

    reason = "bad_config"


class InvalidInput(StoreError, ValueError):
    """Raised when input breaks a rule; the store is unchanged and still usable."""

    reason = "invalid_input"


class LinkRefused(InvalidInput):
    """Raised when a ``supersedes`` link would form a cycle or give a note a second superseder."""

    reason = "link_refused"


class BadExport(InvalidInput):
    """Raised when a line of an export file (``store.owners.restore``) breaks the file's schema or a
    write rule, or the file is cut short; nothing was restored. ``line`` is the line's number
    (1 is the header); ``rule`` the reason of the write rule it broke, when one did."""

    reason = "bad_export"

    def __init__(self, message: str, *, line: int, rule: str | None = None) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.rule = rule


class NotFound(StoreError, LookupError):
    """Raised when a slug names no note in the scope."""

    reason = "not_found"


class StorageFailure(StoreError, RuntimeError):
    """Raised when the database fails; the unit of work was rolled back."""

    reason = "storage_failure"


class DataRefused(StorageFailure):
    """Raised when the database refused a value the unit of work sent (a DBAPI DataError: too
    long for its column, out of range, a NUL): the database is up and the same work would be
    refused again, so a worker fails the job with it instead of retrying. The transaction was
    rolled back."""

    reason = "data_refused"


def format_error(error: BaseException) -> str:
    """Render any error as one line: ``reason: message`` for errors that carry a reason.

    Harvest's errors carry ``reason`` too, so one renderer serves every package.
    """
    reason = getattr(error, "reason", None)
    if isinstance(reason, str):
        return f"{reason}: {error}"
    return f"internal_error: {type(error).__name__}: {error}"


class NoteChanged(StoreError):
    """Raised when a harvest's rewrite of a stored note finds the note, once locked, no
    longer as the harvest read it: pinned or person-written since, or holding other text
    (``store.notes.writer.Expect``). The caller rolls back and decides again on what is stored."""

    reason = "note_changed"
