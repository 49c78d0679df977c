"""Running a gateway: under uvicorn in this process (a thread, for tests and benchmarks) or as a real
``edgepop serve`` subprocess (for crash tests and load tests). Servers bind to loopback addresses only here.

:class:`GatewayServer` is the uvicorn server of ``edgepop serve``: on SIGTERM or SIGINT it stops accepting
connections, tells the gateway to drain (no more batch items claimed), waits up to ``drain_timeout_s`` for
in-flight requests and streams, and returns normally so the process exits 0 (plain uvicorn re-raises the signal
after its graceful shutdown, which ends the process with status -15). A second SIGINT brings the drain deadline
forward: the gateway answers what is in flight now (503, a stream's error frame) and stops waiting for running batch
items (they go back to the queue); the exit status is 0 still. Once
started it freezes its start-up objects out of the garbage collector's passes (:func:`edgepop.memory.freeze_startup`:
each full collection otherwise walked them again, pausing every engine thread for tens of ms).
Idle client connections are kept ``keep_alive_s`` (75 s by default), longer than clients keep theirs (httpx and
the ``openai`` client: 5 s), so a client never sends a request on a connection the server is just closing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from edgepop.errors import UserError
from edgepop.memory import freeze_startup

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# uvicorn's own deadline comes this long after the gateway's: by then the gateway has answered what was still in
# flight (503 / an in-band error frame) instead of uvicorn cancelling it into a plain-text 500.
DRAIN_GRACE_S = 1.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url/healthz`` until it answers 200 (raises RuntimeError on timeout or if ``proc`` died)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server at {url} not healthy after {timeout_s} s")


def uvicorn_config(app, host: str, port: int, log_level: str = "warning"):
    """The uvicorn settings of a gateway app: keep-alive and drain timeout from its config."""
    import uvicorn

    cfg = app.state.gateway.config
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on",
                          timeout_keep_alive=cfg.keep_alive_s, timeout_graceful_shutdown=cfg.drain_timeout_s + DRAIN_GRACE_S)


def _server_class():
    import uvicorn

    class GatewayServer(uvicorn.Server):
        """uvicorn, draining the gateway on SIGTERM/SIGINT and exiting normally afterwards."""

        def __init__(self, config, on_drain=None, on_force=None):
            super().__init__(config)
            self.on_drain, self.on_force = on_drain, on_force
            self._loop = None
            self._forced = False  # a second SIGINT came: the drain deadline was brought forward

        async def serve(self, sockets=None) -> None:
            import asyncio

            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)  # the app's start-up (engines loaded and warmed), then the sockets
            if not self.should_exit:
                # This process serves until it exits: its full collections stop walking the start-up objects
                # (edgepop.memory.freeze_startup; in-process test servers keep the collector as it is).
                freeze_startup()

        def handle_exit(self, sig, frame) -> None:
            first = not self.should_exit
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # drained: return normally instead of dying of the signal
            if first:
                print(f"edgepop gateway: {signal.Signals(sig).name}: draining (up to "
                      f"{self.config.timeout_graceful_shutdown - DRAIN_GRACE_S:g} s)", file=sys.stderr, flush=True)
                if self.on_drain is not None and self._loop is not None:
                    self._loop.call_soon_threadsafe(self.on_drain)
            elif self.force_exit and self.on_force is not None and self._loop is not None and not self._forced:
                # Not uvicorn's force_exit, which skips the app's shutdown (its lifespan task, and the streams still
                # open, were then cancelled with tracebacks, the streams cut without a closing frame): the drain
                # deadline now instead, the gateway answering what is in flight; a third SIGINT is uvicorn's.
                self.force_exit, self._forced = False, True
                print(f"edgepop gateway: {signal.Signals(sig).name} again: stopping now", file=sys.stderr, flush=True)
                self._loop.call_soon_threadsafe(self._stop_now)

        def _stop_now(self) -> None:
            self.on_force()
            # As at uvicorn's own deadline, DRAIN_GRACE_S after the gateway's: what is left by then is cancelled.
            self._loop.call_later(DRAIN_GRACE_S, self._cancel_left)

        def _cancel_left(self) -> None:
            for task in list(self.server_state.tasks):
                task.cancel(msg="edgepop gateway: stopped by a second SIGINT")

    return GatewayServer


def gateway_server(app, host: str, port: int, log_level: str = "warning"):
    """A :class:`GatewayServer` for ``app`` (call ``.run()``)."""
    return _server_class()(uvicorn_config(app, host, port, log_level), on_drain=app.state.begin_drain,
                           on_force=app.state.force_exit)


class ServerThread:
    """A uvicorn server for ``app`` on a background thread: ``with ServerThread(app) as url: ...``."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None):
        self.host, self.port = host, port or free_port(host)
        self.server = gateway_server(app, self.host, self.port)
        self.thread = threading.Thread(target=self.server.run, name="edgepop-uvicorn", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway server failed to start")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def spawn_serve(args: list[str], port: int | None = None, env: dict | None = None, log: Path | None = None,
                timeout_s: float = 90.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m edgepop serve ARGS --host 127.0.0.1 --port PORT`` and wait until it is healthy."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "edgepop", "serve", *args, "--host", "127.0.0.1", "--port", str(port)]
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s, proc)
    except RuntimeError:
        proc.kill()
        proc.wait()
        raise
    return proc, url


def require_loopback(url: str) -> None:
    """Refuse a target that is not on this machine (load tests and replays stay on loopback)."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except Exception:  # noqa: BLE001 (httpx raises several kinds for a malformed URL)
        parsed = None
    if parsed is None or parsed.scheme not in ("http", "https") or not parsed.host:
        raise UserError(f"{url!r} is not a URL (expected http://127.0.0.1:PORT)")
    host = parsed.host
    if host not in LOOPBACK and not host.startswith("127."):
        raise UserError(f"{url}: only loopback targets (127.0.0.0/8, localhost, ::1) are allowed")
