"""A stand-in harvest model for cost accounting (`GLEANER_HARVEST_LLM=bench.echo_llm:answer`).

It makes no network call: it counts the prompt's tokens the way the real path does and
answers one note per user statement, so calls and tokens per transcript are measurable
without a paid model.
"""

from __future__ import annotations

import json
import re
from typing import Any

from gleaner.harvest.chunks import count_tokens
from gleaner.harvest.llm import LLMAnswer

# Per-message framing tokens of the chat format (role markers), as OpenAI counts them.
TOKENS_PER_MESSAGE = 4
_USER_LINE = re.compile(r"^User: (.+)$", re.MULTILINE)


def answer(messages: list[dict[str, str]], *, options: Any) -> LLMAnswer:
    """One call: notes for the first ``max_facts`` user lines of the transcript."""
    prompt = sum(count_tokens(m["content"]) + TOKENS_PER_MESSAGE for m in messages)
    lines = _USER_LINE.findall(messages[-1]["content"])[: options.max_facts]
    notes = [
        {
            "type": "preference",
            "title": line[:80],
            "body": line,
            "topics": ["bench"],
            "confidence": 0.8,
            "topic_key": None,
        }
        for line in lines
    ]
    text = json.dumps({"notes": notes})
    return LLMAnswer(
        text=text, prompt_tokens=prompt, completion_tokens=count_tokens(text), model="echo"
    )
