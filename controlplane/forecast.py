"""Demand forecasts for placement: requests per second per ingress PoP and model.

Demand comes from the topology's cities (population share, optionally shaped by the diurnal curve at a given UTC
time), each city entering at its anycast ingress PoP, and split across models by a task/model mix.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from numbers import Real

import numpy as np
import pandas as pd

from controlplane.catalog import Catalog
from edgepop.errors import UserError
from topology import Topology, demand_rates

# A plausible interactive mix for a Workers-AI-like platform (share of requests): chat on small and mid LLMs,
# a slice on the 70B, and a large volume of cheap embeddings, reranking, classification, images and speech.
DEFAULT_MIX = {
    "@cf/meta/llama-3.1-8b-instruct": 0.24,
    "@cf/meta/llama-3.2-3b-instruct": 0.08,
    "@cf/meta/llama-3.2-1b-instruct": 0.05,
    "@cf/meta/llama-3.3-70b-instruct-fp8-fast": 0.08,
    "@cf/mistral/mistral-7b-instruct-v0.1": 0.05,
    "@cf/baai/bge-base-en-v1.5": 0.20,
    "@cf/baai/bge-small-en-v1.5": 0.06,
    "@cf/baai/bge-reranker-base": 0.08,
    "@cf/huggingface/distilbert-sst-2-int8": 0.06,
    "@cf/microsoft/resnet-50": 0.06,
    "@cf/openai/whisper": 0.04,
}


def normalise_mix(mix: dict[str, float], catalog: Catalog) -> dict[str, float]:
    """Validate a model mix against the catalog and scale it to sum to 1."""
    if not isinstance(mix, Mapping):
        raise UserError(f"the model mix must map model ids to shares, got {mix!r}")
    if not mix:
        raise UserError("the model mix is empty")
    for model, share in mix.items():
        catalog[model]  # raises UnknownModelError naming the id
        if not isinstance(share, Real) or isinstance(share, bool) or not np.isfinite(share) or share < 0:
            raise UserError(f"model mix: share of {model!r} must be a non-negative number, got {share!r}")
    total = float(sum(mix.values()))
    if total <= 0:
        raise UserError("model mix: shares sum to zero")
    if not np.isfinite(total):  # shares near the float limit overflow their sum
        raise UserError("model mix: the shares' sum overflows: use relative shares (e.g. fractions or percents)")
    return {m: s / total for m, s in mix.items()}


def ingress_weights(topo: Topology, when_utc: datetime | None = None) -> np.ndarray:
    """Share of all demand entering at each PoP (sums to 1); diurnal-shaped when ``when_utc`` is given."""
    d = topo.demand
    idx, _ = topo.ingress(d.lat.to_numpy(), d.lon.to_numpy())
    w = demand_rates(d, when_utc, 1.0) if when_utc is not None else d.weight.to_numpy()
    out = np.bincount(idx, weights=w, minlength=len(topo.pops))
    return out / out.sum()


def ingress_demand(topo: Topology, catalog: Catalog, total_rps: float, mix: dict[str, float] | None = None,
                   when_utc: datetime | None = None) -> pd.DataFrame:
    """Requests/s per ingress PoP (rows, PoP ids in table order) and model (columns)."""
    if not np.isfinite(total_rps) or not 0 < total_rps <= 1e9:  # (beyond, the solvers' numbers lose meaning)
        raise UserError(f"total demand must be a positive number of requests/s up to 1e9, got {total_rps!r}")
    shares = normalise_mix(DEFAULT_MIX if mix is None else mix, catalog)  # ({} is an error, not the default)
    w = ingress_weights(topo, when_utc)
    data = total_rps * np.outer(w, np.array(list(shares.values())))
    return pd.DataFrame(data, index=pd.Index(topo.pops.id.to_numpy(), name="ingress"), columns=list(shares))
