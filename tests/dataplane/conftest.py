"""Shared fixtures: a private model cache per test session, and one DataPlane for the task tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _model_cache(tmp_path_factory):
    # Tests build their models from code into a fresh cache, so they also prove the build path works. One cache
    # per test run: the pytest-xdist workers of a run share it (each worker's base folder sits in the run's own),
    # so a model is built once per run, not once per worker (the cache's lock makes the others wait for it).
    old = os.environ.get("EDGEPOP_CACHE")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ["EDGEPOP_CACHE"] = str(shared / "edgepop-models")
    yield
    if old is None:
        os.environ.pop("EDGEPOP_CACHE", None)
    else:
        os.environ["EDGEPOP_CACHE"] = old


@pytest.fixture(scope="session")
def dp(_model_cache):
    from dataplane.service import DataPlane

    plane = DataPlane()
    yield plane
    plane.close()


@pytest.fixture(scope="session")
def lm(_model_cache):
    from dataplane import registry

    return registry.load("gpt2-tiny")
