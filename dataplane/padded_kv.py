"""The running batch's KV cache as dense left-padded arrays: one ``[B,H,P,D]`` array per layer and kind.

Sequences of different lengths share one past length ``P``: each row is left padded to it and its pads are
masked out (``mask`` is ``[B,P]``, 0 for a pad). Rows that join are padded with the batch to the longer of the
two pasts; when rows leave, the padding columns that no remaining row needs are trimmed.
"""

from __future__ import annotations

import numpy as np


def lpad(a: np.ndarray, n: int, axis: int) -> np.ndarray:
    """Left-pad ``a`` with ``n`` zeros along ``axis`` (zeros are masked-out positions)."""
    if n == 0:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (n, 0)
    return np.pad(a, widths)


def merge_rows(past: list[np.ndarray], mask: np.ndarray, present: list[np.ndarray],
               new_mask: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """The batch ``past`` / ``mask`` with the rows of ``present`` / ``new_mask`` appended, both left padded to the
    longer past."""
    p_old, p_new = mask.shape[1], new_mask.shape[1]
    p_all = max(p_old, p_new)
    merged = [np.concatenate([lpad(a, p_all - p_old, 2), lpad(b, p_all - p_new, 2)], axis=0)
              for a, b in zip(past, present, strict=True)]
    return merged, np.concatenate([lpad(mask, p_all - p_old, 1), lpad(new_mask, p_all - p_new, 1)], axis=0)


def merge_positions(shape: tuple[int, int], new_shape: tuple[int, int]) -> tuple[int, int]:
    """(positions :func:`merge_rows` writes into the merged arrays, those of them the shorter side's rows are first
    padded to in a copy of their own) for a batch of mask shape ``shape`` (rows, positions) and joining rows of
    ``new_shape``; the live-host model charges merges by the same count."""
    (b_old, p_old), (b_new, p_new) = shape, new_shape
    p_all = max(p_old, p_new)
    return (b_old + b_new) * p_all, (b_old if p_new > p_old else b_new if p_old > p_new else 0) * p_all


def keep_rows(past: list[np.ndarray], mask: np.ndarray, keep: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
    """Rows ``keep`` of the batch ``past`` / ``mask``, less the leading columns that are padding for all of them."""
    mask = mask[keep]
    lead = int(np.argmax(mask.any(axis=0)))  # columns left of this are padding for every row
    # One indexing expression: a single contiguous copy (indexing rows, then slicing columns off, left a view the
    # next forward call had to copy again).
    return [a[keep, :, lead:] for a in past], mask[:, lead:]
