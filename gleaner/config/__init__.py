"""Gleaner's settings, declared by the package that reads them and composed here.

Each layer's knobs live in their own module: ``store`` (where notes live, ranking,
housekeeping, job leases), ``harvest`` (the model, budgets, read bounds), ``embed``
(semantic recall's model), ``workers`` (broker, Celery limits, worker guards) and
``service`` (the HTTP service, the command line's progress). ``Settings`` composes them
into the one object every entry point builds from the environment
(``gleaner.store.settings.load_settings``) and the docs' configuration reference lists;
the rules across two layers' knobs are checked here. This package sits at the bottom of the
layering: it imports nothing of Gleaner's, and every layer may import it.
"""

from __future__ import annotations

from pydantic import model_validator

from gleaner.config.base import ENV_PREFIX, Part
from gleaner.config.embed import LOCAL_EMBED_MODELS, LOCAL_EMBED_PREFIX, EmbedSettings
from gleaner.config.harvest import HarvestSettings
from gleaner.config.service import CommandSettings, ServiceSettings
from gleaner.config.store import DEFAULT_OBSERVATION_TYPES, StoreSettings
from gleaner.config.workers import WorkerSettings

# The parts, in the order the configuration reference lists them.
PARTS: tuple[type[Part], ...] = (
    StoreSettings,
    HarvestSettings,
    EmbedSettings,
    WorkerSettings,
    ServiceSettings,
    CommandSettings,
)


class Settings(
    CommandSettings, ServiceSettings, WorkerSettings, EmbedSettings, HarvestSettings, StoreSettings
):
    """Every knob Gleaner has. Built by :func:`gleaner.store.settings.load_settings`; tests
    pass their own."""

    @model_validator(mode="after")
    def _check_calls_end_in_time(self) -> Settings:
        # A model call with its retries ends before the task is told to stop: a soft time
        # limit is for a stuck harvest, not a slow model.
        longest_call = self.harvest_timeout_seconds + self.harvest_max_retry_seconds
        if not longest_call < self.task_soft_time_limit:
            raise ValueError(
                "GLEANER_HARVEST_TIMEOUT_SECONDS + GLEANER_HARVEST_MAX_RETRY_SECONDS must be "
                f"under GLEANER_TASK_SOFT_TIME_LIMIT, got {self.harvest_timeout_seconds} + "
                f"{self.harvest_max_retry_seconds} and {self.task_soft_time_limit}"
            )
        # One embedding request must end before the task is told to stop, or every backfill
        # task dies.
        if self.embed_model is not None and not (
            self.embed_timeout_seconds < self.task_soft_time_limit
        ):
            raise ValueError(
                "GLEANER_EMBED_TIMEOUT_SECONDS must be under GLEANER_TASK_SOFT_TIME_LIMIT, got "
                f"{self.embed_timeout_seconds} and {self.task_soft_time_limit}"
            )
        return self


__all__ = [
    "DEFAULT_OBSERVATION_TYPES",
    "ENV_PREFIX",
    "LOCAL_EMBED_MODELS",
    "LOCAL_EMBED_PREFIX",
    "PARTS",
    "CommandSettings",
    "EmbedSettings",
    "HarvestSettings",
    "ServiceSettings",
    "Settings",
    "StoreSettings",
    "WorkerSettings",
]
