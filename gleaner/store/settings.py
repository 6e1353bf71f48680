"""Gleaner's settings: one object (``gleaner.config.Settings``, composed there from each
package's part and re-exported here), read once from ``GLEANER_*`` environment variables by
``load_settings``; the ``<VARIABLE>_FILE`` secrets and the unknown ``GLEANER_`` variables it
names on stderr."""

from __future__ import annotations

import copy
import difflib
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gleaner.config import (
    DEFAULT_OBSERVATION_TYPES,
    ENV_PREFIX,
    LOCAL_EMBED_MODELS,
    LOCAL_EMBED_PREFIX,
    Settings,
)
from gleaner.store.errors import ConfigError

# Settings that may also come from a file named by <VARIABLE>_FILE (Docker/Compose secrets).
FILE_SETTINGS = ("database_url", "broker_url", "harvest_api_key", "embed_api_key")
# GLEANER_ names that belong to the test suite, the benchmarks and the reliability suite, not
# to a running Gleaner: never reported as unknown.
TOOLING_PREFIXES = ("GLEANER_TEST_", "GLEANER_BENCH_", "GLEANER_RELIABILITY_")
# GLEANER_ variables a command reads itself, outside the settings (`gleaner mcp`'s owner).
COMMAND_VARIABLES = ("GLEANER_MCP_OWNER",)


def options_error(exc: ValidationError, setting_of: Mapping[str, str]) -> ConfigError:
    """An options model's validation failure as a ConfigError naming each GLEANER_ setting it
    came from (``setting_of`` maps an option to its setting)."""
    problems = []
    for error in exc.errors():
        option = str(error["loc"][0]) if error["loc"] else "?"
        name = setting_of.get(option, option).upper()
        problems.append(f"GLEANER_{name}: {error['msg']} (got {error.get('input')!r})")
    return ConfigError("; ".join(problems), reason="bad_config")


def setting_field(name: str) -> Any:
    """A copy of the ``Settings`` field ``name`` (default, bounds, description) for a model
    that mirrors a setting (harvest's ModelOptions and Limits), so each is declared once."""
    return copy.copy(Settings.model_fields[name])


def load_settings(**overrides: object) -> Settings:
    """Build the settings from the environment; a bad value raises ConfigError naming it.

    ``GLEANER_DATABASE_URL_FILE``, ``GLEANER_BROKER_URL_FILE``,
    ``GLEANER_HARVEST_API_KEY_FILE`` and ``GLEANER_EMBED_API_KEY_FILE`` name files holding
    the value (read here, stripped);
    an unknown ``GLEANER_`` variable is named on stderr, once per process.
    """
    environ = {name.upper(): value for name, value in os.environ.items()}
    warn_unknown_variables(environ)
    from_files = read_setting_files(environ)
    try:
        return Settings(**{**from_files, **overrides})  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            if not error["loc"]:  # a rule across settings names its variables itself
                problems.append(str(error["msg"]))
                continue
            field = str(error["loc"][0])
            variable = f"{ENV_PREFIX}{field.upper()}"
            if field in from_files and field not in overrides:
                # Never echo a secret read from a file: name the file instead.
                path = environ[f"{variable}_FILE"]
                problems.append(f"{variable}_FILE ({path}): {error['msg']}")
                continue
            problems.append(f"{variable}: {error['msg']} (got {error.get('input')!r})")
        raise ConfigError("; ".join(problems), reason="bad_config") from None


def read_setting_files(environ: Mapping[str, str]) -> dict[str, str]:
    """The values of the ``<VARIABLE>_FILE`` settings that are set, keyed by field name.

    An empty key file means no key; an empty URL file, an unreadable file, or a variable set
    both directly and as a file is a ConfigError naming both.
    """
    values: dict[str, str] = {}
    for field in FILE_SETTINGS:
        variable = f"{ENV_PREFIX}{field.upper()}"
        file_variable = f"{variable}_FILE"
        path = environ.get(file_variable)
        if not path:
            continue
        if environ.get(variable):
            raise ConfigError(
                f"{variable} and {file_variable} are both set: set only one of them",
                reason="bad_config",
            )
        try:
            text = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(
                f"{file_variable}: cannot read {path}: {why}", reason="bad_config"
            ) from None
        if not text:
            if field in ("harvest_api_key", "embed_api_key"):
                continue  # an empty key file: no key (a local server needs none)
            raise ConfigError(f"{file_variable}: {path} is empty", reason="bad_config")
        values[field] = text
    return values


def known_variables() -> frozenset[str]:
    """Every ``GLEANER_`` variable a running Gleaner reads."""
    names = {f"{ENV_PREFIX}{field.upper()}" for field in Settings.model_fields}
    names.update(f"{ENV_PREFIX}{field.upper()}_FILE" for field in FILE_SETTINGS)
    names.update(COMMAND_VARIABLES)
    return frozenset(names)


def unknown_variables(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``GLEANER_`` variables in ``environ`` that no setting reads, each with the closest
    known name (None when nothing is close)."""
    known = known_variables()
    # Compared without the prefix every name shares, so only the part typed counts.
    suffixes = [known_name.removeprefix(ENV_PREFIX) for known_name in sorted(known)]
    found = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        if upper.startswith(TOOLING_PREFIXES):
            continue
        close = difflib.get_close_matches(upper.removeprefix(ENV_PREFIX), suffixes, n=1)
        found.append((name, f"{ENV_PREFIX}{close[0]}" if close else None))
    return found


_warned: set[str] = set()


def warn_unknown_variables(environ: Mapping[str, str]) -> None:
    """One line on stderr per unknown ``GLEANER_`` variable, the first time it is seen."""
    for name, close in unknown_variables(environ):
        if name in _warned:
            continue
        _warned.add(name)
        hint = f"did you mean {close}?" if close else "no setting has a similar name"
        print(
            f"gleaner: warning: {name} is not a Gleaner setting and is ignored ({hint})",
            file=sys.stderr,
        )


# The public names; callers import the model's (gleaner.config) from here too.
__all__ = [
    "COMMAND_VARIABLES",
    "DEFAULT_OBSERVATION_TYPES",
    "ENV_PREFIX",
    "FILE_SETTINGS",
    "LOCAL_EMBED_MODELS",
    "LOCAL_EMBED_PREFIX",
    "TOOLING_PREFIXES",
    "Settings",
    "known_variables",
    "load_settings",
    "read_setting_files",
    "setting_field",
    "unknown_variables",
    "warn_unknown_variables",
]
