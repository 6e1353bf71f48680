"""The beat schedule, docker-compose.yml, the Dockerfile and .dockerignore, checked without
Docker: the compose file against the Compose spec's JSON schema, every command it runs
against gleaner's parser (or run for real against the local PostgreSQL and Redis), the stop
grace period against the time limits, the image's user, the build context.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gleaner.cli import build_parser
from gleaner.store import Settings, Store
from gleaner.workers.app import QUEUES, ROUTES, make_celery
from tests.conftest import PG_BASE_URL, head_revision, pg_url_for, test_settings

ROOT = Path(__file__).parent.parent
COMPOSE_SPEC = Path(__file__).parent / "data" / "compose-spec.json"
# compose-spec/compose-spec, schema/compose-spec.json at this commit (see the ORIGIN file).
COMPOSE_SPEC_COMMIT = "170098ba07d9f53c383a41bfd4c5166b0a4529a6"
COMPOSE_SPEC_SHA256 = "1f91e091f16b2dd50ab8860e02bb391d22df553d91c145eacedb1b6eff9c3f0e"
GLEANER_SERVICES = ("migrate", "harvest-worker", "import-worker", "beat", "gleaner")
WORKERS = ("harvest-worker", "import-worker")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def seconds(duration: str) -> float:
    """A Compose duration (``1m30s``, ``17m``, ``90s``) in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def secret_env(service: dict[str, Any]) -> dict[str, str]:
    """The service's environment with /run/secrets/<name> read from the checkout's file."""
    files = {name: ROOT / interpolated(spec["file"]) for name, spec in compose()["secrets"].items()}
    env = {}
    for key, raw in service["environment"].items():
        value = interpolated(str(raw))
        if value.startswith("/run/secrets/"):
            name = value.removeprefix("/run/secrets/")
            assert name in service.get("secrets", []), (key, name)
            value = str(files[name])
        env[key] = value
    return env


def interpolated(path: str) -> str:
    return re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", path)


def test_beat_schedule_names_registered_tasks_routed_to_housekeeping() -> None:
    from gleaner import beat_schedule
    from gleaner.workers import housekeeping

    settings = test_settings(broker_url="redis://127.0.0.1:6379/15")
    app = make_celery(settings)
    entries = beat_schedule.schedule(settings)
    assert set(entries) == {"decay", "dedupe", "requeue-stale-jobs"}
    for entry in entries.values():
        assert entry["task"] in app.tasks
        assert ROUTES[entry["task"]]["queue"] == "housekeeping"
        assert isinstance(entry["schedule"], timedelta)
        assert entry["options"] == {"time_limit": None, "soft_time_limit": None}  # the worker's
    assert entries["decay"]["task"] == housekeeping.decay.name
    assert entries["dedupe"]["task"] == housekeeping.dedupe.name
    # As README's "Housekeeping" says: decay hourly, dedupe every 10 minutes.
    assert entries["decay"]["schedule"] == timedelta(hours=1)
    assert entries["dedupe"]["schedule"] == timedelta(minutes=10)
    assert app.conf.beat_schedule == entries


def test_with_an_embedding_model_beat_sweeps_pending_vectors_on_the_embed_queue() -> None:
    from gleaner import beat_schedule
    from gleaner.workers import tasks

    settings = test_settings(broker_url="redis://127.0.0.1:6379/15", embed_model="openai/e")
    entries = beat_schedule.schedule(settings)
    sweep = entries["embed-sweep"]
    assert sweep["task"] == tasks.embed_sweep.name in make_celery(settings).tasks
    assert ROUTES[sweep["task"]]["queue"] == ROUTES[tasks.embed.name]["queue"] == "embed"
    assert sweep["schedule"] == timedelta(minutes=5)


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
    assert conf.worker_max_memory_per_child == settings.worker_max_memory_per_child * 1024
    unbounded = make_celery(test_settings(worker_max_memory_per_child=0)).conf
    assert unbounded.worker_max_memory_per_child is None
    assert not conf.worker_send_task_events
    events = make_celery(test_settings(task_events=True)).conf
    assert events.worker_send_task_events and events.task_send_sent_event


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    raw = COMPOSE_SPEC.read_bytes()
    assert hashlib.sha256(raw).hexdigest() == COMPOSE_SPEC_SHA256
    assert COMPOSE_SPEC_COMMIT in (COMPOSE_SPEC.parent / "compose-spec.ORIGIN.md").read_text()
    schema = json.loads(raw)
    jsonschema.Draft7Validator.check_schema(schema)
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []
    # The schema bites: a misspelt key is refused.
    broken = compose()
    broken["services"]["beat"]["stop_grace_periode"] = "1m"
    assert not validator.is_valid(broken)


