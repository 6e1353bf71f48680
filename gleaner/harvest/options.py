"""What one harvest's model calls are told: :class:`ModelOptions`, built from the settings.

An option that is also a setting takes the setting's default and bounds from
``store.Settings`` itself, so the two never disagree; only the backoff (a tuning knob tests
shrink) is declared here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from gleaner.config.harvest import HarvestSettings
from gleaner.store import ConfigError, Settings
from gleaner.store.settings import DEFAULT_OBSERVATION_TYPES, options_error, setting_field

# Strongest first: ``auto`` falls back along this order when the server refuses one
# (``harvest.formats``). Defined here, with the option that names them, so the options sit
# below the clients that read them. ``json_object_schema`` is ``{"type": "json_object",
# "schema": ...}``, the form llama-cpp-python's server takes (it answers HTTP 500 to
# ``json_schema``).
ResponseFormat = Literal["json_schema", "json_object_schema", "json_object", "none"]
FORMATS: tuple[ResponseFormat, ...] = ("json_schema", "json_object_schema", "json_object", "none")

# Each option that mirrors a setting, and the setting it mirrors (its GLEANER_* variable is
# the upper-cased name).
SETTING_OF = {
    "model": "harvest_model",
    "llm": "harvest_llm",
    "api_base": "harvest_api_base",
    "api_key": "harvest_api_key",
    "max_facts": "harvest_max_facts",
    "types": "observation_types",
    "timeout_seconds": "harvest_timeout_seconds",
    "max_attempts": "harvest_max_attempts",
    "max_retry_seconds": "harvest_max_retry_seconds",
    "context_tokens": "harvest_context_tokens",
    "max_calls": "harvest_max_calls",
    "max_transcript_bytes": "max_transcript_bytes",
    "max_transcript_messages": "max_transcript_messages",
    "max_answer_tokens": "harvest_max_answer_tokens",
    "temperature": "harvest_temperature",
    "response_format": "harvest_response_format",
}


def _lower_bound(name: str) -> Any:
    """The ``ge`` bound ``Settings`` declares for ``name``."""
    return next(c.ge for c in Settings.model_fields[name].metadata if hasattr(c, "ge"))


# The smallest transcript budget of one call the settings allow.
MIN_CONTEXT_TOKENS: int = _lower_bound("harvest_context_tokens")


class ModelOptions(BaseModel):
    """Everything one harvest call needs to know; built from the settings by :meth:`from_settings`.

    ``max_retry_seconds`` bounds the retry window: no retry starts later than that after the
    first attempt, so a call returns within about ``max_retry_seconds + timeout_seconds``.
    ``context_tokens`` is the transcript budget of one call (cl100k tokens); longer
    transcripts are chunked, into at most ``max_calls`` requests (a transcript needing more
    is refused, ``too_large``, before the first call). ``max_transcript_bytes`` and
    ``max_transcript_messages`` are checked before any of it is tokenized.
    ``response_format`` is ``auto`` (negotiated with the server, see
    ``harvest.formats.call_with_fallback``) or a format sent as set and never fallen back from.
    """

    model_config = ConfigDict(frozen=True)

    model: str = Field(min_length=1, description="litellm model string")
    llm: str = setting_field("harvest_llm")
    api_base: str | None = setting_field("harvest_api_base")
    api_key: SecretStr | None = setting_field("harvest_api_key")
    max_facts: int = setting_field("harvest_max_facts")
    types: tuple[str, ...] = Field(default=DEFAULT_OBSERVATION_TYPES, min_length=1)
    timeout_seconds: float = setting_field("harvest_timeout_seconds")
    max_attempts: int = setting_field("harvest_max_attempts")
    max_retry_seconds: float = setting_field("harvest_max_retry_seconds")
    backoff_seconds: float = Field(default=1.0, gt=0, description="first backoff window")
    backoff_max_seconds: float = Field(default=10.0, gt=0, description="largest backoff window")
    context_tokens: int = setting_field("harvest_context_tokens")
    max_calls: int = setting_field("harvest_max_calls")
    max_transcript_bytes: int = setting_field("max_transcript_bytes")
    max_transcript_messages: int = setting_field("max_transcript_messages")
    max_answer_tokens: int = setting_field("harvest_max_answer_tokens")
    temperature: float = setting_field("harvest_temperature")
    response_format: Literal["auto", ResponseFormat] = setting_field("harvest_response_format")

    @classmethod
    def from_settings(cls, settings: HarvestSettings) -> ModelOptions:
        """Options from the Gleaner settings.

        Raises ConfigError (naming the ``GLEANER_*`` variable) when no model is configured
        or a value is out of range (a Settings built without validation).
        """
        if not settings.harvest_model:
            raise ConfigError(
                "GLEANER_HARVEST_MODEL is not set: no harvest model to call", reason="bad_config"
            )
        values = {option: getattr(settings, name) for option, name in SETTING_OF.items()}
        values["types"] = tuple(values["types"])
        try:
            return cls(**values)
        except ValidationError as exc:
            raise options_error(exc, SETTING_OF) from None
