"""The public API's Prometheus metrics: how long searches take, whichever surface asked
(Python, HTTP, MCP). Served with the rest by ``workers.metrics`` (``gleaner.scrape``)."""

from __future__ import annotations

from prometheus_client import Histogram

SEARCH_SECONDS = Histogram(
    "gleaner_search_seconds",
    "Wall time of one search, from the query to its ranked hits.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
