"""The console the commands print their tables on.

On a terminal, rich fits a table to the terminal's width. Piped into a file or a CI log, rich assumes 80
columns and wraps every cell of a wide table over several lines; a file has no width, so there the console is
wide enough for the table (``COLUMNS``, when set, still wins: the user asked for that width).
"""

from __future__ import annotations

import os


def table_console(piped_width: int = 150):
    """A ``rich`` console for stdout: the terminal's width, or ``piped_width`` columns when stdout is not a
    terminal and ``COLUMNS`` is not set."""
    from rich.console import Console

    console = Console()
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        return console
    return Console(width=piped_width)
