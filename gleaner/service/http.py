"""``gleaner serve``: the public Python API over HTTP (FastAPI, served by uvicorn).

Here the app factory; the routes are in ``service.http_routes``, the error mapping in
``service.http_errors``, the path and body readers in ``service.http_paths`` and
``service.http_body``.

Every route calls :class:`gleaner.Gleaner` and adds no rule of its own; the key in
``Authorization: Bearer`` decides which owners a request may act for. Errors are JSON,
``{"error": {"reason": ..., "message": ...}}``, and a refused request changes nothing:

    401 no key, or an unknown or revoked one      403 the key is not allowed that owner,
                                                  or is read-only and the route writes
    400 the body is no conversation we can read  413 over a size limit
    422 a bad owner, parameter or note type      404 no such note, job or conversation
    408 the body did not arrive in time           429 over the key's rate or submits
    503 the database or the broker is down, or the harvest pool is full

429 and 503 for a limit carry ``Retry-After`` (seconds).
"""

from __future__ import annotations

from fastapi import FastAPI

from gleaner import Gleaner
from gleaner.service.harvest_pool import HarvestPool
from gleaner.service.http_errors import ERRORS, install_error_handlers
from gleaner.service.http_paths import OwnerSegment
from gleaner.service.http_routes import router
from gleaner.service.limits import KeyLimits


def create_app(gleaner: Gleaner) -> FastAPI:
    """The service for one ``Gleaner`` (its database, its broker or none)."""
    app = FastAPI(
        title="Gleaner",
        version="1",
        summary="Finished conversations in, durable notes out.",
        responses=ERRORS,
    )
    app.state.gleaner = gleaner
    app.state.metrics = None
    settings = gleaner.settings
    app.state.key_limits = KeyLimits(
        settings.http_requests_per_minute, settings.http_submits_per_key
    )
    app.state.harvest_pool = HarvestPool(settings.http_harvest_threads, settings.http_harvest_queue)
    app.add_middleware(OwnerSegment)
    install_error_handlers(app)
    app.include_router(router)
    return app


def from_environment() -> FastAPI:
    """The app on the ``GLEANER_*`` environment (``uvicorn --factory service.http:...``)."""
    return create_app(Gleaner())
