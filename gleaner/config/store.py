"""The store's settings: where the notes live, how a note is bounded and ranked, the search
backend, housekeeping, the database pool and the job leases the store keeps."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode

from gleaner.config.base import Part

DEFAULT_OBSERVATION_TYPES = ("profile", "preference", "decision", "discovery", "pattern")


class StoreSettings(Part):
    """The store's knobs (``gleaner.store`` reads no other)."""

    database_url: str = Field(
        default=None,  # filled in by _default_location
        validate_default=True,
        description="SQLAlchemy URL of the store; unset, one SQLite file in the user's data "
        "directory, shared by every command, hook and MCP server.",
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

    @model_validator(mode="after")
    def _check_lease(self) -> StoreSettings:
        # One late heartbeat (a busy database, a pause) must not make a live job look lost.
        if self.job_lease_seconds <= 2 * self.job_heartbeat_seconds:
            raise ValueError(
                "GLEANER_JOB_LEASE_SECONDS must exceed twice GLEANER_JOB_HEARTBEAT_SECONDS, got "
                f"{self.job_lease_seconds} and {self.job_heartbeat_seconds}"
            )
        return self


def default_database_url() -> str:
    """The SQLite file every entry point shares when GLEANER_DATABASE_URL is unset:
    ``gleaner.db`` in the user's data directory (``$XDG_DATA_HOME/gleaner``, by default
    ``~/.local/share/gleaner`` on Linux), made when the first command writes."""
    from platformdirs import user_data_path

    return f"sqlite:///{user_data_path('gleaner', appauthor=False) / 'gleaner.db'}"
