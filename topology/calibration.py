"""Calibration of the WAN latency model on measured round-trip times, and its cross-validation.

Data: the fitted sets of :mod:`topology.rtt_sets` (Azure's P50 inter-region table, IBM Cloud's newest
inter-region table and cloudping.co's year of AWS inter-region medians: short, regional and intercontinental
pairs on six continents). The fit chooses the circuity factors, the per-hop cost, the per-path fixed term and
the distance-dependent inflation; the physics (light at 200 km/ms in fibre, the backbone graph) stays fixed.

The loss is the soft-L1 of log(predicted / measured), every distance band weighted equally (intercontinental
pairs outnumber short ones ten to one and would otherwise decide alone). Inside a band the data sets are
weighted as networks, not by their number of pairs (random effects, :func:`network_weights`): the same metro
pairs run 5% slower on AWS's long-haul paths than on Azure's, a difference between networks that hundreds of
pairs of one provider do not average away, so the provider that publishes the most regions must not decide
alone either. The best backbone path of a pair depends on the constants, so the fit alternates: find every
pair's path (its land km, cable km and links) with the current constants, fit the constants with those paths
fixed (a smooth least-squares problem), repeat until the paths stop changing. Each round the predictions are
exactly the model's, so the result is the model's fit.

Cross-validation refits without one data set (``leave_one_set_out``) or without every pair that touches one
continent (``leave_one_continent_out``) and predicts what was left out: the error a user should expect on
paths like those. ``python -m topology.calibration`` refits and rewrites ``data/latency_params.json``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np
import pandas as pd
from scipy.optimize import least_squares
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import dijkstra

from topology.borders import barred
from topology.geo import FIBRE_KM_PER_MS, haversine_km
from topology.latency import Backbone, LatencyModel, LatencyParams, build_backbone, default_sites, node_codes
from topology.rtt_sets import SETS, load_all

FREE = ("alpha_land", "alpha_sea", "hop_ms", "base_ms", "short_inflation", "short_scale_km")
LOWER = np.array([1.0, 1.0, 0.05, 0.0, 0.0, 20.0])  # alpha >= 1 (physics), hop >= 50 us: routers are never free
UPPER = np.array([3.0, 2.5, 2.0, 10.0, 4.0, 3000.0])
ROUNDS = 6


@dataclass(frozen=True)
class Paths:
    """Each pair's best route under some constants: land km, cable km and number of links (attach legs included)."""

    land_km: np.ndarray
    sea_km: np.ndarray
    links: np.ndarray
    gc_km: np.ndarray

    def rtt(self, x: np.ndarray) -> np.ndarray:
        alpha_land, alpha_sea, hop, base, infl, scale = x
        cost = 2.0 * (alpha_land * self.land_km + alpha_sea * self.sea_km) / FIBRE_KM_PER_MS + hop * self.links
        return base + (1.0 + infl * scale / (self.gc_km + scale)) * cost


def _graph(backbone: Backbone, params: LatencyParams):
    links = backbone.links
    alpha = np.where(links.kind.to_numpy() == "sea", params.alpha_sea, params.alpha_land)
    w = 2.0 * alpha * links.km.to_numpy() / FIBRE_KM_PER_MS + params.hop_ms
    n = len(backbone.nodes)
    return coo_matrix((w, (links.i.to_numpy(), links.j.to_numpy())), shape=(n, n)).tocsr()


