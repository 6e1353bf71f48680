"""Prometheus metrics: the HTTP service's /metrics (an all-owners key) and `gleaner worker
--metrics-port`, each parsed by the official client's parser; the counters move by exactly
what was done, the state is the database's and Redis's."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gleaner import Gleaner
from gleaner.service.http import create_app
from gleaner.store import Store
from tests.llm_server import LLMServer, answer, llm_server, note
from tests.samples import native
from tests.test_harvest_job import model_settings
from tests.workers_harness import Cluster, fresh_cluster, wait_for

MODEL = "openai/test-model"


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: dict[Any, float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server(answer([note("Likes green tea", body="The user likes green tea.")])) as s:
        yield s


def test_the_http_service_serves_metrics_to_an_all_owners_key(
    make_store: Any, backend: str, server: LLMServer
) -> None:
    store: Store = make_store(backend, **model_settings(server))
    gleaner = Gleaner(store=store)
    _, operator = gleaner.create_api_key(None)
    _, tenant = gleaner.create_api_key("ann")
    with TestClient(create_app(gleaner)) as client:

        def scrape() -> dict[Any, float]:
            response = client.get("/metrics", headers={"Authorization": f"Bearer {operator}"})
            assert response.status_code == 200, response.text
            assert response.headers["content-type"].startswith("text/plain")
            return samples(response.text)

        before = scrape()
        conversation = native(1, owner="ann")
        sent = client.post(
            "/v1/conversations", json=conversation, headers={"Authorization": f"Bearer {tenant}"}
        )
        assert sent.status_code == 202, sent.text
        searched = client.get(
            "/v1/owners/ann/search",
            params={"q": "tea"},
            headers={"Authorization": f"Bearer {tenant}"},
        )
        assert searched.status_code == 200
        after = scrape()

        refused = client.get("/metrics", headers={"Authorization": f"Bearer {tenant}"})
        assert (
            refused.status_code == 403 and refused.json()["error"]["reason"] == "forbidden_metrics"
        )
        assert client.get("/metrics").status_code == 401

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert value(after, "gleaner_database_up") == 1
    assert value(after, "gleaner_jobs", state="done") == 1
    assert value(after, "gleaner_jobs", state="pending") == 0
    assert moved("gleaner_model_calls_total", model=MODEL) == 1
    assert moved("gleaner_model_tokens_total", model=MODEL, kind="prompt") == 100
    assert moved("gleaner_model_tokens_total", model=MODEL, kind="completion") == 20
    assert moved("gleaner_jobs_finished_total", status="harvested") == 1
    assert moved("gleaner_job_duration_seconds_count") == 1
    assert moved("gleaner_search_seconds_count") == 1
    assert "gleaner_broker_up" not in {name for name, _ in after}  # no broker here


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def cluster(tmp_path: Any, worker_id: str) -> Iterator[Cluster]:
    yield from fresh_cluster("metrics", worker_id, tmp_path)


@pytest.mark.slow
def test_a_worker_serves_its_pools_metrics(cluster: Cluster, server: LLMServer) -> None:
    import json

    for name, setting in model_settings(server).items():
        cluster.env[f"GLEANER_{name.upper()}"] = str(setting)
    port = _free_port()
    cluster.start_worker(queues="harvest", concurrency=2, extra=["--metrics-port", str(port)])
    url = f"http://127.0.0.1:{port}/metrics"

    def scrape() -> dict[Any, float]:
        with urllib.request.urlopen(url, timeout=10) as response:
            return samples(response.read().decode())

    files = []
    for i in range(3):
        path = cluster.tmp / f"c{i}.json"
        path.write_text(json.dumps(native(i, owner="ann")))
        files.append(str(path))
    sent = cluster.gleaner("enqueue", *files)
    assert sent.returncode == 0, sent.stderr
    wait_for(lambda: value(scrape(), "gleaner_jobs", state="done") == 3, timeout=60)
    found = scrape()
    # Counted in the pool's processes, summed by the worker's scrape.
    assert value(found, "gleaner_jobs_finished_total", status="harvested") == 3
    assert value(found, "gleaner_model_calls_total", model=MODEL) == 3
    assert value(found, "gleaner_job_duration_seconds_count") == 3
    assert value(found, "gleaner_database_up") == 1 and value(found, "gleaner_broker_up") == 1
    assert value(found, "gleaner_queue_depth", queue="harvest") == 0
