"""Per-request LoRA adapters through a live gateway: Workers AI ``lora`` and OpenAI ``model = "<id>:<adapter>"``
against a float64 numpy reference, unknown adapters, prefix-cache isolation per adapter, config errors."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
from kit.gateway import ALICE, GEN, TOKENS, headers, run_url

from dataplane import lora
from dataplane.models import gpt2
from dataplane.models.gpt2_ref import forward_numpy
from dataplane.tasks import chat_prompt
from dataplane.tokenization import ByteTokenizer
from edgepop.errors import UserError

SPEC = gpt2.PRESETS["tiny"]  # GEN's stand-in, gpt2-tiny
W = gpt2.random_weights(SPEC, np.random.default_rng(SPEC.seed))  # the registry's weights of gpt2-tiny
N_NEW = 6
LONG = "Edge PoPs serve adapters per request; the KV cache must keep them apart at all times. " * 2


def _greedy(prompt: str, adapter: lora.Adapter | None, n: int = N_NEW) -> str:
    """The numpy reference: greedy decoding, full forward per token (no cache, no batching)."""
    tok = ByteTokenizer(SPEC.vocab_size)
    ids = tok.encode(prompt)
    deltas = adapter.deltas() if adapter is not None else None
    out = []
    for _ in range(n):
        nxt = int(np.argmax(forward_numpy(SPEC, W, np.array([ids + out]), deltas)[0]))
        out.append(nxt)
    return b"".join(tok.token_bytes(t) for t in out).decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def lora_gateway(tmp_path_factory, gateway_topo):
    """A gateway whose GEN declares two adapters in a TOML file (relative paths), prefix cache on."""
    from dataplane.gateway.app import create_app
    from dataplane.gateway.config import load_config
    from dataplane.gateway.server import ServerThread

    root = tmp_path_factory.mktemp("gw-lora")
    (root / "adapters").mkdir()
    ads = {"support": lora.random_adapter(SPEC, 8, 16.0, np.random.default_rng(21), std=0.05, name="support"),
           "legal": lora.random_adapter(SPEC, 4, 8.0, np.random.default_rng(22), std=0.05, name="legal")}
    for name, ad in ads.items():
        lora.save_adapter(ad, root / "adapters" / f"{name}.npz")
    toks = "\n".join(f'"{k}" = "{v}"' for k, v in TOKENS.items())
    (root / "gw.toml").write_text(
        f'pops = ["FRA"]\nmodels = ["{GEN}"]\ndelay = false\nlm_prefix_cache_mb = 16\nlm_prefix_block = 16\n'
        f'db = "{root / "b.sqlite"}"\n[tokens]\n{toks}\n[lora_adapters."{GEN}"]\n'
        'support = "adapters/support.npz"\nlegal = "adapters/legal.npz"\n')
    cfg = load_config(root / "gw.toml")
    server = ServerThread(create_app(cfg, topo=gateway_topo))
    server.start()
    yield server.url, ads
    server.stop()


def _run(base: str, prompt: str, adapter: str | None, max_tokens: int = N_NEW) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if adapter is not None:
        body["lora"] = adapter
    return httpx.post(run_url(base, GEN), json=body, headers=headers(), timeout=60)


def test_mixed_adapters_in_one_server_match_reference(lora_gateway):
    base, ads = lora_gateway
    prompt = "Hello from FRA"
    with ThreadPoolExecutor(3) as pool:  # concurrent: the engine may batch the three rows together
        futs = {name: pool.submit(_run, base, prompt, name) for name in ("support", "legal", None)}
        got = {name: f.result().json() for name, f in futs.items()}
    for name, body in got.items():
        assert body["success"], body
        want = _greedy(prompt, ads.get(name))
        assert body["result"]["response"] == want, name
    texts = {body["result"]["response"] for body in got.values()}
    assert len(texts) == 3  # each adapter really changes the output


def test_openai_model_suffix_selects_adapter(lora_gateway):
    base, ads = lora_gateway
    c = openai.OpenAI(base_url=f"{base}/client/v4/accounts/alice/ai/v1", api_key=ALICE, max_retries=0, timeout=60)
    msgs = [{"role": "user", "content": "Which PoP?"}]
    out = c.chat.completions.create(model=f"{GEN}:legal", messages=msgs, max_tokens=N_NEW, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.model == f"{GEN}:legal"
    assert out.choices[0].message.content == _greedy(chat_prompt(msgs), ads["legal"])
    chunks = c.chat.completions.create(model=f"{GEN}:support", messages=msgs, max_tokens=N_NEW, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == _greedy(chat_prompt(msgs), ads["support"])  # streaming carries the adapter too
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=f"{GEN}:nope", messages=msgs, max_tokens=2)
    assert "nope" in str(err.value) and "legal" in str(err.value)


def test_unknown_adapter_is_a_400_in_workers_ai_format(lora_gateway):
    base, _ = lora_gateway
    r = _run(base, "hello", "missing")
    assert r.status_code == 400
    body = r.json()
    assert body["success"] is False and body["errors"][0]["code"] == 5006
    assert "'missing'" in body["errors"][0]["message"] and "support" in body["errors"][0]["message"]
    assert _run(base, "hello", 7).status_code == 400  # not a string


def test_model_schema_lists_the_served_adapters(lora_gateway):
    """``/ai/models/schema`` gives ``lora`` as the model's adapters (or null); the schema and /ai/run agree on a
    served and an unknown one."""
    import jsonschema

    base, _ = lora_gateway
    r = httpx.get(f"{base}/client/v4/accounts/alice/ai/models/schema", params={"model": GEN}, headers=headers())
    assert r.status_code == 200, r.text
    schema = jsonschema.Draft202012Validator(r.json()["result"]["input"])
    assert r.json()["result"]["input"]["properties"]["lora"]["enum"] == ["legal", "support", None]
    for adapter, status in (("support", 200), ("legal", 200), ("nope", 400)):
        body = {"prompt": "Hi", "lora": adapter, "max_tokens": 2}
        assert schema.is_valid(body) == (status == 200)
        assert httpx.post(run_url(base, GEN), json=body, headers=headers(), timeout=60).status_code == status


def test_prefix_cache_keeps_kv_apart_per_adapter(lora_gateway):
    base, ads = lora_gateway
    first = LONG + "Hello from FRA"  # greedy texts differ per adapter here, so borrowed KV would show
    seq = [("support", first), ("legal", first), (None, first), ("support", LONG + "Q2"),
           ("legal", LONG + "Q2")]
    cached = []
    for name, prompt in seq:
        body = _run(base, prompt, name, max_tokens=3).json()
        assert body["result"]["response"] == _greedy(prompt, ads.get(name), 3), name
        cached.append(body["result"]["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))
    # Same long prefix under another adapter (or none) is a miss; the same adapter again is a hit.
    assert cached[:3] == [0, 0, 0]
    assert cached[3] >= 128 and cached[4] >= 128


def test_adapter_config_errors(tmp_path, gateway_topo):
    from dataplane.gateway import GatewayConfig
    from dataplane.gateway.backend import Backend

    with pytest.raises(UserError, match="lora_adapters.*adapter name"):
        GatewayConfig(models=[GEN], lora_adapters={GEN: {"a:b": "x.npz"}})
    with pytest.raises(UserError, match="lora_adapters.*not found"):
        Backend(GatewayConfig(pops=["FRA"], models=[GEN], lora_adapters={GEN: {"a": str(tmp_path / "x.npz")}}),
                   gateway_topo)
    bad = lora.random_adapter(gpt2.PRESETS["tiny"], 4, 8.0, np.random.default_rng(1))
    bad.tensors["h0.attn"] = (bad.tensors["h0.attn"][0][:-1], bad.tensors["h0.attn"][1])
    lora.save_adapter(bad, tmp_path / "bad.npz")
    with pytest.raises(UserError, match=r"'lora_adapters'.*bad\.npz.*h0\.attn\.lora_A.*shape"):
        Backend(GatewayConfig(pops=["FRA"], models=[GEN], lora_adapters={GEN: {"a": str(tmp_path / "bad.npz")}}),
                   gateway_topo)