@dataclass(frozen=True)
class PairGeometry:
    """What :func:`find_paths` reads of a set of pairs and the backbone that no fitted constant changes (a fit reads
    it ten times or more): each end's attachment nodes and their km (``attach_k``, ``max_link_km`` and the border
    rule are the backbone's structure, never fitted), the ends' coordinates, their great-circle km, whether the
    border rule bars a direct link between them, and the backbone's links."""

    nodes_a: np.ndarray
    km_a: np.ndarray
    nodes_b: np.ndarray
    km_b: np.ndarray
    ends: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
    gc_km: np.ndarray
    barred: np.ndarray
    links: tuple[np.ndarray, np.ndarray]  # node x node, both ways: the link's km (0: none), whether it is a cable

    def take(self, rows: np.ndarray) -> PairGeometry:
        """The geometry of the pairs ``rows`` selects (a mask or indices): what :func:`pair_geometry` gives for
        those pairs alone (every pair's fields are its own), without finding their attachment nodes again."""
        return PairGeometry(self.nodes_a[rows], self.km_a[rows], self.nodes_b[rows], self.km_b[rows],
                            tuple(e[rows] for e in self.ends), self.gc_km[rows], self.barred[rows], self.links)


def _link_table(backbone: Backbone) -> tuple[np.ndarray, np.ndarray]:
    links = backbone.links
    kind = {}
    for i, j, km, sea in zip(links.i.to_numpy().tolist(), links.j.to_numpy().tolist(),
                             links.km.to_numpy(dtype=np.float64).tolist(), (links.kind == "sea").tolist(), strict=True):
        kind[(i, j)] = kind[(j, i)] = (km, sea)
    n = len(backbone.nodes)
    km, sea = np.zeros((n, n)), np.zeros((n, n), dtype=bool)
    if kind:
        (i, j), (k, c) = zip(*kind.keys(), strict=True), zip(*kind.values(), strict=True)
        km[i, j], sea[i, j] = k, c
    return km, sea


def _attach_model(backbone: Backbone, params: LatencyParams) -> LatencyModel:
    model = LatencyModel.__new__(LatencyModel)  # the attach rule only; no all-pairs table needed
    model.backbone, model.params = backbone, params
    model.node_lat = backbone.nodes.lat.to_numpy(dtype=np.float64)
    model.node_lon = backbone.nodes.lon.to_numpy(dtype=np.float64)
    model.node_codes = node_codes(backbone)
    return model


def pair_geometry(backbone: Backbone, params: LatencyParams, m: pd.DataFrame) -> PairGeometry:
    """The :class:`PairGeometry` of the pairs of ``m`` on ``backbone`` (``params``: only its structure is read)."""
    model = _attach_model(backbone, params)
    ends = tuple(m[c].to_numpy(dtype=np.float64) for c in ("lat_a", "lon_a", "lat_b", "lon_b"))
    ia, ka, pa = model._attach_nodes(ends[0], ends[1])
    ib, kb, pb = model._attach_nodes(ends[2], ends[3])
    return PairGeometry(ia, ka, ib, kb, ends, haversine_km(*ends), barred(pa, pb), _link_table(backbone))


