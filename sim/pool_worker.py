"""Ctrl-C and the sweep's process pool: how a worker starts and what a dead worker's exit code means.

Kept free of heavy imports on purpose: a spawned worker imports this module (to run :func:`start_worker`, the
pool's initializer) before anything else of the project, while it still has SIGINT blocked. The initializer then
imports the users' modules that register policies the sweep may use (:mod:`edgepop.plugins`), and the pool runs
each variant through :func:`run_task`.
"""

from __future__ import annotations

import contextlib
import os
import signal


@contextlib.contextmanager
def sigint_blocked():
    """Around starting pool workers (in the thread that starts them): a spawned worker inherits the blocked
    signal, so a Ctrl-C during its seconds of imports stays pending until :func:`quiet_on_interrupt` has taken
    over, instead of raising KeyboardInterrupt (a traceback per worker) in the middle of an import. In this
    process a Ctrl-C in the meantime is only held back until the block ends."""
    if not hasattr(signal, "pthread_sigmask"):  # (not on Windows, which has no process groups to signal either)
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def quiet_on_interrupt() -> None:
    """The pool's initializer. Ctrl-C (SIGINT to the whole process group) ends the worker at once and silently;
    the command's own process reports the interruption. Where that process ignores SIGINT (a script's
    ``cmd &``), the worker inherited the ignore and keeps it: it carries on, as its parent does."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    if hasattr(signal, "pthread_sigmask"):  # a Ctrl-C that came while the worker started is delivered now
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


_import_problems: list[str] = []  # in a worker: the users' modules its initializer could not import


def start_worker(modules=()) -> None:
    """The pool's initializer: :func:`quiet_on_interrupt`, then import ``modules``, the (module name, file) pairs
    of :func:`edgepop.plugins.worker_modules` (the parent's registered policies from outside edgepop). A module
    that fails is noted, and named by :func:`run_task` should a policy the sweep uses then be missing."""
    quiet_on_interrupt()
    if modules:
        from edgepop.plugins import import_worker_modules

        _import_problems.extend(import_worker_modules(modules))


def run_task(task, expected=(), run=None) -> dict:
    """Run one sweep variant in a pool worker: :func:`sim.sweep_plugins.run_prepared`, which first checks that
    the users' entries the variant uses (``expected``: (registry kind, name) pairs) are registered here, then calls
    ``run`` (default :func:`sim.sweep_variant.run_variant`)."""
    from sim.sweep_plugins import run_prepared

    return run_prepared(task, (), expected, run, _import_problems)


def stop_pool(pool, exc: BaseException | None = None) -> None:
    """Shut ``pool`` down, starting no more of its work; on the way out of an interrupt, without waiting for the
    running work. A Ctrl-C in a terminal reaches the workers too (the whole process group), but an interrupt sent
    to this process alone (a Jupyter kernel's, ``kill -INT <pid>``) does not: on ``KeyboardInterrupt`` the workers
    are sent SIGINT (they end quietly, :func:`quiet_on_interrupt`), on :class:`edgepop.errors.Terminated` SIGTERM;
    otherwise the running work ends first."""
    from edgepop.errors import Terminated

    sig = (signal.SIGINT if isinstance(exc, KeyboardInterrupt) else
           signal.SIGTERM if isinstance(exc, Terminated) else None)
    if sig is not None:
        # the pool's record of its workers (a private attribute: without it, the shutdown below waits for them)
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(OSError, ValueError):  # (ended meanwhile, or already reaped)
                if proc.is_alive():
                    os.kill(proc.pid, sig)
    pool.shutdown(wait=True, cancel_futures=True)


def why_workers_died(exitcodes) -> str:
    """What the exit codes of a broken pool's workers say (``None``: not ended yet), for the error message. The
    pool terminates the survivors itself (SIGTERM) once one dies, so any other cause is named first."""
    causes = []
    codes = {c for c in exitcodes if c not in (None, 0)}
    if codes - {-signal.SIGTERM}:  # the survivors' SIGTERM is the pool's clean-up, not a second cause
        codes.discard(-signal.SIGTERM)
    for code in sorted(codes):
        if code == 130:  # quiet_on_interrupt's exit
            causes.append("was interrupted (SIGINT, Ctrl-C)")
        elif code < 0:
            causes.append(f"was killed by signal {_signal_name(-code)}" + (
                " (the out-of-memory killer's signal, or kill -9)" if -code == signal.SIGKILL else ""))
        else:
            causes.append(f"exited with status {code}")
    guard = ("a script that starts a sweep without an `if __name__ == '__main__':` guard (workers are spawned and "
             "re-import the main module)")
    if not causes:
        return f"a sweep worker process died: out of memory, killed, or {guard}"
    said = "a sweep worker process " + "; another ".join(causes)
    return said + (f" (a status, not a signal: an error at its start, e.g. {guard})"
                   if all(c.startswith("exited") for c in causes) else "")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)
