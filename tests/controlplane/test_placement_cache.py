"""The placement cache: a hit equals the computation (plan and random state), and any changed input misses."""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest

from controlplane.catalog import default_catalog
from controlplane.fleet import edge_fleet
from controlplane.placement import PlacementProblem, get_policy
from controlplane.placement import cache as placement_cache
from controlplane.placement.cache import cached_place, placement_dir

SITES = ["FRA", "AMS", "CDG", "LHR", "MAD", "WAW"]
MODELS = ["@cf/meta/llama-3.1-8b-instruct", "@cf/meta/llama-3.2-1b-instruct", "@cf/baai/bge-base-en-v1.5"]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEPOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EDGEPOP_NO_CACHE", raising=False)
    return tmp_path / "placement"


def problem(topo, scale: float = 1.0, **options) -> PlacementProblem:
    rng = np.random.default_rng(3)
    demand = pd.DataFrame(rng.uniform(5, 50, (len(SITES), len(MODELS))) * scale, index=SITES, columns=MODELS)
    return PlacementProblem(topo, default_catalog(), edge_fleet(topo, SITES), demand, **options)


def place(prob, seed: int = 0, **options):
    rng = np.random.default_rng(seed)
    p = cached_place(get_policy("greedy-demand", **options), prob, rng)
    return p, rng


def same(a, b) -> None:
    pd.testing.assert_frame_equal(a.table, b.table)
    assert a.solver == b.solver and a.dropped == b.dropped and a.policy == b.policy


def test_a_hit_equals_the_computation_and_restores_the_random_state(topo, folder):
    first, rng1 = place(problem(topo))
    assert not first.from_cache and len(list(folder.glob("*.json"))) == 1
    again, rng2 = place(problem(topo))
    assert again.from_cache
    same(first, again)
    assert again.objective_ms == first.objective_ms
    assert rng1.bit_generator.state == rng2.bit_generator.state
    assert rng1.random() == rng2.random()  # later draws do not depend on whether the plan was cached


@pytest.mark.parametrize("change", ["demand", "option", "problem", "seed", "fleet", "code"])
def test_a_changed_input_misses_and_gives_the_fresh_plan(topo, folder, monkeypatch, change):
    place(problem(topo))
    prob, seed, options = problem(topo), 0, {}
    if change == "demand":
        prob = problem(topo, scale=1.5)
    elif change == "option":
        options = {"swap_passes": 0}
    elif change == "problem":
        prob = problem(topo, utilisation_cap=0.5)
    elif change == "seed":
        seed = 1
    elif change == "fleet":
        fleet = edge_fleet(topo, SITES)
        fleet.nodes.loc[0, "gpus"] = int(fleet.nodes.loc[0, "gpus"]) + 1
        prob = PlacementProblem(topo, default_catalog(), fleet, problem(topo).demand)
    else:
        monkeypatch.setattr(placement_cache, "_CODE", ["another version of the code"])
    got, _ = place(prob, seed, **options)
    assert not got.from_cache and len(list(folder.glob("*.json"))) == 2
    monkeypatch.setenv("EDGEPOP_NO_CACHE", "1")
    fresh, _ = place(prob, seed, **options)
    assert not fresh.from_cache
    same(got, fresh)


@pytest.mark.parametrize("damage", ["truncated", "bad node", "no replicas"])
def test_a_broken_entry_is_recomputed(topo, folder, damage):
    first, _ = place(problem(topo))
    (path,) = folder.glob("*.json")
    entry = json.loads(path.read_text())
    if damage == "truncated":
        path.write_text('{"placed": [[0, 0')
    else:
        entry["placed"] = [[10_000, 0, [0]]] if damage == "bad node" else []
        path.write_text(json.dumps(entry))
    again, _ = place(problem(topo))
    assert not again.from_cache
    same(first, again)
    entry = json.loads(path.read_text())  # rewritten whole
    assert len(entry["placed"]) == len(first.table)


def test_off_switch_and_uncached_policies_write_nothing(topo, folder, monkeypatch):
    prob = problem(topo)
    p = cached_place(get_policy("everywhere-fits"), prob, np.random.default_rng(0))
    assert not p.from_cache and not folder.exists()
    monkeypatch.setenv("EDGEPOP_NO_CACHE", "1")
    assert placement_dir() is None
    place(prob)
    assert not folder.exists()


SUBCLASS = """from dataclasses import dataclass
from controlplane.placement.greedy import GreedyDemand
@dataclass
class Mine(GreedyDemand):
    VARIANT = {variant}
"""


def load_subclass(path, variant: int, monkeypatch):
    """The module at ``path`` with that VARIANT, (re)loaded under one name: only its code differs."""
    import importlib.util

    path.write_text(SUBCLASS.format(variant=variant))
    spec = importlib.util.spec_from_file_location("mine", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "mine", module)
    spec.loader.exec_module(module)
    return module.Mine


def test_a_subclass_edited_in_its_own_module_misses(topo, folder, tmp_path, monkeypatch):
    prob = problem(topo)
    first = cached_place(load_subclass(tmp_path / "mine.py", 1, monkeypatch)(), prob, np.random.default_rng(0))
    again = cached_place(load_subclass(tmp_path / "mine.py", 1, monkeypatch)(), prob, np.random.default_rng(0))
    assert not first.from_cache and again.from_cache
    edited = cached_place(load_subclass(tmp_path / "mine.py", 2, monkeypatch)(), prob, np.random.default_rng(0))
    assert not edited.from_cache and len(list(folder.glob("*.json"))) == 2


def test_a_subclass_without_readable_source_is_not_cached(topo, folder):
    from controlplane.placement.greedy import GreedyDemand

    interactive = type("Typed", (GreedyDemand,), {"__module__": "not_a_loaded_module"})
    prob = problem(topo)
    for _ in range(2):
        assert not cached_place(interactive(), prob, np.random.default_rng(0)).from_cache
    assert not folder.exists()
