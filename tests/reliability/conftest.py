"""The reliability suite's services and records.

One PostgreSQL, one Redis and one model server for the whole session (scenarios that restart
one restart these); each scenario gets a fresh database (copied from a migrated template), a
Redis database of its own, its own workers and beat, and a fresh switchable model. What each
scenario did and found is written to a JSON file as the suite runs
(``GLEANER_RELIABILITY_JSON``, default ``<tmp>/gleaner-reliability.json``);
``python -m tests.reliability.report`` renders it as docs/RELIABILITY.md.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from gleaner.store import Store
from tests.conftest import test_settings
from tests.llm_server import LLMServer, ModelModes
from tests.reliability.report import results_path
from tests.reliability.scenario import SUITE_SETTINGS, Scenario
from tests.reliability.services import Postgres, Redis
from tests.workers_harness import Cluster, cluster_env

TEMPLATE = "rel_template"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Services:
    pg: Postgres
    redis: Redis
    model: LLMServer

    def ensure_up(self) -> None:
        """Start a server a failed scenario left stopped, so the next one runs anyway."""
        if not self.pg.running():
            self.pg.start()
        if self.redis.proc is None or self.redis.proc.poll() is not None:
            self.redis.start()


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    pg = Postgres()
    redis_server = Redis()
    model = LLMServer()
    try:
        pg.init()
        pg.start()
        redis_server.start()
        model.start()
        admin = create_engine(pg.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{TEMPLATE}"'))
        admin.dispose()
        template = Store(pg.url(TEMPLATE), settings=test_settings())
        template.migrate()
        template.dispose()
        yield Services(pg, redis_server, model)
    finally:
        model.close()
        redis_server.close()
        pg.close()


def _git(*args: str) -> str:
    out = subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=False, timeout=30
    )
    return out.stdout.strip()


class Recorder:
    """The run's JSON: rewritten after each scenario, so a partial run leaves its figures."""

    def __init__(self, path: Path, services: Services) -> None:
        self.path = path
        self.started = time.monotonic()
        self.scenarios: list[dict[str, Any]] = []
        versions = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()
        self.run = {
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "commit": _git("rev-parse", "--short", "HEAD"),
            "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "postgresql": services.pg.bin.parent.name,
                "redis": next((v.split("=")[1] for v in versions if v.startswith("v=")), "?"),
            },
            "settings": SUITE_SETTINGS,
            # The client the workers talk to the model with (GLEANER_HARVEST_LLM's default).
            "harvest_llm": test_settings().harvest_llm,
        }

    def add(self, entry: dict[str, Any]) -> None:
        self.scenarios.append(entry)
        self.write()

    def write(self) -> None:
        self.run["seconds"] = round(time.monotonic() - self.started, 1)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {"run": self.run, "scenarios": self.scenarios}
        self.path.write_text(json.dumps(data, indent=2, default=str))


@pytest.fixture(scope="session")
def recorder(services: Services) -> Iterator[Recorder]:
    found = Recorder(results_path(), services)
    yield found
    found.write()
    print(f"\nreliability figures: {found.path}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)


def _outcome(node: pytest.Item) -> str:
    report = getattr(node, "rep_call", None)
    if report is None:
        return "error"
    if hasattr(report, "wasxfail"):
        return "xfail" if report.skipped else "xpass"
    return str(report.outcome)


OpenScenario = Callable[..., Scenario]


@pytest.fixture
def open_scenario(
    request: pytest.FixtureRequest,
    services: Services,
    recorder: Recorder,
    tmp_path: Path,
) -> Iterator[OpenScenario]:
    """``open_scenario(name, title, item=None, **settings)`` -> a :class:`Scenario` on a
    fresh database and Redis database, with a fresh switchable model."""
    opened: list[Scenario] = []

    def factory(
        name: str,
        title: str,
        *,
        item: str | None = None,
        model: ModelModes | None = None,
        **settings: str,
    ) -> Scenario:
        number = len(recorder.scenarios) + len(opened) + 1
        services.ensure_up()
        database = f"rel_{number:02d}"
        admin = create_engine(services.pg.url(), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{database}" TEMPLATE "{TEMPLATE}"'))
        admin.dispose()
        url = services.pg.url(database)
        chosen = {**SUITE_SETTINGS, **settings}
        env = cluster_env(
            url,
            0,
            **chosen,
            GLEANER_HARVEST_API_BASE=services.model.api_base,
        )
        env["GLEANER_BROKER_URL"] = services.redis.url(number % 64)
        cluster = Cluster(env, tmp_path)
        cluster.redis().flushdb()
        modes = model or ModelModes()
        services.model.default = modes
        record: dict[str, Any] = {
            "name": name,
            "title": title,
            "item": item,
            "settings": settings,
        }
        scenario = Scenario(
            name=name,
            number=number,
            title=title,
            item=item,
            cluster=cluster,
            store=Store(url, settings=test_settings()),
            server=services.model,
            model=modes,
            record=record,
            requests_from=len(services.model.requests),
            settings=chosen,
        )
        opened.append(scenario)
        return scenario

    yield factory

    for scenario in opened:
        scenario.kill_all()
        scenario.record["steps"] = scenario.steps
        scenario.record["checks"] = [vars(c) for c in scenario.checks]
        scenario.record["outcome"] = _outcome(request.node)
        scenario.record.setdefault("seconds", round(time.monotonic() - scenario.started, 1))
        marker = request.node.get_closest_marker("xfail")
        if marker is not None:
            scenario.record["xfail_reason"] = marker.kwargs.get("reason", "")
        recorder.add(scenario.record)
        scenario.store.dispose()
        try:
            if services.redis.proc is not None and services.redis.proc.poll() is None:
                scenario.cluster.redis().flushdb()
        except Exception:  # a scenario that broke Redis must not hide its own failure
            pass
        services.model.default = ModelModes()
