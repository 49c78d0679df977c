"""Request-body reading with a size cap, JSON parsing that never raises past a 400, and envelopes."""

from __future__ import annotations

import asyncio
import json
import re
import sys

from starlette.requests import ClientDisconnect

from dataplane.gateway.errors import GatewayError, bad_input, client_gone
from dataplane.runtime import SYNTHETIC_NOTE

BINARY_FIELD = {"image-classification": "image", "automatic-speech-recognition": "audio"}
# A JSON escape of a UTF-16 surrogate: paired ones spell characters beyond the BMP, a lone one no text at all.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


async def read_body(request, limit: int, idle_timeout_s: float | None = None) -> bytes:
    """The whole body, refusing more than ``limit`` bytes with 413/3006 (by header, or while reading), and a body
    that pauses more than ``idle_timeout_s`` between two pieces with 408/3007."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise GatewayError(413, 3006, f"Request is too large: body over {limit} bytes")
        except ValueError:
            raise bad_input("Content-Length is not a number") from None
    chunks, size = [], 0
    pieces = request.stream().__aiter__()
    try:
        while True:
            try:
                async with asyncio.timeout(idle_timeout_s):
                    chunk = await anext(pieces)
            except StopAsyncIteration:
                break
            size += len(chunk)
            if size > limit:
                raise GatewayError(413, 3006, f"Request is too large: body over {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # gone mid-body: no one reads an answer, so it counts as any client that left (499)
        raise client_gone() from None
    except TimeoutError:
        err = GatewayError(408, 3007, f"Request timeout: the body stopped arriving ({size} bytes received, "
                           f"nothing more for {idle_timeout_s:g} s)")
        err.never_ran = True  # (nothing ran: sending it again is safe)
        raise err from None
    return b"".join(chunks)


def parse_json(body: bytes) -> dict:
    """A JSON object from ``body`` (400/5006 if it is missing, malformed or not an object)."""
    if not body.strip():
        raise bad_input("request body is empty; expected a JSON object")
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as exc:  # (malformed, not UTF-8, an integer of thousands of digits)
        raise bad_input(f"request body is not valid JSON ({_json_problem(exc)})") from None
    if not isinstance(doc, dict):
        raise bad_input(f"request body must be a JSON object, got {type(doc).__name__}")
    if _SURROGATE_ESCAPE.search(body):  # (rare: emoji sent escaped) a lone one would fail deep in a tokenizer
        where = lone_surrogate(doc)
        if where is not None:
            raise bad_input(f"field {where!r} holds a lone UTF-16 surrogate escape (\\uD800-\\uDFFF), which is "
                            "not text")
    return doc


def _json_problem(exc: Exception) -> str:
    """What the JSON parser objected to, in one short line."""
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    text = str(exc)
    if "integer string conversion" in text:  # Python's own advice (sys.set_int_max_str_digits) is not the client's
        return f"an integer of more than {sys.get_int_max_str_digits():,} digits"
    return text if len(text) <= 120 else text[:117].rsplit(" ", 1)[0] + "..."


def lone_surrogate(doc) -> str | None:
    """The path (``messages[0].content``) of the first string of ``doc`` that cannot be UTF-8, or None."""
    stack = [("", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or "(the body)"
        elif isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                stack.append((f"{path}.{key}" if path else str(key), item))
                stack.append((path or "(a key)", key))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(value))))
    return None


def run_inputs(body: bytes, content_type: str | None, task: str) -> dict:
    """Workers AI inputs from a ``/ai/run`` body: JSON, or raw bytes for image and speech models."""
    ctype = (content_type or "").split(";")[0].strip().lower()
    if task in BINARY_FIELD:
        looks_json = ctype == "application/json" or ctype.endswith("+json") or body.lstrip()[:1] == b"{"
        if not looks_json:  # raw image / WAV bytes (curl --data-binary @file)
            if not body:
                raise bad_input(f"request body is empty; expected {BINARY_FIELD[task]} bytes")
            return {BINARY_FIELD[task]: body}
    return parse_json(body)


# Codes of the notes in ``messages`` (Cloudflare's envelope lists ``{code, message}`` objects there too).
NOTE_STAND_IN = 1001
NOTE_SYNTHETIC = 1002


def envelope(result, model: str, task: str, stand_in: str, synthetic: bool, emulated: bool = False) -> dict:
    """The Workers AI REST success envelope (``meta`` is edgepop's: what really ran)."""
    messages = []
    if emulated:
        messages.append({"code": NOTE_STAND_IN, "message": f"served by the stand-in model {stand_in}"})
    if synthetic:
        messages.append({"code": NOTE_SYNTHETIC, "message": SYNTHETIC_NOTE})
    return {"result": result, "success": True, "errors": [], "messages": messages,
            "meta": {"model": model, "task": task, "stand_in": stand_in, "synthetic_weights": synthetic}}


def ok(result, **extra) -> dict:
    """The Workers AI success envelope around ``result`` (``extra`` keys added at the top level)."""
    return {"result": result, "success": True, "errors": [], "messages": [], **extra}


TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes"), ("false", "0", "no", "")


def flag(value, name: str) -> bool:
    """A query-string or JSON boolean (true/false, or "true"/"1"/"yes", "false"/"0"/"no"; absent is false); any
    other value is refused naming ``name``: read as false, a client asking to be refused when busy would queue."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise bad_input(f"{name} must be true or false, got {json.dumps(value)[:60]}")
