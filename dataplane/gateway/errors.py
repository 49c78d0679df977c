"""HTTP errors of the gateway, each with a Workers AI code, and the mapping from data- and control-plane errors.

Codes (developers.cloudflare.com/workers-ai/platform/errors, plus the Cloudflare API's auth code):

=======================  ====  =====
what                     HTTP  code
=======================  ====  =====
malformed JSON / schema  400   5006 (Workers AI's "Bad input")
unknown model            400   5007 (404 ``model_not_found`` on the OpenAI routes)
request too large        413   3006
request timeout          408   3007
rate limit (per minute)  429   3021
daily neuron budget      429   3036
out of capacity / shed   429   3040
internal error           500   3043
shutting down            503   3043 (in flight at the drain deadline)
no / bad token           401   10000
another account          403   10000
no such batch request    404   7003
client disconnected      499   7499
=======================  ====  =====

499 (nginx's "client closed request") is never read by anyone: a client that disconnects before its answer has
its work cancelled, and the status is what the counters record.

Every 429 carries ``Retry-After`` (whole seconds, at least 1) and ``retry-after-ms`` (what the ``openai`` client
reads first). Workers AI answers its per-minute limits with code 3021 ("rate limiting: inference request per min
rate reached"); on the OpenAI routes those two 429s take OpenAI's own shapes (``rate_limit_exceeded``,
``insufficient_quota``).
"""

from __future__ import annotations

import math
import re

from controlplane.outcomes import HTTP_STATUS, MESSAGES, Code
from dataplane import errors as dp_errors

BAD_INPUT = 5006
AUTH = 10000
NOT_FOUND = 7003
RATE_LIMITED = 3021
NO_SUCH_MODEL = 5007
ACCOUNT_LIMITED = 3036
MAX_MESSAGE_CHARS = 500


class GatewayError(Exception):
    """An error answer: HTTP ``status``, Workers AI ``code``, a one-line ``message`` (cut after
    :data:`MAX_MESSAGE_CHARS` characters) and, for refusals that can be retried, ``retry_after_s``."""

    def __init__(self, status: int, code: int, message: str, retry_after_s: float | None = None,
                 headers: dict | None = None):
        if len(message) > MAX_MESSAGE_CHARS:  # messages quote client values: a 100 kB model id is not echoed whole
            message = f"{message[:MAX_MESSAGE_CHARS]}... (message cut: {len(message)} characters)"
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.retry_after_s = retry_after_s
        self.extra_headers = dict(headers or {})
        self.never_ran = False  # refused or expired before any engine took it (so it may be sent again as it is)
        self.counted = False  # in edgepop_requests_total already (Metrics.rejected): each request is counted once

    def headers(self) -> dict[str, str]:
        """Response headers: ``Retry-After`` and ``retry-after-ms`` when a retry can succeed later;
        ``x-should-retry: false`` on a timeout after an engine ran the request (clients would run it again)."""
        out = dict(self.extra_headers)
        if self.status == 408 and self.code == 3007 and not self.never_ran:
            # An engine ran it past the request timeout, and it was charged: the openai and cloudflare clients
            # resend a 408 unless told not to, which would run (and charge) the same work again.
            out.setdefault("x-should-retry", "false")
        if self.retry_after_s is not None:
            out["retry-after"] = str(max(1, math.ceil(self.retry_after_s)))
            out["retry-after-ms"] = str(max(1, math.ceil(self.retry_after_s * 1e3)))
        return out

    def envelope(self) -> dict:
        """The Workers AI REST error envelope."""
        return {"result": None, "success": False, "errors": [{"code": self.code, "message": self.message}],
                "messages": []}

    def openai_body(self) -> dict:
        """The OpenAI error shape (what the ``openai`` client parses)."""
        if self.code == RATE_LIMITED:
            return {"error": {"message": self.message, "type": "requests", "param": None,
                              "code": "rate_limit_exceeded"}}
        if self.code == ACCOUNT_LIMITED:
            return {"error": {"message": self.message, "type": "insufficient_quota", "param": None,
                              "code": "insufficient_quota"}}
        status = self.openai_status()
        kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 408: "timeout_error", 413: "invalid_request_error",
                429: "rate_limit_error"}.get(status, "invalid_request_error" if status < 500 else "server_error")
        # OpenAI's ``code`` is a string: its own name where there is one, else the Workers AI code as text.
        code = ("model_not_found" if self.code == NO_SUCH_MODEL else "invalid_api_key" if self.status == 401
                else str(self.code))
        # ``param``: the request field the message names, as OpenAI gives it (its first one, without an index)
        named = re.search(r"field '([A-Za-z_][\w.]*)", self.message) if status < 500 else None
        return {"error": {"message": self.message, "type": kind, "code": code,
                          "param": named.group(1) if named else None}}

    def openai_status(self) -> int:
        """The HTTP status on the OpenAI routes: an unknown model is 404 there (OpenAI's ``model_not_found``),
        400 on Workers AI's."""
        return 404 if self.code == NO_SUCH_MODEL else self.status


