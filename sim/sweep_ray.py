"""The ``ray`` engine of :func:`sim.sweep.run_sweep`: variants as Ray tasks.

With ``RAY_ADDRESS`` set (``ray://head:10001``, which needs ``pip install 'ray[client]'``, or ``auto``), the sweep
joins that cluster, whose nodes must have edgepop installed (the same version as here). Otherwise it starts a local
Ray instance with ``workers`` CPUs (no dashboard, worker logs not forwarded) and shuts it down afterwards. A Ray
session that is already initialised (``ray.init`` called by the caller) is used as it is and left running.
"""

from __future__ import annotations

import os
import signal
import threading

from edgepop.errors import UserError
from edgepop.plugins import worker_modules
from sim.sweep_plugins import run_prepared


def _ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise UserError("the ray engine needs the 'ray' package: pip install 'edgepop[ray]' "
                        "(or use --engine local)") from None
    return ray


def start_ray(workers: int | None) -> bool:
    """Join ``RAY_ADDRESS`` or start a local Ray with ``workers`` CPUs, unless a session is already running;
    True when this call started one (the caller shuts it down)."""
    ray = _ray()
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    # ray.init installs a SIGTERM handler of its own (exit at once): the caller's (the CLI's, which unwinds so that
    # the sweep's staged output folder is removed) is put back.
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    try:
        if address:
            try:
                _answers(address)
                ray.init(address=address, log_to_driver=False)
            except (ValueError, ConnectionError, RuntimeError, TimeoutError) as exc:  # a bad or unreachable address
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise UserError(f"RAY_ADDRESS={address!r}: Ray could not join it: {first}") from None
        else:
            ray.init(num_cpus=workers or os.cpu_count() or 1, include_dashboard=False, log_to_driver=False,
                     logging_level="warning")
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)
    return True


def _answers(address: str) -> None:
    """Raise ConnectionError when nothing accepts a TCP connection at a ``host:port`` address (plain or ``ray://``)
    within 5 s: Ray itself retries an unreachable head for minutes before it gives up. ``auto`` and other forms are
    left to Ray."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise ConnectionError(f"nothing answers at {host}:{port} ({exc.strerror or type(exc).__name__})") from None


def run_on_ray(tasks: list, workers: int | None, collect, expected=()) -> None:
    """Run :func:`sim.sweep_variant.run_variant` on every task, at most ``workers`` in flight when given;
    ``collect`` each result as it arrives (the caller orders them). Each Ray worker first imports the modules of
    the policies registered from outside edgepop and checks that those a variant uses (``expected``, per variant)
    are there (:func:`sim.sweep_plugins.run_prepared`)."""
    ray = _ray()
    started = start_ray(workers)
    modules = worker_modules()
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(run_prepared)
        limit = workers or len(tasks)
        queue, pending = list(tasks), []
        while queue or pending:
            while queue and len(pending) < limit:
                task = queue.pop(0)
                pending.append(remote.remote(task, modules, expected[task.variant.id] if expected else ()))
            done, pending = signal_safe(ray.wait, pending, num_returns=1)
            for ref in done:
                collect(signal_safe(ray.get, ref))
    finally:
        if started:
            ray.shutdown()


def signal_safe(call, *args, **kwargs):
    """``call(*args, **kwargs)``, re-raising a signal handler's exception (Ctrl-C's KeyboardInterrupt, the CLI's
    SIGTERM unwinding) that Ray's compiled wait or get wrapped in a SystemError, so the caller's clean-up and exit
    status are the same as with the local engine."""
    try:
        return call(*args, **kwargs)
    except SystemError as exc:
        cause = exc.__cause__
        if isinstance(cause, BaseException) and not isinstance(cause, Exception):
            raise cause from None
        raise
