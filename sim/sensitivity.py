"""The headline under other assumptions: the edge GPU inventory x0.5 and x2 (central follows it: the same budget),
the edge's placement planned at half its utilisation cap (more replicas for its busiest models: the tail moves with
it), ``nearest-balanced`` with its window on both sides off (or at 10 ms where the scenario has none), both sides
routed by ``least-ttft`` instead (with the scenario's window; a prompt sent where its first token is predicted
earliest, counting the prefills queued before it), central's
GPUs racked in servers the size of the edge's nodes (where the edge has single GPUs, so does central), imperfect
anycast (a fifth of the user locations entering the edge at their second-nearest PoP, as BGP sent roughly 20% of
a large CDN's clients to a suboptimal front-end: Calder et al., IMC 2015; or ideal anycast where the scenario has
it imperfect), each user's last mile measured (M-Lab's median by country, ``topology.last_mile``) instead of one
fixed figure (or the fixed figure where the scenario measures it), the demand cities weighted by the people online
in them (population x the country's share of individuals using the Internet, ``topology.demand``) instead of by
population (or the reverse), both of those at once, every prefill and decode step 20% slower than
the service-time model's (its held-out error is 7-10% a pass, and a simulated replica under load outruns measured
ones by more: docs/perf-model.md), and every other named baseline region set, each on the same arrivals and seed,
run with the sweep machinery.

``edgepop simulate --sensitivity`` adds these rows to summary.json (``sensitivity``) and a section to report.md.
With ``--seeds``, every row (the headline's too) is run for each seed and gives the mean over seeds, its gains a
Student-t 95% interval over seeds (:mod:`sim.replicates`) instead of one run's bootstrap interval: a variant's
p95 moves by a few points from seed to seed, as the headline's does.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from edgepop.errors import UserError

INVENTORY_FACTORS = (0.5, 2.0)
CAP_FACTOR = 0.5  # x the edge's placement utilisation cap
WINDOW_MS = 10.0  # nearest-balanced's window tried when the scenario runs without one
ANYCAST_MISROUTE = 0.2  # share of user locations anycast lands on their second-nearest PoP (Calder et al. 2015)
SLOWER = 1.2  # x every prefill and decode step of the service-time model (prefill_time_scale, decode_time_scale)


# What :func:`variants` runs, in its order, for ``edgepop simulate --help`` (a scenario decides some of it: which
# window, which anycast, whether central is racked in servers, which baselines are the others).
HELP = (f"the edge GPU inventory {' and '.join(f'x{f:g}' for f in INVENTORY_FACTORS)} (central follows), the edge's "
        f"utilisation_cap x{CAP_FACTOR:g}, nearest-balanced's window off on both sides (or at {WINDOW_MS:g} ms where "
        "the scenario has none), both sides routed by least-ttft instead, central racked like the edge (where it "
        f"is racked in servers), anycast with {ANYCAST_MISROUTE:.0%} of user cities one PoP off (or ideal where the "
        "scenario has it imperfect), the last mile by country (M-Lab medians) instead of a fixed one (or fixed "
        "where the scenario measures it), the demand cities weighted by the people online in them instead of by "
        "population (or the reverse), both of those at once, every prefill and decode step "
        f"{SLOWER - 1:.0%} slower, and every other baseline region set")


def variants(sc) -> list[tuple[str, dict]]:
    """(name, overrides) of every sensitivity run of ``sc``."""
    from topology import BASELINE_SETS

    out = [(f"edge GPU inventory x{f:g}", {"gpu_inventory_scale": round(sc.gpu_inventory_scale * f, 9)})
           for f in INVENTORY_FACTORS]
    cap = round(sc.edge.utilisation_cap * CAP_FACTOR, 9)
    out.append((f"edge utilisation_cap {cap:g}", {"edge.utilisation_cap": cap}))
    window = _window_variant(sc)
    if window is not None:
        out.append(window)
        # the same sides, each prompt sent where its first token is predicted earliest (queued prefills counted),
        # balanced within the scenario's window (WINDOW_MS where it has none): what a prompt waiting behind
        # others at a single replica costs the tail
        out.append(("router least-ttft (both)", _least_ttft_variant(sc)))
    if sc.central is not None and sc.central.budget == "gpus" and sc.central.rack == "server":
        out.append(("central racked like the edge", {"central.rack": "edge"}))
    if sc.anycast_misroute:
        out.append(("ideal anycast", {"anycast_misroute": 0.0}))
    else:
        out.append((f"anycast: {ANYCAST_MISROUTE:.0%} of user cities one PoP off", {"anycast_misroute": ANYCAST_MISROUTE}))
    # The access leg both sides pay: one figure for every user, or each country's measured median (an upper bound
    # of the access line alone: it includes the path to the measuring server), whichever the scenario does not use
    if sc.last_mile == "fixed":
        last_mile, mile_over = "last mile by country", {"last_mile": "country"}
        out.append((f"{last_mile} (M-Lab medians)", mile_over))
    else:
        last_mile, mile_over = f"last mile fixed {sc.last_mile_ms:g} ms", {"last_mile": "fixed"}
        out.append((last_mile, mile_over))
    # Where the requests come from: cities weighted by population (the default: 56% of them in Asia) or by the
    # people online there (population x the country's Internet use), whichever the scenario does not use
    demand, demand_over = (("demand by people online", {"demand_weight": "internet_users"})
                           if sc.demand_weight == "population" else ("demand by population", {"demand_weight": "population"}))
    out.append((demand, demand_over))
    # Both at once: each moves the median gain by about as much, and whether they add up is the question the two
    # rows alone leave open
    out.append((f"{last_mile} and {demand}", {**mile_over, **demand_over}))
    # The service-time model's own error: every replica that much slower, for the placement, the control planes'
    # estimates and the replicas alike (a uniform factor per phase: controlplane/perf_scaled.py)
    out.append((f"service times {SLOWER - 1:.0%} slower", {"prefill_time_scale": round(sc.prefill_time_scale * SLOWER, 9),
                                                          "decode_time_scale": round(sc.decode_time_scale * SLOWER, 9)}))
    if sc.central is not None:
        out += [(f"baseline {b}", {"central.baseline": b}) for b in BASELINE_SETS if b != sc.central.baseline]
    return out


def _sides(sc) -> dict:
    """The scenario's deployments by name (central may be switched off)."""
    return {side: dep for side, dep in (("edge", sc.edge), ("central", sc.central)) if dep is not None}


