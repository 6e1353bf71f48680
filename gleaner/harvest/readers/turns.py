"""Messages from a coding agent's turns: one assistant message a turn, its tools on one line."""

from __future__ import annotations

from datetime import datetime

from gleaner.harvest.transcript import Message, Role


class Turns:
    """Messages built turn by turn: an assistant turn runs until the user speaks again (a
    reply written a block a line, or split by tool calls, is one message), and the tools it
    called become one closing line, ``[tools: Bash, Edit]``, names only."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self._tools: dict[str, None] = {}

    def add(self, role: Role, text: str, at: datetime | None, tools: list[str]) -> None:
        """One event's kept text (may be empty) and the tools it called."""
        self._tools.update(dict.fromkeys(tools))
        if not text.strip():
            return
        if role != "assistant":
            self._close()
        elif self.messages and self.messages[-1].role == "assistant":
            last = self.messages.pop()
            text, at = f"{last.content}\n{text}", last.at or at
        self.messages.append(Message(role=role, content=text, at=at))

    def _close(self) -> None:
        if not self._tools:
            return
        line = f"[tools: {', '.join(self._tools)}]"
        self._tools.clear()
        if self.messages and self.messages[-1].role == "assistant":
            last = self.messages.pop()
            self.messages.append(last.model_copy(update={"content": f"{last.content}\n{line}"}))
        else:
            self.messages.append(Message(role="assistant", content=line))

    def done(self) -> list[Message]:
        """The messages, the last assistant turn's tool line included."""
        self._close()
        return self.messages
