"""Request-body reading with a size cap, JSON parsing that never raises past a 400, envelopes and model search."""

from __future__ import annotations

import json
import uuid

from dataplane.gateway.errors import GatewayError, bad_input
from dataplane.runtime import SYNTHETIC_NOTE

BINARY_FIELD = {"image-classification": "image", "automatic-speech-recognition": "audio"}


async def read_body(request, limit: int) -> bytes:
    """The whole body, refusing more than ``limit`` bytes with 413/3006 (by header, or while reading)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise GatewayError(413, 3006, f"Request is too large: body over {limit} bytes")
        except ValueError:
            raise bad_input("Content-Length is not a number") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise GatewayError(413, 3006, f"Request is too large: body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(body: bytes) -> dict:
    """A JSON object from ``body`` (400/5006 if it is missing, malformed or not an object)."""
    if not body.strip():
        raise bad_input("request body is empty; expected a JSON object")
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise bad_input(f"request body is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(doc, dict):
        raise bad_input(f"request body must be a JSON object, got {type(doc).__name__}")
    return doc


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


def envelope(result, model: str, task: str, stand_in: str, synthetic: bool) -> dict:
    """The Workers AI REST success envelope (``meta`` is edgepop's: what really ran)."""
    return {"result": result, "success": True, "errors": [], "messages": [SYNTHETIC_NOTE] if synthetic else [],
            "meta": {"model": model, "task": task, "stand_in": stand_in, "synthetic_weights": synthetic}}


def ok(result) -> dict:
    return {"result": result, "success": True, "errors": [], "messages": []}


def task_title(task: str) -> str:
    return task.replace("-", " ").title()


def search_models(gw, search: str | None, task: str | None, page: int, per_page: int) -> list[dict]:
    """Served models in the Workers AI model-search shape, filtered by substring and task name."""
    out = []
    placement = gw.backend.placement
    for spec in gw.backend.catalog:
        if search and search.lower() not in spec.id.lower() and search.lower() not in spec.description.lower():
            continue
        if task and task.lower() not in (spec.task, task_title(spec.task).lower()):
            continue
        pops = sorted(set(placement["pop"][placement["model"] == spec.id]))
        out.append({
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, spec.id)), "source": 1, "name": spec.id,
            "description": spec.description, "task": {"name": task_title(spec.task), "id": spec.task},
            "tags": [], "properties": [
                {"property_id": "context_window", "value": str(spec.context_window)},
                {"property_id": "max_batch_prefill", "value": str(spec.max_batch)},
                {"property_id": "stand_in", "value": gw.backend.stand_in[spec.id]},
                {"property_id": "pops", "value": ",".join(pops)},
            ]})
    start = (page - 1) * per_page
    return out[start:start + per_page]


def flag(value) -> bool:
    """A query-string or JSON boolean ("true", "1", true)."""
    if isinstance(value, bool):
        return value
    return isinstance(value, str) and value.lower() in ("true", "1", "yes")
