"""Gateway test kit: constants, helpers, and session fixtures serving in-thread uvicorn servers on 127.0.0.1
(free ports, tiny stand-in models, two accounts). A pytest plugin of the root conftest, so the gateway tests and
the sim-vs-live tests share the servers."""

from __future__ import annotations

import pytest

ALICE, BOB = "tok-alice-0000001", "tok-bob-00000001"
TOKENS = {ALICE: "alice", BOB: "bob"}
GEN = "@cf/meta/llama-3.2-1b-instruct"  # stand-in gpt2-tiny
# Stand-in gpt2-small: about ten times slower per token than gpt2-tiny, so that a request can hold a slot well past
# a queue timeout however fast the machine (gpt2-tiny's longest output takes ~0.4 s on a fast core).
SLOW = "@edgepop/gpt2-small"
EMB = "@cf/baai/bge-base-en-v1.5"  # stand-in minilm-l6-v2 (real weights)
MODELS = [GEN, "@edgepop/gpt2-tiny", EMB, "@edgepop/bert-small-classify", "@edgepop/bert-small-rerank",
          "@cf/microsoft/resnet-50", "@cf/openai/whisper"]
TINY = {"@edgepop/bert-small-classify": "bert-tiny-classify", "@edgepop/bert-small-rerank": "bert-tiny-rerank",
        "@cf/microsoft/resnet-50": "resnet-tiny", "@cf/openai/whisper": "ctc-tiny"}



def spent_recently(budget, account: str) -> float:
    """Neurons ``account`` was charged today and yesterday (UTC days, all the budget keeps): a test comparing
    what was charged before and after a request reads this, so a request that crosses midnight still counts."""
    import time

    from dataplane.gateway.limits import DAY_S

    now = time.time()
    return budget.spent(account, now) + budget.spent(account, now - DAY_S)


def wav_bytes(seconds: float = 1.0, rate: int = 16000) -> bytes:
    """A real 16-bit mono WAV file of a 440 Hz tone (speech tasks' input)."""
    import struct

    import numpy as np

    t = np.arange(int(seconds * rate)) / rate
    pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()
    return (b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate,
            rate * 2, 2, 16) + b"data" + struct.pack("<I", len(pcm)) + pcm)


def png_bytes() -> bytes:
    """A real 60x40 PNG of seeded noise (image tasks' input)."""
    import io

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()

def headers(token: str = ALICE, **extra) -> dict:
    return {"authorization": f"Bearer {token}", **extra}


def run_url(base: str, model: str, account: str = "alice") -> str:
    return f"{base}/client/v4/accounts/{account}/ai/run/{model}"


@pytest.fixture(scope="session")
def gateway_topo(topo):
    return topo


def _serve(cfg, topo):
    from dataplane.gateway.app import create_app
    from dataplane.gateway.server import ServerThread

    app = create_app(cfg, topo=topo)
    server = ServerThread(app)
    server.start()
    return server, app


@pytest.fixture(scope="session")
def gateway(tmp_path_factory, gateway_topo):
    """The main test gateway: 3 PoPs, every task, no WAN delay, auth on; yields (base URL, app)."""
    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA", "LHR", "IAD"], models=MODELS, stand_ins=TINY, tokens=TOKENS, delay=False,
                        db=str(tmp_path_factory.mktemp("gw") / "batch.sqlite"), max_body_bytes=200_000,
                        batch_concurrency=2)
    server, app = _serve(cfg, gateway_topo)
    yield server.url, app
    server.stop()


def _one_slot(tmp_path_factory, topo, name: str, models: list[str], queue_timeout_s: float):
    """A gateway at one PoP with one slot and a queue of one (capacity errors and queueing on demand)."""
    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA"], models=models, tokens=TOKENS, delay=False, slots=1, queue_limit=1,
                        queue_timeout_s=queue_timeout_s, db=str(tmp_path_factory.mktemp(name) / "b.sqlite"),
                        router="nearest-with-capacity")
    return _serve(cfg, topo)


@pytest.fixture(scope="session")
def small_gateway(tmp_path_factory, gateway_topo):
    """One PoP, one slot, a queue of one and a short queue timeout: capacity and timeout errors on demand."""
    server, app = _one_slot(tmp_path_factory, gateway_topo, "gw-small", [GEN, SLOW], 0.4)
    yield server.url, app
    server.stop()


@pytest.fixture(scope="session")
def patient_gateway(tmp_path_factory, gateway_topo):
    """One PoP, one slot, a queue of one and a queue timeout no request reaches: queueing without a race."""
    server, app = _one_slot(tmp_path_factory, gateway_topo, "gw-patient", [GEN], 120.0)
    yield server.url, app
    server.stop()


@pytest.fixture(scope="session")
def delayed_gateway(tmp_path_factory, gateway_topo):
    """WAN delays on (scale 1) with the session-affinity router over FRA, LHR and SIN."""
    from dataplane.gateway import GatewayConfig

    cfg = GatewayConfig(pops=["FRA", "LHR", "SIN"], models=[GEN], no_auth=True, delay=True, router="session-affinity",
                        db=str(tmp_path_factory.mktemp("gw-delay") / "b.sqlite"))
    server, app = _serve(cfg, gateway_topo)
    yield server.url, app
    server.stop()
