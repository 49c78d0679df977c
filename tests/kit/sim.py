"""Hand-built deployments and workloads for simulator tests (no placement policy, no workload generator)."""

from dataclasses import replace

import numpy as np
import pandas as pd

from controlplane.catalog import Catalog, default_catalog
from controlplane.deployment import Deployment
from controlplane.fleet import Fleet
from controlplane.plane import AdmissionConfig, ControlPlane
from sim.simulator import Simulation
from sim.techniques import TechniqueRuntime, Techniques


class TokenClock:
    """Perf model for queueing tests: prefill of n 'tokens' takes n microseconds; decode steps take ``step_ms``."""

    def __init__(self, step_ms=10.0):
        self.step_ms = step_ms

    def prefill_ms(self, spec, gpu, tokens):
        return tokens / 1000.0

    def decode_step_ms(self, spec, gpu, batch, context):
        return self.step_ms


def one_slot_catalog(model="@cf/baai/bge-base-en-v1.5", max_batch=1):
    """A one-model catalog whose context window and KV pool never limit the test's huge token counts."""
    spec = replace(default_catalog()[model], max_batch=max_batch, context_window=10**9, kv_pool_tokens=10**6)
    return Catalog([spec]), spec.id


def fleet(n_nodes, sites=None, gpus=1, gpu="H100"):
    """``n_nodes`` nodes (``gpu``: one GPU type, or one per node; 80 GB each)."""
    sites = list(range(n_nodes)) if sites is None else list(sites)
    n_sites = max(sites) + 1
    nodes = pd.DataFrame({"node_id": [f"N{i}" for i in range(n_nodes)], "site_id": [f"S{s}" for s in sites],
                          "site": sites, "gpu": gpu, "gpus": gpus, "gpu_memory_gb": 80.0})
    nodes["memory_gb"], nodes["price_usd_hr"] = 80.0 * gpus, 3.0 * gpus
    site_table = pd.DataFrame({"site_id": [f"S{s}" for s in range(n_sites)], "backbone": range(n_sites),
                               "lat": 0.0, "lon": 0.0, "tz": "UTC", "continent": "EU"})
    return Fleet("test", nodes, site_table)


def deployment(catalog, model, n_nodes, rtt, sites=None, queue_limit=10**6, timeout=1e9, router="nearest-with-capacity",
               gpu="H100", **kw):
    f = fleet(n_nodes, sites, gpu=gpu)
    table = pd.DataFrame({"model": [model] * n_nodes, "node": range(n_nodes)})
    plane = ControlPlane(catalog, f, table, np.asarray(rtt, dtype=float), router=router,
                         admission=AdmissionConfig(queue_limit=queue_limit, queue_timeout_s=timeout), **kw)
    return Deployment("edge", plane, f, ingress_col="ingress", access_col="access_rtt_ms")


def workload(arrivals, model, task, prompt, output=0, ingress=0, access_ms=0.0):
    n = len(arrivals)
    return pd.DataFrame({
        "request_id": np.arange(n), "arrival_s": np.asarray(arrivals, dtype=float), "city": 0,
        "user_lat": 0.0, "user_lon": 0.0, "user_country": "XX", "user_continent": "EU",
        "ingress": np.broadcast_to(ingress, n), "ingress_pop": "S0",
        "access_rtt_ms": np.broadcast_to(np.asarray(access_ms, dtype=float), n),
        "model": model, "task": task, "prompt_tokens": np.broadcast_to(prompt, n).astype(np.int64),
        "output_tokens": np.broadcast_to(output, n).astype(np.int64), "session_id": -1,
        "hash_ids": [()] * n, "batch": False, "reject_if_busy": False})


def poisson(rate, n, rng):
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def three_site_lm(n, seed, **deployment_kw):
    """A small language model on one 4-slot node at each of three sites 10 ms apart (queues of 8, 5 s timeout),
    and ``n`` Poisson requests at 30/s from the three sites (5 ms access): the set-up of the fault tests.
    Returns (model, workload frame, deployment); ``deployment_kw`` go to :func:`deployment`."""
    rng = np.random.default_rng(seed)
    catalog, model = one_slot_catalog("@edgepop/gpt2-tiny", max_batch=4)
    frame = workload(poisson(30.0, n, rng), model, "text-generation", rng.integers(1000, 60_000, n),
                     rng.integers(1, 40, n), ingress=rng.integers(0, 3, n), access_ms=5.0)
    rtt = 10.0 * np.abs(np.subtract.outer(np.arange(3), np.arange(3)))
    return model, frame, deployment(catalog, model, 3, rtt, queue_limit=8, timeout=5.0, **deployment_kw)


def simulate(build, w, perf, techniques=None, name="edge"):
    """Run ``w`` on ``build(**plane_options)`` with ``techniques`` switched on, as ``run_scenario`` wires them.

    Returns (the Simulation, its request frame, the summary blocks the techniques add)."""
    rt = TechniqueRuntime(techniques or Techniques())
    dep = build(**rt.plane_options(name))
    sim = Simulation(dep, w, rt.perf(perf), techniques=rt.for_simulation(name))
    f = sim.run().requests
    blocks = {}
    for part in rt.parts:
        blocks.update(part.blocks(name, sim, f))
    return sim, f, blocks
