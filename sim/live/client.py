"""What every live client of ``sim.live`` does: prompts of an exact token count, one timed streaming request,
and the gateway's deployment and timeline descriptions.

The stand-in language models use byte-level tokenizers, one token per ASCII character, so a prompt of ``n``
characters is a prompt of ``n`` tokens. Times are ``time.monotonic()`` seconds: the clock of the gateway's
timelines, so a client on the same host can chain its stamps with the server's.
"""

from __future__ import annotations

import json
import time

import numpy as np

from dataplane.gateway.sse import DONE, SSEParser
from edgepop.errors import UserError

PROMPT_ALPHABET = np.array(list("abcdefghijklmnopqrstuvwxyz     "))


def prompt_text(n_tokens: int, rng: np.random.Generator) -> str:
    """``n_tokens`` ASCII characters (one token each under the byte-level tokenizers)."""
    return "".join(rng.choice(PROMPT_ALPHABET, n_tokens))


async def stream_once(client, url: str, headers: dict, body: dict) -> dict:
    """Send one streaming request and time it at the client: ``c_send``, ``c_first`` (first non-empty piece),
    ``c_end`` (end of stream), TTFT, TPOT = (E2E - TTFT) / (tokens - 1), E2E, inter-piece gaps, usage."""
    t0 = time.monotonic()
    rec = {"status": 0, "error": "", "serving_pop": "", "pieces": 0, "c_send": t0}
    times, usage = [], {}
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            rec["status"] = r.status_code
            rec["serving_pop"] = r.headers.get("x-edgepop-pop", "")
            if r.status_code != 200:
                rec["error"] = (await r.aread()).decode(errors="replace")[:200]
                return rec
            parser = SSEParser()
            async for text in r.aiter_text():
                now = time.monotonic()
                for data in parser.feed(text):
                    if data == DONE:
                        continue
                    ev = json.loads(data)
                    if "error" in ev:
                        rec["error"] = json.dumps(ev["error"])[:200]
                    if ev.get("response"):
                        times.append(now)
                    usage = ev.get("usage") or usage
            t_end = time.monotonic()
    except Exception as exc:  # a broken connection is this request's outcome, not the caller's
        rec["error"] = f"{type(exc).__name__}: {exc}"[:200]
        return rec
    gaps = np.diff(times) * 1e3 if len(times) > 1 else np.array([])
    tokens = int(usage.get("completion_tokens", len(times)))
    ttft = (times[0] - t0) * 1e3 if times else np.nan
    e2e = (t_end - t0) * 1e3
    rec.update(ttft_ms=ttft, e2e_ms=e2e, pieces=len(times), completion_tokens=tokens, c_end=t_end,
               c_first=times[0] if times else np.nan, prompt_tokens_served=int(usage.get("prompt_tokens", 0)),
               itl_p50_ms=float(np.median(gaps)) if len(gaps) else np.nan,
               itl_max_ms=float(gaps.max()) if len(gaps) else np.nan,
               tpot_ms=(e2e - ttft) / (tokens - 1) if tokens > 1 and times else np.nan)
    return rec


def _get(url: str, path: str, params: dict | None = None, token: str | None = None) -> dict:
    import httpx

    auth = {"authorization": f"Bearer {token}"} if token else {}
    try:
        r = httpx.get(f"{url.rstrip('/')}{path}", params=params, headers=auth, timeout=30)
    except httpx.HTTPError as exc:
        raise UserError(f"{url}: gateway not reachable ({exc})") from None
    if r.status_code != 200:
        raise UserError(f"{url}: {path} answered {r.status_code}{_why(r)}")
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise UserError(f"{url}: {path} did not answer a JSON object: is this an edgepop gateway?")
    return doc


def _why(r) -> str:
    """The gateway's own message for a refusal (its error envelope), and which flag to check for auth ones."""
    try:
        errors = r.json().get("errors") or [{}]
        message = str(errors[0].get("message") or "")
    except (ValueError, AttributeError, IndexError, TypeError):
        message = ""
    hint = " (check --token)" if r.status_code in (401, 403) else ""
    return f": {message}{hint}" if message else hint


def fetch_deployment(url: str, token: str | None = None) -> dict:
    """The live gateway's ``/edgepop/deployment`` description (an operations endpoint: it takes an API token
    unless the gateway runs without auth or with ``--open-ops``)."""
    return _get(url, "/edgepop/deployment", token=token)


def fetch_timings(url: str, trace: str = "", token: str | None = None) -> dict:
    """The gateway's ``/edgepop/timings`` for traces starting with ``trace``: request timelines and host CPU
    (an operations endpoint, like ``/edgepop/deployment``)."""
    return _get(url, "/edgepop/timings", {"trace": trace}, token)


def event_loop_cpu_s(host: dict) -> float:
    """CPU seconds the gateway's event loop thread has used, from a ``/edgepop/timings`` ``host`` snapshot."""
    return sum(t["cpu_s"] for t in host["threads"] if t["role"] == "event-loop")


def gateway_message(body: bytes | str) -> str:
    """The first error message of a gateway's error envelope (Workers AI or OpenAI shape), else the body's start."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    try:
        doc = json.loads(text)
        if "errors" in doc:
            return str(doc["errors"][0]["message"])[:200]
        return str(doc["error"]["message"])[:200]
    except (ValueError, KeyError, IndexError, TypeError):
        return text[:200]
