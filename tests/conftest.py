import os

import pytest

# Gateway servers (session fixtures) for the gateway and sim-vs-live tests.
pytest_plugins = ("kit.gateway",)

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session")
def topo():
    from topology import Topology

    return Topology.load()
