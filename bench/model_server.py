"""An instant (or fixed-delay) OpenAI-compatible chat-completions server for the benches.

Run as its own process: ``python -m bench.model_server --port 0 [--delay 1.0]``; it prints
``listening PORT`` once bound. Raw asyncio with HTTP/1.1 keep-alive, so the server costs
little next to the client it measures. Every answer holds 2-4 notes whose titles carry a
token derived from the request body: different transcripts get different notes (no
accidental near-duplicates), the same transcript gets the same notes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys

TYPES = ("preference", "decision", "discovery", "pattern", "profile")


def notes_answer(body: bytes) -> bytes:
    """The chat-completion JSON for one request body."""
    token = hashlib.blake2b(body, digest_size=6).hexdigest()
    count = 2 + int(token[:2], 16) % 3
    notes = [
        {
            "type": TYPES[n % len(TYPES)],
            "title": f"Fact {n} of t{token} about k{token}{n}",
            "body": f"The user stated fact {n} in conversation t{token}; keep it in mind.",
            "topics": [f"t{token}", f"fact{n}"],
            "confidence": 0.9 - n * 0.1,
            "topic_key": None,
        }
        for n in range(count)
    ]
    return json.dumps(
        {
            "id": f"chatcmpl-{token}",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "bench-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": json.dumps({"notes": notes})},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 220, "completion_tokens": 40 * count, "total_tokens": 0},
        }
    ).encode()


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            body = await reader.readexactly(length) if length else b""
            if delay:
                await asyncio.sleep(delay)
            payload = notes_answer(body)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(payload)).encode() + b"\r\n"
                b"Connection: keep-alive\r\n\r\n" + payload
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


async def serve(port: int, delay: float) -> None:
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, delay), "127.0.0.1", port, backlog=1024
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"listening {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.model_server")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port, args.delay))
    return 0


if __name__ == "__main__":
    sys.exit(main())
