"""The worker process's store: built once per process, rebuilt in each forked child."""

from __future__ import annotations

from celery.signals import worker_process_init

from store import Store

_store: Store | None = None


def store() -> Store:
    """This process's Store (its own engine and small connection pool)."""
    global _store  # noqa: PLW0603 - one store per process, by design
    if _store is None:
        _store = Store()
    return _store


@worker_process_init.connect
def _fresh_engine_in_child(**_: object) -> None:
    # A forked child must not share the parent's pooled connections: drop them unclosed
    # (closing would close the parent's sockets) and let the child open its own.
    global _store  # noqa: PLW0603
    if _store is not None:
        _store.engine.dispose(close=False)
    _store = None