def find_paths(backbone: Backbone, params: LatencyParams, m: pd.DataFrame,
               geometry: PairGeometry | None = None) -> Paths:
    """The route :class:`LatencyModel` takes for every pair of ``m`` under ``params``, decomposed. ``geometry``:
    :func:`pair_geometry` of the same pairs, backbone and structure, when the caller keeps it."""
    geo = geometry or pair_geometry(backbone, params, m)
    model = _attach_model(backbone, params)
    land_link = np.array("land")
    ia, ib, gc = geo.nodes_a, geo.nodes_b, geo.gc_km
    ca, cb = model._link_ms(geo.km_a, land_link), model._link_ms(geo.km_b, land_link)
    sources = np.unique(ia)
    dist, pred = dijkstra(_graph(backbone, params), directed=False, indices=sources, return_predecessors=True)
    row = np.zeros(len(backbone.nodes), dtype=np.intp)
    row[sources] = np.arange(len(sources))
    # Every pair's attach-node x attach-node costs at once (the same sums, in the same order, as pair by pair);
    # the first minimum in row-major order, as argmin over each pair's matrix finds it.
    via = (ca[:, :, None] + dist[row[ia][:, :, None], ib[:, None, :]] + cb[:, None, :]).reshape(len(gc), -1)
    best = np.argmin(via, axis=1)
    k1, k2 = np.unravel_index(best, ia.shape[1:] + ib.shape[1:])
    short = (gc <= params.max_link_km) & ~geo.barred
    direct = np.where(short, model._link_ms(gc, land_link), np.inf)
    routed = np.flatnonzero(~(direct <= via[np.arange(len(gc)), best]))
    land, sea, links = gc.copy(), np.zeros(len(gc)), np.ones(len(gc))
    s = ia[routed, k1[routed]]
    t = ib[routed, k2[routed]]
    lat_a, lon_a, lat_b, lon_b = (x[routed] for x in geo.ends)
    lat_n, lon_n = model.node_lat, model.node_lon
    ends_km = haversine_km(lat_a, lon_a, lat_n[s], lon_n[s]) + haversine_km(lat_b, lon_b, lat_n[t], lon_n[t])
    # Each distinct (source, target) path walked back from the target along the predecessor tree, one step for all
    # of them at a time; then every pair adds its path's links in the walk's order (a link of the other kind, or
    # a step past the path's end, adds 0.0, which changes no sum): the same sums, bit for bit, as pair by pair.
    link_km, link_sea = geo.links
    n_nodes = len(link_km)
    uniq, inv = np.unique(s * n_nodes + t, return_inverse=True)
    src, node = np.divmod(uniq, n_nodes)
    src_row = row[src]
    hops_km, hops_sea, steps = [], [], np.zeros(len(uniq), dtype=np.intp)
    walking = node != src
    while walking.any():
        prev = np.where(walking, pred[src_row, node], node)
        hops_km.append(np.where(walking, link_km[prev, node], 0.0))
        hops_sea.append(walking & link_sea[prev, node])
        steps += walking
        node = prev
        walking = node != src
    land_r, sea_r = ends_km.copy(), np.zeros(len(routed))
    for km_u, is_sea_u in zip(hops_km, hops_sea, strict=True):
        km_p, is_sea_p = km_u[inv], is_sea_u[inv]
        land_r += np.where(is_sea_p, 0.0, km_p)
        sea_r += np.where(is_sea_p, km_p, 0.0)
    land[routed], sea[routed], links[routed] = land_r, sea_r, 2 + steps[inv]
    return Paths(land, sea, links, gc)


def band_weights(m: pd.DataFrame) -> np.ndarray:
    """Per-pair weights that give every distance band the same total weight."""
    counts = m.band.map(m.band.value_counts())
    return 1.0 / counts.to_numpy(dtype=float)


def network_weights(m: pd.DataFrame, resid: np.ndarray) -> np.ndarray:
    """Per-pair weights that give every distance band the same total weight and, inside a band, each data set
    a random-effects weight 1 / (tau^2 + v) for its cell (DerSimonian-Laird).

    A set's pairs all cross one provider's network and share its routing and its measurement stack, so they are
    not independent samples of "a path": beside the scatter of pairs around their network (sigma, read here from
    ``resid``, the log residuals of a fit with :func:`band_weights`), networks differ from one another (tau).
    The variance of a cell's offset is tau^2 + v, v = (pi/2) sigma^2 / n for the median of n pairs: a set with
    hundreds of pairs in a band counts about as much as another network with tens (tau dominates), and one
    with a single pair counts little (v dominates). With one data set this is :func:`band_weights` again.
    Medians and MADs keep outlying pairs (a detour through another continent) from setting the weights."""
    m = m.reset_index(drop=True)
    cell = (m.set.astype(str) + "|" + m.band.astype(str)).to_numpy()
    groups = pd.Series(resid).groupby(cell)
    n, offset = groups.size(), groups.median()
    mad = groups.apply(lambda r: 1.4826 * float(np.median(np.abs(r - r.median()))))
    dof = n - 1
    sigma2 = float((mad**2 * dof).sum() / dof.sum()) if dof.sum() > 0 else 0.0
    v = (np.pi / 2) * max(sigma2, 1e-6) / n
    w = 1.0 / v
    centre = (w * offset).sum() / w.sum()
    q = float((w * (offset - centre) ** 2).sum())  # Cochran's Q: the spread of the cells beyond their noise
    tau2 = max(0.0, (q - (len(n) - 1)) / float(w.sum() - (w**2).sum() / w.sum()))
    per_pair = (1.0 / (tau2 + v) / n).reindex(cell).to_numpy(dtype=float, copy=True)
    band = m.band.to_numpy()
    for b in np.unique(band):
        per_pair[band == b] /= per_pair[band == b].sum()
    return per_pair


