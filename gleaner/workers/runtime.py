"""The worker process's store: built once in the worker's main process, before the pool
forks, and inherited by each child with a fresh connection pool."""

from __future__ import annotations

import threading

from celery.signals import worker_init, worker_process_init

from gleaner.store import Store

_store: Store | None = None
# Under `--pool threads` the first tasks arrive together: build one Store, not one each.
_store_lock = threading.Lock()


def store() -> Store:
    """This process's Store (its own engine and connection pool, shared by its threads)."""
    global _store  # noqa: PLW0603 - one store per process, by design
    if _store is None:
        with _store_lock:
            if _store is None:
                _store = Store()
    return _store


def use(chosen: Store | None) -> Store | None:
    """Make ``chosen`` this process's store (a test's, or an embedding program's; None: built
    from the environment on next use); returns the one it replaces."""
    global _store
    with _store_lock:
        previous, _store = _store, chosen
    return previous


@worker_process_init.connect
def _fresh_engine_in_child(**_: object) -> None:
    # A forked child must not share the parent's pooled connections: drop them unclosed
    # (closing would close the parent's sockets); the child opens its own on first use. The
    # engine itself (its dialect, its compiled-statement cache) is kept.
    if _store is not None:
        _store.engine.dispose(close=False)


@worker_init.connect
def _warm_up_before_forking(**_: object) -> None:
    # Runs in the worker's main process before the pool starts, so what every child would
    # otherwise pay on its first task is paid once and inherited by every forked child,
    # including the ones that replace children: the harvest task's imports (the ORM and the
    # store's models, about 0.3 s of CPU), the engine with its database driver (psycopg's
    # import, 0.2 s), the job's compiled statements, the tokenizer file (0.2 s) and, for the
    # litellm client, litellm's import (seconds).
    import gleaner.harvest.queue  # noqa: F401 - imported for its import chain

    # The ORM's mappers and the job's statements, compiled once (about 35 ms a child).
    store().warm_up()
    settings = store().settings
    if not settings.harvest_model:
        return  # the offline harvester counts no tokens
    from gleaner.harvest.chunks import count_tokens
    from gleaner.harvest.litellm_client import litellm_call
    from gleaner.harvest.model import resolve_llm, warm_up
    from gleaner.harvest.options import ModelOptions

    if resolve_llm(ModelOptions.from_settings(settings)) is litellm_call:
        warm_up(settings.harvest_model)
    else:
        count_tokens("warm up")
