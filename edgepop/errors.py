"""Error types shared by every edgepop package (a leaf module: it imports nothing from the project)."""


class UserError(Exception):
    """A mistake in user input (a file, a field, a value, a flag).

    The CLI prints it as one line, without a traceback, and exits with status 2.
    """


class MachineError(Exception):
    """The machine, not the input nor the code, ended the work (a worker process killed by a signal or the
    out-of-memory killer). The CLI prints it as one line, without a traceback, and exits with status 1."""


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