def test_every_gleaner_command_in_compose_parses() -> None:
    services = compose()["services"]
    assert {"redis", "postgres", *GLEANER_SERVICES, "flower"} <= set(services)
    assert "noeviction" in services["redis"]["command"]
    parser = build_parser()
    for name in GLEANER_SERVICES:
        service = services[name]
        command = [*service.get("entrypoint", []), *service["command"]]
        if command[:2] == ["sh", "-c"]:
            command = shlex.split(command[2].split("&&")[0].split("do", 1)[1])
        assert command[0] == "gleaner", name
        args, extra = parser.parse_known_args(command[1:])
        assert callable(args.func)
        assert extra == [], (name, extra)
    worker_queues = [services[name]["command"][3] for name in WORKERS]
    assert worker_queues == ["harvest", "housekeeping,embed,import"]
    assert services["gleaner"]["profiles"] == ["cli"]
    assert services["flower"]["profiles"] == ["flower"]


def test_compose_settings_load_from_the_secret_files() -> None:
    services = compose()["services"]
    names = ("GLEANER_DATABASE_URL", "GLEANER_BROKER_URL", "GLEANER_HARVEST_API_KEY")
    for name in GLEANER_SERVICES:
        env = secret_env(services[name])
        for variable in names:
            assert variable not in env, "credentials come from files only"
            assert f"{variable}_FILE" in env
        settings = Settings(
            _env_prefix="GLEANER_TEST_UNUSED_",  # type: ignore[call-arg]
            database_url=Path(env["GLEANER_DATABASE_URL_FILE"]).read_text().strip(),
            broker_url=Path(env["GLEANER_BROKER_URL_FILE"]).read_text().strip(),
        )
        assert settings.database_url.startswith("postgresql+psycopg://")
        assert settings.broker_url is not None and settings.broker_url.startswith("redis://")
        assert settings.task_events is False and env["GLEANER_TASK_EVENTS"] == "true"
    # Every secret's file is in the checkout, so the stack comes up on a fresh clone.
    for spec in compose()["secrets"].values():
        assert (ROOT / interpolated(spec["file"])).is_file(), spec
    # The database URL's password is the one PostgreSQL is created with.
    postgres = services["postgres"]
    password_file = ROOT / compose()["secrets"]["postgres_password"]["file"]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert "POSTGRES_PASSWORD" not in postgres["environment"]
    url = (ROOT / "secrets" / "database_url").read_text().strip()
    assert f":{password_file.read_text().strip()}@postgres:5432/" in url
    flower_broker = services["flower"]["command"][1].removeprefix("--broker=")
    assert flower_broker == (ROOT / "secrets" / "broker_url").read_text().strip()


def test_healthchecks_are_real_commands_that_pass_here() -> None:
    """The redis and postgres checks, run against the local servers (pg_isready checks
    reachability over TCP, not credentials); the gleaner ones parse as `gleaner health`."""
    services = compose()["services"]
    for name in ("redis", "postgres"):
        test = services[name]["healthcheck"]["test"]
        assert test[0] == "CMD"
        done = subprocess.run(test[1:], capture_output=True, text=True, check=False, timeout=30)
        assert done.returncode == 0, (name, done.stdout, done.stderr)
    pg_check = services["postgres"]["healthcheck"]["test"]
    # TCP: the image's first start listens on its socket only.
    assert pg_check[pg_check.index("-h") + 1] == "127.0.0.1"
    parser = build_parser()
    for name in (*WORKERS, "beat"):
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "gleaner", "health"], name
        args = parser.parse_args(test[2:])
        assert args.func.__name__ == "cmd_health"
        assert args.local_worker is (name in WORKERS)


def test_workers_stop_after_the_time_limits_and_the_image_is_not_root() -> None:
    defaults = Settings(_env_prefix="GLEANER_TEST_UNUSED_")  # type: ignore[call-arg]
    services = compose()["services"]
    for name in WORKERS:
        env = services[name]["environment"]
        soft = int(env.get("GLEANER_TASK_SOFT_TIME_LIMIT", defaults.task_soft_time_limit))
        hard = int(env.get("GLEANER_TASK_TIME_LIMIT", defaults.task_time_limit))
        grace = seconds(services[name]["stop_grace_period"])
        assert grace > hard > soft, (name, grace, hard, soft)
    dockerfile = (ROOT / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\S+)", dockerfile, flags=re.MULTILINE)
    assert users, "the image must name its user"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    assert f"--uid {user}" in dockerfile
    assert dockerfile.index("USER") > dockerfile.index("pip install")


