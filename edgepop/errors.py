"""Error types shared by every edgepop package (a leaf module: it imports nothing from the project)."""


class UserError(Exception):
    """A mistake in user input (a file, a field, a value, a flag).

    The CLI prints it as one line, without a traceback, and exits with status 2.
    """


class MachineError(Exception):
    """The machine, not the input nor the code, ended the work (a worker process killed by a signal or the
    out-of-memory killer). The CLI prints it as one line, without a traceback, and exits with status 1."""


class Terminated(BaseException):
    """Raised by the CLI's SIGTERM handler (a BaseException, as KeyboardInterrupt is: no ``except Exception`` eats
    it). The CLI prints ``edgepop: terminated`` and exits with status 143."""


_sigterm_seen = False  # set by on_sigterm; see raise_if_terminated


def on_sigterm(signum=None, frame=None) -> None:
    """SIGTERM handler: unwind like Ctrl-C. Python runs a handler between any two bytecodes, including inside a
    finaliser or a weakref callback, where the exception is printed as "ignored" and dropped; the flag set here
    keeps the request, and :func:`raise_if_terminated` raises it again at the next checkpoint."""
    global _sigterm_seen
    _sigterm_seen = True
    raise Terminated()


def raise_if_terminated() -> None:
    """Raise :class:`Terminated` if SIGTERM arrived (even where its exception was swallowed). Checked before an
    output is moved into place and between units of long work."""
    if _sigterm_seen:
        raise Terminated()


def forget_sigterm() -> None:
    """Clear the flag (the CLI does at the start of each command, so one in-process run does not end the next)."""
    global _sigterm_seen
    _sigterm_seen = False


class DataFileError(UserError):
    """A malformed data file; the message names the file, the row and the field."""

    def __init__(self, path: object, row: int | None, field: str | None, problem: str):
        where = str(path)
        if row is not None:
            where += f", row {row}"
        if field is not None:
            where += f", field '{field}'"
        super().__init__(f"{where}: {problem}")
        self.path, self.row, self.field, self.problem = path, row, field, problem


def is_real(value) -> bool:
    """Whether a value given for a numeric field is a real number: Python's or numpy's ints and floats, not a bool
    (``True`` is an int) nor a string. Range checks (finite, positive) are the caller's."""
    from numbers import Real

    return isinstance(value, Real) and not isinstance(value, bool)