def bad_input(message: str) -> GatewayError:
    """A 400 with Workers AI's bad-input code and ``message``."""
    return GatewayError(400, BAD_INPUT, message)


def from_code(code: int, detail: str | None = None, retry_after_s: float | None = None) -> GatewayError:
    """A control-plane decision code (3006, 3007, 3040, 3043, 5007) as an HTTP error."""
    c = Code(code)
    text = MESSAGES[c] + (f": {detail}" if detail else "")
    return GatewayError(HTTP_STATUS[c], int(c), text, retry_after_s)


def queue_timeout(detail: str) -> GatewayError:
    """408/3007 for a request that waited in a queue past its timeout: no engine ran it."""
    err = from_code(Code.TIMEOUT, detail)
    err.never_ran = True
    return err


def rate_limited(refusal, headers: dict | None = None) -> GatewayError:
    """429/3021: the account's per-minute limit for this task or model is reached."""
    return GatewayError(429, RATE_LIMITED, f"rate limiting: inference request per min rate reached "
                        f"({refusal.reason}); try again in {refusal.retry_after_s:.1f} s", refusal.retry_after_s,
                        headers)


def budget_spent(refusal) -> GatewayError:
    """429/3036: the account's daily neuron budget is spent (it renews at 00:00 UTC)."""
    return GatewayError(429, ACCOUNT_LIMITED, f"Account limited: {refusal.reason} for today; it renews at "
                        "00:00 UTC", refusal.retry_after_s)


def shed(retry_after_s: float, detail: str) -> GatewayError:
    """429/3040: refused at once because the estimated wait is over the bound."""
    return from_code(Code.OUT_OF_CAPACITY, detail, retry_after_s)


def auth_throttled(refusal) -> GatewayError:
    """429/10000: too many failed authentications from this client; nothing is checked until the wait is over."""
    return GatewayError(429, AUTH, f"Authentication error: {refusal.reason}; try again in "
                        f"{math.ceil(refusal.retry_after_s)} s", refusal.retry_after_s)


def client_gone() -> GatewayError:
    """499: the client closed the connection before its answer (the status counted for a cancelled request)."""
    return GatewayError(499, 7499, "the client closed the connection before the answer")


def shutting_down() -> GatewayError:
    """503/3043: the request was still in flight when the server's drain deadline came (or a second SIGINT)."""
    return GatewayError(503, int(Code.INTERNAL), "the gateway is shutting down: the request did not finish before "
                        "the drain ended (its timeout, or a second SIGINT)")


def retried(err: GatewayError) -> bool:
    """Whether an async batch item refused with ``err`` goes back to the queue (capacity, or a queue timeout
    before any engine ran it) rather than ending with it."""
    return err.code == int(Code.OUT_OF_CAPACITY) or (err.code == int(Code.TIMEOUT) and err.never_ran)


def unknown_model(model: str) -> GatewayError:
    """The error for a model this gateway does not serve (Workers AI's no-such-model code)."""
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
