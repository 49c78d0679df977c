"""What the gateway says and does about stand-ins: which served models are not what runs, and embeddings of the
real model's dimension.

A catalog model is served by its *stand-in*, a small data-plane model. When they are the same network (an
``@edgepop/`` entry run by its own data-plane model) nothing is emulated; otherwise the model is a stand-in and
``models/search`` says so. An embedding stand-in usually has fewer dimensions than the real model (MiniLM's 384 for
``bge-base-en-v1.5``'s 768), which breaks a client sized for the real one. So the gateway maps each stand-in vector
into the real dimension with a fixed matrix ``Q`` (``dim x d``) whose columns are orthonormal, drawn once from a
generator seeded by the model id: ``Q^T Q = I``, so every inner product, norm and cosine similarity of the
stand-in's vectors is kept exactly, and the same text always gives the same vector. (Into a smaller dimension the
rows of ``Q`` are orthonormal instead; similarities are then only approximately kept and vectors are renormalised.)
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np


def is_stand_in(model_id: str, catalog_stand_in: str, served_stand_in: str) -> bool:
    """True unless the catalog entry is a data-plane model served by itself."""
    return not (model_id.startswith("@edgepop/") and served_stand_in == catalog_stand_in)


@functools.lru_cache(maxsize=64)
def projection(model_id: str, d_in: int, d_out: int) -> np.ndarray:
    """The fixed ``d_out x d_in`` map of ``model_id``'s embeddings (orthonormal columns if ``d_out >= d_in``)."""
    seed = int.from_bytes(hashlib.sha256(f"edgepop-embedding-projection:{model_id}".encode()).digest()[:8], "little")
    g = np.random.default_rng(seed).standard_normal((max(d_in, d_out), min(d_in, d_out)))
    q, r = np.linalg.qr(g)
    q *= np.sign(np.diag(r))  # a unique Q for the draw (QR is unique up to column signs)
    return q if d_out >= d_in else q.T


def project(model_id: str, vectors: list, d_out: int) -> list:
    """Stand-in vectors (lists of floats) mapped into ``d_out`` dimensions; unchanged if already that size."""
    if not vectors or len(vectors[0]) == d_out:
        return vectors
    x = np.asarray(vectors, dtype=np.float64)
    y = x @ projection(model_id, x.shape[1], d_out).T
    if d_out < x.shape[1]:
        y /= np.maximum(np.linalg.norm(y, axis=1, keepdims=True), 1e-12)
    return y.tolist()
