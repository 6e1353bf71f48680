"""Semantic recall's settings (``GLEANER_EMBED_*``): which embedding model, where it runs, how
it is called."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator, model_validator

from gleaner.config.base import Part

# The models the local CPU embedder runs (harvest.embed_local), as GLEANER_EMBED_MODEL names
# them (in any case; the setting holds them lowercased).
LOCAL_EMBED_PREFIX = "local/"
LOCAL_EMBED_MODELS = ("local/all-minilm-l6-v2",)


class EmbedSettings(Part):
    """The embedding knobs (``gleaner.harvest``'s embedders)."""

    embed_model: str | None = Field(
        default=None,
        max_length=200,  # stored with each vector: it names the space the vector lives in
        description="Embedding model of semantic recall: 'local/all-minilm-l6-v2' (the CPU "
        "embedder of the local-embed extra), 'openai/<name>' with GLEANER_EMBED_API_BASE (any "
        "OpenAI-compatible /v1/embeddings server) or any litellm embedding model; unset keeps "
        "recall lexical.",
    )
    embed_api_base: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible embeddings server (.../v1)."
    )
    embed_api_key: SecretStr | None = Field(
        default=None, description="API key for the embedding model."
    )
    embed_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Timeout of one embedding request, in seconds."
    )
    embed_batch_size: int = Field(
        default=64, ge=1, le=2_048, description="Most texts sent in one embedding request."
    )
    embed_max_attempts: int = Field(
        default=4,
        ge=1,
        le=20,
        description="Most attempts of one embedding request (transient errors).",
    )

    @field_validator("embed_model", "embed_api_base", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # GLEANER_EMBED_MODEL= (set but empty, as a compose file leaves it) means no model.
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("embed_model")
    @classmethod
    def _known_local_model(cls, value: str | None) -> str | None:
        lowered = (value or "").lower()
        if not lowered.startswith(LOCAL_EMBED_PREFIX):
            return value
        if lowered not in LOCAL_EMBED_MODELS:
            raise ValueError(
                f"no local embedding model {value!r}: the local embedder runs "
                f"{', '.join(LOCAL_EMBED_MODELS)}"
            )
        return lowered  # one spelling, so the name stored with each vector is always the same

    @model_validator(mode="after")
    def _local_calls_no_server(self) -> EmbedSettings:
        lowered = (self.embed_model or "").lower()
        if self.embed_api_base and lowered.startswith(LOCAL_EMBED_PREFIX):
            raise ValueError(
                "GLEANER_EMBED_API_BASE is set, but GLEANER_EMBED_MODEL names the local "
                f"embedder ({self.embed_model}), which calls no server: unset one of them"
            )
        return self
