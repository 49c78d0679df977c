"""Which LoRA adapter each request names (the workload's optional ``adapter`` column)."""

from __future__ import annotations

import numpy as np
import pandas as pd


def zipf_weights(n: int, s: float) -> np.ndarray:
    """Popularity of ``n`` adapters: the i-th (1-based) weighs 1 / i^s, normalised."""
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def draw_adapters(frame: pd.DataFrame, catalog, fraction: float, zipf: float, rng: np.random.Generator
                  ) -> np.ndarray:
    """Per request an adapter name or "": a ``fraction`` of the requests to models with adapters name one, picked
    by Zipf(``zipf``) popularity over that model's adapters in catalog order. A session's turns share its first
    turn's draw (a conversation stays with one fine-tune). All draws come from ``rng``.
    """
    n = len(frame)
    out = np.full(n, "", dtype=object)
    use = rng.random(n) < fraction
    u = rng.random(n)
    models = frame.model.to_numpy()
    for m in pd.unique(models):
        adapters = catalog[m].adapters
        if not adapters:
            continue
        rows = np.flatnonzero((models == m) & use)
        cum = np.cumsum(zipf_weights(len(adapters), zipf))
        pick = np.minimum(np.searchsorted(cum, u[rows], side="right"), len(adapters) - 1)
        out[rows] = np.asarray([a.name for a in adapters], dtype=object)[pick]
    session = frame.session_id.to_numpy()
    in_session = np.flatnonzero(session >= 0)
    if len(in_session):
        _, first = np.unique(session[in_session], return_index=True)
        head = dict(zip(session[in_session[first]].tolist(), out[in_session[first]].tolist(), strict=True))
        out[in_session] = [head[s] for s in session[in_session].tolist()]
    return out
