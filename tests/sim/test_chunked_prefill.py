"""Chunked prefill (``sim.techniques.chunked``): iterations with a token budget shared by decode rows and prompt
chunks, on the engine alone and in a simulation."""

import heapq
import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from kit.sim import deployment, workload

from controlplane.catalog import Catalog, default_catalog
from controlplane.perf import Roofline, gpu_table
from edgepop.errors import UserError
from sim.engine import ReplicaEngine, Seq
from sim.simulator import Simulation
from sim.techniques import Techniques, parse_techniques
from sim.techniques.chunked import ChunkedEngine, ChunkedPrefill, iteration_ms
from sim.techniques.runtime import SimulationSeam

LLAMA = "@cf/meta/llama-3.1-8b-instruct"
GPUS = Path(__file__).resolve().parents[2] / "topology" / "data" / "gpus.csv"


@pytest.fixture(scope="module")
def roof():
    return Roofline(gpu_table(pd.read_csv(GPUS)))


def drive(engine_cls, perf, joins, **kw):
    """Run one engine on ``joins`` [(t, prompt, output)]: first-token and finish times per request, and the
    engine."""
    spec = default_catalog()[LLAMA]
    queue, ids, first, done = [], itertools.count(), {}, {}
    eng = engine_cls(spec, "H100", perf, lambda _e, t, v: heapq.heappush(queue, (t, next(ids), v)),
                     lambda s, t: first.setdefault(s.rec, t), lambda s, t: done.setdefault(s.rec, t), **kw)
    for k, (t, p, o) in enumerate(joins):
        heapq.heappush(queue, (t, next(ids), ("join", Seq(k, p, o))))
    while queue:
        t, _, v = heapq.heappop(queue)
        if isinstance(v, tuple):
            eng.join(v[1], t)
        else:
            eng.wake(t, v)
    return first, done, eng


def test_a_lone_prompt_is_prefilled_in_budget_sized_chunks(roof):
    spec = default_catalog()[LLAMA]
    first, done, _ = drive(ChunkedEngine, roof, [(0.0, 5000, 3)], budget=2048)
    it = iteration_ms(roof, spec, "H100")
    chunks = sum(it([c], 0, 0.0) for c in ((2048, 0), (2048, 2048), (904, 4096))) / 1e3
    assert first[0] == pytest.approx(chunks)
    step = roof.decode_step_ms(spec, "H100", 1, (5000 >> 6 << 6) + 32) / 1e3  # the engine's 64-token context bucket
    assert done[0] == pytest.approx(chunks + 2 * step)
    # With room for the whole prompt it is one prefill of it (a mixed step without decode rows).
    whole, _, _ = drive(ChunkedEngine, roof, [(0.0, 5000, 3)], budget=8192)
    assert whole[0] == pytest.approx(roof.mixed_step_ms(spec, "H100", [5000], 0, 0.0) / 1e3)
    # A chunk attends to its prompt's earlier chunks: charged, the chunks cost a little more than the prompt in one
    # piece (weights streamed per iteration); uncharged, they would cost less.
    one = roof.prefill_ms(spec, "H100", 8000)
    tiled = sum(it([(2000, o)], 0, 0.0) for o in range(0, 8000, 2000))
    blind = sum(it([(2000, 0)], 0, 0.0) for _ in range(4))
    assert blind < one <= tiled < 1.1 * one


def test_a_long_prompt_delays_running_sequences_a_chunk_at_a_time(roof):
    # Four sequences decode; an 8,000-token prompt arrives. Plain batching stalls them for its whole prefill;
    # chunked prefill stretches each of a few iterations by a chunk's share instead.
    joins = [(0.0, 500, 400) for _ in range(4)] + [(0.5, 8000, 10)]
    out = {}
    for name, cls, kw in (("plain", ReplicaEngine, {}), ("chunked", ChunkedEngine, {"budget": 2048})):
        first, done, eng = drive(cls, roof, joins, **kw)
        assert set(done) == set(range(5)) and set(first) == set(range(5))  # everything ends, once
        out[name] = (first, done, eng.stall_s)
    spec = default_catalog()[LLAMA]
    full = roof.prefill_ms(spec, "H100", 8000) / 1e3
    # (the first sequence alone, then the other three together while it decodes: a first, short stall)
    start = roof.prefill_batch_ms(spec, "H100", [500] * 3) / 1e3
    assert out["plain"][2] == pytest.approx(start + full)  # then one stall: the whole prefill
    assert 0 < out["chunked"][2] < start + full  # spread over iterations, each a chunk beside the decode rows
    # The long prompt's first token comes later (its chunks share iterations with the decode rows) ...
    assert out["chunked"][0][4] > out["plain"][0][4]
    # ... and the running sequences finish sooner than behind one monolithic prefill.
    assert max(out["chunked"][1][k] for k in range(4)) < max(out["plain"][1][k] for k in range(4))


def test_chunked_prefill_in_a_simulation_and_its_switches(roof):
    spec = replace(default_catalog()[LLAMA], max_batch=32)
    cat = Catalog([spec])
    rng = np.random.default_rng(4)
    n = 200
    prompts = np.where(rng.random(n) < 0.2, 12000, 300)
    w = workload(np.cumsum(rng.exponential(1 / 8.0, n)), spec.id, "text-generation", prompts,
                 output=rng.integers(50, 200, n))
    plain = Simulation(deployment(cat, spec.id, 1, [[0.0]]), w, roof).run().requests
    t = Techniques(chunked_prefill=True, prefill_chunk_tokens=1024)
    seam = SimulationSeam("edge", [ChunkedPrefill(t)])
    chunked = Simulation(deployment(cat, spec.id, 1, [[0.0]]), w, roof, techniques=seam).run().requests
    ok = (plain.outcome == "ok").to_numpy() & (chunked.outcome == "ok").to_numpy()
    assert ok.sum() > 150
    short = (prompts == 300) & ok
    # The short requests no longer sit behind whole 12k-token prefills between their tokens.
    assert chunked.tpot_ms[short].quantile(0.99) < plain.tpot_ms[short].quantile(0.99)
    assert t.enabled() == ["chunked_prefill"]
    with pytest.raises(UserError, match="prefill_chunk_tokens"):
        parse_techniques({"chunked_prefill": True, "prefill_chunk_tokens": 0}, "s.toml [techniques]")
    with pytest.raises(UserError, match="cannot both be on"):
        parse_techniques({"chunked_prefill": True, "disaggregation": True}, "s.toml [techniques]")
    with pytest.raises(UserError, match="prefix_cache and disaggregation cannot both be on"):
        parse_techniques({"prefix_cache": True, "disaggregation": True}, "s.toml [techniques]")
