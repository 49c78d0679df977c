"""A minimal HTTP/1.1 keep-alive client for load generation on loopback.

Why not httpx: a load generator shares the machine's cores with the gateway it loads, and httpx spends about
0.9 ms of CPU per request (measured against the gateway on the 2-core machine), so at 256 clients the generator
takes a quarter of a core that the server needs, and more the more requests are refused and retried. This client
writes one request on one persistent connection and reads one response with a ``Content-Length`` body (the
gateway's non-streaming answers all have one): a few times cheaper. It speaks only that subset of HTTP; anything
else (chunked bodies, a closed connection) raises :class:`LightHTTPError`, counted by the caller like any other
transport error.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit


class LightHTTPError(Exception):
    """The connection failed or the response used HTTP this client does not speak."""


class LightResponse:
    """Status, lower-cased headers and body of one response."""

    __slots__ = ("status_code", "headers", "content")

    def __init__(self, status_code: int, headers: dict, content: bytes):
        self.status_code, self.headers, self.content = status_code, headers, content

    def json(self):
        return json.loads(self.content)


class LightClient:
    """One keep-alive connection to ``base_url`` (opened on first use, reopened after a failure)."""

    def __init__(self, base_url: str, timeout_s: float = 120.0):
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"{base_url}: LightClient speaks plain http:// only")
        self.host, self.port = u.hostname, u.port or 80
        self.timeout_s = timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post_json(self, path: str, body: dict, headers: dict) -> LightResponse:
        """POST ``body`` as JSON to ``path``; raises LightHTTPError on transport failures."""
        data = json.dumps(body).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        req = (f"POST {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(data)}\r\n{head}\r\n").encode() + data
        try:
            return await asyncio.wait_for(self._exchange(req), self.timeout_s)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
            await self.aclose()
            raise LightHTTPError(f"{type(exc).__name__}: {exc}") from exc

    async def _exchange(self, req: bytes) -> LightResponse:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        self._writer.write(req)
        raw = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        if "content-length" not in headers:
            await self.aclose()
            raise LightHTTPError(f"response {status} without content-length "
                                 f"(transfer-encoding {headers.get('transfer-encoding')!r})")
        content = await self._reader.readexactly(int(headers["content-length"]))
        if headers.get("connection", "").lower() == "close":
            await self.aclose()
        return LightResponse(status, headers, content)

    async def aclose(self) -> None:
        w, self._reader, self._writer = self._writer, None, None
        if w is not None:
            w.close()
            try:
                await w.wait_closed()
            except OSError:
                pass
