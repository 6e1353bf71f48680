"""The transcript model every reader produces."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["user", "assistant", "system", "tool"]


class Message(BaseModel):
    """One turn of a conversation."""

    model_config = ConfigDict(frozen=True)

    role: Role
    content: str
    at: datetime | None = None


class Transcript(BaseModel):
    """One finished conversation, whatever format it came in.

    ``started_at``/``ended_at`` are when the conversation happened (kept apart from when it
    is harvested); ``owner`` is None for exports that carry none (ChatGPT, Claude).
    """

    model_config = ConfigDict(frozen=True)

    conversation_id: str = Field(min_length=1, max_length=255)
    owner: str | None = None
    title: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    messages: list[Message]
    source_format: str = "native"
    source_path: str | None = None

    @property
    def happened_at(self) -> datetime | None:
        """When the conversation happened: its end, else its start, else its last message."""
        if self.ended_at or self.started_at:
            return self.ended_at or self.started_at
        stamps = [m.at for m in self.messages if m.at is not None]
        return max(stamps) if stamps else None
