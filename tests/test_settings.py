"""Settings: every key of the design with its default, and start-up errors naming the variable."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gleaner.store import ConfigError, load_settings
from gleaner.store.settings import DEFAULT_OBSERVATION_TYPES

SEED_KEYS = [
    "max_body_bytes",
    "index_token_budget",
    "pinned_body_bytes",
    "half_life_days",
    "recency_weight",
    "pinned_bonus",
    "duplicate_threshold",
    "search",
    "harvest_model",
    "harvest_max_facts",
    "harvest_llm",
    "database_url",
    "broker_url",
    "observation_types",
    "harvest_api_base",
    "harvest_api_key",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("GLEANER_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    settings = load_settings()
    for key in SEED_KEYS:
        assert hasattr(settings, key), key
    assert settings.max_body_bytes == 32_000
    data = Path(os.environ["XDG_DATA_HOME"])  # the suite's own (conftest)
    assert settings.database_url == f"sqlite:///{data / 'gleaner' / 'gleaner.db'}"
    assert settings.broker_url is None and settings.harvest_model is None
    assert settings.observation_types == DEFAULT_OBSERVATION_TYPES


def test_environment_is_read_with_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLEANER_DUPLICATE_THRESHOLD", "0.9")
    monkeypatch.setenv("GLEANER_HARVEST_MAX_FACTS", "3")
    monkeypatch.setenv("GLEANER_OBSERVATION_TYPES", "bugfix, decision")
    monkeypatch.setenv("GLEANER_HARVEST_API_KEY", "sk-test")
    settings = load_settings()
    assert settings.duplicate_threshold == 0.9 and settings.harvest_max_facts == 3
    assert settings.observation_types == ("bugfix", "decision")
    assert "sk-test" not in repr(settings)  # the key is a secret


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GLEANER_HALF_LIFE_DAYS", "-1"),
        ("GLEANER_MAX_BODY_BYTES", "lots"),
        ("GLEANER_RECENCY_WEIGHT", "1.5"),
        ("GLEANER_DUPLICATE_THRESHOLD", "0"),
        ("GLEANER_SEARCH", "elastic"),
        ("GLEANER_DATABASE_URL", "mysql://x"),
        ("GLEANER_OBSERVATION_TYPES", "summary,decision"),
        ("GLEANER_HARVEST_MAX_FACTS", "0"),
    ],
)
def test_a_bad_value_is_a_clear_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert name in str(caught.value)
    assert repr(value) in str(caught.value)


def test_a_model_call_with_its_retries_must_end_before_the_soft_time_limit() -> None:
    with pytest.raises(ConfigError, match="GLEANER_HARVEST_TIMEOUT_SECONDS"):
        load_settings(
            harvest_timeout_seconds=300, harvest_max_retry_seconds=30, task_soft_time_limit=320
        )


@pytest.mark.parametrize(
    ("soft", "hard", "visibility"),
    [(900, 900, 3600), (900, 1200, 1200), (900, 1200, 1000)],
)
def test_the_time_limits_must_stop_a_task_before_redis_hands_it_on(
    soft: int, hard: int, visibility: int
) -> None:
    # A task still running when its message becomes visible again is run twice (paid twice).
    with pytest.raises(ConfigError, match="GLEANER_BROKER_VISIBILITY_TIMEOUT must hold"):
        load_settings(
            task_soft_time_limit=soft, task_time_limit=hard, broker_visibility_timeout=visibility
        )
    assert load_settings(
        task_soft_time_limit=900, task_time_limit=1200, broker_visibility_timeout=3600
    )


def test_the_harvest_model_is_at_most_200_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLEANER_HARVEST_MODEL", "openai/" + "m" * 193)
    assert load_settings().harvest_model == "openai/" + "m" * 193
    monkeypatch.setenv("GLEANER_HARVEST_MODEL", "openai/" + "m" * 194)
    with pytest.raises(ConfigError, match="GLEANER_HARVEST_MODEL"):
        load_settings()


def test_each_setting_is_declared_by_one_part() -> None:
    """The settings are declared per package (gleaner.config's parts) and composed: every
    field of Settings comes from exactly one part, and no part redeclares another's."""
    import gleaner
    from gleaner import store
    from gleaner.config import PARTS, Settings

    declared = [name for part in PARTS for name in part.model_fields]
    assert len(declared) == len(set(declared))
    assert set(declared) == set(Settings.model_fields)
    assert store.Settings is Settings and gleaner.Settings is Settings  # what they export


def test_store_modules_read_only_the_stores_part() -> None:
    """Only the Store facade (sessions) and the loader hold the composed Settings; every
    other store module is typed against StoreSettings, so mypy refuses one that reads a
    harvest, Celery or HTTP knob."""
    import ast
    from pathlib import Path

    store = Path(__file__).resolve().parent.parent / "gleaner" / "store"
    holders = {"sessions.py", "settings.py", "__init__.py"}
    found = []
    for path in sorted(store.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            composed = isinstance(node, ast.ImportFrom) and node.module == "gleaner.config"
            if composed and (path.name not in holders or path.parent != store):
                found.append(str(path.relative_to(store)))
    assert found == []
