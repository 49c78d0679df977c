"""Within-run intervals against the spread between seeds: how far one run's 95% interval can be trusted.

    python benchmarks/interval_audit.py [--seeds 24] [--requests 20000] [--scenario default] [--bootstrap-seeds 8]
                                        [--blocks 5,10,25,50,100,200]

Runs the scenario once per seed 1..N (each seed new arrivals, and so a new placement, on both sides) and, for every
headline gain that carries a within-run interval (the paired block bootstrap of ``sim.gains``), reports over the
seeds: the mean of the point estimates, their standard deviation, the mean width of the runs' intervals, and
``width_over_spread`` = mean width / (3.92 x sd), which is 1 when a run's interval is as wide as a normal 95%
interval of the seed-to-seed spread and below 1 when another seed moves the figure by more than one run's interval
says; and ``covered``: in how many runs the interval holds the mean over seeds. Also the range of each side's
replica count over the seeds.

Then the bootstrap's own noise: one run of the scenario at its own size (seed 1, the Quick start's run of
``default``), its paired intervals recomputed with bootstrap seeds 1..M (``--bootstrap-seeds``; a run's own is its
scenario seed); per gain, the standard deviation over those seeds of each interval end and the largest move of
either end.

Then the block length, on that same run: every headline gain's interval width when the arrival span is cut into
each of ``--blocks`` equal-time blocks instead of the shipped 50 (``sim.gains.BLOCKS``), and per gain the widest
width with blocks as long or longer over the shipped one's (``widest_with_longer_blocks_over_shipped``): near 1
when 50 blocks already span the requests' correlation, above it by how much longer blocks would widen the interval
(from correlation, or from a drift of the run's mix that every run shares: the seeds' spread above says which).

And whole chat sessions against time blocks: on one run of ``--requests`` (seed 1), the standard error of the TTFT
p50 and p95 gains of text generation when the bootstrap resamples the run's 50 time blocks (what every interval
does) and when it resamples whole chat sessions instead (a session's turns together, every other request on its
own). Progress goes to stderr; the last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pandas as pd

from edgepop.argtypes import json_line, positive_int


def audit(scenario: str, seeds: list[int], requests: int, first=None) -> dict:
    """``first``: ``_run_sides``'s run of seed 1 at ``requests``, when the caller has it (not run again)."""
    from sim.run import run_scenario

    points: dict[str, list[float]] = {}
    widths: dict[str, list[float]] = {}
    intervals: dict[str, list[tuple[float, float]]] = {}
    replicas: dict[str, list[int]] = {"edge": [], "central": []}
    t0 = time.perf_counter()
    for i, seed in enumerate(seeds, 1):
        s = (first[0] if first is not None and seed == 1 else run_scenario(scenario, requests=requests,
                                                                             seed=seed)).summary
        for side in replicas:
            replicas[side].append(int(s["deployments"][side]["placement"]["replicas"]))
        gains = s["gains"]
        for key, ci in gains["ci95"].items():
            if key == "method" or ci is None or gains.get(key) is None:
                continue
            points.setdefault(key, []).append(float(gains[key]))
            widths.setdefault(key, []).append(float(ci[1]) - float(ci[0]))
            intervals.setdefault(key, []).append((float(ci[0]), float(ci[1])))
        print(f"seed {seed} done ({i}/{len(seeds)}, {time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    out: dict = {"scenario": scenario, "seeds": len(seeds), "requests": requests,
                 "replicas": {side: [min(v), max(v)] for side, v in replicas.items()}, "gains": {}}
    for key, values in points.items():
        v = np.array(values)
        mean, sd = float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else float("nan")
        width = float(np.mean(widths[key]))
        out["gains"][key] = {"runs": len(v), "mean": round(mean, 3), "sd_over_seeds": round(sd, 3),
                             "mean_interval_width": round(width, 3),
                             "width_over_spread": round(width / (3.92 * sd), 3) if sd > 0 else None,
                             "covered": sum(lo <= mean <= hi for lo, hi in intervals[key])}
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def _run_sides(scenario: str, requests: int | None):
    """One run of ``scenario`` (seed 1) and its edge and central request frames, as the run paired them."""
    from sim.run import run_scenario

    out = run_scenario(scenario, requests=requests, seed=1)
    req = out.requests
    return out, *(req[(req.deployment == side).to_numpy(dtype=bool)].reset_index(drop=True)
                  for side in ("edge", "central"))


