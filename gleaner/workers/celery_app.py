"""The Celery app built from the ``GLEANER_*`` environment, for Celery's own tools.

``celery -A gleaner.workers.celery_app inspect ping`` (or ``stats``, ``events``, Flower) finds
``app`` here. Importing this module reads the settings (and any ``_FILE`` secret they name) but
connects to nothing; Gleaner's own code calls :func:`workers.app.make_celery` instead.
"""

from __future__ import annotations

from gleaner.store import load_settings
from gleaner.workers.app import make_celery

app = make_celery(load_settings())

__all__ = ["app"]