def _alternate(m: pd.DataFrame, params: LatencyParams, backbone: Backbone, weights: np.ndarray,
               geometry: PairGeometry) -> LatencyParams:
    """Path search and least squares in turn until the paths stop changing (see module doc)."""
    meas = np.log(m.rtt_ms.to_numpy())
    w = np.sqrt(weights)
    x = np.clip([getattr(params, f) for f in FREE], LOWER, UPPER)
    previous = None
    for _ in range(ROUNDS):
        paths = find_paths(backbone, params, m, geometry)
        key = (paths.land_km.round(1).tobytes(), paths.sea_km.round(1).tobytes())
        if key == previous:
            break
        previous = key
        res = least_squares(lambda v, p=paths: w * (np.log(p.rtt(v)) - meas), x, bounds=(LOWER, UPPER),
                            loss="soft_l1", f_scale=0.1, x_scale="jac")
        x = res.x
        params = replace(params, **{f: round(float(v), 4) for f, v in zip(FREE, x, strict=True)})
    return params


def fit(m: pd.DataFrame, start: LatencyParams | None = None, backbone: Backbone | None = None,
        geometry: PairGeometry | None = None) -> LatencyParams:
    """Constants fitted to the pairs of ``m``: a fit with every pair of a band weighted alike, then, when ``m``
    holds several data sets, a refit with :func:`network_weights` read from its residuals. ``geometry``:
    :func:`pair_geometry` of ``m``'s pairs on ``backbone``, when the caller has it."""
    params = start or LatencyParams.load()
    backbone = backbone or build_backbone(default_sites(), params.knn, params.max_link_km)
    geometry = geometry or pair_geometry(backbone, params, m)
    params = _alternate(m, params, backbone, band_weights(m), geometry)
    if m.set.nunique() < 2:
        return params
    x = np.array([getattr(params, f) for f in FREE])
    resid = np.log(find_paths(backbone, params, m, geometry).rtt(x)) - np.log(m.rtt_ms.to_numpy())
    return _alternate(m, params, backbone, network_weights(m, resid), geometry)


def predict(model: LatencyModel, m: pd.DataFrame) -> np.ndarray:
    """The model's core RTT (ms) for every measured pair of ``m`` (columns lat_a, lon_a, lat_b, lon_b)."""
    return np.asarray(model.core_rtt_ms(m.lat_a, m.lon_a, m.lat_b, m.lon_b))


def errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    """Median / p90 / mean / max absolute percentage error and the median predicted/measured ratio."""
    ape = np.abs(pred - meas) / meas
    return {"pairs": int(len(meas)), "median_ape": round(float(np.median(ape)), 4),
            "p90_ape": round(float(np.quantile(ape, 0.9)), 4), "mean_ape": round(float(np.mean(ape)), 4),
            "max_ape": round(float(np.max(ape)), 4), "median_ratio": round(float(np.median(pred / meas)), 4)}


def plain_distance_fit(m: pd.DataFrame) -> dict[str, float]:
    """Baseline: RTT = a + b * great-circle km, least squares. What a model without geography reaches."""
    b, a = np.polyfit(m.km, m.rtt_ms, 1)
    return errors(a + b * m.km.to_numpy(), m.rtt_ms.to_numpy())


