"""The headline replicated over seeds: how far another seed moves each gain.

The headline's intervals are within one run: its arrivals, and the placement planned for them, are held fixed,
and a paired block bootstrap resamples the requests. A new seed draws new arrivals and so a new placement on both
sides; for some figures (E2E of generation, SLO attainment, the tail percentiles) the spread between seeds is
several times what the within-run interval suggests. A scenario that replays a trace keeps its arrival times
whatever the seed (the seed still draws the users' cities, and so the placement).
``edgepop simulate --seeds 1,2,3`` runs the scenario once per seed (the main run's seed reused, the others on the
sweep machinery: same requests, same overrides) and reports, for every headline gain, its value per seed, the
mean, the standard deviation over seeds and a Student-t 95% interval of the mean. The interval is for the mean
over these seeds of a run of this size, on this scenario; it says nothing about a different scenario, load or
request count.

``summary.json`` gets a ``replicates`` block and report.md a section "Between seeds".
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from edgepop.errors import UserError

MIN_SEEDS = 2
MAX_SEEDS = 100
METHOD = ("one run per seed (new arrivals, new placement on both sides); mean over seeds with a Student-t 95% "
          "interval (t quantile with n-1 degrees of freedom x sd / sqrt(n))")


def headline_gains() -> list[tuple[str, str, bool]]:
    """(label, key in summary.json gains, is a difference) of every headline gain."""
    from sim.report import HEADLINE

    return [(label.replace(" (ms)", ""), key, label == "SLO attainment") for label, _, key, _ in HEADLINE if key]


def parse_seeds(text: str) -> list[int]:
    """``--seeds``: comma-separated distinct whole numbers in [0, 2**63 - 1]; a range ``A-B`` counts as A..B."""
    from edgepop.rng import MAX_INT

    seeds: list[int] = []
    try:
        parts = [p.strip() for p in str(text).split(",")]
        if parts and not parts[-1]:
            parts.pop()  # "1,2,": a trailing comma
        for part in parts:
            if not part:
                raise ValueError(part)  # "1,,2": a seed left out by mistake is not dropped in silence
            lo, sep, hi = part.partition("-") if part[0] != "-" else (part, "", "")
            if sep and int(hi) < int(lo):
                raise ValueError(part)
            if sep and int(hi) - int(lo) >= MAX_SEEDS:
                raise UserError(f"bad --seeds {text!r}: at most {MAX_SEEDS} seeds")
            seeds += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise UserError(f"bad --seeds {text!r}: expected comma-separated whole numbers or ranges like 1-5") from None
    if len(seeds) > MAX_SEEDS:
        raise UserError(f"bad --seeds {text!r}: at most {MAX_SEEDS} seeds, got {len(seeds)}")
    if not seeds or any(not 0 <= s <= MAX_INT for s in seeds) or len(set(seeds)) < len(seeds):
        raise UserError(f"bad --seeds {text!r}: expected distinct whole numbers in [0, 2**63 - 1]")
    return seeds


def interval(values: list[float]) -> dict:
    """Mean, sample standard deviation and Student-t 95% interval of the mean of ``values`` (finite ones; an
    interval needs two)."""
    from edgepop.stats import t_half_width95

    v = np.array([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    out = {"n": int(v.size), "mean": round(float(v.mean()), 4) if v.size else None,
           "sd": round(float(v.std(ddof=1)), 4) if v.size > 1 else None, "ci95": None}
    if v.size > 1:
        half = t_half_width95(v)
        out["ci95"] = [round(float(v.mean()) - half, 4), round(float(v.mean()) + half, 4)]
    return out


def summarise(per_seed: dict[int, dict], within: dict | None = None) -> dict:
    """The ``replicates`` block from each seed's sweep summary rows (seed -> {deployment: row}, the main run's
    first); ``within``: the main run's ``gains.ci95``."""
    seeds = list(per_seed)
    rows = []
    for label, key, delta in headline_gains():
        values = [_number(per_seed[s]["edge"].get(f"gain_{key}")) for s in seeds]
        rows.append({"metric": label, "key": key, "difference": delta, "per_seed": values, **interval(values),
                     "within_run_ci95_first_seed": (within or {}).get(key)})
    conts = by_continent(per_seed)
    return {"seeds": seeds, "method": METHOD,
            "note": "A gain is 100 x (central - edge) / central (SLO attainment: edge - central). The within-run "
                    "interval is the first seed's paired block bootstrap: when it is much narrower than the spread "
                    "between seeds, trust the interval over seeds.", "rows": rows,
            "by_continent": conts, "edge_loses": edge_loses(rows, conts, len(seeds))}


