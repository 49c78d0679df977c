"""Small synthetic fleets for control-plane tests: sites on a line, so RTTs are easy to reason about."""

import numpy as np
import pandas as pd

from controlplane.fleet import Fleet

TINY = "@edgepop/gpt2-tiny"  # 1.7 GB replica, 64 slots
LLAMA = "@cf/meta/llama-3.1-8b-instruct"  # 21.4 GB replica


def make_fleet(gpus_per_node, gpu_memory_gb=80.0, sites=None) -> Fleet:
    """One node per entry of ``gpus_per_node``; node i sits at site ``sites[i]`` (default: its own site)."""
    n = len(gpus_per_node)
    sites = list(range(n)) if sites is None else list(sites)
    n_sites = max(sites) + 1
    nodes = pd.DataFrame({"node_id": [f"N{i}" for i in range(n)], "site_id": [f"S{s}" for s in sites],
                          "site": sites, "gpu": "H100", "gpus": list(gpus_per_node),
                          "gpu_memory_gb": gpu_memory_gb})
    nodes["memory_gb"] = nodes.gpu_memory_gb * nodes.gpus
    nodes["price_usd_hr"] = 3.0 * nodes.gpus
    site_table = pd.DataFrame({"site_id": [f"S{s}" for s in range(n_sites)], "backbone": range(n_sites),
                               "lat": 0.0, "lon": np.arange(n_sites, dtype=float), "tz": "UTC", "continent": "EU"})
    return Fleet("test", nodes, site_table)


def line_rtt(n_ingress: int, n_sites: int, spacing: float = 10.0) -> np.ndarray:
    """Ingress i and site s on a line: RTT = spacing * |i - s|."""
    return spacing * np.abs(np.arange(n_ingress)[:, None] - np.arange(n_sites)[None, :]).astype(float)


def placement(models_nodes) -> pd.DataFrame:
    """Placement table from [(model, node), ...] (GPUs chosen by the state)."""
    return pd.DataFrame({"model": [m for m, _ in models_nodes], "node": [n for _, n in models_nodes]})
