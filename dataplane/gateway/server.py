"""Running a gateway: under uvicorn in this process (a thread, for tests and benchmarks) or as a real
``edgepop serve`` subprocess (for crash tests and load tests). Servers bind to loopback addresses only here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from edgepop.errors import UserError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


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


class ServerThread:
    """A uvicorn server for ``app`` on a background thread: ``with ServerThread(app) as url: ...``."""

    def __init__(self, app, host: str = "127.0.0.1", port: int | None = None):
        import uvicorn

        self.host, self.port = host, port or free_port(host)
        config = uvicorn.Config(app, host=self.host, port=self.port, log_level="warning", access_log=False,
                                lifespan="on")
        self.server = uvicorn.Server(config)
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

    host = httpx.URL(url).host
    if host not in LOOPBACK and not host.startswith("127."):
        raise UserError(f"{url}: only loopback targets (127.0.0.0/8, localhost, ::1) are allowed")
