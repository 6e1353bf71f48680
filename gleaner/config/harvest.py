"""The harvest's settings: the model and how it is called, what a harvest keeps, the daily
budgets, and the bounds on what is read (a transcript, a file, a zip)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from gleaner.config.base import Part


class HarvestSettings(Part):
    """The harvest's knobs (``gleaner.harvest`` and the readers)."""

    harvest_model: str | None = Field(
        default=None,
        max_length=200,  # the ledger keys each harvest by it (``harvester_version``)
        description="litellm model string; unset uses the offline harvester.",
    )
    harvest_max_facts: int = Field(
        default=5, gt=0, le=50, description="Most notes one transcript may yield."
    )
    harvest_min_confidence: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Lowest confidence a harvested note may have; a candidate below it is "
        "dropped (items_dropped), not written.",
    )
    harvest_known_keys: int = Field(
        default=30,
        ge=0,
        le=100,
        description="Most of the owner's notes (with their topic keys) shown to the model "
        "with each transcript, for its same/update marks (0: none).",
    )
    harvest_llm: str = Field(
        default="auto",
        description="Callable that talks to the model: 'auto', 'litellm', 'openai' (the lean "
        "OpenAI-compatible client) or 'module:function'.",
    )
    harvest_api_base: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible server."
    )
    harvest_api_key: SecretStr | None = Field(default=None, description="API key for the model.")
    harvest_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="Deadline of one model call, in seconds, over connecting, waiting and "
        "reading the whole answer however slowly it is sent (CPU inference of a full answer "
        "takes minutes; a hosted API can use 60).",
    )
    harvest_max_attempts: int = Field(
        default=4, ge=1, le=20, description="Most attempts of one model call (transient errors)."
    )
    harvest_max_retry_seconds: float = Field(
        default=30.0, ge=0, description="No retry of a model call starts later than this."
    )
    harvest_context_tokens: int = Field(
        default=6_000, ge=200, description="Transcript tokens per model call; longer is chunked."
    )
    harvest_response_format: Literal[
        "auto", "json_schema", "json_object_schema", "json_object", "none"
    ] = Field(
        default="auto",
        description="Structured output asked of the model; auto falls back to what the server "
        "accepts.",
    )
    harvest_max_answer_tokens: int = Field(
        default=2_048, gt=0, le=100_000, description="max_tokens of one model answer."
    )
    harvest_temperature: float = Field(
        default=0.0, ge=0, le=2, description="Sampling temperature of the harvest model."
    )
    harvest_max_calls: int = Field(
        default=20,
        ge=1,
        le=10_000,
        description="Most model requests one transcript may need; more chunks is too_large.",
    )
    budget_owner_tokens_per_day: int | None = Field(
        default=None,
        gt=0,
        description="Most harvest model tokens (prompt + completion) one owner may spend per "
        "UTC day; checked before each call, a job over it fails as budget_exceeded. Unset: "
        "no cap.",
    )
    budget_owner_usd_per_day: float | None = Field(
        default=None,
        gt=0,
        description="Most dollars of harvest model calls one owner may spend per UTC day, "
        "counting the calls whose price litellm's cost map knows. Unset: no cap.",
    )
    budget_import_tokens_per_day: int | None = Field(
        default=None,
        gt=0,
        description="Most harvest model tokens one queued import may spend per UTC day "
        "(on top of its owner's budget). Unset: no cap.",
    )
    budget_import_usd_per_day: float | None = Field(
        default=None,
        gt=0,
        description="Most dollars one queued import may spend per UTC day, counting the "
        "calls whose price is known. Unset: no cap.",
    )
    max_transcript_bytes: int = Field(
        default=4_000_000,
        gt=0,
        description="Most UTF-8 bytes of message text in one transcript; more is too_large.",
    )
    max_transcript_messages: int = Field(
        default=10_000, gt=0, description="Most messages in one transcript; more is too_large."
    )
    max_file_bytes: int = Field(
        default=256_000_000,
        gt=0,
        description="Most bytes read from one file (a zip's conversations.json inflated).",
    )
    max_zip_entries: int = Field(
        default=200_000,
        gt=0,
        description="Most entries a zip export may declare (its directory is read whole before "
        "any member); more is too_large, unopened.",
    )
