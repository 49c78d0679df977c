"""Typed errors of the data plane.

Every error a caller can cause is a subclass of :class:`edgepop.errors.UserError`, so the CLI prints it as
one line, and the gateway can map each class to a Workers AI error code through ``code``.
"""

from __future__ import annotations

from edgepop.errors import UserError


class DataPlaneError(UserError):
    """Base class of data-plane errors; ``code`` is a stable short name the gateway maps to an HTTP error."""

    code = "dataplane_error"


class InvalidInputError(DataPlaneError):
    """A request's input is malformed: a missing field, a wrong type, an out-of-range value, bad bytes."""

    code = "invalid_input"


class ModelNotFoundError(DataPlaneError):
    """No model of that name is registered."""

    code = "model_not_found"


class ManifestError(DataPlaneError):
    """A bring-your-own-model manifest is malformed or does not match its ONNX file."""

    code = "invalid_manifest"


class CapacityError(DataPlaneError):
    """A request can never fit (e.g. prompt plus max_tokens exceeds the context or the KV budget)."""

    code = "capacity_exceeded"


class RequestCancelledError(DataPlaneError):
    """The request was cancelled before it finished."""

    code = "cancelled"


class EngineClosedError(DataPlaneError):
    """The engine was shut down; it accepts no more requests."""

    code = "engine_closed"
