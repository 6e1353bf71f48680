"""Settings from the environment: ``_FILE`` secrets and unknown ``GLEANER_`` variables."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gleaner.store import ConfigError, load_settings
from gleaner.store.settings import TOOLING_PREFIXES, known_variables, unknown_variables

ROOT = Path(__file__).parent.parent


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("GLEANER_"):
            monkeypatch.delenv(name)


def secret(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_file_secrets_are_read_and_stripped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url = "postgresql+psycopg://gleaner:s3cret@db/gleaner"
    monkeypatch.setenv("GLEANER_DATABASE_URL_FILE", secret(tmp_path, "db", f"{url}\n"))
    monkeypatch.setenv("GLEANER_BROKER_URL_FILE", secret(tmp_path, "broker", " redis://r:6379/0 "))
    monkeypatch.setenv("GLEANER_HARVEST_API_KEY_FILE", secret(tmp_path, "key", "sk-test\n"))
    settings = load_settings()
    assert settings.database_url == url
    assert settings.broker_url == "redis://r:6379/0"
    assert settings.harvest_api_key is not None
    assert settings.harvest_api_key.get_secret_value() == "sk-test"


def test_a_variable_set_directly_and_as_a_file_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GLEANER_BROKER_URL", "redis://a:6379/0")
    monkeypatch.setenv("GLEANER_BROKER_URL_FILE", secret(tmp_path, "broker", "redis://b:6379/0"))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "GLEANER_BROKER_URL and GLEANER_BROKER_URL_FILE are both set" in str(caught.value)
    # An empty variable (compose's `${X:-}`) counts as unset.
    monkeypatch.setenv("GLEANER_BROKER_URL", "")
    assert load_settings().broker_url == "redis://b:6379/0"


def test_missing_and_empty_secret_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GLEANER_DATABASE_URL_FILE", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match=r"GLEANER_DATABASE_URL_FILE: cannot read .*absent"):
        load_settings()
    monkeypatch.setenv("GLEANER_DATABASE_URL_FILE", secret(tmp_path, "db", "\n"))
    with pytest.raises(ConfigError, match=r"GLEANER_DATABASE_URL_FILE: .* is empty"):
        load_settings()
    # An empty key file is no key: the offline harvester needs none.
    monkeypatch.delenv("GLEANER_DATABASE_URL_FILE")
    monkeypatch.setenv("GLEANER_HARVEST_API_KEY_FILE", secret(tmp_path, "key", ""))
    assert load_settings().harvest_api_key is None


def test_a_bad_value_from_a_file_names_the_file_not_the_secret(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = secret(tmp_path, "db", "mysql://root:hunter2@db/x")
    monkeypatch.setenv("GLEANER_DATABASE_URL_FILE", path)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert f"GLEANER_DATABASE_URL_FILE ({path})" in message
    assert "hunter2" not in message


def test_unknown_variables_name_the_closest_setting() -> None:
    environ = {
        "GLEANER_BROKR_URL": "redis://x",
        "GLEANER_DATABASE_URL": "sqlite:///x.db",
        "GLEANER_DATABASE_URL_FILE": "/run/secrets/db",
        "GLEANER_ZZZ": "1",
        "GLEANER_TEST_PG_URL": "postgresql+psycopg://x",
        "GLEANER_BENCH_REDIS_URL": "redis://x",
        "GLEANER_RELIABILITY_JSON": "/tmp/x.json",
        "PATH": "/usr/bin",
    }
    assert unknown_variables(environ) == [
        ("GLEANER_BROKR_URL", "GLEANER_BROKER_URL"),
        ("GLEANER_ZZZ", None),
    ]
    assert "GLEANER_HARVEST_API_KEY_FILE" in known_variables()


def test_start_up_warns_once_on_stderr_and_goes_on(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("GLEANER_")}
    env |= {
        "GLEANER_DATABASE_URL": f"sqlite:///{tmp_path / 'g.db'}",
        "GLEANER_HARVEST_MODLE": "openai/gpt-4o-mini",
        "GLEANER_TEST_DB_SUFFIX": "_x",
    }
    code = "from gleaner.store import load_settings; load_settings(); load_settings()"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "gleaner: warning: GLEANER_HARVEST_MODLE is not a Gleaner setting and is ignored "
        "(did you mean GLEANER_HARVEST_MODEL?)"
    ]


def test_the_test_suites_own_environment_trips_no_warning() -> None:
    # Whatever GLEANER_ variables this run was started with must all be known or tooling.
    assert unknown_variables(dict(os.environ)) == []


def test_every_gleaner_variable_the_code_names_is_known() -> None:
    # A variable read outside the settings must be listed, or start-up would call it unknown.
    packages = ("store", "harvest", "workers", "service", "gleaner")
    sources = [path for package in packages for path in (ROOT / package).rglob("*.py")]
    named = set()
    for path in sources:
        named.update(re.findall(r"[\"'`](GLEANER_[A-Z0-9_]*[A-Z0-9])\b", path.read_text()))
    assert named, "the scan found nothing: the pattern is wrong"
    unknown = {
        name
        for name in named
        if name not in known_variables() and not f"{name}_".startswith(TOOLING_PREFIXES)
    }
    assert unknown == set()
