"""The nearest-k helper gives exactly the first k columns of a stable full sort, ties included."""

import numpy as np
import pytest

from controlplane.ordering import first_k_stable


@pytest.mark.parametrize("seed", range(5))
def test_first_k_equals_a_stable_full_sort(seed):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        rows, cols = int(rng.integers(1, 12)), int(rng.integers(1, 500))
        values = rng.integers(0, 25, (rows, cols)).astype(float)  # many ties, also at the cut
        k = int(rng.integers(1, cols + 1))
        expected = np.argsort(values, axis=1, kind="stable")[:, :k]
        assert np.array_equal(first_k_stable(values, k), expected)
