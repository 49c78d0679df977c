import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def topo():
    from topology import Topology

    return Topology.load()
