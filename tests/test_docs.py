"""The README documents what the code has."""

from __future__ import annotations

from pathlib import Path

from store.settings import Settings

README = (Path(__file__).parent.parent / "README.md").read_text()


def test_every_setting_is_in_the_readme() -> None:
    for name in Settings.model_fields:
        assert f"`GLEANER_{name.upper()}`" in README, name


def test_ci_runs_the_readme_test_command() -> None:
    ci = (Path(__file__).parent.parent / ".ci" / "run").read_text()
    assert "python -m pytest" in README
    assert "python -m pytest" in ci