def _window_variant(sc) -> tuple[str, dict] | None:
    """Both deployments' ``nearest-balanced`` window switched: off if either has one, else ``WINDOW_MS``."""
    sides = _sides(sc)
    if not sides or any(dep.router != "nearest-balanced" for dep in sides.values()):
        return None
    now = [float((dep.router_options or {}).get("window_ms", 0.0)) for dep in sides.values()]
    alt = 0.0 if any(now) else WINDOW_MS
    return (f"router window_ms {alt:g} (both)", {f"{side}.router_options.window_ms": alt for side in sides})


def _least_ttft_variant(sc) -> dict:
    """Both deployments routed by ``least-ttft`` with the scenario's ``nearest-balanced`` window (``WINDOW_MS``
    where it has none): called only where both sides run ``nearest-balanced``."""
    sides = _sides(sc)
    over = {}
    for side, dep in sides.items():
        window = float((dep.router_options or {}).get("window_ms", 0.0)) or WINDOW_MS
        over.update({f"{side}.router": "least-ttft", f"{side}.router_options.window_ms": window})
    return over


def _names_last_mile_ms(path: Path) -> bool:
    """Whether the scenario file at ``path`` sets ``last_mile_ms`` itself (already read and checked once)."""
    import tomllib

    with open(path, "rb") as f:
        return "last_mile_ms" in tomllib.load(f)


def row(name: str, summary_rows: list[dict]) -> dict:
    """One report row from a run's two sweep summary rows (edge and central)."""
    by = {r["deployment"]: r for r in summary_rows}
    e, c = by["edge"], by["central"]

    def ci(k):
        lo, hi = e.get(f"gain_{k}_ci95_lo"), e.get(f"gain_{k}_ci95_hi")
        return None if lo is None or hi is None or lo != lo else [lo, hi]

    return {"variant": name, "gpus": int(e["gpus"]), "edge_ttft_p50_ms": e["ttft_p50_ms"],
            "central_ttft_p50_ms": c["ttft_p50_ms"], "ttft_p50_reduction_pct": e["gain_ttft_ms_p50_reduction_pct"],
            "ttft_p50_ci95": ci("ttft_ms_p50_reduction_pct"), "edge_ttft_p95_ms": e["ttft_p95_ms"],
            "central_ttft_p95_ms": c["ttft_p95_ms"], "ttft_p95_reduction_pct": e["gain_ttft_ms_p95_reduction_pct"],
            "ttft_p95_ci95": ci("ttft_ms_p95_reduction_pct"),
            "tpot_p50_reduction_pct": e.get("gain_tpot_ms_p50_reduction_pct"),
            "tpot_p50_ci95": ci("tpot_ms_p50_reduction_pct"), "edge_busy": e.get("gpu_busy_mean"),
            "central_busy": c.get("gpu_busy_mean")}


