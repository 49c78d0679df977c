"""Server-sent events: framing for the server and an incremental parser for clients (tests, replay, load test).

Wire format (Workers AI and OpenAI alike): each event is ``data: <json>\\n\\n``; the stream ends with
``data: [DONE]``.
"""

from __future__ import annotations

import json

DONE = "[DONE]"
DONE_FRAME = b"data: [DONE]\n\n"


def frame(obj) -> bytes:
    """One ``data:`` event holding ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class SSEParser:
    """Feed text as it arrives; get back the ``data`` payloads of the events it completed (multi-line data is
    joined with newlines, comments and other fields are ignored)."""

    def __init__(self):
        self._buf = ""
        self._data: list[str] = []

    def feed(self, text: str) -> list[str]:
        self._buf += text.replace("\r\n", "\n")
        out = []
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            if line == "":
                if self._data:
                    out.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))
        return out


def parse_events(text: str) -> list[str]:
    """All ``data`` payloads of a complete SSE body."""
    p = SSEParser()
    return p.feed(text if text.endswith("\n\n") else text + "\n\n")
