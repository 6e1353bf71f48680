"""A note as the harvest model (or the offline extractor) proposes it, before it is written."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

NOTE_TYPES = ("profile", "preference", "decision", "discovery", "pattern")


class NoteCandidate(BaseModel):
    """One proposed note; the JSON shape the model is asked for, item by item."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    type: str = Field(description="one of profile, preference, decision, discovery, pattern")
    title: str = Field(min_length=1, max_length=200)
    body: str = Field(min_length=1, max_length=4000)
    topics: list[str] = Field(default_factory=list, max_length=8)
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    topic_key: str | None = Field(default=None, max_length=255)
