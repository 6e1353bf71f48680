"""Prometheus metrics of the queue and its workers, and the registry a scrape reads.

Counters live where the work is counted (``harvest.metrics``: model calls, tokens, cost,
jobs finished and their duration; here: lease recoveries and watchdog exits; the public API:
search latency). The state a scrape reads at that moment (jobs by state in the database, the
oldest pending job, queue depths in Redis) comes from ``StateCollector``, read once per
scrape; the database and the broker being up are gauges too, so an alert sees an outage.

A prefork worker's pool processes count into files (prometheus_client's multiprocess mode,
``PROMETHEUS_MULTIPROC_DIR``, set by ``gleaner worker --metrics-port``), summed per scrape.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from gleaner.store import Store

log = logging.getLogger(__name__)

LEASE_RECOVERIES = Counter(
    "gleaner_lease_recoveries",
    "Running jobs whose worker was lost, put back to pending (or failed) by the sweep.",
)
WATCHDOG_EXITS = Counter(
    "gleaner_watchdog_exits",
    "Workers the watchdog stopped because they no longer took messages.",
)


class StateCollector(Collector):
    """Jobs by state, the oldest pending job's age and the queues' depths, read per scrape."""

    def __init__(self, store: Store, broker_url: str | None, queues: tuple[str, ...]) -> None:
        self.store, self.broker_url, self.queues = store, broker_url, queues

    def collect(self) -> Iterator[Metric]:
        yield from self._database()
        if self.broker_url:
            yield from self._broker(self.broker_url)

    def _database(self) -> Iterator[Metric]:
        from datetime import UTC, datetime

        from gleaner.store import StorageFailure
        from gleaner.store.jobs import reports as job_reports

        up = GaugeMetricFamily("gleaner_database_up", "1 when the database answered the scrape.")
        try:
            with self.store.connection() as conn:
                counts = job_reports.counts(conn)
                oldest = job_reports.oldest_pending(conn)
        except StorageFailure as exc:
            log.warning("metrics: the database did not answer: %s", exc.reason)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily("gleaner_jobs", "Jobs in the database by state.", labels=["state"])
        for state, n in counts.items():
            jobs.add_metric([state], n)
        yield jobs
        age = 0.0 if oldest is None else (datetime.now(UTC) - oldest).total_seconds()
        yield GaugeMetricFamily(
            "gleaner_oldest_pending_job_seconds",
            "Age of the oldest pending job (0 when none waits).",
            value=max(age, 0.0),
        )

    def _broker(self, broker_url: str) -> Iterator[Metric]:
        import redis

        from gleaner.workers.waiting import waiting_messages

        up = GaugeMetricFamily("gleaner_broker_up", "1 when Redis answered the scrape.")
        try:
            found = waiting_messages(broker_url, self.queues, scan_limit=0, timeout=2.0)
        except redis.RedisError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        depth = GaugeMetricFamily(
            "gleaner_queue_depth", "Messages waiting on each queue.", labels=["queue"]
        )
        for queue, waiting in (found or {}).items():
            depth.add_metric([queue], waiting.length)
        yield depth


class _ThisProcess(Collector):
    """prometheus_client's default registry (this process's counters), read per scrape."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def registry_for(store: Store, broker_url: str | None) -> CollectorRegistry:
    """What a scrape reads: this process's counters (or, in multiprocess mode, every pool
    process's, summed) and the state collector. A registry of its own each time, so several
    services in one process (the tests) never register a name twice."""
    # Harvest's counters, loaded so they show at zero from the start (the public API's
    # search latency is loaded by whoever searches: the HTTP service, not a worker).
    import gleaner.harvest.metrics  # noqa: F401

    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    queues: tuple[str, ...] = ()
    if broker_url:
        from gleaner.workers.routing import QUEUES

        queues = tuple(QUEUES)
    registry.register(StateCollector(store, broker_url, queues))
    return registry


def serve(store: Store, broker_url: str | None, port: int, host: str) -> None:
    """Serve the metrics at ``http://host:port/metrics`` from a thread of this process."""
    start_http_server(port, addr=host, registry=registry_for(store, broker_url))
    log.info("metrics at http://%s:%d/metrics", host, port)
