"""Ordering helpers shared by placement and routing: the nearest few of many sites, exactly as a full sort."""

from __future__ import annotations

import numpy as np


def first_k_stable(values: np.ndarray, k: int) -> np.ndarray:
    """Per row, the column indices of the ``k`` smallest values in the order a stable full sort gives (ties: the
    lower column first), without sorting whole rows: the rows of a 3,000-site fleet are long."""
    n_cols = values.shape[1]
    if n_cols <= 4 * k:
        return np.argsort(values, axis=1, kind="stable")[:, :k]
    cut = np.partition(values, k - 1, axis=1)[:, k - 1:k]  # the k-th smallest value of each row
    below = values < cut
    equal = values == cut
    need = k - below.sum(axis=1, keepdims=True)  # how many of the values equal to the cut make the first k
    chosen = below | (equal & (np.cumsum(equal, axis=1) <= need))
    cols = np.nonzero(chosen)[1].reshape(len(values), k)  # k per row, in column order
    order = np.argsort(np.take_along_axis(values, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1)
