"""The replica engine's prefill iterations: prompts that reach a replica together are prefilled in one pass that
costs what the service-time model says for that list of prompts (each attends to its own tokens only)."""

import heapq
import itertools

import pytest

from controlplane.catalog import default_catalog
from controlplane.perf import Roofline
from controlplane.perf_rows import reference_gpus
from sim.engine import ReplicaEngine, Seq

LLAMA = "@cf/meta/llama-3.1-8b-instruct"


def _first_tokens(perf, prompts: list[int], model: str = LLAMA, output: int = 4) -> dict[int, float]:
    """Every prompt joins an idle replica at t = 0 and decodes ``output`` tokens; returns each one's first-token
    time."""
    spec = default_catalog()[model]
    queue, ids, first = [], itertools.count(), {}
    eng = ReplicaEngine(spec, "H100", perf, lambda _e, t, v: heapq.heappush(queue, (t, next(ids), v)),
                        lambda s, t: first.setdefault(s.rec, t), lambda s, t: None)
    for k, p in enumerate(prompts):
        eng.join(Seq(k, p, output), 0.0)
    while queue:
        t, _, v = heapq.heappop(queue)
        eng.wake(t, v)
    return first


def test_prompts_prefilled_together_cost_the_batched_pass_not_one_long_prompt():
    perf = Roofline(reference_gpus())
    spec = default_catalog()[LLAMA]
    first = _first_tokens(perf, [4000, 3000, 2000, 1000])
    # The first prompt found the replica idle and ran alone; the other three waited and were prefilled together.
    alone = perf.prefill_ms(spec, "H100", 4000) / 1e3
    together = perf.prefill_batch_ms(spec, "H100", [3000, 2000, 1000]) / 1e3
    assert first[0] == pytest.approx(alone)
    assert first[1] == first[2] == first[3] == pytest.approx(alone + together)
    # Attention is quadratic in each prompt's own length: one 6,000-token prompt would cost more.
    assert together < perf.prefill_ms(spec, "H100", 6000) / 1e3


def test_a_model_without_batched_prefill_is_charged_the_summed_tokens():
    class SumOnly:
        def __init__(self):
            self.calls = []

        def prefill_ms(self, spec, gpu, tokens):
            self.calls.append(tokens)
            return float(tokens) / 100.0

        def decode_step_ms(self, spec, gpu, batch, context):
            return 1.0

    perf = SumOnly()
    first = _first_tokens(perf, [500, 300, 200])
    assert set(perf.calls) == {500}  # the lone first prompt; the two that waited, as one 500-token pass
    assert first[1] == first[2] == pytest.approx(0.005 + 0.005)


def test_speech_clips_prefilled_together_each_pay_their_own_windows():
    """Four 15 s clips prefilled together are four 30 s encoder windows, not one minute of audio (two windows):
    the engine added their minutes and timed the sum as one clip."""
    from controlplane.perf_cached import CachedPerf

    perf, whisper = CachedPerf(Roofline(reference_gpus())), "@cf/openai/whisper"
    spec = default_catalog()[whisper]
    first = _first_tokens(perf, [0.25] * 5, whisper, output=0)
    alone = perf.prefill_ms(spec, "H100", 0.25) / 1e3
    together = perf.perf.prefill_batch_ms(spec, "H100", [0.25] * 4) / 1e3
    assert first[0] == pytest.approx(alone)
    assert first[1] == pytest.approx(alone + together)
    assert together > 1.5 * perf.prefill_ms(spec, "H100", 1.0) / 1e3
