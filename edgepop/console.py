"""The console the commands print their tables on.

On a terminal, rich fits a table to the terminal's width. Piped into a file or a CI log, rich assumes 80
columns (or ``COLUMNS``, which some tools export as 80 for their child processes) and wraps every cell of a wide
table over several lines; a file has no width, so there the console is wide enough for the table, or wider where
``COLUMNS`` asks for more.
"""

from __future__ import annotations

import os


def table_console(piped_width: int = 150):
    """A ``rich`` console for stdout: the terminal's width, or, when stdout is not a terminal, ``piped_width``
    columns (``COLUMNS`` where it is a larger number)."""
    from rich.console import Console

    console = Console()
    if console.is_terminal:
        return console
    columns = os.environ.get("COLUMNS", "")
    return Console(width=max(piped_width, int(columns) if columns.isdigit() else 0))
