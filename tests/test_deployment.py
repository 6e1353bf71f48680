"""The beat schedule and docker-compose.yml point at things that exist."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import yaml

from tests.conftest import test_settings
from workers.app import QUEUES, ROUTES, make_celery
from workers.cli import build_parser

ROOT = Path(__file__).parent.parent


def test_beat_schedule_names_registered_tasks_routed_to_housekeeping() -> None:
    import beat_schedule
    from workers import tasks

    settings = test_settings(broker_url="redis://127.0.0.1:6379/15")
    app = make_celery(settings)
    entries = beat_schedule.schedule(settings)
    assert set(entries) == {"decay", "dedupe", "requeue-stale-jobs"}
    for entry in entries.values():
        assert entry["task"] in app.tasks
        assert ROUTES[entry["task"]]["queue"] == "housekeeping"
        assert isinstance(entry["schedule"], timedelta)
    assert entries["decay"]["task"] == tasks.decay.name
    assert entries["dedupe"]["task"] == tasks.dedupe.name
    assert app.conf.beat_schedule == entries


def test_celery_settings_are_the_reliable_ones() -> None:
    settings = test_settings(broker_url="redis://127.0.0.1:6379/15")
    conf = make_celery(settings).conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    assert conf.accept_content == ["json"] and conf.task_serializer == "json"
    assert conf.task_soft_time_limit < conf.task_time_limit
    assert conf.task_time_limit < conf.broker_transport_options["visibility_timeout"]
    assert conf.broker_transport_options["queue_order_strategy"] == "priority"
    assert [q.name for q in conf.task_queues] == list(QUEUES)
    assert conf.worker_max_tasks_per_child == settings.worker_max_tasks_per_child


def test_every_compose_command_is_a_gleaner_command() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"redis", "postgres", "migrate", "harvest-worker", "import-worker", "beat"} <= set(
        services
    )
    assert "noeviction" in services["redis"]["command"]
    parser = build_parser()
    gleaner_services = [s for s in services.values() if "gleaner" in str(s.get("command"))]
    assert len(gleaner_services) == 4
    for service in gleaner_services:
        command = service["command"]
        assert command[0] == "gleaner"
        args = parser.parse_args(command[1:])  # exits (SystemExit) on an unknown command
        assert callable(args.func)
        env = service["environment"]
        assert env["GLEANER_BROKER_URL"].startswith("redis://")
        assert env["GLEANER_DATABASE_URL"].startswith("postgresql+psycopg://")
    for name in ("redis", "postgres"):
        assert "healthcheck" in services[name]
    worker_queues = [
        s["command"][s["command"].index("--queues") + 1]
        for s in services.values()
        if "worker" in s.get("command", [])
    ]
    assert worker_queues == ["harvest", "housekeeping,import"]
