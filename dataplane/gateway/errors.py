"""HTTP errors of the gateway, each with a Workers AI code, and the mapping from data- and control-plane errors.

Codes (developers.cloudflare.com/workers-ai/platform/errors, plus the Cloudflare API's auth code):

=======================  ====  =====
what                     HTTP  code
=======================  ====  =====
malformed JSON / schema  400   5006 (Workers AI's "Bad input")
unknown model            400   5007
request too large        413   3006
request timeout          408   3007
out of capacity          429   3040
internal error           500   3043
no / bad token           401   10000
another account          403   10000
no such batch request    404   7003
=======================  ====  =====
"""

from __future__ import annotations

from controlplane.outcomes import HTTP_STATUS, MESSAGES, Code
from dataplane import errors as dp_errors

BAD_INPUT = 5006
AUTH = 10000
NOT_FOUND = 7003


class GatewayError(Exception):
    """An error answer: HTTP ``status``, Workers AI ``code`` and a one-line ``message``."""

    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message

    def envelope(self) -> dict:
        """The Workers AI REST error envelope."""
        return {"result": None, "success": False, "errors": [{"code": self.code, "message": self.message}],
                "messages": []}

    def openai_body(self) -> dict:
        """The OpenAI error shape (what the ``openai`` client parses)."""
        kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "invalid_request_error",
                429: "rate_limit_error"}.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "code": self.code, "param": None}}


def bad_input(message: str) -> GatewayError:
    return GatewayError(400, BAD_INPUT, message)


def from_code(code: int, detail: str | None = None) -> GatewayError:
    """A control-plane decision code (3006, 3007, 3040, 3043, 5007) as an HTTP error."""
    c = Code(code)
    text = MESSAGES[c] + (f": {detail}" if detail else "")
    return GatewayError(HTTP_STATUS[c], int(c), text)


def unknown_model(model: str) -> GatewayError:
    return from_code(Code.NO_SUCH_MODEL, f"{model!r} is not served here (GET .../ai/models/search lists them)")


def from_exception(exc: BaseException) -> GatewayError:
    """Map a data-plane error to its HTTP error; anything unexpected is a 500 (3043)."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, dp_errors.InvalidInputError):
        return bad_input(str(exc))
    if isinstance(exc, dp_errors.CapacityError):
        return from_code(Code.TOO_LARGE, str(exc))
    if isinstance(exc, dp_errors.ModelNotFoundError):
        return from_code(Code.NO_SUCH_MODEL, str(exc))
    if isinstance(exc, dp_errors.RequestCancelledError):
        return GatewayError(408, 3008, "Request was aborted")
    if isinstance(exc, TimeoutError):
        return from_code(Code.TIMEOUT)
    return from_code(Code.INTERNAL, type(exc).__name__)
