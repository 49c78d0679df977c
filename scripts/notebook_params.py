"""The environment readers every notebook's parameters cell defines (inline, so a notebook stands alone): a bad
``EDGEPOP_NB_*`` value stops that cell with one error naming the variable and its value, not cells later."""

ENV_READERS = r'''
import math
import os
import re


def env_int(name, default, least):
    """``name`` from the environment, or ``default``: a value that is not a whole number >= ``least`` stops here,
    naming the variable (not as an error cells later)."""
    text = os.environ.get(name, default)
    value = int(text) if re.fullmatch(r"\s*[+-]?\d+\s*", text) else None
    if value is None or value < least:
        raise ValueError(f"{name}={text!r}: expected a whole number >= {least}")
    return value


def _positive(text):
    """``text`` as a finite number > 0, or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def env_float(name, default):
    """``name`` from the environment, or ``default``: a value that is not a finite number > 0 stops here."""
    text = os.environ.get(name, default)
    value = _positive(text)
    if value is None:
        raise ValueError(f"{name}={text!r}: expected a finite number > 0")
    return value


def env_floats(name, default):
    """``name`` from the environment, or ``default``: comma-separated finite numbers > 0, at least one (an empty
    item, as in ``25,,100``, stops here too)."""
    text = os.environ.get(name, default)
    values = [_positive(x) for x in text.split(",")]
    if None in values:
        raise ValueError(f"{name}={text!r}: expected comma-separated finite numbers > 0")
    return values
'''
