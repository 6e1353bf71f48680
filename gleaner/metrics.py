"""The public API's Prometheus metrics: how long searches take, whichever surface asked
(Python, HTTP, MCP). Served with the rest by ``workers.metrics``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import Histogram

if TYPE_CHECKING:
    from gleaner.client import Gleaner

SEARCH_SECONDS = Histogram(
    "gleaner_search_seconds",
    "Wall time of one search, from the query to its ranked hits.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)


class Scrape:
    """The Prometheus text of one ``Gleaner``: its process's counters and the queue's state
    (``workers.metrics``), for the HTTP service's ``/metrics``."""

    def __init__(self, gleaner: Gleaner) -> None:
        from workers.metrics import registry_for

        self.registry = registry_for(gleaner.store, gleaner.settings.broker_url)

    def text(self) -> tuple[bytes, str]:
        """The exposition and its content type."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
