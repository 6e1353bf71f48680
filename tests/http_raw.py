"""Raw HTTP/1.1 over a socket, for what httpx will not do on purpose (a body cut off, a head
trickled, a body streamed on after the answer), and a server process's resident memory."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

TIMEOUT = 30.0


def connect(url: str, timeout: float = TIMEOUT) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=timeout)


def head(method: str, path: str, headers: dict[str, str], length: int | None = None) -> bytes:
    """A request line and headers; ``length`` None sends the body chunked."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append("Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict[str, object]:
        found: dict[str, object] = json.loads(self.body)
        return found

    @property
    def reason(self) -> str:
        return str(self.json()["error"]["reason"])  # type: ignore[index]


def read_answer(sock: socket.socket) -> Answer | None:
    """The one answer on the socket (read until it closes or the body is whole); None when
    it closed first."""
    data = b""
    while b"\r\n\r\n" not in data:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:
            piece = b""
        if not piece:
            return None
        data += piece
    top, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines)}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:
            break
        if not piece:
            break
        body += piece
    return Answer(int(status_line.split()[1]), headers, body)


def send_streaming(sock: socket.socket, pieces: Iterable[bytes]) -> Answer | None:
    """Send ``pieces`` from a thread while the answer is read here: a server that answers
    and closes mid-body is seen answering (the sender then stops on the broken pipe)."""

    def send() -> None:
        try:
            for piece in pieces:
                sock.sendall(piece)
        except OSError:
            pass  # the server closed: it has answered, or will not

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        return read_answer(sock)
    finally:
        with contextlib.suppress(OSError):  # already reset by the server
            sock.shutdown(socket.SHUT_RDWR)
        sender.join(TIMEOUT)
        sock.close()


def chunked(pieces: Iterable[bytes]) -> Iterable[bytes]:
    """``pieces`` in HTTP/1.1 chunked encoding, with the last chunk."""
    for piece in pieces:
        yield b"%x\r\n" % len(piece) + piece + b"\r\n"
    yield b"0\r\n\r\n"


class Resident:
    """A process's resident memory: ``reset()`` starts a new peak, ``growth()`` is the peak
    since then over the resident size then, in bytes (from /proc/PID/status)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = 0

    def _status(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise LookupError(field)

    def reset(self) -> None:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.base = self._status("VmRSS")

    def growth(self) -> int:
        return self._status("VmHWM") - self.base
