"""Per-request timelines: where a request's time went on its way through the gateway, for sim-vs-live comparisons.

A client that sends ``x-edgepop-trace: <id>`` gets its request's server-side stages recorded as
``time.monotonic()`` stamps (the system-wide monotonic clock, so a client on the same host can put them next to
its own stamps and have them add up to what it measured): when the request reached the application, was
validated and tokenized, waited out the injected inbound WAN delay, got the control plane's decision, had its
slot at the serving replica, was handed to that replica's engine; the engine's own record
(:class:`dataplane.lm_handle.LMTiming`: admitted into the batch, first and last token, decode steps, stalls);
and, for a stream, when each piece was produced and when it was written out (the per-token streaming cost: the
hop from the engine thread to the event loop, the injected return delay, SSE framing) and when the response's
last byte went out. ``GET /edgepop/timings?trace=PREFIX`` returns the recorded timelines whose id starts with
PREFIX and the host's CPU use per thread (engines, event loop), so an error can be located, not only measured.

Untraced requests carry a timeline too (a few stamps) but nothing is kept of them.
"""

from __future__ import annotations

import contextvars
import math
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field

TRACE_HEADER = "x-edgepop-trace"
_TRACE_KEY = TRACE_HEADER.encode()
_current: contextvars.ContextVar[Timeline | None] = contextvars.ContextVar("edgepop_timeline", default=None)
NAN = math.nan


@dataclass
class Timeline:
    """Monotonic stamps (s) of one request's stages at the gateway; NaN for stages it never reached."""

    trace: str = ""
    recv: float = field(default_factory=time.monotonic)  # the application got the request
    prepared: float = NAN  # body read, validated, tokenized
    wan_in_end: float = NAN  # the injected access half-RTT waited out (the control plane decides now)
    decided: float = NAN  # the control plane's decision is made
    ready: float = NAN  # a slot at the serving replica, and the injected backbone half-RTT waited out
    engine_submit: float = NAN  # handed to the replica's engine
    backbone_s: float = 0.0  # the injected ingress -> serving PoP one-way delay
    back_s: float = 0.0  # the injected one-way delay of every piece back to the client
    replica: int = -1
    first_gen: float = NAN  # the first piece was produced by the engine ...
    first_sent: float = NAN  # ... and written out
    last_gen: float = NAN
    last_sent: float = NAN
    pieces: int = 0
    late_s: float = 0.0  # sum over pieces of written - (produced + back_s): streaming cost beyond the WAN delay
    response_end: float = NAN  # the response's last byte was handed to the server to write
    engine: object = None  # the engine's LMTiming (text generation) or None

    def piece(self, t_gen: float, t_sent: float) -> None:
        """A piece produced at ``t_gen`` was written out at ``t_sent``."""
        if self.pieces == 0:
            self.first_gen, self.first_sent = t_gen, t_sent
        self.last_gen, self.last_sent = t_gen, t_sent
        self.pieces += 1
        self.late_s += t_sent - t_gen - self.back_s

    def as_dict(self) -> dict:
        out = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in self.__dict__.items()
               if k != "engine"}
        out["engine"] = self.engine.as_dict() if self.engine is not None else None
        return out


def current() -> Timeline:
    """The timeline of the request being served (a fresh, unkept one outside a traced request)."""
    tl = _current.get()
    return tl if tl is not None else Timeline()


class TimelineStore:
    """The last ``maxlen`` traced requests' timelines, and the id of the event loop's thread."""

    def __init__(self, maxlen: int = 50_000):
        self.timelines: deque[Timeline] = deque(maxlen=maxlen)
        self.loop_thread: int | None = None

    def describe(self, prefix: str = "") -> dict:
        """``GET /edgepop/timings``: the timelines traced with ids starting with ``prefix``, and the host."""
        rows = [t.as_dict() for t in list(self.timelines) if t.trace.startswith(prefix)]
        return {"clock": "monotonic", "now": time.monotonic(), "requests": rows, "host": host_cpu(self.loop_thread)}


class TimelineMiddleware:
    """Pure ASGI middleware: a request with ``x-edgepop-trace`` gets a :class:`Timeline` (stamped on arrival and
    when its last byte is written) that the gateway's stages fill in; it is kept in ``store``."""

    def __init__(self, app, store: TimelineStore):
        self.app, self.store = app, store

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.store.loop_thread is None:
            self.store.loop_thread = threading.get_native_id()
        trace = next((v for k, v in scope.get("headers", ()) if k == _TRACE_KEY), None)
        if trace is None:
            return await self.app(scope, receive, send)
        tl = Timeline(trace.decode("latin-1")[:200])
        token = _current.set(tl)

        async def stamped(message):
            # stamped as the last body is handed to the server, before the write: after it, the event loop may
            # resume this coroutine later than the client reads the bytes (http_out came out negative)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                tl.response_end = time.monotonic()
            await send(message)

        try:
            await self.app(scope, receive, stamped)
        finally:
            _current.reset(token)
            self.store.timelines.append(tl)


def host_cpu(loop_thread: int | None = None) -> dict:
    """This process's CPU seconds per thread (Linux ``/proc``; empty elsewhere), the host's cores and load.

    Thread roles: ``engine`` (data-plane engine threads), ``event-loop`` (the HTTP server and the gateway's
    asyncio code), ``other`` (onnxruntime pools, batch worker, ...). Differences of two snapshots give what each
    used over a run: the host CPU the engines and the HTTP server shared."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    threads = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        tids = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime (fields 14, 15 of stat)
        name = names.get(int(tid), "")
        role = ("event-loop" if int(tid) == loop_thread else "engine" if name.startswith("edgepop-")
                else "other")
        threads.append({"tid": int(tid), "name": name, "role": role, "cpu_s": cpu})
    return {"cores": os.cpu_count(), "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
            "process_cpu_s": time.process_time(), "threads": threads}
