"""The load test's minimal HTTP/1.1 client (benchmarks/http_light.py) against the real test gateway: answers,
keep-alive reuse, error statuses with their headers, and a clear error for what it does not speak (chunked)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import pytest
from kit.gateway import ALICE, GEN, headers

_spec = importlib.util.spec_from_file_location(
    "http_light", Path(__file__).resolve().parents[3] / "benchmarks" / "http_light.py")
http_light = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(http_light)


def test_light_client_round_trips_on_one_connection(gateway):
    url, _app = gateway
    path = f"/client/v4/accounts/alice/ai/run/{GEN}"

    async def scenario():
        c = http_light.LightClient(url)
        try:
            first = await c.post_json(path, {"prompt": "Once upon a time", "max_tokens": 4}, headers(ALICE))
            writer = c._writer
            second = await c.post_json(path, {"prompt": "Again", "max_tokens": 4}, headers(ALICE))
            assert c._writer is writer  # the same keep-alive connection
            denied = await c.post_json(path, {"prompt": "x"}, {})
            with pytest.raises(http_light.LightHTTPError, match="content-length"):
                await c.post_json(path, {"prompt": "stream", "max_tokens": 4, "stream": True}, headers(ALICE))
            after = await c.post_json(path, {"prompt": "reconnects", "max_tokens": 2}, headers(ALICE))
        finally:
            await c.aclose()
        return first, second, denied, after

    first, second, denied, after = asyncio.run(scenario())
    assert first.status_code == second.status_code == after.status_code == 200
    assert first.json()["success"] is True and isinstance(first.json()["result"]["response"], str)
    assert denied.status_code == 401 and denied.json()["errors"][0]["code"]
    assert "content-type" in first.headers  # header names are lower-cased


def test_light_client_refuses_non_http_urls():
    with pytest.raises(ValueError, match="http://"):
        http_light.LightClient("https://127.0.0.1:1")