def bootstrap_noise(run, boot_seeds: list[int]) -> dict:
    """``run``: ``_run_sides``'s (the run, its edge and central frames)."""
    from sim.gains import Paired, headline_gains
    from sim.metrics import slo_met

    t0 = time.perf_counter()
    out, edge, central = run
    slo = out.scenario.slo
    ends: dict[str, list[tuple[float, float]]] = {}
    for seed in boot_seeds:
        p = Paired(edge, central, seed)
        ci, _ = headline_gains(p, slo_met(p.e, slo), slo_met(p.c, slo))
        for key, interval in ci.items():
            if isinstance(interval, list | tuple) and len(interval) == 2:
                ends.setdefault(key, []).append((float(interval[0]), float(interval[1])))
        print(f"bootstrap seed {seed} done", file=sys.stderr, flush=True)
    result: dict = {"requests": int(len(edge)), "bootstrap_seeds": len(boot_seeds), "gains": {},
                    # the run's own interval and the one recomputed here with its seed: the frames split as the run
                    # had them (equal up to the summary's rounding)
                    "ttft_p50_ci95_run": out.summary["gains"]["ci95"]["ttft_ms_p50_reduction_pct"],
                    "ttft_p50_ci95_recomputed_seed_1": [round(x, 3) for x in ends["ttft_ms_p50_reduction_pct"][0]]}
    for key, pairs in ends.items():
        lo, hi = np.array(pairs).T
        result["gains"][key] = {"sd_low": round(float(lo.std(ddof=1)), 3), "sd_high": round(float(hi.std(ddof=1)), 3),
                                "largest_move": round(float(max(np.ptp(lo), np.ptp(hi))), 3)}
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def block_lengths(run, counts: list[int]) -> dict:
    """Each headline gain's 95% interval width on one run when its arrival span is cut into each of ``counts``
    equal-time blocks (the shipped bootstrap uses ``sim.gains.BLOCKS``), with the run's bootstrap seed. A plateau
    says the blocks are long enough. Widths that keep growing as blocks get longer (fewer) say either that requests
    are correlated over spans longer than a block (the shipped intervals then too narrow) or that the run's mix
    drifts through it (a compressed day), which long blocks resample though every run shares it; the spread over
    seeds (:func:`audit`) tells the two apart."""
    from sim.gains import BLOCKS, Bootstrap, Paired, headline_gains
    from sim.metrics import slo_met

    t0 = time.perf_counter()
    out, edge, central = run
    slo = out.scenario.slo
    p = Paired(edge, central, out.scenario.seed)
    met_e, met_c = slo_met(p.e, slo), slo_met(p.c, slo)
    widths: dict[str, dict[str, float]] = {}
    for count in counts:
        p.boot = Bootstrap(p.arrival, out.scenario.seed, blocks=count)
        ci, _ = headline_gains(p, met_e, met_c)
        for key, interval in ci.items():
            if isinstance(interval, list | tuple) and len(interval) == 2:
                width = float(interval[1]) - float(interval[0])
                widths.setdefault(key, {})[str(count)] = round(width * (100 if key == "slo_attainment_delta" else 1), 3)
        print(f"{count} blocks resampled", file=sys.stderr, flush=True)
    result: dict = {"requests": int(len(edge)), "blocks": counts, "shipped_blocks": BLOCKS,
                    "span_s": round(float(p.arrival.max() - p.arrival.min()), 1),
                    "note": "interval width per block count (slo_attainment_delta in points)", "widths": widths}
    for key, by_count in widths.items():
        if str(BLOCKS) in by_count and by_count[str(BLOCKS)] > 0:
            widest_longer = max(v for c, v in by_count.items() if int(c) <= BLOCKS)
            result.setdefault("widest_with_longer_blocks_over_shipped", {})[key] = round(
                widest_longer / by_count[str(BLOCKS)], 3)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def sessions_against_blocks(run, requests: int) -> dict:
    """``run``: ``_run_sides``'s run of seed 1 at ``requests``."""
    from sim.gains import RESAMPLES, Bootstrap, Paired, reduction

    t0 = time.perf_counter()
    out, edge, central = run
    p = Paired(edge, central, 1)
    wl = out.workload.requests.set_index("request_id")
    session = wl.session_id.reindex(p.e.request_id.to_numpy()).to_numpy(dtype=np.int64)
    # a block per session; every request outside one (session_id < 0) a block of its own
    key = np.where(session >= 0, session, -1 - np.arange(len(session)))
    _, block = np.unique(key, return_inverse=True)
    by_session = Bootstrap(p.arrival, 1)
    by_session.block = block.reshape(-1)
    rng = np.random.default_rng(np.random.SeedSequence([1, 0x5E55]))
    by_session.weights = rng.poisson(1.0, size=(RESAMPLES, int(block.max()) + 1)).astype(float)
    ve, vc = p.e.ttft_ms.to_numpy(dtype=float), p.c.ttft_ms.to_numpy(dtype=float)
    me, mc = p.gen & p.ok_e, p.gen & p.ok_c
    turns = session >= 0
    spans = pd.Series(p.boot.block[turns]).groupby(session[turns]).nunique()  # time blocks each session touches
    result: dict = {"requests": requests, "text_generation_in_sessions": round(float((session[p.gen] >= 0).mean()), 3),
                    "sessions": int(len(spans)),
                    "turns_in_sessions_over_several_blocks": round(float(
                        (spans.reindex(session[turns]).to_numpy() > 1).mean()), 3), "gains": {}}
    for boot, name in ((p.boot, "time_blocks"), (by_session, "sessions")):
        be, bc = boot.quantiles(ve, me, (0.5, 0.95)), boot.quantiles(vc, mc, (0.5, 0.95))
        for j, q in enumerate(("p50", "p95")):
            samples = reduction(be[:, j], bc[:, j])
            samples = samples[np.isfinite(samples)]
            result["gains"].setdefault(f"ttft_{q}", {})[f"se_{name}"] = round(float(samples.std(ddof=1)), 3)
        print(f"{name} resampled", file=sys.stderr, flush=True)
    for g in result["gains"].values():
        g["sessions_over_blocks"] = round(g["se_sessions"] / g["se_time_blocks"], 3)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=positive_int, default=24, help="run seeds 1..N, N >= 2 (default 24)")
    ap.add_argument("--requests", type=positive_int, default=20_000, help="requests per run (default 20,000)")
    ap.add_argument("--scenario", default="default", help="embedded scenario name or file (default: default)")
    ap.add_argument("--bootstrap-seeds", type=int, default=8, help="bootstrap seeds 1..M on one full run (default 8; "
                    "0: skip that part)")
    ap.add_argument("--blocks", type=block_counts, default=[5, 10, 25, 50, 100, 200],
                    help="block counts to compare on that run, comma-separated (default 5,10,25,50,100,200)")
    args = ap.parse_args()
    if args.seeds < 2:
        ap.error(f"--seeds: an interval over seeds needs at least 2, got {args.seeds}")
    if not (args.bootstrap_seeds == 0 or args.bootstrap_seeds >= 2):
        ap.error(f"--bootstrap-seeds: 0 (skip) or at least 2, got {args.bootstrap_seeds}")
    check_scenario_arg(ap, args.scenario)
    first = _run_sides(args.scenario, args.requests)  # seed 1 at --requests: the audit's first run, and the sessions'
    result = audit(args.scenario, list(range(1, args.seeds + 1)), args.requests, first)
    full = _run_sides(args.scenario, None)  # the Quick start's run (seed 1, the scenario's own size)
    if args.bootstrap_seeds:
        result["bootstrap_noise"] = bootstrap_noise(full, list(range(1, args.bootstrap_seeds + 1)))
    result["block_lengths"] = block_lengths(full, args.blocks)
    del full
    result["sessions_against_blocks"] = sessions_against_blocks(first, args.requests)
    print(json_line(result))


def block_counts(text: str) -> list[int]:
    """``--blocks``: comma-separated whole numbers of at least 2, e.g. 10,50,200."""
    try:
        counts = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers, got {text!r}") from None
    if not counts or counts[0] < 2:
        raise argparse.ArgumentTypeError(f"each block count must be at least 2, got {text!r}")
    return counts


def check_scenario_arg(ap: argparse.ArgumentParser, name: str) -> None:
    """``--scenario`` loads and compares edge with central (the gains need both), or argparse's one-line error."""
    from edgepop.errors import UserError
    from sim.scenario import load_scenario

    try:
        sc = load_scenario(name)
    except UserError as exc:
        ap.error(f"--scenario: {exc}")
    if sc.central is None:
        ap.error(f"--scenario: {name!r} has no central deployment to compare with")


if __name__ == "__main__":
    main()
