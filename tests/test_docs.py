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


def test_every_default_in_the_settings_table_is_the_codes() -> None:
    # A table row is what an operator sizes a deployment by: `unset` is None, a list is
    # written comma-separated, a secret's default is no value at all.
    import re

    rows = re.findall(r"^\| `GLEANER_([A-Z_]+)` \| (unset|`[^`]*`) \|", README, re.MULTILINE)
    assert len(rows) == len(Settings.model_fields)
    for name, written in rows:
        default = Settings.model_fields[name.lower()].default
        if written == "unset":
            assert default is None, name
            continue
        value = written.strip("`")
        if isinstance(default, tuple):
            assert ",".join(default) == value, name
        elif isinstance(default, bool):
            assert str(default).lower() == value, name
        elif isinstance(default, int | float):
            assert float(value) == default, name
        else:
            assert str(default) == value, name