def neutral_params(params: LatencyParams) -> LatencyParams:
    """The model's neutral constants (a fit's start) on ``params``' backbone structure (``knn``, ``max_link_km``)."""
    return replace(LatencyParams(), knn=params.knn, max_link_km=params.max_link_km)


def cross_validate(m: pd.DataFrame, params: LatencyParams, backbone: Backbone | None = None) -> pd.DataFrame:
    """Out-of-sample predictions: column ``cv_set_ms`` (refit without the pair's data set, by provider),
    ``cv_continent_<C>_ms`` for every pair touching continent ``C`` (refit without every pair touching it) and
    ``cv_continent_ms``, each pair once (a pair spanning two continents predicted by the fit that left out the
    first of them in alphabetical order). Every fold starts from the model's neutral constants, not from
    ``params`` (the shipped constants were fitted on every set, the held-out one too); ``params`` gives the
    backbone's structure (``knn``, ``max_link_km``)."""
    backbone = backbone or build_backbone(default_sites(), params.knn, params.max_link_km)
    start = neutral_params(params)
    every = pair_geometry(backbone, start, m)  # each fold's pairs are some of these: found once
    out = m.copy()
    out["cv_set_ms"] = np.nan
    out["cv_continent_ms"] = np.nan
    for provider in sorted(set(m.provider)):
        test = (m.provider == provider).to_numpy()
        p = fit(m[~test], start, backbone, every.take(~test))
        out.loc[test, "cv_set_ms"] = predict(LatencyModel(backbone, p), m[test])
    for cont in sorted(set(m.continent_a) | set(m.continent_b)):
        touch = ((m.continent_a == cont) | (m.continent_b == cont)).to_numpy()
        p = fit(m[~touch], start, backbone, every.take(~touch))
        col = f"cv_continent_{cont}_ms"
        out[col] = np.nan
        out.loc[touch, col] = predict(LatencyModel(backbone, p), m[touch])
        todo = touch & out.cv_continent_ms.isna().to_numpy()
        out.loc[todo, "cv_continent_ms"] = out.loc[todo, col]
    return out


def calibrate(start: LatencyParams | None = None, cross_validated: bool = True) -> LatencyParams:
    """Fit on the fitted sets; returns params whose ``meta`` holds the in-sample and cross-validated errors."""
    start = start or LatencyParams()
    m = load_all(fitted_only=True)
    backbone = build_backbone(default_sites(), start.knn, start.max_link_km)
    fitted = fit(m, start, backbone)
    pred = predict(LatencyModel(backbone, fitted), m)
    meta: dict = {"fit_on": ", ".join(f"{n} ({SETS[n].statistic})" for n in SETS if SETS[n].fitted),
                  "in_sample": errors(pred, m.rtt_ms.to_numpy()), "plain_distance_fit": plain_distance_fit(m),
                  "refit": "python -m topology.calibration"}
    if cross_validated:
        cv = cross_validate(m, fitted, backbone)
        meta["leave_one_set_out"] = errors(cv.cv_set_ms.to_numpy(), m.rtt_ms.to_numpy())
        meta["leave_one_continent_out"] = errors(cv.cv_continent_ms.to_numpy(), m.rtt_ms.to_numpy())
    return replace(fitted, meta=meta)


def main(argv: list[str] | None = None) -> None:
    """``python -m topology.calibration [--check]``: refit and rewrite data/latency_params.json (or only print)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m topology.calibration",
                                 description="Refit the WAN latency model on the shipped RTT sets and rewrite "
                                             "topology/data/latency_params.json (--check: print, write nothing).")
    ap.add_argument("--check", action="store_true", help="fit and print the errors without writing the file")
    args = ap.parse_args(argv)
    params = calibrate()
    if not args.check:
        params.save()
    print({k: v for k, v in asdict(params).items() if k != "meta"})
    print(params.meta)


if __name__ == "__main__":
    main()
