"""Shared constants and helpers of the gateway tests (fixtures are in conftest.py)."""

from __future__ import annotations

ALICE, BOB = "tok-alice-0000001", "tok-bob-00000001"
TOKENS = {ALICE: "alice", BOB: "bob"}
GEN = "@cf/meta/llama-3.2-1b-instruct"  # stand-in gpt2-tiny
EMB = "@cf/baai/bge-base-en-v1.5"  # stand-in minilm-l6-v2 (real weights)
MODELS = [GEN, "@edgepop/gpt2-tiny", EMB, "@edgepop/bert-small-classify", "@edgepop/bert-small-rerank",
          "@cf/microsoft/resnet-50", "@cf/openai/whisper"]
TINY = {"@edgepop/bert-small-classify": "bert-tiny-classify", "@edgepop/bert-small-rerank": "bert-tiny-rerank",
        "@cf/microsoft/resnet-50": "resnet-tiny", "@cf/openai/whisper": "ctc-tiny"}


def headers(token: str = ALICE, **extra) -> dict:
    return {"authorization": f"Bearer {token}", **extra}


def run_url(base: str, model: str, account: str = "alice") -> str:
    return f"{base}/client/v4/accounts/{account}/ai/run/{model}"
