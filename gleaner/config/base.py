"""What every part of the settings shares: the environment prefix and the model's
configuration (frozen, unknown names ignored; ``gleaner.store.settings`` names them)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "GLEANER_"


class Part(BaseSettings):
    """One package's settings, read from ``GLEANER_*`` variables; ``gleaner.config.Settings``
    composes them all."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")
