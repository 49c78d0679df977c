"""ASGI pieces of the gateway's app: the status-counting middleware, the SSE answer, and the disconnect watch."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from dataplane.gateway.errors import shutting_down
from dataplane.gateway.sse import DONE_FRAME, frame


class StatusCounter:
    """Pure ASGI middleware counting responses per route template and status (cheaper than BaseHTTPMiddleware,
    and safe with streaming). It also answers any exception a route lets out, through ``on_error``: Starlette's
    own catch-all answers outside every middleware, so its responses went uncounted and the error was logged
    twice (by the handler and by the server, which gets the exception re-raised)."""

    def __init__(self, app, metrics, on_error):
        self.app, self.metrics, self.on_error = app, metrics, on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def counted(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                route = scope.get("route")
                self.metrics.http.labels(getattr(route, "path", "unrouted"), str(message["status"])).inc()
            await send(message)

        try:
            return await self.app(scope, receive, counted)
        except Exception as exc:
            if started:
                raise  # mid-response: there is no status line left to answer with
            response = self.on_error(Request(scope), exc)
        await response(scope, receive, counted)


async def disconnected(request: Request) -> None:
    """Return when the client has disconnected (the body is read already: the next ASGI message is the
    disconnect, which the server sends only when the connection closes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class SSEStream(StreamingResponse):
    """An SSE answer whose generation is stopped, and counted as 499, when its client leaves before the end, even
    before the first byte: Starlette then cancels the response without ever starting its body iterator, so the
    generation :meth:`Call.stream` would have stopped would run on, holding its slot.

    At the drain deadline (``gw.stopped``) a stream still going is ended by the gateway rather than cancelled by
    uvicorn: its generation stops, it is counted once as 503/3043, and it ends with an in-band error frame (the
    route's shape, ``openai``) and ``[DONE]``."""

    def __init__(self, content, call, headers: dict, openai: bool = False):
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.call, self.openai = call, openai

    async def __call__(self, scope, receive, send):
        started = False

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        body = asyncio.ensure_future(super().__call__(scope, receive, sending))
        try:
            await asyncio.wait(self.call.gw.or_stopped(body), return_when=asyncio.FIRST_COMPLETED)
            if body.done():
                return body.result()
            body.cancel()  # (a cancelled stream during a drain is not counted as gone: it is counted below)
            with contextlib.suppress(asyncio.CancelledError):
                await body
            await self._stopped(started, send)
        except BaseException:
            body.cancel()
            raise
        finally:
            if not self.call.stream_ended:
                self.call.abandon()

    async def _stopped(self, started: bool, send) -> None:
        call, err = self.call, shutting_down()
        call.gw.metrics.rejected(call.model, call.endpoint, err, call.place, pop=call.gw.backend.pop_of(call.lease.replica))
        if not started:  # no status line sent yet: the error is the answer
            body = err.openai_body() if self.openai else err.envelope()
            await JSONResponse(body, status_code=err.openai_status() if self.openai else err.status)(
                {"type": "http"}, None, send)
            return
        data = err.openai_body() if self.openai else {"error": {"code": err.code, "message": err.message}}
        await send({"type": "http.response.body", "body": frame(data) + DONE_FRAME, "more_body": False})