def over_seeds(name: str, rows_by_seed: list[list[dict]]) -> dict:
    """One report row from several seeds' runs of a variant: the mean of each figure, and each gain's Student-t
    95% interval over the seeds in place of the bootstrap's."""
    from sim.replicates import interval

    per = [row(name, rows) for rows in rows_by_seed]
    out = {"variant": name, "seeds": len(per)}
    for key in per[0]:
        if key == "variant" or key.endswith("_ci95"):
            continue
        vals = [r[key] for r in per]
        iv = interval([float(v) if v is not None else None for v in vals])
        out[key] = int(vals[0]) if key == "gpus" else (None if iv["mean"] is None else round(iv["mean"], 3))
        if f"{key.removesuffix('_reduction_pct')}_ci95" in per[0]:
            out[f"{key.removesuffix('_reduction_pct')}_ci95"] = iv["ci95"]
    return out


def run_sensitivity(scenario: str | Path, summary: dict, *, requests: int | None = None,
                    duration_s: float | None = None, seed: int | None = None, engine: str = "local",
                    workers: int | None = None, out: str | Path = "edgepop-sensitivity",
                    seeds: list[int] | None = None) -> dict:
    """Run the variants of :func:`variants` and return summary.json's ``sensitivity`` block; ``summary`` is the
    main run's (its headline is the first row). ``seeds``: run every row for each of these seeds too (the main
    run's seed is always one of them) and give means over seeds."""
    from sim.frontier import Line, fleet_budget, scenario_path
    from sim.grid import parse_grid
    from sim.scenario import load_scenario
    from sim.sweep import run_sweep
    from sim.sweep_variant import summary_rows
    from topology import Topology

    if "gains" not in summary:
        raise UserError("--sensitivity compares edge and central: it cannot run with --only")
    base = scenario_path(scenario)
    sc = load_scenario(str(base))
    topo = Topology.load(last_mile_ms=sc.last_mile_ms)
    named, skipped = [], {}
    for name, over in variants(sc):
        scale = over.get("gpu_inventory_scale", sc.gpu_inventory_scale)
        lines = (Line("edge"), Line("central", over.get("central.baseline", sc.central.baseline)))
        shaped = sc if "central.rack" not in over else replace(sc, central=replace(sc.central, rack=over["central.rack"]))
        why = [fleet_budget(shaped, topo, line, scale)[3] for line in lines]
        if over.get("last_mile", "fixed") != "fixed" and _names_last_mile_ms(base):
            why.append(f"{base.name} sets last_mile_ms (one figure for every user), which a measured last mile "
                       "replaces: a scenario file may not name both")
        if any(why):
            skipped[name] = "; ".join(w for w in why if w)  # e.g. a model that fits no node at that scale
        else:
            named.append((name, over))
    main = seed if seed is not None else sc.seed
    every = [main, *(s for s in seeds or () if s != main)]
    if len(every) > 1:
        named = [("as run", {}), *named]  # the headline over the other seeds as well (the main one is rerun)
    doc = {"base": str(base), "seeds": every,
           "variants": [{"name": name, **over} for name, over in named] or [{"name": "none"}]}
    if requests is not None:
        doc["requests"] = int(requests)
    if duration_s is not None:
        doc["duration_s"] = float(duration_s)
    grid = parse_grid(doc, source="sensitivity", base_dir=base.parent) if named else None
    result = run_sweep(grid, engine=engine, workers=workers, out=out, keep_requests=False) if named else None
    if len(every) > 1:
        frame = result.summary

        def runs(name):
            return [frame[(frame.variant_name == name) & (frame.seed == s)].to_dict("records") for s in every]

        rows = [over_seeds("as run", runs("as run"))]
        note = (f"Each row is the mean over seeds {', '.join(map(str, every))} (each seed's arrivals the same for "
                "every row); gains carry a Student-t 95% interval over the seeds. GPU busy: share of GPUs busy, "
                "mean over the arrivals' span.")
    else:
        rows = [row("as run", summary_rows(summary))]
        note = ("Each row is one run on the same arrivals and seed as the headline; gains carry the 95% "
                "interval of the paired block bootstrap. GPU busy: share of GPUs busy, mean over the arrivals' span.")
    for name, _ in variants(sc):
        if name in skipped:
            rows.append({"variant": name, "infeasible": skipped[name]})
        elif len(every) > 1:
            rows.append(over_seeds(name, runs(name)))
        else:
            rows.append(row(name, result.summary[result.summary.variant_name == name].to_dict("records")))
    return {"note": note, "seeds": every, "rows": rows}