def edge_loses(rows: list[dict], conts: list[dict], n_seeds: int) -> str | None:
    """One sentence naming every gain whose interval over seeds lies wholly below zero (None when none does)."""
    from sim.report import gain_text

    lost = [f"{r['metric']} {gain_text(r['mean'], r['ci95'], r['difference'])}" for r in rows
            if r["ci95"] is not None and r["ci95"][1] < 0]
    lost += [f"TTFT {q} for users in {c['continent']} {gain_text(c[f'ttft_{q}']['mean'], c[f'ttft_{q}']['ci95'])}"
             for c in conts for q in ("p50", "p95") if c[f"ttft_{q}"]["ci95"] is not None
             and c[f"ttft_{q}"]["ci95"][1] < 0]
    return f"edge loses over {n_seeds} seeds (mean, 95% interval over seeds): " + "; ".join(lost) if lost else None


def by_continent(per_seed: dict[int, dict]) -> list[dict]:
    """Text generation TTFT p50 and p95 gains per user continent, per seed and over seeds (from each side's
    continent percentiles; a seed with fewer than ``MIN_BIN`` such requests on a side gives no figure)."""
    from sim.gains import MIN_BIN

    conts = sorted({k.split("_")[1] for rows in per_seed.values() for k in rows["edge"]
                    if k.startswith("continent_") and k.endswith("_ttft_p50_ms")})
    out = []
    for cont in conts:
        entry = {"continent": cont, "ttft_requests_mean": None}
        counts = []
        for q in ("p50", "p95"):
            values = []
            for rows in per_seed.values():
                e, c = (rows[side] for side in ("edge", "central"))
                n = [_number(r.get(f"continent_{cont}_ttft_requests")) for r in (e, c)]
                a, b = (_number(r.get(f"continent_{cont}_ttft_{q}_ms")) for r in (e, c))
                enough = all(x is not None and x >= MIN_BIN for x in n)
                values.append(round(100.0 * (b - a) / b, 2) if enough and a is not None and b else None)
                if q == "p50":
                    counts.append(n[0])
            entry[f"ttft_{q}"] = {"per_seed": values, **interval(values)}
        known = [x for x in counts if x is not None]
        entry["ttft_requests_mean"] = round(sum(known) / len(known)) if known else None
        out.append(entry)
    return out


def run_replicates(scenario: str | Path, summary: dict, seeds: list[int], *, requests: int | None = None,
                   duration_s: float | None = None, engine: str = "local", workers: int | None = None,
                   out: str | Path = "edgepop-replicates", frame=None) -> dict:
    """Run ``scenario`` for every seed of ``seeds`` not already run (``summary`` is the main run's) and return
    summary.json's ``replicates`` block. ``frame``: sweep summary rows of those runs made already (the
    sensitivity's "as run" rows), used instead of running them again."""
    from sim.frontier import scenario_path
    from sim.grid import parse_grid
    from sim.sweep import run_sweep
    from sim.sweep_variant import summary_rows

    if "gains" not in summary:
        raise UserError("--seeds compares edge and central: it cannot run with --only")
    main = int(summary["seed"])
    if len({main, *seeds}) < MIN_SEEDS:
        raise UserError(f"--seeds needs at least one seed other than the main run's ({main}) for an interval")
    base = scenario_path(scenario)
    others = [s for s in seeds if s != main]
    doc = {"base": str(base), "seeds": others}
    if requests is not None:
        doc["requests"] = int(requests)
    if duration_s is not None:
        doc["duration_s"] = float(duration_s)
    if frame is None:
        grid = parse_grid(doc, source="--seeds", base_dir=base.parent)
        frame = run_sweep(grid, engine=engine, workers=workers, out=out, keep_requests=False).summary
    per_seed = {main: {r["deployment"]: r for r in summary_rows(summary)}}
    for seed in others:
        rows = {r["deployment"]: r for r in frame[frame.seed == seed].to_dict("records")}
        if set(rows) != {"edge", "central"}:
            raise UserError(f"--seeds: the run of seed {seed} left rows for {sorted(rows)} (expected edge and "
                            "central)")
        per_seed[seed] = rows
    return summarise(per_seed, summary["gains"].get("ci95"))


def _number(v) -> float | None:
    """A summary row's value as a float; None for no figure (None or NaN, as Parquet gives it back)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
