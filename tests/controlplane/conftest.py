"""Control-plane fixtures (helpers are in ``kit.controlplane``)."""

import pytest

from controlplane.catalog import default_catalog


@pytest.fixture(scope="session")
def catalog():
    return default_catalog()
