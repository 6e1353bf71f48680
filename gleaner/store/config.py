"""The ``Settings`` model: every knob Gleaner has, its default, bounds and description, and
the rules across knobs. ``store.settings`` builds it from the environment (``load_settings``)
and re-exports it."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from gleaner.store.config_embed import LOCAL_EMBED_PREFIX, EmbedSettings

DEFAULT_OBSERVATION_TYPES = ("profile", "preference", "decision", "discovery", "pattern")
ENV_PREFIX = "GLEANER_"
# The broker URLs Gleaner can use: kombu's Redis transports.
REDIS_SCHEMES = ("redis://", "rediss://", "redis+socket://", "unix://", "sentinel://")


class Settings(EmbedSettings):
    """Every knob Gleaner has. Built by :func:`load_settings`; tests pass their own."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore")

    database_url: str = Field(
        default=None,  # filled in by _default_location
        validate_default=True,
        description="SQLAlchemy URL of the store; unset, one SQLite file in the user's data "
        "directory, shared by every command, hook and MCP server.",
    )
    broker_url: str | None = Field(
        default=None, description="Redis URL of the Celery broker; unset runs tasks in process."
    )
    max_body_bytes: int = Field(default=32_000, gt=0, description="Largest body, in UTF-8 bytes.")
    index_token_budget: int = Field(
        default=1_000, gt=0, description="Token budget of index_text (1 token ~ 4 bytes)."
    )
    pinned_body_bytes: int = Field(
        default=2_000, gt=0, description="Bytes of each pinned body that index_text includes."
    )
    half_life_days: float = Field(
        default=30.0, gt=0, description="Days after which a note's recency factor halves."
    )
    recency_weight: float = Field(
        default=0.25, ge=0, le=1, description="Share of the search score given to recency."
    )
    pinned_bonus: float = Field(
        default=0.2, ge=0, description="Added to the search score of pinned notes."
    )
    duplicate_threshold: float = Field(
        default=0.8, gt=0, le=1, description="Jaccard score at which two notes are duplicates."
    )
    similar_threshold: float = Field(
        default=0.3, gt=0, le=1, description="Lowest Jaccard score listed in write's `similar`."
    )
    search: Literal["bm25", "like"] = Field(
        default="bm25",
        description="Search backend: bm25 (any-word BM25 over the store's own index, both "
        "databases) or like (substring match); fts, its former name, means bm25.",
    )
    instruction_notes: Literal["flag", "drop"] = Field(
        default="flag",
        description="A note that reads as an instruction to the assistant "
        "(gleaner.store.notes.instructions): "
        "flag stores it marked flag=instruction; drop does not store it (a harvest counts it in "
        "items_dropped and items_instructions, a write or mem_save is refused).",
    )
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
    http_max_body_bytes: int = Field(
        default=4_000_000,
        gt=0,
        description="Most bytes of one HTTP request body (a zip inflated), counted while it "
        "streams in and before any parsing; more is 413 too_large.",
    )
    http_body_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Seconds an HTTP client has to send a whole request body; slower is 408.",
    )
    http_header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Seconds an HTTP connection may wait for a request's line and headers "
        "(after it opens or after its last answer); then it is closed.",
    )
    http_max_connections: int = Field(
        default=1_000,
        gt=0,
        description="Open HTTP connections (and requests in progress) one server process "
        "serves; a request over it is answered 503.",
    )
    http_harvest_threads: int = Field(
        default=4,
        gt=0,
        le=256,
        description="Threads of the HTTP service's harvest pool: submits are read there, and "
        "harvested (no broker) or queued, apart from the threads that answer requests.",
    )
    http_harvest_queue: int = Field(
        default=32,
        ge=0,
        description="Submits that may wait for a harvest thread; one more is 503 with Retry-After.",
    )
    http_submits_per_key: int = Field(
        default=4,
        gt=0,
        description="Submits one API key may have in progress at once; one more is 429.",
    )
    http_requests_per_minute: int = Field(
        default=600,
        ge=0,
        description="Requests one API key may make in a moving minute, per server process; "
        "more are 429 with Retry-After; 0 turns the limit off.",
    )
    max_zip_entries: int = Field(
        default=200_000,
        gt=0,
        description="Most entries a zip export may declare (its directory is read whole before "
        "any member); more is too_large, unopened.",
    )
    progress_seconds: float = Field(
        default=5.0,
        ge=0,
        description="Seconds between two plain progress lines of harvest, import and status "
        "--watch when stderr is no terminal (logs, CI); the first and last are always shown.",
    )
    archive_below_weight: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Decay archives unpinned notes whose weight falls below this; unset: never.",
    )
    housekeeping_batch_size: int = Field(
        default=5_000, gt=0, description="Rows per transaction in decay (short locks)."
    )
    db_pool_size: int = Field(
        default=5, gt=0, le=100, description="Connections each process keeps per database."
    )
    task_soft_time_limit: int = Field(
        default=900, gt=0, description="Seconds before a task is asked to stop (SoftTimeLimit)."
    )
    task_time_limit: int = Field(
        default=960, gt=0, description="Seconds before a task's worker child is killed."
    )
    task_events: bool = Field(
        default=False,
        description="Workers send task events (what Flower and `celery events` show).",
    )
    broker_visibility_timeout: int = Field(
        default=3_600,
        gt=0,
        description="Seconds before Redis redelivers an unacknowledged task; above the limits.",
    )
    worker_max_tasks_per_child: int = Field(
        default=10_000,
        gt=0,
        description="Tasks before a worker child is replaced (a last bound on slow leaks).",
    )
    worker_max_memory_per_child: int = Field(
        default=512,
        ge=0,
        description="Resident MB after which a worker child is replaced once its task ends "
        "(bounds leaks, litellm's included); 0 turns the check off.",
    )
    worker_stall_seconds: int = Field(
        default=120,
        ge=0,
        description="A worker with a free slot that takes no message while some wait on its "
        "queues for this long exits (code 70) to be restarted; 0 turns the check off.",
    )
    requeue_after_seconds: int = Field(
        default=900,
        gt=0,
        description="A pending job sent this long ago whose message is not on its queue is "
        "sent again.",
    )
    job_heartbeat_seconds: int = Field(
        default=30, gt=0, description="Seconds between a running job's heartbeats."
    )
    job_lease_seconds: int = Field(
        default=120,
        gt=0,
        description="A running job with no heartbeat for this long is lost and recovered.",
    )
    job_max_crashes: int = Field(
        default=3,
        ge=1,
        le=100,
        description="A job whose worker was lost this many times is failed (worker_lost).",
    )
    observation_types: Annotated[tuple[str, ...], NoDecode] = Field(
        default=DEFAULT_OBSERVATION_TYPES,
        description="Allowed mem_save types, comma-separated in the environment.",
    )

    @field_validator("search", mode="before")
    @classmethod
    def _former_search_name(cls, value: object) -> object:
        # A configuration written for the full-text backend keeps working.
        return "bm25" if value == "fts" else value

    @model_validator(mode="after")
    def _check_embedding(self) -> Settings:
        if self.embed_model is None:
            return self
        if self.embed_api_base and self.embed_model.lower().startswith(LOCAL_EMBED_PREFIX):
            raise ValueError(
                "GLEANER_EMBED_API_BASE is set, but GLEANER_EMBED_MODEL names the local "
                f"embedder ({self.embed_model}), which calls no server: unset one of them"
            )
        # One request must end before the task is told to stop, or every backfill task dies.
        if not self.embed_timeout_seconds < self.task_soft_time_limit:
            raise ValueError(
                "GLEANER_EMBED_TIMEOUT_SECONDS must be under GLEANER_TASK_SOFT_TIME_LIMIT, got "
                f"{self.embed_timeout_seconds} and {self.task_soft_time_limit}"
            )
        return self

    @field_validator("observation_types", mode="before")
    @classmethod
    def _split_types(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            if not value:
                raise ValueError("must name at least one type")
            if "summary" in value:
                raise ValueError("'summary' is reserved for mem_session_summary")
            return tuple(value)
        return value

    @model_validator(mode="after")
    def _check_limits(self) -> Settings:
        # A task must be stopped before Redis hands its message to another worker.
        if not self.task_soft_time_limit < self.task_time_limit < self.broker_visibility_timeout:
            raise ValueError(
                "GLEANER_TASK_SOFT_TIME_LIMIT < GLEANER_TASK_TIME_LIMIT < "
                "GLEANER_BROKER_VISIBILITY_TIMEOUT must hold, got "
                f"{self.task_soft_time_limit}, {self.task_time_limit}, "
                f"{self.broker_visibility_timeout}"
            )
        # A model call with its retries ends before the task is told to stop: a soft time
        # limit is for a stuck harvest, not a slow model.
        longest_call = self.harvest_timeout_seconds + self.harvest_max_retry_seconds
        if not longest_call < self.task_soft_time_limit:
            raise ValueError(
                "GLEANER_HARVEST_TIMEOUT_SECONDS + GLEANER_HARVEST_MAX_RETRY_SECONDS must be "
                f"under GLEANER_TASK_SOFT_TIME_LIMIT, got {self.harvest_timeout_seconds} + "
                f"{self.harvest_max_retry_seconds} and {self.task_soft_time_limit}"
            )
        # One late heartbeat (a busy database, a pause) must not make a live job look lost.
        if self.job_lease_seconds <= 2 * self.job_heartbeat_seconds:
            raise ValueError(
                "GLEANER_JOB_LEASE_SECONDS must exceed twice GLEANER_JOB_HEARTBEAT_SECONDS, got "
                f"{self.job_lease_seconds} and {self.job_heartbeat_seconds}"
            )
        return self

    @field_validator("broker_url")
    @classmethod
    def _check_broker_url(cls, value: str | None) -> str | None:
        # Celery takes any kombu transport, but Gleaner's queues, sweep and health read Redis.
        if value is not None and not value.startswith(REDIS_SCHEMES):
            scheme = value.partition("://")[0] if "://" in value else "no scheme"
            raise ValueError(f"must be a Redis URL ({', '.join(REDIS_SCHEMES)}), got {scheme}")
        return value

    @field_validator("database_url", mode="before")
    @classmethod
    def _default_location(cls, value: object) -> object:
        return default_database_url() if value is None else value

    @field_validator("database_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("sqlite", "postgresql")):
            raise ValueError("must be a sqlite:/// or postgresql+psycopg:// URL")
        return value


def default_database_url() -> str:
    """The SQLite file every entry point shares when GLEANER_DATABASE_URL is unset:
    ``gleaner.db`` in the user's data directory (``$XDG_DATA_HOME/gleaner``, by default
    ``~/.local/share/gleaner`` on Linux), made when the first command writes."""
    from platformdirs import user_data_path

    return f"sqlite:///{user_data_path('gleaner', appauthor=False) / 'gleaner.db'}"
