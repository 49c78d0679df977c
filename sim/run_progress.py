"""The progress shown while a scenario runs: one bar per deployment on stderr (``edgepop simulate``'s), or a
caller's own function."""

from __future__ import annotations

import contextlib

from edgepop.errors import UserError


def check_progress(progress) -> None:
    """``progress`` as :func:`sim.run.run_scenario` takes it: True, False, None or a function; one-line error else."""
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise UserError(f"progress must be True, False, None or a function (deployment, done, total), "
                        f"got {progress!r}")


@contextlib.contextmanager
def simulation_progress(progress):
    """Gives the function a simulation reports to, ``(deployment, requests done, total)``, or None for no progress.
    ``progress``: True, a bar per deployment on stderr (transient, as ``edgepop simulate`` shows it); ``"auto"``,
    the same when stderr is a terminal; None or False, nothing; a function, that function."""
    if progress is None or progress is False:
        yield None
        return
    if callable(progress):
        yield progress
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    enabled = console.is_terminal if progress == "auto" else True
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                  TimeElapsedColumn(), console=console, transient=True, disable=not enabled) as bar:
        tasks = {}

        def advance(name, i, n):
            if name not in tasks:
                tasks[name] = bar.add_task(f"simulating {name}", total=n)
            bar.update(tasks[name], completed=i)

        yield advance
