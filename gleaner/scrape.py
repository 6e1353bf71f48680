"""One Prometheus scrape of a ``Gleaner`` for the HTTP service's ``/metrics``.

Apart from ``gleaner.metrics`` (the counters the client updates), so that the client and
what reads the client do not import each other."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gleaner.client import Gleaner


class Scrape:
    """The Prometheus text of one ``Gleaner``: its process's counters and the queue's state
    (``workers.metrics``), for the HTTP service's ``/metrics``."""

    def __init__(self, gleaner: Gleaner) -> None:
        from gleaner.workers.metrics import registry_for

        self.registry = registry_for(gleaner.store, gleaner.settings.broker_url)

    def text(self) -> tuple[bytes, str]:
        """The exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