def test_dockerignore_keeps_the_context_small_and_secret_free() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git", "**/__pycache__", "*.db", "secrets", "exports"} <= ignored
    copied = re.findall(r"^COPY\s+(.+?)\s+\S+$", (ROOT / "Dockerfile").read_text(), re.M)
    for sources in copied:
        for source in sources.split():
            assert source not in ignored, f"the Dockerfile copies {source}, which is ignored"


def test_exports_volume_and_the_import_command_are_documented() -> None:
    services = compose()["services"]
    for name in GLEANER_SERVICES:
        mounts = [interpolated(v) for v in services[name]["volumes"]]
        assert "./exports:/exports:ro" in mounts, name
    operations = (ROOT / "docs" / "operations.md").read_text()
    command = "docker compose run --rm gleaner import /exports/chatgpt-export.zip --owner alice"
    assert command in operations
    assert command in (ROOT / "docker-compose.yml").read_text()
    service = services["gleaner"]
    argv = shlex.split(command.split("gleaner", 1)[1])
    assert service["entrypoint"] == ["gleaner"]
    assert build_parser().parse_args(argv).func.__name__ == "cmd_import"


@pytest.mark.postgres
@pytest.mark.slow
def test_migrate_waits_for_a_database_that_is_not_there_yet(tmp_path: Path, worker_id: str) -> None:
    """The compose migrate command, run as is: it retries until the database exists (as on
    a fresh volume, where PostgreSQL restarts after initdb), then migrates it."""
    from sqlalchemy import create_engine, text

    from tests.conftest import CREATED_DATABASES

    name = f"gleaner_migrate_wait_{worker_id}"
    admin = create_engine(PG_BASE_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    url_file = tmp_path / "database_url"
    url_file.write_text(pg_url_for(name) + "\n")
    script = compose()["services"]["migrate"]["command"][2].replace("$$", "$")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLEANER_")}
    env |= {
        "GLEANER_DATABASE_URL_FILE": str(url_file),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    }
    proc = subprocess.Popen(
        ["sh", "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # Two or three attempts fail (no such database): the wait is the promise under test
        # (it outlasts a database late to start); the process's output is read only at its end.
        time.sleep(5)
        assert proc.poll() is None, proc.communicate()
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        CREATED_DATABASES.add(name)  # dropped at the run's end, as every one it makes
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        admin.dispose()
    assert proc.returncode == 0, err
    assert "migrate: attempt 1 of 30 failed, retrying in 2 s" in err
    assert "database at revision" in out
    store = Store(pg_url_for(name), settings=test_settings())
    try:
        from gleaner.store.db import current_revision

        assert current_revision(store.engine) == head_revision()
    finally:
        store.dispose()


def test_the_image_copies_every_package_the_wheel_installs() -> None:
    """`pip install .` in the image builds the wheel from what was copied: a package left out
    installs a console script that cannot import its own command line."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    wanted = {pattern.split(".")[0] for pattern in project["packages"]["find"]["include"]}
    wanted |= {f"{module}.py" for module in project.get("py-modules", [])}
    assert wanted == {"gleaner"}, "everything installs under the one gleaner package"
    copied = re.findall(r"^COPY\s+(.+?)\s+\S+$", (ROOT / "Dockerfile").read_text(), re.M)
    sources = {source for line in copied for source in line.split()}
    assert wanted <= sources, f"the Dockerfile does not copy {sorted(wanted - sources)}"


def test_the_wheel_installs_one_gleaner_package_with_its_data(tmp_path: Path) -> None:
    """The built wheel holds ``gleaner`` and its metadata only (no top-level ``store`` or
    ``workers`` to shadow a platform's own), with the files the code reads at run time: the
    migrations, the tokenizer, the type marker. Built as ``pip install .`` builds it, from a
    copy (setuptools writes its build folder beside the sources)."""
    import shutil
    import zipfile

    source, dist = tmp_path / "source", tmp_path / "dist"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "gleaner", source / "gleaner", ignore=ignore)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(source),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = dist.glob("gleaner-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {"gleaner", wheel.name.split("-py3")[0] + ".dist-info"}, sorted(tops)
    assert "gleaner/py.typed" in names
    assert "gleaner/store/migrations/env.py" in names
    assert any(n.startswith("gleaner/store/migrations/versions/") for n in names)
    assert any(n.startswith("gleaner/harvest/embed_models/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "gleaner = gleaner.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
